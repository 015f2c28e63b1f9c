package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/shardpilot/shardpilot/internal/embedded"
	"github.com/shardpilot/shardpilot/internal/testutil"
	"github.com/shardpilot/shardpilot/pkg/bus"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// TestSecuredStore runs the ingester binary and a pusher against an etcd
// that requires client certificates and a NATS server that requires TLS
// and a user and password, where the pusher's user may not publish mesh
// changes. The mesh flows; a client without a certificate is refused by
// etcd, one without credentials by NATS, and the pusher's credentials
// cannot inject an event into the stream.
func TestSecuredStore(t *testing.T) {
	ca := testutil.NewCA(t)
	etcdCert, etcdKey := ca.Issue(t, "etcd")
	natsCert, natsKey := ca.Issue(t, "nats")
	ingCert, ingKey := ca.Issue(t, "ingester")
	pushCert, pushKey := ca.Issue(t, "pusher")
	etcd, err := embedded.StartEtcdWith(t.TempDir(), embedded.EtcdOptions{TLS: &embedded.TLS{CertFile: etcdCert, KeyFile: etcdKey, ClientCAFile: ca.CertFile}})
	if err != nil {
		t.Fatal(err)
	}
	defer etcd.Close()
	if !strings.HasPrefix(etcd.Endpoint, "https://") {
		t.Fatalf("etcd endpoint %s", etcd.Endpoint)
	}
	ns, err := embedded.StartNATSWith(t.TempDir(), 0, embedded.NATSOptions{
		TLS: &embedded.TLS{CertFile: natsCert, KeyFile: natsKey},
		Users: []*natsserver.User{
			{Username: "ingester", Password: "ingester-secret"},
			{Username: "pusher", Password: "pusher-secret", Permissions: &natsserver.Permissions{
				Publish: &natsserver.SubjectPermission{Deny: []string{bus.SubjectPrefix + ".>"}}}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	secrets := t.TempDir()
	secret := func(name, value string) string {
		p := filepath.Join(secrets, name)
		if err := os.WriteFile(p, []byte(value+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}

	mesh := t.TempDir()
	b, err := os.ReadFile("../../examples/mesh/greeter.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(mesh, "greeter.yaml"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "ingester")
	if out, err := exec.Command("go", "build", "-o", bin, "../ingester").CombinedOutput(); err != nil {
		t.Fatalf("build the ingester: %v\n%s", err, out)
	}
	ingester := exec.Command(bin, "--mesh-dir", mesh, "--admin-addr", testutil.FreeAddr(t), "--log-level", "warn")
	ingester.Env = append(os.Environ(),
		"SHARDPILOT_ETCD_ENDPOINTS="+etcd.Endpoint, "SHARDPILOT_ETCD_CA_FILE="+ca.CertFile,
		"SHARDPILOT_ETCD_CERT_FILE="+ingCert, "SHARDPILOT_ETCD_KEY_FILE="+ingKey,
		"SHARDPILOT_NATS_URL="+ns.URL, "SHARDPILOT_NATS_CA_FILE="+ca.CertFile,
		"SHARDPILOT_NATS_USER=ingester", "SHARDPILOT_NATS_PASSWORD_FILE="+secret("ingester-nats", "ingester-secret"))
	ingester.Stderr = io.Discard
	if testing.Verbose() {
		ingester.Stderr = os.Stderr
	}
	if err := ingester.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = ingester.Process.Signal(os.Interrupt)
		_ = ingester.Wait()
	}()

	admin := testutil.FreeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"--etcd-endpoints", etcd.Endpoint, "--etcd-ca-file", ca.CertFile,
			"--etcd-cert-file", pushCert, "--etcd-key-file", pushKey,
			"--nats-url", ns.URL, "--nats-ca-file", ca.CertFile, "--nats-user", "pusher", "--nats-password-file", secret("pusher-nats", "pusher-secret"),
			"--ads-plaintext", "--ads-addr", "127.0.0.1:0", "--admin-addr", admin, "--log-level", "warn"})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("pusher: %v", err)
		}
	}()
	assignments := func(n int) {
		t.Helper()
		testutil.Eventually(t, 30*time.Second, fmt.Sprintf("the pusher serves %d load assignments", n), func() (bool, string) {
			_, body := get("http://" + admin + "/metrics")
			want := fmt.Sprintf(`shardpilot_pusher_resources{type="ClusterLoadAssignment"} %d`, n)
			return strings.Contains(body, want), want + " not in /metrics"
		})
	}
	assignments(1)

	// etcd refuses a client without a certificate.
	tc, err := (&transport.TLSInfo{TrustedCAFile: ca.CertFile}).ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	anon, err := clientv3.New(clientv3.Config{Endpoints: []string{etcd.Endpoint}, TLS: tc, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err == nil {
		gctx, gcancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err = anon.Get(gctx, "/mesh/v1/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		gcancel()
		anon.Close()
	}
	if err == nil {
		t.Error("etcd answered a client without a certificate")
	}

	// NATS refuses a client without credentials.
	if nc, err := nats.Connect(ns.URL, nats.RootCAs(ca.CertFile)); err == nil || !strings.Contains(strings.ToLower(err.Error()), "authorization") {
		if nc != nil {
			nc.Close()
		}
		t.Errorf("NATS without credentials: %v, want an authorization violation", err)
	}

	// The pusher's credentials cannot inject a change into the stream.
	stream := func(user, password string) (jetstream.Stream, *nats.Conn) {
		t.Helper()
		nc, err := nats.Connect(ns.URL, nats.RootCAs(ca.CertFile), nats.UserInfo(user, password))
		if err != nil {
			t.Fatal(err)
		}
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		s, err := js.Stream(context.Background(), "SHARDPILOT_MESH")
		if err != nil {
			t.Fatal(err)
		}
		return s, nc
	}
	s, admin2 := stream("ingester", "ingester-secret")
	defer admin2.Close()
	before, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	forger, err := nats.Connect(ns.URL, nats.RootCAs(ca.CertFile), nats.UserInfo("pusher", "pusher-secret"))
	if err != nil {
		t.Fatal(err)
	}
	defer forger.Close()
	fjs, err := jetstream.New(forger)
	if err != nil {
		t.Fatal(err)
	}
	pctx, pcancel := context.WithTimeout(context.Background(), 2*time.Second)
	_, err = fjs.Publish(pctx, bus.SubjectPrefix+".Service.demo", []byte("forged"))
	pcancel()
	if err == nil {
		t.Error("a pusher's credentials published into the stream")
	}
	after, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if after.State.LastSeq != before.State.LastSeq {
		t.Errorf("the stream grew from %d to %d messages after a forged publish", before.State.LastSeq, after.State.LastSeq)
	}

	// Changes still flow over the secured connections.
	// Its ServiceEntry, renamed.
	more := strings.ReplaceAll(strings.Split(string(b), "\n---\n")[0], "greeter", "farewell")
	if err := os.WriteFile(filepath.Join(mesh, "farewell.yaml"), []byte(more), 0o644); err != nil {
		t.Fatal(err)
	}
	assignments(2)
}
