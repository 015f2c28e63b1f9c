// Package ca is the mesh's certificate authority: a root, either supplied
// by the operator (a file the pushers alone mount) or created on the first
// start and kept in etcd sealed with a key the pushers alone hold, so that
// every pusher signs with the same one, which issues short-lived workload
// certificates for SPIFFE identities.
package ca

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net/url"
	"os"
	"time"

	"github.com/shardpilot/shardpilot/pkg/xds/identity"
)

// RootValidity is how long a root created on first start is valid.
const RootValidity = 10 * 365 * 24 * time.Hour

// CA signs workload certificates.
type CA struct {
	root    *x509.Certificate
	rootPEM []byte
	key     crypto.Signer
	// trust is rootPEM and the roots AlsoTrust added.
	trust []byte
}

// stored is a root and its key, as SealedRootKey holds them once opened.
type stored struct {
	Cert string `json:"cert"`
	Key  string `json:"key"`
}

// FromFiles loads an operator's root (or intermediate) certificate and key.
func FromFiles(certFile, keyFile string) (*CA, error) {
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("ca: %s, %s: %w", certFile, keyFile, err)
	}
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return nil, fmt.Errorf("ca: %w", err)
	}
	return fromPair(pair, certPEM)
}

func fromPair(pair tls.Certificate, certPEM []byte) (*CA, error) {
	root, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, fmt.Errorf("ca: %w", err)
	}
	if !root.IsCA || root.KeyUsage&x509.KeyUsageCertSign == 0 {
		return nil, fmt.Errorf("ca: %q is not a CA certificate allowed to sign certificates", root.Subject.CommonName)
	}
	signer, ok := pair.PrivateKey.(crypto.Signer)
	if !ok {
		return nil, errors.New("ca: the key cannot sign")
	}
	return &CA{root: root, rootPEM: certPEM, key: signer, trust: certPEM}, nil
}

func decode(value []byte, where string) (*CA, error) {
	var s stored
	if err := json.Unmarshal(value, &s); err != nil {
		return nil, fmt.Errorf("ca: %s: %w", where, err)
	}
	pair, err := tls.X509KeyPair([]byte(s.Cert), []byte(s.Key))
	if err != nil {
		return nil, fmt.Errorf("ca: %s: %w", where, err)
	}
	return fromPair(pair, []byte(s.Cert))
}

// newRoot creates a self-signed root for a trust domain, encoded as
// SealedRootKey holds it once opened.
func newRoot(trustDomain string) ([]byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	serial, err := serialNumber()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{Organization: []string{trustDomain}, CommonName: "shardpilot root CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(RootValidity),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("ca: create the root: %w", err)
	}
	kb, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	return json.Marshal(stored{
		Cert: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})),
		Key:  string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kb})),
	})
}

func serialNumber() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
}

// RootPEM returns the root certificate, PEM encoded: what proxies trust.
func (c *CA) RootPEM() []byte { return c.rootPEM }

// TrustPEM returns every root proxies trust: RootPEM and those AlsoTrust
// added.
func (c *CA) TrustPEM() []byte { return c.trust }

// AlsoTrust adds the CA certificates of a PEM file to those proxies trust,
// beside the one that signs: while a root is replaced, the other one (the
// next before it signs, the previous until the certificates it signed
// expire).
func (c *CA) AlsoTrust(file string) error {
	b, err := os.ReadFile(file)
	if err != nil {
		return fmt.Errorf("ca: %w", err)
	}
	n := 0
	for rest := b; ; n++ {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if block.Type != "CERTIFICATE" || err != nil || !cert.IsCA {
			return fmt.Errorf("ca: %s: PEM block %d is not a CA certificate", file, n+1)
		}
	}
	if n == 0 {
		return fmt.Errorf("ca: %s holds no PEM certificate", file)
	}
	trust := append([]byte{}, c.rootPEM...)
	if len(trust) > 0 && trust[len(trust)-1] != '\n' {
		trust = append(trust, '\n')
	}
	c.trust = append(trust, b...)
	return nil
}

// Root returns the root certificate.
func (c *CA) Root() *x509.Certificate { return c.root }

// Workload is a certificate issued for an identity, with its key.
type Workload struct {
	// CertPEM is the certificate followed by the chain up to the root.
	CertPEM, KeyPEM []byte
	NotAfter        time.Time
	Serial          *big.Int
}

// Issue creates a key and a certificate for an identity, valid for ttl
// (never past the root's own expiry).
func (c *CA) Issue(id identity.ID, ttl time.Duration) (*Workload, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl, der, err := c.workload(&key.PublicKey, id, ttl)
	if err != nil {
		return nil, err
	}
	kb, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	chain := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	if !isSelfSigned(c.root) {
		// An operator's intermediate: proxies are sent the chain to it.
		chain = append(chain, c.rootPEM...)
	}
	return &Workload{CertPEM: chain, KeyPEM: pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kb}), NotAfter: tmpl.NotAfter, Serial: tmpl.SerialNumber}, nil
}

// workload signs a workload certificate for an identity over pub.
func (c *CA) workload(pub crypto.PublicKey, id identity.ID, ttl time.Duration) (*x509.Certificate, []byte, error) {
	uri, err := url.Parse(id.String())
	if err != nil {
		return nil, nil, fmt.Errorf("ca: %w", err)
	}
	tmpl, der, err := c.sign(pub, ttl, func(t *x509.Certificate) {
		t.Subject = pkix.Name{Organization: []string{id.TrustDomain}}
		t.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
		t.URIs = []*url.URL{uri}
	})
	if err != nil {
		return nil, nil, fmt.Errorf("ca: issue for %s: %w", id, err)
	}
	return tmpl, der, nil
}

// sign signs a certificate over pub, valid for ttl but never past the
// root's own expiry, that name completes (its names and usages).
func (c *CA) sign(pub crypto.PublicKey, ttl time.Duration, name func(*x509.Certificate)) (*x509.Certificate, []byte, error) {
	serial, err := serialNumber()
	if err != nil {
		return nil, nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		NotBefore:    now.Add(-5 * time.Minute), // clocks disagree
		NotAfter:     now.Add(ttl),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
	}
	if tmpl.NotAfter.After(c.root.NotAfter) {
		tmpl.NotAfter = c.root.NotAfter
	}
	name(tmpl)
	der, err := x509.CreateCertificate(rand.Reader, tmpl, c.root, pub, c.key)
	return tmpl, der, err
}

func isSelfSigned(c *x509.Certificate) bool {
	return c.CheckSignatureFrom(c) == nil
}
