//! The libvirt domain XML of a VM.
//!
//! Fixed choices, each for a reason:
//! - `<domain type='qemu'>` (TCG) unless KVM is asked for: KVM on some hosts (PVM) cannot boot
//!   a stock guest kernel;
//! - CPU model `qemu64`, identical on every node, so a live migration never meets a CPU the
//!   target cannot provide;
//! - each NIC is an unmanaged kernel tap (`type='ethernet'`, `managed='no'`) that the node's OVS
//!   carries as the VM's logical port, with checksum offload off on both sides: on OVS's
//!   userspace datapath, offloaded checksums reach the peer unfinished and TCP silently breaks
//!   while ping works. Both ends of a migration get the same XML;
//! - a disk is the checked image pinned at [`crate::disk::PINNED`], its format stated, with an
//!   empty `<backingStore/>`.

use std::fmt::Write;

use crate::Result;
use crate::spec::{LaunchBoot, VmSpec};

/// Which accelerator the domain uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Accel {
    /// Software emulation (TCG): works everywhere.
    Tcg,
    /// Hardware virtualisation.
    Kvm,
}

/// Escape text for an XML attribute or element.
fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '\'' => out.push_str("&apos;"),
            '"' => out.push_str("&quot;"),
            c => out.push(c),
        }
    }
    out
}

/// The domain XML for `spec` (validated first).
pub fn domain_xml(spec: &VmSpec, accel: Accel) -> Result<String> {
    spec.validate()?;
    let kind = match accel {
        Accel::Tcg => "qemu",
        Accel::Kvm => "kvm",
    };
    let mut x = String::new();
    // writing to a String cannot fail
    let _ = writeln!(x, "<domain type='{kind}'>");
    let _ = writeln!(x, "  <name>{}</name>", esc(&spec.name));
    let _ = writeln!(x, "  <memory unit='MiB'>{}</memory>", spec.memory_mib);
    let _ = writeln!(x, "  <vcpu>{}</vcpu>", spec.vcpus);
    let _ = writeln!(x, "  <os>\n    <type arch='x86_64' machine='pc'>hvm</type>");
    match &spec.boot {
        LaunchBoot::Kernel {
            kernel,
            initrd,
            cmdline,
        } => {
            let _ = writeln!(x, "    <kernel>{}</kernel>", esc(&kernel.to_string_lossy()));
            if let Some(i) = initrd {
                let _ = writeln!(x, "    <initrd>{}</initrd>", esc(&i.to_string_lossy()));
            }
            let _ = writeln!(x, "    <cmdline>{}</cmdline>", esc(cmdline));
        }
        LaunchBoot::Disk { .. } => {
            let _ = writeln!(x, "    <boot dev='hd'/>");
        }
    }
    let _ = writeln!(x, "  </os>");
    let _ = writeln!(
        x,
        "  <cpu mode='custom' match='exact' check='none'><model fallback='forbid'>qemu64</model></cpu>"
    );
    let _ = writeln!(
        x,
        "  <on_poweroff>destroy</on_poweroff>\n  <on_reboot>restart</on_reboot>\n  <on_crash>destroy</on_crash>"
    );
    let _ = writeln!(x, "  <devices>");
    if let LaunchBoot::Disk {
        format, read_only, ..
    } = &spec.boot
    {
        // the checked file where `roam-shim libvirtd` pinned it, never the owner's path; its
        // format stated and no backing store, so neither libvirt nor QEMU probes the image or
        // opens a file it names. Read-only: QEMU opens the image so (the runner mounts the
        // store read-only) and the guest sees a read-only disk; libvirt migrates such a disk
        // without shared storage
        let _ = writeln!(
            x,
            "    <disk type='file' device='disk'><driver name='qemu' type='{}'/><source file='{}'/><backingStore/><target dev='vda' bus='virtio'/>{}</disk>",
            esc(format),
            crate::disk::PINNED,
            if *read_only { "<readonly/>" } else { "" }
        );
    }
    // libvirt gives the NICs PCI slots in the order they appear, so the guest names them
    // eth0, eth1, … in the spec's order (and a migration carries the addresses along)
    for nic in &spec.nics {
        let _ = writeln!(
            x,
            "    <interface type='ethernet'>\n      <mac address='{}'/>\n      <target dev='{}' managed='no'/>\n      <model type='virtio'/>\n      <driver><host csum='off'/><guest csum='off'/></driver>\n    </interface>",
            nic.mac,
            esc(&nic.tap)
        );
    }
    let _ = writeln!(
        x,
        "    <serial type='file'><source path='{}' append='on'/><target port='0'/></serial>",
        esc(&spec.serial_log.to_string_lossy())
    );
    let _ = writeln!(x, "    <memballoon model='none'/>\n  </devices>\n</domain>");
    Ok(x)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::tests::lab_vm;

    #[test]
    fn lab_guest_xml_has_the_choices_migration_needs() {
        let x = domain_xml(&lab_vm(), Accel::Tcg).unwrap();
        assert!(x.starts_with("<domain type='qemu'>"));
        assert!(x.contains("<model fallback='forbid'>qemu64</model>"));
        assert!(x.contains("<mac address='52:54:00:e2:e0:0a'/>"));
        assert!(x.contains("<target dev='vm-demo0' managed='no'/>"));
        assert!(x.contains("<host csum='off'/><guest csum='off'/>"));
        assert!(x.contains("<kernel>/var/cache/roam/guest/vmlinuz</kernel>"));
        assert!(x.contains("<memory unit='MiB'>256</memory>"));
        assert!(x.trim_end().ends_with("</domain>"));
    }

    #[test]
    fn every_nic_is_in_the_xml_in_order() {
        let mut v = lab_vm();
        v.nics.push(crate::spec::LaunchNic {
            mac: "52:54:00:e2:e0:0b".parse().unwrap(),
            tap: "vm-demo1".into(),
            ovn_port: "demo-1.node-a".into(),
        });
        let x = domain_xml(&v, Accel::Tcg).unwrap();
        assert_eq!(x.matches("<interface type='ethernet'>").count(), 2, "{x}");
        assert_eq!(
            x.matches("<host csum='off'/><guest csum='off'/>").count(),
            2
        );
        let first = x.find("<target dev='vm-demo0' managed='no'/>").unwrap();
        let second = x.find("<target dev='vm-demo1' managed='no'/>").unwrap();
        assert!(first < second, "eth0 before eth1: {x}");
        assert!(x.contains("<mac address='52:54:00:e2:e0:0b'/>"));
    }

    #[test]
    fn text_is_escaped() {
        let mut v = lab_vm();
        v.boot = LaunchBoot::Kernel {
            kernel: "/k".into(),
            initrd: None,
            cmdline: "console=ttyS0 roam.note=<a&'b'>".into(),
        };
        let x = domain_xml(&v, Accel::Kvm).unwrap();
        assert!(
            x.contains("<cmdline>console=ttyS0 roam.note=&lt;a&amp;&apos;b&apos;&gt;</cmdline>"),
            "{x}"
        );
        assert!(x.starts_with("<domain type='kvm'>"));
    }

    #[test]
    fn an_invalid_spec_gives_no_xml() {
        let mut v = lab_vm();
        v.memory_mib = 1;
        assert!(domain_xml(&v, Accel::Tcg).is_err());
    }

    #[test]
    fn disk_boot() {
        let mut v = lab_vm();
        v.boot = LaunchBoot::Disk {
            image: "/images/d.qcow2".into(),
            format: "qcow2".into(),
            read_only: false,
        };
        let x = domain_xml(&v, Accel::Tcg).unwrap();
        assert!(x.contains("<boot dev='hd'/>"));
        // the pinned file, its format stated, no backing store; never the owner's path
        assert!(
            x.contains(
                "<driver name='qemu' type='qcow2'/><source file='/run/roam/disk/vda'/><backingStore/>"
            ),
            "{x}"
        );
        assert!(!x.contains("/images/d.qcow2"), "{x}");
        assert!(!x.contains("<kernel>"));
        assert!(
            !x.contains("<readonly/>"),
            "a volume's disk is the VM's to write"
        );
        v.boot = LaunchBoot::Disk {
            image: "/images/d.qcow2".into(),
            format: "qcow2".into(),
            read_only: true,
        };
        let x = domain_xml(&v, Accel::Tcg).unwrap();
        assert!(
            x.contains("<target dev='vda' bus='virtio'/><readonly/></disk>"),
            "an image of the store is read-only: {x}"
        );
    }
}
