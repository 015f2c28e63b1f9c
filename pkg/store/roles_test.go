package store_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/shardpilot/shardpilot/internal/testutil"
	"github.com/shardpilot/shardpilot/pkg/store"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestEtcdRoles: each part's etcd user may do what the part needs and
// nothing else (the CA's sealed root is the pushers' alone, the mesh the
// ingesters' to write); running EnsureRoles again strips a permission or
// a role an administrator added.
func TestEtcdRoles(t *testing.T) {
	_, root, as := testutil.EtcdWithRoles(t)
	ctx := testutil.Context(t)
	ingester, pusher, shardctl := as("ingester"), as("pusher"), as("shardctl")
	const secret = store.PusherPrefix + "ca/root"
	if _, err := root.Put(ctx, secret, "sealed"); err != nil {
		t.Fatal(err)
	}
	read := func(cli *clientv3.Client, key string) error {
		_, err := cli.Get(ctx, key, clientv3.WithPrefix())
		return err
	}
	write := func(cli *clientv3.Client, key string) error {
		_, err := cli.Put(ctx, key, "x")
		return err
	}
	for _, c := range []struct {
		who     string
		cli     *clientv3.Client
		op      func(*clientv3.Client, string) error
		key     string
		allowed bool
	}{
		{"ingester", ingester, write, "/mesh/v1/services/demo/a", true},
		{"ingester", ingester, write, store.ElectionPrefix + "relay/1", true},
		{"ingester", ingester, write, store.MemberPrefix + "ingester/i-1", true},
		{"ingester", ingester, read, store.MemberPrefix + "ingester/", true},
		{"ingester", ingester, write, store.MemberPrefix + "pusher/p-1", false},
		{"ingester", ingester, read, secret, false},
		{"ingester", ingester, write, "/other", false},
		{"pusher", pusher, read, "/mesh/v1/", true},
		{"pusher", pusher, write, "/mesh/v1/services/demo/a", false},
		{"pusher", pusher, write, store.MemberPrefix + "pusher/p-1", true},
		{"pusher", pusher, write, store.ElectionPrefix + "relay/1", false},
		{"pusher", pusher, read, secret, true},
		{"pusher", pusher, write, secret, true},
		{"shardctl", shardctl, read, "/mesh/v1/", true},
		{"shardctl", shardctl, read, store.MemberPrefix, true},
		{"shardctl", shardctl, write, store.MemberPrefix + "pusher/p-1", false},
		{"shardctl", shardctl, write, "/mesh/v1/services/demo/a", false},
		{"shardctl", shardctl, read, secret, false},
	} {
		err := c.op(c.cli, c.key)
		if c.allowed && err != nil {
			t.Errorf("%s on %s: %v, want allowed", c.who, c.key, err)
		}
		if !c.allowed && !errors.Is(err, rpctypes.ErrPermissionDenied) {
			t.Errorf("%s on %s: %v, want permission denied", c.who, c.key, err)
		}
	}

	// An administrator widens the ingesters' role and gives them the
	// pushers' too: the next EnsureRoles undoes both.
	if _, err := root.RoleGrantPermission(ctx, "shardpilot-ingester", "/", "\x00", clientv3.PermissionType(clientv3.PermReadWrite)); err != nil {
		t.Fatal(err)
	}
	if _, err := root.UserGrantRole(ctx, "shardpilot-ingester", "shardpilot-pusher"); err != nil {
		t.Fatal(err)
	}
	if err := read(ingester, secret); err != nil {
		t.Fatalf("widened: %v", err)
	}
	if err := store.EnsureRoles(ctx, root, map[string]string{"ingester": "ingester-secret", "pusher": "pusher-secret", "shardctl": "shardctl-secret"}); err != nil {
		t.Fatal(err)
	}
	if err := read(ingester, secret); !errors.Is(err, rpctypes.ErrPermissionDenied) {
		t.Errorf("after EnsureRoles the ingester reads the CA: %v", err)
	}
	if err := write(ingester, "/mesh/v1/services/demo/b"); err != nil {
		t.Errorf("after EnsureRoles the ingester cannot write the mesh: %v", err)
	}
	user, err := root.UserGet(ctx, "shardpilot-ingester")
	if err != nil {
		t.Fatal(err)
	}
	if len(user.Roles) != 1 || user.Roles[0] != "shardpilot-ingester" {
		t.Errorf("the ingester's user has roles %v, want its own alone", user.Roles)
	}
}

// TestEtcdctl: the commands an operator runs by hand grant what
// EtcdRoles lists.
func TestEtcdctl(t *testing.T) {
	for _, r := range store.EtcdRoles() {
		out := r.Etcdctl("PASSWORD")
		for _, g := range r.Grants {
			want := "etcdctl role grant-permission " + r.Name + " " + string(g.Access) + " " + g.Prefix + " --prefix=true"
			if !strings.Contains(out, want) {
				t.Errorf("%s: no %q in\n%s", r.Name, want, out)
			}
		}
		if !strings.Contains(out, "etcdctl user grant-role "+r.Name+" "+r.Name) {
			t.Errorf("%s: the user is not granted its role:\n%s", r.Name, out)
		}
	}
}

// TestEnableAuth: on an etcd whose authentication is off, EnableAuth after
// EnsureRoles makes root and turns it on: each part signs in as its user,
// a client without credentials is refused, and a second run changes
// nothing.
func TestEnableAuth(t *testing.T) {
	e, open := testutil.Etcd(t)
	ctx := testutil.Context(t)
	passwords := map[string]string{}
	for _, r := range store.EtcdRoles() {
		passwords[r.Part] = r.Part + "-secret"
	}
	if err := store.EnsureRoles(ctx, open, passwords); err != nil {
		t.Fatal(err)
	}
	if err := store.EnableAuth(ctx, open, ""); err == nil || !strings.Contains(err.Error(), "no root password") {
		t.Fatalf("EnableAuth without a root password: %v, want it refused", err)
	}
	if err := store.EnableAuth(ctx, open, "root-secret"); err != nil {
		t.Fatal(err)
	}
	if _, err := open.Put(ctx, "/mesh/v1/services/demo/a", "x"); !errors.Is(err, rpctypes.ErrUserEmpty) {
		t.Errorf("a write without credentials once authentication is on: %v, want %v", err, rpctypes.ErrUserEmpty)
	}
	if _, err := testutil.SignIn(t, e.Endpoint, "shardpilot-ingester", "ingester-secret").Put(ctx, "/mesh/v1/services/demo/a", "x"); err != nil {
		t.Errorf("the ingester's write: %v", err)
	}
	root := testutil.SignIn(t, e.Endpoint, "root", "root-secret")
	if err := store.EnableAuth(ctx, root, "another"); err != nil {
		t.Errorf("EnableAuth with authentication on: %v, want nothing done", err)
	}
	testutil.SignIn(t, e.Endpoint, "root", "root-secret") // the password is root's still
}
