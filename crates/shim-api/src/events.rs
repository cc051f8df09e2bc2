//! Lifecycle events of a shim's domain, in the words the migrator uses.
//!
//! The two that time a switchover: [`Lifecycle::SuspendedForMigration`] on the source (QEMU
//! paused the guest for the final memory copy) and [`Lifecycle::ResumedAfterMigration`] on
//! the target (the guest runs there). Between them the controller has the target announce
//! the guest's NICs, and OVN activates the VM's ports there.

use serde::{Deserialize, Serialize};

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
    /// The guest reset and boots again in the same QEMU: a reboot from inside, a kernel panic
    /// with `panic=N`, a triple fault, or `virsh reset`. The domain keeps running, but what
    /// ran in the guest is gone.
    Reset,
    /// Any other libvirt lifecycle event (defined, undefined, PM suspend, ...).
    Other,
}

/// One event as the API reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// Position in this shim's event log (1, 2, ...): ask for events after the last one seen.
    pub seq: u64,
    /// What happened.
    pub kind: Lifecycle,
    /// When it happened, in nanoseconds since the Unix epoch: when the shim's libvirt callback
    /// ran, or QEMU's own timestamp for QEMU's `STOP` (see `libvirt`).
    pub at_unix_ns: u64,
    /// The node of the shim that saw it.
    pub node: String,
    /// libvirt's raw event code and detail, for diagnosis: `(-1, 0)` a guest reset (libvirt's
    /// reboot event), `(-2, 0)` QEMU's own `STOP` (a migration's pause, seen before libvirt's
    /// lifecycle event; `at_unix_ns` is then QEMU's timestamp).
    pub libvirt: (i32, i32),
}
