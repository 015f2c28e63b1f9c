package store

import (
	"context"
	"errors"
	"fmt"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The values kept beside the mesh's objects (the CA's sealed root, the
// roots proxies trust) are read and written here too: every access to
// etcd goes through this package.

// IsPermissionDenied says etcd refused a request to the user signed in
// (its role does not grant the key).
func IsPermissionDenied(err error) bool { return errors.Is(err, rpctypes.ErrPermissionDenied) }

// CreateValue writes value at key unless key exists; created says it did.
func (s *Store) CreateValue(ctx context.Context, key string, value []byte) (created bool, err error) {
	txn, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, string(value))).Commit()
	if err != nil {
		return false, fmt.Errorf("store: create %s: %w", key, err)
	}
	return txn.Succeeded, nil
}

// PutValueAt writes value at key if key was last written at modRev;
// written says it was.
func (s *Store) PutValueAt(ctx context.Context, key string, value []byte, modRev int64) (written bool, err error) {
	txn, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", modRev)).
		Then(clientv3.OpPut(key, string(value))).Commit()
	if err != nil {
		return false, fmt.Errorf("store: write %s: %w", key, err)
	}
	return txn.Succeeded, nil
}

// PutValue writes value at key.
func (s *Store) PutValue(ctx context.Context, key string, value []byte) error {
	if _, err := s.cli.Put(ctx, key, string(value)); err != nil {
		return fmt.Errorf("store: write %s: %w", key, err)
	}
	return nil
}

// DeleteValue deletes key.
func (s *Store) DeleteValue(ctx context.Context, key string) error {
	if _, err := s.cli.Delete(ctx, key); err != nil {
		return fmt.Errorf("store: delete %s: %w", key, err)
	}
	return nil
}

// FollowValue hands fn key's value, then each value written to it, until
// ctx ends (nil) or the watch fails (its error). A deletion is not
// handed: the last value stands.
func (s *Store) FollowValue(ctx context.Context, key string, fn func(value []byte)) error {
	resp, err := s.cli.Get(ctx, key)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("store: read %s: %w", key, err)
	}
	if len(resp.Kvs) > 0 {
		fn(resp.Kvs[0].Value)
	}
	for wr := range s.cli.Watch(clientv3.WithRequireLeader(ctx), key, clientv3.WithRev(resp.Header.Revision+1)) {
		if err := wr.Err(); err != nil && ctx.Err() == nil {
			return fmt.Errorf("store: watch %s: %w", key, err)
		}
		for _, ev := range wr.Events {
			if ev.Type == clientv3.EventTypePut {
				fn(ev.Kv.Value)
			}
		}
	}
	if ctx.Err() != nil {
		return nil
	}
	return fmt.Errorf("store: the watch of %s ended", key)
}
