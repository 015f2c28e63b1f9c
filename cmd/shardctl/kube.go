package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"github.com/shardpilot/shardpilot/pkg/store"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"
)

// How shardctl reaches the pods it finds in Kubernetes.
const (
	reachPortForward = "port-forward" // through the API server, as kubectl port-forward (from outside the cluster)
	reachPodIP       = "pod-ip"       // at the pod's IP (from a pod in the cluster)
)

// kube finds the pushers and ingesters as pods of a release, as istioctl
// finds istiod: the ready pods of the namespace labelled
// app.kubernetes.io/component=<role> (and the selector), each asked at its
// http-admin port.
type kube struct {
	kubeconfig, context, namespace, selector, reach string
	// tls asks the pods' https-admin port (--admin-ca-file given).
	tls bool

	mu       sync.Mutex
	forwards []chan struct{} // closed to stop a port-forward
	wg       sync.WaitGroup  // the port-forwards' goroutines
	// tokens are the admin tokens of the pods found, by the address they
	// are reached at: read from the Secret each pod mounts as admin-token
	// (the chart's), with the caller's credentials. tokenErr says why one
	// could not be read.
	tokens   map[string]string
	tokenErr error
}

// adminTokenVolume is the volume the chart mounts the admin token from.
const adminTokenVolume = "admin-token"

// token returns the admin token of the pod reached at addr ("" when none
// was read).
func (k *kube) token(addr string) string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.tokens[addr]
}

// tokenError says why a pod's admin token could not be read (nil: none
// failed).
func (k *kube) tokenError() error {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.tokenErr
}

// podToken reads the token of the Secret the pod mounts as admin-token
// ("" when it mounts none), once per Secret.
func (k *kube) podToken(ctx context.Context, client kubernetes.Interface, p *corev1.Pod, read map[string]string) string {
	for _, v := range p.Spec.Volumes {
		if v.Name != adminTokenVolume || v.Secret == nil {
			continue
		}
		if tok, ok := read[v.Secret.SecretName]; ok {
			return tok
		}
		sec, err := client.CoreV1().Secrets(p.Namespace).Get(ctx, v.Secret.SecretName, metav1.GetOptions{})
		tok := ""
		if err != nil {
			k.mu.Lock()
			k.tokenErr = fmt.Errorf("the admin token, Secret %s/%s: %w", p.Namespace, v.Secret.SecretName, err)
			k.mu.Unlock()
		} else {
			tok = strings.TrimSpace(string(sec.Data["token"]))
		}
		read[v.Secret.SecretName] = tok
		return tok
	}
	return ""
}

// close stops the port-forwards and waits for them.
func (k *kube) close() {
	k.mu.Lock()
	for _, stop := range k.forwards {
		close(stop)
	}
	k.forwards = nil
	k.mu.Unlock()
	k.wg.Wait()
}

func (k *kube) config() (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if k.kubeconfig != "" {
		rules.ExplicitPath = k.kubeconfig
	}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: k.context}).ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	return cfg, nil
}

// find returns the members of a role ("" for every role) found as pods.
func (k *kube) find(ctx context.Context, role string) ([]store.Member, error) {
	cfg, err := k.config()
	if err != nil {
		return nil, err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	if _, err := labels.Parse(k.selector); err != nil {
		return nil, fmt.Errorf("--kube-selector %q: %w", k.selector, err)
	}
	var out []store.Member
	read := map[string]string{} // tokens by Secret
	for _, r := range []string{"pusher", "ingester"} {
		if role != "" && role != r {
			continue
		}
		sel := "app.kubernetes.io/component=" + r
		if k.selector != "" {
			sel = k.selector + "," + sel
		}
		pods, err := client.CoreV1().Pods(k.namespace).List(ctx, metav1.ListOptions{LabelSelector: sel})
		if err != nil {
			return nil, fmt.Errorf("pods labelled %s in namespace %s: %w", sel, k.namespace, err)
		}
		for _, p := range pods.Items {
			if !ready(&p) {
				continue
			}
			m := store.Member{Role: r, Name: p.Name}
			addr, err := k.reachPod(ctx, cfg, client, &p)
			if err != nil {
				return nil, fmt.Errorf("pod %s/%s: %w", p.Namespace, p.Name, err)
			}
			if k.tls {
				m.AdminTLS = addr
			} else {
				m.Admin = addr
			}
			if tok := k.podToken(ctx, client, &p, read); tok != "" {
				k.mu.Lock()
				if k.tokens == nil {
					k.tokens = map[string]string{}
				}
				k.tokens[addr] = tok
				k.mu.Unlock()
			}
			out = append(out, m)
		}
	}
	if len(out) == 0 {
		what := "pusher or ingester"
		if role != "" {
			what = role
		}
		return nil, fmt.Errorf("no ready %s pod in namespace %q labelled %s (is --kube-namespace the release's?)", what, k.namespace,
			cmp.Or(k.selector, "app.kubernetes.io/component"))
	}
	return out, nil
}

// ready says whether a pod runs and is ready.
func ready(p *corev1.Pod) bool {
	if p.Status.Phase != corev1.PodRunning {
		return false
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// adminPort is the pod's admin port: http-admin (15014), or https-admin
// (15443) over TLS.
func (k *kube) adminPort(p *corev1.Pod) int32 {
	name, port := "http-admin", int32(15014)
	if k.tls {
		name, port = "https-admin", 15443
	}
	for _, c := range p.Spec.Containers {
		for _, cp := range c.Ports {
			if cp.Name == name {
				return cp.ContainerPort
			}
		}
	}
	return port
}

// reachPod returns the address the pod's admin port is reached at.
func (k *kube) reachPod(ctx context.Context, cfg *rest.Config, client kubernetes.Interface, p *corev1.Pod) (string, error) {
	port := strconv.Itoa(int(k.adminPort(p)))
	if k.reach != reachPodIP {
		return k.portForward(ctx, cfg, client, p, port) // run checked --kube-reach
	}
	if p.Status.PodIP == "" {
		return "", errors.New("no pod IP")
	}
	return net.JoinHostPort(p.Status.PodIP, port), nil
}

// portForward forwards a local loopback port to the pod's port through
// the API server, as kubectl port-forward does, until close.
func (k *kube) portForward(ctx context.Context, cfg *rest.Config, client kubernetes.Interface, p *corev1.Pod, port string) (string, error) {
	transport, upgrader, err := spdy.RoundTripperFor(cfg)
	if err != nil {
		return "", err
	}
	url := client.CoreV1().RESTClient().Post().Resource("pods").Namespace(p.Namespace).Name(p.Name).SubResource("portforward").URL()
	dialer := spdy.NewDialer(upgrader, &http.Client{Transport: transport}, http.MethodPost, url)
	stop, ready := make(chan struct{}), make(chan struct{})
	fw, err := portforward.NewOnAddresses(dialer, []string{"127.0.0.1"}, []string{"0:" + port}, stop, ready, io.Discard, io.Discard)
	if err != nil {
		return "", err
	}
	k.mu.Lock()
	k.forwards = append(k.forwards, stop)
	k.mu.Unlock()
	failed := make(chan error, 1)
	k.wg.Go(func() { failed <- fw.ForwardPorts() })
	select {
	case <-ready:
	case err := <-failed:
		return "", fmt.Errorf("port-forward: %w", err)
	case <-ctx.Done():
		return "", fmt.Errorf("port-forward: %w", ctx.Err())
	}
	ports, err := fw.GetPorts()
	if err != nil || len(ports) == 0 {
		return "", fmt.Errorf("port-forward: no local port (%v)", err)
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(int(ports[0].Local))), nil
}
