//! The /32 lease roam hands a VM, and its validation.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;

use crate::error::{AddressRole, Error, Result, check_unicast};
use crate::mac::MacAddr;
use crate::rfc3442;
use crate::route::Route;

/// The most DNS servers one DHCP option 6 holds (4 bytes each, 255 bytes).
pub const MAX_DNS_SERVERS: usize = rfc3442::MAX_OPTION_LEN / 4;

/// The routes a /32 lease needs to reach anything: the router made on-link,
/// then the default route via it.
///
/// `[router/32 via 0.0.0.0, 0.0.0.0/0 via router]`. A lone
/// `0.0.0.0/0 via router` is not enough: under a /32 nothing is on-link, so
/// clients such as Debian's dhclient cannot install a route via the router
/// and end up with no routes at all.
///
/// Fails with [`Error::UnusableAddress`] if `router` is not unicast.
pub fn default_routes(router: Ipv4Addr) -> Result<Vec<Route>> {
    check_unicast(AddressRole::Router, router)?;
    Ok(default_routes_unchecked(router))
}

fn default_routes_unchecked(router: Ipv4Addr) -> Vec<Route> {
    vec![
        Route::host_on_link(router),
        Route::default_via_unchecked(router),
    ]
}

/// A DHCP lease for one workload address, handed out as a /32.
///
/// Every `Lease` is valid: build one with [`Lease::overlay`] or
/// [`Lease::builder`], which check everything [`LeaseBuilder::build`]
/// documents.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Lease {
    ip: Ipv4Addr,
    router: Ipv4Addr,
    server_id: Ipv4Addr,
    server_mac: MacAddr,
    dns_servers: Vec<Ipv4Addr>,
    classless_static_routes: Vec<Route>,
    lease_time: u32,
    mtu: u16,
}

impl Lease {
    /// roam's default lease time, in seconds.
    pub const DEFAULT_LEASE_TIME: u32 = 3600;

    /// roam's default MTU.
    pub const DEFAULT_MTU: u16 = 1500;

    /// The smallest MTU IPv4 allows (RFC 791).
    pub const MIN_MTU: u16 = 68;

    /// The overlay lease for `ip` behind `router`, served from `server_mac`,
    /// with the defaults: `server_id` = `router`, no DNS servers, the
    /// [`default_routes`], lease time [`Lease::DEFAULT_LEASE_TIME`] and MTU
    /// [`Lease::DEFAULT_MTU`].
    ///
    /// Fails as [`LeaseBuilder::build`].
    pub fn overlay(ip: Ipv4Addr, router: Ipv4Addr, server_mac: MacAddr) -> Result<Self> {
        Self::builder(ip, router, server_mac).build()
    }

    /// A builder starting from the [`Lease::overlay`] defaults.
    pub fn builder(ip: Ipv4Addr, router: Ipv4Addr, server_mac: MacAddr) -> LeaseBuilder {
        LeaseBuilder {
            ip,
            router,
            server_mac,
            server_id: None,
            dns_servers: Vec::new(),
            classless_static_routes: None,
            lease_time: Self::DEFAULT_LEASE_TIME,
            mtu: Self::DEFAULT_MTU,
        }
    }

    /// A builder holding this lease's values, to change some of them.
    pub fn into_builder(self) -> LeaseBuilder {
        LeaseBuilder {
            ip: self.ip,
            router: self.router,
            server_mac: self.server_mac,
            server_id: Some(self.server_id),
            dns_servers: self.dns_servers,
            classless_static_routes: Some(self.classless_static_routes),
            lease_time: self.lease_time,
            mtu: self.mtu,
        }
    }

    /// The client's address, leased as a /32.
    pub const fn ip(&self) -> Ipv4Addr {
        self.ip
    }

    /// The router (option 3), the client's gateway.
    pub const fn router(&self) -> Ipv4Addr {
        self.router
    }

    /// The DHCP server identifier (option 54).
    pub const fn server_id(&self) -> Ipv4Addr {
        self.server_id
    }

    /// The MAC the DHCP server answers from.
    pub const fn server_mac(&self) -> MacAddr {
        self.server_mac
    }

    /// The DNS servers (option 6), possibly none.
    pub fn dns_servers(&self) -> &[Ipv4Addr] {
        &self.dns_servers
    }

    /// The classless static routes (options 121 and 249), possibly none.
    pub fn classless_static_routes(&self) -> &[Route] {
        &self.classless_static_routes
    }

    /// The lease time (option 51), in seconds; `u32::MAX` is infinite.
    pub const fn lease_time(&self) -> u32 {
        self.lease_time
    }

    /// The interface MTU (option 26).
    pub const fn mtu(&self) -> u16 {
        self.mtu
    }

    fn validate(&self) -> Result<()> {
        check_unicast(AddressRole::ClientIp, self.ip)?;
        check_unicast(AddressRole::Router, self.router)?;
        if self.router == self.ip {
            return Err(Error::RouterIsClient {
                router: self.router,
            });
        }
        check_unicast(AddressRole::ServerId, self.server_id)?;
        if self.server_id == self.ip {
            return Err(Error::ServerIdIsClient {
                server_id: self.server_id,
            });
        }
        if self.server_mac.is_multicast() {
            return Err(Error::MulticastServerMac {
                mac: self.server_mac,
            });
        }
        if self.server_mac.is_zero() {
            return Err(Error::ZeroServerMac);
        }
        for &dns in &self.dns_servers {
            check_unicast(AddressRole::DnsServer, dns)?;
        }
        if self.dns_servers.len() > MAX_DNS_SERVERS {
            return Err(Error::TooManyDnsServers {
                count: self.dns_servers.len(),
            });
        }
        self.validate_routes()?;
        if self.lease_time == 0 {
            return Err(Error::ZeroLeaseTime);
        }
        if self.mtu < Self::MIN_MTU {
            return Err(Error::MtuOutOfRange {
                mtu: u64::from(self.mtu),
            });
        }
        Ok(())
    }

    fn validate_routes(&self) -> Result<()> {
        let mut seen = BTreeSet::new();
        for (i, route) in self.classless_static_routes.iter().enumerate() {
            let (dest, gateway) = (route.dest(), route.gateway());
            if !seen.insert(dest) {
                return Err(Error::DuplicateRoute { dest });
            }
            if gateway == self.ip {
                return Err(Error::RouteViaClient { dest, gateway });
            }
            let reachable = route.is_on_link()
                || self.classless_static_routes[..i]
                    .iter()
                    .any(|earlier| earlier.is_on_link() && earlier.dest().contains(&gateway));
            if !reachable {
                return Err(Error::UnreachableRouteGateway { dest, gateway });
            }
        }
        let len = rfc3442::encoded_len(&self.classless_static_routes);
        if len > rfc3442::MAX_OPTION_LEN {
            return Err(Error::RoutesTooLong { len });
        }
        Ok(())
    }
}

/// Builds a [`Lease`], starting from the [`Lease::overlay`] defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use]
pub struct LeaseBuilder {
    ip: Ipv4Addr,
    router: Ipv4Addr,
    server_mac: MacAddr,
    server_id: Option<Ipv4Addr>,
    dns_servers: Vec<Ipv4Addr>,
    classless_static_routes: Option<Vec<Route>>,
    lease_time: u32,
    mtu: u16,
}

impl LeaseBuilder {
    /// The DHCP server identifier; defaults to the router.
    pub fn server_id(mut self, server_id: Ipv4Addr) -> Self {
        self.server_id = Some(server_id);
        self
    }

    /// The DNS servers, in order of preference; defaults to none.
    pub fn dns_servers(mut self, dns_servers: impl IntoIterator<Item = Ipv4Addr>) -> Self {
        self.dns_servers = dns_servers.into_iter().collect();
        self
    }

    /// The classless static routes, in the order the client should install
    /// them; defaults to [`default_routes`] of the router. An empty list
    /// leaves options 121 and 249 out of the row.
    pub fn classless_static_routes(mut self, routes: impl IntoIterator<Item = Route>) -> Self {
        self.classless_static_routes = Some(routes.into_iter().collect());
        self
    }

    /// The lease time in seconds; defaults to [`Lease::DEFAULT_LEASE_TIME`].
    pub fn lease_time(mut self, seconds: u32) -> Self {
        self.lease_time = seconds;
        self
    }

    /// The MTU; defaults to [`Lease::DEFAULT_MTU`].
    pub fn mtu(mut self, mtu: u16) -> Self {
        self.mtu = mtu;
        self
    }

    /// The lease, checked. Fails, in this order of checks, with:
    ///
    /// - [`Error::UnusableAddress`] if the client ip, router, server_id or a
    ///   DNS server is `0.0.0.0`, `255.255.255.255`, multicast or loopback;
    /// - [`Error::RouterIsClient`] / [`Error::ServerIdIsClient`] if the router
    ///   or server_id is the client ip;
    /// - [`Error::MulticastServerMac`] / [`Error::ZeroServerMac`];
    /// - [`Error::TooManyDnsServers`] past [`MAX_DNS_SERVERS`];
    /// - [`Error::DuplicateRoute`] if two routes share a destination;
    /// - [`Error::RouteViaClient`] if a route goes via the client ip;
    /// - [`Error::UnreachableRouteGateway`] if a route's gateway is not
    ///   covered by an earlier on-link route: under a /32 nothing else is
    ///   on-link, and clients install routes in order;
    /// - [`Error::RoutesTooLong`] if the routes encode past 255 bytes, since
    ///   OVN cannot split a long option;
    /// - [`Error::ZeroLeaseTime`];
    /// - [`Error::MtuOutOfRange`] below 68.
    ///
    /// Routes themselves are valid by construction (see [`Route::new`]).
    pub fn build(self) -> Result<Lease> {
        let lease = Lease {
            ip: self.ip,
            router: self.router,
            server_id: self.server_id.unwrap_or(self.router),
            server_mac: self.server_mac,
            dns_servers: self.dns_servers,
            classless_static_routes: self
                .classless_static_routes
                .unwrap_or_else(|| default_routes_unchecked(self.router)),
            lease_time: self.lease_time,
            mtu: self.mtu,
        };
        lease.validate()?;
        Ok(lease)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::AddressKind;
    use ipnet::Ipv4Net;

    const IP: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 11);
    const GW: Ipv4Addr = Ipv4Addr::new(10, 244, 0, 1);
    const MAC: MacAddr = MacAddr::new([0x0a, 0, 0, 0, 0, 1]);

    fn builder() -> LeaseBuilder {
        Lease::builder(IP, GW, MAC)
    }

    fn route(dest: &str, gw: Ipv4Addr) -> Route {
        Route::new(dest.parse().unwrap(), gw).unwrap()
    }

    #[test]
    fn overlay_defaults() {
        let lease = Lease::overlay(IP, GW, MAC).unwrap();
        assert_eq!(lease.ip(), IP);
        assert_eq!(lease.router(), GW);
        assert_eq!(lease.server_id(), GW);
        assert_eq!(lease.server_mac(), MAC);
        assert!(lease.dns_servers().is_empty());
        assert_eq!(
            lease.classless_static_routes(),
            [
                route("10.244.0.1/32", Ipv4Addr::UNSPECIFIED),
                route("0.0.0.0/0", GW)
            ]
        );
        assert_eq!(lease.lease_time(), 3600);
        assert_eq!(lease.mtu(), 1500);
        assert_eq!(default_routes(GW).unwrap(), lease.classless_static_routes());
    }

    #[test]
    fn builder_sets_everything() {
        let lease = builder()
            .server_id(Ipv4Addr::new(10, 244, 0, 2))
            .dns_servers([Ipv4Addr::new(10, 96, 0, 10), Ipv4Addr::new(10, 96, 0, 11)])
            .classless_static_routes([route("0.0.0.0/0", Ipv4Addr::UNSPECIFIED)])
            .lease_time(u32::MAX)
            .mtu(1400)
            .build()
            .unwrap();
        assert_eq!(lease.server_id(), Ipv4Addr::new(10, 244, 0, 2));
        assert_eq!(lease.dns_servers().len(), 2);
        assert_eq!(lease.classless_static_routes().len(), 1);
        assert_eq!(lease.lease_time(), u32::MAX);
        assert_eq!(lease.mtu(), 1400);
        let again = lease.clone().into_builder().build().unwrap();
        assert_eq!(again, lease);
        let shorter = lease.into_builder().lease_time(60).build().unwrap();
        assert_eq!(shorter.lease_time(), 60);
        assert_eq!(shorter.server_id(), Ipv4Addr::new(10, 244, 0, 2));
    }

    #[test]
    fn empty_routes_are_allowed() {
        let lease = builder().classless_static_routes([]).build().unwrap();
        assert_eq!(lease.classless_static_routes(), []);
    }

    #[test]
    fn link_local_gateway_is_allowed() {
        let gw = Ipv4Addr::new(169, 254, 1, 1);
        assert!(Lease::overlay(IP, gw, MAC).is_ok());
    }

    #[test]
    fn rejects_unusable_client_ip() {
        for (ip, kind) in [
            (Ipv4Addr::UNSPECIFIED, AddressKind::Unspecified),
            (Ipv4Addr::BROADCAST, AddressKind::Broadcast),
            (Ipv4Addr::new(239, 1, 2, 3), AddressKind::Multicast),
            (Ipv4Addr::new(127, 0, 0, 2), AddressKind::Loopback),
        ] {
            assert_eq!(
                Lease::overlay(ip, GW, MAC),
                Err(Error::UnusableAddress {
                    role: AddressRole::ClientIp,
                    addr: ip,
                    kind
                })
            );
        }
        assert_eq!(
            Lease::overlay(Ipv4Addr::UNSPECIFIED, GW, MAC)
                .unwrap_err()
                .to_string(),
            "client ip 0.0.0.0 is the unspecified address; the client ip must be a unicast IPv4 \
             host address"
        );
    }

    #[test]
    fn rejects_unusable_router() {
        for (gw, kind) in [
            (Ipv4Addr::UNSPECIFIED, AddressKind::Unspecified),
            (Ipv4Addr::BROADCAST, AddressKind::Broadcast),
            (Ipv4Addr::new(224, 0, 0, 1), AddressKind::Multicast),
            (Ipv4Addr::LOCALHOST, AddressKind::Loopback),
        ] {
            let expected = Error::UnusableAddress {
                role: AddressRole::Router,
                addr: gw,
                kind,
            };
            assert_eq!(Lease::overlay(IP, gw, MAC), Err(expected.clone()));
            assert_eq!(default_routes(gw), Err(expected));
        }
    }

    #[test]
    fn rejects_router_equal_to_client() {
        let e = Lease::overlay(IP, IP, MAC).unwrap_err();
        assert_eq!(e, Error::RouterIsClient { router: IP });
        assert!(
            e.to_string()
                .starts_with("router 10.244.1.11 is the client's own address")
        );
    }

    #[test]
    fn rejects_server_id() {
        assert_eq!(
            builder().server_id(IP).build(),
            Err(Error::ServerIdIsClient { server_id: IP })
        );
        assert_eq!(
            builder().server_id(Ipv4Addr::BROADCAST).build(),
            Err(Error::UnusableAddress {
                role: AddressRole::ServerId,
                addr: Ipv4Addr::BROADCAST,
                kind: AddressKind::Broadcast
            })
        );
        assert!(
            Error::ServerIdIsClient { server_id: IP }
                .to_string()
                .contains("use the gateway address")
        );
    }

    #[test]
    fn rejects_server_mac() {
        let multicast = MacAddr::new([0x01, 0, 0x5e, 0, 0, 1]);
        assert_eq!(
            Lease::overlay(IP, GW, multicast),
            Err(Error::MulticastServerMac { mac: multicast })
        );
        let broadcast = MacAddr::new([0xff; 6]);
        assert_eq!(
            Lease::overlay(IP, GW, broadcast),
            Err(Error::MulticastServerMac { mac: broadcast })
        );
        assert_eq!(
            Lease::overlay(IP, GW, MacAddr::new([0; 6])),
            Err(Error::ZeroServerMac)
        );
        assert_eq!(
            Error::MulticastServerMac { mac: multicast }.to_string(),
            "server_mac 01:00:5e:00:00:01 is a multicast MAC (lowest bit of the first octet set); \
             use a unicast MAC such as 0a:00:00:00:00:01"
        );
    }

    #[test]
    fn rejects_dns_servers() {
        assert_eq!(
            builder()
                .dns_servers([Ipv4Addr::new(10, 96, 0, 10), Ipv4Addr::UNSPECIFIED])
                .build(),
            Err(Error::UnusableAddress {
                role: AddressRole::DnsServer,
                addr: Ipv4Addr::UNSPECIFIED,
                kind: AddressKind::Unspecified
            })
        );
        let many = (1..=64).map(|i| Ipv4Addr::new(10, 96, 0, i));
        assert_eq!(
            builder().dns_servers(many).build(),
            Err(Error::TooManyDnsServers { count: 64 })
        );
        let most = (1..=63).map(|i| Ipv4Addr::new(10, 96, 0, i));
        assert!(builder().dns_servers(most).build().is_ok());
    }

    #[test]
    fn rejects_lone_default_route() {
        // Under a /32 nothing is on-link: a default route alone gives dhclient no usable route.
        let e = builder()
            .classless_static_routes([route("0.0.0.0/0", GW)])
            .build()
            .unwrap_err();
        assert_eq!(
            e,
            Error::UnreachableRouteGateway {
                dest: Ipv4Net::default(),
                gateway: GW
            }
        );
        assert_eq!(
            e.to_string(),
            "route to 0.0.0.0/0 via 10.244.0.1 is unreachable: under a /32 lease nothing is \
             on-link, so an earlier on-link route (gateway 0.0.0.0) must cover the gateway; add \
             10.244.0.1/32 via 0.0.0.0 before it"
        );
    }

    #[test]
    fn rejects_on_link_route_after_use() {
        assert!(matches!(
            builder()
                .classless_static_routes([
                    route("0.0.0.0/0", GW),
                    route("10.244.0.1/32", Ipv4Addr::UNSPECIFIED)
                ])
                .build(),
            Err(Error::UnreachableRouteGateway { .. })
        ));
    }

    #[test]
    fn on_link_subnet_covers_gateways() {
        let lease = builder()
            .classless_static_routes([
                route("10.244.0.0/24", Ipv4Addr::UNSPECIFIED),
                route("0.0.0.0/0", GW),
                route("192.168.0.0/16", Ipv4Addr::new(10, 244, 0, 254)),
            ])
            .build();
        assert!(lease.is_ok(), "{lease:?}");
    }

    #[test]
    fn rejects_duplicate_route() {
        assert_eq!(
            builder()
                .classless_static_routes([
                    route("10.244.0.1/32", Ipv4Addr::UNSPECIFIED),
                    route("0.0.0.0/0", GW),
                    route("0.0.0.0/0", GW),
                ])
                .build(),
            Err(Error::DuplicateRoute {
                dest: Ipv4Net::default()
            })
        );
    }

    #[test]
    fn rejects_route_via_client() {
        assert_eq!(
            builder()
                .classless_static_routes([
                    route("10.244.0.0/16", Ipv4Addr::UNSPECIFIED),
                    route("0.0.0.0/0", IP),
                ])
                .build(),
            Err(Error::RouteViaClient {
                dest: Ipv4Net::default(),
                gateway: IP
            })
        );
    }

    #[test]
    fn rejects_routes_longer_than_an_option() {
        // 1 on-link /32 (9 bytes) + n /32 routes via GW (9 bytes each).
        let routes = |n: u8| {
            std::iter::once(Route::host_on_link(GW))
                .chain((1..=n).map(|i| route(&format!("192.168.0.{i}/32"), GW)))
                .collect::<Vec<_>>()
        };
        assert_eq!(rfc3442::encoded_len(&routes(27)), 252);
        assert!(
            builder()
                .classless_static_routes(routes(27))
                .build()
                .is_ok()
        );
        assert_eq!(
            builder().classless_static_routes(routes(28)).build(),
            Err(Error::RoutesTooLong { len: 261 })
        );
    }

    #[test]
    fn rejects_zero_lease_time() {
        let e = builder().lease_time(0).build().unwrap_err();
        assert_eq!(e, Error::ZeroLeaseTime);
        assert!(e.to_string().contains("use a positive number of seconds"));
    }

    #[test]
    fn rejects_small_mtu() {
        assert_eq!(
            builder().mtu(67).build(),
            Err(Error::MtuOutOfRange { mtu: 67 })
        );
        assert_eq!(
            builder().mtu(0).build(),
            Err(Error::MtuOutOfRange { mtu: 0 })
        );
        assert!(builder().mtu(68).build().is_ok());
        assert!(builder().mtu(u16::MAX).build().is_ok());
        assert!(
            Error::MtuOutOfRange { mtu: 67 }
                .to_string()
                .starts_with("mtu 67 is outside 68..=65535")
        );
    }
}
