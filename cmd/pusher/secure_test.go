package main

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
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
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/bus"
	pkgca "github.com/shardpilot/shardpilot/pkg/ca"
	"github.com/shardpilot/shardpilot/pkg/store"
	"github.com/shardpilot/shardpilot/pkg/telemetry"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// TestSecuredStore runs the ingester binary and a pusher against an etcd
// that requires client certificates, each part signed in as its own user
// (store.EtcdRoles; the pusher keeps the CA's root there, sealed, where
// the ingesters' user cannot read it), and a NATS server that requires TLS
// and a user and password per role (bus.RolePermissions), the relay
// signing its events and the pusher verifying them. The mesh flows; a
// client without a certificate is refused by etcd, one without credentials
// by NATS; the pusher's credentials can neither inject an event nor alter,
// purge or delete the stream; an event forged with the relay's NATS
// credentials alone is refused by the pusher, and the relay does not resume
// after it; a stream deleted or widened by an administrator is made again
// by the relay, and changes keep reaching the pusher.
func TestSecuredStore(t *testing.T) {
	m := startSecuredStores(t)
	m.startIngester(t)
	m.startPusher(t)
	m.assignments(t, 1)
	m.nothingWeakReported(t)
	m.strangersRefused(t)
	m.pusherCannotWrite(t)
	m.forgedEventRefused(t)
	m.streamRestored(t)
}

// securedMesh is the secured store and bus of TestSecuredStore, with the
// processes running on them.
type securedMesh struct {
	ca   *testutil.CA
	etcd *embedded.Etcd
	// root is etcd's root user.
	root *clientv3.Client
	nats *embedded.NATS
	// secrets holds the password and key files; mesh is the mesh
	// directory the ingester reads, greeter the example it starts with.
	secrets, mesh string
	greeter       []byte
	// admin and ingAdmin are the pusher's and the ingester's admin
	// addresses; adminJS is the NATS operator's JetStream.
	admin, ingAdmin string
	adminJS         jetstream.JetStream
}

// startSecuredStores starts an etcd requiring client certificates, with a
// user per part, and a NATS requiring TLS and a user per role.
func startSecuredStores(t *testing.T) *securedMesh {
	m := &securedMesh{ca: testutil.NewCA(t), secrets: t.TempDir(), mesh: t.TempDir()}
	etcdCert, etcdKey := m.ca.Issue(t, "etcd")
	natsCert, natsKey := m.ca.Issue(t, "nats")
	var err error
	m.etcd, err = embedded.StartEtcdWith(t.TempDir(), embedded.EtcdOptions{TLS: &embedded.TLS{CertFile: etcdCert, KeyFile: etcdKey, ClientCAFile: m.ca.CertFile}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.etcd.Close)
	if !strings.HasPrefix(m.etcd.Endpoint, "https://") {
		t.Fatalf("etcd endpoint %s", m.etcd.Endpoint)
	}
	// Authentication on, a user per part (store.EtcdRoles).
	m.root = m.etcdAs(t, "root")
	if _, err := m.root.UserAddWithOptions(context.Background(), "root", "", &clientv3.UserAddOptions{NoPassword: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := m.root.UserGrantRole(context.Background(), "root", "root"); err != nil {
		t.Fatal(err)
	}
	if err := store.EnsureRoles(context.Background(), m.root, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := m.root.AuthEnable(context.Background()); err != nil {
		t.Fatal(err)
	}
	role := func(user string, r bus.Role) *natsserver.User {
		u, err := embedded.RoleUser(user, user+"-secret", r)
		if err != nil {
			t.Fatal(err)
		}
		return u
	}
	m.nats, err = embedded.StartNATSWith(t.TempDir(), 0, embedded.NATSOptions{
		TLS: &embedded.TLS{CertFile: natsCert, KeyFile: natsKey},
		Users: []*natsserver.User{role("ingester", bus.RoleRelay), role("pusher", bus.RoleConsumer),
			// The operator's own, for the stream's deletion below.
			{Username: "admin", Password: "admin-secret"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.nats.Close)
	_, m.adminJS = m.connect(t, "admin")
	return m
}

// etcdAs is an etcd client signed in as user, by its certificate.
func (m *securedMesh) etcdAs(t *testing.T, user string) *clientv3.Client {
	t.Helper()
	cert, key := m.ca.Issue(t, user)
	tc, err := (&transport.TLSInfo{TrustedCAFile: m.ca.CertFile, CertFile: cert, KeyFile: key}).ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{m.etcd.Endpoint}, TLS: tc, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

// connect signs in to NATS as user.
func (m *securedMesh) connect(t *testing.T, user string) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(m.nats.URL, nats.RootCAs(m.ca.CertFile), nats.UserInfo(user, user+"-secret"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return nc, js
}

// secret writes a secret file.
func (m *securedMesh) secret(t *testing.T, name, value string) string {
	p := filepath.Join(m.secrets, name)
	if err := os.WriteFile(p, []byte(value+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// startIngester runs the ingester binary on the example mesh, signed in to
// etcd and NATS as the ingesters, signing its events.
func (m *securedMesh) startIngester(t *testing.T) {
	var err error
	if m.greeter, err = os.ReadFile("../../examples/mesh/greeter.yaml"); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(m.mesh, "greeter.yaml"), m.greeter, 0o644); err != nil {
		t.Fatal(err)
	}
	signing, _ := busKeys(t, m.secrets)
	bin := filepath.Join(t.TempDir(), "ingester")
	if out, err := exec.Command("go", "build", "-o", bin, "../ingester").CombinedOutput(); err != nil {
		t.Fatalf("build the ingester: %v\n%s", err, out)
	}
	ingCert, ingKey := m.ca.Issue(t, "shardpilot-ingester")
	m.ingAdmin = testutil.FreeAddr(t)
	ingester := exec.Command(bin, "--mesh-dir", m.mesh, "--admin-addr", m.ingAdmin, "--log-level", "warn", "--bus-signing-key-file", signing)
	ingester.Env = append(os.Environ(),
		"SHARDPILOT_ETCD_ENDPOINTS="+m.etcd.Endpoint, "SHARDPILOT_ETCD_CA_FILE="+m.ca.CertFile,
		"SHARDPILOT_ETCD_CERT_FILE="+ingCert, "SHARDPILOT_ETCD_KEY_FILE="+ingKey,
		"SHARDPILOT_NATS_URL="+m.nats.URL, "SHARDPILOT_NATS_CA_FILE="+m.ca.CertFile,
		"SHARDPILOT_NATS_USER=ingester", "SHARDPILOT_NATS_PASSWORD_FILE="+m.secret(t, "ingester-nats", "ingester-secret"))
	ingester.Stderr = io.Discard
	if testing.Verbose() {
		ingester.Stderr = os.Stderr
	}
	if err := ingester.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = ingester.Process.Signal(os.Interrupt)
		_ = ingester.Wait()
	})
}

// startPusher runs a pusher, signed in as the pushers, verifying the
// ingester's events and serving ADS over mutual TLS.
func (m *securedMesh) startPusher(t *testing.T) {
	pushCert, pushKey := m.ca.Issue(t, "shardpilot-pusher")
	adsCert, adsKey := m.ca.Issue(t, "pusher")
	verifying := filepath.Join(m.secrets, "bus-verify.pem")
	m.admin = testutil.FreeAddr(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"--etcd-endpoints", m.etcd.Endpoint, "--etcd-ca-file", m.ca.CertFile,
			"--etcd-cert-file", pushCert, "--etcd-key-file", pushKey,
			"--nats-url", m.nats.URL, "--nats-ca-file", m.ca.CertFile, "--nats-user", "pusher", "--nats-password-file", m.secret(t, "pusher-nats", "pusher-secret"),
			"--bus-verify-key-file", verifying,
			"--ads-cert-file", adsCert, "--ads-key-file", adsKey, "--ads-client-ca-file", m.ca.CertFile,
			"--ca-seal-key-file", m.secret(t, "seal.key", base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{7}, 32))),
			"--ads-addr", "127.0.0.1:0", "--admin-addr", m.admin, "--log-level", "warn"})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("pusher: %v", err)
		}
	})
}

// nothingWeakReported: secured as docs/security.md says, the pusher and
// the ingester report no weak setting but the admin port's, whose token
// the test leaves out (shardctl security-check lists what they report).
func (m *securedMesh) nothingWeakReported(t *testing.T) {
	t.Helper()
	for _, admin := range []string{m.admin, m.ingAdmin} {
		code, body := get("http://" + admin + "/debug/security")
		var got []telemetry.Weakness
		if err := json.Unmarshal([]byte(body), &got); code != http.StatusOK || err != nil {
			t.Fatalf("%s/debug/security: %d %v\n%s", admin, code, err, body)
		}
		if len(got) != 1 || !strings.HasPrefix(got[0].Setting, "--admin-token-file") {
			t.Errorf("%s reports %+v, want the admin token alone", admin, got)
		}
	}
}

// assignments waits until the pusher serves n load assignments.
func (m *securedMesh) assignments(t *testing.T, n int) {
	t.Helper()
	testutil.Eventually(t, 30*time.Second, fmt.Sprintf("the pusher serves %d load assignments", n), func() (bool, string) {
		_, body := get("http://" + m.admin + "/metrics")
		want := fmt.Sprintf(`shardpilot_pusher_resources{type="ClusterLoadAssignment"} %d`, n)
		return strings.Contains(body, want), want + " not in /metrics"
	})
}

// strangersRefused: etcd refuses a client without a certificate, NATS one
// without credentials; the CA's root is in etcd sealed, where the
// ingesters' user may not read it, and that user may not announce a
// pusher.
func (m *securedMesh) strangersRefused(t *testing.T) {
	tc, err := (&transport.TLSInfo{TrustedCAFile: m.ca.CertFile}).ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	anon, err := clientv3.New(clientv3.Config{Endpoints: []string{m.etcd.Endpoint}, TLS: tc, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err == nil {
		gctx, gcancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err = anon.Get(gctx, "/mesh/v1/", clientv3.WithPrefix(), clientv3.WithCountOnly())
		gcancel()
		anon.Close()
	}
	if err == nil {
		t.Error("etcd answered a client without a certificate")
	}
	sealed, err := m.root.Get(context.Background(), pkgca.SealedRootKey)
	if err != nil || len(sealed.Kvs) != 1 || bytes.Contains(sealed.Kvs[0].Value, []byte("PRIVATE KEY")) {
		t.Errorf("the root in etcd: %v, %v", sealed, err)
	}
	ingEtcd := m.etcdAs(t, "shardpilot-ingester")
	if _, err := ingEtcd.Get(context.Background(), pkgca.SealedRootKey); !errors.Is(err, rpctypes.ErrPermissionDenied) {
		t.Errorf("the ingesters' etcd user reads the CA's root: %v", err)
	}
	if _, err := ingEtcd.Put(context.Background(), store.MemberPrefix+"pusher/evil", "{}"); !errors.Is(err, rpctypes.ErrPermissionDenied) {
		t.Errorf("the ingesters' etcd user announces a pusher: %v", err)
	}
	if nc, err := nats.Connect(m.nats.URL, nats.RootCAs(m.ca.CertFile)); err == nil || !strings.Contains(strings.ToLower(err.Error()), "authorization") {
		if nc != nil {
			nc.Close()
		}
		t.Errorf("NATS without credentials: %v, want an authorization violation", err)
	}
}

// info is the stream's state, as the operator sees it.
func (m *securedMesh) info(t *testing.T) *jetstream.StreamInfo {
	t.Helper()
	s, err := m.adminJS.Stream(context.Background(), "SHARDPILOT_MESH")
	if err != nil {
		t.Fatal(err)
	}
	i, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return i
}

// pusherCannotWrite: the pusher's credentials can neither publish nor
// alter, purge or delete the stream.
func (m *securedMesh) pusherCannotWrite(t *testing.T) {
	before := m.info(t)
	_, pusherJS := m.connect(t, "pusher")
	for what, attempt := range map[string]func(context.Context) error{
		"publish a change": func(ctx context.Context) error {
			_, err := pusherJS.Publish(ctx, bus.SubjectPrefix+".endpoints.demo", []byte("forged"))
			return err
		},
		"publish elsewhere": func(ctx context.Context) error {
			_, err := pusherJS.Publish(ctx, "evil.x", []byte("forged"))
			return err
		},
		"widen the stream": func(ctx context.Context) error {
			cfg := before.Config
			cfg.Subjects = append(cfg.Subjects, "evil.>")
			_, err := pusherJS.UpdateStream(ctx, cfg)
			return err
		},
		"delete the stream": func(ctx context.Context) error { return pusherJS.DeleteStream(ctx, "SHARDPILOT_MESH") },
		"purge the stream": func(ctx context.Context) error {
			s, err := pusherJS.Stream(ctx, "SHARDPILOT_MESH")
			if err == nil {
				err = s.Purge(ctx)
			}
			return err
		},
	} {
		actx, acancel := context.WithTimeout(context.Background(), 2*time.Second)
		err := attempt(actx)
		acancel()
		if err == nil {
			t.Errorf("a pusher's credentials could %s", what)
		}
	}
	if after := m.info(t); after.State.LastSeq != before.State.LastSeq || len(after.Config.Subjects) != 1 {
		t.Errorf("the stream went from %d messages on %v to %d on %v after the pusher's attempts",
			before.State.LastSeq, before.Config.Subjects, after.State.LastSeq, after.Config.Subjects)
	}
}

// metric waits until a process's metric reaches atLeast.
func metricAtLeast(t *testing.T, addr, name string, atLeast float64) {
	t.Helper()
	testutil.Eventually(t, 30*time.Second, fmt.Sprintf("%s ≥ %v at %s", name, atLeast, addr), func() (bool, string) {
		_, body := get("http://" + addr + "/metrics")
		for _, line := range strings.Split(body, "\n") {
			if v, ok := strings.CutPrefix(line, name+" "); ok {
				var f float64
				_, _ = fmt.Sscan(v, &f)
				return f >= atLeast, line
			}
		}
		return false, "not in /metrics"
	})
}

// forgedEventRefused: with the relay's NATS credentials but not its
// signing key, a forged change (a second load assignment) is refused by
// the pusher, and the relay does not resume after it (far ahead of the
// store): changes keep flowing over the secured connections.
func (m *securedMesh) forgedEventRefused(t *testing.T) {
	ingNC, _ := m.connect(t, "ingester")
	forger, err := bus.New(ingNC, bus.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := forger.Publish(context.Background(), &meshv1.ChangeEvent{Type: meshv1.ChangeEvent_TYPE_PUT,
		Key: "/mesh/v1/endpoints/demo/forged/yaml", Revision: 1 << 40, Value: []byte{}, Count: 1}); err != nil {
		t.Fatal(err)
	}
	metricAtLeast(t, m.admin, `shardpilot_pusher_events_total{outcome="refused"}`, 1)
	m.assignments(t, 1)
	m.write(t, "farewell")
	m.assignments(t, 2)
	metricAtLeast(t, m.ingAdmin, "shardpilot_relay_unconfirmed_events_total", 1)
}

// write adds the example's ServiceEntry under another name.
func (m *securedMesh) write(t *testing.T, name string) {
	t.Helper()
	more := strings.ReplaceAll(strings.Split(string(m.greeter), "\n---\n")[0], "greeter", name)
	if err := os.WriteFile(filepath.Join(m.mesh, name+".yaml"), []byte(more), 0o644); err != nil {
		t.Fatal(err)
	}
}

// streamRestored: a stream an administrator deletes is made again by the
// relay, and a change made afterwards reaches the pusher; one widened is
// narrowed again.
func (m *securedMesh) streamRestored(t *testing.T) {
	if err := m.adminJS.DeleteStream(context.Background(), "SHARDPILOT_MESH"); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, "the relay makes the stream again", func() (bool, string) {
		s, err := m.adminJS.Stream(context.Background(), "SHARDPILOT_MESH")
		if err != nil {
			return false, err.Error()
		}
		return s.CachedInfo().State.Msgs > 0, fmt.Sprint(s.CachedInfo().State)
	})
	m.write(t, "welcome")
	m.assignments(t, 3)
	cfg := m.info(t).Config
	cfg.Subjects = append(cfg.Subjects, "evil.>")
	if _, err := m.adminJS.UpdateStream(context.Background(), cfg); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, "the relay narrows the stream again", func() (bool, string) {
		subjects := m.info(t).Config.Subjects
		return len(subjects) == 1 && subjects[0] == bus.SubjectPrefix+".>", fmt.Sprint(subjects)
	})
}

// busKeys writes an ed25519 key pair as the relay's signing key and the
// pushers' verifying key, and returns their files.
func busKeys(t *testing.T, dir string) (signing, verifying string) {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	pubDER, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	signing, verifying = filepath.Join(dir, "bus-signing.pem"), filepath.Join(dir, "bus-verify.pem")
	if err := os.WriteFile(signing, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(verifying, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pubDER}), 0o644); err != nil {
		t.Fatal(err)
	}
	return signing, verifying
}
