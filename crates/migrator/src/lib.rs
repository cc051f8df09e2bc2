//! roam-controller's library: the `roam.dev/v1alpha1` API types ([`api`]), the pure
//! decisions ([`core`]: addresses, Networks, VMs, launcher pods, the migration state
//! machine) and the controllers that carry them out ([`controller`]: I/O only).
#![warn(missing_docs)]

pub mod api;
pub mod cli;
pub mod core;
mod error;

pub use error::{Error, Result};
pub mod controller;
