package kube_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardpilot/shardpilot/internal/kubetest"
	"github.com/shardpilot/shardpilot/internal/testutil"
	"github.com/shardpilot/shardpilot/pkg/ingest/kube"
	"github.com/shardpilot/shardpilot/pkg/model"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// scriptedRegistrations hands the registrations a test sends to the
// source, and returns its answers.
type scriptedRegistrations struct {
	in   chan scripted
	lost atomic.Uint64
}

func (s *scriptedRegistrations) Lost() uint64 { return s.lost.Load() }

type scripted struct {
	r      model.Registration
	answer chan error
}

func (s *scriptedRegistrations) Run(ctx context.Context, handle func(context.Context, model.Registration) error) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case m := <-s.in:
			m.answer <- handle(ctx, m.r)
		}
	}
}

// send hands r over and returns the answer (model.ErrNotMine included).
func (s *scriptedRegistrations) send(t *testing.T, r model.Registration) error {
	t.Helper()
	m := scripted{r, make(chan error, 1)}
	select {
	case s.in <- m:
	case <-time.After(30 * time.Second):
		t.Fatal("the source took no registration")
	}
	return <-m.answer
}

// TestRegistrarKeepsAndRemovesEntries: the source makes a registered
// workload's WorkloadEntry; a repeated registration changes nothing; an
// entry whose pusher goes silent is taken for disconnected and removed
// after the grace period; the end of an earlier connection does not
// remove the entry of the workload connected again; the next leader
// adopts the entries and removes them on their disconnection; a
// WorkloadEntry of the same name written by someone else is left alone.
func TestRegistrarKeepsAndRemovesEntries(t *testing.T) {
	kc := kubetest.Get(t)
	kc.InstallIstioCRDs(t)
	ns := kc.Namespace(t, nil)
	_, cli := testutil.Etcd(t)
	apply(t, kc, istioObject("WorkloadGroup", "v1", ns, "vms", map[string]any{
		"metadata": map[string]any{"labels": map[string]any{"app": "vm"}, "annotations": map[string]any{"team": "payments"}},
		"template": map[string]any{"serviceAccount": "vm", "ports": map[string]any{"http": int64(8080)}, "weight": int64(3)},
	}))
	apply(t, kc, istioObject("WorkloadEntry", "v1", ns, "vms-10.0.0.9", map[string]any{"address": "10.0.0.9"}))
	regs := &scriptedRegistrations{in: make(chan scripted)}
	start := func() *running {
		return startSource(t, kc, cli, "c1", func(c *kube.Config) {
			c.Registrations, c.RegistrationGrace = regs, 500*time.Millisecond
		})
	}
	src := start()
	entries := kc.Dynamic.Resource(gvr("WorkloadEntry")).Namespace(ns)
	reg := func(op model.RegistrationOp, address string, at time.Time, heartbeat time.Duration) model.Registration {
		return model.Registration{Op: op, Group: "vms", Namespace: ns, Identity: "spiffe://cluster.local/ns/" + ns + "/sa/vm",
			Proxy: "sidecar~" + address + "~vm." + ns + "~" + ns + ".svc.cluster.local", Address: address, Labels: map[string]string{"version": "v2"},
			Locality: "eu/eu-1", ConnectedAt: at, Pusher: "pusher-0", Heartbeat: heartbeat}
	}
	gone := func(name, what string) {
		t.Helper()
		testutil.Eventually(t, 30*time.Second, what, func() (bool, string) {
			_, err := entries.Get(context.Background(), name, metav1.GetOptions{})
			return apierrors.IsNotFound(err), fmt.Sprint(err)
		})
	}

	// Made from the group, and kept while repeated.
	first := time.Now()
	if err := regs.send(t, reg(model.RegistrationConnect, "10.0.0.7", first, time.Hour)); err != nil {
		t.Fatalf("a registration: %v", err)
	}
	u, err := entries.Get(context.Background(), "vms-10.0.0.7", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	spec, _, _ := unstructured.NestedMap(u.Object, "spec")
	if got := fmt.Sprint(spec); got != "map[address:10.0.0.7 labels:map[app:vm version:v2] locality:eu/eu-1 ports:map[http:8080] serviceAccount:vm weight:3]" {
		t.Errorf("the entry's spec: %s", got)
	}
	if a := u.GetAnnotations(); a["team"] != "payments" || a["istio.io/connectedAt"] != first.Format(time.RFC3339Nano) {
		t.Errorf("the entry's annotations: %v", a)
	}
	version := u.GetResourceVersion()
	if err := regs.send(t, reg(model.RegistrationAlive, "10.0.0.7", first, time.Hour)); err != nil {
		t.Fatal(err)
	}
	if u, _ := entries.Get(context.Background(), "vms-10.0.0.7", metav1.GetOptions{}); u.GetResourceVersion() != version {
		t.Error("a repeated registration wrote the entry again")
	}

	// A WorkloadEntry of the same name written by someone else.
	if err := regs.send(t, reg(model.RegistrationConnect, "10.0.0.9", time.Now(), time.Hour)); err == nil || !strings.Contains(err.Error(), "not auto-registered") {
		t.Errorf("a registration over someone's WorkloadEntry: %v, want refused", err)
	}

	// Dated ahead of this clock: it would win over every real connection
	// to come.
	if err := regs.send(t, reg(model.RegistrationConnect, "10.0.0.7", time.Now().Add(time.Hour), time.Hour)); err == nil || !strings.Contains(err.Error(), "ahead of this clock") {
		t.Errorf("a registration dated an hour ahead: %v, want refused", err)
	}

	// A pusher that goes silent.
	if err := regs.send(t, reg(model.RegistrationConnect, "10.0.0.8", time.Now(), 100*time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	gone("vms-10.0.0.8", "the entry of a silent pusher's workload is removed")

	// Connected again: the end of the earlier connection changes nothing.
	second := first.Add(time.Second)
	if err := regs.send(t, reg(model.RegistrationConnect, "10.0.0.7", second, time.Hour)); err != nil {
		t.Fatal(err)
	}
	if err := regs.send(t, reg(model.RegistrationDisconnect, "10.0.0.7", first, time.Hour)); err != nil {
		t.Fatal(err)
	}

	// Another leader adopts it; the end of the current connection
	// removes it after the grace period.
	src.cancel()
	<-src.done
	src.done <- nil // for the cleanup
	start()
	if err := regs.send(t, reg(model.RegistrationDisconnect, "10.0.0.7", second, time.Hour)); err != nil {
		t.Fatal(err)
	}
	if u, err := entries.Get(context.Background(), "vms-10.0.0.7", metav1.GetOptions{}); err == nil && u.GetAnnotations()["istio.io/disconnectedAt"] == "" {
		t.Errorf("after the disconnection: annotations %v, want disconnectedAt", u.GetAnnotations())
	}
	gone("vms-10.0.0.7", "the entry goes after the grace period")
	if _, err := entries.Get(context.Background(), "vms-10.0.0.9", metav1.GetOptions{}); err != nil {
		t.Errorf("someone's WorkloadEntry: %v", err)
	}
}

// TestRegistrationsOfOneIdentityStarveNoOther: one identity's registrations
// are bounded (entries it holds; requests to the API server a second, the
// rest written when repeated), so that another namespace's workload still
// registers and keeps its entry; every request made on the identity's
// account is paid from its allowance, its disconnections' marks and
// removals too; and while registrations are lost before they are read
// (the ingester fell behind a flood), no entry is taken for disconnected
// on their account. Before, one VM identity's registrations took every
// write, and heartbeats the bus dropped cost another namespace's VM its
// WorkloadEntry; then, its connections ended as fast as they were made
// cost four requests each beyond its allowance, which queued the other
// namespace's write behind them (make loadtest-floods, H3).
func TestRegistrationsOfOneIdentityStarveNoOther(t *testing.T) {
	kc := kubetest.Get(t)
	kc.InstallIstioCRDs(t)
	flooded, quiet := kc.Namespace(t, nil), kc.Namespace(t, nil)
	_, cli := testutil.Etcd(t)
	for _, ns := range []string{flooded, quiet} {
		apply(t, kc, istioObject("WorkloadGroup", "v1", ns, "vms", map[string]any{"template": map[string]any{"serviceAccount": "vm"}}))
	}
	regs := &scriptedRegistrations{in: make(chan scripted)}
	startSource(t, kc, cli, "c1", func(c *kube.Config) {
		c.Registrations, c.RegistrationGrace = regs, 200*time.Millisecond
		c.RegistrationLimits = kube.RegistrationLimits{PerIdentity: 10, WritesPerSecond: 0.001, WriteBurst: 5}
	})
	reg := func(ns, address string, heartbeat time.Duration) model.Registration {
		return model.Registration{Op: model.RegistrationConnect, Group: "vms", Namespace: ns, Identity: "spiffe://cluster.local/ns/" + ns + "/sa/vm",
			Proxy: "sidecar~" + address + "~vm." + ns + "~" + ns + ".svc.cluster.local", Address: address,
			ConnectedAt: time.Now(), Pusher: "pusher-0", Heartbeat: heartbeat}
	}
	// The flooding identity: five written, the next left for later.
	var written []model.Registration
	for i := range 5 {
		r := reg(flooded, fmt.Sprintf("10.0.0.%d", i+1), time.Hour)
		if err := regs.send(t, r); err != nil {
			t.Fatalf("registration %d: %v", i+1, err)
		}
		written = append(written, r)
	}
	if err := regs.send(t, reg(flooded, "10.0.0.6", time.Hour)); !errors.Is(err, model.ErrNotMine) {
		t.Errorf("a registration past its identity's writes: %v, want it left unanswered (written when repeated)", err)
	}
	// Its workloads disconnect: with its allowance spent, neither marked
	// nor removed after their grace, on its account.
	for _, r := range written {
		r.Op = model.RegistrationDisconnect
		if err := regs.send(t, r); err != nil {
			t.Fatalf("disconnection: %v", err)
		}
	}
	floodedEntries := kc.Dynamic.Resource(gvr("WorkloadEntry")).Namespace(flooded)
	// Another namespace's workload is written at once.
	if err := regs.send(t, reg(quiet, "10.1.0.1", time.Second)); err != nil {
		t.Fatalf("another namespace's registration: %v", err)
	}

	// Heartbeats lost while the ingester falls behind: the quiet entry
	// stays, though none of its heartbeats (one a second) arrives for
	// twice the three it would be taken for disconnected after.
	entries := kc.Dynamic.Resource(gvr("WorkloadEntry")).Namespace(quiet)
	losing := time.Now()
	for time.Since(losing) < 6*time.Second {
		regs.lost.Add(1)
		time.Sleep(100 * time.Millisecond)
		if _, err := entries.Get(context.Background(), "vms-10.1.0.1", metav1.GetOptions{}); err != nil {
			t.Fatalf("the entry of a workload whose heartbeats may have been lost was removed after %s: %v", time.Since(losing), err)
		}
	}
	// Nothing lost any more: its silence counts.
	testutil.Eventually(t, 30*time.Second, "the entry of a workload no longer heard of is removed", func() (bool, string) {
		_, err := entries.Get(context.Background(), "vms-10.1.0.1", metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
	// By now the flooding identity's disconnected entries are many
	// graces old: still there, unmarked, their requests unpaid.
	for _, r := range written {
		e, err := floodedEntries.Get(context.Background(), r.EntryName(), metav1.GetOptions{})
		if err != nil {
			t.Errorf("the entry %s was removed on an identity's account with no allowance left: %v", r.EntryName(), err)
		} else if _, marked := e.GetAnnotations()["istio.io/disconnectedAt"]; marked {
			t.Errorf("the entry %s was marked disconnected on an identity's account with no allowance left", r.EntryName())
		}
	}
}

// TestRegistrationsBoundedPerIdentity: an identity holds at most its
// bound of entries; past it a registration is refused with the reason.
// Another identity cannot take over an entry while it is connected (it
// could, as any identity its group admits).
func TestRegistrationsBoundedPerIdentity(t *testing.T) {
	kc := kubetest.Get(t)
	kc.InstallIstioCRDs(t)
	ns := kc.Namespace(t, nil)
	_, cli := testutil.Etcd(t)
	apply(t, kc, istioObject("WorkloadGroup", "v1", ns, "vms", map[string]any{"template": map[string]any{}}))
	regs := &scriptedRegistrations{in: make(chan scripted)}
	startSource(t, kc, cli, "c1", func(c *kube.Config) {
		c.Registrations = regs
		c.RegistrationLimits = kube.RegistrationLimits{PerIdentity: 2}
	})
	reg := func(sa, address string) model.Registration {
		return model.Registration{Op: model.RegistrationConnect, Group: "vms", Namespace: ns, Identity: "spiffe://cluster.local/ns/" + ns + "/sa/" + sa,
			Proxy: "sidecar~" + address + "~vm." + ns + "~" + ns + ".svc.cluster.local", Address: address,
			ConnectedAt: time.Now(), Pusher: "pusher-0", Heartbeat: time.Hour}
	}
	for _, a := range []string{"10.0.0.1", "10.0.0.2"} {
		if err := regs.send(t, reg("a", a)); err != nil {
			t.Fatal(err)
		}
	}
	if err := regs.send(t, reg("a", "10.0.0.3")); err == nil || !strings.Contains(err.Error(), "the most one identity may") {
		t.Errorf("a third registration of an identity bounded to two: %v, want refused with the reason", err)
	}
	if err := regs.send(t, reg("b", "10.0.0.4")); err != nil {
		t.Errorf("another identity's registration: %v", err)
	}
	// Another identity the group admits, at a connected workload's
	// address: the entry stays its holder's.
	if err := regs.send(t, reg("b", "10.0.0.1")); err == nil || !strings.Contains(err.Error(), "held by spiffe://cluster.local/ns/"+ns+"/sa/a") {
		t.Errorf("another identity taking over a connected entry: %v, want refused", err)
	}
}
