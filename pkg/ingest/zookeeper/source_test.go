package zookeeper_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/shardpilot/shardpilot/internal/testutil"
	"github.com/shardpilot/shardpilot/internal/zktest"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/ingest"
	"github.com/shardpilot/shardpilot/pkg/ingest/zookeeper"
	"github.com/shardpilot/shardpilot/pkg/model"
	"github.com/shardpilot/shardpilot/pkg/store"
)

func TestMain(m *testing.M) { testutil.VerifyNoLeaks(m) }

const iface = "org.apache.dubbo.demo.DemoService"

// mkdirs creates p and its parents, persistent, as Dubbo does.
func mkdirs(t *testing.T, c *zk.Conn, p string) {
	t.Helper()
	cur := ""
	for _, part := range strings.Split(strings.Trim(p, "/"), "/") {
		cur += "/" + part
		if _, err := c.Create(cur, nil, 0, zk.WorldACL(zk.PermAll)); err != nil && err != zk.ErrNodeExists {
			t.Fatalf("create %s: %v", cur, err)
		}
	}
}

// register registers a provider URL as an ephemeral node of c's session.
func register(t *testing.T, c *zk.Conn, providerURL string) string {
	t.Helper()
	p := "/dubbo/" + iface + "/providers/" + zookeeper.ProviderNode(providerURL)
	if _, err := c.Create(p, nil, zk.FlagEphemeral, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatalf("register %s: %v", providerURL, err)
	}
	return p
}

// proxy forwards TCP connections to addr until closed; closing it cuts
// every connection and refuses new ones, as a crashed host would. Paused,
// it cuts every connection and drops new ones until resumed, as a
// network partition would.
type proxy struct {
	lis    net.Listener
	mu     sync.Mutex
	conns  []net.Conn
	paused bool
	wg     sync.WaitGroup
}

func newProxy(t *testing.T, addr string) *proxy {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{lis: lis}
	p.wg.Go(func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			p.mu.Lock()
			paused := p.paused
			p.mu.Unlock()
			if paused {
				c.Close()
				continue
			}
			up, err := net.Dial("tcp", addr)
			if err != nil {
				c.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, c, up)
			p.mu.Unlock()
			p.wg.Go(func() { _, _ = io.Copy(up, c); up.Close() })
			p.wg.Go(func() { _, _ = io.Copy(c, up); c.Close() })
		}
	})
	t.Cleanup(p.close)
	return p
}

func (p *proxy) close() {
	p.lis.Close()
	p.pause()
	p.wg.Wait()
}

func (p *proxy) pause() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.paused = true
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

func (p *proxy) resume() {
	p.mu.Lock()
	p.paused = false
	p.mu.Unlock()
}

// endpoints returns the stored endpoints of a Dubbo interface or Curator
// service, by address:port, with their version labels.
func endpoints(t *testing.T, st *store.Store, name string) map[string]string {
	t.Helper()
	items, _, _, err := st.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, it := range items {
		if it.Key.Kind != model.KindEndpoints || !strings.HasPrefix(it.Key.Name, name+"@") {
			continue
		}
		for _, ep := range it.Object.(*meshv1.Endpoints).Endpoints {
			for _, port := range ep.Ports {
				out[fmt.Sprintf("%s:%d", ep.Address, port)] = ep.Labels["version"]
			}
		}
	}
	return out
}

// TestSourceFollowsZooKeeper runs the source against a real ZooKeeper and
// a real etcd: Dubbo providers and Curator instances registered as
// ephemeral nodes become endpoints; bad nodes are problems while the rest
// flows; one change is synced alone; a provider whose session dies is
// removed within the session timeout; a ZooKeeper restart loses nothing.
func TestSourceFollowsZooKeeper(t *testing.T) {
	zks := zktest.Start(t)
	_, cli := testutil.Etcd(t)
	st := store.New(cli)
	admin := zktest.Connect(t, zks.Addr, 20*time.Second)
	mkdirs(t, admin, "/dubbo/"+iface+"/providers")
	mkdirs(t, admin, "/services/orders")

	// p1 reaches ZooKeeper through a proxy that the test cuts; p2 holds a
	// session long enough to outlive a ZooKeeper restart.
	const p1Timeout = 2 * time.Second
	cut := newProxy(t, zks.Addr)
	p1 := zktest.Connect(t, cut.lis.Addr().String(), p1Timeout)
	// p2 reaches it through a gate the test holds shut while ZooKeeper
	// restarts: a session's handshake sent to a ZooKeeper still starting
	// can go unanswered, and the client waits for the answer a long time
	// (10 × two thirds of its session timeout), past the test's patience.
	gate := newProxy(t, zks.Addr)
	var p2Log zktest.Log
	p2 := zktest.ConnectLogged(t, gate.lis.Addr().String(), 20*time.Second, &p2Log)
	register(t, p1, "tri://10.0.0.1:50051/"+iface+"?interface="+iface+"&version=v1&side=provider")
	register(t, p2, "tri://10.0.0.2:50051/"+iface+"?interface="+iface+"&version=v2&side=provider")
	if _, err := p2.Create("/dubbo/"+iface+"/providers/tri%3A%2F%2Fbroken%zz", nil, zk.FlagEphemeral, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	if _, err := p2.Create("/services/orders/one", []byte(`{"name":"orders","id":"one","address":"10.1.0.1","port":8080,"payload":{"metadata":{"version":"v1"}}}`),
		zk.FlagEphemeral, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	if _, err := p2.Create("/services/orders/two", []byte(`{"name":"orders","id":"two","port":8080}`), zk.FlagEphemeral, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}

	results := make(chan ingest.Result, 100)
	startSource(t, st, zookeeper.Config{Servers: []string{zks.Addr}, OnSynced: func(r ingest.Result) { results <- r }})

	dubbo := "dubbo-" + strings.ToLower(iface)
	first := <-results
	checkFirstSync(t, st, first, dubbo)

	// One more provider: synced alone, not the whole registry again.
	register(t, p2, "tri://10.0.0.3:50051/"+iface+"?interface="+iface+"&version=v2&side=provider")
	testutil.Eventually(t, 10*time.Second, "the third provider in etcd", func() (bool, string) {
		got := endpoints(t, st, dubbo)
		return len(got) == 3, fmt.Sprint(got)
	})
	for r := range results {
		if r.Written > 0 {
			if r.Written+r.Unchanged > 2 {
				t.Errorf("one provider change synced %d objects (%d written): the whole registry was read", r.Written+r.Unchanged, r.Written)
			}
			break
		}
	}

	// Curator instance data changes are followed too.
	if _, err := p2.Set("/services/orders/one", []byte(`{"name":"orders","id":"one","address":"10.1.0.1","port":8080,"payload":{"metadata":{"version":"v9"}}}`), -1); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, "the Curator instance's new version in etcd", func() (bool, string) {
		got := endpoints(t, st, "curator-orders")
		return got["10.1.0.1:8080"] == "v9", fmt.Sprint(got)
	})

	// p1's host dies: its session expires and its provider goes.
	cut.close()
	died := time.Now()
	testutil.Eventually(t, p1Timeout+10*time.Second, "p1's provider removed once its session expired", func() (bool, string) {
		got := endpoints(t, st, dubbo)
		_, alive := got["10.0.0.1:50051"]
		return !alive && len(got) == 2, fmt.Sprint(got)
	})
	t.Logf("a provider whose session died was removed from etcd %s after its connection was cut (session timeout %s)",
		time.Since(died).Round(10*time.Millisecond), p1Timeout)

	// ZooKeeper restarts: nothing is removed meanwhile, and the watches
	// still work after.
	lowest := watchLowest(t, st, dubbo)
	gate.pause()
	zks.Stop()
	time.Sleep(time.Second)
	zks.Restart()
	// Once ZooKeeper serves sessions again, p2 may reconnect.
	fresh := zktest.Connect(t, zks.Addr, 20*time.Second)
	testutil.Eventually(t, 90*time.Second, "ZooKeeper to serve sessions again", func() (bool, string) {
		return fresh.State() == zk.StateHasSession, fmt.Sprint(fresh.State())
	})
	fresh.Close()
	gate.resume()
	// A loaded machine takes its time to start ZooKeeper's JVM again.
	// What the client and the server said is shown, to tell why if p2's
	// session does not come back.
	for deadline := time.Now().Add(90 * time.Second); p2.State() != zk.StateHasSession; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the provider session did not come back within 90s of the restart; last saw %s\nthe client said:\n%s\nZooKeeper said:\n%s",
				p2.State(), p2Log.String(), zks.LogTail(40))
		}
	}
	register(t, p2, "tri://10.0.0.4:50051/"+iface+"?interface="+iface+"&version=v3&side=provider")
	testutil.Eventually(t, 90*time.Second, "a provider registered after the restart in etcd", func() (bool, string) {
		got := endpoints(t, st, dubbo)
		return len(got) == 3 && got["10.0.0.4:50051"] == "v3", fmt.Sprint(got)
	})
	if n := lowest(); n < 2 {
		t.Errorf("during the ZooKeeper restart etcd held as few as %d of the 2 endpoints", n)
	}
}

// checkFirstSync checks the first sync: the Dubbo and Curator endpoints,
// and a problem for each undecodable entry.
func checkFirstSync(t *testing.T, st *store.Store, first ingest.Result, dubbo string) {
	t.Helper()
	if got := endpoints(t, st, dubbo); len(got) != 2 || got["10.0.0.1:50051"] != "v1" || got["10.0.0.2:50051"] != "v2" {
		t.Fatalf("Dubbo endpoints after the first sync: %v", got)
	}
	if got := endpoints(t, st, "curator-orders"); len(got) != 1 || got["10.1.0.1:8080"] != "v1" {
		t.Fatalf("Curator endpoints after the first sync: %v", got)
	}
	var reasons []string
	for _, p := range first.Problems {
		reasons = append(reasons, p.Error())
	}
	slices.Sort(reasons)
	if len(reasons) != 2 || !strings.Contains(reasons[0], "a:/dubbo/"+iface+" providers/tri%3A%2F%2Fbroken%zz") ||
		!strings.Contains(reasons[0], "undecodable provider URL") || !strings.Contains(reasons[1], "a:/services/orders two") ||
		!strings.Contains(reasons[1], "address: no host") {
		t.Fatalf("problems: %q", reasons)
	}
}

// watchLowest watches how many endpoints of the Dubbo service etcd holds
// until the returned function is called, which returns the fewest seen.
// The watcher reads the store itself (no t.Fatal off the test's
// goroutine) and is stopped however the test ends.
func watchLowest(t *testing.T, st *store.Store, dubbo string) func() int {
	lowest := 1 << 30
	watching := make(chan struct{})
	watched := make(chan struct{})
	stop := sync.OnceFunc(func() { close(watching); <-watched })
	t.Cleanup(stop)
	go func() {
		defer close(watched)
		for {
			if items, _, _, err := st.List(context.Background()); err == nil {
				n := 0
				for _, it := range items {
					if it.Key.Kind == model.KindEndpoints && strings.HasPrefix(it.Key.Name, dubbo+"@") {
						n += len(it.Object.(*meshv1.Endpoints).Endpoints)
					}
				}
				lowest = min(lowest, n)
			}
			select {
			case <-watching:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	return func() int { stop(); return lowest }
}

// TestSourceSessionExpiry: the source's own session expires while it is
// cut off from ZooKeeper; meanwhile a provider leaves and another comes.
// Nothing is removed while the source cannot read; once it reconnects,
// with a new session and none of its watches, it reads everything again:
// the provider that left is removed, the new one added, and the watches
// work again.
func TestSourceSessionExpiry(t *testing.T) {
	zks := zktest.Start(t)
	_, cli := testutil.Etcd(t)
	st := store.New(cli)
	p := zktest.Connect(t, zks.Addr, 20*time.Second)
	mkdirs(t, p, "/dubbo/"+iface+"/providers")
	register(t, p, "tri://10.0.0.1:50051/"+iface)
	b := register(t, p, "tri://10.0.0.2:50051/"+iface)

	link := newProxy(t, zks.Addr)
	logs := &logBuffer{t: t}
	startSource(t, st, zookeeper.Config{Servers: []string{link.lis.Addr().String()}, SessionTimeout: 2 * time.Second,
		Log: slog.New(slog.NewTextHandler(logs, nil))})
	dubbo := "dubbo-" + strings.ToLower(iface)
	testutil.Eventually(t, 10*time.Second, "both providers in etcd", func() (bool, string) {
		got := endpoints(t, st, dubbo)
		return len(got) == 2, fmt.Sprint(got)
	})
	// A probe session through the same link, with the same timeout and
	// an ephemeral node, touched last before the cut: ZooKeeper expires
	// a session at its last touch plus its timeout (rounded up to a
	// tick), so the source's session has expired once the probe's node
	// is gone.
	probe := zktest.Connect(t, link.lis.Addr().String(), 2*time.Second)
	if _, err := probe.Create("/probe", nil, zk.FlagEphemeral, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := probe.Exists("/probe"); err != nil {
		t.Fatal(err)
	}
	link.pause()
	if err := p.Delete(b, -1); err != nil {
		t.Fatal(err)
	}
	register(t, p, "tri://10.0.0.3:50051/"+iface)
	testutil.Eventually(t, 30*time.Second, "ZooKeeper to expire the sessions cut off", func() (bool, string) {
		there, _, err := p.Exists("/probe")
		return err == nil && !there, fmt.Sprint(there, err)
	})
	if got := endpoints(t, st, dubbo); len(got) != 2 {
		t.Fatalf("while cut off, etcd holds %v; want the 2 providers it last read", got)
	}
	link.resume()
	testutil.Eventually(t, 30*time.Second, "the registry as it is now in etcd", func() (bool, string) {
		got := endpoints(t, st, dubbo)
		_, left := got["10.0.0.2:50051"]
		_, came := got["10.0.0.3:50051"]
		return len(got) == 2 && !left && came, fmt.Sprint(got)
	})
	if !strings.Contains(logs.String(), "new ZooKeeper session") {
		t.Errorf("no warning of a new session in the source's log:\n%s", logs)
	}
	register(t, p, "tri://10.0.0.4:50051/"+iface)
	testutil.Eventually(t, 10*time.Second, "a provider registered after the new session in etcd", func() (bool, string) {
		got := endpoints(t, st, dubbo)
		return len(got) == 3, fmt.Sprint(got)
	})
}

// startSource runs a source of ensemble "a" writing to st until the test
// ends or stop is called.
func startSource(t *testing.T, st *store.Store, cfg zookeeper.Config) (stop func()) {
	t.Helper()
	if cfg.Log == nil {
		cfg.Log = testutil.Log(t)
	}
	syncer, err := ingest.NewSyncer(ingest.Config{Source: zookeeper.SourceName("a"), Store: st, Log: cfg.Log})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Ensemble, cfg.Syncer, cfg.RetryDelay = "a", syncer, 200*time.Millisecond
	src, err := zookeeper.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx) }()
	stop = sync.OnceFunc(func() { cancel(); <-done })
	t.Cleanup(stop)
	return stop
}

// TestSourceKeepsPortsOverRestart: a service keeps the port it has in the
// store when the source starts again and a provider has joined on a lower
// port meanwhile (one of several on a host): its clients address host:port.
func TestSourceKeepsPortsOverRestart(t *testing.T) {
	zks := zktest.Start(t)
	_, cli := testutil.Etcd(t)
	st := store.New(cli)
	p := zktest.Connect(t, zks.Addr, 20*time.Second)
	mkdirs(t, p, "/dubbo/"+iface+"/providers")
	register(t, p, "tri://10.0.0.1:50052/"+iface)
	register(t, p, "tri://10.0.0.2:50053/"+iface)
	dubbo := "dubbo-" + strings.ToLower(iface)
	stop := startSource(t, st, zookeeper.Config{Servers: []string{zks.Addr}})
	testutil.Eventually(t, 10*time.Second, "the service on 50052 (a tie goes to the lowest port)", func() (bool, string) {
		port := servicePort(t, st, dubbo)
		return port == 50052, fmt.Sprint(port)
	})
	stop()
	register(t, p, "tri://10.0.0.3:50051/"+iface)
	startSource(t, st, zookeeper.Config{Servers: []string{zks.Addr}})
	testutil.Eventually(t, 10*time.Second, "the third provider in etcd", func() (bool, string) {
		got := endpoints(t, st, dubbo)
		return len(got) == 3, fmt.Sprint(got)
	})
	if port := servicePort(t, st, dubbo); port != 50052 {
		t.Errorf("after a restart the service moved to port %d, want 50052", port)
	}
}

// servicePort returns the stored port of a service (0: none).
func servicePort(t *testing.T, st *store.Store, name string) uint32 {
	t.Helper()
	items, _, _, err := st.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, it := range items {
		if it.Key.Kind == model.KindService && strings.HasPrefix(it.Key.Name, name+"@") {
			return it.Object.(*meshv1.Service).GetPorts()[0].GetNumber()
		}
	}
	return 0
}

// logBuffer keeps what a logger writes and passes it to the test's log.
type logBuffer struct {
	t   *testing.T
	mu  sync.Mutex
	buf strings.Builder
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.t.Log(strings.TrimSuffix(string(p), "\n"))
	return l.buf.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}
