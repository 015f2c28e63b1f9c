package istio

import (
	"fmt"
	"maps"
	"slices"
	"strings"

	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"google.golang.org/protobuf/types/known/durationpb"
)

var loadBalancers = map[string]meshv1.LoadBalancer{
	"": meshv1.LoadBalancer_LOAD_BALANCER_UNSPECIFIED, "UNSPECIFIED": meshv1.LoadBalancer_LOAD_BALANCER_UNSPECIFIED,
	"ROUND_ROBIN": meshv1.LoadBalancer_LOAD_BALANCER_ROUND_ROBIN, "LEAST_REQUEST": meshv1.LoadBalancer_LOAD_BALANCER_LEAST_REQUEST,
	"LEAST_CONN": meshv1.LoadBalancer_LOAD_BALANCER_LEAST_REQUEST, "RANDOM": meshv1.LoadBalancer_LOAD_BALANCER_RANDOM,
	"PASSTHROUGH": meshv1.LoadBalancer_LOAD_BALANCER_PASSTHROUGH,
}

func (n *normalizer) loadBalancer(in Input, field string, tp *trafficPolicy) (meshv1.LoadBalancer, bool) {
	if tp == nil || tp.LoadBalancer == nil {
		return meshv1.LoadBalancer_LOAD_BALANCER_UNSPECIFIED, true
	}
	lb, ok := loadBalancers[strings.ToUpper(tp.LoadBalancer.Simple)]
	if !ok {
		n.problem(in, field+".loadBalancer.simple", "unknown load balancer %q", tp.LoadBalancer.Simple)
	}
	return lb, ok
}

func (n *normalizer) destinationRule(in Input, spec *destinationRule) {
	if spec.WorkloadSelector != nil {
		// Applied to every proxy, a rule meant for some workloads would
		// change the traffic of the rest.
		n.unsupported(in, "spec.workloadSelector", "a rule for some workloads only")
		return
	}
	tp := &meshv1.TrafficPolicy{Origin: n.origin(in), Host: n.fqdn(spec.Host, in.Resource.Metadata.Namespace), ExportTo: spec.ExportTo}
	var ok bool
	if tp.LoadBalancer, ok = n.loadBalancer(in, "spec.trafficPolicy", spec.TrafficPolicy); !ok {
		return
	}
	if !n.policyExtras(in, "spec.trafficPolicy", spec.TrafficPolicy, tp) {
		return
	}
	if tp.PortLevelSettings, ok = n.portPolicies(in, "spec.trafficPolicy", spec.TrafficPolicy); !ok {
		return
	}
	for i, s := range spec.Subsets {
		f := fmt.Sprintf("spec.subsets[%d].trafficPolicy", i)
		sub := &meshv1.Subset{Name: s.Name, Labels: s.Labels}
		level := &meshv1.TrafficPolicy{}
		if level.LoadBalancer, ok = n.loadBalancer(in, f, s.TrafficPolicy); !ok || !n.policyExtras(in, f, s.TrafficPolicy, level) {
			return
		}
		sub.LoadBalancer, sub.ConsistentHash, sub.ConnectionPool, sub.OutlierDetection, sub.Tls, sub.LocalityLb =
			level.LoadBalancer, level.ConsistentHash, level.ConnectionPool, level.OutlierDetection, level.Tls, level.LocalityLb
		if sub.PortLevelSettings, ok = n.portPolicies(in, f, s.TrafficPolicy); !ok {
			return
		}
		tp.Subsets = append(tp.Subsets, sub)
	}
	n.emit(in, tp)
}

// portPolicies reads a traffic policy's portLevelSettings.
func (n *normalizer) portPolicies(in Input, f string, tp *trafficPolicy) ([]*meshv1.PortPolicy, bool) {
	if tp == nil {
		return nil, true
	}
	var out []*meshv1.PortPolicy
	seen := map[uint32]bool{}
	for i, ps := range tp.PortLevelSettings {
		pf := fmt.Sprintf("%s.portLevelSettings[%d]", f, i)
		if ps.Port == nil || ps.Port.Number == 0 {
			n.problem(in, pf+".port.number", "a port number is required")
			return nil, false
		}
		if seen[ps.Port.Number] {
			n.problem(in, pf+".port.number", "port %d has settings twice", ps.Port.Number)
			return nil, false
		}
		seen[ps.Port.Number] = true
		level := &meshv1.TrafficPolicy{}
		as := &trafficPolicy{LoadBalancer: ps.LoadBalancer, ConnectionPool: ps.ConnectionPool, OutlierDetection: ps.OutlierDetection, TLS: ps.TLS}
		var ok bool
		if level.LoadBalancer, ok = n.loadBalancer(in, pf, as); !ok || !n.policyExtras(in, pf, as, level) {
			return nil, false
		}
		out = append(out, &meshv1.PortPolicy{Port: ps.Port.Number, LoadBalancer: level.LoadBalancer, ConsistentHash: level.ConsistentHash,
			ConnectionPool: level.ConnectionPool, OutlierDetection: level.OutlierDetection, Tls: level.Tls, LocalityLb: level.LocalityLb})
	}
	return out, true
}

var h2Upgrades = map[string]meshv1.ConnectionPool_H2Upgrade{
	"": meshv1.ConnectionPool_H2_UPGRADE_DEFAULT, "DEFAULT": meshv1.ConnectionPool_H2_UPGRADE_DEFAULT,
	"DO_NOT_UPGRADE": meshv1.ConnectionPool_H2_UPGRADE_DO_NOT_UPGRADE, "UPGRADE": meshv1.ConnectionPool_H2_UPGRADE_UPGRADE,
}

var tlsModes = map[string]meshv1.ClientTLS_Mode{
	"": meshv1.ClientTLS_MODE_UNSPECIFIED, "DISABLE": meshv1.ClientTLS_MODE_DISABLE, "SIMPLE": meshv1.ClientTLS_MODE_SIMPLE,
	"MUTUAL": meshv1.ClientTLS_MODE_MUTUAL, "ISTIO_MUTUAL": meshv1.ClientTLS_MODE_ISTIO_MUTUAL,
}

// localityLb reads a localityLbSetting, refusing what Istio's validation
// refuses: distribute and failover together, shares of a locality that do
// not add up to 100, failover within a region or beyond one.
func (n *normalizer) localityLb(in Input, f string, s *localityLbSetting) (*meshv1.LocalityLb, bool) {
	out := &meshv1.LocalityLb{Disabled: s.Enabled != nil && !*s.Enabled}
	if len(s.Distribute) > 0 && len(s.Failover) > 0 {
		n.problem(in, f, "distribute and failover cannot both be set")
		return nil, false
	}
	from := map[string]bool{}
	for i, d := range s.Distribute {
		df := fmt.Sprintf("%s.distribute[%d]", f, i)
		if !n.localityPattern(in, df+".from", d.From) {
			return nil, false
		}
		if from[d.From] {
			n.problem(in, df+".from", "locality %q is distributed twice", d.From)
			return nil, false
		}
		from[d.From] = true
		var sum uint32
		for _, to := range slices.Sorted(maps.Keys(d.To)) {
			if !n.localityPattern(in, df+".to", to) {
				return nil, false
			}
			if d.To[to] == 0 || d.To[to] > 100 {
				n.problem(in, df+".to["+to+"]", "weight %d is not between 1 and 100", d.To[to])
				return nil, false
			}
			sum += d.To[to]
		}
		if sum != 100 {
			n.problem(in, df+".to", "the weights add up to %d, not 100", sum)
			return nil, false
		}
		out.Distribute = append(out.Distribute, &meshv1.LocalityLb_Distribute{From: d.From, To: d.To})
	}
	for i, fo := range s.Failover {
		ff := fmt.Sprintf("%s.failover[%d]", f, i)
		switch {
		case fo.From == "" || fo.To == "":
			n.problem(in, ff, "from and to are both required")
		case strings.Contains(fo.From, "/") || strings.Contains(fo.To, "/"):
			n.problem(in, ff, "failover is between regions: %q to %q names a zone", fo.From, fo.To)
		case fo.From == fo.To:
			n.problem(in, ff, "failover from region %q to itself", fo.From)
		default:
			out.Failover = append(out.Failover, &meshv1.LocalityLb_Failover{From: fo.From, To: fo.To})
			continue
		}
		return nil, false
	}
	return out, true
}

// localityPattern checks a locality pattern: region, region/zone or
// region/zone/subzone, where "*" may stand for the last part given.
func (n *normalizer) localityPattern(in Input, f, pattern string) bool {
	parts := strings.Split(pattern, "/")
	bad := pattern == "" || len(parts) > 3
	for i, part := range parts {
		if part == "" || (strings.Contains(part, "*") && (part != "*" || i != len(parts)-1)) {
			bad = true
		}
	}
	if bad {
		n.problem(in, f, "%q is not a locality: want region, region/zone or region/zone/subzone, with * only as the last part", pattern)
	}
	return !bad
}

// policyExtras converts a traffic policy's consistent hash, connection
// pool, outlier detection and TLS.
func (n *normalizer) policyExtras(in Input, f string, tp *trafficPolicy, out *meshv1.TrafficPolicy) bool {
	if tp == nil {
		return true
	}
	if lb := tp.LoadBalancer; lb != nil && lb.ConsistentHash != nil {
		ch := lb.ConsistentHash
		out.ConsistentHash = &meshv1.ConsistentHash{MinimumRingSize: ch.MinimumRingSize}
		switch {
		case ch.HTTPHeaderName != "":
			out.ConsistentHash.Key = &meshv1.ConsistentHash_HttpHeaderName{HttpHeaderName: ch.HTTPHeaderName}
		case ch.HTTPCookie != nil:
			out.ConsistentHash.Key = &meshv1.ConsistentHash_HttpCookieName{HttpCookieName: ch.HTTPCookie.Name}
			ttl, ok := n.duration(in, f+".loadBalancer.consistentHash.httpCookie.ttl", ch.HTTPCookie.TTL)
			if !ok {
				return false
			}
			out.ConsistentHash.HttpCookieTtl = ttl
		case ch.UseSourceIP:
			out.ConsistentHash.Key = &meshv1.ConsistentHash_UseSourceIp{UseSourceIp: true}
		case ch.HTTPQueryParameterName != "":
			out.ConsistentHash.Key = &meshv1.ConsistentHash_HttpQueryParameterName{HttpQueryParameterName: ch.HTTPQueryParameterName}
		default:
			n.problem(in, f+".loadBalancer.consistentHash", "one of httpHeaderName, httpCookie, useSourceIp or httpQueryParameterName is required")
			return false
		}
	}
	if lb := tp.LoadBalancer; lb != nil && lb.LocalityLbSetting != nil {
		var ok bool
		if out.LocalityLb, ok = n.localityLb(in, f+".loadBalancer.localityLbSetting", lb.LocalityLbSetting); !ok {
			return false
		}
	}
	var ok bool
	if cp := tp.ConnectionPool; cp != nil {
		if out.ConnectionPool, ok = n.connectionPool(in, f+".connectionPool", cp); !ok {
			return false
		}
	}
	if od := tp.OutlierDetection; od != nil {
		if out.OutlierDetection, ok = n.outlierDetection(in, f+".outlierDetection", od); !ok {
			return false
		}
	}
	if t := tp.TLS; t != nil {
		mode, ok := tlsModes[strings.ToUpper(t.Mode)]
		if !ok {
			n.problem(in, f+".tls.mode", "unknown TLS mode %q: want DISABLE, SIMPLE, MUTUAL or ISTIO_MUTUAL", t.Mode)
			return false
		}
		out.Tls = &meshv1.ClientTLS{Mode: mode, Sni: t.Sni, SubjectAltNames: t.SubjectAltNames, CredentialName: t.CredentialName}
	}
	return true
}

// connectionPool reads a traffic policy's connectionPool (at f).
func (n *normalizer) connectionPool(in Input, f string, cp *connectionPool) (*meshv1.ConnectionPool, bool) {
	out := &meshv1.ConnectionPool{}
	var ok bool
	if t := cp.TCP; t != nil {
		if t.MaxConnections < 0 {
			n.problem(in, f+".tcp.maxConnections", "%d is negative", t.MaxConnections)
			return nil, false
		}
		out.MaxConnections = uint32(t.MaxConnections)
		if !n.durations(in, f+".tcp", durationField{"connectTimeout", t.ConnectTimeout, &out.ConnectTimeout},
			durationField{"maxConnectionDuration", t.MaxConnectionDuration, &out.MaxConnectionDuration}, durationField{"idleTimeout", t.IdleTimeout, &out.IdleTimeout}) {
			return nil, false
		}
	}
	h := cp.HTTP
	if h == nil {
		return out, true
	}
	for _, v := range []struct {
		field string
		value int32
	}{{"http1MaxPendingRequests", h.HTTP1MaxPendingRequests}, {"http2MaxRequests", h.HTTP2MaxRequests},
		{"maxRequestsPerConnection", h.MaxRequestsPerConnection}, {"maxRetries", h.MaxRetries}, {"maxConcurrentStreams", h.MaxConcurrentStreams}} {
		if v.value < 0 {
			n.problem(in, f+".http."+v.field, "%d is negative", v.value)
			return nil, false
		}
	}
	out.MaxPendingRequests, out.MaxRequests = uint32(h.HTTP1MaxPendingRequests), uint32(h.HTTP2MaxRequests)
	out.MaxRequestsPerConnection, out.MaxRetries = uint32(h.MaxRequestsPerConnection), uint32(h.MaxRetries)
	out.MaxConcurrentStreams, out.UseClientProtocol = uint32(h.MaxConcurrentStreams), h.UseClientProtocol
	if out.H2UpgradePolicy, ok = h2Upgrades[strings.ToUpper(h.H2UpgradePolicy)]; !ok {
		n.problem(in, f+".http.h2UpgradePolicy", "unknown policy %q: want DEFAULT, DO_NOT_UPGRADE or UPGRADE", h.H2UpgradePolicy)
		return nil, false
	}
	// The HTTP idle timeout wins over the TCP one, as in Istio.
	if h.IdleTimeout != "" {
		if out.IdleTimeout, ok = n.duration(in, f+".http.idleTimeout", h.IdleTimeout); !ok {
			return nil, false
		}
	}
	return out, true
}

// durationField is a duration field of an input (field, under some path),
// its value and where it goes.
type durationField struct {
	field, value string
	into         **durationpb.Duration
}

// durations reads duration fields under f, each into its place, and
// reports whether all were durations (the first that is not is a problem).
func (n *normalizer) durations(in Input, f string, ds ...durationField) bool {
	for _, d := range ds {
		var ok bool
		if *d.into, ok = n.duration(in, f+"."+d.field, d.value); !ok {
			return false
		}
	}
	return true
}

// outlierDetection reads a traffic policy's outlierDetection (at f).
func (n *normalizer) outlierDetection(in Input, f string, od *outlierDetection) (*meshv1.OutlierDetection, bool) {
	for _, p := range []struct {
		field string
		value int32
	}{{"maxEjectionPercent", od.MaxEjectionPercent}, {"minHealthPercent", od.MinHealthPercent}} {
		if p.value < 0 || p.value > 100 {
			n.problem(in, f+"."+p.field, "%d is not a percentage", p.value)
			return nil, false
		}
	}
	out := &meshv1.OutlierDetection{
		Consecutive_5XxErrors: od.Consecutive5xxErrors, ConsecutiveGatewayErrors: od.ConsecutiveGatewayErrors,
		MaxEjectionPercent: uint32(od.MaxEjectionPercent), MinHealthPercent: uint32(od.MinHealthPercent),
		SplitExternalLocalOriginErrors: od.SplitExternalLocalOriginErrors, ConsecutiveLocalOriginFailures: od.ConsecutiveLocalOriginFailures,
	}
	ok := n.durations(in, f, durationField{"interval", od.Interval, &out.Interval}, durationField{"baseEjectionTime", od.BaseEjectionTime, &out.BaseEjectionTime})
	return out, ok
}
