package store_test

import (
	"context"
	"errors"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardpilot/shardpilot/internal/testutil"
	"github.com/shardpilot/shardpilot/pkg/model"
	"github.com/shardpilot/shardpilot/pkg/store"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

func client(t *testing.T, endpoint string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	return cli
}

// TestFailover: the leader crashes (its client goes away without
// resigning); the follower leads within the TTL; the crashed leader's
// fenced writes are refused.
func TestFailover(t *testing.T) {
	e, _ := testutil.Etcd(t)
	cliA, cliB := client(t, e.Endpoint), client(t, e.Endpoint)
	defer cliB.Close()
	const ttl = 2 * time.Second
	var leader atomic.Value // "a" or "b"
	fenced := make(chan *store.Store, 2)
	run := func(ctx context.Context, cli *clientv3.Client, id string) chan error {
		done := make(chan error, 1)
		el := &store.Elector{Client: cli, Name: "test", ID: id, TTL: ttl, Log: testutil.Log(t)}
		go func() {
			done <- el.Run(ctx, func(ctx context.Context, s *store.Store) error {
				leader.Store(id)
				fenced <- s
				<-ctx.Done()
				return nil
			})
		}()
		return done
	}
	ctxA, cancelA := context.WithCancel(context.Background())
	doneA := run(ctxA, cliA, "a")
	aStore := <-fenced
	ctxB, cancelB := context.WithCancel(context.Background())
	doneB := run(ctxB, cliB, "b")

	k := model.Key{Kind: model.KindService, Namespace: "ns", Name: "a"}
	if _, _, err := aStore.Put(context.Background(), k, service(time.Now(), 80)); err != nil {
		t.Fatalf("leader's fenced put: %v", err)
	}
	if leader.Load() != "a" {
		t.Fatalf("leader %v, want a", leader.Load())
	}

	// Crash a: its keepalives stop, so its lease lapses after the TTL.
	crashed := time.Now()
	cliA.Close()
	bStore := <-fenced
	took := time.Since(crashed)
	t.Logf("b took over %s after a crashed (TTL %s)", took.Round(10*time.Millisecond), ttl)
	if took > ttl+3*time.Second {
		t.Errorf("takeover took %s, want within the TTL %s (plus a campaign)", took, ttl)
	}
	cancelA()
	<-doneA

	// a's client is gone; a fenced store over a live client shows the fence.
	if _, _, err := bStore.Put(context.Background(), k, service(time.Now(), 81)); err != nil {
		t.Fatalf("new leader's put: %v", err)
	}
	cancelB()
	<-doneB
	// b resigned: its fenced store may no longer write.
	if _, _, err := bStore.Put(context.Background(), k, service(time.Now(), 82)); !errors.Is(err, store.ErrNotLeader) {
		t.Fatalf("a former leader's put: %v, want ErrNotLeader", err)
	}
	// Nor write many keys at once: the transaction is refused whole.
	other := model.Key{Kind: model.KindService, Namespace: k.Namespace, Name: k.Name + "-other"}
	if ok, _, _, err := bStore.WriteAll(context.Background(), []model.Stored{{Key: other, Object: service(time.Now(), 82)}}); ok || err != nil {
		t.Fatalf("a former leader's WriteAll: ok %v, %v: want refused", ok, err)
	}
}

// freezer forwards TCP connections to target until frozen, then holds
// them open without forwarding a byte: a server that stopped (SIGSTOP).
type freezer struct {
	lis    net.Listener
	frozen atomic.Bool
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  []net.Conn
}

func newFreezer(t *testing.T, target string) *freezer {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &freezer{lis: lis}
	f.wg.Go(func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			f.mu.Lock()
			f.conns = append(f.conns, c, up)
			f.mu.Unlock()
			pipe := func(dst, src net.Conn) {
				buf := make([]byte, 32<<10)
				for {
					n, err := src.Read(buf)
					if err != nil {
						return
					}
					for f.frozen.Load() {
						time.Sleep(10 * time.Millisecond)
						if f.closed() {
							return
						}
					}
					if _, err := dst.Write(buf[:n]); err != nil {
						return
					}
				}
			}
			f.wg.Go(func() { pipe(up, c) })
			f.wg.Go(func() { pipe(c, up) })
		}
	})
	t.Cleanup(f.close)
	return f
}

func (f *freezer) closed() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.conns == nil
}

func (f *freezer) close() {
	f.lis.Close()
	f.mu.Lock()
	for _, c := range f.conns {
		c.Close()
	}
	f.conns = nil
	f.mu.Unlock()
	f.wg.Wait()
}

// TestFollowerStopsWhileEtcdIsFrozen: a follower waiting in its campaign
// stops as soon as its context is cancelled, even though etcd answers
// nothing (etcd's own campaign cleanup would wait for it).
func TestFollowerStopsWhileEtcdIsFrozen(t *testing.T) {
	e, _ := testutil.Etcd(t)
	u, err := url.Parse(e.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	leaderCli := client(t, e.Endpoint)
	defer leaderCli.Close()
	lctx, stopLeader := context.WithCancel(context.Background())
	led := make(chan struct{})
	leaderDone := make(chan error, 1)
	go func() {
		leaderDone <- (&store.Elector{Client: leaderCli, Name: "frozen", ID: "leader", TTL: 5 * time.Second}).Run(lctx,
			func(ctx context.Context, _ *store.Store) error { close(led); <-ctx.Done(); return nil })
	}()
	<-led

	f := newFreezer(t, u.Host)
	followerCli := client(t, "http://"+f.lis.Addr().String())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- (&store.Elector{Client: followerCli, Name: "frozen", ID: "follower", TTL: 5 * time.Second}).Run(ctx,
			func(context.Context, *store.Store) error { t.Error("the follower led"); return nil })
	}()
	// The follower campaigns: its key is written, then it waits.
	testutil.Eventually(t, 10*time.Second, "the follower campaigns", func() (bool, string) {
		resp, err := leaderCli.Get(context.Background(), store.ElectionPrefix+"frozen", clientv3.WithPrefix(), clientv3.WithCountOnly())
		return err == nil && resp.Count == 2, "one candidate"
	})
	f.frozen.Store(true)
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("follower: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the follower did not stop within 5s of its cancel while etcd answered nothing")
	}
	// Its campaign's cleanup ends with its client.
	f.frozen.Store(false)
	followerCli.Close()
	stopLeader()
	<-leaderDone
}
