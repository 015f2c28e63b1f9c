// Package kubetest runs a real kube-apiserver, on a real etcd, for the
// Kubernetes integration tests: the binaries come from hack/kube-binaries.sh
// (built once into a cache folder), one apiserver serves a whole test
// process, and each test works in namespaces of its own. No controllers
// run: tests write EndpointSlices themselves.
package kubetest

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardpilot/shardpilot/internal/testutil"
	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// Cluster is a running apiserver and clients to it.
type Cluster struct {
	Config  *rest.Config
	Client  kubernetes.Interface
	Dynamic dynamic.Interface
	// Etcd is the client URL of the apiserver's own etcd (a separate
	// process), which a benchmark may share under another prefix.
	Etcd string

	dir      string
	procs    []*exec.Cmd
	stopOnce sync.Once
}

var (
	shared    *Cluster
	sharedErr error
)

// Main starts the apiserver, runs the package's tests, stops the apiserver
// and fails if goroutines outlive the tests. Use it as TestMain.
func Main(m *testing.M) {
	shared, sharedErr = start()
	code := m.Run()
	if shared != nil {
		shared.stop()
	}
	if code == 0 {
		if err := goleak.Find(testutil.LeakOptions()...); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: errors on successful test run: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

// Get returns the process's apiserver, failing the test if it did not start.
func Get(t testing.TB) *Cluster {
	t.Helper()
	if sharedErr != nil {
		t.Fatalf("kube-apiserver: %v", sharedErr)
	}
	if shared == nil {
		t.Fatal("kubetest: use kubetest.Main as the package's TestMain")
	}
	return shared
}

// StartAnother starts a second, independent apiserver for the test, as
// another cluster; it stops when the test ends.
func StartAnother(t testing.TB) *Cluster {
	t.Helper()
	c, err := start()
	if err != nil {
		t.Fatalf("kube-apiserver: %v", err)
	}
	t.Cleanup(c.stop)
	return c
}

// CreateNamespace creates a namespace with a given name.
func (c *Cluster) CreateNamespace(t testing.TB, name string, labels map[string]string) {
	t.Helper()
	_, err := c.Client.CoreV1().Namespaces().Create(context.Background(),
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
}

// Namespace creates a namespace for the test with the given labels and
// returns its name.
func (c *Cluster) Namespace(t testing.TB, labels map[string]string) string {
	t.Helper()
	name := strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name()))
	if len(name) > 50 {
		name = name[:50]
	}
	name = strings.Trim(name, "-") + fmt.Sprintf("-%d", time.Now().UnixNano()%100000)
	c.CreateNamespace(t, name, labels)
	return name
}

func binaries() (string, error) {
	if dir := os.Getenv("SHARDPILOT_KUBE_BIN"); dir != "" {
		return dir, nil
	}
	root, err := repoRoot()
	if err != nil {
		return "", err
	}
	cmd := exec.Command(filepath.Join(root, "hack", "kube-binaries.sh"))
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("hack/kube-binaries.sh: %w", err)
	}
	return strings.TrimSpace(string(out)), nil
}

func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "hack", "kube-binaries.sh")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("kubetest: hack/kube-binaries.sh not found above the working directory")
		}
		dir = parent
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func start() (*Cluster, error) {
	bin, err := binaries()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "shardpilot-kube-")
	if err != nil {
		return nil, err
	}
	c := &Cluster{dir: dir}
	ok := false
	defer func() {
		if !ok {
			c.stop()
		}
	}()
	ports := make([]int, 3)
	for i := range ports {
		if ports[i], err = freePort(); err != nil {
			return nil, err
		}
	}
	etcdURL := fmt.Sprintf("http://127.0.0.1:%d", ports[0])
	c.Etcd = etcdURL
	peerURL := fmt.Sprintf("http://127.0.0.1:%d", ports[1])
	if err := c.run(filepath.Join(bin, "etcd"), "etcd.log",
		"--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "default="+peerURL, "--log-level", "warn",
		"--unsafe-no-fsync"); err != nil {
		return nil, err
	}

	keyFile, token, tokenFile, err := credentials(dir)
	if err != nil {
		return nil, err
	}
	if err := c.run(filepath.Join(bin, "kube-apiserver"), "kube-apiserver.log",
		"--etcd-servers", etcdURL,
		"--bind-address", "127.0.0.1",
		"--secure-port", fmt.Sprint(ports[2]),
		"--cert-dir", filepath.Join(dir, "certs"),
		"--service-account-issuer", "https://kubernetes.default.svc",
		"--service-account-key-file", keyFile,
		"--service-account-signing-key-file", keyFile,
		"--service-cluster-ip-range", "10.96.0.0/16",
		// RBAC, as clusters have it: the admin token is of system:masters;
		// a service account may do what its Roles give it.
		"--authorization-mode", "RBAC",
		"--token-auth-file", tokenFile,
		"--disable-admission-plugins", "ServiceAccount",
	); err != nil {
		return nil, err
	}
	c.Config = &rest.Config{
		Host:            fmt.Sprintf("https://127.0.0.1:%d", ports[2]),
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{Insecure: true},
		QPS:             500,
		Burst:           1000,
	}
	if c.Client, err = kubernetes.NewForConfig(c.Config); err != nil {
		return nil, err
	}
	if c.Dynamic, err = dynamic.NewForConfig(c.Config); err != nil {
		return nil, err
	}
	if err := c.waitReady(60 * time.Second); err != nil {
		return nil, err
	}
	ok = true
	return c, nil
}

// credentials writes the API server's service-account signing key and
// the admin's token file into dir.
func credentials(dir string) (keyFile, token, tokenFile string, err error) {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return "", "", "", err
	}
	keyFile = filepath.Join(dir, "sa.key")
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}), 0o600); err != nil {
		return "", "", "", err
	}
	token = "shardpilot-test-token"
	tokenFile = filepath.Join(dir, "tokens.csv")
	if err := os.WriteFile(tokenFile, []byte(token+",admin,admin,system:masters\n"), 0o600); err != nil {
		return "", "", "", err
	}
	return keyFile, token, tokenFile, nil
}

// waitReady waits until the API server says it is ready.
func (c *Cluster) waitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		body, err := c.Client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(context.Background())
		if err == nil && string(body) == "ok" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kube-apiserver not ready within %s (last: %v %s); see %s", timeout, err, body, c.dir)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (c *Cluster) run(bin, logName string, args ...string) error {
	log, err := os.Create(filepath.Join(c.dir, logName))
	if err != nil {
		return err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		log.Close()
		return fmt.Errorf("start %s: %w", filepath.Base(bin), err)
	}
	c.procs = append(c.procs, cmd)
	return nil
}

func (c *Cluster) stop() {
	c.stopOnce.Do(func() {
		for i := len(c.procs) - 1; i >= 0; i-- {
			p := c.procs[i]
			_ = p.Process.Signal(os.Interrupt)
			done := make(chan struct{})
			go func() { _ = p.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				_ = p.Process.Kill()
				<-done
			}
		}
		os.RemoveAll(c.dir)
	})
}

// Start starts an apiserver with its Istio CRDs for a program that is not
// a test (the load test's Kubernetes source); Stop stops it.
func Start() (*Cluster, error) {
	c, err := start()
	if err != nil {
		return nil, err
	}
	if err := c.installIstioCRDs(); err != nil {
		c.stop()
		return nil, err
	}
	return c, nil
}

// Stop stops the apiserver and its etcd, and removes their files.
func (c *Cluster) Stop() { c.stop() }

// WriteKubeconfig writes a kubeconfig for the apiserver to path.
func (c *Cluster) WriteKubeconfig(path string) error {
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: test, cluster: {server: %q, insecure-skip-tls-verify: true}}]
users: [{name: admin, user: {token: %q}}]
contexts: [{name: test, context: {cluster: test, user: admin}}]
current-context: test
`, c.Config.Host, c.Config.BearerToken)
	return os.WriteFile(path, []byte(cfg), 0o600)
}
