//! roam-shim's library: the VM runtime inside a launcher pod. One shim owns one libvirt
//! domain on its node and is the migrator's only way to touch that VM.
//!
//! Pure parts (unit-tested without I/O):
//! - [`spec`]: what a VM is made of and its validation;
//! - [`domain`]: the libvirt domain XML for a [`VmSpec`](spec::VmSpec);
//! - [`config`]: the shim's configuration (JSON file and flags), checked before anything is
//!   touched;
//! - [`api`]: the migration API's endpoints, request/response types and request validation;
//! - [`events`]: libvirt lifecycle events in the migrator's words;
//! - [`auth`]: the bearer-token check (constant time).
//!
//! I/O adapters:
//! - [`shim`]: the runtime (libvirt connection, boot / re-attach, migration jobs, event log);
//! - [`server`] / [`client`]: the HTTP/1.1 JSON API and its async client;
//! - [`net`]: the tap and its OVS port;
//! - [`sys`]: the crate's only `unsafe` code (libvirt events and job control, TUN ioctls),
//!   behind safe functions.
#![warn(missing_docs)]

pub mod auth;
pub mod config;
pub mod domain;
mod error;
pub mod events;
pub mod net;
pub mod server;
pub mod shim;
pub mod spec;
pub mod sys;

pub use error::{Error, Result};
/// The API types and client, from `roam_shim_api` (libvirt-free, what controllers link).
pub use roam_shim_api::{api, client};
