// Package patch applies EnvoyFilters: the patches of the EnvoyFilters that
// select a class of Envoys, in Istio's order, to the listeners, clusters
// and routes generated for it. A patch that would make a resource invalid
// (its Validate, or that of an extension it holds, fails) is not applied
// to it: the resource is served as it was, and the patch is reported.
package patch
