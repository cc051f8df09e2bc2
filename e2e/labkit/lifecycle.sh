#!/usr/bin/env bash
# The lab's own contract, checked by e2e/test: `up` twice is harmless, `up` after a run that
# was killed midway cleans up and succeeds, `down` leaves nothing behind.
set -euo pipefail
cd "$(dirname "$0")/../.."
. e2e/labkit/common.sh
case $1 in
  up-twice)
    e2e/lab up
    pids=$(cat "$LAB_DIR"/kube/kube-apiserver.pid "$LAB_DIR"/central/ovnnb_db.pid)
    out=$(e2e/lab up 2>&1)
    echo "$out"
    grep -q "lab already up" <<<"$out" || { echo "the second up did not see the running lab"; exit 1; }
    [ "$pids" = "$(cat "$LAB_DIR"/kube/kube-apiserver.pid "$LAB_DIR"/central/ovnnb_db.pid)" ] \
      || { echo "a second up restarted daemons"; exit 1; }
    e2e/lab status
    ;;
  killed-midway)
    e2e/lab up
    # a run killed midway: daemons gone without `down`, pidfiles, namespaces, mounts and a
    # stale test namespace left behind
    kill -9 "$(cat "$LAB_DIR/kube/kube-apiserver.pid")" "$(cat "$LAB_DIR/node-a/fs_run/openvswitch/ovs-vswitchd.pid")"
    ip netns add roam-t-stale
    ! e2e/lab status >/dev/null 2>&1 || { echo "status did not notice the killed daemons"; exit 1; }
    t0=$(date +%s.%N)
    e2e/lab up
    e2e/lab status
    ! ip netns list | grep -q roam-t-stale || { echo "stale test namespace survived"; exit 1; }
    echo "recovered in $(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}') s"
    ;;
  down-clean)
    e2e/lab down
    e2e/lab check-clean
    ;;
  *) echo "usage: lifecycle.sh up-twice|killed-midway|down-clean" >&2; exit 2 ;;
esac
