package istiod

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"github.com/shardpilot/shardpilot/internal/testutil"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// workloadGroup is the group both control planes register a workload of,
// each in a namespace of its own.
const workloadGroup = `apiVersion: networking.istio.io/v1
kind: WorkloadGroup
metadata: {name: vms, namespace: %s}
spec:
  metadata:
    labels: {app: vm, tier: backend}
    annotations: {team: payments}
  template:
    serviceAccount: vm
    ports: {http: 8080}
    weight: 3
    labels: {app: template, version: v0}
`

// TestAgainstIstiodAutoRegistration: the same workload's agent connects
// to istiod and to the pushers naming the same WorkloadGroup (in a
// namespace each); the WorkloadEntries they make in the API server are
// compared: name, spec, labels, annotations (but the connection's time
// and controller) and owner. istiod, on plaintext, is told not to check
// the identity; the pushers check the client certificate's.
func TestAgainstIstiodAutoRegistration(t *testing.T) {
	istioBin, ourBin := binaries(t, "diff-istiod")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	work := t.TempDir()
	kc, kubeconfig, a := startKubeWithIstioCRDs(t, ctx, istioBin, work)
	for _, ns := range []string{"istio-system", "wg-istiod", "wg-ours"} {
		kc.CreateNamespace(t, ns, nil)
	}
	for _, ns := range []string{"wg-istiod", "wg-ours"} {
		a.apply(t, ctx, fmt.Appendf(nil, workloadGroup, ns))
	}
	settings := "rootNamespace: istio-system\ntrustDomain: cluster.local\n"
	istiod := startIstiod(t, ctx, istioBin, kubeconfig, work, settings, "ISTIO_WORKLOAD_ENTRY_VALIDATE_IDENTITY=false")

	// The pushers over mutual TLS, the workload's certificate naming its
	// service account.
	ca := testutil.NewCA(t)
	serverCert, serverKey := ca.Issue(t, "pusher")
	vmCert, vmKey := ca.Issue(t, "vm", "spiffe://cluster.local/ns/wg-ours/sa/vm")
	run := shardpilotRunner(t, ctx, ourBin, work)
	startIngester(t, run, kubeconfig)
	ads := testutil.FreeAddr(t)
	pusher := run("pusher", "--ads-addr", ads, "--ads-cert-file", serverCert, "--ads-key-file", serverKey, "--ads-client-ca-file", ca.CertFile,
		"--ca-cert-file", ca.CertFile, "--ca-key-file", ca.KeyFile, "--workload-certificates", "agent", "--name", "pusher-0")
	testutil.Eventually(t, time.Minute, "the pusher ready", func() (bool, string) {
		return ready("http://" + pusher + "/readyz"), "not ready"
	})
	tc, err := (&transport.TLSInfo{TrustedCAFile: ca.CertFile, CertFile: vmCert, KeyFile: vmKey}).ClientConfig()
	if err != nil {
		t.Fatal(err)
	}

	entries := schema.GroupVersionResource{Group: "networking.istio.io", Version: "v1", Resource: "workloadentries"}
	made := map[string]*unstructured.Unstructured{}
	for ns, dial := range map[string]struct {
		addr  string
		creds credentials.TransportCredentials
	}{"wg-istiod": {istiod, insecure.NewCredentials()}, "wg-ours": {ads, credentials.NewTLS(tc)}} {
		stop := connectVM(t, ctx, dial.addr, dial.creds, ns)
		defer stop()
		testutil.Eventually(t, time.Minute, "the WorkloadEntry made in "+ns, func() (bool, string) {
			u, err := kc.Dynamic.Resource(entries).Namespace(ns).Get(ctx, "vms-10.9.0.1", metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			made[ns] = u
			return true, ""
		})
	}
	theirs, ours := entryShape(made["wg-istiod"]), entryShape(made["wg-ours"])
	if !maps.Equal(theirs, ours) {
		for _, k := range slices.Sorted(maps.Keys(theirs)) {
			if theirs[k] != ours[k] {
				t.Errorf("%s: istiod %q, shardpilot %q", k, theirs[k], ours[k])
			}
		}
		for _, k := range slices.Sorted(maps.Keys(ours)) {
			if _, ok := theirs[k]; !ok {
				t.Errorf("%s: istiod none, shardpilot %q", k, ours[k])
			}
		}
	}
	t.Logf("the WorkloadEntry istiod made: %v", theirs)
}

// connectVM opens an ADS stream as a VM's agent of ns naming the group
// vms, and returns once it is served; stop ends it.
func connectVM(t *testing.T, ctx context.Context, addr string, creds credentials.TransportCredentials, ns string) (stop func()) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(ctx)
	stop = func() { cancel(); conn.Close() }
	meta, _ := structpb.NewStruct(map[string]any{"NAMESPACE": ns, "AUTO_REGISTER_GROUP": "vms", "INSTANCE_IPS": "10.9.0.1,10.9.0.2",
		"LABELS": map[string]any{"version": "v1", "app": "vm-node"}, "ISTIO_VERSION": "1.30.0"})
	node := &core.Node{Id: "sidecar~10.9.0.1~vm-1." + ns + "~" + ns + ".svc.cluster.local", Metadata: meta,
		Locality: &core.Locality{Region: "eu", Zone: "eu-1"}}
	testutil.Eventually(t, time.Minute, "the VM served at "+addr, func() (bool, string) {
		s, err := discovery.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
		if err == nil {
			err = s.Send(&discovery.DiscoveryRequest{Node: node, TypeUrl: resource.ClusterType})
		}
		if err == nil {
			_, err = s.Recv()
		}
		return err == nil, fmt.Sprint(err)
	})
	return stop
}

// entryShape is what the two control planes' WorkloadEntries are compared
// on: the spec, the labels, the annotations (the connection's time and
// controller by name only) and the owner.
func entryShape(u *unstructured.Unstructured) map[string]string {
	out := map[string]string{"name": u.GetName()}
	spec, _, _ := unstructured.NestedMap(u.Object, "spec")
	for k, v := range spec {
		out["spec."+k] = fmt.Sprint(v)
	}
	for k, v := range u.GetLabels() {
		out["label "+k] = v
	}
	for k, v := range u.GetAnnotations() {
		if k == "istio.io/connectedAt" || k == "istio.io/workloadController" {
			v = "(set)"
		}
		out["annotation "+k] = v
	}
	for _, o := range u.GetOwnerReferences() {
		out["owner"] = fmt.Sprint(o.APIVersion, " ", o.Kind, " ", o.Name, " controller:", o.Controller != nil && *o.Controller)
	}
	return out
}
