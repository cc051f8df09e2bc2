//! Overlay egress through the per-VLAN gateway router with SNAT,
//! on the lab's real OVN: a workload on node-a's overlay segment reaches a "ToR" host on VLAN
//! 300, whose gateway router runs on node-b; the ToR sees the router's VLAN address as the
//! source, never the overlay address; `ovn-trace` shows `ct_snat` to that address and the
//! packet leaving through the localnet port. A second reconcile sends nothing, a foreign NAT
//! row on the router survives it, and bad egress input is a plan error that leaves NB as it
//! was.
//!
//! Network `h4snat` (overlay fixture octet 120: 100.120.0.0/16), VLAN 300, subnet
//! 198.51.100.0/24 (ToR .1, router .5), physical network `h4vlan300` on bridge `br-h4egr`
//! (node-b only), OVS ports `h4egr-*`, namespaces `roam-t-h4egr-*`.

use std::time::Duration;

use roam_dhcp_opts::MacAddr;
use roam_e2e::{
    BridgeMapping, Lab, LabNetwork, PortBuilder, TestNetns, capture, nbctl, overlay_fixture,
    ovn_trace, plug_netns, reconcile_on_lab, run, trace_outputs, try_run, vsctl, wait_until,
};
use roam_network::northbound::read_actual;
use roam_network::topology::{
    EgressSpec, OverlayExtras, PlanError, PortSpec, egress_router_name, plan_overlay_with,
};
use roam_ovsdb::Client;

const NET: &str = "h4snat";
const OCTET: u8 = 120;
const VLAN: u16 = 300;
const PHYSNET: &str = "h4vlan300";
const BRIDGE: &str = "br-h4egr";
/// The ToR's access port on node-b's bridge.
const TOR: &str = "h4egr-tor";
const TOR_IP: &str = "198.51.100.1";
const ROUTER_IP: &str = "198.51.100.5";
/// The workload's OVS internal port on node-a's br-int.
const WORKLOAD: &str = "h4egr-a1";
const WORKLOAD_IP: &str = "100.120.1.1";
const WAIT: Duration = Duration::from_secs(90);

fn egress() -> EgressSpec {
    EgressSpec {
        vlan: VLAN,
        physnet: PHYSNET.into(),
        subnet: "198.51.100.0/24".parse().unwrap(),
        gateway: TOR_IP.parse().unwrap(),
        router_ip: ROUTER_IP.parse().unwrap(),
        router_mac: MacAddr::new([0x0a, 0, 0, 0xe2, OCTET, 0x05]),
        join_ip: std::net::Ipv4Addr::new(169, 254, OCTET, 2),
        join_mac: MacAddr::new([0x0a, 0, 0, 0xe2, OCTET, 0x02]),
        chassis: "node-b".into(),
    }
}

fn workload() -> PortSpec {
    PortBuilder::new("h4e1", WORKLOAD_IP.parse().unwrap(), "node-a").build()
}

fn extras(e: EgressSpec) -> OverlayExtras {
    OverlayExtras {
        egress: Some(e),
        mgmt: vec![],
    }
}

/// The ToR's port, deleted on drop (before the bridge goes with the mapping guard).
struct TorPort(roam_e2e::Node);

impl Drop for TorPort {
    fn drop(&mut self) {
        let db = format!("--db={}", self.0.ovs_db);
        let _ = try_run("ovs-vsctl", &[&db, "--if-exists", "del-port", BRIDGE, TOR]);
    }
}

#[test]
fn overlay_egress_is_snatted_to_the_routers_vlan_address() {
    let lab = Lab::get();
    let (a, b) = (lab.node("node-a"), lab.node("node-b"));
    let network = LabNetwork::new(&lab, NET, &[("node-a", WORKLOAD)]);
    let (spec, nodes) = overlay_fixture(NET, OCTET);
    let gr = egress_router_name(NET, VLAN);

    // --- NB: the gateway router with its SNAT row lands; a second reconcile sends nothing ---
    let t = plan_overlay_with(&spec, &nodes, &[workload()], &extras(egress())).expect("plan");
    let r = reconcile_on_lab(&lab, NET, &t);
    println!("first reconcile: {r}");
    assert_eq!(r.table("NAT").inserted, 1);
    assert!(reconcile_on_lab(&lab, NET, &t).is_empty(), "idempotent");
    let nat = nbctl(&lab, &["lr-nat-list", &gr]);
    println!("{nat}");
    let row: Vec<&str> = nat
        .lines()
        .find(|l| l.starts_with("snat"))
        .unwrap_or_else(|| panic!("no snat row: {nat}"))
        .split_whitespace()
        .collect();
    assert_eq!(row, ["snat", ROUTER_IP, "100.120.0.0/16"]);
    let chassis = nbctl(&lab, &["get", "Logical_Router", &gr, "options:chassis"]);
    assert_eq!(chassis.trim().trim_matches('"'), "node-b");
    let routes = nbctl(&lab, &["lr-route-list", &gr]);
    assert!(
        routes.contains("0.0.0.0/0") && routes.contains(TOR_IP),
        "{routes}"
    );

    // a foreign NAT row on our router (no owner key) survives a reconcile
    nbctl(
        &lab,
        &[
            "lr-nat-add",
            &gr,
            "snat",
            "198.51.100.77",
            "100.120.200.0/24",
        ],
    );
    assert!(reconcile_on_lab(&lab, NET, &t).is_empty());
    assert!(nbctl(&lab, &["lr-nat-list", &gr]).contains("198.51.100.77"));
    nbctl(&lab, &["lr-nat-del", &gr, "snat", "100.120.200.0/24"]);

    // --- ovn-trace, before any traffic: the packet reaches the gateway router, which has
    // no MAC binding for the ToR yet and ARPs for it out of the localnet port ---
    let flow = format!(
        "inport==\"h4e1.node-a\" && eth.src=={} && eth.dst=={} && ip4.src=={WORKLOAD_IP} && \
         ip4.dst=={TOR_IP} && ip.ttl==64 && icmp4.type==8 && icmp4.code==0",
        workload().mac,
        spec.gateway_mac
    );
    let trace = ovn_trace(&lab, &format!("{NET}-node-a"), &flow, &["--ct=new"]);
    assert!(
        trace.contains(&format!("ingress(dp=\"{gr}\", inport=\"{gr}-join\")")),
        "the fabric hands egress to the gateway router:\n{trace}"
    );
    assert!(
        trace_outputs(&trace).contains(&format!("{NET}-ln")),
        "the ARP for the ToR leaves through the localnet port:\n{trace}"
    );

    // --- the datapath: ToR on VLAN 300 behind node-b's bridge, workload on node-a ---
    let _mapping = BridgeMapping::add(&lab, &b, PHYSNET, BRIDGE);
    let tor_port = TorPort(b.clone());
    vsctl(
        &b,
        &[
            "--may-exist",
            "add-port",
            BRIDGE,
            TOR,
            &format!("tag={VLAN}"),
            "--",
            "set",
            "interface",
            TOR,
            "type=internal",
        ],
    );
    wait_until(Duration::from_secs(20), "the ToR port to appear", || {
        try_run("ip", &["-n", &b.netns, "link", "show", TOR]).ok()
    });
    let tor = TestNetns::new("h4egr-tor");
    run(
        "ip",
        &["-n", &b.netns, "link", "set", TOR, "netns", &tor.name],
    );
    tor.run("ip", &["addr", "add", &format!("{TOR_IP}/24"), "dev", TOR]);
    tor.run("ip", &["link", "set", TOR, "up"]);
    // the ToR has no route to the overlay: only SNATed traffic can be answered

    let w = TestNetns::new("h4egr-w1");
    plug_netns(
        &a,
        &w,
        WORKLOAD,
        "h4e1.node-a",
        &workload().mac.to_string(),
        WORKLOAD_IP,
        &spec.gateway.to_string(),
    );
    wait_until(WAIT, "the overlay workload to reach the ToR", || {
        w.ping_once(TOR_IP).then_some(())
    });

    // --- ovn-trace, now that OVN knows the ToR's MAC: ct_snat to the router's address, and
    // out the localnet port ---
    let trace = ovn_trace(&lab, &format!("{NET}-node-a"), &flow, &["--ct=new"]);
    let snat = trace
        .lines()
        .find(|l| l.contains("ct_snat"))
        .unwrap_or_else(|| panic!("no ct_snat in ovn-trace:\n{trace}"));
    assert!(
        snat.contains(&format!("ct_snat({ROUTER_IP})")),
        "{snat}\n{trace}"
    );
    let outs = trace_outputs(&trace);
    assert_eq!(
        outs.last(),
        Some(&format!("{NET}-ln")),
        "the packet leaves through the localnet port: {outs:?}\n{trace}"
    );

    let seen = capture(&tor.name, TOR, 10, &["-c", "6", "icmp"], || {
        let _ = w.try_run("ping", &["-n", "-c", "3", "-i", "0.2", "-W", "1", TOR_IP]);
    });
    println!("at the ToR:\n{seen}");
    let icmp: Vec<&str> = seen.lines().filter(|l| l.contains("ICMP")).collect();
    assert!(
        icmp.iter()
            .any(|l| l.contains(&format!("{ROUTER_IP} > {TOR_IP}: ICMP echo request"))),
        "the ToR sees the router's address as the source: {seen}"
    );
    assert!(
        icmp.iter()
            .any(|l| l.contains(&format!("{TOR_IP} > {ROUTER_IP}: ICMP echo reply"))),
        "{seen}"
    );
    assert!(
        !seen.contains(WORKLOAD_IP),
        "the overlay address leaked onto the VLAN: {seen}"
    );

    // --- bad input: a plan error, NB unchanged ---
    let rt = tokio::runtime::Runtime::new().expect("a tokio runtime");
    let nb = rt
        .block_on(Client::connect(lab.nb()))
        .expect("connect to NB");
    nbctl(&lab, &["--wait=sb", "sync"]);
    let before = rt.block_on(read_actual(&nb, NET)).expect("read owned rows");
    for tag in [0u16, 4095] {
        let mut e = egress();
        e.vlan = tag;
        let err = plan_overlay_with(&spec, &nodes, &[workload()], &extras(e)).unwrap_err();
        assert_eq!(
            err,
            PlanError::BadVlanTag {
                network: NET.into(),
                tag
            }
        );
    }
    let mut e = egress();
    e.router_ip = "203.0.113.5".parse().unwrap();
    let err = plan_overlay_with(&spec, &nodes, &[workload()], &extras(e)).unwrap_err();
    println!("plan error: {err}");
    assert!(
        matches!(err, PlanError::EgressAddressOutsideVlan { .. }),
        "{err}"
    );
    let mut e = egress();
    e.subnet = "100.120.128.0/24".parse().unwrap();
    e.gateway = "100.120.128.1".parse().unwrap();
    e.router_ip = "100.120.128.5".parse().unwrap();
    let err = plan_overlay_with(&spec, &nodes, &[workload()], &extras(e)).unwrap_err();
    println!("plan error: {err}");
    assert!(matches!(err, PlanError::OverlappingSubnets { .. }), "{err}");
    let after = rt.block_on(read_actual(&nb, NET)).expect("read owned rows");
    assert_eq!(before, after, "NB unchanged by refused plans");
    assert!(w.ping_once(TOR_IP) || w.ping_once(TOR_IP));

    drop(w);
    drop(tor);
    drop(tor_port);
    drop(network);
}
