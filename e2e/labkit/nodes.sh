# Lab nodes: one network namespace + one private mount namespace per node, the underlay
# bridge in the root namespace, and the geneve veth between the nodes.

# Bind mounts need their mount points on the host; create the missing ones, and remember
# them so that `down` removes exactly those.
make_mount_points() {
  local p dir c
  for p in $NODE_BIND_PATHS; do
    dir=""
    for c in $(echo "$p" | tr / ' '); do
      dir="$dir/$c"
      [ -d "$dir" ] || { mkdir "$dir"; echo "$dir" >> "$LAB_DIR/created-dirs"; }
    done
  done
}

remove_mount_points() {
  [ -f "$LAB_DIR/created-dirs" ] || return 0
  tac "$LAB_DIR/created-dirs" | while read -r dir; do rmdir "$dir" 2>/dev/null || true; done
  rm -f "$LAB_DIR/created-dirs"
}

nodes_up() {
  local n ns d idx hidden h
  mkdir -p "$LAB_DIR" && echo "$ROAM_LAB_NODES" > "$LAB_DIR/node-count" && echo "$ROAM_LAB_OVN" > "$LAB_DIR/ovn"
  make_mount_points
  ip link show "$BRIDGE" >/dev/null 2>&1 || ip link add "$BRIDGE" type bridge
  ip addr replace "$BRIDGE_IP/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  for n in $NODES; do
    ns=$(node_ns "$n"); d=$(node_dir "$n"); idx=$(node_index "$n")
    # fresh state
    mkdir -p "$d"
    find "$d" -mindepth 1 -maxdepth 1 -exec rm -rf {} +
    mkdir -p "$d/logs"
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    ip link add "roam-up$idx" type veth peer name up0 netns "$ns"
    ip link set "roam-up$idx" master "$BRIDGE" up
    ip -n "$ns" addr add "$(node_ip "$n")/24" dev up0
    ip -n "$ns" link set up0 up
    rm -f "$d/mounted"
    # what the node hides must exist before its namespace covers it
    hidden=$(node_hidden_paths "$n")
    for h in $hidden; do mkdir -p "$h"; done
    nsenter --net="/run/netns/$ns" -- unshare --mount --propagation private -- \
      bash "$LABKIT/node-inner.sh" "$d" "$NODE_BIND_PATHS" "$hidden" >"$d/logs/holder.log" 2>&1 9>&- &
    echo $! > "$d/holder.pid"
  done
  # geneve underlay between the chassis: a bridge with a veth to each node, at a data
  # centre's MTU: the overlay's 1400 plus geneve must fit (ROAM_LAB_UNDERLAY_MTU)
  ip link show "$GNV_BRIDGE" >/dev/null 2>&1 || ip link add "$GNV_BRIDGE" mtu "$UNDERLAY_MTU" type bridge
  ip link set "$GNV_BRIDGE" mtu "$UNDERLAY_MTU" up
  for n in $NODES; do
    ns=$(node_ns "$n"); idx=$(node_index "$n")
    ip link add "roam-gnv$idx" mtu "$UNDERLAY_MTU" type veth peer name gnv0 netns "$ns"
    ip link set "roam-gnv$idx" master "$GNV_BRIDGE" up
    ip -n "$ns" link set gnv0 mtu "$UNDERLAY_MTU" up
    wait_for 10 "node $n mount namespace" "$(node_dir "$n")/logs/holder.log" test -f "$(node_dir "$n")/mounted" \
      || return 1
  done
}

# Kill every process left in a node's mount namespace (a pod's QEMU, ...),
# found by its /proc/PID/ns/mnt, after the daemons were stopped by their pidfiles.
node_sweep() {
  local n=$1 holder mnt p
  holder=$(node_holder_pid "$n") || return 0
  mnt=$(readlink "/proc/$holder/ns/mnt" 2>/dev/null) || return 0
  for p in /proc/[0-9]*; do
    p=${p#/proc/}
    [ "$p" = "$holder" ] && continue
    [ "$(readlink "/proc/$p/ns/mnt" 2>/dev/null)" = "$mnt" ] && kill -9 "$p" 2>/dev/null || true
  done
}

nodes_down() {
  local n ns idx
  for n in $NODES; do
    node_sweep "$n"
    stop_pid "$(node_dir "$n")/holder.pid"
  done
  for n in $NODES; do
    ns=$(node_ns "$n"); idx=$(node_index "$n")
    ip netns del "$ns" 2>/dev/null || true
    ip link del "roam-up$idx" 2>/dev/null || true
    ip link del "roam-gnv$idx" 2>/dev/null || true
  done
  ip link del "$GNV_BRIDGE" 2>/dev/null || true
  rm -f "$LAB_DIR/node-count" "$LAB_DIR/ovn"
  ip link del "$BRIDGE" 2>/dev/null || true
  remove_mount_points
}

nodes_status() {
  local n ok=0 running
  running=$(cat "$LAB_DIR/node-count" 2>/dev/null || echo none)
  if [ "$running" != "$ROAM_LAB_NODES" ]; then
    echo "nodes: the lab runs $running nodes, ROAM_LAB_NODES asks for $ROAM_LAB_NODES"; ok=1
  fi
  for n in $NODES; do
    if pid_alive "$(node_dir "$n")/holder.pid" && [ -e "/run/netns/$(node_ns "$n")" ]; then
      echo "node $n: up (netns $(node_ns "$n"), ip $(node_ip "$n"))"
    else
      echo "node $n: DOWN"; ok=1
    fi
  done
  return $ok
}
