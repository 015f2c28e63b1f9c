// Package sds serves proxies their certificates over SDS on the ADS
// stream, under Istio's names: "default", the workload certificate and key
// of the proxy's SPIFFE identity, issued by the mesh's CA, and "ROOTCA",
// the root it trusts. A table per identity holds them, shared by every
// proxy of that identity; certificates are issued when the identity's
// first proxy asks and issued again before they expire.
package sds

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"sync"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/shardpilot/shardpilot/pkg/ca"
	"github.com/shardpilot/shardpilot/pkg/xds/cache"
	"github.com/shardpilot/shardpilot/pkg/xds/identity"
	"github.com/shardpilot/shardpilot/pkg/xds/server"
)

// Istio's secret names.
const (
	WorkloadSecret = "default"
	RootSecret     = "ROOTCA"
)

// Config configures Secrets.
type Config struct {
	CA *ca.CA
	// TTL is how long a workload certificate is valid. Default 24h.
	TTL time.Duration
	// Identify returns the identity of a stream's peer; default
	// identity.FromContext (its client certificate).
	Identify func(context.Context) (identity.ID, bool, error)
	// Credentials, when set, are TLS secrets an identity is also served,
	// those of its own namespace (a Gateway's credentialName), when it is
	// authorized to.
	Credentials Credentials
	Log         *slog.Logger
	// Registerer receives the metrics; nil registers nothing.
	Registerer prometheus.Registerer
}

// Credentials are TLS secrets by namespace.
type Credentials interface {
	// Namespace returns the secrets of a namespace, by resource name.
	Namespace(namespace string) map[string]types.Resource
	// Authorized says whether an identity may be served its namespace's
	// secrets.
	Authorized(ctx context.Context, id identity.ID) bool
}

// Secrets issues and serves the secrets of each identity.
type Secrets struct {
	*cache.Cache
	cfg    Config
	issued prometheus.Counter
	failed prometheus.Counter

	// mu guards, by class: whether it is held (from Fill to RemoveClass),
	// when its certificate was issued and when it expires; and by
	// identity, whether it was last found authorized to be served
	// credentials.
	mu       sync.Mutex
	held     map[cache.Class]bool
	expires  map[cache.Class]time.Time
	issuedAt map[cache.Class]time.Time
	allowed  map[identity.ID]bool
}

var _ server.SecretSource = (*Secrets)(nil)

// New returns Secrets.
func New(cfg Config) (*Secrets, error) {
	if cfg.CA == nil {
		return nil, fmt.Errorf("sds: a CA is required")
	}
	if cfg.TTL == 0 {
		cfg.TTL = 24 * time.Hour
	}
	if cfg.TTL < time.Second {
		return nil, fmt.Errorf("sds: certificate lifetime %s: want at least a second", cfg.TTL)
	}
	if cfg.Identify == nil {
		cfg.Identify = identity.FromContext
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	c, err := cache.New(cache.Config{Types: []string{resource.SecretType}, Log: cfg.Log})
	if err != nil {
		return nil, err
	}
	s := &Secrets{Cache: c, cfg: cfg, held: map[cache.Class]bool{}, expires: map[cache.Class]time.Time{}, issuedAt: map[cache.Class]time.Time{},
		issued: prometheus.NewCounter(prometheus.CounterOpts{Name: "shardpilot_pusher_certificates_issued_total",
			Help: "Workload certificates issued to proxy identities (first issue and rotation)."}),
		failed: prometheus.NewCounter(prometheus.CounterOpts{Name: "shardpilot_pusher_certificate_failures_total",
			Help: "Workload certificates that could not be issued."}),
	}
	if cfg.Registerer != nil {
		for _, m := range []prometheus.Collector{s.issued, s.failed} {
			if err := cfg.Registerer.Register(m); err != nil {
				return nil, fmt.Errorf("sds: register metrics: %w", err)
			}
		}
	}
	return s, nil
}

// Class names a stream's identity's class: its SPIFFE ID, or "" when the
// peer has none.
func (s *Secrets) Class(ctx context.Context) cache.Class {
	id, ok, err := s.cfg.Identify(ctx)
	if !ok || err != nil {
		return ""
	}
	return cache.Class(id.String())
}

// Fill issues the class's identity a certificate.
func (s *Secrets) Fill(class cache.Class) {
	s.mu.Lock()
	s.held[class] = true
	s.mu.Unlock()
	s.issue(class)
}

// renewal records when a held class's certificate is next due.
func (s *Secrets) renewal(class cache.Class, issued, expires time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.held[class] {
		s.expires[class], s.issuedAt[class] = expires, issued
	}
}

// issue issues a class's certificate and puts it, with the root, in its
// table. A failure is tried again at the next renewal round.
func (s *Secrets) issue(class cache.Class) {
	if err := s.tryIssue(class); err != nil {
		s.failed.Inc()
		s.cfg.Log.Error("cannot issue a workload certificate; trying again", "identity", class, "err", err)
		now := time.Now()
		s.renewal(class, now, now)
	}
}

func (s *Secrets) tryIssue(class cache.Class) error {
	u, err := url.Parse(string(class))
	if err != nil {
		return err
	}
	id, err := identity.Parse(u)
	if err != nil {
		return err
	}
	w, err := s.cfg.CA.Issue(id, s.cfg.TTL)
	if err != nil {
		return err
	}
	secrets := s.credentials(id)
	secrets[WorkloadSecret] = &tlsv3.Secret{Name: WorkloadSecret, Type: &tlsv3.Secret_TlsCertificate{TlsCertificate: &tlsv3.TlsCertificate{
		CertificateChain: inline(w.CertPEM), PrivateKey: inline(w.KeyPEM)}}}
	secrets[RootSecret] = &tlsv3.Secret{Name: RootSecret, Type: &tlsv3.Secret_ValidationContext{ValidationContext: &tlsv3.CertificateValidationContext{
		TrustedCa: inline(s.cfg.CA.TrustPEM())}}}
	if _, _, _, err := s.Update(class, resource.SecretType, secrets); err != nil {
		return err
	}
	s.issued.Inc()
	s.renewal(class, time.Now(), w.NotAfter)
	s.cfg.Log.Debug("workload certificate issued", "identity", class, "expires", w.NotAfter)
	return nil
}

// credentials returns the credentials of an identity's namespace that it
// is authorized to be served (a new map).
func (s *Secrets) credentials(id identity.ID) map[string]types.Resource {
	out := map[string]types.Resource{}
	if s.cfg.Credentials == nil {
		return out
	}
	// The API server is asked only about the identities of namespaces
	// that have credentials: every workload is an identity.
	creds := s.cfg.Credentials.Namespace(id.Namespace)
	if len(creds) == 0 || !s.authorized(id) {
		return out
	}
	for name, r := range creds {
		if name != WorkloadSecret && name != RootSecret {
			out[name] = r
		}
	}
	return out
}

// authorized asks Credentials whether id may be served its namespace's
// credentials, and records the answer for reauthorize.
func (s *Secrets) authorized(id identity.ID) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ok := s.cfg.Credentials.Authorized(ctx, id)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.allowed == nil {
		s.allowed = map[identity.ID]bool{}
	}
	s.allowed[id] = ok
	return ok
}

// CredentialsChanged serves a namespace's changed credentials to the
// identities of that namespace that are held.
func (s *Secrets) CredentialsChanged(namespace string) {
	for _, class := range s.Classes() {
		if id, ok := classID(class); ok && id.Namespace == namespace {
			s.refresh(class, id)
		}
	}
}

// reauthorize serves the held identities whose authorization changed
// their credentials, or takes them away: a Role granted or revoked counts
// within a minute or two.
func (s *Secrets) reauthorize() {
	if s.cfg.Credentials == nil {
		return
	}
	for _, class := range s.Classes() {
		id, ok := classID(class)
		if !ok {
			continue
		}
		s.mu.Lock()
		was, known := s.allowed[id]
		s.mu.Unlock()
		if !known {
			// Never asked: its namespace had no credentials, and a
			// credential made there since was served by
			// CredentialsChanged.
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		now := s.cfg.Credentials.Authorized(ctx, id)
		cancel()
		if now != was {
			s.refresh(class, id)
		}
	}
}

// refresh puts an identity's credentials as they are now in its table.
func (s *Secrets) refresh(class cache.Class, id identity.ID) {
	now := s.credentials(id)
	var gone []string
	for name := range s.Resources(class, resource.SecretType) {
		if _, ok := now[name]; !ok && name != WorkloadSecret && name != RootSecret {
			gone = append(gone, name)
		}
	}
	if _, _, _, err := s.Patch(class, resource.SecretType, now, gone); err != nil {
		s.cfg.Log.Error("cannot update credentials", "identity", class, "err", err)
	}
}

// classID is the identity a class names.
func classID(class cache.Class) (identity.ID, bool) {
	u, err := url.Parse(string(class))
	if err != nil {
		return identity.ID{}, false
	}
	id, err := identity.Parse(u)
	return id, err == nil
}

// RemoveClass drops an identity's secrets, with its last proxy.
func (s *Secrets) RemoveClass(class cache.Class) bool {
	s.mu.Lock()
	delete(s.held, class)
	delete(s.expires, class)
	delete(s.issuedAt, class)
	if id, ok := classID(class); ok {
		delete(s.allowed, id)
	}
	s.mu.Unlock()
	return s.Cache.RemoveClass(class)
}

func inline(b []byte) *core.DataSource {
	return &core.DataSource{Specifier: &core.DataSource_InlineBytes{InlineBytes: b}}
}

// reviewEvery is how often the held identities' authorization to their
// credentials is asked again (each answer is remembered for a minute).
var reviewEvery = 30 * time.Second

// RenewAt is the share of a certificate's lifetime after which it is
// issued again: its proxies hold the new one well before the old expires.
const RenewAt = 2.0 / 3

// due returns the classes whose certificates are due for renewal.
func (s *Secrets) due(now time.Time) []cache.Class {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []cache.Class
	for class, until := range s.expires {
		from := s.issuedAt[class]
		if now.After(from.Add(time.Duration(float64(until.Sub(from)) * RenewAt))) {
			out = append(out, class)
		}
	}
	return out
}

// Run renews certificates before they expire until ctx is done.
func (s *Secrets) Run(ctx context.Context) error {
	tick := time.NewTicker(min(max(s.cfg.TTL/20, 50*time.Millisecond), time.Minute, reviewEvery))
	defer tick.Stop()
	var authorizedAt time.Time
	for {
		select {
		case <-ctx.Done():
			return nil
		case now := <-tick.C:
			for _, class := range s.due(now) {
				s.issue(class)
			}
			if now.Sub(authorizedAt) >= reviewEvery {
				authorizedAt = now
				s.reauthorize()
			}
		}
	}
}
