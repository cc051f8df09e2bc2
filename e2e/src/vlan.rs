//! VLAN wiring on the lab: physical network mappings and a ToR namespace joined to both
//! nodes by a veth wire.

use std::path::PathBuf;
use std::time::Duration;

use crate::lab::{Lab, Node, run, try_run, wait_until};
use crate::netns::TestNetns;
use crate::ovn::vsctl;

/// The physical network mapping `physnet:bridge` added to a node's
/// `external_ids:ovn-bridge-mappings` (keeping every other entry), removed again on drop.
/// The read-modify-write of that one string is serialized across test processes with
/// `flock` on a file in the lab directory, so parallel tests mapping different physical
/// networks never lose each other's entries. The bridge is deleted on drop too.
pub struct BridgeMapping {
    node: Node,
    lock: PathBuf,
    entry: String,
    bridge: String,
}

impl BridgeMapping {
    /// Create `bridge` (userspace datapath) on `node` if missing and map `physnet` to it.
    pub fn add(lab: &Lab, node: &Node, physnet: &str, bridge: &str) -> BridgeMapping {
        vsctl(
            node,
            &[
                "--may-exist",
                "add-br",
                bridge,
                "--",
                "set",
                "bridge",
                bridge,
                "datapath_type=netdev",
            ],
        );
        let m = BridgeMapping {
            node: node.clone(),
            lock: lab.dir().join("bridge-mappings.lock"),
            entry: format!("{physnet}:{bridge}"),
            bridge: bridge.to_string(),
        };
        m.edit(true);
        m
    }

    /// Rewrite the mapping list without any entry for this physical network, plus ours if
    /// `add`.
    fn edit(&self, add: bool) {
        let physnet = self.entry.split(':').next().unwrap_or_default();
        let script = format!(
            "set -e; db='--db={db}'; \
             cur=$(ovs-vsctl $db --if-exists get open . external_ids:ovn-bridge-mappings | tr -d '\"'); \
             new=$(echo \"$cur\" | tr ',' '\\n' | grep -v '^{physnet}:' | grep -v '^$' | paste -sd, -); \
             if [ {add} = 1 ]; then new=\"${{new:+$new,}}{entry}\"; fi; \
             if [ -n \"$new\" ]; then ovs-vsctl $db set open . external_ids:ovn-bridge-mappings=\"\\\"$new\\\"\"; \
             else ovs-vsctl $db remove open . external_ids ovn-bridge-mappings; fi",
            db = self.node.ovs_db,
            add = u8::from(add),
            entry = self.entry,
        );
        let lock = self.lock.to_string_lossy().into_owned();
        let res = try_run("flock", &[&lock, "sh", "-c", &script]);
        if add {
            res.unwrap_or_else(|e| panic!("map {} on {}: {e}", self.entry, self.node.name));
        } else if let Err(e) = res {
            eprintln!("unmap {} on {}: {e}", self.entry, self.node.name);
        }
    }

    /// The node's current mapping list.
    pub fn current(node: &Node) -> String {
        let db = format!("--db={}", node.ovs_db);
        try_run(
            "ovs-vsctl",
            &[
                &db,
                "--if-exists",
                "get",
                "open",
                ".",
                "external_ids:ovn-bridge-mappings",
            ],
        )
        .unwrap_or_default()
        .trim()
        .trim_matches('"')
        .to_string()
    }
}

impl Drop for BridgeMapping {
    fn drop(&mut self) {
        self.edit(false);
        let db = format!("--db={}", self.node.ovs_db);
        let _ = try_run("ovs-vsctl", &[&db, "--if-exists", "del-br", &self.bridge]);
    }
}

/// A VLAN wire with a ToR for lab tests: physical network `physnet` mapped to `bridge` on
/// both nodes ([`BridgeMapping`]), the two bridges joined by a veth pair (`wire`: node-a's
/// end, node-b's end), and a ToR namespace (`TestNetns`) holding one access port per VLAN —
/// an internal port of node-b's bridge tagged with the VLAN, moved into the namespace and
/// given its address. What a leftover of a killed run left is removed first; everything is
/// removed on drop.
pub struct VlanTor {
    /// The ToR's namespace (its access ports are named as given to [`VlanTor::new`]).
    pub tor: TestNetns,
    lab: Lab,
    bridge: String,
    wire: (String, String),
    ports: Vec<String>,
    _mappings: Vec<BridgeMapping>,
}

impl VlanTor {
    /// Set it up; `vlans` lists (access port name ≤ 15 characters, VLAN tag, the ToR's
    /// `address/len` on it).
    pub fn new(
        lab: &Lab,
        physnet: &str,
        bridge: &str,
        wire: (&str, &str),
        tor_suffix: &str,
        vlans: &[(&str, u16, &str)],
    ) -> VlanTor {
        let (a, b) = (lab.node("node-a"), lab.node("node-b"));
        let ports: Vec<String> = vlans.iter().map(|(p, _, _)| p.to_string()).collect();
        Self::remove(lab, bridge, (wire.0, wire.1), &ports);
        let mappings = vec![
            BridgeMapping::add(lab, &a, physnet, bridge),
            BridgeMapping::add(lab, &b, physnet, bridge),
        ];
        run(
            "ip",
            &[
                "link", "add", wire.0, "netns", &a.netns, "type", "veth", "peer", "name", wire.1,
                "netns", &b.netns,
            ],
        );
        for (node, end) in [(&a, wire.0), (&b, wire.1)] {
            run("ip", &["-n", &node.netns, "link", "set", end, "up"]);
            vsctl(node, &["--may-exist", "add-port", bridge, end]);
        }
        let tor = TestNetns::new(tor_suffix);
        for (port, tag, addr) in vlans {
            vsctl(
                &b,
                &[
                    "--may-exist",
                    "add-port",
                    bridge,
                    port,
                    &format!("tag={tag}"),
                    "--",
                    "set",
                    "interface",
                    port,
                    "type=internal",
                ],
            );
            wait_until(Duration::from_secs(20), "the ToR port to appear", || {
                try_run("ip", &["-n", &b.netns, "link", "show", port]).ok()
            });
            run(
                "ip",
                &["-n", &b.netns, "link", "set", port, "netns", &tor.name],
            );
            tor.run("ip", &["addr", "add", addr, "dev", port]);
            tor.run("ip", &["link", "set", port, "up"]);
        }
        VlanTor {
            tor,
            lab: lab.clone(),
            bridge: bridge.into(),
            wire: (wire.0.into(), wire.1.into()),
            ports,
            _mappings: mappings,
        }
    }

    fn remove(lab: &Lab, bridge: &str, wire: (&str, &str), ports: &[String]) {
        let (a, b) = (lab.node("node-a"), lab.node("node-b"));
        let db = format!("--db={}", b.ovs_db);
        for p in ports {
            let _ = try_run("ovs-vsctl", &[&db, "--if-exists", "del-port", bridge, p]);
        }
        let _ = try_run("ip", &["-n", &a.netns, "link", "del", wire.0]);
        let _ = try_run("ip", &["-n", &b.netns, "link", "del", wire.1]);
    }
}

impl Drop for VlanTor {
    fn drop(&mut self) {
        // the ports and the wire here; the namespace and the bridges (mappings) as fields
        Self::remove(
            &self.lab,
            &self.bridge,
            (&self.wire.0, &self.wire.1),
            &self.ports,
        );
    }
}
