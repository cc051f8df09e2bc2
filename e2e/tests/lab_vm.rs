//! The lab's VMs are real: the guest boots under libvirt (TCG) on node-a with its NIC on
//! node-a's OVN chassis, gets its /32 lease from OVN's native DHCP, answers ping from a test
//! namespace plugged into node-b, and keeps answering after a libvirt live migration to
//! node-b (OVN multi-chassis binding with RARP activation).

use std::time::{Duration, Instant};

use roam_e2e::{
    Lab, Node, Pinger, TestNetns, VmCleanup, nbctl, plug_netns, run, try_run, vsctl, wait_until,
};
use roam_vm_shim::domain::Accel;
use roam_vm_shim::spec::{LaunchBoot, LaunchNic, VmSpec};
use virt::connect::Connect;
use virt::domain::MigrateParameters;
use virt::sys;

const DOMAIN: &str = "e2e-smoke-guest";
const LS: &str = "e2e-vm-ls";
const LR: &str = "e2e-vm-lr";
const GUEST_LSP: &str = "e2e-vm-guest";
const PROBE_LSP: &str = "e2e-vm-probe";
const GUEST_MAC: &str = "52:54:00:e2:e0:0a";
const GUEST_IP: &str = "10.250.1.10";
const PROBE_MAC: &str = "0a:00:00:e2:e0:20";
const PROBE_IP: &str = "10.250.1.20";
const GW: &str = "10.250.0.1";
const GW_MAC: &str = "0a:00:00:e2:e0:01";
const TAP: &str = "e2evm0";

/// Removes the test's OVN rows (its switch, router and DHCP options), also after a failure
/// midway.
struct OvnRows {
    lab: Lab,
}

impl OvnRows {
    fn clean(&self) {
        let db = format!("--db={}", self.lab.nb());
        let _ = try_run("ovn-nbctl", &[&db, "--if-exists", "ls-del", LS]);
        let _ = try_run("ovn-nbctl", &[&db, "--if-exists", "lr-del", LR]);
        if let Ok(rows) = try_run(
            "ovn-nbctl",
            &[
                &db,
                "--bare",
                "--columns=_uuid",
                "find",
                "DHCP_Options",
                &format!("cidr=\"{GUEST_IP}/32\""),
            ],
        ) {
            for r in rows.split_whitespace() {
                let _ = try_run("ovn-nbctl", &[&db, "destroy", "DHCP_Options", r]);
            }
        }
    }
}

impl Drop for OvnRows {
    fn drop(&mut self) {
        self.clean();
    }
}

/// The guards of everything the test creates, after removing a killed run's leftovers: the
/// guest's domain and tap and the probe's OVS port on both nodes, then the OVN rows.
fn cleanup(lab: &Lab) -> (VmCleanup, OvnRows) {
    let vm = VmCleanup::new(lab)
        .vm(DOMAIN, &[TAP])
        .ovs_port("e2eprobe0")
        .cleaned();
    let ovn = OvnRows { lab: lab.clone() };
    ovn.clean();
    // a tuple drops its fields in order: the VM, then the OVN rows
    (vm, ovn)
}

/// The guest, as roam-shim describes it (so the shim's domain XML is what libvirt runs).
fn domain_xml(lab: &Lab, serial: &str) -> String {
    let (kernel, initrd) = lab.guest();
    let spec = VmSpec {
        name: DOMAIN.into(),
        vcpus: 1,
        memory_mib: 256,
        boot: LaunchBoot::Kernel {
            kernel: kernel.into(),
            initrd: Some(initrd.into()),
            cmdline: "console=ttyS0 quiet panic=-1".into(),
        },
        nics: vec![LaunchNic {
            mac: GUEST_MAC.parse().unwrap(),
            tap: TAP.into(),
            ovn_port: GUEST_LSP.into(),
        }],
        serial_log: serial.into(),
    };
    roam_vm_shim::domain::domain_xml(&spec, Accel::Tcg).expect("a valid VM spec")
}

/// A kernel tap on `node`, plugged into its br-int as the guest's logical port.
fn guest_tap(node: &Node) {
    run(
        "ip",
        &[
            "-n",
            &node.netns,
            "tuntap",
            "add",
            "dev",
            TAP,
            "mode",
            "tap",
        ],
    );
    run(
        "ip",
        &["-n", &node.netns, "link", "set", TAP, "mtu", "1500", "up"],
    );
    vsctl(
        node,
        &[
            "--may-exist",
            "add-port",
            "br-int",
            TAP,
            "--",
            "set",
            "interface",
            TAP,
            &format!("external_ids:iface-id={GUEST_LSP}"),
        ],
    );
}

fn topology(lab: &Lab) {
    nbctl(lab, &["ls-add", LS]);
    nbctl(lab, &["lr-add", LR]);
    nbctl(
        lab,
        &["lrp-add", LR, "e2e-vm-lr-ls", GW_MAC, &format!("{GW}/16")],
    );
    nbctl(
        lab,
        &[
            "lsp-add",
            LS,
            "e2e-vm-ls-lr",
            "--",
            "lsp-set-type",
            "e2e-vm-ls-lr",
            "router",
            "--",
            "lsp-set-addresses",
            "e2e-vm-ls-lr",
            "router",
            "--",
            "lsp-set-options",
            "e2e-vm-ls-lr",
            "router-port=e2e-vm-lr-ls",
        ],
    );
    nbctl(
        lab,
        &[
            "lsp-add",
            LS,
            GUEST_LSP,
            "--",
            "lsp-set-addresses",
            GUEST_LSP,
            &format!("{GUEST_MAC} {GUEST_IP}"),
        ],
    );
    nbctl(
        lab,
        &["lsp-set-options", GUEST_LSP, "requested-chassis=node-a"],
    );
    let routes = format!("{{{GW}/32,0.0.0.0, 0.0.0.0/0,{GW}}}");
    let dhcp = nbctl(
        lab,
        &[
            "create",
            "DHCP_Options",
            &format!("cidr={GUEST_IP}/32"),
            &format!(
                "options=\"lease_time\"=\"3600\" \"router\"=\"{GW}\" \"server_id\"=\"{GW}\" \"server_mac\"=\"{GW_MAC}\" \
                 \"classless_static_route\"=\"{routes}\" \"ms_classless_static_route\"=\"{routes}\" \"mtu\"=\"1500\""
            ),
        ],
    );
    nbctl(lab, &["lsp-set-dhcpv4-options", GUEST_LSP, dhcp.trim()]);
    nbctl(
        lab,
        &[
            "lsp-add",
            LS,
            PROBE_LSP,
            "--",
            "lsp-set-addresses",
            PROBE_LSP,
            &format!("{PROBE_MAC} {PROBE_IP}"),
        ],
    );
}

fn serial_text(path: &str) -> String {
    std::fs::read(path)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default()
}

#[test]
fn guest_boots_gets_its_lease_from_ovn_answers_ping_and_live_migrates() {
    let lab = Lab::get();
    let (a, b) = (lab.node("node-a"), lab.node("node-b"));
    let cleanup = cleanup(&lab);

    topology(&lab);
    guest_tap(&a);
    let probe = TestNetns::new("vmprobe");
    plug_netns(&b, &probe, "e2eprobe0", PROBE_LSP, PROBE_MAC, PROBE_IP, GW);
    nbctl(&lab, &["--wait=hv", "sync"]);

    let serial = lab
        .dir()
        .join("e2e-smoke-guest.serial.log")
        .display()
        .to_string();
    let _ = std::fs::remove_file(&serial);
    let conn_a =
        Connect::open(Some(&lab.test_libvirt(&a.name).uri)).expect("connect to node-a's libvirtd");
    let conn_b =
        Connect::open(Some(&lab.test_libvirt(&b.name).uri)).expect("connect to node-b's libvirtd");
    let t0 = Instant::now();
    let dom = conn_a
        .create_domain_xml(&domain_xml(&lab, &serial), 0)
        .expect("start the guest on node-a");

    // the lease, from OVN's native DHCP, as the guest's udhcpc hook reports it
    wait_until(
        Duration::from_secs(180),
        "the guest's DHCP lease from OVN (serial log)",
        || {
            let s = serial_text(&serial);
            (s.contains(&format!("lease of {GUEST_IP} obtained from {GW}"))
                && s.contains("ROAM-GUEST-SERVICES-UP"))
            .then_some(())
        },
    );
    let s = serial_text(&serial);
    assert!(
        s.contains(&format!("inet {GUEST_IP}/32")),
        "a /32 address in the guest:\n{s}"
    );
    assert!(
        s.contains(&format!("default via {GW} dev eth0")),
        "a default route via the gateway:\n{s}"
    );
    assert!(
        s.contains(&format!("{GW} dev eth0 scope link")),
        "an on-link route to the gateway:\n{s}"
    );
    println!(
        "guest booted and leased {GUEST_IP} in {:.1} s",
        t0.elapsed().as_secs_f64()
    );

    wait_until(
        Duration::from_secs(60),
        "the guest to answer ping from node-b's test namespace",
        || probe.ping_once(GUEST_IP).then_some(()),
    );

    // Live migration to node-b: let the port live on both chassis, node-b activating it on
    // the guest's RARP after the switchover.
    nbctl(
        &lab,
        &[
            "lsp-set-options",
            GUEST_LSP,
            "requested-chassis=node-a,node-b",
            "activation-strategy=rarp",
        ],
    );
    guest_tap(&b);
    nbctl(&lab, &["--wait=hv", "sync"]);
    let pinger = Pinger::start(&probe, GUEST_IP, "0.01");
    std::thread::sleep(Duration::from_millis(300)); // some replies before the migration starts
    let params = MigrateParameters {
        uri: Some(format!("tcp://{}", b.ip)),
        ..Default::default()
    };
    let migrated = dom
        .migrate3(&conn_b, params, sys::VIR_MIGRATE_LIVE)
        .expect("live migration to node-b");
    wait_until(
        Duration::from_secs(30),
        "the guest to answer on node-b",
        || probe.ping_once(GUEST_IP).then_some(()),
    );
    let (replies, longest) = pinger.stop();
    nbctl(
        &lab,
        &["lsp-set-options", GUEST_LSP, "requested-chassis=node-b"],
    );

    let stats = migrated.job_stats(sys::VIR_DOMAIN_JOB_STATS_COMPLETED).ok();
    println!(
        "migrated to node-b: libvirt downtime {:?} ms, {replies} ping replies, longest silence {:.0} ms",
        stats.as_ref().and_then(|s| s.downtime),
        longest.as_secs_f64() * 1000.0
    );
    assert!(migrated.is_active().unwrap(), "the guest runs on node-b");
    assert!(
        conn_a
            .lookup_domain_by_name(DOMAIN)
            .map(|d| !d.is_active().unwrap_or(false))
            .unwrap_or(true),
        "the guest no longer runs on node-a"
    );
    assert!(replies > 0, "the guest answered while migrating");
    for _ in 0..5 {
        assert!(
            probe.ping_once(GUEST_IP),
            "the guest keeps answering on node-b"
        );
    }
    drop(cleanup);
}
