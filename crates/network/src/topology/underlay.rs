//! The VLAN underlay plan: one logical switch per VLAN, linked to the physical network by a
//! `localnet` port, with the workloads on it addressed from the VLAN's own subnet.
//!
//! ```text
//!   workload ── ls <net>-vlan<tag> ── lsp <net>-ln (localnet, tag, network_name=<physnet>)
//!                                         │  ovn-controller: patch br-int ↔ bridge of
//!                                         │  ovn-bridge-mappings <physnet>:<bridge>
//!                                         └── 802.1Q <tag> on the wire ── ToR (gateway)
//! ```
//!
//! Unlike the overlay, a workload's address is not a /32 behind an anycast gateway: it is a
//! host of the VLAN's subnet, and the gateway is the upstream router (the ToR), on-link. So
//! the DHCP row's `cidr` is the subnet (OVN hands out the subnet's mask from it), `router`
//! is the VLAN's gateway, and there are no classless static routes.

use std::net::Ipv4Addr;

use roam_dhcp_opts::{DhcpOptionsRow, Ipv4Net, Lease, MacAddr};

use super::overlay::{
    LogicalSwitch, PlanError, PortSpec, SwitchPort, SwitchPortKind, Topology, check_ports,
};

/// One VLAN network, as the `Network` object describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnderlaySpec {
    /// Network name; prefixes every OVN object of this network.
    pub name: String,
    /// The 802.1Q tag, 1..=4094.
    pub vlan: u16,
    /// The VLAN's subnet: workload addresses are hosts of it, with its mask.
    pub subnet: Ipv4Net,
    /// The VLAN's gateway (the upstream router), a host of `subnet`.
    pub gateway: Ipv4Addr,
    /// The physical network (`options:network_name`), mapped to a bridge on each chassis by
    /// `external_ids:ovn-bridge-mappings`.
    pub physnet: String,
    /// MTU handed out by DHCP.
    pub mtu: u16,
    /// DNS servers handed out by DHCP.
    pub dns: Vec<Ipv4Addr>,
}

/// The VLAN switch's name: `<net>-vlan<tag>`.
pub fn vlan_switch(net: &str, vlan: u16) -> String {
    format!("{net}-vlan{vlan}")
}

/// The localnet port's name: `<net>-ln`.
pub fn localnet_port(net: &str) -> String {
    format!("{net}-ln")
}

/// The MAC OVN's DHCP server answers from on VLAN `vlan`. Only the local workload sees it
/// (OVN answers DHCP on the chassis, nothing goes out on the VLAN), so a fixed, locally
/// administered MAC per VLAN is enough; a workload may not use it.
pub fn dhcp_server_mac(vlan: u16) -> MacAddr {
    let [hi, lo] = vlan.to_be_bytes();
    MacAddr::new([0x0a, 0x00, 0x00, 0xd4, hi, lo])
}

/// A usable 802.1Q tag: 1..=4094.
pub(super) fn check_vlan_tag(net: &str, tag: u16) -> Result<(), PlanError> {
    if !(1..=4094).contains(&tag) {
        return Err(PlanError::BadVlanTag {
            network: net.to_string(),
            tag,
        });
    }
    Ok(())
}

/// A physical network name `ovn-bridge-mappings` can carry.
pub(super) fn check_physnet(net: &str, physnet: &str) -> Result<(), PlanError> {
    if physnet.is_empty()
        || physnet
            .chars()
            .any(|c| c == ',' || c == ':' || c.is_whitespace())
    {
        return Err(PlanError::BadPhysnet {
            network: net.to_string(),
            physnet: physnet.to_string(),
        });
    }
    Ok(())
}

fn validate(spec: &UnderlaySpec, ports: &[PortSpec]) -> Result<(), PlanError> {
    let net = spec.name.clone();
    check_vlan_tag(&net, spec.vlan)?;
    check_physnet(&net, &spec.physnet)?;
    let subnet = spec.subnet;
    let host =
        |ip: Ipv4Addr| subnet.contains(&ip) && ip != subnet.network() && ip != subnet.broadcast();
    if subnet.prefix_len() >= 32 {
        return Err(PlanError::SubnetTooSmall {
            network: net,
            subnet,
        });
    }
    if !host(spec.gateway) {
        return Err(PlanError::GatewayOutsideSubnet {
            network: net,
            gateway: spec.gateway,
            subnet,
        });
    }
    let server_mac = dhcp_server_mac(spec.vlan);
    check_ports(ports, &subnet, spec.gateway, server_mac)?;
    Ok(())
}

/// The logical switch port (= the OVS interface's `external_ids:iface-id`) of VLAN workload
/// `port`: the port's own name, on every node. A VLAN port is one L2 endpoint on one switch,
/// so a migration target cannot have a port of its own (two ports with one MAC on a switch);
/// the same port is bound on both chassis instead (see [`plan_underlay`]), and its name must
/// not change when the workload's node does.
pub fn vlan_port_name(port: &str) -> String {
    port.to_string()
}

/// The DHCP row of a VLAN workload: `cidr` = the subnet (OVN derives the offered mask from
/// it), `router` = the gateway, no classless routes (the gateway is on-link).
///
/// The option values come from a [`Lease`] (so its checks apply), built without routes;
/// [`Lease::to_ovn`] writes roam's /32 `cidr`, which is replaced by the subnet here: the
/// lease model is /32-only and `Lease::from_ovn` would refuse this row.
fn dhcp_row(spec: &UnderlaySpec, p: &PortSpec) -> Result<DhcpOptionsRow, PlanError> {
    let lease = Lease::builder(p.ip, spec.gateway, dhcp_server_mac(spec.vlan))
        .classless_static_routes([])
        .dns_servers(spec.dns.iter().copied())
        .mtu(spec.mtu)
        .build()
        .map_err(|source| PlanError::Lease {
            port: p.name.clone(),
            source,
        })?;
    let mut row = lease.to_ovn();
    row.cidr = spec.subnet.trunc().to_string();
    Ok(row)
}

/// Plan the VLAN network `spec` with the workload `ports`, each on its `node`.
///
/// A port with migration targets (`also_on`) is *multi-chassis* (OVN ≥ 22.09): one logical
/// switch port with `requested-chassis=<node>,<target>…`, bound on all of them, and
/// `activation-strategy=rarp`, so the target's binding carries no traffic until the migrated
/// VM announces itself with a RARP (QEMU sends one when it resumes on the target); from then
/// on OVN delivers to the target. Dropping `also_on` and moving `node` to the target once the
/// migration is complete leaves the port, unchanged in name, bound on the target only.
pub fn plan_underlay(spec: &UnderlaySpec, ports: &[PortSpec]) -> Result<Topology, PlanError> {
    validate(spec, ports)?;
    let net = &spec.name;
    let ls_name = vlan_switch(net, spec.vlan);
    let mut ls = LogicalSwitch {
        name: ls_name.clone(),
        ..Default::default()
    };
    let ln = localnet_port(net);
    ls.ports.insert(
        ln.clone(),
        SwitchPort {
            name: ln,
            kind: SwitchPortKind::Localnet {
                network_name: spec.physnet.clone(),
                tag: Some(spec.vlan),
            },
        },
    );
    for p in ports {
        let dhcp = if p.dhcp {
            Some(dhcp_row(spec, p)?)
        } else {
            None
        };
        super::overlay::workload_port(
            &mut ls,
            &vlan_port_name(&p.name),
            p,
            super::overlay::requested_chassis(p),
            dhcp,
        );
    }
    let mut t = Topology::default();
    t.switches.insert(ls_name, ls);
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> UnderlaySpec {
        UnderlaySpec {
            name: "v".into(),
            vlan: 116,
            subnet: "192.0.2.0/24".parse().unwrap(),
            gateway: "192.0.2.1".parse().unwrap(),
            physnet: "physnet1".into(),
            mtu: 1500,
            dns: vec!["192.0.2.53".parse().unwrap()],
        }
    }

    fn port(i: u8, node: &str) -> PortSpec {
        PortSpec {
            name: format!("w{i}"),
            mac: MacAddr::new([0x0a, 0x58, 0xc0, 0, 2, i]),
            ip: Ipv4Addr::new(192, 0, 2, 10 + i),
            node: node.into(),
            also_on: vec![],
            dhcp: true,
            marking: None,
            mobile: false,
        }
    }

    #[test]
    fn one_switch_with_a_tagged_localnet_port_and_the_workloads() {
        let mut p2 = port(2, "node-b");
        p2.dhcp = false;
        p2.marking = Some("lowlatency".parse().unwrap());
        let t = plan_underlay(&spec(), &[port(1, "node-a"), p2]).unwrap();
        assert!(t.routers.is_empty());
        assert_eq!(t.switches.keys().collect::<Vec<_>>(), ["v-vlan116"]);
        let ls = &t.switches["v-vlan116"];
        assert_eq!(ls.ports.keys().collect::<Vec<_>>(), ["v-ln", "w1", "w2"]);
        assert_eq!(
            ls.ports["v-ln"].kind,
            SwitchPortKind::Localnet {
                network_name: "physnet1".into(),
                tag: Some(116)
            }
        );
        match &ls.ports["w1"].kind {
            SwitchPortKind::Workload {
                ip,
                requested_chassis,
                dhcp: Some(row),
                ..
            } => {
                assert_eq!(ip.to_string(), "192.0.2.11");
                assert_eq!(requested_chassis, "node-a");
                assert_eq!(row.cidr, "192.0.2.0/24", "the subnet's mask, not a /32");
                assert_eq!(row.options["router"], "192.0.2.1");
                assert_eq!(row.options["server_id"], "192.0.2.1");
                assert_eq!(row.options["dns_server"], "192.0.2.53");
                assert_eq!(row.options["mtu"], "1500");
                assert!(!row.options.contains_key("classless_static_route"));
                assert!(!row.options.contains_key("ms_classless_static_route"));
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            ls.ports["w2"].kind,
            SwitchPortKind::Workload { dhcp: None, .. }
        ));
        assert_eq!(ls.qos.iter().next().unwrap().r#match, "inport == \"w2\"");
    }

    #[test]
    fn a_migrating_port_is_one_port_bound_on_both_chassis() {
        let mut p = port(1, "node-a");
        p.also_on = vec!["node-b".into(), "node-a".into(), "node-b".into()];
        let t = plan_underlay(&spec(), &[p.clone()]).unwrap();
        let ls = &t.switches["v-vlan116"];
        assert_eq!(ls.ports.keys().collect::<Vec<_>>(), ["v-ln", "w1"]);
        match &ls.ports["w1"].kind {
            SwitchPortKind::Workload {
                requested_chassis, ..
            } => assert_eq!(requested_chassis, "node-a,node-b", "main chassis first"),
            other => panic!("{other:?}"),
        }
        // after the switchover: the same port (same name = same iface-id), target only
        p.node = "node-b".into();
        p.also_on.clear();
        let after = plan_underlay(&spec(), &[p]).unwrap();
        match &after.switches["v-vlan116"].ports["w1"].kind {
            SwitchPortKind::Workload {
                requested_chassis, ..
            } => assert_eq!(requested_chassis, "node-b"),
            other => panic!("{other:?}"),
        }
        assert_eq!(vlan_port_name("w1"), "w1");
    }

    #[test]
    fn the_dhcp_cidr_is_the_network_of_the_subnet() {
        let mut s = spec();
        s.subnet = "192.0.2.1/26".parse().unwrap();
        s.gateway = "192.0.2.62".parse().unwrap();
        let t = plan_underlay(&s, &[port(1, "node-a")]).unwrap();
        match &t.switches["v-vlan116"].ports["w1"].kind {
            SwitchPortKind::Workload { dhcp: Some(r), .. } => assert_eq!(r.cidr, "192.0.2.0/26"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn vlan_tags_0_and_4095_are_refused_with_the_reason() {
        for tag in [0u16, 4095, 5000] {
            let mut s = spec();
            s.vlan = tag;
            let err = plan_underlay(&s, &[]).unwrap_err();
            assert_eq!(
                err,
                PlanError::BadVlanTag {
                    network: "v".into(),
                    tag
                }
            );
            let msg = err.to_string();
            assert!(msg.contains(&format!("VLAN tag {tag}")), "{msg}");
            assert!(msg.contains("1..=4094"), "{msg}");
        }
        for tag in [1u16, 4094] {
            let mut s = spec();
            s.vlan = tag;
            let t = plan_underlay(&s, &[]).unwrap();
            assert!(t.switches.contains_key(&format!("v-vlan{tag}")));
        }
    }

    #[test]
    fn bad_input_is_rejected_with_the_reason() {
        let s = spec();
        let err = |ports: &[PortSpec]| plan_underlay(&s, ports).unwrap_err();

        let mut outside = port(1, "node-a");
        outside.ip = "198.51.100.5".parse().unwrap();
        let e = err(&[outside]);
        assert!(matches!(e, PlanError::IpOutsideSubnet { .. }), "{e}");
        assert!(e.to_string().contains("198.51.100.5"), "{e}");
        for ip in ["192.0.2.1", "192.0.2.0", "192.0.2.255"] {
            let mut p = port(1, "node-a");
            p.ip = ip.parse().unwrap();
            assert!(
                matches!(err(&[p]), PlanError::IpOutsideSubnet { .. }),
                "{ip}"
            );
        }

        let mut bad = spec();
        bad.gateway = "198.51.100.1".parse().unwrap();
        let e = plan_underlay(&bad, &[]).unwrap_err();
        assert!(matches!(e, PlanError::GatewayOutsideSubnet { .. }), "{e}");
        assert!(e.to_string().contains("gateway 198.51.100.1"), "{e}");

        let mut dup_ip = port(2, "node-b");
        dup_ip.ip = port(1, "node-a").ip;
        let e = err(&[port(1, "node-a"), dup_ip]);
        assert_eq!(
            e.to_string(),
            "ports w1 and w2 both have IP 192.0.2.11",
            "{e:?}"
        );
        let mut dup_mac = port(2, "node-b");
        dup_mac.mac = port(1, "node-a").mac;
        let e = err(&[port(1, "node-a"), dup_mac]);
        assert!(matches!(e, PlanError::DuplicateMac { .. }), "{e}");
        assert!(e.to_string().contains("both have MAC"), "{e}");

        let mut server = port(1, "node-a");
        server.mac = dhcp_server_mac(116);
        assert!(matches!(err(&[server]), PlanError::BadMac { .. }));
        assert!(matches!(
            err(&[port(1, "node-a"), port(1, "node-b")]),
            PlanError::DuplicatePort { .. }
        ));

        for physnet in ["", "a,b", "a:b", "a b"] {
            let mut bad = spec();
            bad.physnet = physnet.into();
            assert!(
                matches!(plan_underlay(&bad, &[]), Err(PlanError::BadPhysnet { .. })),
                "{physnet:?}"
            );
        }
        let mut tiny = spec();
        tiny.subnet = "192.0.2.1/32".parse().unwrap();
        assert!(matches!(
            plan_underlay(&tiny, &[]),
            Err(PlanError::SubnetTooSmall { .. })
        ));
        let mut no_mtu = port(1, "node-a");
        no_mtu.dhcp = true;
        let mut low = spec();
        low.mtu = 10;
        assert!(matches!(
            plan_underlay(&low, &[no_mtu]),
            Err(PlanError::Lease { .. })
        ));
    }
}
