//! roam-controller's library: the `roam.dev/v1alpha1` API types and, to come, the address
//! operator, the pod (sdn) and route controllers, and the VM and migration controllers.
#![warn(missing_docs)]

pub mod api;
pub mod cli;
pub mod migration;
