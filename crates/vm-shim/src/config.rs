//! The shim's configuration: a JSON file (`--config FILE`) and/or flags (`--KEY VALUE`, the
//! same keys with `-` for `_`; a flag overrides the file). Everything is checked — the VM
//! spec, that the kernel/initrd/disk exist, the token file, the addresses — before the shim
//! touches libvirt, OVS or the kernel: a bad config creates nothing.
//!
//! The API token is given either as a file holding it (`--token-file`) or as its SHA-256 digest
//! (`--token-sha256`, 64 hex digits): the shim only checks tokens, so the digest is enough, and
//! a launcher pod that carries it mounts no Secret (see [`roam_shim_api::token`]).
//!
//! ```text
//! roam-shim --config /etc/roam/vm.json --listen 0.0.0.0:17001
//! roam-shim --name vm1 --vcpus 1 --memory-mib 256 --kernel /guest/vmlinuz \
//!   --initrd /guest/initramfs.gz --cmdline 'console=ttyS0' --mac 52:54:00:00:00:01 \
//!   --tap vm1-tap --ovn-port vm1 --serial-log /var/log/vm1.log --node node-a \
//!   --libvirt-uri qemu:///system --peer-libvirt-uri qemu+tcp://node-a/system \
//!   --migration-uri tcp://10.0.0.11 --ovs-db unix:/run/openvswitch/db.sock \
//!   --listen 0.0.0.0:17001 --token-file /secret/token --state-file /var/lib/roam/vm1.json \
//!   --mode boot --instance vm1-launcher
//! ```
//!
//! A VM with several NICs gives `--nics MAC/TAP/OVN-PORT,MAC/TAP/OVN-PORT,…` (in the guest's
//! order: `eth0`, `eth1`, …; in a config file also a list of `{"mac","tap","ovn_port"}`)
//! instead of `--mac`, `--tap` and `--ovn-port`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::{Map, Value};

use roam_shim_api::token::TokenDigest;

use crate::domain::Accel;
use crate::spec::{Boot, Nic, VmSpec};
use crate::{Error, Result};

/// What the shim does at start when its domain does not run on this node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Boot the VM here — once in the shim's life (recorded in the state file), so a shim
    /// restarted after its VM migrated away never boots a second copy.
    Boot,
    /// Wait for an incoming migration (a migration's target).
    Incoming,
}

/// The config as written (file and flags): flat, every key a flag.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    name: String,
    vcpus: u32,
    memory_mib: u64,
    kernel: Option<PathBuf>,
    initrd: Option<PathBuf>,
    #[serde(default)]
    cmdline: String,
    disk: Option<PathBuf>,
    disk_format: Option<String>,
    mac: Option<String>,
    tap: Option<String>,
    ovn_port: Option<String>,
    nics: Option<RawNics>,
    serial_log: PathBuf,
    node: String,
    libvirt_uri: String,
    peer_libvirt_uri: String,
    migration_uri: String,
    ovs_db: String,
    #[serde(default = "default_bridge")]
    bridge: String,
    listen: String,
    #[serde(default)]
    token_file: Option<PathBuf>,
    #[serde(default)]
    token_sha256: Option<String>,
    state_file: PathBuf,
    mode: Mode,
    #[serde(default)]
    kvm: bool,
    #[serde(default)]
    instance: Option<String>,
}

/// `nics`: the flag's `MAC/TAP/OVN-PORT,…` or, in a file, a list of objects.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
enum RawNics {
    Text(String),
    List(Vec<RawNic>),
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawNic {
    mac: String,
    tap: String,
    ovn_port: String,
}

/// The NICs of a config: `nics`, or the one NIC of `mac` + `tap` + `ovn_port` (pure).
fn raw_nics(raw: &RawConfig) -> Result<Vec<RawNic>> {
    let single = [&raw.mac, &raw.tap, &raw.ovn_port];
    match &raw.nics {
        Some(_) if single.iter().any(|f| f.is_some()) => Err(config_err(
            "give the NICs either as nics or as mac + tap + ovn_port, not both",
        )),
        Some(RawNics::List(list)) => Ok(list.clone()),
        Some(RawNics::Text(text)) => text
            .split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .map(|e| match e.split('/').collect::<Vec<_>>().as_slice() {
                [mac, tap, port] => Ok(RawNic {
                    mac: mac.to_string(),
                    tap: tap.to_string(),
                    ovn_port: port.to_string(),
                }),
                _ => Err(config_err(format!(
                    "nics entry {e:?}: use MAC/TAP/OVN-PORT (entries separated by commas)"
                ))),
            })
            .collect(),
        None => match single {
            [Some(mac), Some(tap), Some(ovn_port)] => Ok(vec![RawNic {
                mac: mac.clone(),
                tap: tap.clone(),
                ovn_port: ovn_port.clone(),
            }]),
            _ => Err(config_err(
                "give the VM's NIC: mac, tap and ovn_port (or nics for several)",
            )),
        },
    }
}

fn default_bridge() -> String {
    "br-int".into()
}

/// The checked configuration.
#[derive(Clone, Debug)]
pub struct ShimConfig {
    /// The VM.
    pub vm: VmSpec,
    /// Per NIC of `vm.nics` (same order), the OVN logical port its tap is bound to
    /// (`external_ids:iface-id`).
    pub ovn_ports: Vec<String>,
    /// This node's name (the OVN chassis).
    pub node: String,
    /// This node's libvirtd, for the shim.
    pub libvirt_uri: String,
    /// This node's libvirtd as another node's libvirtd reaches it (peer-to-peer migration).
    pub peer_libvirt_uri: String,
    /// Where an incoming migration stream connects (`tcp://HOST`).
    pub migration_uri: String,
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
}

impl ShimConfig {
    /// Each NIC's tap with the OVN port it is bound to, in order.
    pub fn plumbing(&self) -> impl Iterator<Item = (&str, &str)> {
        self.vm
            .nics
            .iter()
            .map(|n| n.tap.as_str())
            .zip(self.ovn_ports.iter().map(String::as_str))
    }
}

/// Keys whose flag values are numbers.
const NUMERIC: &[&str] = &["vcpus", "memory_mib"];
/// Keys whose flags take no value.
const SWITCHES: &[&str] = &["kvm"];

fn config_err(problem: impl Into<String>) -> Error {
    Error::Config(problem.into())
}

/// Merge a config file's JSON (if any) and flags into one object (pure).
pub fn merge(file_json: Option<&str>, flags: &[String]) -> Result<Map<String, Value>> {
    let mut map = match file_json {
        Some(text) => match serde_json::from_str::<Value>(text) {
            Ok(Value::Object(m)) => m,
            Ok(_) => return Err(config_err("the config file must hold one JSON object")),
            Err(e) => return Err(config_err(format!("the config file is not JSON: {e}"))),
        },
        None => Map::new(),
    };
    let mut it = flags.iter();
    while let Some(flag) = it.next() {
        let key = flag
            .strip_prefix("--")
            .ok_or_else(|| config_err(format!("{flag:?}: flags look like --KEY VALUE")))?
            .replace('-', "_");
        if SWITCHES.contains(&key.as_str()) {
            map.insert(key, Value::Bool(true));
            continue;
        }
        let value = it
            .next()
            .ok_or_else(|| config_err(format!("{flag} needs a value")))?;
        let value = if NUMERIC.contains(&key.as_str()) {
            Value::from(
                value
                    .parse::<u64>()
                    .map_err(|_| config_err(format!("{flag} {value:?}: not a number")))?,
            )
        } else {
            Value::String(value.clone())
        };
        map.insert(key, value);
    }
    Ok(map)
}

/// Turn the merged config into a [`ShimConfig`] without I/O: field syntax and the VM spec.
/// A token file is read by the caller's `read_token`.
fn build(
    map: Map<String, Value>,
    read_token: impl FnOnce(&Path) -> Result<String>,
) -> Result<ShimConfig> {
    let raw: RawConfig = serde_json::from_value(Value::Object(map))
        .map_err(|e| config_err(format!("{e} (see roam-shim --help)")))?;
    let boot = match (&raw.kernel, &raw.disk) {
        (Some(kernel), None) => Boot::Kernel {
            kernel: kernel.clone(),
            initrd: raw.initrd.clone(),
            cmdline: raw.cmdline.clone(),
        },
        (None, Some(disk)) => Boot::Disk {
            image: disk.clone(),
            format: raw.disk_format.clone().unwrap_or_else(|| "qcow2".into()),
        },
        _ => {
            return Err(config_err(
                "give exactly one boot source: kernel (with optional initrd and cmdline) or disk",
            ));
        }
    };
    let raw_nics = raw_nics(&raw)?;
    let mut nics = Vec::new();
    for n in &raw_nics {
        let mac = n
            .mac
            .parse()
            .map_err(|e| config_err(format!("mac {:?}: {e}", n.mac)))?;
        if n.ovn_port.trim().is_empty() {
            return Err(config_err(format!("ovn_port is empty (tap {})", n.tap)));
        }
        nics.push(Nic {
            mac,
            tap: n.tap.clone(),
        });
    }
    let vm = VmSpec {
        name: raw.name.clone(),
        vcpus: raw.vcpus,
        memory_mib: raw.memory_mib,
        boot,
        nics,
        serial_log: raw.serial_log.clone(),
    };
    vm.validate()?;
    for (what, v) in [
        ("node", &raw.node),
        ("libvirt_uri", &raw.libvirt_uri),
        ("peer_libvirt_uri", &raw.peer_libvirt_uri),
        ("bridge", &raw.bridge),
    ] {
        if v.trim().is_empty() {
            return Err(config_err(format!("{what} is empty")));
        }
    }
    match raw.migration_uri.strip_prefix("tcp://") {
        Some(h) if !h.is_empty() && !h.contains('/') => {}
        _ => {
            return Err(config_err(format!(
                "migration_uri {:?}: use tcp://HOST (this node's address for the migration stream)",
                raw.migration_uri
            )));
        }
    }
    roam_ovsdb::Endpoint::parse(&raw.ovs_db).map_err(|_| {
        config_err(format!(
            "ovs_db {:?}: use unix:PATH or tcp:HOST:PORT",
            raw.ovs_db
        ))
    })?;
    let listen: SocketAddr = raw
        .listen
        .parse()
        .map_err(|_| config_err(format!("listen {:?}: use IP:PORT", raw.listen)))?;
    if !raw.state_file.is_absolute() {
        return Err(config_err(format!(
            "state_file {}: use an absolute path",
            raw.state_file.display()
        )));
    }
    let token = match (&raw.token_file, &raw.token_sha256) {
        (Some(file), None) => TokenDigest::of(&read_token(file)?),
        (None, Some(hex)) => {
            TokenDigest::parse_hex(hex).map_err(|e| config_err(format!("token_sha256: {e}")))?
        }
        _ => {
            return Err(config_err(
                "give exactly one of token_file (a file holding the VM's API token) and \
                 token_sha256 (the token's SHA-256 digest, 64 hex digits)",
            ));
        }
    };
    Ok(ShimConfig {
        vm,
        ovn_ports: raw_nics.into_iter().map(|n| n.ovn_port).collect(),
        node: raw.node,
        libvirt_uri: raw.libvirt_uri,
        peer_libvirt_uri: raw.peer_libvirt_uri,
        migration_uri: raw.migration_uri,
        ovs_db: raw.ovs_db,
        bridge: raw.bridge,
        listen,
        token,
        state_file: raw.state_file,
        mode: raw.mode,
        accel: if raw.kvm { Accel::Kvm } else { Accel::Tcg },
        instance: raw.instance.filter(|i| !i.trim().is_empty()),
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
        if a == "--config" {
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
    let map = merge(file.as_deref(), &flags)?;
    let cfg = build(map, |p| {
        let text = std::fs::read_to_string(p)
            .map_err(|e| config_err(format!("cannot read the token file {}: {e}", p.display())))?;
        parse_token(p, &text)
    })?;
    check_files(&cfg.vm)?;
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

/// The boot files exist and are regular files.
pub fn check_files(vm: &VmSpec) -> Result<()> {
    let files: Vec<(&str, &Path)> = match &vm.boot {
        Boot::Kernel { kernel, initrd, .. } => std::iter::once(("kernel", kernel.as_path()))
            .chain(initrd.iter().map(|i| ("initrd", i.as_path())))
            .collect(),
        Boot::Disk { image, .. } => vec![("disk image", image.as_path())],
    };
    for (what, p) in files {
        if !p.is_file() {
            return Err(Error::InvalidSpec {
                vm: vm.name.clone(),
                problem: format!(
                    "{what} {} does not exist or is not a file: give the path of the {what} on this node",
                    p.display()
                ),
            });
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

    fn build_ok(map: Map<String, Value>) -> Result<ShimConfig> {
        build(map, |_| Ok("tok".into()))
    }

    #[test]
    fn flags_make_a_config() {
        let c = build_ok(merge(None, &full_flags()).unwrap()).unwrap();
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
        let c = build_ok(merge(None, &f).unwrap()).unwrap();
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
        let c = build_ok(merge(Some(file), &f).unwrap()).unwrap();
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
            (vec!["--bogus", "x"], "unknown field"),
            (vec!["--mac", "zz"], "mac"),
            (vec!["--migration-uri", "10.0.0.1"], "tcp://HOST"),
            (vec!["--ovs-db", "/run/db.sock"], "unix:PATH"),
            (vec!["--listen", "localhost"], "IP:PORT"),
            (vec!["--mode", "fly"], "unknown variant"),
            (vec!["--disk", "/d.qcow2"], "exactly one boot source"),
            (vec!["--state-file", "rel.json"], "absolute"),
            (vec!["--ovn-port", ""], "ovn_port is empty"),
            (vec!["--nics", "52:54:00:00:00:02/t2/p2"], "not both"),
        ];
        for (extra, expect) in cases {
            let mut f = full_flags();
            f.extend(flags(&extra));
            let err = merge(None, &f).and_then(build_ok).unwrap_err().to_string();
            assert!(
                err.contains(expect),
                "{extra:?}: {err:?} should mention {expect:?}"
            );
        }
        let err = merge(None, &flags(&["--name", "x"]))
            .and_then(build_ok)
            .unwrap_err()
            .to_string();
        assert!(err.contains("missing field"), "{err}");
        assert!(merge(Some("[1]"), &[]).is_err());
        assert!(merge(None, &flags(&["name"])).is_err());
        assert!(merge(None, &flags(&["--name"])).is_err());
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
        let c = build_ok(merge(None, &f).unwrap()).unwrap();
        let taps: Vec<&str> = c.vm.nics.iter().map(|n| n.tap.as_str()).collect();
        assert_eq!(taps, ["h7tap", "h7tap1"]);
        assert_eq!(c.vm.nics[1].mac.to_string(), "52:54:00:00:00:02");
        assert_eq!(c.ovn_ports, ["vm1.node-a", "vlan-port"]);
        // the single-NIC flags are one NIC
        let c = build_ok(merge(None, &full_flags()).unwrap()).unwrap();
        assert_eq!(c.vm.nics.len(), 1);
        assert_eq!(c.ovn_ports, ["vm1.node-a"]);
        // a config file lists objects
        let file = r#"{"nics":[{"mac":"52:54:00:00:00:01","tap":"a","ovn_port":"pa"},
                              {"mac":"52:54:00:00:00:02","tap":"b","ovn_port":"pb"}]}"#;
        let c = build_ok(merge(Some(file), &f[..f.len() - 2]).unwrap()).unwrap();
        assert_eq!(c.ovn_ports, ["pa", "pb"]);
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
            ("52:54:00:00:00:01/t/ ", "ovn_port is empty"),
            ("zz/t/p", "mac"),
            ("", "give 1 to 8"),
        ] {
            let mut f = full_flags();
            without_single_nic(&mut f);
            f.extend(flags(&["--nics", nics]));
            let err = merge(None, &f).and_then(build_ok).unwrap_err().to_string();
            assert!(
                err.contains(expect),
                "{nics:?}: {err:?} should mention {expect:?}"
            );
        }
        let mut f = full_flags();
        let i = f.iter().position(|x| x == "--tap").unwrap();
        f.drain(i..i + 2);
        let err = merge(None, &f).and_then(build_ok).unwrap_err().to_string();
        assert!(err.contains("mac, tap and ovn_port"), "{err}");
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
        let c = build(merge(None, &f).unwrap(), |_| {
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
            merge(None, &f).and_then(build_ok).unwrap_err().to_string()
        };
        let both = bad(&["--token-sha256", &digest], false);
        assert!(both.contains("exactly one of token_file"), "{both}");
        let neither = bad(&[], true);
        assert!(neither.contains("exactly one of token_file"), "{neither}");
        let short = bad(&["--token-sha256", "abcd"], true);
        assert!(
            short.contains("token_sha256") && short.contains("64 hexadecimal"),
            "{short}"
        );
    }

    #[test]
    fn a_missing_kernel_is_named() {
        let c = build_ok(merge(None, &full_flags()).unwrap()).unwrap();
        let err = check_files(&c.vm).unwrap_err().to_string();
        assert!(err.contains("kernel /k does not exist"), "{err}");
    }
}
