//! roam-shim's library: the VM runtime inside a launcher pod.
//!
//! - [`spec`]: what a VM is made of (vCPUs, memory, boot source, NIC, serial log) and its
//!   validation — pure.
//! - [`domain`]: the libvirt domain XML for a [`VmSpec`](spec::VmSpec) — pure.
//!
//! To come (roam-shim issue): the libvirt adapter (start, re-attach, state), the
//! authenticated migration API, lifecycle events.
#![warn(missing_docs)]

pub mod domain;
mod error;
pub mod spec;

pub use error::{Error, Result};
