#!/usr/bin/env bash
# Builds the Go peers (test-support/go-peers/go/src/peers/<name>) with the Go
# toolchain and upstream libraries scripts/go-tools.sh caches, and prints
#   STEWARD_GO_PEERS=<directory holding one binary per peer>
# for `eval`. The peers are clients and servers whose wire bytes come from
# upstream Go code (encoding/json, grpc-go, kubelet's and the CRI's generated
# types), run by the Rust tests against steward.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
eval "$("$root/scripts/go-tools.sh")"
out="${CARGO_TARGET_DIR:-$root/target}/go-peers/bin"
mkdir -p "$out"
src="$root/test-support/go-peers/go"
for dir in "$src"/src/peers/*/; do
  name=$(basename "$dir")
  env GOROOT="$STEWARD_GOROOT" GOPATH="$src:$STEWARD_GOPATH" GOCACHE="$STEWARD_GOCACHE" \
    GO111MODULE=off GOTOOLCHAIN=local GOFLAGS= CGO_ENABLED=0 \
    "$STEWARD_GO" build -o "$out/$name" "peers/$name" >&2
done
echo "STEWARD_GO_PEERS=$out"
