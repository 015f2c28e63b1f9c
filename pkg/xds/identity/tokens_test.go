package identity

import (
	"context"
	"encoding/base64"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	authnv1 "k8s.io/api/authentication/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// jwt is an unsigned token with these claims (the API server would
// refuse its signature; the precheck cannot tell).
func jwt(claims string) string {
	enc := base64.RawURLEncoding.EncodeToString
	return enc([]byte(`{"alg":"RS256"}`)) + "." + enc([]byte(claims)) + "." + enc([]byte("sig"))
}

// TestTokenReviewFlood: tokens that cannot be service account tokens for
// the audience are refused without a review; one peer sending well-formed
// made-up tokens has a burst of reviews, then is refused; a proxy of
// another peer is still reviewed and served, and a token already reviewed
// is answered from memory whoever floods (a unit test over a fake API
// server that counts the reviews; TestServiceAccountTokens runs the real
// one).
func TestTokenReviewFlood(t *testing.T) {
	client := fake.NewSimpleClientset()
	var reviews atomic.Int64
	valid := jwt(`{"sub":"system:serviceaccount:shop:cart","aud":["istio-ca"],"exp":` + fmt.Sprint(time.Now().Add(time.Hour).Unix()) + `}`)
	client.PrependReactor("create", "tokenreviews", func(a k8stesting.Action) (bool, runtime.Object, error) {
		reviews.Add(1)
		tr := a.(k8stesting.CreateAction).GetObject().(*authnv1.TokenReview)
		if tr.Spec.Token == valid {
			tr.Status = authnv1.TokenReviewStatus{Authenticated: true, Audiences: []string{"istio-ca"},
				User: authnv1.UserInfo{Username: "system:serviceaccount:shop:cart"}}
		} else {
			tr.Status = authnv1.TokenReviewStatus{Error: "invalid signature"}
		}
		return true, tr, nil
	})
	tokens := &Tokens{Client: client, Audiences: []string{"istio-ca"}, TrustDomain: "cluster.local", PerPeer: time.Hour, PerPeerBurst: 5}
	from := func(addr, token string) context.Context {
		ctx := metadata.NewIncomingContext(context.Background(), metadata.Pairs("authorization", "Bearer "+token))
		return peer.NewContext(ctx, &peer.Peer{Addr: &net.TCPAddr{IP: net.ParseIP(addr), Port: 40000}})
	}

	// Not service account tokens for istio-ca: refused unasked.
	for _, tok := range []string{"garbage", "a.b.c", jwt(`{}`), jwt(`{"sub":"admin"}`), jwt(`not json`),
		jwt(`{"sub":"system:serviceaccount:shop:cart","aud":"other"}`),
		jwt(`{"sub":"system:serviceaccount:shop:cart","exp":1}`), strings.Repeat("a.", 20000) + "a"} {
		if _, ok, err := tokens.Identify(from("10.0.0.66", tok)); !ok || err == nil || !strings.Contains(err.Error(), "not valid") {
			t.Errorf("token %.40q: %v, want refused as not valid", tok, err)
		}
	}
	if n := reviews.Load(); n != 0 {
		t.Errorf("%d reviews asked for tokens that cannot be valid, want 0", n)
	}
	// The valid proxy, reviewed once and then remembered.
	if id, _, err := tokens.Identify(from("10.0.0.7", valid)); err != nil || id.Namespace != "shop" {
		t.Fatalf("the valid token: %v %v", id, err)
	}
	// A flood of well-formed made-up tokens from one peer.
	refused := 0
	for i := range 100 {
		tok := jwt(fmt.Sprintf(`{"sub":"system:serviceaccount:shop:x%d","aud":"istio-ca"}`, i))
		if _, _, err := tokens.Identify(from("10.0.0.66", tok)); err != nil && strings.Contains(err.Error(), "too many token reviews") {
			refused++
		}
	}
	if n := reviews.Load(); n != 1+5 || refused != 95 {
		t.Errorf("the flood made %d reviews (want the valid one's and a burst of 5) and was refused %d times (want 95)", n, refused)
	}
	// Others are not held back: the valid token from the flooding peer
	// is remembered, and a new proxy elsewhere is reviewed.
	if _, _, err := tokens.Identify(from("10.0.0.66", valid)); err != nil {
		t.Errorf("a remembered valid token from the flooding peer: %v", err)
	}
	other := jwt(`{"sub":"system:serviceaccount:shop:cart","aud":"istio-ca","n":2}`)
	if _, _, err := tokens.Identify(from("10.0.0.8", other)); err == nil || strings.Contains(err.Error(), "too many") {
		t.Errorf("a new token from another peer: %v, want it reviewed (and refused by the API server)", err)
	}
	if n := reviews.Load(); n != 7 {
		t.Errorf("%d reviews, want 7", n)
	}
}
