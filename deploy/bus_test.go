package deploy_test

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/shardpilot/shardpilot/internal/cli"
	"github.com/shardpilot/shardpilot/internal/kubetest"
	"github.com/shardpilot/shardpilot/internal/testutil"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/bus"
	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// TestChartBusCredentials: with the default values the chart makes a NATS
// user per role and the relay's signing key, each part mounts its own
// credential alone, and a NATS server loading the rendered users lets the
// ingester publish signed events that the pusher verifies, while the
// pusher's credential can publish no change and a client without one is
// refused. Before, the defaults gave both parts one credential (none) and
// no signing: a pusher could forge the whole mesh's endpoints.
func TestChartBusCredentials(t *testing.T) {
	h := helm(t)
	chart := filepath.Join("helm", "shardpilot")
	objs, err := kubetest.Decode([]byte(run(t, h, "template", "sp", chart)))
	if err != nil {
		t.Fatal(err)
	}
	users, signing := find(objs, "Secret", "sp-nats-users"), find(objs, "Secret", "sp-bus-signing")
	if users == nil || signing == nil {
		t.Fatalf("the default values make no NATS users (%v) or signing key (%v)", users != nil, signing != nil)
	}
	for _, s := range []*unstructured.Unstructured{users, signing} {
		if s.GetAnnotations()["helm.sh/resource-policy"] != "keep" {
			t.Errorf("%s is not kept on uninstall (the stream's events and an external NATS server's users outlive the release)", s.GetName())
		}
	}
	// Each part mounts its own password, and its half of the key, alone.
	for part, want := range map[string][2]string{"ingester": {"ingester", "signing.key"}, "pusher": {"pusher", "verify.pub"}} {
		d := find(objs, "Deployment", "sp-"+part)
		vols, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "volumes")
		if got := secretItems(vols, "sp-nats-users"); !slices.Equal(got, []string{want[0]}) {
			t.Errorf("%s mounts %v of sp-nats-users, want %s alone", part, got, want[0])
		}
		if got := secretItems(vols, "sp-bus-signing"); !slices.Equal(got, []string{want[1]}) {
			t.Errorf("%s mounts %v of sp-bus-signing, want %s alone", part, got, want[1])
		}
		if env := containerEnv(d); env["SHARDPILOT_NATS_USER"] != "shardpilot-"+part {
			t.Errorf("%s signs in to NATS as %q, want shardpilot-%s", part, env["SHARDPILOT_NATS_USER"], part)
		}
	}

	dir := t.TempDir()
	files := map[string]string{}
	for _, kv := range [][2]any{{users, "ingester"}, {users, "pusher"}, {signing, "signing.key"}, {signing, "verify.pub"}, {users, "authorization.conf"}} {
		s, key := kv[0].(*unstructured.Unstructured), kv[1].(string)
		v, ok, _ := unstructured.NestedString(s.Object, "stringData", key)
		if !ok {
			enc, _, _ := unstructured.NestedString(s.Object, "data", key)
			b, err := base64.StdEncoding.DecodeString(enc)
			if err != nil || len(b) == 0 {
				t.Fatalf("%s %s: %q (%v)", s.GetName(), key, enc, err)
			}
			v = string(b)
		}
		files[key] = filepath.Join(dir, key)
		if err := os.WriteFile(files[key], []byte(v), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	sign, err := cli.SigningKey("bus-signing-key-file", files["signing.key"])
	if err != nil {
		t.Fatal(err)
	}
	verify, err := cli.VerifyKeys("bus-verify-key-file", files["verify.pub"])
	if err != nil {
		t.Fatal(err)
	}
	checkBusUsers(t, files, sign, verify)

	// A trial's NATS loads the users; an operator may turn both off.
	objs, err = kubetest.Decode([]byte(run(t, h, "template", "sp", chart, "--set", "trial.enabled=true")))
	if err != nil {
		t.Fatal(err)
	}
	nats := find(objs, "StatefulSet", "sp-nats")
	ctrs, _, _ := unstructured.NestedSlice(nats.Object, "spec", "template", "spec", "containers")
	args, _, _ := unstructured.NestedStringSlice(ctrs[0].(map[string]any), "args")
	vols, _, _ := unstructured.NestedSlice(nats.Object, "spec", "template", "spec", "volumes")
	if !slices.Contains(args, "--config=/etc/nats/authorization.conf") || !slices.Equal(secretItems(vols, "sp-nats-users"), []string{"authorization.conf"}) {
		t.Errorf("the trial's NATS does not load the users: args %v, volumes %v", args, vols)
	}
	if keep := find(objs, "Secret", "sp-nats-users").GetAnnotations()["helm.sh/resource-policy"]; keep != "" {
		t.Errorf("a trial's NATS users are kept on uninstall (%q), though its NATS goes with it", keep)
	}
	objs, err = kubetest.Decode([]byte(run(t, h, "template", "sp", chart, "--set", "nats.auth.type=none,nats.signing.enabled=false")))
	if err != nil {
		t.Fatal(err)
	}
	if find(objs, "Secret", "sp-nats-users") != nil || find(objs, "Secret", "sp-bus-signing") != nil {
		t.Error("nats.auth.type=none and nats.signing.enabled=false still make credentials")
	}
	if env := containerEnv(find(objs, "Deployment", "sp-pusher")); env["SHARDPILOT_NATS_USER"] != "" || env["SHARDPILOT_BUS_VERIFY_KEY_FILE"] != "" {
		t.Errorf("turned off, the pusher still signs in or verifies: %v", env)
	}
}

// checkBusUsers runs a NATS server on the rendered authorization.conf and
// checks what each credential can do there.
func checkBusUsers(t *testing.T, files map[string]string, sign ed25519.PrivateKey, verify []ed25519.PublicKey) {
	t.Helper()
	opts, err := natsserver.ProcessConfigFile(files["authorization.conf"])
	if err != nil {
		t.Fatalf("nats-server reads the chart's authorization.conf: %v", err)
	}
	for _, u := range opts.Users {
		role := map[string]bus.Role{"shardpilot-ingester": bus.RoleRelay, "shardpilot-pusher": bus.RoleConsumer}[u.Username]
		want, err := bus.RolePermissions(role, "")
		if err != nil {
			t.Fatalf("user %s: %v", u.Username, err)
		}
		if !slices.Equal(u.Permissions.Publish.Allow, want.Publish) || !slices.Equal(u.Permissions.Subscribe.Allow, want.Subscribe) {
			t.Errorf("user %s: publish %v subscribe %v, want the role's %v and %v (shardctl bus-permissions)", u.Username,
				u.Permissions.Publish.Allow, u.Permissions.Subscribe.Allow, want.Publish, want.Subscribe)
		}
		if !strings.HasPrefix(u.Password, "$2") {
			t.Errorf("user %s: the server's copy of the password is not a bcrypt hash", u.Username)
		}
	}
	opts.Port, opts.JetStream, opts.StoreDir, opts.NoSigs, opts.NoLog = -1, true, t.TempDir(), true, true
	srv, err := natsserver.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start()
	t.Cleanup(srv.Shutdown)
	if !srv.ReadyForConnections(30 * time.Second) {
		t.Fatal("NATS did not start")
	}
	connect := func(user string) (*nats.Conn, error) {
		// The refusals are checked, not logged; the server checks a
		// bcrypt hash, slowly on a loaded machine.
		o := []nats.Option{nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}), nats.Timeout(30 * time.Second)}
		if user != "" {
			pw, err := os.ReadFile(files[strings.TrimPrefix(user, "shardpilot-")])
			if err != nil {
				t.Fatal(err)
			}
			o = append(o, nats.UserInfo(user, string(pw)))
		}
		nc, err := nats.Connect(srv.ClientURL(), o...)
		if err == nil {
			t.Cleanup(nc.Close)
		}
		return nc, err
	}
	if _, err := connect(""); err == nil {
		t.Error("a client without credentials was let in")
	}
	ctx := testutil.Context(t)
	ev := &meshv1.ChangeEvent{Type: meshv1.ChangeEvent_TYPE_PUT, Key: "/mesh/v1/endpoints/payments/api/k8s", Revision: 7, Count: 1}

	inc, err := connect("shardpilot-ingester")
	if err != nil {
		t.Fatal(err)
	}
	relay, err := bus.New(inc, bus.Config{Sign: sign})
	if err != nil {
		t.Fatal(err)
	}
	if err := relay.Ensure(ctx); err != nil {
		t.Fatalf("the ingester's user makes the stream: %v", err)
	}
	if _, err := relay.Publish(ctx, ev); err != nil {
		t.Fatalf("the ingester's user publishes: %v", err)
	}

	pnc, err := connect("shardpilot-pusher")
	if err != nil {
		t.Fatal(err)
	}
	forger, err := bus.New(pnc, bus.Config{Sign: sign})
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, err := forger.Publish(short, &meshv1.ChangeEvent{Type: meshv1.ChangeEvent_TYPE_PUT, Key: "/mesh/v1/endpoints/payments/api/k8s", Revision: 8, Count: 1}); err == nil {
		t.Error("the pusher's user published a change")
	}
	consumer, err := bus.New(pnc, bus.Config{Verify: verify})
	if err != nil {
		t.Fatal(err)
	}
	stop := errors.New("stop")
	var got *meshv1.ChangeEvent
	if err := consumer.Consume(ctx, 1, func(_ uint64, e *meshv1.ChangeEvent) error { got = e; return stop }); !errors.Is(err, stop) || !proto.Equal(got, ev) {
		t.Errorf("the pusher's user consumed %v (%v), want the relay's signed event", got, err)
	}
}

// secretItems lists the keys of a Secret that volumes mount.
func secretItems(vols []any, secret string) []string {
	var keys []string
	for _, v := range vols {
		if name, _, _ := unstructured.NestedString(v.(map[string]any), "secret", "secretName"); name != secret {
			continue
		}
		items, _, _ := unstructured.NestedSlice(v.(map[string]any), "secret", "items")
		for _, it := range items {
			keys = append(keys, it.(map[string]any)["key"].(string))
		}
	}
	return keys
}

// containerEnv is the first container's environment of literal values.
func containerEnv(d *unstructured.Unstructured) map[string]string {
	ctrs, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "containers")
	env := map[string]string{}
	envs, _, _ := unstructured.NestedSlice(ctrs[0].(map[string]any), "env")
	for _, e := range envs {
		if v, ok := e.(map[string]any)["value"].(string); ok {
			env[e.(map[string]any)["name"].(string)] = v
		}
	}
	return env
}
