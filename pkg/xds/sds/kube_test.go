package sds_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/shardpilot/shardpilot/internal/kubetest"
	"github.com/shardpilot/shardpilot/internal/testutil"
	"github.com/shardpilot/shardpilot/pkg/ca"
	"github.com/shardpilot/shardpilot/pkg/xds/cache"
	"github.com/shardpilot/shardpilot/pkg/xds/sds"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestMain(m *testing.M) { kubetest.Main(m) }

// TestGatewayCredentials: a namespace's TLS Secrets are served to the
// identities of that namespace whose service account may list its Secrets
// (a gateway's Role, as istiod authorizes), under the Secret's name and,
// with a CA, "<name>-cacert"; an update is pushed, a deletion removes
// them. Another workload of the namespace is not served them (every
// identity of the namespace was, private keys included), nor another
// namespace's identity; the gateway loses them when its Role is taken
// away.
func TestGatewayCredentials(t *testing.T) {
	defer sds.SetReviews(100*time.Millisecond, 100*time.Millisecond)()
	kc := kubetest.Get(t)
	ns := kc.Namespace(t, nil)
	binding := secretReader(t, kc, ns, "ingressgateway")
	test := testutil.NewCA(t)
	root, err := ca.FromFiles(test.CertFile, test.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile := test.Issue(t, "public.example.com")
	read := func(f string) []byte {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	ctx := testutil.Context(t)
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "public-cert"}, Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{"tls.crt": read(certFile), "tls.key": read(keyFile), "ca.crt": read(test.CertFile)}}
	if _, err := kc.Client.CoreV1().Secrets(ns).Create(ctx, secret, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Not TLS: not served.
	if _, err := kc.Client.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "password"},
		StringData: map[string]string{"password": "x"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	creds := sds.NewKubeCredentials(kc.Client, testutil.Log(t))
	s, err := sds.New(sds.Config{CA: root, TTL: time.Hour, Credentials: creds})
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{})
	done := make(chan error, 1)
	rctx, cancel := context.WithCancel(ctx)
	go func() { done <- creds.Run(rctx, s.CredentialsChanged, func() { close(started) }) }()
	renewing := make(chan error, 1)
	go func() { renewing <- s.Run(rctx) }()
	defer func() { cancel(); <-done; <-renewing }()
	<-started

	gateway := cache.Class("spiffe://cluster.local/ns/" + ns + "/sa/ingressgateway")
	other := cache.Class("spiffe://cluster.local/ns/other/sa/ingressgateway")
	app := cache.Class("spiffe://cluster.local/ns/" + ns + "/sa/app")
	s.AddClass(gateway, s.Fill)
	s.AddClass(other, s.Fill)
	s.AddClass(app, s.Fill)
	held := func(class cache.Class) map[string]string {
		out := map[string]string{}
		for name, r := range s.Resources(class, resource.SecretType) {
			sec := r.(*tlsv3.Secret)
			out[name] = string(sec.GetTlsCertificate().GetCertificateChain().GetInlineBytes()) + string(sec.GetValidationContext().GetTrustedCa().GetInlineBytes())
		}
		return out
	}
	got := held(gateway)
	if got["kubernetes://public-cert"] != string(read(certFile)) || got["kubernetes://public-cert-cacert"] != string(read(test.CertFile)) || got["default"] == "" || len(got) != 4 {
		t.Fatalf("the gateway's identity holds %d secrets: %v", len(got), keys(got))
	}
	if got := held(other); len(got) != 2 {
		t.Errorf("another namespace's identity holds %v, want its certificate and the root only", keys(got))
	}
	if got := held(app); len(got) != 2 {
		t.Errorf("a workload of the namespace that may not read its Secrets holds %v, want its certificate and the root only", keys(got))
	}

	// A renewed certificate reaches the table; a deleted Secret leaves it.
	renewed, _ := test.Issue(t, "public.example.com")
	secret.Data["tls.crt"] = read(renewed)
	if _, err := kc.Client.CoreV1().Secrets(ns).Update(ctx, secret, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, "the renewed certificate is served", func() (bool, string) {
		return held(gateway)["kubernetes://public-cert"] == string(read(renewed)), "the old one"
	})
	if err := kc.Client.CoreV1().Secrets(ns).Delete(ctx, "public-cert", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, "the deleted Secret is no longer served", func() (bool, string) {
		got := held(gateway)
		_, a := got["kubernetes://public-cert"]
		_, b := got["kubernetes://public-cert-cacert"]
		return !a && !b && len(got) == 2, fmtKeys(got)
	})

	// The Role taken away: the credentials follow.
	if _, err := kc.Client.CoreV1().Secrets(ns).Create(ctx, secret.DeepCopy(), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, "the Secret made again is served", func() (bool, string) {
		return len(held(gateway)) == 4, fmtKeys(held(gateway))
	})
	if err := kc.Client.RbacV1().RoleBindings(ns).Delete(ctx, binding.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, "a gateway no longer allowed to read Secrets loses their credentials", func() (bool, string) {
		return len(held(gateway)) == 2, fmtKeys(held(gateway))
	})
}

// secretReader lets a namespace's service account list its Secrets, as
// Istio's gateway chart does for a gateway, and returns the RoleBinding.
func secretReader(t *testing.T, kc *kubetest.Cluster, ns, sa string) *rbacv1.RoleBinding {
	t.Helper()
	ctx := testutil.Context(t)
	if _, err := kc.Client.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "secret-reader"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get", "watch", "list"}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	b, err := kc.Client.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: sa + "-secret-reader"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "secret-reader"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa, Namespace: ns}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func keys(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func fmtKeys(m map[string]string) string { return fmt.Sprint(keys(m)) }
