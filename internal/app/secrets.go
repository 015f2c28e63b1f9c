package app

import (
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"maps"
	"slices"
	"time"

	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/shardpilot/shardpilot/pkg/xds/cache"
)

// heldSecrets holds the secrets of each proxy identity (sds.Secrets).
type heldSecrets interface {
	Resources(class cache.Class, typeURL string) map[string]types.Resource
}

// SecretSummary is what the config dump shows of a secret a proxy is
// served: its certificates, never its key.
type SecretSummary struct {
	Name string `json:"name"`
	// Kind is "certificate" (a certificate and its key) or "trust" (the
	// roots a proxy verifies its peers with).
	Kind         string        `json:"kind"`
	Certificates []CertSummary `json:"certificates"`
}

// CertSummary is one certificate of a secret.
type CertSummary struct {
	Subject   string    `json:"subject"`
	URIs      []string  `json:"uris,omitempty"`
	DNSNames  []string  `json:"dns_names,omitempty"`
	Serial    string    `json:"serial"`
	Issuer    string    `json:"issuer"`
	NotBefore time.Time `json:"not_before"`
	NotAfter  time.Time `json:"not_after"`
	CA        bool      `json:"ca,omitempty"`
}

// secretSummaries summarizes the secrets held for an identity, by name.
func secretSummaries(held map[string]types.Resource) []json.RawMessage {
	var out []json.RawMessage
	for _, name := range slices.Sorted(maps.Keys(held)) {
		s, ok := held[name].(*tlsv3.Secret)
		if !ok {
			continue
		}
		sum := SecretSummary{Name: name}
		switch {
		case s.GetTlsCertificate() != nil:
			sum.Kind = "certificate"
			sum.Certificates = certificates(s.GetTlsCertificate().GetCertificateChain().GetInlineBytes())
		case s.GetValidationContext() != nil:
			sum.Kind = "trust"
			sum.Certificates = certificates(s.GetValidationContext().GetTrustedCa().GetInlineBytes())
		default:
			continue
		}
		if b, err := json.Marshal(sum); err == nil {
			out = append(out, b)
		}
	}
	return out
}

// certificates reads the certificates of a PEM bundle.
func certificates(bundle []byte) []CertSummary {
	var out []CertSummary
	for {
		var block *pem.Block
		block, bundle = pem.Decode(bundle)
		if block == nil {
			return out
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			continue
		}
		sum := CertSummary{Subject: c.Subject.String(), DNSNames: c.DNSNames, Serial: c.SerialNumber.Text(16), Issuer: c.Issuer.String(),
			NotBefore: c.NotBefore, NotAfter: c.NotAfter, CA: c.IsCA}
		for _, u := range c.URIs {
			sum.URIs = append(sum.URIs, u.String())
		}
		out = append(out, sum)
	}
}
