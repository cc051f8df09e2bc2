#!/usr/bin/env bash
# The roam-controller image for deploy/controller/deployment.yaml, without a registry or a
# container engine, the way build-images.sh builds the launcher: a single-layer OCI archive
# holding the release roam-controller (built now from this checkout) with the shared
# libraries it links, an /etc/passwd with the Deployment's non-root user (65532), nothing else.
#   usage: e2e/labkit/build-controller-image.sh [IMAGE] [OUT.tar]
#   IMAGE defaults to roam/roam-controller:dev (the Deployment's), OUT.tar to
#   $ROAM_CACHE/controller-image/roam-controller.tar — not in $ROAM_CACHE/images, so the lab
#   does not import it into every node at start-up. Import it into a node with
#   `e2e/lab exec node-a ctr -n k8s.io images import OUT.tar`.
# The image is checked before it is written: the binary runs (--version) from inside the
# root filesystem, chrooted, so no library is missing.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
CACHE=${ROAM_CACHE:-/var/cache/roam}
IMAGE=${1:-roam/roam-controller:dev}
OUT=${2:-$CACHE/controller-image/roam-controller.tar}
# the name the kubelet asks containerd for: a name without a registry is docker.io's
case "${IMAGE%%/*}" in
  *.*|*:*|localhost) ;;
  *) [ "${IMAGE#*/}" != "$IMAGE" ] && IMAGE=docker.io/$IMAGE || IMAGE=docker.io/library/$IMAGE ;;
esac
mkdir -p "$(dirname "$OUT")"
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT

export PATH="$HOME/.cargo/bin:$PATH"
(cd "$REPO" && cargo build --locked -q --release -p roam-migrator --bin roam-controller)
BIN=${CARGO_TARGET_DIR:-$REPO/target}/release/roam-controller

R=$W/rootfs
mkdir -p "$R"/{usr/local/bin,etc,tmp}
chmod 1777 "$R/tmp"
cp "$BIN" "$R/usr/local/bin/roam-controller"
for lib in $(ldd "$BIN" | awk '/=>/ {print $3} /^[ \t]*\/lib/ {print $1}' | sort -u); do
  mkdir -p "$R$(dirname "$lib")"
  cp -L "$lib" "$R$lib"
done
printf 'root:x:0:0:root:/:/bin/false\nnonroot:x:65532:65532:nonroot:/:/bin/false\n' > "$R/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' > "$R/etc/group"
version=$(chroot "$R" /usr/local/bin/roam-controller --version) \
  || { echo "roam-controller does not run inside the image's root filesystem" >&2; exit 1; }
python3 "$HERE/mkimage.py" "$R" "$IMAGE" "$OUT" \
  '{"Entrypoint":["/usr/local/bin/roam-controller"],"User":"65532:65532"}'
echo "$IMAGE ($version) in $OUT ($(du -h "$OUT" | cut -f1))"
