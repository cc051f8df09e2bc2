//! roam's network core: everything a pod or VM needs from OVN.
//!
//! - [`ovsdb`]: a native async OVSDB client (RFC 7047 JSON-RPC over unix or TCP sockets), used
//!   for OVN's northbound database and for a node's local `Open_vSwitch` database. roam never
//!   shells out to `ovn-nbctl` or `ovs-vsctl`.
//!
//! Topology planning (overlay, VLAN underlay, QoS, /32 routes and the route flip) is added
//! on top of this client by the network-core issue.
#![warn(missing_docs)]

mod error;
pub mod ovsdb;

pub use error::{Error, Result};
