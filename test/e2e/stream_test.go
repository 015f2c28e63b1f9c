package e2e

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/shardpilot/shardpilot/internal/testutil"
)

// TestDeletedStreamIsMadeAgain: someone deletes the JetStream stream. The
// relay makes it again and starts it with a RESYNC; the pusher, whose
// consumer lost its stream, loads the store again; changes reach a grpc-go
// client as before, and both say they follow the store again.
func TestDeletedStreamIsMadeAgain(t *testing.T) {
	a, b := startBackend(t), startBackend(t)
	dir := t.TempDir()
	writeMesh(t, dir, "greeter.yaml", docs(greeterService, workloadEntry("greeter-1", "v1", a)))
	cp := NewCluster(t, Options{}, yamlSource(dir))
	conn := dialXDS(t, cp.ads, "xds:///greeter.demo.svc.cluster.local:50051")
	allOn(t, conn, a.addr, "RPCs reach backend a")

	js, err := jetstream.New(cp.nats)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := js.DeleteStream(ctx, "SHARDPILOT_MESH"); err != nil {
		t.Fatal(err)
	}
	writeMesh(t, dir, "greeter.yaml", docs(greeterService, workloadEntry("greeter-1", "v1", b)))
	allOn(t, conn, b.addr, "RPCs follow the endpoint after the stream was deleted")
	testutil.Eventually(t, 20*time.Second, "the relay and the pusher follow the store again", func() (bool, string) {
		return cp.pusher.Following() && cp.relay.Healthy(), "not yet"
	})
	if _, err := js.Stream(ctx, "SHARDPILOT_MESH"); err != nil {
		t.Errorf("the stream was not made again: %v", err)
	}
	// And the next change flows as usual.
	writeMesh(t, dir, "greeter.yaml", docs(greeterService, workloadEntry("greeter-1", "v1", a)))
	allOn(t, conn, a.addr, "RPCs follow the next change")
}

// TestServesThroughABusOutage: with NATS stopped, the pusher keeps serving
// what it generated last: a grpc-go client that connects during the
// outage (a proxy restarting, or moved by its connection's age) is routed
// as before. The pusher says it is stale, which is all it says: it stays
// ready (cmd/pusher's readiness is the loaded mesh alone).
func TestServesThroughABusOutage(t *testing.T) {
	b := startBackend(t)
	dir := t.TempDir()
	writeMesh(t, dir, "greeter.yaml", docs(greeterService, workloadEntry("greeter-1", "v1", b)))
	cp := NewCluster(t, Options{}, yamlSource(dir))
	cp.settled(t)
	cp.natsServer.Close()
	testutil.Eventually(t, 60*time.Second, "the pusher to find the bus gone", func() (bool, string) {
		return cp.pusher.Stale() > 0, "following"
	})
	conn := dialXDS(t, cp.ads, "xds:///greeter.demo.svc.cluster.local:50051")
	allOn(t, conn, b.addr, "a client connecting during the outage is routed by the last config")
	if cp.pusher.GeneratedRevision() == 0 || cp.pusher.Stale() == 0 {
		t.Errorf("generated revision %d, stale for %s: want the last config, stale", cp.pusher.GeneratedRevision(), cp.pusher.Stale())
	}
}

// TestWipedStreamIsMadeAgainWithoutAChange: NATS restarts with its data
// lost and nothing changes afterwards. The relay finds its stream gone on
// its next check and makes it again, the pusher follows it again, and it
// served its last configuration throughout.
func TestWipedStreamIsMadeAgainWithoutAChange(t *testing.T) {
	a := startBackend(t)
	dir := t.TempDir()
	writeMesh(t, dir, "greeter.yaml", docs(greeterService, workloadEntry("greeter-1", "v1", a)))
	cp := NewCluster(t, Options{}, yamlSource(dir))
	conn := dialXDS(t, cp.ads, "xds:///greeter.demo.svc.cluster.local:50051")
	allOn(t, conn, a.addr, "RPCs reach backend a")
	cp.settled(t)

	cp.stopNATS()
	if err := os.RemoveAll(cp.natsDir); err != nil {
		t.Fatal(err)
	}
	cp.startNATS(t)
	js, err := jetstream.New(cp.nats)
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, "the stream made again, and the relay and the pusher following it", func() (bool, string) {
		if cp.pusher.GeneratedRevision() == 0 {
			t.Fatal("the pusher dropped its configuration")
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if _, err := js.Stream(ctx, "SHARDPILOT_MESH"); err != nil {
			return false, err.Error()
		}
		return cp.pusher.Following() && cp.relay.Healthy(), "not following yet"
	})
	allOn(t, conn, a.addr, "RPCs still reach backend a")
}
