package store

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/model"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// ErrConflict is returned when a guarded write keeps losing to concurrent writers.
var ErrConflict = errors.New("store: conflicting concurrent writes")

// maxAttempts bounds the compare-and-swap retries of one write.
const maxAttempts = 5

// Store reads and writes mesh objects in etcd.
type Store struct {
	cli *clientv3.Client
	// fence, when set, makes every write conditional on a leadership.
	fence *fence
}

// New returns a Store over an etcd client. The caller owns the client.
func New(cli *clientv3.Client) *Store { return &Store{cli: cli} }

// Put writes o under k unless the stored object already has the same
// content. It reports whether it wrote and the key's mod revision after
// the call.
func (s *Store) Put(ctx context.Context, k model.Key, o model.Object) (written bool, rev int64, err error) {
	return s.PutAt(ctx, k, o, unknownRevision)
}

// unknownRevision is a mod revision no key has: a write that expects it
// reads the key's current one in the same round trip.
const unknownRevision = -1

// PutAt is Put for a caller that knows the key's mod revision (0: the key
// is absent): when the store agrees, the write is one round trip. When it
// does not, the current value, read in the same round trip, decides.
func (s *Store) PutAt(ctx context.Context, k model.Key, o model.Object, modRev int64) (written bool, rev int64, err error) {
	if model.KindOf(o) != k.Kind {
		return false, 0, fmt.Errorf("store: put %s: object is a %T", k, o)
	}
	value, err := model.Encode(o)
	if err != nil {
		return false, 0, fmt.Errorf("store: put %s: %w", k, err)
	}
	key := k.String()
	for range maxAttempts {
		resp, err := s.cli.Txn(ctx).
			If(s.guard(clientv3.Compare(clientv3.ModRevision(key), "=", modRev))...).
			Then(clientv3.OpPut(key, string(value))).
			Else(clientv3.OpGet(key)).
			Commit()
		if err != nil {
			return false, 0, fmt.Errorf("store: put %s: %w", key, err)
		}
		if resp.Succeeded {
			return true, resp.Header.Revision, nil
		}
		var cur int64
		if kvs := resp.Responses[0].GetResponseRange().GetKvs(); len(kvs) == 1 {
			cur = kvs[0].ModRevision
			old, err := model.Decode(k, kvs[0].Value)
			if err == nil && model.SameContent(old, o) {
				return false, cur, nil
			}
		}
		if cur == modRev {
			// The key is as expected: the fence refused the write.
			if err := s.checkFence(ctx); err != nil {
				return false, 0, fmt.Errorf("store: put %s: %w", key, err)
			}
		}
		modRev = cur
	}
	return false, 0, fmt.Errorf("store: put %s: %w", key, ErrConflict)
}

// WriteAll makes writes in one transaction: each object under its key (a
// nil Object deletes the key), on the condition that every key's mod
// revision is the one given (0: absent) and the fence, if any, holds. ok
// false says some key was not as given, or the fence refused: nothing was
// written, and the caller writes them one by one (PutAt, DeleteAt), which
// tells which. rev is the transaction's revision, every key's mod revision
// after it; deleted says of each delete whether its key existed. The
// caller keeps a transaction within the store's bounds (etcd's
// --max-txn-ops, 128 by default, and --max-request-bytes).
func (s *Store) WriteAll(ctx context.Context, writes []model.Stored) (ok bool, rev int64, deleted []bool, err error) {
	cmps := make([]clientv3.Cmp, 0, len(writes)+1)
	ops := make([]clientv3.Op, 0, len(writes))
	for _, w := range writes {
		key := w.Key.String()
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(key), "=", w.ModRevision))
		if w.Object == nil {
			ops = append(ops, clientv3.OpDelete(key))
			continue
		}
		if model.KindOf(w.Object) != w.Key.Kind {
			return false, 0, nil, fmt.Errorf("store: put %s: object is a %T", w.Key, w.Object)
		}
		value, err := model.Encode(w.Object)
		if err != nil {
			return false, 0, nil, fmt.Errorf("store: put %s: %w", w.Key, err)
		}
		ops = append(ops, clientv3.OpPut(key, string(value)))
	}
	if s.fence != nil {
		cmps = append(cmps, s.fence.compare())
	}
	resp, err := s.cli.Txn(ctx).If(cmps...).Then(ops...).Commit()
	if err != nil {
		return false, 0, nil, fmt.Errorf("store: write %d keys: %w", len(writes), err)
	}
	if !resp.Succeeded {
		return false, 0, nil, nil
	}
	deleted = make([]bool, len(writes))
	for i, w := range writes {
		deleted[i] = w.Object == nil && resp.Responses[i].GetResponseDeleteRange().GetDeleted() > 0
	}
	return true, resp.Header.Revision, deleted, nil
}

// Delete removes k if it exists. It reports whether it deleted and the
// store revision of the deletion.
func (s *Store) Delete(ctx context.Context, k model.Key) (deleted bool, rev int64, err error) {
	return s.DeleteAt(ctx, k, unknownRevision)
}

// DeleteAt is Delete for a caller that knows the key's mod revision: when
// the store agrees, the deletion is one round trip.
func (s *Store) DeleteAt(ctx context.Context, k model.Key, modRev int64) (deleted bool, rev int64, err error) {
	key := k.String()
	for range maxAttempts {
		resp, err := s.cli.Txn(ctx).
			If(s.guard(clientv3.Compare(clientv3.ModRevision(key), "=", modRev))...).
			Then(clientv3.OpDelete(key)).
			Else(clientv3.OpGet(key, clientv3.WithKeysOnly())).
			Commit()
		if err != nil {
			return false, 0, fmt.Errorf("store: delete %s: %w", key, err)
		}
		if resp.Succeeded {
			// A key expected absent (0) compares equal and deletes nothing.
			return resp.Responses[0].GetResponseDeleteRange().GetDeleted() > 0, resp.Header.Revision, nil
		}
		var cur int64
		if kvs := resp.Responses[0].GetResponseRange().GetKvs(); len(kvs) == 1 {
			cur = kvs[0].ModRevision
		}
		if cur == 0 {
			return false, resp.Header.Revision, nil
		}
		if cur == modRev {
			if err := s.checkFence(ctx); err != nil {
				return false, 0, fmt.Errorf("store: delete %s: %w", key, err)
			}
		}
		modRev = cur
	}
	return false, 0, fmt.Errorf("store: delete %s: %w", key, ErrConflict)
}

// guard adds the leadership fence, if any, to a write's conditions.
func (s *Store) guard(cmp clientv3.Cmp) []clientv3.Cmp {
	if s.fence == nil {
		return []clientv3.Cmp{cmp}
	}
	return []clientv3.Cmp{cmp, s.fence.compare()}
}

// checkFence tells a failed guarded write lost to a new leader from one
// that lost to a concurrent write.
func (s *Store) checkFence(ctx context.Context) error {
	if s.fence == nil {
		return nil
	}
	resp, err := s.cli.Get(ctx, s.fence.key)
	if err != nil {
		return err
	}
	if len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != s.fence.rev {
		return ErrNotLeader
	}
	return nil
}

// List returns every object under /mesh/v1/ at one revision, and that revision.
// Keys that do not parse or values that do not decode are returned in errs
// and skipped, so one bad value cannot hide the rest of the mesh.
func (s *Store) List(ctx context.Context) (items []model.Stored, rev int64, errs []error, err error) {
	return s.ListPrefixes(ctx, 0, model.Prefix)
}

// ListPrefixes is List for the keys under some prefixes, every one read at
// revision rev (0: the store's current revision, that of the first). It
// returns the revision they were read at.
func (s *Store) ListPrefixes(ctx context.Context, rev int64, prefixes ...string) (items []model.Stored, at int64, errs []error, err error) {
	for _, prefix := range prefixes {
		opts := []clientv3.OpOption{clientv3.WithPrefix()}
		if rev != 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		resp, err := s.cli.Get(ctx, prefix, opts...)
		if err != nil {
			return nil, 0, nil, fmt.Errorf("store: list %s: %w", prefix, err)
		}
		rev = cmp.Or(rev, resp.Header.Revision)
		for _, kv := range resp.Kvs {
			k, err := model.ParseKey(string(kv.Key))
			if err != nil {
				errs = append(errs, err)
				continue
			}
			o, err := model.Decode(k, kv.Value)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			items = append(items, model.Stored{Key: k, Object: o, ModRevision: kv.ModRevision})
		}
	}
	if rev == 0 {
		// No prefix: the store's revision all the same.
		if rev, err = s.Revision(ctx); err != nil {
			return nil, 0, nil, err
		}
	}
	return items, rev, errs, nil
}

// Revision returns the store's current revision.
func (s *Store) Revision(ctx context.Context) (int64, error) {
	resp, err := s.cli.Get(ctx, model.Prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return 0, fmt.Errorf("store: revision: %w", err)
	}
	return resp.Header.Revision, nil
}

// Ahead looks for a change under the mesh prefix after revision after
// whose key keep accepts (nil: any), up to the store's current revision:
// it returns the first such change's revision (0: none) and the current
// revision. It reads the changes since after from the store's history (a
// watch that starts there), so it costs what changed since, not the
// mesh's size; it waits at most wait for them. model.ErrCompacted: the
// history no longer reaches back to after.
func (s *Store) Ahead(ctx context.Context, after int64, keep func(key string) bool, wait time.Duration) (first, current int64, err error) {
	current, err = s.Revision(ctx)
	if err != nil || current <= after {
		return 0, current, err
	}
	wctx, cancel := context.WithTimeout(clientv3.WithRequireLeader(ctx), wait)
	defer cancel()
	for resp := range s.cli.Watch(wctx, model.Prefix, clientv3.WithPrefix(), clientv3.WithRev(after+1)) {
		if resp.CompactRevision != 0 || errors.Is(resp.Err(), rpctypes.ErrCompacted) {
			return 0, current, fmt.Errorf("store: changes after %d, compacted at %d: %w", after, resp.CompactRevision, model.ErrCompacted)
		}
		if err := resp.Err(); err != nil {
			return 0, current, fmt.Errorf("store: changes after %d: %w", after, err)
		}
		for _, ev := range resp.Events {
			if ev.Kv.ModRevision > current {
				return 0, current, nil
			}
			if keep == nil || keep(string(ev.Kv.Key)) {
				return ev.Kv.ModRevision, current, nil
			}
			if ev.Kv.ModRevision == current {
				return 0, current, nil
			}
		}
	}
	if err := ctx.Err(); err != nil {
		return 0, current, err
	}
	return 0, current, nil // no mesh change came within wait
}

// Value returns a mesh key's current value and mod revision (nil and 0
// when it does not exist): what an event carried by reference names.
func (s *Store) Value(ctx context.Context, key string) ([]byte, int64, error) {
	resp, err := s.cli.Get(ctx, key)
	if err != nil {
		return nil, 0, fmt.Errorf("store: get %s: %w", key, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, 0, nil
	}
	return resp.Kvs[0].Value, resp.Kvs[0].ModRevision, nil
}

// alarms returns the store's active alarms ("NOSPACE on member 8e9e…"),
// "" when none or when they cannot be read (a user without the right).
func (s *Store) alarms(ctx context.Context) string {
	resp, err := s.cli.AlarmList(ctx)
	if err != nil {
		return ""
	}
	var out []string
	for _, a := range resp.Alarms {
		out = append(out, fmt.Sprintf("%s on member %x", a.Alarm, a.MemberID))
	}
	return strings.Join(out, ", ")
}

// Confirm reports whether the store committed ev: a change of its key at
// its revision, with its content (a RESYNC: a revision the store has
// reached). It returns a reason when it did not, and model.ErrCompacted
// when the revision is no longer there to compare with.
func (s *Store) Confirm(ctx context.Context, ev *meshv1.ChangeEvent) (reason string, err error) {
	rev, err := s.Revision(ctx)
	if err != nil {
		return "", err
	}
	if ev.Revision <= 0 || ev.Revision > rev {
		return fmt.Sprintf("revision %d is not one the store has reached (%d)", ev.Revision, rev), nil
	}
	if ev.Type == meshv1.ChangeEvent_TYPE_RESYNC {
		return "", nil
	}
	if _, err := model.ParseKey(ev.Key); err != nil {
		return fmt.Sprintf("key %q: %v", ev.Key, err), nil
	}
	at := func(rev int64) (*mvccpb.KeyValue, error) {
		resp, err := s.cli.Get(ctx, ev.Key, clientv3.WithRev(rev))
		if errors.Is(err, rpctypes.ErrCompacted) {
			return nil, fmt.Errorf("store: confirm %s at %d: %w", ev.Key, rev, model.ErrCompacted)
		}
		if err != nil {
			return nil, fmt.Errorf("store: confirm %s at %d: %w", ev.Key, rev, err)
		}
		if len(resp.Kvs) == 0 {
			return nil, nil
		}
		return resp.Kvs[0], nil
	}
	kv, err := at(ev.Revision)
	if err != nil {
		return "", err
	}
	switch ev.Type {
	case meshv1.ChangeEvent_TYPE_PUT:
		if kv == nil || kv.ModRevision != ev.Revision {
			return fmt.Sprintf("%s was not written at revision %d", ev.Key, ev.Revision), nil
		}
		if !ev.ByReference && !bytes.Equal(kv.Value, ev.Value) {
			return fmt.Sprintf("%s at revision %d holds other content", ev.Key, ev.Revision), nil
		}
		return "", nil
	case meshv1.ChangeEvent_TYPE_DELETE:
		before, err := at(ev.Revision - 1)
		if err != nil {
			return "", err
		}
		if kv != nil || before == nil {
			return fmt.Sprintf("%s was not deleted at revision %d", ev.Key, ev.Revision), nil
		}
		return "", nil
	}
	return fmt.Sprintf("event type %v", ev.Type), nil
}

// Watch calls fn with the changes under /mesh/v1/ of every revision after
// fromRev, in revision order, one call per revision. It returns when ctx is
// done (with ctx.Err()), when fn fails (with its error), or with
// model.ErrCompacted when fromRev is no longer available.
func (s *Store) Watch(ctx context.Context, fromRev int64, fn func([]*meshv1.ChangeEvent) error) error {
	ctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := s.cli.Watch(ctx, model.Prefix, clientv3.WithPrefix(), clientv3.WithRev(fromRev+1))
	for resp := range wch {
		if resp.CompactRevision != 0 || errors.Is(resp.Err(), rpctypes.ErrCompacted) {
			return fmt.Errorf("store: watch from %d, compacted at %d: %w", fromRev+1, resp.CompactRevision, model.ErrCompacted)
		}
		if err := resp.Err(); err != nil {
			return fmt.Errorf("store: watch: %w", err)
		}
		// One response may carry several revisions; split it so that fn
		// sees exactly one revision per call.
		var batch []*meshv1.ChangeEvent
		flush := func() error {
			if len(batch) == 0 {
				return nil
			}
			for i, ev := range batch {
				ev.Index, ev.Count = int32(i), int32(len(batch))
			}
			err := fn(batch)
			batch = nil
			return err
		}
		for _, ev := range resp.Events {
			rev := ev.Kv.ModRevision
			if len(batch) > 0 && batch[0].Revision != rev {
				if err := flush(); err != nil {
					return err
				}
			}
			ce := &meshv1.ChangeEvent{Key: string(ev.Kv.Key), Revision: rev}
			if ev.Type == mvccpb.DELETE {
				ce.Type = meshv1.ChangeEvent_TYPE_DELETE
			} else {
				ce.Type = meshv1.ChangeEvent_TYPE_PUT
				ce.Value = ev.Kv.Value
			}
			batch = append(batch, ce)
		}
		if err := flush(); err != nil {
			return err
		}
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return errors.New("store: watch channel closed")
}
