#!/usr/bin/env bash
# Container images for the lab's nodes, without a registry: single-layer OCI archives that
# each node's containerd imports (pods use imagePullPolicy: Never).
#   registry.k8s.io/pause:3.2   kubernetes' own pause.c (from the cached source tree), static
#   lab.local/busybox:1.35      Debian's busybox-static
#   lab.local/roam-launcher:dev roam-shim (from this checkout) with its shared libraries + busybox
# Output: $ROAM_CACHE/images/*.tar (pause and busybox cached; the launcher follows the checkout).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
CACHE=${ROAM_CACHE:-/var/cache/roam}
OUT=$CACHE/images
mkdir -p "$OUT"
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT

busybox_rootfs() { # DIR
  mkdir -p "$1"/{bin,etc,tmp,proc,sys,dev,root,run,var}
  cp "$CACHE/guest/bbroot/bin/busybox" "$1/bin/busybox"
  local a
  for a in $("$1/bin/busybox" --list); do [ "$a" = busybox ] || ln -sf busybox "$1/bin/$a"; done
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n' > "$1/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' > "$1/etc/group"
  chmod 1777 "$1/tmp"
}

[ -x "$CACHE/guest/bbroot/bin/busybox" ] || bash "$HERE/build-guest.sh"

if [ ! -f "$OUT/pause.tar" ]; then
  SRC=$(ls -d "$CACHE"/kube/src/kubernetes-*/ | head -1)
  mkdir -p "$W/pause"
  gcc -Os -Wall -Werror -static -DVERSION=v3.2-roam -o "$W/pause/pause" "$SRC/build/pause/linux/pause.c"
  strip "$W/pause/pause"
  python3 "$HERE/mkimage.py" "$W/pause" registry.k8s.io/pause:3.2 "$OUT/pause.tar" '{"Entrypoint":["/pause"]}'
fi

if [ ! -f "$OUT/busybox.tar" ]; then
  busybox_rootfs "$W/busybox"
  python3 "$HERE/mkimage.py" "$W/busybox" lab.local/busybox:1.35 "$OUT/busybox.tar" '{"Cmd":["sh"]}'
fi

# The launcher image follows the checkout: rebuilt when roam-shim changes.
export PATH="$HOME/.cargo/bin:$PATH"
(cd "$REPO" && cargo build --locked -q -p roam-vm-shim --bin roam-shim)
SHIM=${CARGO_TARGET_DIR:-$REPO/target}/debug/roam-shim
stamp=$(sha256sum "$SHIM" | cut -c1-16)
if [ "$(cat "$OUT/launcher.stamp" 2>/dev/null)" != "$stamp" ] || [ ! -f "$OUT/launcher.tar" ]; then
  R=$W/launcher
  busybox_rootfs "$R"
  mkdir -p "$R/usr/bin"
  cp "$SHIM" "$R/usr/bin/roam-shim"
  # the shim's shared libraries (libvirt client and its dependencies), at the same paths
  for lib in $(ldd "$SHIM" | awk '/=>/ {print $3} /^[ \t]*\/lib/ {print $1}' | sort -u); do
    mkdir -p "$R$(dirname "$lib")"
    cp -L "$lib" "$R$lib"
  done
  python3 "$HERE/mkimage.py" "$R" lab.local/roam-launcher:dev "$OUT/launcher.tar" \
    '{"Entrypoint":["/usr/bin/roam-shim"]}'
  echo "$stamp" > "$OUT/launcher.stamp"
fi
echo "images: $(cd "$OUT" && ls ./*.tar | tr '\n' ' ')in $OUT"
