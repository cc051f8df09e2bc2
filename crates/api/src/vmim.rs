//! `VirtualMachineMigration` (short name `vmim`): one live migration of one VM, from the node
//! it runs on to a target node. Created by the controller when a VM is annotated with
//! `roam.dev/migrate-to` (or by a user directly); deleting it while it runs aborts it.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, MicroTime, Time};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The phases of a migration, as its status shows them.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    Deserialize,
    Serialize,
    JsonSchema,
)]
pub enum Phase {
    /// Accepted, not yet checked.
    #[default]
    Pending,
    /// The target launcher pod is being created and scheduled.
    TargetScheduling,
    /// The target pod runs, its shim answers and the VM's port exists on the target.
    TargetReady,
    /// libvirt copies memory.
    Migrating,
    /// The source is paused for the final copy or the guest runs on the target: the VM's
    /// port is activated on the target (its RARP), then the source pod goes.
    Switchover,
    /// The guest runs on the target with its address; the source pod is gone.
    Succeeded,
    /// It could not be done; the guest runs on the source with its address.
    Failed,
    /// Deleted (or asked to stop) before switchover; the guest runs on the source.
    Aborted,
}

impl Phase {
    /// Succeeded, Failed or Aborted.
    pub fn is_terminal(self) -> bool {
        matches!(self, Phase::Succeeded | Phase::Failed | Phase::Aborted)
    }
}

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
    /// At the timeout, switch to post-copy instead of giving up: the guest runs on the target
    /// at once and fetches the rest of its memory from the source (a failure then loses the
    /// guest). The nodes need `vm.unprivileged_userfaultfd=1` (QEMU runs unprivileged).
    #[serde(default)]
    pub allow_post_copy: bool,
    /// Give up (and roll back) after this many seconds (default 300); with `allowPostCopy`,
    /// switch to post-copy then.
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
    /// That pod's UID, recorded when roam created it (`creating` just before): a pod of the
    /// name with another UID is not the migration's.
    #[serde(
        default,
        rename = "targetPodUID",
        skip_serializing_if = "Option::is_none"
    )]
    pub target_pod_uid: Option<String>,
    /// Memory transfer progress (libvirt job statistics, via the source shim).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<Progress>,
    /// libvirt's measured VM downtime, e.g. `"87ms"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub downtime: Option<String>,
    /// libvirt's measured VM downtime in ms.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub downtime_ms: Option<u64>,
    /// From the source's pause to the target's OVN agent carrying every one of the VM's
    /// ports (activated by the guest's RARP, as the southbound database shows it), in ms;
    /// recorded when the controller reads the southbound database (`--sb`).
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
    /// When the controller moved the migration into each phase, in order (microseconds):
    /// where its time went.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub phase_transitions: Vec<PhaseTransition>,
}

/// One entry of [`VirtualMachineMigrationStatus::phase_transitions`].
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PhaseTransition {
    /// The phase entered.
    pub phase: Phase,
    /// When.
    pub time: MicroTime,
}

impl VirtualMachineMigrationStatus {
    /// Set the phase; a change is recorded in [`Self::phase_transitions`] at `at`.
    pub fn enter(&mut self, phase: Phase, at: impl FnOnce() -> MicroTime) {
        if self.phase != phase || self.phase_transitions.is_empty() {
            self.phase_transitions
                .push(PhaseTransition { phase, time: at() });
        }
        self.phase = phase;
    }
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
    fn each_phase_change_is_recorded_once_with_its_time() {
        let at = |s: i64| MicroTime(k8s_openapi::jiff::Timestamp::from_second(s).unwrap());
        let mut st = VirtualMachineMigrationStatus::default();
        st.enter(Phase::Pending, || at(1));
        st.enter(Phase::Pending, || at(2));
        st.enter(Phase::TargetScheduling, || at(3));
        st.enter(Phase::TargetScheduling, || at(4));
        st.enter(Phase::Migrating, || at(5));
        st.enter(Phase::Succeeded, || at(6));
        let got: Vec<(Phase, MicroTime)> = st
            .phase_transitions
            .iter()
            .map(|t| (t.phase, t.time.clone()))
            .collect();
        assert_eq!(
            got,
            [
                (Phase::Pending, at(1)),
                (Phase::TargetScheduling, at(3)),
                (Phase::Migrating, at(5)),
                (Phase::Succeeded, at(6)),
            ]
        );
        assert_eq!(st.phase, Phase::Succeeded);
        // micro-second precision on the wire
        let t = MicroTime(k8s_openapi::jiff::Timestamp::from_microsecond(1_500_123).unwrap());
        let j = serde_json::to_value(PhaseTransition {
            phase: Phase::Switchover,
            time: t,
        })
        .unwrap();
        assert_eq!(
            j,
            serde_json::json!({"phase": "Switchover", "time": "1970-01-01T00:00:01.500123Z"})
        );
    }

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
