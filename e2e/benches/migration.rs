//! Live migration through the product, on the lab: a VM booted by roam-controller in a real
//! launcher pod is migrated back and forth `ROAM_BENCH_MIGRATIONS` times (default 20) by
//! annotating it (`roam.dev/migrate-to`), while a client namespace pings it every 2 ms and
//! streams TCP to its echo port. Per run: libvirt's downtime (the target's completed job),
//! the network blackout (the longest gap between two ping replies), their ratio, the
//! guest's pause as the shims saw it (source suspended → target resumed: libvirt's downtime
//! plus its hand-over to the target) and the blackout over it, when the client's pings first
//! reached the target's tap after the guest's last reply on the source (tcpdump on the VM's
//! tap on both nodes: the network ready — compare with the blackout, when the guest answered
//! there), whether the TCP stream survived (every byte echoed, no reset), the route switchover (pause event →
//! Address write), and annotate→Succeeded minus libvirt's job time (the controller's
//! overhead). Targets (issue 8): ratio ≤ 1.3, every stream survives, overhead ≤ 2 s.
//!
//! The annotation is written and the migration watched through the API from this process
//! (a merge patch, then a watch on the namespace's migrations), so no kubectl start-up or
//! polling interval is counted as overhead.

#[path = "../tests/migration_fixture/mod.rs"]
mod migration_fixture;

use std::io::BufRead;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use migration_fixture::*;
use roam_e2e::{Lab, Pinger, wait_until};
use roam_migrator::api::{VirtualMachine, VirtualMachineMigration};
use serde_json::{Value, json};

/// One ICMP echo seen on the VM's tap: the node (`a`, `b`), tcpdump's time (s since the
/// epoch), and whether it is the guest's reply (else the client's request).
type Seen = (char, f64, bool);

/// tcpdump of ICMP on the VM's tap on both nodes, for the whole bench: a tap appears with
/// the launcher that plugs it and goes with it, so each node's capture waits for it and
/// starts again when it comes back.
struct TapCapture {
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Vec<Seen>>>,
    pids: Arc<Mutex<Vec<u32>>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl TapCapture {
    fn start(lab: &Lab, tap: &str) -> TapCapture {
        let (stop, seen, pids) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(Mutex::new(vec![])),
            Arc::new(Mutex::new(vec![])),
        );
        let threads = [('a', "node-a"), ('b', "node-b")]
            .into_iter()
            .map(|(id, node)| {
                let netns = lab.node(node).netns;
                let (stop, seen, pids, tap) =
                    (stop.clone(), seen.clone(), pids.clone(), tap.to_string());
                std::thread::spawn(move || {
                    while !stop.load(Ordering::SeqCst) {
                        if roam_e2e::try_run("ip", &["-n", &netns, "link", "show", &tap]).is_err() {
                            std::thread::sleep(Duration::from_millis(20));
                            continue;
                        }
                        let Ok(mut child) = std::process::Command::new("ip")
                            .args(["netns", "exec", &netns, "tcpdump", "-i", &tap])
                            .args(["-nn", "-tt", "-l", "-U", "icmp"])
                            .stdout(std::process::Stdio::piped())
                            .stderr(std::process::Stdio::null())
                            .spawn()
                        else {
                            return;
                        };
                        pids.lock().unwrap().push(child.id());
                        let out = std::io::BufReader::new(child.stdout.take().unwrap());
                        for line in out.lines().map_while(Result::ok) {
                            let Some((t, rest)) = line.split_once(' ') else {
                                continue;
                            };
                            let reply = rest.contains("ICMP echo reply");
                            if let Ok(t) = t.parse::<f64>()
                                && (reply || rest.contains("ICMP echo request"))
                            {
                                seen.lock().unwrap().push((id, t, reply));
                            }
                        }
                        let _ = child.wait();
                    }
                })
            })
            .collect();
        TapCapture {
            stop,
            seen,
            pids,
            threads,
        }
    }

    /// For a migration from `src` to `dst` seen since `since` (s since the epoch): after the
    /// guest's last reply on the source, when the client's pings first reached the target's
    /// tap (the network ready) and when the guest first answered there, in ms.
    fn switch(&self, src: char, dst: char, since: f64) -> Option<(f64, f64)> {
        let seen = self.seen.lock().unwrap();
        let at = |node: char, reply: bool| {
            seen.iter()
                .filter(move |(n, t, r)| *n == node && *r == reply && *t >= since)
                .map(|(_, t, _)| *t)
        };
        let answered = at(dst, true).reduce(f64::min)?;
        let last = at(src, true).filter(|t| *t < answered).reduce(f64::max)?;
        let ready = at(dst, false).filter(|t| *t > last).reduce(f64::min)?;
        Some(((ready - last) * 1000.0, (answered - last) * 1000.0))
    }
}

impl Drop for TapCapture {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for pid in self.pids.lock().unwrap().iter() {
            let _ = roam_e2e::try_run("kill", &[&pid.to_string()]);
        }
        // a thread waiting for a tap sees the flag; one in tcpdump ends with it
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn epoch_s() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// Annotate the VM with `roam.dev/migrate-to=to` and wait for its new migration to end;
/// the time is from the patch request to the watch event with the final phase.
async fn migrate_timed(client: &kube::Client, to: &str) -> (Value, Duration) {
    let vms: Api<VirtualMachine> = Api::namespaced(client.clone(), NS);
    let vmims: Api<VirtualMachineMigration> = Api::namespaced(client.clone(), NS);
    let before: Vec<String> = vmims
        .list(&Default::default())
        .await
        .expect("list migrations")
        .items
        .into_iter()
        .filter_map(|m| m.metadata.name)
        .collect();
    // the watch runs before the patch, so no event is missed
    let mut events = watcher(vmims, watcher::Config::default())
        .applied_objects()
        .boxed();
    let t0 = Instant::now();
    vms.patch(
        VM,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {"roam.dev/migrate-to": to}}})),
    )
    .await
    .expect("annotate the VM");
    tokio::time::timeout(LONG, async {
        while let Some(m) = events.try_next().await.expect("watch migrations") {
            let name = m.metadata.name.clone().unwrap_or_default();
            let phase = m
                .status
                .as_ref()
                .map(|s| format!("{:?}", s.phase))
                .unwrap_or_default();
            if !before.contains(&name)
                && ["Succeeded", "Failed", "Aborted"].contains(&phase.as_str())
            {
                return (serde_json::to_value(&m).expect("json"), t0.elapsed());
            }
        }
        panic!("the migration watch ended");
    })
    .await
    .expect("the migration ends within the bound")
}

fn main() {
    let runs: usize = std::env::var("ROAM_BENCH_MIGRATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let lab = Lab::get();
    let rt = tokio::runtime::Runtime::new().expect("tokio");
    let client = rt.block_on(lab.kube_client());
    let b = boot(&lab);
    println!(
        "{:>3} {:>13} {:>10} {:>12} {:>6} {:>9} {:>6} {:>10} {:>13} {:>12} {:>11}  guest",
        "run",
        "route",
        "downtime",
        "blackout",
        "ratio",
        "pause",
        "/pause",
        "net ready",
        "tcp",
        "switchover",
        "overhead"
    );
    let mut pause_ratios = vec![];
    let (mut readies, mut net_late) = (vec![], 0);
    let capture = TapCapture::start(
        &lab,
        &roam_migrator::core::vm::tap_name(&format!("{NS}/{VM}")),
    );
    let (mut ratios, mut survived, mut overheads) = (vec![], 0, vec![]);
    // the guest's kernel banners in its serial log: one more means it rebooted
    let boots = || serial(&lab, &H8).matches("Linux version").count();
    let (mut booted, mut reboots) = (boots(), 0);
    for i in 0..runs {
        let (from, to) = if i % 2 == 0 {
            ("node-a", "node-b")
        } else {
            ("node-b", "node-a")
        };
        let since = epoch_s();
        let (stream, stop) = Stream::start(&lab, &b.cli_ns, &b.ip);
        let pinger = Pinger::start(&b.cli_ns, &b.ip, "0.002");
        std::thread::sleep(Duration::from_millis(500));
        let (m, total) = rt.block_on(migrate_timed(&client, to));
        wait_until(LONG, "ping answered after the migration", || {
            b.cli_ns.ping_once(&b.ip).then_some(())
        });
        let (_, gap) = pinger.stop();
        let tcp = stream.stop(&stop);
        let st = &m["status"];
        assert_eq!(
            st["phase"],
            "Succeeded",
            "run {i}: {m}\n{}",
            b.ctl.log_tail(40)
        );
        let downtime = st["downtimeMs"].as_u64().unwrap_or(0);
        let job = st["jobMs"].as_u64().unwrap_or(0);
        let gap_ms = gap.as_secs_f64() * 1000.0;
        let ratio = if downtime > 0 {
            gap_ms / downtime as f64
        } else {
            f64::NAN
        };
        let pause = st["pauseMs"].as_u64().unwrap_or(0);
        // tcpdump's lines of the last few ms may still be on their way
        std::thread::sleep(Duration::from_millis(300));
        let node = |n: &str| if n == "node-a" { 'a' } else { 'b' };
        let ready = capture.switch(node(from), node(to), since);
        if let Some((r, answered)) = ready {
            readies.push(r);
            net_late += (r >= answered) as usize;
        }
        let pause_ratio = if pause > 0 {
            gap_ms / pause as f64
        } else {
            f64::NAN
        };
        pause_ratios.push(pause_ratio);
        let ok = tcp.starts_with("OK");
        let now_booted = boots();
        let rebooted = now_booted > booted;
        reboots += now_booted.saturating_sub(booted);
        booted = now_booted;
        let overhead = total.as_millis() as i64 - job as i64;
        ratios.push(ratio);
        overheads.push(overhead);
        survived += ok as usize;
        println!(
            "{:>3} {:>13} {:>8}ms {:>10.1}ms {:>6.2} {:>7}ms {:>6.2} {:>8}ms {:>13} {:>10}ms {:>9}ms  {}",
            i + 1,
            format!("{from}→{to}"),
            downtime,
            gap_ms,
            ratio,
            pause,
            pause_ratio,
            ready
                .map(|(r, _)| format!("{r:.0}"))
                .unwrap_or_else(|| "?".into()),
            if ok { "survived" } else { "BROKEN" },
            st["switchoverMs"].as_u64().map(|v| v as i64).unwrap_or(-1),
            overhead,
            if rebooted { "REBOOTED" } else { "ran on" }
        );
        if !ok {
            println!("    tcp: {tcp}");
        }
        // the old source pod is gone before the next migration reuses its node
        wait_until(LONG, "one launcher pod left", || {
            let pods = get(
                &lab,
                &["-n", NS, "get", "pods", "-l", "roam.dev/launcher=true"],
            )?;
            (pods["items"].as_array()?.len() == 1).then_some(())
        });
    }
    let mut sorted = ratios.clone();
    sorted.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    let mut pr = pause_ratios.clone();
    pr.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    let mut oh = overheads.clone();
    oh.sort();
    println!(
        "\n{runs} migrations: blackout/downtime ratio median {:.2} max {:.2} (target ≤ 1.3); \
         blackout/pause (the shims' suspend → resume events) median {:.2} max {:.2}; \
         pings reached the target's tap {:.0}–{:.0} ms after the guest's last reply on the source \
         ({} of {} runs before the guest answered there); \
         TCP survived {survived}/{runs}; guest reboots {reboots}; overhead median {} ms max {} ms (target ≤ 2000 ms)",
        sorted[sorted.len() / 2],
        sorted.last().copied().unwrap_or(f64::NAN),
        pr[pr.len() / 2],
        pr.last().copied().unwrap_or(f64::NAN),
        readies.iter().copied().fold(f64::INFINITY, f64::min),
        readies.iter().copied().fold(0.0, f64::max),
        readies.len() - net_late,
        runs,
        oh[oh.len() / 2],
        oh.last().copied().unwrap_or(0)
    );
}
