//! A new migration's spec, checked against its VM before anything is created. A refusal is
//! handed to [`super::step`] as [`super::Observed::refused`], which ends the migration Failed
//! with the reason and touches nothing.

use kube::ResourceExt;
use roam_shim_api::api::{MAX_BANDWIDTH_MIB_S, MAX_DOWNTIME_MS, MAX_TIMEOUT_S};

use roam_api::{VirtualMachine, VirtualMachineMigration, VirtualMachineMigrationStatus, VmPhase};

/// Check a Pending migration `m` of `vm` and record its source and target in `st`.
/// `Ok(node)`: acceptable if that target node exists and is Ready (the caller looks);
/// `Err(why)`: refused, with what to do.
pub fn accept(
    m: &VirtualMachineMigration,
    vm: Option<&VirtualMachine>,
    st: &mut VirtualMachineMigrationStatus,
) -> Result<String, String> {
    let name = m.name_any();
    numbers_problem(m)?;
    let Some(vm) = vm else {
        return Err(format!(
            "VirtualMachine {}/{} does not exist",
            m.namespace().unwrap_or_default(),
            m.spec.vm
        ));
    };
    if vm.metadata.deletion_timestamp.is_some() {
        return Err(format!(
            "VirtualMachine {}/{} is being deleted",
            m.namespace().unwrap_or_default(),
            m.spec.vm
        ));
    }
    let vs = vm.status.clone().unwrap_or_default();
    st.source_node = vs.node.clone();
    st.source_pod = vs.pod.clone();
    st.target_node = m.spec.target_node.clone();
    let ours = vs.migration.as_deref() == Some(name.as_str());
    match &vs.migration {
        Some(other) if !ours => {
            return Err(format!(
                "migration {other} of this VM is under way; wait for it to end"
            ));
        }
        _ => {}
    }
    if !(vs.phase == VmPhase::Running || (vs.phase == VmPhase::Migrating && ours)) {
        return Err(format!("the VM is {:?}, not Running", vs.phase));
    }
    match (&m.spec.target_node, &vs.node) {
        (None, _) => Err("no target node: set spec.targetNode (or annotate \
             roam.dev/migrate-to=NODE|auto with another Ready node)"
            .into()),
        (Some(t), Some(s)) if t == s => {
            Err(format!("the VM already runs on {t}; name another node"))
        }
        (Some(t), _) => Ok(t.clone()),
    }
}

/// The migration's numbers as the source shim would take them (the same bounds as
/// [`roam_shim_api::api::MigrateRequest::validate`]), checked before a target launcher
/// exists rather than refused by the shim after.
fn numbers_problem(m: &VirtualMachineMigration) -> Result<(), String> {
    let out_of = |field: &str, v: Option<u64>, max: u64, none: &str| match v {
        Some(v) if !(1..=max).contains(&v) => Err(format!(
            "spec.{field} {v}: use 1 to {max}, or leave it out for {none}"
        )),
        _ => Ok(()),
    };
    out_of(
        "bandwidthMibPerSecond",
        m.spec.bandwidth_mib_per_second,
        MAX_BANDWIDTH_MIB_S,
        "no limit",
    )?;
    out_of(
        "maxDowntimeMs",
        m.spec.max_downtime_ms,
        MAX_DOWNTIME_MS,
        "libvirt's 300 ms",
    )?;
    out_of(
        "timeoutSeconds",
        m.spec.timeout_seconds,
        MAX_TIMEOUT_S,
        "the shim's default",
    )
}

/// The refusal when the target node of [`accept`] is missing or not Ready.
pub fn target_not_ready(node: &str) -> String {
    format!("target node {node} does not exist or is not Ready")
}

/// The refusal when the target node of [`accept`] cannot take the VM's launcher pod
/// (`why`: [`crate::placement::unfit`]'s answer).
pub fn target_unfit(node: &str, why: &str) -> String {
    format!(
        "target node {node} cannot take the VM: {why}; name another node or use migrate-to=auto"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use roam_api::{VirtualMachineMigrationSpec, VirtualMachineSpec, VirtualMachineStatus};

    fn migration(target: Option<&str>) -> VirtualMachineMigration {
        let mut m = VirtualMachineMigration::new(
            "m1",
            VirtualMachineMigrationSpec {
                vm: "demo".into(),
                target_node: target.map(Into::into),
                bandwidth_mib_per_second: None,
                max_downtime_ms: None,
                auto_converge: false,
                allow_post_copy: false,
                timeout_seconds: None,
            },
        );
        m.metadata.namespace = Some("ns".into());
        m
    }

    fn vm(phase: VmPhase, migration: Option<&str>) -> VirtualMachine {
        let spec: VirtualMachineSpec = serde_json::from_value(serde_json::json!({
            "cpu": 1, "memoryMiB": 256,
            "boot": {"kernel": {"kernel": "/g/vmlinuz"}}
        }))
        .unwrap();
        let mut v = VirtualMachine::new("demo", spec);
        v.status = Some(VirtualMachineStatus {
            phase,
            node: Some("node-a".into()),
            pod: Some("demo-launcher".into()),
            migration: migration.map(Into::into),
            ..Default::default()
        });
        v
    }

    fn check(m: &VirtualMachineMigration, v: Option<&VirtualMachine>) -> Result<String, String> {
        accept(m, v, &mut VirtualMachineMigrationStatus::default())
    }

    #[test]
    fn a_running_vm_and_another_node_are_accepted_and_recorded() {
        let mut st = VirtualMachineMigrationStatus::default();
        let r = accept(
            &migration(Some("node-b")),
            Some(&vm(VmPhase::Running, None)),
            &mut st,
        );
        assert_eq!(r, Ok("node-b".into()));
        assert_eq!(st.source_node.as_deref(), Some("node-a"));
        assert_eq!(st.source_pod.as_deref(), Some("demo-launcher"));
        assert_eq!(st.target_node.as_deref(), Some("node-b"));
        // its own claim of the VM (a reconcile that died after it) is no obstacle
        let r = check(
            &migration(Some("node-b")),
            Some(&vm(VmPhase::Migrating, Some("m1"))),
        );
        assert_eq!(r, Ok("node-b".into()));
    }

    #[test]
    fn refusals_say_what_to_do() {
        let m = migration(Some("node-b"));
        let err = |r: Result<String, String>| r.unwrap_err();
        assert_eq!(
            err(check(&m, None)),
            "VirtualMachine ns/demo does not exist"
        );
        assert!(
            err(check(&m, Some(&vm(VmPhase::Migrating, Some("m0")))))
                .contains("m0 of this VM is under way")
        );
        assert!(
            err(check(&m, Some(&vm(VmPhase::Running, Some("m0")))))
                .contains("m0 of this VM is under way")
        );
        assert_eq!(
            err(check(&m, Some(&vm(VmPhase::Starting, None)))),
            "the VM is Starting, not Running"
        );
        let mut deleting = vm(VmPhase::Running, None);
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        assert_eq!(
            err(check(&m, Some(&deleting))),
            "VirtualMachine ns/demo is being deleted"
        );
        assert!(
            err(check(&migration(None), Some(&vm(VmPhase::Running, None))))
                .contains("set spec.targetNode")
        );
        assert!(
            err(check(
                &migration(Some("node-a")),
                Some(&vm(VmPhase::Running, None))
            ))
            .contains("already runs on node-a")
        );
    }

    #[test]
    fn numbers_the_shim_would_refuse_are_refused_first() {
        let v = vm(VmPhase::Running, None);
        for (set, field) in [
            (
                Box::new(|m: &mut VirtualMachineMigration| {
                    m.spec.bandwidth_mib_per_second = Some(0)
                }) as Box<dyn Fn(&mut VirtualMachineMigration)>,
                "spec.bandwidthMibPerSecond 0: use 1 to 1048576",
            ),
            (
                Box::new(|m| m.spec.max_downtime_ms = Some(MAX_DOWNTIME_MS + 1)),
                "spec.maxDowntimeMs 60001: use 1 to 60000",
            ),
            (
                Box::new(|m| m.spec.timeout_seconds = Some(0)),
                "spec.timeoutSeconds 0",
            ),
        ] {
            let mut m = migration(Some("node-b"));
            set(&mut m);
            let e = check(&m, Some(&v)).unwrap_err();
            assert!(e.starts_with(field), "{e}");
        }
        let mut m = migration(Some("node-b"));
        m.spec.bandwidth_mib_per_second = Some(MAX_BANDWIDTH_MIB_S);
        m.spec.max_downtime_ms = Some(1);
        m.spec.timeout_seconds = Some(MAX_TIMEOUT_S);
        assert_eq!(check(&m, Some(&v)), Ok("node-b".into()));
    }
}
