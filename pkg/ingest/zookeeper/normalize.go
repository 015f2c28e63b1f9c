package zookeeper

import (
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/ingest"
	"github.com/shardpilot/shardpilot/pkg/model"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Naming turns registry names into the mesh's.
type Naming struct {
	// HostTemplate makes a service's hostname from {service}, {namespace}
	// and {domain}. Default "{service}.{namespace}.svc.{domain}".
	HostTemplate string
	// Namespace is the namespace of a service whose providers name none.
	// Default "default".
	Namespace string
	// DomainSuffix is {domain}. Default "cluster.local".
	DomainSuffix string
	// Shard names the endpoint shard (the ensemble).
	Shard string
}

func (n *Naming) defaults() error {
	if n.HostTemplate == "" {
		n.HostTemplate = "{service}.{namespace}.svc.{domain}"
	}
	if !strings.Contains(n.HostTemplate, "{service}") {
		return fmt.Errorf("zookeeper: host template %q: it must contain {service}", n.HostTemplate)
	}
	if n.Namespace == "" {
		n.Namespace = "default"
	}
	if !validNamespace(n.Namespace) {
		return fmt.Errorf("zookeeper: namespace %q is not a DNS label", n.Namespace)
	}
	if n.DomainSuffix == "" {
		n.DomainSuffix = "cluster.local"
	}
	return nil
}

func (n *Naming) host(service, namespace string) (string, error) {
	h := strings.NewReplacer("{service}", service, "{namespace}", namespace, "{domain}", n.DomainSuffix).Replace(n.HostTemplate)
	if !model.ValidHostname(h) {
		return "", fmt.Errorf("hostname %q (from the template %q) is not a DNS name", h, n.HostTemplate)
	}
	return h, nil
}

func validNamespace(ns string) bool {
	return len(ns) <= 63 && !strings.Contains(ns, ".") && model.ValidHostname(ns)
}

// protocols are the Dubbo protocols served, with the mesh protocol each is.
var protocols = map[string]meshv1.Protocol{
	"tri":    meshv1.Protocol_PROTOCOL_GRPC,
	"triple": meshv1.Protocol_PROTOCOL_GRPC,
	"grpc":   meshv1.Protocol_PROTOCOL_GRPC,
	"dubbo":  meshv1.Protocol_PROTOCOL_TCP,
	"http":   meshv1.Protocol_PROTOCOL_HTTP,
	"rest":   meshv1.Protocol_PROTOCOL_HTTP,
}

// portName is the service port name of a protocol: one name per mesh
// protocol, whatever Dubbo calls it.
func portName(p meshv1.Protocol) string {
	switch p {
	case meshv1.Protocol_PROTOCOL_GRPC:
		return "grpc"
	case meshv1.Protocol_PROTOCOL_HTTP:
		return "http"
	case meshv1.Protocol_PROTOCOL_HTTPS:
		return "https"
	}
	return "tcp"
}

// labelParams are the provider URL parameters that become endpoint labels,
// under the label each becomes.
var labelParams = [][2]string{
	{"version", "version"}, {"group", "group"}, {"application", "application"}, {"application", "app"},
	{"dubbo.tag", "dubbo.tag"}, {"revision", "revision"},
}

// instance is one provider or Curator instance, read.
type instance struct {
	node      string // its path, for problems
	namespace string
	protocol  meshv1.Protocol
	address   string
	port      uint32
	ep        *meshv1.Endpoint
}

// parseProvider reads a Dubbo provider node: its name is a URL-encoded
// provider URL, protocol://host:port/interface?params.
func parseProvider(iface, name string, n *Naming) (instance, error) {
	raw, err := url.QueryUnescape(name)
	if err != nil {
		return instance{}, fmt.Errorf("undecodable provider URL: %v", err)
	}
	u, err := url.Parse(raw)
	if err != nil {
		return instance{}, fmt.Errorf("undecodable provider URL: %v", err)
	}
	proto, ok := protocols[strings.ToLower(u.Scheme)]
	if !ok {
		return instance{}, fmt.Errorf("protocol %q: want tri, grpc, dubbo, http or rest", u.Scheme)
	}
	q := u.Query()
	if side := q.Get("side"); side != "" && side != "provider" {
		return instance{}, fmt.Errorf("side=%s under providers: a consumer registered as a provider", side)
	}
	if in := q.Get("interface"); in != "" && in != iface {
		return instance{}, fmt.Errorf("interface %q registered under the providers of %q", in, iface)
	}
	addr, err := address(u.Hostname())
	if err != nil {
		return instance{}, err
	}
	port, err := portNumber(u.Port())
	if err != nil {
		return instance{}, err
	}
	ns := q.Get("namespace")
	if ns == "" {
		ns = n.Namespace
	} else if !validNamespace(ns) {
		return instance{}, fmt.Errorf("namespace=%s is not a DNS label", ns)
	}
	ep := &meshv1.Endpoint{Address: addr, Ports: map[string]uint32{portName(proto): port}, Health: meshv1.Health_HEALTH_HEALTHY}
	for _, lp := range labelParams {
		if v := q.Get(lp[0]); v != "" {
			if ep.Labels == nil {
				ep.Labels = map[string]string{}
			}
			ep.Labels[lp[1]] = v
		}
	}
	if q.Get("enabled") == "false" || q.Get("disabled") == "true" {
		ep.Health = meshv1.Health_HEALTH_UNHEALTHY
	}
	if w := q.Get("weight"); w != "" {
		v, err := strconv.ParseUint(w, 10, 32)
		if err != nil {
			return instance{}, fmt.Errorf("weight=%s is not a whole number", w)
		}
		ep.Weight = uint32(v)
		if v == 0 {
			// Dubbo's weight 0 takes no traffic; the mesh's 0 means 1.
			ep.Health = meshv1.Health_HEALTH_UNHEALTHY
		}
	}
	return instance{namespace: ns, protocol: proto, address: addr, port: port, ep: ep}, nil
}

func address(host string) (string, error) {
	if host == "" {
		return "", fmt.Errorf("no host")
	}
	if a, err := netip.ParseAddr(host); err == nil {
		return a.String(), nil
	}
	if !model.ValidHostname(strings.ToLower(host)) {
		return "", fmt.Errorf("host %q is neither an IP address nor a DNS name", host)
	}
	return strings.ToLower(host), nil
}

func portNumber(s string) (uint32, error) {
	if s == "" {
		return 0, fmt.Errorf("no port")
	}
	p, err := strconv.Atoi(s)
	if err != nil || p < 1 || p > 65535 {
		return 0, fmt.Errorf("port %s is out of range (1-65535)", s)
	}
	return uint32(p), nil
}

// curatorInstance is what Curator's service discovery stores per instance
// (Spring Cloud ZooKeeper's payload carries the metadata).
type curatorInstance struct {
	Name    string `json:"name"`
	ID      string `json:"id"`
	Address string `json:"address"`
	Port    *int   `json:"port"`
	SSLPort *int   `json:"sslPort"`
	Payload struct {
		Metadata map[string]string `json:"metadata"`
	} `json:"payload"`
}

// parseCurator reads a Curator instance node's data.
func parseCurator(data []byte, n *Naming) (instance, error) {
	var ci curatorInstance
	if err := json.Unmarshal(data, &ci); err != nil {
		return instance{}, fmt.Errorf("undecodable instance: %v", err)
	}
	addr, err := address(ci.Address)
	if err != nil {
		return instance{}, fmt.Errorf("address: %v", err)
	}
	proto, port := meshv1.Protocol_PROTOCOL_HTTP, ci.Port
	if port == nil {
		proto, port = meshv1.Protocol_PROTOCOL_HTTPS, ci.SSLPort
	}
	if port == nil {
		return instance{}, fmt.Errorf("neither port nor sslPort")
	}
	p, err := portNumber(strconv.Itoa(*port))
	if err != nil {
		return instance{}, err
	}
	md := ci.Payload.Metadata
	ns := md["namespace"]
	if ns == "" {
		ns = n.Namespace
	} else if !validNamespace(ns) {
		return instance{}, fmt.Errorf("metadata namespace %q is not a DNS label", ns)
	}
	ep := &meshv1.Endpoint{Address: addr, Ports: map[string]uint32{portName(proto): p}, Health: meshv1.Health_HEALTH_HEALTHY}
	for k, v := range md {
		if k != "namespace" && v != "" {
			if ep.Labels == nil {
				ep.Labels = map[string]string{}
			}
			ep.Labels[k] = v
		}
	}
	if s := md["instance_status"]; s != "" && !strings.EqualFold(s, "UP") {
		ep.Health = meshv1.Health_HEALTH_UNHEALTHY
	}
	return instance{namespace: ns, protocol: proto, address: addr, port: p, ep: ep}, nil
}

// unit is what one interface or Curator service holds: its instances
// read, and a problem for each node that could not be.
type unit struct {
	// service is its name in the mesh ({service}): the interface
	// lowercased, or the Curator service name.
	service string
	// kind is "dubbo" or "curator"; location is where it is, for problems
	// and sync scopes.
	kind, location string
	instances      []instance
	problems       []ingest.Problem
}

// normalize turns a unit into a Service and its Endpoints per namespace.
// last returns the port a service has in the store (0: none).
func (u *unit) normalize(n *Naming, now time.Time, last func(model.Key) uint32) ([]ingest.Object, []ingest.Problem) {
	problems := slices.Clone(u.problems)
	byNS := map[string][]instance{}
	for _, in := range u.instances {
		byNS[in.namespace] = append(byNS[in.namespace], in)
	}
	var objs []ingest.Object
	for _, ns := range slices.Sorted(maps.Keys(byNS)) {
		ins := byNS[ns]
		host, err := n.host(u.service, ns)
		if err != nil {
			problems = append(problems, ingest.Problem{Location: u.location, Resource: u.resource(), Reason: err.Error()})
			continue
		}
		// The protocol most instances speak, then the port most listen on.
		proto := mostCommon(ins, func(in instance) meshv1.Protocol { return in.protocol })
		var served []instance
		for _, in := range ins {
			if in.protocol != proto {
				problems = append(problems, ingest.Problem{Location: in.node, Resource: u.resource(),
					Reason: fmt.Sprintf("speaks %s while most instances of %s speak %s: one service port cannot reach both", protoName(in.protocol), u.service, protoName(proto))})
				continue
			}
			served = append(served, in)
		}
		// A service keeps its port while a provider still listens on it:
		// clients address host:port, and a provider joining on another
		// port (one of several on a host) must not move them.
		name := u.kind + "-" + u.service + "@" + n.Shard
		key := model.Key{Kind: model.KindService, Namespace: ns, Name: name}
		port := mostCommon(served, func(in instance) uint32 { return in.port })
		if had := last(key); had != 0 && slices.ContainsFunc(served, func(in instance) bool { return in.port == had }) {
			port = had
		}
		origin := func() *meshv1.Origin {
			return &meshv1.Origin{ObservedAt: timestamppb.New(now), Location: u.location}
		}
		svc := &meshv1.Service{Origin: origin(), Hostnames: []string{host}, Resolution: meshv1.Resolution_RESOLUTION_STATIC,
			Ports: []*meshv1.Port{{Name: portName(proto), Number: port, Protocol: proto}}}
		eps := &meshv1.Endpoints{Origin: origin(), Service: name, Shard: n.Shard}
		seen := map[string]string{}
		for _, in := range served {
			id := model.EndpointID(in.ep)
			if first, dup := seen[id]; dup {
				problems = append(problems, ingest.Problem{Location: in.node, Resource: u.resource(),
					Reason: fmt.Sprintf("%s:%d is registered twice (also %s)", in.address, in.port, first)})
				continue
			}
			seen[id] = in.node
			eps.Endpoints = append(eps.Endpoints, in.ep)
		}
		objs = append(objs,
			ingest.Object{Key: key, Object: svc, Resource: u.resource()},
			ingest.Object{Key: model.Key{Kind: model.KindEndpoints, Namespace: ns, Name: model.EndpointsName(name, n.Shard)}, Object: eps, Resource: u.resource()})
	}
	return objs, problems
}

func (u *unit) resource() string {
	if u.kind == "dubbo" {
		return "Dubbo interface " + u.service
	}
	return "Curator service " + u.service
}

func protoName(p meshv1.Protocol) string {
	return strings.ToLower(strings.TrimPrefix(p.String(), "PROTOCOL_"))
}

// mostCommon returns the value most instances have; ties go to the least.
func mostCommon[T cmp.Ordered](ins []instance, f func(instance) T) T {
	counts := map[T]int{}
	for _, in := range ins {
		counts[f(in)]++
	}
	var best T
	n := 0
	for _, v := range slices.Sorted(maps.Keys(counts)) {
		if counts[v] > n {
			best, n = v, counts[v]
		}
	}
	return best
}
