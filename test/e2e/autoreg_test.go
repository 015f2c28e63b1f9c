package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/shardpilot/shardpilot/internal/app"
	"github.com/shardpilot/shardpilot/internal/kubetest"
	"github.com/shardpilot/shardpilot/internal/testutil"
	"github.com/shardpilot/shardpilot/pkg/bus"
	"github.com/shardpilot/shardpilot/pkg/xds/identity"
	"github.com/shardpilot/shardpilot/pkg/xds/server"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
)

// registeringKubeSource is kubeSource, of the namespaces inMesh selects
// (nil: all), with the workloads the pushers register made into
// WorkloadEntries, removed registrationGrace after they leave.
func registeringKubeSource(cluster string, cfg *rest.Config, inMesh labels.Selector) source {
	return func(ctx context.Context, in ingester) error {
		return app.KubeSource{Etcd: in.etcd, Cluster: cluster, Kube: cfg, Election: in.election, Log: in.log, NamespaceSelector: inMesh,
			Registrations: &bus.Registrations{NATS: in.nats, Log: in.log}, RegistrationGrace: registrationGrace}.Run(ctx)
	}
}

// vmAgent opens an ADS stream over mutual TLS as a VM's agent of ns
// naming group, and returns once the stream is admitted (its first
// response) or refused; stop ends it.
func vmAgent(t *testing.T, ads, caFile, cert, key, ns, group string) (stop func(), err error) {
	stop, _, err = vmAgentStream(t, ads, caFile, cert, key, ns, group)
	return stop, err
}

// vmAgentStream is vmAgent, returning the admitted stream too.
func vmAgentStream(t *testing.T, ads, caFile, cert, key, ns, group string) (stop func(), s discovery.AggregatedDiscoveryService_StreamAggregatedResourcesClient, err error) {
	conn := dialTLS(t, ads, caFile, cert, key)
	ctx, cancel := context.WithCancel(context.Background())
	stop = func() { cancel(); conn.Close() }
	s, err = discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err == nil {
		meta, _ := structpb.NewStruct(map[string]any{"NAMESPACE": ns, "AUTO_REGISTER_GROUP": group,
			"INSTANCE_IPS": "127.0.0.1,10.9.9.9", "LABELS": map[string]any{"version": "v1"}})
		err = s.Send(&discovery.DiscoveryRequest{TypeUrl: resource.ClusterType,
			Node: &core.Node{Id: "sidecar~127.0.0.1~vm-1." + ns + "~" + ns + ".svc.cluster.local", Metadata: meta}})
	}
	if err == nil {
		_, err = s.Recv()
	}
	if err != nil {
		stop()
	}
	return stop, s, err
}

// The heartbeat and grace period of the registration tests: a loaded
// machine delays a heartbeat by far less than the three it takes for a
// pusher to be taken for gone.
const registrationHeartbeat, registrationGrace = time.Second, time.Second

var workloadEntries = schema.GroupVersionResource{Group: "networking.istio.io", Version: "v1", Resource: "workloadentries"}

// TestWorkloadGroupRegistersConnectedVMs: a VM's agent connecting over
// mutual TLS and naming a WorkloadGroup gets a WorkloadEntry in the real
// API server, made from the group's template with its address and labels;
// a grpc-go client of the ServiceEntry that selects the group's workloads
// then reaches the VM with real RPCs. A connection whose identity the
// group does not admit, or naming a group that does not exist, is
// refused with the reason. When the VM disconnects its entry goes after
// the grace period and the client no longer reaches it.
func TestWorkloadGroupRegistersConnectedVMs(t *testing.T) {
	kc := kubetest.Get(t)
	kc.InstallIstioCRDs(t)
	ns := kc.Namespace(t, nil)
	vm := startBackend(t)
	host := "vms." + ns + ".example.com"
	applyIstio(t, kc, "WorkloadGroup", "workloadgroups", ns, "vms", map[string]any{
		"metadata": map[string]any{"labels": map[string]any{"app": "vm"}},
		"template": map[string]any{"serviceAccount": "vm", "ports": map[string]any{"grpc": int64(vm.port)}},
	})
	applyIstio(t, kc, "ServiceEntry", "serviceentries", ns, "vms", map[string]any{
		"hosts": []any{host}, "location": "MESH_INTERNAL", "resolution": "STATIC",
		"ports":            []any{map[string]any{"number": int64(vm.port), "name": "grpc", "protocol": "GRPC"}},
		"workloadSelector": map[string]any{"labels": map[string]any{"app": "vm"}},
	})

	ca := testutil.NewCA(t)
	serverCert, serverKey := ca.Issue(t, "pusher")
	vmCert, vmKey := ca.Issue(t, "vm", "spiffe://cluster.local/ns/"+ns+"/sa/vm")
	otherCert, otherKey := ca.Issue(t, "other", "spiffe://cluster.local/ns/"+ns+"/sa/other")
	tc, err := identity.ServerTLS(serverCert, serverKey, ca.CertFile, testutil.Log(t))
	if err != nil {
		t.Fatal(err)
	}
	cp := NewCluster(t, Options{
		XDS:    server.Config{GRPCOptions: []grpc.ServerOption{grpc.Creds(credentials.NewTLS(tc))}},
		Policy: &identity.Policy{TrustDomain: "cluster.local", Required: true},
		Tune:   func(_ int, p *app.Pusher) { p.Name, p.RegistrationHeartbeat = "pusher-0", registrationHeartbeat },
	}, registeringKubeSource("c1", kc.Config, nil))

	agent := func(cert, key, group string) (func(), error) {
		return vmAgent(t, cp.ads, ca.CertFile, cert, key, ns, group)
	}
	entry := func() (*unstructured.Unstructured, error) {
		return kc.Dynamic.Resource(workloadEntries).Namespace(ns).Get(context.Background(), "vms-127.0.0.1", metav1.GetOptions{})
	}

	t.Run("refused", func(t *testing.T) {
		for name, c := range map[string]struct{ cert, key, group, says string }{
			"an identity the group does not admit": {otherCert, otherKey, "vms", `service account "vm"`},
			"a group that does not exist":          {vmCert, vmKey, "missing", "missing not found"},
		} {
			testutil.Eventually(t, 20*time.Second, name+" is refused with the reason", func() (bool, string) {
				stop, err := agent(c.cert, c.key, c.group)
				if err == nil {
					stop()
				}
				return status.Code(err) == codes.FailedPrecondition && strings.Contains(err.Error(), c.says), fmt.Sprint(err)
			})
		}
		if _, err := entry(); !apierrors.IsNotFound(err) {
			t.Errorf("after refused connections: %v, want no WorkloadEntry", err)
		}
	})

	var disconnect func()
	testutil.Eventually(t, 30*time.Second, "the VM's agent is admitted", func() (bool, string) {
		var err error
		disconnect, err = agent(vmCert, vmKey, "vms")
		return err == nil, fmt.Sprint(err)
	})
	defer disconnect()
	testutil.Eventually(t, 20*time.Second, "the VM's WorkloadEntry is made from its group", func() (bool, string) {
		u, err := entry()
		if err != nil {
			return false, err.Error()
		}
		spec, _, _ := unstructured.NestedMap(u.Object, "spec")
		a := u.GetAnnotations()
		owners := u.GetOwnerReferences()
		ok := spec["address"] == "127.0.0.1" && spec["serviceAccount"] == "vm" && u.GetLabels()["app"] == "vm" && u.GetLabels()["version"] == "v1" &&
			a["istio.io/autoRegistrationGroup"] == "vms" && a["istio.io/workloadController"] == "pusher-0" && a["istio.io/connectedAt"] != "" &&
			len(owners) == 1 && owners[0].Kind == "WorkloadGroup" && owners[0].Name == "vms"
		return ok, fmt.Sprint(spec, u.GetLabels(), a, owners)
	})
	client := dialXDSWithCert(t, cp.ads, fmt.Sprintf("xds:///%s:%d", host, vm.port), "sidecar~127.0.0.2~client."+ns+"~"+ns+".svc.cluster.local", ns,
		ca.CertFile, vmCert, vmKey)
	allOn(t, client, vm.addr, "a client of the ServiceEntry reaches the registered VM")

	// While connected, the pusher's heartbeats keep the entry past the
	// span in which a silent pusher's would go (three heartbeats, the
	// grace period, the registrar's one-second sweep), checked all along.
	kept := time.Now().Add(3*registrationHeartbeat + registrationGrace + time.Second)
	testutil.Eventually(t, 30*time.Second, "a connected VM's entry kept past a silent pusher's span", func() (bool, string) {
		if _, err := entry(); err != nil {
			t.Fatalf("a connected VM's entry went: %v", err)
		}
		return time.Now().After(kept), "kept so far"
	})
	disconnect()
	testutil.Eventually(t, 20*time.Second, "the entry goes after the grace period", func() (bool, string) {
		_, err := entry()
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
	testutil.Eventually(t, 20*time.Second, "the client no longer reaches the VM", func() (bool, string) {
		got, err := call(client)
		return err != nil, got
	})
}

// TestRegistrationRefusedLaterEndsTheStream: a VM whose registration no
// ingester answers (its namespace is not in the mesh yet) is served, and
// its registration repeated; once its namespace joins the mesh the
// ingester refuses it (an identity its group does not admit): the pusher
// ends the stream, and the agent's reconnection is refused with the
// reason, as istiod refuses it.
func TestRegistrationRefusedLaterEndsTheStream(t *testing.T) {
	kc := kubetest.Get(t)
	kc.InstallIstioCRDs(t)
	ns := kc.Namespace(t, nil)
	applyIstio(t, kc, "WorkloadGroup", "workloadgroups", ns, "vms", map[string]any{"template": map[string]any{"serviceAccount": "vm"}})
	ca := testutil.NewCA(t)
	serverCert, serverKey := ca.Issue(t, "pusher")
	otherCert, otherKey := ca.Issue(t, "other", "spiffe://cluster.local/ns/"+ns+"/sa/other")
	tc, err := identity.ServerTLS(serverCert, serverKey, ca.CertFile, testutil.Log(t))
	if err != nil {
		t.Fatal(err)
	}
	inMesh := labels.SelectorFromSet(labels.Set{"mesh-" + ns: "on"})
	cp := NewCluster(t, Options{
		XDS:    server.Config{GRPCOptions: []grpc.ServerOption{grpc.Creds(credentials.NewTLS(tc))}},
		Policy: &identity.Policy{TrustDomain: "cluster.local", Required: true},
		Tune:   func(_ int, p *app.Pusher) { p.RegistrationHeartbeat = registrationHeartbeat },
	}, registeringKubeSource("c1", kc.Config, inMesh))
	stop, stream, err := vmAgentStream(t, cp.ads, ca.CertFile, otherCert, otherKey, ns, "vms")
	if err != nil {
		t.Fatalf("a VM whose registration no ingester answers: %v, want served", err)
	}
	defer stop()
	n, err := kc.Client.CoreV1().Namespaces().Get(context.Background(), ns, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Labels = map[string]string{"mesh-" + ns: "on"}
	if _, err := kc.Client.CoreV1().Namespaces().Update(context.Background(), n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The pusher ends the stream (responses before that are the config it
	// was served meanwhile), and the agent's reconnection is refused with
	// the reason.
	for {
		if _, err := stream.Recv(); err != nil {
			break
		}
	}
	if _, err := vmAgent(t, cp.ads, ca.CertFile, otherCert, otherKey, ns, "vms"); status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), `service account "vm"`) {
		t.Errorf("the reconnection: %v, want refused with the reason", err)
	}
}
