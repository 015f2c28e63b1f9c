package identity

import (
	"context"
	"crypto/sha256"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/metadata"
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

	mu   sync.Mutex
	seen map[[32]byte]review // by the hash of cluster and token
}

type review struct {
	id    ID
	err   error
	until time.Time
}

// Remembered reviews: how long, and how many at most.
const (
	reviewTTL   = time.Minute
	reviewsHeld = 10000
)

// Identify returns the identity of a stream's token; ok is false when the
// stream carries none.
func (t *Tokens) Identify(ctx context.Context) (ID, bool, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	var token string
	for _, v := range md.Get("authorization") {
		if tok, ok := strings.CutPrefix(v, "Bearer "); ok {
			token = strings.TrimSpace(tok)
		}
	}
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
