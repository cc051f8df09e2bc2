//! Test objects: overlay networks, logical ports (a `PortSpec` builder) and the clean-up
//! guard of a test's VMs.

/// An overlay network for a lab test, on nodes node-a and node-b, disjoint from every other
/// test's: subnet `100.<octet>.0.0/16` (gateway `.0.1`), transit `169.254.<octet>.0/24`
/// (fabric `.1`, nodes `.11`/`.12`), MACs `0a:00:00:e2:<octet>:..`.
pub fn overlay_fixture(
    name: &str,
    octet: u8,
) -> (
    roam_network::topology::OverlaySpec,
    Vec<roam_network::topology::NodeSpec>,
) {
    use roam_dhcp_opts::MacAddr;
    use std::net::Ipv4Addr;
    let spec = roam_network::topology::OverlaySpec {
        name: name.into(),
        subnet: format!("100.{octet}.0.0/16").parse().expect("a /16"),
        gateway: Ipv4Addr::new(100, octet, 0, 1),
        gateway_mac: MacAddr::new([0x0a, 0, 0, 0xe2, octet, 0x01]),
        join_subnet: format!("169.254.{octet}.0/24").parse().expect("a /24"),
        fabric_ip: Ipv4Addr::new(169, 254, octet, 1),
        fabric_mac: MacAddr::new([0x0a, 0, 0, 0xe2, octet, 0xfe]),
        mtu: 1400,
        dns: vec![],
    };
    let nodes = ["node-a", "node-b"]
        .iter()
        .enumerate()
        .map(|(i, n)| roam_network::topology::NodeSpec {
            name: (*n).into(),
            join_ip: Ipv4Addr::new(169, 254, octet, 11 + i as u8),
            join_mac: MacAddr::new([0x0a, 0, 0, 0xe2, octet, 0x11 + i as u8]),
        })
        .collect();
    (spec, nodes)
}
