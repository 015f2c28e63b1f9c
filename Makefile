# shardpilot — run `make help` for the targets.

GO        ?= go
HELM_VERSION := v3.22.0
HELM      := $(shell $(GO) env GOPATH)/bin/helm
STATICCHECK_VERSION := v0.8.2
STATICCHECK := $(shell $(GO) env GOPATH)/bin/staticcheck-$(STATICCHECK_VERSION)
BIN       := $(CURDIR)/.bin
PROTOC    ?= protoc
PROTOS    := $(wildcard proto/shardpilot/mesh/v1/*.proto)
MODULE    := github.com/shardpilot/shardpilot
GOTEST    ?= $(GO) test -race -count=1 -timeout 20m

.DEFAULT_GOAL := help

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  %-16s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: build
build: ## Build the ingester, pusher and standalone binaries into .bin/.
	$(GO) build -o $(BIN)/ ./cmd/...

.PHONY: run
run: ## Run the standalone mode (embedded etcd and NATS) on examples/mesh.
	$(GO) run ./cmd/standalone --mesh-dir examples/mesh

.PHONY: test
test: check-generate $(HELM) $(STATICCHECK) ## Run vet, staticcheck, the generated-code check, every test with the race detector, the small load test and the fault suite.
	$(GO) vet ./...
	$(STATICCHECK) ./...
	SHARDPILOT_REQUIRE_ZOOKEEPER=1 SHARDPILOT_REQUIRE_PROMETHEUS=1 SHARDPILOT_REQUIRE_CHROMIUM=1 SHARDPILOT_HELM=$(HELM) SHARDPILOT_KUBE_BIN="$$(hack/kube-binaries.sh)" $(GOTEST) ./...
	$(MAKE) loadtest
	$(MAKE) loadtest-faults

.PHONY: loadtest
loadtest: build ## Small load test (about 3 minutes): 500 simulated Envoys, 200 services, 2,000 endpoints, shardpilot then the baseline; then 2,000 Envoys on shardpilot alone (RSS per proxy); each on its own connection; fails unless every change reaches every proxy.
	$(GO) build -o $(BIN)/loadtest ./loadtest
	$(BIN)/loadtest run --bin $(BIN) --proxies 500 --services 200 --endpoints 10 \
		--endpoint-rate 10 --route-rate 1 --service-rate 0.5 --duration 20s --out loadtest/out/small
	$(BIN)/loadtest run --bin $(BIN) --proxies 2000 --services 200 --endpoints 10 \
		--endpoint-rate 10 --route-rate 1 --service-rate 0.5 --duration 20s --baseline=false --out loadtest/out/small-2000

.PHONY: loadtest-faults
loadtest-faults: build ## The fault suite (about 5 minutes): under churn, SIGKILL a pusher, SIGSTOP NATS and etcd for 30 s each, SIGKILL the ingester leader, a never-answering proxy and 100 non-reading ones for 30 s (the others' convergence reported), values the bus cannot carry written into etcd past the ingester, the change stream deleted, etcd's NOSPACE alarm for 10 s, NATS's file system full for 30 s then NATS restarted (root: a tmpfs holds its store), etcd restored from a snapshot taken 10 s earlier (what readiness and staleness said reported); then NATS killed with its data wiped and no change after; fails if a change is lost or held back.
	$(GO) build -o $(BIN)/loadtest ./loadtest
	$(BIN)/loadtest run --bin $(BIN) --proxies 100 --services 50 --endpoints 5 \
		--endpoint-rate 5 --route-rate 0.5 --service-rate 0.2 --pushers "" --baseline=false --faults --settle 60s --out loadtest/out/faults

.PHONY: loadtest-inputs
loadtest-inputs: build ## The heavy inputs (about 10 minutes): on the fault suite's processes, under churn, 300 EnvoyFilters merging contradictory values into every cluster, 20,000 services in one namespace every proxy sees, a VirtualService of 5,000 routes rewritten every second for 20 s; a grpc-go client on each pusher follows an endpoint moved every 5 s meanwhile; reports how the unrelated changes converged against the churn alone, how long until both pushers served the input alike, the pushers' CPU and RSS; fails if an unrelated change is held back or lost, or the pushers do not agree.
	$(GO) build -o $(BIN)/loadtest ./loadtest
	$(GO) build -o $(BIN)/meshapp ./test/cluster/meshapp
	$(BIN)/loadtest run --bin $(BIN) --proxies 100 --services 50 --endpoints 5 \
		--endpoint-rate 5 --route-rate 0.5 --service-rate 0.2 --pushers "" --baseline=false --inputs --settle 60s --out loadtest/out/inputs

.PHONY: loadtest-floods
loadtest-floods: build ## The floods (about 3 minutes, root, a kube-apiserver built by hack/kube-binaries.sh): against a pusher set up as docs/security.md describes and held to the chart's memory limit, forged token reviews, one identity's registrations, made-up names, CSDS at once and unfinished messages, 15 s each under churn; the pusher's RSS, the honest proxies' convergence, a token proxy's admission and another namespace's registration reported; fails if the pusher is killed, a change is lost, or that proxy or workload is not served or registered.
	$(GO) build -o $(BIN)/loadtest ./loadtest
	SHARDPILOT_KUBE_BIN="$$(hack/kube-binaries.sh)" $(BIN)/loadtest run --bin $(BIN) --proxies 300 --services 100 --endpoints 5 \
		--endpoint-rate 5 --route-rate 0.5 --service-rate 0.2 --pushers "" --baseline=false --floods --fault-hold 15s --out loadtest/out/floods

.PHONY: loadtest-kube
loadtest-kube: build ## The small load test with the changes made through a real kube-apiserver (Istio resources) instead of the YAML directory.
	$(GO) build -o $(BIN)/loadtest ./loadtest
	SHARDPILOT_KUBE_BIN="$$(hack/kube-binaries.sh)" $(BIN)/loadtest run --bin $(BIN) --source kube --proxies 500 --services 200 --endpoints 10 \
		--endpoint-rate 10 --route-rate 1 --service-rate 0.5 --duration 20s --baseline=false --out loadtest/out/kube

.PHONY: loadtest-starved
loadtest-starved: build ## The small load test on a starved pusher (about 2 minutes): held to one core (GOMAXPROCS=1) with two spinning processes beside it, 20 proxies reading each response 2 s late and 10 a second connecting for 3 s beside the fleet; fails unless every change reached every proxy within 10 s.
	$(GO) build -o $(BIN)/loadtest ./loadtest
	$(BIN)/loadtest run --bin $(BIN) --proxies 500 --services 200 --endpoints 10 \
		--endpoint-rate 10 --route-rate 1 --service-rate 0.5 --duration 20s --baseline=false \
		--pusher-gomaxprocs 1 --hogs 2 --slow-readers 20 --trickle 10 --bound 10s --out loadtest/out/starved

.PHONY: loadtest-istiod
loadtest-istiod: build ## shardpilot beside istiod (ISTIO_BIN from hack/istio-binaries.sh) on the same mesh, changes and simulated Envoys, both reading Istio resources from a kube-apiserver built by hack/kube-binaries.sh: 500 proxies with the baseline, then 2,000; the report gives shardpilot ÷ istiod for every figure (about 12 minutes).
	@test -n "$(ISTIO_BIN)" || { echo 'ISTIO_BIN is not set: give it the directory hack/istio-binaries.sh prints'; exit 2; }
	$(GO) build -o $(BIN)/loadtest ./loadtest
	SHARDPILOT_KUBE_BIN="$$(hack/kube-binaries.sh)" $(BIN)/loadtest run --bin $(BIN) --source kube --istiod "$(ISTIO_BIN)" --proxies 500 --services 200 --endpoints 10 \
		--endpoint-rate 10 --route-rate 1 --service-rate 0.5 --duration 20s --out loadtest/out/istiod
	SHARDPILOT_KUBE_BIN="$$(hack/kube-binaries.sh)" $(BIN)/loadtest run --bin $(BIN) --source kube --istiod "$(ISTIO_BIN)" --proxies 2000 --services 200 --endpoints 10 \
		--endpoint-rate 10 --route-rate 1 --service-rate 0.5 --duration 20s --baseline=false --out loadtest/out/istiod-2000

.PHONY: loadtest-large
loadtest-large: build ## Large load test (about 15 min): 5,000 Envoys, 1,000 services, 10,000 endpoints, 20 endpoint + 1 route changes/s for 2 min; 1 and 2 pushers, the reconnect storm, the baseline.
	$(GO) build -o $(BIN)/loadtest ./loadtest
	$(BIN)/loadtest run --bin $(BIN) --proxies 5000 --services 1000 --endpoints 10 \
		--endpoint-rate 20 --route-rate 1 --service-rate 0 --duration 2m --settle 1m --pushers 1,2 --storm --out loadtest/out/large

.PHONY: loadtest-capacity
loadtest-capacity: build ## Capacity search (about 20-30 min): the most proxies one pusher keeps at convergence p99 <= 1 s under 20 endpoint + 1 route changes/s on 1,000 services (10,000 endpoints), from 5,000 proxies doubling until a trial fails, then bisecting to within a tenth; every trial is a phase of the report.
	$(GO) build -o $(BIN)/loadtest ./loadtest
	$(BIN)/loadtest run --bin $(BIN) --proxies 5000 --services 1000 --endpoints 10 \
		--endpoint-rate 20 --route-rate 1 --service-rate 0 --duration 1m --settle 1m --capacity 1s --out loadtest/out/capacity

.PHONY: loadtest-shards
loadtest-shards: build ## Sharded load test (about 5 min): 4,000 Envoys over 40 namespaces, each namespace's Sidecar seeing it and a shared one; one whole-mesh pusher, then 2 and 4 pushers each serving its share of the namespaces (heap, events, etcd and NATS traffic per change); a fifth shard added and removed (the proxies that move); one of the 4 shards alone with its proxies, as on a machine of its own; the reconnect storm.
	$(GO) build -o $(BIN)/loadtest ./loadtest
	$(BIN)/loadtest run --bin $(BIN) --proxies 4000 --services 2000 --endpoints 10 --namespaces 40 \
		--endpoint-rate 10 --route-rate 1 --service-rate 0.5 --duration 30s --pushers 1 --shards 2,4 --reshard --shard-alone --storm --baseline=false --out loadtest/out/shards

.PHONY: istio-binaries
istio-binaries: ## Build Istio's pilot-discovery and pilot-agent (once, into a cache folder, tens of minutes on 2 cores) from ISTIO_SRC, an Istio release's source tree; Istio pins go-control-plane, istio/client-go and agentgateway at commits the module proxy refuses: ISTIO_REPLACE_SRC names a folder of those repositories (see hack/istio-binaries.sh).
	@test -n "$(ISTIO_SRC)" || { echo "set ISTIO_SRC to an Istio release's source tree, and ISTIO_REPLACE_SRC to a folder of go-control-plane, client-go and agentgateway (trees or bare repositories; see hack/istio-binaries.sh)"; exit 2; }
	hack/istio-binaries.sh $(ISTIO_SRC)

# The Istio comparisons build shardpilot into a folder of their own, so
# that a run leaves the checkout's .bin as it was.
ISTIO_TEST_BIN = bin=$$(mktemp -d) && trap 'rm -rf "$$bin"' EXIT && $(GO) build -o "$$bin/" ./cmd/... &&

.PHONY: diff-istiod
diff-istiod: ## Compare what istiod (ISTIO_BIN, from make istio-binaries) and shardpilot send each case of test/istiod/testdata/cases, fact by fact: a client sidecar (or the case's gateway) and a workload's inbound side, connected before the case is applied, each also against a second instance started after it (incremental equals full); and the WorkloadEntry each makes for a registering workload. Writes the tables into DIFF_ISTIOD_REPORT (docs/istio-differential.md); DIFF_ISTIOD_OUT=<dir> keeps every difference and fact, DIFF_ISTIOD_CASES=<regexp> runs some cases.
	@test -n "$(ISTIO_BIN)" || { echo "set ISTIO_BIN=\$$(hack/istio-binaries.sh <istio source>)"; exit 2; }
	$(ISTIO_TEST_BIN) ISTIO_BIN=$(ISTIO_BIN) SHARDPILOT_BIN="$$bin" SHARDPILOT_KUBE_BIN="$$(hack/kube-binaries.sh)" \
		DIFF_ISTIOD_REPORT=$(abspath $(DIFF_ISTIOD_REPORT)) $(GO) test -count=1 -timeout 20m -v -run TestAgainstIstiod ./test/istiod

DIFF_ISTIOD_REPORT ?= docs/istio-differential.md

.PHONY: e2e-istio-agent
e2e-istio-agent: ## Run Istio's own agent (pilot-agent of ISTIO_BIN, from make istio-binaries) in its proxyless mode against shardpilot and a kube-apiserver: certificates from the pushers' CA service, a gRPC server and client talking Istio's mutual TLS, the server's agent naming a WorkloadGroup and registered.
	@test -n "$(ISTIO_BIN)" || { echo "set ISTIO_BIN=\$$(hack/istio-binaries.sh <istio source>)"; exit 2; }
	$(ISTIO_TEST_BIN) ISTIO_BIN=$(ISTIO_BIN) SHARDPILOT_BIN="$$bin" SHARDPILOT_KUBE_BIN="$$(hack/kube-binaries.sh)" \
		$(GO) test -count=1 -timeout 10m -v -run 'TestIstioAgent$$' ./test/istiod

.PHONY: kube-binaries
kube-binaries: ## Build (once, into a cache folder) the kube-apiserver and etcd the Kubernetes tests run.
	hack/kube-binaries.sh

FUZZTIME ?= 10s
FUZZ_TARGETS := \
	FuzzParseFile:./pkg/ingest/yamldir \
	FuzzNormalize:./pkg/ingest/istio \
	FuzzDecode:./pkg/model \
	FuzzApplyEvent:./pkg/pusher \
	FuzzDecodeSotW:./pkg/xds/server \
	FuzzDecodeDelta:./pkg/xds/server \
	FuzzRegistryData:./pkg/ingest/zookeeper

.PHONY: fuzz
fuzz: ## Run each fuzz target for FUZZTIME (default 10s); findings land in the package's testdata/fuzz.
	@set -e; for t in $(FUZZ_TARGETS); do \
		name=$${t%%:*}; pkg=$${t#*:}; \
		echo "== $$name ($$pkg)"; \
		$(GO) test -run '^$$' -fuzz "^$$name\$$" -fuzztime $(FUZZTIME) $$pkg; \
	done

.PHONY: bench
bench: ## Run the benchmarks.
	$(GO) test -run '^$$' -bench . -benchmem ./...

.PHONY: bench-push
bench-push: ## Measure one endpoint change with 50 vs 1,000 connected proxies in 50 classes, and heap per proxy.
	SHARDPILOT_KUBE_BIN="$$(hack/kube-binaries.sh)" $(GO) test -run '^$$' -bench BenchmarkEndpointChange -benchtime 20x -count 3 -timeout 30m ./test/e2e/

.PHONY: bench-ingest
bench-ingest: ## Measure ingesting 2,000 Services / 20,000 endpoints from a real apiserver into etcd.
	SHARDPILOT_KUBE_BIN="$$(hack/kube-binaries.sh)" $(GO) test -run '^$$' -bench BenchmarkIngestFromKubernetes -benchtime 1x -timeout 30m ./pkg/ingest/kube/

# The release (internal/version), which is also the chart's appVersion.
VERSION := $(shell sed -n 's/^var Release = "\(.*\)"/\1/p' internal/version/version.go)
IMAGE ?= ghcr.io/shardpilot/shardpilot:$(VERSION)

.PHONY: image
image: ## Build the image (ingester, pusher, standalone, shardctl; no Docker daemon needed) as an OCI archive, .bin/image.tar, tagged with the release, the chart's appVersion (IMAGE=<name:tag> to name it otherwise); imported into make cluster's node when it runs. Elsewhere: load it (ctr images import, kind load image-archive) or push it (crane push).
	hack/image.sh $(IMAGE) $(BIN)/image.tar

.PHONY: docker-image
docker-image: ## Build the same image with docker from the Dockerfile.
	docker build --build-arg REVISION=$$(git rev-parse --short=12 HEAD) -t $(IMAGE) .

.PHONY: cluster
cluster: ## Bring up a single-node Kubernetes cluster on this machine (root; containerd, runc and CNI from apt, the rest built once from the Go module proxy; idempotent) and print its kubeconfig.
	hack/cluster.sh up

.PHONY: cluster-down
cluster-down: ## Stop what make cluster started and undo its changes to the host (its state stays: hack/cluster.sh wipe forgets it).
	hack/cluster.sh down

.PHONY: e2e-cluster
e2e-cluster: $(HELM) ## On make cluster's node (brought up if needed): build and import the test's images, run the chart README's quickstart as written (make image, helm install of the trial), run a proxyless grpc-go client and server in the mesh, and take the release through upgrades and faults, counting the client's RPCs (test/cluster); about 10 minutes once the cluster's binaries are built.
	hack/cluster.sh up
	hack/image.sh --test-images $(BIN)/test-images
	SHARDPILOT_CLUSTER_KUBECONFIG="$$(hack/cluster.sh kubeconfig)" SHARDPILOT_KUBECTL="$$(hack/kube-binaries.sh)/kubectl" \
	SHARDPILOT_HELM=$(HELM) SHARDPILOT_CLUSTER_REPORT=$(BIN)/e2e-cluster.md \
	$(GO) test -count=1 -v -timeout 40m ./test/cluster

$(HELM):
	$(GO) install helm.sh/helm/v3/cmd/helm@$(HELM_VERSION)

# staticcheck from the Go module proxy, kept under a name of its version.
$(STATICCHECK):
	GOBIN="$$(mktemp -d)" && GOBIN="$$GOBIN" $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) && mv "$$GOBIN/staticcheck" $@

.PHONY: helm
helm: $(HELM) ## Install helm (from the Go module proxy) if it is missing.

.PHONY: bench-idle
bench-idle: ## Connect 1,000 idle proxies, each on its own connection, to an xDS server process: RSS, heap, stacks and goroutines per stream.
	$(GO) test -run '^$$' -bench BenchmarkIdleStreams -benchtime 1x ./pkg/xds/server/

.PHONY: bench-zookeeper
bench-zookeeper: ## Measure ingesting 1,000 Dubbo interfaces × 10 providers from a real ZooKeeper into etcd, and one provider change.
	SHARDPILOT_REQUIRE_ZOOKEEPER=1 SHARDPILOT_REQUIRE_PROMETHEUS=1 SHARDPILOT_HELM=$(HELM) SHARDPILOT_KUBE_BIN="$$(hack/kube-binaries.sh)" $(GO) test -run '^$$' -bench BenchmarkIngestFromZooKeeper -benchtime 1x -timeout 30m ./pkg/ingest/zookeeper/

.PHONY: lint
lint: $(STATICCHECK) ## Check formatting, vet and staticcheck (a deprecated Envoy field istiod still sends is marked //lint:ignore SA1019 where it is set).
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || (gofmt -l $$(git ls-files '*.go'); exit 1)
	$(GO) vet ./...
	$(STATICCHECK) ./...

$(BIN)/protoc-gen-go: go.mod
	$(GO) build -o $@ google.golang.org/protobuf/cmd/protoc-gen-go

.PHONY: generate
generate: $(BIN)/protoc-gen-go ## Regenerate pkg/api from proto/ (needs protoc).
	$(PROTOC) -I proto --plugin=protoc-gen-go=$(BIN)/protoc-gen-go \
		--go_out=. --go_opt=module=$(MODULE) $(PROTOS)

GATEWAY_API_KINDS := gatewayclasses gateways httproutes grpcroutes referencegrants tlsroutes

.PHONY: gateway-api-crds
gateway-api-crds: ## Copy the Gateway API's CRDs the ingester reads (standard channel, and TCPRoute's from the experimental one) from its module (go.mod's version) into the chart.
	@dir=$$($(GO) list -m -f '{{.Dir}}' sigs.k8s.io/gateway-api) && \
	{ echo "# The Gateway API's standard-channel CRDs, $$($(GO) list -m -f '{{.Version}}' sigs.k8s.io/gateway-api), copied from the module sigs.k8s.io/gateway-api by make gateway-api-crds."; \
	  for k in $(GATEWAY_API_KINDS); do echo "---"; grep -v '^---$$' $$dir/config/crd/standard/gateway.networking.k8s.io_$$k.yaml; done; \
	  echo "---"; echo "# TCPRoute is in the experimental channel only."; grep -v '^---$$' $$dir/config/crd/experimental/gateway.networking.k8s.io_tcproutes.yaml; } \
	> deploy/helm/shardpilot/crds/gateway-api.yaml

.PHONY: check-generate
check-generate: $(BIN)/protoc-gen-go ## Fail when pkg/api differs from what proto/ generates.
	@tmp=$$(mktemp -d) && trap 'rm -rf $$tmp' EXIT && \
	$(PROTOC) -I proto --plugin=protoc-gen-go=$(BIN)/protoc-gen-go \
		--go_out=$$tmp --go_opt=module=$(MODULE) $(PROTOS) && \
	diff -r --exclude=doc.go $$tmp/pkg/api pkg/api >/dev/null || \
	{ echo "pkg/api is out of date with proto/: run 'make generate'"; diff -r --exclude=doc.go $$tmp/pkg/api pkg/api | head -40; exit 1; }
