// Package identity tells who is at the other end of an xDS stream — the
// SPIFFE ID of its client certificate,
// spiffe://<trust domain>/ns/<namespace>/sa/<service account> — and holds
// each proxy to the namespace that identity names: a node that claims
// another is refused, one that claims none is given its own.
package identity

import (
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/shardpilot/shardpilot/pkg/xds/nodemeta"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// ID is a workload's SPIFFE identity, as Istio issues them.
type ID struct {
	TrustDomain    string
	Namespace      string
	ServiceAccount string
}

func (id ID) String() string {
	return "spiffe://" + id.TrustDomain + "/ns/" + id.Namespace + "/sa/" + id.ServiceAccount
}

// Parse reads an ID from a SPIFFE URI of Istio's form.
func Parse(u *url.URL) (ID, error) {
	if u.Scheme != "spiffe" || u.Host == "" {
		return ID{}, fmt.Errorf("%q is not a SPIFFE ID (spiffe://<trust domain>/...)", u.String())
	}
	parts := strings.Split(strings.TrimPrefix(u.Path, "/"), "/")
	if len(parts) != 4 || parts[0] != "ns" || parts[2] != "sa" || parts[1] == "" || parts[3] == "" {
		return ID{}, fmt.Errorf("SPIFFE ID %q: want spiffe://<trust domain>/ns/<namespace>/sa/<service account>", u.String())
	}
	return ID{TrustDomain: u.Host, Namespace: parts[1], ServiceAccount: parts[3]}, nil
}

// FromContext returns the identity of a gRPC call's peer: the SPIFFE ID of
// its verified client certificate. ok is false when the peer presented no
// verified certificate (plaintext, or TLS without client certificates);
// an error says why a certificate names no usable identity.
func FromContext(ctx context.Context) (id ID, ok bool, err error) {
	p, found := peer.FromContext(ctx)
	if !found {
		return ID{}, false, nil
	}
	info, isTLS := p.AuthInfo.(credentials.TLSInfo)
	if !isTLS || len(info.State.VerifiedChains) == 0 || len(info.State.VerifiedChains[0]) == 0 {
		return ID{}, false, nil
	}
	leaf := info.State.VerifiedChains[0][0]
	var ids []ID
	for _, u := range leaf.URIs {
		if u.Scheme != "spiffe" {
			continue
		}
		id, err := Parse(u)
		if err != nil {
			return ID{}, true, err
		}
		ids = append(ids, id)
	}
	switch len(ids) {
	case 0:
		return ID{}, true, fmt.Errorf("the client certificate %q carries no SPIFFE ID", leaf.Subject.CommonName)
	case 1:
		return ids[0], true, nil
	}
	return ID{}, true, fmt.Errorf("the client certificate %q carries %d SPIFFE IDs; want one", leaf.Subject.CommonName, len(ids))
}

// Policy holds proxies to their identities.
type Policy struct {
	// TrustDomain is the mesh's trust domain: identities of another are
	// refused.
	TrustDomain string
	// Required refuses a stream whose peer has no identity.
	Required bool
	// Tokens, when set, identifies a peer without a client certificate by
	// its service account token.
	Tokens *Tokens
	// Streams, when set, bounds the streams Authorize admits per identity.
	Streams *StreamLimit
}

// Screen checks a new call (a stream, or a unary call) before any of its
// messages is read, from what its connection and headers show: with
// identities required, a peer with neither a client certificate nor a
// bearer token that could be a service account's is refused, so that a
// client without a credential has the server buffer nothing of what it
// sends. It does no I/O (gRPC's tap runs it on the connection's reader);
// Admit and Identify do the rest.
func (p Policy) Screen(ctx context.Context, md metadata.MD) error {
	if !p.Required {
		return nil
	}
	if _, ok, err := FromContext(ctx); ok || err != nil {
		if err != nil {
			return status.Errorf(codes.PermissionDenied, "shardpilot: %v", err)
		}
		return nil
	}
	if p.Tokens != nil {
		ok, err := p.Tokens.Screen(md)
		if err != nil {
			// As istiod answers a token it does not take.
			return status.Errorf(codes.Unauthenticated, "shardpilot: %v", err)
		}
		if ok {
			return nil
		}
	}
	return status.Error(codes.Unauthenticated, "shardpilot: "+p.required())
}

// required says what a peer must show.
func (p Policy) required() string {
	if p.Tokens != nil {
		return "a client certificate with a SPIFFE ID, or a service account token, is required"
	}
	return "a client certificate with a SPIFFE ID is required"
}

// admittedKey carries the identity Admit found in a stream's context.
type admittedKey struct{}

// Admit identifies a stream when it starts, before its first message is
// read, and counts it against its identity (Streams) until ctx ends. The
// context returned carries the identity, so that Identify and Authorize
// on it neither review its token again nor count it twice. A stream
// without identity is refused when identities are required.
func (p Policy) Admit(ctx context.Context) (context.Context, error) {
	id, ok, err := p.verified(ctx)
	if err != nil || !ok {
		return ctx, err
	}
	if p.Streams != nil {
		if err := p.Streams.admit(ctx, id); err != nil {
			return ctx, err
		}
	}
	return context.WithValue(ctx, admittedKey{}, id), nil
}

// Admitted returns the identity Admit found for a stream, from the
// context Admit returned.
func Admitted(ctx context.Context) (ID, bool) {
	id, ok := ctx.Value(admittedKey{}).(ID)
	return id, ok
}

// verified is a call's identity, or the status that refuses the call: an
// identity that does not verify, or none where one is required.
func (p Policy) verified(ctx context.Context) (ID, bool, error) {
	id, ok, err := p.Identify(ctx)
	switch {
	case err != nil:
		return ID{}, false, status.Errorf(codes.PermissionDenied, "shardpilot: %v", err)
	case !ok && p.Required:
		return ID{}, false, status.Error(codes.Unauthenticated, "shardpilot: "+p.required())
	}
	return id, ok, nil
}

// Identify returns a stream's identity: its client certificate's, else
// its service account token's (with Tokens). An identity of another trust
// domain than the mesh's is an error: every caller (ADS, CSDS, SDS) is
// held to the same test.
func (p Policy) Identify(ctx context.Context) (ID, bool, error) {
	if id, ok := ctx.Value(admittedKey{}).(ID); ok {
		return id, true, nil
	}
	id, ok, err := FromContext(ctx)
	if !ok && err == nil && p.Tokens != nil {
		id, ok, err = p.Tokens.Identify(ctx)
	}
	if err != nil || !ok {
		return id, ok, err
	}
	if p.TrustDomain != "" && id.TrustDomain != p.TrustDomain {
		return ID{}, true, fmt.Errorf("%s is of trust domain %q; this mesh's is %q", id, id.TrustDomain, p.TrustDomain)
	}
	return id, true, nil
}

// idNamespace returns the namespace an Istio node id names
// (<type>~<ip>~<pod>.<namespace>~<namespace>.svc.<domain>), "" for an id
// of another form.
func idNamespace(id string) string {
	parts := strings.Split(id, "~")
	if len(parts) != 4 {
		return ""
	}
	ns, _, _ := strings.Cut(parts[3], ".")
	return ns
}

// Authorize checks a stream's node against its peer's identity and
// returns the node to serve: the same node, or, for a node that claims no
// namespace, a copy that claims its identity's. A node that claims another
// namespace, or an identity of another trust domain, is PermissionDenied.
func (p Policy) Authorize(ctx context.Context, node *core.Node) (*core.Node, error) {
	id, ok, err := p.verified(ctx)
	if err != nil {
		return nil, err
	}
	if !ok {
		return node, nil
	}
	claimed := nodemeta.Namespace(node)
	if claimed != "" && claimed != id.Namespace {
		return nil, status.Errorf(codes.PermissionDenied, "shardpilot: node %q claims namespace %q, but its certificate is %s", node.GetId(), claimed, id)
	}
	// The id names a namespace too (metadata wins over it when both are
	// there): neither may name another than the identity's.
	if ns := idNamespace(node.GetId()); ns != "" && ns != id.Namespace {
		return nil, status.Errorf(codes.PermissionDenied, "shardpilot: node %q names namespace %q in its id, but its identity is %s", node.GetId(), ns, id)
	}
	if _, admitted := ctx.Value(admittedKey{}).(ID); !admitted && p.Streams != nil {
		if err := p.Streams.admit(ctx, id); err != nil {
			return nil, err
		}
	}
	if claimed == "" {
		n := proto.Clone(node).(*core.Node)
		if n.Metadata == nil {
			n.Metadata = &structpb.Struct{}
		}
		if n.Metadata.Fields == nil {
			n.Metadata.Fields = map[string]*structpb.Value{}
		}
		n.Metadata.Fields["NAMESPACE"] = structpb.NewStringValue(id.Namespace)
		return n, nil
	}
	return node, nil
}

// ServerTLS returns a TLS configuration serving certFile and keyFile and,
// when clientCAFile is given, requiring client certificates that CA
// signed. The files are read again when they change (checked at most every
// few seconds, on new connections), so rotated certificates are picked up
// without a restart; files that do not load keep the last good ones.
func ServerTLS(certFile, keyFile, clientCAFile string, log *slog.Logger) (*tls.Config, error) {
	return serverTLS(certFile, keyFile, clientCAFile, tls.RequireAndVerifyClientCert, log)
}

// ServerTLSOptionalCert is ServerTLS for proxies that may authenticate
// with a token instead: a client certificate, when presented, must verify.
func ServerTLSOptionalCert(certFile, keyFile, clientCAFile string, log *slog.Logger) (*tls.Config, error) {
	return serverTLS(certFile, keyFile, clientCAFile, tls.VerifyClientCertIfGiven, log)
}

func serverTLS(certFile, keyFile, clientCAFile string, auth tls.ClientAuthType, log *slog.Logger) (*tls.Config, error) {
	tc, _, err := newServerTLS(certFile, keyFile, clientCAFile, auth, log)
	return tc, err
}

func newServerTLS(certFile, keyFile, clientCAFile string, auth tls.ClientAuthType, log *slog.Logger) (*tls.Config, *reloader, error) {
	if certFile == "" || keyFile == "" {
		return nil, nil, errors.New("identity: a certificate and its key are required")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return started(&reloader{certFile: certFile, keyFile: keyFile, caFile: clientCAFile, auth: auth, log: log})
}

// started loads r and returns the server configuration that follows it.
func started(r *reloader) (*tls.Config, *reloader, error) {
	if err := r.load(); err != nil {
		return nil, nil, err
	}
	return &tls.Config{
		MinVersion:         tls.VersionTLS12,
		NextProtos:         []string{"h2"},
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) { return r.config(), nil },
	}, r, nil
}

// CertSource issues a server certificate (the mesh's CA, for the names
// proxies dial) and says when to ask for the next one.
type CertSource func() (cert *tls.Certificate, renewAt time.Time, err error)

// ServerTLSFromSource is ServerTLSWithClientCA serving a certificate from
// source, asked again once its renewal time has passed (a failure keeps
// the last one until it expires).
func ServerTLSFromSource(source CertSource, clientCAFile string, optional bool, log *slog.Logger) (*tls.Config, *ClientCA, error) {
	if source == nil {
		return nil, nil, errors.New("identity: a certificate source is required")
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	auth := tls.RequireAndVerifyClientCert
	if optional {
		auth = tls.VerifyClientCertIfGiven
	}
	tc, r, err := started(&reloader{source: source, caFile: clientCAFile, auth: auth, log: log})
	if err != nil {
		return nil, nil, err
	}
	return tc, &ClientCA{r: r}, nil
}

// recheck is how often the files are looked at again.
var recheck = 5 * time.Second

type reloader struct {
	certFile, keyFile, caFile string
	// source, when set, issues the certificate instead of the files;
	// renewAt is when to ask it again.
	source  CertSource
	renewAt time.Time
	auth    tls.ClientAuthType
	log     *slog.Logger

	mu      sync.Mutex
	cfg     *tls.Config
	stamp   string
	checked time.Time
	// caPEM is the client CA file's content; caGen counts its changes.
	caPEM []byte
	caGen uint64
}

// caGeneration counts the client CA's changes.
func (r *reloader) caGeneration() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.caGen
}

func (r *reloader) config() *tls.Config {
	r.mu.Lock()
	defer r.mu.Unlock()
	if time.Since(r.checked) > recheck {
		r.checked = time.Now()
		if r.fileStamp() != r.stamp || r.source != nil && time.Now().After(r.renewAt) {
			if err := r.loadLocked(); err != nil {
				r.log.Warn("cannot reload the ADS certificate; serving the last one", "err", err)
			} else {
				r.log.Info("ADS certificate reloaded", "cert", cmp.Or(r.certFile, "from the mesh's CA"), "renew_at", r.renewAt)
			}
		}
	}
	return r.cfg
}

// fileStamp summarizes the files' sizes and modification times.
func (r *reloader) fileStamp() string {
	var b strings.Builder
	for _, f := range []string{r.certFile, r.keyFile, r.caFile} {
		if f == "" {
			continue
		}
		if st, err := os.Stat(f); err == nil {
			fmt.Fprintf(&b, "%d/%d;", st.Size(), st.ModTime().UnixNano())
		}
	}
	return b.String()
}

func (r *reloader) load() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.loadLocked()
}

func (r *reloader) loadLocked() error {
	stamp := r.fileStamp()
	var cert tls.Certificate
	if r.source != nil {
		c, renewAt, err := r.source()
		if err != nil {
			return fmt.Errorf("identity: the ADS certificate: %w", err)
		}
		cert, r.renewAt = *c, renewAt
	} else {
		c, err := tls.LoadX509KeyPair(r.certFile, r.keyFile)
		if err != nil {
			return fmt.Errorf("identity: %s, %s: %w", r.certFile, r.keyFile, err)
		}
		cert = c
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, NextProtos: []string{"h2"}, Certificates: []tls.Certificate{cert}}
	if r.caFile != "" {
		pem, err := os.ReadFile(r.caFile)
		if err != nil {
			return fmt.Errorf("identity: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return fmt.Errorf("identity: %s holds no PEM certificate", r.caFile)
		}
		cfg.ClientCAs, cfg.ClientAuth = pool, r.auth
		if r.caPEM != nil && !bytes.Equal(r.caPEM, pem) {
			r.caGen++
		}
		r.caPEM = pem
	}
	r.cfg, r.stamp = cfg, stamp
	return nil
}
