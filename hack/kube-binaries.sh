#!/usr/bin/env bash
# Builds a real kube-apiserver and etcd for the Kubernetes integration tests,
# once, into a cache folder, and prints that folder. A second run finds the
# binaries and builds nothing. The binaries (~130 MB) are never committed.
#
#   hack/kube-binaries.sh        kube-apiserver and etcd
#   hack/kube-binaries.sh node   also what a node runs (make cluster): kubelet,
#                                kube-proxy, kube-scheduler, kube-controller-manager,
#                                kubectl, and CoreDNS for the cluster's names
#                                (~500 MB more; 15 to 60 minutes once, on 2 cores)
#
#   SHARDPILOT_KUBE_CACHE  where to keep them (default ~/.cache/shardpilot/kube-<versions>)
set -euo pipefail
cd "$(dirname "$0")/../tools/kube"

k8s=v1.35.4
etcd=v3.6.16
coredns=v1.14.7
dir="${SHARDPILOT_KUBE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/shardpilot/kube-$k8s-etcd-$etcd}"
minor=${k8s#v1.}; minor=${minor%%.*}
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$k8s -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor"
node=(kubelet kube-proxy kube-scheduler kube-controller-manager kubectl)

build_node() {
  local missing=() b
  for b in "${node[@]}"; do [ -x "$dir/$b" ] || missing+=("k8s.io/kubernetes/cmd/$b"); done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "building ${missing[*]} $k8s into $dir (15 to 60 minutes, once)" >&2
    mkdir -p "$dir/tmp"
    CGO_ENABLED=0 go build -trimpath -o "$dir/tmp/" -ldflags "$ldflags" "${missing[@]}"
    for b in "${node[@]}"; do [ -f "$dir/tmp/$b" ] && mv "$dir/tmp/$b" "$dir/$b"; done
    rmdir "$dir/tmp"
  fi
  if [ ! -x "$dir/coredns" ]; then
    # CoreDNS is a module of its own (its dependencies are not Kubernetes'):
    # go install builds it at its version without touching this module.
    echo "building CoreDNS $coredns into $dir (a few minutes, once)" >&2
    (cd / && CGO_ENABLED=0 GOBIN="$dir/tmp" go install -trimpath -ldflags "-s -w" "github.com/coredns/coredns@$coredns")
    mv "$dir/tmp/coredns" "$dir/coredns"
    rmdir "$dir/tmp"
  fi
}

if [ -x "$dir/kube-apiserver" ] && [ -x "$dir/etcd" ]; then
  [ "${1:-}" = node ] && build_node
  echo "$dir"
  exit 0
fi
mkdir -p "$dir"
echo "building kube-apiserver $k8s and etcd $etcd into $dir (once: 10 to 50 minutes on 2 cores, longer on a loaded machine; cached after)" >&2
CGO_ENABLED=0 go build -trimpath -o "$dir/kube-apiserver.tmp" \
  -ldflags "$ldflags" k8s.io/kubernetes/cmd/kube-apiserver
CGO_ENABLED=0 go build -trimpath -o "$dir/etcd.tmp" -ldflags "-s -w" go.etcd.io/etcd/server/v3
mv "$dir/kube-apiserver.tmp" "$dir/kube-apiserver"
mv "$dir/etcd.tmp" "$dir/etcd"
[ "${1:-}" = node ] && build_node
echo "$dir"
