//! A VM's Ready condition and phase, from what its launcher pod and shim say.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use roam_api::VmPhase;

/// A VM's phase and its Ready condition's status, reason and message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Readiness {
    /// The phase.
    pub phase: VmPhase,
    /// Ready's status.
    pub ready: bool,
    /// Ready's reason.
    pub reason: &'static str,
    /// Ready's message.
    pub message: String,
}

/// Ready's reason while something keeps the launcher's containers from running.
pub const LAUNCHER_FAILING: &str = "LauncherFailing";

/// Running once the shim's domain runs; Failed if the launcher pod failed; else Starting —
/// with what keeps the launcher's containers from running (`trouble`, see
/// [`crate::launcher::launcher_trouble`]) as reason `LauncherFailing`.
pub fn readiness(
    node: &str,
    pod: &str,
    pod_failed: bool,
    domain_running: bool,
    trouble: Option<&str>,
) -> Readiness {
    if domain_running {
        return Readiness {
            phase: VmPhase::Running,
            ready: true,
            reason: "Running",
            message: format!("runs on {node}"),
        };
    }
    let phase = if pod_failed {
        VmPhase::Failed
    } else {
        VmPhase::Starting
    };
    match trouble {
        Some(t) => Readiness {
            phase,
            ready: false,
            reason: LAUNCHER_FAILING,
            message: format!("launcher pod {pod} on {node}: {t}"),
        },
        None => Readiness {
            phase,
            ready: false,
            reason: "Starting",
            message: format!("launcher pod {pod} on {node} is starting"),
        },
    }
}

/// A status condition, stamped `now` (messages cut to 1000 characters).
pub fn condition(
    type_: &str,
    ok: bool,
    reason: &str,
    message: &str,
    generation: Option<i64>,
    now: &Time,
) -> Condition {
    Condition {
        type_: type_.into(),
        status: if ok { "True" } else { "False" }.into(),
        reason: reason.into(),
        message: message.chars().take(1000).collect(),
        observed_generation: generation,
        last_transition_time: now.clone(),
    }
}

/// Put `c` into `list`, keeping the transition time when the status did not change.
pub fn set_condition(list: &mut Vec<Condition>, mut c: Condition) {
    if let Some(old) = list.iter_mut().find(|o| o.type_ == c.type_) {
        if old.status == c.status {
            c.last_transition_time = old.last_transition_time.clone();
        }
        *old = c;
    } else {
        list.push(c);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vm_is_ready_when_its_domain_runs() {
        let r = readiness("node-a", "demo-launcher", false, true, None);
        assert_eq!(
            (r.phase, r.ready, r.message.as_str()),
            (VmPhase::Running, true, "runs on node-a")
        );
        let r = readiness("node-a", "demo-launcher", false, false, None);
        assert_eq!((r.phase, r.ready), (VmPhase::Starting, false));
        assert!(r.message.contains("demo-launcher on node-a"));
        assert_eq!(
            readiness("n", "p", true, false, None).phase,
            VmPhase::Failed
        );
        // what keeps it from starting, in its condition
        let r = readiness(
            "node-a",
            "demo-launcher",
            false,
            false,
            Some("container shim CrashLoopBackOff"),
        );
        assert_eq!(
            (r.phase, r.reason, r.message.as_str()),
            (
                VmPhase::Starting,
                "LauncherFailing",
                "launcher pod demo-launcher on node-a: container shim CrashLoopBackOff"
            )
        );
        // a domain that runs wins over an old trouble
        assert!(readiness("n", "p", false, true, Some("x")).ready);
    }

    #[test]
    fn a_condition_keeps_its_transition_time_while_its_status_holds() {
        let at = |s: &str| Time(s.parse().unwrap());
        let (t0, t1) = (at("2026-01-01T00:00:00Z"), at("2026-01-01T00:00:05Z"));
        let mut list = vec![];
        let first = condition("Ready", false, "Starting", "x", Some(1), &t0);
        set_condition(&mut list, first.clone());
        set_condition(
            &mut list,
            condition("Ready", false, "Starting", "y", Some(2), &t1),
        );
        assert_eq!(list.len(), 1);
        assert_eq!(list[0].last_transition_time, first.last_transition_time);
        assert_eq!(list[0].message, "y");
        set_condition(
            &mut list,
            condition("Ready", true, "Running", "z", Some(2), &t1),
        );
        assert_eq!(list[0].last_transition_time, t1);
        set_condition(
            &mut list,
            condition("MigrationRequest", false, "Bad", "w", None, &t1),
        );
        assert_eq!(list.len(), 2);
        assert_eq!(
            condition("A", true, "R", &"m".repeat(2000), None, &t1)
                .message
                .len(),
            1000
        );
    }
}
