//! roam-controller's library, the top layer of the controller: the controllers that carry
//! out [`roam_core`]'s decisions over [`roam_api`]'s objects ([`controller`]: watches, the
//! observe step, the writers), the launcher and runner pods they create ([`launcher`], pure
//! builders) and the command lines of the binaries ([`cli`]).
#![warn(missing_docs)]

pub mod cli;
mod error;
pub mod launcher;

pub use error::{Error, Result};
pub mod controller;
