package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/shardpilot/shardpilot/loadtest/meshgen"
)

// echo is a real gRPC service in the mesh and its proxyless clients:
// two meshapp servers, a ServiceEntry that names one of them, and a
// grpc-go client on each pusher calling it through grpc-go's xDS
// resolver. Moving the ServiceEntry's endpoint to the other server and
// timing until each client's RPCs land there is how long a proxyless
// client takes to follow a change.
type echo struct {
	meshDir string
	servers [2]*proc
	addrs   [2]string
	clients []*proc
	stats   []string // each client's stats address
	at      int      // the server the ServiceEntry names
}

// echoNamespace is the echo service's namespace, and its clients'.
const echoNamespace = "echo"

const echoHost = "echo." + echoNamespace + ".svc.cluster.local"

// startEcho starts the servers, writes the ServiceEntry naming the first,
// and starts a client on each ADS address; it returns once each client
// has had an answer. stop stops what it started, after an error too.
func startEcho(out, meshapp, meshDir string, ads []string) (*echo, error) {
	e := &echo{meshDir: meshDir}
	if _, err := os.Stat(meshapp); err != nil {
		return e, fmt.Errorf("the grpc-go client and server: %w (build it: go build -o %s ./test/cluster/meshapp)", err, meshapp)
	}
	for i := range e.servers {
		addr, err := freeAddr()
		if err != nil {
			return e, err
		}
		if e.servers[i], err = start(out, fmt.Sprintf("echo-server-%d", i), meshapp, "server", "-addr", addr, "-drain", "0s"); err != nil {
			return e, err
		}
		e.addrs[i] = addr
	}
	if err := e.write(0); err != nil {
		return e, err
	}
	return e, e.startClients(out, meshapp, ads)
}

// stop stops the servers and clients.
func (e *echo) stop() {
	for _, p := range append(e.clients, e.servers[:]...) {
		if p != nil {
			p.stop()
		}
	}
}

func (e *echo) write(at int) error {
	port := e.addrs[at][len("127.0.0.1:"):]
	doc := fmt.Sprintf(`apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: echo, namespace: %s}
spec:
  hosts: [%s]
  ports: [{number: 7070, name: grpc, protocol: GRPC}]
  resolution: STATIC
  endpoints: [{address: 127.0.0.1, ports: {grpc: %s}}]
`, echoNamespace, echoHost, port)
	e.at = at
	return meshgen.Dir(e.meshDir).Put("echo", []byte(doc))
}

// startClients starts a client on each ADS address, and waits until each
// has had an answer.
func (e *echo) startClients(out, meshapp string, ads []string) error {
	for i, a := range ads {
		stats, err := freeAddr()
		if err != nil {
			return err
		}
		bootstrap := fmt.Sprintf(`{"xds_servers": [{"server_uri": %q, "channel_creds": [{"type": "insecure"}], "server_features": ["xds_v3"]}],
"node": {"id": "sidecar~127.0.0.1~echo-client-%d.%s~%s.svc.cluster.local", "metadata": {"GENERATOR": "grpc", "NAMESPACE": %q}}}`,
			a, i, echoNamespace, echoNamespace, echoNamespace)
		p, err := startWith([]string{"GRPC_XDS_BOOTSTRAP_CONFIG=" + bootstrap}, out, fmt.Sprintf("echo-client-%d", i), meshapp,
			"client", "-target", "xds:///"+echoHost+":7070", "-rate", "20", "-stats", stats)
		if err != nil {
			return err
		}
		e.clients, e.stats = append(e.clients, p), append(e.stats, stats)
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(200 * time.Millisecond) {
		all := true
		for _, s := range e.stats {
			all = all && httpOK("http://"+s+"/ready")
		}
		if all {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the grpc-go clients had no answer within a minute (see echo-client-*.log)")
		}
	}
}

// clientStats is what a meshapp client says on /stats.
type clientStats struct {
	OK     map[string]int64 `json:"ok"`
	Failed int64            `json:"failed"`
	Errors []string         `json:"errors"`
}

func (e *echo) read(i int) (clientStats, error) {
	var st clientStats
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + e.stats[i] + "/stats")
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	return st, json.NewDecoder(resp.Body).Decode(&st)
}

// failed sums the clients' failed RPCs.
func (e *echo) failed() int64 {
	var n int64
	for i := range e.stats {
		if st, err := e.read(i); err == nil {
			n += st.Failed
		}
	}
	return n
}

// move names the other server and returns how long each client took
// until its RPCs reached it (-1 for a client that had not within limit).
func (e *echo) move(limit time.Duration) ([]time.Duration, error) {
	to := 1 - e.at
	before := make([]int64, len(e.stats))
	for i := range e.stats {
		st, err := e.read(i)
		if err != nil {
			return nil, err
		}
		before[i] = st.OK[e.addrs[to]]
	}
	moved := time.Now()
	if err := e.write(to); err != nil {
		return nil, err
	}
	took := make([]time.Duration, len(e.stats))
	for i := range took {
		took[i] = -1
	}
	for pending := len(took); pending > 0 && time.Since(moved) < limit; time.Sleep(50 * time.Millisecond) {
		for i := range e.stats {
			if took[i] >= 0 {
				continue
			}
			if st, err := e.read(i); err == nil && st.OK[e.addrs[to]] > before[i] {
				took[i] = time.Since(moved)
				pending--
			}
		}
	}
	return took, nil
}
