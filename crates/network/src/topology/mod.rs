//! OVN topology planning: from what roam wants (networks, nodes, addresses and where each
//! address lives) to the logical switches, routers, ports, routes, DHCP options and QoS rows
//! that OVN's northbound database must hold, and the difference between a plan and what the
//! database holds. Pure: no I/O; [`crate::northbound`] reads the database and sends the
//! difference in one transaction.
//!
//! # The overlay
//!
//! ```text
//!   workload ── ls <net>-<node> ── lr <net>-<node>-rtr ── ls <net>-join ── lr <net>-fabric
//!               (one per node)     anycast gateway      (transit)       one /32 per address
//!                                  GW/plen + GW MAC                      → the hosting node
//!                                  on every node
//! ```
//!
//! Every node's router answers for the same gateway IP and MAC (the anycast gateway), so a
//! migrated VM keeps a valid gateway without renewing its lease. A node router routes the two
//! halves of the overlay subnet to the fabric router — more specific than the connected
//! subnet, which would otherwise swallow traffic to addresses on other nodes — and holds one
//! /32 route per address it hosts. The fabric router holds one /32 per address toward the
//! hosting node's router. So route state is two routes per address, whatever the number of
//! nodes; moving an address (the *route flip*) changes three routes, in one transaction.
//!
//! # The VLAN underlay
//!
//! ```text
//!   workload ── ls <net>-vlan<tag> ── <net>-ln (localnet: network_name=<physnet>, tag)
//!                                       └─ bridge of ovn-bridge-mappings ── ToR (gateway)
//! ```
//!
//! [`plan_underlay`]: one switch per VLAN, its workloads addressed from the VLAN's subnet
//! (DHCP with the subnet's mask, router = the VLAN's gateway). A VLAN port that migrates is
//! one port bound on two chassis (`requested-chassis=<node>,<target>`,
//! `activation-strategy=rarp`), named [`vlan_port_name`] on every node.
//!
//! # Egress and management ports
//!
//! [`plan_overlay_with`] adds to the overlay what [`OverlayExtras`] asks for:
//! - egress to a VLAN ([`EgressSpec`]): a gateway router `<net>-vlan<tag>-rtr` on the transit
//!   network and on the overlay's own VLAN switch, with `snat <subnet> → <router's VLAN
//!   address>`; default routes node router → fabric → that router → the VLAN's gateway (why
//!   a gateway router and not a distributed gateway port: see [`EgressSpec`]);
//! - a management port per node ([`MgmtPort`]): routed like a
//!   workload, so the node's host stack reaches every workload; [`mgmt_config`] is what the
//!   node configures on its side.

mod egress;
mod flip;
mod mgmt;
mod overlay;
mod reconcile;
mod underlay;

pub use egress::{EgressSpec, egress_router_name};
pub use flip::{Flip, FlipPlan, flip_ops, flip_select};
pub use mgmt::{HostRoute, MgmtConfig, MgmtPort, mgmt_config, mgmt_port_name};
pub use overlay::{
    LogicalRouter, LogicalSwitch, NodeSpec, OverlayExtras, OverlaySpec, PlanError, PortSpec,
    QosRule, RouteFlip, RouterPort, RouterRoute, SnatRule, StaticRoute, SwitchPort, SwitchPortKind,
    Topology, gateway_port_name, mobile_gateway_port_name, mobile_port_name, mobile_switch_name,
    node_router_name, overlay_port_name, plan_overlay, plan_overlay_with, route_flip,
};
pub use reconcile::{ActualState, QOS_PRIORITY, ReconcileReport, TableCounts, check, diff};
pub use underlay::{
    UnderlaySpec, dhcp_server_mac, localnet_port, plan_underlay, vlan_port_name, vlan_switch,
};

/// A two-node overlay shared by the egress and management-port unit tests.
#[cfg(test)]
pub(crate) mod fixtures {
    use std::net::Ipv4Addr;

    use roam_dhcp_opts::MacAddr;

    use super::{NodeSpec, OverlaySpec};

    pub(crate) fn spec() -> OverlaySpec {
        OverlaySpec {
            name: "ovl".into(),
            subnet: "100.64.0.0/16".parse().unwrap(),
            gateway: "100.64.0.1".parse().unwrap(),
            gateway_mac: "0a:00:00:00:00:01".parse().unwrap(),
            join_subnet: "169.254.100.0/24".parse().unwrap(),
            fabric_ip: "169.254.100.1".parse().unwrap(),
            fabric_mac: "0a:00:00:00:ff:01".parse().unwrap(),
            mtu: 1400,
            dns: vec![],
        }
    }

    pub(crate) fn nodes() -> Vec<NodeSpec> {
        (0..2u8)
            .map(|i| NodeSpec {
                name: format!("node-{i}"),
                join_ip: Ipv4Addr::new(169, 254, 100, 10 + i),
                join_mac: MacAddr::new([0x0a, 0, 0, 0, 0xfe, i]),
            })
            .collect()
    }
}
