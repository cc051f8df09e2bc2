//! roam's VLAN underlay on the lab's real OVN: the reconciler programs a VLAN 116 network (one
//! switch with a tagged `localnet` port, one workload port on node-a), each chassis maps the
//! physical network to a userspace bridge, a veth pair joins node-a's and node-b's bridges
//! (the "wire"), and an OVS access port on node-b's bridge holds the VLAN's gateway (the
//! "ToR"). The workload pings the ToR, and a capture on the wire shows the frames carry
//! 802.1Q tag 116 (and the ToR's access port sees them untagged). A second workload takes a
//! lease from OVN's DHCP with the subnet's /24 mask and the ToR as router, and reaches the ToR
//! too. Bad input (tag 4095) is a plan error and leaves the NB database as it was.
//!
//! Network `e2e-vlan`, VLAN 116, TEST-NET-1 192.0.2.0/24 (gateway 192.0.2.1), physical
//! network `e2evlan` on bridge `br-e2evlan`: nothing here collides with the other lab tests.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use roam_dhcp_opts::MacAddr;
use roam_e2e::{Lab, Node, TestNetns, attach_netns, nbctl, run, try_run, vsctl, wait_until};
use roam_network::ovsdb::Client;
use roam_network::topology::{
    OWNER_KEY, PlanError, PortSpec, Topology, UnderlaySpec, check, plan_underlay, read_actual,
    reconcile,
};

const NET: &str = "e2e-vlan";
const VLAN: u16 = 116;
const PHYSNET: &str = "e2evlan";
const BRIDGE: &str = "br-e2evlan";
/// The veth pair joining the two nodes' bridges: the end in node-a, the end in node-b.
const WIRE: (&str, &str) = ("e2evlan-a", "e2evlan-b");
/// The ToR's access port on node-b's bridge (at most 15 characters).
const TOR: &str = "tor116";
/// The workload's OVS internal port on node-a's br-int.
const WORKLOAD: &str = "e2evlan-w1";
const GW: &str = "192.0.2.1";
const WORKLOAD_IP: &str = "192.0.2.10";
/// The DHCP workload's OVS internal port on node-a's br-int, and its address.
const DHCP_WORKLOAD: &str = "e2evlan-w2";
const DHCP_IP: &str = "192.0.2.11";
const WAIT: Duration = Duration::from_secs(90);

fn spec() -> UnderlaySpec {
    UnderlaySpec {
        name: NET.into(),
        vlan: VLAN,
        subnet: "192.0.2.0/24".parse().unwrap(),
        gateway: GW.parse().unwrap(),
        physnet: PHYSNET.into(),
        mtu: 1500,
        dns: vec![],
    }
}

fn workload() -> PortSpec {
    PortSpec {
        name: "w1".into(),
        mac: MacAddr::new([0x0a, 0x58, 0xc0, 0x00, 0x02, 0x0a]),
        ip: WORKLOAD_IP.parse().unwrap(),
        node: "node-a".into(),
        also_on: vec![],
        dhcp: false,
        marking: None,
    }
}

/// A second workload, addressed by OVN's DHCP.
fn dhcp_workload() -> PortSpec {
    PortSpec {
        name: "w2".into(),
        mac: MacAddr::new([0x0a, 0x58, 0xc0, 0x00, 0x02, 0x0b]),
        ip: DHCP_IP.parse().unwrap(),
        node: "node-a".into(),
        also_on: vec![],
        dhcp: true,
        marking: None,
    }
}

fn owned() -> String {
    format!("external_ids:\"{OWNER_KEY}\"={NET}")
}

/// The network's OVN rows and every bridge, mapping, port, veth and namespace the test
/// makes; removed first (a killed run's leftovers) and when dropped (also after a failure).
struct Env {
    lab: Lab,
    nb: Client,
    rt: tokio::runtime::Runtime,
    /// `ovn-bridge-mappings` of node-a and node-b before the test (restored on drop).
    mappings: Vec<(Node, Option<String>)>,
}

impl Env {
    fn new() -> Env {
        let lab = Lab::get();
        let rt = tokio::runtime::Runtime::new().expect("a tokio runtime");
        let nb = rt
            .block_on(Client::connect(lab.nb()))
            .expect("connect to NB");
        let mappings = ["node-a", "node-b"]
            .iter()
            .map(|n| {
                let node = lab.node(n);
                let m = bridge_mappings(&node).map(|m| without_physnet(&m));
                (node, m.filter(|m| !m.is_empty()))
            })
            .collect();
        let env = Env {
            lab,
            nb,
            rt,
            mappings,
        };
        env.cleanup();
        env
    }

    fn reconcile(
        &self,
        t: &Topology,
    ) -> roam_network::Result<roam_network::topology::ReconcileReport> {
        self.rt.block_on(reconcile(&self.nb, NET, t))
    }

    /// node's bridge for the physical network, mapped in `ovn-bridge-mappings` (keeping any
    /// other mapping).
    fn map_physnet(&self, node: &Node, before: &Option<String>) {
        vsctl(
            node,
            &[
                "--may-exist",
                "add-br",
                BRIDGE,
                "--",
                "set",
                "bridge",
                BRIDGE,
                "datapath_type=netdev",
            ],
        );
        let ours = format!("{PHYSNET}:{BRIDGE}");
        let all = match before {
            Some(m) => format!("{m},{ours}"),
            None => ours,
        };
        vsctl(
            node,
            &[
                "set",
                "open",
                ".",
                &format!("external_ids:ovn-bridge-mappings=\"{all}\""),
            ],
        );
    }

    fn cleanup(&self) {
        for (node, before) in &self.mappings {
            let db = format!("--db={}", node.ovs_db);
            if node.name == "node-b" {
                let _ = try_run("ovs-vsctl", &[&db, "--if-exists", "del-port", BRIDGE, TOR]);
                let _ = try_run("ip", &["-n", &node.netns, "link", "del", WIRE.1]);
            }
            if node.name == "node-a" {
                for p in [WORKLOAD, DHCP_WORKLOAD] {
                    let _ = try_run("ovs-vsctl", &[&db, "--if-exists", "del-port", "br-int", p]);
                    let _ = try_run("ip", &["-n", &node.netns, "link", "del", p]);
                }
                // deleting one end of the pair deletes both
                let _ = try_run("ip", &["-n", &node.netns, "link", "del", WIRE.0]);
            }
            let _ = match before {
                Some(m) => try_run(
                    "ovs-vsctl",
                    &[
                        &db,
                        "set",
                        "open",
                        ".",
                        &format!("external_ids:ovn-bridge-mappings=\"{m}\""),
                    ],
                ),
                None => try_run(
                    "ovs-vsctl",
                    &[
                        &db,
                        "remove",
                        "open",
                        ".",
                        "external_ids",
                        "ovn-bridge-mappings",
                    ],
                ),
            };
            let _ = try_run("ovs-vsctl", &[&db, "--if-exists", "del-br", BRIDGE]);
        }
        if let Err(e) = self.reconcile(&Topology::default()) {
            eprintln!("cleanup: reconcile to an empty plan failed: {e}");
        }
        let db = format!("--db={}", self.lab.nb());
        for table in ["Logical_Switch", "DHCP_Options"] {
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

fn bridge_mappings(node: &Node) -> Option<String> {
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
    .ok()
    .map(|s| s.trim().trim_matches('"').to_string())
    .filter(|s| !s.is_empty())
}

/// A mapping string without this test's physical network (a killed run's leftover).
fn without_physnet(m: &str) -> String {
    m.split(',')
        .filter(|e| !e.starts_with(&format!("{PHYSNET}:")))
        .collect::<Vec<_>>()
        .join(",")
}

/// Run `tcpdump -e` on `iface` in `netns` (at most 5 frames, at most 10 s) while `traffic`
/// runs; returns what it printed. Waits for tcpdump to say it is listening before `traffic`.
fn capture(netns: &str, iface: &str, filter: &str, traffic: impl FnOnce()) -> String {
    let mut child = Command::new("ip")
        .args([
            "netns", "exec", netns, "timeout", "10", "tcpdump", "-e", "-n", "-l", "-c", "5", "-i",
            iface, filter,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start tcpdump");
    let mut stderr = BufReader::new(child.stderr.take().expect("tcpdump stderr"));
    let mut line = String::new();
    let mut seen = String::new();
    loop {
        line.clear();
        let n = stderr.read_line(&mut line).expect("read tcpdump stderr");
        seen.push_str(&line);
        if n == 0 {
            panic!("tcpdump on {iface} in {netns} ended before listening: {seen}");
        }
        if line.contains("listening on") {
            break;
        }
    }
    traffic();
    let out = child.wait_with_output().expect("wait for tcpdump");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_vlan_network_reaches_the_tor_with_tag_116_on_the_wire() {
    let env = Env::new();
    let (a, b) = (env.lab.node("node-a"), env.lab.node("node-b"));

    // --- the VLAN network lands: one switch, a tagged localnet port, the workload ---
    let t = plan_underlay(&spec(), &[workload(), dhcp_workload()]).expect("a valid plan");
    check(&t, NET).expect("realizable");
    let r = env.reconcile(&t).expect("first reconcile");
    println!("first reconcile: {r}");
    assert_eq!(r.table("Logical_Switch").inserted, 1);
    assert_eq!(r.table("Logical_Switch_Port").inserted, 3);
    assert_eq!(r.table("DHCP_Options").inserted, 1);
    assert!(env.reconcile(&t).expect("second reconcile").is_empty());
    let col = |c: &str| {
        nbctl(
            &env.lab,
            &[
                "--bare",
                &format!("--columns={c}"),
                "list",
                "Logical_Switch_Port",
                "e2e-vlan-ln",
            ],
        )
        .trim()
        .to_string()
    };
    assert_eq!(col("type"), "localnet");
    assert_eq!(col("tag"), "116");
    assert_eq!(col("addresses"), "unknown");
    assert_eq!(col("options"), format!("network_name={PHYSNET}"));
    let ls = nbctl(
        &env.lab,
        &[
            "--bare",
            "--columns=name",
            "find",
            "Logical_Switch",
            &owned(),
        ],
    );
    assert_eq!(ls.trim(), "e2e-vlan-vlan116");

    // --- the physical side: bridges + mappings, the wire, the ToR ---
    for (node, before) in &env.mappings {
        env.map_physnet(node, before);
    }
    run(
        "ip",
        &[
            "link", "add", WIRE.0, "netns", &a.netns, "type", "veth", "peer", "name", WIRE.1,
            "netns", &b.netns,
        ],
    );
    for (node, end) in [(&a, WIRE.0), (&b, WIRE.1)] {
        run("ip", &["-n", &node.netns, "link", "set", end, "up"]);
        vsctl(node, &["--may-exist", "add-port", BRIDGE, end]);
    }
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
    let tor = TestNetns::new("vlan-tor");
    run(
        "ip",
        &["-n", &b.netns, "link", "set", TOR, "netns", &tor.name],
    );
    tor.run("ip", &["addr", "add", &format!("{GW}/24"), "dev", TOR]);
    tor.run("ip", &["link", "set", TOR, "up"]);

    // --- the workload: a static address of the VLAN's subnet, gateway on-link ---
    let w = TestNetns::new("vlan-w1");
    attach_netns(&a, &w, WORKLOAD, "w1.node-a", &workload().mac.to_string());
    w.run(
        "ip",
        &["addr", "add", &format!("{WORKLOAD_IP}/24"), "dev", WORKLOAD],
    );
    w.run("ip", &["route", "add", "default", "via", GW]);

    // ovn-controller patches br-int to the mapped bridge for the localnet port, once a port
    // of the switch is bound on the chassis (not before: the datapath is not local yet)
    wait_until(
        WAIT,
        "ovn-controller's patch port to the VLAN bridge",
        || {
            let ports = vsctl(&a, &["list-ports", BRIDGE]);
            ports.lines().any(|p| p.starts_with("patch-")).then_some(())
        },
    );

    wait_until(WAIT, "the workload to reach the ToR", || {
        w.ping_once(GW).then_some(())
    });

    // --- on the wire, the frames carry tag 116 (the filter matches tagged and untagged) ---
    let wire = capture(&a.netns, WIRE.0, "icmp or (vlan and icmp)", || {
        let _ = w.try_run("ping", &["-n", "-c", "5", "-i", "0.2", "-W", "1", GW]);
    });
    println!("capture on {}:\n{wire}", WIRE.0);
    let frames: Vec<&str> = wire.lines().filter(|l| l.contains("ICMP")).collect();
    assert!(!frames.is_empty(), "no ICMP captured on the wire: {wire}");
    for f in &frames {
        assert!(
            f.contains("vlan 116"),
            "an untagged or mistagged frame: {f}"
        );
        assert!(f.contains("192.0.2.10") && f.contains(GW), "{f}");
    }
    assert!(
        frames
            .iter()
            .any(|f| f.contains("192.0.2.10 > 192.0.2.1: ICMP echo request")),
        "{wire}"
    );
    assert!(
        frames
            .iter()
            .any(|f| f.contains("192.0.2.1 > 192.0.2.10: ICMP echo reply")),
        "{wire}"
    );

    // the ToR's access port strips the tag
    let access = capture(&tor.name, TOR, "icmp or (vlan and icmp)", || {
        let _ = w.try_run("ping", &["-n", "-c", "5", "-i", "0.2", "-W", "1", GW]);
    });
    let frames: Vec<&str> = access.lines().filter(|l| l.contains("ICMP")).collect();
    assert!(!frames.is_empty(), "no ICMP at the ToR: {access}");
    assert!(frames.iter().all(|f| !f.contains("vlan")), "{access}");

    // --- DHCP on the VLAN: the subnet's mask, the VLAN's gateway as router, no routes ---
    let w2 = TestNetns::new("vlan-w2");
    attach_netns(
        &a,
        &w2,
        DHCP_WORKLOAD,
        "w2.node-a",
        &dhcp_workload().mac.to_string(),
    );
    let script = std::env::temp_dir().join("roam-e2e-vlan-udhcpc.sh");
    std::fs::write(
        &script,
        "#!/bin/sh\n[ \"$1\" = bound ] && echo \"LEASE ip=$ip mask=$mask subnet=$subnet \
         router=$router routes=$staticroutes\"\nexit 0\n",
    )
    .expect("write the udhcpc script");
    run("chmod", &["+x", script.to_str().unwrap()]);
    let lease = wait_until(WAIT, "udhcpc to get a lease on the VLAN from OVN", || {
        w2.try_run(
            "busybox",
            &[
                "udhcpc",
                "-i",
                DHCP_WORKLOAD,
                "-f",
                "-q",
                "-n",
                "-t",
                "5",
                "-T",
                "1",
                "-O",
                "staticroutes",
                "-s",
                script.to_str().unwrap(),
            ],
        )
        .ok()
        .and_then(|out| {
            out.lines()
                .find(|l| l.starts_with("LEASE"))
                .map(str::to_string)
        })
    });
    let _ = std::fs::remove_file(&script);
    println!("{lease}");
    assert!(lease.contains(&format!("ip={DHCP_IP} ")), "{lease}");
    assert!(
        lease.contains(" subnet=255.255.255.0 "),
        "the subnet's mask: {lease}"
    );
    assert!(lease.contains(&format!(" router={GW} ")), "{lease}");
    assert!(lease.ends_with(" routes="), "no classless routes: {lease}");
    w2.run(
        "ip",
        &[
            "addr",
            "add",
            &format!("{DHCP_IP}/24"),
            "dev",
            DHCP_WORKLOAD,
        ],
    );
    wait_until(WAIT, "the DHCP workload to reach the ToR", || {
        w2.ping_once(GW).then_some(())
    });
    drop(w2);

    // --- bad input: tag 4095 is a plan error, and NB is left as it was ---
    nbctl(&env.lab, &["--wait=sb", "sync"]);
    let before = env
        .rt
        .block_on(read_actual(&env.nb, NET))
        .expect("read owned rows");
    let mut bad = spec();
    bad.vlan = 4095;
    let err = plan_underlay(&bad, &[workload(), dhcp_workload()]).unwrap_err();
    println!("plan error: {err}");
    assert_eq!(
        err,
        PlanError::BadVlanTag {
            network: NET.into(),
            tag: 4095
        }
    );
    assert!(err.to_string().contains("4095 is reserved"), "{err}");
    let after = env
        .rt
        .block_on(read_actual(&env.nb, NET))
        .expect("read owned rows");
    assert_eq!(before, after);
    assert_eq!(col("tag"), "116");
    // and the workload still reaches the ToR
    assert!(w.ping_once(GW) || w.ping_once(GW));

    drop(w);
    drop(tor);
}
