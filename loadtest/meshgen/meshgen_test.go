package meshgen

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestMarkersRoundTrip(t *testing.T) {
	for _, n := range []int{0, 1, 255, 256, 65535, 65536, 1<<22 - 1} {
		got, ok := ParseMarkerAddress(MarkerAddress(n))
		if !ok || got != n {
			t.Errorf("marker %d → %s → %d, %v", n, MarkerAddress(n), got, ok)
		}
	}
	for _, addr := range []string{"10.0.0.1", "100.63.255.255", "100.128.0.0", "100.64.0", "x"} {
		if n, ok := ParseMarkerAddress(addr); ok {
			t.Errorf("%s parsed as marker %d", addr, n)
		}
	}
	if s, n, ok := ParseRouteName(RouteName(12, 345)); !ok || s != 12 || n != 345 {
		t.Errorf("route name round trip: %d %d %v", s, n, ok)
	}
}

func TestChangesEditTheDirectory(t *testing.T) {
	dir := t.TempDir()
	m, err := Write(dir, Spec{Services: 3, Endpoints: 2, Namespaces: 2})
	if err != nil {
		t.Fatal(err)
	}
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(dir, name+".yaml"))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	var made []Change
	record := func(c Change) { made = append(made, c) }
	c1, _ := m.Apply(Endpoint, 4, record)
	c2, _ := m.Apply(Route, 1, record)
	c3, _ := m.Apply(RemoveService, 0, record) // nothing to remove: adds
	c4, err := m.Apply(RemoveService, 0, record)
	if err != nil {
		t.Fatal(err)
	}
	if len(made) != 4 || c1.Service != 1 || c3.Kind != AddService || c4.Kind != RemoveService || c4.Service != c3.N {
		t.Fatalf("changes %+v %+v %+v %+v (made %d)", c1, c2, c3, c4, len(made))
	}
	if !strings.Contains(read(ServiceName(1)), MarkerAddress(c1.N)) {
		t.Error("the endpoint change is not in the file")
	}
	if !strings.Contains(read(ServiceName(1)), RouteName(1, c2.N)) {
		t.Error("the route change is not in the file")
	}
	if _, err := os.Stat(filepath.Join(dir, DynamicName(c3.N)+".yaml")); !os.IsNotExist(err) {
		t.Errorf("the removed service's file: %v", err)
	}
}

// TestAudience: with Sidecars, a change in a namespace reaches the proxies
// of that namespace; one in the shared namespace (ns-0) or of a dynamic
// service reaches every proxy; without Sidecars every change does.
func TestAudience(t *testing.T) {
	dir := t.TempDir()
	m, err := Write(dir, Spec{Services: 20, Endpoints: 2, Namespaces: 4, Sidecars: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "sidecar-ns-3.yaml")); err != nil {
		t.Errorf("no Sidecar for ns-3: %v", err)
	}
	for c, want := range map[Change]int{
		{Kind: Endpoint, Service: 5}:   3, // ns-1: proxies 1, 5, 9 of 10
		{Kind: Route, Service: 7}:      2, // ns-3: proxies 3, 7
		{Kind: Endpoint, Service: 8}:   10,
		{Kind: AddService, Service: 9}: 10,
	} {
		if got := m.Audience(c, 10); got != want {
			t.Errorf("%v: %d proxies, want %d", c, got, want)
		}
	}
	plain, err := Write(t.TempDir(), Spec{Services: 20, Endpoints: 2, Namespaces: 4})
	if err != nil {
		t.Fatal(err)
	}
	if got := plain.Audience(Change{Kind: Endpoint, Service: 5}, 10); got != 10 {
		t.Errorf("without Sidecars: %d proxies, want 10", got)
	}
}
