package kube

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strings"
	"time"

	"github.com/shardpilot/shardpilot/pkg/ingest/istio"
	"github.com/shardpilot/shardpilot/pkg/model"
	"golang.org/x/sync/errgroup"
	"golang.org/x/time/rate"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/cache"
)

// Registrations deliver the registrations of workloads whose agents
// connected naming a WorkloadGroup (bus.Registrations): handle's answer
// goes back to the pusher, model.ErrNotMine leaving the answer to the
// part that owns the namespace.
type Registrations interface {
	Run(ctx context.Context, handle func(context.Context, model.Registration) error) error
	// Lost counts the registrations lost before they were handed over
	// (the ingester fell behind): any heartbeat may be among them.
	Lost() uint64
}

// The annotations istiod sets on the WorkloadEntries it registers.
const (
	annotationGroup        = "istio.io/autoRegistrationGroup"
	annotationController   = "istio.io/workloadController"
	annotationConnectedAt  = "istio.io/connectedAt"
	annotationDisconnected = "istio.io/disconnectedAt"
)

// registrar makes the WorkloadEntry of each registered workload of the
// part's namespaces from its WorkloadGroup, as istiod does: the group's
// template, the workload's address, its labels over the group's, its
// network and locality, owned by the group. The entry is marked
// disconnected when its pusher says the stream ended, or when the pusher
// has not repeated it for three heartbeats (the pusher is gone), and is
// removed Grace after unless the workload connected again. Its state is
// its loop's alone.
type registrar struct {
	client  dynamic.Interface
	entries schema.GroupVersionResource
	groups  cache.GenericLister
	group   schema.GroupVersion // the WorkloadGroups' version watched
	wles    cache.GenericLister
	mine    func(string) bool
	grace   time.Duration
	limits  RegistrationLimits
	log     *slog.Logger
	count   func(result string)

	state map[string]*registered // "<namespace>/<entry>"
	// writes are each identity's allowance of writes; lost is the count
	// of lost registrations at the last sweep.
	writes map[string]*rate.Limiter
	lost   uint64
}

// errDeferred leaves a registration unanswered: its identity has written
// its share for now, and its pusher repeats it with the next heartbeat.
var errDeferred = errors.New("the identity's writes are at their rate: written when repeated")

// registered is what the registrar knows of one entry.
type registered struct {
	ns, name     string
	identity     string
	connectedAt  time.Time
	lastSeen     time.Time
	heartbeat    time.Duration
	disconnected time.Time // zero while connected
	written      bool      // the entry shows this connection
}

// request is a registration handed to the loop, and where its answer goes.
type request struct {
	r      model.Registration
	answer chan error
}

// registrar returns the registrar of the part's workloads, nil without
// Registrations or when the cluster serves no WorkloadEntry or
// WorkloadGroup.
func (s *Source) registrar(w *watched, served map[string]servedResource) *registrar {
	entries, ok1 := served[istio.KindWorkloadEntry]
	groups, ok2 := served[istio.KindWorkloadGroup]
	if s.cfg.Registrations == nil {
		return nil
	}
	if !ok1 || !ok2 {
		s.cfg.Log.Warn("the cluster serves no WorkloadEntry or WorkloadGroup: workloads are not registered", "cluster", s.cfg.Cluster)
		return nil
	}
	group := istio.GroupOf(istio.KindWorkloadEntry)
	return &registrar{
		client:  s.cfg.Dynamic,
		entries: schema.GroupVersionResource{Group: group, Version: entries.version, Resource: entries.plural},
		group:   schema.GroupVersion{Group: istio.GroupOf(istio.KindWorkloadGroup), Version: groups.version},
		groups:  w.istio[istio.KindWorkloadGroup], wles: w.istio[istio.KindWorkloadEntry],
		mine: func(ns string) bool { return s.owns(w, ns) }, grace: s.cfg.RegistrationGrace, limits: s.cfg.RegistrationLimits, log: s.cfg.Log.With("part", "registrar", "cluster", s.cfg.Cluster),
		count: func(result string) { s.m.registrations.WithLabelValues(s.cfg.Cluster, result).Inc() },
	}
}

// owns reports whether one namespace is in the mesh and in this source's
// part, looking it alone up (namespaceFilter lists them all, for a sync).
func (s *Source) owns(w *watched, ns string) bool {
	if PartOf(ns, s.cfg.Parts) != s.cfg.Part {
		return false
	}
	if sel := s.cfg.NamespaceSelector; sel != nil && !sel.Empty() {
		n, err := w.namespaces.Get(ns)
		return err == nil && sel.Matches(labels.Set(n.Labels))
	}
	return true
}

// run serves registrations until ctx is done. It first adopts the entries
// registered before (by an earlier leader): each is kept for three
// heartbeats of 10s unless its pusher repeats it.
func (g *registrar) run(ctx context.Context, regs Registrations) error {
	g.state, g.writes = map[string]*registered{}, map[string]*rate.Limiter{}
	g.lost = regs.Lost()
	g.adopt(time.Now())
	in := make(chan request)
	eg, ctx := errgroup.WithContext(ctx)
	eg.Go(func() error {
		return regs.Run(ctx, func(ctx context.Context, r model.Registration) error {
			if !g.mine(r.Namespace) {
				return model.ErrNotMine
			}
			req := request{r, make(chan error, 1)}
			select {
			case in <- req:
			case <-ctx.Done():
				return ctx.Err()
			}
			if err := <-req.answer; !errors.Is(err, errDeferred) {
				return err
			}
			return model.ErrNotMine // unanswered: kept and repeated by its pusher
		})
	})
	eg.Go(func() error {
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return nil
			case req := <-in:
				req.answer <- g.handle(ctx, req.r, time.Now())
			case now := <-tick.C:
				g.sweep(ctx, now, regs.Lost())
			}
		}
	})
	return eg.Wait()
}

// adopt takes over the auto-registered entries of the part's namespaces.
func (g *registrar) adopt(now time.Time) {
	list, _ := g.wles.List(labels.Everything())
	for _, o := range list {
		u, ok := o.(*unstructured.Unstructured)
		if !ok || !g.mine(u.GetNamespace()) || u.GetAnnotations()[annotationGroup] == "" {
			continue
		}
		a := u.GetAnnotations()
		r := &registered{ns: u.GetNamespace(), name: u.GetName(), lastSeen: now, heartbeat: 10 * time.Second, written: true}
		r.connectedAt, _ = time.Parse(time.RFC3339Nano, a[annotationConnectedAt])
		if at, ok := a[annotationDisconnected]; ok {
			if r.disconnected, _ = time.Parse(time.RFC3339Nano, at); r.disconnected.IsZero() {
				r.disconnected = now
			}
		}
		g.state[r.ns+"/"+r.name] = r
	}
}

// handle applies one registration.
func (g *registrar) handle(ctx context.Context, r model.Registration, now time.Time) error {
	key := r.Namespace + "/" + r.EntryName()
	cur := g.state[key]
	if r.Op == model.RegistrationDisconnect {
		if cur != nil && cur.connectedAt.Equal(r.ConnectedAt) && cur.disconnected.IsZero() {
			cur.disconnected = now
			g.markDisconnected(ctx, cur, now)
		}
		return nil
	}
	if r.ConnectedAt.After(now.Add(model.MaxRegistrationSkew)) {
		g.count("refused")
		return fmt.Errorf("registration of %s: connected at %s, ahead of this clock by more than %v", key, r.ConnectedAt.Format(time.RFC3339), model.MaxRegistrationSkew)
	}
	if cur != nil && r.ConnectedAt.Before(cur.connectedAt) {
		return nil // an earlier connection of a workload connected again since
	}
	if cur != nil && cur.disconnected.IsZero() && cur.identity != "" && cur.identity != r.Identity {
		// Another workload the group admits, at the same address: the
		// entry stays its connected holder's.
		g.count("refused")
		return fmt.Errorf("registration of %s: the entry is held by %s while it is connected", key, cur.identity)
	}
	if cur != nil && cur.connectedAt.Equal(r.ConnectedAt) && cur.written && cur.disconnected.IsZero() {
		cur.lastSeen = now
		return nil
	}
	entry, err := g.entry(r)
	if err != nil {
		g.count("refused")
		return err
	}
	if cur == nil {
		if err := g.bound(r); err != nil {
			g.count("refused")
			return err
		}
	}
	if !g.allow(r.Identity, r.Namespace, now, writeCost) {
		g.count("deferred")
		return errDeferred
	}
	if cur == nil {
		cur = &registered{ns: r.Namespace, name: entry.GetName()}
		g.state[key] = cur
	}
	cur.identity = r.Identity
	cur.connectedAt, cur.lastSeen, cur.heartbeat, cur.disconnected, cur.written = r.ConnectedAt, now, r.Heartbeat, time.Time{}, false
	if err := g.write(ctx, entry); err != nil {
		g.count("failed")
		return err
	}
	cur.written = true
	g.log.Info("workload registered", "entry", key, "proxy", r.Proxy, "pusher", r.Pusher)
	return nil
}

// bound refuses a new entry past what its identity and its namespace may
// hold.
func (g *registrar) bound(r model.Registration) error {
	byIdentity, byNamespace := 0, 0
	for _, e := range g.state {
		if e.identity == r.Identity {
			byIdentity++
		}
		if e.ns == r.Namespace {
			byNamespace++
		}
	}
	if byIdentity >= g.limits.PerIdentity {
		return fmt.Errorf("identity %s holds %d registered workloads, the most one identity may (--max-registrations-per-identity)", r.Identity, byIdentity)
	}
	if byNamespace >= g.limits.PerNamespace {
		return fmt.Errorf("namespace %s holds %d registered workloads, the most one namespace may (--max-registrations-per-namespace)", r.Namespace, byNamespace)
	}
	return nil
}

// What the registrar's requests to the API server cost an allowance: an
// entry written (created; updated, when it is there, costs one more), and
// marked disconnected or removed (each read first, then written).
const (
	writeCost  = 1
	markCost   = 2
	removeCost = 2
)

// allow takes n requests from the allowances of an identity and of its
// namespace, or from neither when either has too few: every request the
// registrar makes on a registration's account (writing the entry, marking
// it disconnected, removing it) is paid from them, so that one identity's
// connections, ended as fast as they are made, cannot queue the others'
// writes behind its own. An entry adopted from an earlier leader (no
// identity known) pays nothing. The allowances of those that have written
// nothing for a while are forgotten.
func (g *registrar) allow(id, ns string, now time.Time, n int) bool {
	if id == "" {
		return true
	}
	mine := g.limiter("identity "+id, now, g.limits.WritesPerSecond, g.limits.WriteBurst)
	theirs := g.limiter("namespace "+ns, now, g.limits.NamespaceWritesPerSecond, g.limits.NamespaceWriteBurst)
	if mine.TokensAt(now) < float64(n) || theirs.TokensAt(now) < float64(n) {
		return false
	}
	return mine.AllowN(now, n) && theirs.AllowN(now, n)
}

// limiter is the allowance of key, made full when it is new.
func (g *registrar) limiter(key string, now time.Time, perSecond float64, burst int) *rate.Limiter {
	if l, ok := g.writes[key]; ok {
		return l
	}
	if len(g.writes) > 10_000 {
		for k, l := range g.writes {
			if l.TokensAt(now) >= float64(l.Burst()) {
				delete(g.writes, k)
			}
		}
	}
	l := rate.NewLimiter(rate.Limit(perSecond), burst)
	g.writes[key] = l
	return l
}

// entry makes a registration's WorkloadEntry from its group, after
// checking that the group admits the identity the pusher verified.
func (g *registrar) entry(r model.Registration) (*unstructured.Unstructured, error) {
	o, err := g.groups.ByNamespace(r.Namespace).Get(r.Group)
	if err != nil {
		return nil, fmt.Errorf("WorkloadGroup %s/%s not found", r.Namespace, r.Group)
	}
	group, ok := o.(*unstructured.Unstructured)
	if !ok {
		return nil, fmt.Errorf("WorkloadGroup %s/%s: unexpected %T", r.Namespace, r.Group, o)
	}
	template, _, _ := unstructured.NestedMap(group.Object, "spec", "template")
	if template == nil {
		template = map[string]any{}
	}
	ns, sa, ok := spiffeNamespaceAccount(r.Identity)
	switch account, _, _ := unstructured.NestedString(template, "serviceAccount"); {
	case !ok:
		return nil, fmt.Errorf("identity %q is not spiffe://<trust domain>/ns/<namespace>/sa/<service account>", r.Identity)
	case ns != r.Namespace:
		return nil, fmt.Errorf("identity %s is of namespace %q, not the WorkloadGroup's %q", r.Identity, ns, r.Namespace)
	case account != "" && account != sa:
		return nil, fmt.Errorf("identity %s is not the WorkloadGroup %s/%s's service account %q", r.Identity, r.Namespace, r.Group, account)
	}
	// The node's labels over the group's over the template's, as istiod;
	// the locality travels in its own field.
	labels := map[string]string{}
	tl, _, _ := unstructured.NestedStringMap(template, "labels")
	gl, _, _ := unstructured.NestedStringMap(group.Object, "spec", "metadata", "labels")
	for _, m := range []map[string]string{tl, gl, r.Labels} {
		maps.Copy(labels, m)
	}
	delete(labels, "istio-locality")
	spec := maps.Clone(template)
	spec["address"] = r.Address
	if len(labels) > 0 {
		spec["labels"] = toAny(labels)
	}
	if r.Network != "" {
		spec["network"] = r.Network
	}
	if r.Locality != "" {
		spec["locality"] = r.Locality
	}
	annotations, _, _ := unstructured.NestedStringMap(group.Object, "spec", "metadata", "annotations")
	if annotations == nil {
		annotations = map[string]string{}
	}
	annotations[annotationGroup] = r.Group
	annotations[annotationController] = r.Pusher
	annotations[annotationConnectedAt] = r.ConnectedAt.Format(time.RFC3339Nano)
	u := &unstructured.Unstructured{Object: map[string]any{"spec": spec}}
	u.SetAPIVersion(g.entries.GroupVersion().String())
	u.SetKind(istio.KindWorkloadEntry)
	u.SetNamespace(r.Namespace)
	u.SetName(r.EntryName())
	u.SetLabels(labels)
	u.SetAnnotations(annotations)
	u.SetOwnerReferences([]metav1.OwnerReference{{APIVersion: g.group.String(), Kind: istio.KindWorkloadGroup,
		Name: group.GetName(), UID: group.GetUID(), Controller: new(true)}})
	return u, nil
}

// write creates the entry, or updates the one there: a WorkloadEntry of
// that name written by someone else is left alone and the registration
// refused.
func (g *registrar) write(ctx context.Context, entry *unstructured.Unstructured) error {
	api := g.client.Resource(g.entries).Namespace(entry.GetNamespace())
	_, err := api.Create(ctx, entry, metav1.CreateOptions{FieldManager: "shardpilot-ingester"})
	if err == nil {
		g.count("created")
		return nil
	}
	if !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create WorkloadEntry %s/%s: %w", entry.GetNamespace(), entry.GetName(), err)
	}
	cur, err := api.Get(ctx, entry.GetName(), metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("read WorkloadEntry %s/%s: %w", entry.GetNamespace(), entry.GetName(), err)
	}
	if cur.GetAnnotations()[annotationGroup] == "" {
		return fmt.Errorf("WorkloadEntry %s/%s exists and was not auto-registered: left alone", cur.GetNamespace(), cur.GetName())
	}
	entry.SetResourceVersion(cur.GetResourceVersion())
	entry.SetUID(cur.GetUID())
	if _, err := api.Update(ctx, entry, metav1.UpdateOptions{FieldManager: "shardpilot-ingester"}); err != nil {
		return fmt.Errorf("update WorkloadEntry %s/%s: %w", entry.GetNamespace(), entry.GetName(), err)
	}
	g.count("updated")
	return nil
}

// markDisconnected records the end of an entry's connection on it, as
// istiod: its connectedAt goes, disconnectedAt comes. When its identity
// or namespace has no allowance left, the mark is left out: the entry is
// removed after its grace all the same.
func (g *registrar) markDisconnected(ctx context.Context, r *registered, now time.Time) {
	if !g.allow(r.identity, r.ns, now, markCost) {
		g.count("unmarked")
		return
	}
	api := g.client.Resource(g.entries).Namespace(r.ns)
	cur, err := api.Get(ctx, r.name, metav1.GetOptions{})
	if err != nil {
		return // gone already, or the sweep deletes it
	}
	a := cur.GetAnnotations()
	if a[annotationConnectedAt] != r.connectedAt.Format(time.RFC3339Nano) {
		return // connected again, elsewhere
	}
	delete(a, annotationConnectedAt)
	a[annotationDisconnected] = now.Format(time.RFC3339Nano)
	cur.SetAnnotations(a)
	if _, err := api.Update(ctx, cur, metav1.UpdateOptions{FieldManager: "shardpilot-ingester"}); err != nil {
		g.log.Warn("WorkloadEntry not marked disconnected", "entry", r.ns+"/"+r.name, "err", err)
	}
}

// sweep takes the entries whose pushers went silent for disconnected, and
// removes those disconnected for Grace.
func (g *registrar) sweep(ctx context.Context, now time.Time, lost uint64) {
	if lost != g.lost {
		// A heartbeat may be among the registrations lost: no entry is
		// taken for disconnected on their account.
		g.log.Warn("registrations were lost before they were read (the ingester fell behind): every registered workload is taken for heard of", "lost", lost-g.lost)
		g.lost = lost
		for _, r := range g.state {
			if r.disconnected.IsZero() {
				r.lastSeen = now
			}
		}
	}
	for key, r := range g.state {
		if r.disconnected.IsZero() && now.Sub(r.lastSeen) > 3*r.heartbeat {
			g.log.Info("registered workload not heard of: taken for disconnected", "entry", key, "since", r.lastSeen)
			r.disconnected = now
			g.markDisconnected(ctx, r, now)
		}
		if r.disconnected.IsZero() || now.Sub(r.disconnected) < g.grace {
			continue
		}
		if !g.allow(r.identity, r.ns, now, removeCost) {
			continue // removed once its identity and namespace may pay
		}
		if err := g.remove(ctx, r); err != nil {
			g.log.Warn("WorkloadEntry not removed; retried", "entry", key, "err", err)
			continue
		}
		delete(g.state, key)
	}
}

// remove deletes a disconnected entry, unless it shows a later connection.
func (g *registrar) remove(ctx context.Context, r *registered) error {
	api := g.client.Resource(g.entries).Namespace(r.ns)
	cur, err := api.Get(ctx, r.name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if at := cur.GetAnnotations()[annotationConnectedAt]; at != "" {
		if t, _ := time.Parse(time.RFC3339Nano, at); t.After(r.connectedAt) {
			return nil // connected again since
		}
	}
	rv := cur.GetResourceVersion()
	err = api.Delete(ctx, r.name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{ResourceVersion: &rv}})
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	g.count("removed")
	g.log.Info("registered workload removed", "entry", r.ns+"/"+r.name)
	return nil
}

// spiffeNamespaceAccount reads spiffe://<td>/ns/<namespace>/sa/<account>.
func spiffeNamespaceAccount(id string) (ns, sa string, ok bool) {
	rest, ok := strings.CutPrefix(id, "spiffe://")
	if !ok {
		return "", "", false
	}
	parts := strings.Split(rest, "/")
	if len(parts) != 5 || parts[1] != "ns" || parts[3] != "sa" || parts[2] == "" || parts[4] == "" {
		return "", "", false
	}
	return parts[2], parts[4], true
}

func toAny(m map[string]string) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
