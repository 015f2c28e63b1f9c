package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	statusv3 "github.com/envoyproxy/go-control-plane/envoy/service/status/v3"
	matcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/shardpilot/shardpilot/internal/testutil"
	"github.com/shardpilot/shardpilot/pkg/xds/identity"
	"github.com/shardpilot/shardpilot/pkg/xds/server"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/grpc/xds"
	"google.golang.org/protobuf/types/known/structpb"
)

// dialXDSWithCert dials target through grpc-go's xDS resolver over mTLS:
// its bootstrap's "tls" channel credentials watch the certificate files
// (grpc-go's file-watcher certificate provider).
func dialXDSWithCert(t *testing.T, ads, target, nodeID, namespace, ca, cert, key string) *grpc.ClientConn {
	t.Helper()
	meta := `"GENERATOR": "grpc"`
	if namespace != "" {
		meta += fmt.Sprintf(`, "NAMESPACE": %q`, namespace)
	}
	bootstrap := fmt.Sprintf(`{
		"xds_servers": [{"server_uri": %q, "server_features": ["xds_v3"],
			"channel_creds": [{"type": "tls", "config": {"ca_certificate_file": %q, "certificate_file": %q, "private_key_file": %q}}]}],
		"node": {"id": %q, "metadata": {%s}}
	}`, ads, ca, cert, key, nodeID, meta)
	resolver, err := xds.NewXDSResolverWithConfigForTesting([]byte(bootstrap))
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithResolvers(resolver))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// TestMutualTLS serves ADS over mTLS with identities from SPIFFE client
// certificates: a grpc-go xDS client with a certificate for namespace demo
// routes real RPCs; a client without a certificate, one whose node claims
// another namespace than its certificate, and one of another trust domain
// are refused; CSDS answers a caller for its own namespace's proxies.
func TestMutualTLS(t *testing.T) {
	f := startMutualTLS(t)
	t.Run("served its namespace", f.servedItsNamespace)
	t.Run("a node that claims no namespace is given its certificate's", f.givenItsCertificatesNamespace)
	f.refused(t)
	t.Run("CSDS answers for the caller's namespace", f.csdsOfTheCallersNamespace)
	t.Run("the names one identity subscribes to are bounded in bytes", f.boundedSubscriptions)
	t.Run("one identity holds a bounded number of streams", f.boundedStreams)
	t.Run("CSDS answers for a stream from its own node", f.csdsFromItsOwnNode)
}

// mutualTLS is a pusher serving ADS over mutual TLS, one policy for ADS
// and CSDS as cmd/pusher has it, with client certificates of namespaces
// demo and other, of another trust domain and without a SPIFFE ID.
type mutualTLS struct {
	cp                      *Cluster
	ca                      *testutil.CA
	a                       backend
	streams                 *identity.StreamLimit
	demoCert, demoKey       string
	otherCert, otherKey     string
	foreignCert, foreignKey string
	plainCert, plainKey     string
}

const mtlsTarget = "xds:///greeter.demo.svc.cluster.local:50051"

func startMutualTLS(t *testing.T) *mutualTLS {
	f := &mutualTLS{ca: testutil.NewCA(t)}
	ca := f.ca
	serverCert, serverKey := ca.Issue(t, "pusher")
	f.demoCert, f.demoKey = ca.Issue(t, "client-demo", "spiffe://cluster.local/ns/demo/sa/client")
	f.otherCert, f.otherKey = ca.Issue(t, "client-other", "spiffe://cluster.local/ns/other/sa/client")
	f.foreignCert, f.foreignKey = ca.Issue(t, "client-foreign", "spiffe://evil.example/ns/demo/sa/client")
	f.plainCert, f.plainKey = ca.Issue(t, "client-no-spiffe")
	tc, err := identity.ServerTLS(serverCert, serverKey, ca.CertFile, testutil.Log(t))
	if err != nil {
		t.Fatal(err)
	}
	f.a = startBackend(t)
	dir := t.TempDir()
	writeMesh(t, dir, "greeter.yaml", docs(greeterService, workloadEntry("greeter-1", "v1", f.a)))
	if f.streams, err = identity.NewStreamLimit(8, nil); err != nil {
		t.Fatal(err)
	}
	policy := &identity.Policy{TrustDomain: "cluster.local", Required: true, Streams: f.streams}
	f.cp = NewCluster(t, Options{XDS: server.Config{
		GRPCOptions: []grpc.ServerOption{grpc.Creds(credentials.NewTLS(tc))},
		NameBudget:  server.NameBudget{PerIdentity: 2 << 20},
	}, Policy: policy}, yamlSource(dir))
	return f
}

// adsCall opens an ADS stream with the given client credentials and
// node, and returns the error of its first answer.
func (f *mutualTLS) adsCall(t *testing.T, creds credentials.TransportCredentials, node *core.Node) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := dialADS(t, f.cp.ads, creds).StreamAggregatedResources(ctx)
	if err != nil {
		return err
	}
	if err := s.Send(&discovery.DiscoveryRequest{Node: node, TypeUrl: resource.ClusterType}); err != nil {
		_, err = s.Recv()
		return err
	}
	_, err = s.Recv()
	return err
}

// tlsWith are client credentials presenting cert ("": none).
func (f *mutualTLS) tlsWith(t *testing.T, cert, key string) credentials.TransportCredentials {
	return tlsCreds(t, f.ca.CertFile, cert, key)
}

// mtlsNode is a sidecar of a namespace, saying so in its metadata.
func mtlsNode(ns string) *core.Node {
	return &core.Node{Id: "sidecar~10.0.0.1~x." + ns + "~" + ns + ".svc.cluster.local",
		Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{"NAMESPACE": structpb.NewStringValue(ns)}}}
}

// servedItsNamespace: a client with a certificate for demo calls the greeter.
func (f *mutualTLS) servedItsNamespace(t *testing.T) {
	conn := dialXDSWithCert(t, f.cp.ads, mtlsTarget, "sidecar~127.0.0.1~client.demo~demo.svc.cluster.local", "demo", f.ca.CertFile, f.demoCert, f.demoKey)
	allOn(t, conn, f.a.addr, "a client with a certificate for demo calls the greeter")
}

// givenItsCertificatesNamespace: a node that claims no namespace is
// served as its certificate's.
func (f *mutualTLS) givenItsCertificatesNamespace(t *testing.T) {
	conn := dialXDSWithCert(t, f.cp.ads, mtlsTarget, "anonymous-client", "", f.ca.CertFile, f.demoCert, f.demoKey)
	allOn(t, conn, f.a.addr, "a client that names no namespace calls the greeter")
	if ns := f.cp.status.Node("anonymous-client").GetMetadata().GetFields()["NAMESPACE"].GetStringValue(); ns != "demo" {
		t.Errorf("served as namespace %q, want its certificate's, demo", ns)
	}
}

// refused: what ADS refuses, and why.
func (f *mutualTLS) refused(t *testing.T) {
	for _, c := range []struct {
		name  string
		creds credentials.TransportCredentials
		node  *core.Node
		code  codes.Code
		says  string
	}{
		{"without a certificate", f.tlsWith(t, "", ""), mtlsNode("demo"), codes.Unavailable, ""},
		{"plaintext", insecure.NewCredentials(), mtlsNode("demo"), codes.Unavailable, ""},
		{"claims another namespace", f.tlsWith(t, f.demoCert, f.demoKey), mtlsNode("payments"), codes.PermissionDenied, `claims namespace "payments"`},
		{"an id of another namespace, metadata of its own", f.tlsWith(t, f.demoCert, f.demoKey), &core.Node{Id: "sidecar~10.0.0.1~x.payments~payments.svc.cluster.local",
			Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{"NAMESPACE": structpb.NewStringValue("demo")}}}, codes.PermissionDenied, `names namespace "payments" in its id`},
		{"another trust domain", f.tlsWith(t, f.foreignCert, f.foreignKey), mtlsNode("demo"), codes.PermissionDenied, `trust domain "evil.example"`},
		{"a certificate without a SPIFFE ID", f.tlsWith(t, f.plainCert, f.plainKey), mtlsNode("demo"), codes.PermissionDenied, "carries no SPIFFE ID"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := f.adsCall(t, c.creds, c.node)
			if grpcstatus.Code(err) != c.code || !strings.Contains(fmt.Sprint(err), c.says) {
				t.Errorf("got %v, want %s saying %q", err, c.code, c.says)
			}
		})
	}
	if err := f.adsCall(t, f.tlsWith(t, f.demoCert, f.demoKey), mtlsNode("demo")); err != nil {
		t.Errorf("the demo certificate with a demo node: %v", err)
	}

}

// csdsOfTheCallersNamespace: CSDS answers for the caller's namespace
// alone, and refuses another trust domain as ADS does.
func (f *mutualTLS) csdsOfTheCallersNamespace(t *testing.T) {
	conn := dialXDSWithCert(t, f.cp.ads, mtlsTarget, "sidecar~127.0.0.1~csds.demo~demo.svc.cluster.local", "demo", f.ca.CertFile, f.demoCert, f.demoKey)
	allOn(t, conn, f.a.addr, "a client of demo calls the greeter")
	proxies := func(cert, key string) []string {
		conn, err := grpc.NewClient(f.cp.ads, grpc.WithTransportCredentials(f.tlsWith(t, cert, key)))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		resp, err := statusv3.NewClientStatusDiscoveryServiceClient(conn).FetchClientStatus(context.Background(), &statusv3.ClientStatusRequest{})
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, c := range resp.Config {
			ids = append(ids, c.GetNode().GetId())
		}
		return ids
	}
	if got := proxies(f.demoCert, f.demoKey); len(got) != 1 || got[0] != "sidecar~127.0.0.1~csds.demo~demo.svc.cluster.local" {
		t.Errorf("demo's caller sees %v, want demo's grpc-go client", got)
	}
	if got := proxies(f.otherCert, f.otherKey); len(got) != 0 {
		t.Errorf("another namespace's caller sees %v", got)
	}
	// A caller of another trust domain is refused, as ADS refuses it.
	conn, err := grpc.NewClient(f.cp.ads, grpc.WithTransportCredentials(f.tlsWith(t, f.foreignCert, f.foreignKey)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, err = statusv3.NewClientStatusDiscoveryServiceClient(conn).FetchClientStatus(context.Background(), &statusv3.ClientStatusRequest{})
	if grpcstatus.Code(err) != codes.PermissionDenied || !strings.Contains(fmt.Sprint(err), `trust domain "evil.example"`) {
		t.Errorf("CSDS for another trust domain: %v, want PermissionDenied naming it", err)
	}
}

// boundedSubscriptions: one identity subscribing to made-up names, on
// as many connections as it likes, is refused once they would hold more
// than its budget (2 MiB here); another identity is served meanwhile, and
// what the refused streams held is given back.
func (f *mutualTLS) boundedSubscriptions(t *testing.T) {
	demo := identity.ID{TrustDomain: "cluster.local", Namespace: "demo", ServiceAccount: "client"}
	held := f.streams.Held(demo)
	ctx, cancel := context.WithCancel(context.Background())
	defer func() { cancel() }()
	// subscribe opens a stream on a connection of its own, takes the
	// clusters a wildcard request is answered with and asks again for
	// them and n made-up names of a kilobyte: the existing clusters are
	// answered, or the stream refused.
	made := 0
	subscribe := func(cert, key, ns string, n int) error {
		s, err := dialADS(t, f.cp.ads, f.tlsWith(t, cert, key)).StreamAggregatedResources(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Send(&discovery.DiscoveryRequest{Node: mtlsNode(ns), TypeUrl: resource.ClusterType}); err != nil {
			t.Fatal(err)
		}
		resp, err := s.Recv()
		if err != nil {
			return err
		}
		var names []string
		for _, a := range resp.Resources {
			c := &clusterv3.Cluster{}
			if err := a.UnmarshalTo(c); err != nil {
				t.Fatal(err)
			}
			names = append(names, c.Name)
		}
		for range n {
			made++
			names = append(names, fmt.Sprintf("made-up-%06d-%s", made, strings.Repeat("x", 1000)))
		}
		if err := s.Send(&discovery.DiscoveryRequest{TypeUrl: resource.ClusterType, ResourceNames: names,
			VersionInfo: resp.VersionInfo, ResponseNonce: resp.Nonce}); err != nil {
			t.Fatal(err)
		}
		_, err = s.Recv()
		return err
	}
	// 700 names of a kilobyte: two such streams fit demo's 2 MiB, the
	// third does not.
	for i := range 2 {
		if err := subscribe(f.demoCert, f.demoKey, "demo", 700); err != nil {
			t.Fatalf("demo's stream %d: %v", i+1, err)
		}
	}
	err := subscribe(f.demoCert, f.demoKey, "demo", 700)
	if grpcstatus.Code(err) != codes.ResourceExhausted || !strings.Contains(fmt.Sprint(err), "of identity spiffe://cluster.local/ns/demo/sa/client") {
		t.Fatalf("demo's third stream: %v, want ResourceExhausted naming its identity", err)
	}
	if err := subscribe(f.otherCert, f.otherKey, "other", 700); err != nil {
		t.Fatalf("another identity, meanwhile: %v", err)
	}
	conn := dialXDSWithCert(t, f.cp.ads, mtlsTarget, "sidecar~127.0.0.1~budget.other~other.svc.cluster.local", "other", f.ca.CertFile, f.otherCert, f.otherKey)
	allOn(t, conn, f.a.addr, "another identity's client calls the greeter")
	// Once demo's streams end, what they held is given back.
	cancel()
	ctx, cancel = context.WithCancel(context.Background())
	testutil.Eventually(t, 30*time.Second, "demo's budget given back", func() (bool, string) {
		err := subscribe(f.demoCert, f.demoKey, "demo", 700)
		return err == nil, fmt.Sprint(err)
	})
	// The next test counts demo's streams: these are gone first.
	cancel()
	testutil.Eventually(t, 30*time.Second, "demo's streams of this test ended", func() (bool, string) {
		n := f.streams.Held(demo)
		return n == held, fmt.Sprintf("%d streams, want %d", n, held)
	})
}

// boundedStreams: one identity holds a bounded number of streams.
func (f *mutualTLS) boundedStreams(t *testing.T) {
	// Streams of demo's identity until one is refused: the limit (8)
	// counts the ones the subtests above left open too.
	conn, err := grpc.NewClient(f.cp.ads, grpc.WithTransportCredentials(f.tlsWith(t, f.demoCert, f.demoKey)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ads := discovery.NewAggregatedDiscoveryServiceClient(conn)
	var refused error
	for i := 0; i < 9 && refused == nil; i++ {
		s, err := ads.StreamAggregatedResources(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Send(&discovery.DiscoveryRequest{Node: mtlsNode("demo"), TypeUrl: resource.ClusterType}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Recv(); err != nil {
			refused = err
		}
	}
	if grpcstatus.Code(refused) != codes.ResourceExhausted || !strings.Contains(fmt.Sprint(refused), "spiffe://cluster.local/ns/demo/sa/client holds 8 streams") {
		t.Fatalf("the ninth stream of one identity: %v, want ResourceExhausted naming it", refused)
	}
	if got := f.streams.Held(identity.ID{TrustDomain: "cluster.local", Namespace: "demo", ServiceAccount: "client"}); got != 8 {
		t.Errorf("demo holds %d streams, want 8", got)
	}
	if err := f.adsCall(t, f.tlsWith(t, f.otherCert, f.otherKey), mtlsNode("other")); err != nil {
		t.Errorf("another identity, meanwhile: %v", err)
	}
}

// csdsFromItsOwnNode: CSDS answers for a stream from its own node.
func (f *mutualTLS) csdsFromItsOwnNode(t *testing.T) {
	// Two proxies of two namespaces claim one id (of no namespace):
	// each is served its certificate's namespace, and other's caller,
	// asking for that id, is answered from other's stream alone.
	const shared = "shared-proxy-id"
	demo := dialXDSWithCert(t, f.cp.ads, mtlsTarget, shared, "", f.ca.CertFile, f.demoCert, f.demoKey)
	allOn(t, demo, f.a.addr, "demo's proxy calls the greeter")
	other := dialXDSWithCert(t, f.cp.ads, mtlsTarget, shared, "", f.ca.CertFile, f.otherCert, f.otherKey)
	allOn(t, other, f.a.addr, "other's proxy calls the greeter")
	conn, err := grpc.NewClient(f.cp.ads, grpc.WithTransportCredentials(f.tlsWith(t, f.otherCert, f.otherKey)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	csds := statusv3.NewClientStatusDiscoveryServiceClient(conn)
	for i := range 30 {
		resp, err := csds.FetchClientStatus(context.Background(), &statusv3.ClientStatusRequest{
			NodeMatchers: []*matcherv3.NodeMatcher{{NodeId: &matcherv3.StringMatcher{MatchPattern: &matcherv3.StringMatcher_Exact{Exact: shared}}}}})
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Config) != 1 {
			t.Fatalf("request %d: %d configs for %s, want other's one", i, len(resp.Config), shared)
		}
		if ns := resp.Config[0].GetNode().GetMetadata().GetFields()["NAMESPACE"].GetStringValue(); ns != "other" {
			t.Fatalf("request %d: other's caller was answered from a node of namespace %q", i, ns)
		}
	}
}
