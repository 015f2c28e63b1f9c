package app_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/nats-io/nats.go"
	"github.com/shardpilot/shardpilot/cmd/internal/app"
	"github.com/shardpilot/shardpilot/internal/embedded"
	"github.com/shardpilot/shardpilot/internal/testutil"
	"github.com/shardpilot/shardpilot/pkg/bus"
	"github.com/shardpilot/shardpilot/pkg/ingest"
	"github.com/shardpilot/shardpilot/pkg/model"
	"github.com/shardpilot/shardpilot/pkg/pusher"
	"github.com/shardpilot/shardpilot/pkg/store"
	"github.com/shardpilot/shardpilot/pkg/xds/cache"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"
)

// runningPusher is a pusher replica the test can stop.
type runningPusher struct {
	ads    string
	p      *pusher.Pusher
	c      *cache.Cache
	cancel context.CancelFunc
	done   chan error
}

func startPusher(t *testing.T, cli *clientv3.Client, nc *nats.Conn) *runningPusher {
	t.Helper()
	return startPusherWith(t, cli, nc, nil)
}

// startShardPusher starts a pusher serving the proxies of some namespaces
// (nil: all), its metrics in reg (nil: none).
func startShardPusher(t *testing.T, cli *clientv3.Client, nc *nats.Conn, reg prometheus.Registerer, namespaces []string) *runningPusher {
	t.Helper()
	return startPusherWith(t, cli, nc, func(p *app.Pusher) {
		p.Registerer, p.Namespaces = reg, namespaces
		if namespaces != nil {
			// A shard drains its proxies for a second when stopped, as a
			// pod's rolling update does (in its termination grace period).
			p.XDS.DrainTimeout = time.Second
		}
	})
}

// startPusherWith starts a pusher, configured by set when given, and
// returns it once it runs.
func startPusherWith(t *testing.T, cli *clientv3.Client, nc *nats.Conn, set func(*app.Pusher)) *runningPusher {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	rp := &runningPusher{ads: lis.Addr().String(), cancel: cancel, done: make(chan error, 1)}
	p := app.Pusher{Etcd: cli, NATS: nc, ADS: lis, Log: testutil.Log(t)}
	if set != nil {
		set(&p)
	}
	built, err := p.Build()
	if err != nil {
		t.Fatalf("the pusher did not start: %v", err)
	}
	rp.p, rp.c = built.Pusher, built.Cache
	go func() { rp.done <- built.Run(ctx) }()
	t.Cleanup(rp.stop)
	return rp
}

func (rp *runningPusher) stop() {
	rp.cancel()
	<-rp.done
	rp.done <- nil // a second stop returns at once
}

// content renders everything a pusher serves, for comparison.
func (rp *runningPusher) content() []byte {
	var b bytes.Buffer
	for _, class := range append([]string{cache.Shared}, pusher.Classes...) {
		types := pusher.ClassTypes
		if class == cache.Shared {
			types = pusher.SharedTypes
		}
		for _, typ := range types {
			res := rp.c.Resources(class, typ)
			for _, name := range sortedNames(res) {
				raw, _ := proto.MarshalOptions{Deterministic: true}.Marshal(res[name])
				fmt.Fprintf(&b, "%s %s %s %x\n", class, typ, name, raw)
			}
		}
	}
	return b.Bytes()
}

// syncedSource runs the YAML source of dir until ctx ends (its error to
// done) and returns once the whole mesh is in the store.
func syncedSource(t *testing.T, ctx context.Context, cli *clientv3.Client, dir string, done chan<- error) {
	t.Helper()
	synced := make(chan struct{})
	var once sync.Once
	go func() {
		done <- app.Source{Etcd: cli, MeshDir: dir, Log: testutil.Log(t), OnSynced: func(ingest.Result) { once.Do(func() { close(synced) }) }}.Run(ctx)
	}()
	select {
	case <-synced:
	case <-time.After(30 * time.Second):
		t.Fatal("the mesh directory was never synced")
	}
}

func waitConverged(t *testing.T, cli *clientv3.Client, what string, ps ...*runningPusher) {
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
			seen += fmt.Sprintf(" %d", p.p.GeneratedRevision())
			ok = ok && p.p.GeneratedRevision() == rev
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

	_, cli := testutil.Etcd(t)
	natsDir := t.TempDir()
	ns, err := embedded.StartNATS(natsDir, 0)
	if err != nil {
		t.Fatal(err)
	}
	port := ns.Port()
	t.Cleanup(func() { ns.Close() })
	nc := testutil.Connect(t, ns.URL)

	ctx, cancel := context.WithCancel(context.Background())
	srcDone, relayDone := make(chan error, 1), make(chan error, 1)
	syncedSource(t, ctx, cli, dir, srcDone)
	go func() { relayDone <- app.Relay{Etcd: cli, NATS: nc, Bus: bus.Config{}, Log: testutil.Log(t)}.Run(ctx) }()
	defer func() { cancel(); <-srcDone; <-relayDone }()

	p1, p2 := startPusher(t, cli, nc), startPusher(t, cli, nc)
	waitConverged(t, cli, "both pushers load the mesh", p1, p2)
	p2.stop()

	writeMesh(t, dir, "greeter.yaml", docs(greeterService, workloadEntry("greeter-1", "v1", b)))
	waitConverged(t, cli, "the running pusher follows an endpoint move", p1)

	// NATS goes down; the mesh changes in etcd meanwhile; NATS comes back.
	before, _ := store.New(cli).Revision(context.Background())
	ns.Close()
	writeMesh(t, dir, "greeter.yaml", docs(greeterService, workloadEntry("greeter-1", "v1", a),
		workloadEntry("greeter-2", "v2", b), greeterSplit))
	testutil.Eventually(t, 20*time.Second, "the ingester writes etcd while NATS is down", func() (bool, string) {
		rev, _ := store.New(cli).Revision(context.Background())
		return rev > before+2, fmt.Sprint(rev)
	})
	ns, err = embedded.StartNATS(natsDir, port)
	if err != nil {
		t.Fatal(err)
	}

	p3 := startPusher(t, cli, nc)
	waitConverged(t, cli, "the replica that stayed up and a fresh one reach the store's revision", p1, p3)
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
	_, cli := testutil.Etcd(t)
	_, nc := testutil.NATS(t)
	ctx, cancel := context.WithCancel(context.Background())
	srcDone, relayDone := make(chan error, 1), make(chan error, 1)
	syncedSource(t, ctx, cli, dir, srcDone)
	go func() { relayDone <- app.Relay{Etcd: cli, NATS: nc, Bus: bus.Config{}, Log: testutil.Log(t)}.Run(ctx) }()
	defer func() { cancel(); <-srcDone; <-relayDone }()
	p1, p2 := startPusher(t, cli, nc), startPusher(t, cli, nc)
	waitConverged(t, cli, "both replicas serve the mesh", p1, p2)

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
	_, cli := testutil.Etcd(t)
	_, nc := testutil.NATS(t)
	ctx, cancel := context.WithCancel(context.Background())
	srcDone, relayDone := make(chan error, 1), make(chan error, 1)
	syncedSource(t, ctx, cli, dir, srcDone)
	go func() { relayDone <- app.Relay{Etcd: cli, NATS: nc, Bus: bus.Config{}, Log: testutil.Log(t)}.Run(ctx) }()
	defer func() { cancel(); <-srcDone; <-relayDone }()
	p1, p2 := startPusher(t, cli, nc), startPusher(t, cli, nc)
	waitConverged(t, cli, "both replicas serve the mesh", p1, p2)

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
