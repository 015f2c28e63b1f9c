package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/shardpilot/shardpilot/pkg/bus"
	"github.com/shardpilot/shardpilot/pkg/store"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// roleUsers names the NATS user each role's credentials sign in as, in
// what bus-permissions prints.
var roleUsers = map[bus.Role]string{bus.RoleRelay: "shardpilot-ingester", bus.RoleConsumer: "shardpilot-pusher"}

// busPermissions prints the NATS permissions each role needs on a stream:
// as nats-server users and as nsc commands, or as JSON.
func busPermissions(_ context.Context, o *options, args []string) error {
	if len(args) > 1 {
		return errors.New("want at most one argument, the stream's name")
	}
	stream := "SHARDPILOT_MESH"
	if len(args) == 1 {
		stream = args[0]
	}
	perms := map[bus.Role]bus.Permissions{}
	for _, r := range bus.Roles {
		p, err := bus.RolePermissions(r, stream)
		if err != nil {
			return err
		}
		perms[r] = p
	}
	if o.output != "table" {
		return writeOutput(o, perms)
	}
	return writePermissions(o.stdout, stream, perms)
}

// writePermissions writes the server configuration and the nsc commands.
func writePermissions(w io.Writer, stream string, perms map[bus.Role]bus.Permissions) error {
	var b strings.Builder
	fmt.Fprintf(&b, "# nats-server.conf: one user per role on stream %s (passwords from the environment)\n", stream)
	b.WriteString("authorization {\n  users = [\n")
	for _, r := range bus.Roles {
		env := strings.ToUpper(strings.ReplaceAll(roleUsers[r], "-", "_")) + "_PASSWORD"
		for _, line := range strings.Split(perms[r].ServerConfig(roleUsers[r], env), "\n") {
			b.WriteString("    " + line + "\n")
		}
	}
	b.WriteString("  ]\n}\n\n# operator mode (JWT): the same users with nsc\n")
	for _, r := range bus.Roles {
		b.WriteString(perms[r].NSC(roleUsers[r]) + "\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// etcdRoles prints the etcd role and user of each part (as etcdctl
// commands, or JSON), or, given "apply <password-dir>", makes them in the
// etcd of the flags, signed in as its root: the directory holds a file per
// part (ingester, pusher, shardctl) with its user's password, empty for a
// user that signs in with a client certificate of its name.
func etcdRoles(ctx context.Context, o *options, args []string) error {
	switch {
	case len(args) == 0:
		if o.output != "table" {
			return writeOutput(o, store.EtcdRoles())
		}
		var b strings.Builder
		b.WriteString("# etcd, signed in as root (etcd authentication on): one role and user per part (passwords from the environment)\n")
		for _, r := range store.EtcdRoles() {
			fmt.Fprintf(&b, "# %s\n%s", r.Part, r.Etcdctl(strings.ToUpper(strings.ReplaceAll(r.Name, "-", "_"))+"_PASSWORD"))
		}
		_, err := io.WriteString(o.stdout, b.String())
		return err
	case len(args) == 2 && args[0] == "apply":
		passwords := map[string]string{}
		for _, r := range store.EtcdRoles() {
			b, err := os.ReadFile(filepath.Join(args[1], r.Part))
			if err != nil {
				return fmt.Errorf("the %s's password: %w", r.Part, err)
			}
			passwords[r.Part] = strings.TrimSpace(string(b))
		}
		cfg, err := o.etcd.Config(o.timeout)
		if err != nil {
			return err
		}
		cfg.Context = ctx
		cli, err := clientv3.New(cfg)
		if err != nil {
			return fmt.Errorf("etcd %s: %w", o.etcd.Endpoints, err)
		}
		defer cli.Close()
		if err := store.EnsureRoles(ctx, cli, passwords); err != nil {
			return fmt.Errorf("etcd %s: %w", o.etcd.Endpoints, err)
		}
		for _, r := range store.EtcdRoles() {
			fmt.Fprintf(o.stdout, "%s: role and user %s\n", r.Part, r.Name)
		}
		// An etcd whose authentication is off (a new one) is given its
		// root and has it turned on, when the directory holds root's
		// password: the roles bind nobody until then.
		root, err := os.ReadFile(filepath.Join(args[1], "root"))
		if errors.Is(err, os.ErrNotExist) {
			if st, err := cli.AuthStatus(ctx); err == nil && !st.Enabled {
				fmt.Fprintf(o.stderr, "etcd %s: authentication is off, so the roles bind nobody; turn it on, or give %s the root password to\n", o.etcd.Endpoints, filepath.Join(args[1], "root"))
			}
			return nil
		}
		if err != nil {
			return fmt.Errorf("root's password: %w", err)
		}
		if err := store.EnableAuth(ctx, cli, strings.TrimSpace(string(root))); err != nil {
			return fmt.Errorf("etcd %s: %w", o.etcd.Endpoints, err)
		}
		fmt.Fprintln(o.stdout, "authentication: on")
		return nil
	default:
		return errors.New(`want no argument (print the roles) or "apply <password-dir>"`)
	}
}
