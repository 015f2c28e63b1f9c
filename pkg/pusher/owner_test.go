package pusher

import (
	"context"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/model"
	"github.com/shardpilot/shardpilot/pkg/xds/cache"
)

// chanFeed delivers the events sent on it.
type chanFeed struct{ events chan *meshv1.ChangeEvent }

func (f *chanFeed) LastSeq(context.Context) (uint64, error) { return 0, nil }

func (f *chanFeed) Consume(ctx context.Context, _ uint64, fn func(uint64, *meshv1.ChangeEvent) error) error {
	for seq := uint64(1); ; seq++ {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case ev := <-f.events:
			if err := fn(seq, ev); err != nil {
				return err
			}
		}
	}
}

// gatedSink is a cache that holds the first update of one class's
// clusters until released.
type gatedSink struct {
	*cache.Cache
	class   cache.Class
	release chan struct{}
	gated   atomic.Bool
}

func (s *gatedSink) Update(class cache.Class, typeURL string, res map[string]types.Resource) (int, int, int, error) {
	if class == s.class && typeURL == resource.ClusterType && s.gated.CompareAndSwap(false, true) {
		<-s.release
	}
	return s.Cache.Update(class, typeURL, res)
}

// TestClassFilledDuringAGeneration: a proxy's class seen for the first
// time is filled from the last generation's mesh while a change arrives
// and is generated. However the two interleave, the class ends with the
// change, without a further one. Here the fill is held in the middle (it
// read the mesh before the change) until the change's generation has run
// or waits for it.
func TestClassFilledDuringAGeneration(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		loader := &scriptedLoader{loads: []func() ([]model.Stored, int64, error){
			func() ([]model.Stored, int64, error) { return []model.Stored{stored("a", 80)}, 10, nil },
		}}
		feed := &chanFeed{events: make(chan *meshv1.ChangeEvent)}
		c, err := cache.New(cache.Config{Classes: Classes, Types: ClassTypes, SharedTypes: SharedTypes})
		if err != nil {
			t.Fatal(err)
		}
		sink := &gatedSink{Cache: c, class: "envoy/ns/", release: make(chan struct{})}
		p, stop := run(t, Config{Loader: loader, Feed: feed, Tables: sink}, time.Second)
		defer stop()
		added := make(chan struct{})
		go func() {
			c.AddClass(sink.class, p.FillClass)
			close(added)
		}()
		synctest.Wait() // the fill holds a's clusters
		b := stored("b", 80)
		value, err := model.Encode(b.Object)
		if err != nil {
			t.Fatal(err)
		}
		feed.events <- &meshv1.ChangeEvent{Type: meshv1.ChangeEvent_TYPE_PUT, Key: b.Key.String(), Revision: 11, Value: value}
		time.Sleep(time.Second)
		synctest.Wait() // b's generation has run, or waits for the fill
		close(sink.release)
		<-added
		time.Sleep(time.Second)
		synctest.Wait()
		got := c.Resources(sink.class, resource.ClusterType)
		for _, name := range []string{"outbound|80||a.ns.svc.cluster.local", "outbound|80||b.ns.svc.cluster.local"} {
			if got[name] == nil {
				t.Errorf("the class filled during b's generation serves no %s", name)
			}
		}
	})
}
