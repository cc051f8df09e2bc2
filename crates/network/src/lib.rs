//! roam's network core: everything a pod or VM needs from OVN.
//!
//! - [`ovsdb`]: a native async OVSDB client (RFC 7047 JSON-RPC over unix or TCP sockets), used
//!   for OVN's northbound database and for a node's local `Open_vSwitch` database. roam never
//!   shells out to `ovn-nbctl` or `ovs-vsctl`.
//!
//! - [`topology`]: pure planning of the OVN northbound state of an overlay network (per-node
//!   switch and anycast-gateway router, fabric router, /32 routes, DHCP options, DSCP
//!   marking) and of a route flip, and the reconciler that applies a plan in one transaction.
//! - [`annotation`]: the pod annotations between the controller and the CNI plugin
//!   (`roam.dev/interfaces` asked, `roam.dev/addresses` published), parsed and validated.
//! - [`qos`]: RFC 4594 service classes and their DSCP values.
//! - [`pool`]: the address pool's decisions (warm pool refill, claim or reuse by owner, reclaim
//!   after the grace period), over plain data.
#![warn(missing_docs)]

pub mod annotation;
mod error;
pub mod ovsdb;
pub mod pool;
pub mod qos;
pub mod topology;

pub use error::{Error, Result};
