package store_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardpilot/shardpilot/internal/testutil"
	"github.com/shardpilot/shardpilot/pkg/store"
	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
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

// TestProbeSaysTheStoreRefusesWrites: etcd's NOSPACE alarm (its quota
// full: every write refused) makes the store not writable, with the alarm
// named; disarmed, writable again.
func TestProbeSaysTheStoreRefusesWrites(t *testing.T) {
	_, cli := testutil.Etcd(t)
	ctx, cancel := context.WithCancel(testutil.Context(t))
	defer cancel()
	var p store.Probe
	done := make(chan struct{})
	go func() { defer close(done); p.Run(ctx, store.New(cli), 50*time.Millisecond) }()
	testutil.Eventually(t, 10*time.Second, "reachable and writable", func() (bool, string) { return p.Reachable() && p.Writable(), p.Alarms() })
	status, err := cli.Status(ctx, cli.Endpoints()[0])
	if err != nil {
		t.Fatal(err)
	}
	alarm := &etcdserverpb.AlarmRequest{Action: etcdserverpb.AlarmRequest_ACTIVATE, MemberID: status.Header.MemberId, Alarm: etcdserverpb.AlarmType_NOSPACE}
	if _, err := etcdserverpb.NewMaintenanceClient(cli.ActiveConnection()).Alarm(ctx, alarm); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, "not writable, the alarm named", func() (bool, string) {
		return p.Reachable() && !p.Writable() && strings.Contains(p.Alarms(), "NOSPACE"), p.Alarms()
	})
	if _, err := cli.AlarmDisarm(ctx, &clientv3.AlarmMember{MemberID: status.Header.MemberId, Alarm: etcdserverpb.AlarmType_NOSPACE}); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, "writable again", func() (bool, string) { return p.Writable(), p.Alarms() })
	cancel()
	<-done
}
