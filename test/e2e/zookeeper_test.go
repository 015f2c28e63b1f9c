package e2e

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/shardpilot/shardpilot/internal/app"
	"github.com/shardpilot/shardpilot/internal/testutil"
	"github.com/shardpilot/shardpilot/internal/zktest"
	"github.com/shardpilot/shardpilot/pkg/ingest/zookeeper"
	"google.golang.org/grpc/health"
)

func zookeeperSource(ensemble, addr string) source {
	return func(ctx context.Context, in ingester) error {
		return app.ZooKeeperSource{Etcd: in.etcd, Config: zookeeper.Config{Ensemble: ensemble, Servers: []string{addr}}, Election: in.election, Log: in.log}.Run(ctx)
	}
}

// TestProxylessGRPCFollowsZooKeeper: gRPC providers registered in a real
// ZooKeeper as Dubbo triple providers reach a real grpc-go client as
// routable endpoints, and a DestinationRule's version subsets with a
// VirtualService from the YAML directory split them 80/20.
func TestProxylessGRPCFollowsZooKeeper(t *testing.T) {
	zks := zktest.Start(t)
	a, b := startBackend(t), startBackend(t)
	provider := zktest.Connect(t, zks.Addr, 10*time.Second)
	const iface = "grpc.health.v1.Health"
	for _, p := range []string{"/dubbo", "/dubbo/" + iface, "/dubbo/" + iface + "/providers"} {
		if _, err := provider.Create(p, nil, 0, zk.WorldACL(zk.PermAll)); err != nil {
			t.Fatal(err)
		}
	}
	register := func(session *zk.Conn, version string, be backend) {
		u := fmt.Sprintf("tri://127.0.0.1:%d/%s?interface=%s&application=greeter&version=%s&namespace=demo&side=provider", be.port, iface, iface, version)
		if _, err := session.Create("/dubbo/"+iface+"/providers/"+zookeeper.ProviderNode(u), nil, zk.FlagEphemeral, zk.WorldACL(zk.PermAll)); err != nil {
			t.Fatal(err)
		}
	}
	register(provider, "v1", a)
	register(provider, "v2", b)

	// The service port is the one most providers listen on; with a tie,
	// the lowest.
	port := min(a.port, b.port)
	const host = "grpc.health.v1.health.demo.svc.cluster.local"
	dir := t.TempDir()
	writeMesh(t, dir, "split.yaml", fmt.Sprintf(`
apiVersion: networking.istio.io/v1
kind: DestinationRule
metadata: {name: health, namespace: demo}
spec:
  host: %[1]s
  subsets:
  - {name: v1, labels: {version: v1}}
  - {name: v2, labels: {version: v2}}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: health, namespace: demo}
spec:
  hosts: [%[1]s]
  http:
  - route:
    - destination: {host: %[1]s, subset: v1}
      weight: 80
    - destination: {host: %[1]s, subset: v2}
      weight: 20
`, host))
	// Both sources start at once: the YAML's routes wait (rejected, then
	// retried) until the registry's service is in the store.
	zkSource := newRestartable(zookeeperSource("zk1", zks.Addr))
	cp := NewCluster(t, Options{}, yamlSource(dir), zkSource.source)
	conn := dialXDS(t, cp.ads, fmt.Sprintf("xds:///%s:%d", host, port))
	splits8020(t, conn, a, b)

	// A third v1 provider, with a session of its own and on a lower port
	// than the service's (several providers on a host), joins subset v1:
	// the service keeps its port, so the client keeps its listener and
	// calls it too. When it leaves (its session closes, as a Dubbo
	// provider's does when it stops), the client stops calling it and no
	// RPC fails.
	c := backendBelow(t, port)
	third := zktest.Connect(t, zks.Addr, 10*time.Second)
	register(third, "v1", c)
	testutil.Eventually(t, 20*time.Second, "the third provider to serve RPCs", func() (bool, string) {
		got := spread(conn, 50)
		return got[c.addr] > 0, fmt.Sprint(got)
	})
	if got := spread(conn, 200); got[a.addr]+got[b.addr]+got[c.addr] != 200 {
		t.Errorf("200 RPCs with the third provider: %v; want all served", got)
	}
	third.Close()
	testutil.Eventually(t, 20*time.Second, "the client to stop calling the provider that left", func() (bool, string) {
		got := spread(conn, 50)
		return got[c.addr] == 0, fmt.Sprint(got)
	})
	if got := spread(conn, 200); got[a.addr]+got[b.addr] != 200 {
		t.Errorf("200 RPCs after the third provider left: %v; want all served by the other two", got)
	}

	// The ingester restarts, and meanwhile a provider joined on a lower
	// port: the service keeps the port it has in the store, and the
	// client calls the new provider without an RPC failing.
	zkSource.pause()
	d := backendBelow(t, port)
	register(provider, "v1", d)
	zkSource.resume()
	testutil.Eventually(t, 20*time.Second, "the provider added while the source was down to serve RPCs", func() (bool, string) {
		got := spread(conn, 50)
		return got[d.addr] > 0, fmt.Sprint(got)
	})
	if got := spread(conn, 200); got[a.addr]+got[b.addr]+got[d.addr] != 200 {
		t.Errorf("200 RPCs after the restart: %v; want all served", got)
	}
}

// backendBelow starts a backend on a loopback port below port.
func backendBelow(t *testing.T, port int) backend {
	t.Helper()
	for p := port - 1; p > 1024; p-- {
		if lis, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p)); err == nil {
			return serveBackend(t, lis, health.NewServer())
		}
	}
	t.Fatalf("no free port below %d", port)
	return backend{}
}

// restartable runs a source that the test can stop and start again.
type restartable struct {
	run     source
	stop    chan struct{} // closed: stop
	stopped chan struct{} // closed: stopped
	start   chan struct{} // closed: start again
}

func newRestartable(run source) *restartable {
	return &restartable{run: run, stop: make(chan struct{}), stopped: make(chan struct{}), start: make(chan struct{})}
}

func (r *restartable) source(ctx context.Context, in ingester) error {
	first, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-r.stop:
			cancel()
		case <-first.Done():
		}
	}()
	if err := r.run(first, in); ctx.Err() != nil || err != nil {
		return err
	}
	close(r.stopped)
	select {
	case <-r.start:
	case <-ctx.Done():
		return nil
	}
	return r.run(ctx, in)
}

func (r *restartable) pause()  { close(r.stop); <-r.stopped }
func (r *restartable) resume() { close(r.start) }
