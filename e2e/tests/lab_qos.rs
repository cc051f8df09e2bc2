//! RFC 4594 DSCP on the wire: the reconciler marks a port's traffic with an OVN QoS row, and
//! tcpdump sees it. `lowlatency` (AF23, DSCP 22) leaves as TOS 0x58 and `bulk` (AF13, DSCP
//! 14) as TOS 0x38, both inside the receiving namespace and on the geneve underlay between
//! the nodes (the lab sets `ovn-encap-tos=inherit`, so the outer header carries it too).

use std::net::Ipv4Addr;
use std::time::Duration;

use roam_e2e::{
    Lab, LabNetwork, PortBuilder, Tcpdump, TestNetns, icmp_microflow, overlay_fixture, ovn_trace,
    plug_netns, reconcile_on_lab, run, wait_until,
};
use roam_network::topology::{PortSpec, plan_overlay};

const NET: &str = "e2e-qos";
const GW: &str = "100.102.0.1";

fn port(i: u8, node: &str, class: &str) -> PortSpec {
    PortBuilder::new(format!("q{i}"), Ipv4Addr::new(100, 102, 1, i), node)
        .marking(class)
        .build()
}

const OVS_PORTS: [(&str, &str); 2] = [("node-a", "e2eqos-a1"), ("node-b", "e2eqos-b2")];

/// tcpdump for `count` ICMP echo requests (or the Geneve packets carrying them), at most 30 s.
fn capture(netns: &str, dev: &str, count: usize) -> Tcpdump {
    let count = count.to_string();
    Tcpdump::start(
        netns,
        dev,
        30,
        &[
            "-v",
            "-c",
            &count,
            "icmp[icmptype] == icmp-echo or (udp and port 6081)",
        ],
    )
}

#[test]
fn lowlatency_and_bulk_leave_with_their_dscp() {
    let lab = Lab::get();
    let network = LabNetwork::new(&lab, NET, &OVS_PORTS);
    let (spec, nodes) = overlay_fixture(NET, 102);
    let ports = [port(1, "node-a", "lowlatency"), port(2, "node-b", "bulk")];
    reconcile_on_lab(
        &lab,
        NET,
        &plan_overlay(&spec, &nodes, &ports).expect("plan"),
    );
    let qos = run(
        "ovn-nbctl",
        &[&format!("--db={}", lab.nb()), "qos-list", "e2e-qos-node-a"],
    );
    assert!(qos.contains("dscp=22"), "{qos}");
    // ovn-trace: the switch's QoS stage sets the port's DSCP
    for (i, (p, dscp)) in [(&ports[0], 22), (&ports[1], 14)].into_iter().enumerate() {
        let node = &p.node;
        let other = &ports[1 - i];
        let flow = icmp_microflow(
            &format!("{}.{node}", p.name),
            &p.mac.to_string(),
            &spec.gateway_mac.to_string(),
            &p.ip.to_string(),
            &other.ip.to_string(),
        );
        let trace = ovn_trace(&lab, &format!("{NET}-{node}"), &flow, &[]);
        let mark = trace
            .lines()
            .find(|l| l.contains("ip.dscp ="))
            .unwrap_or_else(|| panic!("no DSCP marking in ovn-trace:\n{trace}"));
        assert_eq!(mark.trim(), format!("ip.dscp = {dscp};"), "{trace}");
        // the stage is ls_in_qos_mark up to OVN 23.x, ls_in_qos after
        assert!(trace.contains("ls_in_qos"), "{trace}");
    }

    let a = TestNetns::new("qos-a");
    let b = TestNetns::new("qos-b");
    plug_netns(
        &lab.node("node-a"),
        &a,
        OVS_PORTS[0].1,
        "q1.node-a",
        &ports[0].mac.to_string(),
        "100.102.1.1",
        GW,
    );
    plug_netns(
        &lab.node("node-b"),
        &b,
        OVS_PORTS[1].1,
        "q2.node-b",
        &ports[1].mac.to_string(),
        "100.102.1.2",
        GW,
    );
    run(
        "ovn-nbctl",
        &[&format!("--db={}", lab.nb()), "--wait=hv", "sync"],
    );
    wait_until(
        Duration::from_secs(60),
        "node-a's namespace to reach node-b's",
        || a.ping_once("100.102.1.2").then_some(()),
    );

    // a -> b: lowlatency, seen inside b and as the outer header on the geneve underlay
    let inner = capture(&b.name, OVS_PORTS[1].1, 2);
    let outer = capture(&lab.node("node-a").netns, "gnv0", 2);
    a.run("ping", &["-n", "-c", "2", "-W", "2", "100.102.1.2"]);
    let (inner, outer) = (inner.finish(), outer.finish());
    assert!(
        inner.contains("tos 0x58"),
        "DSCP 22 inside node-b's namespace:\n{inner}"
    );
    assert!(
        outer.contains("tos 0x58"),
        "DSCP 22 on the geneve underlay (outer header):\n{outer}"
    );

    // b -> a: bulk
    let inner = capture(&a.name, OVS_PORTS[0].1, 2);
    b.run("ping", &["-n", "-c", "2", "-W", "2", "100.102.1.1"]);
    let inner = inner.finish();
    assert!(
        inner.contains("tos 0x38"),
        "DSCP 14 inside node-a's namespace:\n{inner}"
    );
    drop(network);
}
