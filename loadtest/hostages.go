package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/shardpilot/shardpilot/loadtest/meshgen"
	"github.com/shardpilot/shardpilot/loadtest/report"
	"github.com/shardpilot/shardpilot/loadtest/track"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// hostages connects, to each address, a proxy that reads its responses
// and never answers them, and readers proxies that never read theirs (each
// on a connection of its own, so that only its own flow-control window
// fills): the bad proxies one pusher must not let hold the others'
// changes back. They stay until release is called.
func hostages(ctx context.Context, addrs []string, readers int) (release func(), err error) {
	ctx, cancel := context.WithCancel(ctx)
	var conns []*grpc.ClientConn
	var wg sync.WaitGroup
	release = func() {
		cancel()
		for _, c := range conns {
			c.Close()
		}
		wg.Wait()
	}
	open := func(addr, name string, read bool) error {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return err
		}
		conns = append(conns, conn)
		stream, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
		if err != nil {
			return err
		}
		node := &core.Node{Id: "sidecar~10.250.0.1~" + name + ".ns-0~ns-0.svc.cluster.local"}
		for _, typ := range []string{resource.ClusterType, resource.ListenerType} {
			if err := stream.Send(&discovery.DiscoveryRequest{Node: node, TypeUrl: typ}); err != nil {
				return err
			}
		}
		if read {
			wg.Go(func() {
				for {
					if _, err := stream.Recv(); err != nil {
						return
					}
				}
			})
		}
		return nil
	}
	for i, addr := range addrs {
		if err := open(addr, fmt.Sprintf("mute-%d", i), true); err != nil {
			release()
			return nil, err
		}
		for j := range readers / len(addrs) {
			if err := open(addr, fmt.Sprintf("unread-%d-%d", i, j), false); err != nil {
				release()
				return nil, err
			}
		}
	}
	return release, nil
}

// convergedBetween returns the p99 and the longest convergence of the
// changes made between from and to that reached every proxy, and how many
// there were.
func convergedBetween(t *track.Tracker, from, to time.Time) (p99, longest time.Duration, n int) {
	var all []time.Duration
	for _, r := range t.Results() {
		if r.Done && !r.Made.Before(from) && r.Made.Before(to) {
			all = append(all, r.Converged)
		}
	}
	if len(all) == 0 {
		return 0, 0, 0
	}
	slices.Sort(all)
	return all[min(len(all)-1, len(all)*99/100)], all[len(all)-1], len(all)
}

// natsWiped kills NATS, wipes its data and starts it again on its port,
// with no change made after: the relay must make the change stream again
// by itself and every pusher follow it again, ready throughout (it has a
// config to serve). It returns the new NATS process.
func natsWiped(ctx context.Context, sc Scenario, work, natsURL string, nats *proc, servers []*proc) (*proc, time.Duration, error) {
	port := natsURL[strings.LastIndex(natsURL, ":")+1:]
	nats.kill()
	if err := os.RemoveAll(filepath.Join(work, "nats-store")); err != nil {
		return nil, 0, err
	}
	restarted := time.Now()
	p, _, _, err := startStore(ctx, sc.out, "faults-nats-wiped", work, "--only", "nats", "--nats-port", port)
	if err != nil {
		return nil, 0, err
	}
	for deadline := time.Now().Add(time.Minute); ctx.Err() == nil; time.Sleep(200 * time.Millisecond) {
		following := true
		for _, s := range servers {
			if !s.ready() {
				return p, 0, fmt.Errorf("%s went unready after NATS lost its data: it has a config to serve", s.name)
			}
			following = following && !s.stale()
		}
		if following {
			return p, time.Since(restarted), nil
		}
		if time.Now().After(deadline) {
			return p, 0, fmt.Errorf("the pushers did not follow the store again within a minute of NATS losing its data, with no change made")
		}
	}
	return p, 0, ctx.Err()
}

// wipedNATS runs natsWiped and reports it as a fault: how long until the
// pushers followed the store again (no change made), then how long one
// change made after took to reach every proxy.
func wipedNATS(ctx context.Context, sc Scenario, work, natsURL string, nats *proc, servers []*proc, mesh *meshgen.Mesh,
	tracker *track.Tracker, prog *progress, ph *report.Phase) (*proc, string) {
	const name = "NATS killed (SIGKILL) with its data wiped and no change made after, until the pushers followed the store again"
	p, took, err := natsWiped(ctx, sc, work, natsURL, nats, servers)
	if err != nil {
		return p, name + ": " + err.Error()
	}
	c, err := mesh.Apply(meshgen.Endpoint, 1, func(c meshgen.Change) { tracker.Made(c, time.Now()) })
	if err != nil {
		return p, name + ": " + err.Error()
	}
	made := time.Now()
	for time.Since(made) < sc.Settle && !tracker.Done(c.N) && ctx.Err() == nil {
		time.Sleep(100 * time.Millisecond)
	}
	fr := report.Fault{Name: name, Lasted: took.Seconds(), Recovered: time.Since(made).Seconds()}
	if !tracker.Done(c.N) {
		fr.Pending = 1
	}
	ph.Faults = append(ph.Faults, fr)
	prog.done("fault: %s; the pushers followed the store again %.2fs after NATS came back, and a change made then reached every proxy %.2fs later", name, fr.Lasted, fr.Recovered)
	if fr.Pending > 0 {
		return p, fmt.Sprintf("%s: a change made after did not reach every proxy within %s", name, sc.Settle)
	}
	return p, ""
}
