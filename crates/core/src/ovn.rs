//! The OVN syncer's decisions: whether a batch only adds ports (one small transaction against
//! the known parent rows) or needs a full reconcile, and the topology of just the additions.

use std::collections::{BTreeMap, BTreeSet};

use roam_network::topology::{PortSpec, SwitchPortKind, Topology};

/// What a sync has to do, given the ports OVN holds (as this controller last wrote or read
/// them) and the ports the index wants.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Delta {
    /// Nothing changed.
    Nothing,
    /// Only these ports are new; every known port is wanted unchanged.
    Add(Vec<PortSpec>),
    /// A port went away or changed (host, MAC, DHCP, marking): reconcile everything.
    Full,
}

/// Compare `known` with `wanted`.
pub fn delta(known: &BTreeMap<String, PortSpec>, wanted: &[PortSpec]) -> Delta {
    let by_name: BTreeMap<&str, &PortSpec> = wanted.iter().map(|p| (p.name.as_str(), p)).collect();
    if !known
        .iter()
        .all(|(n, p)| by_name.get(n.as_str()) == Some(&p))
    {
        return Delta::Full;
    }
    let new: Vec<PortSpec> = wanted
        .iter()
        .filter(|p| !known.contains_key(&p.name))
        .cloned()
        .collect();
    if new.is_empty() {
        Delta::Nothing
    } else {
        Delta::Add(new)
    }
}

/// `t` (planned for the `new` ports only) reduced to what they add: their switch ports (and
/// QoS rules) and their /32 routes — no router ports, no router-type or localnet switch
/// ports, no other routes. Diffed against parent rows without children, it yields only
/// inserts of these rows and their insertion into their parents.
pub fn additions_only(mut t: Topology, new: &[PortSpec]) -> Topology {
    let prefixes: BTreeSet<String> = new.iter().map(|p| format!("{}/32", p.ip)).collect();
    for ls in t.switches.values_mut() {
        ls.ports
            .retain(|_, p| matches!(p.kind, SwitchPortKind::Workload { .. }));
    }
    for lr in t.routers.values_mut() {
        lr.ports.clear();
        lr.routes
            .retain(|r| prefixes.contains(&r.ip_prefix.to_string()));
    }
    t
}

/// Whether the SB's `Port_Binding` rows (`logical_port`, `options`) show every one of
/// `ports` activated on `chassis`: ovn-controller on a multi-chassis port's additional
/// chassis adds its name to `options:additional-chassis-activated` once the workload's RARP
/// came in and its flows carry the port's traffic.
pub fn all_activated(rows: &[serde_json::Value], ports: &[String], chassis: &str) -> bool {
    ports.iter().all(|port| {
        rows.iter().any(|r| {
            r["logical_port"].as_str() == Some(port.as_str())
                && r["options"][1].as_array().is_some_and(|pairs| {
                    pairs.iter().any(|kv| {
                        kv[0] == "additional-chassis-activated"
                            && kv[1]
                                .as_str()
                                .is_some_and(|v| v.split(',').any(|c| c == chassis))
                    })
                })
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use roam_dhcp_opts::MacAddr;
    use roam_network::topology::{NodeSpec, OverlaySpec, plan_overlay};
    use std::net::Ipv4Addr;

    fn port(i: u8, node: &str) -> PortSpec {
        PortSpec {
            name: format!("p{i}"),
            mac: MacAddr::new([0x0a, 0x58, 100, 64, 0, i]),
            ip: Ipv4Addr::new(100, 64, 0, i),
            node: node.into(),
            also_on: vec![],
            dhcp: false,
            marking: None,
            mobile: false,
        }
    }

    #[test]
    fn only_additions_are_incremental() {
        let known: BTreeMap<String, PortSpec> = [port(10, "a"), port(11, "b")]
            .into_iter()
            .map(|p| (p.name.clone(), p))
            .collect();
        assert_eq!(
            delta(&known, &[port(10, "a"), port(11, "b")]),
            Delta::Nothing
        );
        assert_eq!(
            delta(&known, &[port(10, "a"), port(11, "b"), port(12, "a")]),
            Delta::Add(vec![port(12, "a")])
        );
        assert_eq!(
            delta(&known, &[port(10, "a")]),
            Delta::Full,
            "a port went away"
        );
        assert_eq!(
            delta(&known, &[port(10, "b"), port(11, "b")]),
            Delta::Full,
            "a host changed"
        );
    }

    #[test]
    fn a_mobile_port_is_an_addition_like_any_other() {
        let mobile = |i, node| PortSpec {
            mobile: true,
            ..port(i, node)
        };
        let known: BTreeMap<String, PortSpec> = [port(10, "a")]
            .into_iter()
            .map(|p| (p.name.clone(), p))
            .collect();
        assert_eq!(
            delta(&known, &[port(10, "a"), mobile(11, "b")]),
            Delta::Add(vec![mobile(11, "b")])
        );
    }

    #[test]
    fn activation_is_read_from_the_port_bindings_options() {
        let row = |port: &str, activated: Option<&str>| {
            let mut options = vec![serde_json::json!(["requested-chassis", "a,b"])];
            if let Some(a) = activated {
                options.push(serde_json::json!(["additional-chassis-activated", a]));
            }
            serde_json::json!({"logical_port": port, "options": ["map", options]})
        };
        let ports = ["vm1".to_string(), "vm2".to_string()];
        let rows = [row("vm1", Some("b")), row("vm2", None)];
        assert!(!all_activated(&rows, &ports, "b"));
        let rows = [row("vm1", Some("b")), row("vm2", Some("c,b"))];
        assert!(all_activated(&rows, &ports, "b"));
        assert!(!all_activated(&rows, &ports, "c"), "vm1 is not on c");
        assert!(
            !all_activated(&rows[..1], &ports, "b"),
            "vm2 has no binding"
        );
        let rows = [row("vm1", Some("bb")), row("vm2", Some("b"))];
        assert!(!all_activated(&rows, &ports, "b"), "whole names only");
    }

    #[test]
    fn the_additions_topology_holds_only_the_new_rows() {
        let spec = OverlaySpec {
            name: "n".into(),
            subnet: "100.64.0.0/24".parse().unwrap(),
            gateway: Ipv4Addr::new(100, 64, 0, 1),
            gateway_mac: MacAddr::new([0x0a, 0x58, 100, 64, 0, 1]),
            join_subnet: "169.254.0.0/24".parse().unwrap(),
            fabric_ip: Ipv4Addr::new(169, 254, 0, 1),
            fabric_mac: MacAddr::new([0x0a, 0x58, 169, 254, 0, 1]),
            mtu: 1400,
            dns: vec![],
        };
        let nodes: Vec<NodeSpec> = ["a", "b"]
            .iter()
            .enumerate()
            .map(|(i, n)| NodeSpec {
                name: (*n).into(),
                join_ip: Ipv4Addr::new(169, 254, 0, 2 + i as u8),
                join_mac: MacAddr::new([0x0a, 0x58, 169, 254, 0, 2 + i as u8]),
            })
            .collect();
        let new = [port(12, "a")];
        let t = additions_only(plan_overlay(&spec, &nodes, &new).unwrap(), &new);
        let ports: Vec<&String> = t.switches.values().flat_map(|s| s.ports.keys()).collect();
        assert_eq!(ports, ["p12.a"]);
        assert!(t.routers.values().all(|r| r.ports.is_empty()));
        let routes = t.routes();
        assert_eq!(
            routes.len(),
            2,
            "the fabric route and node a's local route: {routes:?}"
        );
        assert!(
            routes
                .iter()
                .all(|(_, r)| r.ip_prefix.to_string() == "100.64.0.12/32")
        );
    }
}
