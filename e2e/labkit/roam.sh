# roam installed into the lab the way a user installs it on a cluster: its images imported
# into each node's containerd (no registry), then `kubectl apply -k e2e/deploy/lab` — the
# lab's overlay of deploy/ — and a wait until the controller Deployment is available and one
# of its pods holds the Lease. Nothing of roam runs on the host.
# The images (roam-controller's, and roam-cni's: the nodes' CNI, installed by the roam-cni
# DaemonSet) are built by build-roam-image.sh (release build, `lab up`'s build step) into
# $CACHE/roam-images/; a node re-imports one when its stamp changed, and an image that changed
# under a running installation rolls its Deployment or DaemonSet.

ROAM_OVERLAY=$E2E/deploy/lab
ROAM_IMAGES=$CACHE/roam-images
ROAM_CONTROLLER_IMAGE=lab.local/roam-controller:dev
ROAM_CNI_IMAGE=lab.local/roam-cni:dev

# The release build goes to a target directory in the cache (not the checkout's): a fresh
# clone rebuilds roam's own crates only, not its dependencies.
ROAM_RELEASE_TARGET=${CARGO_TARGET_DIR:-$CACHE/target}

# shellcheck source=release.sh
. "$LABKIT/release.sh"

roam_build() {
  local stamp
  release_build "$E2E/.." "$ROAM_RELEASE_TARGET"
  stamp=$(cat "$ROAM_RELEASE_TARGET/release/roam-controller" "$ROAM_RELEASE_TARGET/release/roam-node" | sha256sum | cut -c1-16)
  if [ "$(cat "$ROAM_IMAGES/controller.stamp" 2>/dev/null)" != "$stamp" ] || [ ! -f "$ROAM_IMAGES/controller.tar" ]; then
    CARGO_TARGET_DIR=$ROAM_RELEASE_TARGET bash "$LABKIT/build-roam-image.sh" controller "$ROAM_CONTROLLER_IMAGE" "$ROAM_IMAGES/controller.tar" >/dev/null
    echo "$stamp" > "$ROAM_IMAGES/controller.stamp"
  fi
  stamp=$( (sha256sum "$ROAM_RELEASE_TARGET/release/roam-cni" "$E2E/../deploy/cni/install.sh" "$LABKIT/build-roam-image.sh") | sha256sum | cut -c1-16)
  if [ "$(cat "$ROAM_IMAGES/cni.stamp" 2>/dev/null)" != "$stamp" ] || [ ! -f "$ROAM_IMAGES/cni.tar" ]; then
    CARGO_TARGET_DIR=$ROAM_RELEASE_TARGET bash "$LABKIT/build-roam-image.sh" cni "$ROAM_CNI_IMAGE" "$ROAM_IMAGES/cni.tar" >/dev/null
    echo "$stamp" > "$ROAM_IMAGES/cni.stamp"
  fi
}

# Import IMAGE.tar into the nodes whose copy is older than STAMPFILE says; prints "changed"
# if any node's was.
roam_import_one() { # TAR STAMPFILE NODE-STAMP-NAME
  local n d stamp changed=
  stamp=$(cat "$2")
  for n in $NODES; do
    d=$(node_dir "$n")
    [ "$(cat "$d/$3" 2>/dev/null)" = "$stamp" ] && continue
    node_exec "$n" ctr -n k8s.io images import "$1" >/dev/null || return 1
    echo "$stamp" > "$d/$3"
    changed=1
  done
  [ -z "$changed" ] || echo changed
}

# Import roam's images into the nodes whose copy is older: the launcher's (libvirt + QEMU +
# roam-shim), the controller's, roam-cni's. Prints "controller" and/or "cni" for those that
# changed.
roam_import() {
  local c
  roam_import_one "$CACHE/images/launcher.tar" "$CACHE/images/launcher.stamp" launcher-image.stamp >/dev/null || return 1
  c=$(roam_import_one "$ROAM_IMAGES/controller.tar" "$ROAM_IMAGES/controller.stamp" roam-images.stamp) || return 1
  [ -z "$c" ] || echo controller
  c=$(roam_import_one "$ROAM_IMAGES/cni.tar" "$ROAM_IMAGES/cni.stamp" cni-image.stamp) || return 1
  [ -z "$c" ] || echo cni
}

# The Lease's holder, if it is one of the Deployment's running pods.
roam_leader() {
  local holder
  holder=$(kubectl --kubeconfig "$KUBECONFIG_PATH" -n roam-system get lease roam-controller \
    -o jsonpath='{.spec.holderIdentity}' 2>/dev/null) || return 1
  [ -n "$holder" ] && kubectl --kubeconfig "$KUBECONFIG_PATH" -n roam-system get pod "$holder" \
    -o jsonpath='{.status.phase}' 2>/dev/null | grep -qx Running && echo "$holder"
}

# A DaemonSet's "desired/ready/updated" pod counts: ds_counts NAMESPACE NAME.
ds_counts() {
  kubectl --kubeconfig "$KUBECONFIG_PATH" -n "$1" get ds "$2" \
    -o jsonpath='{.status.desiredNumberScheduled}/{.status.numberReady}/{.status.updatedNumberScheduled}' 2>/dev/null
}

# DaemonSet NAMESPACE NAME has a pod on every lab node, all ready and updated.
ds_ready() {
  local counts
  counts=$(ds_counts "$1" "$2") || return 1
  [ "${counts%%/*}" = "$(echo $NODES | wc -w)" ] && [ "$counts" = "${counts%%/*}/${counts%%/*}/${counts%%/*}" ]
}

# The controller Deployment's "replicas/ready" counts.
deploy_counts() {
  kubectl --kubeconfig "$KUBECONFIG_PATH" -n roam-system get deploy roam-controller \
    -o jsonpath='{.spec.replicas}/{.status.readyReplicas}' 2>/dev/null
}

# roam-cni's DaemonSet ready everywhere (the plugin's STATUS passes).
roam_cni_ready() { ds_ready kube-system roam-cni; }

# roam-node's DaemonSet ready everywhere (the node's certificate is on disk and valid).
roam_node_ready() { ds_ready roam-system roam-node; }

roam_ready() {
  local counts
  counts=$(deploy_counts) || return 1
  [ "${counts%/*}" -gt 0 ] 2>/dev/null && [ "${counts%/*}" = "${counts#*/}" ] && roam_leader >/dev/null \
    && roam_cni_ready && roam_node_ready
}

# Every node Ready (its CNI installed), and schedulable: the lab runs no node lifecycle
# controller, so the kubelet's registration taint is lifted here.
roam_nodes_ready() {
  local n
  for n in $NODES; do
    wait_for 120 "node $n Ready (roam-cni installed)" "$(node_dir "$n")/logs/kubelet.log" node_ready "$n" 0 || return 1
    kubectl --kubeconfig "$KUBECONFIG_PATH" taint node "$n" node.kubernetes.io/not-ready:NoSchedule- >/dev/null 2>&1 || true
  done
}

# The Secret roam-system/roam-ovn-tls: the lab CA and roam-controller's client certificate
# for the NB's ssl: remote (ovn.sh), as an admin hands a cluster's OVN certificates to roam.
roam_ovn_secret() {
  local k="kubectl --kubeconfig $KUBECONFIG_PATH"
  $k create namespace roam-system --dry-run=client -o yaml | $k apply -f - >/dev/null || return 1
  $k -n roam-system create secret generic roam-ovn-tls --from-file=ca.crt="$OVN_PKI/ca.pem" \
    --from-file=tls.crt="$OVN_PKI/roam-controller.pem" --from-file=tls.key="$OVN_PKI/roam-controller.key" \
    --dry-run=client -o yaml | $k apply -f - >/dev/null
}

roam_up() {
  local t0 changed had_deploy= had_ds=
  t0=$(now)
  [ -f "$ROAM_IMAGES/controller.tar" ] && [ -f "$ROAM_IMAGES/cni.tar" ] \
    || die "no roam images in $ROAM_IMAGES: run e2e/lab up (it builds them)"
  changed=$(roam_import) || return 1
  kubectl --kubeconfig "$KUBECONFIG_PATH" -n roam-system get deploy roam-controller >/dev/null 2>&1 && had_deploy=1
  kubectl --kubeconfig "$KUBECONFIG_PATH" -n kube-system get ds roam-cni >/dev/null 2>&1 && had_ds=1
  roam_ovn_secret || return 1
  # the overlay names the default image store; a lab with its own ROAM_CACHE has it elsewhere
  { kubectl --kubeconfig "$KUBECONFIG_PATH" kustomize "$ROAM_OVERLAY" \
      | sed "s#ROAM_IMAGE_ROOT: /var/cache/roam/guest\$#ROAM_IMAGE_ROOT: $GUEST_DIR#" \
      | kubectl --kubeconfig "$KUBECONFIG_PATH" apply -f -; } >"$LAB_DIR/roam-apply.log" 2>&1 \
    || { cat "$LAB_DIR/roam-apply.log" >&2; return 1; }
  # an image of the same name that changed under a running installation: roll it
  if [ -n "$had_deploy" ] && echo "$changed" | grep -qx controller; then
    kubectl --kubeconfig "$KUBECONFIG_PATH" -n roam-system rollout restart deploy/roam-controller >/dev/null
    kubectl --kubeconfig "$KUBECONFIG_PATH" -n roam-system rollout restart ds/roam-node >/dev/null 2>&1 || true
  fi
  if [ -n "$had_ds" ] && echo "$changed" | grep -qx cni; then
    kubectl --kubeconfig "$KUBECONFIG_PATH" -n kube-system rollout restart ds/roam-cni >/dev/null
  fi
  kubectl --kubeconfig "$KUBECONFIG_PATH" wait --for=condition=Established --timeout=60s \
    crd/networks.roam.dev crd/addresses.roam.dev crd/virtualmachines.roam.dev crd/virtualmachinemigrations.roam.dev >/dev/null || return 1
  # roam-cni first: a node is Ready once its installer has written the CNI configuration
  if ! timeout 180 kubectl --kubeconfig "$KUBECONFIG_PATH" -n kube-system rollout status ds/roam-cni >/dev/null \
    || ! roam_nodes_ready \
    || ! timeout 180 kubectl --kubeconfig "$KUBECONFIG_PATH" -n roam-system rollout status deploy/roam-controller >/dev/null \
    || ! timeout 180 kubectl --kubeconfig "$KUBECONFIG_PATH" -n roam-system rollout status ds/roam-node >/dev/null \
    || ! wait_for 60 "roam-controller holds its Lease, roam-cni and roam-node ready on every node" /dev/null roam_ready; then
    roam_explain >&2
    return 1
  fi
  log "roam installed (e2e/deploy/lab): roam-controller leader $(roam_leader), roam-cni and roam-node on $(echo $NODES | wc -w) nodes, ready in $(elapsed "$t0") s"
}

# What the installation's pods say when it is not ready.
roam_explain() {
  kubectl --kubeconfig "$KUBECONFIG_PATH" -n roam-system get deploy,ds,pods -o wide 2>&1
  kubectl --kubeconfig "$KUBECONFIG_PATH" -n roam-system describe pods 2>&1 | tail -30
  kubectl --kubeconfig "$KUBECONFIG_PATH" -n kube-system get ds,pods -l app.kubernetes.io/name=roam-cni -o wide 2>&1
  local p
  for p in $(kubectl --kubeconfig "$KUBECONFIG_PATH" -n roam-system get pods -o name 2>/dev/null); do
    echo "== $p"
    kubectl --kubeconfig "$KUBECONFIG_PATH" -n roam-system logs "$p" --tail=20 2>&1
  done
  for p in $(kubectl --kubeconfig "$KUBECONFIG_PATH" -n kube-system get pods -l app.kubernetes.io/name=roam-cni -o name 2>/dev/null); do
    echo "== kube-system $p"
    kubectl --kubeconfig "$KUBECONFIG_PATH" -n kube-system logs "$p" --tail=20 2>&1
  done
}

roam_status() {
  if roam_ready 2>/dev/null; then
    echo "roam: installed, roam-controller leader $(roam_leader), roam-cni and roam-node ready on every node"
  else
    echo "roam: NOT READY (e2e/lab up installs it): controller replicas/ready $(deploy_counts), leader $(roam_leader || echo none), roam-cni desired/ready/updated $(ds_counts kube-system roam-cni), roam-node $(ds_counts roam-system roam-node)"
    return 1
  fi
}
