// Package meshgen writes a synthetic mesh as a directory of Istio YAML and
// edits it the way a busy cluster changes: endpoint churn, route changes,
// services added and removed. Every change carries a marker the simulated
// proxies can find in the xDS they receive, so its convergence can be
// measured without keeping whole configurations:
//
//   - an endpoint change moves a service's marker endpoint to an address
//     in 100.64.0.0/10 that encodes the change's number;
//   - a route change renames the service's one HTTP route "chg-<svc>-<n>";
//   - an added service is named "dyn-<n>", and a removal deletes one.
//
// A Mesh is not safe for concurrent use.
package meshgen

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/template"
)

// Spec is the shape of the synthetic mesh.
type Spec struct {
	// Services is how many services the mesh starts with.
	Services int
	// Endpoints is how many endpoints each service has, its marker
	// endpoint included.
	Endpoints int
	// Namespaces spreads the services over this many namespaces.
	Namespaces int
	// Port is every service's HTTP port.
	Port uint32
	// Sidecars gives every namespace a Sidecar whose proxies see their
	// own namespace and the shared ones (ns-0 and the dynamic services'),
	// as a realistic scope: a change then reaches only the proxies of its
	// namespace (every proxy for the shared ones; see Audience).
	Sidecars bool
}

// Validate checks the spec and fills in defaults.
func (s *Spec) Validate() error {
	if s.Namespaces == 0 {
		s.Namespaces = 10
	}
	if s.Port == 0 {
		s.Port = 80
	}
	if s.Services < 1 || s.Endpoints < 1 || s.Namespaces < 1 {
		return fmt.Errorf("meshgen: services %d, endpoints %d, namespaces %d: each must be at least 1", s.Services, s.Endpoints, s.Namespaces)
	}
	if s.Services*s.Endpoints > 1<<24 {
		return fmt.Errorf("meshgen: %d endpoints do not fit the address plan", s.Services*s.Endpoints)
	}
	return nil
}

// Kind is a kind of change.
type Kind int

// The kinds of change.
const (
	Endpoint Kind = iota
	Route
	AddService
	RemoveService
)

func (k Kind) String() string {
	return [...]string{"endpoint", "route", "add-service", "remove-service"}[k]
}

// Change is one edit, numbered from 1 in the order made.
type Change struct {
	N    int
	Kind Kind
	// Service is the service changed: an index below Spec.Services, or
	// the number of the change that added it (for dynamic services).
	Service int
}

// Destination is where the mesh is written: a directory of YAML (Dir), or the
// Kubernetes API.
type Destination interface {
	// Put creates or replaces what one file of YAML documents holds.
	Put(name string, yaml []byte) error
	// Delete removes what Put wrote under name in a namespace.
	Delete(namespace, name string) error
}

// Dir writes each file into a directory, atomically.
type Dir string

// Put writes the file, so that a reader never sees half of it.
func (d Dir) Put(name string, yaml []byte) error {
	tmp := filepath.Join(string(d), "."+name+".tmp")
	if err := os.WriteFile(tmp, yaml, 0o644); err != nil {
		return fmt.Errorf("meshgen: write %s: %w", name, err)
	}
	if err := os.Rename(tmp, filepath.Join(string(d), name+".yaml")); err != nil {
		return fmt.Errorf("meshgen: write %s: %w", name, err)
	}
	return nil
}

// Delete removes the file.
func (d Dir) Delete(_, name string) error {
	if err := os.Remove(filepath.Join(string(d), name+".yaml")); err != nil {
		return fmt.Errorf("meshgen: remove %s: %w", name, err)
	}
	return nil
}

// Mesh is the synthetic mesh in a destination.
type Mesh struct {
	spec Spec
	dest Destination
	// marker and route hold each service's current change numbers.
	marker, route map[int]int
	// dynamic holds the dynamic services that exist, by the change that added them.
	dynamic []int
	next    int
}

// Write writes the initial mesh into dir, replacing what the generator
// wrote there before.
func Write(dir string, spec Spec) (*Mesh, error) {
	old, _ := filepath.Glob(filepath.Join(dir, "*.yaml"))
	for _, f := range old {
		if err := os.Remove(f); err != nil {
			return nil, fmt.Errorf("meshgen: %w", err)
		}
	}
	return WriteTo(Dir(dir), spec)
}

// WriteTo writes the initial mesh into a destination.
func WriteTo(dest Destination, spec Spec) (*Mesh, error) {
	if err := spec.Validate(); err != nil {
		return nil, err
	}
	m := &Mesh{spec: spec, dest: dest, marker: map[int]int{}, route: map[int]int{}, next: 1}
	if spec.Sidecars {
		for ns := range spec.Namespaces {
			name := "ns-" + strconv.Itoa(ns)
			if err := dest.Put("sidecar-"+name, fmt.Appendf(nil, sidecarYAML, name, DynamicNamespace)); err != nil {
				return nil, err
			}
		}
	}
	for i := range spec.Services {
		if err := m.write(i); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// sidecarYAML is a namespace's Sidecar: its own namespace and the shared ones.
const sidecarYAML = `apiVersion: networking.istio.io/v1
kind: Sidecar
metadata: {name: default, namespace: %s}
spec:
  egress: [{hosts: ["./*", "ns-0/*", "%s/*"]}]
`

// Audience returns how many of the proxies (spread over the namespaces as
// the simulated fleet spreads them: proxy i in ns-<i mod namespaces>) a
// change reaches: every one, unless Sidecars limit what they see and the
// change is in a namespace other than the shared ones, whose own proxies
// alone see it.
func (m *Mesh) Audience(c Change, proxies int) int {
	if !m.spec.Sidecars || c.Kind == AddService || c.Kind == RemoveService {
		return proxies
	}
	ns := c.Service % m.spec.Namespaces
	if ns == 0 {
		return proxies
	}
	n := proxies / m.spec.Namespaces
	if ns < proxies%m.spec.Namespaces {
		n++
	}
	return n
}

// Sees says whether proxy i (of ns-<i mod namespaces>) sees a change:
// Audience counts those that do.
func (m *Mesh) Sees(c Change, proxy int) bool {
	if !m.spec.Sidecars || c.Kind == AddService || c.Kind == RemoveService {
		return true
	}
	ns := c.Service % m.spec.Namespaces
	return ns == 0 || proxy%m.spec.Namespaces == ns
}

// Spec returns the mesh's spec.
func (m *Mesh) Spec() Spec { return m.spec }

// Apply makes one change of a kind to the service chosen by pick (an index
// into the services that exist; dynamic services for RemoveService) and
// returns it; made, when set, is told of the change just before it is
// written, so that nobody can see it before it is recorded. AddService
// ignores pick. RemoveService with no dynamic service adds one instead.
func (m *Mesh) Apply(kind Kind, pick int, made func(Change)) (Change, error) {
	c := Change{N: m.next, Kind: kind}
	if kind == RemoveService && len(m.dynamic) == 0 {
		c.Kind = AddService
	}
	m.next++
	switch c.Kind {
	case Endpoint, Route:
		c.Service = pick % m.spec.Services
	case AddService:
		c.Service = c.N
	default:
		c.Service = m.dynamic[pick%len(m.dynamic)]
	}
	if made != nil {
		made(c)
	}
	switch c.Kind {
	case Endpoint, Route:
		if c.Kind == Endpoint {
			m.marker[c.Service] = c.N
		} else {
			m.route[c.Service] = c.N
		}
		return c, m.write(c.Service)
	case AddService:
		m.dynamic = append(m.dynamic, c.N)
		return c, m.writeDynamic(c.N)
	default:
		i := pick % len(m.dynamic)
		m.dynamic = append(m.dynamic[:i], m.dynamic[i+1:]...)
		return c, m.dest.Delete(DynamicNamespace, DynamicName(c.Service))
	}
}

// Dynamic returns the dynamic services that exist, by the change that added them.
func (m *Mesh) Dynamic() []int { return append([]int(nil), m.dynamic...) }

// Marker returns the number of the last endpoint change of service i (0: none).
func (m *Mesh) Marker(i int) int { return m.marker[i] }

// RouteMarker returns the number of the last route change of service i (0: none).
func (m *Mesh) RouteMarker(i int) int { return m.route[i] }

// ServiceName is the name of static service i.
func ServiceName(i int) string { return "svc-" + strconv.Itoa(i) }

// DynamicNamespace is the namespace of the services changes add.
const DynamicNamespace = "dyn"

// AllNamespaces returns every namespace a mesh of this (validated) spec uses.
func (s Spec) AllNamespaces() []string {
	out := []string{DynamicNamespace}
	for i := range s.Namespaces {
		out = append(out, "ns-"+strconv.Itoa(i))
	}
	return out
}

// DynamicName is the name of the service added by change n.
func DynamicName(n int) string { return "dyn-" + strconv.Itoa(n) }

// Namespace is the namespace of static service i.
func (m *Mesh) Namespace(i int) string { return "ns-" + strconv.Itoa(i%m.spec.Namespaces) }

// Host is the host name of static service i.
func (m *Mesh) Host(i int) string {
	return ServiceName(i) + "." + m.Namespace(i) + ".svc.cluster.local"
}

// MarkerAddress encodes a change number as an address in 100.64.0.0/10.
func MarkerAddress(n int) string {
	v := 100<<24 | 64<<16 + uint32(n)
	return fmt.Sprintf("%d.%d.%d.%d", v>>24, v>>16&0xff, v>>8&0xff, v&0xff)
}

// ParseMarkerAddress returns the change number of a marker address.
func ParseMarkerAddress(addr string) (int, bool) {
	if !strings.HasPrefix(addr, "100.") {
		return 0, false // not in 100.64.0.0/10: most addresses, rejected without allocating
	}
	parts := strings.Split(addr, ".")
	if len(parts) != 4 {
		return 0, false
	}
	var v uint32
	for _, p := range parts {
		b, err := strconv.ParseUint(p, 10, 8)
		if err != nil {
			return 0, false
		}
		v = v<<8 | uint32(b)
	}
	base := uint32(100<<24 | 64<<16)
	if v < base || v >= base+1<<22 {
		return 0, false
	}
	return int(v - base), true
}

// RouteName is the name of service i's route after change n.
func RouteName(i, n int) string { return "chg-" + strconv.Itoa(i) + "-" + strconv.Itoa(n) }

// ParseRouteName returns the service and change number in a route name.
func ParseRouteName(name string) (service, n int, ok bool) {
	rest, found := strings.CutPrefix(name, "chg-")
	if !found {
		return 0, 0, false
	}
	a, b, found := strings.Cut(rest, "-")
	if !found {
		return 0, 0, false
	}
	s, err1 := strconv.Atoi(a)
	c, err2 := strconv.Atoi(b)
	return s, c, err1 == nil && err2 == nil
}

var serviceTmpl = template.Must(template.New("svc").Parse(`apiVersion: networking.istio.io/v1
kind: ServiceEntry
metadata: {name: {{.Name}}, namespace: {{.Namespace}}}
spec:
  hosts: [{{.Host}}]
  ports: [{number: {{.Port}}, name: http, protocol: HTTP}]
  resolution: STATIC
  endpoints:
{{- range .Addresses}}
  - {address: {{.}}}
{{- end}}
{{- if .Route}}
---
apiVersion: networking.istio.io/v1
kind: VirtualService
metadata: {name: {{.Name}}, namespace: {{.Namespace}}}
spec:
  hosts: [{{.Host}}]
  http:
  - name: {{.Route}}
    route: [{destination: {host: {{.Host}}}}]
{{- end}}
`))

type serviceData struct {
	Name, Namespace, Host, Route string
	Port                         uint32
	Addresses                    []string
}

func (m *Mesh) write(i int) error {
	d := serviceData{Name: ServiceName(i), Namespace: m.Namespace(i), Host: m.Host(i), Port: m.spec.Port,
		Route: RouteName(i, m.route[i])}
	d.Addresses = append(d.Addresses, MarkerAddress(m.marker[i]))
	for e := 1; e < m.spec.Endpoints; e++ {
		v := uint32(i*m.spec.Endpoints + e)
		d.Addresses = append(d.Addresses, fmt.Sprintf("10.%d.%d.%d", v>>16&0xff, v>>8&0xff, v&0xff))
	}
	return m.render(ServiceName(i), d)
}

func (m *Mesh) writeDynamic(n int) error {
	name := DynamicName(n)
	return m.render(name, serviceData{Name: name, Namespace: DynamicNamespace, Host: name + "." + DynamicNamespace + ".svc.cluster.local", Port: m.spec.Port,
		Addresses: []string{MarkerAddress(n)}})
}

func (m *Mesh) render(name string, d serviceData) error {
	var b bytes.Buffer
	if err := serviceTmpl.Execute(&b, d); err != nil {
		return fmt.Errorf("meshgen: render %s: %w", name, err)
	}
	return m.dest.Put(name, b.Bytes())
}
