//! What a VM is made of, checked before anything is started.

use std::path::PathBuf;

use crate::{Error, Result};

/// A VM's boot source and NICs are the launch contract's own types: what the controller
/// renders onto the shim's command line is what the shim runs.
pub use roam_shim_api::launch::{LaunchBoot, LaunchNic};
pub use roam_shim_api::limits::{MAX_MEMORY_MIB, MAX_NICS, MAX_VCPUS, MIN_MEMORY_MIB};
use roam_shim_api::limits::{
    boot_path_problem, cmdline_problem, disk_format_problem, domain_name_problem,
};

/// One VM.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VmSpec {
    /// Domain name.
    pub name: String,
    /// Virtual CPUs.
    pub vcpus: u32,
    /// Memory in MiB.
    pub memory_mib: u64,
    /// Boot source.
    pub boot: LaunchBoot,
    /// Network interfaces, in the guest's order (1 to [`MAX_NICS`]).
    pub nics: Vec<LaunchNic>,
    /// File the serial console is appended to.
    pub serial_log: PathBuf,
}

impl VmSpec {
    /// Check the spec; the error says what is wrong and what is allowed.
    pub fn validate(&self) -> Result<()> {
        let bad = |problem: String| {
            Err(Error::InvalidSpec {
                vm: self.name.clone(),
                problem,
            })
        };
        if let Some(p) = domain_name_problem(&self.name) {
            return bad(p);
        }
        if self.vcpus == 0 || self.vcpus > MAX_VCPUS {
            return bad(format!("{} vCPUs: use 1 to {MAX_VCPUS}", self.vcpus));
        }
        if !(MIN_MEMORY_MIB..=MAX_MEMORY_MIB).contains(&self.memory_mib) {
            return bad(format!(
                "{} MiB of memory: use {MIN_MEMORY_MIB} to {MAX_MEMORY_MIB} MiB",
                self.memory_mib
            ));
        }
        match &self.boot {
            LaunchBoot::Kernel {
                kernel,
                initrd,
                cmdline,
            } => {
                let initrd = initrd.iter().map(|i| ("initrd", i));
                for (what, p) in std::iter::once(("kernel", kernel)).chain(initrd) {
                    if let Some(problem) = boot_path_problem(what, &p.display().to_string()) {
                        return bad(problem);
                    }
                }
                if let Some(problem) = cmdline_problem(cmdline) {
                    return bad(problem);
                }
            }
            LaunchBoot::Disk { image, format, .. } => {
                if let Some(problem) = boot_path_problem("disk image", &image.display().to_string())
                {
                    return bad(problem);
                }
                if let Some(problem) = disk_format_problem(format) {
                    return bad(problem);
                }
            }
        }
        if self.nics.is_empty() || self.nics.len() > MAX_NICS {
            return bad(format!(
                "{} NICs: give 1 to {MAX_NICS} (mac + tap each)",
                self.nics.len()
            ));
        }
        for (i, nic) in self.nics.iter().enumerate() {
            if nic.mac.is_multicast() || nic.mac.is_zero() {
                return bad(format!(
                    "MAC {} of NIC {i}: a VM needs a unicast, non-zero MAC",
                    nic.mac
                ));
            }
            let tap = &nic.tap;
            if tap.is_empty()
                || tap.len() > 15
                || !tap
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            {
                return bad(format!(
                    "tap {tap:?}: a Linux interface name of 1-15 characters a-z, 0-9, '-', '_'"
                ));
            }
            if let Some(j) = self.nics[..i].iter().position(|o| o.tap == nic.tap) {
                return bad(format!(
                    "NICs {j} and {i} both use tap {tap}: give each NIC its own tap"
                ));
            }
            if let Some(j) = self.nics[..i].iter().position(|o| o.mac == nic.mac) {
                return bad(format!(
                    "NICs {j} and {i} both have MAC {}: give each NIC its own MAC",
                    nic.mac
                ));
            }
        }
        if !self.serial_log.is_absolute() {
            return bad(format!(
                "serial log {} must be an absolute path",
                self.serial_log.display()
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn lab_vm() -> VmSpec {
        VmSpec {
            name: "demo".into(),
            vcpus: 1,
            memory_mib: 256,
            boot: LaunchBoot::Kernel {
                kernel: "/var/cache/roam/guest/vmlinuz".into(),
                initrd: Some("/var/cache/roam/guest/initramfs.gz".into()),
                cmdline: "console=ttyS0 quiet panic=-1".into(),
            },
            nics: vec![LaunchNic {
                mac: "52:54:00:e2:e0:0a".parse().unwrap(),
                tap: "vm-demo0".into(),
                ovn_port: "demo.node-a".into(),
            }],
            serial_log: "/var/log/roam/demo.serial.log".into(),
        }
    }

    #[test]
    fn the_lab_guest_is_valid() {
        lab_vm().validate().unwrap();
    }

    #[test]
    fn several_nics_with_their_own_tap_and_mac_are_valid() {
        let mut v = lab_vm();
        v.nics.push(LaunchNic {
            mac: "52:54:00:e2:e0:0b".parse().unwrap(),
            tap: "vm-demo1".into(),
            ovn_port: "demo-1.node-a".into(),
        });
        v.validate().unwrap();
    }

    #[test]
    fn bad_values_are_rejected_with_what_is_allowed() {
        type Mutation = Box<dyn Fn(&mut VmSpec)>;
        let cases: Vec<(Mutation, &str)> = vec![
            (Box::new(|v| v.vcpus = 0), "use 1 to 255"),
            (Box::new(|v| v.vcpus = 1000), "use 1 to 255"),
            (Box::new(|v| v.memory_mib = 4), "MiB of memory"),
            (Box::new(|v| v.memory_mib = u64::MAX), "MiB of memory"),
            (Box::new(|v| v.name = "a b".into()), "name"),
            (Box::new(|v| v.name = String::new()), "name"),
            (
                Box::new(|v| v.nics[0].tap = "a-tap-name-too-long".into()),
                "tap",
            ),
            (
                Box::new(|v| v.nics[0].mac = "01:00:5e:00:00:01".parse().unwrap()),
                "unicast",
            ),
            (Box::new(|v| v.nics.clear()), "give 1 to 8"),
            (
                Box::new(|v| {
                    let n = v.nics[0].clone();
                    v.nics = vec![n; 9]
                }),
                "give 1 to 8",
            ),
            (
                Box::new(|v| {
                    let mut n = v.nics[0].clone();
                    n.mac = "52:54:00:e2:e0:0b".parse().unwrap();
                    v.nics.push(n)
                }),
                "both use tap vm-demo0",
            ),
            (
                Box::new(|v| {
                    let mut n = v.nics[0].clone();
                    n.tap = "vm-demo1".into();
                    v.nics.push(n)
                }),
                "both have MAC 52:54:00:e2:e0:0a",
            ),
            (Box::new(|v| v.serial_log = "serial.log".into()), "absolute"),
            (
                Box::new(|v| {
                    v.boot = LaunchBoot::Kernel {
                        kernel: "vmlinuz".into(),
                        initrd: None,
                        cmdline: String::new(),
                    }
                }),
                "kernel path",
            ),
            (
                Box::new(|v| {
                    v.boot = LaunchBoot::Disk {
                        image: "/img.vmdk".into(),
                        format: "vmdk".into(),
                        read_only: false,
                    }
                }),
                "qcow2 or raw",
            ),
        ];
        for (mutate, expect) in cases {
            let mut v = lab_vm();
            mutate(&mut v);
            let err = v.validate().unwrap_err().to_string();
            assert!(err.contains(expect), "{err:?} should mention {expect:?}");
        }
    }
}
