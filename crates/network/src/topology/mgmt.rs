//! A node's management port into its overlay segment: the node's own host stack (kubelet
//! probes, host services) reaches the workloads through it.
//!
//! The port is an ordinary logical switch port on the node's switch, bound to the node's
//! chassis, with its own MAC and an overlay address (the Address's `gateway`): the node
//! configures it like a container's interface — the address as a /32, an on-link route to the
//! anycast gateway, the overlay subnet through the gateway ([`mgmt_config`]) — and the
//! overlay routes the address like a workload's: a /32 on the node router toward the port, a
//! /32 on the fabric toward the node. So a workload on any node reaches the node and back.

use std::net::Ipv4Addr;

use roam_dhcp_opts::{Ipv4Net, MacAddr};

use super::overlay::{
    LogicalRouter, OverlaySpec, PlanError, PortSpec, StaticRoute, SwitchPort, SwitchPortKind,
    Topology, gateway_port_name, node_router, node_switch,
};

/// A node's management port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MgmtPort {
    /// The node (chassis).
    pub node: String,
    /// Its overlay address (a host of the overlay subnet, not the anycast gateway).
    pub ip: Ipv4Addr,
    /// Its MAC.
    pub mac: MacAddr,
}

/// The management port's logical switch port name (= `iface-id`): `<net>-<node>-mgmt`.
pub fn mgmt_port_name(net: &str, node: &str) -> String {
    format!("{net}-{node}-mgmt")
}

/// A route the node installs on its management interface.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostRoute {
    /// Destination.
    pub dst: Ipv4Net,
    /// Next hop; `None` for an on-link route (scope link).
    pub via: Option<Ipv4Addr>,
}

/// What a node configures on its side of the management port: an OVS interface on `br-int`
/// with `external_ids:iface-id=<iface_id>` and MAC `mac`, `address` on it, `mtu`, and the
/// `routes` (in order). Pure data; the CNI / node daemon applies it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MgmtConfig {
    /// The logical switch port (`external_ids:iface-id`).
    pub iface_id: String,
    /// The interface's MAC.
    pub mac: MacAddr,
    /// The interface's address: the node's overlay IP as a /32.
    pub address: Ipv4Net,
    /// The interface's MTU (the overlay's).
    pub mtu: u16,
    /// Routes through the interface: the on-link anycast gateway, then the overlay subnet
    /// through it.
    pub routes: Vec<HostRoute>,
}

/// The node side of management port `m` of overlay `spec`. Fails like the planner does on
/// an address that is not a usable host of the overlay (or is the gateway).
pub fn mgmt_config(spec: &OverlaySpec, m: &MgmtPort) -> Result<MgmtConfig, PlanError> {
    let port = as_ports(spec, std::slice::from_ref(m));
    super::overlay::check_ports(&port, &spec.subnet, spec.gateway, spec.gateway_mac)?;
    Ok(MgmtConfig {
        iface_id: mgmt_port_name(&spec.name, &m.node),
        mac: m.mac,
        address: Ipv4Net::new(m.ip, 32).expect("/32 is valid"),
        mtu: spec.mtu,
        routes: vec![
            HostRoute {
                dst: Ipv4Net::new(spec.gateway, 32).expect("/32 is valid"),
                via: None,
            },
            HostRoute {
                dst: spec.subnet.trunc(),
                via: Some(spec.gateway),
            },
        ],
    })
}

/// The management ports as port specs (named after their LSP), so that the planner's port
/// checks (unique IP and MAC with the workloads, address in the subnet, known node) and
/// a port per node apply to them.
pub(super) fn as_ports(spec: &OverlaySpec, mgmt: &[MgmtPort]) -> Vec<PortSpec> {
    mgmt.iter()
        .map(|m| PortSpec {
            name: mgmt_port_name(&spec.name, &m.node),
            mac: m.mac,
            ip: m.ip,
            node: m.node.clone(),
            also_on: vec![],
            dhcp: false,
            marking: None,
            mobile: false,
        })
        .collect()
}

/// Add management port `m` (validated) to the plan: its LSP on the node's switch, a /32 on
/// the node's router toward it and one on the fabric toward the node.
pub(super) fn plan(
    spec: &OverlaySpec,
    t: &mut Topology,
    fabric: &mut LogicalRouter,
    node_join_ip: Ipv4Addr,
    m: &MgmtPort,
) {
    let net = &spec.name;
    let lsp = mgmt_port_name(net, &m.node);
    let ls = t
        .switches
        .get_mut(&node_switch(net, &m.node))
        .expect("validated node");
    ls.ports.insert(
        lsp.clone(),
        SwitchPort {
            name: lsp,
            kind: SwitchPortKind::Workload {
                mac: m.mac,
                ip: m.ip,
                requested_chassis: m.node.clone(),
                dhcp: None,
            },
        },
    );
    let host = Ipv4Net::new(m.ip, 32).expect("/32 is valid");
    let lr = t
        .routers
        .get_mut(&node_router(net, &m.node))
        .expect("validated node");
    lr.routes.insert(StaticRoute {
        ip_prefix: host,
        nexthop: m.ip,
        output_port: Some(gateway_port_name(net, &m.node)),
    });
    fabric.routes.insert(StaticRoute {
        ip_prefix: host,
        nexthop: node_join_ip,
        output_port: None,
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::{OverlayExtras, plan_overlay_with};

    use crate::topology::fixtures::{nodes, spec};

    fn m(node: &str, ip: &str, last: u8) -> MgmtPort {
        MgmtPort {
            node: node.into(),
            ip: ip.parse().unwrap(),
            mac: MacAddr::new([0x0a, 0, 0, 0, 0x4d, last]),
        }
    }

    fn plan(mgmt: Vec<MgmtPort>, ports: &[PortSpec]) -> Result<Topology, PlanError> {
        plan_overlay_with(
            &spec(),
            &nodes(),
            ports,
            &OverlayExtras { egress: None, mgmt },
        )
    }

    #[test]
    fn the_node_side_is_a_32_an_on_link_gateway_and_the_subnet_through_it() {
        let c = mgmt_config(&spec(), &m("node-0", "100.64.0.10", 1)).unwrap();
        assert_eq!(
            c,
            MgmtConfig {
                iface_id: "ovl-node-0-mgmt".into(),
                mac: MacAddr::new([0x0a, 0, 0, 0, 0x4d, 1]),
                address: "100.64.0.10/32".parse().unwrap(),
                mtu: 1400,
                routes: vec![
                    HostRoute {
                        dst: "100.64.0.1/32".parse().unwrap(),
                        via: None
                    },
                    HostRoute {
                        dst: "100.64.0.0/16".parse().unwrap(),
                        via: Some("100.64.0.1".parse().unwrap())
                    },
                ],
            }
        );
        assert!(matches!(
            mgmt_config(&spec(), &m("node-0", "100.64.0.1", 1)),
            Err(PlanError::IpOutsideSubnet { .. })
        ));
    }

    #[test]
    fn a_mgmt_port_is_routed_like_a_workload_on_its_node() {
        let t = plan(vec![m("node-1", "100.64.0.11", 2)], &[]).unwrap();
        let ls = &t.switches["ovl-node-1"];
        match &ls.ports["ovl-node-1-mgmt"].kind {
            SwitchPortKind::Workload {
                ip,
                requested_chassis,
                dhcp,
                ..
            } => {
                assert_eq!(ip.to_string(), "100.64.0.11");
                assert_eq!(requested_chassis, "node-1");
                assert!(dhcp.is_none());
            }
            other => panic!("{other:?}"),
        }
        let host: Ipv4Net = "100.64.0.11/32".parse().unwrap();
        let routes: Vec<(String, StaticRoute)> = t
            .routes()
            .into_iter()
            .filter(|(_, r)| r.ip_prefix == host)
            .collect();
        assert_eq!(routes.len(), 2, "{routes:?}");
        assert!(
            routes.iter().any(|(n, r)| n == "ovl-node-1-rtr"
                && r.output_port.as_deref() == Some("ovl-node-1-rtr-gw"))
        );
        assert!(
            routes
                .iter()
                .any(|(n, r)| n == "ovl-fabric" && r.nexthop == Ipv4Addr::new(169, 254, 100, 11))
        );
    }

    #[test]
    fn mgmt_ports_are_checked_with_the_workloads() {
        let w = PortSpec {
            name: "p1".into(),
            mac: MacAddr::new([0x0a, 0x58, 0, 0, 0, 1]),
            ip: "100.64.1.1".parse().unwrap(),
            node: "node-0".into(),
            also_on: vec![],
            dhcp: false,
            marking: None,
            mobile: false,
        };
        let err = plan(vec![m("node-0", "100.64.1.1", 1)], std::slice::from_ref(&w)).unwrap_err();
        assert_eq!(
            err,
            PlanError::DuplicateIp {
                first: "p1".into(),
                second: "ovl-node-0-mgmt".into(),
                ip: "100.64.1.1".parse().unwrap()
            }
        );
        let mut same_mac = m("node-0", "100.64.0.10", 1);
        same_mac.mac = w.mac;
        assert!(matches!(
            plan(vec![same_mac], &[w]).unwrap_err(),
            PlanError::DuplicateMac { .. }
        ));
        assert!(matches!(
            plan(vec![m("node-7", "100.64.0.10", 1)], &[]).unwrap_err(),
            PlanError::UnknownNode { .. }
        ));
        assert!(matches!(
            plan(
                vec![m("node-0", "100.64.0.10", 1), m("node-0", "100.64.0.12", 3)],
                &[]
            )
            .unwrap_err(),
            PlanError::DuplicatePort { .. }
        ));
        assert!(matches!(
            plan(vec![m("node-0", "10.0.0.1", 1)], &[]).unwrap_err(),
            PlanError::IpOutsideSubnet { .. }
        ));
    }
}
