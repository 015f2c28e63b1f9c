package identity

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"log/slog"
	"time"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
)

// ClientCA follows the client CA file of a server's TLS configuration, so
// that streams opened under a CA that was replaced can be ended: a
// certificate the operator stopped trusting does not keep its streams
// until the connection ages out.
type ClientCA struct {
	r *reloader
}

// ServerTLSWithClientCA is ServerTLS (or ServerTLSOptionalCert, when
// optional) that also returns the ClientCA it follows.
func ServerTLSWithClientCA(certFile, keyFile, clientCAFile string, optional bool, log *slog.Logger) (*tls.Config, *ClientCA, error) {
	auth := tls.RequireAndVerifyClientCert
	if optional {
		auth = tls.VerifyClientCertIfGiven
	}
	tc, r, err := newServerTLS(certFile, keyFile, clientCAFile, auth, log)
	if err != nil {
		return nil, nil, err
	}
	return tc, &ClientCA{r: r}, nil
}

// Trusted reports whether a call's peer certificate chains to the client
// CA as it is now. A peer without a verified certificate (a token, or
// plaintext) is not the CA's to judge: true.
func (c *ClientCA) Trusted(ctx context.Context) bool {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return true
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.VerifiedChains) == 0 || len(info.State.PeerCertificates) == 0 {
		return true
	}
	cfg := c.r.config()
	if cfg.ClientCAs == nil {
		return true
	}
	inter := x509.NewCertPool()
	for _, ic := range info.State.PeerCertificates[1:] {
		inter.AddCert(ic)
	}
	_, err := info.State.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: cfg.ClientCAs, Intermediates: inter,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	return err == nil
}

// Watch calls changed each time the client CA file's content changes
// (looked at every recheck), until ctx is done.
func (c *ClientCA) Watch(ctx context.Context, changed func()) error {
	t := time.NewTicker(recheck)
	defer t.Stop()
	last := c.r.caGeneration()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			c.r.config() // reads the files again when they changed
			if g := c.r.caGeneration(); g != last {
				last = g
				changed()
			}
		}
	}
}
