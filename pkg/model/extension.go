package model

import (
	"fmt"
	"regexp"
	"strings"

	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
)

// maxExpression bounds a Telemetry's CEL filter and an EnvoyFilter's
// version pattern.
const maxExpression = 4096

func validateTelemetry(t *meshv1.Telemetry) error {
	for i, l := range t.AccessLogging {
		f := fmt.Sprintf("spec.accessLogging[%d]", i)
		if len(l.Filter) > maxExpression {
			return fieldErr(f+".filter.expression", "longer than %d bytes", maxExpression)
		}
		if err := providerNames(f, l.Providers); err != nil {
			return err
		}
	}
	for i, tr := range t.Tracing {
		f := fmt.Sprintf("spec.tracing[%d]", i)
		if p := tr.RandomSamplingPercentage; p != nil && (*p < 0 || *p > 100) {
			return fieldErr(f+".randomSamplingPercentage", "%v is not a percentage (0 to 100)", *p)
		}
		if err := providerNames(f, tr.Providers); err != nil {
			return err
		}
		for name, tag := range tr.CustomTags {
			if name == "" {
				return fieldErr(f+".customTags", "a tag needs a name")
			}
			if tag.GetValue() == nil {
				return fieldErr(f+".customTags["+name+"]", "give a literal, an environment variable or a header")
			}
			if h := tag.GetHeader(); h != "" && !validHeaderName(h) {
				return fieldErr(f+".customTags["+name+"].header.name", "%q is not a header name", h)
			}
		}
	}
	return nil
}

func providerNames(field string, names []string) error {
	for j, n := range names {
		if n == "" {
			return fieldErr(fmt.Sprintf("%s.providers[%d].name", field, j), "a provider needs a name")
		}
	}
	return nil
}

var headerName = regexp.MustCompile(`^:?[0-9a-zA-Z!#$%&'*+\-.^_|~` + "`" + `]+$`)

func validHeaderName(h string) bool { return headerName.MatchString(h) }

// patchOperations are the operations each kind of patch takes, as Istio
// applies them.
var patchOperations = map[meshv1.EnvoyPatch_ApplyTo][]meshv1.EnvoyPatch_Operation{
	meshv1.EnvoyPatch_APPLY_TO_LISTENER:            {meshv1.EnvoyPatch_OPERATION_MERGE, meshv1.EnvoyPatch_OPERATION_ADD, meshv1.EnvoyPatch_OPERATION_REMOVE},
	meshv1.EnvoyPatch_APPLY_TO_FILTER_CHAIN:        {meshv1.EnvoyPatch_OPERATION_MERGE, meshv1.EnvoyPatch_OPERATION_ADD, meshv1.EnvoyPatch_OPERATION_REMOVE},
	meshv1.EnvoyPatch_APPLY_TO_NETWORK_FILTER:      filterOperations,
	meshv1.EnvoyPatch_APPLY_TO_HTTP_FILTER:         filterOperations,
	meshv1.EnvoyPatch_APPLY_TO_ROUTE_CONFIGURATION: {meshv1.EnvoyPatch_OPERATION_MERGE},
	meshv1.EnvoyPatch_APPLY_TO_VIRTUAL_HOST:        {meshv1.EnvoyPatch_OPERATION_MERGE, meshv1.EnvoyPatch_OPERATION_ADD, meshv1.EnvoyPatch_OPERATION_REMOVE},
	meshv1.EnvoyPatch_APPLY_TO_HTTP_ROUTE: {meshv1.EnvoyPatch_OPERATION_MERGE, meshv1.EnvoyPatch_OPERATION_REMOVE,
		meshv1.EnvoyPatch_OPERATION_INSERT_BEFORE, meshv1.EnvoyPatch_OPERATION_INSERT_AFTER, meshv1.EnvoyPatch_OPERATION_INSERT_FIRST},
	meshv1.EnvoyPatch_APPLY_TO_CLUSTER:          {meshv1.EnvoyPatch_OPERATION_MERGE, meshv1.EnvoyPatch_OPERATION_ADD, meshv1.EnvoyPatch_OPERATION_REMOVE},
	meshv1.EnvoyPatch_APPLY_TO_EXTENSION_CONFIG: {meshv1.EnvoyPatch_OPERATION_ADD},
}

var filterOperations = []meshv1.EnvoyPatch_Operation{meshv1.EnvoyPatch_OPERATION_MERGE, meshv1.EnvoyPatch_OPERATION_ADD,
	meshv1.EnvoyPatch_OPERATION_REMOVE, meshv1.EnvoyPatch_OPERATION_INSERT_BEFORE, meshv1.EnvoyPatch_OPERATION_INSERT_AFTER,
	meshv1.EnvoyPatch_OPERATION_INSERT_FIRST, meshv1.EnvoyPatch_OPERATION_REPLACE}

// PatchOperationAllowed reports whether a kind of patch takes an operation.
func PatchOperationAllowed(to meshv1.EnvoyPatch_ApplyTo, op meshv1.EnvoyPatch_Operation) bool {
	for _, o := range patchOperations[to] {
		if o == op {
			return true
		}
	}
	return false
}

func validateEnvoyFilter(e *meshv1.EnvoyFilter) error {
	for i, p := range e.Patches {
		f := fmt.Sprintf("spec.configPatches[%d]", i)
		if p.Location != "" {
			f = p.Location
		}
		if _, ok := patchOperations[p.ApplyTo]; !ok {
			return fieldErr(f+".applyTo", "%s is not a kind of patch shardpilot applies", strings.TrimPrefix(p.ApplyTo.String(), "APPLY_TO_"))
		}
		if !PatchOperationAllowed(p.ApplyTo, p.Operation) {
			return fieldErr(f+".patch.operation", "%s does not apply to %s", strings.TrimPrefix(p.Operation.String(), "OPERATION_"),
				strings.TrimPrefix(p.ApplyTo.String(), "APPLY_TO_"))
		}
		if p.Operation != meshv1.EnvoyPatch_OPERATION_REMOVE && p.Value == nil {
			return fieldErr(f+".patch.value", "%s needs a value", p.Operation)
		}
		if len(p.ProxyVersion) > maxExpression {
			return fieldErr(f+".match.proxy.proxyVersion", "longer than %d bytes", maxExpression)
		}
		if _, err := regexp.Compile(p.ProxyVersion); err != nil {
			return fieldErr(f+".match.proxy.proxyVersion", "not a regular expression: %v", err)
		}
		if p.Match.GetPort() > 65535 || p.Match.GetClusterPort() > 65535 {
			return fieldErr(f+".match", "a port number is above 65535")
		}
	}
	return nil
}
