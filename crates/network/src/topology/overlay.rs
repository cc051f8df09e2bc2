//! The overlay plan: per-node switch + anycast-gateway router, a transit switch and a fabric
//! router, /32 routes, DHCP options and DSCP marking per workload port.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use roam_dhcp_opts::{DhcpOptionsRow, Ipv4Net, Lease, MacAddr};

use roam_contract::qos::Marking;

/// One overlay network, as the `Network` object describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OverlaySpec {
    /// Network name; prefixes every OVN object of this network.
    pub name: String,
    /// The range workload addresses come from (each handed out as a /32).
    pub subnet: Ipv4Net,
    /// The anycast gateway: the same IP on every node's router.
    pub gateway: Ipv4Addr,
    /// The anycast gateway's MAC: the same on every node (a guest that keeps an old
    /// gateway MAC after a migration would lose its network until its ARP entry expires).
    pub gateway_mac: MacAddr,
    /// Transit network between the node routers and the fabric router.
    pub join_subnet: Ipv4Net,
    /// The fabric router's address on the transit network.
    pub fabric_ip: Ipv4Addr,
    /// The fabric router's MAC on the transit network.
    pub fabric_mac: MacAddr,
    /// MTU handed out by DHCP.
    pub mtu: u16,
    /// DNS servers handed out by DHCP.
    pub dns: Vec<Ipv4Addr>,
}

/// A node (OVN chassis) taking part in the overlay.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeSpec {
    /// Node name = chassis name.
    pub name: String,
    /// The node router's address on the transit network (stable for the node's life).
    pub join_ip: Ipv4Addr,
    /// The node router's MAC on the transit network.
    pub join_mac: MacAddr,
}

/// A workload address and where it lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PortSpec {
    /// Stable name of the workload's port (e.g. from the Address object).
    pub name: String,
    /// The workload's MAC.
    pub mac: MacAddr,
    /// The workload's /32.
    pub ip: Ipv4Addr,
    /// The node its /32 routes point at.
    pub node: String,
    /// Further nodes that get a port for it too (a migration's target, before switchover).
    pub also_on: Vec<String>,
    /// Whether OVN answers DHCP for it (VMs) or not (containers, plumbed by the CNI).
    pub dhcp: bool,
    /// A workload that migrates (a VM): its port lives on the network's mobile switch
    /// ([`mobile_switch_name`]), one port whatever its node, bound on `node` and `also_on`
    /// (multi-chassis with RARP activation while it migrates), and its /32 route never
    /// changes. Otherwise the port lives on `node`'s switch and the route points there.
    pub mobile: bool,
    /// DSCP marking of its traffic, if any.
    pub marking: Option<Marking>,
}

/// What is wrong with a plan's input. Nothing is planned (or applied) for an invalid input.
/// Every variant is bad input: report it; the same input fails again, so do not retry it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// The gateway is not a usable host address of the subnet.
    #[error("network {network}: gateway {gateway} is not a host address of {subnet}")]
    GatewayOutsideSubnet {
        /// Network.
        network: String,
        /// Gateway.
        gateway: Ipv4Addr,
        /// Subnet.
        subnet: Ipv4Net,
    },
    /// The subnet is too small to split (a /32).
    #[error("network {network}: subnet {subnet} is too small; use a prefix of /31 or shorter")]
    SubnetTooSmall {
        /// Network.
        network: String,
        /// Subnet.
        subnet: Ipv4Net,
    },
    /// The transit network overlaps the workload subnet.
    #[error("network {network}: transit network {join} overlaps the workload subnet {subnet}")]
    JoinOverlapsSubnet {
        /// Network.
        network: String,
        /// Transit network.
        join: Ipv4Net,
        /// Subnet.
        subnet: Ipv4Net,
    },
    /// A transit address is outside the transit network or used twice.
    #[error("network {network}: transit address {ip} of {owner} is outside {join} or already used")]
    BadJoinAddress {
        /// Network.
        network: String,
        /// The address.
        ip: Ipv4Addr,
        /// Who has it (a node, or "fabric").
        owner: String,
        /// Transit network.
        join: Ipv4Net,
    },
    /// A node appears twice.
    #[error("network {network}: node {node} is listed twice")]
    DuplicateNode {
        /// Network.
        network: String,
        /// Node.
        node: String,
    },
    /// A port's IP is outside the subnet, the gateway, or the subnet's network/broadcast address.
    #[error("port {port}: {ip} is not a usable address of {subnet} (gateway {gateway})")]
    IpOutsideSubnet {
        /// Port.
        port: String,
        /// IP.
        ip: Ipv4Addr,
        /// Subnet.
        subnet: Ipv4Net,
        /// Gateway.
        gateway: Ipv4Addr,
    },
    /// Two ports share an IP.
    #[error("ports {first} and {second} both have IP {ip}")]
    DuplicateIp {
        /// One port.
        first: String,
        /// The other.
        second: String,
        /// IP.
        ip: Ipv4Addr,
    },
    /// Two ports share a MAC.
    #[error("ports {first} and {second} both have MAC {mac}")]
    DuplicateMac {
        /// One port.
        first: String,
        /// The other.
        second: String,
        /// MAC.
        mac: MacAddr,
    },
    /// Two ports share a name.
    #[error("port {port} is listed twice")]
    DuplicatePort {
        /// Port.
        port: String,
    },
    /// A port's MAC is multicast, broadcast, zero, or the gateway's.
    #[error("port {port}: MAC {mac} cannot be a workload's (multicast, zero, or the gateway's)")]
    BadMac {
        /// Port.
        port: String,
        /// MAC.
        mac: MacAddr,
    },
    /// A port names a node that is not part of the network.
    #[error("port {port}: node {node} is not part of network {network}")]
    UnknownNode {
        /// Port.
        port: String,
        /// Node.
        node: String,
        /// Network.
        network: String,
    },
    /// The DHCP lease could not be built.
    #[error("port {port}: {source}")]
    Lease {
        /// Port.
        port: String,
        /// Why.
        source: roam_dhcp_opts::Error,
    },
    /// A VLAN tag outside 1..=4094.
    #[error(
        "network {network}: VLAN tag {tag} is not usable; 802.1Q tags are 1..=4094 \
         (0 means untagged or priority-tagged, 4095 is reserved)"
    )]
    BadVlanTag {
        /// Network.
        network: String,
        /// The tag.
        tag: u16,
    },
    /// A physical network name that cannot appear in `ovn-bridge-mappings`.
    #[error(
        "network {network}: physical network name {physnet:?} is not usable; it must be \
         non-empty, without ',' ':' or whitespace (ovn-bridge-mappings syntax)"
    )]
    BadPhysnet {
        /// Network.
        network: String,
        /// The name.
        physnet: String,
    },
    /// A port on a VLAN network asks for more than one node (a migration target): one VLAN
    /// switch holds all ports, and two ports with one MAC on one switch are not realizable.
    /// (No longer returned: a VLAN port with a migration target is bound on both chassis.)
    #[error(
        "port {port}: a VLAN network port lives on one node; migration targets ({also_on:?}) \
         are not supported on the underlay yet"
    )]
    UnderlayAlsoOn {
        /// Port.
        port: String,
        /// The extra nodes.
        also_on: Vec<String>,
    },
    /// The egress router's address on the VLAN is not a usable host of the VLAN's subnet
    /// (or is the VLAN's gateway).
    #[error(
        "network {network}: egress router address {ip} is not a usable address of the VLAN \
         subnet {subnet} (gateway {gateway}); pick a free host address of {subnet}"
    )]
    EgressAddressOutsideVlan {
        /// Network.
        network: String,
        /// The router's address.
        ip: Ipv4Addr,
        /// The VLAN's subnet.
        subnet: Ipv4Net,
        /// The VLAN's gateway.
        gateway: Ipv4Addr,
    },
    /// Two networks of one plan overlap.
    #[error(
        "network {network}: the {first_what} {first} overlaps the {second_what} {second}; \
         they must be disjoint"
    )]
    OverlappingSubnets {
        /// Network.
        network: String,
        /// What the first one is (e.g. "overlay subnet").
        first_what: String,
        /// The first one.
        first: Ipv4Net,
        /// What the second one is (e.g. "egress VLAN subnet").
        second_what: String,
        /// The second one.
        second: Ipv4Net,
    },
    /// The egress gateway chassis is not one of the network's nodes.
    #[error(
        "network {network}: egress gateway chassis {chassis} is not one of the network's \
         nodes; name a node of the overlay"
    )]
    UnknownGatewayChassis {
        /// Network.
        network: String,
        /// The chassis.
        chassis: String,
    },
}

/// A logical switch port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SwitchPort {
    /// LSP name (also the OVS `external_ids:iface-id` of the workload's interface).
    pub name: String,
    /// What it connects.
    pub kind: SwitchPortKind,
}

/// What a logical switch port connects.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SwitchPortKind {
    /// A workload's interface.
    Workload {
        /// MAC.
        mac: MacAddr,
        /// IP.
        ip: Ipv4Addr,
        /// The chassis allowed to bind it (`options:requested-chassis`). Several,
        /// comma-separated, make a multi-chassis port (a VLAN port during a migration): the
        /// reconciler then also sets `activation-strategy=rarp`.
        requested_chassis: String,
        /// Its DHCP options, when OVN answers DHCP for it.
        dhcp: Option<DhcpOptionsRow>,
    },
    /// The peer of a logical router port.
    Router {
        /// The router port's name.
        router_port: String,
    },
    /// The switch's link to a physical network (`type=localnet`, `addresses=["unknown"]`):
    /// ovn-controller patches it to the bridge `ovn-bridge-mappings` names for
    /// `network_name`, tagging the traffic with `tag`.
    Localnet {
        /// `options:network_name`: the physical network.
        network_name: String,
        /// The VLAN tag (1..=4094), `None` for an untagged physical network.
        tag: Option<u16>,
    },
}

/// A DSCP marking rule on a switch.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct QosRule {
    /// Match, e.g. `inport == "p1.node-a"`.
    pub r#match: String,
    /// DSCP value to set.
    pub dscp: u8,
}

/// A logical switch.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogicalSwitch {
    /// Name.
    pub name: String,
    /// Ports by name.
    pub ports: BTreeMap<String, SwitchPort>,
    /// DSCP rules.
    pub qos: BTreeSet<QosRule>,
}

/// A logical router port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouterPort {
    /// Name.
    pub name: String,
    /// MAC.
    pub mac: MacAddr,
    /// `IP/plen` networks.
    pub networks: Vec<String>,
}

/// A static route.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StaticRoute {
    /// Destination.
    pub ip_prefix: Ipv4Net,
    /// Next hop.
    pub nexthop: Ipv4Addr,
    /// Output port, when the next hop alone does not select it.
    pub output_port: Option<String>,
}

/// A source NAT rule of a logical router (`NAT` row, `type=snat`): traffic from
/// `logical_ip` leaves with source `external_ip`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SnatRule {
    /// The address traffic leaves with (the router's address on the external network).
    pub external_ip: Ipv4Addr,
    /// The internal network whose traffic is translated.
    pub logical_ip: Ipv4Net,
}

/// A logical router.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogicalRouter {
    /// Name.
    pub name: String,
    /// Ports by name.
    pub ports: BTreeMap<String, RouterPort>,
    /// Static routes.
    pub routes: BTreeSet<StaticRoute>,
    /// `options` the plan sets (e.g. `chassis` for a gateway router); other keys are left
    /// alone by the reconciler only if the plan names none (empty = the column is not managed).
    pub options: BTreeMap<String, String>,
    /// Source NAT rules.
    pub snat: BTreeSet<SnatRule>,
}

/// The desired OVN northbound state of one overlay network.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Topology {
    /// Logical switches by name.
    pub switches: BTreeMap<String, LogicalSwitch>,
    /// Logical routers by name.
    pub routers: BTreeMap<String, LogicalRouter>,
}

impl Topology {
    /// Every static route, as `(router, route)`.
    pub fn routes(&self) -> BTreeSet<RouterRoute> {
        self.routers
            .values()
            .flat_map(|r| r.routes.iter().map(move |s| (r.name.clone(), s.clone())))
            .collect()
    }
}

pub(super) fn node_switch(net: &str, node: &str) -> String {
    format!("{net}-{node}")
}
/// Routers and switches get distinct names: OVN needs every logical port name unique across
/// switch AND router ports (ovn-northd drops a duplicate with only a log line), and the
/// router ports are named after their router.
pub(super) fn node_router(net: &str, node: &str) -> String {
    format!("{net}-{node}-rtr")
}

/// The name of `node`'s router in overlay `net`.
pub fn node_router_name(net: &str, node: &str) -> String {
    node_router(net, node)
}

/// The name of the anycast-gateway port of `node`'s router in overlay `net`: the output port
/// of the node's local /32 routes.
pub fn gateway_port_name(net: &str, node: &str) -> String {
    format!("{}-gw", node_router(net, node))
}
/// The logical switch port (= the OVS interface's `external_ids:iface-id`) of overlay
/// workload `port` on `node`: `<port>.<node>`.
pub fn overlay_port_name(port: &str, node: &str) -> String {
    format!("{port}.{node}")
}

/// The mobile switch of overlay `net`: the ports of the workloads that migrate, whatever
/// node they run on, behind the fabric router's own anycast-gateway port.
pub fn mobile_switch_name(net: &str) -> String {
    format!("{net}-mobile")
}

/// The fabric router's anycast-gateway port on [`mobile_switch_name`]: the output port of
/// every mobile /32 route.
pub fn mobile_gateway_port_name(net: &str) -> String {
    format!("{net}-fabric-mobile")
}

/// The logical switch port (= `iface-id`) of mobile workload `port`: the port's own name,
/// on every node (the source's and the target's interface bind the same port).
pub fn mobile_port_name(port: &str) -> String {
    port.to_string()
}

/// The `requested-chassis` of a multi-chassis capable port: its node, then its migration
/// targets (comma-separated, without repeats).
pub(super) fn requested_chassis(p: &PortSpec) -> String {
    let mut seen = BTreeSet::new();
    std::iter::once(&p.node)
        .chain(&p.also_on)
        .filter(|n| seen.insert(n.as_str()))
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join(",")
}

fn validate(
    spec: &OverlaySpec,
    nodes: &[NodeSpec],
    ports: &[PortSpec],
    extras: &OverlayExtras,
) -> Result<(), PlanError> {
    let net = spec.name.clone();
    let hosts =
        |n: &Ipv4Net, ip: Ipv4Addr| n.contains(&ip) && ip != n.network() && ip != n.broadcast();
    if spec.subnet.prefix_len() >= 32 {
        return Err(PlanError::SubnetTooSmall {
            network: net,
            subnet: spec.subnet,
        });
    }
    if !hosts(&spec.subnet, spec.gateway) {
        return Err(PlanError::GatewayOutsideSubnet {
            network: net,
            gateway: spec.gateway,
            subnet: spec.subnet,
        });
    }
    if spec.join_subnet.contains(&spec.subnet.network())
        || spec.subnet.contains(&spec.join_subnet.network())
    {
        return Err(PlanError::JoinOverlapsSubnet {
            network: net,
            join: spec.join_subnet,
            subnet: spec.subnet,
        });
    }
    let mut join_used = BTreeSet::new();
    let mut check_join = |ip: Ipv4Addr, owner: &str| {
        if !hosts(&spec.join_subnet, ip) || !join_used.insert(ip) {
            return Err(PlanError::BadJoinAddress {
                network: net.clone(),
                ip,
                owner: owner.to_string(),
                join: spec.join_subnet,
            });
        }
        Ok(())
    };
    check_join(spec.fabric_ip, "fabric")?;
    let mut names = BTreeSet::new();
    for n in nodes {
        check_join(n.join_ip, &n.name)?;
        if !names.insert(n.name.as_str()) {
            return Err(PlanError::DuplicateNode {
                network: net,
                node: n.name.clone(),
            });
        }
    }
    if let Some(e) = &extras.egress {
        check_join(e.join_ip, "egress router")?;
        super::egress::validate(spec, &names, e)?;
    }
    let mgmt = super::mgmt::as_ports(spec, &extras.mgmt);
    let all: Vec<PortSpec> = ports.iter().chain(&mgmt).cloned().collect();
    check_ports(&all, &spec.subnet, spec.gateway, spec.gateway_mac)?;
    for p in &all {
        for node in std::iter::once(&p.node).chain(&p.also_on) {
            if !names.contains(node.as_str()) {
                return Err(PlanError::UnknownNode {
                    port: p.name.clone(),
                    node: node.clone(),
                    network: net,
                });
            }
        }
    }
    Ok(())
}

/// The checks every planner makes on its workload ports: unique names, an IP that is a host
/// address of `subnet` and not the `gateway`, a unicast non-zero MAC that is not
/// `reserved_mac` (the gateway's or the DHCP server's), no IP or MAC used twice.
pub(super) fn check_ports(
    ports: &[PortSpec],
    subnet: &Ipv4Net,
    gateway: Ipv4Addr,
    reserved_mac: MacAddr,
) -> Result<(), PlanError> {
    let host =
        |ip: Ipv4Addr| subnet.contains(&ip) && ip != subnet.network() && ip != subnet.broadcast();
    let mut by_ip: BTreeMap<Ipv4Addr, &str> = BTreeMap::new();
    let mut by_mac: BTreeMap<MacAddr, &str> = BTreeMap::new();
    let mut names = BTreeSet::new();
    for p in ports {
        if !names.insert(p.name.as_str()) {
            return Err(PlanError::DuplicatePort {
                port: p.name.clone(),
            });
        }
        if !host(p.ip) || p.ip == gateway {
            return Err(PlanError::IpOutsideSubnet {
                port: p.name.clone(),
                ip: p.ip,
                subnet: *subnet,
                gateway,
            });
        }
        if p.mac.is_multicast() || p.mac.is_zero() || p.mac == reserved_mac {
            return Err(PlanError::BadMac {
                port: p.name.clone(),
                mac: p.mac,
            });
        }
        if let Some(first) = by_ip.insert(p.ip, &p.name) {
            return Err(PlanError::DuplicateIp {
                first: first.to_string(),
                second: p.name.clone(),
                ip: p.ip,
            });
        }
        if let Some(first) = by_mac.insert(p.mac, &p.name) {
            return Err(PlanError::DuplicateMac {
                first: first.to_string(),
                second: p.name.clone(),
                mac: p.mac,
            });
        }
    }
    Ok(())
}

/// Workload `p`'s logical port `lsp` on switch `ls`, bound to `requested_chassis`, and the
/// DSCP marking of what comes in through it.
pub(super) fn workload_port(
    ls: &mut LogicalSwitch,
    lsp: &str,
    p: &PortSpec,
    requested_chassis: String,
    dhcp: Option<DhcpOptionsRow>,
) {
    ls.ports.insert(
        lsp.to_string(),
        SwitchPort {
            name: lsp.to_string(),
            kind: SwitchPortKind::Workload {
                mac: p.mac,
                ip: p.ip,
                requested_chassis,
                dhcp,
            },
        },
    );
    if let Some(m) = p.marking {
        ls.qos.insert(QosRule {
            r#match: format!("inport == \"{lsp}\""),
            dscp: m.dscp(),
        });
    }
}

/// Connect router `lr` to switch `ls`: router port `port` (`mac`, `network` as `IP/plen`) and
/// its peer `peer` on the switch.
pub(super) fn link(
    lr: &mut LogicalRouter,
    (port, mac, network): (&str, MacAddr, String),
    ls: &mut LogicalSwitch,
    peer: String,
) {
    lr.ports.insert(
        port.to_string(),
        RouterPort {
            name: port.to_string(),
            mac,
            networks: vec![network],
        },
    );
    ls.ports.insert(
        peer.clone(),
        SwitchPort {
            name: peer,
            kind: SwitchPortKind::Router {
                router_port: port.to_string(),
            },
        },
    );
}

/// Attach switch `ls` to router `lr` through the anycast gateway: router port `port` with the
/// gateway's IP (on the subnet's prefix) and MAC, and its peer `<ls>-gw` on the switch.
fn anycast_gateway(spec: &OverlaySpec, lr: &mut LogicalRouter, port: &str, ls: &mut LogicalSwitch) {
    let network = format!("{}/{}", spec.gateway, spec.subnet.prefix_len());
    let peer = format!("{}-gw", ls.name);
    link(lr, (port, spec.gateway_mac, network), ls, peer);
}

/// Plan the overlay network `spec` over `nodes` with the workload `ports`.
pub fn plan_overlay(
    spec: &OverlaySpec,
    nodes: &[NodeSpec],
    ports: &[PortSpec],
) -> Result<Topology, PlanError> {
    plan_overlay_with(spec, nodes, ports, &OverlayExtras::default())
}

/// What an overlay may have beyond its workloads: egress to a VLAN through a SNAT router,
/// and the nodes' management ports. `OverlayExtras::default()` is the bare overlay of
/// [`plan_overlay`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OverlayExtras {
    /// Egress of the overlay to a VLAN, SNATed to the router's address there.
    pub egress: Option<super::egress::EgressSpec>,
    /// Management ports, at most one per node.
    pub mgmt: Vec<super::mgmt::MgmtPort>,
}

/// [`plan_overlay`] with the `extras`: the egress router (see [`EgressSpec`]) and the
/// management ports (see [`MgmtPort`]). Reconcile the whole result as one network: a plan
/// without the extras removes them.
///
/// [`EgressSpec`]: super::egress::EgressSpec
/// [`MgmtPort`]: super::mgmt::MgmtPort
pub fn plan_overlay_with(
    spec: &OverlaySpec,
    nodes: &[NodeSpec],
    ports: &[PortSpec],
    extras: &OverlayExtras,
) -> Result<Topology, PlanError> {
    validate(spec, nodes, ports, extras)?;
    let net = &spec.name;
    let mut t = Topology::default();
    let join_name = format!("{net}-join");
    let fabric_name = format!("{net}-fabric");
    let join_plen = spec.join_subnet.prefix_len();
    let halves: Vec<Ipv4Net> = spec
        .subnet
        .subnets(spec.subnet.prefix_len() + 1)
        .expect("checked: plen < 32")
        .collect();

    let mut join = LogicalSwitch {
        name: join_name.clone(),
        ..Default::default()
    };
    let mut fabric = LogicalRouter {
        name: fabric_name.clone(),
        ..Default::default()
    };
    link(
        &mut fabric,
        (
            &format!("{fabric_name}-join"),
            spec.fabric_mac,
            format!("{}/{join_plen}", spec.fabric_ip),
        ),
        &mut join,
        format!("{join_name}-{fabric_name}"),
    );

    for n in nodes {
        let ls_name = node_switch(net, &n.name);
        let lr_name = node_router(net, &n.name);
        let mut ls = LogicalSwitch {
            name: ls_name.clone(),
            ..Default::default()
        };
        let mut lr = LogicalRouter {
            name: lr_name.clone(),
            ..Default::default()
        };
        anycast_gateway(spec, &mut lr, &format!("{lr_name}-gw"), &mut ls);
        link(
            &mut lr,
            (
                &format!("{lr_name}-join"),
                n.join_mac,
                format!("{}/{join_plen}", n.join_ip),
            ),
            &mut join,
            format!("{join_name}-{lr_name}"),
        );
        // both halves of the subnet to the fabric: more specific than the connected subnet
        for h in &halves {
            lr.routes.insert(StaticRoute {
                ip_prefix: *h,
                nexthop: spec.fabric_ip,
                output_port: None,
            });
        }
        t.switches.insert(ls_name, ls);
        t.routers.insert(lr_name, lr);
    }

    let join_ip: BTreeMap<&str, Ipv4Addr> =
        nodes.iter().map(|n| (n.name.as_str(), n.join_ip)).collect();
    let mobile_gw = mobile_gateway_port_name(net);
    // always there (a parent the incremental sync can rely on), even before its first VM
    let mut mobile = LogicalSwitch {
        name: mobile_switch_name(net),
        ..Default::default()
    };
    anycast_gateway(spec, &mut fabric, &mobile_gw, &mut mobile);
    for p in ports {
        let host = Ipv4Net::new(p.ip, 32).expect("/32 is valid");
        let dhcp = if p.dhcp {
            let lease = Lease::builder(p.ip, spec.gateway, spec.gateway_mac)
                .dns_servers(spec.dns.iter().copied())
                .mtu(spec.mtu)
                .build()
                .map_err(|source| PlanError::Lease {
                    port: p.name.clone(),
                    source,
                })?;
            Some(lease.to_ovn())
        } else {
            None
        };
        if p.mobile {
            // one port wherever the workload runs; its route never moves
            workload_port(
                &mut mobile,
                &mobile_port_name(&p.name),
                p,
                requested_chassis(p),
                dhcp,
            );
            fabric.routes.insert(StaticRoute {
                ip_prefix: host,
                nexthop: p.ip,
                output_port: Some(mobile_gw.clone()),
            });
            continue;
        }
        let mut placed = BTreeSet::new();
        for node in std::iter::once(&p.node).chain(&p.also_on) {
            if !placed.insert(node) {
                continue;
            }
            let ls = t
                .switches
                .get_mut(&node_switch(net, node))
                .expect("validated node");
            workload_port(
                ls,
                &overlay_port_name(&p.name, node),
                p,
                node.clone(),
                dhcp.clone(),
            );
        }
        // the /32 points at the hosting node: locally to its gateway port, and from the fabric
        let lr_name = node_router(net, &p.node);
        let lr = t.routers.get_mut(&lr_name).expect("validated node");
        lr.routes.insert(StaticRoute {
            ip_prefix: host,
            nexthop: p.ip,
            output_port: Some(format!("{lr_name}-gw")),
        });
        fabric.routes.insert(StaticRoute {
            ip_prefix: host,
            nexthop: join_ip[p.node.as_str()],
            output_port: None,
        });
    }
    for m in &extras.mgmt {
        super::mgmt::plan(spec, &mut t, &mut fabric, join_ip[m.node.as_str()], m);
    }
    if let Some(e) = &extras.egress {
        super::egress::plan(spec, &mut t, &mut join, &mut fabric, e);
    }
    t.switches.insert(mobile.name.clone(), mobile);
    t.switches.insert(join_name, join);
    t.routers.insert(fabric_name, fabric);
    Ok(t)
}

/// A route on a named router.
pub type RouterRoute = (String, StaticRoute);

/// The route changes between two plans. For a route flip of one address: its local route
/// leaves the old node's router, a local route appears on the new node's router, and the
/// fabric route's next hop changes — three changes that one transaction must make.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RouteFlip {
    /// Routes only in the old plan.
    pub removed: Vec<RouterRoute>,
    /// Routes only in the new plan.
    pub added: Vec<RouterRoute>,
}

/// The route changes from `before` to `after`.
pub fn route_flip(before: &Topology, after: &Topology) -> RouteFlip {
    let (b, a) = (before.routes(), after.routes());
    RouteFlip {
        removed: b.difference(&a).cloned().collect(),
        added: a.difference(&b).cloned().collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mac(s: &str) -> MacAddr {
        s.parse().unwrap()
    }

    fn spec() -> OverlaySpec {
        OverlaySpec {
            name: "ovl".into(),
            subnet: "100.64.0.0/16".parse().unwrap(),
            gateway: "100.64.0.1".parse().unwrap(),
            gateway_mac: mac("0a:00:00:00:00:01"),
            join_subnet: "169.254.100.0/24".parse().unwrap(),
            fabric_ip: "169.254.100.1".parse().unwrap(),
            fabric_mac: mac("0a:00:00:00:ff:01"),
            mtu: 1400,
            dns: vec!["10.96.0.10".parse().unwrap()],
        }
    }

    fn nodes(n: usize) -> Vec<NodeSpec> {
        (0..n)
            .map(|i| NodeSpec {
                name: format!("node-{i}"),
                join_ip: Ipv4Addr::new(169, 254, 100, 10 + i as u8),
                join_mac: MacAddr::new([0x0a, 0, 0, 0, 0xfe, i as u8]),
            })
            .collect()
    }

    fn port(i: u32, node: &str) -> PortSpec {
        let ip = Ipv4Addr::from(u32::from(Ipv4Addr::new(100, 64, 1, 0)) + i);
        PortSpec {
            name: format!("p{i}"),
            mac: MacAddr::new([0x0a, 0x58, 0, 0, (i >> 8) as u8, i as u8]),
            ip,
            node: node.into(),
            also_on: vec![],
            dhcp: true,
            marking: None,
            mobile: false,
        }
    }

    #[test]
    fn every_node_router_presents_the_same_anycast_gateway() {
        let t = plan_overlay(&spec(), &nodes(3), &[]).unwrap();
        let gws: BTreeSet<_> = (0..3)
            .map(|i| {
                let lr = &t.routers[&format!("ovl-node-{i}-rtr")];
                let p = &lr.ports[&format!("ovl-node-{i}-rtr-gw")];
                (p.mac, p.networks.clone())
            })
            .collect();
        assert_eq!(
            gws.len(),
            1,
            "one gateway MAC and IP on every node: {gws:?}"
        );
        let (m, n) = gws.into_iter().next().unwrap();
        assert_eq!(m, mac("0a:00:00:00:00:01"));
        assert_eq!(n, vec!["100.64.0.1/16".to_string()]);
    }

    #[test]
    fn logical_port_names_are_unique_across_switches_and_routers() {
        let ns = nodes(3);
        let ports: Vec<_> = (1..=6).map(|i| port(i, &ns[i as usize % 3].name)).collect();
        let t = plan_overlay(&spec(), &ns, &ports).unwrap();
        let mut names = BTreeSet::new();
        let lsps = t.switches.values().flat_map(|s| s.ports.keys());
        let lrps = t.routers.values().flat_map(|r| r.ports.keys());
        for n in lsps.chain(lrps) {
            assert!(names.insert(n.clone()), "{n} is used twice");
        }
        // and every router-type switch port peers with a router port that exists
        for ls in t.switches.values() {
            for p in ls.ports.values() {
                if let SwitchPortKind::Router { router_port } = &p.kind {
                    assert!(
                        t.routers
                            .values()
                            .any(|r| r.ports.contains_key(router_port)),
                        "{router_port}"
                    );
                }
            }
        }
    }

    #[test]
    fn node_routers_send_both_halves_to_the_fabric() {
        let t = plan_overlay(&spec(), &nodes(2), &[]).unwrap();
        let lr = &t.routers["ovl-node-0-rtr"];
        let prefixes: Vec<String> = lr.routes.iter().map(|r| r.ip_prefix.to_string()).collect();
        assert_eq!(prefixes, ["100.64.0.0/17", "100.64.128.0/17"]);
        assert!(lr.routes.iter().all(|r| r.nexthop == spec().fabric_ip));
    }

    #[test]
    fn routes_grow_with_addresses_not_nodes_times_addresses() {
        for n in [2usize, 5, 20] {
            let ns = nodes(n);
            let ports: Vec<_> = (1..=100)
                .map(|i| port(i, &ns[i as usize % n].name))
                .collect();
            let t = plan_overlay(&spec(), &ns, &ports).unwrap();
            let host_routes = t
                .routes()
                .iter()
                .filter(|(_, r)| r.ip_prefix.prefix_len() == 32)
                .count();
            assert_eq!(host_routes, 2 * ports.len(), "{n} nodes");
        }
    }

    #[test]
    fn a_route_flip_changes_three_routes() {
        let ns = nodes(3);
        let mut ports: Vec<_> = (1..=10).map(|i| port(i, "node-0")).collect();
        let before = plan_overlay(&spec(), &ns, &ports).unwrap();
        ports[3].node = "node-2".into();
        let after = plan_overlay(&spec(), &ns, &ports).unwrap();
        let RouteFlip { removed, added } = route_flip(&before, &after);
        assert_eq!(removed.len(), 2, "{removed:?}");
        assert_eq!(added.len(), 2, "{added:?}");
        let ip: Ipv4Net = "100.64.1.4/32".parse().unwrap();
        assert!(
            removed
                .iter()
                .any(|(r, s)| r == "ovl-node-0-rtr" && s.ip_prefix == ip)
        );
        assert!(
            added
                .iter()
                .any(|(r, s)| r == "ovl-node-2-rtr" && s.ip_prefix == ip && s.nexthop == ip.addr())
        );
        let fabric_old = removed.iter().find(|(r, _)| r == "ovl-fabric").unwrap();
        let fabric_new = added.iter().find(|(r, _)| r == "ovl-fabric").unwrap();
        assert_eq!(fabric_old.1.nexthop, ns[0].join_ip);
        assert_eq!(fabric_new.1.nexthop, ns[2].join_ip);
        // the fabric route is modified in place (same prefix): 1 local delete + 1 local add + 1 fabric update
        assert_eq!(fabric_old.1.ip_prefix, fabric_new.1.ip_prefix);
    }

    #[test]
    fn a_migration_target_gets_its_port_before_the_route_moves() {
        let ns = nodes(2);
        let mut p = port(7, "node-0");
        p.also_on = vec!["node-1".into()];
        p.marking = Some("lowlatency".parse().unwrap());
        let t = plan_overlay(&spec(), &ns, &[p]).unwrap();
        for n in ["node-0", "node-1"] {
            let ls = &t.switches[&format!("ovl-{n}")];
            let lsp = &ls.ports[&format!("p7.{n}")];
            match &lsp.kind {
                SwitchPortKind::Workload {
                    requested_chassis,
                    dhcp,
                    ..
                } => {
                    assert_eq!(requested_chassis, n);
                    let row = dhcp.as_ref().unwrap();
                    assert_eq!(row.cidr, "100.64.1.7/32");
                    assert_eq!(
                        row.options["classless_static_route"],
                        "{100.64.0.1/32,0.0.0.0, 0.0.0.0/0,100.64.0.1}"
                    );
                    assert_eq!(row.options["mtu"], "1400");
                }
                other => panic!("{other:?}"),
            }
            assert_eq!(ls.qos.iter().next().unwrap().dscp, 22);
        }
        // routes still point at node-0
        assert!(
            t.routers["ovl-fabric"]
                .routes
                .iter()
                .any(|r| r.nexthop == ns[0].join_ip)
        );
        assert!(
            !t.routers["ovl-node-1-rtr"]
                .routes
                .iter()
                .any(|r| r.ip_prefix.prefix_len() == 32)
        );
    }

    fn mobile(i: u32, node: &str, also_on: &[&str]) -> PortSpec {
        PortSpec {
            mobile: true,
            also_on: also_on.iter().map(|n| n.to_string()).collect(),
            ..port(i, node)
        }
    }

    #[test]
    fn a_mobile_port_is_one_port_behind_the_fabric_and_its_route_never_moves() {
        let ns = nodes(3);
        let plan = |p: PortSpec| plan_overlay(&spec(), &ns, &[port(1, "node-0"), p]).unwrap();
        let on_0 = plan(mobile(7, "node-0", &[]));
        let migrating = plan(mobile(7, "node-0", &["node-1"]));
        let on_1 = plan(mobile(7, "node-1", &[]));
        for (t, chassis) in [
            (&on_0, "node-0"),
            (&migrating, "node-0,node-1"),
            (&on_1, "node-1"),
        ] {
            let ls = &t.switches["ovl-mobile"];
            match &ls.ports["p7"].kind {
                SwitchPortKind::Workload {
                    requested_chassis,
                    dhcp,
                    ..
                } => {
                    assert_eq!(requested_chassis, chassis);
                    assert_eq!(dhcp.as_ref().unwrap().cidr, "100.64.1.7/32");
                }
                other => panic!("{other:?}"),
            }
            // the mobile switch's gateway is the fabric's port with the anycast gateway
            let gw = &t.routers["ovl-fabric"].ports["ovl-fabric-mobile"];
            assert_eq!(gw.mac, mac("0a:00:00:00:00:01"));
            assert_eq!(gw.networks, vec!["100.64.0.1/16".to_string()]);
            // no per-node port for it anywhere
            for n in &ns {
                assert!(
                    !t.switches[&format!("ovl-{}", n.name)]
                        .ports
                        .keys()
                        .any(|k| k.starts_with("p7")),
                    "{chassis}"
                );
            }
        }
        // wherever it runs, migrating or not: the same routes (one /32, on the fabric)
        assert_eq!(on_0.routes(), migrating.routes());
        assert_eq!(on_0.routes(), on_1.routes());
        let mine: Vec<_> = on_0
            .routes()
            .into_iter()
            .filter(|(_, r)| r.ip_prefix.to_string() == "100.64.1.7/32")
            .collect();
        assert_eq!(mine.len(), 1, "{mine:?}");
        assert_eq!(mine[0].0, "ovl-fabric");
        assert_eq!(mine[0].1.output_port.as_deref(), Some("ovl-fabric-mobile"));
        assert_eq!(mine[0].1.nexthop, Ipv4Addr::new(100, 64, 1, 7));
        assert_eq!(route_flip(&on_0, &on_1), RouteFlip::default());
    }

    #[test]
    fn every_overlay_has_its_mobile_switch_which_carries_its_ports_marking() {
        let ns = nodes(2);
        let t = plan_overlay(&spec(), &ns, &[]).unwrap();
        assert_eq!(
            t.switches["ovl-mobile"].ports.keys().collect::<Vec<_>>(),
            ["ovl-mobile-gw"],
            "before its first VM: the switch and its gateway"
        );
        assert!(
            t.routers["ovl-fabric"]
                .ports
                .contains_key("ovl-fabric-mobile")
        );
        let mut m = mobile(2, "node-1", &[]);
        m.marking = Some("lowlatency".parse().unwrap());
        let t = plan_overlay(&spec(), &ns, &[port(1, "node-0"), m]).unwrap();
        let qos: Vec<_> = t.switches["ovl-mobile"].qos.iter().collect();
        assert_eq!(qos.len(), 1);
        assert_eq!(qos[0].r#match, "inport == \"p2\"");
        assert_eq!(qos[0].dscp, 22);
    }

    #[test]
    fn a_mobile_port_on_an_unknown_node_is_refused() {
        let err =
            plan_overlay(&spec(), &nodes(2), &[mobile(3, "node-0", &["node-9"])]).unwrap_err();
        assert!(matches!(err, PlanError::UnknownNode { .. }), "{err}");
    }

    #[test]
    fn bad_input_is_rejected_with_the_reason() {
        let ns = nodes(2);
        let s = spec();
        let err = |ports: &[PortSpec]| plan_overlay(&s, &ns, ports).unwrap_err();
        assert!(matches!(
            err(&[port(1, "node-9")]),
            PlanError::UnknownNode { .. }
        ));
        let mut outside = port(1, "node-0");
        outside.ip = "10.0.0.5".parse().unwrap();
        assert!(matches!(err(&[outside]), PlanError::IpOutsideSubnet { .. }));
        let mut gw = port(1, "node-0");
        gw.ip = s.gateway;
        assert!(matches!(err(&[gw]), PlanError::IpOutsideSubnet { .. }));
        let mut dup_ip = port(2, "node-1");
        dup_ip.ip = port(1, "node-0").ip;
        assert!(matches!(
            err(&[port(1, "node-0"), dup_ip]),
            PlanError::DuplicateIp { .. }
        ));
        let mut dup_mac = port(2, "node-1");
        dup_mac.mac = port(1, "node-0").mac;
        assert!(matches!(
            err(&[port(1, "node-0"), dup_mac]),
            PlanError::DuplicateMac { .. }
        ));
        let mut gw_mac = port(1, "node-0");
        gw_mac.mac = s.gateway_mac;
        assert!(matches!(err(&[gw_mac]), PlanError::BadMac { .. }));
        assert!(matches!(
            err(&[port(1, "node-0"), port(1, "node-1")]),
            PlanError::DuplicatePort { .. }
        ));

        let mut bad = spec();
        bad.gateway = "10.0.0.1".parse().unwrap();
        assert!(matches!(
            plan_overlay(&bad, &ns, &[]),
            Err(PlanError::GatewayOutsideSubnet { .. })
        ));
        let mut bad = spec();
        bad.join_subnet = "100.64.200.0/24".parse().unwrap();
        assert!(matches!(
            plan_overlay(&bad, &ns, &[]),
            Err(PlanError::JoinOverlapsSubnet { .. })
        ));
        let mut dup = nodes(2);
        dup[1].join_ip = dup[0].join_ip;
        assert!(matches!(
            plan_overlay(&s, &dup, &[]),
            Err(PlanError::BadJoinAddress { .. })
        ));
        let mut dup = nodes(2);
        dup[1].name = dup[0].name.clone();
        assert!(matches!(
            plan_overlay(&s, &dup, &[]),
            Err(PlanError::DuplicateNode { .. })
        ));
    }
}
