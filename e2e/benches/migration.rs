//! Live migration through the product, on the lab: a VM booted by roam-controller in a real
//! launcher pod is migrated back and forth `ROAM_BENCH_MIGRATIONS` times (default 20) by
//! annotating it (`roam.dev/migrate-to`), while a client namespace pings it every 2 ms and
//! streams TCP to its echo port. Per run: libvirt's downtime (the target's completed job),
//! the network blackout (the longest gap between two ping replies), their ratio, the
//! guest's pause as the shims saw it (`status.pauseMs`) and the blackout over it, whether the
//! TCP stream survived (every byte echoed, no reset), the switchover (pause event → the
//! target's OVN agent carries the VM's ports, from the southbound database), and
//! annotate→Succeeded minus libvirt's job time (the controller's overhead); a guest that
//! rebooted (its init's marker twice in its serial log) is flagged. The summary prints each
//! against its target: blackout/downtime ≤ 1.3, the pings at the target before QEMU resumes
//! the guest, every TCP stream surviving, overhead ≤ 2 s. The current figures and how to
//! re-run are in docs/benchmarks.md. `ROAM_BENCH_OTHER_ADDRESSES=N` first loads OVN with N
//! other addresses (the scale lab, [`roam_e2e::ScaleLoad`]) and removes them at the end.
//! Where the time goes: the median of each phase step (annotation → the first phase, then
//! phase → phase, from `status.phaseTransitions`), and the steps of every run over 2 s.
//!
//! Where the blackout goes: tcpdump on the VM's tap on both nodes and QEMU's own STOP and
//! RESUME events (QMP, through libvirt) split it into the guest's last reply → QEMU stops it
//! on the source (*before*), stopped → resumed on the target (*qemu*), resumed → the guest's
//! first reply (*after*); *net ready* is when the client's pings first reached the target's
//! tap. Then two controls on one node with no network change, under the same load: the guest
//! suspended and resumed by the same QEMU (`ROAM_BENCH_SUSPENDS`, default 10), and saved and
//! restored into a new QEMU (`ROAM_BENCH_RESTORES`, default 5) — how long the guest takes to
//! answer once resumed by a warm QEMU and by one that has just loaded it, as a migration's
//! target has.
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
use roam_api::{VirtualMachine, VirtualMachineMigration};
use roam_e2e::{Lab, Pinger, wait_until};
use serde_json::{Value, json};

/// What a capture saw: the client's ICMP echo request or the guest's reply on the VM's tap
/// (tcpdump), or QEMU stopping or resuming the guest (QMP's STOP / RESUME events through
/// libvirt, stamped by QEMU itself with the host's clock — the same clock as tcpdump's, as the
/// lab's nodes share the machine's kernel).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Request,
    Reply,
    Stop,
    Resume,
    /// A TCP reset, either way.
    Reset,
    /// An ARP request or reply, either way.
    Arp,
}

/// One thing seen: the node (`a`, `b`), its time (s since the epoch) and what.
type Seen = (char, f64, Kind);

/// Per node, for the whole bench: tcpdump of ICMP on the VM's tap (a tap appears with the
/// launcher that plugs it and goes with it, so the capture waits for it and starts again
/// when it comes back) and QEMU's monitor events for the VM's domain.
struct Capture {
    stop: Arc<AtomicBool>,
    seen: Arc<Mutex<Vec<Seen>>>,
    pids: Arc<Mutex<Vec<u32>>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

/// A capture's source: the command that produces lines (`None`: not yet, try again soon) and
/// the parser of one line.
type Source = (
    Box<dyn Fn() -> Option<std::process::Command> + Send>,
    fn(&str, &str) -> Option<(f64, Kind)>,
);

fn tcpdump_line(line: &str, _: &str) -> Option<(f64, Kind)> {
    let (t, rest) = line.split_once(' ')?;
    let kind = if rest.contains("Flags [R") {
        Kind::Reset
    } else if rest.contains("ARP") {
        Kind::Arp
    } else if rest.contains("ICMP echo reply") {
        Kind::Reply
    } else if rest.contains("ICMP echo request") {
        Kind::Request
    } else {
        return None;
    };
    Some((t.parse().ok()?, kind))
}

/// `event STOP at 1795986463.678882 for domain 'ns_vm': <null>`
fn qmp_line(line: &str, domain: &str) -> Option<(f64, Kind)> {
    let rest = line.strip_prefix("event ")?;
    let (event, rest) = rest.split_once(" at ")?;
    let (t, rest) = rest.split_once(' ')?;
    if !rest.starts_with(&format!("for domain '{domain}'")) {
        return None;
    }
    let kind = match event {
        "STOP" => Kind::Stop,
        "RESUME" => Kind::Resume,
        _ => return None,
    };
    Some((t.parse().ok()?, kind))
}

/// tcpdump's filter: ICMP, ARP and TCP resets.
const RESETS_AND_ECHOS: &str = "icmp or arp or tcp[tcpflags] & tcp-rst != 0";

impl Capture {
    /// Captures on the VM's tap and QEMU's events on both nodes (`a`, `b`), and on the
    /// client's namespace `client` (`c`).
    fn start(lab: &Lab, tap: &str, domain: &str, client: &str) -> Capture {
        let (stop, seen, pids) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(Mutex::new(vec![])),
            Arc::new(Mutex::new(vec![])),
        );
        let mut sources: Vec<(char, Source)> = vec![];
        let client = client.to_string();
        sources.push((
            'c',
            (
                Box::new(move || {
                    let mut c = std::process::Command::new("ip");
                    c.args(["netns", "exec", &client, "tcpdump", "-i", "any"])
                        .args(["-nn", "-tt", "-l", "-U", RESETS_AND_ECHOS]);
                    Some(c)
                }),
                tcpdump_line,
            ),
        ));
        for (id, node) in [('a', "node-a"), ('b', "node-b")] {
            let node = lab.node(node);
            let (netns, tap_) = (node.netns.clone(), tap.to_string());
            let tcpdump: Source = (
                Box::new(move || {
                    roam_e2e::try_run("ip", &["-n", &netns, "link", "show", &tap_]).ok()?;
                    let mut c = std::process::Command::new("ip");
                    c.args(["netns", "exec", &netns, "tcpdump", "-i", &tap_])
                        .args(["-nn", "-tt", "-l", "-U", RESETS_AND_ECHOS]);
                    Some(c)
                }),
                tcpdump_line,
            );
            // QEMU's events from the libvirtd of the VM's launcher pod on this node (each pod
            // runs its own): looked up again whenever the subscription ends (the pod went,
            // a migration's target pod came)
            let (lab_, name) = (lab.clone(), node.name.clone());
            let qmp: Source = (
                Box::new(move || {
                    std::thread::sleep(Duration::from_millis(100));
                    let uri = roam_e2e::launcher_libvirt(&lab_, NS, VM, &name)?;
                    let mut c = std::process::Command::new("virsh");
                    c.args(["-c", &uri, "qemu-monitor-event", "--loop"]);
                    Some(c)
                }),
                qmp_line,
            );
            sources.push((id, tcpdump));
            sources.push((id, qmp));
        }
        let mut threads = vec![];
        for (id, (command, parse)) in sources {
            let (stop, seen, pids, domain) =
                (stop.clone(), seen.clone(), pids.clone(), domain.to_string());
            threads.push(std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    let Some(mut cmd) = command() else {
                        std::thread::sleep(Duration::from_millis(20));
                        continue;
                    };
                    let Ok(mut child) = cmd
                        .stdout(std::process::Stdio::piped())
                        .stderr(std::process::Stdio::null())
                        .spawn()
                    else {
                        return;
                    };
                    pids.lock().unwrap().push(child.id());
                    let out = std::io::BufReader::new(child.stdout.take().unwrap());
                    for line in out.lines().map_while(Result::ok) {
                        if let Some((t, kind)) = parse(&line, &domain) {
                            seen.lock().unwrap().push((id, t, kind));
                        }
                    }
                    let _ = child.wait();
                    std::thread::sleep(Duration::from_millis(20));
                }
            }));
        }
        Capture {
            stop,
            seen,
            pids,
            threads,
        }
    }

    /// The guest's last pause since `since` (s since the epoch): QEMU stopped it on `src` and
    /// resumed it on `dst` (the same node for a suspend/resume, the target for a migration).
    fn pause(&self, src: char, dst: char, since: f64) -> Option<Pause> {
        let seen = self.seen.lock().unwrap();
        let at = |node: char, kind: Kind| {
            seen.iter()
                .filter(move |(n, t, k)| *n == node && *k == kind && *t >= since)
                .map(|(_, t, _)| *t)
        };
        let stopped = at(src, Kind::Stop).reduce(f64::max)?;
        let resumed = at(dst, Kind::Resume)
            .filter(|t| *t > stopped)
            .reduce(f64::min)?;
        let last = at(src, Kind::Reply)
            .filter(|t| *t < stopped)
            .reduce(f64::max)?;
        let answered = at(dst, Kind::Reply)
            .filter(|t| *t > resumed)
            .reduce(f64::min)?;
        let reached = at(dst, Kind::Request)
            .filter(|t| *t > last)
            .reduce(f64::min)?;
        let ms = |a: f64, b: f64| (b - a) * 1000.0;
        Some(Pause {
            before: ms(last, stopped),
            paused: ms(stopped, resumed),
            after: ms(resumed, answered),
            reached: ms(last, reached),
        })
    }
}

impl Capture {
    /// What was seen since `since`, 100 ms per line: per place (the taps on node-a and
    /// node-b, the client's namespace) the requests / replies / resets (`r`) and QEMU's stops
    /// and resumes — where the pings went when a run broke.
    fn timeline(&self, since: f64) -> String {
        let seen = self.seen.lock().unwrap();
        let mut out =
            String::from("    t(ms)         tap node-a         tap node-b             client\n");
        let end = seen.iter().map(|(_, t, _)| *t).fold(since, f64::max);
        let mut t = since;
        while t <= end {
            let cell = |node: char| {
                let n = |kind: Kind| {
                    seen.iter()
                        .filter(|(p, at, k)| *p == node && *k == kind && *at >= t && *at < t + 0.1)
                        .count()
                };
                let mut c = format!("{}/{}", n(Kind::Request), n(Kind::Reply));
                if n(Kind::Reset) > 0 {
                    c += &format!(" {}r", n(Kind::Reset));
                }
                if n(Kind::Arp) > 0 {
                    c += &format!(" {}arp", n(Kind::Arp));
                }
                if n(Kind::Stop) > 0 {
                    c += " STOP";
                }
                if n(Kind::Resume) > 0 {
                    c += " RESUME";
                }
                c
            };
            out += &format!(
                "{:>9.0} {:>18} {:>18} {:>18}\n",
                (t - since) * 1000.0,
                cell('a'),
                cell('b'),
                cell('c')
            );
            t += 0.1;
        }
        out
    }

    /// TCP resets seen anywhere since `since`.
    fn resets(&self, since: f64) -> usize {
        let seen = self.seen.lock().unwrap();
        seen.iter()
            .filter(|(_, t, k)| *k == Kind::Reset && *t >= since)
            .count()
    }
}

/// One part of a pause for a table cell (`?` when the capture did not see the pause).
fn part(seen: Option<Pause>, f: fn(&Pause) -> f64) -> String {
    seen.map(|p| format!("{:.0}ms", f(&p)))
        .unwrap_or_else(|| "?".into())
}

/// One pause of the guest, from the taps and QEMU's events (ms): the guest's last reply →
/// QEMU stops it (`before`), stopped → resumed (`paused`), resumed → the guest's first reply
/// (`after`); the three add up to the blackout as the taps see it. `reached`: the guest's
/// last reply → the client's first request on the resuming side's tap (for a migration: the
/// network ready).
#[derive(Clone, Copy, Debug)]
struct Pause {
    before: f64,
    paused: f64,
    after: f64,
    reached: f64,
}

impl Drop for Capture {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for pid in self.pids.lock().unwrap().iter() {
            let _ = roam_e2e::try_run("kill", &[&pid.to_string()]);
        }
        // a thread waiting for a tap sees the flag; one in tcpdump or virsh ends with it
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
async fn migrate_timed(client: &kube::Client, to: &str) -> (Value, Duration, f64) {
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
    let (t0, annotated) = (Instant::now(), epoch_s());
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
                return (
                    serde_json::to_value(&m).expect("json"),
                    t0.elapsed(),
                    annotated,
                );
            }
        }
        panic!("the migration watch ended");
    })
    .await
    .expect("the migration ends within the bound")
}

/// A migration's phase steps and their durations in ms.
type Spans = Vec<(String, f64)>;

/// The migration's phase transitions: each phase and when it was entered (Unix seconds).
fn transitions(st: &Value) -> Vec<(String, f64)> {
    st["phaseTransitions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| {
            let ts: k8s_openapi::jiff::Timestamp = t["time"].as_str()?.parse().ok()?;
            Some((
                t["phase"].as_str()?.to_string(),
                ts.as_microsecond() as f64 / 1e6,
            ))
        })
        .collect()
}

/// Where a migration's time went: from the annotation (`annotated`, Unix seconds) to its
/// first recorded phase, then from each phase to the next (`status.phaseTransitions`), in ms.
fn phase_spans(st: &Value, annotated: f64) -> Spans {
    let mut spans = Vec::new();
    let (mut last, mut from) = (annotated, "annotate".to_string());
    for (phase, at) in transitions(st) {
        spans.push((format!("{from}→{phase}"), (at - last) * 1000.0));
        (last, from) = (at, phase);
    }
    spans
}

/// Add each span of one run to its step's list over the runs.
fn gather(all: &mut Vec<(String, Vec<f64>)>, spans: &Spans) {
    for (name, ms) in spans {
        match all.iter_mut().find(|(n, _)| n == name) {
            Some((_, v)) => v.push(*ms),
            None => all.push((name.clone(), vec![*ms])),
        }
    }
}

/// How the target launcher pod `pod` on `node` started ([`roam_e2e::startlog::pod_start`]
/// over the node's kubelet and containerd logs and the shim's own log): each step's time
/// after the previous one (ms), from `created` (the TargetScheduling transition: the
/// controller created the pod) to `ready` (TargetReady: the controller's poll got the
/// shim's answer).
/// Also whether the kubelet's first list of a Secret of the pod was forbidden.
fn launcher_start(lab: &Lab, node: &str, pod: &str, created: f64, ready: f64) -> (Spans, bool) {
    // the pod whose shim serves the migration API: the launcher's runner (roam as installed)
    let (ns, pod) = roam_e2e::runner_of_launcher(lab, NS, pod);
    let pod = pod.as_str();
    let dir = lab.dir().join(node);
    let read = |p: std::path::PathBuf| std::fs::read_to_string(p).unwrap_or_default();
    let shim_log = std::fs::read_dir(dir.join("fs_var_log_pods"))
        .into_iter()
        .flatten()
        .flatten()
        .find(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(&format!("{ns}_{pod}_"))
        })
        .map(|e| read(e.path().join("shim/0.log")))
        .unwrap_or_default();
    let year = k8s_openapi::jiff::Timestamp::now()
        .strftime("%Y")
        .to_string()
        .parse()
        .unwrap_or(2026);
    let kubelet = read(dir.join("logs/kubelet.log"));
    // the kubelet asked for the pod's Secrets before the API server's node authorizer knew
    // the pod: forbidden, and its reflector backs off (~1 s) before the volume can mount
    let denied = !roam_e2e::startlog::lines_between(
        &kubelet,
        "Failed to watch *v1.Secret",
        // the kubelet sees the pod a few ms before the controller records TargetScheduling
        created - 1.0,
        ready,
        year,
    )
    .is_empty();
    let mut steps = roam_e2e::startlog::pod_start(
        &kubelet,
        &read(dir.join("logs/containerd.log")),
        &shim_log,
        (&ns, pod, "shim"),
        "serving the migration API",
        year,
    );
    steps.push(("TargetReady", ready));
    let mut last = created;
    let spans = steps
        .into_iter()
        .map(|(name, t)| {
            let span = (name.to_string(), (t - last) * 1000.0);
            last = t;
            span
        })
        .collect();
    (spans, denied)
}

/// The state of a guest on a node, from QEMU's monitor: run state, vCPU registers (is it
/// halted, where), translated blocks so far (is it executing new code), local APIC (pending
/// interrupts), and the virtio-net device's status and queues (0 RX, 1 TX: are buffers
/// available, has the device signalled what it used).
fn probe(uri: &str, domain: &str) -> String {
    // bounded: a QEMU whose main loop is stuck does not answer its monitor either (then the
    // probe says so instead of hanging the bench)
    let monitor = |args: &[&str]| {
        let mut all = vec!["5", "virsh", "-c", uri, "qemu-monitor-command"];
        all.extend_from_slice(args);
        roam_e2e::try_run("timeout", &all)
            .unwrap_or_else(|e| format!("(no answer in 5 s, or an error: {e})"))
    };
    let hmp = |cmd: &str| monitor(&["--hmp", domain, cmd]);
    let qmp = |cmd: &str| monitor(&[domain, cmd]);
    let nic = "/machine/peripheral/net0/virtio-backend";
    let mut out = String::new();
    out += &hmp("info status");
    let regs = hmp("info registers");
    out += &regs
        .lines()
        .filter(|l| l.contains("RIP=") || l.contains("HLT=") || l.contains("EFL="))
        .collect::<Vec<_>>()
        .join("\n");
    out += "\n";
    out += &hmp("info jit")
        .lines()
        .filter(|l| l.contains("TB count"))
        .collect::<String>();
    out += "\n";
    out += &hmp("info lapic")
        .lines()
        .filter(|l| {
            l.contains("IRR") || l.contains("ISR") || l.contains("LVT0") || l.contains("Timer")
        })
        .collect::<Vec<_>>()
        .join("\n");
    out += "\n";
    out += &qmp(&format!(
        r#"{{"execute":"x-query-virtio-status","arguments":{{"path":"{nic}"}}}}"#
    ));
    for q in [0, 1] {
        out += "\n";
        out += &qmp(&format!(
            r#"{{"execute":"x-query-virtio-queue-status","arguments":{{"path":"{nic}","queue":{q}}}}}"#
        ));
    }
    out
}

/// Median, min and max.
fn spread(v: &[f64]) -> (f64, f64, f64) {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    (
        v.get(v.len() / 2).copied().unwrap_or(f64::NAN),
        v.first().copied().unwrap_or(f64::NAN),
        v.last().copied().unwrap_or(f64::NAN),
    )
}

/// A control run `n` times on `node`: under 2 ms pings, `pause(i)` stops and resumes the
/// guest there; prints each blackout and its parts, returns the `after`s (ms).
fn control(
    lab: &Lab,
    capture: &Capture,
    b: &Booted,
    node: &str,
    what: &str,
    n: usize,
    pause: impl Fn(usize),
) -> Vec<f64> {
    let id = if node == "node-a" { 'a' } else { 'b' };
    println!(
        "\ncontrol on {node}: {what}\n{:>3} {:>12} {:>9} {:>8} {:>8}",
        "run", "blackout", "qemu", "before", "after"
    );
    let mut afters = vec![];
    for i in 0..n {
        let since = epoch_s();
        // the same load as in a migration: pings and the TCP echo stream
        let (stream, stop) = Stream::start(lab, &b.cli_ns, &b.ip);
        let pinger = Pinger::start(&b.cli_ns, &b.ip, "0.002");
        std::thread::sleep(Duration::from_millis(500));
        pause(i);
        wait_until(LONG, "ping answered after the resume", || {
            b.cli_ns.ping_once(&b.ip).then_some(())
        });
        let (_, gap) = pinger.stop();
        let tcp = stream.stop(&stop);
        assert!(
            tcp.starts_with("OK"),
            "{what}, run {}: the TCP stream broke: {tcp}",
            i + 1
        );
        // tcpdump's and virsh's lines of the last few ms may still be on their way
        std::thread::sleep(Duration::from_millis(300));
        let seen = capture.pause(id, id, since);
        if let Some(p) = seen {
            afters.push(p.after);
        }
        println!(
            "{:>3} {:>10.1}ms {:>9} {:>8} {:>8}",
            i + 1,
            gap.as_secs_f64() * 1000.0,
            part(seen, |p| p.paused),
            part(seen, |p| p.before),
            part(seen, |p| p.after),
        );
    }
    afters
}

fn main() {
    let runs: usize = std::env::var("ROAM_BENCH_MIGRATIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let lab = Lab::get();
    // the scale lab: N other addresses in OVN while the VM migrates (none by default)
    let others: usize = std::env::var("ROAM_BENCH_OTHER_ADDRESSES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let _load = (others > 0).then(|| {
        let mut load = roam_e2e::ScaleLoad::new(&lab);
        let r = load.load(others, 0.05, &[]);
        println!(
            "{} other addresses in OVN ({} bound to OVS ports): committed in {:.1} s, on every chassis in {:.1} s",
            r.addresses,
            r.bound,
            r.commit.as_secs_f64(),
            r.settled.as_secs_f64()
        );
        load
    });
    let rt = tokio::runtime::Runtime::new().expect("tokio");
    let client = rt.block_on(lab.kube_client());
    let b = boot(&lab);
    println!(
        "{:>3} {:>13} {:>10} {:>12} {:>6} {:>9} {:>6} {:>9} {:>8} {:>8} {:>10} {:>13} {:>12} {:>11}  guest",
        "run",
        "route",
        "downtime",
        "blackout",
        "ratio",
        "pause",
        "/pause",
        "qemu",
        "before",
        "after",
        "net ready",
        "tcp",
        "switchover",
        "overhead"
    );
    let mut pause_ratios = vec![];
    let (mut readies, mut leads, mut afters, mut bounds) = (vec![], vec![], vec![], vec![]);
    // The blackout the network allows, from the pause: QEMU's stop on the source → the later
    // of its resume on the target and the pings at the target, plus a warm QEMU's answer
    // time, over the pause (QEMU's stop → resume). 1.0x: the network added nothing to it.
    let mut over_pause = vec![];
    let domain = roam_core::launcher::domain_name(NS, VM);
    let capture = Capture::start(
        &lab,
        &roam_core::vm::tap_name(&format!("{NS}/{VM}")),
        &domain,
        &b.cli_ns.name,
    );
    let (mut ratios, mut survived, mut overheads) = (vec![], 0, vec![]);
    // per phase step (e.g. "TargetScheduling→TargetReady"), its durations over the runs
    let mut phase_times: Vec<(String, Vec<f64>)> = vec![];
    let mut slow: Vec<(usize, i64, Spans, Spans, bool)> = vec![];
    // the target launcher's start, step by step (kubelet, containerd, the shim's log)
    let mut start_times: Vec<(String, Vec<f64>)> = vec![];
    // runs whose target kubelet was refused its first list of the pod's Secret
    let mut denials = 0;
    // one more boot in the serial log means the guest rebooted
    let boots = || roam_e2e::guest_boots(&serial(&lab, &H8));
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
        let (m, total, annotated) = rt.block_on(migrate_timed(&client, to));
        // a guest that does not answer a second after its migration is looked at while it
        // does not: is it running, executing, taking its interrupts, refilling its RX ring?
        let landed = Instant::now();
        let mut probes = 0;
        wait_until(LONG, "ping answered after the migration", || {
            if b.cli_ns.ping_once(&b.ip) {
                return Some(());
            }
            if landed.elapsed() > Duration::from_secs(1 + probes) && probes < 4 {
                probes += 1;
                println!(
                    "    no answer {:.1} s after the migration; the guest on {to}:\n{}",
                    landed.elapsed().as_secs_f64(),
                    roam_e2e::launcher_libvirt(&lab, NS, VM, to).map_or_else(
                        || format!("no launcher pod on {to}"),
                        |uri| probe(&uri, &domain)
                    )
                );
            }
            None
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
        let seen = capture.pause(node(from), node(to), since);
        if let Some(p) = seen {
            readies.push(p.reached);
            afters.push(p.after);
            leads.push(p.before + p.paused - p.reached);
            bounds.push((p.before + p.paused, p.reached, downtime as f64));
            over_pause.push((p.paused, p.reached - p.before));
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
        let spans = phase_spans(st, annotated);
        let entered = |phase: &str| {
            transitions(st)
                .into_iter()
                .find(|(p, _)| p == phase)
                .map(|(_, t)| t)
        };
        let start = match (
            entered("TargetScheduling"),
            entered("TargetReady"),
            st["targetPod"].as_str(),
        ) {
            (Some(created), Some(ready), Some(pod)) => {
                launcher_start(&lab, to, pod, created, ready)
            }
            _ => (vec![], false),
        };
        let (start, denied) = start;
        denials += denied as usize;
        gather(&mut start_times, &start);
        gather(&mut phase_times, &spans);
        ratios.push(ratio);
        overheads.push(overhead);
        survived += ok as usize;
        println!(
            "{:>3} {:>13} {:>8}ms {:>10.1}ms {:>6.2} {:>7}ms {:>6.2} {:>9} {:>8} {:>8} {:>10} {:>13} {:>10}ms {:>9}ms  {}",
            i + 1,
            format!("{from}→{to}"),
            downtime,
            gap_ms,
            ratio,
            pause,
            pause_ratio,
            part(seen, |p| p.paused),
            part(seen, |p| p.before),
            part(seen, |p| p.after),
            part(seen, |p| p.reached),
            if ok { "survived" } else { "BROKEN" },
            st["switchoverMs"].as_u64().map(|v| v as i64).unwrap_or(-1),
            overhead,
            if rebooted { "REBOOTED" } else { "ran on" }
        );
        if overhead > 2000 {
            slow.push((i + 1, overhead, spans, start, denied));
        }
        let resets = capture.resets(since);
        if !ok || resets > 0 || gap_ms > 1000.0 {
            let console = serial(&lab, &H8);
            let tail: Vec<&str> = console.lines().rev().take(30).collect();
            println!(
                "    tcp: {tcp}; TCP resets seen: {resets}; requests/replies per 100 ms since the \
                 run began:\n{}    the guest's console, last lines:\n{}",
                capture.timeline(since),
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
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
    // The controls, on the node the VM is on, under the same pings and with no network
    // change: the guest paused and resumed by the same QEMU (`virsh suspend` / `resume`),
    // and the guest saved and restored into a new QEMU (`virsh save` / `restore`). Their
    // `after` is how long this guest takes to answer once resumed, by a QEMU that has been
    // running it and by one that has just loaded it (as a migration's target has).
    let count = |var: &str, default: usize| {
        std::env::var(var)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let here = if runs.is_multiple_of(2) {
        "node-a"
    } else {
        "node-b"
    };
    let uri = roam_e2e::launcher_libvirt(&lab, NS, VM, here)
        .unwrap_or_else(|| panic!("no launcher pod of {NS}/{VM} on {here}"));
    // in the launcher pod's own filesystem: its libvirtd writes and reads it
    let image = "/var/lib/libvirt/qemu/save/bench-save.img";
    let suspend_afters = control(
        &lab,
        &capture,
        &b,
        here,
        "suspend → resume in the same QEMU",
        count("ROAM_BENCH_SUSPENDS", 10),
        |i| {
            roam_e2e::run("virsh", &["-c", &uri, "suspend", &domain]);
            // pauses as long as a migration's (50–200 ms)
            std::thread::sleep(Duration::from_millis(50 + 50 * (i as u64 % 4)));
            roam_e2e::run("virsh", &["-c", &uri, "resume", &domain]);
        },
    );
    let restore_afters = control(
        &lab,
        &capture,
        &b,
        here,
        "save → restore into a new QEMU",
        count("ROAM_BENCH_RESTORES", 5),
        |_| {
            roam_e2e::run("virsh", &["-c", &uri, "save", &domain, image]);
            roam_e2e::run("virsh", &["-c", &uri, "restore", image]);
        },
    );
    let (am, a0, a1) = spread(&afters);
    let (sm, s0, s1) = spread(&suspend_afters);
    let (rm, r0, r1) = spread(&restore_afters);
    println!(
        "\nQEMU resumed → the guest's first reply, median (range): after a migration {am:.0} ms \
         ({a0:.0}–{a1:.0}); after a suspend/resume in the same QEMU {sm:.0} ms ({s0:.0}–{s1:.0}); \
         after a save/restore into a new QEMU {rm:.0} ms ({r0:.0}–{r1:.0})"
    );
    println!(
        "\nwhere a migration's time goes (the controller's phase transitions), median (range):"
    );
    for (name, v) in &phase_times {
        let (m, lo, hi) = spread(v);
        println!("  {name:<32} {m:>7.0} ms ({lo:.0}–{hi:.0})");
    }
    println!(
        "\nthe target launcher's start (TargetScheduling → TargetReady), step by step, median (range):"
    );
    for (name, v) in &start_times {
        let (m, lo, hi) = spread(v);
        println!("  → {name:<30} {m:>7.0} ms ({lo:.0}–{hi:.0})");
    }
    let line = |spans: &Spans| {
        spans
            .iter()
            .map(|(n, ms)| format!("{n} {ms:.0} ms"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    println!(
        "  in {denials} of {runs} runs the target's kubelet was first refused the pod's Secret \
         (the API server's node authorizer did not know the pod yet)"
    );
    for (run, overhead, spans, start, denied) in &slow {
        println!(
            "  run {run} (overhead {overhead} ms): {}\n    its launcher: {}{}",
            line(spans),
            line(start),
            if *denied {
                "; its Secret list was forbidden first"
            } else {
                ""
            }
        );
    }
    let (rm_, rmin, rmax) = spread(&ratios);
    let (pm, _, pmax) = spread(&pause_ratios);
    let (om, _, omax) = spread(&overheads.iter().map(|&o| o as f64).collect::<Vec<_>>());
    let (_, r0, r1) = spread(&readies);
    let (lm, l0, l1) = spread(&leads);
    let network_first = leads.iter().filter(|&&l| l > 0.0).count();
    // What the network allows: the guest reachable on the target (the later of the network
    // ready and QEMU resuming it) plus a warm QEMU's answer time, over the downtime.
    let allowed: Vec<f64> = bounds
        .iter()
        .map(|&(resumed, reached, downtime)| (resumed.max(reached) + sm) / downtime)
        .collect();
    let (wm, _, wmax) = spread(&allowed);
    let over_pause: Vec<f64> = over_pause
        .iter()
        .map(|&(paused, reached)| (paused.max(reached) + sm) / paused)
        .collect();
    let (xm, _, xmax) = spread(&over_pause);
    println!(
        "\n{runs} migrations: blackout/downtime ratio median {rm_:.2} ({rmin:.2}–{rmax:.2}), {} of {runs} ≤ 1.3 (target ≤ 1.3); \
         blackout/pause (the shims' suspend → resume events) median {pm:.2} max {pmax:.2}; \
         pings reached the target's tap {r0:.0}–{r1:.0} ms after the guest's last reply on the source, \
         before QEMU resumed the guest there in {network_first} of {} runs (by a median {lm:.0} ms, {l0:.0}–{l1:.0}); \
         the blackout the network allows (the later of the two, plus a warm QEMU's {sm:.0} ms) over the downtime: \
         median {wm:.2} max {wmax:.2}; \
         from QEMU's stop, over the pause: median {xm:.2} max {xmax:.2} (target ≤ 1.1); \
         TCP survived {survived}/{runs}; guest reboots {reboots}; overhead median {om:.0} ms max {omax:.0} ms (target ≤ 2000 ms)",
        ratios.iter().filter(|&&r| r <= 1.3).count(),
        leads.len(),
    );
}
