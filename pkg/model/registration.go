package model

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"
)

// A Registration is what a pusher tells the ingesters of an agent that
// connected naming a WorkloadGroup (Istio's AUTO_REGISTER_GROUP): the
// workload's address, labels and place, and the identity the pusher
// verified. The ingester part that owns the namespace makes the group's
// WorkloadEntry of it (see kube.Registrar), keeps it while the pusher
// says the agent is connected, and removes it a grace period after.
type Registration struct {
	Op RegistrationOp `json:"op"`
	// Group is the WorkloadGroup's name, in Namespace (the proxy's).
	Group     string `json:"group"`
	Namespace string `json:"namespace"`
	// Identity is the SPIFFE ID the pusher verified the proxy's stream
	// with (its client certificate or service account token).
	Identity string `json:"identity"`
	// Proxy is the node's id; Address the workload's first IP
	// (INSTANCE_IPS, else the id's); Network, Locality ("region/zone/
	// subzone") and Labels come from its node metadata.
	Proxy    string            `json:"proxy"`
	Address  string            `json:"address"`
	Network  string            `json:"network,omitempty"`
	Locality string            `json:"locality,omitempty"`
	Labels   map[string]string `json:"labels,omitempty"`
	// ConnectedAt is when the stream began: a later connection of the
	// same workload wins over an earlier one's messages.
	ConnectedAt time.Time `json:"connectedAt"`
	// Pusher names the pusher holding the stream (the entry's
	// istio.io/workloadController).
	Pusher string `json:"pusher"`
	// Heartbeat is how often the pusher repeats Alive while the stream
	// lasts: an entry not heard of for three of them is taken for
	// disconnected (its pusher is gone).
	Heartbeat time.Duration `json:"heartbeat"`
}

// MaxRegistrationHeartbeat is the longest heartbeat a registration may
// name: an entry is taken for disconnected after three, so a pusher (or
// whoever holds its NATS credential) naming years would keep an entry
// alive long after its messages stop.
const MaxRegistrationHeartbeat = 5 * time.Minute

// MaxRegistrationSkew is how far ahead of the ingester's clock a
// registration's connectedAt may be: a later connection wins, so one
// dated in the future would win over every real one to come.
const MaxRegistrationSkew = time.Minute

// RegistrationOp says what happened to a registered workload's stream.
type RegistrationOp string

const (
	// RegistrationConnect is a new stream; the pusher waits for the answer
	// and refuses the stream when the registration is refused, as istiod.
	RegistrationConnect RegistrationOp = "connect"
	// RegistrationAlive repeats Connect while the stream lasts.
	RegistrationAlive RegistrationOp = "alive"
	// RegistrationDisconnect is the stream's end.
	RegistrationDisconnect RegistrationOp = "disconnect"
)

// ErrNotMine says a registration is for a namespace another ingester part
// owns: it is left for that part to answer.
var ErrNotMine = errors.New("model: registration of a namespace owned elsewhere")

// Validate checks a registration as it arrives off the bus.
func (r Registration) Validate() error {
	switch r.Op {
	case RegistrationConnect, RegistrationAlive, RegistrationDisconnect:
	default:
		return fmt.Errorf("registration: op %q: want connect, alive or disconnect", r.Op)
	}
	if !ValidHostname(r.Namespace) || strings.Contains(r.Namespace, ".") {
		return fmt.Errorf("registration: namespace %q is not a DNS label", r.Namespace)
	}
	if !ValidHostname(r.Group) || strings.Contains(r.Group, ".") {
		return fmt.Errorf("registration: group %q is not a DNS label", r.Group)
	}
	if _, err := netip.ParseAddr(r.Address); err != nil {
		return fmt.Errorf("registration: address %q: %w", r.Address, err)
	}
	if r.Identity == "" || r.Proxy == "" || r.Pusher == "" {
		return errors.New("registration: identity, proxy and pusher are required")
	}
	if r.ConnectedAt.IsZero() || r.Heartbeat <= 0 {
		return errors.New("registration: connectedAt and a positive heartbeat are required")
	}
	if r.Heartbeat > MaxRegistrationHeartbeat {
		return fmt.Errorf("registration: heartbeat %v: at most %v", r.Heartbeat, MaxRegistrationHeartbeat)
	}
	return nil
}

// EntryName is the name of the WorkloadEntry a registration makes, as
// istiod names it: the group, the address with its colons as dashes, and
// the network when there is one; the end of it when that passes
// Kubernetes' 253 characters.
func (r Registration) EntryName() string {
	parts := []string{r.Group, strings.ReplaceAll(r.Address, ":", "-")}
	if r.Network != "" {
		parts = append(parts, r.Network)
	}
	name := strings.Join(parts, "-")
	if len(name) > 253 {
		name = name[len(name)-253:]
	}
	return name
}
