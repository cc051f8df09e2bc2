//! DHCP options for roam's /32 leases: the OVN `DHCP_Options` row and
//! RFC 3442 classless static routes. Pure logic, no I/O.
//!
//! # The /32 lease
//!
//! Every roam workload address is a /32, so a VM can move between nodes
//! without renumbering. OVN's native DHCP hands the VM that /32 from a
//! `DHCP_Options` row ([`Lease::to_ovn`]).
//!
//! Under a /32 nothing is on-link, not even the gateway. A lease whose only
//! route is `0.0.0.0/0 via GW` therefore leaves clients such as Debian's
//! dhclient with no routes at all: the kernel refuses a route via a next
//! hop it cannot reach. So the lease first makes the gateway on-link, then
//! routes through it ([`default_routes`]):
//!
//! ```text
//! classless_static_route = {GW/32,0.0.0.0, 0.0.0.0/0,GW}
//!                           ^ on-link host route to GW
//!                                          ^ default route via GW
//! ```
//!
//! The same list goes in option 121 (RFC 3442) and in Microsoft's option
//! 249, and [`LeaseBuilder::build`] refuses any route whose gateway no
//! earlier on-link route covers.
//!
//! ```
//! use std::net::Ipv4Addr;
//! use roam_dhcp_opts::{Lease, rfc3442};
//!
//! let lease = Lease::overlay(
//!     Ipv4Addr::new(10, 244, 1, 11),
//!     Ipv4Addr::new(10, 244, 0, 1),
//!     "0a:00:00:00:00:01".parse()?,
//! )?;
//! let row = lease.to_ovn();
//! assert_eq!(row.cidr, "10.244.1.11/32");
//! assert_eq!(row.options["router"], "10.244.0.1");
//! assert_eq!(
//!     rfc3442::encode(lease.classless_static_routes()),
//!     [32, 10, 244, 0, 1, 0, 0, 0, 0, 0, 10, 244, 0, 1]
//! );
//! # Ok::<(), roam_dhcp_opts::Error>(())
//! ```
//!
//! # Modules
//!
//! - [`Lease`] / [`LeaseBuilder`]: the lease model and its checks.
//! - [`Route`]: one classless static route, valid by construction.
//! - [`MacAddr`]: the DHCP server's MAC.
//! - [`ovn`]: the `DHCP_Options` row, [`Lease::to_ovn`] / [`Lease::from_ovn`].
//! - [`rfc3442`]: the option 121 / 249 wire codec and OVN's string form.
//! - [`Error`]: the crate's one error type.

#![warn(missing_docs)]

mod error;
mod lease;
mod mac;
pub mod ovn;
pub mod rfc3442;
mod route;

pub use error::{AddressKind, AddressRole, Error, Result};
pub use ipnet::Ipv4Net;
pub use lease::{Lease, LeaseBuilder, MAX_DNS_SERVERS, default_routes};
pub use mac::MacAddr;
pub use ovn::DhcpOptionsRow;
pub use route::Route;
