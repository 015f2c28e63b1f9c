#!/usr/bin/env bash
# Builds a real kube-apiserver and etcd for the Kubernetes integration tests,
# once, into a cache folder, and prints that folder. A second run finds the
# binaries and builds nothing. The binaries (~130 MB) are never committed.
#
#   SHARDPILOT_KUBE_CACHE  where to keep them (default ~/.cache/shardpilot/kube-<versions>)
set -euo pipefail
cd "$(dirname "$0")/../tools/kube"

k8s=v1.35.4
etcd=v3.6.16
dir="${SHARDPILOT_KUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/shardpilot/kube-$k8s-etcd-$etcd}"
if [ -x "$dir/kube-apiserver" ] && [ -x "$dir/etcd" ]; then
  echo "$dir"
  exit 0
fi
mkdir -p "$dir"
minor=${k8s#v1.}; minor=${minor%%.*}
echo "building kube-apiserver $k8s and etcd $etcd into $dir (a few minutes, once)" >&2
CGO_ENABLED=0 go build -trimpath -o "$dir/kube-apiserver.tmp" \
  -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$k8s -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor" \
  k8s.io/kubernetes/cmd/kube-apiserver
CGO_ENABLED=0 go build -trimpath -o "$dir/etcd.tmp" -ldflags "-s -w" go.etcd.io/etcd/server/v3
mv "$dir/kube-apiserver.tmp" "$dir/kube-apiserver"
mv "$dir/etcd.tmp" "$dir/etcd"
echo "$dir"
