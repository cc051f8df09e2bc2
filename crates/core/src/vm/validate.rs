//! A VirtualMachine's spec, checked before anything is created for it (no Address, Secret or
//! pod): what the shim would refuse on the node (the same [`roam_shim_api::limits`]), what
//! Kubernetes would refuse in the objects made from it (a label value of its name), and what
//! roam allows to boot from.

use roam_contract::annotation::MAX_INTERFACES;
use roam_shim_api::limits::{
    MAX_MEMORY_MIB, MAX_NICS, MAX_VCPUS, MIN_MEMORY_MIB, boot_path_problem, cmdline_problem,
    disk_format_problem, domain_name_problem, outside_root_problem,
};

use crate::launcher::domain_name;
use roam_api::{Boot, VirtualMachineSpec};

/// The longest VM name: it is the value of its pods' `roam.dev/vm` label.
pub const MAX_NAME: usize = 63;

// a VM's interfaces are parsed as a pod's: the shim must take as many NICs as they allow
const _: () = assert!(MAX_INTERFACES <= MAX_NICS);

/// Every problem of VM `ns/name`'s spec that no retry can fix, each saying what is allowed;
/// empty: it may be started. Boot files must be under `image_root` when the admin set one.
/// Interfaces are checked later against the Networks ([`super::resolve_vm`]), node capacity
/// against the chosen node.
pub fn problems(
    ns: &str,
    name: &str,
    spec: &VirtualMachineSpec,
    image_root: Option<&str>,
) -> Vec<String> {
    let mut out = Vec::new();
    if name.len() > MAX_NAME {
        out.push(format!(
            "the name is {} characters; at most {MAX_NAME} (it is the value of its pods' \
             roam.dev/vm label)",
            name.len()
        ));
    }
    if let Some(p) = domain_name_problem(&domain_name(ns, name)) {
        out.push(format!(
            "{p}: namespace and name together are at most {} characters",
            roam_shim_api::limits::MAX_DOMAIN_NAME - 1
        ));
    }
    if !(1..=MAX_VCPUS).contains(&spec.cpu) {
        out.push(format!("cpu {}: use 1 to {MAX_VCPUS}", spec.cpu));
    }
    if !(MIN_MEMORY_MIB..=MAX_MEMORY_MIB).contains(&spec.memory_mib) {
        out.push(format!(
            "memoryMiB {}: use {MIN_MEMORY_MIB} to {MAX_MEMORY_MIB}",
            spec.memory_mib
        ));
    }
    if spec.interfaces.len() > MAX_INTERFACES {
        out.push(format!(
            "{} interfaces; a VM has at most {MAX_INTERFACES}",
            spec.interfaces.len()
        ));
    }
    match &spec.boot {
        Boot::Kernel {
            kernel,
            initrd,
            cmdline,
        } => {
            out.extend(boot_path_problem("kernel", kernel));
            out.extend(initrd.iter().filter_map(|i| boot_path_problem("initrd", i)));
            out.extend(cmdline.as_deref().and_then(cmdline_problem));
        }
        Boot::Disk { image, format } => {
            out.extend(boot_path_problem("disk image", image));
            out.extend(disk_format_problem(format));
        }
        Boot::Volume {
            claim_name,
            file,
            format,
        } => {
            out.extend(claim_name_problem(claim_name));
            out.extend(volume_file_problem(file));
            out.extend(disk_format_problem(format));
        }
    }
    if let Some(root) = image_root {
        let files: Vec<(&str, &str)> = match &spec.boot {
            Boot::Kernel { kernel, initrd, .. } => std::iter::once(("kernel", kernel.as_str()))
                .chain(initrd.iter().map(|i| ("initrd", i.as_str())))
                .collect(),
            Boot::Disk { image, .. } => vec![("disk image", image.as_str())],
            // on the tenant's own volume, not the nodes' image store
            Boot::Volume { .. } => vec![],
        };
        out.extend(
            files
                .into_iter()
                .filter_map(|(what, path)| outside_root_problem(what, path, root)),
        );
    }
    out
}

/// What is wrong with `name` as a PersistentVolumeClaim's name (a DNS subdomain).
pub fn claim_name_problem(name: &str) -> Option<String> {
    (!roam_api::is_dns_subdomain(name)).then(|| {
        format!(
            "volume claimName {name:?}: give the name of a PersistentVolumeClaim in the VM's \
             namespace (lowercase letters, digits, '-' and '.', at most 253)"
        )
    })
}

/// What is wrong with `file` as the image's path inside a volume: relative, plain (no `.`,
/// `..` or empty parts), no control characters.
pub fn volume_file_problem(file: &str) -> Option<String> {
    if file.starts_with('/') {
        return Some(format!(
            "volume file {file:?}: give the image's path relative to the volume's root"
        ));
    }
    boot_path_problem("volume file", &format!("/{file}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> VirtualMachineSpec {
        serde_json::from_value(serde_json::json!({
            "cpu": 1, "memoryMiB": 256,
            "boot": {"kernel": {"kernel": "/g/vmlinuz", "initrd": "/g/initramfs.gz",
                                "cmdline": "console=ttyS0"}},
        }))
        .unwrap()
    }

    fn refused(ns: &str, name: &str, s: &VirtualMachineSpec, needle: &str) {
        let p = problems(ns, name, s, None);
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(p[0].contains(needle), "{needle:?} not in {p:?}");
    }

    #[test]
    fn a_volume_is_a_claim_name_and_a_plain_relative_file() {
        let mut s = spec();
        s.boot =
            serde_json::from_value(serde_json::json!({"volume": {"claimName": "disk-1"}})).unwrap();
        assert_eq!(
            s.boot,
            Boot::Volume {
                claim_name: "disk-1".into(),
                file: "disk.img".into(),
                format: "qcow2".into()
            }
        );
        // the image store does not apply: the tenant's own volume
        assert!(problems("ns", "vm", &s, Some("/var/lib/roam/images")).is_empty());
        for (claim, file, format, needle) in [
            ("Disk_1", "disk.img", "qcow2", "claimName \"Disk_1\""),
            ("", "disk.img", "qcow2", "claimName"),
            ("d", "/etc/shadow", "qcow2", "relative to the volume's root"),
            ("d", "../x.img", "qcow2", "plain path"),
            ("d", "a//b.img", "qcow2", "plain path"),
            ("d", "", "qcow2", "plain path"),
            ("d", "x.img", "vmdk", "vmdk"),
        ] {
            s.boot = Boot::Volume {
                claim_name: claim.into(),
                file: file.into(),
                format: format.into(),
            };
            refused("ns", "vm", &s, needle);
        }
    }

    #[test]
    fn boot_files_outside_the_admins_image_store_are_refused() {
        let root = Some("/g");
        assert!(problems("ns", "demo", &spec(), root).is_empty());
        let p = problems("ns", "demo", &spec(), Some("/var/lib/roam/images"));
        assert_eq!(p.len(), 2, "kernel and initrd: {p:?}");
        assert!(
            p.iter().all(|p| p.contains("outside the image store")),
            "{p:?}"
        );
        let shadow = VirtualMachineSpec {
            boot: Boot::Disk {
                image: "/etc/shadow".into(),
                format: "raw".into(),
            },
            ..spec()
        };
        let p = problems("ns", "d", &shadow, Some("/var/lib/roam/images"));
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(p[0].contains("disk image path \"/etc/shadow\""), "{p:?}");
    }

    #[test]
    fn a_good_spec_has_no_problem() {
        assert!(problems("ns", "demo", &spec(), None).is_empty());
    }

    #[test]
    fn cpus_outside_1_to_255_are_refused() {
        for (cpu, ok) in [(0, false), (1, true), (255, true), (256, false)] {
            let mut s = spec();
            s.cpu = cpu;
            assert_eq!(problems("ns", "demo", &s, None).is_empty(), ok, "{cpu}");
        }
        let mut s = spec();
        s.cpu = 0;
        refused("ns", "demo", &s, "use 1 to 255");
    }

    #[test]
    fn memory_outside_32_mib_to_1_tib_is_refused() {
        for (mib, ok) in [
            (31, false),
            (32, true),
            (1 << 20, true),
            ((1 << 20) + 1, false),
        ] {
            let mut s = spec();
            s.memory_mib = mib;
            assert_eq!(problems("ns", "demo", &s, None).is_empty(), ok, "{mib}");
        }
    }

    #[test]
    fn more_than_8_interfaces_are_refused() {
        let mut s = spec();
        s.interfaces = (0..9)
            .map(|i| {
                serde_json::from_value(serde_json::json!({"name": format!("eth{i}")})).unwrap()
            })
            .collect();
        refused("ns", "demo", &s, "at most 8");
        s.interfaces.pop();
        assert!(problems("ns", "demo", &s, None).is_empty());
    }

    #[test]
    fn a_name_longer_than_a_label_value_is_refused() {
        let p = problems("n", &"v".repeat(64), &spec(), None);
        assert!(p[0].contains("at most 63"), "{p:?}");
        assert!(problems("n", &"v".repeat(60), &spec(), None).is_empty());
    }

    #[test]
    fn namespace_and_name_longer_than_a_domain_name_are_refused() {
        refused(&"n".repeat(30), &"v".repeat(33), &spec(), "together");
        assert!(problems(&"n".repeat(30), &"v".repeat(32), &spec(), None).is_empty());
    }

    #[test]
    fn boot_paths_that_are_not_plain_absolute_paths_are_refused() {
        let kernel = |k: &str, i: Option<&str>, c: Option<&str>| VirtualMachineSpec {
            boot: Boot::Kernel {
                kernel: k.into(),
                initrd: i.map(Into::into),
                cmdline: c.map(Into::into),
            },
            ..spec()
        };
        refused("ns", "d", &kernel("vmlinuz", None, None), "kernel path");
        refused(
            "ns",
            "d",
            &kernel("/g/../etc/shadow", None, None),
            "plain path",
        );
        refused(
            "ns",
            "d",
            &kernel("/g/k", Some("/g//i"), None),
            "initrd path",
        );
        refused(
            "ns",
            "d",
            &kernel("/g/k", None, Some("a\ninit=/bin/sh")),
            "one line",
        );
        let disk = |image: &str, format: &str| VirtualMachineSpec {
            boot: Boot::Disk {
                image: image.into(),
                format: format.into(),
            },
            ..spec()
        };
        assert!(problems("ns", "d", &disk("/images/d.qcow2", "qcow2"), None).is_empty());
        refused(
            "ns",
            "d",
            &disk("images/d.qcow2", "qcow2"),
            "disk image path",
        );
        refused("ns", "d", &disk("/images/d.vmdk", "vmdk"), "qcow2 or raw");
    }

    #[test]
    fn every_problem_is_reported_at_once() {
        let mut s = spec();
        s.cpu = 0;
        s.memory_mib = 1;
        assert_eq!(problems("ns", "demo", &s, None).len(), 2);
    }
}
