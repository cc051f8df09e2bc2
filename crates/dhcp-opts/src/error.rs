//! The crate's one error type.

use std::fmt;
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

use crate::mac::MacAddr;

/// `Result` with this crate's [`Error`] as the default error type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can be wrong with a lease, a route, a MAC, an RFC 3442
/// payload or an OVN `DHCP_Options` row.
///
/// Each message says what was wrong and what to do instead. Every variant is bad input: the
/// same lease or row fails again until it is fixed, so report it rather than retry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An address that must be a unicast host address is not.
    #[error("{role} {addr} is {kind}; the {role} must be a unicast IPv4 host address")]
    UnusableAddress {
        /// Which field of the lease holds the address.
        role: AddressRole,
        /// The offending address.
        addr: Ipv4Addr,
        /// Why it is unusable.
        kind: AddressKind,
    },

    /// The router (gateway) is the client's own address.
    #[error(
        "router {router} is the client's own address; the gateway must be another host, \
         e.g. the overlay gateway"
    )]
    RouterIsClient {
        /// The router, equal to the client ip.
        router: Ipv4Addr,
    },

    /// The DHCP server identifier is the client's own address.
    #[error(
        "server_id {server_id} is the client's own address; use the gateway address \
         (the default) or another address that belongs to the DHCP server"
    )]
    ServerIdIsClient {
        /// The server identifier, equal to the client ip.
        server_id: Ipv4Addr,
    },

    /// The MTU is below the IPv4 minimum or does not fit the 16-bit option.
    #[error(
        "mtu {mtu} is outside 68..=65535; 68 is the IPv4 minimum (RFC 791) and 65535 the \
         largest value option 26 can carry: use the overlay's MTU (typically 1500)"
    )]
    MtuOutOfRange {
        /// The offending MTU.
        mtu: u64,
    },

    /// The lease time is zero.
    #[error(
        "lease_time 0 would expire the lease immediately; use a positive number of seconds \
         (roam's default is 3600; 4294967295 means infinite)"
    )]
    ZeroLeaseTime,

    /// A prefix length is longer than 32 bits.
    #[error("prefix length {prefix_len} is longer than 32; an IPv4 prefix length is 0..=32")]
    PrefixTooLong {
        /// The offending prefix length.
        prefix_len: u8,
    },

    /// A route destination has bits set beyond its prefix length.
    #[error(
        "route destination {addr}/{prefix_len} has host bits set beyond its {prefix_len}-bit \
         prefix; use the network address {network}"
    )]
    HostBitsSet {
        /// The destination address as given.
        addr: Ipv4Addr,
        /// The destination prefix length.
        prefix_len: u8,
        /// The destination with its host bits cleared: what was probably meant.
        network: Ipv4Net,
    },

    /// A route gateway is multicast, broadcast or loopback.
    #[error(
        "route to {dest}: gateway {gateway} is {kind}; a route gateway must be a unicast \
         address, or 0.0.0.0 for an on-link route"
    )]
    UnusableRouteGateway {
        /// The route's destination.
        dest: Ipv4Net,
        /// The offending gateway.
        gateway: Ipv4Addr,
        /// Why it is unusable.
        kind: AddressKind,
    },

    /// A route goes via the client's own address.
    #[error(
        "route to {dest} goes via the client's own address {gateway}; route via the router, \
         or use 0.0.0.0 for an on-link route"
    )]
    RouteViaClient {
        /// The route's destination.
        dest: Ipv4Net,
        /// The gateway, equal to the client ip.
        gateway: Ipv4Addr,
    },

    /// Two routes have the same destination.
    #[error("route to {dest} is listed twice; keep one route per destination")]
    DuplicateRoute {
        /// The repeated destination.
        dest: Ipv4Net,
    },

    /// A route's gateway is not made on-link by an earlier route.
    #[error(
        "route to {dest} via {gateway} is unreachable: under a /32 lease nothing is on-link, \
         so an earlier on-link route (gateway 0.0.0.0) must cover the gateway; \
         add {gateway}/32 via 0.0.0.0 before it"
    )]
    UnreachableRouteGateway {
        /// The route's destination.
        dest: Ipv4Net,
        /// The gateway no earlier on-link route covers.
        gateway: Ipv4Addr,
    },

    /// The routes do not fit one DHCP option.
    #[error(
        "the classless static routes encode to {len} bytes, but a DHCP option holds at most \
         255 and OVN does not split long options (RFC 3396); use fewer routes or shorter \
         prefixes"
    )]
    RoutesTooLong {
        /// The RFC 3442 encoded length.
        len: usize,
    },

    /// The DNS servers do not fit one DHCP option.
    #[error(
        "{count} dns servers do not fit one DHCP option (at most 63, 255 bytes) and OVN does \
         not split long options (RFC 3396); list at most 63"
    )]
    TooManyDnsServers {
        /// How many were given.
        count: usize,
    },

    /// A MAC address string is malformed.
    #[error(
        "MAC address {input:?} is malformed: {problem}; write six two-digit hex octets \
         separated by ':', like 0a:00:00:00:00:01"
    )]
    InvalidMac {
        /// The text as given.
        input: String,
        /// What is wrong with it.
        problem: String,
    },

    /// The server MAC is a multicast (or broadcast) MAC.
    #[error(
        "server_mac {mac} is a multicast MAC (lowest bit of the first octet set); use a \
         unicast MAC such as 0a:00:00:00:00:01"
    )]
    MulticastServerMac {
        /// The offending MAC.
        mac: MacAddr,
    },

    /// The server MAC is all zeros.
    #[error(
        "server_mac 00:00:00:00:00:00 is not a usable source address; use a unicast MAC such \
         as 0a:00:00:00:00:01"
    )]
    ZeroServerMac,

    /// An RFC 3442 descriptor's width octet exceeds 32.
    #[error(
        "RFC 3442 route descriptor at byte {offset}: width {width} exceeds 32; the width is \
         the destination prefix length, 0..=32"
    )]
    Rfc3442WidthTooLarge {
        /// Offset of the descriptor's width octet in the payload.
        offset: usize,
        /// The offending width.
        width: u8,
    },

    /// An RFC 3442 descriptor runs past the end of the payload.
    #[error(
        "RFC 3442 route descriptor at byte {offset} is truncated: width {width} needs \
         {needed} bytes (width octet, significant destination octets, 4 router octets) but \
         only {available} remain"
    )]
    Rfc3442Truncated {
        /// Offset of the descriptor's width octet in the payload.
        offset: usize,
        /// The descriptor's width.
        width: u8,
        /// Bytes the descriptor needs.
        needed: usize,
        /// Bytes left in the payload from `offset`.
        available: usize,
    },

    /// An RFC 3442 descriptor is well-formed but describes an invalid route.
    #[error("RFC 3442 route descriptor at byte {offset}: {error}")]
    Rfc3442InvalidRoute {
        /// Offset of the descriptor's width octet in the payload.
        offset: usize,
        /// What is wrong with the route (e.g. [`Error::HostBitsSet`]).
        error: Box<Error>,
    },

    /// An OVN option value (or one token of it) is malformed.
    #[error("OVN option {option}: {token:?} {problem}")]
    InvalidOvnValue {
        /// The option's name, e.g. `classless_static_route`.
        option: &'static str,
        /// The offending token, or the whole value.
        token: String,
        /// What is wrong with it and what is expected.
        problem: String,
    },

    /// The OVN row lacks an option roam always writes.
    #[error(
        "OVN DHCP_Options row lacks the {option} option, which roam always writes; \
         rebuild the row with Lease::to_ovn"
    )]
    MissingOvnOption {
        /// The missing option's name.
        option: &'static str,
    },

    /// The OVN row carries an option the lease model does not.
    #[error(
        "OVN DHCP_Options row has option {option:?}, which roam's lease model does not carry; \
         remove it from the row (reading it back would silently drop it)"
    )]
    UnknownOvnOption {
        /// The unknown option's name.
        option: String,
    },

    /// The OVN row's option 121 and option 249 routes differ.
    #[error(
        "OVN classless_static_route {classless:?} and ms_classless_static_route {ms:?} \
         differ; roam writes the same routes to both (options 121 and 249)"
    )]
    OvnRouteOptionsDiffer {
        /// The `classless_static_route` value.
        classless: String,
        /// The `ms_classless_static_route` value.
        ms: String,
    },

    /// The OVN row's `cidr` column is not a /32.
    #[error("OVN DHCP_Options cidr {cidr:?} {problem}; roam leases are written as <client ip>/32")]
    InvalidOvnCidr {
        /// The column as given.
        cidr: String,
        /// What is wrong with it.
        problem: String,
    },
}

/// Which field of a lease an address fills, for [`Error::UnusableAddress`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AddressRole {
    /// The client's own address (the lease).
    ClientIp,
    /// The router (option 3), the client's gateway.
    Router,
    /// The DHCP server identifier (option 54).
    ServerId,
    /// A DNS server (option 6).
    DnsServer,
}

impl fmt::Display for AddressRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::ClientIp => "client ip",
            Self::Router => "router",
            Self::ServerId => "server_id",
            Self::DnsServer => "dns_server",
        })
    }
}

/// Why an address is not a usable unicast host address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AddressKind {
    /// `0.0.0.0`.
    Unspecified,
    /// `255.255.255.255`.
    Broadcast,
    /// `224.0.0.0/4`.
    Multicast,
    /// `127.0.0.0/8`.
    Loopback,
}

impl AddressKind {
    /// Why `addr` is not a usable unicast host address, or `None` if it is.
    pub fn of(addr: Ipv4Addr) -> Option<Self> {
        if addr.is_unspecified() {
            Some(Self::Unspecified)
        } else if addr.is_broadcast() {
            Some(Self::Broadcast)
        } else if addr.is_multicast() {
            Some(Self::Multicast)
        } else if addr.is_loopback() {
            Some(Self::Loopback)
        } else {
            None
        }
    }
}

impl fmt::Display for AddressKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Unspecified => "the unspecified address",
            Self::Broadcast => "the limited broadcast address",
            Self::Multicast => "a multicast address",
            Self::Loopback => "a loopback address",
        })
    }
}

/// `Ok` if `addr` is a usable unicast host address for `role`.
pub(crate) fn check_unicast(role: AddressRole, addr: Ipv4Addr) -> Result<()> {
    match AddressKind::of(addr) {
        None => Ok(()),
        Some(kind) => Err(Error::UnusableAddress { role, addr, kind }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_addresses() {
        assert_eq!(
            AddressKind::of(Ipv4Addr::UNSPECIFIED),
            Some(AddressKind::Unspecified)
        );
        assert_eq!(
            AddressKind::of(Ipv4Addr::BROADCAST),
            Some(AddressKind::Broadcast)
        );
        assert_eq!(
            AddressKind::of(Ipv4Addr::new(224, 0, 0, 1)),
            Some(AddressKind::Multicast)
        );
        assert_eq!(
            AddressKind::of(Ipv4Addr::new(239, 255, 255, 255)),
            Some(AddressKind::Multicast)
        );
        assert_eq!(
            AddressKind::of(Ipv4Addr::LOCALHOST),
            Some(AddressKind::Loopback)
        );
        assert_eq!(AddressKind::of(Ipv4Addr::new(10, 244, 0, 1)), None);
        assert_eq!(AddressKind::of(Ipv4Addr::new(169, 254, 1, 1)), None);
    }

    #[test]
    fn unusable_address_message_names_role_and_fix() {
        let e = check_unicast(AddressRole::Router, Ipv4Addr::new(224, 0, 0, 5)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "router 224.0.0.5 is a multicast address; the router must be a unicast IPv4 host \
             address"
        );
    }
}
