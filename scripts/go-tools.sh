#!/usr/bin/env bash
# Fetches a Go toolchain and the Go libraries kubelet and kube-scheduler are
# built from (Debian's packages of k8s.io/api, k8s.io/cri-client,
# k8s.io/kubelet, google.golang.org/grpc and their dependency closure) into a
# cache directory, once, and prints
#   STEWARD_GO=<go binary>
#   STEWARD_GOROOT=<GOROOT>
#   STEWARD_GOPATH=<GOPATH holding the libraries' sources>
#   STEWARD_GOCACHE=<a build cache beside them>
# for `eval`. The Go peers under test-support/go-peers build offline from
# these sources (GO111MODULE=off): no module proxy is needed.
#
# The packages come from Debian's development suite through a private sources
# list and lists directory: the machine's own apt configuration is left as it
# is. Packages are extracted with dpkg-deb, never installed.
set -euo pipefail

suite=sid
# The toolchain and the libraries the peers import; apt resolves the rest.
top=(golang-1.27-go golang-1.27-src golang-k8s-cri-client-dev golang-k8s-cri-api-dev
  golang-google-grpc-dev golang-github-kubernetes-kubelet-dev golang-k8s-api-dev
  golang-k8s-apimachinery-dev)
tools="${STEWARD_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/steward-tools}"
dir="$tools/go-peers-$suite-$(printf '%s\n' "${top[@]}" | sha256sum | cut -c1-12)"
goroot="$dir/root/usr/lib/go-1.27"

if [ ! -x "$goroot/bin/go" ] || [ ! -f "$dir/complete" ]; then
  rm -rf "$dir"
  mkdir -p "$dir/apt/lists/partial" "$dir/apt/cache/archives/partial" "$dir/debs" "$dir/root"
  # The archive URI is the machine's own Debian source.
  uri=""
  if [ -f /etc/apt/sources.list.d/debian.sources ]; then
    uri=$(awk '/^URIs:/ { print $2; exit }' /etc/apt/sources.list.d/debian.sources)
  fi
  if [ -z "$uri" ] && [ -f /etc/apt/sources.list ]; then
    uri=$(awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i ~ /^[a-z]+:\/\//) { print $i; exit } }' /etc/apt/sources.list)
  fi
  if [ -z "$uri" ]; then
    echo "go-tools: no Debian archive URI in the machine's apt sources" >&2
    exit 1
  fi
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $uri $suite main" >"$dir/apt/sources.list"
  opts=(-o "Dir::Etc::SourceList=$dir/apt/sources.list" -o Dir::Etc::SourceParts=/dev/null
    -o "Dir::State::Lists=$dir/apt/lists" -o "Dir::Cache=$dir/apt/cache"
    -o APT::Sandbox::User=root)
  apt-get "${opts[@]}" update -qq >&2
  # The Go closure only: libraries are golang-* packages; the C libraries the
  # closure also names are not needed to build pure-Go programs.
  mapfile -t pkgs < <(apt-cache "${opts[@]}" depends --recurse --no-recommends --no-suggests \
    --no-conflicts --no-breaks --no-replaces --no-enhances "${top[@]}" |
    grep -v '^ ' | grep -v '^<' | grep '^golang-' | sort -u)
  echo "go-tools: fetching ${#pkgs[@]} packages from Debian $suite" >&2
  (cd "$dir/debs" && apt-get "${opts[@]}" download -qq "${pkgs[@]}" >&2)
  for deb in "$dir"/debs/*.deb; do dpkg-deb -x "$deb" "$dir/root"; done
  # Keep what a build reads: the toolchain and the library sources.
  rm -rf "$dir/debs" "$dir/apt" "$dir/root/usr/share/doc"
  find "$dir/root/usr/bin" -mindepth 1 -maxdepth 1 ! -name 'go*' -exec rm -f {} + 2>/dev/null || true
  "$goroot/bin/go" version >&2
  touch "$dir/complete"
fi

mkdir -p "$dir/gocache"
echo "STEWARD_GO=$goroot/bin/go"
echo "STEWARD_GOROOT=$goroot"
echo "STEWARD_GOPATH=$dir/root/usr/share/gocode"
echo "STEWARD_GOCACHE=$dir/gocache"
