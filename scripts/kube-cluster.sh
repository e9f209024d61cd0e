#!/usr/bin/env bash
# A one-machine Kubernetes cluster from upstream's own binaries, for steward's
# real-cluster tests and for trying steward on one machine.
#
#   kube-cluster.sh start DIR     start etcd, kube-apiserver, kube-controller-manager,
#                                 kube-scheduler (with steward's extender in its
#                                 configuration), and two nodes, each a kubelet on
#                                 its own containerd 2.x with kube-proxy; print
#                                 KUBECONFIG=… and the rest for `eval`
#   kube-cluster.sh stop DIR      stop all of it and remove what it left behind
#   kube-cluster.sh restart-kubelet DIR NODE
#                                 stop NODE's kubelet (SIGTERM) and start it again
#
# Env (start): STEWARD_KUBE_BIN (kube-apiserver, kube-controller-manager,
# kube-scheduler, kubelet, kube-proxy and etcd: scripts/kube-build.sh),
# STEWARD_CONTAINERD2_BIN (containerd 2.x, its ctr and shim:
# scripts/containerd2.sh), STEWARD_IMAGE_DIR (where the test images' tarballs
# are cached, default DIR/images), STEWARD_CLUSTER_IMAGES (extra OCI tarballs
# imported into every node's containerd, space-separated).
#
# Layout, all private to DIR and to network and mount namespaces this script
# makes (nothing of the machine's own network, /run or kubelet paths is used):
# - a bridge in the machine's namespace holding 10.244.0.254/24; the control
#   plane in a network namespace of its own at 10.244.0.1 (etcd on its
#   loopback, kube-apiserver on :6443, the `kubernetes` Service at
#   10.96.0.1:443 through its kube-proxy);
# - node-a at 10.244.0.11 and node-b at 10.244.0.12, each in a network
#   namespace and a mount namespace of its own, with DIR/<node>/run on /run,
#   DIR/<node>/kubelet on /var/lib/kubelet, DIR/<node>/steward on
#   /var/lib/steward and DIR/<node>/log on /var/log/pods, so the paths kubelet,
#   containerd and steward's chart take by default are each node's own; pods
#   in 10.244.11.0/24 and 10.244.12.0/24 (bridge CNI), routed between nodes;
# - cgroups under /stwk-a and /stwk-b (kubelet's cgroupRoot, cgroupfs);
# - TLS from a CA made here: the API server's serving certificate, client
#   certificates for admin (system:masters), the controller manager, the
#   scheduler, kube-proxy, each kubelet (system:node:<name>) and the API
#   server's kubelet client; an RSA key for service-account tokens;
#   authorization Node,RBAC with NodeRestriction.
#
# The extender: kube-scheduler calls https://10.96.200.200:8888 (the Service
# steward's chart makes when installed with
# extender.service.clusterIP=10.96.200.200) with its own client
# certificate (CN system:kube-scheduler, from the cluster's CA), verifying
# the extender's serving certificate (pki/extender-serving.crt, made here
# for the chart's extender.tls Secret) against that CA; for the resources of
# STEWARD_CLUSTER_MANAGED (space-separated; default
# resmgr.steward.dev/exclusive-cpus: each steward.dev/<instance> is a
# resource name of its own, and the scheduler takes no pattern).
set -euo pipefail

SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
NODES=(a b)
CP_NS=stwk-cp
BRIDGE=stwk0
HOST_IP=10.244.0.254
CP_IP=10.244.0.1
SERVICE_CIDR=10.96.0.0/16
KUBERNETES_SVC_IP=10.96.0.1
EXTENDER_IP=${STEWARD_CLUSTER_EXTENDER_IP:-10.96.200.200}
EXTENDER_PORT=${STEWARD_CLUSTER_EXTENDER_PORT:-8888}
CLUSTER_CIDR=10.244.0.0/16
STOP_TIMEOUT=15

log() { echo "kube-cluster: $*" >&2; }
die() {
  log "error: $*"
  exit 1
}
usage() {
  echo "usage: $0 start DIR | stop DIR | restart-kubelet DIR NODE" >&2
  exit 2
}

node_ip() { case "$1" in a) echo 10.244.0.11 ;; b) echo 10.244.0.12 ;; esac; }
node_octet() { case "$1" in a) echo 11 ;; b) echo 12 ;; esac; }
node_name() { echo "node-$1"; }
node_ns() { echo "stwk-$1"; }

pid_alive() { [ -n "${1:-}" ] && [ -d "/proc/$1" ] && ! grep -qs '^State:.*Z' "/proc/$1/status"; }

# --- certificates ---------------------------------------------------------

# cert NAME CN O SANS(comma-separated openssl subjectAltName, or "") USAGE
cert() {
  local name=$1 cn=$2 o=$3 sans=$4 usage=$5 subj="/CN=$2"
  [ -n "$o" ] && subj="/O=$o/CN=$cn"
  [ -f "$PKI/$name.crt" ] && return 0
  openssl genrsa -out "$PKI/$name.key" 2048 2>/dev/null
  openssl req -new -key "$PKI/$name.key" -subj "$subj" -out "$PKI/$name.csr" 2>/dev/null
  {
    echo "basicConstraints=CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=$usage"
    [ -n "$sans" ] && echo "subjectAltName=$sans"
  } >"$PKI/$name.ext"
  openssl x509 -req -in "$PKI/$name.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial \
    -days 30 -sha256 -extfile "$PKI/$name.ext" -out "$PKI/$name.crt" 2>/dev/null
  rm -f "$PKI/$name.csr" "$PKI/$name.ext"
}

make_pki() {
  mkdir -p "$PKI"
  if [ ! -f "$PKI/ca.crt" ]; then
    openssl genrsa -out "$PKI/ca.key" 2048 2>/dev/null
    openssl req -x509 -new -key "$PKI/ca.key" -subj "/CN=steward-test-ca" -days 30 -sha256 \
      -out "$PKI/ca.crt" 2>/dev/null
  fi
  cert apiserver kube-apiserver "" \
    "IP:$CP_IP,IP:127.0.0.1,IP:$KUBERNETES_SVC_IP,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local" \
    serverAuth
  cert admin admin system:masters "" clientAuth
  cert controller-manager system:kube-controller-manager "" "" clientAuth
  cert scheduler system:kube-scheduler "" "" clientAuth
  cert kube-proxy system:kube-proxy "" "" clientAuth
  cert extender-serving steward-extender "" \
    "IP:$EXTENDER_IP,DNS:steward-extender.steward-system.svc,DNS:localhost,IP:127.0.0.1" serverAuth
  cert controller-decide steward-controller-decide "" \
    "DNS:steward-controller-decide.steward-system.svc" serverAuth
  cert apiserver-kubelet-client kube-apiserver-kubelet-client system:masters "" clientAuth
  local n
  for n in "${NODES[@]}"; do
    cert "kubelet-$n" "system:node:$(node_name "$n")" system:nodes "" clientAuth
    cert "kubelet-$n-serving" "system:node:$(node_name "$n")" system:nodes \
      "IP:$(node_ip "$n"),DNS:$(node_name "$n")" serverAuth
  done
  [ -f "$PKI/sa.key" ] || openssl genrsa -out "$PKI/sa.key" 2048 2>/dev/null
  [ -f "$PKI/sa.pub" ] || openssl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
}

# kubeconfig FILE CERT_NAME [SERVER]
kubeconfig() {
  cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: steward-test
  cluster:
    certificate-authority: $PKI/ca.crt
    server: ${3:-https://$CP_IP:6443}
users:
- name: $2
  user:
    client-certificate: $PKI/$2.crt
    client-key: $PKI/$2.key
contexts:
- name: steward-test
  context: {cluster: steward-test, user: $2}
current-context: steward-test
EOF
}

# --- processes ----------------------------------------------------------------

# spawn NAME CMD...: start CMD detached, log to DIR/logs/NAME.log, record PID.
spawn() {
  local name=$1
  shift
  setsid "$@" </dev/null >>"$DIR/logs/$name.log" 2>&1 &
  echo "$!" >"$DIR/pids/$name"
}

# wait_for WHAT SECONDS CMD...: until CMD succeeds.
wait_for() {
  local what=$1 secs=$2 i
  shift 2
  for ((i = 0; i < secs * 5; i++)); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.2
  done
  log "timed out waiting for $what"
  return 1
}

kubectl_admin() { "$KUBECTL" --kubeconfig "$DIR/admin.kubeconfig" "$@"; }

# --- network --------------------------------------------------------------------

make_network() {
  if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
    ip link add "$BRIDGE" type bridge
    ip addr add "$HOST_IP/24" dev "$BRIDGE"
    ip link set "$BRIDGE" up
  fi
  local ns ip veth
  for ns in cp "${NODES[@]}"; do
    if [ "$ns" = cp ]; then ip=$CP_IP; else ip=$(node_ip "$ns"); fi
    veth=stwk-$ns
    [ -e "/run/netns/stwk-$ns" ] || ip netns add "stwk-$ns"
    if ! ip link show "$veth" >/dev/null 2>&1; then
      ip link add "$veth" type veth peer name eth0 netns "stwk-$ns"
      ip link set "$veth" master "$BRIDGE" up
      ip -n "stwk-$ns" addr add "$ip/24" dev eth0
      ip -n "stwk-$ns" link set eth0 up
      ip -n "stwk-$ns" link set lo up
      ip netns exec "stwk-$ns" sysctl -qw net.ipv4.ip_forward=1
      ip netns exec "stwk-$ns" sysctl -qw net.ipv4.conf.all.route_localnet=1
    fi
  done
  # Service IPs from the control plane (kube-scheduler calls the extender's
  # Service): a route so the packet reaches kube-proxy's DNAT in OUTPUT.
  ip -n "$CP_NS" route replace "$SERVICE_CIDR" dev eth0
  # Pod subnets: reachable from the machine, the control plane and the other node.
  local n m
  for n in "${NODES[@]}"; do
    ip route replace "10.244.$(node_octet "$n").0/24" via "$(node_ip "$n")" dev "$BRIDGE"
    ip -n "$CP_NS" route replace "10.244.$(node_octet "$n").0/24" via "$(node_ip "$n")"
    for m in "${NODES[@]}"; do
      [ "$n" = "$m" ] && continue
      ip -n "$(node_ns "$m")" route replace "10.244.$(node_octet "$n").0/24" via "$(node_ip "$n")"
    done
    ip -n "$(node_ns "$n")" route replace default via "$CP_IP"
  done
}

# --- control plane ----------------------------------------------------------

feature_gates() {
  # DRA's optional features as each version has them (pkg/features in the
  # module built): the ones not on by default are turned on.
  case "$VERSION_MINOR" in
    35) echo "DRAExtendedResource=true,DRAConsumableCapacity=true,DRADeviceTaints=true,DRAPartitionableDevices=true,ResourceHealthStatus=true" ;;
    36) echo "ResourceHealthStatus=true" ;;
    *) echo "ResourceHealthStatus=true" ;;
  esac
}

start_control_plane() {
  local cp="ip netns exec $CP_NS"
  mkdir -p "$DIR/etcd"
  spawn etcd $cp "$BIN/etcd" --name steward-test --data-dir "$DIR/etcd" \
    --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
    --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
    --initial-cluster steward-test=http://127.0.0.1:2380 --unsafe-no-fsync --log-level warn
  wait_for etcd 60 ip netns exec "$CP_NS" curl -sf http://127.0.0.1:2379/health
  spawn kube-apiserver $cp "$BIN/kube-apiserver" \
    --etcd-servers=http://127.0.0.1:2379 \
    --bind-address=0.0.0.0 --secure-port=6443 --advertise-address="$CP_IP" \
    --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" \
    --client-ca-file="$PKI/ca.crt" \
    --kubelet-client-certificate="$PKI/apiserver-kubelet-client.crt" \
    --kubelet-client-key="$PKI/apiserver-kubelet-client.key" \
    --kubelet-certificate-authority="$PKI/ca.crt" \
    --kubelet-preferred-address-types=InternalIP \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$PKI/sa.pub" --service-account-signing-key-file="$PKI/sa.key" \
    --api-audiences=https://kubernetes.default.svc.cluster.local \
    --service-cluster-ip-range="$SERVICE_CIDR" \
    --authorization-mode=Node,RBAC \
    --enable-admission-plugins=NodeRestriction \
    --allow-privileged=true \
    --feature-gates="$(feature_gates)" \
    --runtime-config="${STEWARD_CLUSTER_RUNTIME_CONFIG:-api/all=true}" \
    --profiling=false --v=1
  wait_for "kube-apiserver /readyz" 120 kubectl_admin get --raw /readyz
  spawn kube-controller-manager $cp "$BIN/kube-controller-manager" \
    --kubeconfig="$DIR/controller-manager.kubeconfig" \
    --authentication-kubeconfig="$DIR/controller-manager.kubeconfig" \
    --authorization-kubeconfig="$DIR/controller-manager.kubeconfig" \
    --use-service-account-credentials \
    --service-account-private-key-file="$PKI/sa.key" --root-ca-file="$PKI/ca.crt" \
    --cluster-signing-cert-file="$PKI/ca.crt" --cluster-signing-key-file="$PKI/ca.key" \
    --service-cluster-ip-range="$SERVICE_CIDR" --cluster-cidr="$CLUSTER_CIDR" \
    --leader-elect=false --bind-address=127.0.0.1 --secure-port=10257 \
    --feature-gates="$(feature_gates)" \
    --node-monitor-grace-period=20s --v=1
  write_scheduler_config
  spawn kube-scheduler $cp "$BIN/kube-scheduler" --config="$DIR/scheduler.yaml" \
    --authentication-kubeconfig="$DIR/scheduler.kubeconfig" \
    --authorization-kubeconfig="$DIR/scheduler.kubeconfig" \
    --bind-address=127.0.0.1 --secure-port=10259 \
    --feature-gates="$(feature_gates)" --v=1
  write_proxy_config cp "$DIR/kube-proxy-cp.yaml"
  spawn kube-proxy-cp $cp "$BIN/kube-proxy" --config="$DIR/kube-proxy-cp.yaml" --hostname-override=control-plane
}

write_scheduler_config() {
  local managed="${STEWARD_CLUSTER_MANAGED:-resmgr.steward.dev/exclusive-cpus}" r
  {
    echo "apiVersion: kubescheduler.config.k8s.io/v1"
    echo "kind: KubeSchedulerConfiguration"
    echo "clientConnection: {kubeconfig: $DIR/scheduler.kubeconfig}"
    echo "leaderElection: {leaderElect: false}"
    echo "profiles: [{schedulerName: default-scheduler}]"
    echo "extenders:"
    echo "- urlPrefix: https://$EXTENDER_IP:$EXTENDER_PORT"
    echo "  enableHTTPS: true"
    echo "  tlsConfig: {caFile: $PKI/ca.crt, certFile: $PKI/scheduler.crt, keyFile: $PKI/scheduler.key}"
    echo "  filterVerb: filter"
    echo "  prioritizeVerb: prioritize"
    echo "  weight: 5"
    echo "  nodeCacheCapable: true"
    echo "  httpTimeout: 5s"
    echo "  ignorable: false"
    echo "  managedResources:"
    for r in $managed; do
      echo "  - {name: $r, ignoredByScheduler: false}"
    done
  } >"$DIR/scheduler.yaml"
}

# write_proxy_config NODE FILE
write_proxy_config() {
  cat >"$2" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $DIR/kube-proxy.kubeconfig}
mode: iptables
clusterCIDR: $CLUSTER_CIDR
bindAddress: 0.0.0.0
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
EOF
}

# --- nodes ------------------------------------------------------------------

write_containerd_config() {
  local n=$1 nd=$2 octet
  octet=$(node_octet "$n")
  mkdir -p "$nd/containerd/root" "$nd/containerd/state" "$nd/cni/net.d" "$nd/cni/ipam" "$nd/opt"
  cat >"$nd/containerd/config.toml" <<EOF
# containerd of $(node_name "$n") (written by kube-cluster.sh); paths under /run
# are the node's own /run.
version = 2
root = "$nd/containerd/root"
state = "$nd/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs"]

[grpc]
  address = "/run/containerd/containerd.sock"

[plugins."io.containerd.internal.v1.opt"]
  path = "$nd/opt"

[plugins."io.containerd.nri.v1.nri"]
  disable = false
  socket_path = "/var/run/nri/nri.sock"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "steward.local/pause:latest"
  enable_cdi = true
  cdi_spec_dirs = ["/var/run/cdi", "/etc/cdi"]
  restrict_oom_score_adj = true
  enable_selinux = false

[plugins."io.containerd.grpc.v1.cri".containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
  BinaryName = "runc"
  SystemdCgroup = false

[plugins."io.containerd.grpc.v1.cri".cni]
  bin_dir = "/usr/lib/cni"
  conf_dir = "$nd/cni/net.d"
  max_conf_num = 1
EOF
  cat >"$nd/cni/net.d/10-steward.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "steward-cluster",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "cni0",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$nd/cni/ipam",
        "ranges": [[{ "subnet": "10.244.$octet.0/24" }]],
        "routes": [{ "dst": "0.0.0.0/0" }]
      }
    },
    { "type": "portmap", "capabilities": { "portMappings": true } }
  ]
}
EOF
}

write_kubelet_config() {
  local n=$1 nd=$2
  cat >"$nd/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $(node_ip "$n")
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
tlsCertFile: $PKI/kubelet-$n-serving.crt
tlsPrivateKeyFile: $PKI/kubelet-$n-serving.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: Webhook}
containerRuntimeEndpoint: unix:///run/containerd/containerd.sock
cgroupDriver: cgroupfs
cgroupRoot: /stwk-$n
failCgroupV1: false
failSwapOn: false
cpuManagerPolicy: none
clusterDomain: cluster.local
resolvConf: $nd/resolv.conf
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
imageMinimumGCAge: 8760h
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", nodefs.inodesFree: "1%", imagefs.available: "1%"}
serializeImagePulls: false
maxPods: 60
nodeStatusUpdateFrequency: 5s
syncFrequency: 10s
shutdownGracePeriod: 0s
localStorageCapacityIsolation: false
featureGates: {$(feature_gates | sed 's/=/: /g; s/,/, /g')}
EOF
}

# The node's namespaces: a holder process in the node's network namespace
# and a mount namespace of its own with the node's private directories on
# /run, /var/lib/kubelet, /var/lib/steward and /var/log/pods; containerd,
# kubelet and kube-proxy enter both.
start_node_holder() {
  local n=$1 nd=$2
  mkdir -p "$nd/run/udev" "$nd/run/netns" "$nd/kubelet" "$nd/steward" "$nd/log" "$nd/etc-cdi"
  : >"$nd/resolv.conf"
  spawn "holder-$n" nsenter --net="/run/netns/$(node_ns "$n")" unshare --mount --propagation private -- \
    sh -c '
      set -e
      nd=$1
      [ -d /run/udev ] && mount --bind /run/udev "$nd/run/udev"
      mount --bind "$nd/run" /run
      mkdir -p /var/lib/kubelet /var/lib/steward /var/log/pods /etc/cdi
      mount --bind "$nd/kubelet" /var/lib/kubelet
      mount --make-rshared /var/lib/kubelet
      mount --bind "$nd/steward" /var/lib/steward
      mount --bind "$nd/log" /var/log/pods
      mount --bind "$nd/etc-cdi" /etc/cdi
      exec sleep infinity
    ' sh "$nd"
  wait_for "node-$n's namespaces" 20 holder_ready "$n" "$nd"
}

# The holder is ready once /run and /var/lib/kubelet inside are the node's own.
holder_ready() {
  local holder
  holder=$(cat "$DIR/pids/holder-$1")
  [ "$(stat -c %i "$2/run")" = "$(stat -c %i "/proc/$holder/root/run" 2>/dev/null)" ] &&
    [ "$(stat -c %i "$2/log")" = "$(stat -c %i "/proc/$holder/root/var/log/pods" 2>/dev/null)" ]
}

# in_node N CMD...: CMD in node N's network and mount namespaces.
in_node() {
  local n=$1 holder
  shift
  holder=$(cat "$DIR/pids/holder-$n")
  nsenter -t "$holder" -m -n -- "$@"
}

make_cgroup_root() {
  local n=$1 c
  for c in /sys/fs/cgroup/*/; do
    c=${c%/}
    case "$(basename "$c")" in unified) continue ;; esac
    mkdir -p "$c/stwk-$n"
    if [ -f "$c/cpuset.cpus" ]; then
      cat "$c/cpuset.cpus" >"$c/stwk-$n/cpuset.cpus"
      cat "$c/cpuset.mems" >"$c/stwk-$n/cpuset.mems"
    fi
  done
}

start_node() {
  local n=$1 nd=$DIR/node-$n holder image
  mkdir -p "$nd"
  start_node_holder "$n" "$nd"
  holder=$(cat "$DIR/pids/holder-$n")
  write_containerd_config "$n" "$nd"
  make_cgroup_root "$n"
  spawn "containerd-$n" nsenter -t "$holder" -m -n -- env PATH="$CONTAINERD_BIN:$PATH" \
    "$CONTAINERD_BIN/containerd" --config "$nd/containerd/config.toml"
  wait_for "containerd on node-$n" 60 in_node "$n" "$CONTAINERD_BIN/ctr" -a /run/containerd/containerd.sock version
  wait_for "NRI on node-$n" 30 test -S "$nd/run/nri/nri.sock"
  for image in "$IMAGE_DIR/pause.tar" "$IMAGE_DIR/busybox.tar" ${STEWARD_CLUSTER_IMAGES:-}; do
    in_node "$n" "$CONTAINERD_BIN/ctr" -a /run/containerd/containerd.sock -n k8s.io images import \
      --no-unpack=false "$image" >/dev/null
  done
  kubeconfig "$nd/kubelet.kubeconfig" "kubelet-$n"
  write_kubelet_config "$n" "$nd"
  start_kubelet "$n"
  write_proxy_config "$n" "$nd/kube-proxy.yaml"
  spawn "kube-proxy-$n" nsenter -t "$holder" -m -n -- "$BIN/kube-proxy" \
    --config="$nd/kube-proxy.yaml" --hostname-override="$(node_name "$n")"
}

start_kubelet() {
  local n=$1 nd=$DIR/node-$1
  spawn "kubelet-$n" nsenter -t "$(cat "$DIR/pids/holder-$n")" -m -n -- "$BIN/kubelet" \
    --config="$nd/kubelet.yaml" --kubeconfig="$nd/kubelet.kubeconfig" \
    --hostname-override="$(node_name "$n")" --node-ip="$(node_ip "$n")" \
    --root-dir=/var/lib/kubelet --v=1
}

# kubelet of node N stopped (SIGTERM, as a service manager stops it) and
# started again with the same configuration; its pods keep running.
cmd_restart_kubelet() {
  local n=${1#node-} pid
  [ -f "$DIR/pids/kubelet-$n" ] || die "no kubelet of node-$n in $DIR"
  BIN=$(cat "$DIR/kube-bin")
  pid=$(cat "$DIR/pids/kubelet-$n")
  terminate "$pid"
  start_kubelet "$n"
  log "kubelet of node-$n restarted"
}

node_ready() {
  [ "$(kubectl_admin get node "$1" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}')" = True ]
}

print_env() {
  echo "KUBECONFIG=$DIR/admin.kubeconfig"
  echo "STEWARD_CLUSTER_DIR=$DIR"
  # Quoted: the node list has a space.
  echo "STEWARD_CLUSTER_NODES='$(for n in "${NODES[@]}"; do printf '%s ' "$(node_name "$n")"; done | sed 's/ $//')'"
  echo "STEWARD_CLUSTER_VERSION=$VERSION"
  echo "STEWARD_CLUSTER_EXTENDER_URL=https://$EXTENDER_IP:$EXTENDER_PORT"
  echo "STEWARD_CLUSTER_PKI=$PKI"
}

cmd_start() {
  [ "$(id -u)" -eq 0 ] || die "must run as root"
  BIN=${STEWARD_KUBE_BIN:?set STEWARD_KUBE_BIN (scripts/kube-build.sh)}
  CONTAINERD_BIN=${STEWARD_CONTAINERD2_BIN:?set STEWARD_CONTAINERD2_BIN (scripts/containerd2.sh)}
  KUBECTL=${STEWARD_KUBECTL:-kubectl}
  IMAGE_DIR=${STEWARD_IMAGE_DIR:-$DIR/images}
  local b
  for b in etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy; do
    [ -x "$BIN/$b" ] || die "no $b in $BIN"
  done
  VERSION=$("$BIN/kubelet" --version | awk '{print $2}')
  VERSION_MINOR=$(echo "$VERSION" | cut -d. -f2)
  command -v iptables >/dev/null || die "iptables is missing (kube-proxy needs it)"
  [ -x /usr/lib/cni/bridge ] && [ -x /usr/lib/cni/portmap ] || die "the CNI plugins are missing (containernetworking-plugins)"
  mkdir -p "$DIR/logs" "$DIR/pids"
  echo "$VERSION" >"$DIR/version"
  echo "$BIN" >"$DIR/kube-bin"
  "$SCRIPT_DIR/build-images.sh" "$IMAGE_DIR" >&2
  make_pki
  kubeconfig "$DIR/admin.kubeconfig" admin
  kubeconfig "$DIR/controller-manager.kubeconfig" controller-manager
  kubeconfig "$DIR/scheduler.kubeconfig" scheduler
  kubeconfig "$DIR/kube-proxy.kubeconfig" kube-proxy
  make_network
  log "starting the control plane ($VERSION)"
  start_control_plane
  local n
  for n in "${NODES[@]}"; do
    log "starting node-$n"
    start_node "$n"
  done
  for n in "${NODES[@]}"; do
    wait_for "node-$n Ready" 180 node_ready "node-$n" || {
      tail -n 30 "$DIR/logs/kubelet-$n.log" >&2
      die "node-$n is not Ready (logs: $DIR/logs)"
    }
  done
  wait_for "the default ServiceAccount" 120 kubectl_admin get serviceaccount default -n default
  log "cluster up: ${NODES[*]/#/node-} ($VERSION)"
  print_env
}

# --- stop -------------------------------------------------------------------

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

terminate() {
  [ "$#" -gt 0 ] || return 0
  kill -TERM "$@" 2>/dev/null || true
  local i pid alive
  for ((i = 0; i < STOP_TIMEOUT * 10; i++)); do
    alive=0
    for pid in "$@"; do pid_alive "$pid" && alive=1; done
    [ "$alive" -eq 0 ] && return 0
    sleep 0.1
  done
  kill -KILL "$@" 2>/dev/null || true
  sleep 0.5
}

# Shims of a node's containerd: their -address is the node's socket, and
# their mount namespace the node's.
node_shims() {
  local nd=$1 dir pid
  for dir in /proc/[0-9]*; do
    pid=${dir#/proc/}
    case "$({ head -c 200 "$dir/cmdline" | tr '\0' ' '; } 2>/dev/null)" in
      *containerd-shim*) ;;
      *) continue ;;
    esac
    # The shim's cwd is under the node's containerd state directory.
    case "$(readlink "$dir/cwd" 2>/dev/null)" in
      "$nd"/*) echo "$pid" ;;
    esac
  done
}

cmd_stop() {
  local name pid pids=() n
  # kubelets and kube-proxies first, then containerd, then the control plane.
  for name in kubelet-a kubelet-b kube-proxy-a kube-proxy-b kube-scheduler kube-controller-manager kube-proxy-cp; do
    [ -f "$DIR/pids/$name" ] && pids+=("$(cat "$DIR/pids/$name")")
  done
  terminate "${pids[@]}"
  for n in "${NODES[@]}"; do
    local nd=$DIR/node-$n shims=() procs=()
    [ -d "$nd" ] || continue
    mapfile -t shims < <(node_shims "$nd")
    [ -f "$DIR/pids/containerd-$n" ] && terminate "$(cat "$DIR/pids/containerd-$n")"
    mapfile -t procs < <(descendants "${shims[@]}")
    [ "${#procs[@]}" -gt 0 ] && kill -KILL "${procs[@]}" 2>/dev/null || true
    terminate "${shims[@]}"
  done
  pids=()
  for name in kube-apiserver etcd holder-a holder-b; do
    [ -f "$DIR/pids/$name" ] && pids+=("$(cat "$DIR/pids/$name")")
  done
  terminate "${pids[@]}"
  # Anything still below what we started (a process a pod left behind).
  for name in "$DIR"/pids/*; do
    [ -f "$name" ] || continue
    pid=$(cat "$name")
    pid_alive "$pid" && kill -KILL "$pid" 2>/dev/null || true
  done
  # Mounts below DIR (rootfs overlays, volumes), deepest first.
  local mnt mounts=()
  mapfile -t mounts < <(awk -v prefix="$DIR/" 'index($5, prefix) == 1 {print $5}' /proc/self/mountinfo | sort -r)
  for mnt in "${mounts[@]}"; do umount "$mnt" 2>/dev/null || umount -l "$mnt" 2>/dev/null || true; done
  for n in cp "${NODES[@]}"; do
    if [ -e "/run/netns/stwk-$n" ]; then ip netns del "stwk-$n" 2>/dev/null || true; fi
    ip link del "stwk-$n" 2>/dev/null || true
  done
  ip link del "$BRIDGE" 2>/dev/null || true
  for n in "${NODES[@]}"; do
    ip route del "10.244.$(node_octet "$n").0/24" 2>/dev/null || true
    local c
    for c in /sys/fs/cgroup/*/; do
      c=${c%/}
      [ -d "$c/stwk-$n" ] && find "$c/stwk-$n" -depth -type d -exec rmdir {} \; 2>/dev/null || true
    done
  done
  rm -rf "$DIR/pids"
  log "stopped"
}

[ "$#" -eq 2 ] || { [ "$#" -eq 3 ] && [ "$1" = restart-kubelet ]; } || usage
case "$1" in
  restart-kubelet)
    DIR=$(cd "$2" && pwd)
    cmd_restart_kubelet "$3"
    ;;
  start)
    mkdir -p "$2"
    DIR=$(cd "$2" && pwd)
    PKI=$DIR/pki
    cmd_start
    ;;
  stop)
    [ -d "$2" ] || { log "nothing to stop: $2 does not exist"; exit 0; }
    DIR=$(cd "$2" && pwd)
    PKI=$DIR/pki
    cmd_stop
    ;;
  *) usage ;;
esac
