// Package envoypatch reads the values of EnvoyFilter patches: each decoded
// to the Envoy message its kind patches with, and checked as Envoy would
// take it (its own constraints and those of every extension configuration
// it holds, whose types are registered here). The ingesters check a patch
// with it when they read an EnvoyFilter; the pushers apply the decoded
// values (pkg/xds/patch). It is a leaf: ingest reaches no xDS generation
// through it.
package envoypatch
