# The lab's guests. No node runs a libvirtd of its own: libvirt and QEMU come in roam's
# launcher image (deploy/launcher/Containerfile), one libvirtd per VM in its launcher pod. The
# component tests that drive libvirt or roam-shim themselves get a libvirtd per node from a pod
# of the same image (e2e/src/lab.rs, `Lab::test_libvirt`).

libvirt_status() {
  if [ -f "$GUEST_DIR/vmlinuz" ] && [ -f "$GUEST_DIR/initramfs.gz" ]; then
    echo "guest: $GUEST_DIR/vmlinuz + initramfs.gz"
  else
    echo "guest: NOT BUILT"; return 1
  fi
}
