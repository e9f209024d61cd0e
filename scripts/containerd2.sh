#!/usr/bin/env bash
# Fetches containerd 2.1.9 (NRI and CDI on by default) from Debian's
# development suite into a cache directory, once, and prints
#   STEWARD_CONTAINERD2_BIN=<directory holding containerd, ctr and the shim>
#   STEWARD_CONTAINERD2_VERSION=<the version fetched>
# for `eval`. Put that directory first on containerd's PATH so it starts the
# matching shim; runc stays the machine's own (the development suite's runc
# needs a newer glibc than Debian 12 has).
#
# Like go-tools.sh: a private sources list and lists directory leave the
# machine's own apt configuration as it is, and the package is extracted with
# dpkg-deb, never installed. Cached under the same root, keyed by version.
set -euo pipefail

suite=sid
version=${STEWARD_CONTAINERD2_VERSION:-2.1.9}
tools="${STEWARD_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/steward-tools}"
dir="$tools/containerd-$version"
bin="$dir/root/usr/bin"

if [ ! -x "$bin/containerd" ] || [ ! -f "$dir/complete" ]; then
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
    echo "containerd2: no Debian archive URI in the machine's apt sources" >&2
    exit 1
  fi
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $uri $suite main" >"$dir/apt/sources.list"
  opts=(-o "Dir::Etc::SourceList=$dir/apt/sources.list" -o Dir::Etc::SourceParts=/dev/null
    -o "Dir::State::Lists=$dir/apt/lists" -o "Dir::Cache=$dir/apt/cache"
    -o APT::Sandbox::User=root)
  apt-get "${opts[@]}" update -qq >&2
  # Debian revisions change; the upstream version is what we pin.
  candidate=$(apt-cache "${opts[@]}" madison containerd | awk -v v="$version" '$3 ~ "^" v "([~+-]|$)" { print $3; exit }')
  if [ -z "$candidate" ]; then
    echo "containerd2: Debian $suite has no containerd $version (it has: $(apt-cache "${opts[@]}" madison containerd | awk '{ print $3 }' | tr '\n' ' '))" >&2
    exit 1
  fi
  echo "containerd2: fetching containerd $candidate from Debian $suite" >&2
  (cd "$dir/debs" && apt-get "${opts[@]}" download -qq "containerd=$candidate" >&2)
  for deb in "$dir"/debs/*.deb; do dpkg-deb -x "$deb" "$dir/root"; done
  rm -rf "$dir/debs" "$dir/apt" "$dir/root/usr/share/doc" "$dir/root/usr/share/man"
  "$bin/containerd" --version >&2
  touch "$dir/complete"
fi

echo "STEWARD_CONTAINERD2_BIN=$bin"
echo "STEWARD_CONTAINERD2_VERSION=$version"
