package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// ErrNotLeader is returned by a fenced Store's writes once the writer is no
// longer the leader that fenced it.
var ErrNotLeader = errors.New("store: no longer the leader")

// ElectionPrefix is where leader elections live, outside /mesh/v1/.
const ElectionPrefix = "/shardpilot/leader/"

// Elector runs a function only while this process leads an election, so
// that one replica of a part (a source, the relay) runs at a time.
type Elector struct {
	Client *clientv3.Client
	// Name names the election, for example "source/yaml".
	Name string
	// ID identifies this candidate, for example the host name.
	ID string
	// TTL is how long a leader that stopped renewing keeps leading.
	// Default 10s; a crashed leader is replaced within it.
	TTL time.Duration
	Log *slog.Logger
}

// Run campaigns until ctx is done; while it leads, it runs lead with a
// context that is cancelled when leadership is lost, and a Store whose
// writes fail with ErrNotLeader once it is. After lead returns it resigns
// and campaigns again.
func (e *Elector) Run(ctx context.Context, lead func(ctx context.Context, fenced *Store) error) error {
	if e.Client == nil || e.Name == "" || e.ID == "" {
		return errors.New("store: elector needs a client, a name and an id")
	}
	ttl := e.TTL
	if ttl == 0 {
		ttl = 10 * time.Second
	}
	log := e.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("election", e.Name, "id", e.ID)
	for {
		err := e.term(ctx, ttl, log, lead)
		if ctx.Err() != nil {
			return nil
		}
		log.Warn("leadership ended; campaigning again", "err", err)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(time.Second):
		}
	}
}

// term campaigns once and, once elected, leads until lead returns or the
// session expires.
func (e *Elector) term(ctx context.Context, ttl time.Duration, log *slog.Logger, lead func(context.Context, *Store) error) error {
	sess, err := concurrency.NewSession(e.Client, concurrency.WithTTL(int(max(ttl/time.Second, 1))), concurrency.WithContext(ctx))
	if err != nil {
		return fmt.Errorf("store: election %s: session: %w", e.Name, err)
	}
	defer sess.Close()
	el := concurrency.NewElection(sess, ElectionPrefix+e.Name)
	// A campaign cancelled while it waits resigns with the client's own
	// context, which blocks for as long as etcd does not answer: on
	// shutdown with etcd unreachable, the process must not wait for it
	// (it ends when the client is closed).
	campaigned := make(chan error, 1)
	go func() { campaigned <- el.Campaign(ctx, e.ID) }()
	select {
	case err := <-campaigned:
		if err != nil {
			return fmt.Errorf("store: election %s: campaign: %w", e.Name, err)
		}
	case <-ctx.Done():
		return ctx.Err()
	}
	log.Info("elected leader")
	lctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		select {
		case <-sess.Done():
			log.Warn("leader session expired")
			cancel()
		case <-lctx.Done():
		}
	})
	err = lead(lctx, &Store{cli: e.Client, fence: &fence{key: el.Key(), rev: el.Rev()}})
	cancel()
	wg.Wait()
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer rcancel()
	if rerr := el.Resign(rctx); rerr != nil {
		log.Warn("resign failed; leadership lapses with the session", "err", rerr)
	}
	return err
}

// fence guards writes: they succeed only while the leader key still has
// the revision it was created with.
type fence struct {
	key string
	rev int64
}

func (f *fence) compare() clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(f.key), "=", f.rev)
}
