//! `VirtualMachine` (short name `vm`): a VM that runs in a launcher pod on some node, keeps
//! its addresses wherever it runs, and moves when annotated with `roam.dev/migrate-to`.

use std::collections::BTreeMap;

pub use k8s_openapi::api::core::v1::Toleration;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use roam_contract::keys::MIGRATE_TO;
/// The value of [`MIGRATE_TO`] that lets the controller pick the target node.
pub const MIGRATE_TO_AUTO: &str = "auto";

/// A virtual machine. Namespaced.
#[derive(CustomResource, Clone, Debug, PartialEq, Deserialize, Serialize, JsonSchema)]
#[kube(
    group = "roam.dev",
    version = "v1alpha1",
    kind = "VirtualMachine",
    plural = "virtualmachines",
    shortname = "vm",
    namespaced,
    status = "VirtualMachineStatus",
    printcolumn = r#"{"name":"PHASE","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"NODE","type":"string","jsonPath":".status.node"}"#,
    printcolumn = r#"{"name":"IP","type":"string","jsonPath":".status.interfaces[0].ip"}"#,
    printcolumn = r#"{"name":"AGE","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineSpec {
    /// Virtual CPUs (1–255).
    pub cpu: u32,
    /// Memory in MiB (at least 32).
    #[serde(rename = "memoryMiB")]
    pub memory_mib: u64,
    /// How the guest boots.
    pub boot: Boot,
    /// The VM's interfaces, each on its own Network. Empty: one overlay `eth0` with a
    /// DHCP lease from OVN.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interfaces: Vec<VmInterface>,
    /// Pin the VM to this node at start; otherwise the scheduler picks one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Labels a node must carry to run the VM (at start without `node`, and for
    /// `migrate-to=auto`); its launcher pods carry the same selector.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// Taints the VM tolerates (as a pod's): a node tainted `NoSchedule` or `NoExecute` takes
    /// the VM only if one of these tolerates it; its launcher pods carry them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
}

/// Boot source: a kernel (direct boot) or a disk image, paths on the node.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum Boot {
    /// Direct kernel boot.
    Kernel {
        /// Kernel image path.
        kernel: String,
        /// Initramfs path.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        initrd: Option<String>,
        /// Kernel command line.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        cmdline: Option<String>,
    },
    /// A disk image (virtio) on the nodes, in the administrator's image store: attached
    /// read-only (every VM that boots the image shares it; a disk the VM writes is a
    /// `volume`).
    Disk {
        /// Image path.
        image: String,
        /// `qcow2` or `raw`.
        #[serde(default = "qcow2")]
        format: String,
    },
    /// A disk image (virtio) that is a file on a PersistentVolumeClaim of the VM's namespace
    /// (a filesystem volume), read and written by the VM. A VM booted from a volume migrates
    /// only when the claim is ReadWriteMany (both nodes mount it; the disk does not move).
    #[serde(rename_all = "camelCase")]
    Volume {
        /// The PersistentVolumeClaim, in the VM's namespace.
        claim_name: String,
        /// The image file, relative to the volume's root (default `disk.img`).
        #[serde(default = "disk_img")]
        file: String,
        /// `qcow2` or `raw`.
        #[serde(default = "qcow2")]
        format: String,
    },
}

fn disk_img() -> String {
    "disk.img".into()
}

fn qcow2() -> String {
    "qcow2".into()
}

/// One interface of a VM: the fields of a pod's per-interface request
/// (`roam_contract::annotation::InterfaceRequest`), typed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VmInterface {
    /// Interface name in the guest's view (`eth0`, …); names the Address's interface.
    pub name: String,
    /// `overlay` (default) or `underlay`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// The Network to draw from (default: the overlay network, or the VLAN's network).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<String>,
    /// Address by DHCP from OVN (the default for VMs), else static.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dhcp: Option<bool>,
    /// Static IP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip: Option<String>,
    /// Static netmask (underlay).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mask: Option<String>,
    /// Static gateway.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<String>,
    /// Requested MAC; otherwise the Address's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    /// Default route metric.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metric: Option<u32>,
    /// RFC 4594 service class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_class: Option<String>,
    /// VLAN tag (underlay).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vlan: Option<u16>,
}

/// Where a VM is in its life.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
pub enum VmPhase {
    /// Accepted, nothing started.
    #[default]
    Pending,
    /// Its launcher pod waits for a node.
    Scheduling,
    /// The launcher pod runs; the guest is starting.
    Starting,
    /// The guest runs.
    Running,
    /// A migration is under way (the guest runs on the source until switchover).
    Migrating,
    /// The guest is stopped.
    Stopped,
    /// It cannot run; see the conditions.
    Failed,
}

/// What the controller observed of a VM.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineStatus {
    /// Phase.
    #[serde(default)]
    pub phase: VmPhase,
    /// The node the guest runs on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The launcher pod carrying the guest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// That pod's UID, recorded when roam created it (`creating` just before): a pod of the
    /// name with another UID is not the VM's.
    #[serde(default, rename = "podUID", skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
    /// The interfaces' addresses (the same before and after a migration).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interfaces: Vec<VmInterfaceStatus>,
    /// The migration in progress, if any (a VirtualMachineMigration's name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub migration: Option<String>,
    /// The TCP port the VM's roam-shim serves its API on (host network, on every node the
    /// VM runs on), allocated by the controller.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shim_port: Option<u16>,
    /// `Ready`, `Migrating`, and failure reasons.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The generation this status is for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Guest resets seen (a reboot from inside, a kernel panic with `panic=N`, a triple fault,
    /// a reset from outside); absent until the first. Each new one is also a Warning Event
    /// `GuestReset`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest_resets: Option<GuestResets>,
}

/// Guest resets, as the launchers' shims counted them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GuestResets {
    /// Resets over the VM's life (every launcher pod it ran in).
    pub total: u64,
    /// The launcher pod of the last count.
    pub pod: String,
    /// That pod's shim's own count (since the shim started).
    pub shim_count: u64,
}

/// One interface's address.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VmInterfaceStatus {
    /// Interface name.
    pub name: String,
    /// IP.
    pub ip: String,
    /// MAC.
    pub mac: String,
    /// The Address object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
}

/// What is wrong with a `roam.dev/migrate-to` value.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum MigrateToError {
    /// Empty.
    #[error("annotation {MIGRATE_TO} is empty; set it to a node name or \"{MIGRATE_TO_AUTO}\"")]
    Empty,
    /// Not a valid node name.
    #[error(
        "annotation {MIGRATE_TO}={0:?} is not a node name (lowercase RFC 1123 subdomain) nor \"{MIGRATE_TO_AUTO}\""
    )]
    NotANodeName(String),
}

/// The target a `roam.dev/migrate-to` value asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MigrateTo {
    /// This node.
    Node(String),
    /// Any other ready node.
    Auto,
}

/// Parse a `roam.dev/migrate-to` value.
pub fn parse_migrate_to(value: &str) -> Result<MigrateTo, MigrateToError> {
    let v = value.trim();
    if v.is_empty() {
        return Err(MigrateToError::Empty);
    }
    if v == MIGRATE_TO_AUTO {
        return Ok(MigrateTo::Auto);
    }
    if !is_dns_subdomain(v) {
        return Err(MigrateToError::NotANodeName(value.into()));
    }
    Ok(MigrateTo::Node(v.into()))
}

/// Whether `name` is a DNS subdomain as Kubernetes names most objects (Nodes,
/// PersistentVolumeClaims): at most 253 bytes of dot-separated labels, each 1–63 lowercase
/// letters, digits and '-', not starting or ending with '-'.
pub fn is_dns_subdomain(name: &str) -> bool {
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && l.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    !name.is_empty() && name.len() <= 253 && name.split('.').all(label_ok)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::CustomResourceExt;

    #[test]
    fn migrate_to_values() {
        assert_eq!(
            parse_migrate_to("node-b"),
            Ok(MigrateTo::Node("node-b".into()))
        );
        assert_eq!(parse_migrate_to(" auto "), Ok(MigrateTo::Auto));
        assert_eq!(parse_migrate_to(""), Err(MigrateToError::Empty));
        for bad in ["Node-B", "node_b", "-x", "a..b", "node b", "x-"] {
            assert!(
                matches!(parse_migrate_to(bad), Err(MigrateToError::NotANodeName(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn crd_is_namespaced_with_short_name_and_columns() {
        let crd = VirtualMachine::crd();
        assert_eq!(crd.spec.scope, "Namespaced");
        assert_eq!(
            crd.spec.names.short_names.as_deref(),
            Some(&["vm".to_string()][..])
        );
        let cols: Vec<String> = crd.spec.versions[0]
            .additional_printer_columns
            .as_ref()
            .unwrap()
            .iter()
            .map(|c| c.name.clone())
            .collect();
        assert_eq!(cols, ["PHASE", "NODE", "IP", "AGE"]);
    }

    #[test]
    fn spec_reads_the_documented_shape() {
        let spec: VirtualMachineSpec = serde_json::from_value(serde_json::json!({
            "cpu": 1, "memoryMiB": 256,
            "boot": {"kernel": {"kernel": "/k", "initrd": "/i", "cmdline": "console=ttyS0"}},
            "interfaces": [{"name": "eth0", "serviceClass": "lowlatency"}]
        }))
        .unwrap();
        assert_eq!(spec.memory_mib, 256);
        assert!(matches!(spec.boot, Boot::Kernel { .. }));
        assert_eq!(
            spec.interfaces[0].service_class.as_deref(),
            Some("lowlatency")
        );
    }
}
