package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/shardpilot/shardpilot/internal/testutil"
	"github.com/shardpilot/shardpilot/pkg/xds/identity"
	"github.com/shardpilot/shardpilot/pkg/xds/server"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	grpcstatus "google.golang.org/grpc/status"
)

// TestClientCAReplaced: when the client CA file is replaced, a proxy whose
// certificate the old CA signed loses its open stream within the file's
// recheck (5 s), instead of keeping it until its connection
// ages out; a proxy of the new CA is served.
func TestClientCAReplaced(t *testing.T) {
	oldCA, newCA := testutil.NewCA(t), testutil.NewCA(t)
	serverCert, serverKey := oldCA.Issue(t, "pusher")
	oldCert, oldKey := oldCA.Issue(t, "old", "spiffe://cluster.local/ns/demo/sa/client")
	newCert, newKey := newCA.Issue(t, "new", "spiffe://cluster.local/ns/demo/sa/client")
	caFile := filepath.Join(t.TempDir(), "client-ca.pem")
	copyFile := func(from string) {
		t.Helper()
		b, err := os.ReadFile(from)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(caFile+".tmp", b, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(caFile+".tmp", caFile); err != nil {
			t.Fatal(err)
		}
	}
	copyFile(oldCA.CertFile)
	tc, clientCA, err := identity.ServerTLSWithClientCA(serverCert, serverKey, caFile, false, testutil.Log(t))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	writeMesh(t, dir, "greeter.yaml", docs(greeterService, workloadEntry("greeter-1", "v1", startBackend(t))))
	policy := &identity.Policy{TrustDomain: "cluster.local", Required: true}
	cp := NewCluster(t, Options{
		XDS:      server.Config{GRPCOptions: []grpc.ServerOption{grpc.Creds(credentials.NewTLS(tc))}},
		Policy:   policy,
		ClientCA: clientCA,
	}, yamlSource(dir))

	// The whole mesh in place first: a proxy connected while demo's
	// service is still on its way is reclassified when it arrives (its
	// namespace then has a class of its own), and its stream ended.
	testutil.Eventually(t, 20*time.Second, "demo's service and workload in the store", func() (bool, string) {
		resp, err := cp.etcd.Get(context.Background(), "/mesh/v1/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
		if err != nil {
			return false, err.Error()
		}
		var keys []string
		for _, kv := range resp.Kvs {
			keys = append(keys, string(kv.Key))
		}
		return len(keys) >= 2 && slices.ContainsFunc(keys, func(k string) bool { return strings.HasPrefix(k, "/mesh/v1/services/demo/") }), strings.Join(keys, " ")
	})
	cp.settled(t)

	stream := func(cert, key string) (discovery.AggregatedDiscoveryService_StreamAggregatedResourcesClient, error) {
		t.Helper()
		// The server's certificate is the old CA's: clients trust it.
		conn := dialTLS(t, cp.ads, oldCA.CertFile, cert, key)
		s, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(testutil.Context(t))
		if err != nil {
			return nil, err
		}
		node := &core.Node{Id: "sidecar~10.0.0.1~client.demo~demo.svc.cluster.local"}
		if err := s.Send(&discovery.DiscoveryRequest{Node: node, TypeUrl: resource.ClusterType}); err != nil {
			return nil, err
		}
		_, err = s.Recv()
		return s, err
	}
	old, err := stream(oldCert, oldKey)
	if err != nil {
		t.Fatalf("a proxy of the old CA: %v", err)
	}
	ended := make(chan error, 1)
	go func() {
		for {
			if _, err := old.Recv(); err != nil {
				ended <- err
				return
			}
		}
	}()
	copyFile(newCA.CertFile)
	select {
	case err := <-ended:
		// The server ends the stream by cancelling it: the client sees
		// the status, or the cancellation if the reset arrives first; the
		// server counts why.
		if c := grpcstatus.Code(err); c != codes.Unauthenticated && c != codes.Canceled {
			t.Errorf("the old CA's stream ended with %v, want Unauthenticated", err)
		}
		// The server counts it as its stream's handler returns, which
		// may be after the client saw the end.
		testutil.Eventually(t, 10*time.Second, "the old CA's stream counted as untrusted", func() (bool, string) {
			n := counter(t, cp.reg, "shardpilot_pusher_xds_streams_untrusted_total")
			return n == 1, fmt.Sprintf("%v streams ended as untrusted, want the old CA's one", n)
		})
	case <-time.After(30 * time.Second):
		t.Fatal("the old CA's stream outlived the CA's replacement by 30 s")
	}
	testutil.Eventually(t, 20*time.Second, "a proxy of the new CA is served", func() (bool, string) {
		_, err := stream(newCert, newKey)
		return err == nil, grpcstatus.Convert(err).Message()
	})
}
