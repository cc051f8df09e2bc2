//! The shim's configuration: its command line ([`roam_shim_api::launch`], which the controller
//! renders into a launcher pod) and/or a JSON config file (`--config FILE`, the same keys
//! with `_` for `-`; a flag overrides the file). Everything is checked — the VM spec, that
//! the kernel/initrd/disk exist, the token file, the addresses — before the shim touches
//! libvirt, OVS or the kernel: a bad config creates nothing.
//!
//! The API token is given either as a file holding it (`--token-file`) or as its SHA-256 digest
//! (`--token-sha256`, 64 hex digits): the shim only checks tokens, so the digest is enough, and
//! a launcher pod that carries it mounts no Secret (see [`roam_shim_api::token`]).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use roam_shim_api::launch::{LaunchArgs, LaunchBoot, LaunchToken, flag};
use roam_shim_api::token::TokenDigest;

use crate::domain::Accel;
use crate::spec::VmSpec;
use crate::{Error, Result};

pub use roam_shim_api::launch::{Migration, Mode};

/// The checked configuration.
#[derive(Clone, Debug)]
pub struct ShimConfig {
    /// The VM.
    pub vm: VmSpec,
    /// This node's name (the OVN chassis).
    pub node: String,
    /// This node's libvirtd, for the shim.
    pub libvirt_uri: String,
    /// How a VM migrates between this node and another: plain TCP, or through the shims'
    /// mutual-TLS proxies ([`crate::proxy`]).
    pub migration: Migration,
    /// This node's Open_vSwitch database (`unix:PATH` or `tcp:HOST:PORT`).
    pub ovs_db: String,
    /// The integration bridge.
    pub bridge: String,
    /// The API's listen address.
    pub listen: SocketAddr,
    /// The digest of the API token (of the token file's token, or `--token-sha256`).
    pub token: TokenDigest,
    /// Where the shim records that it booted its VM.
    pub state_file: PathBuf,
    /// Boot or wait for an incoming migration.
    pub mode: Mode,
    /// TCG or KVM.
    pub accel: Accel,
    /// Who runs this shim (a launcher pod's name), echoed in the status: a client tells this
    /// shim from an older one of the same VM on the same node by it.
    pub instance: Option<String>,
    /// The admin's image store: every boot file must resolve under it (`--image-root`).
    pub image_root: Option<PathBuf>,
    /// The node's roam identity (`--pki-dir`): the API over mutual TLS, and a migration's
    /// target reached over it.
    pub pki_dir: Option<PathBuf>,
}

impl ShimConfig {
    /// Each NIC's tap with the OVN port it is bound to, in order.
    pub fn plumbing(&self) -> impl Iterator<Item = (&str, &str)> {
        self.vm
            .nics
            .iter()
            .map(|n| (n.tap.as_str(), n.ovn_port.as_str()))
    }
}

fn config_err(problem: impl Into<String>) -> Error {
    Error::Config(problem.into())
}

/// Parse a config file's JSON (if any) overridden by flags (pure).
pub fn parse_args(file_json: Option<&str>, flags: &[String]) -> Result<LaunchArgs> {
    Ok(match file_json {
        Some(text) => LaunchArgs::parse_with_file(text, flags)?,
        None => LaunchArgs::parse(flags)?,
    })
}

/// Turn the launch arguments into a [`ShimConfig`] without I/O: the VM spec and the token.
/// A token file is read by the caller's `read_token`.
fn build(args: LaunchArgs, read_token: impl FnOnce(&Path) -> Result<String>) -> Result<ShimConfig> {
    let vm = VmSpec {
        name: args.name,
        vcpus: args.vcpus,
        memory_mib: args.memory_mib,
        boot: args.boot,
        nics: args.nics,
        serial_log: args.serial_log,
    };
    vm.validate()?;
    let token = match &args.token {
        LaunchToken::File(file) => TokenDigest::of(&read_token(file)?),
        LaunchToken::Sha256(digest) => digest.clone(),
    };
    Ok(ShimConfig {
        vm,
        node: args.node,
        libvirt_uri: args.libvirt_uri,
        migration: args.migration,
        ovs_db: args.ovs_db.to_string(),
        bridge: args.bridge,
        listen: args.listen,
        token,
        state_file: args.state_file,
        mode: args.mode,
        accel: if args.kvm { Accel::Kvm } else { Accel::Tcg },
        instance: args.instance,
        image_root: args.image_root,
        pki_dir: args.pki_dir,
    })
}

/// The token in a token file: its content without surrounding whitespace; empty is an error.
pub fn parse_token(path: &Path, text: &str) -> Result<String> {
    let t = text.trim();
    if t.is_empty() {
        return Err(config_err(format!(
            "token file {} is empty: put the VM's API token in it",
            path.display()
        )));
    }
    if t.chars().any(char::is_whitespace) {
        return Err(config_err(format!(
            "token file {}: the token must be one word",
            path.display()
        )));
    }
    Ok(t.to_string())
}

/// Load and check the configuration from the command line (after the program name):
/// `--config FILE` and/or flags. Reads the config file, the token file (if one is given),
/// and checks that the boot files exist; touches nothing else.
pub fn load(args: &[String]) -> Result<ShimConfig> {
    let mut file = None;
    let mut flags = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        if a == flag::CONFIG {
            let p = it
                .next()
                .ok_or_else(|| config_err("--config needs a file"))?;
            file = Some(
                std::fs::read_to_string(p)
                    .map_err(|e| config_err(format!("cannot read the config file {p}: {e}")))?,
            );
        } else {
            flags.push(a.clone());
        }
    }
    let cfg = build(parse_args(file.as_deref(), &flags)?, |p| {
        let text = std::fs::read_to_string(p)
            .map_err(|e| config_err(format!("cannot read the token file {}: {e}", p.display())))?;
        parse_token(p, &text)
    })?;
    check_files(&cfg.vm, cfg.image_root.as_deref())?;
    if let Some(dir) = cfg.state_file.parent()
        && !dir.is_dir()
    {
        return Err(config_err(format!(
            "state_file {}: directory {} does not exist",
            cfg.state_file.display(),
            dir.display()
        )));
    }
    Ok(cfg)
}

/// The boot files exist and are regular files, and, with the admin's image store `root`,
/// resolve (symbolic links followed) to files under it: a link inside the store that leads
/// out of it is refused, as is a path that only looks inside. A disk image is opened and
/// checked as [`crate::disk::open`] does (no link followed, its header read): the same
/// verdict `roam-shim libvirtd` reaches before it pins the image for QEMU.
pub fn check_files(vm: &VmSpec, root: Option<&Path>) -> Result<()> {
    let files: Vec<(&str, &Path)> = match &vm.boot {
        LaunchBoot::Kernel { kernel, initrd, .. } => std::iter::once(("kernel", kernel.as_path()))
            .chain(initrd.iter().map(|i| ("initrd", i.as_path())))
            .collect(),
        LaunchBoot::Disk { image, format, .. } => {
            let root = root.unwrap_or(Path::new("/"));
            crate::disk::open(root, image, format, &roam_disk_image::Limits::default())?;
            return Ok(());
        }
    };
    let invalid = |problem: String| Error::InvalidSpec {
        vm: vm.name.clone(),
        problem,
    };
    let root = match root {
        None => None,
        Some(r) => Some(std::fs::canonicalize(r).map_err(|e| {
            invalid(format!(
                "the image store {} cannot be read on this node ({e}): the administrator's \
                 --image-root must exist on every node",
                r.display()
            ))
        })?),
    };
    for (what, p) in files {
        // a link whose target is not here (in a launcher: most often outside the mounted
        // store) says where it leads, not only that nothing is there
        if let Ok(to) = std::fs::read_link(p)
            && !p.exists()
        {
            return Err(invalid(format!(
                "{what} {} is a symbolic link to {}, which does not exist on this node{}",
                p.display(),
                to.display(),
                match &root {
                    Some(r) => format!(
                        " (only the image store {} is there: a link out of it is refused)",
                        r.display()
                    ),
                    None => String::new(),
                }
            )));
        }
        if !p.is_file() {
            return Err(invalid(format!(
                "{what} {} does not exist or is not a file: give the path of the {what} on this node",
                p.display()
            )));
        }
        if let Some(root) = &root {
            let real = std::fs::canonicalize(p)
                .map_err(|e| invalid(format!("{what} {}: {e}", p.display())))?;
            if !real.starts_with(root) {
                return Err(invalid(format!(
                    "{what} {} resolves to {}, outside the image store {}: boot files must be \
                     in the store (a symbolic link out of it is refused)",
                    p.display(),
                    real.display(),
                    root.display()
                )));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags(s: &[&str]) -> Vec<String> {
        s.iter().map(|s| s.to_string()).collect()
    }

    pub(crate) fn full_flags() -> Vec<String> {
        flags(&[
            "--name",
            "vm1",
            "--vcpus",
            "1",
            "--memory-mib",
            "256",
            "--kernel",
            "/k",
            "--initrd",
            "/i",
            "--cmdline",
            "console=ttyS0",
            "--mac",
            "52:54:00:00:00:01",
            "--tap",
            "h7tap",
            "--ovn-port",
            "vm1.node-a",
            "--serial-log",
            "/var/log/vm1.log",
            "--node",
            "node-a",
            "--libvirt-uri",
            "qemu:///system",
            "--peer-libvirt-uri",
            "qemu+tcp://node-a/system",
            "--migration-uri",
            "tcp://10.0.0.11",
            "--ovs-db",
            "unix:/run/openvswitch/db.sock",
            "--listen",
            "127.0.0.1:17001",
            "--token-file",
            "/secret/token",
            "--state-file",
            "/var/lib/roam/vm1.json",
            "--mode",
            "boot",
        ])
    }

    fn build_ok(args: LaunchArgs) -> Result<ShimConfig> {
        build(args, |_| Ok("tok".into()))
    }

    fn ports(c: &ShimConfig) -> Vec<&str> {
        c.plumbing().map(|(_, port)| port).collect()
    }

    #[test]
    fn flags_make_a_config() {
        let c = build_ok(parse_args(None, &full_flags()).unwrap()).unwrap();
        assert_eq!(c.vm.name, "vm1");
        assert_eq!(c.vm.memory_mib, 256);
        assert_eq!(c.bridge, "br-int");
        assert_eq!(c.mode, Mode::Boot);
        assert_eq!(c.accel, Accel::Tcg);
        assert!(c.token.matches("tok"));
        assert!(!c.token.matches("tok2"));
        assert_eq!(c.listen.port(), 17001);
        assert_eq!(c.instance, None);
        let mut f = full_flags();
        f.extend(flags(&["--instance", "vm1-launcher"]));
        let c = build_ok(parse_args(None, &f).unwrap()).unwrap();
        assert_eq!(c.instance.as_deref(), Some("vm1-launcher"));
    }

    #[test]
    fn a_flag_overrides_the_file() {
        let file = r#"{"name":"vm1","vcpus":2,"memory_mib":128}"#;
        let mut f = full_flags();
        // drop --vcpus 1 from the flags: the file's 2 stays
        let i = f.iter().position(|x| x == "--vcpus").unwrap();
        f.drain(i..i + 2);
        f.extend(flags(&["--memory-mib", "512", "--kvm"]));
        let c = build_ok(parse_args(Some(file), &f).unwrap()).unwrap();
        assert_eq!(c.vm.vcpus, 2);
        assert_eq!(c.vm.memory_mib, 512);
        assert_eq!(c.accel, Accel::Kvm);
    }

    #[test]
    fn bad_configs_are_rejected_with_the_reason() {
        let cases: Vec<(Vec<&str>, &str)> = vec![
            (vec!["--vcpus", "0"], "use 1 to 255"),
            (vec!["--memory-mib", "1"], "MiB of memory"),
            (vec!["--vcpus", "two"], "not a number"),
            (vec!["--bogus", "x"], "--bogus: unknown flag"),
            (vec!["--mac", "zz"], "--mac: bad mac"),
            (vec!["--migration-uri", "10.0.0.1"], "tcp://HOST"),
            (vec!["--ovs-db", "/run/db.sock"], "unix:PATH"),
            (vec!["--listen", "localhost"], "IP:PORT"),
            (
                vec!["--mode", "fly"],
                "--mode: \"fly\": use boot (boot the VM here) or incoming",
            ),
            (vec!["--disk", "/d.qcow2"], "exactly one boot source"),
            (vec!["--state-file", "rel.json"], "absolute"),
            (
                vec!["--ovn-port", ""],
                "--ovn-port: the OVN port of tap \"h7tap\" is empty",
            ),
            (vec!["--nics", "52:54:00:00:00:02/t2/p2"], "not both"),
        ];
        for (extra, expect) in cases {
            let mut f = full_flags();
            f.extend(flags(&extra));
            let err = parse_args(None, &f)
                .and_then(build_ok)
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(expect),
                "{extra:?}: {err:?} should mention {expect:?}"
            );
        }
        let err = parse_args(None, &flags(&["--name", "x"]))
            .and_then(build_ok)
            .unwrap_err()
            .to_string();
        assert!(err.contains("--vcpus: is missing"), "{err}");
        assert!(parse_args(Some("[1]"), &[]).is_err());
        assert!(parse_args(None, &flags(&["name"])).is_err());
        assert!(parse_args(None, &flags(&["--name"])).is_err());
    }

    fn without_single_nic(f: &mut Vec<String>) {
        for k in ["--mac", "--tap", "--ovn-port"] {
            let i = f.iter().position(|x| x == k).unwrap();
            f.drain(i..i + 2);
        }
    }

    #[test]
    fn several_nics_in_order() {
        let mut f = full_flags();
        without_single_nic(&mut f);
        f.extend(flags(&[
            "--nics",
            "52:54:00:00:00:01/h7tap/vm1.node-a, 52:54:00:00:00:02/h7tap1/vlan-port",
        ]));
        let c = build_ok(parse_args(None, &f).unwrap()).unwrap();
        let taps: Vec<&str> = c.vm.nics.iter().map(|n| n.tap.as_str()).collect();
        assert_eq!(taps, ["h7tap", "h7tap1"]);
        assert_eq!(c.vm.nics[1].mac.to_string(), "52:54:00:00:00:02");
        assert_eq!(ports(&c), ["vm1.node-a", "vlan-port"]);
        // the single-NIC flags are one NIC
        let c = build_ok(parse_args(None, &full_flags()).unwrap()).unwrap();
        assert_eq!(c.vm.nics.len(), 1);
        assert_eq!(ports(&c), ["vm1.node-a"]);
        // a config file lists objects
        let file = r#"{"nics":[{"mac":"52:54:00:00:00:01","tap":"a","ovn_port":"pa"},
                              {"mac":"52:54:00:00:00:02","tap":"b","ovn_port":"pb"}]}"#;
        let c = build_ok(parse_args(Some(file), &f[..f.len() - 2]).unwrap()).unwrap();
        assert_eq!(ports(&c), ["pa", "pb"]);
    }

    #[test]
    fn bad_nic_lists_are_rejected_with_the_reason() {
        for (nics, expect) in [
            ("52:54:00:00:00:01/t", "use MAC/TAP/OVN-PORT"),
            (
                "52:54:00:00:00:01/t/p,52:54:00:00:00:01/u/q",
                "both have MAC",
            ),
            (
                "52:54:00:00:00:01/t/p,52:54:00:00:00:02/t/q",
                "both use tap t",
            ),
            (
                "52:54:00:00:00:01/t/ ",
                "the OVN port of tap \"t\" is empty",
            ),
            ("zz/t/p", "mac"),
            ("", "give 1 to 8"),
        ] {
            let mut f = full_flags();
            without_single_nic(&mut f);
            f.extend(flags(&["--nics", nics]));
            let err = parse_args(None, &f)
                .and_then(build_ok)
                .unwrap_err()
                .to_string();
            assert!(
                err.contains(expect),
                "{nics:?}: {err:?} should mention {expect:?}"
            );
        }
        let mut f = full_flags();
        let i = f.iter().position(|x| x == "--tap").unwrap();
        f.drain(i..i + 2);
        let err = parse_args(None, &f)
            .and_then(build_ok)
            .unwrap_err()
            .to_string();
        assert!(err.contains("--mac, --tap and --ovn-port"), "{err}");
    }

    #[test]
    fn tokens() {
        let p = Path::new("/t");
        assert_eq!(parse_token(p, " abc\n").unwrap(), "abc");
        assert!(parse_token(p, "\n").is_err());
        assert!(parse_token(p, "a b").is_err());
    }

    #[test]
    fn a_token_digest_instead_of_a_token_file() {
        let digest = TokenDigest::of("tok").to_string();
        let mut f = full_flags();
        let i = f.iter().position(|x| x == "--token-file").unwrap();
        f.drain(i..i + 2);
        f.extend(flags(&["--token-sha256", &digest]));
        let c = build(parse_args(None, &f).unwrap(), |_| {
            panic!("no token file to read")
        })
        .unwrap();
        assert!(c.token.matches("tok"));
        assert!(!c.token.matches(&digest), "the digest is not the token");

        let bad = |extra: &[&str], without_file: bool| {
            let mut f = full_flags();
            if without_file {
                let i = f.iter().position(|x| x == "--token-file").unwrap();
                f.drain(i..i + 2);
            }
            f.extend(flags(extra));
            parse_args(None, &f)
                .and_then(build_ok)
                .unwrap_err()
                .to_string()
        };
        let both = bad(&["--token-sha256", &digest], false);
        assert!(both.contains("exactly one of --token-file"), "{both}");
        let neither = bad(&[], true);
        assert!(neither.contains("exactly one of --token-file"), "{neither}");
        let short = bad(&["--token-sha256", "abcd"], true);
        assert!(
            short.contains("--token-sha256: ") && short.contains("64 hexadecimal"),
            "{short}"
        );
    }

    #[test]
    fn a_missing_kernel_is_named() {
        let c = build_ok(parse_args(None, &full_flags()).unwrap()).unwrap();
        let err = check_files(&c.vm, None).unwrap_err().to_string();
        assert!(err.contains("kernel /k does not exist"), "{err}");
    }

    #[test]
    fn a_boot_file_that_resolves_outside_the_image_store_is_refused() {
        let dir = std::env::temp_dir().join(format!("roam-image-root-{}", std::process::id()));
        let store = dir.join("images");
        std::fs::create_dir_all(&store).unwrap();
        let outside = dir.join("secret");
        std::fs::write(&outside, "not a kernel").unwrap();
        std::fs::write(store.join("vmlinuz"), "kernel").unwrap();
        std::os::unix::fs::symlink(&outside, store.join("escape")).unwrap();
        std::os::unix::fs::symlink("vmlinuz", store.join("alias")).unwrap();
        std::os::unix::fs::symlink("/nowhere/vmlinuz", store.join("dangling")).unwrap();
        let vm = |kernel: PathBuf| VmSpec {
            boot: LaunchBoot::Kernel {
                kernel,
                initrd: None,
                cmdline: String::new(),
            },
            ..build_ok(parse_args(None, &full_flags()).unwrap())
                .unwrap()
                .vm
        };
        check_files(&vm(store.join("vmlinuz")), Some(&store)).unwrap();
        check_files(&vm(store.join("alias")), Some(&store)).expect("a link within the store");
        check_files(&vm(outside.clone()), None).expect("no store: any file");
        for (kernel, says) in [
            (store.join("escape"), "resolves to"),
            (outside.clone(), "outside the image store"),
            (
                store.join("dangling"),
                "is a symbolic link to /nowhere/vmlinuz, which does not exist on this node (only the image store",
            ),
        ] {
            let e = check_files(&vm(kernel.clone()), Some(&store))
                .unwrap_err()
                .to_string();
            assert!(e.contains(says), "{kernel:?}: {e}");
        }
        let e = check_files(&vm(store.join("vmlinuz")), Some(&dir.join("none")))
            .unwrap_err()
            .to_string();
        assert!(e.contains("cannot be read on this node"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
