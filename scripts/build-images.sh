#!/usr/bin/env bash
# Build the two local test images as OCI image-layout tarballs:
#
#   OUTDIR/busybox.tar  steward.local/busybox:latest  workload image
#   OUTDIR/pause.tar    steward.local/pause:latest    sandbox (pause) image
#
# Both hold a static busybox and its applet symlinks. No registry is needed:
# the tarballs are imported with `ctr images import`.
#
# The output is deterministic (fixed mtimes, owners and ordering), and a file
# is only rewritten when its content changes, so reruns are cheap.
#
# Usage: build-images.sh OUTDIR
# Env:   STEWARD_BUSYBOX  path of a statically linked busybox (auto-detected)
set -euo pipefail

if [ "$#" -ne 1 ]; then
    echo "usage: $0 OUTDIR" >&2
    exit 2
fi
outdir=$1

busybox=${STEWARD_BUSYBOX:-}
if [ -z "$busybox" ]; then
    for candidate in /bin/busybox /usr/bin/busybox; do
        if [ -x "$candidate" ]; then
            busybox=$candidate
            break
        fi
    done
fi
if [ -z "$busybox" ] || [ ! -x "$busybox" ]; then
    echo "build-images.sh: no busybox binary found (install busybox-static)" >&2
    exit 1
fi
if ! command -v python3 >/dev/null 2>&1; then
    echo "build-images.sh: python3 is required" >&2
    exit 1
fi

case "$(uname -m)" in
    x86_64) arch=amd64 ;;
    aarch64 | arm64) arch=arm64 ;;
    armv7l) arch=arm ;;
    ppc64le) arch=ppc64le ;;
    s390x) arch=s390x ;;
    riscv64) arch=riscv64 ;;
    *)
        echo "build-images.sh: unsupported machine $(uname -m)" >&2
        exit 1
        ;;
esac

mkdir -p "$outdir"
applets=$("$busybox" --list | LC_ALL=C sort -u | tr '\n' ' ')

python3 - "$busybox" "$outdir" "$arch" "$applets" <<'PY'
import hashlib
import io
import json
import os
import sys
import tarfile

busybox, outdir, arch, applets = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4].split()
MTIME = 946684800  # 2000-01-01T00:00:00Z, fixed so output is reproducible
CREATED = "2000-01-01T00:00:00Z"

with open(busybox, "rb") as f:
    busybox_bytes = f.read()


def tar_add(tar, name, kind, data=b"", mode=0o644, target=""):
    info = tarfile.TarInfo(name)
    info.mtime = MTIME
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    info.mode = mode
    if kind == "dir":
        info.type = tarfile.DIRTYPE
        tar.addfile(info)
    elif kind == "symlink":
        info.type = tarfile.SYMTYPE
        info.linkname = target
        info.mode = 0o777
        tar.addfile(info)
    else:
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))


def rootfs_layer():
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for d in ["bin", "dev", "etc", "proc", "root", "sys", "tmp", "var"]:
            tar_add(tar, d + "/", "dir", mode=0o1777 if d == "tmp" else 0o755)
        tar_add(tar, "bin/busybox", "file", busybox_bytes, mode=0o755)
        for applet in applets:
            if applet != "busybox" and "/" not in applet:
                tar_add(tar, "bin/" + applet, "symlink", target="busybox")
        tar_add(tar, "etc/passwd", "file", b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n")
        tar_add(tar, "etc/group", "file", b"root:x:0:\nnogroup:x:65534:\n")
    return buf.getvalue()


def sha(data):
    return "sha256:" + hashlib.sha256(data).hexdigest()


def canon(obj):
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


# A shell loop that sleeps forever but, unlike a bare `sleep` running as
# PID 1, terminates promptly on SIGTERM/SIGINT because the trap installs a
# handler.
FOREVER = "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done"

IMAGES = [
    # (file, image name, entrypoint, cmd)
    ("busybox.tar", "steward.local/busybox:latest", None, ["/bin/sh", "-c", FOREVER]),
    ("pause.tar", "steward.local/pause:latest", ["/bin/sh", "-c", FOREVER], None),
]

layer = rootfs_layer()
layer_digest = sha(layer)

for filename, ref, entrypoint, cmd in IMAGES:
    container_config = {"Env": ["PATH=/bin"], "WorkingDir": "/"}
    if entrypoint is not None:
        container_config["Entrypoint"] = entrypoint
    if cmd is not None:
        container_config["Cmd"] = cmd
    config = canon({
        "architecture": arch,
        "os": "linux",
        "created": CREATED,
        "config": container_config,
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
        "history": [{"created": CREATED, "created_by": "steward build-images.sh"}],
    })
    manifest = canon({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": sha(config),
            "size": len(config),
        },
        "layers": [{
            "mediaType": "application/vnd.oci.image.layer.v1.tar",
            "digest": layer_digest,
            "size": len(layer),
        }],
    })
    index = canon({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": sha(manifest),
            "size": len(manifest),
            "platform": {"architecture": arch, "os": "linux"},
            "annotations": {
                "io.containerd.image.name": ref,
                "org.opencontainers.image.ref.name": ref.rsplit(":", 1)[1],
            },
        }],
    })
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        tar_add(tar, "oci-layout", "file", canon({"imageLayoutVersion": "1.0.0"}))
        tar_add(tar, "index.json", "file", index)
        tar_add(tar, "blobs/", "dir", mode=0o755)
        tar_add(tar, "blobs/sha256/", "dir", mode=0o755)
        for blob in sorted([layer, config, manifest], key=sha):
            tar_add(tar, "blobs/sha256/" + sha(blob).split(":", 1)[1], "file", blob)
    data = out.getvalue()

    path = os.path.join(outdir, filename)
    try:
        with open(path, "rb") as f:
            unchanged = f.read() == data
    except FileNotFoundError:
        unchanged = False
    if unchanged:
        print(f"{path}: up to date ({ref})")
        continue
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
    print(f"{path}: written ({ref}, manifest {sha(manifest)})")
PY
