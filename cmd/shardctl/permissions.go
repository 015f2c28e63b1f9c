package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/shardpilot/shardpilot/pkg/bus"
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
	if o.output == "json" {
		enc := json.NewEncoder(o.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(perms)
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
