package classify

import (
	"slices"
	"strconv"
	"strings"

	meshv1 "github.com/shardpilot/shardpilot/pkg/api/mesh/v1"
	"github.com/shardpilot/shardpilot/pkg/xds/cache"
	"github.com/shardpilot/shardpilot/pkg/xds/generate"
)

// Class is a class of proxies, all served the same resources. For a
// sidecar or a proxyless client: its kind and, unless every proxy of the
// kind is alike, the namespace it sees from (Elsewhere for the namespaces
// with nothing of their own), the Sidecar that scopes it ("" for none) and
// the tags of the security policies and route sources that select it. For
// a gateway proxy (Kind Router): the keys of the Gateways that select it.
//
// Its String is the cache's key; ParseClass reads one back. The grammar
// lives here alone:
//
//	<kind>                                    every proxy of the kind
//	<kind>/<namespace>/<sidecar>[/<tag>,...]  a namespace's proxies
//	router/<gateway key>,...                  a gateway proxy
type Class struct {
	Kind      string
	Namespace string
	Sidecar   string
	Tags      []string
	Gateways  []string
}

// Key is the class's key in the cache: its String.
func (c Class) Key() cache.Class { return cache.Class(c.String()) }

// String is the class's key, as text.
func (c Class) String() string {
	switch {
	case c.Kind == Router && c.Namespace == "" && len(c.Tags) == 0:
		return Router + "/" + strings.Join(c.Gateways, ",")
	case c.Kind == Router:
		return Router + "/" + strings.Join(c.Gateways, ",") + ";" + c.Namespace + ";" + strings.Join(c.Tags, ",")
	case c.Namespace == "":
		return c.Kind
	case len(c.Tags) == 0:
		return c.Kind + "/" + c.Namespace + "/" + c.Sidecar
	}
	return c.Kind + "/" + c.Namespace + "/" + c.Sidecar + "/" + strings.Join(c.Tags, ",")
}

// ParseClass reads a class's key.
func ParseClass(class cache.Class) Class {
	key := string(class)
	if gateways, ok := strings.CutPrefix(key, Router+"/"); ok {
		parts := strings.SplitN(gateways, ";", 3)
		c := Class{Kind: Router, Gateways: strings.Split(parts[0], ",")}
		if len(parts) == 3 {
			c.Namespace = parts[1]
			if parts[2] != "" {
				c.Tags = strings.Split(parts[2], ",")
			}
		}
		return c
	}
	parts := strings.SplitN(key, "/", 4)
	c := Class{Kind: parts[0]}
	if len(parts) >= 3 {
		c.Namespace, c.Sidecar = parts[1], parts[2]
	}
	if len(parts) == 4 {
		c.Tags = strings.Split(parts[3], ",")
	}
	return c
}

// UnprivilegedTag marks a class of gateway proxies that cannot bind the
// ports below 1024 (Istio's UNPRIVILEGED_POD metadata).
const UnprivilegedTag = "u:1"

// Unprivileged reports whether the class's proxies cannot bind the ports
// below 1024.
func (c Class) Unprivileged() bool {
	return slices.Contains(c.Tags, UnprivilegedTag)
}

// topologyPrefix starts the tag of a class of gateway proxies whose
// agent says their gateway topology (see TopologyTag).
const topologyPrefix = "gt:"

// TopologyTag marks a class of gateway proxies whose agent says their
// gateway topology (Istio's PROXY_CONFIG gatewayTopology: the mesh's
// defaultConfig as the pod's proxy.istio.io/config annotation overrides
// it): "gt:<trusted proxies>:<client certificate details>".
func TopologyTag(trusted uint32, details meshv1.ClientCertDetails) string {
	return topologyPrefix + strconv.FormatUint(uint64(trusted), 10) + ":" + strconv.Itoa(int(details))
}

// Topology returns the gateway topology the class's proxies say, if they
// say one.
func (c Class) Topology() (trusted uint32, details meshv1.ClientCertDetails, ok bool) {
	for _, tag := range c.Tags {
		v, found := strings.CutPrefix(tag, topologyPrefix)
		if !found {
			continue
		}
		n, d, _ := strings.Cut(v, ":")
		t, err1 := strconv.ParseUint(n, 10, 32)
		cd, err2 := strconv.Atoi(d)
		if err1 != nil || err2 != nil {
			return 0, 0, false
		}
		return uint32(t), meshv1.ClientCertDetails(cd), true
	}
	return 0, 0, false
}

// Proxy is the kind of proxy of a sidecar or proxyless class.
func (c Class) Proxy() generate.Proxy {
	if c.Kind == generate.Proxyless.String() {
		return generate.Proxyless
	}
	return generate.Envoy
}
