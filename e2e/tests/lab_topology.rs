//! roam's topology reconciler against the lab's real OVN: a planned overlay (per-node switch
//! and anycast-gateway router, transit switch, fabric router, /32 routes, DHCP options, DSCP
//! marking) lands in the NB database in one transaction, a second reconcile sends nothing,
//! test namespaces on node-a and node-b ping each other across geneve through the fabric
//! router, a route flip moves an address to node-a with exactly three route changes and
//! traffic follows it, and bad input (a plan error, a value the schema refuses, a transaction
//! the server rejects) leaves the NB database as it was.
//!
//! Network `e2e-topo`, addresses in 100.100.0.0/16, transit 169.254.77.0/24: nothing here
//! collides with the other lab tests. The two tests share the network, so they take turns.

use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

use roam_contract::keys::OWNER_KEY;
use roam_dhcp_opts::MacAddr;
use roam_e2e::{
    Lab, Node, PortBuilder, TestNetns, icmp_microflow, nbctl, ovn_trace, plug_netns, trace_outputs,
    try_run, vsctl, wait_until_else,
};
use roam_network::Error;
use roam_network::northbound::{apply, read_actual, reconcile};
use roam_network::topology::{
    ActualState, NodeSpec, OverlaySpec, PlanError, PortSpec, QosRule, ReconcileReport, SwitchPort,
    SwitchPortKind, TableCounts, Topology, check, diff, plan_overlay,
};
use roam_ovsdb::{self as ovsdb, Client, Uuid, ops};
use serde_json::{Value, json};

const NET: &str = "e2e-topo";
const GW: &str = "100.100.0.1";
const FOREIGN_LS: &str = "e2e-topo-foreign";
/// OVS internal ports the test plugs (at most 15 characters).
const OVS_PORTS: [&str; 4] = ["e2etopo-a1", "e2etopo-b2", "e2etopo-b3", "e2etopo-a2"];
const WAIT: Duration = Duration::from_secs(90);

/// The two tests reconcile the same network: one at a time.
static LOCK: Mutex<()> = Mutex::new(());

fn spec() -> OverlaySpec {
    OverlaySpec {
        name: NET.into(),
        subnet: "100.100.0.0/16".parse().unwrap(),
        gateway: GW.parse().unwrap(),
        gateway_mac: "0a:00:00:e2:70:01".parse().unwrap(),
        join_subnet: "169.254.77.0/24".parse().unwrap(),
        fabric_ip: "169.254.77.1".parse().unwrap(),
        fabric_mac: "0a:00:00:e2:70:fe".parse().unwrap(),
        mtu: 1400,
        dns: vec![],
    }
}

fn nodes() -> Vec<NodeSpec> {
    [("node-a", 11u8), ("node-b", 12)]
        .into_iter()
        .map(|(name, i)| NodeSpec {
            name: name.into(),
            join_ip: format!("169.254.77.{i}").parse().unwrap(),
            join_mac: MacAddr::new([0x0a, 0, 0, 0xe2, 0x71, i]),
        })
        .collect()
}

/// Port `p<i>` with IP 100.100.1.(10+i).
fn port(i: u8, node: &str) -> PortSpec {
    let p = PortBuilder::new(format!("p{i}"), ip(i).parse().unwrap(), node).dhcp(true);
    if i == 1 { p.marking("lowlatency") } else { p }.build()
}

fn ip(i: u8) -> String {
    format!("100.100.1.{}", 10 + i)
}

fn mac(i: u8) -> String {
    port(i, "node-a").mac.to_string()
}

fn plan(ports: &[PortSpec]) -> Topology {
    let t = plan_overlay(&spec(), &nodes(), ports).expect("a valid plan");
    assert!(check(&t, NET).is_ok(), "{:?}", check(&t, NET));
    t
}

fn owned() -> String {
    format!("external_ids:\"{OWNER_KEY}\"={NET}")
}

/// The lab, a runtime and an NB connection; removes everything the tests create, first and
/// when dropped (also after a failure midway).
struct Env {
    lab: Lab,
    nb: Client,
    rt: tokio::runtime::Runtime,
}

impl Env {
    fn new() -> Env {
        let lab = Lab::get();
        let rt = tokio::runtime::Runtime::new().expect("a tokio runtime");
        let nb = rt
            .block_on(Client::connect(lab.nb()))
            .expect("connect to NB");
        let env = Env { lab, nb, rt };
        env.cleanup();
        env
    }

    fn block<F: Future>(&self, f: F) -> F::Output {
        self.rt.block_on(f)
    }

    fn reconcile(&self, t: &Topology) -> roam_network::Result<ReconcileReport> {
        self.block(reconcile(&self.nb, NET, t))
    }

    fn actual(&self) -> ActualState {
        self.block(read_actual(&self.nb, NET))
            .expect("read the owned rows")
    }

    fn nbctl(&self, args: &[&str]) -> String {
        nbctl(&self.lab, args)
    }

    /// Every row the network owns, with `_version` so that any write shows (for switch
    /// ports without it and `up`, which ovn-northd maintains), read with a plain `select`.
    fn dump(&self) -> String {
        self.nbctl(&["--wait=sb", "sync"]);
        let tables: [(&str, &[&str]); 7] = [
            (
                "Logical_Switch",
                &["_version", "name", "ports", "qos_rules", "external_ids"],
            ),
            (
                "Logical_Switch_Port",
                &[
                    "name",
                    "type",
                    "addresses",
                    "port_security",
                    "options",
                    "dhcpv4_options",
                    "external_ids",
                ],
            ),
            (
                "Logical_Router",
                &["_version", "name", "ports", "static_routes", "external_ids"],
            ),
            (
                "Logical_Router_Port",
                &["_version", "name", "mac", "networks", "external_ids"],
            ),
            (
                "Logical_Router_Static_Route",
                &[
                    "_version",
                    "ip_prefix",
                    "nexthop",
                    "output_port",
                    "external_ids",
                ],
            ),
            (
                "DHCP_Options",
                &["_version", "cidr", "options", "external_ids"],
            ),
            (
                "QoS",
                &[
                    "_version",
                    "priority",
                    "direction",
                    "match",
                    "action",
                    "external_ids",
                ],
            ),
        ];
        let owned = vec![ops::cond(
            "external_ids",
            "includes",
            ops::string_map([(OWNER_KEY, NET)]),
        )];
        let selects = tables
            .iter()
            .map(|(t, cols)| {
                let mut cols = cols.to_vec();
                cols.insert(0, "_uuid");
                ops::select(t, owned.clone(), Some(&cols))
            })
            .collect();
        let res = self
            .block(self.nb.transact("OVN_Northbound", selects))
            .expect("dump the owned rows");
        let mut out = String::new();
        for ((table, _), r) in tables.iter().zip(res) {
            let mut rows: Vec<String> = r["rows"]
                .as_array()
                .expect("rows")
                .iter()
                .map(Value::to_string)
                .collect();
            rows.sort_unstable();
            out.push_str(&format!("{table}:\n{}\n", rows.join("\n")));
        }
        out
    }

    fn cleanup(&self) {
        for n in ["node-a", "node-b"] {
            let node = self.lab.node(n);
            for p in OVS_PORTS {
                node.remove_port(p);
            }
        }
        let db = format!("--db={}", self.lab.nb());
        let _ = try_run("ovn-nbctl", &[&db, "--if-exists", "ls-del", FOREIGN_LS]);
        // roam's own way out: an empty plan deletes every owned row ...
        if let Err(e) = self.reconcile(&Topology::default()) {
            eprintln!("cleanup: reconcile to an empty plan failed: {e}");
        }
        // ... and in case that is what is broken, by hand (children go with their parents)
        for table in ["Logical_Switch", "Logical_Router", "DHCP_Options"] {
            if let Ok(rows) = try_run(
                "ovn-nbctl",
                &[&db, "--bare", "--columns=_uuid", "find", table, &owned()],
            ) {
                for r in rows.split_whitespace() {
                    let _ = try_run("ovn-nbctl", &[&db, "destroy", table, r]);
                }
            }
        }
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        self.cleanup();
    }
}

/// `ovn-nbctl --bare --columns=nexthop find Logical_Router_Static_Route ip_prefix=..`, sorted.
fn nexthops(env: &Env, prefix: &str) -> Vec<String> {
    let out = env.nbctl(&[
        "--bare",
        "--columns=nexthop",
        "find",
        "Logical_Router_Static_Route",
        &format!("ip_prefix=\"{prefix}\""),
        &owned(),
    ]);
    let mut v: Vec<String> = out.split_whitespace().map(str::to_string).collect();
    v.sort();
    v
}

fn column(env: &Env, table: &str, record: &str, column: &str) -> String {
    env.nbctl(&[
        "--bare",
        &format!("--columns={column}"),
        "list",
        table,
        record,
    ])
    .trim()
    .to_string()
}

fn plug(node: &Node, suffix: &str, ovs_port: &str, i: u8) -> TestNetns {
    let ns = TestNetns::new(suffix);
    let lsp = format!("p{i}.{}", node.name);
    plug_netns(node, &ns, ovs_port, &lsp, &mac(i), &ip(i), GW);
    ns
}

fn ping(lab: &Lab, from: &TestNetns, to: u8, what: &str) {
    let to = ip(to);
    wait_until_else(
        WAIT,
        what,
        || from.ping_once(&to).then_some(()),
        || datapath_report(lab),
    );
}

/// What explains a ping that does not arrive: the test's OVN rows, and on each node the
/// OVS interfaces bound to its ports and the tunnels (their ofport and status).
fn datapath_report(lab: &Lab) -> String {
    let mut out = roam_e2e::ovn_rows_about(lab, &["100.100.", "p1.", "p2.", "p3.", NET]);
    for n in ["node-a", "node-b"] {
        let node = lab.node(n);
        let ifaces = vsctl(
            &node,
            &[
                "--format=csv",
                "--data=bare",
                "--no-headings",
                "--columns=name,ofport,external_ids,status",
                "list",
                "interface",
            ],
        );
        out.push_str(&format!(
            "{n} OVS interfaces (the test's and the tunnels):\n"
        ));
        for l in ifaces
            .lines()
            .filter(|l| l.contains("e2etopo") || l.contains("iface-id=p") || l.contains("ovn-"))
        {
            out.push_str(&format!("  {l}\n"));
        }
    }
    out
}

fn counts(inserted: usize, updated: usize, deleted: usize) -> TableCounts {
    TableCounts {
        inserted,
        updated,
        deleted,
    }
}

#[test]
fn reconciles_an_overlay_pings_across_geneve_and_flips_a_route() {
    let _turn = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let env = Env::new();
    let (a, b) = (env.lab.node("node-a"), env.lab.node("node-b"));

    // --- the overlay lands in one transaction ---
    let t1 = plan(&[port(1, "node-a"), port(2, "node-b")]);
    let r = env.reconcile(&t1).expect("first reconcile");
    println!("first reconcile: {r}");
    // node switches, join, and the (still empty) mobile switch of the VMs
    assert_eq!(r.table("Logical_Switch"), counts(4, 0, 0));
    assert_eq!(r.table("Logical_Router"), counts(3, 0, 0));
    assert_eq!(r.table("Logical_Router_Port"), counts(6, 0, 0));
    assert_eq!(r.table("Logical_Switch_Port"), counts(8, 0, 0));
    assert_eq!(r.table("Logical_Router_Static_Route"), counts(8, 0, 0));
    assert_eq!(r.table("DHCP_Options"), counts(2, 0, 0));
    assert_eq!(r.table("QoS"), counts(1, 0, 0));

    // as OVN's own tool sees it
    assert_eq!(
        nexthops(&env, "100.100.1.12/32"),
        ["100.100.1.12", "169.254.77.12"]
    );
    assert_eq!(
        nexthops(&env, "100.100.1.11/32"),
        ["100.100.1.11", "169.254.77.11"]
    );
    assert_eq!(
        nexthops(&env, "100.100.0.0/17"),
        ["169.254.77.1", "169.254.77.1"]
    );
    let fabric = env.nbctl(&["lr-route-list", "e2e-topo-fabric"]);
    assert!(
        fabric
            .lines()
            .any(|l| l.contains("100.100.1.12") && l.contains("169.254.77.12")),
        "{fabric}"
    );
    let node_b = env.nbctl(&["lr-route-list", "e2e-topo-node-b-rtr"]);
    assert!(
        node_b
            .lines()
            .any(|l| l.contains("100.100.1.12") && l.contains("e2e-topo-node-b-rtr-gw")),
        "{node_b}"
    );
    // --- ovn-trace: p1 on node-a to p2 on node-b leaves node-a's router for the fabric,
    // which hands it to node-b's router, out to p2.node-b ---
    let gw_mac = spec().gateway_mac.to_string();
    let to_p2 = icmp_microflow("p1.node-a", &mac(1), &gw_mac, &ip(1), &ip(2));
    let trace = ovn_trace(&env.lab, "e2e-topo-node-a", &to_p2, &[]);
    let outs = trace_outputs(&trace);
    println!("p1 -> p2 outputs: {outs:?}");
    let pos = |p: &str| {
        outs.iter()
            .position(|o| o == p)
            .unwrap_or_else(|| panic!("{p} not in the trace's outputs {outs:?}:\n{trace}"))
    };
    assert!(pos("e2e-topo-node-a-rtr-join") < pos("e2e-topo-fabric-join"));
    assert!(pos("e2e-topo-fabric-join") < pos("e2e-topo-node-b-rtr-gw"));
    assert_eq!(
        outs.last().map(String::as_str),
        Some("p2.node-b"),
        "{trace}"
    );
    assert!(!outs.iter().any(|o| o.starts_with("p1.")), "{outs:?}");

    // --- ovn-trace: port security drops a spoofed source IP or MAC at the first stage ---
    for (what, flow) in [
        (
            "a spoofed source IP",
            icmp_microflow("p1.node-a", &mac(1), &gw_mac, "100.100.1.99", &ip(2)),
        ),
        (
            "a spoofed source MAC",
            icmp_microflow("p1.node-a", "0a:58:de:ad:be:ef", &gw_mac, &ip(1), &ip(2)),
        ),
    ] {
        let trace = ovn_trace(&env.lab, "e2e-topo-node-a", &flow, &[]);
        assert!(
            trace_outputs(&trace).is_empty(),
            "{what} must not get anywhere:\n{trace}"
        );
        assert!(
            trace.contains("port_sec") && trace.contains("drop;"),
            "{what} is dropped by port security:\n{trace}"
        );
    }

    let lsp = "p1.node-a";
    let addr = format!("{} {}", mac(1), ip(1));
    assert_eq!(column(&env, "Logical_Switch_Port", lsp, "addresses"), addr);
    assert_eq!(
        column(&env, "Logical_Switch_Port", lsp, "port_security"),
        addr
    );
    assert_eq!(
        column(&env, "Logical_Switch_Port", lsp, "options"),
        "requested-chassis=node-a"
    );
    let dhcp = column(&env, "Logical_Switch_Port", lsp, "dhcpv4_options");
    assert_eq!(
        column(&env, "DHCP_Options", &dhcp, "cidr"),
        "100.100.1.11/32"
    );
    let opts = column(&env, "DHCP_Options", &dhcp, "options");
    assert!(
        opts.contains("router=\"100.100.0.1\"") || opts.contains("router=100.100.0.1"),
        "{opts}"
    );
    assert!(
        opts.contains("mtu=\"1400\"") || opts.contains("mtu=1400"),
        "{opts}"
    );
    let peer = "e2e-topo-node-a-gw";
    assert_eq!(column(&env, "Logical_Switch_Port", peer, "type"), "router");
    assert_eq!(
        column(&env, "Logical_Switch_Port", peer, "addresses"),
        "router"
    );
    assert_eq!(
        column(&env, "Logical_Switch_Port", peer, "options"),
        "router-port=e2e-topo-node-a-rtr-gw"
    );
    assert_eq!(
        column(&env, "Logical_Router_Port", "e2e-topo-node-a-rtr-gw", "mac"),
        "0a:00:00:e2:70:01"
    );
    assert_eq!(
        column(
            &env,
            "Logical_Router_Port",
            "e2e-topo-node-b-rtr-gw",
            "networks"
        ),
        "100.100.0.1/16"
    );
    let qos = env.nbctl(&["qos-list", "e2e-topo-node-a"]);
    assert!(
        qos.contains("from-lport") && qos.contains("100") && qos.contains("dscp=22"),
        "{qos}"
    );

    // --- a second reconcile of the same plan sends nothing ---
    let before = env.dump();
    let r = env.reconcile(&t1).expect("second reconcile");
    assert!(r.is_empty(), "second reconcile changed {r}");
    assert_eq!(diff(&env.actual(), &t1, NET), Vec::<Value>::new());
    assert_eq!(env.dump(), before, "a no-op reconcile writes nothing");

    // --- datapath: node-a → node-b across geneve, through the fabric router ---
    let ns_a1 = plug(&a, "topo-a1", "e2etopo-a1", 1);
    let ns_b2 = plug(&b, "topo-b2", "e2etopo-b2", 2);
    env.nbctl(&["--wait=hv", "sync"]);
    ping(&env.lab, &ns_a1, 2, "p1 on node-a to reach p2 on node-b");
    ping(&env.lab, &ns_b2, 1, "p2 on node-b to reach p1 on node-a");
    println!("p1 (node-a) <-> p2 (node-b): ping ok");

    // --- route flip: p2 moves to node-a ---
    // its target port exists before the move, and a probe p3 on node-b watches from afar
    let mut p2 = port(2, "node-b");
    p2.also_on = vec!["node-a".into()];
    let t2 = plan(&[port(1, "node-a"), p2.clone(), port(3, "node-b")]);
    let r = env.reconcile(&t2).expect("reconcile the migration target");
    println!("target port and probe: {r}");
    assert_eq!(r.table("Logical_Switch_Port"), counts(2, 0, 0));
    assert_eq!(r.table("Logical_Router_Static_Route"), counts(2, 0, 0));
    let ns_b3 = plug(&b, "topo-b3", "e2etopo-b3", 3);
    env.nbctl(&["--wait=hv", "sync"]);
    ping(&env.lab, &ns_b3, 2, "p3 to reach p2, both on node-b");
    ping(&env.lab, &ns_b3, 1, "p3 on node-b to reach p1 on node-a");

    // the workload leaves node-b ...
    drop(ns_b2);
    vsctl(&b, &["--if-exists", "del-port", "br-int", "e2etopo-b2"]);
    // ... and shows up on node-a with the same IP and MAC
    let ns_a2 = plug(&a, "topo-a2", "e2etopo-a2", 2);
    env.nbctl(&["--wait=hv", "sync"]);
    // the routes still point at node-b, where nothing answers any more
    for _ in 0..3 {
        assert!(!ns_b3.ping_once(&ip(2)), "p2 is gone from node-b");
        assert!(
            !ns_a1.ping_once(&ip(2)),
            "p1's traffic to p2 still goes to node-b"
        );
    }

    p2.node = "node-a".into();
    p2.also_on = vec!["node-b".into()];
    let t3 = plan(&[port(1, "node-a"), p2, port(3, "node-b")]);
    let actual = env.actual();
    let flip = diff(&actual, &t3, NET);
    let route_ops: Vec<&Value> = flip
        .iter()
        .filter(|o| o["table"] == "Logical_Router_Static_Route")
        .collect();
    let uuid_of = |prefix: &str, nexthop: &str| -> Uuid {
        actual
            .routes
            .iter()
            .find(|r| r.ip_prefix == prefix && r.nexthop == nexthop)
            .unwrap_or_else(|| panic!("route {prefix} via {nexthop}"))
            .uuid
    };
    let fabric_route = uuid_of("100.100.1.12/32", "169.254.77.12");
    let old_local = uuid_of("100.100.1.12/32", "100.100.1.12");
    let target = |o: &Value| o["where"][0][2].clone();
    assert_eq!(route_ops.len(), 3, "{flip:#?}");
    let update = route_ops.iter().find(|o| o["op"] == "update").unwrap();
    assert_eq!(target(update), fabric_route.to_json());
    assert_eq!(update["row"], json!({"nexthop": "169.254.77.11"}));
    let delete = route_ops.iter().find(|o| o["op"] == "delete").unwrap();
    assert_eq!(target(delete), old_local.to_json());
    let insert = route_ops.iter().find(|o| o["op"] == "insert").unwrap();
    assert_eq!(
        insert["row"]["output_port"],
        json!("e2e-topo-node-a-rtr-gw"),
        "{insert}"
    );
    // besides them only the two routers' static_routes references change
    assert_eq!(flip.len(), 5, "{flip:#?}");
    assert!(
        flip.iter()
            .filter(|o| o["table"] != "Logical_Router_Static_Route")
            .all(|o| o["table"] == "Logical_Router" && o["op"] == "mutate"),
        "{flip:#?}"
    );

    let r = env.reconcile(&t3).expect("the route flip");
    println!("route flip: {r}");
    assert_eq!(r, ReconcileReport::from_ops(&flip));
    assert_eq!(r.table("Logical_Router_Static_Route"), counts(1, 1, 1));
    assert_eq!(r.table("Logical_Router"), counts(0, 2, 0));
    assert_eq!(r.totals(), counts(1, 3, 1));
    assert_eq!(
        nexthops(&env, "100.100.1.12/32"),
        ["100.100.1.12", "169.254.77.11"]
    );
    assert!(
        env.nbctl(&["lr-route-list", "e2e-topo-node-a-rtr"])
            .lines()
            .any(|l| l.contains("100.100.1.12") && l.contains("e2e-topo-node-a-rtr-gw"))
    );
    assert!(
        !env.nbctl(&["lr-route-list", "e2e-topo-node-b-rtr"])
            .contains("100.100.1.12 ")
    );
    env.nbctl(&["--wait=hv", "sync"]);
    ping(
        &env.lab,
        &ns_b3,
        2,
        "p3 on node-b to reach p2, now on node-a, via the fabric",
    );
    ping(&env.lab, &ns_a1, 2, "p1 to reach p2, both on node-a now");
    ping(&env.lab, &ns_a2, 3, "p2 on node-a to answer p3 on node-b");
    println!("after the flip: p3 (node-b) -> p2 (node-a) and p1 -> p2 ping ok");
    assert!(env.reconcile(&t3).unwrap().is_empty());

    drop((ns_a1, ns_a2, ns_b3));
    drop(env);
}

#[test]
fn bad_input_leaves_the_nb_database_unchanged() {
    let _turn = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let env = Env::new();
    let t = plan(&[port(1, "node-a"), port(2, "node-b")]);
    env.reconcile(&t).expect("reconcile");
    let before = env.dump();

    // a plan error: nothing to send
    let mut dup = port(3, "node-a");
    dup.ip = port(1, "node-a").ip;
    let err = plan_overlay(
        &spec(),
        &nodes(),
        &[port(1, "node-a"), port(2, "node-b"), dup],
    )
    .expect_err("a duplicate IP is a plan error");
    assert!(matches!(err, PlanError::DuplicateIp { .. }), "{err}");
    assert_eq!(env.dump(), before);

    // a plan refused before anything is sent: the error, the NB as it was
    let refused = |plan: &Topology, what: &str| {
        let err = env.reconcile(plan).expect_err(what);
        println!("{what}: {err}");
        assert_eq!(env.dump(), before, "{what}: the NB is unchanged");
        err
    };

    // a plan OVN cannot realize: a switch port named like a router port (ovn-northd would
    // drop one of them with a warning)
    let mut clash = t.clone();
    clash
        .switches
        .get_mut("e2e-topo-join")
        .unwrap()
        .ports
        .insert(
            "e2e-topo-fabric-join".into(),
            SwitchPort {
                name: "e2e-topo-fabric-join".into(),
                kind: SwitchPortKind::Router {
                    router_port: "e2e-topo-fabric-join".into(),
                },
            },
        );
    let err = refused(&clash, "clashing port names");
    assert!(matches!(err, Error::InvalidTopology { .. }), "{err}");

    // a DSCP that is none (0..63; the NB schema of OVN ≥ 24 takes any integer there): refused
    // by roam's own check before sending
    let mut bad = t.clone();
    bad.switches
        .get_mut("e2e-topo-node-b")
        .unwrap()
        .qos
        .insert(QosRule {
            r#match: "inport == \"p2.node-b\"".into(),
            dscp: 99,
        });
    let err = refused(&bad, "DSCP 99");
    assert!(matches!(err, Error::InvalidTopology { .. }), "{err}");

    // a value that passes the check but not the server's schema (a localnet port's VLAN tag,
    // 0..4095 there): refused by the schema check before sending
    let mut bad = t.clone();
    bad.switches
        .get_mut("e2e-topo-node-b")
        .unwrap()
        .ports
        .insert(
            "e2e-topo-ln".into(),
            SwitchPort {
                name: "e2e-topo-ln".into(),
                kind: SwitchPortKind::Localnet {
                    network_name: "physnet".into(),
                    tag: Some(5000),
                },
            },
        );
    let err = refused(&bad, "VLAN tag 5000");
    assert!(
        matches!(err, Error::Ovsdb(ovsdb::Error::InvalidValue { .. })),
        "{err}"
    );

    // a transaction the server rejects: a foreign port already has the name of a new one
    env.nbctl(&["ls-add", FOREIGN_LS]);
    env.nbctl(&["lsp-add", FOREIGN_LS, "p3.node-a"]);
    let t3 = plan(&[port(1, "node-a"), port(2, "node-b"), port(3, "node-a")]);
    assert!(
        diff(&env.actual(), &t3, NET).len() > 3,
        "a sizeable transaction"
    );
    let err = refused(&t3, "the name is taken");
    assert!(
        matches!(err, Error::Ovsdb(ovsdb::Error::Transaction { .. })),
        "{err}"
    );
    env.nbctl(&["ls-del", FOREIGN_LS]);

    // a crafted transaction: a valid route change, then a reference to a row that does not
    // exist; the route change must not land either
    let actual = env.actual();
    let route = actual
        .routes
        .iter()
        .find(|r| r.ip_prefix == "100.100.1.12/32" && r.nexthop == "169.254.77.12")
        .expect("fabric route");
    let ls = actual
        .switches
        .iter()
        .find(|l| l.name == "e2e-topo-node-a")
        .expect("node-a switch");
    let by = |u: Uuid| vec![ops::cond("_uuid", "==", u.to_json())];
    let missing = Uuid("0badc0de-0000-4000-8000-000000000000".parse().unwrap());
    let err = env
        .block(apply(
            &env.nb,
            vec![
                ops::update(
                    "Logical_Router_Static_Route",
                    by(route.uuid),
                    json!({"nexthop": "169.254.77.11"}),
                ),
                ops::mutate(
                    "Logical_Switch",
                    by(ls.uuid),
                    vec![ops::mutation(
                        "ports",
                        "insert",
                        ops::set(vec![missing.to_json()]),
                    )],
                ),
            ],
        ))
        .expect_err("a dangling strong reference");
    println!("crafted transaction: {err}");
    assert!(
        matches!(err, Error::Ovsdb(ovsdb::Error::Transaction { .. })),
        "{err}"
    );
    assert_eq!(env.dump(), before);
    assert_eq!(
        nexthops(&env, "100.100.1.12/32"),
        ["100.100.1.12", "169.254.77.12"]
    );

    // and the state is still exactly the plan
    assert!(env.reconcile(&t).expect("reconcile").is_empty());
    drop(env);
}
