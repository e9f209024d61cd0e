#!/usr/bin/env bash
# Builds kube-apiserver, kube-controller-manager, kube-scheduler, kubelet and
# kube-proxy of one Kubernetes version from upstream's own Go module
# (k8s.io/kubernetes), and etcd (go.etcd.io/etcd/server/v3 at the version
# that Kubernetes version's go.mod pins), with the machine's Go toolchain and
# the Go module proxy, once, into a cache keyed by version, and prints
#   STEWARD_KUBE_BIN=<directory holding the six binaries>
#   STEWARD_KUBE_VERSION=<the version built>
# for `eval`.
#
#   scripts/kube-build.sh [VERSION]      # default 1.37.2
#
# k8s.io/kubernetes requires its staging modules (k8s.io/api, client-go, …) at
# v0.0.0 and maps them with `replace` lines that apply only inside its own
# repository, so `go install k8s.io/kubernetes/cmd/kubelet@…` cannot work. A
# small wrapper module requires k8s.io/kubernetes at VERSION and replaces every
# staging module its go.mod lists with the published v0.<minor>.<patch>.
set -euo pipefail

version=${1:-${STEWARD_KUBE_VERSION:-1.37.2}}
version=${version#v}
minor=${version#*.}; minor=${minor%%.*}
staging="v0.${version#*.}"
tools="${STEWARD_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/steward-tools}"
dir="$tools/kubernetes-$version"
bin="$dir/bin"
names=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy)
go_bin=${STEWARD_KUBE_GO:-$(command -v go || echo /usr/local/go/bin/go)}

complete() {
  [ -f "$dir/complete" ] || return 1
  for n in "${names[@]}" etcd; do [ -x "$bin/$n" ] || return 1; done
}

if ! complete; then
  # A binary built before stays (a build that stopped half-way, or a cache of
  # an earlier list of binaries): only what is missing is built.
  rm -rf "$dir/wrap" "$dir/complete"
  mkdir -p "$dir/wrap" "$bin"
  t0=$SECONDS
  export GOFLAGS=-mod=mod GOTOOLCHAIN=local CGO_ENABLED=0
  # The module cache and build cache stay beside the binaries' cache root,
  # shared between versions (most of the dependency graph is the same).
  export GOMODCACHE="$tools/go-mod" GOCACHE="$tools/go-build-cache"
  cd "$dir/wrap"
  "$go_bin" mod init steward.dev/kube-build >&2 2>/dev/null
  "$go_bin" mod download -json "k8s.io/kubernetes@v$version" >"$dir/module.json"
  moddir=$(sed -n 's/^\t"Dir": "\(.*\)",$/\1/p' "$dir/module.json")
  [ -f "$moddir/go.mod" ] || { echo "kube-build: k8s.io/kubernetes@v$version has no go.mod in the module cache" >&2; exit 1; }
  # The staging modules, from upstream's own replace block.
  mapfile -t mods < <(sed -n 's#^\t\(k8s\.io/[a-z0-9-]*\) => \./staging/src/.*#\1#p' "$moddir/go.mod")
  [ "${#mods[@]}" -gt 10 ] || { echo "kube-build: no staging replaces found in k8s.io/kubernetes@v$version's go.mod" >&2; exit 1; }
  {
    echo "module steward.dev/kube-build"
    echo
    sed -n 's/^go \(.*\)$/go \1/p' "$moddir/go.mod"
    echo
    echo "require k8s.io/kubernetes v$version"
    echo
    echo "replace ("
    for m in "${mods[@]}"; do echo "	$m => $m $staging"; done
    echo ")"
  } >go.mod
  # The requires upstream pins (its go.mod's require blocks), so the wrapper
  # resolves exactly the dependency versions upstream builds with.
  sed -n '/^require (/,/^)/p' "$moddir/go.mod" | grep -v '^require (\|^)' | grep -v '=> ' \
    | grep -v '^\s*k8s\.io/\(api\|apiextensions-apiserver\|apimachinery\|apiserver\|cli-runtime\|client-go\|cloud-provider\|cluster-bootstrap\|code-generator\|component-base\|component-helpers\|controller-manager\|cri-api\|cri-client\|cri-streaming\|csi-translation-lib\|dynamic-resource-allocation\|endpointslice\|externaljwt\|kms\|kube-aggregator\|kube-controller-manager\|kube-proxy\|kube-scheduler\|kubectl\|kubelet\|metrics\|mount-utils\|pod-security-admission\|sample-apiserver\|sample-cli-plugin\|sample-controller\|streaming\) ' \
    | sed 's#^\s*\([^ ]*\) \([^ ]*\).*#require \1 \2#' >>go.mod
  cat >main.go <<'EOF'
package main

// The wrapper module builds upstream's commands; it has no code of its own.
import (
	_ "go.etcd.io/etcd/server/v3/etcdmain"
	_ "k8s.io/kubernetes/cmd/kubelet/app"
)

func main() {}
EOF
  "$go_bin" mod tidy -e >&2 2>"$dir/tidy.log" || { cat "$dir/tidy.log" >&2; exit 1; }
  date=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  ld="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld="$ld -X $pkg.gitVersion=v$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    ld="$ld -X $pkg.gitTreeState=clean -X $pkg.buildDate=$date"
  done
  for n in "${names[@]}"; do
    [ -x "$bin/$n" ] && continue
    echo "kube-build: building $n v$version" >&2
    "$go_bin" build -p "${STEWARD_KUBE_BUILD_P:-2}" -trimpath -ldflags "$ld" -o "$bin/$n.tmp" "k8s.io/kubernetes/cmd/$n" >&2
    mv "$bin/$n.tmp" "$bin/$n"
  done
  if [ ! -x "$bin/etcd" ]; then
    echo "kube-build: building etcd $(sed -n 's#^\tgo\.etcd\.io/etcd/server/v3 \([^ ]*\).*#\1#p' "$moddir/go.mod")" >&2
    "$go_bin" build -p "${STEWARD_KUBE_BUILD_P:-2}" -trimpath -ldflags "-s -w" -o "$bin/etcd.tmp" go.etcd.io/etcd/server/v3 >&2
    mv "$bin/etcd.tmp" "$bin/etcd"
  fi
  echo "kube-build: v$version built in $((SECONDS - t0)) s" >&2
  echo "$((SECONDS - t0))" >"$dir/build-seconds"
  touch "$dir/complete"
fi
echo "STEWARD_KUBE_BIN=$bin"
echo "STEWARD_KUBE_VERSION=$version"
