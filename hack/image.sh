#!/usr/bin/env bash
# Builds the project's image without a Docker daemon or a registry: the
# Dockerfile's content (static ingester, pusher, standalone and shardctl on an
# empty base, run as the non-root user 65532), its release and source
# revision inside (--version, shardpilot_build_info), written as an OCI
# archive; imported into the local cluster's containerd when it runs
# (hack/cluster.sh).
#
#   hack/image.sh IMAGE [OUT]          the project's image (default OUT .bin/image.tar)
#   hack/image.sh --test-images DIR    also what the cluster test runs: etcd and NATS as
#                                      the chart's trial names them (built from the Go
#                                      module proxy at those versions) and the grpc-go
#                                      workload test/cluster/meshapp
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"

revision="$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)"
[ "$revision" != unknown ] && [ -n "$(git status --porcelain 2>/dev/null)" ] && revision="$revision-dirty"
build() { # out packages...
  local out=$1; shift
  CGO_ENABLED=0 go build -trimpath -o "$out" \
    -ldflags "-s -w -X github.com/shardpilot/shardpilot/internal/version.revision=$revision" "$@"
}
image() { # tag out ociimage-flags...
  local tag=$1 out=$2; shift 2
  go run ./tools/ociimage -tag "$tag" -out "$out" "$@"
  if "$root/hack/cluster.sh" status >/dev/null 2>&1; then "$root/hack/cluster.sh" import "$out"; fi
}

if [ "${1:-}" = --test-images ]; then
  dir="${2:?hack/image.sh --test-images DIR}"
  mkdir -p "$dir/bin"
  kube="$("$root/hack/kube-binaries.sh")"
  build "$dir/bin/" ./test/cluster/meshapp
  CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$dir/bin/nats-server" github.com/nats-io/nats-server/v2
  etcd_tag=$(sed -n 's/^ *etcdImage: *//p' deploy/helm/shardpilot/values.yaml)
  nats_tag=$(sed -n 's/^ *natsImage: *//p' deploy/helm/shardpilot/values.yaml)
  nats_version=$(sed -n 's#^\tgithub.com/nats-io/nats-server/v2 v\([0-9.]*\)$#\1#p' go.mod)
  [ "${nats_tag#nats:}" = "$nats_version-alpine" ] || { echo "the chart's natsImage $nats_tag is not go.mod's nats-server $nats_version" >&2; exit 1; }
  [ "${etcd_tag##*:}" = "$(sed -n 's/^etcd=//p' hack/kube-binaries.sh)" ] || { echo "the chart's etcdImage $etcd_tag is not hack/kube-binaries.sh's etcd" >&2; exit 1; }
  image shardpilot.local/meshapp:test "$dir/meshapp.tar" -file /meshapp="$dir/bin/meshapp" -entrypoint /meshapp -user 65532:65532
  image "$etcd_tag" "$dir/etcd.tar" -file /usr/local/bin/etcd="$kube/etcd" -env PATH=/usr/local/bin -entrypoint /usr/local/bin/etcd
  image "docker.io/library/$nats_tag" "$dir/nats.tar" -file /nats-server="$dir/bin/nats-server" -entrypoint /nats-server
  exit 0
fi

tag="${1:?hack/image.sh IMAGE [OUT]}"
out="${2:-.bin/image.tar}"
mkdir -p .bin/image
build .bin/image/ ./cmd/ingester ./cmd/pusher ./cmd/standalone ./cmd/shardctl
release=$(sed -n 's/^var Release = "\(.*\)"/\1/p' internal/version/version.go)
image "$tag" "$out" -entrypoint /pusher -user 65532:65532 \
  -file /ingester=.bin/image/ingester -file /pusher=.bin/image/pusher \
  -file /standalone=.bin/image/standalone -file /shardctl=.bin/image/shardctl \
  -label org.opencontainers.image.version="$release" -label org.opencontainers.image.revision="$revision" \
  -label org.opencontainers.image.source=https://github.com/shardpilot/shardpilot
