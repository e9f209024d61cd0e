#!/usr/bin/env bash
# Run a private containerd (CRI enabled) for steward's tests.
#
#   containerd.sh start STATE_DIR [BIN_DIR]
#                                   install packages if missing, build and import
#                                   the local images, start containerd, print
#                                   CONTAINERD_SOCK=... and CONTAINERD_CGROUP_PARENT=...
#   containerd.sh stop STATE_DIR    stop it and remove everything it left behind:
#                                   shims, container processes, mounts, network
#                                   namespaces, cgroups under our parent, CNI bridge
#
# Without BIN_DIR the machine's containerd (1.6) runs. With BIN_DIR (a
# directory holding containerd 2.x, its ctr and its shim, as
# scripts/containerd2.sh prints) that containerd runs instead, first on its
# PATH so it starts its own shim, with NRI on a socket under STATE_DIR
# (CONTAINERD_NRI_SOCK=...) and CDI on, reading specs from STATE_DIR/cdi
# (CONTAINERD_CDI_SPEC_DIR=...). containerd always puts shim sockets and runc
# state under /run/containerd: a 2.x instance runs in a mount namespace of
# its own with STATE_DIR/run bind-mounted on /run, so two instances never
# meet there, and its rootfs mounts vanish with that namespace.
#
# Both commands are idempotent. Everything lives under STATE_DIR except what
# the machine's containerd/runc always put under /run/containerd (runc state,
# shim sockets) and the cgroups, which go under CONTAINERD_CGROUP_PARENT, a
# cgroup parent private to this instance. Tests must use that parent so
# cleanup is precise. Only processes that descend from this instance are
# ever signalled.
#
# Needs root. Env: STEWARD_IMAGE_DIR (where image tarballs are cached,
# default STATE_DIR/images).
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PACKAGES=(containerd runc busybox-static containernetworking-plugins)
CNI_BIN_DIR=/usr/lib/cni
NETNS_DIR=/var/run/netns
CGROUP_ROOT=/sys/fs/cgroup
STOP_TIMEOUT=10

log() { echo "containerd.sh: $*" >&2; }
die() {
    log "error: $*"
    exit 1
}

usage() {
    echo "usage: $0 start STATE_DIR [BIN_DIR] | stop STATE_DIR" >&2
    exit 2
}

# --- instance layout --------------------------------------------------------

init_paths() {
    STATE_DIR=$(cd "$1" && pwd)
    SOCK=$STATE_DIR/containerd.sock
    PID_FILE=$STATE_DIR/containerd.pid
    CONFIG=$STATE_DIR/config.toml
    LOG_FILE=$STATE_DIR/containerd.log
    CNI_CONF_DIR=$STATE_DIR/cni/net.d
    IMAGE_DIR=${STEWARD_IMAGE_DIR:-$STATE_DIR/images}
    NRI_SOCK=$STATE_DIR/nri.sock
    CDI_DIR=$STATE_DIR/cdi
    # The containerd 2.x this instance runs (empty: the machine's own); kept
    # in the state directory from `start` to `stop` (which removes it) so
    # `stop`, and a `start` again without BIN_DIR, know the layout `start`
    # chose.
    BIN_FILE=$STATE_DIR/bin-dir
    BIN_DIR=${2:-}
    if [ -z "$BIN_DIR" ] && [ -f "$BIN_FILE" ]; then BIN_DIR=$(cat "$BIN_FILE"); fi
    CTR=ctr
    RUN_DIR=/run
    SUBNET_PREFIX=10.231
    if [ -n "$BIN_DIR" ]; then
        CTR=$BIN_DIR/ctr
        RUN_DIR=$STATE_DIR/run
        # Its own /24s, so its bridge never routes the same subnet as a 1.6
        # instance's.
        SUBNET_PREFIX=10.232
    fi
    RUNC_ROOT=$RUN_DIR/containerd/runc/k8s.io
    SHIM_SOCKET_DIR=$RUN_DIR/containerd/s
    # Names private to this instance, derived from its state directory.
    local hash
    hash=$(printf '%s' "$STATE_DIR" | sha256sum | cut -c1-8)
    BRIDGE=stw$hash
    SUBNET_OCTET=$((16#${hash:0:2}))
    CGROUP_PARENT=/steward-test/$hash
}

pid_alive() {
    [ -n "${1:-}" ] && [ -d "/proc/$1" ] && ! grep -qs '^State:.*Z' "/proc/$1/status"
}

# PID of our containerd if it is running (checked against its command line,
# so a recycled PID is never mistaken for it).
containerd_pid() {
    local pid
    [ -f "$PID_FILE" ] || return 1
    pid=$(cat "$PID_FILE")
    pid_alive "$pid" || return 1
    { tr '\0' ' ' <"/proc/$pid/cmdline"; } 2>/dev/null | grep -qF -- "--config $CONFIG " || return 1
    echo "$pid"
}

# Shims started by our containerd: they carry `-address SOCK` in argv.
our_shims() {
    local dir pid
    for dir in /proc/[0-9]*; do
        pid=${dir#/proc/}
        if { tr '\0' '\n' <"$dir/cmdline"; } 2>/dev/null | grep -qxF -- "$SOCK"; then
            case "$({ head -c 256 "$dir/cmdline" | tr '\0' ' '; } 2>/dev/null)" in
                *containerd-shim*) echo "$pid" ;;
            esac
        fi
    done
}

# All descendants of the given PIDs (not the PIDs themselves).
descendants() {
    [ "$#" -gt 0 ] || return 0
    local -A children=()
    local stat pid ppid rest
    for stat in /proc/[0-9]*/stat; do
        { read -r rest <"$stat"; } 2>/dev/null || continue
        pid=${rest%% *}
        rest=${rest##*) }
        read -r _ ppid _ <<<"$rest"
        children[$ppid]="${children[$ppid]:-} $pid"
    done
    local queue=("$@") next
    while [ "${#queue[@]}" -gt 0 ]; do
        next=${queue[0]}
        queue=("${queue[@]:1}")
        for pid in ${children[$next]:-}; do
            echo "$pid"
            queue+=("$pid")
        done
    done
}

# --- start ------------------------------------------------------------------

ensure_packages() {
    local missing=0
    command -v containerd >/dev/null 2>&1 || missing=1
    command -v ctr >/dev/null 2>&1 || missing=1
    if [ -n "$BIN_DIR" ]; then
        [ -x "$BIN_DIR/containerd" ] && [ -x "$BIN_DIR/ctr" ] || die "no containerd and ctr in $BIN_DIR"
    fi
    command -v runc >/dev/null 2>&1 || missing=1
    [ -x /bin/busybox ] || [ -x /usr/bin/busybox ] || missing=1
    [ -x "$CNI_BIN_DIR/bridge" ] && [ -x "$CNI_BIN_DIR/host-local" ] && [ -x "$CNI_BIN_DIR/loopback" ] || missing=1
    [ "$missing" -eq 0 ] && return 0
    command -v apt-get >/dev/null 2>&1 || die "containerd/runc/busybox/CNI plugins missing and apt-get unavailable"
    log "installing ${PACKAGES[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update >&2 || die "apt-get update failed"
    apt-get install -y --no-install-recommends "${PACKAGES[@]}" >&2 || die "apt-get install failed"
}

write_config() {
    mkdir -p "$CNI_CONF_DIR" "$STATE_DIR/root" "$STATE_DIR/state" "$STATE_DIR/opt" "$STATE_DIR/cni/ipam"
    # containerd 2.x: NRI on a socket of its own (2.x turns it on at a
    # machine-wide path otherwise), CDI on (the 2.x default, said here so the
    # spec directory is ours). 1.6 knows neither.
    local nri="" cdi=""
    if [ -n "$BIN_DIR" ]; then
        mkdir -p "$RUN_DIR" "$CDI_DIR"
        nri="
[plugins.\"io.containerd.nri.v1.nri\"]
  disable = false
  socket_path = \"$NRI_SOCK\"
"
        cdi="  enable_cdi = true
  cdi_spec_dirs = [\"$CDI_DIR\"]
"
    fi
    cat >"$CONFIG" <<EOF
# Private containerd for steward tests (written by containerd.sh).
version = 2
root = "$STATE_DIR/root"
state = "$STATE_DIR/state"
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs",
]

[grpc]
  address = "$SOCK"

[ttrpc]
  address = "$SOCK.ttrpc"

[debug]
  address = "$STATE_DIR/debug.sock"
  level = "info"

[plugins."io.containerd.internal.v1.opt"]
  path = "$STATE_DIR/opt"
$nri
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "steward.local/pause:latest"
$cdi  restrict_oom_score_adj = true
  enable_selinux = false
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  netns_mounts_under_state_dir = true

[plugins."io.containerd.grpc.v1.cri".containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
  BinaryName = "runc"
  SystemdCgroup = false

[plugins."io.containerd.grpc.v1.cri".cni]
  bin_dir = "$CNI_BIN_DIR"
  conf_dir = "$CNI_CONF_DIR"
  max_conf_num = 1
EOF
    cat >"$CNI_CONF_DIR/10-steward.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "steward-test",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": false,
      "ipam": {
        "type": "host-local",
        "dataDir": "$STATE_DIR/cni/ipam",
        "ranges": [[{ "subnet": "$SUBNET_PREFIX.$SUBNET_OCTET.0/24" }]],
        "routes": [{ "dst": "0.0.0.0/0" }]
      }
    }
  ]
}
EOF
}

print_env() {
    echo "CONTAINERD_SOCK=$SOCK"
    echo "CONTAINERD_CGROUP_PARENT=$CGROUP_PARENT"
    echo "CONTAINERD_PID=$1"
    if [ -n "$BIN_DIR" ]; then
        echo "CONTAINERD_NRI_SOCK=$NRI_SOCK"
        echo "CONTAINERD_CDI_SPEC_DIR=$CDI_DIR"
    fi
}

cmd_start() {
    local pid
    if pid=$(containerd_pid); then
        log "already running (pid $pid)"
        print_env "$pid"
        return 0
    fi
    [ "$(id -u)" -eq 0 ] || die "must run as root to start containerd"
    ensure_packages
    "$SCRIPT_DIR/build-images.sh" "$IMAGE_DIR" >&2 || die "building images failed"
    write_config
    rm -f "$SOCK" "$SOCK.ttrpc" "$STATE_DIR/debug.sock" "$NRI_SOCK"

    # Detached from our session and stdio so callers reading our output do
    # not wait for containerd to exit.
    if [ -n "$BIN_DIR" ]; then
        printf '%s\n' "$BIN_DIR" >"$BIN_FILE"
        # unshare and sh exec: the PID is containerd's own.
        PATH="$BIN_DIR:$PATH" setsid unshare --mount --propagation private -- \
            sh -c 'mount --bind "$1" /run && exec containerd --config "$2"' sh "$RUN_DIR" "$CONFIG" \
            </dev/null >>"$LOG_FILE" 2>&1 &
    else
        setsid containerd --config "$CONFIG" </dev/null >>"$LOG_FILE" 2>&1 &
    fi
    pid=$!
    echo "$pid" >"$PID_FILE"

    local waited=0
    until "$CTR" -a "$SOCK" version >/dev/null 2>&1 && { [ -z "$BIN_DIR" ] || [ -S "$NRI_SOCK" ]; }; do
        if ! pid_alive "$pid"; then
            tail -n 30 "$LOG_FILE" >&2 || true
            die "containerd exited during startup (log: $LOG_FILE)"
        fi
        if [ "$waited" -ge 300 ]; then
            tail -n 30 "$LOG_FILE" >&2 || true
            die "containerd socket not ready after 30s (log: $LOG_FILE)"
        fi
        sleep 0.1
        waited=$((waited + 1))
    done

    if ! "$CTR" -a "$SOCK" plugins ls 2>/dev/null | grep -E '^io\.containerd\.grpc\.v1[[:space:]]+cri[[:space:]]' | grep -q ' ok'; then
        grep -E 'level=(error|warning)' "$LOG_FILE" | tail -n 10 >&2 || true
        terminate "$pid"
        die "the CRI plugin did not load (log: $LOG_FILE)"
    fi

    local image
    for image in busybox pause; do
        "$CTR" -a "$SOCK" -n k8s.io images import "$IMAGE_DIR/$image.tar" >&2 ||
            die "importing $image image failed"
    done
    log "containerd running (pid $pid)"
    print_env "$pid"
}

# --- stop -------------------------------------------------------------------

# Signal a PID list, wait up to STOP_TIMEOUT seconds, then SIGKILL survivors.
terminate() {
    [ "$#" -gt 0 ] || return 0
    kill -TERM "$@" 2>/dev/null || true
    local i pid alive
    for ((i = 0; i < STOP_TIMEOUT * 10; i++)); do
        alive=0
        for pid in "$@"; do
            pid_alive "$pid" && alive=1
        done
        [ "$alive" -eq 0 ] && return 0
        sleep 0.1
    done
    kill -KILL "$@" 2>/dev/null || true
    for ((i = 0; i < 50; i++)); do
        alive=0
        for pid in "$@"; do
            pid_alive "$pid" && alive=1
        done
        [ "$alive" -eq 0 ] && return 0
        sleep 0.1
    done
    log "warning: processes still alive after SIGKILL: $*"
}

# Remove a cgroup directory tree bottom-up (rmdir only: a cgroup still in
# use by someone is never touched).
remove_cgroup_tree() {
    local dir=$1
    [ -d "$dir" ] || return 0
    find "$dir" -depth -type d -exec rmdir {} \; 2>/dev/null || true
    if [ -d "$dir" ]; then
        log "warning: cgroup $dir still present (in use?)"
    fi
}

cmd_stop() {
    local pid shims=() procs=() netns=() inodes=() ns
    pid=$(containerd_pid) || pid=""
    mapfile -t shims < <(our_shims)
    mapfile -t procs < <(descendants "${shims[@]}")

    # Network namespaces held by our container processes (matched by inode).
    if [ -d "$NETNS_DIR" ] && [ "${#procs[@]}" -gt 0 ]; then
        local p
        for p in "${procs[@]}"; do
            inodes+=("$(stat -L -c %i "/proc/$p/ns/net" 2>/dev/null || true)")
        done
        for ns in "$NETNS_DIR"/*; do
            [ -e "$ns" ] || continue
            local ino
            ino=$(stat -L -c %i "$ns" 2>/dev/null || true)
            [ -n "$ino" ] || continue
            for p in "${inodes[@]}"; do
                [ "$p" = "$ino" ] && netns+=("$ns") && break
            done
        done
    fi

    if [ -n "$pid" ]; then
        log "stopping containerd (pid $pid)"
        terminate "$pid"
    fi

    # Containers left running: let runc kill them and drop their state and
    # cgroups, then make sure nothing below our shims survives.
    local task_dir=$STATE_DIR/state/io.containerd.runtime.v2.task/k8s.io id
    if [ -d "$task_dir" ]; then
        for id in "$task_dir"/*; do
            [ -e "$id" ] || continue
            id=$(basename "$id")
            if [ -d "$RUNC_ROOT/$id" ]; then
                runc --root "$RUNC_ROOT" delete --force "$id" >/dev/null 2>&1 || true
            fi
            rm -f "$SHIM_SOCKET_DIR/$(printf '%s' "$SOCK/k8s.io/$id" | sha256sum | cut -c1-64)"
        done
    fi
    mapfile -t procs < <(descendants "${shims[@]}")
    if [ "${#procs[@]}" -gt 0 ]; then
        kill -KILL "${procs[@]}" 2>/dev/null || true
    fi
    terminate "${shims[@]}"

    for ns in "${netns[@]}"; do
        umount "$ns" 2>/dev/null || umount -l "$ns" 2>/dev/null || true
        rm -f "$ns"
    done

    # Mounts below the state directory (rootfs overlays, shm), deepest first.
    local mnt mounts=()
    mapfile -t mounts < <(awk -v prefix="$STATE_DIR/" 'index($5, prefix) == 1 {print $5}' /proc/self/mountinfo | sort -r)
    for mnt in "${mounts[@]}"; do
        umount "$mnt" 2>/dev/null || umount -l "$mnt" 2>/dev/null || true
    done

    local controller
    for controller in "$CGROUP_ROOT"/*; do
        [ -d "$controller" ] || continue
        remove_cgroup_tree "$controller$CGROUP_PARENT"
        rmdir "$controller/steward-test" 2>/dev/null || true
    done

    if ip link show "$BRIDGE" >/dev/null 2>&1; then
        ip link delete "$BRIDGE" || log "warning: could not delete bridge $BRIDGE"
    fi

    rm -f "$PID_FILE" "$SOCK" "$SOCK.ttrpc" "$STATE_DIR/debug.sock" "$NRI_SOCK"
    # A 2.x instance's private /run (shim sockets, runc state): nothing is
    # mounted on it outside its namespace, which is gone with its processes.
    if [ -n "$BIN_DIR" ] && [ -d "$RUN_DIR" ]; then rm -rf "$RUN_DIR"; fi
    # Last: everything above needed the layout it records. A later `start`
    # of this directory without BIN_DIR then runs the machine's containerd,
    # not the 2.x an earlier start chose. (A restart, `start` again before
    # any `stop`, still finds it.)
    rm -f "$BIN_FILE"
    log "stopped"
}

[ "$#" -eq 2 ] || { [ "$#" -eq 3 ] && [ "$1" = start ]; } || usage
case "$1" in
    start)
        mkdir -p "$2"
        init_paths "$2" "${3:-}"
        cmd_start
        ;;
    stop)
        if [ ! -d "$2" ]; then
            log "nothing to stop: $2 does not exist"
            exit 0
        fi
        init_paths "$2"
        cmd_stop
        ;;
    *) usage ;;
esac
