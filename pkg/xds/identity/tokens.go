package identity

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	authnv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Tokens authenticates proxies that present a Kubernetes service account
// token instead of a client certificate ("authorization: Bearer <token>"
// on the stream), as istiod accepts: the API server reviews the token
// (TokenReview), and its service account is the identity,
// spiffe://<trust domain>/ns/<namespace>/sa/<account>. Reviews are
// remembered for a minute.
//
// A proxy of another cluster says which in its "ClusterID" request
// metadata, as Istio's agent sends it: that cluster's API server reviews
// its token. A proxy that names none, or Cluster, is Client's.
type Tokens struct {
	Client kubernetes.Interface
	// Cluster is the ID of Client's cluster (Istio's CLUSTER_ID).
	Cluster string
	// Remote are the API servers of the other clusters whose proxies are
	// served, by cluster ID.
	Remote map[string]kubernetes.Interface
	// Audiences the token must be for (Istio's "istio-ca"); empty: the
	// API server's own.
	Audiences   []string
	TrustDomain string
	// PerPeer bounds the reviews one peer address makes the API server do:
	// a burst of PerPeerBurst, then one every PerPeer (defaults
	// reviewEvery, reviewBurst). Tokens already reviewed are answered
	// from memory and count for nothing.
	PerPeer      time.Duration
	PerPeerBurst int

	mu    sync.Mutex
	seen  map[[32]byte]review // by the hash of cluster and token
	peers *KeyedLimit[string]
}

type review struct {
	id    ID
	err   error
	until time.Time
}

// Remembered reviews: how long, and how many at most; and the reviews
// one peer may have made: a burst, then one per interval. The API server
// answers a client some QPS (client-go's default is 5): without a bound,
// one caller sending made-up tokens would hold every proxy's review back.
const (
	reviewTTL   = time.Minute
	reviewsHeld = 10000
	reviewBurst = 20
	reviewEvery = time.Second
	peersHeld   = 10000
)

// Identify returns the identity of a stream's token; ok is false when the
// stream carries none.
func (t *Tokens) Identify(ctx context.Context) (ID, bool, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	token := bearer(md)
	if token == "" {
		return ID{}, false, nil
	}
	cluster := ""
	if v := md.Get(ClusterIDMetadata); len(v) == 1 {
		cluster = v[0]
	}
	client, err := t.reviewer(cluster)
	if err != nil {
		return ID{}, true, err
	}
	key := sha256.Sum256([]byte(cluster + "\x00" + token))
	now := time.Now()
	t.mu.Lock()
	r, ok := t.seen[key]
	t.mu.Unlock()
	if ok && now.Before(r.until) {
		return r.id, true, r.err
	}
	// What cannot be a service account token for these audiences is
	// refused here, without asking the API server.
	if err := t.precheck(token, now); err != nil {
		return ID{}, true, err
	}
	if peer := peerHost(ctx); !t.allow(peer) {
		return ID{}, true, fmt.Errorf("too many token reviews asked from %s: ask again later", peer)
	}
	id, err, final := t.review(ctx, client, token)
	if !final {
		return id, true, err // the API server did not answer: ask again next time
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.seen == nil || len(t.seen) >= reviewsHeld {
		t.seen = map[[32]byte]review{}
	}
	t.seen[key] = review{id: id, err: err, until: now.Add(reviewTTL)}
	return id, true, err
}

// precheck refuses a token that cannot be a service account token for
// t's audiences: not a JWT, no service account as its subject, expired,
// or for none of the audiences (a token naming none is left to the API
// server). The signature is the API server's to check.
func (t *Tokens) precheck(token string, now time.Time) error {
	parts := strings.Split(token, ".")
	if len(parts) != 3 || len(token) > maxTokenBytes {
		return errors.New("the token is not valid: not a JSON web token")
	}
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return errors.New("the token is not valid: its claims are not base64url")
	}
	var claims struct {
		Sub string          `json:"sub"`
		Exp *float64        `json:"exp"`
		Aud json.RawMessage `json:"aud"`
	}
	if err := json.Unmarshal(payload, &claims); err != nil {
		return errors.New("the token is not valid: its claims are not JSON")
	}
	if f := strings.Split(claims.Sub, ":"); len(f) != 4 || f[0] != "system" || f[1] != "serviceaccount" {
		return fmt.Errorf("the token is not valid: its subject %q is not a service account", claims.Sub)
	}
	if claims.Exp != nil && time.Unix(int64(*claims.Exp), 0).Before(now.Add(-time.Minute)) {
		return errors.New("the token is not valid: it expired")
	}
	var aud []string
	if len(claims.Aud) > 0 && json.Unmarshal(claims.Aud, &aud) != nil {
		var one string
		if json.Unmarshal(claims.Aud, &one) != nil {
			return errors.New("the token is not valid: its audience is neither a string nor a list")
		}
		aud = []string{one}
	}
	if len(t.Audiences) > 0 && len(aud) > 0 && !slices.ContainsFunc(aud, func(a string) bool { return slices.Contains(t.Audiences, a) }) {
		return fmt.Errorf("the token is not valid: its audiences %v are not %v", aud, t.Audiences)
	}
	return nil
}

// bearer is the bearer token of a call's metadata ("" for none).
func bearer(md metadata.MD) string {
	var token string
	for _, v := range md.Get("authorization") {
		if tok, ok := strings.CutPrefix(v, "Bearer "); ok {
			token = strings.TrimSpace(tok)
		}
	}
	return token
}

// Screen refuses, without asking the API server, a call whose metadata
// carries no bearer token that could be a service account's for these
// audiences (ok false: it carries none at all).
func (t *Tokens) Screen(md metadata.MD) (ok bool, err error) {
	token := bearer(md)
	if token == "" {
		return false, nil
	}
	return true, t.precheck(token, time.Now())
}

// maxTokenBytes is the longest token reviewed (Kubernetes' are about 1 KiB).
const maxTokenBytes = 16 << 10

// allow takes one review from the peer's allowance.
func (t *Tokens) allow(peer string) bool {
	t.mu.Lock()
	if t.peers == nil {
		t.peers = NewKeyedLimit[string](cmp.Or(t.PerPeer, reviewEvery), cmp.Or(t.PerPeerBurst, reviewBurst), peersHeld)
	}
	peers := t.peers
	t.mu.Unlock()
	return peers.Allow(peer)
}

// peerHost is the caller's address without its port ("" when unknown).
func peerHost(ctx context.Context) string {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return ""
	}
	if host, _, err := net.SplitHostPort(p.Addr.String()); err == nil {
		return host
	}
	return p.Addr.String()
}

// ClusterIDMetadata is the request metadata in which Istio's agent names
// its cluster.
const ClusterIDMetadata = "clusterid"

// reviewer is the API server of the cluster a proxy names.
func (t *Tokens) reviewer(cluster string) (kubernetes.Interface, error) {
	if cluster == "" || cluster == t.Cluster {
		return t.Client, nil
	}
	if c, ok := t.Remote[cluster]; ok {
		return c, nil
	}
	known := append([]string{t.Cluster}, slices.Sorted(maps.Keys(t.Remote))...)
	return nil, fmt.Errorf("the proxy says it is in cluster %q (request metadata ClusterID); tokens are reviewed for clusters %q", cluster, known)
}

// review asks the API server; final is false when it did not answer.
func (t *Tokens) review(ctx context.Context, client kubernetes.Interface, token string) (id ID, err error, final bool) {
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	res, err := client.AuthenticationV1().TokenReviews().Create(rctx, &authnv1.TokenReview{
		Spec: authnv1.TokenReviewSpec{Token: token, Audiences: t.Audiences},
	}, metav1.CreateOptions{})
	if err != nil {
		return ID{}, fmt.Errorf("the token could not be reviewed: %w", err), false
	}
	id, err = t.identity(res)
	return id, err, true
}

func (t *Tokens) identity(res *authnv1.TokenReview) (ID, error) {
	if !res.Status.Authenticated {
		return ID{}, fmt.Errorf("the token is not valid: %s", res.Status.Error)
	}
	if len(t.Audiences) > 0 && !slices.ContainsFunc(res.Status.Audiences, func(a string) bool { return slices.Contains(t.Audiences, a) }) {
		return ID{}, fmt.Errorf("the token is for %v, not %v", res.Status.Audiences, t.Audiences)
	}
	parts := strings.Split(res.Status.User.Username, ":")
	if len(parts) != 4 || parts[0] != "system" || parts[1] != "serviceaccount" {
		return ID{}, fmt.Errorf("the token is %q's, not a service account's", res.Status.User.Username)
	}
	return ID{TrustDomain: t.TrustDomain, Namespace: parts[2], ServiceAccount: parts[3]}, nil
}
