#!/usr/bin/env bash
# Trace TCG's translation on a lab node: QEMU's translated-block count for DOMAIN, sampled as
# fast as `virsh qemu-monitor-command` answers (~every 30 ms) for SECONDS, one line each:
# "<unix time> <TB count>". Run it on a migration's target node while a migration lands (or
# around a `virsh restore`) to see a new QEMU translate the guest's code again after it
# resumes — the guest's warm-up that a warm QEMU does not have.
#
# Each launcher pod runs its own libvirtd, on the node's address at the pod's libvirt port
# (its `libvirtd` container's --listen): give the target pod's.
#
#   e2e/labkit/tcg-trace.sh 10.213.0.12:17242 h8-mig_h8vm 10 > trace.txt
set -euo pipefail
. "$(dirname "$0")/common.sh"
[ $# = 3 ] || die "usage: $0 NODE_IP:LIBVIRT_PORT DOMAIN SECONDS"
listen=$1 domain=$2 seconds=$3
uri="qemu+tcp://$listen/system"
end=$((SECONDS + seconds))
while [ $SECONDS -lt $end ]; do
  out=$(virsh -c "$uri" qemu-monitor-command --hmp "$domain" 'info jit' 2>/dev/null || true)
  count=$(echo "$out" | sed -n 's/^TB count *\([0-9]*\).*/\1/p')
  [ -n "$count" ] && echo "$(date +%s.%N) $count"
done
