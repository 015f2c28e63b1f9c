package ca

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/shardpilot/shardpilot/pkg/xds/identity"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pb "istio.io/api/security/v1alpha1"
)

// Service is Istio's certificate service (istio.v1.auth.IstioCertificateService)
// over the mesh's CA, as Istio's agent calls it at its caAddress: a caller
// authenticated by its service account token or its current mesh
// certificate (a renewal) sends a CSR and gets a certificate for its own
// SPIFFE identity, with the chain up to the root.
type Service struct {
	pb.UnimplementedIstioCertificateServiceServer
	CA *CA
	// Identify returns the caller's identity (see identity.Policy.Identify).
	Identify func(context.Context) (identity.ID, bool, error)
	// TTL is a certificate's validity when the request asks for none;
	// MaxTTL caps what a request asks for.
	TTL, MaxTTL time.Duration
	// PerIdentity bounds how many certificates one identity is issued: a
	// burst of PerIdentityBurst, then one every PerIdentity (0: no bound).
	// An agent asks at start and at each rotation; a caller asking more
	// makes the CA sign for nothing.
	PerIdentity      time.Duration
	PerIdentityBurst int
	Log              *slog.Logger
	results          *prometheus.CounterVec
	cut              prometheus.Counter
	cutSaid          *atomic.Bool // the first cut is warned of
	limits           *identity.KeyedLimit[identity.ID]
}

// limitedIdentities is how many identities' rates are remembered; one
// forgotten starts again with a full burst.
const limitedIdentities = 100_000

// NewService checks the configuration and registers the service's
// metrics with reg (nil: unregistered).
func NewService(s *Service, reg prometheus.Registerer) (*Service, error) {
	if s.CA == nil || s.Identify == nil {
		return nil, errors.New("ca: the certificate service needs a CA and a way to identify callers")
	}
	if s.TTL <= 0 || s.MaxTTL < s.TTL {
		return nil, fmt.Errorf("ca: certificate TTL %v, maximum %v: want 0 < TTL <= maximum", s.TTL, s.MaxTTL)
	}
	if s.Log == nil {
		s.Log = slog.New(slog.DiscardHandler)
	}
	if s.PerIdentity < 0 || (s.PerIdentity > 0 && s.PerIdentityBurst < 1) {
		return nil, fmt.Errorf("ca: per-identity rate one every %v, burst %d: want a positive interval and burst, or 0", s.PerIdentity, s.PerIdentityBurst)
	}
	if s.PerIdentity > 0 {
		s.limits = identity.NewKeyedLimit[identity.ID](s.PerIdentity, s.PerIdentityBurst, limitedIdentities)
	}
	s.results = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shardpilot_ca_certificate_requests_total",
		Help: "Certificate signing requests (Istio's CreateCertificate) by result: issued, or the reason of a refusal (unauthenticated, csr, identity, rate, error)."},
		[]string{"result"})
	s.cutSaid = new(atomic.Bool)
	s.cut = prometheus.NewCounter(prometheus.CounterOpts{Name: "shardpilot_ca_certificates_cut_total",
		Help: "Workload certificates issued for less than their lifetime (the one asked, or the default) because the certificate that signs them expires first: replace it (the ShardpilotCACertificateExpiring alert)."})
	if reg != nil {
		for _, c := range []prometheus.Collector{s.results, s.cut} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return s, nil
}

// CreateCertificate signs the caller's CSR for the caller's identity.
func (s *Service) CreateCertificate(ctx context.Context, req *pb.IstioCertificateRequest) (*pb.IstioCertificateResponse, error) {
	id, ok, err := s.Identify(ctx)
	switch {
	case err != nil:
		return nil, s.refuse(codes.Unauthenticated, "unauthenticated", id, "%v", err)
	case !ok:
		return nil, s.refuse(codes.Unauthenticated, "unauthenticated", id, "no client certificate and no service account token")
	}
	csr, err := parseCSR(req.GetCsr())
	if err != nil {
		return nil, s.refuse(codes.InvalidArgument, "csr", id, "%v", err)
	}
	if err := namesOnly(csr, id); err != nil {
		return nil, s.refuse(codes.PermissionDenied, "identity", id, "%v", err)
	}
	if s.limits != nil {
		if !s.limits.Allow(id) {
			return nil, s.refuse(codes.ResourceExhausted, "rate", id, "%s asked for more than %d certificates in a row and one every %v: ask again later",
				id, s.PerIdentityBurst, s.PerIdentity)
		}
	}
	ttl := validity(req.GetValidityDuration(), s.TTL, s.MaxTTL)
	leaf, notAfter, err := s.CA.Sign(csr, id, ttl)
	if err != nil {
		s.results.WithLabelValues("error").Inc()
		s.Log.Error("certificate not signed", "identity", id, "err", err)
		return nil, status.Error(codes.Internal, "shardpilot: the certificate could not be signed")
	}
	s.results.WithLabelValues("issued").Inc()
	s.Log.Debug("certificate issued", "identity", id, "expires", notAfter)
	if time.Until(notAfter) < ttl-time.Minute {
		// Cut to the signing certificate's expiry.
		s.cut.Inc()
		if !s.cutSaid.Swap(true) {
			s.Log.Warn("workload certificates are cut to the expiry of the certificate that signs them: replace it", "expires", notAfter, "asked", ttl)
		}
	}
	// As Istio answers: the certificate, the chain above it, the root.
	chain := []string{string(leaf)}
	if !isSelfSigned(s.CA.root) {
		chain = append(chain, string(s.CA.rootPEM))
	}
	return &pb.IstioCertificateResponse{CertChain: append(chain, string(s.CA.TrustPEM()))}, nil
}

// validity is what a request asking for seconds (0 or less: nothing) is
// given: def, or what it asks up to max, compared in seconds so that a
// huge request cannot overflow into a negative, already expired, validity.
func validity(seconds int64, def, max time.Duration) time.Duration {
	switch {
	case seconds <= 0:
		return def
	case seconds >= int64(max/time.Second):
		return max
	}
	return time.Duration(seconds) * time.Second
}

// refuse counts and logs a refusal and returns its error.
func (s *Service) refuse(code codes.Code, reason string, id identity.ID, format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	s.results.WithLabelValues(reason).Inc()
	s.Log.Warn("certificate request refused", "reason", reason, "identity", id, "detail", msg)
	return status.Error(code, "shardpilot: "+msg)
}

// parseCSR decodes and checks a PEM certificate request.
func parseCSR(text string) (*x509.CertificateRequest, error) {
	block, _ := pem.Decode([]byte(text))
	if block == nil || block.Type != "CERTIFICATE REQUEST" {
		return nil, errors.New("the CSR is not a PEM certificate request")
	}
	csr, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("the CSR cannot be read: %w", err)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("the CSR's signature is not its key's: %w", err)
	}
	return csr, nil
}

// namesOnly checks that a CSR names no identity but the caller's.
func namesOnly(csr *x509.CertificateRequest, id identity.ID) error {
	for _, u := range csr.URIs {
		if u.String() != id.String() {
			return fmt.Errorf("the CSR names %s; the caller is %s", u, id)
		}
	}
	if len(csr.DNSNames) > 0 || len(csr.IPAddresses) > 0 || len(csr.EmailAddresses) > 0 {
		return fmt.Errorf("the CSR names DNS names, addresses or emails; a workload certificate names its SPIFFE identity %s alone", id)
	}
	return nil
}

// Sign issues a certificate for an identity over a CSR's key, valid for
// ttl (never past the root's own expiry), and returns it in PEM.
func (c *CA) Sign(csr *x509.CertificateRequest, id identity.ID, ttl time.Duration) ([]byte, time.Time, error) {
	tmpl, der, err := c.workload(csr.PublicKey, id, ttl)
	if err != nil {
		return nil, time.Time{}, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), tmpl.NotAfter, nil
}

// ServingCertificate is a source of the pushers' own TLS certificate for
// the names proxies dial (their Services; istiod's, for a drop-in), signed
// by the mesh's CA so that Istio's agents verify it against the roots of
// istio-ca-root-cert, valid for ttl and renewed after two thirds of it.
func (c *CA) ServingCertificate(names []string, ttl time.Duration) identity.CertSource {
	return func() (*tls.Certificate, time.Time, error) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, time.Time{}, err
		}
		_, der, err := c.sign(&key.PublicKey, ttl, func(t *x509.Certificate) {
			t.Subject = pkix.Name{Organization: []string{"shardpilot"}, CommonName: names[0]}
			t.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
			t.DNSNames = names
		})
		if err != nil {
			return nil, time.Time{}, fmt.Errorf("ca: the pushers' certificate: %w", err)
		}
		chain := [][]byte{der}
		if !isSelfSigned(c.root) {
			chain = append(chain, c.root.Raw)
		}
		return &tls.Certificate{Certificate: chain, PrivateKey: key}, time.Now().Add(ttl * 2 / 3), nil
	}
}
