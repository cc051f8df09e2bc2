#!/usr/bin/env bash
# Install the Debian packages the lab and the tests need. Idempotent; apt only.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
PKGS=(
  # kube control plane at run time
  etcd-server openssl curl ca-certificates
  # real nodes: containerd + runc; the CNI reference plugins stand in until roam-cni
  containerd runc containernetworking-plugins gcc libc6-dev python3
  # OVN: central + two chassis (userspace datapath)
  openvswitch-switch openvswitch-common ovn-central ovn-host
  # what the guest build needs
  cpio uuid-runtime
  # Rust crates: virt (libvirt-dev, from backports below, + pkg-config)
  pkg-config
  # the lab's OVN, unpacked from a newer suite (ovn-fetch.py)
  patchelf
  # tests: DHCP clients, ping, capture
  busybox isc-dhcp-client iputils-ping tcpdump iproute2 procps psmisc util-linux
)
# VMs: libvirtd + QEMU (TCG) from bookworm-backports (QEMU 10.0, libvirt 11.3) — what the lab
# copies into roam's launcher image (build-images.sh; no node runs the host's) —, not bookworm's
# QEMU 7.2 / libvirt 9.0: QEMU 7.2's TCG corrupts the guest's memory across live migrations
# (every time with a 1 ms downtime limit; docs/benchmarks.md, "QEMU ≥ 10 under TCG").
# libvirt 9.0 cannot drive QEMU 10, so both come from backports.
BPO=bookworm-backports
BPO_LIST=/etc/apt/sources.list.d/roam-$BPO.list
BPO_PKGS=(qemu-system-x86 qemu-utils libvirt-daemon-system libvirt-clients libvirt-dev libvirt0)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
bpo_missing=()
for p in "${BPO_PKGS[@]}"; do
  dpkg-query -W -f='${Status} ${Version}' "$p" 2>/dev/null | grep -q 'install ok installed .*~bpo12' \
    || bpo_missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ] || [ ${#bpo_missing[@]} -gt 0 ]; then
  echo "deps: installing ${missing[*]} ${bpo_missing[*]}"
  # No init system here: keep packages from starting their services.
  # The lab runs its own daemons; packages must not start system copies of them.
  own_policy=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d; own_policy=1
  fi
  trap '[ $own_policy = 1 ] && rm -f /usr/sbin/policy-rc.d' EXIT
  if [ ${#bpo_missing[@]} -gt 0 ] && ! grep -qs "^deb .* $BPO " /etc/apt/sources.list /etc/apt/sources.list.d/*.list \
      && ! grep -qs "Suites:.*\b$BPO\b" /etc/apt/sources.list.d/*.sources; then
    echo "deb http://deb.debian.org/debian $BPO main" > "$BPO_LIST"
  fi
  apt-get update -qq
  if [ ${#missing[@]} -gt 0 ]; then
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
  if [ ${#bpo_missing[@]} -gt 0 ]; then
    apt-get install -y -qq --no-install-recommends -t "$BPO" "${bpo_missing[@]}" >/dev/null
  fi
fi
echo "deps: ok"
