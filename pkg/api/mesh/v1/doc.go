// Package meshv1 holds the Go code generated from proto/shardpilot/mesh/v1:
// the normalized mesh model stored in etcd and the change event carried on
// the bus. Run `make generate` after editing the .proto files; `make test`
// fails when this code drifts from them.
package meshv1
