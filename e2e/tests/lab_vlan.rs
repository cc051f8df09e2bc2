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

use std::time::Duration;

use roam_contract::keys::OWNER_KEY;
use roam_e2e::{
    Lab, PortBuilder, TestNetns, VlanTor, attach_netns, capture, nbctl, ovn_trace, run, send_rarp,
    trace_outputs, try_run, vsctl, wait_until,
};
use roam_network::northbound::{read_actual, reconcile};
use roam_network::topology::{PlanError, PortSpec, Topology, UnderlaySpec, check, plan_underlay};
use roam_ovsdb::Client;

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
    PortBuilder::new("e2e-vlan-w1", WORKLOAD_IP.parse().unwrap(), "node-a").build()
}

/// A second workload, addressed by OVN's DHCP.
fn dhcp_workload() -> PortSpec {
    PortBuilder::new("e2e-vlan-w2", DHCP_IP.parse().unwrap(), "node-a")
        .dhcp(true)
        .build()
}

fn owned() -> String {
    format!("external_ids:\"{OWNER_KEY}\"={NET}")
}

/// The network's OVN rows and every port, veth and namespace the test makes; removed first
/// (a killed run's leftovers) and when dropped (also after a failure). The bridges and their
/// `ovn-bridge-mappings` entries are [`BridgeMapping`] guards of the test.
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

    fn reconcile(
        &self,
        t: &Topology,
    ) -> roam_network::Result<roam_network::topology::ReconcileReport> {
        self.rt.block_on(reconcile(&self.nb, NET, t))
    }

    fn cleanup(&self) {
        for node in [self.lab.node("node-a"), self.lab.node("node-b")] {
            let db = format!("--db={}", node.ovs_db);
            if node.name == "node-a" {
                for p in [WORKLOAD, DHCP_WORKLOAD] {
                    let _ = try_run("ovs-vsctl", &[&db, "--if-exists", "del-port", "br-int", p]);
                    let _ = try_run("ip", &["-n", &node.netns, "link", "del", p]);
                }
            }
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

/// What the captures keep: with link-level headers (the VLAN tag), at most 5 ICMP frames,
/// tagged or not.
const FRAMES: &[&str] = &["-e", "-c", "5", "icmp or (vlan and icmp)"];

#[test]
fn a_vlan_network_reaches_the_tor_with_tag_116_on_the_wire() {
    let env = Env::new();
    let a = env.lab.node("node-a");

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
    let tor_addr = format!("{GW}/24");
    let wire = VlanTor::new(
        &env.lab,
        PHYSNET,
        BRIDGE,
        WIRE,
        "vlan-tor",
        &[(TOR, VLAN, &tor_addr)],
    );
    let tor = &wire.tor;

    // --- the workload: a static address of the VLAN's subnet, gateway on-link ---
    let w = TestNetns::new("vlan-w1");
    attach_netns(&a, &w, WORKLOAD, "e2e-vlan-w1", &workload().mac.to_string());
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

    // --- ovn-trace: the workload's packet to the ToR leaves through the localnet port ---
    let tor_mac = tor.run("cat", &[&format!("/sys/class/net/{TOR}/address")]);
    let flow = format!(
        "inport==\"e2e-vlan-w1\" && eth.src=={} && eth.dst=={} && ip4.src=={WORKLOAD_IP} && \
         ip4.dst=={GW} && ip.ttl==64 && icmp4.type==8",
        workload().mac,
        tor_mac.trim()
    );
    let trace = ovn_trace(&env.lab, "e2e-vlan-vlan116", &flow, &[]);
    assert_eq!(
        trace_outputs(&trace),
        ["e2e-vlan-ln"],
        "out the localnet port only:\n{trace}"
    );
    assert!(trace.contains("type \"localnet\""), "{trace}");

    // --- on the wire, the frames carry tag 116 (the filter matches tagged and untagged) ---
    let wire = capture(&a.netns, WIRE.0, 10, FRAMES, || {
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
    let access = capture(&tor.name, TOR, 10, FRAMES, || {
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
        "e2e-vlan-w2",
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
    drop(wire);
}

// ---- a migrating VM on a VLAN: one port bound on two chassis (multi-chassis) ----

/// Network `h4mc`: VLAN 301, 203.0.113.0/24 (ToR .1), physical network `h4vlan301` on
/// bridges `br-h4mc` joined by the veth pair `h4mc-a`/`h4mc-b`, ToR port `h4mc-tor` on
/// node-b's bridge; the VM's port `h4mc-vm` has an interface on node-a (`h4mc-src`) and on
/// node-b (`h4mc-dst`), both with the VM's MAC and IP.
mod mc {
    pub const NET: &str = "h4mc";
    pub const VLAN: u16 = 301;
    pub const PHYSNET: &str = "h4vlan301";
    pub const BRIDGE: &str = "br-h4mc";
    pub const WIRE: (&str, &str) = ("h4mc-a", "h4mc-b");
    pub const TOR: &str = "h4mc-tor";
    pub const TOR_IP: &str = "203.0.113.1";
    pub const VM_IP: &str = "203.0.113.10";
    pub const VM_MAC: &str = "0a:58:cb:00:71:0a";
    pub const LSP: &str = "h4mc-vm";
    pub const SRC: &str = "h4mc-src";
    pub const DST: &str = "h4mc-dst";
}

fn mc_spec() -> UnderlaySpec {
    UnderlaySpec {
        name: mc::NET.into(),
        vlan: mc::VLAN,
        subnet: "203.0.113.0/24".parse().unwrap(),
        gateway: mc::TOR_IP.parse().unwrap(),
        physnet: mc::PHYSNET.into(),
        mtu: 1500,
        dns: vec![],
    }
}

fn mc_vm(node: &str, also_on: &[&str]) -> PortSpec {
    PortBuilder::new(mc::LSP, mc::VM_IP.parse().unwrap(), node)
        .mac(mc::VM_MAC.parse().unwrap())
        .also_on(also_on)
        .build()
}

/// What the multi-chassis test creates besides the bridges: its OVN rows, the ToR port, the
/// wire, the VM's two interfaces. Removed first and on drop.
struct McEnv {
    lab: Lab,
    nb: Client,
    rt: tokio::runtime::Runtime,
}

impl McEnv {
    fn new() -> McEnv {
        let lab = Lab::get();
        let rt = tokio::runtime::Runtime::new().expect("a tokio runtime");
        let nb = rt
            .block_on(Client::connect(lab.nb()))
            .expect("connect to NB");
        let env = McEnv { lab, nb, rt };
        env.cleanup();
        env
    }

    fn reconcile(&self, t: &Topology) -> roam_network::topology::ReconcileReport {
        self.rt
            .block_on(reconcile(&self.nb, mc::NET, t))
            .expect("reconcile h4mc")
    }

    fn cleanup(&self) {
        let (a, b) = (self.lab.node("node-a"), self.lab.node("node-b"));
        let (da, db) = (format!("--db={}", a.ovs_db), format!("--db={}", b.ovs_db));
        let _ = try_run(
            "ovs-vsctl",
            &[&da, "--if-exists", "del-port", "br-int", mc::SRC],
        );
        let _ = try_run(
            "ovs-vsctl",
            &[&db, "--if-exists", "del-port", "br-int", mc::DST],
        );
        if let Err(e) = self
            .rt
            .block_on(reconcile(&self.nb, mc::NET, &Topology::default()))
        {
            eprintln!("cleanup: reconcile h4mc to an empty plan failed: {e}");
        }
    }
}

impl Drop for McEnv {
    fn drop(&mut self) {
        self.cleanup();
    }
}

/// `ovn-sbctl` against the lab's southbound database.
fn sbctl(lab: &Lab, args: &[&str]) -> String {
    let db = format!("--db={}", lab.var("OVN_SB_DB"));
    let mut all = vec![db.as_str(), "--timeout=30"];
    all.extend_from_slice(args);
    run("ovn-sbctl", &all)
}

/// The chassis names in a Port_Binding column of `lsp` (`chassis`, `additional_chassis`).
fn bound_on(lab: &Lab, lsp: &str, column: &str) -> Vec<String> {
    let uuids = sbctl(
        lab,
        &[
            "--bare",
            &format!("--columns={column}"),
            "find",
            "Port_Binding",
            &format!("logical_port={lsp}"),
        ],
    );
    let mut names: Vec<String> = uuids
        .split_whitespace()
        .map(|u| {
            sbctl(lab, &["get", "Chassis", u, "name"])
                .trim()
                .trim_matches('"')
                .to_string()
        })
        .collect();
    names.sort();
    names
}

#[test]
fn a_migrating_vlan_port_is_bound_on_both_chassis_and_the_target_carries_traffic_once_activated() {
    let env = McEnv::new();
    let lab = &env.lab;
    let (a, b) = (lab.node("node-a"), lab.node("node-b"));
    let version = run("ovn-nbctl", &["--version"]);
    println!("{}", version.lines().next().unwrap_or_default());

    // --- the VLAN, the wire between the nodes' bridges, the ToR on node-b ---
    let tor_addr = format!("{}/24", mc::TOR_IP);
    let wire = VlanTor::new(
        lab,
        mc::PHYSNET,
        mc::BRIDGE,
        mc::WIRE,
        "h4mc-tor",
        &[(mc::TOR, mc::VLAN, &tor_addr)],
    );
    let tor = &wire.tor;

    // --- the VM lives on node-a ---
    let src = TestNetns::new("h4mc-src");
    env.reconcile(&plan_underlay(&mc_spec(), &[mc_vm("node-a", &[])]).expect("plan"));
    attach_netns(&a, &src, mc::SRC, mc::LSP, mc::VM_MAC);
    src.run(
        "ip",
        &["addr", "add", &format!("{}/24", mc::VM_IP), "dev", mc::SRC],
    );
    wait_until(WAIT, "the VM on node-a to reach the ToR", || {
        src.ping_once(mc::TOR_IP).then_some(())
    });

    // --- migration starts: the same port, requested on node-a and node-b ---
    let t = plan_underlay(&mc_spec(), &[mc_vm("node-a", &["node-b"])]).expect("plan");
    let r = env.reconcile(&t);
    println!("multi-chassis: {r}");
    assert_eq!(r.table("Logical_Switch_Port").updated, 1, "{r}");
    assert_eq!(r.totals().inserted, 0, "no second port: {r}");
    assert!(env.reconcile(&t).is_empty(), "idempotent");
    let opts = nbctl(lab, &["get", "Logical_Switch_Port", mc::LSP, "options"]);
    assert!(
        opts.contains("requested-chassis=\"node-a,node-b\""),
        "{opts}"
    );
    assert!(opts.contains("activation-strategy=rarp"), "{opts}");

    let dst = TestNetns::new("h4mc-dst");
    attach_netns(&b, &dst, mc::DST, mc::LSP, mc::VM_MAC);
    dst.run(
        "ip",
        &["addr", "add", &format!("{}/24", mc::VM_IP), "dev", mc::DST],
    );
    wait_until(
        WAIT,
        "the port bound on node-a and, additionally, node-b",
        || {
            (bound_on(lab, mc::LSP, "chassis") == ["node-a"]
                && bound_on(lab, mc::LSP, "additional_chassis") == ["node-b"])
            .then_some(())
        },
    );
    // both chassis have installed the port's flows
    nbctl(lab, &["--wait=hv", "sync"]);
    // the source still works; the target is blocked until the VM announces itself there
    assert!(src.ping_once(mc::TOR_IP) || src.ping_once(mc::TOR_IP));
    // the source pauses (the VM's final copy): its interface goes down
    src.run("ip", &["link", "set", mc::SRC, "down"]);
    for _ in 0..3 {
        assert!(
            !dst.ping_once(mc::TOR_IP),
            "the target carries traffic before its activation (RARP)"
        );
    }

    // --- the VM resumes on node-b and sends its RARP: the target binding activates ---
    send_rarp(&dst, mc::DST, mc::VM_MAC);
    wait_until(WAIT, "the VM on node-b to reach the ToR", || {
        dst.ping_once(mc::TOR_IP).then_some(())
    });
    wait_until(WAIT, "the ToR to reach the VM on node-b", || {
        tor.ping_once(mc::VM_IP).then_some(())
    });
    let pb = sbctl(
        lab,
        &[
            "--bare",
            "--columns=options",
            "find",
            "Port_Binding",
            &format!("logical_port={}", mc::LSP),
        ],
    );
    println!("port binding options after the RARP: {pb}");
    assert!(
        pb.contains("additional-chassis-activated=node-b"),
        "ovn-controller on node-b recorded the activation: {pb}"
    );

    // --- switchover complete: the port, unchanged in name, on node-b only ---
    let t = plan_underlay(&mc_spec(), &[mc_vm("node-b", &[])]).expect("plan");
    let r = env.reconcile(&t);
    assert_eq!(r.table("Logical_Switch_Port").updated, 1, "{r}");
    assert_eq!(r.totals().inserted + r.totals().deleted, 0, "{r}");
    drop(src);
    wait_until(WAIT, "the port bound on node-b only", || {
        (bound_on(lab, mc::LSP, "chassis") == ["node-b"]
            && bound_on(lab, mc::LSP, "additional_chassis").is_empty())
        .then_some(())
    });
    wait_until(
        WAIT,
        "the ToR to reach the VM on node-b after the switchover",
        || tor.ping_once(mc::VM_IP).then_some(()),
    );

    drop(dst);
    drop(wire);
}
