//! roam's decisions, pure: no Kubernetes client, no OVN or libvirt I/O, no clock or
//! randomness read (time and ids come in as arguments), only plain data in and decisions out
//! (unit and property tested). The middle layer of roam's controller: it decides over
//! `roam-api`'s types; `roam-migrator`'s controllers feed it what the API server holds and
//! carry out what it decides.
//!
//! - [`network`]: a Network spec → a validated plan; overlapping Networks; the nodes'
//!   transit addresses; the OVN planner's input.
//! - [`claim`]: a pod → owner key + interface requests → the Address per interface; the
//!   claimed Address; `roam.dev/addresses`; the OVN ports of a Network's Addresses.
//! - [`ovn`]: whether a batch of ports is an addition (one small transaction) or a full
//!   reconcile, and the topology of just the additions.
//! - [`pool`]: the warm pool, reclaim after the grace, orphaned and doubly claimed Addresses.
//! - [`event`]: the namespace an Event about an object is stored in.
//! - [`vm`]: a VM's interfaces → its Addresses and NICs; per Address, what a migration does.
//! - [`launcher`]: the names a VM's pods, domain and shim go by; what a launcher's status says.
//! - [`adoption`]: whether the pod under a launcher's name is the one roam created.
//! - [`migration`]: the migration state machine, what it observes, and spec validation.
//! - [`placement`]: which node takes a VM (its start, `migrate-to=auto`) under the
//!   scheduler's constraints.
#![warn(missing_docs)]

pub mod adoption;
pub mod claim;
pub mod event;
pub mod launcher;
pub mod migration;
pub mod network;
pub mod ovn;
pub mod placement;
pub mod pool;
pub mod vm;

mod error;
pub use error::{Error, Result};
