package store_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/shardpilot/shardpilot/internal/testutil"
	"github.com/shardpilot/shardpilot/pkg/store"
)

// TestProbeFollowsTheStore: the probe says the store is reachable while
// etcd answers, and no longer once it stopped.
func TestProbeFollowsTheStore(t *testing.T) {
	etcd, cli := testutil.Etcd(t)
	var p store.Probe
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { p.Run(ctx, store.New(cli), 100*time.Millisecond) })
	defer func() { cancel(); wg.Wait() }()
	testutil.Eventually(t, 10*time.Second, "the store reachable", func() (bool, string) { return p.Reachable(), "unreachable" })
	etcd.Close()
	testutil.Eventually(t, 10*time.Second, "the stopped store unreachable", func() (bool, string) { return !p.Reachable(), "reachable" })
}
