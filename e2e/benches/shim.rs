//! roam-shim live migrations on the lab, through the shim's API: 10 migrations back and forth
//! between node-a and node-b of the real guest while a 2 ms ping runs from a test namespace on
//! node-b. Prints a table: the job's wall time through the API (migrate request → completed,
//! including the target's prepare), libvirt's own job time and downtime (the target's
//! completed-job stats), the longest ping gap, and the time from the source's
//! suspended-for-migration event to the target's resumed-after-migration event.
//!
//! After each migration the guest's console is read for signs that its memory did not arrive
//! intact (a virtio ring out of step, an Oops, a panic, a soft lockup); a guest that no longer
//! answers ends the bench with its console's tail.
//!
//! `cargo bench -p roam-e2e --bench shim` (needs the lab and a built `roam-shim`);
//! `ROAM_BENCH_SHIM_MIGRATIONS` (default 10) and `ROAM_BENCH_MAX_DOWNTIME_MS` (libvirt's
//! downtime limit; default: libvirt's 300 ms). A 1 ms limit (many short passes) is the
//! hardest case for the guest's memory (the README's Limits: QEMU ≥ 10 under TCG).

use std::net::Ipv4Addr;
use std::time::Duration;

use roam_dhcp_opts::MacAddr;
use roam_e2e::{
    Lab, LabNetwork, Pinger, PortBuilder, ShimProcess, ShimVm, TestNetns, plug_netns,
    set_port_chassis, shim_network, wait_until,
};
use roam_network::topology::{NodeSpec, OverlaySpec, PortSpec};
use roam_shim_api::launch::Mode;
use roam_vm_shim::api::{JobState, MigrateRequest};
use roam_vm_shim::client::ShimClient;
use roam_vm_shim::events::Lifecycle;

const NET: &str = "h7net";
const VM: &str = "h7vm";
const TAP: &str = "h7vm0";
const GUEST_MAC: &str = "52:54:00:e7:00:0a";
const GUEST_IP: &str = "10.252.0.10";
const GW: &str = "10.252.0.1";
const PROBE_MAC: &str = "0a:00:00:e7:00:20";
const PROBE_IP: &str = "10.252.0.20";
const PROBE_PORT: &str = "h7probe0";
/// What the guest's kernel says when its memory or a device ring is not what it should be.
const DAMAGE: [&str; 6] = [
    "is not a head",
    "Oops",
    "Kernel panic",
    "soft lockup",
    "BUG:",
    // a second boot
    roam_e2e::GUEST_BOOT_MARKER,
];

fn overlay() -> (OverlaySpec, Vec<NodeSpec>, Vec<PortSpec>) {
    let spec = OverlaySpec {
        name: NET.into(),
        subnet: "10.252.0.0/25".parse().unwrap(),
        gateway: GW.parse().unwrap(),
        gateway_mac: MacAddr::new([0x0a, 0, 0, 0xe7, 0, 0x01]),
        join_subnet: "10.252.0.240/28".parse().unwrap(),
        fabric_ip: Ipv4Addr::new(10, 252, 0, 241),
        fabric_mac: MacAddr::new([0x0a, 0, 0, 0xe7, 0, 0xfe]),
        mtu: 1400,
        dns: vec![],
    };
    let nodes = ["node-a", "node-b"]
        .iter()
        .enumerate()
        .map(|(i, n)| NodeSpec {
            name: (*n).into(),
            join_ip: Ipv4Addr::new(10, 252, 0, 242 + i as u8),
            join_mac: MacAddr::new([0x0a, 0, 0, 0xe7, 0, 0x11 + i as u8]),
        })
        .collect();
    let port = |name: &str, mac: &str, ip: &str, node: &str, dhcp| {
        PortBuilder::new(name, ip.parse().unwrap(), node)
            .mac(mac.parse().unwrap())
            .dhcp(dhcp)
            .build()
    };
    let ports = vec![
        port(VM, GUEST_MAC, GUEST_IP, "node-a", true),
        port("h7probe", PROBE_MAC, PROBE_IP, "node-b", false),
    ];
    (spec, nodes, ports)
}

struct Row {
    dir: String,
    api_ms: f64,
    libvirt_ms: Option<u64>,
    downtime_ms: Option<u64>,
    gap_ms: f64,
    paused_to_resumed_ms: f64,
    /// Where the guest's console stood when the run began (bytes).
    console_at: usize,
    /// The first sign of damage on the guest's console during the run (up to the next run's
    /// start: the guest may say it a moment after the migration), if any.
    damage: Option<String>,
}

/// The first console line in `from..to` (bytes) that shows damage (a second boot counts).
fn damage_in(console: &str, from: usize, to: usize) -> Option<String> {
    console
        .get(from..to.min(console.len()))?
        .lines()
        .find(|l| DAMAGE.iter().any(|d| l.contains(d)))
        .map(|l| l.trim().to_string())
}

fn main() {
    let lab = Lab::get();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let vm = ShimVm {
        name: VM.into(),
        tap: TAP.into(),
        ovn_port: format!("{VM}.node-a"),
        mac: GUEST_MAC.into(),
        token: format!(
            "h7-bench-{:x}",
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos()
        ),
        dir: lab.dir().join("h7").join("bench"),
    };
    let network = LabNetwork::new(
        &lab,
        NET,
        &[("node-a", TAP), ("node-b", TAP), ("node-b", PROBE_PORT)],
    );
    let cleanup = vm.cleanup(&lab);
    let (spec, nodes, ports) = overlay();
    shim_network(&lab, &spec, &nodes, &ports);
    let probe = TestNetns::new("h7bench");
    plug_netns(
        &lab.node("node-b"),
        &probe,
        PROBE_PORT,
        "h7probe.node-b",
        PROBE_MAC,
        PROBE_IP,
        GW,
    );
    let shims = [
        ShimProcess::start(&lab, &vm, "node-a", 17003, Mode::Boot),
        ShimProcess::start(&lab, &vm, "node-b", 17004, Mode::Incoming),
    ];
    let clients: Vec<ShimClient> = shims
        .iter()
        .map(|s| ShimClient::new(&s.url, &vm.token).unwrap())
        .collect();
    for c in &clients {
        wait_until(Duration::from_secs(30), "the shim's API", || {
            rt.block_on(c.health()).ok()
        });
    }
    wait_until(Duration::from_secs(180), "the guest's lease", || {
        vm.serial_text()
            .contains("ROAM-GUEST-SERVICES-UP")
            .then_some(())
    });
    wait_until(Duration::from_secs(60), "the guest to answer ping", || {
        probe.ping_once(GUEST_IP).then_some(())
    });
    let names = ["node-a", "node-b"];
    let lsp = format!("{VM}.node-a");
    let runs: usize = std::env::var("ROAM_BENCH_SHIM_MIGRATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let max_downtime_ms: Option<u64> = std::env::var("ROAM_BENCH_MAX_DOWNTIME_MS")
        .ok()
        .and_then(|v| v.parse().ok());
    let mut rows: Vec<Row> = Vec::new();
    let mut stopped = None;
    for run in 0..runs {
        let console_at = vm.serial_text().len();
        let (s, t) = (run % 2, 1 - run % 2);
        let (src, dst) = (&clients[s], &clients[t]);
        let seq_s = rt.block_on(src.events(0, Duration::ZERO)).unwrap().next;
        let seq_t = rt.block_on(dst.events(0, Duration::ZERO)).unwrap().next;
        set_port_chassis(&lab, &lsp, &[names[s], names[t]]);
        let pinger = Pinger::start(&probe, GUEST_IP, "0.002");
        std::thread::sleep(Duration::from_millis(300));
        let t0 = std::time::Instant::now();
        let req = MigrateRequest {
            target: shims[t].url.clone(),
            target_token: vm.token.clone(),
            bandwidth_mib_s: None,
            max_downtime_ms,
            auto_converge: false,
            post_copy: false,
            timeout_s: Some(120),
            target_node: None,
            target_address: None,
        };
        let job = rt.block_on(src.migrate(&req)).expect("migrate");
        // poll the job's state quickly so the wall time is the API's, not the poll's
        let job = wait_until(Duration::from_secs(120), "the migration", || {
            let j = rt.block_on(src.progress()).ok()?;
            (j.id == job.id && j.state.is_final()).then_some(j)
        });
        let api_ms = t0.elapsed().as_secs_f64() * 1e3;
        assert_eq!(job.state, JobState::Completed, "{job:?}");
        let answered = (0..30).any(|_| probe.ping_once(GUEST_IP));
        let (_, gap) = pinger.stop();
        if !answered {
            let console = vm.serial_text();
            let tail: Vec<&str> = console.lines().rev().take(15).collect();
            println!(
                "run {}: the guest does not answer 30 s after the migration ({}); its console:\n{}",
                run + 1,
                damage_in(&console, console_at, usize::MAX)
                    .unwrap_or_else(|| "no damage on the console".into()),
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
            stopped = Some(run + 1);
            break;
        }
        set_port_chassis(&lab, &lsp, &[names[t]]);
        let paused = rt
            .block_on(src.events(seq_s, Duration::ZERO))
            .unwrap()
            .events
            .into_iter()
            .find(|e| e.kind == Lifecycle::SuspendedForMigration)
            .expect("a suspended-for-migration event");
        let resumed = wait_until(Duration::from_secs(10), "the resumed event", || {
            rt.block_on(dst.events(seq_t, Duration::from_millis(500)))
                .ok()?
                .events
                .into_iter()
                .find(|e| e.kind == Lifecycle::ResumedAfterMigration)
        });
        rows.push(Row {
            dir: format!("{} → {}", names[s], names[t]),
            api_ms,
            libvirt_ms: job.stats.elapsed_ms,
            downtime_ms: job.stats.downtime_ms,
            gap_ms: gap.as_secs_f64() * 1e3,
            paused_to_resumed_ms: (resumed.at_unix_ns as f64 - paused.at_unix_ns as f64) / 1e6,
            console_at,
            damage: None,
        });
    }
    // what the guest said during each run, read once it has had its say
    let console = vm.serial_text();
    let starts: Vec<usize> = rows.iter().map(|r| r.console_at).collect();
    for (i, r) in rows.iter_mut().enumerate() {
        let end = starts.get(i + 1).copied().unwrap_or(usize::MAX);
        r.damage = damage_in(&console, r.console_at, end);
    }
    println!(
        "\nroam-shim live migration, {} of {runs} runs (TCG guest, 256 MiB; ping every 2 ms from node-b; downtime limit {})\n",
        rows.len(),
        max_downtime_ms
            .map(|d| format!("{d} ms"))
            .unwrap_or_else(|| "libvirt's".into())
    );
    println!(
        "| run | direction | job via API (ms) | libvirt job (ms) | libvirt downtime (ms) | longest ping gap (ms) | paused → resumed (ms) | guest |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let opt = |v: Option<u64>| v.map(|v| v.to_string()).unwrap_or_else(|| "-".into());
    for (i, r) in rows.iter().enumerate() {
        println!(
            "| {} | {} | {:.0} | {} | {} | {:.1} | {:.1} | {} |",
            i + 1,
            r.dir,
            r.api_ms,
            opt(r.libvirt_ms),
            opt(r.downtime_ms),
            r.gap_ms,
            r.paused_to_resumed_ms,
            r.damage.as_deref().unwrap_or("intact")
        );
    }
    let med = |mut v: Vec<f64>| {
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        (v[v.len() / 2], v[0], v[v.len() - 1])
    };
    let show = |name: &str, v: Vec<f64>| {
        if v.is_empty() {
            println!("{name}: no values");
            return;
        }
        let (m, lo, hi) = med(v);
        println!("{name}: median {m:.1} ms (min {lo:.1}, max {hi:.1})");
    };
    println!();
    show("job via API", rows.iter().map(|r| r.api_ms).collect());
    show(
        "libvirt downtime",
        rows.iter()
            .filter_map(|r| r.downtime_ms.map(|d| d as f64))
            .collect(),
    );
    show("longest ping gap", rows.iter().map(|r| r.gap_ms).collect());
    show(
        "paused → resumed",
        rows.iter().map(|r| r.paused_to_resumed_ms).collect(),
    );
    println!(
        "guest damaged after {} of {} migrations{}",
        rows.iter().filter(|r| r.damage.is_some()).count(),
        rows.len(),
        stopped
            .map(|r| format!("; stopped at run {r}: the guest no longer answers"))
            .unwrap_or_default()
    );
    drop(shims);
    drop(probe);
    drop(cleanup);
    drop(network);
}
