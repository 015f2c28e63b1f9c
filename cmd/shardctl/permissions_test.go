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
	"github.com/shardpilot/shardpilot/pkg/bus"
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
