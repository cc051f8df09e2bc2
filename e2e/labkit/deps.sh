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
  # VMs: libvirtd + QEMU (TCG), and what the guest build needs
  libvirt-daemon-system libvirt-clients qemu-system-x86 qemu-utils cpio uuid-runtime
  # Rust crates: virt (libvirt-dev + pkg-config)
  libvirt-dev pkg-config
  # tests: DHCP clients, ping, capture
  busybox isc-dhcp-client iputils-ping tcpdump iproute2 procps psmisc util-linux
)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "deps: installing ${missing[*]}"
  # No init system here: keep packages from starting their services.
  # The lab runs its own daemons; packages must not start system copies of them.
  own_policy=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d; own_policy=1
  fi
  trap '[ $own_policy = 1 ] && rm -f /usr/sbin/policy-rc.d' EXIT
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
echo "deps: ok"
