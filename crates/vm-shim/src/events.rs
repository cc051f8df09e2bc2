//! Lifecycle events of the shim's domain, in the words the migrator uses — pure mapping from
//! libvirt's `(event, detail)` codes.
//!
//! The two that time a switchover: [`Lifecycle::SuspendedForMigration`] on the source (QEMU
//! paused the guest for the final memory copy) and [`Lifecycle::ResumedAfterMigration`] on
//! the target (the guest runs there). The migrator flips the route between them.

use serde::{Deserialize, Serialize};
use virt::sys;

/// What happened to the domain.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Lifecycle {
    /// Booted here.
    Started,
    /// An incoming migration created the domain here (paused, before memory arrives).
    IncomingMigration,
    /// Paused for the final copy of a live migration (source side).
    SuspendedForMigration,
    /// Paused when switching to post-copy (source side).
    SuspendedForPostCopy,
    /// Paused for another reason (I/O error, an API call, ...).
    Suspended,
    /// Runs here after an incoming migration (target side).
    ResumedAfterMigration,
    /// Runs here in post-copy (target side; memory still arriving).
    ResumedPostCopy,
    /// Resumed for another reason (e.g. a failed migration resumed the source).
    Resumed,
    /// Left this node by migration (source side, after the target took over).
    MigratedAway,
    /// Stopped: shut down or destroyed.
    Stopped,
    /// QEMU or libvirt failed: the emulator died, or an incoming migration failed (target
    /// side, e.g. after an abort).
    Failed,
    /// The guest crashed (QEMU or the guest kernel).
    Crashed,
    /// Any other libvirt lifecycle event (defined, undefined, PM suspend, ...).
    Other,
}

impl Lifecycle {
    /// Map libvirt's `virDomainEventType` and its detail.
    pub fn from_libvirt(event: i32, detail: i32) -> Lifecycle {
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
}

/// One event as the API reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// Position in this shim's event log (1, 2, ...): ask for events after the last one seen.
    pub seq: u64,
    /// What happened.
    pub kind: Lifecycle,
    /// When the shim's libvirt callback ran, in nanoseconds since the Unix epoch.
    pub at_unix_ns: u64,
    /// The node of the shim that saw it.
    pub node: String,
    /// libvirt's raw event code and detail, for diagnosis.
    pub libvirt: (i32, i32),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(e: u32, d: u32) -> Lifecycle {
        Lifecycle::from_libvirt(e as i32, d as i32)
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
        assert_eq!(Lifecycle::from_libvirt(99, 99), Lifecycle::Other);
    }

    #[test]
    fn kinds_serialize_in_kebab_case() {
        assert_eq!(
            serde_json::to_string(&Lifecycle::SuspendedForMigration).unwrap(),
            "\"suspended-for-migration\""
        );
    }
}
