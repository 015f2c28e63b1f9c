package zookeeper

import (
	"net/url"
	"strings"
	"testing"
	"time"

	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/model"
)

const demoIface = "org.apache.dubbo.demo.DemoService"

func provider(u string) string { return url.QueryEscape(u) }

// TestParseProvider: each bad provider URL is refused with why; a good one
// becomes an endpoint with its labels, weight and health.
func TestParseProvider(t *testing.T) {
	n := &Naming{Shard: "zookeeper-a"}
	if err := n.defaults(); err != nil {
		t.Fatal(err)
	}
	good := "tri://10.0.0.7:50051/" + demoIface + "?application=demo&interface=" + demoIface +
		"&version=1.0.0&group=g1&dubbo.tag=gray&side=provider&weight=50&namespace=shop"
	in, err := parseProvider(demoIface, provider(good), n)
	if err != nil {
		t.Fatal(err)
	}
	if in.protocol != meshv1.Protocol_PROTOCOL_GRPC || in.address != "10.0.0.7" || in.port != 50051 || in.namespace != "shop" {
		t.Errorf("read %+v", in)
	}
	want := map[string]string{"version": "1.0.0", "group": "g1", "application": "demo", "app": "demo", "dubbo.tag": "gray"}
	for k, v := range want {
		if in.ep.Labels[k] != v {
			t.Errorf("label %s = %q, want %q", k, in.ep.Labels[k], v)
		}
	}
	if in.ep.Weight != 50 || in.ep.Health != meshv1.Health_HEALTH_HEALTHY || in.ep.Ports["grpc"] != 50051 {
		t.Errorf("endpoint %v", in.ep)
	}
	disabled, err := parseProvider(demoIface, provider("dubbo://10.0.0.8:20880/"+demoIface+"?disabled=true"), n)
	if err != nil || disabled.ep.Health != meshv1.Health_HEALTH_UNHEALTHY || disabled.namespace != "default" || disabled.protocol != meshv1.Protocol_PROTOCOL_TCP {
		t.Errorf("a disabled dubbo provider: %+v, %v", disabled, err)
	}

	for _, c := range []struct{ node, reason string }{
		{"tri%3A%2F%2F10.0.0.1%3A5%zz", "undecodable provider URL"},
		{provider("tri://10.0.0.1:70000/" + demoIface), "port 70000 is out of range"},
		{provider("tri://10.0.0.1/" + demoIface), "no port"},
		{provider("thrift://10.0.0.1:9090/" + demoIface), `protocol "thrift"`},
		{provider("tri://10.0.0.1:1/" + demoIface + "?side=consumer"), "side=consumer"},
		{provider("tri://10.0.0.1:1/x?interface=other.Service"), `interface "other.Service"`},
		{provider("tri://under_score:1/" + demoIface), "neither an IP address nor a DNS name"},
		{provider("tri://10.0.0.1:1/" + demoIface + "?namespace=Not.A.Label"), "namespace=Not.A.Label"},
		{provider("tri://10.0.0.1:1/" + demoIface + "?weight=heavy"), "weight=heavy"},
	} {
		if _, err := parseProvider(demoIface, c.node, n); err == nil || !strings.Contains(err.Error(), c.reason) {
			t.Errorf("%s: %v, want an error saying %q", c.node, err, c.reason)
		}
	}
}

// TestParseCurator: Curator's JSON instances, good and bad.
func TestParseCurator(t *testing.T) {
	n := &Naming{Shard: "zookeeper-a"}
	if err := n.defaults(); err != nil {
		t.Fatal(err)
	}
	in, err := parseCurator([]byte(`{"name":"orders","id":"1","address":"10.1.0.1","port":8080,
		"payload":{"@class":"org.springframework.cloud.zookeeper.discovery.ZookeeperInstance","metadata":{"version":"v2","instance_status":"OUT_OF_SERVICE","namespace":"shop"}}}`), n)
	if err != nil {
		t.Fatal(err)
	}
	if in.ep.Labels["version"] != "v2" || in.ep.Health != meshv1.Health_HEALTH_UNHEALTHY || in.namespace != "shop" || in.ep.Ports["http"] != 8080 {
		t.Errorf("read %+v (endpoint %v)", in, in.ep)
	}
	for _, c := range []struct{ data, reason string }{
		{`{"name":"orders"`, "undecodable instance"},
		{`{"name":"orders","port":8080}`, "address: no host"},
		{`{"name":"orders","address":"10.1.0.1"}`, "neither port nor sslPort"},
		{`{"name":"orders","address":"10.1.0.1","port":0}`, "port 0 is out of range"},
	} {
		if _, err := parseCurator([]byte(c.data), n); err == nil || !strings.Contains(err.Error(), c.reason) {
			t.Errorf("%s: %v, want an error saying %q", c.data, err, c.reason)
		}
	}
}

// TestNormalizeUnit: one service per namespace, on the port and protocol
// most providers use; a provider of another protocol and a duplicate are
// problems; the objects validate.
func TestNormalizeUnit(t *testing.T) {
	n := &Naming{Shard: "zookeeper-a"}
	if err := n.defaults(); err != nil {
		t.Fatal(err)
	}
	u := &unit{service: strings.ToLower(demoIface), kind: "dubbo", location: "a:/dubbo/" + demoIface}
	for _, p := range []string{
		"tri://10.0.0.1:50051/" + demoIface + "?version=v1",
		"tri://10.0.0.2:50051/" + demoIface + "?version=v2",
		"tri://10.0.0.3:50052/" + demoIface + "?version=v2",
		"tri://10.0.0.1:50051/" + demoIface + "?version=v1&timestamp=2",
		"dubbo://10.0.0.4:20880/" + demoIface,
	} {
		in, err := parseProvider(demoIface, provider(p), n)
		if err != nil {
			t.Fatal(err)
		}
		in.node = u.location + " providers/" + p
		u.instances = append(u.instances, in)
	}
	objs, problems := u.normalize(n, time.Now(), none)
	if len(objs) != 2 {
		t.Fatalf("%d objects, want a service and its endpoints", len(objs))
	}
	svc := objs[0].Object.(*meshv1.Service)
	if svc.Hostnames[0] != "org.apache.dubbo.demo.demoservice.default.svc.cluster.local" || svc.Ports[0].Number != 50051 ||
		svc.Ports[0].Protocol != meshv1.Protocol_PROTOCOL_GRPC {
		t.Errorf("service %v", svc)
	}
	eps := objs[1].Object.(*meshv1.Endpoints)
	if len(eps.Endpoints) != 3 || eps.Endpoints[2].Ports["grpc"] != 50052 {
		t.Errorf("endpoints %v", eps.Endpoints)
	}
	for _, o := range objs {
		if err := model.Validate(o.Object); err != nil {
			t.Errorf("%s: %v", o.Key, err)
		}
	}
	if len(problems) != 2 || !strings.Contains(problems[0].Reason, "speaks tcp while most instances") ||
		!strings.Contains(problems[1].Reason, "10.0.0.1:50051 is registered twice") {
		t.Errorf("problems %v", problems)
	}
}

// none is a store that holds no service.
func none(model.Key) uint32 { return 0 }

// A service keeps its port while a provider listens on it: providers
// joining on other ports (several on one host) do not move its clients;
// once none is left on it, the most common port wins.
func TestServicePortSticks(t *testing.T) {
	n := &Naming{Shard: "zookeeper-a"}
	if err := n.defaults(); err != nil {
		t.Fatal(err)
	}
	stored := map[model.Key]uint32{} // the port the store holds
	portOf := func(urls ...string) uint32 {
		t.Helper()
		u := &unit{service: strings.ToLower(demoIface), kind: "dubbo", location: "a:/dubbo/" + demoIface}
		for _, p := range urls {
			in, err := parseProvider(demoIface, provider(p), n)
			if err != nil {
				t.Fatal(err)
			}
			u.instances = append(u.instances, in)
		}
		objs, _ := u.normalize(n, time.Now(), func(k model.Key) uint32 { return stored[k] })
		port := objs[0].Object.(*meshv1.Service).Ports[0].Number
		stored[objs[0].Key] = port
		return port
	}
	a, b, c := "tri://10.0.0.1:50052/"+demoIface, "tri://10.0.0.1:50053/"+demoIface, "tri://10.0.0.1:50051/"+demoIface
	if got := portOf(a, b); got != 50052 {
		t.Fatalf("port %d, want 50052 (a tie goes to the lowest)", got)
	}
	if got := portOf(a, b, c); got != 50052 {
		t.Errorf("a provider on a lower port moved the service to %d", got)
	}
	if got := portOf(b, c, "tri://10.0.0.2:50051/"+demoIface); got != 50051 {
		t.Errorf("with no provider left on 50052, port %d, want the most common, 50051", got)
	}
}

// FuzzRegistryData: whatever a provider node's name or an instance's data
// holds, reading it returns an instance or an error, never a panic, and
// what it returns normalizes into objects that validate.
func FuzzRegistryData(f *testing.F) {
	f.Add(provider("tri://10.0.0.1:50051/"+demoIface+"?version=v1&weight=5&namespace=shop"), []byte(`{"name":"a","address":"10.0.0.1","port":1}`))
	f.Add("dubbo%3A%2F%2F%5B%3A%3A1%5D%3A20880%2Fx", []byte(`{"address":"h","sslPort":443,"payload":{"metadata":{"namespace":"x","instance_status":"DOWN"}}}`))
	n := &Naming{Shard: "zookeeper-f"}
	if err := n.defaults(); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, node string, data []byte) {
		u := &unit{service: "svc", kind: "dubbo", location: "f:/dubbo/svc"}
		if in, err := parseProvider(demoIface, node, n); err == nil {
			u.instances = append(u.instances, in)
		}
		if in, err := parseCurator(data, n); err == nil {
			u.instances = append(u.instances, in)
		}
		objs, _ := u.normalize(n, time.Now(), none)
		for _, o := range objs {
			if err := model.Validate(o.Object); err != nil {
				t.Fatalf("%s from %q and %q: %v", o.Key, node, data, err)
			}
		}
	})
}
