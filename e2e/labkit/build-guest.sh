#!/usr/bin/env bash
# Build the lab guest: Debian's kernel + a busybox initramfs whose udhcpc hook honours
# RFC 3442 option 121/249 and /32 leases (e2e/guest/initramfs). Packages are only
# downloaded (apt-get download) and unpacked, never installed. Cached outside the checkout;
# the initramfs is rebuilt when e2e/guest changes.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
SRC=$(cd "$HERE/../guest/initramfs" && pwd)
OUT=${ROAM_CACHE:-/var/cache/roam}/guest
mkdir -p "$OUT/debs"
cd "$OUT/debs"
if [ ! -f "$OUT/vmlinuz" ] || [ ! -d "$OUT/bbroot" ]; then
  KPKG=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
  [ -n "$KPKG" ] || { echo "guest: cannot resolve the kernel package of linux-image-amd64 (run apt-get update)"; exit 1; }
  rm -f ./*.deb
  apt-get download -qq busybox-static "$KPKG" 2>&1 | grep -v unsandboxed || true
  rm -rf "$OUT/kroot" "$OUT/bbroot"
  dpkg-deb -x "$KPKG"_*.deb "$OUT/kroot"
  dpkg-deb -x busybox-static_*.deb "$OUT/bbroot"
  cp "$OUT/kroot/boot/vmlinuz-${KPKG#linux-image-}" "$OUT/vmlinuz.new"
  echo "${KPKG#linux-image-}" > "$OUT/kernel-version"
  mv "$OUT/vmlinuz.new" "$OUT/vmlinuz"
fi
KVER=$(cat "$OUT/kernel-version")
stamp=$( (cd "$SRC" && find . -type f -print0 | sort -z | xargs -0 sha256sum; echo "$KVER") | sha256sum | cut -c1-16)
if [ -f "$OUT/initramfs.gz" ] && [ "$(cat "$OUT/initramfs.stamp" 2>/dev/null)" = "$stamp" ]; then
  echo "guest: cached in $OUT (kernel $KVER)"
  exit 0
fi
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
cp -a "$SRC/." "$T/"
mkdir -p "$T"/{bin,sbin,proc,sys,dev,run,tmp,www,lib/modules,usr/bin,usr/sbin}
cp "$OUT/bbroot/bin/busybox" "$T/bin/busybox"
K=$OUT/kroot/lib/modules/$KVER/kernel
# Debian's virtio stack is modular; /init loads these in dependency order.
for f in drivers/virtio/virtio_ring.ko drivers/virtio/virtio.ko drivers/virtio/virtio_pci_legacy_dev.ko \
         drivers/virtio/virtio_pci_modern_dev.ko drivers/virtio/virtio_pci.ko net/core/failover.ko \
         drivers/net/net_failover.ko drivers/net/virtio_net.ko; do
  cp "$K/$f" "$T/lib/modules/"
done
(cd "$T" && find . | cpio -o -H newc --quiet | gzip -1) > "$OUT/initramfs.gz.new"
mv "$OUT/initramfs.gz.new" "$OUT/initramfs.gz"
echo "$stamp" > "$OUT/initramfs.stamp"
echo "guest: built $OUT/vmlinuz + initramfs.gz (kernel $KVER)"
