// Package sim runs simulated Envoy sidecars: thousands of ADS streams from
// one process, SotW or Delta, each behaving as Envoy does. A proxy
// subscribes to every cluster and listener, then to the endpoints of every
// EDS cluster it receives and the routes every listener names; it ACKs each
// response with its version and nonce (or NACKs a share of them when
// asked), and on a broken stream reconnects, to the next address when
// there are several, saying what it already holds.
//
// A proxy keeps names and versions, not configurations: each response is
// read for what the load test looks for (the markers of package meshgen)
// and dropped. Names and version lists are interned across proxies.
//
// Fleet.Run returns after every proxy's goroutines have stopped.
package sim

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"hash/maphash"
	"log/slog"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/experimental"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/shardpilot/shardpilot/loadtest/meshgen"
	"github.com/shardpilot/shardpilot/loadtest/track"
)

// Observer learns what the proxies hold: proxy p ACKed at a time a
// response holding key k as of change n.
type Observer interface {
	Saw(p int, k track.Key, n int, at time.Time)
}

// Config configures a Fleet.
type Config struct {
	// Addrs are the ADS addresses; proxy i connects to Addrs[i%len] first
	// (Addrs[0] when Sticky) and moves to the next when its stream breaks.
	Addrs  []string
	Sticky bool
	// Resolve, when set, is the address proxy i dials at each connection
	// instead (Addrs is then ignored): a namespace's Service, which may
	// lead to another shard by the time the proxy reconnects.
	Resolve func(proxy int) string
	// Proxies is how many proxies there are across all shards; this
	// process runs those whose index modulo Shards is Shard.
	Proxies       int
	Shard, Shards int
	// First is the index of the first proxy (its node id is NodeID of
	// it): fleets beside one another that must not share node ids.
	First int
	// Delta is the share of proxies that speak Delta xDS (0 to 1).
	Delta float64
	// NACKRate is the share of responses a proxy rejects (0 to 1).
	NACKRate float64
	// Namespaces spreads the proxies over this many namespaces (ns-<i>).
	Namespaces int
	// PerConn is how many proxies share one gRPC connection. Default 1,
	// as real Envoys: each brings its connection's cost to the server.
	PerConn int
	// TLS, when set, is how the proxies speak TLS to the control plane
	// (plaintext otherwise).
	TLS *tls.Config
	// ReadDelay, when set, is how long a proxy waits before it reads each
	// response: a proxy that reads slowly (a busy Envoy, a slow link).
	ReadDelay time.Duration
	Observer  Observer
	Log       *slog.Logger
}

// Validate checks the configuration and fills in defaults.
func (c *Config) Validate() error {
	if len(c.Addrs) == 0 && c.Resolve == nil {
		return errors.New("sim: at least one ADS address (or Resolve) is required")
	}
	if c.First < 0 {
		return fmt.Errorf("sim: first proxy %d: want at least 0", c.First)
	}
	if c.Proxies < 1 {
		return fmt.Errorf("sim: %d proxies: want at least 1", c.Proxies)
	}
	if c.Shards == 0 {
		c.Shards = 1
	}
	if c.Shard < 0 || c.Shard >= c.Shards {
		return fmt.Errorf("sim: shard %d/%d: want 0 <= shard < shards", c.Shard, c.Shards)
	}
	if c.PerConn < 0 {
		return fmt.Errorf("sim: %d proxies per connection: want at least 1", c.PerConn)
	}
	if c.Delta < 0 || c.Delta > 1 || c.NACKRate < 0 || c.NACKRate > 1 {
		return fmt.Errorf("sim: delta share %v and NACK rate %v: each must be within [0, 1]", c.Delta, c.NACKRate)
	}
	if c.Namespaces == 0 {
		c.Namespaces = 10
	}
	if c.PerConn == 0 {
		c.PerConn = 1
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Fleet is this process's share of the simulated proxies.
type Fleet struct {
	cfg     Config
	proxies []*proxy
	// conns are the connections by proxy group and address (Resolve).
	connsMu sync.Mutex
	conns   map[string]*grpc.ClientConn
	// full counts proxies whose current stream has delivered a full config.
	full   atomic.Int64
	intern interner
	// dial returns the connection of a group of proxies to an address.
	dial func(group int, addr string) (*grpc.ClientConn, error)
	// codec decodes the responses (rawCodec).
	codec *rawCodec
	// routeMarkers are the markers of the route configurations the
	// proxies received, by content: most proxies receive the same.
	routeMarkers markerCache
}

// envoyWindow is Envoy's default HTTP/2 flow-control window, of a stream
// and of a connection (initial_stream_window_size and
// initial_connection_window_size).
const envoyWindow = 256 << 20

// New returns a Fleet; Run starts it.
func New(cfg Config) (*Fleet, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	f := &Fleet{cfg: cfg}
	rng := rand.New(rand.NewPCG(uint64(cfg.Proxies), 7))
	for i := cfg.First + cfg.Shard; i < cfg.First+cfg.Proxies; i += cfg.Shards {
		ns := "ns-" + strconv.Itoa(i%cfg.Namespaces)
		name := "proxy-" + strconv.Itoa(i)
		meta, err := structpb.NewStruct(map[string]any{"NAMESPACE": ns, "LABELS": map[string]any{"app": name}})
		if err != nil {
			return nil, err
		}
		f.proxies = append(f.proxies, &proxy{
			fleet: f, index: i, group: len(f.proxies) / cfg.PerConn, delta: rng.Float64() < cfg.Delta,
			node: &core.Node{Id: NodeID(i, cfg.Namespaces), Metadata: meta},
		})
	}
	return f, nil
}

// NodeID is the node id of proxy i of a fleet over namespaces namespaces.
func NodeID(i, namespaces int) string {
	ns := "ns-" + strconv.Itoa(i%namespaces)
	ip := fmt.Sprintf("10.%d.%d.%d", 200+i>>16&0x1f, i>>8&0xff, i&0xff)
	return "sidecar~" + ip + "~proxy-" + strconv.Itoa(i) + "." + ns + "~" + ns + ".svc.cluster.local"
}

// Run connects every proxy and keeps them connected until ctx is done.
func (f *Fleet) Run(ctx context.Context) error {
	pool := &dirtyPool{}
	f.codec = newRawCodec(pool)
	f.conns = map[string]*grpc.ClientConn{}
	defer func() {
		f.connsMu.Lock()
		defer f.connsMu.Unlock()
		for _, c := range f.conns {
			c.Close()
		}
	}()
	f.dial = func(group int, addr string) (*grpc.ClientConn, error) {
		key := strconv.Itoa(group) + "|" + addr
		f.connsMu.Lock()
		defer f.connsMu.Unlock()
		if c, ok := f.conns[key]; ok {
			return c, nil
		}
		creds := insecure.NewCredentials()
		if f.cfg.TLS != nil {
			creds = credentials.NewTLS(f.cfg.TLS)
		}
		// Envoy's HTTP/2 windows (256 MiB a stream and a connection)
		// rather than gRPC's estimate, which pings the server at each
		// response it reads: Envoy does not, and the server's answer to
		// each ping was a write and a read the proxies put on it.
		c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds),
			grpc.WithInitialWindowSize(envoyWindow), grpc.WithInitialConnWindowSize(envoyWindow),
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(256<<20)), experimental.WithBufferPool(pool))
		if err != nil {
			return nil, fmt.Errorf("sim: dial %s: %w", addr, err)
		}
		f.conns[key] = c
		return c, nil
	}
	var wg sync.WaitGroup
	for _, p := range f.proxies {
		wg.Go(func() { p.run(ctx) })
	}
	wg.Wait()
	return nil
}

// Placed returns how many proxies hold a full config on a stream to the
// address want gives for them.
func (f *Fleet) Placed(want func(proxy int) string) int {
	n := 0
	for _, p := range f.proxies {
		if a := p.fullAt.Load(); a != nil && *a == want(p.index) {
			n++
		}
	}
	return n
}

// Size returns how many proxies this process runs.
func (f *Fleet) Size() int { return len(f.proxies) }

// Full returns how many proxies hold a full config on their current stream.
func (f *Fleet) Full() int { return int(f.full.Load()) }

// Stats are a fleet's counters.
type Stats struct {
	Proxies, Delta int
	// FirstFull is each proxy's time from its first connect to a full
	// config (0 for a proxy that never got one).
	FirstFull []time.Duration
	Responses []int64 // per proxy
	Bytes     []int64 // per proxy: resource bytes received
	// ByType is the responses and resource bytes all proxies received,
	// per xDS type (Types).
	ByType   [len(Types)]Received
	NACKs    int64
	Errors   int64   // broken streams
	ErrorsOf []int64 // per proxy
}

// Stats returns the fleet's counters so far.
func (f *Fleet) Stats() Stats {
	s := Stats{Proxies: len(f.proxies)}
	for _, p := range f.proxies {
		if p.delta {
			s.Delta++
		}
		s.FirstFull = append(s.FirstFull, time.Duration(p.firstFull.Load()))
		s.Responses = append(s.Responses, p.responses.Load())
		s.Bytes = append(s.Bytes, p.bytes.Load())
		for i := range Types {
			s.ByType[i].Responses += p.byType[i].responses.Load()
			s.ByType[i].Bytes += p.byType[i].bytes.Load()
		}
		s.NACKs += p.nacks.Load()
		s.Errors += p.errors.Load()
		s.ErrorsOf = append(s.ErrorsOf, p.errors.Load())
	}
	return s
}

// Types are the xDS types a proxy counts what it receives by, and
// TypeNames are their names as operators say them.
var Types = [...]string{resource.ClusterType, resource.EndpointType, resource.ListenerType, resource.RouteType, resource.VirtualHostType}
var TypeNames = [len(Types)]string{"CDS", "EDS", "LDS", "RDS", "VHDS"}

// Received is what proxies received of one type.
type Received struct{ Responses, Bytes int64 }

// Minus returns what was received since an earlier count.
func (r Received) Minus(earlier Received) Received {
	return Received{r.Responses - earlier.Responses, r.Bytes - earlier.Bytes}
}

// received counts a response of a type.
func (p *proxy) received(typ string, bytes int64) {
	p.responses.Add(1)
	p.bytes.Add(bytes)
	if i := slices.Index(Types[:], typ); i >= 0 {
		p.byType[i].responses.Add(1)
		p.byType[i].bytes.Add(bytes)
	}
}

// proxy is one simulated Envoy.
type proxy struct {
	fleet *Fleet
	index int
	delta bool
	node  *core.Node
	// group is the proxies sharing its connections (Config.PerConn).
	group int
	// addr is the address of the current stream; fullAt, once it has
	// delivered a full config.
	addr   string
	fullAt atomic.Pointer[string]

	firstFull                  atomic.Int64 // nanoseconds from the first connect
	responses, bytes           atomic.Int64
	byType                     [len(Types)]struct{ responses, bytes atomic.Int64 }
	nacks, errors              atomic.Int64
	started                    time.Time
	state                      holdings
	full                       bool // the current stream delivered a full config
	rng                        *rand.Rand
	sotwVersion, sotwNonce     map[string]string // type → last ACKed version, last nonce
	deltaVersions              map[string]map[string]string
	listenerRoutes             map[string][]string // listener → route names (Delta)
	acked                      map[string]bool     // type → ever ACKed
	edsRequested, rdsRequested bool
	vhdsRequested              bool
	// seenRoute and seenEndpoint are the last marker reported per service
	// (plus one), so that the tracker hears only of new ones: a route
	// configuration carries every service's marker, and most did not change.
	seenRoute, seenEndpoint []int32
}

// holdings is what a proxy holds, in names.
type holdings struct {
	eds, rds []string // subscribed names, sorted and interned
	// vhds are the route configurations whose virtual hosts come apart
	// (VHDS, Delta alone), sorted and interned.
	vhds    []string
	dynamic []int // dynamic services among its clusters
}

func (p *proxy) run(ctx context.Context) {
	p.started = time.Now()
	p.rng = rand.New(rand.NewPCG(uint64(p.index), 11))
	cfg := p.fleet.cfg
	for attempt := 0; ctx.Err() == nil; attempt++ {
		first := p.index
		if cfg.Sticky {
			first = 0
		}
		if cfg.Resolve != nil {
			p.addr = cfg.Resolve(p.index)
		} else {
			p.addr = cfg.Addrs[(first+attempt)%len(cfg.Addrs)]
		}
		conn, err := p.fleet.dial(p.group, p.addr)
		if err == nil {
			if p.delta {
				err = p.runDelta(ctx, conn)
			} else {
				err = p.runSotW(ctx, conn)
			}
		}
		if p.full {
			p.full = false
			p.fullAt.Store(nil)
			p.fleet.full.Add(-1)
		}
		if ctx.Err() != nil {
			return
		}
		p.errors.Add(1)
		p.fleet.cfg.Log.Debug("stream broke; reconnecting", "proxy", p.index, "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(time.Duration(50+p.rng.IntN(200)) * time.Millisecond):
		}
	}
}

// readLate waits the fleet's ReadDelay before the proxy reads a response.
func (p *proxy) readLate(ctx context.Context) error {
	if p.fleet.cfg.ReadDelay <= 0 {
		return nil
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(p.fleet.cfg.ReadDelay):
		return nil
	}
}

// markFull notes a full config once every type has been ACKed.
func (p *proxy) markFull() {
	if p.full || !p.acked[resource.ClusterType] || !p.acked[resource.ListenerType] ||
		(len(p.state.eds) > 0 && !p.acked[resource.EndpointType]) || (len(p.state.rds) > 0 && !p.acked[resource.RouteType]) ||
		(len(p.state.vhds) > 0 && !p.acked[resource.VirtualHostType]) {
		return
	}
	p.full = true
	addr := p.addr
	p.fullAt.Store(&addr)
	p.fleet.full.Add(1)
	p.firstFull.CompareAndSwap(0, int64(time.Since(p.started)))
}

// resumed counts a reconnected proxy that holds a full config as full
// once it has said what it holds: like Envoy, it keeps what it applied on
// earlier streams (see held), and a control plane that finds it current
// sends nothing.
func (p *proxy) resumed() {
	for typ, version := range p.sotwVersion {
		if version != "" {
			p.held(typ)
		}
	}
	for typ, versions := range p.deltaVersions {
		if len(versions) > 0 {
			p.held(typ)
		}
	}
	p.markFull()
}

func (p *proxy) reject() bool {
	return p.fleet.cfg.NACKRate > 0 && p.rng.Float64() < p.fleet.cfg.NACKRate
}

var nackStatus = &rpcstatus.Status{Code: 3, Message: "rejected by the load test's NACK rate"}

func (p *proxy) runSotW(ctx context.Context, conn *grpc.ClientConn) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, err := conn.NewStream(ctx, adsDesc, sotwMethod, grpc.ForceCodecV2(p.fleet.codec))
	if err != nil {
		return err
	}
	if p.sotwVersion == nil {
		p.sotwVersion, p.sotwNonce = map[string]string{}, map[string]string{}
		p.acked = map[string]bool{}
	}
	p.edsRequested, p.rdsRequested = false, false
	node := p.node // on the first request alone, as Istio's bootstrap has Envoy do
	request := func(typeURL string, names []string, nonce string, detail *rpcstatus.Status) error {
		err := s.SendMsg(&discovery.DiscoveryRequest{Node: node, TypeUrl: typeURL, VersionInfo: p.sotwVersion[typeURL],
			ResourceNames: names, ResponseNonce: nonce, ErrorDetail: detail})
		node = nil
		return err
	}
	// Like Envoy, say what is held: the versions last ACKed (from any
	// replica) and the names subscribed.
	if err := p.sayHeld(nil, func(typ string, names []string) error { return request(typ, names, "", nil) }); err != nil {
		return err
	}
	resp := &response{}
	defer resp.release()
	for {
		if err := p.readLate(ctx); err != nil {
			return err
		}
		if err := s.RecvMsg(resp); err != nil {
			return err
		}
		typ := resp.typeURL
		p.received(typ, resp.size())
		p.sotwNonce[typ] = resp.nonce
		if p.reject() {
			p.nacks.Add(1)
			if err := request(typ, p.names(typ), resp.nonce, nackStatus); err != nil {
				return err
			}
			continue
		}
		var follow func() error
		switch typ {
		case resource.ClusterType:
			eds, dynamic := p.readClusters(resp.resources)
			follow = p.followClusters(eds, dynamic, func(names []string) error {
				p.edsRequested = true
				return request(resource.EndpointType, names, p.sotwNonce[resource.EndpointType], nil)
			})
		case resource.ListenerType:
			follow = p.followListeners(resp.resources, func(rds []string) error {
				p.rdsRequested = true
				return request(resource.RouteType, rds, p.sotwNonce[resource.RouteType], nil)
			})
		}
		p.sotwVersion[typ] = p.fleet.intern.name(resp.version)
		// Applied before it is ACKed: a proxy whose ACK is lost with its
		// stream holds it all the same, and says so when it reconnects.
		p.observe(typ, resp.resources)
		if err := request(typ, p.names(typ), resp.nonce, nil); err != nil {
			return err
		}
		if follow != nil {
			if err := follow(); err != nil {
				return err
			}
		}
		p.ackedType(typ)
	}
}

// held counts a type as ACKed: an ACK sent, or, on a new stream, a type
// applied on an earlier one, whose ACK may have gone with that stream (a
// proxy moved to another pusher mid-response held its endpoints unACKed;
// the pusher, finding them current, sent nothing, and the proxy was never
// counted full again).
func (p *proxy) held(typ string) {
	if (typ == resource.EndpointType && !p.edsRequested) || (typ == resource.RouteType && !p.rdsRequested) ||
		(typ == resource.VirtualHostType && !p.vhdsRequested) {
		return
	}
	p.acked[typ] = true
}

// ackedType records an ACK; EDS and RDS count once they were asked for.
func (p *proxy) ackedType(typ string) {
	p.held(typ)
	p.markFull()
}

// names returns the names a SotW proxy subscribes to for a type.
func (p *proxy) names(typ string) []string {
	switch typ {
	case resource.EndpointType:
		return p.state.eds
	case resource.RouteType:
		return p.state.rds
	}
	return nil
}

// readClusters returns the EDS cluster names and dynamic services in a
// full set of clusters, reading only each cluster's name and type.
func (p *proxy) readClusters(rs []body) ([]string, []int) {
	var eds []string
	var dynamic []int
	for _, r := range rs {
		name, isEDS := clusterNameAndType(r.value)
		if isEDS {
			eds = append(eds, p.fleet.intern.name(name))
		}
		if n, ok := dynamicService(name); ok {
			dynamic = append(dynamic, n)
		}
	}
	return p.fleet.intern.list(eds), dynamic
}

// followClusters records the new set of clusters: the dynamic services
// that appeared or went, and a new EDS subscription when it changed.
func (p *proxy) followClusters(eds []string, dynamic []int, subscribe func([]string) error) func() error {
	slices.Sort(dynamic)
	now := time.Now()
	obs := p.fleet.cfg.Observer
	if obs != nil {
		for _, n := range dynamic {
			if _, had := slices.BinarySearch(p.state.dynamic, n); !had {
				obs.Saw(p.index, track.Key{Kind: meshgen.AddService, Service: n}, n, now)
			}
		}
		for _, n := range p.state.dynamic {
			if _, has := slices.BinarySearch(dynamic, n); !has {
				// The removal's own number is not in the clusters: it is the
				// latest change of its key.
				obs.Saw(p.index, track.Key{Kind: meshgen.RemoveService, Service: n}, math.MaxInt, now)
			}
		}
	}
	p.state.dynamic = dynamic
	if slices.Equal(eds, p.state.eds) {
		return nil
	}
	p.state.eds = eds
	return func() error { return subscribe(eds) }
}

// observe reports the markers in an ACKed response.
func (p *proxy) observe(typ string, rs []body) {
	obs := p.fleet.cfg.Observer
	if obs == nil {
		return
	}
	now := time.Now()
	saw := func(seen *[]int32, kind meshgen.Kind, svc, n int) {
		if svc < 0 || n < 0 {
			return
		}
		if svc >= len(*seen) {
			*seen = append(*seen, make([]int32, svc+1-len(*seen))...)
		}
		if (*seen)[svc] == int32(n+1) {
			return
		}
		(*seen)[svc] = int32(n + 1)
		obs.Saw(p.index, track.Key{Kind: kind, Service: svc}, n, now)
	}
	switch typ {
	case resource.EndpointType:
		for _, r := range rs {
			forEachEndpointMarker(r.value, func(svc, n int) { saw(&p.seenEndpoint, meshgen.Endpoint, svc, n) })
		}
	case resource.RouteType, resource.VirtualHostType:
		for _, r := range rs {
			p.fleet.routeMarkers.each(r.value, func(svc, n int) { saw(&p.seenRoute, meshgen.Route, svc, n) })
		}
	}
}

// sayHeld opens a stream as Envoy does: it asks for the clusters and the
// listeners (naming wildcard), then for the load assignments and route
// configurations it held on the last stream.
func (p *proxy) sayHeld(wildcard []string, ask func(typ string, names []string) error) error {
	for _, typ := range []string{resource.ClusterType, resource.ListenerType} {
		if err := ask(typ, wildcard); err != nil {
			return err
		}
	}
	if len(p.state.eds) > 0 {
		p.edsRequested = true
		if err := ask(resource.EndpointType, p.state.eds); err != nil {
			return err
		}
	}
	if len(p.state.rds) > 0 {
		p.rdsRequested = true
		if err := ask(resource.RouteType, p.state.rds); err != nil {
			return err
		}
	}
	if len(p.state.vhds) > 0 {
		p.vhdsRequested = true
		if err := ask(resource.VirtualHostType, p.state.vhds); err != nil {
			return err
		}
	}
	p.resumed()
	return nil
}

// followListeners records the route configurations a full set of
// listeners names, and returns what asks for them when they changed.
func (p *proxy) followListeners(rs []body, subscribe func([]string) error) func() error {
	var rds []string
	for _, r := range rs {
		rds = append(rds, routeNames(r.value)...)
	}
	return p.followRouteNames(rds, subscribe)
}

// followRouteNames records the route configurations the listeners name,
// and returns what asks for them when they changed.
func (p *proxy) followRouteNames(rds []string, subscribe func([]string) error) func() error {
	rds = p.fleet.intern.list(rds)
	if slices.Equal(rds, p.state.rds) {
		return nil
	}
	p.state.rds = rds
	return func() error { return subscribe(rds) }
}

// deltaClusters returns the EDS clusters a Delta proxy holds after a
// response: those it held, changed by what was added and removed.
func (p *proxy) deltaClusters(resp *response) []string {
	var eds []string
	changed := map[string]bool{}
	for _, r := range resp.resources {
		changed[r.name] = true
		if name, isEDS := clusterNameAndType(r.value); isEDS {
			eds = append(eds, p.fleet.intern.name(name))
		}
	}
	for _, name := range resp.removed {
		changed[name] = true
	}
	for _, name := range p.state.eds {
		if !changed[name] {
			eds = append(eds, name)
		}
	}
	slices.Sort(eds)
	return p.fleet.intern.list(slices.Compact(eds))
}

// applyVersions records the versions a Delta response changed, and
// returns those of its type.
func (p *proxy) applyVersions(typ string, resp *response) map[string]string {
	versions := p.deltaVersions[typ]
	if versions == nil {
		versions = map[string]string{}
		p.deltaVersions[typ] = versions
	}
	for _, name := range resp.removed {
		delete(versions, name)
	}
	for _, r := range resp.resources {
		versions[p.fleet.intern.name(r.name)] = p.fleet.intern.name(r.version)
	}
	return versions
}

// deltaRoutes records the route configurations the listeners of a Delta
// response name, and returns those every listener held names.
func (p *proxy) deltaRoutes(resp *response) []string {
	for _, name := range resp.removed {
		delete(p.listenerRoutes, name)
	}
	for _, r := range resp.resources {
		p.listenerRoutes[r.name] = routeNames(r.value)
	}
	var rds []string
	for _, names := range p.listenerRoutes {
		rds = append(rds, names...)
	}
	return rds
}

// followVirtualHosts records the route configurations of a Delta response
// whose virtual hosts come apart (VHDS: their vhds field is set), and
// returns what asks for them, as Envoy does, by the configurations' names
// (the virtual hosts' namespace), when they changed.
func (p *proxy) followVirtualHosts(resp *response, subscribe func([]string) error) func() error {
	apart := map[string]bool{}
	for _, name := range p.state.vhds {
		apart[name] = true
	}
	for _, name := range resp.removed {
		delete(apart, name)
	}
	for _, r := range resp.resources {
		apart[p.fleet.intern.name(r.name)] = hasVHDS(r.value)
	}
	var vhds []string
	for name, on := range apart {
		if on {
			vhds = append(vhds, name)
		}
	}
	slices.Sort(vhds)
	vhds = p.fleet.intern.list(vhds)
	if slices.Equal(vhds, p.state.vhds) {
		return nil
	}
	p.state.vhds = vhds
	return func() error { return subscribe(vhds) }
}

// hasVHDS reports whether an encoded route configuration sets vhds (9).
func hasVHDS(b []byte) bool {
	found := false
	eachBytes(b, 9, func([]byte) { found = true })
	return found
}

// dynamicHeld returns the dynamic services among the clusters held.
func (p *proxy) dynamicHeld(versions map[string]string) []int {
	var dynamic []int
	for name := range versions {
		if n, ok := dynamicService(name); ok {
			dynamic = append(dynamic, n)
		}
	}
	return dynamic
}

func (p *proxy) runDelta(ctx context.Context, conn *grpc.ClientConn) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s, err := conn.NewStream(ctx, adsDesc, deltaMethod, grpc.ForceCodecV2(p.fleet.codec))
	if err != nil {
		return err
	}
	if p.deltaVersions == nil {
		p.deltaVersions = map[string]map[string]string{}
		p.listenerRoutes = map[string][]string{}
		p.acked = map[string]bool{}
	}
	p.edsRequested, p.rdsRequested, p.vhdsRequested = false, false, false
	node := p.node // on the first request alone, as Istio's bootstrap has Envoy do
	subscribe := func(typ string, add, remove []string) error {
		known := p.deltaVersions[typ]
		if len(known) == 0 {
			known = nil
		}
		err := s.SendMsg(&discovery.DeltaDiscoveryRequest{Node: node, TypeUrl: typ,
			ResourceNamesSubscribe: add, ResourceNamesUnsubscribe: remove, InitialResourceVersions: known})
		node = nil
		return err
	}
	// A new stream says what is held (initial_resource_versions).
	if err := p.sayHeld([]string{"*"}, func(typ string, names []string) error { return subscribe(typ, names, nil) }); err != nil {
		return err
	}
	resp := &response{delta: true}
	defer resp.release()
	for {
		if err := p.readLate(ctx); err != nil {
			return err
		}
		if err := s.RecvMsg(resp); err != nil {
			return err
		}
		typ := resp.typeURL
		p.received(typ, resp.size())
		if p.reject() {
			p.nacks.Add(1)
			if err := s.SendMsg(&discovery.DeltaDiscoveryRequest{TypeUrl: typ, ResponseNonce: resp.nonce, ErrorDetail: nackStatus}); err != nil {
				return err
			}
			continue
		}
		versions := p.applyVersions(typ, resp)
		var follow func() error
		switch typ {
		case resource.ClusterType:
			old := p.state.eds
			follow = p.followClusters(p.deltaClusters(resp), p.dynamicHeld(versions), func(names []string) error {
				p.edsRequested = true
				add, remove := diff(old, names)
				return subscribe(resource.EndpointType, add, remove)
			})
		case resource.ListenerType:
			old := p.state.rds
			follow = p.followRouteNames(p.deltaRoutes(resp), func(rds []string) error {
				p.rdsRequested = true
				add, remove := diff(old, rds)
				return subscribe(resource.RouteType, add, remove)
			})
		case resource.RouteType:
			old := p.state.vhds
			follow = p.followVirtualHosts(resp, func(vhds []string) error {
				p.vhdsRequested = true
				add, remove := diff(old, vhds)
				return subscribe(resource.VirtualHostType, add, remove)
			})
		}
		p.observe(typ, resp.resources) // applied before it is ACKed, as above
		if err := s.SendMsg(&discovery.DeltaDiscoveryRequest{TypeUrl: typ, ResponseNonce: resp.nonce}); err != nil {
			return err
		}
		if follow != nil {
			if err := follow(); err != nil {
				return err
			}
		}
		p.ackedType(typ)
	}
}

// diff returns what is in b and not a, and what is in a and not b (both sorted).
func diff(a, b []string) (added, removed []string) {
	for _, n := range b {
		if _, ok := slices.BinarySearch(a, n); !ok {
			added = append(added, n)
		}
	}
	for _, n := range a {
		if _, ok := slices.BinarySearch(b, n); !ok {
			removed = append(removed, n)
		}
	}
	return added, removed
}

// clusterNameAndType reads a Cluster's name (field 1) and whether its
// discovery type (field 2) is EDS, without decoding the rest.
func clusterNameAndType(b []byte) (string, bool) {
	var name string
	var isEDS bool
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return name, isEDS
		}
		b = b[n:]
		switch {
		case num == 1 && typ == protowire.BytesType:
			v, m := protowire.ConsumeBytes(b)
			if m < 0 {
				return name, isEDS
			}
			name, b = string(v), b[m:]
			continue
		case num == 2 && typ == protowire.VarintType:
			v, m := protowire.ConsumeVarint(b)
			if m < 0 {
				return name, isEDS
			}
			isEDS, b = v == uint64(cluster.Cluster_EDS), b[m:]
			continue
		}
		m := protowire.ConsumeFieldValue(num, typ, b)
		if m < 0 {
			return name, isEDS
		}
		b = b[m:]
	}
	return name, isEDS
}

// routeNames returns the route configurations a listener's connection
// managers fetch over RDS.
func routeNames(b []byte) []string {
	var l listener.Listener
	if b == nil || proto.Unmarshal(b, &l) != nil {
		return nil
	}
	var out []string
	for _, fc := range l.FilterChains {
		for _, f := range fc.Filters {
			var m hcm.HttpConnectionManager
			if f.GetTypedConfig() == nil || f.GetTypedConfig().UnmarshalTo(&m) != nil {
				continue
			}
			if name := m.GetRds().GetRouteConfigName(); name != "" {
				out = append(out, name)
			}
		}
	}
	return out
}

// forEachRouteMarker finds the route names meshgen writes ("chg-<svc>-<n>")
// in an encoded route configuration, without decoding it.
// markerCache remembers the route markers of the last route
// configurations read, by a hash of their bytes, so that of the many
// proxies receiving the same configuration one reads it.
type markerCache struct {
	mu   sync.Mutex
	seed maphash.Seed
	byID map[markerKey][][2]int
}

// markerKey is a configuration's hash and length.
type markerKey struct {
	hash uint64
	size int
}

// each calls fn with every route marker of an encoded route configuration.
func (c *markerCache) each(b []byte, fn func(svc, n int)) {
	c.mu.Lock()
	if c.byID == nil {
		c.byID, c.seed = map[markerKey][][2]int{}, maphash.MakeSeed()
	}
	if len(c.byID) > 256 {
		clear(c.byID)
	}
	key := markerKey{maphash.Bytes(c.seed, b), len(b)}
	found, ok := c.byID[key]
	c.mu.Unlock()
	if !ok {
		found = [][2]int{}
		forEachRouteMarker(b, func(svc, n int) { found = append(found, [2]int{svc, n}) })
		c.mu.Lock()
		c.byID[key] = found
		c.mu.Unlock()
	}
	for _, m := range found {
		fn(m[0], m[1])
	}
}

func forEachRouteMarker(b []byte, fn func(svc, n int)) {
	marker := []byte("chg-")
	for {
		i := bytes.Index(b, marker)
		if i < 0 {
			return
		}
		b = b[i:]
		end := len(marker)
		for end < len(b) && (b[end] == '-' || (b[end] >= '0' && b[end] <= '9')) {
			end++
		}
		if svc, n, ok := meshgen.ParseRouteName(string(b[:end])); ok {
			fn(svc, n)
		}
		b = b[end:]
	}
}

// forEachEndpointMarker finds the marker endpoints in an encoded
// ClusterLoadAssignment of a static service, walking only the fields on
// the way: cluster_name (1), and endpoints (2) → lb_endpoints (2) →
// endpoint (1) → address (1) → socket_address (1) → address (2).
func forEachEndpointMarker(b []byte, fn func(svc, n int)) {
	var svc int
	var static bool
	eachBytes(b, 1, func(v []byte) { svc, static = staticService(string(v)) })
	if !static {
		return
	}
	path := []protowire.Number{2, 2, 1, 1, 1}
	var walk func(b []byte, depth int)
	walk = func(b []byte, depth int) {
		if depth == len(path) {
			eachBytes(b, 2, func(addr []byte) {
				if !bytes.HasPrefix(addr, []byte("100.")) {
					return // not a marker: no string made
				}
				if n, ok := meshgen.ParseMarkerAddress(string(addr)); ok {
					fn(svc, n)
				}
			})
			return
		}
		eachBytes(b, path[depth], func(v []byte) { walk(v, depth+1) })
	}
	walk(b, 0)
}

// eachBytes calls fn with every length-delimited field numbered num.
func eachBytes(b []byte, num protowire.Number, fn func([]byte)) {
	for len(b) > 0 {
		n, typ, m := protowire.ConsumeTag(b)
		if m < 0 {
			return
		}
		b = b[m:]
		if n == num && typ == protowire.BytesType {
			v, k := protowire.ConsumeBytes(b)
			if k < 0 {
				return
			}
			fn(v)
			b = b[k:]
			continue
		}
		k := protowire.ConsumeFieldValue(n, typ, b)
		if k < 0 {
			return
		}
		b = b[k:]
	}
}

// staticService returns the static service of an outbound cluster name
// ("outbound|80||svc-<i>.<ns>.svc.cluster.local").
func staticService(cluster string) (int, bool) {
	return numbered(cluster, "||svc-")
}

// dynamicService returns the dynamic service of an outbound cluster name.
func dynamicService(cluster string) (int, bool) {
	return numbered(cluster, "||dyn-")
}

func numbered(cluster, marker string) (int, bool) {
	i := strings.Index(cluster, marker)
	if i < 0 {
		return 0, false
	}
	rest := cluster[i+len(marker):]
	end := strings.IndexByte(rest, '.')
	if end < 0 {
		return 0, false
	}
	n, err := strconv.Atoi(rest[:end])
	return n, err == nil
}

// interner shares equal strings and equal name lists across proxies.
type interner struct {
	mu    sync.Mutex
	names map[string]string
	lists map[string][]string
}

func (in *interner) name(s string) string {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.names == nil {
		in.names = map[string]string{}
	}
	if v, ok := in.names[s]; ok {
		return v
	}
	in.names[s] = s
	return s
}

// list returns a sorted, de-duplicated, shared copy of names.
func (in *interner) list(names []string) []string {
	slices.Sort(names)
	names = slices.Compact(names)
	key := strings.Join(names, "\x00")
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.lists == nil {
		in.lists = map[string][]string{}
	}
	if v, ok := in.lists[key]; ok {
		return v
	}
	in.lists[key] = names
	return names
}
