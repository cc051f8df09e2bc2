//! The scale lab: the lab's OVN loaded with N addresses that are not the test's own, as roam
//! creates them (one logical port, DHCP options and two /32 routes each, through roam's
//! reconciler), spread over the two chassis, a share of them bound to OVS ports on the nodes
//! so that each ovn-controller holds them as a real node would. The size and the bound share
//! are parameters: a larger machine pushes further.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use roam_network::northbound::reconcile;
use roam_network::topology::{
    NodeSpec, OverlaySpec, PortSpec, Topology, overlay_port_name, plan_overlay,
};

use crate::fixtures::PortBuilder;
use crate::lab::{Lab, run, try_run};

/// The scale network's name.
pub const SCALE_NETWORK: &str = "scale";

/// How many OVS ports one `ovs-vsctl` call adds or removes.
const VSCTL_CHUNK: usize = 100;

/// The scale network: a /12 (room for a million addresses), its own transit network.
pub fn scale_spec() -> OverlaySpec {
    OverlaySpec {
        name: SCALE_NETWORK.into(),
        subnet: "10.128.0.0/12".parse().expect("a subnet"),
        gateway: Ipv4Addr::new(10, 128, 0, 1),
        gateway_mac: "0a:00:00:5c:a1:01".parse().expect("a MAC"),
        join_subnet: "169.254.200.0/24".parse().expect("a subnet"),
        fabric_ip: Ipv4Addr::new(169, 254, 200, 1),
        fabric_mac: "0a:00:00:5c:a1:fe".parse().expect("a MAC"),
        mtu: 1400,
        dns: vec![],
    }
}

/// The lab's two nodes in the scale network.
pub fn scale_nodes() -> Vec<NodeSpec> {
    ["node-a", "node-b"]
        .iter()
        .enumerate()
        .map(|(i, n)| NodeSpec {
            name: (*n).into(),
            join_ip: Ipv4Addr::new(169, 254, 200, 11 + i as u8),
            join_mac: roam_dhcp_opts::MacAddr::new([0x0a, 0, 0, 0x5c, 0xa1, 0x11 + i as u8]),
        })
        .collect()
}

/// Address `i` of the load: `10.128.1.0 + i`, on node-a (even) or node-b (odd), with DHCP
/// (a VM's port: the most rows per address).
pub fn scale_port(i: usize) -> PortSpec {
    let ip = Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 128, 1, 0)) + i as u32);
    let node = if i.is_multiple_of(2) {
        "node-a"
    } else {
        "node-b"
    };
    PortBuilder::new(format!("sc{i}"), ip, node)
        .dhcp(true)
        .build()
}

/// Which `want` of the load's `n` addresses are bound: spread evenly over the load, half of
/// them even (node-a's) and half odd (node-b's).
pub fn bound_indices(n: usize, want: usize) -> Vec<usize> {
    let want = want.min(n);
    let Some(every) = n.checked_div(want) else {
        return vec![];
    };
    if every < 2 {
        return (0..want).collect();
    }
    // an odd step alternates the parity by itself; an even one needs a nudge
    let nudge = usize::from(every.is_multiple_of(2));
    (0..want).map(|k| k * every + nudge * (k % 2)).collect()
}

/// How a load went.
#[derive(Clone, Debug)]
pub struct LoadReport {
    /// Addresses in the scale network now.
    pub addresses: usize,
    /// Of which bound to an OVS port on their node.
    pub bound: usize,
    /// roam's reconcile (one transaction) of the whole network.
    pub commit: Duration,
    /// Commit, binding and `ovn-nbctl --wait=hv sync`: every chassis has the flows.
    pub settled: Duration,
}

/// The scale network on the lab; removes its OVN rows and OVS ports when created (leftovers
/// of a killed run) and when dropped.
pub struct ScaleLoad {
    lab: Lab,
    rt: tokio::runtime::Runtime,
    client: roam_ovsdb::Client,
    /// (node, OVS port) bound so far.
    bound: Vec<(String, String)>,
    addresses: usize,
}

impl ScaleLoad {
    /// Take charge of the scale network (empty).
    pub fn new(lab: &Lab) -> ScaleLoad {
        let rt = tokio::runtime::Runtime::new().expect("a tokio runtime");
        let client = rt
            .block_on(roam_ovsdb::Client::connect_with(lab.nb(), patient()))
            .expect("connect to the lab's NB");
        let mut s = ScaleLoad {
            lab: lab.clone(),
            rt,
            client,
            bound: vec![],
            addresses: 0,
        };
        // a killed run's ports are named sc<i> on either node
        for node in ["node-a", "node-b"] {
            let db = format!("--db={}", lab.node(node).ovs_db);
            let listed = try_run("ovs-vsctl", &[&db, "list-ports", "br-int"]).unwrap_or_default();
            let stale: Vec<(String, String)> = listed
                .lines()
                .filter(|p| p.starts_with("sc") && p[2..].chars().all(|c| c.is_ascii_digit()))
                .map(|p| (node.to_string(), p.to_string()))
                .collect();
            s.bound.extend(stale);
        }
        s.unbind_all();
        s.apply(&[]);
        s
    }

    fn apply(&self, extra: &[PortSpec]) -> Duration {
        self.try_apply(extra)
            .unwrap_or_else(|e| panic!("reconcile the scale network: {e}"))
    }

    fn try_apply(&self, extra: &[PortSpec]) -> Result<Duration, roam_network::Error> {
        let mut ports: Vec<PortSpec> = (0..self.addresses).map(scale_port).collect();
        ports.extend_from_slice(extra);
        let topology = if ports.is_empty() {
            Topology::default()
        } else {
            plan_overlay(&scale_spec(), &scale_nodes(), &ports).expect("plan the scale network")
        };
        let t0 = Instant::now();
        self.rt
            .block_on(reconcile(&self.client, SCALE_NETWORK, &topology))?;
        Ok(t0.elapsed())
    }

    /// Grow (or shrink) the load to `n` addresses plus `extra` ports (a test's own, in the
    /// same network), and bind `bound_share` of the load (0.0–1.0) to OVS ports on their
    /// nodes. Waits until every chassis has the flows.
    pub fn load(&mut self, n: usize, bound_share: f64, extra: &[PortSpec]) -> LoadReport {
        let t0 = Instant::now();
        let want_bound = ((n as f64) * bound_share.clamp(0.0, 1.0)).round() as usize;
        if want_bound < self.bound.len() || n < self.addresses {
            self.unbind_all();
        }
        self.addresses = n;
        let commit = self.apply(extra);
        // both nodes get their share ([`bound_indices`]): with every k-th address alone (k
        // even) all of them were node-a's, and node-b's ovn-controller never even monitored
        // the load's datapaths
        let have: std::collections::BTreeSet<String> =
            self.bound.iter().map(|(_, p)| p.clone()).collect();
        let mut todo: Vec<(String, String, String)> = vec![];
        for i in bound_indices(n, want_bound) {
            let p = scale_port(i);
            if !have.contains(&p.name) {
                todo.push((
                    p.node.clone(),
                    p.name.clone(),
                    overlay_port_name(&p.name, &p.node),
                ));
            }
        }
        for node in ["node-a", "node-b"] {
            let mine: Vec<&(String, String, String)> =
                todo.iter().filter(|t| t.0 == node).collect();
            for chunk in mine.chunks(VSCTL_CHUNK) {
                let mut args = vec![
                    format!("--db={}", self.lab.node(node).ovs_db),
                    "--timeout=120".into(),
                ];
                for (_, port, lsp) in chunk {
                    args.extend([
                        "--".into(),
                        "--may-exist".into(),
                        "add-port".into(),
                        "br-int".into(),
                        port.clone(),
                        "--".into(),
                        "set".into(),
                        "interface".into(),
                        port.clone(),
                        "type=internal".into(),
                        format!("external_ids:iface-id={lsp}"),
                    ]);
                }
                let argv: Vec<&str> = args.iter().map(String::as_str).collect();
                run("ovs-vsctl", &argv);
                self.bound
                    .extend(chunk.iter().map(|(n, p, _)| (n.clone(), p.clone())));
            }
        }
        sync_hv(&self.lab);
        LoadReport {
            addresses: n,
            bound: self.bound.len(),
            commit,
            settled: t0.elapsed(),
        }
    }

    /// Re-plan with the load and `extra` (e.g. a test port gaining a migration target).
    pub fn replan(&self, extra: &[PortSpec]) -> Duration {
        self.apply(extra)
    }

    /// Run `f` on the load's runtime (e.g. a route flip through its NB client).
    pub fn block_on<F: std::future::Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }

    /// The NB client the load uses.
    pub fn client(&self) -> &roam_ovsdb::Client {
        &self.client
    }

    fn unbind_all(&mut self) {
        for node in ["node-a", "node-b"] {
            let mine: Vec<String> = self
                .bound
                .iter()
                .filter(|(n, _)| n == node)
                .map(|(_, p)| p.clone())
                .collect();
            for chunk in mine.chunks(VSCTL_CHUNK) {
                let mut args = vec![
                    format!("--db={}", self.lab.node(node).ovs_db),
                    "--timeout=120".into(),
                ];
                for port in chunk {
                    args.extend([
                        "--".into(),
                        "--if-exists".into(),
                        "del-port".into(),
                        "br-int".into(),
                        port.clone(),
                    ]);
                }
                let argv: Vec<&str> = args.iter().map(String::as_str).collect();
                let _ = try_run("ovs-vsctl", &argv);
            }
        }
        self.bound.clear();
    }

    /// Remove every row and port of the load.
    pub fn clear(&mut self) {
        self.unbind_all();
        self.addresses = 0;
        self.apply(&[]);
    }
}

impl Drop for ScaleLoad {
    fn drop(&mut self) {
        // also after a failure midway: never a second panic
        self.unbind_all();
        self.addresses = 0;
        if let Err(e) = self.try_apply(&[]) {
            eprintln!("the scale network's rows were not removed: {e}");
        }
    }
}

/// Client options for a loaded OVN: its servers may be busy for minutes (a recompute of ten
/// thousand ports), which is not a dead connection.
pub fn patient() -> roam_ovsdb::ClientOptions {
    roam_ovsdb::ClientOptions {
        request_timeout: Duration::from_secs(900),
        inactivity_probe: None,
        ..Default::default()
    }
}

/// `ovn-nbctl --wait=hv sync` (generous timeout: a large NB takes northd and the chassis a
/// while).
pub fn sync_hv(lab: &Lab) {
    run(
        "ovn-nbctl",
        &[
            &format!("--db={}", lab.nb()),
            "--timeout=900",
            "--wait=hv",
            "sync",
        ],
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bound_share_is_spread_over_both_nodes() {
        for (n, want) in [(10_000, 500), (1000, 50), (1000, 1000), (1000, 333), (7, 3)] {
            let b = bound_indices(n, want);
            assert_eq!(b.len(), want, "{n} {want}");
            assert!(
                b.windows(2).all(|w| w[0] < w[1]),
                "{n} {want}: unique, in order"
            );
            assert!(b.iter().all(|&i| i < n));
            let on_a = b
                .iter()
                .filter(|&&i| scale_port(i).node == "node-a")
                .count();
            assert!(
                on_a.abs_diff(want - on_a) <= 1,
                "{n} {want}: {on_a} on node-a"
            );
        }
        assert!(bound_indices(10, 0).is_empty());
    }
}
