package sds

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/shardpilot/shardpilot/pkg/xds/generate"
	"github.com/shardpilot/shardpilot/pkg/xds/identity"
	authzv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
)

// KubeCredentials serves the TLS Secrets (type kubernetes.io/tls) of a
// cluster as credentials, as Istio serves a Gateway's credentialName: a
// Secret "<name>" is the secret "<name>" (tls.crt and tls.key) and, when
// it holds a ca.crt, "<name>-cacert" (the CA that verifies clients).
//
// An identity is served its namespace's credentials only when its service
// account may list the namespace's Secrets, as istiod authorizes a
// gateway's credentials (a SubjectAccessReview, remembered for a minute):
// the gateways whose Role lets them read Secrets, and no other workload of
// the namespace.
type KubeCredentials struct {
	client  kubernetes.Interface
	log     *slog.Logger
	secrets corelisters.SecretLister

	mu         sync.Mutex
	authorized map[identity.ID]authorization
}

// NewKubeCredentials returns credentials read from a cluster.
func NewKubeCredentials(client kubernetes.Interface, log *slog.Logger) *KubeCredentials {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &KubeCredentials{client: client, log: log}
}

// Run watches the cluster's TLS Secrets until ctx is done: started is
// called once they are all read, and changed, from then on, with the
// namespace of every Secret added, updated or deleted (nil: not called).
func (k *KubeCredentials) Run(ctx context.Context, changed func(namespace string), started func()) error {
	factory := informers.NewSharedInformerFactoryWithOptions(k.client, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("type", string(corev1.SecretTypeTLS)).String()
		}))
	inf := factory.Core().V1().Secrets()
	k.secrets = inf.Lister()
	var synced atomic.Bool
	if changed == nil {
		changed = func(string) {}
	}
	onChange := func(o any) {
		if s, ok := o.(*corev1.Secret); ok && synced.Load() {
			changed(s.Namespace)
		} else if t, ok := o.(cache.DeletedFinalStateUnknown); ok && synced.Load() {
			if s, ok := t.Obj.(*corev1.Secret); ok {
				changed(s.Namespace)
			}
		}
	}
	if _, err := inf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    onChange,
		UpdateFunc: func(_, o any) { onChange(o) },
		DeleteFunc: onChange,
	}); err != nil {
		return fmt.Errorf("sds: watch Secrets: %w", err)
	}
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	for typ, ok := range factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("sds: %v never synced: %w", typ, ctx.Err())
		}
	}
	synced.Store(true)
	k.log.Info("TLS Secrets read for gateway credentials")
	if started != nil {
		started()
	}
	<-ctx.Done()
	return nil
}

// authorization is a review's answer and how long it holds.
type authorization struct {
	allowed bool
	until   time.Time
}

// reviewFor is how long a review's answer is remembered.
var reviewFor = time.Minute

// Authorized says whether id's service account may list the Secrets of
// its namespace, as the API server answers a SubjectAccessReview; an
// answer is remembered for a minute, a failure to ask is not (and is a
// refusal).
func (k *KubeCredentials) Authorized(ctx context.Context, id identity.ID) bool {
	now := time.Now()
	k.mu.Lock()
	a, ok := k.authorized[id]
	k.mu.Unlock()
	if ok && now.Before(a.until) {
		return a.allowed
	}
	res, err := k.client.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{
		User:               "system:serviceaccount:" + id.Namespace + ":" + id.ServiceAccount,
		Groups:             []string{"system:serviceaccounts", "system:serviceaccounts:" + id.Namespace, "system:authenticated"},
		ResourceAttributes: &authzv1.ResourceAttributes{Namespace: id.Namespace, Verb: "list", Resource: "secrets"},
	}}, metav1.CreateOptions{})
	if err != nil {
		k.log.Warn("cannot ask whether an identity may read its namespace's credentials; not served them", "identity", id, "err", err)
		return false
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.authorized == nil {
		k.authorized = map[identity.ID]authorization{}
	}
	for known, a := range k.authorized {
		if now.After(a.until) {
			delete(k.authorized, known)
		}
	}
	k.authorized[id] = authorization{allowed: res.Status.Allowed, until: now.Add(reviewFor)}
	if !res.Status.Allowed {
		k.log.Debug("identity may not list its namespace's Secrets; not served their credentials", "identity", id)
	}
	return res.Status.Allowed
}

// Namespace returns the credentials of a namespace's TLS Secrets.
func (k *KubeCredentials) Namespace(namespace string) map[string]types.Resource {
	out := map[string]types.Resource{}
	if k.secrets == nil {
		return out
	}
	list, err := k.secrets.Secrets(namespace).List(labels.Everything())
	if err != nil {
		return out
	}
	for _, s := range list {
		cert, key := s.Data[corev1.TLSCertKey], s.Data[corev1.TLSPrivateKeyKey]
		if len(cert) == 0 || len(key) == 0 {
			k.log.Warn("TLS Secret without a certificate or key; not served", "namespace", namespace, "secret", s.Name)
			continue
		}
		name := generate.CredentialResource(s.Name)
		out[name] = &tlsv3.Secret{Name: name, Type: &tlsv3.Secret_TlsCertificate{TlsCertificate: &tlsv3.TlsCertificate{
			CertificateChain: inline(cert), PrivateKey: inline(key)}}}
		if ca := s.Data["ca.crt"]; len(ca) > 0 {
			out[name+"-cacert"] = &tlsv3.Secret{Name: name + "-cacert", Type: &tlsv3.Secret_ValidationContext{
				ValidationContext: &tlsv3.CertificateValidationContext{TrustedCa: inline(ca)}}}
		}
	}
	return out
}
