package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/shardpilot/shardpilot/pkg/model"
	"go.etcd.io/etcd/api/v3/authpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// PusherPrefix is what the pushers alone may read and write: the CA's
// sealed root (ca.SealedRootKey). No other role is granted any of it.
const PusherPrefix = "/shardpilot/pusher/"

// TrustKey holds the roots proxies trust (PEM, public): the pushers, which
// hold the CA, write it; the ingesters read it, to publish it in every
// namespace as Istio's istio-ca-root-cert ConfigMap.
const TrustKey = "/shardpilot/trust/roots"

// Access is what a grant allows.
type Access string

const (
	Read      Access = "read"
	ReadWrite Access = "readwrite"
)

// Grant is one key range of a role: every key under Prefix.
type Grant struct {
	Prefix string `json:"prefix"`
	Access Access `json:"access"`
}

// EtcdRole is one part's etcd user and role (both named Name) and the
// least it needs. With client certificates, etcd takes the certificate's
// common name as the user: issue each part's certificate for its Name.
type EtcdRole struct {
	Name   string  `json:"name"`
	Grants []Grant `json:"grants"`
	// Part is what runs as it.
	Part string `json:"part"`
}

// EtcdRoles are the roles of the parts, in the order the documentation
// lists them:
//   - the ingesters write the mesh (their writes fenced by the elections
//     they campaign in) and announce themselves;
//   - the pushers read the mesh, announce themselves, keep the CA's
//     sealed root under PusherPrefix, which nobody else may read, and
//     publish the roots proxies trust (TrustKey), which the ingesters read;
//   - shardctl reads the mesh and the members' announcements.
func EtcdRoles() []EtcdRole {
	return []EtcdRole{
		{Name: "shardpilot-ingester", Part: "ingester", Grants: []Grant{
			{model.Prefix, ReadWrite},
			{ElectionPrefix, ReadWrite},
			{MemberPrefix + "ingester/", ReadWrite},
			{TrustKey, Read},
		}},
		{Name: "shardpilot-pusher", Part: "pusher", Grants: []Grant{
			{model.Prefix, Read},
			{MemberPrefix + "pusher/", ReadWrite},
			{PusherPrefix, ReadWrite},
			{TrustKey, ReadWrite},
		}},
		{Name: "shardpilot-shardctl", Part: "shardctl", Grants: []Grant{
			{model.Prefix, Read},
			{MemberPrefix, Read},
		}},
	}
}

// Etcdctl returns the etcdctl commands that make r, its user's password
// taken from the environment variable passwordEnv.
func (r EtcdRole) Etcdctl(passwordEnv string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "etcdctl role add %s\n", r.Name)
	for _, g := range r.Grants {
		fmt.Fprintf(&b, "etcdctl role grant-permission %s %s %s --prefix=true\n", r.Name, g.Access, g.Prefix)
	}
	fmt.Fprintf(&b, "etcdctl user add %s --new-user-password=\"$%s\"\n", r.Name, passwordEnv)
	fmt.Fprintf(&b, "etcdctl user grant-role %s %s\n", r.Name, r.Name)
	return b.String()
}

// EnsureRoles makes every role of EtcdRoles as it should be, through
// cli, a client signed in as etcd's root: each role is created, given its
// grants and stripped of any other permission; each user is created (or
// given its password anew) and granted its role alone. A role whose
// password is empty gets a user without one, who signs in with a client
// certificate of its name. It may run again at every upgrade.
func EnsureRoles(ctx context.Context, cli *clientv3.Client, passwords map[string]string) error {
	for _, r := range EtcdRoles() {
		if err := ensureRole(ctx, cli, r); err != nil {
			return fmt.Errorf("store: etcd role %s: %w", r.Name, err)
		}
		if err := ensureUser(ctx, cli, r.Name, passwords[r.Part]); err != nil {
			return fmt.Errorf("store: etcd user %s: %w", r.Name, err)
		}
	}
	return nil
}

// EnableAuth turns etcd's authentication on, when it is off, with a root
// user of rootPassword (made, or given that password): a new etcd's first
// setup, after EnsureRoles made each part's user. An etcd whose
// authentication is on is left as it is.
func EnableAuth(ctx context.Context, cli *clientv3.Client, rootPassword string) error {
	st, err := cli.AuthStatus(ctx)
	if err != nil {
		return fmt.Errorf("store: etcd authentication status: %w", err)
	}
	if st.Enabled {
		return nil
	}
	if rootPassword == "" {
		return errors.New("store: etcd authentication is off, and no root password was given to turn it on")
	}
	if _, err := cli.RoleAdd(ctx, "root"); err != nil && !errors.Is(err, rpctypes.ErrRoleAlreadyExist) {
		return fmt.Errorf("store: etcd role root: %w", err)
	}
	if _, err := cli.UserAdd(ctx, "root", rootPassword); err != nil {
		if !errors.Is(err, rpctypes.ErrUserAlreadyExist) {
			return fmt.Errorf("store: etcd user root: %w", err)
		}
		if _, err := cli.UserChangePassword(ctx, "root", rootPassword); err != nil {
			return fmt.Errorf("store: etcd user root: %w", err)
		}
	}
	if _, err := cli.UserGrantRole(ctx, "root", "root"); err != nil {
		return fmt.Errorf("store: etcd user root: %w", err)
	}
	if _, err := cli.AuthEnable(ctx); err != nil {
		return fmt.Errorf("store: turn etcd authentication on: %w", err)
	}
	return nil
}

func ensureRole(ctx context.Context, cli *clientv3.Client, r EtcdRole) error {
	if _, err := cli.RoleAdd(ctx, r.Name); err != nil && !errors.Is(err, rpctypes.ErrRoleAlreadyExist) {
		return err
	}
	have, err := cli.RoleGet(ctx, r.Name)
	if err != nil {
		return err
	}
	for _, p := range have.Perm {
		want := slices.ContainsFunc(r.Grants, func(g Grant) bool {
			return string(p.Key) == g.Prefix && string(p.RangeEnd) == clientv3.GetPrefixRangeEnd(g.Prefix) && p.PermType == permType(g.Access)
		})
		if !want {
			if _, err := cli.RoleRevokePermission(ctx, r.Name, string(p.Key), string(p.RangeEnd)); err != nil {
				return fmt.Errorf("revoke %s: %w", p.Key, err)
			}
		}
	}
	for _, g := range r.Grants {
		if _, err := cli.RoleGrantPermission(ctx, r.Name, g.Prefix, clientv3.GetPrefixRangeEnd(g.Prefix), clientv3.PermissionType(permType(g.Access))); err != nil {
			return fmt.Errorf("grant %s %s: %w", g.Access, g.Prefix, err)
		}
	}
	return nil
}

func ensureUser(ctx context.Context, cli *clientv3.Client, name, password string) error {
	opts := &clientv3.UserAddOptions{NoPassword: password == ""}
	if _, err := cli.UserAddWithOptions(ctx, name, password, opts); err != nil {
		if !errors.Is(err, rpctypes.ErrUserAlreadyExist) {
			return err
		}
		if password != "" {
			if _, err := cli.UserChangePassword(ctx, name, password); err != nil {
				return err
			}
		}
	}
	user, err := cli.UserGet(ctx, name)
	if err != nil {
		return err
	}
	for _, role := range user.Roles {
		if role != name {
			if _, err := cli.UserRevokeRole(ctx, name, role); err != nil {
				return fmt.Errorf("revoke role %s: %w", role, err)
			}
		}
	}
	if !slices.Contains(user.Roles, name) {
		if _, err := cli.UserGrantRole(ctx, name, name); err != nil {
			return err
		}
	}
	return nil
}

func permType(a Access) authpb.Permission_Type {
	if a == ReadWrite {
		return authpb.READWRITE
	}
	return authpb.READ
}
