//! `VirtualMachineMigration` (short name `vmim`): one live migration of one VM, from the node
//! it runs on to a target node. Created by the controller when a VM is annotated with
//! `roam.dev/migrate-to` (or by a user directly); deleting it while it runs aborts it.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::migration::Phase;

/// A live migration. Namespaced (in the VM's namespace).
#[derive(CustomResource, Clone, Debug, PartialEq, Deserialize, Serialize, JsonSchema)]
#[kube(
    group = "roam.dev",
    version = "v1alpha1",
    kind = "VirtualMachineMigration",
    plural = "virtualmachinemigrations",
    shortname = "vmim",
    namespaced,
    status = "VirtualMachineMigrationStatus",
    printcolumn = r#"{"name":"VM","type":"string","jsonPath":".spec.vm"}"#,
    printcolumn = r#"{"name":"PHASE","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"SOURCE","type":"string","jsonPath":".status.sourceNode"}"#,
    printcolumn = r#"{"name":"TARGET","type":"string","jsonPath":".status.targetNode"}"#,
    printcolumn = r#"{"name":"PROGRESS","type":"string","jsonPath":".status.progress.percent"}"#,
    printcolumn = r#"{"name":"DOWNTIME","type":"string","jsonPath":".status.downtime"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineMigrationSpec {
    /// The VirtualMachine (same namespace).
    pub vm: String,
    /// Target node; `None` or `auto`: the controller picks another ready node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_node: Option<String>,
    /// Migration bandwidth limit in MiB/s (default: unlimited).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bandwidth_mib_per_second: Option<u64>,
    /// Largest acceptable pause for the final copy, in ms (libvirt's max downtime; default 300).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_downtime_ms: Option<u64>,
    /// Let QEMU throttle the guest's vCPUs when memory does not converge.
    #[serde(default)]
    pub auto_converge: bool,
    /// Allow switching to post-copy when pre-copy does not converge.
    #[serde(default)]
    pub allow_post_copy: bool,
    /// Give up (and roll back) after this many seconds (default 300).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<u64>,
}

/// What the controller observed of a migration.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineMigrationStatus {
    /// Phase: Pending → TargetScheduling → TargetReady → Migrating → Switchover → Succeeded,
    /// or Failed / Aborted (the VM keeps running on the source).
    #[serde(default)]
    pub phase: Phase,
    /// The node the VM ran on when the migration started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_node: Option<String>,
    /// The node it moves to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_node: Option<String>,
    /// The source launcher pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_pod: Option<String>,
    /// The target launcher pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_pod: Option<String>,
    /// Memory transfer progress (libvirt job statistics, via the source shim).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<Progress>,
    /// libvirt's measured VM downtime, e.g. `"87ms"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub downtime: Option<String>,
    /// libvirt's measured VM downtime in ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub downtime_ms: Option<u64>,
    /// From the source's pause to the route flip committed in OVN, in ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub switchover_ms: Option<u64>,
    /// The guest's pause as the shims saw it, in ms: the source's `suspended-for-migration`
    /// event to the target's `resumed-after-migration` event. Longer than `downtimeMs`
    /// (QEMU's figure) by libvirt's hand-over to the target; unknown when the controller
    /// restarted during the migration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pause_ms: Option<u64>,
    /// libvirt's job time, in ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_ms: Option<u64>,
    /// Why it failed or was aborted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The source shim's job number of this migration (once started).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_id: Option<u64>,
    /// When it started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_time: Option<Time>,
    /// When it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_time: Option<Time>,
    /// Conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// Memory transfer progress.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Progress {
    /// Percent of memory transferred, as text for the printer column (e.g. `"73%"`). (Not a
    /// defaulted string: API servers ≤ 1.20 reject a CRD with `default: ''`.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub percent: Option<String>,
    /// Guest memory, bytes.
    #[serde(default)]
    pub memory_total: u64,
    /// Transferred so far, bytes.
    #[serde(default)]
    pub memory_processed: u64,
    /// Left to transfer, bytes.
    #[serde(default)]
    pub memory_remaining: u64,
    /// Pre-copy iteration.
    #[serde(default)]
    pub iteration: u64,
    /// Pages dirtied per second.
    #[serde(default)]
    pub dirty_rate: u64,
}

impl Progress {
    /// The printer column's text for `processed` of `total`.
    pub fn percent_of(processed: u64, total: u64) -> String {
        if total == 0 {
            return "0%".into();
        }
        format!("{}%", (processed.min(total) * 100) / total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::CustomResourceExt;

    #[test]
    fn crd_columns() {
        let crd = VirtualMachineMigration::crd();
        assert_eq!(crd.spec.scope, "Namespaced");
        assert_eq!(
            crd.spec.names.short_names.as_deref(),
            Some(&["vmim".to_string()][..])
        );
        let cols: Vec<String> = crd.spec.versions[0]
            .additional_printer_columns
            .as_ref()
            .unwrap()
            .iter()
            .map(|c| c.name.clone())
            .collect();
        assert_eq!(
            cols,
            ["VM", "PHASE", "SOURCE", "TARGET", "PROGRESS", "DOWNTIME"]
        );
    }

    #[test]
    fn percent() {
        assert_eq!(Progress::percent_of(0, 0), "0%");
        assert_eq!(Progress::percent_of(50, 200), "25%");
        assert_eq!(Progress::percent_of(300, 200), "100%");
    }
}
