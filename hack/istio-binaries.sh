#!/usr/bin/env bash
# Builds Istio's pilot-discovery (istiod) and pilot-agent from an Istio source
# tree the developer provides, once, into a cache folder, and prints that
# folder: the reference for `make diff-istiod` and `make e2e-istio-agent`.
# Nothing of Istio is kept in this repository.
#
#   hack/istio-binaries.sh ISTIO_SRC
#
#   ISTIO_SRC               an Istio release tag's source tree (github.com/istio/istio)
#   ISTIO_REPLACE_SRC       a folder holding the source of the modules Istio pins at
#                           pseudo-versions the Go module proxy refuses, one folder per
#                           repository, each at the commit its pseudo-version names:
#                             go-control-plane   (github.com/envoyproxy/go-control-plane)
#                             client-go          (github.com/istio/client-go)
#                             agentgateway       (github.com/agentgateway/agentgateway)
#                           Instead of a tree, a folder may be a bare git repository:
#                           the commit is then extracted into the cache.
#   SHARDPILOT_ISTIO_CACHE  where to build (default ~/.cache/shardpilot/istio-<version>)
#   ISTIO_VERSION           the version the binaries report (default: the tree's git tag,
#                           else its VERSION file)
#
# Istio pins those three modules at commits the module proxy refuses, so
# without ISTIO_REPLACE_SRC the build stops, naming the one it lacks; the
# search tool's fetch brings each as a bare repository. The build takes
# tens of minutes on a 2-core machine, once.
#
# The tree is not modified: the build uses a go.mod of its own in the cache
# (go build -modfile) with replace directives for those modules.
set -euo pipefail

src="${1:-${ISTIO_SRC:-}}"
if [ -z "$src" ] || [ ! -f "$src/go.mod" ] || ! grep -q '^module istio.io/istio$' "$src/go.mod"; then
  echo "usage: hack/istio-binaries.sh ISTIO_SRC (an Istio source tree: its go.mod names istio.io/istio)" >&2
  exit 2
fi
src="$(cd "$src" && pwd)"
# The tree's VERSION file names the minor release; the go.sum's hash tells
# two trees of one minor apart.
version="$(cat "$src/VERSION" 2>/dev/null || echo unknown)-$(sha256sum "$src/go.sum" | cut -c1-8)"
cache="${SHARDPILOT_ISTIO_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/shardpilot/istio-$version}"
if [ -x "$cache/pilot-discovery" ] && [ -x "$cache/pilot-agent" ]; then
  echo "$cache"
  exit 0
fi
mkdir -p "$cache/deps"

# pin MODULE prints the commit of MODULE's pseudo-version in Istio's go.mod,
# or nothing when it is pinned at a tag.
pin() {
  awk -v m="$1" '$1 == m {print $2}' "$src/go.mod" | sed -n 's/.*-\([0-9a-f]\{12\}\)$/\1/p' | head -1
}

# dep NAME COMMIT prints a tree of repository NAME at COMMIT.
dep() {
  local name=$1 commit=$2 from="${ISTIO_REPLACE_SRC:-}/$1"
  if [ -z "${ISTIO_REPLACE_SRC:-}" ] || [ ! -e "$from" ]; then
    echo "istio-binaries: Istio pins $name at $commit, which the module proxy refuses: set ISTIO_REPLACE_SRC to a folder holding $name (a tree at that commit, or a bare git repository)" >&2
    exit 2
  fi
  if [ -f "$from/HEAD" ] && git --git-dir="$from" rev-parse --verify -q "$commit^{commit}" >/dev/null 2>&1; then
    local out="$cache/deps/$name-$commit"
    if [ ! -d "$out" ]; then
      mkdir -p "$out.tmp"
      git --git-dir="$from" archive "$commit" | tar -x -C "$out.tmp"
      mv "$out.tmp" "$out"
    fi
    echo "$out"
  else
    echo "$from"
  fi
}

cp "$src/go.mod" "$cache/go.mod"
cp "$src/go.sum" "$cache/go.sum"
add_replace() { # MODULE DIR
  [ -f "$2/go.mod" ] || { echo "istio-binaries: $2 has no go.mod for $1" >&2; exit 2; }
  printf 'replace %s => %s\n' "$1" "$2" >>"$cache/go.mod"
}
if c=$(pin github.com/envoyproxy/go-control-plane/envoy) && [ -n "$c" ]; then
  d=$(dep go-control-plane "$c")
  add_replace github.com/envoyproxy/go-control-plane/envoy "$d/envoy"
  add_replace github.com/envoyproxy/go-control-plane/contrib "$d/contrib"
fi
if c=$(pin istio.io/client-go) && [ -n "$c" ]; then
  add_replace istio.io/client-go "$(dep client-go "$c")"
fi
if c=$(pin github.com/agentgateway/agentgateway/api) && [ -n "$c" ]; then
  add_replace github.com/agentgateway/agentgateway/api "$(dep agentgateway "$c")/api"
fi

# The version the binaries report, as Istio's release build stamps it.
release="${ISTIO_VERSION:-$(git -C "$src" describe --tags --exact-match 2>/dev/null || cat "$src/VERSION" 2>/dev/null || echo unknown)}"
revision="$(git -C "$src" rev-parse HEAD 2>/dev/null || echo unknown)"
stamp="-X istio.io/istio/pkg/version.buildVersion=$release -X istio.io/istio/pkg/version.buildGitRevision=$revision"
stamp="$stamp -X istio.io/istio/pkg/version.buildTag=$release -X istio.io/istio/pkg/version.buildStatus=Clean"
stamp="$stamp -X istio.io/istio/pkg/version.buildOS=$(go env GOOS) -X istio.io/istio/pkg/version.buildArch=$(go env GOARCH)"

echo "building Istio $release's pilot-discovery and pilot-agent into $cache (tens of minutes on 2 cores, once)" >&2
cd "$src"
for bin in pilot-discovery pilot-agent; do
  GOFLAGS=-mod=mod CGO_ENABLED=0 go build -modfile "$cache/go.mod" -trimpath -ldflags "-s -w $stamp" -o "$cache/$bin.tmp" "./pilot/cmd/$bin"
  mv "$cache/$bin.tmp" "$cache/$bin"
done
echo "$src" >"$cache/source"
echo "$cache"
