#!/usr/bin/env bash
# roam's own images for deploy/, without a registry or a container engine, the way
# build-images.sh builds the launcher: single-layer OCI archives of release binaries built now
# from this checkout, with the shared libraries they link.
#   usage: e2e/labkit/build-roam-image.sh controller|cni [IMAGE] [OUT.tar]
#   controller  roam-controller, roam-node (the node agent) and an /etc/passwd with the
#               Deployment's non-root user (65532), nothing else (deploy/controller/Containerfile). IMAGE defaults to
#               roam/roam-controller:dev, OUT.tar to $ROAM_CACHE/controller-image/roam-controller.tar.
#   cni         the roam-cni DaemonSet's installer (deploy/cni/Containerfile): roam-cni and
#               deploy/cni/install.sh as /usr/local/bin/roam-cni-install, on busybox (the
#               installer is a shell script). IMAGE defaults to roam/roam-cni:dev, OUT.tar to
#               $ROAM_CACHE/controller-image/roam-cni.tar. The plugin is the glibc build: the
#               installer copies it onto the node, and the lab's nodes share the host's libc
#               (deploy/cni/Containerfile builds it static, for any node).
#   Neither lands in $ROAM_CACHE/images (the lab does not import it into every node at
#   start-up); e2e/lab up builds them into $ROAM_CACHE/roam-images. Import one into a node
#   with `e2e/lab exec node-a ctr -n k8s.io images import OUT.tar`.
# Each image is checked before it is written: its binaries run from inside the root
# filesystem, chrooted, so no library is missing.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
CACHE=${ROAM_CACHE:-/var/cache/roam}
KIND=${1:-}
case $KIND in
  controller) IMAGE=${2:-roam/roam-controller:dev}; OUT=${3:-$CACHE/controller-image/roam-controller.tar} ;;
  cni) IMAGE=${2:-roam/roam-cni:dev}; OUT=${3:-$CACHE/controller-image/roam-cni.tar} ;;
  *) echo "usage: $0 controller|cni [IMAGE] [OUT.tar]" >&2; exit 2 ;;
esac
# the name the kubelet asks containerd for: a name without a registry is docker.io's
case "${IMAGE%%/*}" in
  *.*|*:*|localhost) ;;
  *) [ "${IMAGE#*/}" != "$IMAGE" ] && IMAGE=docker.io/$IMAGE || IMAGE=docker.io/library/$IMAGE ;;
esac
mkdir -p "$(dirname "$OUT")"
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
R=$W/rootfs
mkdir -p "$R"/{usr/local/bin,etc,tmp}
chmod 1777 "$R/tmp"

export PATH="$HOME/.cargo/bin:$PATH"
# shellcheck source=release.sh
. "$HERE/release.sh"
TARGET_DIR=${CARGO_TARGET_DIR:-$CACHE/target}
release_build "$REPO" "$TARGET_DIR"
TARGET=$TARGET_DIR/release

# BINARY and the shared libraries it links, into the root filesystem
with_libs() {
  cp "$1" "$R/usr/local/bin/$(basename "$1")"
  local lib
  for lib in $(ldd "$1" | awk '/=>/ {print $3} /^[ \t]*\/lib/ {print $1}' | sort -u); do
    mkdir -p "$R$(dirname "$lib")"
    cp -L "$lib" "$R$lib"
  done
}

case $KIND in
  controller)
    with_libs "$TARGET/roam-controller"
    with_libs "$TARGET/roam-node"
    printf 'root:x:0:0:root:/:/bin/false\nnonroot:x:65532:65532:nonroot:/:/bin/false\n' > "$R/etc/passwd"
    printf 'root:x:0:\nnonroot:x:65532:\n' > "$R/etc/group"
    version=$(chroot "$R" /usr/local/bin/roam-controller --version) \
      || { echo "roam-controller does not run inside the image's root filesystem" >&2; exit 1; }
    chroot "$R" /usr/local/bin/roam-node --version >/dev/null \
      || { echo "roam-node does not run inside the image's root filesystem" >&2; exit 1; }
    CONFIG='{"Entrypoint":["/usr/local/bin/roam-controller"],"User":"65532:65532"}'
    ;;
  cni)
    BB=$CACHE/guest/bbroot/bin/busybox
    [ -x "$BB" ] || bash "$HERE/build-guest.sh"
    mkdir -p "$R/bin"
    cp "$BB" "$R/bin/busybox"
    for a in $("$R/bin/busybox" --list); do [ "$a" = busybox ] || ln -sf busybox "$R/bin/$a"; done
    printf 'root:x:0:0:root:/:/bin/false\n' > "$R/etc/passwd"
    printf 'root:x:0:\n' > "$R/etc/group"
    with_libs "$TARGET/roam-cni"
    install -m 755 "$REPO/deploy/cni/install.sh" "$R/usr/local/bin/roam-cni-install"
    version=$(echo '{"cniVersion":"1.1.0"}' | chroot "$R" env CNI_COMMAND=VERSION /usr/local/bin/roam-cni) \
      || { echo "roam-cni does not run inside the image's root filesystem" >&2; exit 1; }
    chroot "$R" /bin/sh -n /usr/local/bin/roam-cni-install \
      || { echo "the installer does not parse under the image's shell" >&2; exit 1; }
    CONFIG='{"Entrypoint":["/usr/local/bin/roam-cni-install"],"Env":["PATH=/usr/local/bin:/bin"]}'
    ;;
esac
python3 "$HERE/mkimage.py" "$R" "$IMAGE" "$OUT" "$CONFIG"
echo "$IMAGE ($version) in $OUT ($(du -h "$OUT" | cut -f1))"
