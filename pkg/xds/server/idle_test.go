package server_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/shardpilot/shardpilot/pkg/xds/cache"
	"github.com/shardpilot/shardpilot/pkg/xds/server"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// idleChildEnv makes the test binary an xDS server for BenchmarkIdleStreams
// instead of running tests: RSS is a whole process's figure, so the server
// runs in a process of its own, apart from the clients.
const idleChildEnv = "SHARDPILOT_IDLE_SERVER"

// usage is what the idle server reports of itself.
type usage struct {
	RSS        int64 `json:"rss"`
	Goroutines int64 `json:"goroutines"`
	HeapLive   int64 `json:"heap_live"`
	Stacks     int64 `json:"stacks"`
	HeapGoal   int64 `json:"heap_goal"`
	Streams    int   `json:"streams"`
}

// TestIdleServer is the idle server when the benchmark runs the test
// binary as one; otherwise it does nothing. It serves 20 clusters, prints
// its address, then answers each line on stdin with its usage as JSON.
func TestIdleServer(t *testing.T) {
	if os.Getenv(idleChildEnv) == "" {
		t.Skip("run by BenchmarkIdleStreams")
	}
	c, err := cache.New(cache.Config{Classes: []cache.Class{"all"}, Types: []string{resource.ClusterType}})
	if err != nil {
		t.Fatal(err)
	}
	clusters := map[string]types.Resource{}
	for i := range 20 {
		name := "outbound|80||svc-" + strconv.Itoa(i) + ".ns.svc.cluster.local"
		clusters[name] = &clusterv3.Cluster{Name: name, ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_EDS}}
	}
	if _, _, _, err := c.Update("all", resource.ClusterType, clusters); err != nil {
		t.Fatal(err)
	}
	status := server.NewStreams()
	// Every proxy connects from this host: its connections are not bounded.
	srv, err := server.New(server.Config{Cache: c, Hooks: server.OneClass("all"), Streams: status, MaxConnectionsPerSource: -1})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx, lis) }()
	fmt.Println(lis.Addr().String())
	in := bufio.NewScanner(os.Stdin)
	enc := json.NewEncoder(os.Stdout)
	for in.Scan() {
		_ = enc.Encode(measure(len(status.Status())))
	}
	cancel()
	<-done
}

func measure(streams int) usage {
	runtime.GC()
	runtime.GC()
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}, {Name: "/memory/classes/heap/stacks:bytes"}, {Name: "/gc/heap/goal:bytes"}}
	metrics.Read(s)
	u := usage{Goroutines: int64(runtime.NumGoroutine()), HeapLive: int64(s[0].Value.Uint64()), Stacks: int64(s[1].Value.Uint64()),
		HeapGoal: int64(s[2].Value.Uint64()), Streams: streams}
	if b, err := os.ReadFile("/proc/self/statm"); err == nil {
		if f := strings.Fields(string(b)); len(f) > 1 {
			pages, _ := strconv.ParseInt(f[1], 10, 64)
			u.RSS = pages * int64(os.Getpagesize())
		}
	}
	return u
}

// BenchmarkIdleStreams connects N proxies, each on a connection of its
// own as Envoys do, that subscribe to the clusters, ACK and then stay
// idle, and reports the server process's growth per stream: RSS, live
// heap, goroutine stacks and goroutines. Run with -benchtime 1x (each
// iteration connects the N proxies again on a fresh server):
//
//	go test -run '^$' -bench IdleStreams -benchtime 1x ./pkg/xds/server/
func BenchmarkIdleStreams(b *testing.B) {
	if runtime.GOOS != "linux" {
		b.Skip("reads RSS from /proc")
	}
	for _, n := range []int{1000} {
		b.Run("streams="+strconv.Itoa(n), func(b *testing.B) {
			var before, after usage
			for range b.N {
				before, after = idleStreams(b, n)
			}
			per := func(f func(usage) int64) float64 { return float64(f(after)-f(before)) / float64(n) }
			b.ReportMetric(per(func(u usage) int64 { return u.RSS }), "rss-B/stream")
			b.ReportMetric(per(func(u usage) int64 { return u.HeapLive }), "heap-B/stream")
			b.ReportMetric(per(func(u usage) int64 { return u.Stacks }), "stack-B/stream")
			b.ReportMetric(per(func(u usage) int64 { return u.Goroutines }), "goroutines/stream")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// idleStreams starts an idle server, reads its usage, connects n proxies
// and reads it again once every one is served and has ACKed.
func idleStreams(b *testing.B, n int) (before, after usage) {
	b.StopTimer()
	cmd := exec.Command(os.Args[0], "-test.run", "^TestIdleServer$", "-test.v=false")
	cmd.Env = append(os.Environ(), idleChildEnv+"=1")
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { stdin.Close(); _ = cmd.Wait() }()
	out := bufio.NewReader(stdout)
	addr, err := out.ReadString('\n')
	if err != nil {
		b.Fatalf("idle server: %v", err)
	}
	read := func() usage {
		if _, err := io.WriteString(stdin, "measure\n"); err != nil {
			b.Fatal(err)
		}
		line, err := out.ReadBytes('\n')
		if err != nil {
			b.Fatalf("idle server: %v", err)
		}
		var u usage
		if err := json.Unmarshal(line, &u); err != nil {
			b.Fatalf("idle server said %q: %v", line, err)
		}
		return u
	}
	before = read()

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	errs := make(chan error, n)
	acked := make(chan struct{}, n)
	for i := range n {
		conn, err := grpc.NewClient(strings.TrimSpace(addr), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			b.Fatal(err)
		}
		wg.Go(func() {
			defer conn.Close()
			if err := idleProxy(ctx, conn, i, acked); err != nil && ctx.Err() == nil {
				errs <- err
			}
		})
	}
	for range n {
		select {
		case <-acked:
		case err := <-errs:
			b.Fatal(err)
		case <-time.After(2 * time.Minute):
			b.Fatal("the proxies were not all served within 2m")
		}
	}
	// An ACK is read by the server after the client sent it: wait until
	// the server has every stream and its ACKs are in.
	for after = read(); after.Streams < n; after = read() {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond)
	after = read()
	return before, after
}

// idleProxy subscribes to every cluster, ACKs the response and then waits.
func idleProxy(ctx context.Context, conn *grpc.ClientConn, i int, acked chan<- struct{}) error {
	s, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		return err
	}
	node := &core.Node{Id: "sidecar~10.0.0.1~p" + strconv.Itoa(i) + ".ns~ns.svc.cluster.local"}
	if err := s.Send(&discovery.DiscoveryRequest{Node: node, TypeUrl: resource.ClusterType}); err != nil {
		return err
	}
	resp, err := s.Recv()
	if err != nil {
		return err
	}
	if err := s.Send(&discovery.DiscoveryRequest{TypeUrl: resource.ClusterType, VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()}); err != nil {
		return err
	}
	acked <- struct{}{}
	_, err = s.Recv()
	return err
}
