// Package testutil starts the real servers tests run against — etcd and
// NATS JetStream, embedded in the test process — and stops them when the
// test ends.
package testutil

import (
	"context"
	"log/slog"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/shardpilot/shardpilot/internal/embedded"
	"github.com/shardpilot/shardpilot/pkg/store"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"
)

// Etcd starts an embedded etcd and returns a client to it.
func Etcd(t testing.TB) (*embedded.Etcd, *clientv3.Client) {
	t.Helper()
	e, err := embedded.StartEtcd(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{e.Endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return e, cli
}

// NATS starts an embedded NATS server with JetStream and returns a
// connection that reconnects forever.
func NATS(t testing.TB) (*embedded.NATS, *nats.Conn) {
	t.Helper()
	n, err := embedded.StartNATS(t.TempDir(), 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Close)
	return n, Connect(t, n.URL)
}

// Connect connects to NATS, reconnecting forever; the test closes it.
func Connect(t testing.TB, url string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond), nats.RetryOnFailedConnect(true))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// Log returns a logger that writes through t.Log, or discards when the
// test is not verbose.
func Log(t testing.TB) *slog.Logger {
	if !testing.Verbose() {
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(string(p))
	return len(p), nil
}

// Eventually polls cond until it holds or the timeout passes. It is for
// waiting on real servers and real clients, whose progress a test cannot
// step; cond should say what it saw through the returned string.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var last string
	for {
		ok, seen := cond()
		if ok {
			return
		}
		last = seen
		if time.Now().After(deadline) {
			t.Fatalf("%s: not reached within %s; last saw: %s", what, timeout, last)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Context returns a context cancelled when the test ends.
func Context(t testing.TB) context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return ctx
}

// VerifyNoLeaks runs the package's tests and fails if goroutines outlive
// them. Use it as TestMain.
func VerifyNoLeaks(m *testing.M) {
	goleak.VerifyTestMain(m, LeakOptions()...)
}

// LeakOptions are the goroutines the leak check tolerates: long-lived pools
// of the libraries under test, not of shardpilot.
func LeakOptions() []goleak.Option {
	return []goleak.Option{
		goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"),
		goleak.IgnoreAnyFunction("github.com/nats-io/nats-server/v2/server.(*Server).startGoRoutine"),
		// grpc-go's xDS client builds its "tls" channel credentials and
		// drops their cleanup (internal/xds/xdsclient/clientimpl.go,
		// populateGRPCTransportConfigsFromServerConfig, v1.85.0), so each
		// client with a certificate leaves its file watcher running.
		goleak.IgnoreTopFunction("google.golang.org/grpc/credentials/tls/certprovider/pemfile.(*watcher).run"),
	}
}

// FreeAddr returns a loopback address nobody listens on right now.
func FreeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// CPUTime returns the CPU time this process has used (user and system).
func CPUTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// SignIn returns a client of the etcd at endpoint signed in as user,
// closed when the test ends. Signing in waits for etcd to check the
// password (bcrypt), slowly under the race detector on a loaded machine:
// 5 s was passed there, so it is given a minute.
func SignIn(t testing.TB, endpoint, user, password string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, Username: user, Password: password,
		DialTimeout: time.Minute, Logger: zap.NewNop()})
	if err != nil {
		t.Fatalf("%s signs in: %v", user, err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// EtcdWithRoles starts an embedded etcd with authentication enabled and the
// parts' roles of store.EtcdRoles, each user's password "<part>-secret".
// It returns the root's client and one signed in as a part's user.
func EtcdWithRoles(t testing.TB) (e *embedded.Etcd, root *clientv3.Client, as func(part string) *clientv3.Client) {
	t.Helper()
	e, open := Etcd(t)
	ctx := Context(t)
	if _, err := open.UserAdd(ctx, "root", "root-secret"); err != nil {
		t.Fatal(err)
	}
	if _, err := open.UserGrantRole(ctx, "root", "root"); err != nil {
		t.Fatal(err)
	}
	if _, err := open.AuthEnable(ctx); err != nil {
		t.Fatal(err)
	}
	root = SignIn(t, e.Endpoint, "root", "root-secret")
	passwords := map[string]string{}
	for _, r := range store.EtcdRoles() {
		passwords[r.Part] = r.Part + "-secret"
	}
	if err := store.EnsureRoles(ctx, root, passwords); err != nil {
		t.Fatal(err)
	}
	return e, root, func(part string) *clientv3.Client { return SignIn(t, e.Endpoint, "shardpilot-"+part, part+"-secret") }
}
