//! Benchmark on the lab's real OVN (needs `e2e/lab up`):
//! `cargo bench -p roam-e2e --bench topology`.
//!
//! 1. Programming N ports (default 1000; `ROAM_BENCH_PORTS`) with DHCP options and their /32
//!    routes on an existing overlay, through roam's reconciler (one transaction) and through
//!    one `ovn-nbctl` batch doing the same rows (sent to an `ovn-nbctl --detach` daemon over
//!    its control socket, so no argument list limits N), in the same run: time to NB commit and to
//!    flows installed on both chassis (`ovn-nbctl --wait=hv sync`), and their ratio (target
//!    roam ≤ 1.2× ovn-nbctl).
//! 2. Route flips: one address moved between node-a and node-b, 100 times (`ROAM_BENCH_FLIPS`):
//!    NB commit and flows on both chassis, p50/p99 — through the full reconcile, and through
//!    the fast flip (`flip_route`) that a switchover uses.
//!
//! Figures are printed; nothing is asserted (the machine is shared and noisy; compare ratios
//! within one run).

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use roam_e2e::{Lab, PortBuilder, percentile, run};
use roam_network::northbound::{flip_route, reconcile};
use roam_network::topology::{NodeSpec, OverlaySpec, PortSpec, Topology, plan_overlay};
use roam_ovsdb::Client;

fn spec(name: &str, second_octet: u8) -> OverlaySpec {
    OverlaySpec {
        name: name.into(),
        subnet: format!("100.{second_octet}.0.0/16").parse().unwrap(),
        gateway: Ipv4Addr::new(100, second_octet, 0, 1),
        gateway_mac: "0a:00:00:e2:73:01".parse().unwrap(),
        join_subnet: format!("169.254.{second_octet}.0/24").parse().unwrap(),
        fabric_ip: Ipv4Addr::new(169, 254, second_octet, 1),
        fabric_mac: "0a:00:00:e2:73:fe".parse().unwrap(),
        mtu: 1400,
        dns: vec![],
    }
}

fn nodes(second_octet: u8) -> Vec<NodeSpec> {
    ["node-a", "node-b"]
        .iter()
        .enumerate()
        .map(|(i, n)| NodeSpec {
            name: (*n).into(),
            join_ip: Ipv4Addr::new(169, 254, second_octet, 11 + i as u8),
            join_mac: roam_dhcp_opts::MacAddr::new([0x0a, 0, 0, 0xe2, 0x73, 0x11 + i as u8]),
        })
        .collect()
}

fn ports(prefix: &str, second_octet: u8, n: usize) -> Vec<PortSpec> {
    (0..n)
        .map(|i| {
            let ip = Ipv4Addr::from(u32::from(Ipv4Addr::new(100, second_octet, 1, 0)) + i as u32);
            let node = if i % 2 == 0 { "node-a" } else { "node-b" };
            PortBuilder::new(format!("{prefix}{i}"), ip, node)
                .dhcp(true)
                .build()
        })
        .collect()
}

fn sync_hv(lab: &Lab) {
    run(
        "ovn-nbctl",
        &[
            &format!("--db={}", lab.nb()),
            "--timeout=600",
            "--wait=hv",
            "sync",
        ],
    );
}

/// An `ovn-nbctl` daemon (`--detach`): a batch goes to it over its control socket (the
/// `run` command a daemon-mode `ovn-nbctl` client sends), not through an argument list, which
/// the kernel caps at a few MB (~1 500 ports' worth of commands).
struct NbctlDaemon {
    ctl: String,
}

impl NbctlDaemon {
    fn start(lab: &Lab) -> NbctlDaemon {
        let dir = std::env::temp_dir();
        let pid = dir.join("roam-bench-nbctl.pid");
        let ctl = dir.join("roam-bench-nbctl.ctl");
        let out = run(
            "ovn-nbctl",
            &[
                &format!("--db={}", lab.nb()),
                "--timeout=600",
                "--detach",
                &format!("--pidfile={}", pid.display()),
                &format!("--unixctl={}", ctl.display()),
                "--log-file=/dev/null",
            ],
        );
        let ctl = match out.trim() {
            "" => ctl.display().to_string(),
            printed => printed.to_string(),
        };
        NbctlDaemon { ctl }
    }

    /// One batch (`-- command args -- command args …`), one NB transaction.
    fn run(&self, args: &[String]) -> String {
        use std::io::Write;
        let mut s = std::os::unix::net::UnixStream::connect(&self.ctl)
            .unwrap_or_else(|e| panic!("connect to the ovn-nbctl daemon at {}: {e}", self.ctl));
        let req = serde_json::json!({"method": "run", "params": args, "id": 0});
        s.write_all(req.to_string().as_bytes())
            .expect("send the batch");
        let reply: serde_json::Value = serde_json::Deserializer::from_reader(&mut s)
            .into_iter()
            .next()
            .expect("an answer from the ovn-nbctl daemon")
            .expect("JSON from the ovn-nbctl daemon");
        match &reply["error"] {
            serde_json::Value::Null => reply["result"].as_str().unwrap_or_default().to_string(),
            e => panic!("ovn-nbctl batch: {e}"),
        }
    }
}

impl Drop for NbctlDaemon {
    fn drop(&mut self) {
        let _ = std::process::Command::new(roam_e2e::tool("ovs-appctl"))
            .args(["-t", &self.ctl, "exit"])
            .status();
    }
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// The same rows as roam's reconciler adds for `ports`, as one ovn-nbctl batch (its commands,
/// for [`NbctlDaemon::run`]) on the skeleton of network `net`.
fn nbctl_batch(
    net: &str,
    spec: &OverlaySpec,
    nodes: &[NodeSpec],
    ports: &[PortSpec],
) -> Vec<String> {
    let mut a: Vec<String> = vec![];
    let join: std::collections::BTreeMap<&str, Ipv4Addr> =
        nodes.iter().map(|n| (n.name.as_str(), n.join_ip)).collect();
    for (i, p) in ports.iter().enumerate() {
        let lsp = format!("{}.{}", p.name, p.node);
        let ls = format!("{net}-{}", p.node);
        let rtr = format!("{net}-{}-rtr", p.node);
        let addr = format!("{} {}", p.mac, p.ip);
        let routes = format!("{{{gw}/32,0.0.0.0, 0.0.0.0/0,{gw}}}", gw = spec.gateway);
        for part in [
            vec!["--".into(), "lsp-add".into(), ls, lsp.clone()],
            vec![
                "--".into(),
                "lsp-set-addresses".into(),
                lsp.clone(),
                addr.clone(),
            ],
            vec![
                "--".into(),
                "lsp-set-port-security".into(),
                lsp.clone(),
                addr,
            ],
            vec![
                "--".into(),
                "lsp-set-options".into(),
                lsp.clone(),
                format!("requested-chassis={}", p.node),
            ],
            vec![
                "--".into(),
                format!("--id=@d{i}"),
                "create".into(),
                "DHCP_Options".into(),
                format!("cidr={}/32", p.ip),
                format!(
                    "options=\"lease_time\"=\"3600\" \"router\"=\"{gw}\" \"server_id\"=\"{gw}\" \"server_mac\"=\"{mac}\" \
                     \"classless_static_route\"=\"{routes}\" \"ms_classless_static_route\"=\"{routes}\" \"mtu\"=\"1400\"",
                    gw = spec.gateway,
                    mac = spec.gateway_mac
                ),
                "external_ids:bench=nbctl".into(),
            ],
            vec![
                "--".into(),
                "set".into(),
                "Logical_Switch_Port".into(),
                lsp,
                format!("dhcpv4_options=@d{i}"),
            ],
            vec![
                "--".into(),
                "lr-route-add".into(),
                rtr.clone(),
                format!("{}/32", p.ip),
                p.ip.to_string(),
                format!("{rtr}-gw"),
            ],
            vec![
                "--".into(),
                "lr-route-add".into(),
                format!("{net}-fabric"),
                format!("{}/32", p.ip),
                join[p.node.as_str()].to_string(),
            ],
        ] {
            a.extend(part);
        }
    }
    a
}

fn main() {
    let lab = Lab::get();
    let n: usize = std::env::var("ROAM_BENCH_PORTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let flips: usize = std::env::var("ROAM_BENCH_FLIPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let client = rt
        .block_on(Client::connect(lab.nb()))
        .expect("connect to NB");
    let (roam_net, nbctl_net) = ("bench-roam", "bench-nbctl");
    let clean = |net: &str| {
        rt.block_on(reconcile(&client, net, &Topology::default()))
            .expect("clean up");
        // the baseline's DHCP options (no switch owns them), in one transaction
        let res = rt
            .block_on(client.transact(
                roam_ovsdb::nb::DATABASE,
                vec![serde_json::json!({
                    "op": "delete", "table": "DHCP_Options",
                    "where": [["external_ids", "includes", ["map", [["bench", "nbctl"]]]]],
                })],
            ))
            .expect("delete the baseline's DHCP options");
        assert!(
            res.iter().all(|r| r.get("error").is_none()),
            "delete the baseline's DHCP options: {res:?}"
        );
    };
    clean(roam_net);
    clean(nbctl_net);
    sync_hv(&lab);

    // the same skeleton for both: switches, routers, transit, fabric, no ports
    let (rs, ns) = (spec(roam_net, 110), spec(nbctl_net, 111));
    rt.block_on(reconcile(
        &client,
        roam_net,
        &plan_overlay(&rs, &nodes(110), &[]).unwrap(),
    ))
    .unwrap();
    rt.block_on(reconcile(
        &client,
        nbctl_net,
        &plan_overlay(&ns, &nodes(111), &[]).unwrap(),
    ))
    .unwrap();
    sync_hv(&lab);

    // 1. N ports: roam
    let roam_ports = ports("r", 110, n);
    let want = plan_overlay(&rs, &nodes(110), &roam_ports).unwrap();
    let t0 = Instant::now();
    let report = rt
        .block_on(reconcile(&client, roam_net, &want))
        .expect("reconcile");
    let roam_commit = t0.elapsed();
    sync_hv(&lab);
    let roam_flows = t0.elapsed();

    // 1. N ports: ovn-nbctl, one batch
    let nb_ports = ports("n", 111, n);
    let args = nbctl_batch(nbctl_net, &ns, &nodes(111), &nb_ports);
    let daemon = NbctlDaemon::start(&lab);
    let t0 = Instant::now();
    daemon.run(&args);
    let nb_commit = t0.elapsed();
    sync_hv(&lab);
    let nb_flows = t0.elapsed();

    println!("\n== {n} ports with DHCP options and /32 routes (2 chassis)");
    println!("{report}");
    println!(
        "{:<24}{:>14}{:>22}",
        "", "NB commit (s)", "flows on both (s)"
    );
    println!(
        "{:<24}{:>14.3}{:>22.3}",
        "roam reconcile",
        secs(roam_commit),
        secs(roam_flows)
    );
    println!(
        "{:<24}{:>14.3}{:>22.3}",
        "ovn-nbctl batch",
        secs(nb_commit),
        secs(nb_flows)
    );
    println!(
        "{:<24}{:>14.2}{:>22.2}   (target ≤ 1.2)",
        "ratio roam / nbctl",
        secs(roam_commit) / secs(nb_commit),
        secs(roam_flows) / secs(nb_flows)
    );

    // 2. route flips at that scale
    let mut moving = roam_ports.clone();
    let (mut commits, mut flows) = (vec![], vec![]);
    for i in 0..flips {
        moving[0].node = if i % 2 == 0 { "node-b" } else { "node-a" }.into();
        let want = plan_overlay(&rs, &nodes(110), &moving).unwrap();
        let t0 = Instant::now();
        rt.block_on(reconcile(&client, roam_net, &want))
            .expect("flip");
        commits.push(t0.elapsed());
        sync_hv(&lab);
        flows.push(t0.elapsed());
    }
    // 3. the same flips through the fast path (the address is on node-b after an even count)
    let ns110 = nodes(110);
    let (mut fast_commits, mut fast_flows) = (vec![], vec![]);
    let mut on_a = moving[0].node == "node-a";
    for _ in 0..flips {
        let (from, to) = if on_a {
            (&ns110[0], &ns110[1])
        } else {
            (&ns110[1], &ns110[0])
        };
        let t0 = Instant::now();
        rt.block_on(flip_route(&client, roam_net, moving[0].ip, from, to))
            .expect("fast flip");
        fast_commits.push(t0.elapsed());
        sync_hv(&lab);
        fast_flows.push(t0.elapsed());
        on_a = !on_a;
    }
    for v in [&mut commits, &mut flows, &mut fast_commits, &mut fast_flows] {
        v.sort();
    }
    println!("\n== route flip of one address among {n}, {flips} flips each");
    println!("{:<40}{:>10}{:>10}", "", "p50 (ms)", "p99 (ms)");
    for (what, v) in [
        ("full reconcile: NB commit", &commits),
        ("full reconcile: flows on both chassis", &flows),
        ("fast flip: NB commit", &fast_commits),
        ("fast flip: flows on both chassis", &fast_flows),
    ] {
        println!(
            "{:<40}{:>10.1}{:>10.1}",
            what,
            secs(percentile(v, 0.5)) * 1000.0,
            secs(percentile(v, 0.99)) * 1000.0
        );
    }
    println!(
        "(flows on both chassis = NB commit + `ovn-nbctl --wait=hv sync`, whose own process start is included)"
    );

    clean(roam_net);
    clean(nbctl_net);
}
