package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
)

// shortName is a proxy's name as istioctl shows it, "<pod>.<namespace>"
// (the third part of an Istio node id), or the whole id when it is not
// one.
func shortName(id string) string {
	parts := strings.Split(id, "~")
	if len(parts) == 4 && parts[2] != "" {
		return parts[2]
	}
	return id
}

// proxyNamespace is a proxy's namespace from its node id ("" when the id
// does not say).
func proxyNamespace(id string) string {
	parts := strings.Split(id, "~")
	if len(parts) != 4 {
		return ""
	}
	if _, ns, ok := strings.Cut(parts[2], "."); ok {
		return ns
	}
	ns, _, _ := strings.Cut(parts[3], ".")
	return ns
}

// resolve finds the proxy a name means: a node id as it is, else
// "<pod>.<namespace>", or "<pod>" in --namespace. It returns the proxy's
// rows (its newest stream first) and what the pushers could not answer.
func resolve(ctx context.Context, o *options, name string) ([]proxyRow, error) {
	if strings.Contains(name, "~") {
		return streams(ctx, o, name)
	}
	all, askErr := streams(ctx, o, "")
	want := name
	if !strings.Contains(name, ".") && o.namespace != "" {
		want = name + "." + o.namespace
	}
	var matches []proxyRow
	for _, r := range all {
		if shortName(r.Proxy) == want {
			matches = append(matches, r)
		}
	}
	if len(matches) > 1 {
		ids := make([]string, len(matches))
		for i, r := range matches {
			ids[i] = r.Proxy
		}
		return nil, fmt.Errorf("%q names %d proxies (%s): give the node id", name, len(matches), strings.Join(slices.Sorted(slices.Values(ids)), ", "))
	}
	return matches, askErr
}
