package yamldir

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/shardpilot/shardpilot/internal/testutil"
	"github.com/shardpilot/shardpilot/loadtest/meshgen"
	"github.com/shardpilot/shardpilot/pkg/ingest"
	"github.com/shardpilot/shardpilot/pkg/ingest/istio"
	"github.com/shardpilot/shardpilot/pkg/store"
)

// recording is the load test's directory, remembering the last file written.
type recording struct {
	meshgen.Dir
	last string
}

func (r *recording) Put(name string, yaml []byte) error {
	r.last = filepath.Join(string(r.Dir), name+".yaml")
	return r.Dir.Put(name, yaml)
}

// BenchmarkSyncAfterOneChange measures one sync of the load test's mesh
// directory after one endpoint change into a real etcd: reading the file
// the event names, normalizing and writing what changed ("file"), against
// reading and comparing the whole directory ("directory").
func BenchmarkSyncAfterOneChange(b *testing.B) {
	for _, c := range []struct {
		services int
		whole    bool
	}{{200, false}, {200, true}, {1000, false}, {1000, true}} {
		read := "file"
		if c.whole {
			read = "directory"
		}
		b.Run(fmt.Sprintf("services=%d/read=%s", c.services, read), func(b *testing.B) {
			_, cli := testutil.Etcd(b)
			dir := b.TempDir()
			sink := &recording{Dir: meshgen.Dir(dir)}
			mesh, err := meshgen.WriteTo(sink, meshgen.Spec{Services: c.services, Endpoints: 10})
			if err != nil {
				b.Fatal(err)
			}
			syncer, err := ingest.NewSyncer(ingest.Config{Source: "yaml", Store: store.New(cli)})
			if err != nil {
				b.Fatal(err)
			}
			src, err := New(Config{Dir: dir, Syncer: syncer, Normalize: istio.Options{Shard: "yaml"}})
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			if err := src.readAll(ctx, time.Time{}); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for i := range b.N {
				b.StopTimer()
				if _, err := mesh.Apply(meshgen.Endpoint, i, nil); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				if c.whole {
					err = src.readAll(ctx, time.Time{})
				} else {
					err = src.syncFiles(ctx, map[string]time.Time{sink.last: time.Now()})
				}
				if err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
