package e2e

import (
	"context"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/shardpilot/shardpilot/internal/testutil"
)

// convergence returns the convergence histogram's sample count and sum.
func (cp *Cluster) convergence(t *testing.T) (uint64, float64) {
	t.Helper()
	families, err := cp.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == "shardpilot_pusher_convergence_seconds" {
			h := f.GetMetric()[0].GetHistogram()
			return h.GetSampleCount(), h.GetSampleSum()
		}
	}
	return 0, 0
}

// TestConvergenceIsMeasured: a change made in the YAML is timed from when
// the ingester observed it to when a proxy ACKs a response containing it.
func TestConvergenceIsMeasured(t *testing.T) {
	a, b := startBackend(t), startBackend(t)
	dir := t.TempDir()
	writeMesh(t, dir, "greeter.yaml", docs(greeterService, workloadEntry("greeter-1", "v1", a)))
	cp := NewCluster(t, Options{}, yamlSource(dir))
	cp.settled(t)
	ads := dialADS(t, cp.ads, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s, err := ads.StreamAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rx := receive(s)
	const proxy = "sidecar~10.0.0.4~conv.demo~demo.svc.cluster.local"
	req := &discovery.DiscoveryRequest{Node: &core.Node{Id: proxy}, TypeUrl: resource.ClusterType}
	// ACK until the greeter's cluster is there.
	for {
		if err := s.Send(req); err != nil {
			t.Fatal(err)
		}
		resp, err := rx.next(10 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		req = &discovery.DiscoveryRequest{TypeUrl: resource.ClusterType, VersionInfo: resp.VersionInfo, ResponseNonce: resp.Nonce}
		if len(resp.Resources) > 3 {
			break
		}
	}
	if err := s.Send(req); err != nil {
		t.Fatal(err)
	}
	// The server has measured that ACK once it shows in the stream's status.
	testutil.Eventually(t, 10*time.Second, "the ACK to be recorded", func() (bool, string) {
		for _, st := range cp.status.Status() {
			if ts := st.Types["Cluster"]; st.Proxy == proxy && ts != nil {
				return ts.Acked == req.VersionInfo, "acked " + ts.Acked + ", want " + req.VersionInfo
			}
		}
		return false, "no stream"
	})
	// Every change made before this one has been generated, so that the
	// samples the ACK below adds are this change's alone.
	cp.settled(t)
	before, sumBefore := cp.convergence(t)

	changed := time.Now()
	writeMesh(t, dir, "greeter.yaml", docs(greeterService, workloadEntry("greeter-1", "v1", a), workloadEntry("greeter-2", "v2", b), greeterSplit))
	resp, err := rx.next(10 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(&discovery.DiscoveryRequest{TypeUrl: resource.ClusterType, VersionInfo: resp.VersionInfo, ResponseNonce: resp.Nonce}); err != nil {
		t.Fatal(err)
	}
	var count uint64
	var sum float64
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if count, sum = cp.convergence(t); count > before {
			break
		}
	}
	if count <= before {
		t.Fatal("the ACK of the change was not measured")
	}
	// The new samples measure the change: each at most the time since it
	// was made.
	n, added := count-before, sum-sumBefore
	if took := time.Since(changed).Seconds(); added <= 0 || added > took*float64(n) {
		t.Errorf("convergence %.3fs over %d new samples; the change took at most %.3fs to reach the proxy", added, n, took)
	}
}
