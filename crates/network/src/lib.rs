//! roam's OVN model: what a network's pods and VMs need from OVN's northbound database.
//!
//! - [`topology`]: pure planning of the northbound state of an overlay or VLAN network
//!   (per-node switch and anycast-gateway router, fabric router, /32 routes, DHCP options, DSCP
//!   marking), of a route flip, and the difference between a plan and the database.
//! - [`northbound`]: the one module with I/O: reads the database and applies the difference,
//!   flips a route, waits for the chassis (over [`roam_ovsdb`]); its default feature
//!   `northbound`, which the pure planners (`roam-core`) leave off.
#![warn(missing_docs)]

mod error;
#[cfg(feature = "northbound")]
pub mod northbound;
pub mod topology;

pub use error::{Error, Result};
