package app

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"

	adminv3 "github.com/envoyproxy/go-control-plane/envoy/admin/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	statusv3 "github.com/envoyproxy/go-control-plane/envoy/service/status/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/shardpilot/shardpilot/pkg/pusher"
	"github.com/shardpilot/shardpilot/pkg/xds/cache"
	"github.com/shardpilot/shardpilot/pkg/xds/generate"
	"github.com/shardpilot/shardpilot/pkg/xds/identity"
	"github.com/shardpilot/shardpilot/pkg/xds/nodemeta"
	"github.com/shardpilot/shardpilot/pkg/xds/server"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

// ConfigDump serves /debug/config_dump?proxy=<id>: every resource the
// pusher holds for a connected proxy's class, as JSON.
// A pusher's Build makes it.
type ConfigDump struct {
	status *server.Streams
	cache  *cache.Cache
	pusher *pusher.Pusher
	// localities holds the load assignments of proxies with a locality.
	localities *cache.Cache
	// secrets, when the pushers serve secrets, holds each identity's:
	// the dump summarizes them (never a key).
	secrets heldSecrets
}

func (d *ConfigDump) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id := r.URL.Query().Get("proxy")
	if id == "" {
		http.Error(w, "config_dump: ?proxy=<node id> is required (see /debug/syncz for the connected proxies)", http.StatusBadRequest)
		return
	}
	node := d.status.Node(id)
	if node == nil {
		http.Error(w, fmt.Sprintf("config_dump: proxy %q is not connected to this replica", id), http.StatusNotFound)
		return
	}
	c, ps := d.cache, d.pusher
	class := ps.Classify(node)
	dump := map[string]any{"proxy": id, "class": class}
	resources := map[string][]json.RawMessage{}
	add := func(class cache.Class, typeURL string) {
		held := c.Resources(class, typeURL)
		if typeURL == resource.EndpointType {
			// A proxy with a locality is served its locality's.
			if lc, l := d.localities, generate.LocalityName(node.GetLocality()); lc != nil && l != "" {
				if own := lc.Resources(cache.Class(l), typeURL); own != nil {
					held = own
				}
			}
		}
		names := make([]string, 0, len(held))
		for n := range held {
			names = append(names, n)
		}
		slices.Sort(names)
		short := typeURL[strings.LastIndex(typeURL, ".")+1:]
		for _, n := range names {
			b, err := protojson.Marshal(held[n])
			if err != nil {
				continue
			}
			resources[short] = append(resources[short], b)
		}
	}
	for _, t := range pusher.ClassTypes {
		add(class, t)
	}
	for _, t := range pusher.SharedTypes {
		add(cache.Shared, t)
	}
	// Of the endpoints, shared by the whole mesh, those the proxy's
	// clusters name.
	named := edsNames(c, class)
	short := resource.EndpointType[strings.LastIndex(resource.EndpointType, ".")+1:]
	resources[short] = slices.DeleteFunc(resources[short], func(b json.RawMessage) bool {
		var cla struct {
			ClusterName string `json:"clusterName"`
		}
		return json.Unmarshal(b, &cla) != nil || !named.Has(cla.ClusterName)
	})
	dump["provenance"] = d.provenance(class)
	if identity := d.status.Identity(node); identity != "" && d.secrets != nil {
		dump["identity"] = identity
		resources["Secret"] = secretSummaries(d.secrets.Resources(identity, resource.SecretType))
	}
	dump["resources"] = resources
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(dump)
}

// Provenance is what the config dump names as the source of a class's
// clusters and virtual hosts, as istioctl's columns: the DestinationRule
// of each cluster, the VirtualService of each virtual host.
type Provenance struct {
	Clusters     map[string]string `json:"clusters,omitempty"`
	VirtualHosts map[string]string `json:"virtual_hosts,omitempty"`
}

// provenance names the DestinationRule of each of a class's outbound
// clusters and the VirtualService of each of its virtual hosts.
func (d *ConfigDump) provenance(class cache.Class) Provenance {
	clusterHosts, vhostHosts := map[string]string{}, map[string]string{}
	var hosts []string
	for name := range d.cache.Resources(class, resource.ClusterType) {
		if host, _, _, ok := generate.ParseClusterName(name); ok {
			clusterHosts[name] = host
			hosts = append(hosts, host)
		}
	}
	for _, r := range d.cache.Resources(class, resource.RouteType) {
		rc, ok := r.(*route.RouteConfiguration)
		if !ok {
			continue
		}
		for _, vh := range rc.GetVirtualHosts() {
			host := vh.GetName()
			if h, port, ok := strings.Cut(host, ":"); ok && port != "" && strings.Trim(port, "0123456789") == "" {
				host = h
			}
			vhostHosts[vh.GetName()] = host
			hosts = append(hosts, host)
		}
	}
	drs, vss := d.pusher.Provenance(hosts)
	out := Provenance{Clusters: map[string]string{}, VirtualHosts: map[string]string{}}
	for name, host := range clusterHosts {
		if dr := drs[host]; dr != "" {
			out.Clusters[name] = dr
		}
	}
	for name, host := range vhostHosts {
		if vs := vss[host]; vs != "" {
			out.VirtualHosts[name] = vs
		}
	}
	return out
}

// edsNames returns the names of the load assignments a class's clusters
// take from EDS: what the cache lets the class's streams see of them.
func edsNames(c *cache.Cache, class cache.Class) *cache.View {
	return c.Visible(class, resource.EndpointType)
}

// typeURLs maps the short type names of the status to type URLs.
var typeURLs = map[string]string{
	"Cluster": resource.ClusterType, "ClusterLoadAssignment": resource.EndpointType,
	"Listener": resource.ListenerType, "RouteConfiguration": resource.RouteType,
}

// CSDS serves Envoy's client status discovery service on the ADS port: per
// connected proxy, each resource its class holds, with the version the
// proxy ACKed and whether it rejected the last one sent.
type CSDS struct {
	statusv3.UnimplementedClientStatusDiscoveryServiceServer
	Dump *ConfigDump
	// Policy, when set, identifies callers as proxies are: a caller with
	// an identity sees its namespace's proxies only, and one without is
	// refused where the policy requires one. Unset: identity.Policy{}
	// (a client certificate's identity, none required).
	Policy *identity.Policy
	// MaxUnmatched bounds the proxies a request without node matchers is
	// answered for (default csdsMaxUnmatched; negative: none): beyond, it
	// is refused.
	MaxUnmatched int
	// MaxConcurrent bounds the requests answered at once (default
	// csdsMaxConcurrent); one more is refused at once, before anything is
	// built. MaxBytes bounds one response's encoded size (default
	// csdsMaxBytes), measured before it is built.
	MaxConcurrent, MaxBytes int

	once  sync.Once
	slots chan struct{} // a token per request being answered
}

// Bounds of CSDS: a request without node matchers on a pusher with
// thousands of proxies would otherwise build a response of gigabytes, and
// concurrent requests hold one response each.
const (
	csdsMaxUnmatched  = 100      // proxies answered for without node matchers
	csdsMaxBytes      = 32 << 20 // encoded size of one response
	csdsMaxConcurrent = 2        // requests answered at once
)

// enter takes one of the request slots, or says there is none free.
func (c *CSDS) enter() bool {
	c.once.Do(func() { c.slots = make(chan struct{}, cmp.Or(c.MaxConcurrent, csdsMaxConcurrent)) })
	select {
	case c.slots <- struct{}{}:
		return true
	default:
		return false
	}
}

func (c *CSDS) leave() { <-c.slots }

// FetchClientStatus answers one request; node matchers on the exact node id
// select proxies, and no matcher selects all (up to csdsMaxUnmatched). A
// caller with a SPIFFE identity is answered for its namespace's proxies.
func (c *CSDS) FetchClientStatus(ctx context.Context, req *statusv3.ClientStatusRequest) (*statusv3.ClientStatusResponse, error) {
	resp, leave, err := c.answer(ctx, req)
	if leave != nil {
		// gRPC writes the response after this returns: its slot is left
		// when the call ends, so that a response being written counts
		// among those answered at once.
		context.AfterFunc(ctx, leave)
	}
	return resp, err
}

// answer builds the response to a request in a slot of MaxConcurrent,
// and returns what leaves it once the response is written (nil when the
// request was refused).
func (c *CSDS) answer(ctx context.Context, req *statusv3.ClientStatusRequest) (_ *statusv3.ClientStatusResponse, leave func(), err error) {
	limit := c.MaxUnmatched
	if limit == 0 {
		limit = csdsMaxUnmatched
	}
	// A caller with an identity (a client certificate or a token on the
	// ADS port) sees the proxies of its namespace only.
	policy := identity.Policy{}
	if c.Policy != nil {
		policy = *c.Policy
	}
	id, identified, err := policy.Identify(ctx)
	switch {
	case err != nil:
		return nil, nil, status.Errorf(codes.PermissionDenied, "csds: %v", err)
	case !identified && policy.Required:
		return nil, nil, status.Error(codes.Unauthenticated, "csds: a client certificate or a service account token is required")
	}
	if !c.enter() {
		return nil, nil, status.Errorf(codes.ResourceExhausted, "csds: %d requests are being answered; ask again", cap(c.slots))
	}
	defer func() {
		if err != nil {
			c.leave()
		}
	}()
	// Each stream is answered for from its own node, which ADS admitted
	// for its own identity: another stream claiming the same id is
	// another proxy.
	var streams []server.StreamStatus
	for _, st := range c.Dump.status.Status() {
		if st.Node != nil && (!identified || nodemeta.Namespace(st.Node) == id.Namespace) {
			streams = append(streams, st)
		}
	}
	if n := len(streams); len(req.NodeMatchers) == 0 && n > limit {
		return nil, nil, status.Errorf(codes.FailedPrecondition,
			"csds: %d proxy streams are connected; name the proxies wanted with node matchers (at most %d are answered for without)", n, limit)
	}
	wanted := func(id string) bool {
		if len(req.NodeMatchers) == 0 {
			return true
		}
		for _, m := range req.NodeMatchers {
			if m.GetNodeId().GetExact() == id {
				return true
			}
		}
		return false
	}
	plan, err := c.plan(streams, wanted)
	if err != nil {
		return nil, nil, err
	}
	return plan.response(), c.leave, nil
}

// csdsPlan is what a CSDS response holds, measured before anything of it
// is built: for each proxy, each type's resources as the proxy holds them.
type csdsPlan []csdsProxy

type csdsProxy struct {
	node  *corev3.Node
	parts []csdsPart
}

type csdsPart struct {
	typeURL, acked string
	held           map[string]*anypb.Any
	client         adminv3.ClientResourceStatus
	config         statusv3.ConfigStatus
}

// plan gathers, for the streams wanted, the resources of each type as
// every response encodes them (the dump marshals nothing of its own), and
// refuses a response past MaxBytes before building any of it.
func (c *CSDS) plan(streams []server.StreamStatus, wanted func(id string) bool) (csdsPlan, error) {
	cch, ps := c.Dump.cache, c.Dump.pusher
	var plan csdsPlan
	size, maxBytes := 0, cmp.Or(c.MaxBytes, csdsMaxBytes)
	for _, st := range streams {
		if !wanted(st.Proxy) {
			continue
		}
		class := ps.Classify(st.Node)
		p := csdsProxy{node: st.Node}
		for _, short := range slices.Sorted(maps.Keys(st.Types)) {
			ts, typeURL := st.Types[short], typeURLs[short]
			held := cch.Encoded(class, typeURL)
			if typeURL == resource.EndpointType {
				held = cch.Encoded(cache.Shared, typeURL)
				named := edsNames(cch, class)
				maps.DeleteFunc(held, func(name string, _ *anypb.Any) bool { return !named.Has(name) })
			}
			clientStatus, configStatus := adminv3.ClientResourceStatus_ACKED, statusv3.ConfigStatus_SYNCED
			switch {
			case ts.LastNACK != nil && ts.LastNACK.Version == ts.Sent:
				clientStatus, configStatus = adminv3.ClientResourceStatus_NACKED, statusv3.ConfigStatus_ERROR
			case ts.Acked != ts.Sent:
				clientStatus, configStatus = adminv3.ClientResourceStatus_REQUESTED, statusv3.ConfigStatus_STALE
			}
			for name, r := range held {
				if size += proto.Size(r) + len(name); size > maxBytes {
					return nil, status.Errorf(codes.ResourceExhausted, "csds: the response would exceed %d MiB; name fewer proxies", maxBytes>>20)
				}
			}
			p.parts = append(p.parts, csdsPart{typeURL: typeURL, acked: ts.Acked, held: held, client: clientStatus, config: configStatus})
		}
		plan = append(plan, p)
	}
	return plan, nil
}

// response builds the response the plan measured.
func (plan csdsPlan) response() *statusv3.ClientStatusResponse {
	resp := &statusv3.ClientStatusResponse{}
	for _, p := range plan {
		cfg := &statusv3.ClientConfig{Node: p.node}
		for _, pt := range p.parts {
			for _, name := range slices.Sorted(maps.Keys(pt.held)) {
				cfg.GenericXdsConfigs = append(cfg.GenericXdsConfigs, &statusv3.ClientConfig_GenericXdsConfig{
					TypeUrl: pt.typeURL, Name: name, VersionInfo: pt.acked, XdsConfig: pt.held[name],
					ConfigStatus: pt.config, ClientStatus: pt.client,
				})
			}
		}
		resp.Config = append(resp.Config, cfg)
	}
	return resp
}

// StreamClientStatus answers every request on the stream.
func (c *CSDS) StreamClientStatus(stream grpc.BidiStreamingServer[statusv3.ClientStatusRequest, statusv3.ClientStatusResponse]) error {
	for {
		req, err := stream.Recv()
		if err != nil {
			return nil
		}
		resp, leave, err := c.answer(stream.Context(), req)
		if err != nil {
			return err
		}
		err = stream.Send(resp) // the slot is held until the response is written
		leave()
		if err != nil {
			return err
		}
	}
}
