//! The rest of a migration's decisions, beside [`super::step`] (pure): what the switchover
//! task does with each of the source's events, where the VM goes back when the migration
//! ends, where its ports stay, and when its reconcile looks again.

use std::time::Duration;

use roam_api::{Phase, VirtualMachineMigrationStatus};
use roam_shim_api::events::Lifecycle;

use super::{Decision, GuestAt};
use crate::vm::When;

/// What the switchover task does with an event of the source's domain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnSourceEvent {
    /// The pause for the final copy (or the switch to post-copy): the target announces the
    /// guest's NICs now, so that OVN activates its ports there before the guest resumes; the
    /// landing is watched from here.
    Switch,
    /// The guest runs on one side now (it left, or resumed, stopped or failed on the
    /// source): the task ends and the reconcile decides at once.
    Settled,
    /// Nothing to do.
    Nothing,
}

/// What event `kind` of the source's domain calls for.
pub fn on_source_event(kind: Lifecycle) -> OnSourceEvent {
    match kind {
        Lifecycle::SuspendedForMigration | Lifecycle::SuspendedForPostCopy => OnSourceEvent::Switch,
        Lifecycle::MigratedAway | Lifecycle::Resumed | Lifecycle::Stopped | Lifecycle::Failed => {
            OnSourceEvent::Settled
        }
        _ => OnSourceEvent::Nothing,
    }
}

/// Where the VM is handed back at a migration's end (its status: no migration, Running).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HandBack {
    /// The node and launcher pod it runs in (the target's when it succeeded, else the
    /// source's), when the migration knew them.
    pub at: Option<(String, String)>,
    /// The target pod's UID, when it succeeded.
    pub pod_uid: Option<String>,
}

/// Where the VM of migration status `st` goes back; `None` while the migration runs.
pub fn hand_back(st: &VirtualMachineMigrationStatus) -> Option<HandBack> {
    if !st.phase.is_terminal() {
        return None;
    }
    let succeeded = st.phase == Phase::Succeeded;
    let (node, pod) = if succeeded {
        (&st.target_node, &st.target_pod)
    } else {
        (&st.source_node, &st.source_pod)
    };
    Some(HandBack {
        at: node.clone().zip(pod.clone()),
        pod_uid: if succeeded {
            st.target_pod_uid.clone()
        } else {
            None
        },
    })
}

/// Where the VM's ports stay once migration decision `d` ended it, with the guest at
/// `guest`: on the target alone when it succeeded (the source's port goes with its pod), on
/// the source alone when the guest runs there; `None`: not ended, or the guest's place
/// unknown (nothing moves).
pub fn ports_at_end(d: &Decision, guest: GuestAt) -> Option<When> {
    if !d.phase.is_terminal() {
        None
    } else if d.phase == Phase::Succeeded {
        Some(When::Succeeded { source_pod: false })
    } else if guest == GuestAt::Source {
        Some(When::RolledBack)
    } else {
        None
    }
}

/// When a migration's reconcile looks again, and whether its finalizer goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Next {
    /// Look again after this (`None`: on a change only).
    pub requeue: Option<Duration>,
    /// Remove the finalizer: the migration ended and nothing is left to do (or it is being
    /// deleted).
    pub release: bool,
}

/// What follows decision `d` of a migration (`deleting`: it is being deleted). A running
/// migration is looked at every 500 ms (the tasks wake it sooner; this is the fallback and
/// the progress refresh); an ended one with actions left again after 300 ms.
pub fn next(d: &Decision, deleting: bool) -> Next {
    if !d.phase.is_terminal() {
        return Next {
            requeue: Some(Duration::from_millis(500)),
            release: false,
        };
    }
    Next {
        requeue: (!d.actions.is_empty()).then_some(Duration::from_millis(300)),
        release: deleting || d.actions.is_empty(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::migration::Action;

    fn decided(phase: Phase, actions: Vec<Action>) -> Decision {
        Decision {
            phase,
            actions,
            reason: None,
        }
    }

    #[test]
    fn the_pause_switches_and_any_end_of_the_job_settles() {
        use Lifecycle::*;
        assert_eq!(
            on_source_event(SuspendedForMigration),
            OnSourceEvent::Switch
        );
        assert_eq!(on_source_event(SuspendedForPostCopy), OnSourceEvent::Switch);
        for k in [MigratedAway, Resumed, Stopped, Failed] {
            assert_eq!(on_source_event(k), OnSourceEvent::Settled, "{k:?}");
        }
        assert_eq!(on_source_event(Started), OnSourceEvent::Nothing);
    }

    #[test]
    fn the_vm_goes_back_where_the_guest_runs() {
        let mut st = VirtualMachineMigrationStatus {
            source_node: Some("a".into()),
            source_pod: Some("vm-launcher".into()),
            target_node: Some("b".into()),
            target_pod: Some("vm-launcher-b".into()),
            target_pod_uid: Some("uid-b".into()),
            ..Default::default()
        };
        st.phase = Phase::Migrating;
        assert_eq!(hand_back(&st), None);
        st.phase = Phase::Succeeded;
        assert_eq!(
            hand_back(&st),
            Some(HandBack {
                at: Some(("b".into(), "vm-launcher-b".into())),
                pod_uid: Some("uid-b".into())
            })
        );
        for phase in [Phase::Failed, Phase::Aborted] {
            st.phase = phase;
            assert_eq!(
                hand_back(&st),
                Some(HandBack {
                    at: Some(("a".into(), "vm-launcher".into())),
                    pod_uid: None
                })
            );
        }
        // refused before it knew its pods: the VM is only released
        let refused = VirtualMachineMigrationStatus {
            phase: Phase::Failed,
            ..Default::default()
        };
        assert_eq!(hand_back(&refused).unwrap().at, None);
    }

    #[test]
    fn the_ports_stay_where_the_guest_runs_once_it_ended() {
        let ok = decided(Phase::Succeeded, vec![]);
        assert_eq!(
            ports_at_end(&ok, GuestAt::Target),
            Some(When::Succeeded { source_pod: false })
        );
        let failed = decided(Phase::Failed, vec![]);
        assert_eq!(
            ports_at_end(&failed, GuestAt::Source),
            Some(When::RolledBack)
        );
        assert_eq!(ports_at_end(&failed, GuestAt::Unknown), None);
        assert_eq!(
            ports_at_end(&decided(Phase::Migrating, vec![]), GuestAt::Source),
            None
        );
    }

    #[test]
    fn an_ended_migration_lets_go_once_nothing_is_left() {
        let running = next(
            &decided(Phase::Migrating, vec![Action::StartMigration]),
            true,
        );
        assert!(!running.release);
        assert!(running.requeue.is_some());
        let cleaning = next(
            &decided(Phase::Succeeded, vec![Action::DeleteSource]),
            false,
        );
        assert_eq!(
            (cleaning.release, cleaning.requeue.is_some()),
            (false, true)
        );
        let done = next(&decided(Phase::Succeeded, vec![]), false);
        assert_eq!(
            done,
            Next {
                requeue: None,
                release: true
            }
        );
        // deleted: the finalizer goes even with actions left (they were done once)
        let deleted = next(&decided(Phase::Aborted, vec![Action::DeleteTarget]), true);
        assert!(deleted.release);
    }
}
