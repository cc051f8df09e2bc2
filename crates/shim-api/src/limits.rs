//! What a VM may be, as numbers and rules both sides check: the controller before it creates
//! anything for a VirtualMachine, the shim before it defines a domain. One definition, so
//! the controller never creates a launcher the shim would refuse.

/// Smallest memory accepted: a floor against a mistyped size, not a promise that a guest
/// boots in it.
pub const MIN_MEMORY_MIB: u64 = 32;
/// Largest memory accepted (1 TiB).
pub const MAX_MEMORY_MIB: u64 = 1 << 20;
/// Most vCPUs accepted (QEMU's `pc` machine limit).
pub const MAX_VCPUS: u32 = 255;
/// Most NICs accepted (each takes a PCI slot of the `pc` machine; 8 is plenty for a VM on a
/// few networks).
pub const MAX_NICS: usize = 8;
/// Longest domain name.
pub const MAX_DOMAIN_NAME: usize = 63;
/// Longest kernel command line (Linux's `COMMAND_LINE_SIZE` on x86, with its NUL).
pub const MAX_CMDLINE: usize = 2047;
/// Longest boot file path.
pub const MAX_PATH: usize = 4096;

/// What is wrong with a domain name, if anything.
pub fn domain_name_problem(name: &str) -> Option<String> {
    let ok = !name.is_empty()
        && name.len() <= MAX_DOMAIN_NAME
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.');
    (!ok).then(|| {
        format!(
            "domain name {name:?}: use 1-{MAX_DOMAIN_NAME} characters from a-z, A-Z, 0-9, '-', '_', '.'"
        )
    })
}

/// What is wrong with a boot file's path (`what`: `kernel`, `initrd`, `disk image`), if
/// anything: it must be absolute and plain — no `.` or `..` component, no empty one, no
/// control character — so what is checked is what is opened.
pub fn boot_path_problem(what: &str, path: &str) -> Option<String> {
    let problem = if !path.starts_with('/') {
        "must be absolute"
    } else if path.len() > MAX_PATH {
        "is longer than 4096 bytes"
    } else if path.chars().any(char::is_control) {
        "holds a control character"
    } else if path[1..]
        .split('/')
        .any(|c| c.is_empty() || c == "." || c == "..")
    {
        "must be a plain path to a file (no '.', '..', '//' or trailing '/')"
    } else {
        return None;
    };
    Some(format!("{what} path {path:?} {problem}"))
}

/// What is wrong with a boot file's path (`what`) given the admin's image store `root`, if
/// anything (lexical: both are plain absolute paths, see [`boot_path_problem`]; the shim
/// also resolves symbolic links on the node).
pub fn outside_root_problem(what: &str, path: &str, root: &str) -> Option<String> {
    let root = root.trim_end_matches('/');
    let inside = path
        .strip_prefix(root)
        .is_some_and(|rest| rest.starts_with('/') && rest.len() > 1);
    (!inside).then(|| {
        format!(
            "{what} path {path:?} is outside the image store {root}: boot files must be under \
             the directory the administrator set (roam-controller --image-root)"
        )
    })
}

/// What is wrong with a kernel command line, if anything.
pub fn cmdline_problem(cmdline: &str) -> Option<String> {
    if cmdline.chars().any(char::is_control) {
        Some("the kernel command line must be one line without control characters".into())
    } else if cmdline.len() > MAX_CMDLINE {
        Some(format!(
            "the kernel command line is {} bytes; Linux takes at most {MAX_CMDLINE}",
            cmdline.len()
        ))
    } else {
        None
    }
}

/// Longest Linux interface name (`IFNAMSIZ` less its NUL).
pub const MAX_TAP_NAME: usize = 15;
/// Longest OVN logical port name roam gives (an Address's name, a `.` and a node's name).
pub const MAX_OVN_PORT: usize = 253 + 1 + 253;

/// What is wrong with a tap's name, if anything: Linux's rules for an interface name
/// (1-15 bytes, not `.` or `..`, no `/`, `:` or whitespace) and no `,` (the `--nics`
/// separator).
pub fn tap_name_problem(tap: &str) -> Option<String> {
    let ok = !tap.is_empty()
        && tap.len() <= MAX_TAP_NAME
        && tap != "."
        && tap != ".."
        && !tap
            .chars()
            .any(|c| c == '/' || c == ':' || c == ',' || c.is_whitespace() || c.is_control());
    (!ok).then(|| {
        format!(
            "tap {tap:?}: an interface name has 1-{MAX_TAP_NAME} bytes, is not '.' or '..', \
             and holds no '/', ':', ',' or whitespace"
        )
    })
}

/// What is wrong with a node's name, if anything: a DNS subdomain (lowercase letters, digits,
/// `-` and `.`, at most 253 bytes) — the common name of its roam certificate.
pub fn node_name_problem(node: &str) -> Option<String> {
    let ok = !node.is_empty()
        && node.len() <= 253
        && node
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.');
    (!ok).then(|| {
        format!("node {node:?}: a node's name has 1-253 lowercase letters, digits, '-' or '.'")
    })
}

/// What is wrong with an OVN logical port's name, if anything: not empty, at most
/// [`MAX_OVN_PORT`] bytes, no `/`, `,` (the `--nics` separators), whitespace or control
/// character.
pub fn ovn_port_problem(port: &str) -> Option<String> {
    let ok = !port.is_empty()
        && port.len() <= MAX_OVN_PORT
        && !port
            .chars()
            .any(|c| c == '/' || c == ',' || c.is_whitespace() || c.is_control());
    (!ok).then(|| {
        format!("OVN port {port:?}: use 1-{MAX_OVN_PORT} bytes without '/', ',' or whitespace")
    })
}

/// What is wrong with a disk format, if anything.
pub fn disk_format_problem(format: &str) -> Option<String> {
    (format != "qcow2" && format != "raw")
        .then(|| format!("disk format {format:?}: use qcow2 or raw"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boot_paths_are_absolute_and_plain() {
        for ok in [
            "/var/cache/roam/guest/vmlinuz",
            "/a",
            "/images/disk-1.qcow2",
        ] {
            assert_eq!(boot_path_problem("kernel", ok), None, "{ok}");
        }
        for (bad, why) in [
            ("vmlinuz", "absolute"),
            ("/images/../etc/shadow", "plain"),
            ("/images/./disk", "plain"),
            ("/images//disk", "plain"),
            ("/images/", "plain"),
            ("/", "plain"),
            ("/images/disk\n", "control"),
        ] {
            let p = boot_path_problem("disk image", bad).expect(bad);
            assert!(p.contains(why), "{bad}: {p}");
        }
        assert!(boot_path_problem("kernel", &format!("/{}", "a".repeat(MAX_PATH))).is_some());
    }

    #[test]
    fn taps_are_interface_names_and_ports_carry_no_separator() {
        for ok in ["rm1a2b3c4d5e6f7", "tap0", "a.b-c_d"] {
            assert_eq!(tap_name_problem(ok), None, "{ok}");
        }
        for bad in [
            "",
            ".",
            "..",
            "a/b",
            "a:b",
            "a,b",
            "a b",
            "tap0 ",
            "0123456789abcdef",
        ] {
            assert!(tap_name_problem(bad).is_some(), "{bad:?}");
        }
        for ok in ["ns_vm-eth0", "demo-eth0.node-a", "vlan-port"] {
            assert_eq!(ovn_port_problem(ok), None, "{ok}");
        }
        let long = "p".repeat(MAX_OVN_PORT + 1);
        for bad in ["", "a/b", "a,b", "p ", " p", "a\tb", long.as_str()] {
            assert!(ovn_port_problem(bad).is_some(), "{bad:?}");
        }
    }

    #[test]
    fn boot_files_must_be_in_the_image_store() {
        let root = "/var/lib/roam/images";
        for ok in [
            "/var/lib/roam/images/vmlinuz",
            "/var/lib/roam/images/a/disk.qcow2",
        ] {
            assert_eq!(outside_root_problem("kernel", ok, root), None, "{ok}");
            assert_eq!(
                outside_root_problem("kernel", ok, "/var/lib/roam/images/"),
                None
            );
        }
        for bad in [
            "/etc/shadow",
            "/var/lib/roam/images",
            "/var/lib/roam/images/",
            "/var/lib/roam/images-evil/x",
            "/var/lib/roam",
        ] {
            let p = outside_root_problem("disk image", bad, root).expect(bad);
            assert!(p.contains("outside the image store"), "{p}");
        }
    }

    #[test]
    fn command_lines_are_one_line_within_linuxs_limit() {
        assert_eq!(cmdline_problem("console=ttyS0 quiet"), None);
        assert!(cmdline_problem("console=ttyS0\ninit=/bin/sh").is_some());
        assert!(cmdline_problem(&"a".repeat(MAX_CMDLINE)).is_none());
        assert!(cmdline_problem(&"a".repeat(MAX_CMDLINE + 1)).is_some());
    }

    #[test]
    fn domain_names_and_formats() {
        assert_eq!(domain_name_problem("ns_demo"), None);
        assert!(domain_name_problem("").is_some());
        assert!(domain_name_problem(&"a".repeat(64)).is_some());
        assert!(domain_name_problem("a/b").is_some());
        assert_eq!(disk_format_problem("raw"), None);
        assert!(disk_format_problem("vmdk").is_some());
    }
}
