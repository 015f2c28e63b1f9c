// Package model names the normalized mesh objects and their store keys, and
// validates them.
//
// Every object is one key, /mesh/v1/<kind>/<namespace>/<name>; Endpoints are
// one key per service per source shard, /mesh/v1/endpoints/<namespace>/<service>/<shard>.
// The package does no I/O and holds no state; everything in it is safe for
// concurrent use.
package model
