//! libvirt's words → the API's: lifecycle events (`(event, detail)` codes) and job stats.
//! The types themselves are `roam_shim_api`'s (re-exported here).

use std::time::{Duration, SystemTime};

use virt::sys;

pub use roam_shim_api::events::{Event, Lifecycle};

use crate::api::JobStats;

/// Map libvirt's `virDomainEventType` and its detail (or [`crate::sys::RESET_EVENT`]).
pub fn from_libvirt(event: i32, detail: i32) -> Lifecycle {
    if event == crate::sys::RESET_EVENT {
        return Lifecycle::Reset;
    }
    let (e, d) = (event as u32, detail as u32);
    match e {
        sys::VIR_DOMAIN_EVENT_STARTED => match d {
            sys::VIR_DOMAIN_EVENT_STARTED_MIGRATED => Lifecycle::IncomingMigration,
            _ => Lifecycle::Started,
        },
        sys::VIR_DOMAIN_EVENT_SUSPENDED => match d {
            sys::VIR_DOMAIN_EVENT_SUSPENDED_MIGRATED => Lifecycle::SuspendedForMigration,
            sys::VIR_DOMAIN_EVENT_SUSPENDED_POSTCOPY => Lifecycle::SuspendedForPostCopy,
            _ => Lifecycle::Suspended,
        },
        sys::VIR_DOMAIN_EVENT_RESUMED => match d {
            sys::VIR_DOMAIN_EVENT_RESUMED_MIGRATED => Lifecycle::ResumedAfterMigration,
            sys::VIR_DOMAIN_EVENT_RESUMED_POSTCOPY => Lifecycle::ResumedPostCopy,
            _ => Lifecycle::Resumed,
        },
        sys::VIR_DOMAIN_EVENT_STOPPED => match d {
            sys::VIR_DOMAIN_EVENT_STOPPED_MIGRATED => Lifecycle::MigratedAway,
            sys::VIR_DOMAIN_EVENT_STOPPED_CRASHED => Lifecycle::Crashed,
            sys::VIR_DOMAIN_EVENT_STOPPED_FAILED => Lifecycle::Failed,
            _ => Lifecycle::Stopped,
        },
        sys::VIR_DOMAIN_EVENT_CRASHED => Lifecycle::Crashed,
        _ => Lifecycle::Other,
    }
}

/// What the shim reports for a raw event (pure): libvirt's lifecycle events as
/// [`from_libvirt`] maps them, and QEMU's own `STOP` ([`crate::sys::QEMU_STOP_EVENT`]) as the
/// migration's pause while an outgoing migration runs (`outgoing`) — it comes before libvirt's
/// *suspended* event for the same stop, sometimes by hundreds of ms, and the target's
/// announcement waits for whichever is reported. `outgoing` is what a stop means now: `None` (no migration of
/// ours), [`Lifecycle::SuspendedForMigration`] (the final copy's pause) or
/// [`Lifecycle::SuspendedForPostCopy`] (the shim asked for the switch to post-copy). One pause
/// is reported once per migration (`pause_reported`): libvirt's later event for it is not
/// reported again. `None`: nothing to report.
pub fn report(
    event: i32,
    detail: i32,
    outgoing: Option<Lifecycle>,
    pause_reported: bool,
) -> Option<Lifecycle> {
    if event == crate::sys::QEMU_STOP_EVENT {
        // outside a migration a stop is reported by libvirt's own event, with its reason
        return outgoing.filter(|_| !pause_reported);
    }
    match from_libvirt(event, detail) {
        Lifecycle::SuspendedForMigration | Lifecycle::SuspendedForPostCopy if pause_reported => {
            None
        }
        kind => Some(kind),
    }
}

/// An outgoing migration's pause as the shim has reported it (reset when a migration starts).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pause {
    /// When the pause happened, once reported (QEMU's `STOP` or libvirt's *suspended*,
    /// whichever came first).
    pub reported_at: Option<SystemTime>,
    /// The shim asked the migration to switch to post-copy: a stop is that switch.
    pub post_copy_asked: bool,
}

impl Pause {
    /// [`report`] for an event that happened `at`, with this state, and the state updated:
    /// `Err` with the reported pause's time when there is nothing to report.
    pub fn report(
        &mut self,
        event: i32,
        detail: i32,
        outgoing: bool,
        at: SystemTime,
    ) -> Result<Lifecycle, Option<SystemTime>> {
        let stop_means = outgoing.then_some(if self.post_copy_asked {
            Lifecycle::SuspendedForPostCopy
        } else {
            Lifecycle::SuspendedForMigration
        });
        match report(event, detail, stop_means, self.reported_at.is_some()) {
            None => Err(self.reported_at),
            Some(kind) => {
                match kind {
                    Lifecycle::SuspendedForMigration | Lifecycle::SuspendedForPostCopy => {
                        self.reported_at = Some(at)
                    }
                    // a failed migration resumed the guest here: a next pause is a new one
                    Lifecycle::Resumed => self.reported_at = None,
                    _ => {}
                }
                Ok(kind)
            }
        }
    }
}

/// The API's job stats from the `virt` crate's.
pub fn job_stats(s: &virt::domain::JobStats) -> JobStats {
    JobStats {
        data_total: s.data_total,
        data_processed: s.data_processed,
        data_remaining: s.data_remaining,
        iteration: s.mem_iteration,
        dirty_rate_pages_s: s.mem_dirty_rate,
        bandwidth_bytes_s: s.mem_bps,
        elapsed_ms: s.time_elapsed,
        downtime_ms: s.downtime,
        setup_ms: s.setup_time,
    }
}

/// What a migration past its deadline does next (pure).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AtDeadline {
    /// Ask QEMU to switch to post-copy.
    PostCopy,
    /// Abort: the VM stays on its source.
    Abort,
    /// Look again at the next sample.
    Wait,
}

/// How long past its deadline a migration allowed post-copy waits for its copy to start
/// before it is aborted: QEMU takes a switch only in a running copy, and libvirt starts the
/// copy only once the target's QEMU is up (seconds under TCG).
pub const POST_COPY_START_GRACE: Duration = Duration::from_secs(30);

/// At or past the deadline (`past` after it): without post-copy abort; with it switch once
/// QEMU copies (`copying`: libvirt's job is running and has moved memory), else wait for the
/// copy a bounded while.
pub fn at_deadline(post_copy: bool, copying: bool, past: Duration) -> AtDeadline {
    match (post_copy, copying) {
        (false, _) => AtDeadline::Abort,
        (true, true) => AtDeadline::PostCopy,
        (true, false) if past < POST_COPY_START_GRACE => AtDeadline::Wait,
        (true, false) => AtDeadline::Abort,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(e: u32, d: u32) -> Lifecycle {
        from_libvirt(e as i32, d as i32)
    }

    #[test]
    fn post_copy_is_asked_only_of_a_running_copy() {
        let s = Duration::from_secs;
        assert_eq!(at_deadline(false, true, s(0)), AtDeadline::Abort);
        assert_eq!(at_deadline(false, false, s(0)), AtDeadline::Abort);
        assert_eq!(at_deadline(true, true, s(0)), AtDeadline::PostCopy);
        assert_eq!(at_deadline(true, true, s(3600)), AtDeadline::PostCopy);
        // the target's QEMU still starting: no copy to switch yet
        assert_eq!(at_deadline(true, false, s(1)), AtDeadline::Wait);
        assert_eq!(
            at_deadline(true, false, POST_COPY_START_GRACE),
            AtDeadline::Abort
        );
    }

    #[test]
    fn migration_events_are_the_ones_the_switchover_needs() {
        assert_eq!(
            map(
                sys::VIR_DOMAIN_EVENT_SUSPENDED,
                sys::VIR_DOMAIN_EVENT_SUSPENDED_MIGRATED
            ),
            Lifecycle::SuspendedForMigration
        );
        assert_eq!(
            map(
                sys::VIR_DOMAIN_EVENT_RESUMED,
                sys::VIR_DOMAIN_EVENT_RESUMED_MIGRATED
            ),
            Lifecycle::ResumedAfterMigration
        );
        assert_eq!(
            map(
                sys::VIR_DOMAIN_EVENT_STARTED,
                sys::VIR_DOMAIN_EVENT_STARTED_MIGRATED
            ),
            Lifecycle::IncomingMigration
        );
        assert_eq!(
            map(
                sys::VIR_DOMAIN_EVENT_STOPPED,
                sys::VIR_DOMAIN_EVENT_STOPPED_MIGRATED
            ),
            Lifecycle::MigratedAway
        );
    }

    #[test]
    fn qemu_stop_is_the_pause_of_an_outgoing_migration_reported_once() {
        let stop = crate::sys::QEMU_STOP_EVENT;
        let (s, mig, pc) = (
            sys::VIR_DOMAIN_EVENT_SUSPENDED as i32,
            sys::VIR_DOMAIN_EVENT_SUSPENDED_MIGRATED as i32,
            sys::VIR_DOMAIN_EVENT_SUSPENDED_POSTCOPY as i32,
        );
        const MIG: Option<Lifecycle> = Some(Lifecycle::SuspendedForMigration);
        const PC: Option<Lifecycle> = Some(Lifecycle::SuspendedForPostCopy);
        // during a migration QEMU's stop is the pause; libvirt's event for it comes after
        assert_eq!(
            report(stop, 0, MIG, false),
            Some(Lifecycle::SuspendedForMigration)
        );
        assert_eq!(report(s, mig, MIG, true), None);
        assert_eq!(report(s, pc, PC, true), None);
        // the shim asked for post-copy: the stop is that switch
        assert_eq!(
            report(stop, 0, PC, false),
            Some(Lifecycle::SuspendedForPostCopy)
        );
        // libvirt first (QMP events lost, or slower): reported, and QEMU's is not
        assert_eq!(
            report(s, mig, MIG, false),
            Some(Lifecycle::SuspendedForMigration)
        );
        assert_eq!(report(stop, 0, MIG, true), None);
        // no migration of ours (a pause from outside, or a job adopted after a restart):
        // only libvirt's event, with its reason
        assert_eq!(report(stop, 0, None, false), None);
        assert_eq!(
            report(
                s,
                sys::VIR_DOMAIN_EVENT_SUSPENDED_PAUSED as i32,
                None,
                false
            ),
            Some(Lifecycle::Suspended)
        );
        assert_eq!(
            report(s, mig, None, false),
            Some(Lifecycle::SuspendedForMigration)
        );
        // every other event is libvirt's, whatever the pause
        assert_eq!(
            report(
                sys::VIR_DOMAIN_EVENT_RESUMED as i32,
                sys::VIR_DOMAIN_EVENT_RESUMED_MIGRATED as i32,
                MIG,
                true
            ),
            Some(Lifecycle::ResumedAfterMigration)
        );
    }

    #[test]
    fn a_pause_is_reported_once_until_the_guest_resumes_here() {
        let (t0, t1) = (
            SystemTime::UNIX_EPOCH,
            SystemTime::UNIX_EPOCH + std::time::Duration::from_millis(5),
        );
        let (s, mig) = (
            sys::VIR_DOMAIN_EVENT_SUSPENDED as i32,
            sys::VIR_DOMAIN_EVENT_SUSPENDED_MIGRATED as i32,
        );
        let resumed = (sys::VIR_DOMAIN_EVENT_RESUMED as i32, 0);
        let stop = crate::sys::QEMU_STOP_EVENT;
        let mut p = Pause::default();
        assert_eq!(
            p.report(stop, 0, true, t0),
            Ok(Lifecycle::SuspendedForMigration)
        );
        assert_eq!(p.report(s, mig, true, t1), Err(Some(t0)));
        // the copy failed and the guest runs here again: the next stop is a new pause
        assert_eq!(
            p.report(resumed.0, resumed.1, true, t1),
            Ok(Lifecycle::Resumed)
        );
        p.post_copy_asked = true;
        assert_eq!(
            p.report(stop, 0, true, t1),
            Ok(Lifecycle::SuspendedForPostCopy)
        );
        assert_eq!(p.reported_at, Some(t1));
    }

    #[test]
    fn other_events() {
        assert_eq!(
            map(
                sys::VIR_DOMAIN_EVENT_STARTED,
                sys::VIR_DOMAIN_EVENT_STARTED_BOOTED
            ),
            Lifecycle::Started
        );
        assert_eq!(
            map(
                sys::VIR_DOMAIN_EVENT_SUSPENDED,
                sys::VIR_DOMAIN_EVENT_SUSPENDED_PAUSED
            ),
            Lifecycle::Suspended
        );
        assert_eq!(
            map(
                sys::VIR_DOMAIN_EVENT_RESUMED,
                sys::VIR_DOMAIN_EVENT_RESUMED_UNPAUSED
            ),
            Lifecycle::Resumed
        );
        assert_eq!(
            map(
                sys::VIR_DOMAIN_EVENT_STOPPED,
                sys::VIR_DOMAIN_EVENT_STOPPED_DESTROYED
            ),
            Lifecycle::Stopped
        );
        assert_eq!(
            map(
                sys::VIR_DOMAIN_EVENT_STOPPED,
                sys::VIR_DOMAIN_EVENT_STOPPED_FAILED
            ),
            Lifecycle::Failed
        );
        assert_eq!(
            map(
                sys::VIR_DOMAIN_EVENT_STOPPED,
                sys::VIR_DOMAIN_EVENT_STOPPED_CRASHED
            ),
            Lifecycle::Crashed
        );
        assert_eq!(
            map(
                sys::VIR_DOMAIN_EVENT_CRASHED,
                sys::VIR_DOMAIN_EVENT_CRASHED_PANICKED
            ),
            Lifecycle::Crashed
        );
        assert_eq!(map(sys::VIR_DOMAIN_EVENT_DEFINED, 0), Lifecycle::Other);
        assert_eq!(
            from_libvirt(crate::sys::RESET_EVENT, 0),
            Lifecycle::Reset,
            "the reboot callback's events"
        );
        assert_eq!(from_libvirt(99, 99), Lifecycle::Other);
    }

    #[test]
    fn kinds_serialize_in_kebab_case() {
        assert_eq!(
            serde_json::to_string(&Lifecycle::SuspendedForMigration).unwrap(),
            "\"suspended-for-migration\""
        );
    }

    #[test]
    fn job_stats_map_libvirt_fields() {
        let s = virt::domain::JobStats {
            data_total: Some(10),
            data_processed: Some(4),
            data_remaining: Some(6),
            mem_iteration: Some(2),
            mem_dirty_rate: Some(100),
            time_elapsed: Some(1234),
            downtime: Some(42),
            ..Default::default()
        };
        let j = job_stats(&s);
        assert_eq!(j.data_total, Some(10));
        assert_eq!(j.data_remaining, Some(6));
        assert_eq!(j.iteration, Some(2));
        assert_eq!(j.dirty_rate_pages_s, Some(100));
        assert_eq!(j.elapsed_ms, Some(1234));
        assert_eq!(j.downtime_ms, Some(42));
    }
}
