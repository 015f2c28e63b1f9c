package istio

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/reflect/protoreflect"
	istiomesh "istio.io/api/mesh/v1alpha1"
	kjson "sigs.k8s.io/json"
)

// The mesh's settings are Istio's MeshConfig, written as YAML under the
// MeshConfigKey of the ConfigMap MeshConfigName in the mesh's namespace
// (Options.MeshNamespace), as istiod reads them.
const (
	KindConfigMap  = "ConfigMap"
	MeshConfigName = "istio"
	MeshConfigKey  = "mesh"
	// maxMeshConfig bounds the settings' text (a ConfigMap holds at most 1 MiB).
	maxMeshConfig = 1 << 20
)

// meshFields are the fields of MeshConfig the pushers act on;
// outsideFields, those that configure Istio's agent or injection rather
// than what proxies are sent (accepted without a word). Any other field
// set is warned: it has no effect yet.
var (
	meshFields = []string{"connectTimeout", "protocolDetectionTimeout", "outboundTrafficPolicy", "enableAutoMtls",
		"trustDomain", "rootNamespace", "localityLbSetting", "dnsRefreshRate", "h2UpgradePolicy", "pathNormalization",
		"defaultHttpRetryPolicy", "defaultConfig"}
	outsideFields = []string{"enablePrometheusMerge", "proxyListenPort", "proxyInboundListenPort", "proxyHttpPort",
		"enableEnvoyAccessLogService", "sdsUdsPath", "enableSdsTokenMount", "certificates", "ca"}
)

// meshSettings is what the pushers read of MeshConfig, as the YAML names it.
type meshSettings struct {
	ConnectTimeout           string                 `json:"connectTimeout"`
	ProtocolDetectionTimeout string                 `json:"protocolDetectionTimeout"`
	OutboundTrafficPolicy    *struct{ Mode string } `json:"outboundTrafficPolicy"`
	EnableAutoMtls           *bool                  `json:"enableAutoMtls"`
	TrustDomain              string                 `json:"trustDomain"`
	RootNamespace            string                 `json:"rootNamespace"`
	LocalityLbSetting        *localityLbSetting     `json:"localityLbSetting"`
	DNSRefreshRate           string                 `json:"dnsRefreshRate"`
	H2UpgradePolicy          string                 `json:"h2UpgradePolicy"`
	PathNormalization        *struct {
		Normalization string `json:"normalization"`
	} `json:"pathNormalization"`
	DefaultHTTPRetryPolicy *httpRetry `json:"defaultHttpRetryPolicy"`
	DefaultConfig          *struct {
		GatewayTopology *struct {
			NumTrustedProxies        uint32 `json:"numTrustedProxies"`
			ForwardClientCertDetails string `json:"forwardClientCertDetails"`
		} `json:"gatewayTopology"`
	} `json:"defaultConfig"`
}

// meshConfig reads the mesh's ConfigMap. Another ConfigMap is ignored,
// with a warning; settings that cannot be read keep the ones in effect.
func (n *normalizer) meshConfig(in Input) {
	md := in.Resource.Metadata
	if md.Name != MeshConfigName || md.Namespace != n.opts.MeshNamespace {
		n.warn(in, "metadata.name", "only the mesh's ConfigMap %s/%s is read; this one is ignored", n.opts.MeshNamespace, MeshConfigName)
		return
	}
	text, ok := in.Resource.Data[MeshConfigKey]
	f := "data." + MeshConfigKey
	switch {
	case !ok:
		n.problem(in, f, "the mesh's settings are missing (Istio's MeshConfig as YAML under the key %q)", MeshConfigKey)
		return
	case len(text) > maxMeshConfig:
		n.problem(in, f, "%d bytes is more than the %d a ConfigMap can hold", len(text), maxMeshConfig)
		return
	}
	// Istio's own types say which fields exist and what they hold.
	var pb istiomesh.MeshConfig
	raw, unknown, modeSet, err := meshJSON(text, pb.ProtoReflect().Descriptor())
	if err != nil {
		n.problem(in, f, "%v", err)
		return
	}
	for _, field := range unknown {
		n.warn(in, f+"."+field, "not a field of Istio's MeshConfig; ignored")
	}
	if err := protojson.Unmarshal(raw, &pb); err != nil {
		n.problem(in, f, "not Istio's MeshConfig: %s", strings.TrimPrefix(err.Error(), "proto: "))
		return
	}
	var unapplied []string
	pb.ProtoReflect().Range(func(fd protoreflect.FieldDescriptor, _ protoreflect.Value) bool {
		if name := fd.JSONName(); !slices.Contains(meshFields, name) && !slices.Contains(outsideFields, name) && !slices.Contains(telemetryFields, name) &&
			!slices.Contains(ingressFields, name) {
			unapplied = append(unapplied, name)
		}
		return true
	})
	if len(unapplied) > 0 {
		slices.Sort(unapplied)
		n.warn(in, f, "%s: not applied by the pushers yet", strings.Join(unapplied, ", "))
	}
	// Read again from Istio's canonical JSON, whatever spelling the YAML used.
	canonical, err := protojson.Marshal(&pb)
	if err != nil {
		n.problem(in, f, "%v", err)
		return
	}
	var s meshSettings
	if err := kjson.UnmarshalCaseSensitivePreserveInts(canonical, &s); err != nil {
		n.problem(in, f, "%v", err)
		return
	}
	if out, ok := n.meshSettings(in, f, &s, modeSet); ok && n.telemetrySettings(in, f, &pb, out) {
		n.emit(in, out)
	}
}

// meshJSON turns the settings' YAML into the JSON protojson reads for md
// (Istio's MeshConfig), without the fields md does not have (returned, by
// path), and says whether it names the outbound traffic policy's mode.
// Anchors and aliases are refused, so that a few bytes cannot expand into
// gigabytes.
func meshJSON(text string, md protoreflect.MessageDescriptor) (raw []byte, unknown []string, modeSet bool, err error) {
	var node yaml.Node
	if err := yaml.Unmarshal([]byte(text), &node); err != nil {
		return nil, nil, false, fmt.Errorf("malformed YAML: %w", err)
	}
	if line := Aliased(&node); line > 0 {
		return nil, nil, false, fmt.Errorf("line %d: anchors and aliases are not accepted in the mesh's settings", line)
	}
	var v any
	if err := node.Decode(&v); err != nil {
		return nil, nil, false, fmt.Errorf("malformed YAML: %w", err)
	}
	if v == nil {
		v = map[string]any{}
	}
	top, ok := v.(map[string]any)
	if !ok {
		return nil, nil, false, errors.New("the settings must be a mapping of MeshConfig's fields")
	}
	if err := prepare(top, md, "", &unknown); err != nil {
		return nil, nil, false, err
	}
	slices.Sort(unknown)
	// REGISTRY_ONLY is Istio's zero value, which protojson's output leaves
	// out, and where the YAML names no mode the mesh keeps ALLOW_ANY.
	policy, _ := cmp.Or(top["outboundTrafficPolicy"], top["outbound_traffic_policy"]).(map[string]any)
	_, modeSet = policy["mode"]
	raw, err = json.Marshal(top)
	return raw, unknown, modeSet, err
}

// prepare readies a message's decoded YAML for protojson: it takes out the
// fields md does not have (appending their paths to unknown), and rewrites
// durations written as Go durations ("100ms", "1m30s"), which Istio
// accepts, into the seconds protojson reads ("0.1s").
func prepare(obj map[string]any, md protoreflect.MessageDescriptor, path string, unknown *[]string) error {
	for key, val := range obj {
		f := strings.TrimPrefix(path+"."+key, ".")
		fd := cmp.Or(md.Fields().ByJSONName(key), md.Fields().ByName(protoreflect.Name(key)))
		if fd == nil {
			*unknown = append(*unknown, f)
			delete(obj, key)
			continue
		}
		if fd.Message() == nil {
			continue // a scalar: protojson says what is wrong with it
		}
		if strings.HasPrefix(string(fd.Message().FullName()), "google.protobuf.") && fd.Message().FullName() != "google.protobuf.Duration" {
			continue // free-form (Struct, Value, Any) or a wrapper: no fields to check
		}
		sub, elems := fd.Message(), []any{val}
		switch {
		case fd.IsMap():
			sub, elems = fd.MapValue().Message(), nil
			m, _ := val.(map[string]any)
			for _, e := range m {
				elems = append(elems, e)
			}
		case fd.IsList():
			elems, _ = val.([]any)
		case sub.FullName() == "google.protobuf.Duration":
			str, ok := val.(string)
			if !ok {
				continue
			}
			d, err := time.ParseDuration(str)
			if err != nil {
				return fmt.Errorf("%s: %q is not a duration (such as 10s or 1m30s)", f, str)
			}
			obj[key] = strconv.FormatFloat(d.Seconds(), 'f', -1, 64) + "s"
			continue
		}
		for _, e := range elems {
			if m, ok := e.(map[string]any); ok && sub != nil {
				if err := prepare(m, sub, f, unknown); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// Aliased returns the line of the first anchor or alias under node, or 0:
// where they are refused, a few bytes cannot expand into gigabytes.
func Aliased(node *yaml.Node) int {
	if node.Kind == yaml.AliasNode || node.Anchor != "" {
		return max(node.Line, 1)
	}
	for _, c := range node.Content {
		if line := Aliased(c); line > 0 {
			return line
		}
	}
	return 0
}

// meshSettings turns what MeshConfig says into the mesh's model.
// modeSet says the YAML named the outbound traffic policy's mode.
func (n *normalizer) meshSettings(in Input, f string, s *meshSettings, modeSet bool) (*meshv1.MeshConfig, bool) {
	out := &meshv1.MeshConfig{Origin: n.origin(in), EnableAutoMtls: s.EnableAutoMtls, TrustDomain: s.TrustDomain,
		RootNamespace: s.RootNamespace, H2Upgrade: s.H2UpgradePolicy == "UPGRADE"}
	if !n.durations(in, f, durationField{"connectTimeout", s.ConnectTimeout, &out.ConnectTimeout},
		durationField{"protocolDetectionTimeout", s.ProtocolDetectionTimeout, &out.ProtocolDetectionTimeout},
		durationField{"dnsRefreshRate", s.DNSRefreshRate, &out.DnsRefreshRate}) {
		return nil, false
	}
	if modeSet {
		out.OutboundTrafficPolicy = meshv1.OutboundPolicy_OUTBOUND_POLICY_REGISTRY_ONLY
		if s.OutboundTrafficPolicy != nil && s.OutboundTrafficPolicy.Mode == "ALLOW_ANY" {
			out.OutboundTrafficPolicy = meshv1.OutboundPolicy_OUTBOUND_POLICY_ALLOW_ANY
		}
	}
	if s.LocalityLbSetting != nil {
		lb, ok := n.localityLb(in, f+".localityLbSetting", s.LocalityLbSetting)
		if !ok {
			return nil, false
		}
		out.LocalityLb = lb
	}
	if r := s.DefaultHTTPRetryPolicy; r != nil {
		rp, ok := n.retries(in, f+".defaultHttpRetryPolicy", r)
		if !ok {
			return nil, false
		}
		out.DefaultHttpRetry = rp
	}
	if p := s.PathNormalization; p != nil {
		out.PathNormalization = meshv1.PathNormalization(meshv1.PathNormalization_value["PATH_NORMALIZATION_"+p.Normalization])
	}
	if s.DefaultConfig != nil && s.DefaultConfig.GatewayTopology != nil {
		t := s.DefaultConfig.GatewayTopology
		out.GatewayTrustedProxies = t.NumTrustedProxies
		out.GatewayClientCert = meshv1.ClientCertDetails(meshv1.ClientCertDetails_value["CLIENT_CERT_DETAILS_"+t.ForwardClientCertDetails])
	}
	return out, true
}
