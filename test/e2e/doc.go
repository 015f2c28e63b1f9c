// Package e2e holds the end-to-end tests: whole control planes built by
// the mains' own path (internal/app) on an embedded etcd and NATS, a real
// ZooKeeper or Kubernetes API server where a test needs one, and real
// grpc-go xDS clients routing real RPCs. NewCluster starts a cluster of
// ingesters and pushers (Options says how many and how they are tuned);
// dialADS speaks xDS to a pusher, dialXDS routes RPCs through grpc-go's
// xDS resolver. Run them with go test ./test/e2e/.
package e2e
