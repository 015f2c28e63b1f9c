// Package layers holds the rules of which package of the module may
// import which (docs/architecture.md lists them, with why), and checks a
// package graph against them; its test checks the module's own, as
// `go list` reports it.
package layers

import (
	"fmt"
	"slices"
	"strings"
)

// Module is the module's path; rules name packages relative to it.
const Module = "github.com/shardpilot/shardpilot/"

// Package is one package of the graph: its path relative to the module
// (or a path outside it), what it imports itself, and everything it
// depends on through them.
type Package struct {
	Path          string
	Imports, Deps []string
}

// Rule forbids the packages under From (but those under Except) to depend
// on the packages under Deny: through any path, or, Direct, by importing
// them themselves.
type Rule struct {
	From   string
	Except []string
	Deny   []string
	Direct bool
	Why    string
}

// Rules are the module's layers.
var Rules = []Rule{
	{From: "pkg/", Deny: []string{"internal/"},
		Why: "pkg is the library; internal composes it into the commands and helps the tests"},
	{From: "pkg/", Except: []string{"pkg/store"}, Deny: []string{"go.etcd.io/etcd/"}, Direct: true,
		Why: "every access to etcd goes through pkg/store"},
	{From: "pkg/", Except: []string{"pkg/bus"}, Deny: []string{"github.com/nats-io/"}, Direct: true,
		Why: "every access to NATS goes through pkg/bus"},
	{From: "pkg/api/", Deny: []string{"pkg/", "internal/"},
		Why: "the API's types are the bottom layer"},
	{From: "pkg/model", Deny: []string{"pkg/bus", "pkg/ca", "pkg/classify", "pkg/ingest", "pkg/meshbuild", "pkg/pusher", "pkg/relay", "pkg/store", "pkg/telemetry", "pkg/xds"},
		Why: "the model is what every part shares: it knows none of them"},
	{From: "pkg/envoypatch", Deny: []string{"pkg/ingest", "pkg/xds", "pkg/pusher", "pkg/meshbuild", "pkg/classify"},
		Why: "EnvoyFilter patches are read where they are ingested and where they are applied: a leaf both use"},
	{From: "pkg/ingest", Deny: []string{"pkg/xds", "pkg/pusher", "pkg/classify", "pkg/meshbuild", "pkg/bus", "pkg/relay"},
		Why: "ingest normalizes sources into the store; it never generates xDS nor carries events"},
	{From: "pkg/xds", Deny: []string{"pkg/ingest", "pkg/bus", "pkg/relay", "pkg/pusher"},
		Why: "xDS generation and serving know nothing of the sources or of the bus"},
	{From: "pkg/xds", Deny: []string{"pkg/store"}, Direct: true,
		Why: "xDS reads the mesh from what the pusher hands it, not from etcd"},
	{From: "pkg/xds/identity", Deny: []string{"pkg/classify", "pkg/xds/generate", "pkg/meshbuild"},
		Why: "who a stream is does not depend on what it is sent"},
	{From: "pkg/xds/nodemeta", Deny: []string{"pkg/"},
		Why: "what a node says of itself is a leaf"},
	{From: "pkg/xds/cache", Deny: []string{"pkg/"},
		Why: "the cache holds resources of any kind, a leaf"},
	{From: "pkg/debounce", Deny: []string{"pkg/"},
		Why: "debouncing is generic"},
	{From: "pkg/pusher", Deny: []string{"pkg/bus", "pkg/relay", "pkg/ingest", "pkg/store"},
		Why: "the pusher follows a feed and loads from a loader it is given: it knows no subject and no key"},
	{From: "pkg/telemetry", Deny: []string{"pkg/xds", "pkg/pusher", "pkg/ingest", "pkg/store", "pkg/bus", "pkg/relay"},
		Why: "telemetry is beneath every part: they report to it"},
	{From: "pkg/relay", Deny: []string{"pkg/xds", "pkg/pusher", "pkg/ingest"},
		Why: "the relay carries the store's changes to the bus, nothing more"},
}

// Check returns each way the packages break the rules, sorted.
func Check(pkgs []Package, rules []Rule) []string {
	var out []string
	for _, p := range pkgs {
		for _, r := range rules {
			if !under(p.Path, r.From) || slices.ContainsFunc(r.Except, func(e string) bool { return under(p.Path, e) }) {
				continue
			}
			deps := p.Deps
			if r.Direct {
				deps = p.Imports
			}
			for _, d := range deps {
				if d != p.Path && slices.ContainsFunc(r.Deny, func(deny string) bool { return under(d, deny) }) {
					how := "depends on"
					if slices.Contains(p.Imports, d) {
						how = "imports"
					}
					out = append(out, fmt.Sprintf("%s %s %s: %s", p.Path, how, d, r.Why))
				}
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// under says path is prefix itself or lies below it ("pkg/xds" holds
// "pkg/xds/cache", not "pkg/xdsfoo"; "pkg/" holds all of pkg).
func under(path, prefix string) bool {
	if strings.HasSuffix(prefix, "/") {
		return strings.HasPrefix(path, prefix)
	}
	return path == prefix || strings.HasPrefix(path, prefix+"/")
}

// Relative strips the module's path from an import path; a package of
// the standard library (no dot in its first element) is "" (no rule
// names one, and its "internal/..." is not the module's).
func Relative(path string) string {
	if rest, ok := strings.CutPrefix(path, Module); ok {
		return rest
	}
	if first, _, _ := strings.Cut(path, "/"); !strings.Contains(first, ".") {
		return ""
	}
	return path
}
