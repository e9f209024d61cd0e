#!/usr/bin/env bash
# Fetches promtool (Debian's `prometheus` package ships it) into a cache
# directory, once, and prints
#   STEWARD_PROMTOOL=<path>
# for `eval`. The package is downloaded, not installed: it is unpacked with
# dpkg-deb, no service is started and the machine's packages are untouched.
# The monitoring tests run `promtool test rules` and `promtool check metrics`
# with it.
set -euo pipefail
dir="${STEWARD_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/steward-tools}/promtool"
bin="$dir/usr/bin/promtool"
if [ ! -x "$bin" ]; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  # apt-get download writes into the current directory; _apt must be able
  # to write there, or apt falls back to an unsandboxed download (and warns).
  chmod 0777 "$work"
  (cd "$work" && apt-get download -q prometheus >&2) || {
    apt-get update -q >&2
    (cd "$work" && apt-get download -q prometheus >&2)
  }
  deb=$(ls "$work"/prometheus_*.deb)
  rm -rf "$dir.new"
  mkdir -p "$dir.new"
  dpkg-deb -x "$deb" "$dir.new"
  # Only promtool is kept.
  find "$dir.new" -mindepth 1 -not -path "$dir.new/usr" -not -path "$dir.new/usr/bin" \
    -not -path "$dir.new/usr/bin/promtool" -delete 2>/dev/null || true
  rm -rf "$dir"
  mv "$dir.new" "$dir"
fi
"$bin" --version >/dev/null 2>&1
echo "STEWARD_PROMTOOL=$bin"
