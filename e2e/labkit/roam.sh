# roam installed into the lab the way a user installs it on a cluster: its images imported
# into each node's containerd (no registry), then `kubectl apply -k e2e/deploy/lab` — the
# lab's overlay of deploy/ — and a wait until the controller Deployment is available and one
# of its pods holds the Lease. Nothing of roam runs on the host.
# The image is built by build-controller-image.sh (release build, `lab up`'s build step) into
# $CACHE/roam-images/; a node re-imports it when its stamp changed, and an image that changed
# under a running installation rolls the Deployment.

ROAM_OVERLAY=$E2E/deploy/lab
ROAM_IMAGES=$CACHE/roam-images
ROAM_CONTROLLER_IMAGE=lab.local/roam-controller:dev

# The release build goes to a target directory in the cache (not the checkout's): a fresh
# clone rebuilds roam's own crates only, not its dependencies.
ROAM_RELEASE_TARGET=${CARGO_TARGET_DIR:-$CACHE/target}

roam_build() {
  local stamp src
  # The target directory is shared by every checkout of this machine, and cargo judges a
  # workspace crate fresh by mtimes: another checkout's newer build would pass for this one's.
  # When the sources differ from the last build's, they are touched so that cargo rebuilds
  # roam's crates (the dependencies stay cached).
  src=$(cd "$E2E/.." && find crates Cargo.toml Cargo.lock -type f \( -name '*.rs' -o -name Cargo.toml -o -name Cargo.lock \) -print0 \
    | sort -z | xargs -0 sha256sum | sha256sum | cut -c1-16)
  if [ "$(cat "$ROAM_RELEASE_TARGET/roam-sources.stamp" 2>/dev/null)" != "$src" ]; then
    (cd "$E2E/.." && find crates -type f -name '*.rs' -exec touch {} +)
  fi
  (cd "$E2E/.." && export PATH="$HOME/.cargo/bin:$PATH" CARGO_TARGET_DIR="$ROAM_RELEASE_TARGET" \
    && cargo build --locked -q --release -p roam-migrator --bin roam-controller)
  mkdir -p "$ROAM_RELEASE_TARGET" && echo "$src" > "$ROAM_RELEASE_TARGET/roam-sources.stamp"
  stamp=$(sha256sum "$ROAM_RELEASE_TARGET/release/roam-controller" | cut -c1-16)
  if [ "$(cat "$ROAM_IMAGES/controller.stamp" 2>/dev/null)" != "$stamp" ] || [ ! -f "$ROAM_IMAGES/controller.tar" ]; then
    CARGO_TARGET_DIR=$ROAM_RELEASE_TARGET bash "$LABKIT/build-controller-image.sh" "$ROAM_CONTROLLER_IMAGE" "$ROAM_IMAGES/controller.tar" >/dev/null
    echo "$stamp" > "$ROAM_IMAGES/controller.stamp"
  fi
}

# Import roam's images (the controller's, and the launcher's: libvirt + QEMU + roam-shim) into
# the nodes whose copy is older; prints "changed" if the controller's was.
roam_import() {
  local n d stamp lstamp changed=
  stamp=$(cat "$ROAM_IMAGES/controller.stamp")
  lstamp=$(cat "$CACHE/images/launcher.stamp")
  for n in $NODES; do
    d=$(node_dir "$n")
    if [ "$(cat "$d/launcher-image.stamp" 2>/dev/null)" != "$lstamp" ]; then
      node_exec "$n" ctr -n k8s.io images import "$CACHE/images/launcher.tar" >/dev/null || return 1
      echo "$lstamp" > "$d/launcher-image.stamp"
    fi
    [ "$(cat "$d/roam-images.stamp" 2>/dev/null)" = "$stamp" ] && continue
    node_exec "$n" ctr -n k8s.io images import "$ROAM_IMAGES/controller.tar" >/dev/null || return 1
    echo "$stamp" > "$d/roam-images.stamp"
    changed=1
  done
  [ -z "$changed" ] || echo changed
}

# The Lease's holder, if it is one of the Deployment's running pods.
roam_leader() {
  local holder
  holder=$(kubectl --kubeconfig "$KUBECONFIG_PATH" -n roam-system get lease roam-controller \
    -o jsonpath='{.spec.holderIdentity}' 2>/dev/null) || return 1
  [ -n "$holder" ] && kubectl --kubeconfig "$KUBECONFIG_PATH" -n roam-system get pod "$holder" \
    -o jsonpath='{.status.phase}' 2>/dev/null | grep -qx Running && echo "$holder"
}

roam_ready() {
  local counts
  counts=$(kubectl --kubeconfig "$KUBECONFIG_PATH" -n roam-system get deploy roam-controller \
    -o jsonpath='{.spec.replicas}/{.status.readyReplicas}' 2>/dev/null) || return 1
  [ "${counts%/*}" -gt 0 ] 2>/dev/null && [ "${counts%/*}" = "${counts#*/}" ] && roam_leader >/dev/null
}

roam_up() {
  local t0 changed existed=
  t0=$(now)
  [ -f "$ROAM_IMAGES/controller.tar" ] || die "no roam image in $ROAM_IMAGES: run e2e/lab up (it builds them)"
  changed=$(roam_import) || return 1
  kubectl --kubeconfig "$KUBECONFIG_PATH" -n roam-system get deploy roam-controller >/dev/null 2>&1 && existed=1
  kubectl --kubeconfig "$KUBECONFIG_PATH" apply -k "$ROAM_OVERLAY" >"$LAB_DIR/roam-apply.log" 2>&1 \
    || { cat "$LAB_DIR/roam-apply.log" >&2; return 1; }
  if [ -n "$existed" ] && [ -n "$changed" ]; then
    kubectl --kubeconfig "$KUBECONFIG_PATH" -n roam-system rollout restart deploy/roam-controller >/dev/null
  fi
  kubectl --kubeconfig "$KUBECONFIG_PATH" wait --for=condition=Established --timeout=60s \
    crd/networks.roam.dev crd/addresses.roam.dev crd/virtualmachines.roam.dev crd/virtualmachinemigrations.roam.dev >/dev/null || return 1
  if ! timeout 180 kubectl --kubeconfig "$KUBECONFIG_PATH" -n roam-system rollout status deploy/roam-controller >/dev/null \
    || ! wait_for 60 "roam-controller holds its Lease" /dev/null roam_ready; then
    roam_explain >&2
    return 1
  fi
  log "roam installed (e2e/deploy/lab): roam-controller leader $(roam_leader), ready in $(elapsed "$t0") s"
}

# What the installation's pods say when it is not ready.
roam_explain() {
  kubectl --kubeconfig "$KUBECONFIG_PATH" -n roam-system get deploy,pods -o wide 2>&1
  kubectl --kubeconfig "$KUBECONFIG_PATH" -n roam-system describe pods 2>&1 | tail -30
  local p
  for p in $(kubectl --kubeconfig "$KUBECONFIG_PATH" -n roam-system get pods -o name 2>/dev/null); do
    echo "== $p"
    kubectl --kubeconfig "$KUBECONFIG_PATH" -n roam-system logs "$p" --tail=20 2>&1
  done
}

roam_status() {
  if roam_ready 2>/dev/null; then
    echo "roam: installed, roam-controller leader $(roam_leader)"
  else
    echo "roam: NOT READY (e2e/lab up installs it)"; return 1
  fi
}
