package identity

import (
	"context"
	"crypto/sha256"
	"fmt"
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
type Tokens struct {
	Client kubernetes.Interface
	// Audiences the token must be for (Istio's "istio-ca"); empty: the
	// API server's own.
	Audiences   []string
	TrustDomain string

	mu   sync.Mutex
	seen map[[32]byte]review
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
	key := sha256.Sum256([]byte(token))
	now := time.Now()
	t.mu.Lock()
	r, ok := t.seen[key]
	t.mu.Unlock()
	if ok && now.Before(r.until) {
		return r.id, true, r.err
	}
	id, err, final := t.review(ctx, token)
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

// review asks the API server; final is false when it did not answer.
func (t *Tokens) review(ctx context.Context, token string) (id ID, err error, final bool) {
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	res, err := t.Client.AuthenticationV1().TokenReviews().Create(rctx, &authnv1.TokenReview{
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
