#!/usr/bin/env bash
# Container images for the lab's nodes, without a registry: single-layer OCI archives that
# each node's containerd imports (pods use imagePullPolicy: Never).
#   registry.k8s.io/pause:3.2   kubernetes' own pause.c (from the cached source tree), static
#   lab.local/busybox:1.35      Debian's busybox-static
#   lab.local/roam-launcher:dev roam-shim (from this checkout), libvirtd and QEMU (as
#                               deploy/launcher/Containerfile) + busybox
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

# The launcher image follows the checkout: rebuilt when roam-shim or its recipe changes.
# Its contents are deploy/launcher/Containerfile's: the files of the Debian packages below as
# this host has them installed (the Containerfile installs the same versions from
# bookworm-backports), the shared libraries they link, deploy/launcher/qemu.conf and roam-shim.
LAUNCHER_PKGS="libvirt-daemon libvirt-daemon-common libvirt-daemon-driver-qemu libvirt0 libvirt-common
  qemu-system-x86 qemu-system-common qemu-system-data seabios ipxe-qemu"
export PATH="$HOME/.cargo/bin:$PATH"
# release, as the Containerfile builds it: the shim carries every migration's stream through
# its TLS proxy, and a debug build's copies and record layer cost the copy what the product's
# do not (the TLS bench measured 1.13x plain with it); built with roam's other release
# binaries (release.sh), into the same target directory
# shellcheck source=release.sh
. "$HERE/release.sh"
TARGET_DIR=${CARGO_TARGET_DIR:-$CACHE/target}
release_build "$REPO" "$TARGET_DIR"
SHIM=$TARGET_DIR/release/roam-shim
# shellcheck disable=SC2086
stamp=$( (sha256sum "$SHIM" "$REPO/deploy/launcher/qemu.conf" "$0"; dpkg-query -W $LAUNCHER_PKGS) | sha256sum | cut -c1-16)
if [ "$(cat "$OUT/launcher.stamp" 2>/dev/null)" != "$stamp" ] || [ ! -f "$OUT/launcher.tar" ]; then
  R=$W/launcher
  busybox_rootfs "$R"
  # the packages' files (directories, files and symlinks as installed), without docs, man
  # pages or the host's service, AppArmor and logrotate files
  # shellcheck disable=SC2086
  dpkg -L $LAUNCHER_PKGS | sort -u \
    | grep -Ev '^/\.$|^/usr/share/(doc|man|lintian|augeas)|^/(usr/)?lib/systemd|^/etc/(apparmor|init\.d|logrotate|default)' \
    | tar -cf - --no-recursion -T - 2>/dev/null | tar -xf - -C "$R"
  mkdir -p "$R/usr/bin" "$R/run/libvirt" "$R/var/lib/libvirt/qemu" "$R/var/cache/libvirt/qemu" \
    "$R/var/log/libvirt/qemu"
  cp "$SHIM" "$R/usr/bin/roam-shim"
  cp "$REPO/deploy/launcher/qemu.conf" "$R/etc/libvirt/qemu.conf"
  # libvirt resolves its built-in QEMU user before it reads qemu.conf (which says root)
  echo 'libvirt-qemu:x:64055:994:libvirt qemu:/var/lib/libvirt:/bin/false' >> "$R/etc/passwd"
  printf 'kvm:x:994:\nlibvirt-qemu:x:64055:\nlibvirt:x:993:\n' >> "$R/etc/group"
  # the shared libraries of every program and module (libvirt's drivers and QEMU's modules
  # are loaded at run time), at the same paths
  # (ldd fails on static programs: its status is not the list's)
  libs=$(find "$R" -type f \( -perm -u+x -o -name '*.so*' \) -print0 \
    | xargs -0 file -N | awk -F: '/ELF/ {print $1}' \
    | { xargs -r ldd 2>/dev/null || true; } | awk '/=>/ && $3 ~ /^\// {print $3} /^[ \t]*\/lib/ {print $1}' | sort -u)
  for lib in $libs; do
    [ -e "$R$lib" ] && continue
    mkdir -p "$R$(dirname "$lib")"
    cp -L "$lib" "$R$lib"
  done
  # checked before it is written: the programs run from inside the root filesystem
  for prog in "/usr/bin/roam-shim --version" "/usr/sbin/libvirtd --version" "/usr/bin/qemu-system-x86_64 --version"; do
    # shellcheck disable=SC2086
    LC_ALL=C LANG=C chroot "$R" $prog >/dev/null || { echo "launcher image: $prog does not run inside the image" >&2; exit 1; }
  done
  python3 "$HERE/mkimage.py" "$R" lab.local/roam-launcher:dev "$OUT/launcher.tar" \
    '{"Entrypoint":["/usr/bin/roam-shim"]}'
  echo "$stamp" > "$OUT/launcher.stamp"
fi
echo "images: $(cd "$OUT" && ls ./*.tar | tr '\n' ' ')in $OUT"
