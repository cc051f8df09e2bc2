//! The switchover at scale, on the lab's real OVN (needs `e2e/lab up`):
//! `cargo bench -p roam-e2e --bench scale --profile dev`.
//!
//! The NB is loaded with N addresses that are not the test's ([`roam_e2e::ScaleLoad`]: ports,
//! DHCP options and /32 routes as roam creates them, over both nodes, a share bound to OVS
//! ports), then one address is switched between node-a and node-b while a client on node-a
//! pings it every 2 ms, by two mechanisms:
//!
//! - **route flip** (roam's switchover until now): the old port goes silent (the pause), and
//!   the fast flip moves the /32 routes in one NB transaction; ovn-northd recomputes and each
//!   ovn-controller installs the new flows. Measured: the ping silence, and when each chassis
//!   reported the flip installed (`Chassis_Private:nb_cfg_timestamp`, ovn-controller's own
//!   clock on this machine) after the commit.
//! - **RARP activation** (a VM's mobile port, multi-chassis): the port is requested on both
//!   chassis beforehand (`requested-chassis=from,to`, `activation-strategy=rarp`); at the switch the
//!   old side goes silent and the new side sends the RARP QEMU sends when a migrated guest
//!   lands; the target's ovn-controller unblocks the port by itself, no NB change.
//!   Measured: the ping silence.
//!
//! Then northd's own stopwatch over the flips. Sizes, bound share and switch count are
//! parameters (`ROAM_SCALE_SIZES`, default `1000,10000`; `ROAM_SCALE_BOUND`, default 0.05;
//! `ROAM_SCALE_SWITCHES`, default 20, even). Figures are printed; nothing is asserted.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use roam_e2e::{
    Lab, Pinger, PortBuilder, RarpTrigger, ScaleLoad, TestNetns, nbctl, patient, percentile,
    plug_netns, run, scale_nodes, scale_spec, sync_hv, try_run, wait_until,
};
use roam_network::northbound::flip_route_marked;
use roam_network::topology::{PortSpec, mobile_port_name, overlay_port_name};
use roam_ovsdb::{Client, ops};
use serde_json::Value;

const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(10, 143, 255, 2);
const FLIP_IP: Ipv4Addr = Ipv4Addr::new(10, 143, 255, 10);
const MC_IP: Ipv4Addr = Ipv4Addr::new(10, 143, 255, 11);
const PING_EVERY: &str = "0.002";
/// How long the pings run before and after a switch (around the silence being measured).
const SETTLE: Duration = Duration::from_millis(300);

fn env<T: std::str::FromStr>(k: &str, default: T) -> T {
    std::env::var(k)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn wall_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("a clock after 1970")
        .as_millis() as i64
}

fn mac_of(p: &PortSpec) -> String {
    p.mac.to_string()
}

/// A namespace plugged into the scale network on `node` as logical port `lsp`.
struct Plugged {
    ns: TestNetns,
    iface: String,
    ovs_db: String,
}

impl Plugged {
    fn new(lab: &Lab, node: &str, iface: &str, lsp: &str, p: &PortSpec) -> Plugged {
        let ns = TestNetns::new(iface);
        let n = lab.node(node);
        let _ = try_run(
            "ovs-vsctl",
            &[
                &format!("--db={}", n.ovs_db),
                "--if-exists",
                "del-port",
                "br-int",
                iface,
            ],
        );
        plug_netns(
            &n,
            &ns,
            iface,
            lsp,
            &mac_of(p),
            &p.ip.to_string(),
            &scale_spec().gateway.to_string(),
        );
        Plugged {
            ns,
            iface: iface.into(),
            ovs_db: n.ovs_db.clone(),
        }
    }

    /// Stop answering (the pause: the guest no longer runs here) or answer again. The
    /// link stays up (a link going down would take its routes with it).
    fn answer(&self, yes: bool) {
        self.ns.run(
            "sysctl",
            &[
                "-q",
                &format!("net.ipv4.icmp_echo_ignore_all={}", u8::from(!yes)),
            ],
        );
    }
}

impl Drop for Plugged {
    fn drop(&mut self) {
        let _ = try_run(
            "ovs-vsctl",
            &[
                &format!("--db={}", self.ovs_db),
                "--if-exists",
                "del-port",
                "br-int",
                &self.iface,
            ],
        );
    }
}

/// Each chassis' (nb_cfg, nb_cfg_timestamp) from the SB.
async fn chassis_cfg(sb: &Client) -> Vec<(String, i64, i64)> {
    let got = sb
        .transact(
            "OVN_Southbound",
            vec![ops::select(
                "Chassis_Private",
                vec![],
                Some(&["name", "nb_cfg", "nb_cfg_timestamp"]),
            )],
        )
        .await
        .expect("read Chassis_Private");
    got[0]["rows"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|r: &Value| {
            (
                r["name"].as_str().unwrap_or_default().to_string(),
                r["nb_cfg"].as_i64().unwrap_or_default(),
                r["nb_cfg_timestamp"].as_i64().unwrap_or_default(),
            )
        })
        .collect()
}

/// Wait until every chassis reports `nb_cfg`; each one's install time after `since_ms`.
async fn chassis_installed(sb: &Client, nb_cfg: i64, since_ms: i64) -> Vec<Duration> {
    let t0 = Instant::now();
    loop {
        let rows = chassis_cfg(sb).await;
        if !rows.is_empty() && rows.iter().all(|(_, c, _)| *c >= nb_cfg) {
            return rows
                .iter()
                .map(|(_, _, ts)| Duration::from_millis((ts - since_ms).max(0) as u64))
                .collect();
        }
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "chassis never reported nb_cfg {nb_cfg}: {rows:?}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Requested chassis (and RARP activation when two) of logical port `lsp`, waiting for
/// every chassis.
fn request_chassis(lab: &Lab, lsp: &str, chassis: &[&str]) {
    let requested = format!("options:requested-chassis={}", chassis.join(","));
    let mut args = vec![
        "--wait=hv",
        "--timeout=900",
        "set",
        "Logical_Switch_Port",
        lsp,
        &requested,
    ];
    if chassis.len() > 1 {
        args.push("options:activation-strategy=rarp");
    } else {
        args.extend([
            "--",
            "remove",
            "Logical_Switch_Port",
            lsp,
            "options",
            "activation-strategy",
        ]);
    }
    nbctl(lab, &args);
}

/// The longest ping silence while `switch` runs, pinging `ip` from `client`.
fn silence_around(client: &TestNetns, ip: Ipv4Addr, switch: impl FnOnce()) -> Duration {
    let pinger = Pinger::start(client, &ip.to_string(), PING_EVERY);
    std::thread::sleep(SETTLE);
    switch();
    wait_until(
        Duration::from_secs(30),
        "the pings to get through after the switch",
        || client.ping_once(&ip.to_string()).then_some(()),
    );
    std::thread::sleep(SETTLE);
    let (replies, silence) = pinger.stop();
    if std::env::var("ROAM_SCALE_DEBUG").is_ok() {
        println!("  {replies} replies, longest silence {silence:?}");
    }
    assert!(
        replies > 10,
        "the pings never got through ({replies} replies)"
    );
    silence
}

struct Figures {
    n: usize,
    bound: usize,
    load_commit: Duration,
    load_settled: Duration,
    flip_silence: Vec<Duration>,
    flip_commit: Vec<Duration>,
    flip_chassis: Vec<Duration>,
    rarp_silence: Vec<Duration>,
    northd: String,
}

fn northd_ctl(lab: &Lab) -> String {
    lab.dir()
        .join("central/ovn-northd.ctl")
        .to_string_lossy()
        .into_owned()
}

/// northd's stopwatch lines for the loop and the logical-flow build.
fn northd_stopwatch(lab: &Lab) -> String {
    let out = run("ovn-appctl", &["-t", &northd_ctl(lab), "stopwatch/show"]);
    let mut keep = String::new();
    let mut section = false;
    for l in out.lines() {
        if l.starts_with("Statistics for") {
            section = l.contains("'ovn-northd-loop'") || l.contains("'build_lflows'");
        }
        if section
            && (l.starts_with("Statistics")
                || l.contains("95th")
                || l.contains("Maximum")
                || l.contains("Total samples"))
        {
            keep.push_str(l.trim());
            keep.push('\n');
        }
    }
    keep
}

fn main() {
    let lab = Lab::get();
    let sizes: Vec<usize> = std::env::var("ROAM_SCALE_SIZES")
        .unwrap_or_else(|_| "1000,10000".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let bound_share: f64 = env("ROAM_SCALE_BOUND", 0.05);
    let switches: usize = env("ROAM_SCALE_SWITCHES", 20usize).max(2) / 2 * 2;
    let rt = tokio::runtime::Runtime::new().expect("a tokio runtime");
    let sb = rt
        .block_on(Client::connect_with(lab.var("OVN_SB_DB"), patient()))
        .expect("connect to the SB");

    let mut load = ScaleLoad::new(&lab);
    let client_port = PortBuilder::new("cl", CLIENT_IP, "node-a").build();
    let flip_port = PortBuilder::new("fl", FLIP_IP, "node-a")
        .also_on(&["node-b"])
        .build();
    let mc_port = PortSpec {
        mobile: true,
        ..PortBuilder::new("mc", MC_IP, "node-a").build()
    };
    let extra = vec![client_port.clone(), flip_port.clone(), mc_port.clone()];
    let mc_lsp = mobile_port_name("mc");
    let nodes = scale_nodes();

    let mut all = vec![];
    for &n in &sizes {
        println!("\n== loading {n} addresses (bound share {bound_share})");
        let report = load.load(n, bound_share, &extra);
        println!(
            "   commit {:.2} s, every chassis has it {:.2} s, {} bound",
            report.commit.as_secs_f64(),
            report.settled.as_secs_f64(),
            report.bound
        );

        let client = Plugged::new(
            &lab,
            "node-a",
            "sccl",
            &overlay_port_name("cl", "node-a"),
            &client_port,
        );
        let flip = [
            Plugged::new(
                &lab,
                "node-a",
                "scfla",
                &overlay_port_name("fl", "node-a"),
                &flip_port,
            ),
            Plugged::new(
                &lab,
                "node-b",
                "scflb",
                &overlay_port_name("fl", "node-b"),
                &flip_port,
            ),
        ];
        let mc = [
            Plugged::new(&lab, "node-a", "scmca", &mc_lsp, &mc_port),
            Plugged::new(&lab, "node-b", "scmcb", &mc_lsp, &mc_port),
        ];
        sync_hv(&lab);
        wait_until(
            Duration::from_secs(60),
            "the client to reach the flip port",
            || client.ns.ping_once(&FLIP_IP.to_string()).then_some(()),
        );
        wait_until(
            Duration::from_secs(60),
            "the client to reach the multi-chassis port",
            || client.ns.ping_once(&MC_IP.to_string()).then_some(()),
        );
        // the target sides know the gateway's MAC before their first reply
        flip[1].ns.ping_once(&scale_spec().gateway.to_string());
        mc[1].ns.ping_once(&scale_spec().gateway.to_string());

        // route flips, back and forth
        run("ovn-appctl", &["-t", &northd_ctl(&lab), "stopwatch/reset"]);
        let (mut flip_silence, mut flip_commit, mut flip_chassis) = (vec![], vec![], vec![]);
        for i in 0..switches {
            let (from, to) = if i % 2 == 0 { (0, 1) } else { (1, 0) };
            let mut installed = vec![];
            let mut committed = Duration::ZERO;
            let silence = silence_around(&client.ns, FLIP_IP, || {
                flip[from].answer(false);
                let since = wall_ms();
                let t0 = Instant::now();
                let (_, nb_cfg) = rt
                    .block_on(flip_route_marked(
                        load.client(),
                        "scale",
                        FLIP_IP,
                        &nodes[from],
                        &nodes[to],
                    ))
                    .expect("route flip");
                committed = t0.elapsed();
                installed = rt.block_on(chassis_installed(
                    &sb,
                    nb_cfg.expect("a marked flip"),
                    since,
                ));
            });
            flip[from].answer(true);
            if std::env::var("ROAM_SCALE_DEBUG").is_ok() {
                println!("flip {from} -> {to}: {silence:?}, chassis {installed:?}");
            }
            flip_silence.push(silence);
            flip_commit.push(committed);
            flip_chassis.extend(installed);
        }
        let northd = northd_stopwatch(&lab);

        // RARP activation, back and forth
        let mut rarp_silence = vec![];
        for i in 0..switches {
            let (from, to) = if i % 2 == 0 { (0, 1) } else { (1, 0) };
            let names = ["node-a", "node-b"];
            request_chassis(&lab, &mc_lsp, &[names[from], names[to]]);
            let mut trigger = RarpTrigger::new(&mc[to].ns, &mc[to].iface, &mac_of(&mc_port));
            if std::env::var("ROAM_SCALE_DEBUG").is_ok() {
                println!(
                    "ping before the switch: {}",
                    client.ns.ping_once(&MC_IP.to_string())
                );
                println!(
                    "{}",
                    run(
                        "ovn-sbctl",
                        &[
                            &format!("--db={}", lab.var("OVN_SB_DB")),
                            "find",
                            "Port_Binding",
                            &format!("logical_port={mc_lsp}")
                        ]
                    )
                );
            }
            let silence = silence_around(&client.ns, MC_IP, || {
                mc[from].answer(false);
                trigger.fire();
            });
            request_chassis(&lab, &mc_lsp, &[names[to]]);
            mc[from].answer(true);
            rarp_silence.push(silence);
        }

        for v in [
            &mut flip_silence,
            &mut flip_commit,
            &mut flip_chassis,
            &mut rarp_silence,
        ] {
            v.sort();
        }
        all.push(Figures {
            n,
            bound: report.bound,
            load_commit: report.commit,
            load_settled: report.settled,
            flip_silence,
            flip_commit,
            flip_chassis,
            rarp_silence,
            northd,
        });
        drop((client, flip, mc));
        // back to the plan (the ports on node-a) before growing
        load.replan(&extra);
    }

    println!(
        "\n== the switchover at scale ({switches} switches each, ping every {PING_EVERY} s from node-a)"
    );
    println!(
        "{:>8} {:>7} {:>10} {:>11} | {:>19} {:>19} {:>19} | {:>19}",
        "N",
        "bound",
        "load (s)",
        "settled (s)",
        "flip: commit ms",
        "flip: chassis ms",
        "flip: silence ms",
        "RARP: silence ms"
    );
    for f in &all {
        let pp = |v: &[Duration]| {
            format!(
                "{:>7.1} / {:>7.1}",
                ms(percentile(v, 0.5)),
                ms(percentile(v, 0.99))
            )
        };
        println!(
            "{:>8} {:>7} {:>10.2} {:>11.2} | {:>19} {:>19} {:>19} | {:>19}",
            f.n,
            f.bound,
            f.load_commit.as_secs_f64(),
            f.load_settled.as_secs_f64(),
            pp(&f.flip_commit),
            pp(&f.flip_chassis),
            pp(&f.flip_silence),
            pp(&f.rarp_silence)
        );
    }
    println!("(p50 / p99; flip: chassis = commit → each chassis' nb_cfg_timestamp for the flip)");
    for f in &all {
        println!(
            "\nnorthd stopwatch over the route flips at N = {}:\n{}",
            f.n, f.northd
        );
    }
    load.clear();
}
