package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/shardpilot/shardpilot/internal/testutil"
	"github.com/shardpilot/shardpilot/pkg/bus"
	"github.com/shardpilot/shardpilot/pkg/store"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestBusPermissionsDoc: docs/security.md shows what bus-permissions
// prints, and nats-server reads that configuration into users with exactly
// each role's permissions.
func TestBusPermissionsDoc(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), []string{"bus-permissions"}, &out, &out); err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile("../../docs/security.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, _ := strings.Cut(string(doc), "<!-- bus-permissions -->\n```\n")
	section, _, _ = strings.Cut(section, "```\n<!-- /bus-permissions -->")
	if section != out.String() {
		t.Errorf("docs/security.md shows\n%s\nshardctl bus-permissions prints\n%s", section, out.String())
	}

	conf, _, _ := strings.Cut(out.String(), "\n# operator mode")
	path := filepath.Join(t.TempDir(), "nats.conf")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("SHARDPILOT_INGESTER_PASSWORD", "i-secret")
	t.Setenv("SHARDPILOT_PUSHER_PASSWORD", "p-secret")
	opts, err := natsserver.ProcessConfigFile(path)
	if err != nil {
		t.Fatalf("nats-server reads the printed configuration: %v", err)
	}
	if len(opts.Users) != 2 {
		t.Fatalf("%d users, want 2", len(opts.Users))
	}
	for _, u := range opts.Users {
		var role bus.Role
		for r, name := range roleUsers {
			if name == u.Username {
				role = r
			}
		}
		want, err := bus.RolePermissions(role, "")
		if err != nil {
			t.Fatalf("user %s: %v", u.Username, err)
		}
		if u.Password == "" || strings.HasPrefix(u.Password, "$") {
			t.Errorf("user %s: password %q not taken from the environment", u.Username, u.Password)
		}
		if !slices.Equal(u.Permissions.Publish.Allow, want.Publish) || !slices.Equal(u.Permissions.Subscribe.Allow, want.Subscribe) {
			t.Errorf("user %s: publish %v subscribe %v, want %v and %v", u.Username,
				u.Permissions.Publish.Allow, u.Permissions.Subscribe.Allow, want.Publish, want.Subscribe)
		}
	}
	if err := run(context.Background(), []string{"bus-permissions", "a", "b"}, &out, &out); err == nil {
		t.Error("two streams taken")
	}
}

// TestEtcdRolesApply: "etcd-roles apply", signed in as etcd's root, gives
// each part's user the password of its file; docs/security.md shows what
// etcd-roles prints.
func TestEtcdRolesApply(t *testing.T) {
	e, _, _ := testutil.EtcdWithRoles(t)
	dir := filepath.Join(t.TempDir(), "passwords")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	for name, password := range map[string]string{"ingester": "new-ingester", "pusher": "new-pusher", "shardctl": "new-shardctl", "../root": "root-secret"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(password+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	var out bytes.Buffer
	// etcd hashes each password (bcrypt), slowly under the race detector
	// on a loaded machine: the Job the chart runs gives it a minute too.
	if err := run(context.Background(), []string{"--etcd-endpoints", e.Endpoint, "--etcd-username", "root", "--etcd-password-file", filepath.Join(dir, "../root"),
		"--timeout", "1m", "etcd-roles", "apply", dir}, &out, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	for _, r := range store.EtcdRoles() {
		cli := testutil.SignIn(t, e.Endpoint, r.Name, "new-"+r.Part)
		if _, err := cli.Get(testutil.Context(t), "/mesh/v1/", clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil {
			t.Errorf("%s reads the mesh: %v", r.Name, err)
		}
	}
	if err := run(context.Background(), []string{"--etcd-endpoints", e.Endpoint, "etcd-roles", "apply", t.TempDir()}, &out, &out); err == nil || !strings.Contains(err.Error(), "the ingester's password") {
		t.Errorf("apply without password files: %v", err)
	}

	// A new etcd, authentication off: given root's password in the
	// directory, apply turns it on after the roles.
	fresh, open := testutil.Etcd(t)
	if err := os.WriteFile(filepath.Join(dir, "root"), []byte("fresh-root\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if err := run(context.Background(), []string{"--etcd-endpoints", fresh.Endpoint, "--etcd-username", "root", "--etcd-password-file", filepath.Join(dir, "root"),
		"--timeout", "1m", "etcd-roles", "apply", dir}, &out, &out); err != nil || !strings.Contains(out.String(), "authentication: on") {
		t.Fatalf("apply on an etcd without authentication: %v\n%s", err, out.String())
	}
	if st, err := open.AuthStatus(testutil.Context(t)); err != nil || !st.Enabled {
		t.Errorf("authentication after apply with a root password: %v (%v), want on", st, err)
	}

	out.Reset()
	if err := run(context.Background(), []string{"etcd-roles"}, &out, &out); err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile("../../docs/security.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, _ := strings.Cut(string(doc), "<!-- etcd-roles -->\n```\n")
	section, _, _ = strings.Cut(section, "```\n<!-- /etcd-roles -->")
	if section != out.String() {
		t.Errorf("docs/security.md shows\n%s\nshardctl etcd-roles prints\n%s", section, out.String())
	}
}
