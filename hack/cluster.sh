#!/usr/bin/env bash
# A single-node Kubernetes cluster on this machine, from nothing and without
# a registry: containerd, runc and the CNI plugins from the OS packages; etcd,
# the kube-apiserver, controller-manager, scheduler, kubelet, kube-proxy and
# CoreDNS built once from the Go module proxy (hack/kube-binaries.sh node);
# a PKI of its own; a bridge CNI; local persistent volumes. Run as root.
#
#   hack/cluster.sh up       start what is not running (idempotent), print the kubeconfig
#   hack/cluster.sh down     stop what up started (by its PIDs) and undo its host changes
#   hack/cluster.sh wipe     down, then forget the cluster's state (etcd, images, PKI)
#   hack/cluster.sh status   say which components run
#   hack/cluster.sh kubeconfig   print the kubeconfig's path
#   hack/cluster.sh import ARCHIVE...   import OCI image archives into the node's containerd
#
#   SHARDPILOT_CLUSTER_DIR   the cluster's state (default ~/.cache/shardpilot/cluster)
#   SHARDPILOT_KUBE_CACHE    where the binaries are built (see hack/kube-binaries.sh)
#
# Ports on the host: etcd 127.0.0.1:32379 (2379 stays free for the tests),
# kube-apiserver :6443, kubelet :10250, CoreDNS <node IP>:53. Pods get
# 10.244.0.0/24 on the bridge spnode0; Services 10.96.0.0/16.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
K="${SHARDPILOT_CLUSTER_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/shardpilot/cluster}"
P="$K/pki"
NODE=shardpilot-node
BRIDGE=spnode0
POD_CIDR=10.244.0.0/24
SERVICE_CIDR=10.96.0.0/16
export CONTAINERD_ADDRESS="$K/run/containerd.sock"

say() { echo "$(date +%T) $*" >&2; }

node_ip() {
  ip -4 -o route get 192.0.2.255 2>/dev/null | sed -n 's/.* src \([0-9.]*\).*/\1/p' | head -1
}

running() { [ -f "$K/pids/$1" ] && kill -0 "$(cat "$K/pids/$1")" 2>/dev/null; }

launch() { # name cmd...
  local n=$1; shift
  if running "$n"; then return; fi
  setsid "$@" >>"$K/logs/$n.log" 2>&1 </dev/null &
  echo $! >"$K/pids/$n"
  say "started $n (pid $!, log $K/logs/$n.log)"
}

waitfor() { # what cmd...
  local what=$1; shift
  for _ in $(seq 1 360); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 0.5
  done
  say "$what is not ready after 180 s: see $K/logs"
  return 1
}

packages() {
  local missing=()
  command -v containerd >/dev/null || missing+=(containerd)
  command -v runc >/dev/null || missing+=(runc)
  [ -x /usr/lib/cni/bridge ] || missing+=(containernetworking-plugins)
  command -v iptables >/dev/null || missing+=(iptables)
  command -v conntrack >/dev/null || missing+=(conntrack)
  command -v openssl >/dev/null || missing+=(openssl)
  command -v curl >/dev/null || missing+=(curl)
  if [ ${#missing[@]} -gt 0 ]; then
    say "installing ${missing[*]}"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}

pki() {
  [ -f "$P/ca.crt" ] && return
  say "making the cluster's PKI in $P"
  mkdir -p "$P"
  (
    cd "$P"
    openssl genrsa -out ca.key 2048 2>/dev/null
    openssl req -x509 -new -nodes -key ca.key -subj "/CN=shardpilot-cluster-ca" -days 3650 -out ca.crt 2>/dev/null
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
    sign() { # name subject extensions
      openssl genrsa -out "$1.key" 2048 2>/dev/null
      openssl req -new -key "$1.key" -subj "$2" -out "$1.csr" 2>/dev/null
      printf '%s\n' "$3" >"$1.ext"
      openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 -extfile "$1.ext" -out "$1.crt" 2>/dev/null
      rm -f "$1.csr" "$1.ext"
    }
    client="basicConstraints=CA:FALSE
keyUsage=digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth"
    sign apiserver "/CN=kube-apiserver" "basicConstraints=CA:FALSE
keyUsage=digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,IP:127.0.0.1,IP:10.96.0.1,IP:$IP"
    sign admin "/O=system:masters/CN=shardpilot-cluster-admin" "$client"
    sign apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" "$client"
    sign controller-manager "/CN=system:kube-controller-manager" "$client"
    sign scheduler "/CN=system:kube-scheduler" "$client"
    sign kubelet "/O=system:nodes/CN=system:node:$NODE" "$client"
    sign kube-proxy "/CN=system:kube-proxy" "$client"
    sign kubelet-serving "/CN=$NODE" "basicConstraints=CA:FALSE
keyUsage=digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=DNS:$NODE,IP:$IP"
  )
  echo "$IP" >"$P/ip"
}

# put FILE: stdin becomes FILE unless FILE already says the same (kube-proxy
# exits when its configuration file is written, even with the same content).
put() {
  local f=$1
  cat >"$f.new"
  if cmp -s "$f.new" "$f"; then rm -f "$f.new"; else mv "$f.new" "$f"; fi
}

kubeconfig() { # name
  put "$K/$1.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: shardpilot
  cluster:
    certificate-authority: $P/ca.crt
    server: https://127.0.0.1:6443
users:
- name: $1
  user:
    client-certificate: $P/$1.crt
    client-key: $P/$1.key
contexts:
- name: shardpilot
  context: {cluster: shardpilot, user: $1}
current-context: shardpilot
EOF
}

configs() {
  mkdir -p "$K"/{etc,pids,logs,run,etcd,kubelet,log/pods,cni/net.d,volumes}
  for n in admin controller-manager scheduler kubelet kube-proxy; do kubeconfig "$n"; done
  put "$K/etc/containerd.toml" <<EOF
# containerd 1.6: everything under $K, no registry.
version = 2
root = "$K/containerd/root"
state = "$K/containerd/state"
oom_score = 0
[grpc]
  address = "$K/run/containerd.sock"
[ttrpc]
  address = "$K/run/containerd-ttrpc.sock"
[metrics]
  address = ""
[plugins]
  [plugins."io.containerd.internal.v1.opt"]
    path = "$K/containerd/opt"
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "shardpilot.local/pause:1"
    enable_selinux = false
    # Where root may not lower oom_score_adj (no CAP_SYS_RESOURCE, as in some
    # VMs), the sandbox's default -998 makes runc's init die; clamp it.
    restrict_oom_score_adj = true
    [plugins."io.containerd.grpc.v1.cri".containerd]
      snapshotter = "overlayfs"
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          BinaryName = "$(command -v runc)"
          Root = "$K/run/runc"
          SystemdCgroup = false
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "/usr/lib/cni"
      conf_dir = "$K/cni/net.d"
      max_conf_num = 1
EOF
  put "$K/cni/net.d/10-shardpilot.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "shardpilot",
  "plugins": [
    {"type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": true, "hairpinMode": true,
     "ipam": {"type": "host-local", "dataDir": "$K/cni/ipam",
              "ranges": [[{"subnet": "$POD_CIDR", "gateway": "10.244.0.1"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "portmap", "capabilities": {"portMappings": true}},
    {"type": "loopback"}
  ]
}
EOF
  # kubelet 1.35 refuses a cgroup v1 host unless told otherwise
  local cgv1=false
  [ -f /sys/fs/cgroup/cgroup.controllers ] || cgv1=true
  put "$K/etc/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://$K/run/containerd.sock
address: 0.0.0.0
port: 10250
healthzBindAddress: 127.0.0.1
healthzPort: 10248
readOnlyPort: 0
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $P/ca.crt}
authorization:
  mode: Webhook
tlsCertFile: $P/kubelet-serving.crt
tlsPrivateKeyFile: $P/kubelet-serving.key
clusterDomain: cluster.local
clusterDNS: [$IP]
resolvConf: /etc/resolv.conf
failSwapOn: false
podLogsDir: $K/log/pods
serializeImagePulls: false
maxPods: 60
evictionHard:
  memory.available: "200Mi"
  nodefs.available: "5%"
  imagefs.available: "5%"
imageGCHighThresholdPercent: 95
imageGCLowThresholdPercent: 90
EOF
  put "$K/etc/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: $K/kube-proxy.kubeconfig
hostnameOverride: $NODE
mode: iptables
clusterCIDR: $POD_CIDR
bindAddress: 0.0.0.0
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
oomScoreAdj: 0
EOF
  put "$K/etc/Corefile" <<EOF
cluster.local:53 10.in-addr.arpa:53 {
    bind $IP
    errors
    kubernetes cluster.local 10.in-addr.arpa {
        kubeconfig $K/admin.kubeconfig shardpilot
        pods insecure
    }
    cache 5
}
.:53 {
    bind $IP
    errors
    forward . /etc/resolv.conf
    cache 30
}
EOF
}

images() {
  [ -f "$K/images/pause.tar" ] || {
    mkdir -p "$K/images"
    (cd "$root" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$K/images/pause" ./tools/pause &&
      go run ./tools/ociimage -tag shardpilot.local/pause:1 -entrypoint /pause -file /pause="$K/images/pause" -out "$K/images/pause.tar" >/dev/null)
  }
  ctr -n k8s.io images ls -q | grep -qx shardpilot.local/pause:1 || ctr -n k8s.io images import "$K/images/pause.tar" >/dev/null
}

start() {
  local B=$1 api=(--cacert "$P/ca.crt")
  launch containerd containerd --config "$K/etc/containerd.toml"
  waitfor containerd ctr version
  images
  launch etcd "$B/etcd" --name "$NODE" --data-dir "$K/etcd" \
    --listen-client-urls http://127.0.0.1:32379 --advertise-client-urls http://127.0.0.1:32379 \
    --listen-peer-urls http://127.0.0.1:32380 --initial-advertise-peer-urls http://127.0.0.1:32380 \
    --initial-cluster "$NODE=http://127.0.0.1:32380" --listen-metrics-urls http://127.0.0.1:32381 --log-level warn
  waitfor etcd curl -sf http://127.0.0.1:32379/health
  launch kube-apiserver "$B/kube-apiserver" --etcd-servers=http://127.0.0.1:32379 \
    --secure-port=6443 --advertise-address="$IP" \
    --tls-cert-file="$P/apiserver.crt" --tls-private-key-file="$P/apiserver.key" --client-ca-file="$P/ca.crt" \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$P/sa.pub" --service-account-signing-key-file="$P/sa.key" \
    --service-cluster-ip-range="$SERVICE_CIDR" --authorization-mode=Node,RBAC \
    --enable-admission-plugins=NodeRestriction \
    --kubelet-client-certificate="$P/apiserver-kubelet-client.crt" --kubelet-client-key="$P/apiserver-kubelet-client.key" \
    --kubelet-certificate-authority="$P/ca.crt" --kubelet-preferred-address-types=InternalIP \
    --allow-privileged=true --profiling=false --v=1
  waitfor kube-apiserver curl -sf "${api[@]}" https://127.0.0.1:6443/readyz
  launch kube-controller-manager "$B/kube-controller-manager" --kubeconfig="$K/controller-manager.kubeconfig" \
    --authentication-kubeconfig="$K/controller-manager.kubeconfig" --authorization-kubeconfig="$K/controller-manager.kubeconfig" \
    --bind-address=127.0.0.1 --secure-port=10257 \
    --service-account-private-key-file="$P/sa.key" --root-ca-file="$P/ca.crt" \
    --cluster-signing-cert-file="$P/ca.crt" --cluster-signing-key-file="$P/ca.key" \
    --use-service-account-credentials=true --service-cluster-ip-range="$SERVICE_CIDR" \
    --leader-elect=false --profiling=false --v=1
  launch kube-scheduler "$B/kube-scheduler" --kubeconfig="$K/scheduler.kubeconfig" \
    --authentication-kubeconfig="$K/scheduler.kubeconfig" --authorization-kubeconfig="$K/scheduler.kubeconfig" \
    --bind-address=127.0.0.1 --secure-port=10259 --leader-elect=false --profiling=false --v=1
  launch kubelet "$B/kubelet" --config="$K/etc/kubelet.yaml" --kubeconfig="$K/kubelet.kubeconfig" \
    --root-dir="$K/kubelet" --hostname-override="$NODE" --node-ip="$IP" --oom-score-adj=0 --v=1
  launch kube-proxy "$B/kube-proxy" --config="$K/etc/kube-proxy.yaml" --v=1
  launch coredns "$B/coredns" -conf "$K/etc/Corefile"
  waitfor kube-controller-manager curl -sfk https://127.0.0.1:10257/healthz
  waitfor kube-scheduler curl -sfk https://127.0.0.1:10259/healthz
  waitfor kubelet curl -sf http://127.0.0.1:10248/healthz
  waitfor kube-proxy curl -sf http://127.0.0.1:10256/healthz
}

# storage: a default StorageClass of local volumes and volumes for it (a
# StatefulSet's claim binds to one when its pod is scheduled; a volume
# released by a deleted claim is made available again, emptied).
storage() {
  local kc=("$B/kubectl" --kubeconfig "$K/admin.kubeconfig") i
  {
    cat <<EOF
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: local
  annotations: {storageclass.kubernetes.io/is-default-class: "true"}
provisioner: kubernetes.io/no-provisioner
volumeBindingMode: WaitForFirstConsumer
reclaimPolicy: Delete
EOF
    for i in $(seq 1 8); do
      mkdir -p "$K/volumes/pv$i"
      cat <<EOF
---
apiVersion: v1
kind: PersistentVolume
metadata:
  name: local-pv$i
spec:
  capacity: {storage: 5Gi}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: local
  local: {path: $K/volumes/pv$i}
  nodeAffinity:
    required:
      nodeSelectorTerms: [{matchExpressions: [{key: kubernetes.io/hostname, operator: In, values: [$NODE]}]}]
EOF
    done
  } | "${kc[@]}" apply -f - >/dev/null
  recycle "$B"
}

# recycle makes the volumes released by deleted claims available again,
# emptied, as a provisioner would: up runs it once, then every 5 s in the
# background (the component "volumes").
recycle() {
  local kc=("$1/kubectl" --kubeconfig "$K/admin.kubeconfig") pv
  for pv in $("${kc[@]}" get pv -o jsonpath='{range .items[?(@.status.phase=="Released")]}{.metadata.name}{"\n"}{end}'); do
    find "$K/volumes/pv${pv#local-pv}" -mindepth 1 -delete
    "${kc[@]}" patch pv "$pv" --type json -p '[{"op":"remove","path":"/spec/claimRef"}]' >/dev/null
  done
}

up() {
  [ "$(id -u)" = 0 ] || { echo "hack/cluster.sh up runs as root (it starts containerd, the kubelet and kube-proxy)" >&2; exit 1; }
  packages
  B="$("$root/hack/kube-binaries.sh" node)"
  IP="$(node_ip)"
  [ -n "$IP" ] || { echo "no IPv4 address with a route: the node needs one" >&2; exit 1; }
  mkdir -p "$K"
  if [ -f "$P/ip" ] && [ "$(cat "$P/ip")" != "$IP" ]; then
    echo "the node's address changed ($(cat "$P/ip") -> $IP): hack/cluster.sh wipe, then up" >&2
    exit 1
  fi
  pki
  configs
  [ -f "$K/ip_forward.before" ] || cat /proc/sys/net/ipv4/ip_forward >"$K/ip_forward.before"
  start "$B"
  local kc=("$B/kubectl" --kubeconfig "$K/admin.kubeconfig")
  waitfor "the node" "${kc[@]}" wait --for=condition=Ready "node/$NODE" --timeout=1s
  waitfor "the default service account" "${kc[@]}" get serviceaccount default
  storage
  launch volumes "$root/hack/cluster.sh" recycle-loop
  cp "$K/admin.kubeconfig" "$K/kubeconfig"
  say "cluster up: export KUBECONFIG=$K/kubeconfig (kubectl: $B/kubectl)"
  echo "$K/kubeconfig"
}

stop_pid() {
  local n=$1 p
  [ -f "$K/pids/$n" ] || return 0
  p=$(cat "$K/pids/$n")
  if kill -0 "$p" 2>/dev/null; then
    kill "$p"
    for _ in $(seq 40); do kill -0 "$p" 2>/dev/null || break; sleep 0.5; done
    kill -0 "$p" 2>/dev/null && kill -9 "$p"
    say "stopped $n ($p)"
  fi
  rm -f "$K/pids/$n"
}

down() {
  [ -d "$K" ] || return 0
  local B n t m ipt
  B="$("$root/hack/kube-binaries.sh")"
  for n in volumes coredns kube-proxy kubelet kube-scheduler kube-controller-manager kube-apiserver etcd; do stop_pid "$n"; done
  [ -x "$B/kube-proxy" ] && "$B/kube-proxy" --cleanup >/dev/null 2>&1 || true
  if running containerd; then
    for t in $(ctr -n k8s.io task ls -q 2>/dev/null); do ctr -n k8s.io task kill -s SIGKILL "$t" >/dev/null 2>&1 || true; done
    sleep 1
    for t in $(ctr -n k8s.io task ls -q 2>/dev/null); do ctr -n k8s.io task rm -f "$t" >/dev/null 2>&1 || true; done
    for t in $(ctr -n k8s.io containers ls -q 2>/dev/null); do ctr -n k8s.io containers rm "$t" >/dev/null 2>&1 || true; done
  fi
  stop_pid containerd
  for m in $(awk -v k="$K" 'index($2, k) == 1 {print $2}' /proc/mounts | sort -r); do umount -l "$m" 2>/dev/null || true; done
  for n in /var/run/netns/cni-*; do [ -e "$n" ] && ip netns delete "$(basename "$n")"; done
  ip link show "$BRIDGE" >/dev/null 2>&1 && ip link delete "$BRIDGE"
  rm -rf "$K/cni/ipam"
  # The bridge plugin's masquerading, per pod: its rules in POSTROUTING (by
  # number: their comments hold quotes) and its chains.
  local n
  while n=$(iptables -t nat -L POSTROUTING -n --line-numbers 2>/dev/null | awk '$2 ~ /^CNI-/ {print $1; exit}') && [ -n "$n" ]; do
    iptables -t nat -D POSTROUTING "$n"
  done
  for c in $(iptables -t nat -S 2>/dev/null | awk '$1 == "-N" && $2 ~ /^CNI-/ {print $2}'); do
    iptables -t nat -F "$c" && iptables -t nat -X "$c"
  done
  for ipt in iptables ip6tables; do
    while $ipt -D INPUT -j KUBE-FIREWALL 2>/dev/null; do :; done
    while $ipt -D OUTPUT -j KUBE-FIREWALL 2>/dev/null; do :; done
    $ipt -F KUBE-FIREWALL 2>/dev/null || true
    $ipt -X KUBE-FIREWALL 2>/dev/null || true
    for t in filter nat mangle; do
      $ipt -t "$t" -F KUBE-KUBELET-CANARY 2>/dev/null || true
      $ipt -t "$t" -X KUBE-KUBELET-CANARY 2>/dev/null || true
    done
    $ipt -t mangle -X KUBE-IPTABLES-HINT 2>/dev/null || true
  done
  rm -f /var/log/containers/*.log
  for h in /sys/fs/cgroup/*/; do [ -d "$h/kubepods" ] && find "$h/kubepods" -depth -type d -exec rmdir {} \; 2>/dev/null; done
  rm -rf /run/containerd
  if [ -f "$K/ip_forward.before" ]; then
    cat "$K/ip_forward.before" >/proc/sys/net/ipv4/ip_forward
    rm -f "$K/ip_forward.before"
  fi
  say "cluster down (its state stays in $K: hack/cluster.sh wipe forgets it)"
}

status() {
  local n rc=0
  for n in containerd etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy coredns volumes; do
    if running "$n"; then echo "$n running (pid $(cat "$K/pids/$n"))"; else echo "$n stopped"; rc=1; fi
  done
  return $rc
}

case "${1:-}" in
up) up ;;
down) down ;;
wipe)
  down
  rm -rf "$K"
  say "cluster state removed"
  ;;
status) status ;;
recycle-loop)
  B="$("$root/hack/kube-binaries.sh")"
  while sleep 5; do recycle "$B" || true; done
  ;;
kubeconfig)
  [ -f "$K/kubeconfig" ] || { echo "no cluster: hack/cluster.sh up" >&2; exit 1; }
  echo "$K/kubeconfig"
  ;;
import)
  shift
  running containerd || { echo "the cluster is not up: hack/cluster.sh up" >&2; exit 1; }
  for a in "$@"; do ctr -n k8s.io images import "$a" >/dev/null && say "imported $a"; done
  ;;
*)
  sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
  ;;
esac
