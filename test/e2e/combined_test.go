package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/shardpilot/shardpilot/internal/testutil"
)

// TestClientKeepsWorkingThroughACombinedChange: the routing rules of a
// proxyless gRPC host are deleted, a file that does not parse is added in
// the same moment, and then the endpoints move: a real grpc-go client's
// RPCs keep succeeding, and follow the endpoints. A route must never name
// a cluster the client has been told to remove.
func TestClientKeepsWorkingThroughACombinedChange(t *testing.T) {
	a, b, c := startBackend(t), startBackend(t), startBackend(t)
	dir := t.TempDir()
	writeMesh(t, dir, "greeter.yaml", docs(greeterService, workloadEntry("greeter-1", "v1", a), workloadEntry("greeter-2", "v2", b)))
	writeMesh(t, dir, "greeter-dr.yaml", greeterSubsets)
	writeMesh(t, dir, "greeter-vs.yaml", greeterByHeader)
	cp := NewCluster(t, Options{}, yamlSource(dir))
	conn := dialXDS(t, cp.ads, "xds:///greeter.demo.svc.cluster.local:50051")
	allOn(t, conn, a.addr, "RPCs without the header reach subset v1")

	// One burst: the rules go, a broken file comes.
	for _, name := range []string{"greeter-vs.yaml", "greeter-dr.yaml"} {
		if err := os.Remove(filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	writeMesh(t, dir, "broken.yaml", "metadata: {name: [oops\n")
	testutil.Eventually(t, 20*time.Second, "RPCs spread over both endpoints without the rules", func() (bool, string) {
		got := spread(conn, 40)
		return got[a.addr] > 0 && got[b.addr] > 0 && got[a.addr]+got[b.addr] == 40, fmt.Sprint(got)
	})
	cp.settled(t)
	if got := spread(conn, 200); got[a.addr]+got[b.addr] != 200 {
		t.Fatalf("RPCs failed once the rules were gone: %v", got)
	}

	// Then the endpoints move.
	writeMesh(t, dir, "greeter.yaml", docs(greeterService, workloadEntry("greeter-1", "v1", c)))
	testutil.Eventually(t, 20*time.Second, "RPCs follow the endpoints to backend c", func() (bool, string) {
		got := spread(conn, 20)
		return got[c.addr] == 20, fmt.Sprint(got)
	})
	cp.settled(t)
	if got := spread(conn, 200); got[c.addr] != 200 {
		t.Fatalf("RPCs failed after the endpoints moved: %v", got)
	}
}
