//! One classless static route: a destination prefix and a gateway.

use std::fmt;
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

use crate::error::{AddressKind, Error, Result};

/// A classless static route (RFC 3442): traffic for `dest` goes via `gateway`.
///
/// A gateway of `0.0.0.0` means the destination is on-link: the client
/// reaches it directly on the interface, with no next hop. Under a /32 lease
/// that is how the router itself becomes reachable.
///
/// Every `Route` is valid: its destination has no bits set beyond the prefix
/// length, and its gateway is `0.0.0.0` or a unicast address (not multicast,
/// broadcast or loopback).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Route {
    dest: Ipv4Net,
    gateway: Ipv4Addr,
}

impl Route {
    /// The route to `dest` via `gateway` (`0.0.0.0` for on-link).
    ///
    /// Fails with [`Error::HostBitsSet`] if `dest` has bits set beyond its
    /// prefix (e.g. `10.0.0.1/24`), and with [`Error::UnusableRouteGateway`]
    /// if `gateway` is multicast, broadcast or loopback.
    pub fn new(dest: Ipv4Net, gateway: Ipv4Addr) -> Result<Self> {
        if dest.addr() != dest.network() {
            return Err(Error::HostBitsSet {
                addr: dest.addr(),
                prefix_len: dest.prefix_len(),
                network: dest.trunc(),
            });
        }
        if !gateway.is_unspecified()
            && let Some(kind) = AddressKind::of(gateway)
        {
            return Err(Error::UnusableRouteGateway {
                dest,
                gateway,
                kind,
            });
        }
        Ok(Self { dest, gateway })
    }

    /// The route to `addr/prefix_len` via `gateway`; as [`Route::new`], and
    /// fails with [`Error::PrefixTooLong`] if `prefix_len` exceeds 32.
    pub fn from_parts(addr: Ipv4Addr, prefix_len: u8, gateway: Ipv4Addr) -> Result<Self> {
        let dest =
            Ipv4Net::new(addr, prefix_len).map_err(|_| Error::PrefixTooLong { prefix_len })?;
        Self::new(dest, gateway)
    }

    /// The on-link route to `dest` (gateway `0.0.0.0`); as [`Route::new`].
    pub fn on_link(dest: Ipv4Net) -> Result<Self> {
        Self::new(dest, Ipv4Addr::UNSPECIFIED)
    }

    /// The on-link host route `host/32 via 0.0.0.0`, which makes `host`
    /// reachable without a next hop. Cannot fail.
    pub fn host_on_link(host: Ipv4Addr) -> Self {
        Self {
            dest: Ipv4Net::from(host),
            gateway: Ipv4Addr::UNSPECIFIED,
        }
    }

    /// The destination prefix (never has host bits set).
    pub const fn dest(&self) -> Ipv4Net {
        self.dest
    }

    /// The next hop, or `0.0.0.0` for an on-link route.
    pub const fn gateway(&self) -> Ipv4Addr {
        self.gateway
    }

    /// Whether the destination is on-link (gateway `0.0.0.0`).
    pub fn is_on_link(&self) -> bool {
        self.gateway.is_unspecified()
    }

    /// Whether this is a default route (`0.0.0.0/0`).
    pub fn is_default(&self) -> bool {
        self.dest.prefix_len() == 0
    }

    /// The number of destination octets RFC 3442 carries for this route:
    /// `ceil(prefix_len / 8)`.
    pub fn significant_octets(&self) -> usize {
        usize::from(self.dest.prefix_len()).div_ceil(8)
    }

    /// This route's RFC 3442 descriptor length: width octet, significant
    /// destination octets, four router octets.
    pub fn encoded_len(&self) -> usize {
        1 + self.significant_octets() + 4
    }

    /// A route known valid by construction (the default route via a router
    /// already checked to be unicast).
    pub(crate) fn default_via_unchecked(gateway: Ipv4Addr) -> Self {
        Self {
            dest: Ipv4Net::default(),
            gateway,
        }
    }
}

impl fmt::Display for Route {
    /// `10.17.0.0/16 via 10.0.0.1`, or `10.244.0.1/32 on-link`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_on_link() {
            write!(f, "{} on-link", self.dest)
        } else {
            write!(f, "{} via {}", self.dest, self.gateway)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> Ipv4Net {
        s.parse().unwrap()
    }

    #[test]
    fn builds_valid_routes() {
        let r = Route::new(net("10.17.0.0/16"), Ipv4Addr::new(10, 0, 0, 1)).unwrap();
        assert_eq!(r.dest(), net("10.17.0.0/16"));
        assert_eq!(r.gateway(), Ipv4Addr::new(10, 0, 0, 1));
        assert!(!r.is_on_link() && !r.is_default());
        assert_eq!(r.significant_octets(), 2);
        assert_eq!(r.encoded_len(), 7);
        assert_eq!(r.to_string(), "10.17.0.0/16 via 10.0.0.1");

        let h = Route::host_on_link(Ipv4Addr::new(10, 244, 0, 1));
        assert_eq!(h.dest(), net("10.244.0.1/32"));
        assert!(h.is_on_link());
        assert_eq!(h.to_string(), "10.244.0.1/32 on-link");
        assert_eq!(h, Route::on_link(net("10.244.0.1/32")).unwrap());

        let d = Route::from_parts(Ipv4Addr::UNSPECIFIED, 0, Ipv4Addr::new(10, 244, 0, 1)).unwrap();
        assert!(d.is_default());
        assert_eq!(d.significant_octets(), 0);
        assert_eq!(
            d,
            Route::default_via_unchecked(Ipv4Addr::new(10, 244, 0, 1))
        );
    }

    #[test]
    fn significant_octets_round_up() {
        for (len, octets) in [
            (0, 0),
            (1, 1),
            (8, 1),
            (9, 2),
            (16, 2),
            (17, 3),
            (24, 3),
            (25, 4),
            (32, 4),
        ] {
            let r = Route::on_link(Ipv4Net::new(Ipv4Addr::UNSPECIFIED, len).unwrap()).unwrap();
            assert_eq!(r.significant_octets(), octets, "/{len}");
        }
    }

    #[test]
    fn rejects_host_bits() {
        let e = Route::new(net("10.0.0.1/24"), Ipv4Addr::new(10, 0, 0, 254)).unwrap_err();
        assert_eq!(
            e,
            Error::HostBitsSet {
                addr: Ipv4Addr::new(10, 0, 0, 1),
                prefix_len: 24,
                network: net("10.0.0.0/24"),
            }
        );
        assert_eq!(
            e.to_string(),
            "route destination 10.0.0.1/24 has host bits set beyond its 24-bit prefix; use the \
             network address 10.0.0.0/24"
        );
        assert!(matches!(
            Route::from_parts(Ipv4Addr::new(0, 0, 0, 1), 0, Ipv4Addr::UNSPECIFIED),
            Err(Error::HostBitsSet { prefix_len: 0, .. })
        ));
    }

    #[test]
    fn rejects_long_prefix() {
        assert_eq!(
            Route::from_parts(Ipv4Addr::new(10, 0, 0, 0), 33, Ipv4Addr::UNSPECIFIED),
            Err(Error::PrefixTooLong { prefix_len: 33 })
        );
        assert_eq!(
            Error::PrefixTooLong { prefix_len: 33 }.to_string(),
            "prefix length 33 is longer than 32; an IPv4 prefix length is 0..=32"
        );
    }

    #[test]
    fn rejects_unusable_gateways() {
        for (gw, kind) in [
            (Ipv4Addr::new(224, 0, 0, 1), AddressKind::Multicast),
            (Ipv4Addr::BROADCAST, AddressKind::Broadcast),
            (Ipv4Addr::new(127, 0, 0, 1), AddressKind::Loopback),
        ] {
            assert_eq!(
                Route::new(net("0.0.0.0/0"), gw),
                Err(Error::UnusableRouteGateway {
                    dest: net("0.0.0.0/0"),
                    gateway: gw,
                    kind
                })
            );
        }
        let msg = Route::new(net("0.0.0.0/0"), Ipv4Addr::BROADCAST)
            .unwrap_err()
            .to_string();
        assert_eq!(
            msg,
            "route to 0.0.0.0/0: gateway 255.255.255.255 is the limited broadcast address; a \
             route gateway must be a unicast address, or 0.0.0.0 for an on-link route"
        );
    }
}
