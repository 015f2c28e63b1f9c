package generate

import (
	"net/url"
	"slices"
	"strings"
	"time"

	accesslog "github.com/envoyproxy/go-control-plane/envoy/config/accesslog/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	tracecfg "github.com/envoyproxy/go-control-plane/envoy/config/trace/v3"
	fileal "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/file/v3"
	cel "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/filters/cel/v3"
	grpcal "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/grpc/v3"
	otelal "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/open_telemetry/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tcpproxy "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	reqwithoutquery "github.com/envoyproxy/go-control-plane/envoy/extensions/formatter/req_without_query/v3"
	uuid "github.com/envoyproxy/go-control-plane/envoy/extensions/request_id/uuid/v3"
	metadatakind "github.com/envoyproxy/go-control-plane/envoy/type/metadata/v3"
	tracingtag "github.com/envoyproxy/go-control-plane/envoy/type/tracing/v3"
	xdstype "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	otlpcommon "go.opentelemetry.io/proto/otlp/common/v1"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// defaultSampling is istiod's trace sampling where nothing sets one
// (PILOT_TRACE_SAMPLING), in percent.
const defaultSampling = 1.0

// Observability is the access logs and tracing of one class of Envoys,
// for each side of its connections, as its Telemetries and the mesh's
// settings say.
type Observability struct {
	client, server observed
	// listenerLog logs the connections no filter chain takes.
	listenerLog bool
}

type observed struct {
	logs      []*accesslog.AccessLog
	tracing   *hcm.HttpConnectionManager_Tracing
	requestID *hcm.RequestIDExtension
}

// ObservabilityFor returns the access logs and tracing of a class of
// Envoys of a namespace ("" or "~" where the class spans several) whose
// policies are sec; nil where none applies. Collectors are found among
// mesh's services.
func ObservabilityFor(mesh *Mesh, sec Security, namespace string) *Observability {
	tels := sec.telemetries()
	o := &Observability{listenerLog: !mesh.Config.GetNoListenerAccessLog()}
	for _, s := range []struct {
		side meshv1.WorkloadMode
		out  *observed
	}{{meshv1.WorkloadMode_WORKLOAD_MODE_CLIENT, &o.client}, {meshv1.WorkloadMode_WORKLOAD_MODE_SERVER, &o.server}} {
		if providers, ok := logProviders(tels, mesh.Config.GetDefaultAccessLogProviders(), s.side); ok {
			s.out.logs = accessLogs(mesh, providers)
		} else if al := mesh.Config.GetAccessLog(); al != nil {
			s.out.logs = []*accesslog.AccessLog{fileAccessLog(al)}
		}
		if spec, ok := tracing(tels, mesh.Config, s.side); ok && !spec.disabled {
			s.out.tracing = hcmTracing(mesh, spec, namespace)
			if s.out.tracing != nil {
				s.out.requestID = &hcm.RequestIDExtension{TypedConfig: mustAny(&uuid.UuidRequestIdConfig{
					UseRequestIdForTraceSampling: wrapperspb.Bool(spec.useRequest)})}
			}
		}
	}
	if len(o.client.logs)+len(o.server.logs) == 0 && o.client.tracing == nil && o.server.tracing == nil {
		return nil
	}
	return o
}

// accessLogs builds the access logs of the providers on, by provider name;
// a provider that is not known, or whose collector is not a service of
// the mesh, is left out.
func accessLogs(mesh *Mesh, providers map[string]logSpec) []*accesslog.AccessLog {
	var out []*accesslog.AccessLog
	for _, name := range sortedKeys(providers) {
		spec := providers[name]
		p := telemetryProvider(mesh.Config, name)
		if spec.disabled || p == nil {
			continue
		}
		var al *accesslog.AccessLog
		switch k := p.Kind.(type) {
		case *meshv1.TelemetryProvider_FileAccessLog:
			al = fileAccessLog(k.FileAccessLog)
		case *meshv1.TelemetryProvider_OtelAccessLog:
			al = otelAccessLog(mesh, k.OtelAccessLog)
		}
		if al == nil {
			continue
		}
		if spec.filter != "" {
			al.Filter = &accesslog.AccessLogFilter{FilterSpecifier: &accesslog.AccessLogFilter_ExtensionFilter{ExtensionFilter: &accesslog.ExtensionFilter{
				Name:       "envoy.access_loggers.extension_filters.cel",
				ConfigType: &accesslog.ExtensionFilter_TypedConfig{TypedConfig: mustAny(&cel.ExpressionFilter{Expression: spec.filter})},
			}}}
		}
		out = append(out, al)
	}
	return out
}

// fileAccessLog is a file access log, in Istio's text format unless it
// names its own (text, or JSON labels).
func fileAccessLog(f *meshv1.FileAccessLog) *accesslog.AccessLog {
	format := &core.SubstitutionFormatString{OmitEmptyValues: f.OmitEmptyValues}
	var uses string
	if f.Labels != nil {
		format.Format = &core.SubstitutionFormatString_JsonFormat{JsonFormat: f.Labels}
		format.JsonFormatOptions = &core.JsonFormatOptions{}
		for _, v := range f.Labels.GetFields() {
			uses += v.GetStringValue()
		}
	} else {
		text := logText(f.Text)
		format.Format = &core.SubstitutionFormatString_TextFormatSource{TextFormatSource: &core.DataSource{
			Specifier: &core.DataSource_InlineString{InlineString: text}}}
		uses = text
	}
	format.Formatters = formatters(uses)
	return &accesslog.AccessLog{Name: "envoy.access_loggers.file", ConfigType: &accesslog.AccessLog_TypedConfig{TypedConfig: mustAny(&fileal.FileAccessLog{
		Path: f.Path, AccessLogFormat: &fileal.FileAccessLog_LogFormat{LogFormat: format}})}}
}

// logText is a format as Istio writes it: its own where none is given,
// and always ending with a newline.
func logText(text string) string {
	if text == "" {
		return TextLogFormat
	}
	if !strings.HasSuffix(text, "\n") {
		text += "\n"
	}
	return text
}

// formatters are the formatter extensions a format's operators need.
func formatters(format string) []*core.TypedExtensionConfig {
	if !strings.Contains(format, "%REQ_WITHOUT_QUERY") {
		return nil
	}
	return []*core.TypedExtensionConfig{{Name: "envoy.formatter.req_without_query", TypedConfig: mustAny(&reqwithoutquery.ReqWithoutQuery{})}}
}

// collector returns the outbound cluster of a telemetry collector and its
// host, or "" where the mesh has no such service.
func collector(mesh *Mesh, c *meshv1.Collector) (cluster, host string) {
	if mesh.Service(c.GetHost()) == nil {
		return "", ""
	}
	return ClusterName(c.Port, "", c.Host), c.Host
}

// otelAccessLog sends access logs to an OpenTelemetry collector.
func otelAccessLog(mesh *Mesh, p *meshv1.OtelAccessLog) *accesslog.AccessLog {
	cluster, host := collector(mesh, p.Collector)
	if cluster == "" {
		return nil
	}
	name := p.LogName
	if name == "" {
		name = "otel_envoy_accesslog"
	}
	text := p.Text
	if text == "" {
		text = TextLogFormat
	}
	cfg := &otelal.OpenTelemetryAccessLogConfig{
		//lint:ignore SA1019 the field istiod sets
		CommonConfig: &grpcal.CommonGrpcAccessLogConfig{
			LogName:                 name,
			GrpcService:             &core.GrpcService{TargetSpecifier: &core.GrpcService_EnvoyGrpc_{EnvoyGrpc: &core.GrpcService_EnvoyGrpc{ClusterName: cluster, Authority: host}}},
			TransportApiVersion:     core.ApiVersion_V3,
			FilterStateObjectsToLog: []string{"upstream_peer", "downstream_peer", "wasm.upstream_peer", "wasm.upstream_peer_id", "wasm.downstream_peer", "wasm.downstream_peer_id"},
		},
		DisableBuiltinLabels: true,
		Body:                 &otlpcommon.AnyValue{Value: &otlpcommon.AnyValue_StringValue{StringValue: text}},
	}
	uses := text
	if fields := p.Labels.GetFields(); len(fields) > 0 {
		cfg.Attributes = &otlpcommon.KeyValueList{}
		for _, k := range sortedKeys(fields) {
			cfg.Attributes.Values = append(cfg.Attributes.Values, &otlpcommon.KeyValue{Key: k,
				Value: &otlpcommon.AnyValue{Value: &otlpcommon.AnyValue_StringValue{StringValue: fields[k].GetStringValue()}}})
			uses += fields[k].GetStringValue()
		}
	}
	cfg.Formatters = formatters(uses)
	return &accesslog.AccessLog{Name: "envoy.access_loggers.open_telemetry", ConfigType: &accesslog.AccessLog_TypedConfig{TypedConfig: mustAny(cfg)}}
}

// hcmTracing is a connection manager's tracing for a side's spec; nil
// where its provider's collector is not a service of the mesh.
func hcmTracing(mesh *Mesh, spec traceSpec, namespace string) *hcm.HttpConnectionManager_Tracing {
	t := &hcm.HttpConnectionManager_Tracing{}
	var maxTag uint32
	switch k := spec.provider.Kind.(type) {
	case *meshv1.TelemetryProvider_OtelTracing:
		cluster, host := collector(mesh, k.OtelTracing.Collector)
		if cluster == "" {
			return nil
		}
		maxTag = k.OtelTracing.MaxTagLength
		cfg := &tracecfg.OpenTelemetryConfig{}
		if path := k.OtelTracing.HttpPath; path != "" {
			uri, _ := url.JoinPath(host, path)
			timeout := k.OtelTracing.HttpTimeout
			if timeout == nil {
				timeout = durationpb.New(3 * time.Second) // Istio's API's default; Envoy needs one
			}
			cfg.HttpService = &core.HttpService{HttpUri: &core.HttpUri{Uri: uri, HttpUpstreamType: &core.HttpUri_Cluster{Cluster: cluster},
				Timeout: timeout}}
		} else {
			cfg.GrpcService = &core.GrpcService{TargetSpecifier: &core.GrpcService_EnvoyGrpc_{EnvoyGrpc: &core.GrpcService_EnvoyGrpc{ClusterName: cluster, Authority: host}}}
		}
		t.Provider = &tracecfg.Tracing_Http{Name: "envoy.tracers.opentelemetry", ConfigType: &tracecfg.Tracing_Http_TypedConfig{TypedConfig: mustAny(cfg)}}
	case *meshv1.TelemetryProvider_Zipkin:
		z := k.Zipkin
		cluster, host := collector(mesh, z.Collector)
		if cluster == "" {
			return nil
		}
		maxTag = z.MaxTagLength
		path := z.Path
		if path == "" {
			path = "/api/v2/spans"
		}
		t.Provider = &tracecfg.Tracing_Http{Name: "envoy.tracers.zipkin", ConfigType: &tracecfg.Tracing_Http_TypedConfig{TypedConfig: mustAny(&tracecfg.ZipkinConfig{
			CollectorEndpointVersion: tracecfg.ZipkinConfig_HTTP_JSON,
			TraceId_128Bit:           !z.Enable_64BitTraceId,
			SharedSpanContext:        wrapperspb.Bool(false),
			CollectorService: &core.HttpService{HttpUri: &core.HttpUri{Uri: "http://" + host + path,
				HttpUpstreamType: &core.HttpUri_Cluster{Cluster: cluster}, Timeout: durationpb.New(5 * time.Second)}},
		})}}
	default:
		return nil // an access log provider named for tracing
	}
	sampling := defaultSampling
	if spec.sampling != nil {
		sampling = *spec.sampling
	}
	t.ClientSampling, t.OverallSampling, t.RandomSampling = &xdstype.Percent{Value: 100}, &xdstype.Percent{Value: 100}, &xdstype.Percent{Value: sampling}
	if maxTag != 0 {
		t.MaxPathTagLength = wrapperspb.UInt32(maxTag)
	}
	if spec.istioTags {
		t.CustomTags = istioTags(namespace)
	}
	for _, name := range sortedKeys(spec.tags) {
		t.CustomTags = append(t.CustomTags, customTag(name, spec.tags[name]))
	}
	slices.SortStableFunc(t.CustomTags, func(a, b *tracingtag.CustomTag) int { return strings.Compare(a.Tag, b.Tag) })
	return t
}

// istioTags are Istio's tags that a class's proxies share, as istiod sets
// them: the authorization dry run's results, the namespace (a literal,
// or the pod's POD_NAMESPACE for a class of several), and the mesh and
// cluster from the agent's environment (ISTIO_META_MESH_ID,
// ISTIO_META_CLUSTER_ID), which istiod reads from the node those set.
// The canonical service and revision name the workload, not the class,
// and are not sent.
func istioTags(namespace string) []*tracingtag.CustomTag {
	env := func(tag, name, def string) *tracingtag.CustomTag {
		return &tracingtag.CustomTag{Tag: tag, Type: &tracingtag.CustomTag_Environment_{Environment: &tracingtag.CustomTag_Environment{Name: name, DefaultValue: def}}}
	}
	dryRun := func(tag, key string) *tracingtag.CustomTag {
		return &tracingtag.CustomTag{Tag: tag, Type: &tracingtag.CustomTag_Metadata_{Metadata: &tracingtag.CustomTag_Metadata{
			Kind: &metadatakind.MetadataKind{Kind: &metadatakind.MetadataKind_Request_{Request: &metadatakind.MetadataKind_Request{}}},
			MetadataKey: &metadatakind.MetadataKey{Key: "envoy.filters.http.rbac", Path: []*metadatakind.MetadataKey_PathSegment{
				{Segment: &metadatakind.MetadataKey_PathSegment_Key{Key: key}}}},
		}}}
	}
	ns := env("istio.namespace", "POD_NAMESPACE", "default")
	if namespace != "" && namespace != "~" {
		ns = &tracingtag.CustomTag{Tag: "istio.namespace", Type: &tracingtag.CustomTag_Literal_{Literal: &tracingtag.CustomTag_Literal{Value: namespace}}}
	}
	return []*tracingtag.CustomTag{
		dryRun("istio.authorization.dry_run.allow_policy.name", "istio_dry_run_allow_shadow_effective_policy_id"),
		dryRun("istio.authorization.dry_run.allow_policy.result", "istio_dry_run_allow_shadow_engine_result"),
		dryRun("istio.authorization.dry_run.deny_policy.name", "istio_dry_run_deny_shadow_effective_policy_id"),
		dryRun("istio.authorization.dry_run.deny_policy.result", "istio_dry_run_deny_shadow_engine_result"),
		env("istio.cluster_id", "ISTIO_META_CLUSTER_ID", "unknown"),
		env("istio.mesh_id", "ISTIO_META_MESH_ID", "unknown"),
		ns,
	}
}

func customTag(name string, tag *meshv1.TracingTag) *tracingtag.CustomTag {
	out := &tracingtag.CustomTag{Tag: name}
	switch v := tag.Value.(type) {
	case *meshv1.TracingTag_Literal:
		out.Type = &tracingtag.CustomTag_Literal_{Literal: &tracingtag.CustomTag_Literal{Value: v.Literal}}
	case *meshv1.TracingTag_Environment:
		out.Type = &tracingtag.CustomTag_Environment_{Environment: &tracingtag.CustomTag_Environment{Name: v.Environment, DefaultValue: tag.DefaultValue}}
	case *meshv1.TracingTag_Header:
		out.Type = &tracingtag.CustomTag_RequestHeader{RequestHeader: &tracingtag.CustomTag_Header{Name: v.Header, DefaultValue: tag.DefaultValue}}
	}
	return out
}

// Listeners returns a class's listeners with their access logs and
// tracing: a sidecar's inbound listener as the server side, every other
// listener as the client side (a gateway's too). The listeners given are
// not modified.
func (o *Observability) Listeners(in []*listener.Listener, router bool) []*listener.Listener {
	if o == nil {
		return in
	}
	out := make([]*listener.Listener, len(in))
	for i, l := range in {
		side := &o.client
		if !router && l.Name == VirtualInboundListener {
			side = &o.server
		}
		out[i] = side.listener(l, o.listenerLog && (router || l.Name == VirtualInboundListener || l.Name == VirtualOutboundListener))
	}
	return out
}

// listener adds a side's access logs and tracing to a clone of a
// listener's connection managers and TCP proxies, and, with listenerLog,
// logs its connections no chain takes (response flag NR).
func (s *observed) listener(l *listener.Listener, listenerLog bool) *listener.Listener {
	if len(s.logs) == 0 && s.tracing == nil {
		return l
	}
	out := proto.CloneOf(l)
	if listenerLog {
		for _, al := range s.logs {
			nr := &accesslog.AccessLogFilter{FilterSpecifier: &accesslog.AccessLogFilter_ResponseFlagFilter{ResponseFlagFilter: &accesslog.ResponseFlagFilter{Flags: []string{"NR"}}}}
			withNR := proto.CloneOf(al)
			if al.Filter != nil {
				nr = &accesslog.AccessLogFilter{FilterSpecifier: &accesslog.AccessLogFilter_AndFilter{AndFilter: &accesslog.AndFilter{Filters: []*accesslog.AccessLogFilter{nr, al.Filter}}}}
			}
			withNR.Filter = nr
			out.AccessLog = append(out.AccessLog, withNR)
		}
	}
	chains := out.FilterChains
	if out.DefaultFilterChain != nil {
		chains = append(slices.Clone(chains), out.DefaultFilterChain)
	}
	for _, c := range chains {
		if c.Name == virtualInboundChainBlackhole || c.Name == virtualOutboundChainBlackhole {
			continue // a connection to the listener's own port: not traffic, not logged (as istiod's)
		}
		for _, f := range c.Filters {
			s.filter(f)
		}
	}
	return out
}

// filter adds the side's logs (and tracing) to a connection manager or TCP proxy.
func (s *observed) filter(f *listener.Filter) {
	switch f.Name {
	case "envoy.filters.network.http_connection_manager":
		m := &hcm.HttpConnectionManager{}
		if f.GetTypedConfig().UnmarshalTo(m) != nil {
			return
		}
		m.AccessLog = append(m.AccessLog, s.logs...)
		if s.tracing != nil {
			m.Tracing, m.RequestIdExtension = s.tracing, s.requestID
		}
		f.ConfigType = &listener.Filter_TypedConfig{TypedConfig: mustAny(m)}
	case "envoy.filters.network.tcp_proxy":
		if len(s.logs) == 0 {
			return
		}
		t := &tcpproxy.TcpProxy{}
		if f.GetTypedConfig().UnmarshalTo(t) != nil {
			return
		}
		t.AccessLog = append(t.AccessLog, s.logs...)
		f.ConfigType = &listener.Filter_TypedConfig{TypedConfig: mustAny(t)}
	}
}
