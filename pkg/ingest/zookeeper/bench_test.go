package zookeeper_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/shardpilot/shardpilot/internal/testutil"
	"github.com/shardpilot/shardpilot/internal/zktest"
	"github.com/shardpilot/shardpilot/pkg/ingest"
	"github.com/shardpilot/shardpilot/pkg/ingest/zookeeper"
	"github.com/shardpilot/shardpilot/pkg/store"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// BenchmarkIngestFromZooKeeper measures ingesting 1,000 Dubbo interfaces
// of 10 providers each from a real ZooKeeper into etcd (from the source's
// start to its first sync written), then one provider registered: the time
// from its node's creation to its endpoint in etcd, and the CPU this
// process (the source) used meanwhile. etcd runs as a process of its own
// when SHARDPILOT_KUBE_BIN names the directory of an etcd binary (make
// bench-zookeeper does), so that the CPU is the source's alone; otherwise
// it is embedded and its CPU counts too.
func BenchmarkIngestFromZooKeeper(b *testing.B) {
	const interfaces, providers = 1000, 10
	b.StopTimer()
	zks := zktest.Start(b)
	reg := zktest.Connect(b, zks.Addr, 20*time.Second)
	setup := time.Now()
	create := func(p string, flags int32) error {
		_, err := reg.Create(p, nil, flags, zk.WorldACL(zk.PermAll))
		if err == zk.ErrNodeExists {
			return nil
		}
		return err
	}
	if err := create("/dubbo", 0); err != nil {
		b.Fatal(err)
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	var once sync.Once
	var failed error
	for i := range interfaces {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			name := fmt.Sprintf("org.example.bench.Service%04d", i)
			err := create("/dubbo/"+name, 0)
			if err == nil {
				err = create("/dubbo/"+name+"/providers", 0)
			}
			for j := 0; err == nil && j < providers; j++ {
				u := fmt.Sprintf("tri://10.%d.%d.%d:50051/%s?interface=%s&version=v%d&side=provider", i/250, i%250, j+1, name, name, j%2)
				err = create("/dubbo/"+name+"/providers/"+zookeeper.ProviderNode(u), zk.FlagEphemeral)
			}
			if err != nil {
				once.Do(func() { failed = err })
			}
		}()
	}
	wg.Wait()
	if failed != nil {
		b.Fatal(failed)
	}
	b.Logf("registered %d interfaces × %d providers in ZooKeeper in %s", interfaces, providers, time.Since(setup).Round(time.Millisecond))
	cli := benchEtcd(b)

	for i := range b.N {
		ensemble := fmt.Sprintf("bench%d", i)
		syncer, err := ingest.NewSyncer(ingest.Config{Source: zookeeper.SourceName(ensemble), Store: store.New(cli)})
		if err != nil {
			b.Fatal(err)
		}
		done := make(chan ingest.Result, 16)
		src, err := zookeeper.New(zookeeper.Config{Ensemble: ensemble, Servers: []string{zks.Addr}, Syncer: syncer,
			OnSynced: func(r ingest.Result) { done <- r }})
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		stopped := make(chan error, 1)
		start := time.Now()
		b.StartTimer()
		go func() { stopped <- src.Run(ctx) }()
		res := <-done
		b.StopTimer()
		took := time.Since(start)

		name := "org.example.bench.Service0000"
		u := fmt.Sprintf("tri://10.9.%d.1:50051/%s?interface=%s&version=v9&side=provider", i%250, name, name)
		changed, cpu := time.Now(), testutil.CPUTime()
		if err := create("/dubbo/"+name+"/providers/"+zookeeper.ProviderNode(u), zk.FlagEphemeral); err != nil {
			b.Fatal(err)
		}
		var change ingest.Result
		for change = range done {
			if change.Written > 0 {
				break
			}
		}
		changeTook, changeCPU := time.Since(changed), testutil.CPUTime()-cpu
		cancel()
		<-stopped
		b.ReportMetric(took.Seconds(), "s/ingest")
		b.ReportMetric(changeTook.Seconds(), "s/provider-change")
		b.ReportMetric(float64(changeCPU)/float64(time.Millisecond), "cpu-ms/provider-change")
		b.Logf("%d objects written in %s; one provider registered reached etcd in %s using %s of CPU (%d written, %d unchanged)",
			res.Written, took.Round(time.Millisecond), changeTook.Round(time.Millisecond), changeCPU.Round(100*time.Microsecond),
			change.Written, change.Unchanged)
	}
}

// benchEtcd returns a client of an etcd process of its own, from
// $SHARDPILOT_KUBE_BIN/etcd, or of an embedded etcd.
func benchEtcd(b *testing.B) *clientv3.Client {
	bin := filepath.Join(os.Getenv("SHARDPILOT_KUBE_BIN"), "etcd")
	if _, err := os.Stat(bin); os.Getenv("SHARDPILOT_KUBE_BIN") == "" || err != nil {
		b.Log("etcd is embedded: the CPU figures include its work (set SHARDPILOT_KUBE_BIN, as make bench-zookeeper does, to run it apart)")
		_, cli := testutil.Etcd(b)
		return cli
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	peer, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	url := "http://" + l.Addr().String()
	peerURL := "http://" + peer.Addr().String()
	l.Close()
	peer.Close()
	cmd := exec.Command(bin, "--data-dir", b.TempDir(), "--listen-client-urls", url, "--advertise-client-urls", url,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL, "--initial-cluster", "default="+peerURL)
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{url}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cli.Close() })
	testutil.Eventually(b, 30*time.Second, "etcd to serve", func() (bool, string) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := cli.Get(ctx, "x")
		return err == nil, fmt.Sprint(err)
	})
	return cli
}
