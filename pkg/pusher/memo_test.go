package pusher

import (
	"testing"

	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/xds/generate"
)

// TestEndpointChangesThatChangeClustersRegenerate: an endpoint change
// takes the fast path (load assignments alone) unless it changes what
// clusters read of endpoints, which the service's configuration version
// names: a new service account among its workloads (its clusters accept
// the workloads' identities), a workload without a sidecar behind a
// headless service (its clusters' TLS).
func TestEndpointChangesThatChangeClustersRegenerate(t *testing.T) {
	svc := func(headless bool, config string) *generate.Service {
		return &generate.Service{Namespace: "data", Name: "db", ConfigVersion: config, Spec: &meshv1.Service{
			Hostnames: []string{"db.data.svc.cluster.local"}, Headless: headless, Resolution: meshv1.Resolution_RESOLUTION_STATIC,
			Ports: []*meshv1.Port{{Name: "tcp", Number: 5432, Protocol: meshv1.Protocol_PROTOCOL_TCP}}}}
	}
	for _, headless := range []bool{false, true} {
		var s serverPorts
		s.record(generate.NewMesh([]*generate.Service{svc(headless, "s1adb")}, nil))
		if s.changed([]*generate.Service{svc(headless, "s1adb")}) {
			t.Errorf("headless %v: endpoints that change no cluster regenerate the classes", headless)
		}
		if !s.changed([]*generate.Service{svc(headless, "s1adb,db-canary")}) {
			t.Errorf("headless %v: a new service account among the workloads does not regenerate the classes", headless)
		}
	}
	var s serverPorts
	s.record(generate.NewMesh([]*generate.Service{svc(true, "s1adbm")}, nil))
	if !s.changed([]*generate.Service{svc(true, "s1adb")}) {
		t.Error("a workload without a sidecar behind a headless service does not regenerate the classes")
	}
}
