package bus

import (
	"fmt"
	"strings"
)

// Role names what a component does on the bus; each role's NATS
// credentials should allow that and nothing else.
type Role string

const (
	// RoleRelay owns the stream: it makes it (and makes it again when it is
	// gone or altered), reads its last event and publishes the store's
	// changes. The ingester runs it, and takes and answers the workload
	// registrations (registry.v1.<namespace>) with the same credential.
	RoleRelay Role = "relay"
	// RoleConsumer reads the stream through its own consumers, and sends
	// workload registrations: it can neither publish an event nor manage a
	// stream, nor read another pusher's registrations. The pushers hold
	// it.
	RoleConsumer Role = "consumer"
)

// Roles are every role, in the order the documentation lists them.
var Roles = []Role{RoleRelay, RoleConsumer}

// Permissions are the subjects a role may publish to and subscribe to;
// a credential given them is denied every other subject.
type Permissions struct {
	Publish, Subscribe []string
}

// inboxes is where JetStream's answers to a client's requests arrive.
const inboxes = "_INBOX.>"

// RolePermissions returns the least a role needs on stream (default
// SHARDPILOT_MESH). The stream's management API (create, update, delete,
// purge, message delete) is the relay's create and update alone: no role
// may delete or purge, and a consumer may only create, read and delete
// consumers of the stream.
func RolePermissions(role Role, stream string) (Permissions, error) {
	if stream == "" {
		stream = "SHARDPILOT_MESH"
	}
	if strings.ContainsAny(stream, ". *>") {
		return Permissions{}, fmt.Errorf("bus: stream name %q may not contain '.', ' ', '*' or '>'", stream)
	}
	api := "$JS.API."
	switch role {
	case RoleRelay:
		return Permissions{
			Publish: []string{SubjectPrefix + ".>", api + "INFO", api + "STREAM.INFO." + stream,
				api + "STREAM.CREATE." + stream, api + "STREAM.UPDATE." + stream, api + "STREAM.MSG.GET." + stream, inboxes},
			Subscribe: []string{inboxes, RegistryPrefix + ".*"},
		}, nil
	case RoleConsumer:
		return Permissions{
			Publish: []string{api + "INFO", api + "STREAM.INFO." + stream,
				api + "CONSUMER.CREATE." + stream + ".>", api + "CONSUMER.INFO." + stream + ".>",
				api + "CONSUMER.DELETE." + stream + ".>", api + "CONSUMER.MSG.NEXT." + stream + ".>", RegistryPrefix + ".*"},
			Subscribe: []string{inboxes},
		}, nil
	}
	return Permissions{}, fmt.Errorf("bus: unknown role %q (want %s or %s)", role, RoleRelay, RoleConsumer)
}

// ServerConfig renders the permissions as a user entry of a nats-server
// configuration's authorization block, the password taken from the
// environment variable passwordEnv.
func (p Permissions) ServerConfig(user, passwordEnv string) string {
	list := func(subjects []string) string {
		q := make([]string, len(subjects))
		for i, s := range subjects {
			q[i] = fmt.Sprintf("%q", s)
		}
		return "[" + strings.Join(q, ", ") + "]"
	}
	return fmt.Sprintf("{user: %q, password: $%s, permissions: {\n  publish: {allow: %s}\n  subscribe: {allow: %s}\n}}",
		user, passwordEnv, list(p.Publish), list(p.Subscribe))
}

// NSC renders the permissions as the nsc command that adds a user holding
// them, for operator-mode (JWT) deployments.
func (p Permissions) NSC(user string) string {
	// Single quotes: the shell must not expand $JS.
	return fmt.Sprintf("nsc add user %s --allow-pub '%s' --allow-sub '%s'",
		user, strings.Join(p.Publish, ","), strings.Join(p.Subscribe, ","))
}
