package e2e

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/shardpilot/shardpilot/internal/testutil"
	"google.golang.org/protobuf/types/known/structpb"
)

const privatePayments = `
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: ledger, namespace: payments}
spec:
  hosts: [ledger.payments.svc.cluster.local]
  exportTo: ["."]
  ports: [{number: 8080, name: http, protocol: HTTP}]
  resolution: STATIC
  endpoints: [{address: 10.9.9.9}]
---
apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: catalog, namespace: shop}
spec:
  hosts: [catalog.shop.svc.cluster.local]
  ports: [{number: 8080, name: http, protocol: HTTP}]
  resolution: STATIC
  endpoints: [{address: 10.1.1.1}]
`

// TestEDSVisibility: a proxy is served the load assignments its class's
// clusters name and no other, whether it asks for another's by name or by
// wildcard, over SotW and Delta: a shop sidecar asking for a payments
// service exported to payments alone gets nothing of it, while a payments
// sidecar gets it.
func TestEDSVisibility(t *testing.T) {
	dir := t.TempDir()
	writeMesh(t, dir, "mesh.yaml", privatePayments)
	cp := NewCluster(t, Options{}, yamlSource(dir))
	ads := dialADS(t, cp.ads, nil)
	const ledger, catalog = "outbound|8080||ledger.payments.svc.cluster.local", "outbound|8080||catalog.shop.svc.cluster.local"
	node := func(ns string) *core.Node {
		return &core.Node{Id: "sidecar~10.0.0.1~x." + ns + "~" + ns + ".svc.cluster.local",
			Metadata: &structpb.Struct{Fields: map[string]*structpb.Value{"NAMESPACE": structpb.NewStringValue(ns)}}}
	}
	// served returns the load assignments a SotW stream of ns is sent for
	// its EDS request of names (none: the wildcard), once its clusters are
	// in. A stream the server ends (its class changed while the mesh was
	// still arriving) is an error to retry.
	served := func(ns string, names ...string) ([]string, error) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		s, err := ads.StreamAggregatedResources(ctx)
		if err != nil {
			return nil, err
		}
		if err := s.Send(&discovery.DiscoveryRequest{Node: node(ns), TypeUrl: resource.ClusterType}); err != nil {
			return nil, err
		}
		if _, err := s.Recv(); err != nil {
			return nil, err
		}
		if err := s.Send(&discovery.DiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNames: names}); err != nil {
			return nil, err
		}
		// The catalog is visible to both: every answer carries it.
		resp, err := s.Recv()
		if err != nil {
			return nil, err
		}
		var got []string
		for _, a := range resp.Resources {
			cla := &endpoint.ClusterLoadAssignment{}
			if err := a.UnmarshalTo(cla); err != nil {
				return nil, err
			}
			got = append(got, cla.ClusterName)
		}
		slices.Sort(got)
		return got, nil
	}
	testutil.Eventually(t, 30*time.Second, "the mesh is served", func() (bool, string) {
		got, err := served("payments", ledger, catalog)
		return err == nil && len(got) == 2, fmt.Sprint(got, err)
	})
	for name, tc := range map[string]struct {
		ns    string
		names []string
		want  []string
	}{
		"shop, by name":     {"shop", []string{ledger, catalog}, []string{catalog}},
		"shop, wildcard":    {"shop", nil, []string{catalog}},
		"payments, by name": {"payments", []string{ledger, catalog}, []string{catalog, ledger}},
	} {
		t.Run(name, func(t *testing.T) {
			if got, err := served(tc.ns, tc.names...); err != nil || !slices.Equal(got, tc.want) {
				t.Errorf("served %v (%v), want %v", got, err, tc.want)
			}
		})
	}
	t.Run("shop, Delta", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		s, err := ads.DeltaAggregatedResources(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Send(&discovery.DeltaDiscoveryRequest{Node: node("shop"), TypeUrl: resource.ClusterType}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Recv(); err != nil {
			t.Fatal(err)
		}
		for _, subscribe := range [][]string{{ledger, catalog}, {"*"}} {
			if err := s.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNamesSubscribe: subscribe}); err != nil {
				t.Fatal(err)
			}
		}
		resp, err := s.Recv()
		if err != nil {
			t.Fatal(err)
		}
		var sent []string
		for _, r := range resp.Resources {
			sent = append(sent, r.Name)
		}
		// The catalog, which shop sees, and nothing else.
		if !slices.Equal(sent, []string{catalog}) {
			t.Errorf("shop's Delta stream was sent %v, want %s alone", sent, catalog)
		}
	})
}
