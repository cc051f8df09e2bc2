# Lab libvirt: one monolithic libvirtd per node, inside the node's network and private mount
# namespaces (its /run, /etc/libvirt, /var/lib/libvirt ... are the node's own), with a
# distinct host_uuid so that the two daemons can migrate to each other.

libvirt_up() {
  local t0 n d; t0=$(now)
  for n in $NODES; do
    d=$(node_dir "$n")
    node_exec "$n" /usr/sbin/libvirtd -d --listen -f /etc/libvirt/libvirtd.conf -p /run/libvirtd.pid || return 1
  done
  for n in $NODES; do
    d=$(node_dir "$n")
    wait_for 60 "libvirtd on $n" "$d/fs_var_log_libvirt/libvirtd.log" \
      virsh -c "$(node_libvirt_uri "$n")" version || return 1
  done
  log "libvirt up in $(elapsed "$t0") s"
}

libvirt_down() {
  local n d
  for n in $NODES; do
    d=$(node_dir "$n")
    [ -S "$d/fs_run/libvirt/libvirt-sock" ] && pid_alive "$d/fs_run/libvirtd.pid" || continue
    # domains first, so QEMU exits cleanly
    for dom in $(timeout 20 virsh -c "$(node_libvirt_uri "$n")" list --name 2>/dev/null); do
      timeout 20 virsh -c "$(node_libvirt_uri "$n")" destroy "$dom" >/dev/null 2>&1 || true
    done
  done
  for n in $NODES; do stop_pid "$(node_dir "$n")/fs_run/libvirtd.pid"; done
}

libvirt_status() {
  local ok=0 n
  for n in $NODES; do
    if pid_alive "$(node_dir "$n")/fs_run/libvirtd.pid" && virsh -c "$(node_libvirt_uri "$n")" version >/dev/null 2>&1; then
      echo "libvirt $n: up ($(node_libvirt_uri "$n"))"
    else
      echo "libvirt $n: DOWN"; ok=1
    fi
  done
  if [ -f "$GUEST_DIR/vmlinuz" ] && [ -f "$GUEST_DIR/initramfs.gz" ]; then
    echo "guest: $GUEST_DIR/vmlinuz + initramfs.gz"
  else
    echo "guest: NOT BUILT"; ok=1
  fi
  return $ok
}
