package istio

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/google/cel-go/common"
	"github.com/google/cel-go/parser"
	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
)

// The Telemetry API (telemetry.istio.io).

type telemetry struct {
	Selector      *matchSelector  `json:"selector"`
	TargetRef     json.RawMessage `json:"targetRef" field:"rejected: Telemetry attached to gateways and waypoints is not supported yet"`
	TargetRefs    json.RawMessage `json:"targetRefs" field:"rejected: as targetRef"`
	Tracing       []tracing       `json:"tracing"`
	AccessLogging []accessLogging `json:"accessLogging"`
	Metrics       []any           `json:"metrics" field:"warned: metrics overrides configure Istio's own Envoy stats extension, which is not sent"`
}

type providerRef struct {
	Name string `json:"name"`
}

type workloadMatch struct {
	Mode string `json:"mode"`
}

type accessLogging struct {
	Match     *workloadMatch `json:"match"`
	Providers []providerRef  `json:"providers"`
	Disabled  *bool          `json:"disabled"`
	Filter    *struct {
		Expression string `json:"expression"`
	} `json:"filter"`
}

type tracing struct {
	Match                        *workloadMatch       `json:"match"`
	Providers                    []providerRef        `json:"providers"`
	RandomSamplingPercentage     *float64             `json:"randomSamplingPercentage"`
	DisableSpanReporting         *bool                `json:"disableSpanReporting"`
	CustomTags                   map[string]customTag `json:"customTags"`
	UseRequestIDForTraceSampling *bool                `json:"useRequestIdForTraceSampling"`
	EnableIstioTags              *bool                `json:"enableIstioTags" field:"supported: Istio's tags that name the workload's canonical service and revision are not sent (see docs/istio-compatibility.md)"`
	DisableContextPropagation    json.RawMessage      `json:"disableContextPropagation" field:"warned: not supported yet; context is propagated"`
}

type customTag struct {
	Literal *struct {
		Value string `json:"value"`
	} `json:"literal"`
	Environment *tagSource      `json:"environment"`
	Header      *tagSource      `json:"header"`
	Formatter   json.RawMessage `json:"formatter" field:"warned: not supported yet; the tag is not sent"`
}

type tagSource struct {
	Name         string `json:"name"`
	DefaultValue string `json:"defaultValue"`
}

// telemetry normalizes a Telemetry. Attached to gateways and waypoints
// (targetRef) it is refused: applied to the namespace instead, it would
// reach workloads it does not name.
func (n *normalizer) telemetry(in Input, spec *telemetry) {
	if len(spec.TargetRef) > 0 || len(spec.TargetRefs) > 0 {
		n.unsupported(in, "spec.targetRef", "Telemetry attached to gateways and waypoints")
		return
	}
	if len(spec.Metrics) > 0 {
		n.warn(in, "spec.metrics", "metrics overrides configure Istio's own Envoy stats extension, which shardpilot does not send; the rest of the Telemetry applies")
	}
	t := &meshv1.Telemetry{Origin: n.origin(in), Selector: selectorOf(spec.Selector)}
	for i, l := range spec.AccessLogging {
		f := fmt.Sprintf("spec.accessLogging[%d]", i)
		mode, ok := n.workloadMode(in, f, l.Match)
		if !ok {
			return
		}
		al := &meshv1.AccessLogging{Mode: mode, Providers: providerNames(l.Providers), Disabled: l.Disabled != nil && *l.Disabled}
		if l.Filter != nil {
			if err := checkCEL(l.Filter.Expression); err != nil {
				n.problem(in, f+".filter.expression", "%v", err)
				return
			}
			al.Filter = l.Filter.Expression
		}
		t.AccessLogging = append(t.AccessLogging, al)
	}
	for i, tr := range spec.Tracing {
		f := fmt.Sprintf("spec.tracing[%d]", i)
		mode, ok := n.workloadMode(in, f, tr.Match)
		if !ok {
			return
		}
		out := &meshv1.Tracing{Mode: mode, Providers: providerNames(tr.Providers), DisableSpanReporting: tr.DisableSpanReporting,
			RandomSamplingPercentage: tr.RandomSamplingPercentage, UseRequestIdForTraceSampling: tr.UseRequestIDForTraceSampling,
			EnableIstioTags: tr.EnableIstioTags}
		if len(tr.DisableContextPropagation) > 0 {
			n.warn(in, f+".disableContextPropagation", "not supported yet: context is propagated")
		}
		for name, tag := range tr.CustomTags {
			tf := f + ".customTags[" + name + "]"
			t, ok := n.customTag(in, tf, tag)
			if !ok {
				return
			}
			if t == nil {
				continue
			}
			if out.CustomTags == nil {
				out.CustomTags = map[string]*meshv1.TracingTag{}
			}
			out.CustomTags[name] = t
		}
		t.Tracing = append(t.Tracing, out)
	}
	n.emit(in, t)
}

func providerNames(refs []providerRef) []string {
	var out []string
	for _, r := range refs {
		out = append(out, r.Name)
	}
	return out
}

func (n *normalizer) workloadMode(in Input, field string, m *workloadMatch) (meshv1.WorkloadMode, bool) {
	if m == nil {
		return meshv1.WorkloadMode_WORKLOAD_MODE_CLIENT_AND_SERVER, true
	}
	switch strings.ToUpper(m.Mode) {
	case "", "CLIENT_AND_SERVER":
		return meshv1.WorkloadMode_WORKLOAD_MODE_CLIENT_AND_SERVER, true
	case "CLIENT":
		return meshv1.WorkloadMode_WORKLOAD_MODE_CLIENT, true
	case "SERVER":
		return meshv1.WorkloadMode_WORKLOAD_MODE_SERVER, true
	}
	n.problem(in, field+".match.mode", "%q is not CLIENT_AND_SERVER, CLIENT or SERVER", m.Mode)
	return 0, false
}

// customTag returns a tracing tag; nil (with a warning) for a formatter,
// which Envoy takes from Istio 1.29's on alone.
func (n *normalizer) customTag(in Input, field string, tag customTag) (*meshv1.TracingTag, bool) {
	set := 0
	out := &meshv1.TracingTag{}
	if tag.Literal != nil {
		set++
		out.Value = &meshv1.TracingTag_Literal{Literal: tag.Literal.Value}
	}
	if tag.Environment != nil {
		set++
		out.Value, out.DefaultValue = &meshv1.TracingTag_Environment{Environment: tag.Environment.Name}, tag.Environment.DefaultValue
	}
	if tag.Header != nil {
		set++
		out.Value, out.DefaultValue = &meshv1.TracingTag_Header{Header: tag.Header.Name}, tag.Header.DefaultValue
	}
	if len(tag.Formatter) > 0 {
		set++
	}
	switch {
	case set == 0:
		n.problem(in, field, "give a literal, an environment variable or a header")
		return nil, false
	case set > 1:
		n.problem(in, field, "give one of literal, environment, header and formatter")
		return nil, false
	case len(tag.Formatter) > 0:
		n.warn(in, field+".formatter", "not supported yet: the tag is not sent")
		return nil, true
	}
	return out, true
}

// celParser parses the CEL expressions of access log filters, as Envoy
// does before it takes them.
var celParser = func() *parser.Parser {
	p, err := parser.NewParser(parser.Macros(parser.AllMacros...), parser.MaxRecursionDepth(100), parser.ExpressionSizeCodePointLimit(4096))
	if err != nil {
		panic(err)
	}
	return p
}()

// checkCEL reports an expression Envoy's CEL filter would refuse to parse.
func checkCEL(expr string) error {
	if strings.TrimSpace(expr) == "" {
		return fmt.Errorf("an expression is required")
	}
	_, errs := celParser.Parse(common.NewTextSource(expr))
	if list := errs.GetErrors(); len(list) > 0 {
		e := list[0]
		return fmt.Errorf("not a CEL expression: column %d: %s", e.Location.Column()+1, e.Message)
	}
	return nil
}
