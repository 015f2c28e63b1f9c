package istio

import (
	"fmt"
	"strings"

	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"
	istiomesh "istio.io/api/mesh/v1alpha1"
)

// telemetryFields are the MeshConfig fields of access logging and tracing
// that the pushers act on; ingressFields, those of Kubernetes Ingress,
// which the Kubernetes source acts on.
var (
	telemetryFields = []string{"extensionProviders", "defaultProviders", "accessLogFile", "accessLogFormat", "accessLogEncoding",
		"disableEnvoyListenerLog"}
	ingressFields = []string{"ingressClass", "ingressControllerMode", "ingressSelector", "ingressService"}
)

// telemetrySettings reads the access log and tracing settings of
// MeshConfig into out: the providers (those shardpilot does not send are
// warned of, by field), the default ones, and accessLogFile.
func (n *normalizer) telemetrySettings(in Input, f string, pb *istiomesh.MeshConfig, out *meshv1.MeshConfig) bool {
	for i, p := range pb.ExtensionProviders {
		pf := fmt.Sprintf("%s.extensionProviders[%d]", f, i)
		if p.Name == "" {
			n.problem(in, pf+".name", "a provider needs a name")
			return false
		}
		tp, ok := n.telemetryProvider(in, pf, p)
		if !ok {
			return false
		}
		if tp != nil {
			out.TelemetryProviders = append(out.TelemetryProviders, tp)
		}
	}
	if d := pb.DefaultProviders; d != nil {
		out.DefaultAccessLogProviders, out.DefaultTracingProviders = d.AccessLogging, d.Tracing
		if len(d.Metrics) > 0 {
			n.warn(in, f+".defaultProviders.metrics", "metrics providers configure Istio's own Envoy stats extension, which is not sent")
		}
	}
	out.NoListenerAccessLog = pb.DisableEnvoyListenerLog
	if pb.AccessLogFile != "" {
		al := &meshv1.FileAccessLog{Path: pb.AccessLogFile, Text: pb.AccessLogFormat}
		if pb.AccessLogEncoding == istiomesh.MeshConfig_JSON {
			al.Text = ""
			al.Labels = &structpb.Struct{Fields: map[string]*structpb.Value{}}
			if pb.AccessLogFormat != "" {
				if err := protojson.Unmarshal([]byte(pb.AccessLogFormat), al.Labels); err != nil {
					n.problem(in, f+".accessLogFormat", "not a JSON object of log keys and their format strings: %v", err)
					return false
				}
			}
		}
		out.AccessLog = al
	}
	return true
}

// telemetryProvider converts an extension provider; nil, with a warning,
// for a kind shardpilot does not send.
func (n *normalizer) telemetryProvider(in Input, f string, p *istiomesh.MeshConfig_ExtensionProvider) (*meshv1.TelemetryProvider, bool) {
	out := &meshv1.TelemetryProvider{Name: p.Name}
	collector := func(field, service string, port uint32) (*meshv1.Collector, bool) {
		if _, host, ok := strings.Cut(service, "/"); ok {
			service = host
		}
		if service == "" || port == 0 || port > 65535 {
			n.problem(in, f+"."+field, "a service host and port are required")
			return nil, false
		}
		return &meshv1.Collector{Host: service, Port: port}, true
	}
	switch k := p.Provider.(type) {
	case *istiomesh.MeshConfig_ExtensionProvider_EnvoyFileAccessLog:
		e := k.EnvoyFileAccessLog
		fl := &meshv1.FileAccessLog{Path: e.Path, OmitEmptyValues: e.OmitEmptyValues}
		if fl.Path == "" {
			fl.Path = "/dev/stdout"
		}
		fl.Text, fl.Labels = e.GetLogFormat().GetText(), e.GetLogFormat().GetLabels()
		out.Kind = &meshv1.TelemetryProvider_FileAccessLog{FileAccessLog: fl}
	case *istiomesh.MeshConfig_ExtensionProvider_EnvoyOtelAls:
		e := k.EnvoyOtelAls
		c, ok := collector("envoyOtelAls.service", e.Service, e.Port)
		if !ok {
			return nil, false
		}
		out.Kind = &meshv1.TelemetryProvider_OtelAccessLog{OtelAccessLog: &meshv1.OtelAccessLog{Collector: c, LogName: e.LogName,
			Text: e.GetLogFormat().GetText(), Labels: e.GetLogFormat().GetLabels()}}
	case *istiomesh.MeshConfig_ExtensionProvider_Opentelemetry:
		e := k.Opentelemetry
		c, ok := collector("opentelemetry.service", e.Service, e.Port)
		if !ok {
			return nil, false
		}
		for _, u := range []struct {
			field string
			set   bool
		}{{"resourceDetectors", e.ResourceDetectors != nil}, {"dynatraceSampler", e.GetDynatraceSampler() != nil},
			{"grpc.timeout", e.GetGrpc().GetTimeout() != nil}, {"grpc.initialMetadata", len(e.GetGrpc().GetInitialMetadata()) > 0},
			{"http.headers", len(e.GetHttp().GetHeaders()) > 0}} {
			if u.set {
				n.warn(in, f+".opentelemetry."+u.field, "not supported yet; the provider applies without it")
			}
		}
		ot := &meshv1.OtelTracing{Collector: c, MaxTagLength: e.MaxTagLength}
		if e.Http != nil {
			if e.Http.Path == "" {
				n.problem(in, f+".opentelemetry.http.path", "a path is required to export over HTTP")
				return nil, false
			}
			ot.HttpPath, ot.HttpTimeout = e.Http.Path, e.Http.Timeout
		}
		out.Kind = &meshv1.TelemetryProvider_OtelTracing{OtelTracing: ot}
	case *istiomesh.MeshConfig_ExtensionProvider_Zipkin:
		e := k.Zipkin
		c, ok := collector("zipkin.service", e.Service, e.Port)
		if !ok {
			return nil, false
		}
		out.Kind = &meshv1.TelemetryProvider_Zipkin{Zipkin: &meshv1.ZipkinTracing{Collector: c, Path: e.Path, MaxTagLength: e.MaxTagLength,
			Enable_64BitTraceId: e.Enable_64BitTraceId}}
	default:
		kind := fmt.Sprintf("%T", p.Provider)
		kind = strings.TrimPrefix(kind, "*v1alpha1.MeshConfig_ExtensionProvider_")
		n.warn(in, f, "provider %q (%s) is not sent: shardpilot sends file and OpenTelemetry access logs, and OpenTelemetry and Zipkin tracing", p.Name, kind)
		return nil, true
	}
	return out, true
}
