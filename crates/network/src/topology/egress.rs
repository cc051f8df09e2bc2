//! Egress of an overlay to a VLAN: a per-VLAN gateway router with SNAT (a `nat` row and a
//! default route to the VLAN's gateway).
//!
//! ```text
//!   node routers ── 0/0 ─▶ ls <net>-join ── lr <net>-fabric ── 0/0 ─▶ lr <net>-vlan<tag>-rtr
//!                                                                     options:chassis=<node>
//!                                                                     snat <subnet> → <router_ip>
//!                                                                     0/0 → VLAN gateway
//!                                                                     <subnet> → fabric
//!   ls <net>-vlan<tag> ── <net>-ln (localnet: network_name=<physnet>, tag) ── ToR (gateway)
//! ```
//!
//! Why a gateway router and not a distributed gateway port: see [`EgressSpec`].
//!
//! The VLAN switch is the overlay's own (`<net>-vlan<tag>`, owned by the overlay network):
//! an underlay network on the same VLAN has its own switch, and the two meet on the wire.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;

use roam_dhcp_opts::{Ipv4Net, MacAddr};

use super::overlay::{
    LogicalRouter, LogicalSwitch, OverlaySpec, PlanError, SnatRule, StaticRoute, SwitchPort,
    SwitchPortKind, Topology, link,
};
use super::underlay::{check_physnet, check_vlan_tag, localnet_port, vlan_switch};

/// Egress of an overlay to a VLAN: where the VLAN is, the router's addresses on it and on the
/// transit network, and the chassis that runs the router.
///
/// # Gateway router, not a distributed gateway port
///
/// OVN performs SNAT only where connection tracking for the external side is centralized: on
/// a *gateway router* (`Logical_Router.options:chassis`) or on a router's *distributed gateway
/// port* (a port with `Gateway_Chassis` rows or an `HA_Chassis_Group`). roam uses a gateway
/// router:
/// - the router is a leaf of the overlay (only the fabric routes to it), so pinning the whole
///   router to one chassis costs nothing a distributed gateway port would save — with a DGP
///   the egress traffic is redirected to the gateway chassis just the same;
/// - it is one column (`options:chassis`) on a row roam already owns, reconciled like every
///   other column; a DGP adds `Gateway_Chassis` / `HA_Chassis_Group` rows (more tables to own,
///   diff and garbage-collect) for what it buys: fail-over between several gateway chassis;
/// - it is the shape ovn-kubernetes uses for the same job (per-node `GR_<node>` joined to the
///   cluster router through a join switch, SNAT on the GR), so OVN's behaviour here is well
///   trodden.
///
/// The price is that egress stops while the gateway chassis is down until the plan names
/// another one (a reconcile moves it: one column). Moving to an HA chassis group is the way to
/// fail-over without a reconcile, when needed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EgressSpec {
    /// The 802.1Q tag, 1..=4094.
    pub vlan: u16,
    /// The physical network (`options:network_name` of the localnet port).
    pub physnet: String,
    /// The VLAN's subnet (disjoint from the overlay subnet and the transit network).
    pub subnet: Ipv4Net,
    /// The VLAN's gateway (the upstream router, the ToR): the egress default route.
    pub gateway: Ipv4Addr,
    /// The router's address on the VLAN: overlay traffic leaves SNATed to it.
    pub router_ip: Ipv4Addr,
    /// The router's MAC on the VLAN.
    pub router_mac: MacAddr,
    /// The router's address on the overlay's transit network.
    pub join_ip: Ipv4Addr,
    /// The router's MAC on the transit network.
    pub join_mac: MacAddr,
    /// The chassis (a node of the overlay) that runs the gateway router.
    pub chassis: String,
}

/// The egress router's name: `<net>-vlan<tag>-rtr`.
pub fn egress_router_name(net: &str, vlan: u16) -> String {
    format!("{}-rtr", vlan_switch(net, vlan))
}

fn host(n: &Ipv4Net, ip: Ipv4Addr) -> bool {
    n.contains(&ip) && ip != n.network() && ip != n.broadcast()
}

fn overlaps(a: &Ipv4Net, b: &Ipv4Net) -> bool {
    a.contains(&b.network()) || b.contains(&a.network())
}

/// The checks of an egress spec (its transit address is checked with the other transit
/// addresses by the overlay's validation).
pub(super) fn validate(
    spec: &OverlaySpec,
    nodes: &BTreeSet<&str>,
    e: &EgressSpec,
) -> Result<(), PlanError> {
    let net = &spec.name;
    check_vlan_tag(net, e.vlan)?;
    check_physnet(net, &e.physnet)?;
    if e.subnet.prefix_len() >= 31 {
        return Err(PlanError::SubnetTooSmall {
            network: net.clone(),
            subnet: e.subnet,
        });
    }
    for (what, other) in [
        ("overlay subnet", spec.subnet),
        ("transit network", spec.join_subnet),
    ] {
        if overlaps(&other, &e.subnet) {
            return Err(PlanError::OverlappingSubnets {
                network: net.clone(),
                first_what: what.into(),
                first: other,
                second_what: "egress VLAN subnet".into(),
                second: e.subnet,
            });
        }
    }
    if !host(&e.subnet, e.gateway) {
        return Err(PlanError::GatewayOutsideSubnet {
            network: net.clone(),
            gateway: e.gateway,
            subnet: e.subnet,
        });
    }
    if !host(&e.subnet, e.router_ip) || e.router_ip == e.gateway {
        return Err(PlanError::EgressAddressOutsideVlan {
            network: net.clone(),
            ip: e.router_ip,
            subnet: e.subnet,
            gateway: e.gateway,
        });
    }
    let rtr = egress_router_name(net, e.vlan);
    for (port, mac) in [
        (format!("{rtr}-ext"), e.router_mac),
        (format!("{rtr}-join"), e.join_mac),
    ] {
        if mac.is_multicast() || mac.is_zero() {
            return Err(PlanError::BadMac { port, mac });
        }
    }
    if !nodes.contains(e.chassis.as_str()) {
        return Err(PlanError::UnknownGatewayChassis {
            network: net.clone(),
            chassis: e.chassis.clone(),
        });
    }
    Ok(())
}

/// Add the egress to a validated overlay plan: the VLAN switch with its localnet port, the
/// gateway router with SNAT and routes, its transit port, and the default routes of the
/// fabric and node routers toward it.
pub(super) fn plan(
    spec: &OverlaySpec,
    t: &mut Topology,
    join: &mut LogicalSwitch,
    fabric: &mut LogicalRouter,
    e: &EgressSpec,
) {
    let net = &spec.name;
    let default: Ipv4Net = "0.0.0.0/0".parse().expect("a prefix");
    let ls_name = vlan_switch(net, e.vlan);
    let lr_name = egress_router_name(net, e.vlan);
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
                network_name: e.physnet.clone(),
                tag: Some(e.vlan),
            },
        },
    );
    let mut lr = LogicalRouter {
        name: lr_name.clone(),
        options: [("chassis".to_string(), e.chassis.clone())].into(),
        ..Default::default()
    };
    link(
        &mut lr,
        (
            &format!("{lr_name}-ext"),
            e.router_mac,
            format!("{}/{}", e.router_ip, e.subnet.prefix_len()),
        ),
        &mut ls,
        format!("{ls_name}-{lr_name}"),
    );
    let peer = format!("{}-{lr_name}", join.name);
    link(
        &mut lr,
        (
            &format!("{lr_name}-join"),
            e.join_mac,
            format!("{}/{}", e.join_ip, spec.join_subnet.prefix_len()),
        ),
        join,
        peer,
    );
    lr.routes.insert(StaticRoute {
        ip_prefix: default,
        nexthop: e.gateway,
        output_port: None,
    });
    lr.routes.insert(StaticRoute {
        ip_prefix: spec.subnet.trunc(),
        nexthop: spec.fabric_ip,
        output_port: None,
    });
    lr.snat.insert(SnatRule {
        external_ip: e.router_ip,
        logical_ip: spec.subnet.trunc(),
    });
    fabric.routes.insert(StaticRoute {
        ip_prefix: default,
        nexthop: e.join_ip,
        output_port: None,
    });
    // node routers: everything that is not the overlay goes to the fabric
    let fabric_ip = spec.fabric_ip;
    for r in t.routers.values_mut() {
        r.routes.insert(StaticRoute {
            ip_prefix: default,
            nexthop: fabric_ip,
            output_port: None,
        });
    }
    t.switches.insert(ls_name, ls);
    t.routers.insert(lr_name, lr);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::{OverlayExtras, plan_overlay, plan_overlay_with};

    use crate::topology::fixtures::{nodes, spec};

    fn egress() -> EgressSpec {
        EgressSpec {
            vlan: 300,
            physnet: "physnet1".into(),
            subnet: "198.51.100.0/24".parse().unwrap(),
            gateway: "198.51.100.1".parse().unwrap(),
            router_ip: "198.51.100.5".parse().unwrap(),
            router_mac: "0a:00:00:00:e5:01".parse().unwrap(),
            join_ip: "169.254.100.2".parse().unwrap(),
            join_mac: "0a:00:00:00:e5:02".parse().unwrap(),
            chassis: "node-1".into(),
        }
    }

    fn plan(e: EgressSpec) -> Result<Topology, PlanError> {
        plan_overlay_with(
            &spec(),
            &nodes(),
            &[],
            &OverlayExtras {
                egress: Some(e),
                mgmt: vec![],
            },
        )
    }

    #[test]
    fn the_subnet_is_snatted_to_the_routers_vlan_address() {
        let t = plan(egress()).unwrap();
        let lr = &t.routers["ovl-vlan300-rtr"];
        assert_eq!(lr.options["chassis"], "node-1");
        assert_eq!(
            lr.snat.iter().collect::<Vec<_>>(),
            [&SnatRule {
                external_ip: "198.51.100.5".parse().unwrap(),
                logical_ip: "100.64.0.0/16".parse().unwrap(),
            }]
        );
        assert_eq!(
            lr.ports["ovl-vlan300-rtr-ext"].networks,
            ["198.51.100.5/24"]
        );
        assert_eq!(
            lr.ports["ovl-vlan300-rtr-join"].networks,
            ["169.254.100.2/24"]
        );
        let ls = &t.switches["ovl-vlan300"];
        assert_eq!(
            ls.ports["ovl-ln"].kind,
            SwitchPortKind::Localnet {
                network_name: "physnet1".into(),
                tag: Some(300)
            }
        );
        assert!(ls.ports.contains_key("ovl-vlan300-ovl-vlan300-rtr"));
        assert!(
            t.switches["ovl-join"]
                .ports
                .contains_key("ovl-join-ovl-vlan300-rtr")
        );
        // without egress, no default route anywhere (the bare overlay is unchanged)
        let bare = plan_overlay(&spec(), &nodes(), &[]).unwrap();
        assert!(
            !bare
                .routes()
                .iter()
                .any(|(_, r)| r.ip_prefix.prefix_len() == 0)
        );
        let defaults: Vec<(String, Ipv4Addr)> = t
            .routes()
            .into_iter()
            .filter(|(_, r)| r.ip_prefix.prefix_len() == 0)
            .map(|(n, r)| (n, r.nexthop))
            .collect();
        assert_eq!(
            defaults,
            [
                ("ovl-fabric".to_string(), "169.254.100.2".parse().unwrap()),
                (
                    "ovl-node-0-rtr".to_string(),
                    "169.254.100.1".parse().unwrap()
                ),
                (
                    "ovl-node-1-rtr".to_string(),
                    "169.254.100.1".parse().unwrap()
                ),
                (
                    "ovl-vlan300-rtr".to_string(),
                    "198.51.100.1".parse().unwrap()
                ),
            ]
        );
    }

    #[test]
    fn bad_egress_input_is_a_precise_plan_error() {
        for tag in [0u16, 4095] {
            let mut e = egress();
            e.vlan = tag;
            assert_eq!(
                plan(e).unwrap_err(),
                PlanError::BadVlanTag {
                    network: "ovl".into(),
                    tag
                }
            );
        }
        for ip in [
            "198.51.101.5",
            "198.51.100.1",
            "198.51.100.0",
            "198.51.100.255",
        ] {
            let mut e = egress();
            e.router_ip = ip.parse().unwrap();
            let err = plan(e).unwrap_err();
            assert!(
                matches!(err, PlanError::EgressAddressOutsideVlan { .. }),
                "{ip}: {err}"
            );
            assert!(err.to_string().contains(ip), "{err}");
            assert!(err.to_string().contains("198.51.100.0/24"), "{err}");
        }
        let mut e = egress();
        e.subnet = "100.64.7.0/24".parse().unwrap();
        e.gateway = "100.64.7.1".parse().unwrap();
        e.router_ip = "100.64.7.5".parse().unwrap();
        let err = plan(e).unwrap_err();
        assert_eq!(
            err.to_string(),
            "network ovl: the overlay subnet 100.64.0.0/16 overlaps the egress VLAN subnet \
             100.64.7.0/24; they must be disjoint"
        );
        let mut e = egress();
        e.subnet = "169.254.0.0/16".parse().unwrap();
        e.gateway = "169.254.200.1".parse().unwrap();
        e.router_ip = "169.254.200.5".parse().unwrap();
        assert!(matches!(
            plan(e).unwrap_err(),
            PlanError::OverlappingSubnets { first_what, .. } if first_what == "transit network"
        ));
        let mut e = egress();
        e.gateway = "192.0.2.1".parse().unwrap();
        assert!(matches!(
            plan(e).unwrap_err(),
            PlanError::GatewayOutsideSubnet { .. }
        ));
        let mut e = egress();
        e.join_ip = "169.254.100.11".parse().unwrap(); // node-1's
        assert!(matches!(
            plan(e).unwrap_err(),
            PlanError::BadJoinAddress { owner, .. } if owner == "egress router"
        ));
        let mut e = egress();
        e.chassis = "node-9".into();
        assert_eq!(
            plan(e).unwrap_err(),
            PlanError::UnknownGatewayChassis {
                network: "ovl".into(),
                chassis: "node-9".into()
            }
        );
        let mut e = egress();
        e.physnet = "a:b".into();
        assert!(matches!(plan(e).unwrap_err(), PlanError::BadPhysnet { .. }));
        let mut e = egress();
        e.router_mac = "01:00:5e:00:00:01".parse().unwrap();
        assert!(matches!(plan(e).unwrap_err(), PlanError::BadMac { .. }));
    }
}
