//! Property tests: the RFC 3442 codec, OVN's string form and the OVN row
//! all round-trip, and the decoder never panics.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;

use proptest::collection::vec;
use proptest::prelude::*;
use roam_dhcp_opts::{AddressKind, Ipv4Net, Lease, MacAddr, Route, rfc3442};

/// A unicast host address (not 0.0.0.0, broadcast, multicast, loopback).
fn unicast() -> impl Strategy<Value = Ipv4Addr> {
    any::<u32>()
        .prop_map(Ipv4Addr::from)
        .prop_filter("unicast", |a| AddressKind::of(*a).is_none())
}

/// A destination prefix, normalized to its network address.
fn dest() -> impl Strategy<Value = Ipv4Net> {
    (any::<u32>(), 0u8..=32).prop_map(|(addr, len)| {
        Ipv4Net::new(Ipv4Addr::from(addr), len)
            .expect("len is at most 32")
            .trunc()
    })
}

/// Any valid route: on-link or via a unicast gateway.
fn route() -> impl Strategy<Value = Route> {
    let gateway = prop_oneof![Just(Ipv4Addr::UNSPECIFIED), unicast()];
    (dest(), gateway).prop_map(|(dest, gateway)| Route::new(dest, gateway).expect("valid"))
}

fn unicast_mac() -> impl Strategy<Value = MacAddr> {
    any::<[u8; 6]>()
        .prop_map(|mut octets| {
            octets[0] &= 0xfe;
            MacAddr::new(octets)
        })
        .prop_filter("nonzero", |mac| !mac.is_zero())
}

/// Routes a lease accepts: on-link /32s to some gateways first, then
/// routes via those gateways, distinct destinations, within 255 bytes.
fn lease_routes(ip: Ipv4Addr) -> impl Strategy<Value = Vec<Route>> {
    (
        vec(unicast(), 1..4),
        vec((dest(), any::<prop::sample::Index>()), 0..12),
    )
        .prop_map(move |(gateways, via)| {
            let gateways: Vec<Ipv4Addr> = gateways.into_iter().filter(|g| *g != ip).collect();
            let mut seen = BTreeSet::new();
            let mut routes: Vec<Route> = gateways
                .iter()
                .filter(|g| seen.insert(Ipv4Net::from(**g)))
                .map(|g| Route::host_on_link(*g))
                .collect();
            if !gateways.is_empty() {
                for (dest, index) in via {
                    let gateway = *index.get(&gateways);
                    let route = Route::new(dest, gateway).expect("valid");
                    if rfc3442::encoded_len(&routes) + route.encoded_len()
                        <= rfc3442::MAX_OPTION_LEN
                        && seen.insert(dest)
                    {
                        routes.push(route);
                    }
                }
            }
            routes
        })
}

fn lease() -> impl Strategy<Value = Lease> {
    (unicast(), unicast(), unicast_mac())
        .prop_filter("router is not the client", |(ip, gw, _)| ip != gw)
        .prop_flat_map(|(ip, router, mac)| {
            let server_id = prop_oneof![Just(router), unicast()];
            let routes = prop_oneof![Just(None), lease_routes(ip).prop_map(Some),];
            (
                Just((ip, router, mac)),
                server_id.prop_filter("server_id is not the client", move |s| *s != ip),
                vec(unicast(), 0..5),
                routes,
                1u32..,
                68u16..,
            )
        })
        .prop_map(
            |((ip, router, mac), server_id, dns, routes, lease_time, mtu)| {
                let mut builder = Lease::builder(ip, router, mac)
                    .server_id(server_id)
                    .dns_servers(dns)
                    .lease_time(lease_time)
                    .mtu(mtu);
                if let Some(routes) = routes {
                    builder = builder.classless_static_routes(routes);
                }
                builder.build().expect("strategy builds valid leases")
            },
        )
}

proptest! {
    #[test]
    fn encode_decode_round_trip(routes in vec(route(), 0..40)) {
        let bytes = rfc3442::encode(&routes);
        prop_assert_eq!(rfc3442::decode(&bytes).unwrap(), routes);
    }

    #[test]
    fn encode_uses_minimal_octets(routes in vec(route(), 0..40)) {
        let expected: usize = routes
            .iter()
            .map(|r| 1 + usize::from(r.dest().prefix_len()).div_ceil(8) + 4)
            .sum();
        prop_assert_eq!(rfc3442::encode(&routes).len(), expected);
        prop_assert_eq!(rfc3442::encoded_len(&routes), expected);
    }

    #[test]
    fn ovn_string_round_trip(routes in vec(route(), 0..40)) {
        let text = rfc3442::format_ovn(&routes);
        prop_assert_eq!(rfc3442::parse_ovn(&text).unwrap(), routes);
    }

    #[test]
    fn lease_ovn_round_trip(lease in lease()) {
        let row = lease.to_ovn();
        prop_assert_eq!(&row.cidr, &format!("{}/32", lease.ip()));
        let back = Lease::from_ovn(&row).unwrap();
        prop_assert_eq!(&back, &lease);
        prop_assert_eq!(back.to_ovn(), row);
    }

    #[test]
    fn decode_never_panics(bytes in vec(any::<u8>(), 0..300)) {
        if let Ok(routes) = rfc3442::decode(&bytes) {
            prop_assert_eq!(rfc3442::encode(&routes), bytes);
        }
    }

    #[test]
    fn decode_never_panics_on_plausible_widths(
        bytes in vec(prop_oneof![0u8..=32, any::<u8>()], 0..300)
    ) {
        if let Ok(routes) = rfc3442::decode(&bytes) {
            prop_assert_eq!(rfc3442::encode(&routes), bytes);
        }
    }

    #[test]
    fn parse_ovn_never_panics(text in "[{}0-9./, ]{0,60}") {
        let _ = rfc3442::parse_ovn(&text);
    }

    #[test]
    fn mac_display_parse_round_trip(octets in any::<[u8; 6]>()) {
        let mac = MacAddr::new(octets);
        prop_assert_eq!(mac.to_string().parse::<MacAddr>().unwrap(), mac);
    }
}
