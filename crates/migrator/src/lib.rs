//! roam-controller's library: the `roam.dev/v1alpha1` API types, the address control plane's
//! pure decisions ([`core`]) and the controllers that carry them out ([`controller`]: the
//! address operator, the pod (sdn) controller, the route controller, leader election,
//! metrics). The VM and migration controllers arrive with the live-migration issue.
#![warn(missing_docs)]

pub mod api;
pub mod cli;
pub mod core;
mod error;
pub mod migration;

pub use error::{Error, Result};
pub mod controller;
