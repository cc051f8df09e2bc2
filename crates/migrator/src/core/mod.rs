//! The address control plane's decisions, pure: no Kubernetes or OVN I/O, only plain data
//! in and decisions out (unit and property tested). The controllers in
//! [`crate::controller`] feed them what the API server holds and carry out what they decide.
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
//! - [`launcher`]: a VM's launcher pod and the names its pods, domain and shim go by.
//! - [`adoption`]: whether the pod under a launcher's name is the one roam created.
//! - [`migration`]: the migration state machine, what it observes, and spec validation.
//! - [`placement`]: which node takes a VM (its start, `migrate-to=auto`) under the
//!   scheduler's constraints.

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
