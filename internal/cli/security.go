package cli

import (
	"context"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/shardpilot/shardpilot/pkg/telemetry"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Weaknesses are the weak settings of what every long-running part shares:
// NATS and etcd as the servers enforce them (asked now: a server
// reconfigured since the start counts), the connections to them, and the
// admin port's guard.
func (c *Common) Weaknesses(ctx context.Context, r *Remote, nc *nats.Conn, etcd *clientv3.Client) []telemetry.Weakness {
	var ws []telemetry.Weakness
	add := func(sev, setting, risk string) {
		ws = append(ws, telemetry.Weakness{Severity: sev, Setting: setting, Risk: risk})
	}
	if nc != nil {
		if !nc.AuthRequired() {
			add(telemetry.High, "NATS server authorization (chart: nats.auth; shardctl bus-permissions)",
				"the NATS server lets in clients without a credential: anyone who reaches it is every role, and may delete or purge the change stream")
		}
		if !nc.TLSRequired() && r.NATS.CAFile == "" && !strings.HasPrefix(r.NATS.URL, "tls://") {
			add(telemetry.Medium, "--nats-ca-file (chart: nats.tls.secretName)",
				"NATS is reached in the clear: its credentials and every change cross the network readable")
		}
	}
	if etcd != nil {
		if st, err := etcd.AuthStatus(ctx); err == nil && !st.Enabled {
			add(telemetry.High, "etcd authentication (chart: etcd.auth.roles; shardctl etcd-roles)",
				"etcd lets in clients without a credential: anyone who reaches it writes the mesh and reads the CA's sealed root")
		}
		if strings.Contains(r.Etcd.Endpoints, "http://") {
			add(telemetry.Medium, "--etcd-endpoints https:// with --etcd-ca-file (chart: etcd.tls.secretName)",
				"etcd is reached in the clear: its credentials and the mesh cross the network readable")
		}
	}
	switch {
	case c.AdminTokenFile == "":
		add(telemetry.Medium, "--admin-token-file with --admin-token-on-loopback (the chart sets both)",
			"/debug/ (config dumps, profiles) answers loopback without a token: in a pod, whoever may port-forward to it")
	case !c.AdminTokenOnLoopback:
		add(telemetry.Medium, "--admin-token-on-loopback (the chart sets it)",
			"/debug/ answers loopback without the token: in a pod, whoever may port-forward to it")
	}
	return ws
}
