//! roam's /32 lease on the datapath: the reconciler programs an overlay with OVN native DHCP
//! for two ports, one on each node; a namespace on node-a takes its lease with busybox
//! **udhcpc** (through roam's guest hook), one on node-b with ISC **dhclient** (through
//! Debian's own dhclient-script and its RFC 3442 hook). Both end with the /32, the on-link
//! route to the gateway and the default route via it — the lease's leading
//! `GW/32,0.0.0.0` route is what makes dhclient install any route at all — and then reach
//! each other across geneve through the fabric router.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::Duration;

use roam_e2e::{
    Lab, LabNetwork, PortBuilder, TestNetns, attach_netns, overlay_fixture, reconcile_on_lab, run,
    wait_until,
};
use roam_network::topology::{PortSpec, plan_overlay};

const NET: &str = "e2e-dhcp";
const GW: &str = "100.101.0.1";

fn port(i: u8, node: &str) -> PortSpec {
    PortBuilder::new(format!("d{i}"), Ipv4Addr::new(100, 101, 1, i), node)
        .dhcp(true)
        .build()
}

fn routes(ns: &TestNetns) -> String {
    ns.run("ip", &["-4", "route", "show"])
}

fn assert_lease(ns: &TestNetns, dev: &str, ip: &str, client: &str) {
    let addr = ns.run("ip", &["-4", "-o", "addr", "show", "dev", dev]);
    assert!(
        addr.contains(&format!("inet {ip}/32")),
        "{client}: a /32 address: {addr}"
    );
    let r = routes(ns);
    assert!(
        r.lines()
            .any(|l| l.starts_with(&format!("{GW} dev {dev}")) && l.contains("scope link")),
        "{client}: on-link route to the gateway:\n{r}"
    );
    assert!(
        r.lines()
            .any(|l| l.starts_with(&format!("default via {GW} dev {dev}"))),
        "{client}: default route via the gateway:\n{r}"
    );
}

#[test]
fn udhcpc_and_dhclient_take_the_32_lease_and_reach_each_other() {
    let lab = Lab::get();
    let network = LabNetwork::new(
        &lab,
        NET,
        &[("node-a", "e2edhcp-a1"), ("node-b", "e2edhcp-b2")],
    );
    let (mut spec, nodes) = overlay_fixture(NET, 101);
    spec.dns = vec!["100.101.0.53".parse().unwrap()];
    let ports = [port(11, "node-a"), port(12, "node-b")];
    reconcile_on_lab(
        &lab,
        NET,
        &plan_overlay(&spec, &nodes, &ports).expect("plan"),
    );
    run(
        "ovn-nbctl",
        &[&format!("--db={}", lab.nb()), "--wait=hv", "sync"],
    );

    // udhcpc on node-a, with roam's guest hook (/32-aware, RFC 3442 option 121 first); in a
    // test namespace it logs to stderr and keeps its state in the test's directory
    let dir = lab.dir().join("e2e-dhcp");
    std::fs::create_dir_all(&dir).unwrap();
    let guest_hook =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("guest/initramfs/etc/udhcpc/default.script");
    let hook = dir.join("udhcpc.script");
    let text = std::fs::read_to_string(&guest_hook).expect("the guest's udhcpc hook");
    std::fs::write(
        &hook,
        text.replace("/dev/console", "/dev/stderr")
            .replace("/run/udhcpc.", &format!("{}/udhcpc.", dir.display())),
    )
    .unwrap();
    run("chmod", &["+x", hook.to_str().unwrap()]);
    let a = TestNetns::new("dhcp-a");
    attach_netns(
        &lab.node("node-a"),
        &a,
        "e2edhcp-a1",
        "d11.node-a",
        &ports[0].mac.to_string(),
    );
    wait_until(
        Duration::from_secs(60),
        "udhcpc to get a lease from OVN",
        || {
            a.try_run(
                "busybox",
                &[
                    "udhcpc",
                    "-i",
                    "e2edhcp-a1",
                    "-f",
                    "-q",
                    "-n",
                    "-t",
                    "5",
                    "-T",
                    "1",
                    "-O",
                    "staticroutes",
                    "-O",
                    "msstaticroutes",
                    "-s",
                    hook.to_str().unwrap(),
                ],
            )
            .ok()
        },
    );
    assert_lease(&a, "e2edhcp-a1", "100.101.1.11", "udhcpc");

    // dhclient on node-b, with Debian's dhclient-script (resolv.conf writing off: the test
    // namespace must not touch the host's)
    let b = TestNetns::new("dhcp-b");
    attach_netns(
        &lab.node("node-b"),
        &b,
        "e2edhcp-b2",
        "d12.node-b",
        &ports[1].mac.to_string(),
    );
    let script = dir.join("dhclient-script");
    let stock = std::fs::read_to_string("/sbin/dhclient-script")
        .expect("Debian's dhclient-script (isc-dhcp-client)");
    std::fs::write(
        &script,
        stock.replace("make_resolv_conf() {", "make_resolv_conf() { return 0;"),
    )
    .unwrap();
    run("chmod", &["+x", script.to_str().unwrap()]);
    let (leases, pid) = (dir.join("leases"), dir.join("dhclient.pid"));
    let _ = std::fs::remove_file(&leases);
    let dhclient = |args: &[&str]| {
        let mut all = vec![
            "-sf",
            script.to_str().unwrap(),
            "-lf",
            leases.to_str().unwrap(),
            "-pf",
            pid.to_str().unwrap(),
        ];
        all.extend_from_slice(args);
        b.try_run("dhclient", &all)
    };
    wait_until(
        Duration::from_secs(90),
        "dhclient to get a lease from OVN",
        || dhclient(&["-1", "-v", "e2edhcp-b2"]).ok(),
    );
    // the dhclient daemon keeps running until the namespace is dropped, which kills it
    // (`dhclient -x` would run the script's STOP, which flushes the address)
    assert_lease(&b, "e2edhcp-b2", "100.101.1.12", "dhclient");
    let lease = std::fs::read_to_string(&leases).unwrap();
    assert!(
        lease.contains(
            "option rfc3442-classless-static-routes 32,100,101,0,1,0,0,0,0,0,100,101,0,1"
        ),
        "{lease}"
    );
    assert!(
        lease.contains("option subnet-mask 255.255.255.255"),
        "{lease}"
    );
    assert!(lease.contains("option interface-mtu 1400"), "{lease}");

    // and the two leased namespaces reach each other across the nodes
    wait_until(
        Duration::from_secs(60),
        "node-a's namespace to reach node-b's",
        || a.ping_once("100.101.1.12").then_some(()),
    );
    assert!(b.ping_once("100.101.1.11"), "and back");
    drop(network);
}
