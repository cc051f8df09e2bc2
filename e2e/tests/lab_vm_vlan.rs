//! VirtualMachines on the VLAN underlay and with two interfaces, live-migrating, on the lab,
//! through the Kubernetes API only (roam-controller as a child process, launcher pods started
//! by the real kubelets, the nodes' libvirtd, real OVN):
//!
//! - `v8vm1`: one interface on VLAN 150 with a pinned (static) IP that OVN's DHCP hands out;
//!   it boots, takes its lease, answers the ToR on VLAN 150, and live-migrates a→b→a keeping
//!   IP and MAC, its VLAN port multi-chassis (`requested-chassis=a,b`, RARP activation) while
//!   the migration runs and single-chassis after; the longest gap of the ToR's 2 ms pings and
//!   libvirt's downtime are printed;
//! - `v8vm2`: overlay `eth0` + `eth1` on VLAN 151 by DHCP: one Address per interface, both
//!   NICs in the launcher (`--nics`), a lease on each; migrated a→b: the /32 flipped in the
//!   pause window, the VLAN port multi-chassis, status lists both interfaces unchanged, the
//!   ToR reaches eth1 and an overlay client reaches eth0 afterwards;
//! - bad input (a VLAN interface naming a missing or an overlay Network, two interfaces on one
//!   Network): Failed with the reason in a condition and a Warning Event; no Address, no pod.
//!
//! Overrides (until the lab's own images carry this branch's roam-shim and guest):
//! `ROAM_V8_LAUNCHER_IMAGE` (default: the controller's default launcher image) and
//! `ROAM_V8_GUEST_INITRD` (default: the lab's guest initramfs; `v8vm2` needs one whose init
//! takes a lease on every NIC, as `e2e/guest` now does).

use std::time::{Duration, Instant};

mod migration_fixture;

use migration_fixture::{apply_crds, create, events_in, get, kubectl, switchover_ms, try_kubectl};
use roam_e2e::{
    ControllerProcess, Lab, Pinger, TestNetns, VlanTor, VmCleanup, try_run, wait_until,
};
use serde_json::{Value, json};

const NS: &str = "v8-vms";
const OVL: &str = "v8ovl";
const V150: &str = "v8vlan150";
const V151: &str = "v8vlan151";
const PHYSNET: &str = "v8phys";
const VM1: &str = "v8vm1";
const VM2: &str = "v8vm2";
const VM1_IP: &str = "198.18.150.50";
const TOR150: &str = "198.18.150.1";
const TOR151: &str = "198.18.151.1";
const OVL_GW: &str = "100.153.0.1";
const LONG: Duration = Duration::from_secs(150);

/// The VMs' log directory on each node (its own disk; the launcher pods create it).
const LOG_DIR: &str = "/var/log/roam/v8-vms";

/// A guest's serial log, as each node's QEMU wrote it (node-a's, then node-b's).
fn serial(lab: &Lab, vm: &str) -> String {
    roam_e2e::node_files(lab, &format!("{LOG_DIR}/{NS}_{vm}.serial.log"))
}

fn vm(lab: &Lab, name: &str) -> Value {
    get(lab, &["-n", NS, "get", "vm", name]).expect("the VM")
}

fn events_of(lab: &Lab, name: &str) -> String {
    events_in(lab, NS, name)
}

fn lsp_options(lab: &Lab, lsp: &str) -> String {
    try_run(
        "ovn-nbctl",
        &[
            &format!("--db={}", lab.nb()),
            "--if-exists",
            "get",
            "Logical_Switch_Port",
            lsp,
            "options",
        ],
    )
    .unwrap_or_default()
}

/// Everything the test creates in Kubernetes, the VMs' domains, taps and logs, and the
/// overlay client's OVS port (its device goes with its namespace, the port does not):
/// removed first (leftovers of a killed run) and on drop. Declared after the controller so
/// it drops after it.
fn objects(lab: &Lab) -> VmCleanup {
    let mut guard = VmCleanup::new(lab).namespace(NS);
    for net in [OVL, V150, V151] {
        guard = guard.network(net);
    }
    for name in [VM1, VM2] {
        // a launcher killed without its shim's shutdown leaves taps and OVS ports
        let key = format!("{NS}/{name}");
        let taps: Vec<String> = (0..2).map(|i| roam_core::vm::nic_tap(&key, i)).collect();
        let taps: Vec<&str> = taps.iter().map(String::as_str).collect();
        guard = guard.vm(&format!("{NS}_{name}"), &taps);
    }
    let guard = guard.ovs_port("v8cli").node_path(LOG_DIR).cleaned();
    apply_crds(lab);
    roam_e2e::create_test_namespace(lab, NS);
    guard
}

/// The OVN rows of the test's Networks (the controller reconciles them; a killed run's are
/// removed by a reconcile to nothing).
struct OvnRows {
    lab: Lab,
}

impl OvnRows {
    fn new(lab: &Lab) -> OvnRows {
        let o = OvnRows { lab: lab.clone() };
        o.clean();
        o
    }
    fn clean(&self) {
        for net in [OVL, V150, V151] {
            roam_e2e::reconcile_on_lab(
                &self.lab,
                net,
                &roam_network::topology::Topology::default(),
            );
        }
    }
}

impl Drop for OvnRows {
    fn drop(&mut self) {
        self.clean();
    }
}

/// On a failure: the controller's log tail, the launcher pods and their shims' logs.
struct OnPanic<'a> {
    lab: &'a Lab,
    ctl: &'a ControllerProcess,
}

impl Drop for OnPanic<'_> {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        eprintln!("--- controller log ---\n{}", self.ctl.log_tail(80));
        let pods = try_kubectl(self.lab, &["-n", NS, "get", "pods", "-o", "wide"]);
        eprintln!("--- pods ---\n{}", pods.unwrap_or_else(|e| e));
        for vm in [VM1, VM2] {
            let pod = format!("{vm}-launcher");
            let logs = try_kubectl(
                self.lab,
                &["-n", NS, "logs", &pod, "--all-containers", "--tail=30"],
            );
            eprintln!("--- {pod} ---\n{}", logs.unwrap_or_else(|e| e));
        }
    }
}

/// Annotate `name` to migrate to `to`; while it runs, record whether every port in `vlan_ports`
/// was seen requested on both nodes with RARP activation. Returns the ended migration and
/// whether multi-chassis was seen.
fn migrate(lab: &Lab, name: &str, to: &str, vlan_ports: &[&str]) -> (Value, bool) {
    let list = |lab: &Lab| -> Vec<Value> {
        get(
            lab,
            &[
                "-n",
                NS,
                "get",
                "vmim",
                "-l",
                &format!("roam.dev/vm={name}"),
            ],
        )
        .and_then(|l| l["items"].as_array().cloned())
        .unwrap_or_default()
    };
    let before: Vec<String> = list(lab)
        .iter()
        .map(|m| {
            m["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect();
    kubectl(
        lab,
        &[
            "-n",
            NS,
            "annotate",
            "vm",
            name,
            &format!("roam.dev/migrate-to={to}"),
        ],
    );
    let mut multi = false;
    let m = wait_until(LONG, "the migration to end", || {
        if !multi && !vlan_ports.is_empty() {
            multi = vlan_ports.iter().all(|p| {
                let o = lsp_options(lab, p);
                (o.contains("requested-chassis=\"node-a,node-b\"")
                    || o.contains("requested-chassis=\"node-b,node-a\""))
                    && o.contains("activation-strategy=rarp")
            });
        }
        let m = list(lab).into_iter().find(|m| {
            !before.contains(
                &m["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            )
        })?;
        let phase = m["status"]["phase"].as_str().unwrap_or_default();
        ["Succeeded", "Failed", "Aborted"]
            .contains(&phase)
            .then_some(m)
    });
    (m, multi)
}

/// The VLAN port of Address `addr` is on `node` alone (no second chassis, no activation).
fn single_chassis(lab: &Lab, lsp: &str, node: &str) {
    wait_until(LONG, "the VLAN port on one chassis", || {
        let o = lsp_options(lab, lsp);
        (o.contains(&format!("requested-chassis={node}")) && !o.contains("activation-strategy"))
            .then_some(())
    });
}

#[test]
fn vms_on_vlans_and_with_two_interfaces_live_migrate_keeping_their_addresses() {
    let lab = Lab::get();
    let started = Instant::now();
    let launcher = std::env::var("ROAM_V8_LAUNCHER_IMAGE").ok();
    let (kernel, lab_initrd) = lab.guest();
    let initrd = std::env::var("ROAM_V8_GUEST_INITRD").unwrap_or(lab_initrd);
    eprintln!(
        "launcher image: {}; guest initrd: {initrd}",
        launcher.as_deref().unwrap_or("(the controller's default)")
    );

    // --- the wire: VLANs 150 and 151 on physnet v8phys, a ToR on each ---
    let wire = VlanTor::new(
        &lab,
        PHYSNET,
        "br-v8",
        ("v8w-a", "v8w-b"),
        "v8tor",
        &[
            ("v8tor150", 150, "198.18.150.1/24"),
            ("v8tor151", 151, "198.18.151.1/24"),
        ],
    );
    let tor = &wire.tor;
    let ovn = OvnRows::new(&lab);
    let objects = objects(&lab);
    let mut args = vec![
        "--leader-elect",
        "false",
        "--network-selector",
        "roam.dev/test=v8",
        "--node-selector",
        "roam.dev/lab=true",
        "--pod-namespace",
        NS,
        "--shim-ports",
        "17300-17399",
        "--vm-log-dir",
        LOG_DIR,
        "--launcher-priority-class",
        "system-node-critical",
    ];
    if let Some(img) = &launcher {
        args.extend(["--launcher-image", img.as_str()]);
    }
    let ctl = ControllerProcess::start(&lab, "v8-controller", 18153, &args);
    let _on_panic = OnPanic {
        lab: &lab,
        ctl: &ctl,
    };
    let net = |name: &str, mut spec: Value| {
        spec["namespaces"] = json!([NS]);
        json!({"apiVersion": "roam.dev/v1alpha1", "kind": "Network",
               "metadata": {"name": name, "labels": {"roam.dev/test": "v8"}}, "spec": spec})
    };
    let boot = json!({"kernel": {"kernel": kernel, "initrd": initrd,
                                 "cmdline": "console=ttyS0 quiet panic=-1"}});
    let a_vm = |name: &str, interfaces: Value| {
        json!({"apiVersion": "roam.dev/v1alpha1", "kind": "VirtualMachine",
               "metadata": {"name": name, "namespace": NS},
               "spec": {"cpu": 1, "memoryMiB": 256, "node": "node-a", "boot": boot,
                        "interfaces": interfaces}})
    };
    create(
        &lab,
        &[
            net(
                OVL,
                json!({"subnet": "100.153.0.0/24", "transitSubnet": "169.254.153.0/24",
                       "poolSizePerNode": 2, "mtu": 1400}),
            ),
            net(
                V150,
                json!({"mode": "underlay", "vlan": 150, "subnet": "198.18.150.0/24",
                       "gateway": TOR150, "physnet": PHYSNET, "poolSizePerNode": 1,
                       "excluded": ["198.18.150.2-198.18.150.9"]}),
            ),
            net(
                V151,
                json!({"mode": "underlay", "vlan": 151, "subnet": "198.18.151.0/24",
                       "gateway": TOR151, "physnet": PHYSNET, "poolSizePerNode": 1}),
            ),
        ],
    );
    for n in [OVL, V150, V151] {
        wait_until(LONG, "the Network Ready", || {
            let v = get(&lab, &["get", "network", n])?;
            v["status"]["conditions"]
                .as_array()?
                .iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
                .then_some(())
        });
    }

    // --- the two VMs boot together on node-a ---
    create(
        &lab,
        &[
            a_vm(
                VM1,
                json!([{"name": "eth0", "network": V150, "ip": VM1_IP}]),
            ),
            a_vm(
                VM2,
                json!([{"name": "eth0", "network": OVL},
                       {"name": "eth1", "mode": "underlay", "network": V151}]),
            ),
        ],
    );

    // --- bad input meanwhile: refused, nothing created ---
    let bad = [
        (
            "v8vm-bad1",
            json!([{"name": "eth0", "mode": "underlay", "network": "v8nope"}]),
            "no usable Network \"v8nope\"",
        ),
        (
            "v8vm-bad2",
            json!([{"name": "eth0", "mode": "underlay", "network": OVL}]),
            "Network v8ovl is Overlay",
        ),
        (
            "v8vm-bad3",
            json!([{"name": "eth0", "network": V150}, {"name": "eth1", "vlan": 150}]),
            "eth0 and eth1 are both on Network v8vlan150",
        ),
    ];
    create(
        &lab,
        &bad.iter()
            .map(|(n, i, _)| a_vm(n, i.clone()))
            .collect::<Vec<_>>(),
    );
    for (name, _, why) in &bad {
        let cond = wait_until(LONG, "the bad VM refused", || {
            let v = vm(&lab, name);
            (v["status"]["phase"] == "Failed").then(|| v["status"]["conditions"].clone())
        });
        let ready = cond
            .as_array()
            .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
            .cloned()
            .unwrap_or_default();
        assert_eq!(ready["status"], "False", "{cond}");
        let msg = ready["message"].as_str().unwrap_or_default();
        assert!(msg.contains(why), "{name}: {msg:?} should say {why:?}");
        let ev = wait_until(LONG, "the Warning Event", || {
            let e = events_of(&lab, name);
            e.contains("Warning").then_some(e)
        });
        assert!(ev.contains(why), "{name}: {ev}");
        let pods = get(
            &lab,
            &[
                "-n",
                NS,
                "get",
                "pods",
                "-l",
                &format!("roam.dev/vm={name}"),
            ],
        )
        .expect("pods");
        assert_eq!(pods["items"], json!([]), "{name}: no launcher pod");
        let owned = get(&lab, &["get", "addresses"]).expect("addresses")["items"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|a| a["spec"]["owner"] == format!("{NS}/{name}"))
            .count();
        assert_eq!(owned, 0, "{name}: no Address claimed");
        eprintln!("{name}: refused: {msg}");
    }

    // --- both VMs run, with their leases ---
    let st1 = wait_until(LONG, "v8vm1 Running", || {
        let v = vm(&lab, VM1);
        (v["status"]["phase"] == "Running").then(|| v["status"].clone())
    });
    let st2 = wait_until(LONG, "v8vm2 Running", || {
        let v = vm(&lab, VM2);
        (v["status"]["phase"] == "Running").then(|| v["status"].clone())
    });
    let ifs1 = st1["interfaces"].as_array().cloned().unwrap_or_default();
    assert_eq!(ifs1.len(), 1, "{st1}");
    assert_eq!(ifs1[0]["ip"], VM1_IP, "the pinned IP: {st1}");
    let mac1 = ifs1[0]["mac"].as_str().unwrap().to_string();
    let port1 = ifs1[0]["address"].as_str().unwrap().to_string();
    let ifs2 = st2["interfaces"].as_array().cloned().unwrap_or_default();
    let names: Vec<&str> = ifs2.iter().filter_map(|i| i["name"].as_str()).collect();
    assert_eq!(names, ["eth0", "eth1"], "{st2}");
    let ovl_ip = ifs2[0]["ip"].as_str().unwrap().to_string();
    let vlan_ip = ifs2[1]["ip"].as_str().unwrap().to_string();
    assert!(ovl_ip.starts_with("100.153.0."), "{st2}");
    assert!(vlan_ip.starts_with("198.18.151."), "{st2}");
    let port2 = ifs2[1]["address"].as_str().unwrap().to_string();
    for (i, want) in [(0, OVL), (1, V151)] {
        let a = get(
            &lab,
            &["get", "address", ifs2[i]["address"].as_str().unwrap()],
        )
        .expect("the Address");
        assert_eq!(a["spec"]["network"], want, "{a}");
        assert_eq!(a["spec"]["owner"], format!("{NS}/{VM2}"), "{a}");
        assert_eq!(a["spec"]["dhcp"], true, "{a}");
    }
    // the pod that runs the VM: its runner, with runners (as installed)
    let (rns, runner2) = roam_e2e::runner_of_launcher(&lab, NS, st2["pod"].as_str().unwrap());
    let pod2 = get(&lab, &["-n", &rns, "get", "pod", &runner2]).unwrap();
    let shim2 = pod2["spec"]["containers"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == "shim"))
        .expect("the launcher's shim container");
    let args2: Vec<String> = serde_json::from_value(shim2["args"].clone()).unwrap();
    let nics = &args2[args2.iter().position(|a| a == "--nics").expect("--nics") + 1];
    assert_eq!(
        nics.split(',').count(),
        2,
        "both NICs in the launcher: {nics}"
    );
    wait_until(LONG, "v8vm1's lease (serial log)", || {
        let s = serial(&lab, VM1);
        (s.contains(&format!("lease of {VM1_IP} obtained")) && s.contains("ROAM-GUEST-SERVICES-UP"))
            .then_some(())
    });
    wait_until(LONG, "v8vm2's two leases (serial log)", || {
        let s = serial(&lab, VM2);
        (s.contains(&format!("lease of {ovl_ip} obtained"))
            && s.contains(&format!("lease of {vlan_ip} obtained")))
        .then_some(())
    });
    wait_until(LONG, "the ToR reaches v8vm1 on VLAN 150", || {
        tor.ping_once(VM1_IP).then_some(())
    });
    wait_until(LONG, "the ToR reaches v8vm2's eth1 on VLAN 151", || {
        tor.ping_once(&vlan_ip).then_some(())
    });
    // an overlay client: a pod on node-b, plumbed by roam-cni (the nodes' CNI)
    create(&lab, &[roam_e2e::sleeper_pod(NS, "v8client", "node-b")]);
    let cli = wait_until(LONG, "the client's address", || {
        let p = get(&lab, &["-n", NS, "get", "pod", "v8client"])?;
        let a: Vec<Value> =
            serde_json::from_str(p["metadata"]["annotations"]["roam.dev/addresses"].as_str()?)
                .ok()?;
        a.first().cloned()
    });
    let cli_ns = TestNetns::of_pod(&lab, NS, "v8client", "v8cli");
    cli_ns.assert_overlay_eth0(cli["ip"].as_str().unwrap(), OVL_GW);
    wait_until(LONG, "the overlay client reaches v8vm2's eth0", || {
        cli_ns.ping_once(&ovl_ip).then_some(())
    });
    eprintln!(
        "booted: v8vm1 {VM1_IP} {mac1}; v8vm2 eth0 {ovl_ip}, eth1 {vlan_ip} ({:.0?} in)",
        started.elapsed()
    );

    // --- v8vm1 a→b→a under the ToR's 2 ms pings ---
    for (to, from) in [("node-b", "node-a"), ("node-a", "node-b")] {
        let window = Instant::now();
        let pinger = Pinger::start(tor, VM1_IP, "0.002");
        std::thread::sleep(Duration::from_millis(300));
        let (m, multi) = migrate(&lab, VM1, to, &[&port1]);
        let st = &m["status"];
        assert_eq!(st["phase"], "Succeeded", "{m}\n{}", ctl.log_tail(60));
        assert_eq!(
            (st["sourceNode"].as_str(), st["targetNode"].as_str()),
            (Some(from), Some(to))
        );
        assert!(
            multi,
            "the VLAN port was requested on both chassis with RARP activation"
        );
        wait_until(LONG, "the ToR reaches v8vm1 after the migration", || {
            tor.ping_once(VM1_IP).then_some(())
        });
        let (replies, gap) = pinger.stop();
        let sent = window.elapsed().as_millis() as usize / 2;
        let v = wait_until(LONG, "v8vm1 Running on the target", || {
            let v = vm(&lab, VM1)["status"].clone();
            (v["phase"] == "Running" && v["node"] == to && v["migration"].is_null()).then_some(v)
        });
        assert_eq!(v["interfaces"][0]["ip"], VM1_IP, "same IP");
        assert_eq!(v["interfaces"][0]["mac"], mac1.as_str(), "same MAC");
        single_chassis(&lab, &port1, to);
        // 2 ms pings across the whole migration: the pinger kept reading (a blocked pinger
        // stops at its pipe's size whatever the window); a quarter of the pings sent in the
        // window leaves room for a loaded machine
        assert!(
            replies * 4 > sent,
            "the pings cover the migration: {replies} replies, ~{sent} sent"
        );
        eprintln!(
            "v8vm1 {from} → {to} (VLAN 150): libvirt downtime {} ms, longest ping gap at the ToR \
             {:.1} ms ({replies} replies), multi-chassis during the copy: {multi}",
            st["downtimeMs"],
            gap.as_secs_f64() * 1000.0
        );
    }

    // --- v8vm2 a→b: both ports (overlay and VLAN) multi-chassis, activated at the pause ---
    let pinger = Pinger::start(tor, &vlan_ip, "0.002");
    let cli_pinger = Pinger::start(&cli_ns, &ovl_ip, "0.002");
    std::thread::sleep(Duration::from_millis(300));
    let (m, multi) = migrate(&lab, VM2, "node-b", &[&port2]);
    let st = &m["status"];
    assert_eq!(st["phase"], "Succeeded", "{m}\n{}", ctl.log_tail(60));
    assert!(
        multi,
        "eth1's VLAN port was multi-chassis during the migration"
    );
    assert!(
        switchover_ms(&lab, NS, m["metadata"]["name"].as_str().unwrap_or_default()).is_some(),
        "the target activated both ports, timed from the pause: {st}"
    );
    wait_until(LONG, "the ToR reaches eth1 after the migration", || {
        tor.ping_once(&vlan_ip).then_some(())
    });
    wait_until(LONG, "the client reaches eth0 after the migration", || {
        cli_ns.ping_once(&ovl_ip).then_some(())
    });
    let (vlan_replies, vlan_gap) = pinger.stop();
    let (ovl_replies, ovl_gap) = cli_pinger.stop();
    let v = wait_until(LONG, "v8vm2 Running on node-b", || {
        let v = vm(&lab, VM2)["status"].clone();
        (v["phase"] == "Running" && v["node"] == "node-b" && v["migration"].is_null()).then_some(v)
    });
    assert_eq!(
        v["interfaces"], st2["interfaces"],
        "every interface unchanged"
    );
    let ovl_addr = ifs2[0]["address"].as_str().unwrap();
    let a = get(&lab, &["get", "address", ovl_addr]).expect("the overlay Address");
    assert_eq!(a["spec"]["host"], "node-b", "{a}");
    single_chassis(&lab, &port2, "node-b");
    assert!(
        vlan_replies > 0 && ovl_replies > 0,
        "both interfaces answered pings around the migration: {vlan_replies}, {ovl_replies} replies"
    );
    eprintln!(
        "v8vm2 node-a → node-b: libvirt downtime {} ms, /32 flipped {} ms after the pause; \
         longest ping gap eth0 (overlay) {:.1} ms, eth1 (VLAN 151, ToR) {:.1} ms",
        st["downtimeMs"],
        st["switchoverMs"],
        ovl_gap.as_secs_f64() * 1000.0,
        vlan_gap.as_secs_f64() * 1000.0
    );
    assert!(
        events_of(&lab, VM2).contains("MigrationSucceeded"),
        "{}",
        events_of(&lab, VM2)
    );
    eprintln!("lab time {:.0?}", started.elapsed());
    drop(cli_ns);
    drop(_on_panic);
    drop(ctl);
    drop(objects);
    drop(ovn);
    drop(wire);
}
