//! The runtime's input, as plain data: the network configuration (stdin) and the CNI
//! environment variables. Parsing is pure; every problem is an [`Error`] with its CNI code.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

use crate::error::{Error, Result};

/// CNI versions roam-cni speaks, oldest first.
pub const SUPPORTED_VERSIONS: &[&str] = &["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];
/// The version roam-cni answers VERSION with.
pub const LATEST: &str = "1.1.0";
/// Default OVSDB endpoint of the node's Open_vSwitch database.
pub const DEFAULT_OVS_DB: &str = "unix:/run/openvswitch/db.sock";
/// Default integration bridge.
pub const DEFAULT_BRIDGE: &str = "br-int";
/// Default bound on the wait for the pod's address annotation.
pub const DEFAULT_ANNOTATION_TIMEOUT: Duration = Duration::from_secs(30);

/// A CNI operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    /// Attach the container.
    Add,
    /// Detach the container.
    Del,
    /// Check the attachment against the ADD's result.
    Check,
    /// Report the supported versions.
    Version,
    /// Report whether the plugin can add containers (1.1).
    Status,
    /// Remove attachments the runtime no longer knows (1.1).
    Gc,
}

impl Command {
    /// From `CNI_COMMAND`.
    pub fn parse(s: &str) -> Result<Command> {
        Ok(match s {
            "ADD" => Command::Add,
            "DEL" => Command::Del,
            "CHECK" => Command::Check,
            "VERSION" => Command::Version,
            "STATUS" => Command::Status,
            "GC" => Command::Gc,
            other => {
                return Err(Error::InvalidEnv {
                    var: "CNI_COMMAND",
                    problem: format!(
                        "is {other:?}; expected ADD, DEL, CHECK, VERSION, STATUS or GC"
                    ),
                });
            }
        })
    }

    /// The spelling of `CNI_COMMAND`.
    pub fn as_str(self) -> &'static str {
        match self {
            Command::Add => "ADD",
            Command::Del => "DEL",
            Command::Check => "CHECK",
            Command::Version => "VERSION",
            Command::Status => "STATUS",
            Command::Gc => "GC",
        }
    }

    /// The oldest CNI version that has this command.
    fn since(self) -> &'static str {
        match self {
            Command::Check => "0.4.0",
            Command::Status | Command::Gc => "1.1.0",
            _ => "0.3.0",
        }
    }
}

/// One attachment as the runtime names it (spec key: network name, container ID, ifname).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AttachmentKey {
    /// CNI_CONTAINERID.
    pub container_id: String,
    /// CNI_IFNAME.
    pub ifname: String,
}

/// roam-cni's network configuration (one plugin of a conflist, as the runtime passes it).
#[derive(Clone, Debug, PartialEq)]
pub struct NetConf {
    /// `cniVersion`.
    pub cni_version: String,
    /// `name`: the network's name (part of every attachment's key).
    pub name: String,
    /// `kubeconfig`: the plugin's credentials to read pods (ADD only).
    pub kubeconfig: Option<PathBuf>,
    /// `ovsDb`: the node's Open_vSwitch database.
    pub ovs_db: String,
    /// `bridge`: the integration bridge.
    pub bridge: String,
    /// `annotationTimeoutSeconds`: how long ADD waits for `roam.dev/addresses`.
    pub annotation_timeout: Duration,
    /// `prevResult` (CHECK, DEL).
    pub prev_result: Option<Value>,
    /// `cni.dev/valid-attachments` (GC).
    pub valid_attachments: Option<Vec<AttachmentKey>>,
    /// `txOffloads`: keep (true) or turn off (false) the pod interfaces' transmit offloads;
    /// absent: off when the bridge's datapath is OVS's userspace one (`netdev`), which
    /// cannot take partial checksums or GSO frames from a veth.
    pub tx_offloads: Option<bool>,
}

fn bad(field: &str, problem: impl Into<String>) -> Error {
    Error::InvalidConfig {
        field: field.into(),
        problem: problem.into(),
    }
}

/// Is `v` a version roam-cni speaks?
pub fn is_supported(v: &str) -> bool {
    SUPPORTED_VERSIONS.contains(&v)
}

fn version_key(v: &str) -> (u32, u32, u32) {
    let mut it = v.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    (
        it.next().unwrap_or(0),
        it.next().unwrap_or(0),
        it.next().unwrap_or(0),
    )
}

/// Is version `a` at least `b`?
pub fn at_least(a: &str, b: &str) -> bool {
    version_key(a) >= version_key(b)
}

/// Parse the configuration for `command` from stdin's bytes.
pub fn parse_conf(command: Command, stdin: &[u8]) -> Result<NetConf> {
    let v: Value = serde_json::from_slice(stdin).map_err(|e| Error::Decode(e.to_string()))?;
    let obj = v
        .as_object()
        .ok_or_else(|| bad("(top level)", "must be a JSON object"))?;
    let string = |field: &str| -> Result<Option<String>> {
        match obj.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(other) => Err(bad(field, format!("must be a string, not {other}"))),
        }
    };
    let cni_version =
        string("cniVersion")?.ok_or_else(|| bad("cniVersion", "is required, e.g. \"1.1.0\""))?;
    if !is_supported(&cni_version) {
        return Err(Error::IncompatibleVersion {
            version: cni_version,
            for_command: None,
            supported: SUPPORTED_VERSIONS.to_vec(),
        });
    }
    if !at_least(&cni_version, command.since()) {
        return Err(Error::IncompatibleVersion {
            version: cni_version,
            for_command: Some(command.as_str()),
            supported: SUPPORTED_VERSIONS.to_vec(),
        });
    }
    let name = string("name")?.ok_or_else(|| bad("name", "is required (the network's name)"))?;
    if name.is_empty() {
        return Err(bad("name", "must not be empty"));
    }
    match string("type")?.as_deref() {
        Some("roam-cni") => {}
        Some(other) => return Err(bad("type", format!("is {other:?}, expected \"roam-cni\""))),
        None => return Err(bad("type", "is required (\"roam-cni\")")),
    }
    let kubeconfig = string("kubeconfig")?.map(PathBuf::from);
    if command == Command::Add && kubeconfig.is_none() {
        return Err(bad(
            "kubeconfig",
            "is required: the path of the kubeconfig roam-cni reads pods with",
        ));
    }
    let ovs_db = string("ovsDb")?.unwrap_or_else(|| DEFAULT_OVS_DB.into());
    if roam_ovsdb::Endpoint::parse(&ovs_db).is_err() {
        return Err(bad(
            "ovsDb",
            format!("{ovs_db:?} is not unix:PATH or tcp:HOST:PORT"),
        ));
    }
    let bridge = string("bridge")?.unwrap_or_else(|| DEFAULT_BRIDGE.into());
    if bridge.is_empty() {
        return Err(bad("bridge", "must not be empty"));
    }
    let annotation_timeout = match obj.get("annotationTimeoutSeconds") {
        None | Some(Value::Null) => DEFAULT_ANNOTATION_TIMEOUT,
        Some(v) => match v.as_f64() {
            Some(s) if s > 0.0 && s <= 3600.0 => Duration::from_secs_f64(s),
            _ => {
                return Err(bad(
                    "annotationTimeoutSeconds",
                    format!("{v} is not a number of seconds in (0, 3600]"),
                ));
            }
        },
    };
    let prev_result = obj.get("prevResult").filter(|v| !v.is_null()).cloned();
    if let Some(p) = &prev_result
        && !p.is_object()
    {
        return Err(bad("prevResult", "must be a CNI result object"));
    }
    let valid_attachments = match obj.get("cni.dev/valid-attachments") {
        None | Some(Value::Null) => None,
        Some(Value::Array(list)) => Some(
            list.iter()
                .enumerate()
                .map(|(i, a)| {
                    let get = |k: &str| a.get(k).and_then(Value::as_str).map(str::to_string);
                    match (get("containerID"), get("ifname")) {
                        (Some(container_id), Some(ifname)) => Ok(AttachmentKey {
                            container_id,
                            ifname,
                        }),
                        _ => Err(bad(
                            &format!("cni.dev/valid-attachments[{i}]"),
                            "needs string fields containerID and ifname",
                        )),
                    }
                })
                .collect::<Result<Vec<_>>>()?,
        ),
        Some(_) => {
            return Err(bad(
                "cni.dev/valid-attachments",
                "must be an array of {containerID, ifname}",
            ));
        }
    };
    let tx_offloads = match obj.get("txOffloads") {
        None | Some(Value::Null) => None,
        Some(Value::Bool(b)) => Some(*b),
        Some(other) => {
            return Err(bad(
                "txOffloads",
                format!("must be true or false (absent: decided by the datapath), not {other}"),
            ));
        }
    };
    if command == Command::Gc && valid_attachments.is_none() {
        return Err(bad(
            "cni.dev/valid-attachments",
            "GC needs the list of valid attachments",
        ));
    }
    if command == Command::Check && prev_result.is_none() {
        return Err(bad(
            "prevResult",
            "CHECK needs the result of the preceding ADD",
        ));
    }
    Ok(NetConf {
        cni_version,
        name,
        kubeconfig,
        ovs_db,
        bridge,
        annotation_timeout,
        prev_result,
        valid_attachments,
        tx_offloads,
    })
}

/// The CNI environment of one invocation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CniEnv {
    /// CNI_COMMAND.
    pub command: Command,
    /// CNI_CONTAINERID + CNI_IFNAME (ADD, DEL, CHECK).
    pub key: Option<AttachmentKey>,
    /// CNI_NETNS (required by ADD and CHECK; optional for DEL).
    pub netns: Option<PathBuf>,
    /// CNI_ARGS, parsed.
    pub args: BTreeMap<String, String>,
}

impl CniEnv {
    /// The attachment key (present for ADD, DEL and CHECK).
    pub fn key(&self) -> &AttachmentKey {
        self.key
            .as_ref()
            .expect("ADD, DEL and CHECK environments carry CNI_CONTAINERID and CNI_IFNAME")
    }

    /// K8S_POD_NAMESPACE and K8S_POD_NAME from CNI_ARGS.
    pub fn pod(&self) -> Result<(String, String)> {
        let get = |k: &str| {
            self.args
                .get(k)
                .filter(|v| !v.is_empty())
                .cloned()
                .ok_or_else(|| Error::InvalidEnv {
                    var: "CNI_ARGS",
                    problem: format!(
                        "has no {k}; the runtime passes K8S_POD_NAMESPACE and K8S_POD_NAME"
                    ),
                })
        };
        Ok((get("K8S_POD_NAMESPACE")?, get("K8S_POD_NAME")?))
    }
}

/// The spec's container ID rule: alphanumeric first, then alphanumerics, `_`, `.`, `-`.
pub fn valid_container_id(id: &str) -> bool {
    let mut chars = id.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

/// The spec's interface name rule.
pub fn valid_ifname(name: &str) -> bool {
    !name.is_empty()
        && name.len() < 16
        && name != "."
        && name != ".."
        && !name
            .chars()
            .any(|c| c == '/' || c == ':' || c.is_whitespace())
}

/// Parse the CNI environment through `get` (e.g. `std::env::var`).
pub fn parse_env(get: impl Fn(&str) -> Option<String>) -> Result<CniEnv> {
    let command = Command::parse(&get("CNI_COMMAND").ok_or(Error::InvalidEnv {
        var: "CNI_COMMAND",
        problem: "is not set".into(),
    })?)?;
    let needs_key = matches!(command, Command::Add | Command::Del | Command::Check);
    let non_empty = |var: &'static str| get(var).filter(|v| !v.is_empty());
    let key = if needs_key {
        let container_id = non_empty("CNI_CONTAINERID").ok_or(Error::InvalidEnv {
            var: "CNI_CONTAINERID",
            problem: format!("is not set ({} needs it)", command.as_str()),
        })?;
        if !valid_container_id(&container_id) {
            return Err(Error::InvalidEnv {
                var: "CNI_CONTAINERID",
                problem: format!(
                    "{container_id:?} is invalid: alphanumeric first, then alphanumerics, '_', '.', '-'"
                ),
            });
        }
        let ifname = non_empty("CNI_IFNAME").ok_or(Error::InvalidEnv {
            var: "CNI_IFNAME",
            problem: format!("is not set ({} needs it)", command.as_str()),
        })?;
        if !valid_ifname(&ifname) {
            return Err(Error::InvalidEnv {
                var: "CNI_IFNAME",
                problem: format!(
                    "{ifname:?} is not a valid interface name (1–15 characters, no '/', ':' or spaces)"
                ),
            });
        }
        Some(AttachmentKey {
            container_id,
            ifname,
        })
    } else {
        None
    };
    let netns = non_empty("CNI_NETNS").map(PathBuf::from);
    if matches!(command, Command::Add | Command::Check) && netns.is_none() {
        return Err(Error::InvalidEnv {
            var: "CNI_NETNS",
            problem: format!(
                "is not set ({} needs the container's network namespace)",
                command.as_str()
            ),
        });
    }
    let mut args = BTreeMap::new();
    if let Some(raw) = non_empty("CNI_ARGS") {
        for pair in raw.split(';').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').ok_or_else(|| Error::InvalidEnv {
                var: "CNI_ARGS",
                problem: format!("{pair:?} is not KEY=VALUE (pairs are separated by ';')"),
            })?;
            args.insert(k.to_string(), v.to_string());
        }
    }
    Ok(CniEnv {
        command,
        key,
        netns,
        args,
    })
}
