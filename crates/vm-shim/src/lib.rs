//! roam-shim's library: the VM runtime inside a launcher pod. One shim owns one libvirt
//! domain on its node and is the migrator's only way to touch that VM.
//!
//! The API's types, its client, the token digest and the command line
//! ([`roam_shim_api::launch`]) are `roam_shim_api`'s; [`api`] and [`client`] are re-exported.
//!
//! Pure parts (unit-tested without I/O):
//! - [`spec`]: what a VM is made of and its validation;
//! - [`domain`]: the libvirt domain XML for a [`VmSpec`](spec::VmSpec);
//! - [`events`]: libvirt's lifecycle event codes and job stats in the API's words;
//! - [`auth`]: the `Authorization: Bearer` header.
//!
//! Pure decisions behind a thin edge that reads files:
//! - [`config`]: the launch arguments turned into a checked configuration before anything is
//!   touched (`parse_args`, pure); `load` reads the config and token files, `check_files`
//!   resolves the boot files on disk;
//! - [`libvirtd`]: the launcher pod's own libvirtd, its configuration and command line
//!   (pure); `new_host_uuid` reads the kernel's.
//!
//! I/O adapters:
//! - [`shim`]: the runtime (libvirt connection, boot / re-attach, migration jobs, event log);
//! - [`server`]: the HTTP/1.1 JSON API;
//! - [`net`]: the tap and its OVS port;
//! - [`console`]: the guest's serial console followed onto the launcher pod's output;
//! - [`disk`]: the disk image opened without following links, checked, and pinned where
//!   its owner cannot reach;
//! - [`openflow`]: a frame handed to OVS as if from a port (the target's RARP at the pause);
//! - [`proxy`]: the migration's mutual-TLS proxy between two nodes' libvirtds;
//! - [`sys`]: the crate's only `unsafe` code (libvirt events and job control, TUN ioctls),
//!   behind safe functions.
#![warn(missing_docs)]

pub mod auth;
pub mod config;
pub mod console;
pub mod disk;
pub mod domain;
mod error;
pub mod events;
pub mod libvirtd;
pub mod net;
pub mod openflow;
pub mod proxy;
pub mod server;
pub mod shim;
pub mod spec;
pub mod sys;

pub use error::{Error, Result};
/// The API types and client, from `roam_shim_api` (libvirt-free, what controllers link).
pub use roam_shim_api::{api, client};
