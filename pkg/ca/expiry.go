package ca

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"

	"github.com/prometheus/client_golang/prometheus"
)

// expiryDesc describes ExpiryCollector's gauge.
var expiryDesc = prometheus.NewDesc("shardpilot_ca_certificate_expiry_timestamp_seconds",
	"When each CA certificate of the mesh expires (Unix seconds): the one that signs workload certificates (certificate=\"signing\", "+
		"a root or an intermediate) and the others proxies trust (\"trusted\": the rest of its chain, the roots --ca-trust-file adds). "+
		"A workload certificate never outlives the signing one: it is cut to its expiry.",
	[]string{"certificate", "subject"}, nil)

// ExpiryCollector reports when each certificate of the CA expires, as
// read at each scrape.
func ExpiryCollector(c *CA) prometheus.Collector { return expiry{c} }

type expiry struct{ ca *CA }

func (e expiry) Describe(ch chan<- *prometheus.Desc) { ch <- expiryDesc }

func (e expiry) Collect(ch chan<- prometheus.Metric) {
	signing := e.ca.Root()
	ch <- prometheus.MustNewConstMetric(expiryDesc, prometheus.GaugeValue, float64(signing.NotAfter.Unix()), "signing", signing.Subject.CommonName)
	for rest := e.ca.TrustPEM(); ; {
		var block *pem.Block
		if block, rest = pem.Decode(rest); block == nil {
			return
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil || bytes.Equal(cert.Raw, signing.Raw) {
			continue
		}
		ch <- prometheus.MustNewConstMetric(expiryDesc, prometheus.GaugeValue, float64(cert.NotAfter.Unix()), "trusted", cert.Subject.CommonName)
	}
}
