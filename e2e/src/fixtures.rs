//! Test objects: overlay networks, logical ports (a `PortSpec` builder) and the clean-up
//! guard of a test's VMs.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::Duration;

use roam_dhcp_opts::MacAddr;
use roam_network::topology::PortSpec;

use crate::lab::{Lab, try_kubectl, try_run};

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

/// A logical port for a planned topology: [`PortBuilder::new`] gives the common case (no
/// DHCP, no marking, on one node, the MAC `0a:58:` followed by the IP's four bytes) and the
/// methods change one field each.
#[derive(Clone, Debug)]
pub struct PortBuilder(PortSpec);

impl PortBuilder {
    /// Port `name` with address `ip` on `node`.
    pub fn new(name: impl Into<String>, ip: Ipv4Addr, node: &str) -> PortBuilder {
        let [a, b, c, d] = ip.octets();
        PortBuilder(PortSpec {
            name: name.into(),
            mac: MacAddr::new([0x0a, 0x58, a, b, c, d]),
            ip,
            node: node.into(),
            also_on: vec![],
            dhcp: false,
            marking: None,
            mobile: false,
        })
    }

    /// Another MAC than the one derived from the IP.
    pub fn mac(mut self, mac: MacAddr) -> PortBuilder {
        self.0.mac = mac;
        self
    }

    /// Whether OVN answers DHCP for it.
    pub fn dhcp(mut self, dhcp: bool) -> PortBuilder {
        self.0.dhcp = dhcp;
        self
    }

    /// Further nodes that get a port for it (a migration's target).
    pub fn also_on(mut self, nodes: &[&str]) -> PortBuilder {
        self.0.also_on = nodes.iter().map(|n| n.to_string()).collect();
        self
    }

    /// DSCP marking of service class `class` (e.g. `lowlatency`); panics on an unknown one.
    pub fn marking(mut self, class: &str) -> PortBuilder {
        self.0.marking = Some(
            class
                .parse()
                .unwrap_or_else(|e| panic!("service class {class}: {e}")),
        );
        self
    }

    /// The port.
    pub fn build(self) -> PortSpec {
        self.0
    }
}

/// Delete namespace `ns` and all in it, waiting until it is gone. The migrations'
/// finalizers are dropped first: no controller may be running to honour them.
pub fn delete_namespace(lab: &Lab, ns: &str) {
    if try_kubectl(lab, &["get", "namespace", ns]).is_err() {
        return;
    }
    for m in items(lab, ns, "vmim") {
        drop_finalizers(lab, ns, "vmim", &m);
    }
    let _ = try_kubectl(
        lab,
        &["-n", ns, "delete", "vm,vmim,pods", "--all", "--wait=false"],
    );
    release_vms(lab, ns);
    let _ = try_kubectl(
        lab,
        &["delete", "namespace", ns, "--wait=true", "--timeout=120s"],
    );
}

/// The objects of `kind` in namespace `ns` (none when kubectl cannot list them).
fn items(lab: &Lab, ns: &str, kind: &str) -> Vec<serde_json::Value> {
    try_kubectl(lab, &["-n", ns, "get", kind, "-o", "json"])
        .ok()
        .and_then(|s| serde_json::from_str::<serde_json::Value>(&s).ok())
        .and_then(|l| l["items"].as_array().cloned())
        .unwrap_or_default()
}

/// Take every finalizer off `obj` (of `kind`, in `ns`), for a clean-up no controller serves.
fn drop_finalizers(lab: &Lab, ns: &str, kind: &str, obj: &serde_json::Value) {
    let name = obj["metadata"]["name"].as_str().unwrap_or_default();
    let _ = try_kubectl(
        lab,
        &[
            "-n",
            ns,
            "patch",
            kind,
            name,
            "--type=merge",
            "-p",
            r#"{"metadata":{"finalizers":null}}"#,
        ],
    );
}

/// The deleted VMs of `ns`, once a controller has torn them down (finalizer
/// `roam.dev/teardown`). A VM that no controller tears down — the test's own controller is
/// gone already — shows no `Deleting` condition within 10 s: its finalizer is taken off, so
/// that the namespace can go (the caller cleans the nodes itself).
fn release_vms(lab: &Lab, ns: &str) {
    let started = std::time::Instant::now();
    loop {
        let items = items(lab, ns, "vm");
        if items.is_empty() {
            return;
        }
        let waited = started.elapsed();
        for v in &items {
            let tearing_down = v["status"]["conditions"]
                .as_array()
                .is_some_and(|cs| cs.iter().any(|c| c["reason"] == "Deleting"));
            if waited > Duration::from_secs(120)
                || (!tearing_down && waited > Duration::from_secs(10))
            {
                drop_finalizers(lab, ns, "vm", v);
            }
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// What a test's VMs leave behind, removed by [`VmCleanup::clean`], on drop, and (with
/// [`VmCleanup::cleaned`]) before the test starts, for a killed run's leftovers. In this
/// order: the Kubernetes side (a namespace with its VMs, migrations and pods; Networks
/// with their Addresses; further kubectl deletions), then on node-a and node-b each VM's
/// libvirt domain and taps (with their OVS ports) and further OVS ports, then files and
/// directories (logs, state files). Every step is best effort.
#[derive(Debug)]
pub struct VmCleanup {
    lab: Lab,
    namespace: Option<String>,
    networks: Vec<String>,
    kubectl: Vec<Vec<String>>,
    domains: Vec<String>,
    taps: Vec<String>,
    ovs_ports: Vec<String>,
    paths: Vec<PathBuf>,
}

impl VmCleanup {
    /// A guard with nothing in its charge yet.
    pub fn new(lab: &Lab) -> VmCleanup {
        VmCleanup {
            lab: lab.clone(),
            namespace: None,
            networks: vec![],
            kubectl: vec![],
            domains: vec![],
            taps: vec![],
            ovs_ports: vec![],
            paths: vec![],
        }
    }

    /// Namespace `ns` and everything in it ([`delete_namespace`]).
    pub fn namespace(mut self, ns: &str) -> VmCleanup {
        self.namespace = Some(ns.into());
        self
    }

    /// roam Network `name` and its Addresses.
    pub fn network(mut self, name: &str) -> VmCleanup {
        self.networks.push(name.into());
        self
    }

    /// A kubectl command that deletes something (e.g. one VM), run before the nodes' part.
    pub fn kubectl(mut self, args: &[&str]) -> VmCleanup {
        self.kubectl
            .push(args.iter().map(|a| a.to_string()).collect());
        self
    }

    /// A VM: its libvirt domain `domain` and its `taps` on both nodes.
    pub fn vm(mut self, domain: &str, taps: &[&str]) -> VmCleanup {
        self.domains.push(domain.into());
        self.taps.extend(taps.iter().map(|t| t.to_string()));
        self
    }

    /// An OVS port on both nodes' `br-int` (a probe's, whose device went elsewhere).
    pub fn ovs_port(mut self, port: &str) -> VmCleanup {
        self.ovs_ports.push(port.into());
        self
    }

    /// A file or directory (removed with what is in it).
    pub fn path(mut self, path: impl Into<PathBuf>) -> VmCleanup {
        self.paths.push(path.into());
        self
    }

    /// Also remove `path` from every node's own disk (e.g. a VM log directory).
    pub fn node_path(self, path: &str) -> VmCleanup {
        let lab = self.lab.clone();
        lab.nodes()
            .iter()
            .fold(self, |c, node| c.path(lab.node_path(node, path)))
    }

    /// [`VmCleanup::clean`] now (a killed run's leftovers), then the guard.
    pub fn cleaned(self) -> VmCleanup {
        self.clean();
        self
    }

    /// Remove everything in its charge.
    pub fn clean(&self) {
        let lab = &self.lab;
        if let Some(ns) = &self.namespace {
            delete_namespace(lab, ns);
        }
        for net in &self.networks {
            let _ = try_kubectl(lab, &["delete", "network", net, "--ignore-not-found"]);
            let label = format!("roam.dev/network={net}");
            let _ = try_kubectl(lab, &["delete", "addresses", "-l", &label]);
        }
        for args in &self.kubectl {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let _ = try_kubectl(lab, &args);
        }
        for n in lab.nodes() {
            let node = lab.node(&n);
            for d in &self.domains {
                node.destroy_domain(lab, d);
            }
            for t in &self.taps {
                node.remove_port(t);
            }
            let db = format!("--db={}", node.ovs_db);
            for p in &self.ovs_ports {
                let _ = try_run("ovs-vsctl", &[&db, "--if-exists", "del-port", "br-int", p]);
            }
        }
        for p in &self.paths {
            if p.is_dir() {
                let _ = std::fs::remove_dir_all(p);
            } else {
                let _ = std::fs::remove_file(p);
            }
        }
    }
}

impl Drop for VmCleanup {
    fn drop(&mut self) {
        self.clean();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_defaults_to_a_mac_from_its_ip_and_no_dhcp() {
        let p = PortBuilder::new("p1", Ipv4Addr::new(100, 100, 1, 11), "node-a").build();
        assert_eq!(p.mac, MacAddr::new([0x0a, 0x58, 100, 100, 1, 11]));
        assert_eq!(p.node, "node-a");
        assert!(p.also_on.is_empty() && !p.dhcp && p.marking.is_none());
    }

    #[test]
    fn each_builder_method_sets_its_field() {
        let mac = MacAddr::new([0x52, 0x54, 0, 1, 2, 3]);
        let p = PortBuilder::new("vm", Ipv4Addr::new(10, 0, 0, 2), "node-a")
            .mac(mac)
            .dhcp(true)
            .also_on(&["node-b"])
            .marking("lowlatency")
            .build();
        assert_eq!(p.mac, mac);
        assert!(p.dhcp);
        assert_eq!(p.also_on, vec!["node-b".to_string()]);
        assert_eq!(p.marking, Some("lowlatency".parse().unwrap()));
    }
}
