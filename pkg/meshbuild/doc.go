// Package meshbuild joins the mesh's stored objects into the generators'
// view of it (generate.Mesh) and keeps that view up to date change by
// change: an endpoint change rebuilds only the services that share a host
// with the service it belongs to, and the new view shares everything else
// with the previous one; any other change joins everything again. The
// pusher and the load test's baseline build their views with it.
package meshbuild
