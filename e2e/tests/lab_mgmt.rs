//! A node's management port on the lab's real OVN: the plan gives node-a and node-b a port on
//! their overlay switch; the test applies what [`mgmt_config`] says the node must configure
//! (an OVS internal port on br-int with the port's iface-id and MAC, the /32, the on-link
//! gateway and the overlay subnet through it) in node-a's own network namespace, and node-a's
//! host stack then reaches a workload on node-a and one on node-b. Without the management
//! ports in the plan, the node reaches neither.
//!
//! Network `h4mgmt` (overlay fixture octet 121: 100.121.0.0/16), OVS ports `h4mgmt-*`,
//! namespaces `roam-t-h4mgmt-*`.

use std::net::Ipv4Addr;
use std::time::Duration;

use roam_dhcp_opts::MacAddr;
use roam_e2e::{
    Lab, LabNetwork, Node, PortBuilder, TestNetns, icmp_microflow, overlay_fixture, ovn_trace,
    plug_netns, reconcile_on_lab, run, trace_outputs, try_run, vsctl, wait_until,
};
use roam_network::topology::{
    MgmtConfig, MgmtPort, OverlayExtras, PortSpec, mgmt_config, plan_overlay, plan_overlay_with,
};

const NET: &str = "h4mgmt";
const OCTET: u8 = 121;
/// node-a's management interface (an OVS internal port left in node-a's namespace).
const MGMT_IFACE: &str = "h4mgmt-a";
const WAIT: Duration = Duration::from_secs(90);

fn mgmt(node: &str, last: u8) -> MgmtPort {
    MgmtPort {
        node: node.into(),
        ip: std::net::Ipv4Addr::new(100, OCTET, 0, last),
        mac: MacAddr::new([0x0a, 0, 0, 0xe2, OCTET, last]),
    }
}

fn port(i: u8, node: &str) -> PortSpec {
    PortBuilder::new(format!("h4m{i}"), Ipv4Addr::new(100, OCTET, 1, i), node).build()
}

/// Configure `c` on `node`'s side with `ip` and `ovs-vsctl`, as the node daemon would.
fn apply_on_node(node: &Node, iface: &str, c: &MgmtConfig) {
    vsctl(
        node,
        &[
            "--may-exist",
            "add-port",
            "br-int",
            iface,
            "--",
            "set",
            "interface",
            iface,
            "type=internal",
            &format!("external_ids:iface-id={}", c.iface_id),
        ],
    );
    wait_until(
        Duration::from_secs(20),
        "the management port to appear",
        || try_run("ip", &["-n", &node.netns, "link", "show", iface]).ok(),
    );
    let ip = |args: &[&str]| {
        let mut all = vec!["-n", node.netns.as_str()];
        all.extend_from_slice(args);
        run("ip", &all)
    };
    ip(&["link", "set", iface, "address", &c.mac.to_string()]);
    ip(&["link", "set", iface, "mtu", &c.mtu.to_string()]);
    ip(&["link", "set", iface, "up"]);
    ip(&["addr", "add", &c.address.to_string(), "dev", iface]);
    for r in &c.routes {
        let dst = r.dst.to_string();
        match r.via {
            None => ip(&["route", "add", &dst, "dev", iface, "scope", "link"]),
            Some(via) => ip(&["route", "add", &dst, "via", &via.to_string(), "dev", iface]),
        };
    }
}

fn node_pings(node: &Node, ip: &str) -> bool {
    try_run(
        "ip",
        &[
            "netns",
            "exec",
            &node.netns,
            "ping",
            "-n",
            "-c",
            "1",
            "-W",
            "1",
            ip,
        ],
    )
    .is_ok()
}

#[test]
fn the_node_reaches_workloads_on_both_nodes_through_its_management_port() {
    let lab = Lab::get();
    let (a, b) = (lab.node("node-a"), lab.node("node-b"));
    let network = LabNetwork::new(
        &lab,
        NET,
        &[
            ("node-a", MGMT_IFACE),
            ("node-a", "h4mgmt-w1"),
            ("node-b", "h4mgmt-w2"),
        ],
    );
    let (spec, nodes) = overlay_fixture(NET, OCTET);
    let gw = spec.gateway.to_string();
    let ports = [port(1, "node-a"), port(2, "node-b")];
    let extras = OverlayExtras {
        egress: None,
        mgmt: vec![mgmt("node-a", 11), mgmt("node-b", 12)],
    };

    // first without management ports: the node's interface is not bound to anything
    let bare = plan_overlay(&spec, &nodes, &ports).expect("plan");
    reconcile_on_lab(&lab, NET, &bare);
    let c = mgmt_config(&spec, &extras.mgmt[0]).expect("node-a's side");
    assert_eq!(c.iface_id, "h4mgmt-node-a-mgmt");
    assert_eq!(c.address.to_string(), "100.121.0.11/32");
    apply_on_node(&a, MGMT_IFACE, &c);

    let w1 = TestNetns::new("h4mgmt-w1");
    plug_netns(
        &a,
        &w1,
        "h4mgmt-w1",
        "h4m1.node-a",
        &ports[0].mac.to_string(),
        "100.121.1.1",
        &gw,
    );
    let w2 = TestNetns::new("h4mgmt-w2");
    plug_netns(
        &b,
        &w2,
        "h4mgmt-w2",
        "h4m2.node-b",
        &ports[1].mac.to_string(),
        "100.121.1.2",
        &gw,
    );
    wait_until(WAIT, "w1 to reach w2 (the overlay works)", || {
        w1.ping_once("100.121.1.2").then_some(())
    });
    assert!(
        !node_pings(&a, "100.121.1.1") && !node_pings(&a, "100.121.1.2"),
        "node-a reaches workloads without a management port in the plan"
    );

    // with them: node-a's host stack reaches the workload on node-a and the one on node-b
    let t = plan_overlay_with(&spec, &nodes, &ports, &extras).expect("plan");
    let r = reconcile_on_lab(&lab, NET, &t);
    println!("with management ports: {r}");
    assert!(reconcile_on_lab(&lab, NET, &t).is_empty(), "idempotent");
    // ovn-trace: from node-a's management port, w2 is reached through the fabric and
    // node-b's router; w1 directly through node-a's router
    for (dst, last, via_fabric) in [
        ("100.121.1.2", "h4m2.node-b", true),
        ("100.121.1.1", "h4m1.node-a", false),
    ] {
        let flow = icmp_microflow(
            &c.iface_id,
            &c.mac.to_string(),
            &spec.gateway_mac.to_string(),
            &c.address.addr().to_string(),
            dst,
        );
        let trace = ovn_trace(&lab, &format!("{NET}-node-a"), &flow, &[]);
        let outs = trace_outputs(&trace);
        println!("mgmt -> {dst}: {outs:?}");
        assert_eq!(outs.last().map(String::as_str), Some(last), "{trace}");
        assert_eq!(
            outs.contains(&format!("{NET}-fabric-join")),
            via_fabric,
            "{outs:?}"
        );
    }
    wait_until(WAIT, "node-a to reach w1 on node-a", || {
        node_pings(&a, "100.121.1.1").then_some(())
    });
    wait_until(WAIT, "node-a to reach w2 on node-b", || {
        node_pings(&a, "100.121.1.2").then_some(())
    });
    // and a workload reaches the node (its address is the Address's `gateway`)
    wait_until(
        WAIT,
        "w2 on node-b to reach node-a's management address",
        || w2.ping_once("100.121.0.11").then_some(()),
    );

    drop(w1);
    drop(w2);
    drop(network);
}
