//! The migration state machine, as a pure function of what the controller observes.
//!
//! The controller is level-based: each reconcile observes the world ([`Observed`]: the
//! migration object, the launcher pods, the shims' view of the guest and of libvirt's job,
//! which node the VM's ports have as their main chassis) and [`step`] decides the next phase and the actions
//! that move the world towards it. Nothing is remembered between reconciles but the phase
//! written to the object's status, so a restarted controller carries on from any phase — it
//! observes again and decides again.
//!
//! ```text
//!  Pending ─▶ TargetScheduling ─▶ TargetReady ─▶ Migrating ─▶ Switchover ─▶ Succeeded
//!     │              │                 │             │   (source paused:     │
//!     └──────────────┴─────────────────┴─────────────┘    target activates)  │
//!                 invalid / failure / timeout ─▶ Failed      deleted ─▶ Aborted
//! ```
//!
//! TargetScheduling lasts until the target's shim answers *and* reports every port of the VM
//! installed by its node's ovn-controller ([`Observed::target_uninstalled`]): however long OVN
//! takes to bind the ports there (seconds with 10 000 addresses in the NB), that wait is
//! spent before the copy, never in the pause.
//!
//! A VM's port is bound on both nodes from TargetScheduling on (`requested-chassis=src,dst`):
//! the switch is no write at all. While the source is paused for the final copy the target
//! announces the guest's NICs (a RARP), and OVN activates the port there, so the network is
//! back when the guest is; the Addresses (their `host`, the ports' main chassis) follow once
//! the guest runs on the target.
//!
//! The one truth is **where the guest runs** ([`GuestAt`], reported by the shims): the
//! Addresses follow the guest. If the final copy fails and the guest resumes on the source,
//! its RARP activates the source's binding again and the Addresses stay (or go back) there.
//! A migration never ends while the guest's location is unknown, so it never ends with the
//! Addresses at the wrong node.

pub mod end;
pub mod observe;
pub mod validate;

pub use roam_api::Phase;

/// The target launcher pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PodState {
    /// Not created (or gone).
    Absent,
    /// Created, not running yet (or its shim does not answer yet).
    Starting,
    /// Running and its shim answers.
    Ready,
    /// It cannot run (unschedulable, image, crash): the reason.
    Failed(String),
}

/// libvirt's migration job, as the source shim reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Job {
    /// No job has been started for this migration.
    None,
    /// Copying memory.
    Running,
    /// The source is paused for the final copy (libvirt's "suspended: migrated" event).
    Paused,
    /// Done: the guest runs on the target.
    Completed,
    /// Failed (or aborted): the guest runs on the source. The reason.
    Failed(String),
    /// The source shim does not answer.
    Unknown,
}

/// Where the guest runs, as the shims report it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GuestAt {
    /// On the source node (running or paused).
    Source,
    /// On the target node, running.
    Target,
    /// Neither shim can tell (unreachable, mid-handover).
    Unknown,
}

/// Which node the VM's ports have as their main chassis (the Addresses' `host`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PortsAt {
    /// The source node.
    Source,
    /// The target node.
    Target,
}

/// Everything [`step`] needs, observed fresh on every reconcile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observed {
    /// Why the migration cannot be done at all (missing or same node, VM not running,
    /// another migration of the VM under way), found before anything was created.
    pub invalid: Option<String>,
    /// The migration object is being deleted (abort).
    pub deleted: bool,
    /// Its timeout passed.
    pub timed_out: bool,
    /// The target launcher pod.
    pub target_pod: PodState,
    /// The VM's OVN port (and DHCP options) exist on the target node.
    pub target_port: bool,
    /// The VM's OVN ports that the target node's ovn-controller has not installed yet (as
    /// the target's shim reports them): the copy waits for them, so that at the pause the
    /// target has every port bound, ready to activate.
    pub target_uninstalled: Vec<String>,
    /// The source launcher pod still exists.
    pub source_pod: bool,
    /// libvirt's job.
    pub job: Job,
    /// Where the guest runs.
    pub guest: GuestAt,
    /// Where the VM's ports are bound as main chassis.
    pub ports: PortsAt,
}

/// What the controller does to move the world on. Every action is idempotent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Create the target launcher pod (pinned to the target node) and put the VM's port on
    /// the target too (its Address lists the target as a second node).
    CreateTarget,
    /// Ask the source shim to migrate live to the target shim.
    StartMigration,
    /// Ask the source shim to abort the job.
    AbortMigration,
    /// The target as the ports' main chassis (the Addresses' host). In the pause there is
    /// nothing to write (the target's binding activates on the announced RARP); once the
    /// guest runs on the target, the Addresses record it and the source's binding goes.
    PortsToTarget,
    /// The source as the ports' main chassis again (a final copy that failed after the
    /// Addresses moved: the guest resumed on the source).
    PortsToSource,
    /// Delete the source launcher pod (the guest runs on the target).
    DeleteSource,
    /// Delete the target launcher pod and the VM's port on the target.
    DeleteTarget,
}

/// The next phase, what to do, and why (for status and Events).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// The phase to record.
    pub phase: Phase,
    /// What to do now, in order.
    pub actions: Vec<Action>,
    /// The reason, for Failed and Aborted.
    pub reason: Option<String>,
}

impl Decision {
    fn stay(phase: Phase) -> Self {
        Decision {
            phase,
            actions: vec![],
            reason: None,
        }
    }
    fn go(phase: Phase, actions: Vec<Action>) -> Self {
        Decision {
            phase,
            actions,
            reason: None,
        }
    }
}

/// Decide. See the module documentation.
pub fn step(phase: Phase, o: &Observed) -> Decision {
    use Action::*;
    if phase.is_terminal() {
        return settle(phase, o);
    }
    // The guest already runs on the target (the job completed, perhaps while the controller
    // was down): whatever the phase, finish — the Addresses follow the guest.
    if o.guest == GuestAt::Target {
        if o.ports != PortsAt::Target {
            return Decision::go(Phase::Switchover, vec![PortsToTarget]);
        }
        return Decision::go(Phase::Succeeded, source_cleanup(o));
    }
    // The source is paused for the final copy: switch now (the target activates), so the
    // network is back when the guest is. Deletion can no longer abort cleanly here; libvirt decides in milliseconds.
    if o.job == Job::Paused && phase >= Phase::TargetReady {
        let actions = if o.ports == PortsAt::Target {
            vec![]
        } else {
            vec![PortsToTarget]
        };
        return Decision::go(Phase::Switchover, actions);
    }
    // The guest's location is unknown: never end, never move the Addresses; wait.
    if o.guest == GuestAt::Unknown || o.job == Job::Unknown {
        return Decision::stay(phase);
    }
    // From here on, the guest runs on the source.
    if o.ports == PortsAt::Target {
        // moved for a final copy that failed: the guest resumed on the source
        return Decision::go(phase.min(Phase::Migrating), vec![PortsToSource]);
    }
    let abort = if let Some(why) = &o.invalid {
        Some((Phase::Failed, why.clone()))
    } else if o.deleted {
        Some((Phase::Aborted, "the migration was deleted".to_string()))
    } else if o.timed_out && o.job == Job::None && !o.target_uninstalled.is_empty() {
        Some((
            Phase::Failed,
            format!(
                "timed out: the target node's ovn-controller never installed port(s) {} \
                 (is it running there, connected to the OVN southbound database?)",
                o.target_uninstalled.join(", ")
            ),
        ))
    } else if o.timed_out {
        Some((Phase::Failed, "timed out".to_string()))
    } else if o.target_pod == PodState::Absent && matches!(o.job, Job::Running | Job::Failed(_)) {
        // the copy has nowhere to land (the target pod was deleted): stop it (the reason
        // stays this one once libvirt reports the job aborted)
        Some((
            Phase::Failed,
            "target pod: gone while the memory was being copied".to_string(),
        ))
    } else if let Job::Failed(why) = &o.job {
        Some((Phase::Failed, format!("libvirt: {why}")))
    } else if let PodState::Failed(why) = &o.target_pod {
        Some((Phase::Failed, format!("target pod: {why}")))
    } else {
        None
    };
    if let Some((end, reason)) = abort {
        if o.job == Job::Running {
            // stop the copy first; the next reconcile sees it failed and cleans up
            return Decision {
                phase,
                actions: vec![AbortMigration],
                reason: Some(reason),
            };
        }
        let mut d = settle(end, o);
        d.reason = Some(reason);
        return d;
    }
    // a copy runs — perhaps one a controller started and died before writing any further
    // phase (its successor adopted the job): it is Migrating; never start a second one
    if o.job == Job::Running && phase >= Phase::TargetScheduling {
        return Decision::stay(Phase::Migrating);
    }
    match phase {
        Phase::Pending => Decision::go(Phase::TargetScheduling, vec![CreateTarget]),
        Phase::TargetScheduling => match (&o.target_pod, o.target_port) {
            (PodState::Absent, _) | (_, false) => Decision::stay(phase).with(CreateTarget),
            _ if target_ready(o) => Decision::go(Phase::TargetReady, vec![StartMigration]),
            _ => Decision::stay(phase),
        },
        Phase::TargetReady | Phase::Migrating | Phase::Switchover => match o.job {
            Job::None if target_ready(o) => Decision::go(Phase::TargetReady, vec![StartMigration]),
            // the target's OVN has not installed the ports (again): wait for it
            Job::None if o.target_pod == PodState::Ready && o.target_port => Decision::stay(phase),
            // the target went away before the copy started
            Job::None => Decision::go(Phase::TargetScheduling, vec![CreateTarget]),
            Job::Running => Decision::stay(Phase::Migrating),
            // Completed means the guest is on the target (handled above); until the target
            // shim confirms it, wait.
            _ => Decision::stay(phase),
        },
        Phase::Succeeded | Phase::Failed | Phase::Aborted => unreachable!("terminal"),
    }
}

impl Decision {
    fn with(mut self, a: Action) -> Self {
        self.actions.push(a);
        self
    }
}

/// The target pod's shim answers and the VM's ports are on the target, installed there.
fn target_ready(o: &Observed) -> bool {
    o.target_pod == PodState::Ready && o.target_port && o.target_uninstalled.is_empty()
}

fn source_cleanup(o: &Observed) -> Vec<Action> {
    if o.source_pod {
        vec![Action::DeleteSource]
    } else {
        vec![]
    }
}

/// A terminal phase keeps the world consistent with itself (idempotent clean-up).
fn settle(phase: Phase, o: &Observed) -> Decision {
    let mut actions = vec![];
    match phase {
        Phase::Succeeded => {
            if o.ports != PortsAt::Target {
                actions.push(Action::PortsToTarget);
            }
            actions.extend(source_cleanup(o));
        }
        _ => {
            if o.ports != PortsAt::Source && o.guest == GuestAt::Source {
                actions.push(Action::PortsToSource);
            }
            if o.target_pod != PodState::Absent || o.target_port {
                actions.push(Action::DeleteTarget);
            }
        }
    }
    Decision {
        phase,
        actions,
        reason: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Nothing created yet: the guest on the source, its ports there.
    fn fresh() -> Observed {
        Observed {
            invalid: None,
            ..Observed::refused("")
        }
    }

    #[test]
    fn the_happy_path() {
        let mut o = fresh();
        let d = step(Phase::Pending, &o);
        assert_eq!(
            (d.phase, d.actions),
            (Phase::TargetScheduling, vec![Action::CreateTarget])
        );
        o.target_pod = PodState::Starting;
        o.target_port = true;
        assert_eq!(
            step(Phase::TargetScheduling, &o),
            Decision::stay(Phase::TargetScheduling)
        );
        o.target_pod = PodState::Ready;
        let d = step(Phase::TargetScheduling, &o);
        assert_eq!(
            (d.phase, d.actions),
            (Phase::TargetReady, vec![Action::StartMigration])
        );
        o.job = Job::Running;
        assert_eq!(step(Phase::TargetReady, &o).phase, Phase::Migrating);
        o.job = Job::Paused;
        let d = step(Phase::Migrating, &o);
        assert_eq!(
            (d.phase, d.actions),
            (Phase::Switchover, vec![Action::PortsToTarget])
        );
        o.ports = PortsAt::Target;
        assert_eq!(
            step(Phase::Switchover, &o),
            Decision::stay(Phase::Switchover)
        );
        o.job = Job::Completed;
        o.guest = GuestAt::Target;
        let d = step(Phase::Switchover, &o);
        assert_eq!(
            (d.phase, d.actions),
            (Phase::Succeeded, vec![Action::DeleteSource])
        );
        o.source_pod = false;
        assert_eq!(step(Phase::Succeeded, &o), Decision::stay(Phase::Succeeded));
    }

    #[test]
    fn the_copy_waits_for_the_target_to_install_the_ports() {
        let mut o = fresh();
        o.target_pod = PodState::Ready;
        o.target_port = true;
        o.target_uninstalled = vec!["ns.vm-a".into()];
        for phase in [Phase::TargetScheduling, Phase::TargetReady] {
            assert!(step(phase, &o).actions.is_empty(), "{phase:?}");
        }
        o.timed_out = true;
        let d = step(Phase::TargetScheduling, &o);
        assert_eq!(d.phase, Phase::Failed);
        assert_eq!(d.actions, vec![Action::DeleteTarget]);
        assert!(
            d.reason
                .unwrap()
                .contains("never installed port(s) ns.vm-a")
        );
        o.timed_out = false;
        o.target_uninstalled.clear();
        for phase in [Phase::TargetScheduling, Phase::TargetReady] {
            assert_eq!(
                step(phase, &o),
                Decision::go(Phase::TargetReady, vec![Action::StartMigration]),
                "{phase:?}"
            );
        }
    }

    #[test]
    fn a_final_copy_that_fails_moves_the_ports_back() {
        let mut o = fresh();
        o.target_pod = PodState::Ready;
        o.target_port = true;
        o.job = Job::Failed("connection reset".into());
        o.ports = PortsAt::Target; // flipped during the pause
        let d = step(Phase::Switchover, &o);
        assert_eq!(d.actions, vec![Action::PortsToSource]);
        o.ports = PortsAt::Source;
        let d = step(d.phase, &o);
        assert_eq!(d.phase, Phase::Failed);
        assert_eq!(d.actions, vec![Action::DeleteTarget]);
        assert!(d.reason.unwrap().contains("connection reset"));
    }

    #[test]
    fn an_adopted_copy_is_migrating_whatever_phase_was_last_written() {
        // a controller started the copy and died before writing TargetReady: its successor
        // finds the phase TargetScheduling and the job (adopted) running
        let mut o = fresh();
        o.target_pod = PodState::Ready;
        o.target_port = true;
        o.job = Job::Running;
        for phase in [
            Phase::TargetScheduling,
            Phase::TargetReady,
            Phase::Migrating,
        ] {
            assert_eq!(
                step(phase, &o),
                Decision::stay(Phase::Migrating),
                "{phase:?}"
            );
        }
    }

    #[test]
    fn deletion_aborts_the_copy_first() {
        let mut o = fresh();
        o.target_pod = PodState::Ready;
        o.target_port = true;
        o.job = Job::Running;
        o.deleted = true;
        let d = step(Phase::Migrating, &o);
        assert_eq!(
            (d.phase, d.actions),
            (Phase::Migrating, vec![Action::AbortMigration])
        );
        o.job = Job::Failed("aborted".into());
        let d = step(Phase::Migrating, &o);
        assert_eq!(d.phase, Phase::Aborted);
        assert_eq!(d.actions, vec![Action::DeleteTarget]);
    }

    #[test]
    fn a_target_pod_gone_mid_copy_aborts_and_fails() {
        let mut o = fresh();
        o.target_pod = PodState::Absent;
        o.target_port = true;
        o.job = Job::Running;
        let d = step(Phase::Migrating, &o);
        assert_eq!(
            (d.phase, d.actions),
            (Phase::Migrating, vec![Action::AbortMigration])
        );
        o.job = Job::Failed("canceled by client".into());
        let d = step(Phase::Migrating, &o);
        assert_eq!(d.phase, Phase::Failed);
        assert_eq!(d.actions, vec![Action::DeleteTarget]);
        assert!(d.reason.unwrap().contains("target pod: gone"));
        // before the copy started, a vanished target pod is simply created again
        o.job = Job::None;
        let d = step(Phase::TargetReady, &o);
        assert_eq!(
            (d.phase, d.actions),
            (Phase::TargetScheduling, vec![Action::CreateTarget])
        );
    }

    #[test]
    fn an_invalid_migration_creates_nothing() {
        let mut o = fresh();
        o.invalid = Some("node-z does not exist".into());
        let d = step(Phase::Pending, &o);
        assert_eq!(d.phase, Phase::Failed);
        assert!(d.actions.is_empty());
        assert_eq!(d.reason.as_deref(), Some("node-z does not exist"));
    }

    #[test]
    fn unknown_whereabouts_never_end_a_migration() {
        let mut o = fresh();
        o.target_pod = PodState::Ready;
        o.target_port = true;
        o.job = Job::Unknown;
        o.timed_out = true;
        o.deleted = true;
        assert_eq!(step(Phase::Migrating, &o), Decision::stay(Phase::Migrating));
    }

    #[test]
    fn a_restart_after_completion_finishes_the_switchover() {
        // the controller died in Migrating; libvirt completed meanwhile
        let mut o = fresh();
        o.target_pod = PodState::Ready;
        o.target_port = true;
        o.job = Job::Completed;
        o.guest = GuestAt::Target;
        let d = step(Phase::Migrating, &o);
        assert_eq!(
            (d.phase, d.actions),
            (Phase::Switchover, vec![Action::PortsToTarget])
        );
    }

    /// A small model of the world: libvirt, the pods, the ports' main chassis. The controller may be
    /// restarted at any point (it forgets everything but the recorded phase), the migration
    /// may be deleted, time out, or libvirt may fail, at random.
    #[derive(Clone, Debug)]
    struct World {
        o: Observed,
        started: bool,
        aborted: bool,
        /// the truth while the shims are unreachable
        hidden: Option<(Job, GuestAt)>,
    }

    #[derive(Clone, Debug)]
    enum Event {
        Reconcile,
        PodReady,
        PortsInstalled,
        PodFails,
        PodDeleted,
        CopyProgress,
        Pause,
        Complete,
        LibvirtFails,
        Delete,
        Timeout,
        ShimsUnreachable,
        ShimsBack,
    }

    fn event() -> impl Strategy<Value = Event> {
        prop_oneof![
            6 => Just(Event::Reconcile),
            2 => Just(Event::PodReady),
            2 => Just(Event::PortsInstalled),
            1 => Just(Event::PodFails),
            1 => Just(Event::PodDeleted),
            2 => Just(Event::CopyProgress),
            2 => Just(Event::Pause),
            2 => Just(Event::Complete),
            1 => Just(Event::LibvirtFails),
            1 => Just(Event::Delete),
            1 => Just(Event::Timeout),
            1 => Just(Event::ShimsUnreachable),
            1 => Just(Event::ShimsBack),
        ]
    }

    impl World {
        fn apply(&mut self, a: &Action) {
            let o = &mut self.o;
            match a {
                Action::CreateTarget => {
                    if o.target_pod == PodState::Absent {
                        o.target_pod = PodState::Starting;
                        o.target_uninstalled = vec!["ns.vm".into()];
                    }
                    o.target_port = true;
                }
                Action::StartMigration => {
                    assert_eq!(
                        o.target_pod,
                        PodState::Ready,
                        "migrating to a target not ready"
                    );
                    assert!(
                        o.target_port,
                        "migrating before the port exists on the target"
                    );
                    assert!(
                        o.target_uninstalled.is_empty(),
                        "migrating before the target installed the port"
                    );
                    if !self.started {
                        self.started = true;
                        o.job = Job::Running;
                    }
                }
                Action::AbortMigration => self.aborted = true,
                Action::PortsToTarget => o.ports = PortsAt::Target,
                Action::PortsToSource => o.ports = PortsAt::Source,
                Action::DeleteSource => {
                    assert_eq!(
                        o.guest,
                        GuestAt::Target,
                        "deleted the pod the guest runs in"
                    );
                    o.source_pod = false;
                }
                Action::DeleteTarget => {
                    assert_ne!(
                        o.guest,
                        GuestAt::Target,
                        "deleted the pod the guest runs in"
                    );
                    o.target_pod = PodState::Absent;
                    o.target_port = false;
                }
            }
        }

        fn happen(&mut self, e: &Event) {
            let o = &mut self.o;
            let reachable = o.job != Job::Unknown;
            match e {
                Event::Reconcile => {}
                Event::PodReady if o.target_pod == PodState::Starting => {
                    o.target_pod = PodState::Ready
                }
                Event::PortsInstalled if o.target_pod != PodState::Absent => {
                    o.target_uninstalled.clear()
                }
                Event::PodFails if o.target_pod != PodState::Absent && !self.started => {
                    o.target_pod = PodState::Failed("ImagePullBackOff".into())
                }
                // deleted by someone: a pod the guest already runs in is not (the test of
                // that is the end state), one still receiving it may be
                Event::PodDeleted if o.guest != GuestAt::Target && o.job != Job::Paused => {
                    o.target_pod = PodState::Absent
                }
                Event::CopyProgress if self.aborted && o.job == Job::Running => {
                    o.job = Job::Failed("aborted".into())
                }
                Event::Pause if o.job == Job::Running && !self.aborted => o.job = Job::Paused,
                Event::Complete if o.job == Job::Paused => {
                    o.job = Job::Completed;
                    o.guest = GuestAt::Target;
                }
                Event::LibvirtFails if matches!(o.job, Job::Running | Job::Paused) => {
                    o.job = Job::Failed("I/O error".into())
                }
                Event::Delete => o.deleted = true,
                Event::Timeout => o.timed_out = true,
                Event::ShimsUnreachable if reachable && o.job != Job::None => {
                    self.hidden = Some((o.job.clone(), o.guest));
                    o.job = Job::Unknown;
                    o.guest = GuestAt::Unknown;
                }
                Event::ShimsBack => {
                    if let Some((job, guest)) = self.hidden.take() {
                        o.job = job;
                        o.guest = guest;
                    }
                }
                _ => {}
            }
        }
    }

    impl World {
        fn new() -> Self {
            World {
                o: fresh(),
                started: false,
                aborted: false,
                hidden: None,
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        /// Whatever happens, in whatever order, once the world calms down the migration ends
        /// with the guest running on exactly one node, its ports bound there, and the
        /// other launcher pod gone; no action ever deletes the pod the guest runs in.
        #[test]
        fn the_address_follows_the_guest(events in proptest::collection::vec(event(), 0..40)) {
            let mut w = World::new();
            let mut phase = Phase::Pending;
            for e in &events {
                w.happen(e);
                if matches!(e, Event::Reconcile) {
                    let d = step(phase, &w.o);
                    for a in &d.actions { w.apply(a); }
                    phase = d.phase;
                }
            }
            // calm: the shims answer again, nothing else happens; libvirt finishes a pause
            w.happen(&Event::ShimsBack);
            for _ in 0..20 {
                let d = step(phase, &w.o);
                for a in &d.actions { w.apply(a); }
                phase = d.phase;
                w.happen(&Event::PodReady);
                w.happen(&Event::PortsInstalled);
                w.happen(&Event::CopyProgress);
                w.happen(&Event::Complete);
                w.happen(&Event::Pause);
            }
            // a migration that is still under way is allowed only if nothing stops it and it
            // progresses: drive it to its end
            prop_assert!(phase.is_terminal(), "not terminal: {phase:?} {:?}", w.o);
            match phase {
                Phase::Succeeded => {
                    prop_assert_eq!(w.o.guest, GuestAt::Target);
                    prop_assert_eq!(w.o.ports, PortsAt::Target);
                    prop_assert!(!w.o.source_pod);
                }
                _ => {
                    prop_assert_eq!(w.o.guest, GuestAt::Source);
                    prop_assert_eq!(w.o.ports, PortsAt::Source);
                    prop_assert_eq!(&w.o.target_pod, &PodState::Absent);
                    prop_assert!(!w.o.target_port);
                    prop_assert!(w.o.source_pod);
                }
            }
        }
    }
}
