// Package istiod compares what istiod and shardpilot send one proxy for the
// same input, fact by fact: the differential suite behind make diff-istiod.
// Facts are the leaves of each resource as JSON, with lists of named
// things keyed by name (virtual hosts, filters, weighted clusters; a
// virtual host's routes also in their order, one fact), filter chains
// keyed by what they match, lists
// of endpoints keyed by address, lists of plain values compared as sets,
// and what is Istio's own telemetry left out.
package istiod

import (
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	// The extensions both control planes send, so that their settings
	// are compared field by field.
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/cors/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/fault/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/grpc_stats/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rbac/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/listener/http_inspector/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/listener/original_dst/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/listener/tls_inspector/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/rbac/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/network/dns_resolver/cares/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/retry/host/previous_hosts/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/retry/priority/previous_priorities/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/raw_buffer/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/emptypb"
)

// lenient resolves the types this program knows and stands an empty
// message in for the rest (Istio's own extensions), so that they show as
// their type alone.
type lenient struct{}

func (lenient) FindMessageByURL(url string) (protoreflect.MessageType, error) {
	if t, err := protoregistry.GlobalTypes.FindMessageByURL(url); err == nil {
		return t, nil
	}
	return (&emptypb.Empty{}).ProtoReflect().Type(), nil
}

func (lenient) FindMessageByName(name protoreflect.FullName) (protoreflect.MessageType, error) {
	return protoregistry.GlobalTypes.FindMessageByName(name)
}

func (lenient) FindExtensionByName(field protoreflect.FullName) (protoreflect.ExtensionType, error) {
	return protoregistry.GlobalTypes.FindExtensionByName(field)
}

func (lenient) FindExtensionByNumber(message protoreflect.FullName, field protoreflect.FieldNumber) (protoreflect.ExtensionType, error) {
	return protoregistry.GlobalTypes.FindExtensionByNumber(message, field)
}

// Facts are path → value; a path names the resource first.
type Facts map[string]string

// telemetry are the fields that carry Istio's telemetry or stats names, not
// traffic behaviour, left out of every comparison.
var telemetry = map[string]bool{
	"metadata": true, "alt_stat_name": true, "stat_prefix": true, "access_log": true, "tracing": true,
	"request_id_extension": true, "filter_metadata": true, "typed_filter_metadata": true, "stats_matcher": true,
	"track_cluster_stats": true, "stat_name": true, "shadow_rules_stat_prefix": true,
}

// telemetryFilters are the filters of Istio's Envoy build and its stats.
func telemetryFilter(name string) bool {
	return strings.HasPrefix(name, "istio.") || name == "envoy.filters.http.grpc_stats" ||
		strings.HasPrefix(name, "envoy.filters.network.metadata_exchange") || name == "envoy.filters.network.peer_metadata" ||
		name == "envoy.filters.http.peer_metadata"
}

// Of returns the facts of a resource, under prefix.
func Of(prefix string, m proto.Message) (Facts, error) { return of(prefix, m, false) }

// WithLogs returns the facts of a resource, under prefix, with its access
// logs and tracing (the Telemetry API's), which Of leaves out.
func WithLogs(prefix string, m proto.Message) (Facts, error) { return of(prefix, m, true) }

// observed are the telemetry fields WithLogs keeps.
var observed = map[string]bool{"access_log": true, "tracing": true, "request_id_extension": true}

func of(prefix string, m proto.Message, logs bool) (Facts, error) {
	b, err := protojson.MarshalOptions{UseProtoNames: true, Resolver: lenient{}}.Marshal(m)
	if err != nil {
		return nil, err
	}
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		return nil, err
	}
	out := Facts{}
	walk(out, prefix, v, logs)
	return out, nil
}

func walk(out Facts, path string, v any, logs bool) {
	switch x := v.(type) {
	case map[string]any:
		if name, ok := x["name"].(string); ok && telemetryFilter(name) {
			return
		}
		for _, k := range slices.Sorted(maps.Keys(x)) {
			if k == "filter_disabled" {
				// Where a listener filter is off, as the ports it names:
				// one range or several are the same to Envoy.
				out[path+".filter_disabled.ports"] = predicatePorts(x[k])
				continue
			}
			if k == "metadata" {
				// Of metadata, only what Envoy matches transport sockets on
				// changes traffic.
				fm, _ := x[k].(map[string]any)["filter_metadata"].(map[string]any)
				if m, ok := fm["envoy.transport_socket_match"]; ok {
					walk(out, path+".metadata.transport_socket_match", m, logs)
				}
				continue
			}
			if telemetry[k] && !(logs && observed[k]) {
				continue
			}
			walk(out, path+"."+k, x[k], logs)
		}
	case []any:
		if len(x) == 0 {
			return
		}
		if !isObjectList(x) {
			// Plain values: compared as a set.
			for _, e := range x {
				out[path+"[]="+scalar(e)] = "present"
			}
			return
		}
		// Elements of one key (routes of one rule's several matches)
		// are told apart by their turn.
		seen := map[string]int{}
		var order []string
		for i, e := range x {
			k := key(e, i)
			if seen[k]++; seen[k] > 1 {
				k += fmt.Sprintf(" #%d", seen[k])
			}
			order = append(order, k)
			walk(out, path+"["+k+"]", e, logs)
		}
		if strings.HasSuffix(path, ".routes") {
			// Envoy takes a virtual host's first route that matches:
			// their order is one fact.
			out[path+".order"] = strings.Join(order, ", ")
		}
	default:
		out[path] = scalar(v)
	}
}

func isObjectList(x []any) bool {
	for _, e := range x {
		if _, ok := e.(map[string]any); ok {
			return true
		}
	}
	return false
}

// key names a list element: by its name, its endpoint's address, or else
// its place in the list.
func key(e any, i int) string {
	m, ok := e.(map[string]any)
	if !ok {
		return fmt.Sprint(i)
	}
	if match, ok := m["filter_chain_match"].(map[string]any); ok {
		// Envoy tells filter chains apart by what they match; istiod
		// names several alike.
		return "match " + chainMatch(match)
	}
	if tag, ok := m["tag"].(string); ok && tag != "" {
		return "tag " + tag // a tracing tag
	}
	if name, ok := m["name"].(string); ok && name != "" {
		return name
	}
	if addr := endpointAddress(m); addr != "" {
		return addr
	}
	if loc, ok := m["locality"].(map[string]any); ok {
		return fmt.Sprintf("locality %v/%v/%v", loc["region"], loc["zone"], loc["sub_zone"])
	}
	return fmt.Sprint(i)
}

// predicatePorts writes a listener filter predicate of destination port
// ranges (one, any of several, or not those) as its ports, sorted: "9080
// 15006", "not 9080".
func predicatePorts(v any) string {
	m, _ := v.(map[string]any)
	var ports []int
	var ranges func(m map[string]any) bool
	ranges = func(m map[string]any) bool {
		if r, ok := m["destination_port_range"].(map[string]any); ok {
			start, _ := r["start"].(float64)
			end, _ := r["end"].(float64)
			for p := int(start); p < int(end); p++ {
				ports = append(ports, p)
			}
			return true
		}
		if or, ok := m["or_match"].(map[string]any); ok {
			rules, _ := or["rules"].([]any)
			for _, r := range rules {
				if rm, _ := r.(map[string]any); rm == nil || !ranges(rm) {
					return false
				}
			}
			return true
		}
		return false
	}
	prefix := ""
	if not, ok := m["not_match"].(map[string]any); ok {
		prefix, m = "not ", not
	}
	if !ranges(m) {
		b, _ := json.Marshal(v)
		return string(b)
	}
	slices.Sort(ports)
	return prefix + strings.Trim(fmt.Sprint(ports), "[]")
}

// chainMatch writes a filter chain's match with its lists sorted.
func chainMatch(match map[string]any) string {
	sorted := map[string]any{}
	for k, v := range match {
		if list, ok := v.([]any); ok {
			s := make([]string, 0, len(list))
			for _, e := range list {
				s = append(s, scalar(e))
			}
			slices.Sort(s)
			v = s
		}
		sorted[k] = v
	}
	b, _ := json.Marshal(sorted)
	return string(b)
}

func endpointAddress(m map[string]any) string {
	ep, _ := m["endpoint"].(map[string]any)
	addr, _ := ep["address"].(map[string]any)
	sa, _ := addr["socket_address"].(map[string]any)
	if sa == nil {
		return ""
	}
	return fmt.Sprintf("%v:%v", sa["address"], sa["port_value"])
}

func scalar(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case nil:
		return "null"
	default:
		b, _ := json.Marshal(x)
		return string(b)
	}
}

// Lines are the facts as "path: value" lines, sorted by path.
func (f Facts) Lines() []byte {
	var b strings.Builder
	for _, p := range slices.Sorted(maps.Keys(f)) {
		b.WriteString(p + ": " + f[p] + "\n")
	}
	return []byte(b.String())
}

// Comparison is how two sets of facts compare.
type Comparison struct {
	// Compared counts the facts either side has; Equal those both have
	// with the same value.
	Compared, Equal int
	// Differences are the facts that are not equal, as "path: istiod's
	// value | shardpilot's value" ("-" for none).
	Differences []string
}

// Compare compares istiod's facts with shardpilot's.
func Compare(istiod, ours Facts) Comparison {
	var c Comparison
	paths := map[string]bool{}
	for p := range istiod {
		paths[p] = true
	}
	for p := range ours {
		paths[p] = true
	}
	for _, p := range slices.Sorted(maps.Keys(paths)) {
		c.Compared++
		a, inA := istiod[p]
		b, inB := ours[p]
		if inA && inB && a == b {
			c.Equal++
			continue
		}
		c.Differences = append(c.Differences, fmt.Sprintf("%s: %s | %s", p, cmp.Or(a, "-"), cmp.Or(b, "-")))
	}
	return c
}

// Percent is the share of equal facts.
func (c Comparison) Percent() float64 {
	if c.Compared == 0 {
		return 100
	}
	return 100 * float64(c.Equal) / float64(c.Compared)
}
