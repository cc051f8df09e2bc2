//! Helpers for roam's lab-backed tests, by area: the lab itself ([`lab`]), test network
//! namespaces ([`netns`]), OVN ([`ovn`]), VLAN wiring ([`vlan`]), roam-shim ([`shim`]),
//! roam-controller ([`controller`]), roam-cni ([`cni`]), the nodes as separate hosts
//! ([`hosts`]), test objects and their clean-up
//! ([`fixtures`]), and measurements ([`measure`]). Everything is re-exported at the root.
//!
//! Every test here needs the lab (`e2e/lab up`). Without it a test fails loudly and says
//! how to start it; it never skips.

pub mod cni;
pub mod controller;
pub mod fixtures;
pub mod hosts;
pub mod lab;
pub mod measure;
pub mod netns;
pub mod ovn;
pub mod scale;
pub mod shim;
pub mod startlog;
pub mod tenant;
pub mod vlan;

pub use cni::*;
pub use controller::*;
pub use fixtures::*;
pub use hosts::*;
pub use lab::*;
pub use measure::*;
pub use netns::*;
pub use ovn::*;
pub use scale::*;
pub use shim::*;
pub use tenant::Tenant;
pub use vlan::*;
