package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	shtest "github.com/shardpilot/shardpilot/internal/testutil"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/model"
	"google.golang.org/protobuf/proto"
)

// TestValuesTheBusCannotCarryDoNotWedgeTheMesh: written straight into
// etcd, past the ingester, a valid Service over NATS's payload limit
// (under etcd's) and a key whose namespace holds a space no longer stop
// the change stream: the first reaches the pusher by reference (read from
// etcd), the second is published on the subject every consumer follows,
// and a real grpc-go client follows the endpoints that move afterwards.
// The pusher is never stale, behind the store.
func TestValuesTheBusCannotCarryDoNotWedgeTheMesh(t *testing.T) {
	a, c := startBackend(t), startBackend(t)
	dir := t.TempDir()
	writeMesh(t, dir, "greeter.yaml", docs(greeterService, workloadEntry("greeter-1", "v1", a)))
	cp := NewCluster(t, Options{}, yamlSource(dir))
	conn := dialXDS(t, cp.ads, "xds:///greeter.demo.svc.cluster.local:50051")
	allOn(t, conn, a.addr, "RPCs reach the first endpoint")

	labels := map[string]string{}
	for i := range 1000 {
		labels[fmt.Sprintf("label-%04d", i)] = strings.Repeat("v", 1200)
	}
	big := &meshv1.Service{Origin: &meshv1.Origin{Source: "elsewhere"}, Hostnames: []string{"big.demo.svc.cluster.local"},
		Resolution: meshv1.Resolution_RESOLUTION_STATIC, Labels: labels,
		Ports: []*meshv1.Port{{Name: "http", Number: 80, Protocol: meshv1.Protocol_PROTOCOL_HTTP}}}
	value, err := proto.Marshal(big)
	if err != nil {
		t.Fatal(err)
	}
	if len(value) < 1<<20 || len(value) > 1500<<10 {
		t.Fatalf("the big Service is %d bytes, want over NATS's 1 MiB and under etcd's 1.5 MiB", len(value))
	}
	odd, err := proto.Marshal(&meshv1.Service{Origin: &meshv1.Origin{Source: "elsewhere"}, Hostnames: []string{"odd.example.com"},
		Resolution: meshv1.Resolution_RESOLUTION_STATIC, Ports: []*meshv1.Port{{Name: "tcp", Number: 9000, Protocol: meshv1.Protocol_PROTOCOL_TCP}}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := cp.etcd.Put(ctx, model.Prefix+"services/demo/big", string(value)); err != nil {
		t.Fatal(err)
	}
	if _, err := cp.etcd.Put(ctx, model.Prefix+"services/my ns/odd", string(odd)); err != nil {
		t.Fatal(err)
	}

	// Then the endpoints move: the change after them reaches the client.
	writeMesh(t, dir, "greeter.yaml", docs(greeterService, workloadEntry("greeter-1", "v1", c)))
	shtest.Eventually(t, 30*time.Second, "RPCs follow the endpoints to backend c", func() (bool, string) {
		got := spread(conn, 20)
		return got[c.addr] == 20, fmt.Sprint(got)
	})
	cp.settled(t)
	if got := spread(conn, 100); got[c.addr] != 100 {
		t.Fatalf("RPCs failed after the endpoints moved: %v", got)
	}
	shtest.Eventually(t, 10*time.Second, "the big Service read by reference", func() (bool, string) {
		n := counterSum(t, cp.reg, "shardpilot_pusher_events_by_reference_total")
		return n >= 1, fmt.Sprint(n)
	})
	if s := cp.pusher.Stale(); s != 0 {
		t.Errorf("the pusher is stale (%s): %s", s, cp.pusher.StaleReason())
	}
}

// counterWith is a counter's value with a label's value (0 when it has
// not been set).
func counterWith(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// counterSum is a counter's value, all its labels together.
func counterSum(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n float64
	for _, f := range families {
		if f.GetName() == name {
			for _, m := range f.GetMetric() {
				n += m.GetCounter().GetValue()
			}
		}
	}
	return n
}
