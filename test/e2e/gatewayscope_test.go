package e2e

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/shardpilot/shardpilot/internal/testutil"
	"github.com/shardpilot/shardpilot/pkg/xds/identity"
	"github.com/shardpilot/shardpilot/pkg/xds/server"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/protobuf/types/known/structpb"
)

const paymentsGateway = `
apiVersion: networking.istio.io/v1
kind: Gateway
metadata: {name: pay, namespace: payments}
spec:
  selector: {istio: payments-gateway}
  servers:
  - port: {number: 8443, name: http, protocol: HTTP}
    hosts: ["payments/*"]
`

// TestGatewayLabelsDoNotCrossNamespaces: over mutual TLS, a router whose
// certificate is shop's and whose node claims the payments gateway's labels
// is served no listener of payments' Gateway; payments' own router is.
func TestGatewayLabelsDoNotCrossNamespaces(t *testing.T) {
	ca := testutil.NewCA(t)
	serverCert, serverKey := ca.Issue(t, "pusher")
	shopCert, shopKey := ca.Issue(t, "shop", "spiffe://cluster.local/ns/shop/sa/gateway")
	payCert, payKey := ca.Issue(t, "payments", "spiffe://cluster.local/ns/payments/sa/gateway")
	tc, err := identity.ServerTLS(serverCert, serverKey, ca.CertFile, testutil.Log(t))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	writeMesh(t, dir, "gateway.yaml", paymentsGateway)
	policy := &identity.Policy{TrustDomain: "cluster.local", Required: true}
	cp := NewCluster(t, Options{
		XDS:            server.Config{GRPCOptions: []grpc.ServerOption{grpc.Creds(credentials.NewTLS(tc))}},
		Policy:         policy,
		SharedGateways: []string{"istio-system"},
	}, yamlSource(dir))

	// listeners returns the listeners a router of ns is served; a stream
	// the server ends (its class changed while the mesh arrived) is an
	// error to retry.
	listeners := func(cert, key, ns string) ([]string, error) {
		t.Helper()
		return routerNames(t, cp.ads, ca.CertFile, cert, key, ns, map[string]any{"LABELS": map[string]any{"istio": "payments-gateway"}}, resource.ListenerType)
	}
	testutil.Eventually(t, 20*time.Second, "payments' router is served its Gateway's listener", func() (bool, string) {
		got, err := listeners(payCert, payKey, "payments")
		return slices.Contains(got, "0.0.0.0_8443"), fmt.Sprint(got, err)
	})
	if got, err := listeners(shopCert, shopKey, "shop"); err != nil || slices.Contains(got, "0.0.0.0_8443") {
		t.Errorf("shop's router claiming payments' labels was served %v (%v)", got, err)
	}
}

// TestGatewaySeesWhatItsNamespaceSees: a gateway proxy is served the
// clusters of the services exported to its namespace, as istiod serves a
// gateway: shop's router gets shop's catalog and not payments' ledger
// (exported to payments alone), payments' router gets both. Any workload
// connecting as a router got every service's clusters, exportTo ignored.
func TestGatewaySeesWhatItsNamespaceSees(t *testing.T) {
	ca := testutil.NewCA(t)
	serverCert, serverKey := ca.Issue(t, "pusher")
	shopCert, shopKey := ca.Issue(t, "shop", "spiffe://cluster.local/ns/shop/sa/gateway")
	payCert, payKey := ca.Issue(t, "payments", "spiffe://cluster.local/ns/payments/sa/gateway")
	tc, err := identity.ServerTLS(serverCert, serverKey, ca.CertFile, testutil.Log(t))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	writeMesh(t, dir, "services.yaml", privatePayments)
	cp := NewCluster(t, Options{
		XDS:    server.Config{GRPCOptions: []grpc.ServerOption{grpc.Creds(credentials.NewTLS(tc))}},
		Policy: &identity.Policy{TrustDomain: "cluster.local", Required: true},
	}, yamlSource(dir))
	const ledger, catalog = "outbound|8080||ledger.payments.svc.cluster.local", "outbound|8080||catalog.shop.svc.cluster.local"
	clusters := func(cert, key, ns string) ([]string, error) {
		return routerNames(t, cp.ads, ca.CertFile, cert, key, ns, nil, resource.ClusterType)
	}
	testutil.Eventually(t, 20*time.Second, "payments' router is served both services", func() (bool, string) {
		got, err := clusters(payCert, payKey, "payments")
		return slices.Contains(got, ledger) && slices.Contains(got, catalog), fmt.Sprint(got, err)
	})
	got, err := clusters(shopCert, shopKey, "shop")
	if err != nil || !slices.Contains(got, catalog) || slices.Contains(got, ledger) {
		t.Errorf("shop's router was served %v (%v), want catalog and not ledger", got, err)
	}
}

// routerNames returns the names of the resources of a type a router of ns
// (with node metadata meta) is served in its first response, over mutual
// TLS with cert and key.
func routerNames(t *testing.T, ads, caFile, cert, key, ns string, meta map[string]any, typeURL string) ([]string, error) {
	t.Helper()
	conn := dialTLS(t, ads, caFile, cert, key)
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		return nil, err
	}
	md, err := structpb.NewStruct(meta)
	if err != nil {
		return nil, err
	}
	node := &core.Node{Id: "router~10.0.0.7~gw." + ns + "~" + ns + ".svc.cluster.local", Metadata: md}
	if err := s.Send(&discovery.DiscoveryRequest{Node: node, TypeUrl: typeURL}); err != nil {
		return nil, err
	}
	resp, err := s.Recv()
	if err != nil {
		return nil, err
	}
	var names []string
	for _, a := range resp.Resources {
		m, err := a.UnmarshalNew()
		if err != nil {
			return nil, err
		}
		names = append(names, m.(interface{ GetName() string }).GetName())
	}
	return names, nil
}
