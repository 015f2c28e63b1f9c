package istiod

import (
	"context"
	"crypto/tls"
	"errors"
	"os"
	"slices"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/shardpilot/shardpilot/internal/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestAgainstIstiodSecretAccess asks istiod and the pushers, each over
// TLS with a service account token (istiod's third-party JWTs), for a
// gateway credential: a TLS Secret of the namespace and its CA
// ("<name>-cacert"), as the namespace's gateway (whose service account
// may list the namespace's Secrets, as Istio's gateway chart grants) and
// as another workload of the namespace (which may not). The pushers serve
// what istiod serves or less, and the gateway what istiod serves it. A
// caller with neither a certificate nor a token is refused with the same
// gRPC code by both.
func TestAgainstIstiodSecretAccess(t *testing.T) {
	istioBin, ourBin := binaries(t, "diff-istiod")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	work := t.TempDir()
	kc, kubeconfig, _ := startKubeWithIstioCRDs(t, ctx, istioBin, work)
	const ns = "sds"
	for _, n := range []string{"istio-system", ns} {
		kc.CreateNamespace(t, n, nil)
	}
	for _, sa := range []string{"ingressgateway", "app"} {
		if _, err := kc.Client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := kc.Client.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "secret-reader"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get", "watch", "list"}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := kc.Client.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "ingressgateway"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "secret-reader"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "ingressgateway", Namespace: ns}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ca := testutil.NewCA(t)
	certFile, keyFile := ca.Issue(t, "public.example.com")
	read := func(f string) []byte {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	if _, err := kc.Client.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "public-cert"}, Type: corev1.SecretTypeTLS,
		Data: map[string][]byte{"tls.crt": read(certFile), "tls.key": read(keyFile), "ca.crt": read(ca.CertFile)}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	settings := "rootNamespace: istio-system\ntrustDomain: cluster.local\n"
	_, istiod := startIstiodSecure(t, ctx, istioBin, kubeconfig, work, settings)
	serverCert, serverKey := ca.Issue(t, "pusher", "spiffe://cluster.local/ns/istio-system/sa/shardpilot-pusher")
	run := shardpilotRunner(t, ctx, ourBin, work)
	startIngester(t, run, kubeconfig)
	ours := testutil.FreeAddr(t)
	pusher := run("pusher", "--ads-addr", ours, "--ads-cert-file", serverCert, "--ads-key-file", serverKey, "--ads-client-ca-file", ca.CertFile,
		"--ads-tokens", "--kubeconfig", kubeconfig, "--ca-cert-file", ca.CertFile, "--ca-key-file", ca.KeyFile, "--name", "pusher-0")
	testutil.Eventually(t, time.Minute, "the pusher ready", func() (bool, string) {
		return ready("http://" + pusher + "/readyz"), "not ready"
	})

	token := func(sa string) string {
		tr, err := kc.Client.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authnv1.TokenRequest{
			Spec: authnv1.TokenRequestSpec{Audiences: []string{"istio-ca"}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tr.Status.Token
	}
	names := []string{"kubernetes://public-cert", "kubernetes://public-cert-cacert"}
	served := map[string]map[string][]string{} // control plane, service account: names served
	for who, addr := range map[string]string{"istiod": istiod, "shardpilot": ours} {
		served[who] = map[string][]string{}
		for _, sa := range []string{"ingressgateway", "app"} {
			got, err := secretsServed(ctx, addr, token(sa), gatewayNode(ns, sa), names)
			if err != nil {
				t.Fatalf("%s, as %s: %v", who, sa, err)
			}
			served[who][sa] = got
		}
	}
	t.Logf("credentials served: %v", served)
	for _, sa := range []string{"ingressgateway", "app"} {
		for _, name := range served["shardpilot"][sa] {
			if !slices.Contains(served["istiod"][sa], name) {
				t.Errorf("shardpilot serves %s to %s, which istiod does not", name, sa)
			}
		}
	}
	if !slices.Equal(served["shardpilot"]["ingressgateway"], served["istiod"]["ingressgateway"]) || len(served["istiod"]["ingressgateway"]) != len(names) {
		t.Errorf("the gateway is served %v by shardpilot, %v by istiod; want both of %v", served["shardpilot"]["ingressgateway"], served["istiod"]["ingressgateway"], names)
	}

	// Without a certificate or a token.
	codesOf := map[string]codes.Code{}
	for who, addr := range map[string]string{"istiod": istiod, "shardpilot": ours} {
		_, err := secretsServed(ctx, addr, "", gatewayNode(ns, "app"), names)
		codesOf[who] = status.Code(err)
	}
	if codesOf["istiod"] != codesOf["shardpilot"] || codesOf["istiod"] == codes.OK {
		t.Errorf("a caller without a credential: istiod answers %v, shardpilot %v", codesOf["istiod"], codesOf["shardpilot"])
	}
	t.Logf("a caller without a credential: %v", codesOf)
}

// gatewayNode is a router of namespace ns running as service account sa.
func gatewayNode(ns, sa string) *core.Node {
	meta, _ := structpb.NewStruct(map[string]any{"NAMESPACE": ns, "SERVICE_ACCOUNT": sa, "ISTIO_VERSION": "1.30.3", "CLUSTER_ID": "Kubernetes",
		"LABELS": map[string]any{"istio": "ingressgateway"}, "INSTANCE_IPS": "10.77.0.1"})
	return &core.Node{Id: "router~10.77.0.1~" + sa + "-0." + ns + "~" + ns + ".svc.cluster.local", Metadata: meta, UserAgentName: "envoy"}
}

// secretsServed asks addr over TLS (the server's certificate unchecked:
// each control plane's own CA signed it), with a bearer token when one is
// given, for the named secrets, and returns the names of those served
// within 10 s, sorted.
func secretsServed(ctx context.Context, addr, token string, node *core.Node, names []string) ([]string, error) {
	opts := []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{InsecureSkipVerify: true}))}
	if token != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(bearer(token)))
	}
	conn, err := grpc.NewClient(addr, opts...)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	s, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		return nil, err
	}
	if err := s.Send(&discovery.DiscoveryRequest{Node: node, TypeUrl: resource.SecretType, ResourceNames: names}); err != nil {
		_, err = s.Recv()
		return nil, err
	}
	var got []string
	for {
		resp, err := s.Recv()
		if status.Code(err) == codes.DeadlineExceeded || errors.Is(err, context.DeadlineExceeded) {
			break // nothing more is served
		}
		if err != nil {
			return nil, err
		}
		got = got[:0]
		for _, r := range resp.GetResources() {
			var sec tlsv3.Secret
			if err := r.UnmarshalTo(&sec); err != nil {
				return nil, err
			}
			got = append(got, sec.GetName())
		}
		if len(got) == len(names) {
			break
		}
		if err := s.Send(&discovery.DiscoveryRequest{Node: node, TypeUrl: resource.SecretType, ResourceNames: names,
			VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()}); err != nil {
			return nil, err
		}
	}
	slices.Sort(got)
	return got, nil
}

type bearer string

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}
func (bearer) RequireTransportSecurity() bool { return true }
