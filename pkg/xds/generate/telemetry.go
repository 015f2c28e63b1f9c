package generate

import (
	"cmp"
	"slices"
	"strings"

	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
)

// TextLogFormat is Istio's access log format (Istio 1.9 on), used where a
// provider names none.
const TextLogFormat = "[%START_TIME%] \"%REQ(:METHOD)% %REQ(X-ENVOY-ORIGINAL-PATH?:PATH)% " +
	"%PROTOCOL%\" %RESPONSE_CODE% %RESPONSE_FLAGS% " +
	"%RESPONSE_CODE_DETAILS% %CONNECTION_TERMINATION_DETAILS% " +
	"\"%UPSTREAM_TRANSPORT_FAILURE_REASON%\" %BYTES_RECEIVED% %BYTES_SENT% " +
	"%DURATION% %RESP(X-ENVOY-UPSTREAM-SERVICE-TIME)% \"%REQ(X-FORWARDED-FOR)%\" " +
	"\"%REQ(USER-AGENT)%\" \"%REQ(X-REQUEST-ID)%\" \"%REQ(:AUTHORITY)%\" \"%UPSTREAM_HOST%\" " +
	"%UPSTREAM_CLUSTER_RAW% %UPSTREAM_LOCAL_ADDRESS% %DOWNSTREAM_LOCAL_ADDRESS% " +
	"%DOWNSTREAM_REMOTE_ADDRESS% %REQUESTED_SERVER_NAME% %ROUTE_NAME%\n"

// BuiltinAccessLog is Istio's built-in provider, a file access log to
// /dev/stdout, unless the mesh's settings name their own "envoy".
const BuiltinAccessLog = "envoy"

// telemetries returns the Telemetries of a class in the order they
// apply: the root namespace's without selector, the namespace's without
// selector (the first of each by name, as one is expected), then those
// that select the class's workloads, by name.
func (s Security) telemetries() []*meshv1.Telemetry {
	var root, ns, selected []*Policy
	for _, p := range s {
		t, ok := p.Spec.(*meshv1.Telemetry)
		switch {
		case !ok:
		case len(t.Selector) > 0:
			selected = append(selected, p)
		case p.Root:
			root = append(root, p)
		default:
			ns = append(ns, p)
		}
	}
	byName := func(a, b *Policy) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	}
	var out []*meshv1.Telemetry
	for _, list := range [][]*Policy{root, ns} {
		if len(list) > 0 {
			out = append(out, slices.MinFunc(list, byName).Spec.(*meshv1.Telemetry))
		}
	}
	slices.SortFunc(selected, byName)
	for _, p := range selected {
		out = append(out, p.Spec.(*meshv1.Telemetry))
	}
	return out
}

func modeMatches(m, side meshv1.WorkloadMode) bool {
	return m == meshv1.WorkloadMode_WORKLOAD_MODE_CLIENT_AND_SERVER || m == side
}

// logSpec is what one provider logs: off, or with a CEL filter.
type logSpec struct {
	disabled bool
	filter   string
}

// logProviders merges the access logging of a class's Telemetries for one
// side, as istiod does: the providers the most specific Telemetry names
// (else the mesh's defaults), each off or with the filter the last one
// says. ok is false where no Telemetry and no default provider speaks
// (MeshConfig's accessLogFile applies then).
func logProviders(tels []*meshv1.Telemetry, defaults []string, side meshv1.WorkloadMode) (map[string]logSpec, bool) {
	var logs [][]*meshv1.AccessLogging
	for _, t := range tels {
		if len(t.AccessLogging) > 0 {
			logs = append(logs, t.AccessLogging)
		}
	}
	if len(logs) == 0 && len(defaults) == 0 {
		return nil, false
	}
	out := map[string]logSpec{}
	if len(logs) == 0 {
		for _, d := range defaults {
			out[d] = logSpec{}
		}
		return out, true
	}
	names, filters := defaults, map[string]logSpec{}
	for _, entry := range logs {
		var named []string
		for _, l := range entry {
			if !modeMatches(l.Mode, side) {
				continue
			}
			for _, p := range l.Providers {
				if !slices.Contains(named, p) {
					named = append(named, p)
				}
				filters[p] = logSpec{filter: l.Filter}
			}
		}
		if len(named) > 0 {
			names = named
		}
	}
	parent := defaults
	for _, entry := range logs {
		for _, l := range entry {
			providers := l.Providers
			if len(providers) == 0 {
				providers = parent
			}
			parent = providers
			for _, p := range providers {
				if !slices.Contains(names, p) || !modeMatches(l.Mode, side) {
					continue
				}
				if l.Disabled {
					out[p] = logSpec{disabled: true}
					continue
				}
				out[p] = filters[p]
			}
		}
	}
	return out, true
}

// traceSpec is the tracing of one side of a class.
type traceSpec struct {
	provider   *meshv1.TelemetryProvider
	disabled   bool
	sampling   *float64
	tags       map[string]*meshv1.TracingTag
	useRequest bool
	istioTags  bool
}

// tracing merges the tracing of a class's Telemetries for one side, as
// istiod does: the first provider named last (else the mesh's first
// default), and each setting as the last Telemetry that sets it. ok is
// false where neither a Telemetry nor a default provider speaks.
func tracing(tels []*meshv1.Telemetry, cfg *meshv1.MeshConfig, side meshv1.WorkloadMode) (traceSpec, bool) {
	defaults := cfg.GetDefaultTracingProviders()
	var list []*meshv1.Tracing
	for _, t := range tels {
		list = append(list, t.Tracing...)
	}
	if len(list) == 0 && len(defaults) == 0 {
		return traceSpec{}, false
	}
	spec := traceSpec{useRequest: true, istioTags: true}
	if len(defaults) > 0 {
		spec.provider = telemetryProvider(cfg, defaults[0])
	}
	for _, t := range list {
		if !modeMatches(t.Mode, side) {
			continue
		}
		if len(t.Providers) > 0 {
			spec.provider = telemetryProvider(cfg, t.Providers[0])
		}
		if t.DisableSpanReporting != nil {
			spec.disabled = *t.DisableSpanReporting
		}
		if t.CustomTags != nil {
			spec.tags = t.CustomTags
		}
		if t.RandomSamplingPercentage != nil {
			spec.sampling = t.RandomSamplingPercentage
		}
		if t.UseRequestIdForTraceSampling != nil {
			spec.useRequest = *t.UseRequestIdForTraceSampling
		}
		if t.EnableIstioTags != nil {
			spec.istioTags = *t.EnableIstioTags
		}
	}
	if spec.provider == nil {
		spec.disabled = true
	}
	return spec, true
}

// telemetryProvider returns the mesh's provider of a name (case aside),
// Istio's built-in "envoy" file access log unless the mesh has its own,
// or nil.
func telemetryProvider(cfg *meshv1.MeshConfig, name string) *meshv1.TelemetryProvider {
	for _, p := range cfg.GetTelemetryProviders() {
		if strings.EqualFold(p.Name, name) {
			return p
		}
	}
	if strings.EqualFold(name, BuiltinAccessLog) {
		return &meshv1.TelemetryProvider{Name: BuiltinAccessLog, Kind: &meshv1.TelemetryProvider_FileAccessLog{FileAccessLog: &meshv1.FileAccessLog{Path: "/dev/stdout"}}}
	}
	return nil
}
