package e2e

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/shardpilot/shardpilot/internal/app"
	"github.com/shardpilot/shardpilot/internal/testutil"
	"github.com/shardpilot/shardpilot/pkg/model"
	"github.com/shardpilot/shardpilot/pkg/pusher"
	"github.com/shardpilot/shardpilot/pkg/store"
	"github.com/shardpilot/shardpilot/pkg/xds/cache"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"
)

// shardPusher adds a pusher serving the proxies of some namespaces
// (nil: all).
func (c *Cluster) shardPusher(t *testing.T, namespaces []string) *Replica {
	t.Helper()
	return c.AddPusher(t, func(p *app.Pusher) {
		p.Namespaces = namespaces
		if namespaces != nil {
			// A shard drains its proxies for a second when stopped, as a
			// pod's rolling update does (in its termination grace period).
			p.XDS.DrainTimeout = time.Second
		}
	})
}

// content renders everything a pusher serves, for comparison.
func (rp *Replica) content() []byte {
	var b bytes.Buffer
	for _, class := range append([]cache.Class{cache.Shared}, pusher.Classes...) {
		types := pusher.ClassTypes
		if class == cache.Shared {
			types = pusher.SharedTypes
		}
		for _, typ := range types {
			res := rp.cache.Resources(class, typ)
			for _, name := range sortedNames(res) {
				raw, _ := proto.MarshalOptions{Deterministic: true}.Marshal(res[name])
				fmt.Fprintf(&b, "%s %s %s %x\n", class, typ, name, raw)
			}
		}
	}
	return b.Bytes()
}

func (c *Cluster) waitConverged(t *testing.T, what string, ps ...*Replica) {
	cli := c.etcd
	t.Helper()
	testutil.Eventually(t, 20*time.Second, what, func() (bool, string) {
		// The source has written the mesh: a store still empty is
		// "converged" too.
		services, err := cli.Get(context.Background(), model.Prefix+string(model.KindService)+"/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			return false, err.Error()
		}
		if services.Count == 0 {
			return false, "the store holds no service yet"
		}
		rev, err := store.New(cli).Revision(context.Background())
		if err != nil {
			return false, err.Error()
		}
		seen := fmt.Sprintf("store at %d; pushers at", rev)
		ok := true
		for _, p := range ps {
			seen += fmt.Sprintf(" %d", p.pusher.GeneratedRevision())
			ok = ok && p.pusher.GeneratedRevision() == rev
		}
		return ok, seen
	})
}

// TestRestartedPusherConverges stops one pusher replica, changes the mesh
// while it is down and while NATS is down too, then starts a fresh replica:
// it must serve exactly what the replica that stayed up serves.
func TestRestartedPusherConverges(t *testing.T) {
	a, b := startBackend(t), startBackend(t)
	dir := t.TempDir()
	writeMesh(t, dir, "greeter.yaml", docs(greeterService, workloadEntry("greeter-1", "v1", a)))

	cp := NewCluster(t, Options{Pushers: 2}, yamlSource(dir))
	cli, p1, p2 := cp.etcd, cp.Pushers[0], cp.Pushers[1]
	cp.waitConverged(t, "both pushers load the mesh", p1, p2)
	p2.stop()

	writeMesh(t, dir, "greeter.yaml", docs(greeterService, workloadEntry("greeter-1", "v1", b)))
	cp.waitConverged(t, "the running pusher follows an endpoint move", p1)

	// NATS goes down; the mesh changes in etcd meanwhile; NATS comes back.
	before, _ := store.New(cli).Revision(context.Background())
	cp.stopNATS()
	writeMesh(t, dir, "greeter.yaml", docs(greeterService, workloadEntry("greeter-1", "v1", a),
		workloadEntry("greeter-2", "v2", b), greeterSplit))
	testutil.Eventually(t, 20*time.Second, "the ingester writes etcd while NATS is down", func() (bool, string) {
		rev, _ := store.New(cli).Revision(context.Background())
		return rev > before+2, fmt.Sprint(rev)
	})
	cp.startNATS(t)

	p3 := cp.AddPusher(t, nil)
	cp.waitConverged(t, "the replica that stayed up and a fresh one reach the store's revision", p1, p3)
	if c1, c3 := p1.content(), p3.content(); !bytes.Equal(c1, c3) {
		t.Fatalf("replicas serve different resources:\nstayed up:\n%s\nrestarted:\n%s", c1, c3)
	}
	if len(p1.content()) == 0 {
		t.Fatal("the pushers serve nothing")
	}
}

// TestDeltaReconnectToAnotherReplica: a Delta proxy that moves to another
// pusher replica says what it has (initial_resource_versions); resource
// versions are content hashes, the same on every replica, so it is sent
// nothing it already has — only the next real change.
func TestDeltaReconnectToAnotherReplica(t *testing.T) {
	a, b := startBackend(t), startBackend(t)
	dir := t.TempDir()
	writeMesh(t, dir, "greeter.yaml", docs(greeterService, workloadEntry("greeter-1", "v1", a), workloadEntry("greeter-2", "v2", b), greeterSplit))
	cp := NewCluster(t, Options{Pushers: 2}, yamlSource(dir))
	p1, p2 := cp.Pushers[0], cp.Pushers[1]
	cp.waitConverged(t, "both replicas serve the mesh", p1, p2)
	ctx := t.Context()

	node := &core.Node{Id: "sidecar~10.0.0.9~mover.demo~demo.svc.cluster.local"}
	subscribe := func(addr string, known map[string]string) (*receiver[*discovery.DeltaDiscoveryResponse], discovery.AggregatedDiscoveryService_DeltaAggregatedResourcesClient, func()) {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		sctx, scancel := context.WithCancel(ctx)
		s, err := discovery.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(sctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Send(&discovery.DeltaDiscoveryRequest{Node: node, TypeUrl: resource.ClusterType,
			ResourceNamesSubscribe: []string{"*"}, InitialResourceVersions: known}); err != nil {
			t.Fatal(err)
		}
		return receive(s), s, func() { scancel(); conn.Close() }
	}

	rx1, _, close1 := subscribe(p1.ads, nil)
	first, err := rx1.next(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	known := map[string]string{}
	for _, r := range first.Resources {
		known[r.Name] = r.Version
	}
	close1()
	if len(known) != 7 {
		t.Fatalf("replica 1 sent %d clusters, want the greeter's 3, its inbound one and the 3 catch-all clusters", len(known))
	}

	rx2, s2, close2 := subscribe(p2.ads, known)
	defer close2()
	// Replica 2 may answer the subscription, but with nothing in it.
	if resp, err := rx2.next(700 * time.Millisecond); err == nil {
		if len(resp.Resources) > 0 || len(resp.RemovedResources) > 0 {
			t.Fatalf("replica 2 re-sent %d resources the proxy already had (and removed %d)", len(resp.Resources), len(resp.RemovedResources))
		}
		if err := s2.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.ClusterType, ResponseNonce: resp.Nonce}); err != nil {
			t.Fatal(err)
		}
	}
	writeMesh(t, dir, "greeter.yaml", docs(greeterService, workloadEntry("greeter-1", "v1", a), workloadEntry("greeter-2", "v2", b)))
	resp, err := rx2.next(10 * time.Second)
	if err != nil {
		t.Fatalf("the next change did not arrive: %v", err)
	}
	if len(resp.Resources) != 0 || len(resp.RemovedResources) != 2 {
		t.Errorf("after the subsets went: %d resources, %d removed; want 0 and the 2 subset clusters", len(resp.Resources), len(resp.RemovedResources))
	}
}

// TestSotWReconnectToAnotherReplica: SotW response versions are content
// hashes, the same on every replica, so a proxy that moves to another
// replica and says which versions it holds is sent nothing for the types
// it already has — only the next real change.
func TestSotWReconnectToAnotherReplica(t *testing.T) {
	a, b := startBackend(t), startBackend(t)
	dir := t.TempDir()
	writeMesh(t, dir, "greeter.yaml", docs(greeterService, workloadEntry("greeter-1", "v1", a), workloadEntry("greeter-2", "v2", b), greeterSplit))
	cp := NewCluster(t, Options{Pushers: 2}, yamlSource(dir))
	p1, p2 := cp.Pushers[0], cp.Pushers[1]
	cp.waitConverged(t, "both replicas serve the mesh", p1, p2)
	ctx := t.Context()

	node := &core.Node{Id: "sidecar~10.0.0.9~sotw-mover.demo~demo.svc.cluster.local"}
	type sotw struct {
		rx *receiver[*discovery.DiscoveryResponse]
		s  discovery.AggregatedDiscoveryService_StreamAggregatedResourcesClient
	}
	open := func(addr string) (sotw, func()) {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		sctx, scancel := context.WithCancel(ctx)
		s, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(sctx)
		if err != nil {
			t.Fatal(err)
		}
		return sotw{receive(s), s}, func() { scancel(); conn.Close() }
	}
	send := func(st sotw, r *discovery.DiscoveryRequest) {
		t.Helper()
		r.Node = node
		if err := st.s.Send(r); err != nil {
			t.Fatal(err)
		}
	}

	// On replica 1: clusters, then the endpoints of every EDS cluster,
	// then listeners, each ACKed.
	st1, close1 := open(p1.ads)
	held := map[string]*discovery.DiscoveryRequest{} // type → the ACK the proxy last sent
	var edsNames []string
	for _, typ := range []string{resource.ClusterType, resource.EndpointType, resource.ListenerType} {
		req := &discovery.DiscoveryRequest{TypeUrl: typ}
		if typ == resource.EndpointType {
			req.ResourceNames = edsNames
		}
		send(st1, req)
		resp, err := st1.rx.next(10 * time.Second)
		if err != nil {
			t.Fatalf("%s: %v", typ, err)
		}
		if typ == resource.ClusterType {
			for _, r := range resp.Resources {
				var c clusterv3.Cluster
				if err := r.UnmarshalTo(&c); err != nil {
					t.Fatal(err)
				}
				if c.GetType() == clusterv3.Cluster_EDS {
					edsNames = append(edsNames, c.Name)
				}
			}
		}
		ack := &discovery.DiscoveryRequest{TypeUrl: typ, VersionInfo: resp.VersionInfo, ResponseNonce: resp.Nonce, ResourceNames: req.ResourceNames}
		send(st1, ack)
		held[typ] = ack
	}
	close1()
	if len(edsNames) != 3 {
		t.Fatalf("replica 1 sent %d EDS clusters, want the greeter's 3", len(edsNames))
	}

	// On replica 2, a new stream says what the proxy holds.
	st2, close2 := open(p2.ads)
	defer close2()
	for _, typ := range []string{resource.ClusterType, resource.EndpointType, resource.ListenerType} {
		send(st2, &discovery.DiscoveryRequest{TypeUrl: typ, VersionInfo: held[typ].VersionInfo, ResourceNames: held[typ].ResourceNames})
	}
	if resp, err := st2.rx.next(700 * time.Millisecond); err == nil {
		t.Fatalf("replica 2 re-sent %d %s resources the proxy already had (version %s)", len(resp.Resources), resp.TypeUrl, resp.VersionInfo)
	}

	// The next change arrives: the subsets go, and with them two clusters.
	writeMesh(t, dir, "greeter.yaml", docs(greeterService, workloadEntry("greeter-1", "v1", a), workloadEntry("greeter-2", "v2", b)))
	resp, err := st2.rx.next(10 * time.Second)
	if err != nil {
		t.Fatalf("the next change did not arrive: %v", err)
	}
	if resp.TypeUrl != resource.ClusterType || len(resp.Resources) != 5 || resp.VersionInfo == held[resource.ClusterType].VersionInfo {
		t.Errorf("after the subsets went: %s with %d resources at version %s; want the 5 remaining clusters at a new version",
			resp.TypeUrl, len(resp.Resources), resp.VersionInfo)
	}
}
