//! A deleted VM's teardown (pure): what to do with each of its launcher pods so that its
//! domain, taps and OVS ports are gone from every node before the VM — and with it the hold
//! on its Addresses — goes (the finalizer [`roam_contract::keys::VM_FINALIZER`]).
//!
//! A launcher pod's shim tears down on request (`POST /v1/teardown`: the domain destroyed, a
//! running migration with it, each tap and its OVS port removed, recorded so that a
//! restarted shim starts nothing); only then is the pod deleted. A pod whose shim never
//! started plumbed nothing and is deleted at once. A running migration is ended first, by
//! deleting it: its own finalizer aborts the copy (or, past the pause, lets it land), and the
//! VM's pods are then where that leaves them.

use k8s_openapi::api::core::v1::Pod;

use roam_contract::EXIT_REFUSED_CONFIG;
use roam_shim_api::api::TornDown;

use crate::launcher::{LAUNCHER_LABEL, target_hopeless};

/// The launcher container that runs roam-shim.
pub const SHIM_CONTAINER: &str = "shim";

/// What a teardown knows of one launcher pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launcher {
    /// The pod's name.
    pub pod: String,
    /// Its node, once scheduled.
    pub node: Option<String>,
    /// The node is Ready (its kubelet answers): what runs there can be reached.
    pub node_ready: bool,
    /// The pod is being deleted already.
    pub deleting: bool,
    /// The shim container runs now.
    pub shim_running: bool,
    /// A shim container may have plumbed something in this pod: it runs, or ran and did not
    /// exit with [`EXIT_REFUSED_CONFIG`] (refused before touching anything).
    pub shim_started: bool,
    /// Why the shim will not come up without a change
    /// ([`target_hopeless`]), if so.
    pub hopeless: Option<String>,
}

impl Launcher {
    /// The facts of launcher pod `p` (`node_ready`: whether its node is Ready).
    pub fn of(p: &Pod, node_ready: bool) -> Launcher {
        let shim = p
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|cs| cs.iter().find(|c| c.name == SHIM_CONTAINER));
        let state = shim.and_then(|c| c.state.as_ref());
        let shim_running = state.is_some_and(|s| s.running.is_some());
        // its last exit: a shim that refused its configuration touched nothing
        let last_exit = state
            .and_then(|s| s.terminated.as_ref())
            .or_else(|| shim?.last_state.as_ref()?.terminated.as_ref())
            .map(|t| t.exit_code);
        let shim_started = shim_running
            || (last_exit.is_some() && last_exit != Some(EXIT_REFUSED_CONFIG))
            || (last_exit.is_none() && shim.is_some_and(|c| c.restart_count > 0));
        Launcher {
            pod: p.metadata.name.clone().unwrap_or_default(),
            node: p.spec.as_ref().and_then(|s| s.node_name.clone()),
            node_ready,
            deleting: p.metadata.deletion_timestamp.is_some(),
            shim_running,
            shim_started,
            hopeless: target_hopeless(p),
        }
    }
}

/// What to do with one launcher pod now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Ask its shim to tear the VM down there; once it answered, delete the pod.
    Teardown,
    /// Nothing of the VM is left through this pod: delete it.
    Delete,
    /// Delete it without a teardown: its shim never stays up (the reason). Said in a Warning
    /// Event: what an earlier life of the shim plumbed may remain on the node.
    Abandon(String),
    /// Nothing to do yet (the reason, for the VM's condition).
    Wait(String),
}

/// The teardown's next move.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Plan {
    /// A migration of the VM runs: delete it (if it is not being deleted) and wait for it
    /// to end.
    EndMigration(String),
    /// A step per launcher pod.
    Pods(Vec<(String, Step)>),
    /// No launcher pod is left: the finalizer may go.
    Done,
}

/// One launcher pod's step (see the module's text).
pub fn step(l: &Launcher) -> Step {
    let node = l.node.as_deref().unwrap_or("?");
    if l.node.is_none() || !l.shim_started {
        // never scheduled, or no shim ever ran in it: nothing was plumbed
        return if l.deleting {
            Step::Wait(format!("pod {} is terminating", l.pod))
        } else {
            Step::Delete
        };
    }
    if l.shim_running && l.node_ready {
        // also while the pod terminates (deleted by someone else): its grace period is the
        // last chance to remove what it plumbed
        return Step::Teardown;
    }
    if !l.node_ready {
        return Step::Wait(format!(
            "node {node} is not Ready: the VM's domain, taps and OVS ports on it cannot be \
             removed until it is back (if the node is gone for good, remove the finalizer {} \
             from the VirtualMachine by hand)",
            roam_contract::keys::VM_FINALIZER
        ));
    }
    if l.deleting {
        return Step::Wait(format!("pod {} is terminating", l.pod));
    }
    if let Some(why) = &l.hopeless {
        return Step::Abandon(why.clone());
    }
    Step::Wait(format!(
        "the shim of pod {} on {node} does not run (restarting?): the teardown waits for it",
        l.pod
    ))
}

/// The plan for a deleted VM: `migration`, the migration its status names, if that still
/// exists; `launchers`, its launcher pods.
pub fn plan(migration: Option<&str>, launchers: &[Launcher]) -> Plan {
    if let Some(m) = migration {
        return Plan::EndMigration(m.to_string());
    }
    if launchers.is_empty() {
        return Plan::Done;
    }
    Plan::Pods(launchers.iter().map(|l| (l.pod.clone(), step(l))).collect())
}

/// The VM's condition message while the teardown runs.
pub fn message(plan: &Plan) -> String {
    match plan {
        Plan::EndMigration(m) => format!("deleting: waiting for migration {m} to end"),
        Plan::Done => "deleting: torn down on every node".into(),
        Plan::Pods(steps) => {
            let parts: Vec<String> = steps
                .iter()
                .map(|(pod, s)| match s {
                    Step::Teardown => format!("{pod}: tearing down"),
                    Step::Delete => format!("{pod}: deleting"),
                    Step::Abandon(why) => format!("{pod}: deleted without a teardown ({why})"),
                    Step::Wait(why) => why.clone(),
                })
                .collect();
            format!("deleting: {}", parts.join("; "))
        }
    }
}

/// The `TornDown` Event's note: what launcher pod `pod`'s shim removed.
pub fn torn_down_note(pod: &str, done: &TornDown) -> String {
    let domain = if done.destroyed_domain {
        "domain destroyed"
    } else {
        "no domain was left"
    };
    let taps = if done.removed_taps.is_empty() {
        "no tap (none was left)".to_string()
    } else {
        format!(
            "tap(s) {} and their OVS ports",
            done.removed_taps.join(", ")
        )
    };
    format!("{pod}: {domain}, removed {taps}")
}

/// Whether `p` is one of the VM's launcher pods: it carries the launcher label and the VM
/// (uid `vm_uid`) is its controller — a pod that merely carries the labels is not.
pub fn is_launcher_of(p: &Pod, vm_uid: &str) -> bool {
    let labelled = p
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(LAUNCHER_LABEL))
        .is_some_and(|v| v == "true");
    labelled
        && p.metadata.owner_references.as_ref().is_some_and(|os| {
            os.iter()
                .any(|o| o.uid == vm_uid && o.controller == Some(true))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn launcher() -> Launcher {
        Launcher {
            pod: "demo-launcher".into(),
            node: Some("node-a".into()),
            node_ready: true,
            deleting: false,
            shim_running: true,
            shim_started: true,
            hopeless: None,
        }
    }

    #[test]
    fn a_running_shim_tears_down_before_its_pod_goes() {
        assert_eq!(step(&launcher()), Step::Teardown);
        // deleted by someone else: still asked during its grace period
        let l = Launcher {
            deleting: true,
            ..launcher()
        };
        assert_eq!(step(&l), Step::Teardown);
    }

    #[test]
    fn a_pod_whose_shim_never_ran_is_deleted_at_once() {
        let never = Launcher {
            shim_running: false,
            shim_started: false,
            ..launcher()
        };
        assert_eq!(step(&never), Step::Delete);
        let unscheduled = Launcher {
            node: None,
            ..never.clone()
        };
        assert_eq!(step(&unscheduled), Step::Delete);
        let going = Launcher {
            deleting: true,
            ..never
        };
        assert!(matches!(step(&going), Step::Wait(w) if w.contains("terminating")));
    }

    #[test]
    fn a_node_that_is_not_ready_holds_the_teardown_and_says_how_to_give_up() {
        let l = Launcher {
            node_ready: false,
            ..launcher()
        };
        let Step::Wait(why) = step(&l) else {
            panic!("not a wait: {:?}", step(&l))
        };
        assert!(why.contains("node-a is not Ready"), "{why}");
        assert!(why.contains("roam.dev/teardown"), "{why}");
    }

    #[test]
    fn a_restarting_shim_is_waited_for_and_a_hopeless_one_abandoned() {
        let restarting = Launcher {
            shim_running: false,
            ..launcher()
        };
        assert!(matches!(step(&restarting), Step::Wait(w) if w.contains("does not run")));
        let hopeless = Launcher {
            hopeless: Some("container shim CrashLoopBackOff".into()),
            ..restarting
        };
        assert_eq!(
            step(&hopeless),
            Step::Abandon("container shim CrashLoopBackOff".into())
        );
    }

    #[test]
    fn a_running_migration_ends_first_and_no_pod_left_is_done() {
        assert_eq!(
            plan(Some("demo-1"), &[launcher()]),
            Plan::EndMigration("demo-1".into())
        );
        assert_eq!(plan(None, &[]), Plan::Done);
        let p = plan(None, &[launcher()]);
        assert_eq!(
            p,
            Plan::Pods(vec![("demo-launcher".into(), Step::Teardown)])
        );
        assert_eq!(message(&p), "deleting: demo-launcher: tearing down");
    }

    fn pod(v: serde_json::Value) -> Pod {
        serde_json::from_value(v).unwrap()
    }

    /// The shim container's status of [`facts_from_the_pod`]'s pod.
    fn shim_of(p: &mut Pod) -> &mut k8s_openapi::api::core::v1::ContainerStatus {
        &mut p
            .status
            .as_mut()
            .unwrap()
            .container_statuses
            .as_mut()
            .unwrap()[1]
    }

    #[test]
    fn the_torn_down_note_says_what_went() {
        let done = TornDown {
            destroyed_domain: true,
            removed_taps: vec!["tap0".into(), "tap1".into()],
        };
        assert_eq!(
            torn_down_note("demo-launcher", &done),
            "demo-launcher: domain destroyed, removed tap(s) tap0, tap1 and their OVS ports"
        );
        assert_eq!(
            torn_down_note("p", &TornDown::default()),
            "p: no domain was left, removed no tap (none was left)"
        );
    }

    #[test]
    fn facts_from_the_pod() {
        let p = pod(json!({
            "metadata": {"name": "demo-launcher", "labels": {"roam.dev/launcher": "true"},
                         "ownerReferences": [{"apiVersion": "roam.dev/v1alpha1",
                             "kind": "VirtualMachine", "name": "demo", "uid": "u1",
                             "controller": true}]},
            "spec": {"nodeName": "node-a", "containers": []},
            "status": {"containerStatuses": [
                {"name": "libvirtd", "ready": true, "restartCount": 0, "image": "i",
                 "imageID": "", "state": {"running": {}}},
                {"name": "shim", "ready": false, "restartCount": 0, "image": "i",
                 "imageID": "", "state": {"waiting": {"reason": "ContainerCreating"}}}]}
        }));
        let l = Launcher::of(&p, true);
        assert_eq!(l.node.as_deref(), Some("node-a"));
        assert!(!l.shim_running && !l.shim_started && !l.deleting);
        assert_eq!(step(&l), Step::Delete);
        assert!(is_launcher_of(&p, "u1"));
        assert!(!is_launcher_of(&p, "u2"), "another VM's pod");

        let mut running = p.clone();
        shim_of(&mut running).state = Some(serde_json::from_value(json!({"running": {}})).unwrap());
        let l = Launcher::of(&running, true);
        assert!(l.shim_running && l.shim_started);

        let mut crashed = p.clone();
        let c = shim_of(&mut crashed);
        c.restart_count = 1;
        c.last_state =
            Some(serde_json::from_value(json!({"terminated": {"exitCode": 1}})).unwrap());
        let l = Launcher::of(&crashed, true);
        assert!(!l.shim_running && l.shim_started);
        assert!(matches!(step(&l), Step::Wait(_)), "its shim may come back");

        // a shim that refused its configuration (a kernel not on the node) left nothing
        let mut refused = crashed.clone();
        shim_of(&mut refused).last_state = Some(
            serde_json::from_value(json!({"terminated": {"exitCode": EXIT_REFUSED_CONFIG}}))
                .unwrap(),
        );
        let l = Launcher::of(&refused, true);
        assert!(!l.shim_started);
        assert_eq!(step(&l), Step::Delete);

        // labels alone do not make a pod the VM's launcher
        let mut forged = p;
        forged.metadata.owner_references = None;
        assert!(!is_launcher_of(&forged, "u1"));
    }
}
