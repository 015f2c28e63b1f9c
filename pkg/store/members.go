package store

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// MemberPrefix is where running pushers and ingesters announce themselves,
// outside /mesh/v1/, so that the CLI finds every one of them.
const MemberPrefix = "/shardpilot/members/"

// MemberTTL is how long a member that stopped renewing stays listed.
const MemberTTL = 10 * time.Second

// Member is one running process, as it announces itself.
type Member struct {
	// Role is what the process serves: "pusher" or "ingester".
	Role string `json:"role"`
	// Name names the replica (its pod name).
	Name string `json:"name"`
	// Admin is the host:port of its admin port (/debug/, the status page).
	Admin string `json:"admin"`
	// AdminTLS, when set, is the host:port of its admin port over TLS,
	// where alone a bearer token is taken.
	AdminTLS string `json:"admin_tls,omitempty"`
	// ADS is the host:port proxies connect to, for a pusher.
	ADS     string    `json:"ads,omitempty"`
	Started time.Time `json:"started"`
	// Version is the shardpilot the process runs (internal/version).
	Version string `json:"version,omitempty"`
}

// Announce keeps m under MemberPrefix, attached to a lease of ttl that it
// renews (0: MemberTTL), until ctx is done; then it removes it. When etcd is unreachable
// for longer than ttl the lease lapses and m disappears; Announce puts it
// back once etcd answers again. It returns nil once ctx is done.
func Announce(ctx context.Context, cli *clientv3.Client, m Member, ttl time.Duration, log *slog.Logger) error {
	if m.Role == "" || m.Name == "" || m.Admin == "" {
		return errors.New("store: a member needs a role, a name and an admin address")
	}
	value, err := json.Marshal(m)
	if err != nil {
		return err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if ttl == 0 {
		ttl = MemberTTL
	}
	for {
		err := announceOnce(ctx, cli, m.Role, value, ttl)
		if ctx.Err() != nil {
			return nil
		}
		log.Warn("member registration lost; announcing again", "role", m.Role, "name", m.Name, "err", err)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(time.Second):
		}
	}
}

// announceOnce puts the member under a new lease and keeps it until ctx is
// done (nil) or the lease is lost (an error).
func announceOnce(ctx context.Context, cli *clientv3.Client, role string, value []byte, ttl time.Duration) error {
	lease, err := cli.Grant(ctx, int64(max(ttl/time.Second, 1)))
	if err != nil {
		return fmt.Errorf("lease: %w", err)
	}
	defer func() {
		// Revoked on the way out, with a deadline of its own, so that the
		// CLI stops listing a replica that stopped.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		_, _ = cli.Revoke(rctx, lease.ID)
	}()
	renewed, err := cli.KeepAlive(ctx, lease.ID)
	if err != nil {
		return fmt.Errorf("keep the lease alive: %w", err)
	}
	key := fmt.Sprintf("%s%s/%x", MemberPrefix, role, int64(lease.ID))
	if _, err := cli.Put(ctx, key, string(value), clientv3.WithLease(lease.ID)); err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case _, ok := <-renewed:
			if !ok {
				return errors.New("the lease expired")
			}
		}
	}
}

// Members lists the announced members of a role ("" for every role),
// ordered by role and name. A value that cannot be read is an error naming
// its key.
func Members(ctx context.Context, cli *clientv3.Client, role string) ([]Member, error) {
	prefix := MemberPrefix
	if role != "" {
		prefix += role + "/"
	}
	resp, err := cli.Get(ctx, prefix, clientv3.WithPrefix())
	if err != nil {
		return nil, fmt.Errorf("store: list %s: %w", prefix, err)
	}
	out := make([]Member, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		var m Member
		if err := json.Unmarshal(kv.Value, &m); err != nil {
			return nil, fmt.Errorf("store: member %s: %w", kv.Key, err)
		}
		out = append(out, m)
	}
	slices.SortFunc(out, func(a, b Member) int {
		return cmp.Or(cmp.Compare(a.Role, b.Role), cmp.Compare(a.Name, b.Name), cmp.Compare(a.Admin, b.Admin))
	})
	return out, nil
}
