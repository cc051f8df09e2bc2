#!/usr/bin/env bash
# Runs as the holder of a lab node's private mount namespace (already inside the node's
# network namespace): gives the node its own /sys, /run and kubelet trees, then waits.
# Daemons of the node are started later with `nsenter -t <holder> -m -n`.
set -euo pipefail
D=$1
BIND_PATHS=$2
HIDDEN=${3:-}
# A sysfs for this network namespace (so /sys/class/net shows the node's links), keeping
# the cgroup tree that kubelet and the containers need (`ip netns exec` would drop it).
tmp=$(mktemp -d)
mount --rbind /sys/fs/cgroup "$tmp"
mount -t sysfs sysfs /sys
mount --move "$tmp" /sys/fs/cgroup
rmdir "$tmp"
# Stock paths, private per node: daemons inside use their defaults.
for p in $BIND_PATHS; do
  src=$D/fs$(echo "$p" | tr / _)
  mkdir -p "$src"
  mount --bind "$src" "$p"
done
mkdir -p /run/openvswitch /run/ovn /run/lock
# Other hosts' disks: an empty read-only tmpfs over each (see node_hidden_paths).
for h in $HIDDEN; do
  mkdir -p "$h"
  mount -t tmpfs -o ro,size=4k,mode=0555 roam-hidden "$h"
done
touch "$D/mounted"
exec -a roam-lab-holder sleep infinity
