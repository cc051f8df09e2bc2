# Lab real nodes: containerd + kubelet (v1.20.2) inside each node's namespaces, registered to
# the lab API server, plus kube-scheduler in the root namespace. Images come from local OCI
# archives (build-images.sh); no registry is ever contacted.
#
# The nodes' CNI is roam-cni, installed by roam's DaemonSet (deploy/cni-daemonset.yaml, applied
# by roam_up): until it has written /etc/cni/net.d/00-roam.conflist a node is NotReady
# (NetworkReady=false), as on any cluster before its CNI is installed; host-network pods
# (roam-cni's own, roam-controller, the launchers) run meanwhile. /opt/cni/bin holds the
# reference plugins only for containerd's loopback.

SYSCTLS="vm.overcommit_memory kernel.panic kernel.panic_on_oops"

kubelet_pki() {
  local P=$KDIR/pki n
  for n in $NODES; do
    [ -f "$KDIR/$n.kubeconfig" ] && continue
    (
      cd "$P"
      openssl req -newkey rsa:2048 -nodes -keyout "$n.key" -out "$n.csr" -subj "/O=system:nodes/CN=system:node:$n" 2>/dev/null
      openssl x509 -req -in "$n.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -out "$n.crt" -days 3650 -extfile client.ext 2>/dev/null
      printf 'subjectAltName=IP:%s,DNS:%s\nextendedKeyUsage=serverAuth\nkeyUsage=digitalSignature,keyEncipherment\n' \
        "$(node_ip "$n")" "$n" > "$n-serving.ext"
      openssl req -newkey rsa:2048 -nodes -keyout "$n-serving.key" -out "$n-serving.csr" -subj "/CN=$n" 2>/dev/null
      openssl x509 -req -in "$n-serving.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -out "$n-serving.crt" -days 3650 \
        -extfile "$n-serving.ext" 2>/dev/null
    )
    sed -e "s#client-certificate-data: .*#client-certificate-data: $(base64 -w0 "$P/$n.crt")#" \
        -e "s#client-key-data: .*#client-key-data: $(base64 -w0 "$P/$n.key")#" \
        -e "s#name: admin#name: $n#; s#user: admin#user: $n#" "$KUBECONFIG_PATH" > "$KDIR/$n.kubeconfig"
    chmod 600 "$KDIR/$n.kubeconfig"
  done
}

kubelet_configs() {
  local n=$1 d k
  d=$(node_dir "$n")
  # the node's own credentials at kubeadm's paths, on its own disk: it cannot see the
  # control plane's directory (node_hidden_paths)
  k=$(bind_src "$n" /etc/kubernetes)
  mkdir -p "$k/pki"
  install -m 600 "$KDIR/$n.kubeconfig" "$k/kubelet.conf"
  install -m 644 "$KDIR/pki/ca.crt" "$k/pki/ca.crt"
  install -m 644 "$KDIR/pki/$n-serving.crt" "$k/pki/kubelet.crt"
  install -m 600 "$KDIR/pki/$n-serving.key" "$k/pki/kubelet.key"
  mkdir -p "$(bind_src "$n" /opt/cni)/bin" "$(bind_src "$n" /etc/cni/net.d)"
  for f in /usr/lib/cni/*; do ln -sf "$f" "$(bind_src "$n" /opt/cni)/bin/"; done
  cat > "$d/containerd.toml" <<EOF
# containerd for lab $n: inside the node's netns and private mount ns (stock paths are per-node binds)
version = 2
root = "/var/lib/containerd"
state = "/run/containerd"
[grpc]
  address = "/run/containerd/containerd.sock"
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "/var/lib/containerd/opt"
[plugins."io.containerd.gc.v1.scheduler"]
  pause_threshold = 0.02
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.k8s.io/pause:3.2"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  netns_mounts_under_state_dir = true
  tolerate_missing_hugetlb_controller = true
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "/usr/bin/runc"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/opt/cni/bin"
    conf_dir = "/etc/cni/net.d"
    max_conf_num = 1
EOF
  # no CNI configuration until roam-cni's installer writes one (a stale one from an
  # earlier lab goes)
  rm -f "$(bind_src "$n" /etc/cni/net.d)"/*.conflist "$(bind_src "$n" /etc/cni/net.d)"/*.conf \
    "$(bind_src "$n" /etc/cni/net.d)/roam-cni.kubeconfig" "$(bind_src "$n" /opt/cni)/bin/roam-cni"
  case ${ROAM_LAB_SECRET_STRATEGY:-Watch} in
    Watch|Get|Cache) ;;
    *) die "ROAM_LAB_SECRET_STRATEGY=$ROAM_LAB_SECRET_STRATEGY: expected Watch, Get or Cache" ;;
  esac
  cat > "$d/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $(node_ip "$n")
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
tlsCertFile: /etc/kubernetes/pki/kubelet.crt
tlsPrivateKeyFile: /etc/kubernetes/pki/kubelet.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: /etc/kubernetes/pki/ca.crt}
authorization: {mode: AlwaysAllow}
cgroupDriver: cgroupfs
cgroupRoot: /$n
failSwapOn: false
makeIPTablesUtilChains: false
clusterDomain: cluster.local
serializeImagePulls: false
# how the kubelet fetches a pod's Secrets and ConfigMaps: Watch (its default: a reflector per
# object; a first list the node authorizer refuses delays the mount by a cache timeout) or Get
# (ROAM_LAB_SECRET_STRATEGY=Get, for measuring what that race costs with a plain GET)
configMapAndSecretChangeDetectionStrategy: ${ROAM_LAB_SECRET_STRATEGY:-Watch}
nodeStatusUpdateFrequency: 2s
nodeStatusReportFrequency: 1m
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
# The lab shares its disk with builds: kubelet's default hard eviction (imagefs < 15 % free)
# once evicted every pod and deleted every unused image on a machine with 10 % free. Keep
# the thresholds (all four: a partial evictionHard zeroes the rest) but at the very bottom.
evictionHard:
  memory.available: "50Mi"
  nodefs.available: "1%"
  nodefs.inodesFree: "1%"
  imagefs.available: "1%"
EOF
}

kubelet_cgroups() {
  local n=$1 c
  for c in /sys/fs/cgroup/*/; do
    [ -f "${c}cgroup.procs" ] || continue
    mkdir -p "$c$n"
    if [ "$c" = /sys/fs/cgroup/cpuset/ ]; then
      cat "${c}cpuset.cpus" > "$c$n/cpuset.cpus"
      cat "${c}cpuset.mems" > "$c$n/cpuset.mems"
    fi
  done
}

# PIDs of every process in NODE's cgroup tree: the containers live in their own mount
# namespaces, so the node's mount-namespace sweep does not see them, but their cgroup does.
node_cgroup_pids() {
  local n=$1
  [ -d "/sys/fs/cgroup/pids/$n" ] || return 0
  find "/sys/fs/cgroup/pids/$n" -name cgroup.procs -exec cat {} + 2>/dev/null | sort -u
}

kubelet_cgroups_remove() {
  local n=$1 c p
  for _ in $(seq 1 50); do
    p=$(node_cgroup_pids "$n")
    [ -z "$p" ] && break
    # shellcheck disable=SC2086
    kill -9 $p 2>/dev/null || true
    sleep 0.1
  done
  for c in /sys/fs/cgroup/*/; do
    [ -d "$c$n" ] && find "$c$n" -depth -type d -exec rmdir {} \; 2>/dev/null
  done
  return 0
}

node_registered() { # NODE START_EPOCH: a heartbeat from this kubelet (Ready or not: no CNI yet)
  local r
  r=$(kubectl --kubeconfig "$KUBECONFIG_PATH" get node "$1" -o \
    jsonpath='{.status.conditions[?(@.type=="Ready")].lastHeartbeatTime}' 2>/dev/null) || return 1
  [ -n "$r" ] && [ "$(date -d "$r" +%s)" -ge "$2" ]
}

node_ready() { # NODE START_EPOCH: Ready=True with a heartbeat from this kubelet
  local r
  r=$(kubectl --kubeconfig "$KUBECONFIG_PATH" get node "$1" -o \
    jsonpath='{.status.conditions[?(@.type=="Ready")].status} {.status.conditions[?(@.type=="Ready")].lastHeartbeatTime}' 2>/dev/null) || return 1
  [ "${r%% *}" = True ] && [ "$(date -d "${r#* }" +%s)" -ge "$2" ]
}

sysctls_now() { local s; for s in $SYSCTLS; do echo "$s=$(sysctl -n "$s")"; done; }
sysctls_restore() {
  [ -f "$LAB_DIR/sysctls-before" ] || return 0
  [ "$(sysctls_now)" = "$(cat "$LAB_DIR/sysctls-before")" ] || sysctl -q -w $(cat "$LAB_DIR/sysctls-before")
}

# The nodes' own setting: QEMU runs unprivileged (uid 107) and a post-copy migration's target
# QEMU needs userfaultfd, which the kernel gives unprivileged processes only so (KubeVirt's
# nodes need the same). The lab's nodes share this machine's kernel: saved, and put back on
# `down`, with the kubelet's.
node_sysctls_up() {
  [ -f "$LAB_DIR/node-sysctls-before" ] || echo "vm.unprivileged_userfaultfd=$(sysctl -n vm.unprivileged_userfaultfd)" > "$LAB_DIR/node-sysctls-before"
  sysctl -q -w vm.unprivileged_userfaultfd=1
}
node_sysctls_down() {
  [ -f "$LAB_DIR/node-sysctls-before" ] || return 0
  sysctl -q -w $(cat "$LAB_DIR/node-sysctls-before") && rm -f "$LAB_DIR/node-sysctls-before"
}

kubelet_up() {
  local t0 n d start
  t0=$(now)
  kubelet_pki
  [ -f "$LAB_DIR/sysctls-before" ] || sysctls_now > "$LAB_DIR/sysctls-before"
  node_sysctls_up
  "$KUBE_BIN/kube-scheduler" --kubeconfig="$KUBECONFIG_PATH" --authentication-kubeconfig="$KUBECONFIG_PATH" \
    --authorization-kubeconfig="$KUBECONFIG_PATH" --leader-elect=false --bind-address=127.0.0.1 \
    --secure-port=0 --port=0 --logtostderr=true --v=1 >"$KDIR/logs/kube-scheduler.log" 2>&1 9>&- &
  echo $! > "$KDIR/kube-scheduler.pid"
  start=$(date +%s)
  for n in $NODES; do
    d=$(node_dir "$n")
    kubelet_configs "$n"
    kubelet_cgroups "$n"
    node_spawn "$n" "$d/logs/containerd.log" "$d/containerd.pid" containerd --config "$d/containerd.toml"
  done
  for n in $NODES; do
    d=$(node_dir "$n")
    wait_for 30 "containerd on $n" "$d/logs/containerd.log" node_exec "$n" ctr version || return 1
    for img in "$CACHE"/images/*.tar; do
      node_exec "$n" ctr -n k8s.io images import "$img" >/dev/null || return 1
    done
    cp "$CACHE/images/launcher.stamp" "$d/launcher-image.stamp"
    # kubelet 1.20 probes the cloud metadata address at start-up unless told not to; the node
    # has no route out anyway.
    node_spawn "$n" "$d/logs/kubelet.log" "$d/kubelet.pid" \
      env AWS_EC2_METADATA_DISABLED=true "$KUBE_BIN/kubelet" --config="$d/kubelet.yaml" \
      --kubeconfig=/etc/kubernetes/kubelet.conf --container-runtime=remote \
      --container-runtime-endpoint=unix:///run/containerd/containerd.sock --runtime-request-timeout=5m \
      --hostname-override="$n" --node-ip="$(node_ip "$n")" --node-labels=roam.dev/lab=true --volume-plugin-dir=/var/lib/kubelet/volume-plugins \
      --v=2
  done
  for n in $NODES; do
    wait_for 120 "node $n registered" "$(node_dir "$n")/logs/kubelet.log" node_registered "$n" "$start" || return 1
  done
  log "nodes registered in $(elapsed "$t0") s (Ready once roam-cni is installed)"
  # kubelet rewrites three host-wide sysctls a few seconds after it starts: put them back
  # (again on `down`).
  ( for _ in $(seq 1 200); do sysctls_restore; sleep 0.1; done ) >/dev/null 2>&1 9>&- &
}

kubelet_down() {
  local n d
  if pid_alive "$KDIR/kube-apiserver.pid"; then
    for n in $NODES; do
      pid_alive "$(node_dir "$n")/kubelet.pid" || continue
      timeout 30 kubectl --kubeconfig "$KUBECONFIG_PATH" delete pods -A --field-selector "spec.nodeName=$n" \
        --grace-period=0 --force --wait=false >/dev/null 2>&1 || true
    done
    # let the kubelets stop the containers and release their network namespaces (what
    # is still running after 10 s is killed through its cgroup below)
    for n in $NODES; do
      pid_alive "$(node_dir "$n")/kubelet.pid" || continue
      for _ in $(seq 1 50); do
        [ -z "$(find "/sys/fs/cgroup/pids/$n/kubepods" -name cgroup.procs -exec cat {} + 2>/dev/null)" ] && break
        sleep 0.2
      done
    done
  fi
  for n in $NODES; do
    d=$(node_dir "$n")
    stop_pid "$d/kubelet.pid"
    stop_pid "$d/containerd.pid"
  done
  stop_pid "$KDIR/kube-scheduler.pid"
  # containerd shims and containers are swept with the node's mount namespace (nodes_down);
  # cgroups can only go once their processes are gone.
  for n in $NODES; do node_sweep "$n"; done
  sleep 0.2
  for n in $NODES; do kubelet_cgroups_remove "$n"; done
  sysctls_restore
  rm -f "$LAB_DIR/sysctls-before"
  node_sysctls_down
}

kubelet_status() {
  local ok=0 n
  for n in $NODES; do
    if pid_alive "$(node_dir "$n")/kubelet.pid" && pid_alive "$(node_dir "$n")/containerd.pid" && node_ready "$n" 0; then
      echo "kubelet $n: Ready"
    else
      echo "kubelet $n: DOWN"; ok=1
    fi
  done
  if pid_alive "$KDIR/kube-scheduler.pid"; then echo "kube-scheduler: up"; else echo "kube-scheduler: DOWN"; ok=1; fi
  return $ok
}
