//! roam-shim's command line, typed: what the controller renders into a launcher pod, what the
//! lab tests start the shim with, and what the shim parses (pure).
//!
//! [`LaunchArgs::to_args`] writes `--FLAG VALUE` pairs; [`LaunchArgs::parse`] reads them back
//! (`parse(to_args(x)) == x`). The shim also takes the same keys from a JSON config file, with
//! `_` for `-` (`memory_mib`), a flag overriding the file ([`LaunchArgs::parse_with_file`]).
//!
//! Parsing checks each value's form (numbers, paths, addresses, URIs, one boot source, one
//! token source) and names the flag at fault; what a VM may be (vCPU and memory ranges, tap
//! names, unique MACs) is the shim's VM spec to check.
//!
//! ```text
//! roam-shim --name vm1 --vcpus 1 --memory-mib 256 --kernel /guest/vmlinuz \
//!   --initrd /guest/initramfs.gz --cmdline 'console=ttyS0' --mac 52:54:00:00:00:01 \
//!   --tap vm1-tap --ovn-port vm1 --serial-log /var/log/vm1.log --node node-a \
//!   --libvirt-uri qemu:///system --ovs-db unix:/run/openvswitch/db.sock \
//!   --peer-libvirt-uri qemu+tcp://node-a/system --migration-uri tcp://10.0.0.11 \
//!   --listen 0.0.0.0:17001 --token-file /secret/token --state-file /var/lib/roam/vm1.json \
//!   --mode boot --instance vm1-launcher
//! ```
//!
//! A VM with several NICs gives `--nics MAC/TAP/OVN-PORT,MAC/TAP/OVN-PORT,…` (in the guest's
//! order: `eth0`, `eth1`, …; in a config file also a list of `{"mac","tap","ovn_port"}`)
//! instead of `--mac`, `--tap` and `--ovn-port`.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::str::FromStr;

pub use roam_dhcp_opts::MacAddr;
use serde::Deserialize;

use crate::token::TokenDigest;
use crate::{Error, Result};

/// The flags, as written on the command line. In a config file the key is the flag without
/// `--` and with `_` for `-`.
pub mod flag {
    /// A JSON config file holding the other keys (the shim's own; not a [`super::LaunchArgs`]
    /// field).
    pub const CONFIG: &str = "--config";
    /// The domain's name.
    pub const NAME: &str = "--name";
    /// Virtual CPUs.
    pub const VCPUS: &str = "--vcpus";
    /// Memory in MiB.
    pub const MEMORY_MIB: &str = "--memory-mib";
    /// Direct kernel boot: the kernel image.
    pub const KERNEL: &str = "--kernel";
    /// Direct kernel boot: the initramfs.
    pub const INITRD: &str = "--initrd";
    /// Direct kernel boot: the kernel command line.
    pub const CMDLINE: &str = "--cmdline";
    /// Disk boot: the image.
    pub const DISK: &str = "--disk";
    /// Disk boot: the image's format.
    pub const DISK_FORMAT: &str = "--disk-format";
    /// Disk boot: `read-only` (the admin's image store, shared by every VM that boots the
    /// image) or `read-write` (the default: the VM's own volume).
    pub const DISK_ACCESS: &str = "--disk-access";
    /// The one NIC's MAC.
    pub const MAC: &str = "--mac";
    /// The one NIC's tap.
    pub const TAP: &str = "--tap";
    /// The one NIC's OVN logical port.
    pub const OVN_PORT: &str = "--ovn-port";
    /// Several NICs: `MAC/TAP/OVN-PORT,…`.
    pub const NICS: &str = "--nics";
    /// The file the serial console is appended to.
    pub const SERIAL_LOG: &str = "--serial-log";
    /// This node's name.
    pub const NODE: &str = "--node";
    /// This node's libvirtd, for the shim.
    pub const LIBVIRT_URI: &str = "--libvirt-uri";
    /// This node's libvirtd as another node's libvirtd reaches it.
    pub const PEER_LIBVIRT_URI: &str = "--peer-libvirt-uri";
    /// Where an incoming migration stream connects.
    pub const MIGRATION_URI: &str = "--migration-uri";
    /// The migration proxy's listen address (mutual TLS with the node's identity).
    pub const MIGRATION_PROXY: &str = "--migration-proxy";
    /// The nodes whose certificates the migration proxy takes, separated by commas.
    pub const ALLOWED_PEERS: &str = "--allowed-peers";
    /// This node's Open_vSwitch database.
    pub const OVS_DB: &str = "--ovs-db";
    /// The integration bridge.
    pub const BRIDGE: &str = "--bridge";
    /// The API's listen address.
    pub const LISTEN: &str = "--listen";
    /// A file holding the VM's API token.
    pub const TOKEN_FILE: &str = "--token-file";
    /// The API token's SHA-256 digest.
    pub const TOKEN_SHA256: &str = "--token-sha256";
    /// Where the shim records that it booted its VM.
    pub const STATE_FILE: &str = "--state-file";
    /// `boot` or `incoming`.
    pub const MODE: &str = "--mode";
    /// KVM instead of TCG (a switch: no value).
    pub const KVM: &str = "--kvm";
    /// Who runs the shim (a launcher pod's name).
    pub const INSTANCE: &str = "--instance";
    /// The admin's image store: every boot file must resolve under it.
    pub const IMAGE_ROOT: &str = "--image-root";
    /// The node's roam identity (roam-node's directory): the API over mutual TLS.
    pub const PKI_DIR: &str = "--pki-dir";

    /// Every flag of [`super::LaunchArgs`] (not [`CONFIG`]).
    pub const ALL: &[&str] = &[
        NAME,
        VCPUS,
        MEMORY_MIB,
        KERNEL,
        INITRD,
        CMDLINE,
        DISK,
        DISK_FORMAT,
        DISK_ACCESS,
        MAC,
        TAP,
        OVN_PORT,
        NICS,
        SERIAL_LOG,
        NODE,
        LIBVIRT_URI,
        PEER_LIBVIRT_URI,
        MIGRATION_URI,
        MIGRATION_PROXY,
        ALLOWED_PEERS,
        OVS_DB,
        BRIDGE,
        LISTEN,
        TOKEN_FILE,
        TOKEN_SHA256,
        STATE_FILE,
        MODE,
        KVM,
        INSTANCE,
        IMAGE_ROOT,
        PKI_DIR,
    ];
}

/// The integration bridge when `--bridge` is not given.
pub const DEFAULT_BRIDGE: &str = "br-int";
/// The disk format when `--disk-format` is not given.
pub const DEFAULT_DISK_FORMAT: &str = "qcow2";
/// `--disk-access`'s values; read-write when not given.
pub const READ_ONLY: &str = "read-only";
/// See [`READ_ONLY`].
pub const READ_WRITE: &str = "read-write";
/// The launcher pod's own libvirtd as its shim reaches it (the pod's `/run/libvirt`, an
/// emptyDir both containers mount).
pub const NODE_LIBVIRT_URI: &str = "qemu:///system";
/// The node's Open_vSwitch database socket as a shim in a launcher pod (hostPath
/// `/run/openvswitch`) reaches it.
pub const NODE_OVS_DB_SOCKET: &str = "/run/openvswitch/db.sock";

pub use roam_contract::EXIT_REFUSED_CONFIG;

/// What the shim does at start when its domain does not run on this node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Boot the VM here — once in the shim's life (recorded in the state file), so a shim
    /// restarted after its VM migrated away never boots a second copy.
    Boot,
    /// Wait for an incoming migration (a migration's target).
    Incoming,
}

impl Mode {
    /// As written on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Boot => "boot",
            Mode::Incoming => "incoming",
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Mode {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Mode, String> {
        match s {
            "boot" => Ok(Mode::Boot),
            "incoming" => Ok(Mode::Incoming),
            _ => Err(format!(
                "{s:?}: use boot (boot the VM here) or incoming (wait for a migration)"
            )),
        }
    }
}

/// How the guest boots.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LaunchBoot {
    /// Direct kernel boot (`--kernel`, `--initrd`, `--cmdline`).
    Kernel {
        /// The kernel image.
        kernel: PathBuf,
        /// The initramfs, if any.
        initrd: Option<PathBuf>,
        /// The kernel command line (empty: none; then not rendered).
        cmdline: String,
    },
    /// Boot from a disk image (`--disk`, `--disk-format`, `--disk-access`).
    Disk {
        /// The image file.
        image: PathBuf,
        /// Its format (`qcow2` or `raw`; the shim's VM spec checks it).
        format: String,
        /// The guest sees the disk read-only and QEMU opens it so (`--disk-access
        /// read-only`): an image of the admin's store, which every VM booting it shares.
        read_only: bool,
    },
}

/// One NIC: its MAC, the tap QEMU opens, and the OVN logical port the tap is bound to. The
/// tap is a kernel tap that the node's OVS `br-int` carries as the interface's logical port
/// (on OVS's userspace datapath QEMU cannot open an OVS internal port). The guest sees the
/// NICs in the order given (`eth0`, `eth1`, …).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchNic {
    /// The guest's MAC: the Address's, so the VM keeps it across migrations.
    pub mac: MacAddr,
    /// The tap device on the node; it exists before the domain starts (the same name on a
    /// migration's target).
    pub tap: String,
    /// The OVN logical port (`external_ids:iface-id` of the tap's OVS interface).
    pub ovn_port: String,
}

/// Where an incoming migration stream connects: `tcp://HOST`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MigrationUri {
    host: String,
}

impl MigrationUri {
    /// `tcp://HOST`; `host` is this node's address (no `/`).
    pub fn tcp(host: impl Into<String>) -> Result<MigrationUri, String> {
        let host = host.into();
        if host.is_empty() || host.contains('/') {
            return Err(format!(
                "host {host:?}: give this node's address for the migration stream"
            ));
        }
        Ok(MigrationUri { host })
    }

    /// The host.
    pub fn host(&self) -> &str {
        &self.host
    }
}

impl fmt::Display for MigrationUri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "tcp://{}", self.host)
    }
}

impl FromStr for MigrationUri {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<MigrationUri, String> {
        s.strip_prefix("tcp://")
            .and_then(|h| MigrationUri::tcp(h).ok())
            .ok_or_else(|| {
                format!("{s:?}: use tcp://HOST (this node's address for the migration stream)")
            })
    }
}

/// How a VM migrates between this node and another.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Migration {
    /// libvirt and QEMU reach each other's node directly over plain TCP
    /// (`--peer-libvirt-uri`, `--migration-uri`): the tests' own libvirtds, the TLS bench's
    /// baseline.
    Plain {
        /// This node's libvirtd as another node's libvirtd reaches it.
        peer_libvirt_uri: String,
        /// Where an incoming migration stream connects.
        migration_uri: MigrationUri,
    },
    /// Through the shims (`--migration-proxy IP:PORT`, needs `--pki-dir`): libvirt and QEMU
    /// speak over UNIX sockets of the launcher pod only, and the shims carry both streams
    /// between the nodes over mutual TLS with the nodes' identities.
    Proxy {
        /// Where the runner's migration proxy (`roam-shim proxy`) takes a source's
        /// connections; the shim names it to a migration's source.
        listen: SocketAddr,
        /// The nodes whose certificates it takes (`--allowed-peers`: this node, and a
        /// migration's source). Empty: none.
        allowed_peers: Vec<String>,
    },
}

/// An Open_vSwitch database: `unix:PATH` or `tcp:HOST:PORT`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum OvsDb {
    /// A Unix socket.
    Unix(PathBuf),
    /// A TCP address.
    Tcp {
        /// Host name or address.
        host: String,
        /// Port.
        port: u16,
    },
}

impl OvsDb {
    /// The node's database as a launcher pod reaches it ([`NODE_OVS_DB_SOCKET`]).
    pub fn node() -> OvsDb {
        OvsDb::Unix(NODE_OVS_DB_SOCKET.into())
    }
}

impl fmt::Display for OvsDb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OvsDb::Unix(p) => write!(f, "unix:{}", p.display()),
            OvsDb::Tcp { host, port } => write!(f, "tcp:{host}:{port}"),
        }
    }
}

impl FromStr for OvsDb {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<OvsDb, String> {
        if let Some(p) = s.strip_prefix("unix:").filter(|p| !p.is_empty()) {
            return Ok(OvsDb::Unix(p.into()));
        }
        if let Some((host, port)) = s.strip_prefix("tcp:").and_then(|hp| hp.rsplit_once(':'))
            && !host.is_empty()
            && let Ok(port) = port.parse::<u16>()
        {
            return Ok(OvsDb::Tcp {
                host: host.into(),
                port,
            });
        }
        Err(format!("{s:?}: use unix:PATH or tcp:HOST:PORT"))
    }
}

/// How the shim learns the VM's API token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LaunchToken {
    /// A file holding the token (`--token-file`).
    File(PathBuf),
    /// The token's SHA-256 digest (`--token-sha256`): the shim only checks tokens, so a
    /// launcher pod carries this and mounts no Secret.
    Sha256(TokenDigest),
}

/// roam-shim's command line: one field per flag.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchArgs {
    /// The domain's name (`--name`).
    pub name: String,
    /// Virtual CPUs (`--vcpus`).
    pub vcpus: u32,
    /// Memory in MiB (`--memory-mib`).
    pub memory_mib: u64,
    /// The boot source.
    pub boot: LaunchBoot,
    /// The NICs in the guest's order: one is rendered as `--mac --tap --ovn-port`, several as
    /// `--nics`.
    pub nics: Vec<LaunchNic>,
    /// The file the serial console is appended to (`--serial-log`).
    pub serial_log: PathBuf,
    /// This node's name, the OVN chassis (`--node`).
    pub node: String,
    /// This node's libvirtd, for the shim (`--libvirt-uri`).
    pub libvirt_uri: String,
    /// How another node's shim migrates the VM here, and this shim to another node.
    pub migration: Migration,
    /// This node's Open_vSwitch database (`--ovs-db`).
    pub ovs_db: OvsDb,
    /// The integration bridge (`--bridge`, default [`DEFAULT_BRIDGE`]; rendered only when
    /// another).
    pub bridge: String,
    /// The API's listen address (`--listen`).
    pub listen: SocketAddr,
    /// The API token (`--token-file` or `--token-sha256`).
    pub token: LaunchToken,
    /// Where the shim records that it booted its VM; absolute (`--state-file`).
    pub state_file: PathBuf,
    /// Boot or wait for an incoming migration (`--mode`).
    pub mode: Mode,
    /// KVM instead of TCG (`--kvm`).
    pub kvm: bool,
    /// Who runs the shim, echoed in its status (`--instance`).
    pub instance: Option<String>,
    /// The admin's image store (`--image-root`): every boot file must resolve (symbolic
    /// links followed) to a file under it. `None`: any absolute path.
    pub image_root: Option<PathBuf>,
    /// The node's roam identity (`--pki-dir`: `node.key`, `node.crt`, `ca.crt`, kept by
    /// roam-node): the API is served over mutual TLS with the node's certificate, and a
    /// migration's target is reached over it. `None`: plain HTTP.
    pub pki_dir: Option<PathBuf>,
}

/// A value as given, before its type is checked.
#[derive(Clone, Debug)]
enum Given {
    Text(String),
    On,
    NicList(Vec<FileNic>),
}

/// One NIC in a config file's `nics` list.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileNic {
    mac: String,
    tap: String,
    ovn_port: String,
}

/// Flags whose value is a whole number (a JSON number in a config file).
const NUMERIC: &[&str] = &[flag::VCPUS, flag::MEMORY_MIB];

fn bad(flag: &str, problem: impl Into<String>) -> Error {
    Error::LaunchArg {
        flag: flag.to_string(),
        problem: problem.into(),
    }
}

/// The flag of a command-line word or config key: `--memory-mib`, `--memory_mib` and
/// `memory_mib` are all [`flag::MEMORY_MIB`].
fn known(key: &str) -> Option<&'static str> {
    let dashed = format!("--{}", key.trim_start_matches("--").replace('_', "-"));
    flag::ALL.iter().copied().find(|f| *f == dashed)
}

impl LaunchArgs {
    /// The command line (after the program name): `--FLAG VALUE` pairs and the `--kvm`
    /// switch, optional flags left out when they hold their default.
    pub fn to_args(&self) -> Vec<String> {
        let mut out: Vec<(&str, Option<String>)> = vec![
            (flag::NAME, Some(self.name.clone())),
            (flag::VCPUS, Some(self.vcpus.to_string())),
            (flag::MEMORY_MIB, Some(self.memory_mib.to_string())),
        ];
        let path = |p: &Path| Some(p.display().to_string());
        match &self.boot {
            LaunchBoot::Kernel {
                kernel,
                initrd,
                cmdline,
            } => {
                out.push((flag::KERNEL, path(kernel)));
                if let Some(i) = initrd {
                    out.push((flag::INITRD, path(i)));
                }
                if !cmdline.is_empty() {
                    out.push((flag::CMDLINE, Some(cmdline.clone())));
                }
            }
            LaunchBoot::Disk {
                image,
                format,
                read_only,
            } => {
                out.push((flag::DISK, path(image)));
                out.push((flag::DISK_FORMAT, Some(format.clone())));
                if *read_only {
                    out.push((flag::DISK_ACCESS, Some(READ_ONLY.into())));
                }
            }
        }
        match self.nics.as_slice() {
            // no NIC: an empty list, which parses back to none (no flag would be refused)
            [] => out.push((flag::NICS, Some(String::new()))),
            // one NIC: the flags every roam-shim understands
            [one] => out.extend([
                (flag::MAC, Some(one.mac.to_string())),
                (flag::TAP, Some(one.tap.clone())),
                (flag::OVN_PORT, Some(one.ovn_port.clone())),
            ]),
            several => out.push((
                flag::NICS,
                Some(
                    several
                        .iter()
                        .map(|n| format!("{}/{}/{}", n.mac, n.tap, n.ovn_port))
                        .collect::<Vec<_>>()
                        .join(","),
                ),
            )),
        }
        out.extend([
            (flag::SERIAL_LOG, path(&self.serial_log)),
            (flag::NODE, Some(self.node.clone())),
            (flag::LIBVIRT_URI, Some(self.libvirt_uri.clone())),
            (flag::OVS_DB, Some(self.ovs_db.to_string())),
        ]);
        if self.bridge != DEFAULT_BRIDGE {
            out.push((flag::BRIDGE, Some(self.bridge.clone())));
        }
        match &self.migration {
            Migration::Plain {
                peer_libvirt_uri,
                migration_uri,
            } => out.extend([
                (flag::PEER_LIBVIRT_URI, Some(peer_libvirt_uri.clone())),
                (flag::MIGRATION_URI, Some(migration_uri.to_string())),
            ]),
            Migration::Proxy {
                listen,
                allowed_peers,
            } => {
                out.push((flag::MIGRATION_PROXY, Some(listen.to_string())));
                if !allowed_peers.is_empty() {
                    out.push((flag::ALLOWED_PEERS, Some(allowed_peers.join(","))));
                }
            }
        }
        out.push((flag::LISTEN, Some(self.listen.to_string())));
        out.push(match &self.token {
            LaunchToken::File(p) => (flag::TOKEN_FILE, path(p)),
            LaunchToken::Sha256(d) => (flag::TOKEN_SHA256, Some(d.to_string())),
        });
        out.extend([
            (flag::STATE_FILE, path(&self.state_file)),
            (flag::MODE, Some(self.mode.to_string())),
        ]);
        if self.kvm {
            out.push((flag::KVM, None));
        }
        if let Some(r) = &self.image_root {
            out.push((flag::IMAGE_ROOT, path(r)));
        }
        if let Some(d) = &self.pki_dir {
            out.push((flag::PKI_DIR, path(d)));
        }
        if let Some(i) = &self.instance {
            out.push((flag::INSTANCE, Some(i.clone())));
        }
        out.into_iter()
            .flat_map(|(f, v)| std::iter::once(f.to_string()).chain(v))
            .collect()
    }

    /// Parse a command line (after the program name; no `--config`).
    pub fn parse(args: &[String]) -> Result<LaunchArgs> {
        let mut given = BTreeMap::new();
        add_flags(&mut given, args)?;
        from_given(given)
    }

    /// Parse a config file's JSON (one object of keys) overridden by a command line (after
    /// the program name; without `--config FILE`, which the caller has read).
    pub fn parse_with_file(file_json: &str, args: &[String]) -> Result<LaunchArgs> {
        let mut given = from_file(file_json)?;
        add_flags(&mut given, args)?;
        from_given(given)
    }
}

/// The keys of a config file: numbers for [`NUMERIC`], a bool for `kvm`, a string or a list
/// of NIC objects for `nics`, strings for the rest; `null` is absent.
fn from_file(text: &str) -> Result<BTreeMap<&'static str, Given>> {
    let file = |problem: String| bad(flag::CONFIG, problem);
    let obj = match serde_json::from_str::<serde_json::Value>(text) {
        Ok(serde_json::Value::Object(m)) => m,
        Ok(_) => return Err(file("the config file must hold one JSON object".into())),
        Err(e) => return Err(file(format!("the config file is not JSON: {e}"))),
    };
    let mut given = BTreeMap::new();
    for (key, value) in obj {
        use serde_json::Value as V;
        let f = known(&key)
            .filter(|_| !key.starts_with('-'))
            .ok_or_else(|| {
                file(format!(
                    "unknown key {key:?} in the config file (see roam-shim --help)"
                ))
            })?;
        let expected = match f {
            flag::KVM => "true or false",
            flag::NICS => "a string MAC/TAP/OVN-PORT,… or a list of {\"mac\",\"tap\",\"ovn_port\"}",
            f if NUMERIC.contains(&f) => "a whole number",
            _ => "a string",
        };
        let g = match value {
            V::Null | V::Bool(false) if f == flag::KVM => continue,
            V::Null => continue,
            V::Bool(true) if f == flag::KVM => Given::On,
            V::Number(n) if NUMERIC.contains(&f) => Given::Text(n.to_string()),
            V::Array(list) if f == flag::NICS => Given::NicList(
                list.into_iter()
                    .map(serde_json::from_value)
                    .collect::<std::result::Result<_, _>>()
                    .map_err(|e| file(format!("key \"nics\": {e}; give {expected}")))?,
            ),
            V::String(s) if f != flag::KVM && !NUMERIC.contains(&f) => Given::Text(s),
            other => {
                return Err(file(format!("key {key:?}: {other} is not {expected}")));
            }
        };
        given.insert(f, g);
    }
    Ok(given)
}

/// Add `--FLAG VALUE` pairs (and switches) to `given`; a later value replaces an earlier one.
fn add_flags(given: &mut BTreeMap<&'static str, Given>, args: &[String]) -> Result<()> {
    let mut it = args.iter();
    while let Some(word) = it.next() {
        if !word.starts_with("--") {
            return Err(bad(
                &format!("{word:?}"),
                "flags look like --FLAG VALUE (see roam-shim --help)",
            ));
        }
        let f = known(word).ok_or_else(|| bad(word, "unknown flag (see roam-shim --help)"))?;
        if f == flag::KVM {
            given.insert(f, Given::On);
            continue;
        }
        let value = it
            .next()
            .ok_or_else(|| bad(f, "needs a value (see roam-shim --help)"))?;
        given.insert(f, Given::Text(value.clone()));
    }
    Ok(())
}

/// The values given, taken out one flag at a time.
struct Values(BTreeMap<&'static str, Given>);

impl Values {
    fn text(&mut self, f: &'static str) -> Result<Option<String>> {
        match self.0.remove(f) {
            None => Ok(None),
            Some(Given::Text(t)) => Ok(Some(t)),
            // only `--kvm` is a switch and only `nics` a list: add_flags and from_file see to it
            Some(other) => Err(bad(f, format!("unexpected value {other:?}"))),
        }
    }

    fn required(&mut self, f: &'static str, what: &str) -> Result<String> {
        self.text(f)?
            .ok_or_else(|| bad(f, format!("is missing: give {what} (see roam-shim --help)")))
    }

    fn not_empty(&mut self, f: &'static str, what: &str) -> Result<String> {
        let v = self.required(f, what)?;
        if v.trim().is_empty() {
            return Err(bad(f, format!("is empty: give {what}")));
        }
        Ok(v)
    }

    fn number<T: TryFrom<u64>>(&mut self, f: &'static str, what: &str) -> Result<T> {
        let v = self.required(f, what)?;
        v.parse::<u64>()
            .ok()
            .and_then(|n| T::try_from(n).ok())
            .ok_or_else(|| bad(f, format!("{v:?}: not a number (give {what})")))
    }

    fn parsed<T: FromStr<Err = String>>(&mut self, f: &'static str, what: &str) -> Result<T> {
        self.required(f, what)?.parse().map_err(|e| bad(f, e))
    }
}

/// Check each value's type and form.
fn from_given(given: BTreeMap<&'static str, Given>) -> Result<LaunchArgs> {
    let mut v = Values(given);
    let nic_list = match v.0.remove(flag::NICS) {
        Some(Given::NicList(list)) => Some(list),
        Some(Given::Text(t)) => Some(nics_text(&t)?),
        Some(Given::On) => return Err(bad(flag::NICS, "needs a value")),
        None => None,
    };
    let kvm = matches!(v.0.remove(flag::KVM), Some(Given::On));

    let name = v.required(flag::NAME, "the domain's name")?;
    let vcpus = v.number(flag::VCPUS, "the number of vCPUs")?;
    let memory_mib = v.number(flag::MEMORY_MIB, "the memory in MiB")?;

    // a kernel boot ignores --disk-format and --disk-access, a disk boot --initrd and --cmdline
    let (initrd, cmdline) = (v.text(flag::INITRD)?, v.text(flag::CMDLINE)?);
    let disk_format = v.text(flag::DISK_FORMAT)?;
    let read_only = match v.text(flag::DISK_ACCESS)?.as_deref() {
        None | Some(READ_WRITE) => false,
        Some(READ_ONLY) => true,
        Some(other) => {
            return Err(bad(
                flag::DISK_ACCESS,
                format!("{other:?}: give {READ_ONLY} or {READ_WRITE}"),
            ));
        }
    };
    let boot = match (v.text(flag::KERNEL)?, v.text(flag::DISK)?) {
        (Some(kernel), None) => LaunchBoot::Kernel {
            kernel: kernel.into(),
            initrd: initrd.map(Into::into),
            cmdline: cmdline.unwrap_or_default(),
        },
        (None, Some(image)) => LaunchBoot::Disk {
            image: image.into(),
            format: disk_format.unwrap_or_else(|| DEFAULT_DISK_FORMAT.into()),
            read_only,
        },
        _ => {
            return Err(bad(
                "--kernel/--disk",
                "give exactly one boot source: --kernel (with optional --initrd and --cmdline) \
                 or --disk (with optional --disk-format and --disk-access)",
            ));
        }
    };

    let single = [
        v.text(flag::MAC)?,
        v.text(flag::TAP)?,
        v.text(flag::OVN_PORT)?,
    ];
    let (from_list, raw_nics) = match (nic_list, single) {
        (Some(_), s) if s.iter().any(Option::is_some) => {
            return Err(bad(
                flag::NICS,
                "give the NICs either as --nics or as --mac + --tap + --ovn-port, not both",
            ));
        }
        (Some(list), _) => (true, list),
        (None, [Some(mac), Some(tap), Some(ovn_port)]) => {
            (false, vec![FileNic { mac, tap, ovn_port }])
        }
        (None, _) => {
            return Err(bad(
                "--mac/--tap/--ovn-port",
                "give the VM's NIC: --mac, --tap and --ovn-port (or --nics for several)",
            ));
        }
    };
    let (mac_flag, tap_flag, port_flag) = match from_list {
        true => (flag::NICS, flag::NICS, flag::NICS),
        false => (flag::MAC, flag::TAP, flag::OVN_PORT),
    };
    let mut nics = Vec::with_capacity(raw_nics.len());
    for n in raw_nics {
        let mac = n
            .mac
            .parse::<MacAddr>()
            .map_err(|e| bad(mac_flag, format!("bad mac: {e}")))?;
        if n.ovn_port.trim().is_empty() {
            return Err(bad(
                port_flag,
                format!(
                    "the OVN port of tap {:?} is empty: give the logical port it is bound to",
                    n.tap
                ),
            ));
        }
        if let Some(p) = crate::limits::tap_name_problem(&n.tap) {
            return Err(bad(tap_flag, p));
        }
        if let Some(p) = crate::limits::ovn_port_problem(&n.ovn_port) {
            return Err(bad(port_flag, p));
        }
        nics.push(LaunchNic {
            mac,
            tap: n.tap,
            ovn_port: n.ovn_port,
        });
    }

    let serial_log = v
        .required(flag::SERIAL_LOG, "the serial console's log file")?
        .into();
    let node = v.not_empty(flag::NODE, "this node's name")?;
    let libvirt_uri = v.not_empty(flag::LIBVIRT_URI, "this node's libvirtd URI")?;
    let migration = match v.text(flag::MIGRATION_PROXY)? {
        None => {
            if v.0.contains_key(flag::ALLOWED_PEERS) {
                return Err(bad(
                    flag::ALLOWED_PEERS,
                    "names the nodes the migration proxy takes: give --migration-proxy",
                ));
            }
            Migration::Plain {
                peer_libvirt_uri: v.not_empty(
                    flag::PEER_LIBVIRT_URI,
                    "this node's libvirtd URI as other nodes reach it (or --migration-proxy)",
                )?,
                migration_uri: v.parsed(
                    flag::MIGRATION_URI,
                    "tcp://HOST (this node's address for the migration stream)",
                )?,
            }
        }
        Some(listen) => {
            for f in [flag::PEER_LIBVIRT_URI, flag::MIGRATION_URI] {
                if v.0.contains_key(f) {
                    return Err(bad(
                        f,
                        "is for a plain TCP migration: with --migration-proxy libvirt and QEMU \
                         reach the other node through the shims' proxies only",
                    ));
                }
            }
            let listen = listen.parse().map_err(|_| {
                bad(
                    flag::MIGRATION_PROXY,
                    format!("{listen:?}: use IP:PORT (an address of this node and a port)"),
                )
            })?;
            let allowed_peers = match v.text(flag::ALLOWED_PEERS)? {
                None => vec![],
                Some(list) => list
                    .split(',')
                    .map(str::trim)
                    .filter(|n| !n.is_empty())
                    .map(|n| match crate::limits::node_name_problem(n) {
                        None => Ok(n.to_string()),
                        Some(p) => Err(bad(flag::ALLOWED_PEERS, p)),
                    })
                    .collect::<Result<Vec<_>>>()?,
            };
            Migration::Proxy {
                listen,
                allowed_peers,
            }
        }
    };
    let ovs_db = v.parsed(
        flag::OVS_DB,
        "this node's OVS database (unix:PATH or tcp:HOST:PORT)",
    )?;
    let bridge = match v.0.contains_key(flag::BRIDGE) {
        true => v.not_empty(flag::BRIDGE, "the integration bridge")?,
        false => DEFAULT_BRIDGE.into(),
    };
    let listen = v.required(flag::LISTEN, "the API's IP:PORT")?;
    let listen = listen.parse().map_err(|_| {
        bad(
            flag::LISTEN,
            format!("{listen:?}: use IP:PORT (an address of this node and a port)"),
        )
    })?;
    let token = match (v.text(flag::TOKEN_FILE)?, v.text(flag::TOKEN_SHA256)?) {
        (Some(file), None) => LaunchToken::File(file.into()),
        (None, Some(hex)) => LaunchToken::Sha256(
            TokenDigest::parse_hex(&hex).map_err(|e| bad(flag::TOKEN_SHA256, e))?,
        ),
        _ => {
            return Err(bad(
                "--token-file/--token-sha256",
                "give exactly one of --token-file (a file holding the VM's API token) and \
                 --token-sha256 (the token's SHA-256 digest, 64 hex digits)",
            ));
        }
    };
    let state_file: PathBuf = v
        .required(flag::STATE_FILE, "the shim's state file")?
        .into();
    if !state_file.is_absolute() {
        return Err(bad(
            flag::STATE_FILE,
            format!("{}: use an absolute path", state_file.display()),
        ));
    }
    let mode = v.parsed(flag::MODE, "boot or incoming")?;
    let instance = v.text(flag::INSTANCE)?.filter(|i| !i.trim().is_empty());
    let image_root = match v.text(flag::IMAGE_ROOT)? {
        None => None,
        Some(r) => {
            if let Some(p) = crate::limits::boot_path_problem("image root", r.trim_end_matches('/'))
            {
                return Err(bad(flag::IMAGE_ROOT, p));
            }
            Some(PathBuf::from(r))
        }
    };
    let pki_dir = match v.text(flag::PKI_DIR)? {
        None => None,
        Some(d) => {
            if let Some(p) =
                crate::limits::boot_path_problem("PKI directory", d.trim_end_matches('/'))
            {
                return Err(bad(flag::PKI_DIR, p));
            }
            Some(PathBuf::from(d))
        }
    };
    if matches!(migration, Migration::Proxy { .. }) && pki_dir.is_none() {
        return Err(bad(
            flag::MIGRATION_PROXY,
            "the proxy speaks mutual TLS with the node's certificate: give --pki-dir",
        ));
    }
    Ok(LaunchArgs {
        name,
        vcpus,
        memory_mib,
        boot,
        nics,
        serial_log,
        node,
        libvirt_uri,
        migration,
        ovs_db,
        bridge,
        listen,
        token,
        state_file,
        mode,
        kvm,
        instance,
        image_root,
        pki_dir,
    })
}

/// `--nics MAC/TAP/OVN-PORT,…`: entries separated by commas, blanks around them ignored.
fn nics_text(text: &str) -> Result<Vec<FileNic>> {
    text.split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(|e| match e.split('/').collect::<Vec<_>>().as_slice() {
            [mac, tap, port] => Ok(FileNic {
                mac: mac.to_string(),
                tap: tap.to_string(),
                ovn_port: port.to_string(),
            }),
            _ => Err(bad(
                flag::NICS,
                format!("entry {e:?}: use MAC/TAP/OVN-PORT (entries separated by commas)"),
            )),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn words(s: &[&str]) -> Vec<String> {
        s.iter().map(|s| s.to_string()).collect()
    }

    fn example() -> LaunchArgs {
        LaunchArgs {
            name: "ns_vm1".into(),
            vcpus: 1,
            memory_mib: 256,
            boot: LaunchBoot::Kernel {
                kernel: "/guest/vmlinuz".into(),
                initrd: Some("/guest/initramfs.gz".into()),
                cmdline: "console=ttyS0".into(),
            },
            nics: vec![LaunchNic {
                mac: "52:54:00:00:00:01".parse().unwrap(),
                tap: "h7tap".into(),
                ovn_port: "vm1.node-a".into(),
            }],
            serial_log: "/var/log/vm1.log".into(),
            node: "node-a".into(),
            libvirt_uri: NODE_LIBVIRT_URI.into(),
            migration: Migration::Plain {
                peer_libvirt_uri: "qemu+tcp://10.0.0.11/system".into(),
                migration_uri: MigrationUri::tcp("10.0.0.11").unwrap(),
            },
            ovs_db: OvsDb::node(),
            bridge: DEFAULT_BRIDGE.into(),
            listen: "10.0.0.11:17001".parse().unwrap(),
            token: LaunchToken::Sha256(TokenDigest::of("t0ken")),
            state_file: "/var/lib/roam/state.json".into(),
            mode: Mode::Boot,
            kvm: false,
            instance: Some("vm1-launcher".into()),
            image_root: None,
            pki_dir: None,
        }
    }

    #[test]
    fn renders_the_flags_a_launcher_pod_has_always_carried() {
        let digest = TokenDigest::of("t0ken").to_string();
        assert_eq!(
            example().to_args(),
            words(&[
                "--name",
                "ns_vm1",
                "--vcpus",
                "1",
                "--memory-mib",
                "256",
                "--kernel",
                "/guest/vmlinuz",
                "--initrd",
                "/guest/initramfs.gz",
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
                "--ovs-db",
                "unix:/run/openvswitch/db.sock",
                "--peer-libvirt-uri",
                "qemu+tcp://10.0.0.11/system",
                "--migration-uri",
                "tcp://10.0.0.11",
                "--listen",
                "10.0.0.11:17001",
                "--token-sha256",
                &digest,
                "--state-file",
                "/var/lib/roam/state.json",
                "--mode",
                "boot",
                "--instance",
                "vm1-launcher",
            ])
        );
    }

    #[test]
    fn optional_flags_appear_when_they_differ_from_the_default() {
        let mut a = example();
        a.boot = LaunchBoot::Disk {
            image: "/img/vm.raw".into(),
            format: "raw".into(),
            read_only: true,
        };
        a.nics.push(LaunchNic {
            mac: "52:54:00:00:00:02".parse().unwrap(),
            tap: "h7tap1".into(),
            ovn_port: "vlan-port".into(),
        });
        a.bridge = "br-vm".into();
        a.kvm = true;
        a.instance = None;
        a.token = LaunchToken::File("/secret/token".into());
        let args = a.to_args();
        let value = |f: &str| {
            let i = args.iter().position(|a| a == f)?;
            args.get(i + 1).cloned()
        };
        assert_eq!(value(flag::DISK).as_deref(), Some("/img/vm.raw"));
        assert_eq!(value(flag::DISK_FORMAT).as_deref(), Some("raw"));
        assert_eq!(value(flag::DISK_ACCESS).as_deref(), Some(READ_ONLY));
        assert_eq!(
            value(flag::NICS).as_deref(),
            Some("52:54:00:00:00:01/h7tap/vm1.node-a,52:54:00:00:00:02/h7tap1/vlan-port")
        );
        assert_eq!(value(flag::BRIDGE).as_deref(), Some("br-vm"));
        assert_eq!(value(flag::TOKEN_FILE).as_deref(), Some("/secret/token"));
        assert_eq!(args.last().map(String::as_str), Some(flag::KVM));
        for absent in [flag::MAC, flag::KERNEL, flag::INSTANCE, flag::TOKEN_SHA256] {
            assert!(!args.iter().any(|a| a == absent), "{absent} in {args:?}");
        }
        assert_eq!(LaunchArgs::parse(&args).unwrap(), a);
    }

    #[test]
    fn defaults_fill_what_is_not_given() {
        let mut args = example().to_args();
        let i = args.iter().position(|a| a == flag::CMDLINE).unwrap();
        args.drain(i..i + 2);
        let i = args.iter().position(|a| a == flag::INSTANCE).unwrap();
        args.drain(i..i + 2);
        let a = LaunchArgs::parse(&args).unwrap();
        assert_eq!(a.bridge, DEFAULT_BRIDGE);
        assert!(!a.kvm);
        assert_eq!(a.instance, None);
        assert!(matches!(a.boot, LaunchBoot::Kernel { ref cmdline, .. } if cmdline.is_empty()));
        args.extend(words(&["--instance", " "]));
        assert_eq!(LaunchArgs::parse(&args).unwrap().instance, None);
        let mut disk = example();
        disk.boot = LaunchBoot::Disk {
            image: "/d.qcow2".into(),
            format: "x".into(),
            read_only: false,
        };
        let mut args = disk.to_args();
        let i = args.iter().position(|a| a == flag::DISK_FORMAT).unwrap();
        args.drain(i..i + 2);
        let a = LaunchArgs::parse(&args).unwrap();
        assert!(matches!(a.boot, LaunchBoot::Disk { ref format, .. } if format == "qcow2"));
    }

    #[test]
    fn a_flag_overrides_the_config_file() {
        let file = r#"{"name":"vm1","vcpus":2,"memory_mib":128,"kvm":true,"instance":null,
                      "nics":[{"mac":"52:54:00:00:00:01","tap":"a","ovn_port":"pa"},
                              {"mac":"52:54:00:00:00:02","tap":"b","ovn_port":"pb"}]}"#;
        let mut args = example().to_args();
        for f in [flag::VCPUS, flag::MAC, flag::TAP, flag::OVN_PORT] {
            let i = args.iter().position(|a| a == f).unwrap();
            args.drain(i..i + 2);
        }
        args.extend(words(&["--memory_mib", "512"]));
        let a = LaunchArgs::parse_with_file(file, &args).unwrap();
        assert_eq!(a.name, "ns_vm1", "the flag wins");
        assert_eq!(a.vcpus, 2, "the file's");
        assert_eq!(a.memory_mib, 512, "the flag wins, written with _");
        assert!(a.kvm);
        let ports: Vec<&str> = a.nics.iter().map(|n| n.ovn_port.as_str()).collect();
        assert_eq!(ports, ["pa", "pb"]);
    }

    #[test]
    fn a_bad_config_file_is_named() {
        let args = example().to_args();
        for (file, expect) in [
            ("[1]", "one JSON object"),
            ("{", "not JSON"),
            (r#"{"bogus":1}"#, "unknown key \"bogus\""),
            (r#"{"--name":"x"}"#, "unknown key"),
            (r#"{"vcpus":"2"}"#, "is not a whole number"),
            (r#"{"name":2}"#, "is not a string"),
            (r#"{"kvm":"yes"}"#, "is not true or false"),
            (r#"{"nics":[{"mac":"m"}]}"#, "key \"nics\""),
        ] {
            let err = LaunchArgs::parse_with_file(file, &args)
                .unwrap_err()
                .to_string();
            assert!(
                err.starts_with("--config: ") && err.contains(expect),
                "{file}: {err:?} should mention {expect:?}"
            );
        }
    }

    #[test]
    fn bad_flags_are_named_with_what_is_expected() {
        let cases: &[(&[&str], &str)] = &[
            (&["--vcpus", "two"], "--vcpus: \"two\": not a number"),
            (
                &["--vcpus", "4294967296"],
                "--vcpus: \"4294967296\": not a number",
            ),
            (
                &["--memory-mib", "-1"],
                "--memory-mib: \"-1\": not a number",
            ),
            (&["--bogus", "x"], "--bogus: unknown flag"),
            (&["name"], "\"name\": flags look like --FLAG VALUE"),
            (&["--mac", "zz"], "--mac: bad mac"),
            (
                &["--migration-uri", "10.0.0.1"],
                "--migration-uri: \"10.0.0.1\": use tcp://HOST",
            ),
            (&["--migration-uri", "tcp://a/b"], "use tcp://HOST"),
            (
                &["--ovs-db", "/run/db.sock"],
                "--ovs-db: \"/run/db.sock\": use unix:PATH",
            ),
            (&["--ovs-db", "tcp:host"], "tcp:HOST:PORT"),
            (
                &["--listen", "localhost"],
                "--listen: \"localhost\": use IP:PORT",
            ),
            (&["--mode", "fly"], "--mode: \"fly\": use boot"),
            (
                &["--disk-access", "ro"],
                "--disk-access: \"ro\": give read-only or read-write",
            ),
            (&["--disk", "/d.qcow2"], "exactly one boot source"),
            (
                &["--state-file", "rel.json"],
                "--state-file: rel.json: use an absolute path",
            ),
            (
                &["--ovn-port", " "],
                "--ovn-port: the OVN port of tap \"h7tap\" is empty",
            ),
            (&["--node", ""], "--node: is empty"),
            (&["--bridge", ""], "--bridge: is empty"),
            (&["--nics", "52:54:00:00:00:02/t2/p2"], "not both"),
            (&["--token-file", "/t"], "exactly one of --token-file"),
            (&["--name"], "--name: needs a value"),
        ];
        for (extra, expect) in cases {
            let mut args = example().to_args();
            args.extend(words(extra));
            let err = LaunchArgs::parse(&args).unwrap_err().to_string();
            assert!(
                err.contains(expect),
                "{extra:?}: {err:?} should say {expect:?}"
            );
        }
        let err = LaunchArgs::parse(&words(&["--name", "x"]))
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("--vcpus: is missing"), "{err}");
    }

    #[test]
    fn bad_nic_lists_are_named() {
        let mut base = example().to_args();
        for f in [flag::MAC, flag::TAP, flag::OVN_PORT] {
            let i = base.iter().position(|a| a == f).unwrap();
            base.drain(i..i + 2);
        }
        let err = LaunchArgs::parse(&base).unwrap_err().to_string();
        assert!(
            err.contains("give the VM's NIC: --mac, --tap and --ovn-port"),
            "{err}"
        );
        for (nics, expect) in [
            ("52:54:00:00:00:01/t", "use MAC/TAP/OVN-PORT"),
            (
                "52:54:00:00:00:01/t/ ",
                "the OVN port of tap \"t\" is empty",
            ),
            ("zz/t/p", "--nics: bad mac"),
            ("52:54:00:00:00:01/0123456789abcdef/p", "an interface name"),
            ("52:54:00:00:00:01/t/p q", "without '/', ',' or whitespace"),
        ] {
            let mut args = base.clone();
            args.extend(words(&["--nics", nics]));
            let err = LaunchArgs::parse(&args).unwrap_err().to_string();
            assert!(
                err.contains(expect),
                "{nics:?}: {err:?} should say {expect:?}"
            );
        }
        // blanks around entries are ignored; an empty list is the VM spec's to refuse
        let mut args = base.clone();
        args.extend(words(&["--nics", " 52:54:00:00:00:01/t/p , "]));
        assert_eq!(LaunchArgs::parse(&args).unwrap().nics.len(), 1);
        let mut args = base;
        args.extend(words(&["--nics", ""]));
        assert!(LaunchArgs::parse(&args).unwrap().nics.is_empty());
    }

    #[test]
    fn every_flag_is_a_config_key_and_back() {
        for f in flag::ALL {
            let key = f.trim_start_matches("--").replace('-', "_");
            assert_eq!(known(&key), Some(*f));
            assert_eq!(known(f), Some(*f));
        }
        assert_eq!(known("config"), None, "--config is not a launch argument");
    }

    // values in the forms parse accepts: no ',' or '/' in a tap or port (the --nics separators),
    // a tap an interface name (at most 15 bytes),
    // no blank instance (parse reads it as none)
    fn name() -> impl Strategy<Value = String> {
        "[a-z][a-z0-9._-]{0,20}"
    }

    fn path() -> impl Strategy<Value = PathBuf> {
        "(/[a-z0-9._-]{1,8}){1,4}".prop_map(PathBuf::from)
    }

    fn nic() -> impl Strategy<Value = LaunchNic> {
        (any::<[u8; 6]>(), "[a-z][a-z0-9._-]{0,14}", name()).prop_map(|(mac, tap, ovn_port)| {
            LaunchNic {
                mac: MacAddr::new(mac),
                tap,
                ovn_port,
            }
        })
    }

    fn boot() -> impl Strategy<Value = LaunchBoot> {
        prop_oneof![
            (path(), proptest::option::of(path()), "[ -~]{0,30}").prop_map(
                |(kernel, initrd, cmdline)| LaunchBoot::Kernel {
                    kernel,
                    initrd,
                    cmdline
                }
            ),
            (path(), "qcow2|raw|[a-z0-9]{1,6}", any::<bool>()).prop_map(
                |(image, format, read_only)| LaunchBoot::Disk {
                    image,
                    format,
                    read_only
                }
            ),
        ]
    }

    fn ovs_db() -> impl Strategy<Value = OvsDb> {
        prop_oneof![
            path().prop_map(OvsDb::Unix),
            ("[a-z0-9.:-]{1,20}", any::<u16>()).prop_map(|(host, port)| OvsDb::Tcp { host, port }),
        ]
    }

    fn migration() -> impl Strategy<Value = Migration> {
        prop_oneof![
            ("[a-z+]{1,10}://[a-z0-9./-]{0,20}", "[a-z0-9.:-]{1,20}").prop_map(
                |(peer_libvirt_uri, host)| Migration::Plain {
                    peer_libvirt_uri,
                    migration_uri: MigrationUri::tcp(host).unwrap(),
                }
            ),
            (
                any::<std::net::IpAddr>(),
                any::<u16>(),
                proptest::collection::vec("[a-z0-9][a-z0-9.-]{0,20}", 0..3)
            )
                .prop_map(|(ip, port, allowed_peers)| Migration::Proxy {
                    listen: SocketAddr::new(ip, port),
                    allowed_peers
                }),
        ]
    }

    #[test]
    fn the_migration_proxy_takes_no_plain_uri_and_needs_the_node_identity() {
        let mut a = example();
        a.migration = Migration::Proxy {
            listen: "10.0.0.11:17201".parse().unwrap(),
            allowed_peers: vec!["node-a".into(), "node-b".into()],
        };
        let e = LaunchArgs::parse(&a.to_args()).unwrap_err().to_string();
        assert!(e.contains("--pki-dir"), "{e}");
        a.pki_dir = Some("/var/lib/roam/pki".into());
        let args = a.to_args();
        assert!(
            args.windows(2)
                .any(|w| w[0] == "--allowed-peers" && w[1] == "node-a,node-b"),
            "{args:?}"
        );
        assert_eq!(LaunchArgs::parse(&args).unwrap(), a);
        for (extra, says) in [
            (["--migration-uri", "tcp://10.0.0.11"], "plain TCP"),
            (["--peer-libvirt-uri", "qemu+tcp://x/system"], "plain TCP"),
            (["--allowed-peers", "Node_A"], "lowercase"),
            (["--migration-proxy", "10.0.0.11"], "IP:PORT"),
        ] {
            let mut w = args.clone();
            w.extend(extra.iter().map(|s| s.to_string()));
            let e = LaunchArgs::parse(&w).unwrap_err().to_string();
            assert!(e.contains(says), "{extra:?}: {e}");
        }
        let mut plain = example().to_args();
        plain.extend(["--allowed-peers".to_string(), "node-b".into()]);
        let e = LaunchArgs::parse(&plain).unwrap_err().to_string();
        assert!(e.contains("--migration-proxy"), "{e}");
    }

    fn token() -> impl Strategy<Value = LaunchToken> {
        prop_oneof![
            path().prop_map(LaunchToken::File),
            "[ -~]{1,40}".prop_map(|t| LaunchToken::Sha256(TokenDigest::of(&t))),
        ]
    }

    fn launch_args() -> impl Strategy<Value = LaunchArgs> {
        (
            (name(), any::<u32>(), any::<u64>(), boot()),
            (proptest::collection::vec(nic(), 1..5), path(), name()),
            ("[a-z+]{1,10}://[a-z0-9./-]{0,20}", migration()),
            (
                ovs_db(),
                prop_oneof![Just(DEFAULT_BRIDGE.to_string()), name()],
            ),
            (any::<std::net::IpAddr>(), any::<u16>(), token(), path()),
            (
                prop_oneof![Just(Mode::Boot), Just(Mode::Incoming)],
                any::<bool>(),
                proptest::option::of(name()),
                // a plain path: parse refuses an image root with '.' or '..'
                proptest::option::of("(/[a-z0-9_-]{1,8}){1,4}".prop_map(PathBuf::from)),
                proptest::option::of("(/[a-z0-9_-]{1,8}){1,4}".prop_map(PathBuf::from)),
            ),
        )
            .prop_map(
                |(
                    (name, vcpus, memory_mib, boot),
                    (nics, serial_log, node),
                    (libvirt_uri, migration),
                    (ovs_db, bridge),
                    (ip, port, token, state_file),
                    (mode, kvm, instance, image_root, pki_dir),
                )| LaunchArgs {
                    name,
                    vcpus,
                    memory_mib,
                    boot,
                    nics,
                    serial_log,
                    node,
                    libvirt_uri,
                    // the proxy needs the node's identity
                    pki_dir: match (&migration, pki_dir) {
                        (Migration::Proxy { .. }, None) => Some("/pki".into()),
                        (_, d) => d,
                    },
                    migration,
                    ovs_db,
                    bridge,
                    listen: SocketAddr::new(ip, port),
                    token,
                    state_file,
                    mode,
                    kvm,
                    instance,
                    image_root,
                },
            )
    }

    proptest! {
        #[test]
        fn parse_reads_back_what_to_args_writes(a in launch_args()) {
            prop_assert_eq!(LaunchArgs::parse(&a.to_args()).unwrap(), a);
        }

        #[test]
        fn the_typed_values_read_back_their_text(
            db in ovs_db(),
            host in "[a-z0-9.:-]{1,20}",
            mode in prop_oneof![Just(Mode::Boot), Just(Mode::Incoming)],
        ) {
            prop_assert_eq!(db.to_string().parse::<OvsDb>(), Ok(db));
            let uri = MigrationUri::tcp(host).unwrap();
            prop_assert_eq!(uri.to_string().parse::<MigrationUri>(), Ok(uri));
            prop_assert_eq!(mode.to_string().parse::<Mode>(), Ok(mode));
        }
    }
}
