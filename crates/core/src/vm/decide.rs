//! The VM controller's decisions (pure): whether a VM may start as it is ([`admit`]), and
//! what its status, Events and next look are once its launcher is there ([`outcome`]).
//!
//! The controller observes (the VM, its spec's problems, its Networks' access rules, its boot
//! claim; then its launcher pod and shim), asks these, and carries out the answer; the steps
//! between (placement, the Address claims, the launcher pod) decide in [`crate::placement`],
//! [`crate::claim`] and [`crate::adoption`].

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use roam_api::{GuestResets, VirtualMachineStatus, VmInterfaceStatus, VmPhase};

use super::readiness::{LAUNCHER_FAILING, condition, readiness, set_condition};

/// What the controller saw of a VM that is not being deleted, before starting it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Seen {
    /// `namespace/name`.
    pub key: String,
    /// Its status names a node or a launcher pod: something exists for it.
    pub started: bool,
    /// What is wrong with its spec ([`super::validate::problems`]), asked while nothing
    /// exists for it.
    pub problems: Vec<String>,
    /// A Network it names refuses its namespace or an interface's service class (the
    /// refusal's reason and words), asked while no migration of it runs.
    pub refused: Option<(&'static str, String)>,
    /// Its `roam.dev/migrate-to` annotation.
    pub migrate_to: Option<String>,
    /// A migration of it runs (its status names one).
    pub migrating: bool,
    /// Why its boot volume cannot be used yet ([`super::volume::not_ready`]), asked while
    /// it has no launcher pod.
    pub volume_not_ready: Option<String>,
}

/// Whether, and how, a VM goes on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Admit {
    /// Bad input: Failed with the reason, nothing created or claimed.
    Refuse {
        /// The reason (PascalCase).
        reason: &'static str,
        /// What is wrong and what to do.
        message: String,
        /// Only an edit of the VM can fix it (else a Network's or namespace's change may:
        /// looked at again after [`requeue::REFUSED`]).
        until_edited: bool,
    },
    /// Turn the annotation's value into a migration (the finalizer first).
    Migrate(String),
    /// The migration controller owns the VM's pods and status until its migration ends.
    HandOff,
    /// Pending until the boot volume is there and bound (the finalizer first): the reason.
    WaitForVolume(String),
    /// Place it, claim its Addresses, make its launcher (the finalizer first).
    Start,
}

/// What `seen` allows. A spec no retry can fix is refused before anything exists; a Network
/// that refuses the VM is refused unless a migration runs (the interfaces it holds stay); an
/// annotation asks for a migration before anything else; a running migration is left alone;
/// a VM waits for its boot volume before anything is created for it.
pub fn admit(seen: &Seen) -> Admit {
    if !seen.started && !seen.problems.is_empty() {
        let e = crate::Error::InvalidVm {
            vm: seen.key.clone(),
            problem: seen.problems.join("; "),
        };
        return Admit::Refuse {
            reason: e.reason(),
            message: e.to_string(),
            until_edited: true,
        };
    }
    if !seen.migrating
        && let Some((reason, message)) = &seen.refused
    {
        return Admit::Refuse {
            reason,
            message: message.clone(),
            until_edited: false,
        };
    }
    if let Some(value) = &seen.migrate_to {
        return Admit::Migrate(value.clone());
    }
    if seen.migrating {
        return Admit::HandOff;
    }
    match &seen.volume_not_ready {
        Some(why) => Admit::WaitForVolume(why.clone()),
        None => Admit::Start,
    }
}

/// How long until a VM is looked at again.
pub mod requeue {
    use std::time::Duration;

    /// After a migration was asked for: it takes over shortly.
    pub const MIGRATE: Duration = Duration::from_millis(200);
    /// While a migration runs.
    pub const HAND_OFF: Duration = Duration::from_secs(5);
    /// While its boot volume is not there.
    pub const VOLUME: Duration = Duration::from_secs(5);
    /// After a refusal (an edit retriggers at once).
    pub const REFUSED: Duration = Duration::from_secs(10);
    /// Running: the shim is asked again for resets.
    pub const READY: Duration = Duration::from_secs(30);
    /// Starting: the shim is asked again soon.
    pub const STARTING: Duration = Duration::from_secs(1);
}

/// What a started VM's launcher and shim say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launched {
    /// Its node.
    pub node: String,
    /// Its launcher pod.
    pub pod: String,
    /// Its shim's port.
    pub port: u16,
    /// Its interfaces' addresses.
    pub interfaces: Vec<VmInterfaceStatus>,
    /// The launcher pod failed.
    pub pod_failed: bool,
    /// What keeps its containers from running ([`crate::launcher::launcher_trouble`]).
    pub trouble: Option<String>,
    /// Its shim answered: whether its domain runs, and the shim's count of guest resets.
    pub shim: Option<(bool, u64)>,
}

/// An Event to publish about the VM.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Note {
    /// A Warning (else Normal).
    pub warning: bool,
    /// The reason.
    pub reason: &'static str,
    /// The action.
    pub action: &'static str,
    /// The message.
    pub message: String,
}

/// A started VM's next status, the Events that say what changed, and when to look again.
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome {
    /// The status to write.
    pub status: VirtualMachineStatus,
    /// The Events.
    pub notes: Vec<Note>,
    /// When to look again.
    pub requeue: Duration,
}

/// The status of a VM whose launcher is `l`, from its status `before` (its generation
/// `generation`, stamped `now`): where it runs, its Ready condition and phase, the guest
/// resets counted; with an Event for each new guest reset (a Warning: what ran in the guest
/// is gone), for the start of a launcher's trouble (once: the condition follows it), and for
/// Running.
pub fn outcome(
    before: &VirtualMachineStatus,
    l: &Launched,
    generation: Option<i64>,
    now: &Time,
) -> Outcome {
    let mut st = before.clone();
    st.node = Some(l.node.clone());
    st.pod = Some(l.pod.clone());
    st.shim_port = Some(l.port);
    st.observed_generation = generation;
    st.interfaces = l.interfaces.clone();
    let (running, new_resets) = match l.shim {
        Some((running, count)) => {
            let (record, new) = super::account_resets(before.guest_resets.as_ref(), &l.pod, count);
            st.guest_resets = record;
            (running, new)
        }
        None => (false, 0),
    };
    let r = readiness(&l.node, &l.pod, l.pod_failed, running, l.trouble.as_deref());
    st.phase = r.phase;
    set_condition(
        &mut st.conditions,
        condition("Ready", r.ready, r.reason, &r.message, generation, now),
    );
    let mut notes = Vec::new();
    if new_resets > 0 {
        notes.push(reset_note(&l.node, new_resets, st.guest_resets.as_ref()));
    }
    let was_failing = before
        .conditions
        .iter()
        .any(|c| c.type_ == "Ready" && c.reason == LAUNCHER_FAILING);
    if r.reason == LAUNCHER_FAILING && !was_failing {
        notes.push(Note {
            warning: true,
            reason: LAUNCHER_FAILING,
            action: "Start",
            message: r.message.clone(),
        });
    }
    if before.phase != VmPhase::Running && st.phase == VmPhase::Running {
        notes.push(Note {
            warning: false,
            reason: "Running",
            action: "Start",
            message: format!("runs on {}", l.node),
        });
    }
    Outcome {
        status: st,
        notes,
        requeue: if r.ready {
            requeue::READY
        } else {
            requeue::STARTING
        },
    }
}

fn reset_note(node: &str, new: u64, record: Option<&GuestResets>) -> Note {
    let total = record.map_or(new, |r| r.total);
    let times = if new == 1 {
        "once".to_string()
    } else {
        format!("{new} times")
    };
    Note {
        warning: true,
        reason: "GuestReset",
        action: "Observe",
        message: format!(
            "the guest on {node} reset {times} ({total} in all): it rebooted, panicked \
             (panic=N) or was reset from outside, and what ran in it is gone; its console log \
             says why"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn at(s: &str) -> Time {
        Time(s.parse().unwrap())
    }

    #[test]
    fn a_bad_spec_is_refused_only_while_nothing_exists() {
        let seen = Seen {
            key: "ns/vm".into(),
            problems: vec!["cpu 0: use 1 to 64".into(), "no boot".into()],
            ..Seen::default()
        };
        assert_eq!(
            admit(&seen),
            Admit::Refuse {
                reason: "InvalidVirtualMachine",
                message: "virtual machine ns/vm: cpu 0: use 1 to 64; no boot".into(),
                until_edited: true,
            }
        );
        // a running VM's spec edit does not stop it
        let started = Seen {
            started: true,
            ..seen
        };
        assert_eq!(admit(&started), Admit::Start);
    }

    #[test]
    fn a_network_refusal_waits_for_a_running_migration() {
        let refused = Some((
            "NetworkNotAllowed",
            "namespace ns may not attach".to_string(),
        ));
        let seen = Seen {
            started: true,
            refused: refused.clone(),
            ..Seen::default()
        };
        assert!(matches!(
            admit(&seen),
            Admit::Refuse {
                reason: "NetworkNotAllowed",
                until_edited: false,
                ..
            }
        ));
        let migrating = Seen {
            migrating: true,
            ..seen
        };
        assert_eq!(admit(&migrating), Admit::HandOff);
    }

    #[test]
    fn a_migration_request_comes_before_the_volume_and_the_start() {
        let seen = Seen {
            migrate_to: Some("node-b".into()),
            volume_not_ready: Some("claim c does not exist".into()),
            ..Seen::default()
        };
        assert_eq!(admit(&seen), Admit::Migrate("node-b".into()));
        let waiting = Seen {
            migrate_to: None,
            ..seen
        };
        assert_eq!(
            admit(&waiting),
            Admit::WaitForVolume("claim c does not exist".into())
        );
    }

    fn launched() -> Launched {
        Launched {
            node: "node-a".into(),
            pod: "demo-launcher".into(),
            port: 17100,
            interfaces: vec![],
            pod_failed: false,
            trouble: None,
            shim: None,
        }
    }

    #[test]
    fn running_is_said_once_and_looked_at_less_often() {
        let t = at("2026-01-01T00:00:00Z");
        let up = Launched {
            shim: Some((true, 0)),
            ..launched()
        };
        let o = outcome(&VirtualMachineStatus::default(), &up, Some(3), &t);
        assert_eq!(o.status.phase, VmPhase::Running);
        assert_eq!(
            (
                o.status.node.as_deref(),
                o.status.shim_port,
                o.status.observed_generation
            ),
            (Some("node-a"), Some(17100), Some(3))
        );
        assert_eq!(o.notes.len(), 1);
        assert_eq!(o.notes[0].reason, "Running");
        assert_eq!(o.requeue, requeue::READY);
        // already Running: nothing new to say
        let again = outcome(&o.status, &up, Some(3), &t);
        assert!(again.notes.is_empty());
        assert_eq!(again.status, o.status);
    }

    #[test]
    fn a_launchers_trouble_is_a_warning_when_it_begins() {
        let t = at("2026-01-01T00:00:00Z");
        let failing = Launched {
            trouble: Some("container shim CrashLoopBackOff".into()),
            ..launched()
        };
        let o = outcome(&VirtualMachineStatus::default(), &failing, None, &t);
        assert_eq!(o.status.phase, VmPhase::Starting);
        assert_eq!(o.notes.len(), 1);
        assert!(o.notes[0].warning && o.notes[0].reason == LAUNCHER_FAILING);
        assert_eq!(o.requeue, requeue::STARTING);
        assert!(outcome(&o.status, &failing, None, &t).notes.is_empty());
    }

    proptest! {
        /// Whatever the shims counted, over whatever succession of launcher pods (each
        /// with a shim counting from 0), every reset is said once: the Events' counts add up
        /// to the recorded total.
        #[test]
        fn every_guest_reset_is_said_once(
            steps in proptest::collection::vec((any::<bool>(), 0u64..5), 1..30)
        ) {
            let t = at("2026-01-01T00:00:00Z");
            let mut st = VirtualMachineStatus::default();
            let (mut said, mut pod, mut count) = (0u64, 0, 0u64);
            for (next_pod, add) in steps {
                if next_pod {
                    pod += 1;
                    count = 0;
                }
                count += add;
                let l = Launched {
                    pod: format!("p{pod}"),
                    shim: Some((true, count)),
                    ..launched()
                };
                let o = outcome(&st, &l, None, &t);
                for n in o.notes.iter().filter(|n| n.reason == "GuestReset") {
                    let word = n.message.split_whitespace().nth(5).unwrap();
                    said += if word == "once" { 1 } else { word.parse::<u64>().unwrap() };
                }
                st = o.status;
            }
            prop_assert_eq!(said, st.guest_resets.map_or(0, |r| r.total));
        }
    }
}
