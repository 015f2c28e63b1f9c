package app_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/shardpilot/shardpilot/cmd/internal/app"
	"github.com/shardpilot/shardpilot/internal/testutil"
	"github.com/shardpilot/shardpilot/internal/zktest"
	"github.com/shardpilot/shardpilot/pkg/ingest/zookeeper"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func zookeeperSource(ensemble, addr string) source {
	return func(ctx context.Context, etcd *clientv3.Client, log *slog.Logger) error {
		return app.ZooKeeperSource{Etcd: etcd, Config: zookeeper.Config{Ensemble: ensemble, Servers: []string{addr}}, Log: log}.Run(ctx)
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
	cp := startControlPlane(t, yamlSource(dir), zookeeperSource("zk1", zks.Addr))
	conn := dialXDS(t, cp.ads, fmt.Sprintf("xds:///%s:%d", host, port))
	splits8020(t, conn, a, b)

	// A third v1 provider, with a session of its own, joins subset v1;
	// when it leaves (its session closes, as a Dubbo provider's does when
	// it stops), the client stops calling it and no RPC fails.
	c := startBackend(t)
	third := zktest.Connect(t, zks.Addr, 10*time.Second)
	register(third, "v1", c)
	testutil.Eventually(t, 20*time.Second, "the third provider to serve RPCs", func() (bool, string) {
		got := spread(conn, 50)
		return got[c.addr] > 0, fmt.Sprint(got)
	})
	third.Close()
	testutil.Eventually(t, 20*time.Second, "the client to stop calling the provider that left", func() (bool, string) {
		got := spread(conn, 50)
		return got[c.addr] == 0, fmt.Sprint(got)
	})
	if got := spread(conn, 200); got[a.addr]+got[b.addr] != 200 {
		t.Errorf("200 RPCs after the third provider left: %v; want all served by the other two", got)
	}
}
