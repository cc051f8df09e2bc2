# Shared settings and helpers of the roam lab (sourced by e2e/lab and its parts).
# Everything the lab creates is named roam-* and lives under $LAB_DIR; every daemon's PID
# is recorded there and stopped by PID.

LABKIT=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
E2E=$(cd "$LABKIT/.." && pwd)
LAB_DIR=${ROAM_LAB_DIR:-/var/tmp/roam/lab}
CACHE=${ROAM_CACHE:-/var/cache/roam}
KUBE_BIN=$CACHE/kube/bin
# OVN and Open vSwitch: a Debian suite's (ROAM_LAB_OVN, default trixie: OVN 25.03, OVS 3.5),
# unpacked under $CACHE/ovn with the libraries they link (ovn-fetch.py) and first in PATH for
# every part of the lab, central and chassis alike; `ROAM_LAB_OVN=system` runs the host's
# packages instead (bookworm: OVN 23.03, OVS 3.1). A running lab remembers which ($LAB_DIR/ovn).
ROAM_LAB_OVN=${ROAM_LAB_OVN:-$(cat "$LAB_DIR/ovn" 2>/dev/null || echo trixie)}
if [ "$ROAM_LAB_OVN" = system ]; then
  OVN_BIN= OVN_SHARE=/usr/share
else
  OVN_ROOT=$CACHE/ovn/$ROAM_LAB_OVN
  OVN_BIN=$OVN_ROOT/bin OVN_SHARE=$OVN_ROOT/usr/share
  PATH=$OVN_BIN:$PATH
fi
GUEST_DIR=$CACHE/guest

# Two nodes by default; ROAM_LAB_NODES=3 adds node-c, for tests that need a choice of target
# (placement among several nodes). Up to 4 (node-a … node-d).
# A running lab remembers its count ($LAB_DIR/node-count), so that `e2e/lab down`, `status`
# and `env` without the variable see every node.
ROAM_LAB_NODES=${ROAM_LAB_NODES:-$(cat "$LAB_DIR/node-count" 2>/dev/null || echo 2)}
nodes_of_count() {
  case $1 in
    2) echo "node-a node-b" ;;
    3) echo "node-a node-b node-c" ;;
    4) echo "node-a node-b node-c node-d" ;;
    *) return 1 ;;
  esac
}
NODES=$(nodes_of_count "$ROAM_LAB_NODES") || { echo "ROAM_LAB_NODES=${ROAM_LAB_NODES}: give 2, 3 or 4" >&2; exit 1; }
# Lab underlay: a bridge in the root namespace that reaches each node's namespace through a
# veth. It carries the API traffic and the launchers' migration streams. Nodes have no default
# route, so nothing can leave the machine.
BRIDGE=roam-br0
BRIDGE_IP=10.213.0.1
GNV_BRIDGE=roam-gnvbr
# Geneve between the chassis runs on a bridge of its own (GNV_BRIDGE), one veth to each
# chassis' br-phy (the userspace datapath needs the tunnel endpoint on an OVS bridge).
# Its MTU is a data centre's, 1500: an overlay's full-size packet (1400, roam's default) plus
# geneve must fit, as between real hosts.
UNDERLAY_MTU=${ROAM_LAB_UNDERLAY_MTU:-1500}
APISERVER_PORT=${ROAM_APISERVER_PORT:-16443}
ETCD_CLIENT_PORT=${ROAM_ETCD_CLIENT_PORT:-23790}
ETCD_PEER_PORT=${ROAM_ETCD_PEER_PORT:-23800}
NB_TCP_PORT=${ROAM_NB_TCP_PORT:-16641}
SB_TCP_PORT=${ROAM_SB_TCP_PORT:-16642}

# Paths kubelet, containerd and CNI hard-code: each node gets its own copy, bind-mounted in the
# node's private mount namespace (the host's are never written). No node has a libvirt of its
# own: libvirt and QEMU run in roam's launcher pods.
NODE_BIND_PATHS="/run /var/lib/kubelet /var/log/pods /var/log/containers /var/lib/containerd /var/lib/cni /etc/cni/net.d /opt/cni \
/etc/kubernetes /var/log/roam /var/lib/roam"
bind_src() { echo "$(node_dir "$1")/fs$(echo "$2" | tr / _)"; }
# What a node must not see, as one host cannot see another's disk: the other nodes' trees,
# OVN central's and the control plane's (its PKI holds the cluster CA's key). Each node's
# mount namespace covers them with an empty read-only tmpfs (node-inner.sh); a node reaches
# the API server, the OVN databases and the other node's launcher pods over the network only.
node_hidden_paths() {
  local n=$1 o out="$LAB_DIR/central $LAB_DIR/kube"
  for o in $NODES; do [ "$o" = "$n" ] || out="$out $(node_dir "$o")"; done
  echo "$out"
}

node_index() { case $1 in node-a) echo 11 ;; node-b) echo 12 ;; node-c) echo 13 ;; node-d) echo 14 ;; *) echo "unknown node $1" >&2; return 1 ;; esac; }
node_ns() { echo "roam-$1"; }
node_dir() { echo "$LAB_DIR/$1"; }
node_ip() { echo "10.213.0.$(node_index "$1")"; }
node_tunnel_ip() { echo "10.214.0.$(node_index "$1")"; }
node_ovs_db() { echo "unix:$(node_dir "$1")/fs_run/openvswitch/db.sock"; }

CENTRAL=$LAB_DIR/central
OVN_NB_DB=unix:$CENTRAL/ovnnb_db.sock
OVN_SB_DB=unix:$CENTRAL/ovnsb_db.sock
KUBECONFIG_PATH=$LAB_DIR/kube/kubeconfig
export OVN_NB_DB OVN_SB_DB

# kubectl from the same source tree as the API server (a fresh Debian 12 has none)
kubectl() { "$KUBE_BIN/kubectl" "$@"; }

log() { printf '[lab %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN{printf "%.1f", b-a}'; }

# pid_alive FILE: the PID recorded in FILE is a running process.
pid_alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

# stop_pid FILE [NAME]: TERM the recorded PID, wait up to 10 s, then KILL; remove FILE.
stop_pid() {
  local f=$1 pid
  [ -f "$f" ] || return 0
  pid=$(cat "$f")
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$f"
}

# wait_for SECONDS DESCRIPTION LOGFILE CMD...: poll CMD every 0.1 s; on timeout print the log tail.
wait_for() {
  local secs=$1 what=$2 logf=$3; shift 3
  local deadline=$(( $(date +%s) + secs ))
  until "$@" >/dev/null 2>&1; do
    if [ "$(date +%s)" -ge "$deadline" ]; then
      log "timed out after ${secs}s waiting for $what"
      [ -n "$logf" ] && [ -f "$logf" ] && { log "last lines of $logf:"; tail -n 40 "$logf" >&2; }
      return 1
    fi
    sleep 0.1
  done
}

# The holder process of a node owns its private mount namespace (and sits in its netns).
node_holder_pid() { cat "$(node_dir "$1")/holder.pid" 2>/dev/null; }

# node_spawn NODE LOGFILE PIDFILE CMD...: start a long-running CMD inside NODE's namespaces in
# the background and record its PID (nsenter execs CMD, so $! is the daemon itself).
node_spawn() {
  local n=$1 logf=$2 pidf=$3; shift 3
  local pid; pid=$(node_holder_pid "$n") || die "node $n is not up"
  nsenter -t "$pid" -m -n -- "$@" >"$logf" 2>&1 9>&- &
  echo $! > "$pidf"
}

# node_exec NODE CMD...: run CMD inside NODE's network and mount namespaces.
# (fd 9 is the lab lock: daemons must not inherit it, or they would hold it forever)
node_exec() {
  local n=$1; shift
  local pid; pid=$(node_holder_pid "$n") || die "node $n is not up"
  nsenter -t "$pid" -m -n -- "$@" 9>&-
}
