//! roam-shim's API as its clients see it, without libvirt: what the migration controller
//! (and a source shim talking to a target shim) links.
//!
//! - [`api`]: the endpoints, request/answer types and request validation (pure);
//! - [`events`]: the domain's lifecycle events in the migrator's words (pure);
//! - [`client`]: an async HTTP/1.1 client of the API;
//! - [`launch`]: the shim's command line, typed: rendered by the controller, parsed by the
//!   shim (pure);
//! - [`limits`]: what a VM may be (vCPUs, memory, NICs, names, boot paths), checked by the
//!   controller and the shim alike (pure);
//! - [`token`]: the VM's API token as a shim checks it (its SHA-256 digest);
//! - [`serve`]: the hardened HTTP/1.1 server every roam endpoint runs on (the shim's API,
//!   the controller's metrics and probes): connection cap, timeouts, size limits.
//!
//! The shim's routes, the libvirt runtime and the mapping from libvirt's codes live in
//! `roam-vm-shim`.
#![warn(missing_docs)]

pub mod api;
#[cfg(feature = "http")]
pub mod client;
mod error;
pub mod events;
pub mod launch;
pub mod limits;
#[cfg(feature = "http")]
pub mod serve;
#[cfg(feature = "http")]
pub mod tls;
/// The token digest lives in `roam-contract` (the controller's pure core names runners by it).
pub use roam_contract::token;

pub use error::{Error, Result};
