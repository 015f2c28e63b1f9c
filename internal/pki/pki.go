// Package pki makes a private certificate authority and the certificates
// it issues, as PEM files in a directory: for the standalone's embedded
// servers and for tests.
package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"time"
)

// CA is a certificate authority whose root and issued certificates are
// files in its directory.
type CA struct {
	dir  string
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	// CertFile is the root certificate, KeyFile its key.
	CertFile, KeyFile string
}

// NewCA creates a root, valid for validity, in dir.
func NewCA(dir, name string, validity time.Duration) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(validity),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("pki: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("pki: %w", err)
	}
	ca := &CA{dir: dir, cert: cert, key: key}
	if ca.CertFile, err = ca.write("ca.pem", "CERTIFICATE", der); err != nil {
		return nil, err
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	if ca.KeyFile, err = ca.write("ca-key.pem", "EC PRIVATE KEY", kb); err != nil {
		return nil, err
	}
	return ca, nil
}

// Issue writes a certificate and its key for name, good for servers on
// localhost, 127.0.0.1 and name, and for clients, with the given URI names
// (a SPIFFE ID, say), valid as long as the root.
func (ca *CA) Issue(name string, uris ...string) (certFile, keyFile string, err error) {
	tmpl := &x509.Certificate{
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		DNSNames:    []string{"localhost", name},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	for _, u := range uris {
		parsed, err := url.Parse(u)
		if err != nil {
			return "", "", fmt.Errorf("pki: %w", err)
		}
		tmpl.URIs = append(tmpl.URIs, parsed)
	}
	return ca.issue(name, name, tmpl)
}

// IssueCA writes an intermediate CA certificate and its key for name,
// signed by this CA (as Istio's cacerts hold one under an organization's
// root), valid as long as the root.
func (ca *CA) IssueCA(name string) (certFile, keyFile string, err error) {
	return ca.issue(name, name+"-ca", &x509.Certificate{
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
	})
}

// issue signs tmpl for name with a new key, valid as long as the root,
// and writes both as file.pem and file-key.pem.
func (ca *CA) issue(name, file string, tmpl *x509.Certificate) (certFile, keyFile string, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", err
	}
	if tmpl.SerialNumber, err = rand.Int(rand.Reader, big.NewInt(1<<62)); err != nil {
		return "", "", err
	}
	tmpl.Subject = pkix.Name{CommonName: name}
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), ca.cert.NotAfter
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return "", "", fmt.Errorf("pki: issue %s: %w", name, err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return "", "", err
	}
	if certFile, err = ca.write(file+".pem", "CERTIFICATE", der); err != nil {
		return "", "", err
	}
	keyFile, err = ca.write(file+"-key.pem", "EC PRIVATE KEY", kb)
	return certFile, keyFile, err
}

func (ca *CA) write(name, typ string, der []byte) (string, error) {
	p := filepath.Join(ca.dir, name)
	if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		return "", fmt.Errorf("pki: %w", err)
	}
	return p, nil
}
