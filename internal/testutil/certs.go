package testutil

import (
	"testing"
	"time"

	"github.com/shardpilot/shardpilot/internal/pki"
)

// CA is a certificate authority for one test: its root and the
// certificates it issues are PEM files in a temporary directory.
type CA struct{ *pki.CA }

// NewCA creates a root for one test.
func NewCA(t testing.TB) *CA {
	t.Helper()
	ca, err := pki.NewCA(t.TempDir(), "shardpilot test root", 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return &CA{ca}
}

// Issue writes a certificate and its key for name (servers on localhost
// and 127.0.0.1, and clients), with the given URI names (a SPIFFE ID).
func (ca *CA) Issue(t testing.TB, name string, uris ...string) (certFile, keyFile string) {
	t.Helper()
	certFile, keyFile, err := ca.CA.Issue(name, uris...)
	if err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

// IssueCA writes an intermediate CA under this root.
func (ca *CA) IssueCA(t testing.TB, name string) (certFile, keyFile string) {
	t.Helper()
	certFile, keyFile, err := ca.CA.IssueCA(name)
	if err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}
