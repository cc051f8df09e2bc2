//! The fast route flip on the lab's real OVN: an address moves from node-b to node-a with one
//! small transaction that also marks the change (`nb_cfg`); once every chassis reports that
//! mark (`hv_cfg`) the traffic goes to node-a at the first try; a second flip is a no-op, the plan with the address
//! on node-a then reconciles to nothing (the fast path and the planner agree), and a flip of an
//! address the network does not route changes nothing.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use roam_e2e::{
    Lab, LabNetwork, PortBuilder, TestNetns, icmp_microflow, overlay_fixture, ovn_trace,
    plug_netns, reconcile_on_lab, trace_outputs, wait_until,
};
use roam_network::Error;
use roam_network::northbound::{flip_route, flip_route_marked, wait_for_chassis};
use roam_network::topology::{Flip, PortSpec, plan_overlay};
use roam_ovsdb::Client;

const NET: &str = "e2e-flip";
const OCTET: u8 = 103;

fn port(i: u8, node: &str, also_on: &[&str]) -> PortSpec {
    PortBuilder::new(format!("f{i}"), Ipv4Addr::new(100, OCTET, 1, i), node)
        .also_on(also_on)
        .build()
}

#[test]
fn a_fast_flip_moves_the_route_and_agrees_with_the_plan() {
    let lab = Lab::get();
    let ovs_ports = [
        ("node-a", "e2eflip-a1"),
        ("node-b", "e2eflip-b2"),
        ("node-a", "e2eflip-a2"),
    ];
    let network = LabNetwork::new(&lab, NET, &ovs_ports);
    let (spec, nodes) = overlay_fixture(NET, OCTET);
    let gw = spec.gateway.to_string();
    // f2 lives on node-b; its migration target port on node-a exists already
    let before = [port(1, "node-a", &[]), port(2, "node-b", &["node-a"])];
    reconcile_on_lab(
        &lab,
        NET,
        &plan_overlay(&spec, &nodes, &before).expect("plan"),
    );

    let probe = TestNetns::new("flip-probe");
    plug_netns(
        &lab.node("node-a"),
        &probe,
        ovs_ports[0].1,
        "f1.node-a",
        &before[0].mac.to_string(),
        "100.103.1.1",
        &gw,
    );
    let old = TestNetns::new("flip-old");
    plug_netns(
        &lab.node("node-b"),
        &old,
        ovs_ports[1].1,
        "f2.node-b",
        &before[1].mac.to_string(),
        "100.103.1.2",
        &gw,
    );
    wait_until(
        Duration::from_secs(60),
        "the probe to reach f2 on node-b",
        || probe.ping_once("100.103.1.2").then_some(()),
    );

    // the workload moves: gone from node-b, up on node-a's target port
    drop(old);
    let new = TestNetns::new("flip-new");
    plug_netns(
        &lab.node("node-a"),
        &new,
        ovs_ports[2].1,
        "f2.node-a",
        &before[1].mac.to_string(),
        "100.103.1.2",
        &gw,
    );
    assert!(
        !probe.ping_once("100.103.1.2"),
        "before the flip the route still points at node-b"
    );

    // ovn-trace before the flip: the probe's packet to f2 ends at f2's port on node-b
    let to_f2 = icmp_microflow(
        "f1.node-a",
        &before[0].mac.to_string(),
        &spec.gateway_mac.to_string(),
        "100.103.1.1",
        "100.103.1.2",
    );
    let trace = ovn_trace(&lab, &format!("{NET}-node-a"), &to_f2, &[]);
    let outs = trace_outputs(&trace);
    println!("before the flip: {outs:?}");
    assert_eq!(
        outs.last().map(String::as_str),
        Some("f2.node-b"),
        "{trace}"
    );
    assert!(outs.contains(&format!("{NET}-fabric-join")), "{outs:?}");

    let rt = tokio::runtime::Runtime::new().unwrap();
    let client = rt
        .block_on(Client::connect(lab.nb()))
        .expect("connect to NB");
    // f2: node-b → node-a
    let flip_f2 = || {
        rt.block_on(flip_route_marked(
            &client,
            NET,
            before[1].ip,
            &nodes[1],
            &nodes[0],
        ))
    };
    let t0 = Instant::now();
    let (flip, mark) = flip_f2().expect("flip");
    let committed = t0.elapsed();
    assert_eq!(flip, Flip::Moved);
    let mark = mark.expect("a moved flip marks its change");
    let synced = rt
        .block_on(wait_for_chassis(&client, mark, Duration::from_secs(60)))
        .expect("every chassis reports the flip");
    println!(
        "fast flip committed in {:.1} ms, on every chassis {:.1} ms later (nb_cfg {mark})",
        committed.as_secs_f64() * 1000.0,
        synced.as_secs_f64() * 1000.0
    );
    // once every chassis reports it, the flip is in the data plane: the first ping answers
    assert!(
        probe.ping_once("100.103.1.2"),
        "no answer from f2 on node-a although every chassis reported the flip"
    );
    // a change nobody made yet is never reported: a clear error at the deadline
    let err = rt
        .block_on(wait_for_chassis(
            &client,
            mark + 1_000_000,
            Duration::from_millis(200),
        ))
        .expect_err("a change that was not made");
    assert!(matches!(err, Error::NotSynced { .. }), "{err}");
    assert!(
        err.to_string().contains("a chassis is down or slow"),
        "{err}"
    );
    // ovn-trace after the flip: node-a's router delivers locally to f2.node-a, no fabric
    let trace = ovn_trace(&lab, &format!("{NET}-node-a"), &to_f2, &[]);
    let outs = trace_outputs(&trace);
    println!("after the flip: {outs:?}");
    assert_eq!(
        outs.last().map(String::as_str),
        Some("f2.node-a"),
        "{trace}"
    );
    assert!(!outs.iter().any(|o| o.contains("fabric")), "{outs:?}");
    assert!(!outs.iter().any(|o| o == "f2.node-b"), "{outs:?}");
    wait_until(
        Duration::from_secs(60),
        "traffic to follow the flip to node-a",
        || probe.ping_once("100.103.1.2").then_some(()),
    );

    // idempotent, and consistent with the planner
    let again = flip_f2().expect("flip again");
    assert_eq!(again, (Flip::AlreadyThere, None));
    let after = [port(1, "node-a", &[]), port(2, "node-a", &["node-b"])];
    let report = reconcile_on_lab(
        &lab,
        NET,
        &plan_overlay(&spec, &nodes, &after).expect("plan"),
    );
    assert!(
        report.is_empty(),
        "the plan with f2 on node-a needs no change after the flip: {report}"
    );

    // an address the network does not route: an error, and nothing changes
    let report_before = reconcile_on_lab(&lab, NET, &plan_overlay(&spec, &nodes, &after).unwrap());
    assert!(report_before.is_empty());
    let err = rt
        .block_on(flip_route(
            &client,
            NET,
            "100.103.9.9".parse().unwrap(),
            &nodes[0],
            &nodes[1],
        ))
        .expect_err("no such route");
    assert!(matches!(err, Error::InvalidTopology { .. }), "{err}");
    // moving an address "from" a node it is not on is refused (f1 lives on node-a)
    let mut elsewhere = nodes[1].clone();
    elsewhere.name = "node-c".into();
    elsewhere.join_ip = std::net::Ipv4Addr::new(169, 254, OCTET, 13);
    let err = rt
        .block_on(flip_route(
            &client,
            NET,
            before[0].ip,
            &elsewhere,
            &nodes[1],
        ))
        .expect_err("f1 is not on node-c");
    assert!(err.to_string().contains("refusing"), "{err}");
    let report = reconcile_on_lab(&lab, NET, &plan_overlay(&spec, &nodes, &after).unwrap());
    assert!(
        report.is_empty(),
        "the refused flips changed nothing: {report}"
    );
    drop(network);
}
