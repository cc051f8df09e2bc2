//! Live-migration faults on the lab, through the Kubernetes API and real
//! processes: one VM booted by roam-controller in a real launcher pod (as in lab_migration),
//! then, one after the other on that VM:
//!
//! - the installed roam-controller's leader SIGKILLed on its node while the migration is in
//!   TargetScheduling, in TargetReady, in Migrating (copy slowed by a low bandwidth), at
//!   Switchover (as the Address's host flips to the target) and right after Succeeded (source
//!   pod still terminating): the kubelet restarts it or the standby replica takes the Lease,
//!   and the migration ends Succeeded;
//! - a second migration (a VirtualMachineMigration and a `roam.dev/migrate-to` annotation)
//!   while one is Migrating: refused with the reason, the first unaffected;
//! - the source shim SIGKILLed right after the switchover: the migration still ends
//!   Succeeded on the target;
//! - the target launcher pod deleted while Migrating: Failed with the reason, the VM still
//!   on the source;
//! - the target shim process SIGKILLed while Migrating: the kubelet restarts it and it
//!   re-attaches; the migration ends Succeeded, or Failed (a known limit) with the VM running
//!   on the source and the next one Succeeded (and the failed migration before it got no
//!   route flip from a task it left behind);
//! - roam-controller dead right after it started the copy, before it recorded the job (the
//!   `migration-started` failpoint: `ROAM_FAILPOINT` set in the Deployment, a rollout): the
//!   next one adopts the running job and still sees the pause (the target announces, its
//!   activation is timed); the failpoint removed again (a rollout);
//! - an upgrade: `kubectl rollout restart deploy/roam-controller` while a slow copy runs:
//!   both pods replaced one at a time, the migration ends Succeeded.
//!
//! After each: the guest runs on exactly one node (libvirt domains of both nodes, through
//! their sockets), the VM's status and its Address's host name that node, same IP and MAC, no
//! second node left on the Address, exactly one launcher pod, the guest answers ping, and the
//! migration's phase (and reason) is in its status and in an Event. A watch on the Address
//! checks that its host moved at most once, to the node the guest ends on, and never back (a
//! restarted controller once re-settled old migrations and flipped the route to their old
//! targets).

mod migration_fixture;

use std::io::BufReader;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use migration_fixture::*;
use roam_e2e::{Installed, Lab, try_run, wait_until, wait_until_else};
use serde_json::{Value, json};

const F8: Names = Names {
    ns: "f8-mig",
    net: "f8mig",
    vm: "f8vm",
    subnet: "100.151.0.0/24",
    gw: "100.151.0.1",
    transit: "169.254.151.0/24",
    cli: "f8cli",
};

fn other(node: &str) -> &'static str {
    if node == "node-a" { "node-b" } else { "node-a" }
}

/// The installed roam-controller, crashed and reconfigured the way an operator's cluster
/// would see it: its leader's process SIGKILLed (the kubelet restarts the container, or the
/// standby replica takes the Lease), a failpoint set in the Deployment's environment (a
/// rollout), and removed again when dropped.
struct Ctl {
    lab: Lab,
    roam: Installed,
    failpoint: bool,
}

impl Ctl {
    /// SIGKILL the leader (a crash) and wait until a controller leads again; prints the
    /// phase `migration` had then.
    fn crash_and_restart(&mut self, migration: &str) {
        let crash = self.roam.kill_leader();
        let at = vmim(&self.lab, migration)
            .map(|m| phase(&m).to_string())
            .unwrap_or_default();
        self.roam.wait_back(&crash);
        eprintln!(
            "  controller {} SIGKILLed with {migration} in {at}; {} leads",
            crash.pod,
            self.roam.leader().unwrap_or_default()
        );
    }

    /// Roll the Deployment out with `ROAM_FAILPOINT=at`: its leader aborts there.
    fn with_failpoint(&mut self, at: &str) {
        self.failpoint = true;
        self.roam.set_env("ROAM_FAILPOINT", Some(at));
        eprintln!("  controller rolled out with failpoint {at}");
    }

    /// Wait until a controller aborted at failpoint `at` (its crashed container's log says
    /// so) and another leads.
    fn wait_aborted(&self, at: &str) {
        let line = format!("failpoint {at}: aborting");
        wait_until_else(
            LONG,
            "the controller to abort at its failpoint",
            || self.roam.log_text().contains(&line).then_some(()),
            || self.tail(),
        );
        let leader = wait_until(LONG, "a leader after the abort", || self.roam.leader());
        eprintln!("  it aborted at {at}; {leader} leads");
    }

    /// Roll the Deployment out without the failpoint.
    fn clear_failpoint(&mut self) {
        self.roam.set_env("ROAM_FAILPOINT", None);
        self.failpoint = false;
    }

    fn tail(&self) -> String {
        self.roam.describe()
    }
}

impl Drop for Ctl {
    fn drop(&mut self) {
        if self.failpoint {
            self.roam.set_env("ROAM_FAILPOINT", None);
        }
    }
}

/// `kubectl get -w -o json` of one object: every version of it, as it changes.
struct Watch {
    child: Child,
    rx: mpsc::Receiver<Value>,
}

impl Watch {
    fn new(lab: &Lab, args: &[&str]) -> Watch {
        let mut child = Command::new(lab.kubectl())
            .args(["--kubeconfig", lab.kubeconfig()])
            .args(args)
            .args(["-w", "-o", "json"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start kubectl get -w");
        let out = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let objects = serde_json::Deserializer::from_reader(BufReader::new(out));
            for v in objects.into_iter::<Value>() {
                let Ok(v) = v else { return };
                if tx.send(v).is_err() {
                    return;
                }
            }
        });
        Watch { child, rx }
    }

    /// The first version for which `f` holds.
    fn until(&self, what: &str, f: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + LONG;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(v) if f(&v) => return v,
                Ok(_) => {}
                Err(_) => panic!("timed out (or the watch ended) waiting for {what}"),
            }
        }
    }
}

/// The hosts an Address watch saw, consecutive repeats folded, once it has seen `last`.
fn hosts(w: &Watch, last: &str) -> Vec<String> {
    let mut seen: Vec<String> = vec![];
    let deadline = Instant::now() + LONG;
    loop {
        let next =
            if seen.last().map(String::as_str) == Some(last) {
                w.rx.try_recv().ok()
            } else {
                let left = deadline.saturating_duration_since(Instant::now());
                Some(w.rx.recv_timeout(left).unwrap_or_else(|_| {
                    panic!("the Address never named {last}; it named {seen:?}")
                }))
            };
        let Some(a) = next else { return seen };
        let h = a["spec"]["host"].as_str().unwrap_or("-").to_string();
        if seen.last() != Some(&h) {
            seen.push(h);
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn domain(n: &Names) -> String {
    format!("{}_{}", n.ns, n.vm)
}

/// The state of the VM's libvirt domain on `node` ("running", "paused", …), None if absent.
fn domstate(lab: &Lab, node: &str) -> Option<String> {
    // each launcher pod runs its own libvirtd: the VM's pod on the node, if any
    let uri = roam_e2e::launcher_libvirt(lab, F8.ns, F8.vm, node)?;
    try_run("virsh", &["-c", &uri, "domstate", &domain(&F8)])
        .ok()
        .map(|s| s.trim().to_string())
}

/// The pids of the roam-shim processes of the VM on `node`.
fn shim_pids(node: &str) -> Vec<String> {
    let mut out = vec![];
    for e in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(cmd) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmd
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let has = |k: &str, v: &str| args.windows(2).any(|w| w[0] == k && w[1] == v);
        if args.first().is_some_and(|a| a.ends_with("roam-shim"))
            && has("--name", &domain(&F8))
            && has("--node", node)
        {
            out.push(e.file_name().to_string_lossy().into_owned());
        }
    }
    out
}

/// SIGKILL the VM's shim process on `node` (the pod's container; the kubelet restarts it).
fn kill_shim(node: &str) {
    let pids = shim_pids(node);
    assert_eq!(pids.len(), 1, "one shim of the VM on {node}: {pids:?}");
    roam_e2e::run("kill", &["-KILL", &pids[0]]);
    eprintln!("  roam-shim on {node} (pid {}) SIGKILLed", pids[0]);
}

fn vmim(lab: &Lab, name: &str) -> Option<Value> {
    get(lab, &["-n", F8.ns, "get", "vmim", name])
}

fn create_vmim(lab: &Lab, name: &str, to: &str, bandwidth: Option<u64>) {
    let mut spec = json!({"vm": F8.vm, "targetNode": to});
    if let Some(b) = bandwidth {
        spec["bandwidthMibPerSecond"] = json!(b);
    }
    create(
        lab,
        &[
            json!({"apiVersion": "roam.dev/v1alpha1", "kind": "VirtualMachineMigration",
                 "metadata": {"name": name, "namespace": F8.ns, "labels": {"roam.dev/vm": F8.vm}},
                 "spec": spec}),
        ],
    );
}

fn phase(m: &Value) -> &str {
    m["status"]["phase"].as_str().unwrap_or_default()
}

fn wait_end(lab: &Lab, ctl: &Ctl, name: &str) -> Value {
    let deadline = Instant::now() + LONG;
    loop {
        if let Some(m) = vmim(lab, name)
            && ["Succeeded", "Failed", "Aborted"].contains(&phase(&m))
        {
            return m;
        }
        assert!(
            Instant::now() < deadline,
            "migration {name} did not end: {:?}\n{}",
            vmim(lab, name),
            ctl.tail()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn watch_vmim(lab: &Lab, name: &str) -> Watch {
    // a list watch: the migration need not exist yet
    let field = format!("metadata.name={name}");
    Watch::new(
        lab,
        &["-n", F8.ns, "get", "vmim", "--field-selector", &field],
    )
}

/// The end state every scenario must reach: the guest on `on` only, with its address.
fn assert_settled(lab: &Lab, b: &Booted, ctl: &Ctl, on: &str) {
    let fail = |what: &str| format!("{what}\n{}", ctl.tail());
    let v = wait_until(LONG, "the VM Running, no migration under way", || {
        let v = vm(lab, &F8)["status"].clone();
        (v["phase"] == "Running" && v["migration"].is_null()).then_some(v)
    });
    assert_eq!(v["node"], on, "{}", fail(&v.to_string()));
    assert_eq!(v["interfaces"][0]["ip"], b.ip.as_str(), "same IP");
    assert_eq!(v["interfaces"][0]["mac"], b.mac.as_str(), "same MAC");
    let pod = v["pod"].as_str().expect("the VM's pod").to_string();
    wait_until(LONG, "the Address on that node only", || {
        let a = get(lab, &["get", "address", &b.addr])?;
        (a["spec"]["host"] == on && a["metadata"]["annotations"]["roam.dev/also-on"].is_null())
            .then_some(())
    });
    let a = get(lab, &["get", "address", &b.addr]).expect("the Address");
    assert_eq!(a["spec"]["ip"], b.ip.as_str(), "{a}");
    assert_eq!(a["spec"]["mac"], b.mac.as_str(), "{a}");
    wait_until(LONG, "exactly one launcher pod, the VM's", || {
        let pods = get(
            lab,
            &["-n", F8.ns, "get", "pods", "-l", "roam.dev/launcher=true"],
        )?;
        let items = pods["items"].as_array()?.clone();
        (items.len() == 1
            && items[0]["metadata"]["name"] == pod.as_str()
            && items[0]["spec"]["nodeName"] == on)
            .then_some(())
    });
    wait_until(LONG, "the guest's domain on that node only", || {
        (domstate(lab, on).as_deref() == Some("running") && domstate(lab, other(on)).is_none())
            .then_some(())
    });
    wait_until_else(
        LONG,
        "the guest answers ping",
        || b.cli_ns.ping_once(&b.ip).then_some(()),
        || format!("{}\n{}", network_report(lab, b), ctl.tail()),
    );
}

/// The migration ended in `want`, with its reason (for Failed) and an Event.
fn assert_ended(lab: &Lab, ctl: &Ctl, m: &Value, want: &str, reason: Option<&str>) {
    let name = m["metadata"]["name"].as_str().unwrap();
    assert_eq!(phase(m), want, "{m}\n{}", ctl.tail());
    if let Some(r) = reason {
        let got = m["status"]["reason"].as_str().unwrap_or_default();
        assert!(got.contains(r), "reason {got:?} should say {r:?}");
    }
    let ev = wait_until(LONG, "the migration's Event", || {
        let ev = events_of(lab, &F8, name);
        ev.contains(&format!("Migration{want}")).then_some(ev)
    });
    if let Some(r) = reason {
        assert!(ev.contains(r), "the Event says why: {ev}");
    }
}

/// A migration `name` to `to` in which the controller is SIGKILLed and restarted as soon
/// as the migration shows `at`; it must end Succeeded.
fn controller_crash(
    lab: &Lab,
    b: &Booted,
    ctl: &mut Ctl,
    name: &str,
    to: &str,
    bandwidth: Option<u64>,
    at: &str,
) -> Value {
    let w = watch_vmim(lab, name);
    let addr = Watch::new(lab, &["get", "address", &b.addr]);
    create_vmim(lab, name, to, bandwidth);
    w.until(&format!("{name} in {at}"), |m| phase(m) == at);
    ctl.crash_and_restart(name);
    let m = wait_end(lab, ctl, name);
    assert_ended(lab, ctl, &m, "Succeeded", None);
    assert_settled(lab, b, ctl, to);
    assert_one_flip(&addr, to, ctl);
    m
}

/// The Address's host moved once, from the other node to `to`, and never back.
fn assert_one_flip(addr: &Watch, to: &str, ctl: &Ctl) {
    let seen = hosts(addr, to);
    assert_eq!(
        seen,
        [other(to), to],
        "the Address moved once, never back\n{}",
        ctl.tail()
    );
}

#[test]
fn migrations_survive_controller_and_shim_faults() {
    let t0 = Instant::now();
    let lab = Lab::get();
    let b = boot_with(&lab, &F8);
    let mut ctl = Ctl {
        lab: lab.clone(),
        roam: b.ctl.clone(),
        failpoint: false,
    };
    assert_settled(&lab, &b, &ctl, "node-a");
    eprintln!("booted in {:?}", t0.elapsed());

    // --- controller killed in TargetScheduling (a → b)
    let t = Instant::now();
    let m = controller_crash(
        &lab,
        &b,
        &mut ctl,
        "f8-sched",
        "node-b",
        None,
        "TargetScheduling",
    );
    // how much memory one copy moves: the slow migrations below take ~20 s with it
    let moved = m["status"]["progress"]["memoryProcessed"]
        .as_u64()
        .unwrap_or(0);
    let slow = ((moved >> 20) / 20).max(1);
    eprintln!(
        "TargetScheduling: Succeeded in {:?} ({} MiB moved; slow copies at {slow} MiB/s)",
        t.elapsed(),
        moved >> 20
    );

    // --- controller killed in TargetReady (b → a)
    let t = Instant::now();
    controller_crash(
        &lab,
        &b,
        &mut ctl,
        "f8-ready",
        "node-a",
        None,
        "TargetReady",
    );
    eprintln!("TargetReady: Succeeded in {:?}", t.elapsed());

    // --- a slow migration (a → b): a second one is refused while it copies; then the
    // controller is killed while it copies and the restarted one carries on
    let t = Instant::now();
    let w = watch_vmim(&lab, "f8-copy");
    let addr = Watch::new(&lab, &["get", "address", &b.addr]);
    // slow enough (~60 s) that the copy's pause comes after a controller leads again even
    // when the crashed leader's container is in the kubelet's back-off and the standby
    // waits out the Lease (15 s): the restarted controller must see the pause to time it
    create_vmim(&lab, "f8-copy", "node-b", Some((slow / 3).max(1)));
    w.until("f8-copy copying", |m| phase(m) == "Migrating");
    create_vmim(&lab, "f8-dup", "node-a", None);
    let dup = wait_end(&lab, &ctl, "f8-dup");
    assert_ended(
        &lab,
        &ctl,
        &dup,
        "Failed",
        Some("f8-copy of this VM is under way"),
    );
    let name_of = |m: &Value| {
        m["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    let before: Vec<String> = migrations(&lab, &F8).iter().map(name_of).collect();
    kubectl(
        &lab,
        &[
            "-n",
            F8.ns,
            "annotate",
            "vm",
            F8.vm,
            "roam.dev/migrate-to=node-b",
        ],
    );
    let refused = wait_until(LONG, "the annotation's migration refused", || {
        migrations(&lab, &F8)
            .into_iter()
            .find(|m| !before.contains(&name_of(m)))
            .filter(|m| phase(m) == "Failed")
    });
    assert_ended(
        &lab,
        &ctl,
        &refused,
        "Failed",
        Some("f8-copy of this VM is under way"),
    );
    let copy = vmim(&lab, "f8-copy").unwrap();
    assert_eq!(
        phase(&copy),
        "Migrating",
        "the first one unaffected: {copy}"
    );
    assert_eq!(vm(&lab, &F8)["status"]["migration"], "f8-copy");
    ctl.crash_and_restart("f8-copy");
    let m = wait_end(&lab, &ctl, "f8-copy");
    assert_ended(&lab, &ctl, &m, "Succeeded", None);
    assert!(
        switchover_ms(&lab, F8.ns, "f8-copy").is_some(),
        "the restarted controller timed the target's activation from the pause: {m}\n{}",
        ctl.tail()
    );
    assert_settled(&lab, &b, &ctl, "node-b");
    assert_one_flip(&addr, "node-b", &ctl);
    eprintln!(
        "Migrating (+ migrate while migrating): Succeeded in {:?}",
        t.elapsed()
    );

    // --- controller killed as the Address's host flips to the target (b → a)
    let t = Instant::now();
    let wa = Watch::new(&lab, &["get", "address", &b.addr]);
    create_vmim(&lab, "f8-flip", "node-a", None);
    wa.until("the Address's host on node-a", |a| {
        a["spec"]["host"] == "node-a"
    });
    ctl.crash_and_restart("f8-flip");
    let m = wait_end(&lab, &ctl, "f8-flip");
    assert_ended(&lab, &ctl, &m, "Succeeded", None);
    assert_settled(&lab, &b, &ctl, "node-a");
    assert_eq!(hosts(&wa, "node-a"), ["node-a"], "never back to node-b");
    eprintln!("Switchover: Succeeded in {:?}", t.elapsed());

    // --- controller killed right after Succeeded, the source pod still terminating (a → b)
    let t = Instant::now();
    let source_pod = vm(&lab, &F8)["status"]["pod"].as_str().unwrap().to_string();
    let w = watch_vmim(&lab, "f8-done");
    let addr = Watch::new(&lab, &["get", "address", &b.addr]);
    create_vmim(&lab, "f8-done", "node-b", None);
    w.until("f8-done Succeeded", |m| phase(m) == "Succeeded");
    ctl.crash_and_restart("f8-done");
    let still = get(&lab, &["-n", F8.ns, "get", "pod", &source_pod]).is_some();
    eprintln!("  f8-done: controller killed at Succeeded (source pod still there: {still})");
    let m = wait_end(&lab, &ctl, "f8-done");
    assert_ended(&lab, &ctl, &m, "Succeeded", None);
    assert_settled(&lab, &b, &ctl, "node-b");
    assert_one_flip(&addr, "node-b", &ctl);
    eprintln!("after Succeeded: settled in {:?}", t.elapsed());

    // --- the source shim killed right after the switchover (b → a)
    let t = Instant::now();
    let wa = Watch::new(&lab, &["get", "address", &b.addr]);
    create_vmim(&lab, "f8-srcshim", "node-a", None);
    wa.until("the Address's host on node-a", |a| {
        a["spec"]["host"] == "node-a"
    });
    kill_shim("node-b");
    let m = wait_end(&lab, &ctl, "f8-srcshim");
    assert_ended(&lab, &ctl, &m, "Succeeded", None);
    assert_settled(&lab, &b, &ctl, "node-a");
    assert_eq!(hosts(&wa, "node-a"), ["node-a"], "never back to node-b");
    eprintln!(
        "source shim killed after switchover: Succeeded in {:?}",
        t.elapsed()
    );

    // --- the target pod deleted while copying (a → b): Failed, the VM stays on node-a
    let t = Instant::now();
    let addr = Watch::new(&lab, &["get", "address", &b.addr]);
    let w = watch_vmim(&lab, "f8-tgtpod");
    create_vmim(&lab, "f8-tgtpod", "node-b", Some(1));
    let m = w.until("f8-tgtpod copying", |m| phase(m) == "Migrating");
    let target_pod = m["status"]["targetPod"].as_str().unwrap().to_string();
    kubectl(
        &lab,
        &["-n", F8.ns, "delete", "pod", &target_pod, "--wait=false"],
    );
    let m = wait_end(&lab, &ctl, "f8-tgtpod");
    assert_ended(&lab, &ctl, &m, "Failed", Some("target pod: gone"));
    assert_settled(&lab, &b, &ctl, "node-a");
    assert_eq!(hosts(&addr, "node-a"), ["node-a"], "the route never moved");
    assert!(
        get(&lab, &["-n", F8.ns, "get", "pod", &target_pod]).is_none(),
        "the target pod is gone"
    );
    eprintln!(
        "target pod deleted while copying: Failed in {:?}",
        t.elapsed()
    );

    // --- the target shim process killed while copying (a → b): the kubelet restarts it and
    // it re-attaches; the copy carries on to the end (the proxy's target side is not the
    // shim) or, when the kill falls early, ends Failed with the VM on node-a as before
    // (docs/status.md, Limits) and the next migration to node-b succeeds
    let t = Instant::now();
    let addr = Watch::new(&lab, &["get", "address", &b.addr]);
    let w = watch_vmim(&lab, "f8-tgtshim");
    create_vmim(&lab, "f8-tgtshim", "node-b", Some(slow));
    w.until("f8-tgtshim copying", |m| phase(m) == "Migrating");
    kill_shim("node-b");
    let m = wait_end(&lab, &ctl, "f8-tgtshim");
    if phase(&m) == "Failed" {
        // the kill fell where the streams could not carry on: the VM on its source
        assert_ended(&lab, &ctl, &m, "Failed", None);
        assert_settled(&lab, &b, &ctl, "node-a");
        create_vmim(&lab, "f8-tgtshim-again", "node-b", None);
        let m = wait_end(&lab, &ctl, "f8-tgtshim-again");
        assert_ended(&lab, &ctl, &m, "Succeeded", None);
    } else {
        assert_ended(&lab, &ctl, &m, "Succeeded", None);
    }
    assert_settled(&lab, &b, &ctl, "node-b");
    assert_one_flip(&addr, "node-b", &ctl);
    // the failed f8-tgtpod's copy never paused, so no event ended its switchover task: it
    // must have ended with the migration, not flipped the route at this one's pause
    let failed = vmim(&lab, "f8-tgtpod").unwrap();
    assert!(
        failed["status"]["switchoverMs"].is_null(),
        "a failed migration's task acted on the next one: {failed}\n{}",
        ctl.tail()
    );
    eprintln!(
        "target shim killed while copying: on node-b in {:?}",
        t.elapsed()
    );

    // --- the controller dies right after it started the copy, before it wrote the job's id
    // (b → a, a slow copy): the next one adopts the running job (no second start) and still
    // sees the pause (the target announces)
    let t = Instant::now();
    let addr = Watch::new(&lab, &["get", "address", &b.addr]);
    ctl.with_failpoint("migration-started");
    create_vmim(&lab, "f8-adopt", "node-a", Some(slow));
    ctl.wait_aborted("migration-started");
    let m = wait_end(&lab, &ctl, "f8-adopt");
    assert_ended(&lab, &ctl, &m, "Succeeded", None);
    assert!(
        switchover_ms(&lab, F8.ns, "f8-adopt").is_some(),
        "the adopted copy's pause was seen (the target's activation timed): {m}\n{}",
        ctl.tail()
    );
    assert!(
        ctl.roam
            .log_text()
            .contains("adopting the copy this migration started"),
        "{}",
        ctl.tail()
    );
    // read before the rollout replaces the pods whose logs say it
    ctl.clear_failpoint();
    assert_settled(&lab, &b, &ctl, "node-a");
    assert_one_flip(&addr, "node-a", &ctl);
    eprintln!(
        "controller killed between starting the copy and recording it: Succeeded in {:?}",
        t.elapsed()
    );

    // --- an upgrade while a slow copy runs (a → b): `kubectl rollout restart` replaces both
    // controller pods, one at a time (SIGTERM: the leader hands its Lease over); the
    // migration completes, nothing is lost
    let t = Instant::now();
    let w = watch_vmim(&lab, "f8-upgrade");
    let addr = Watch::new(&lab, &["get", "address", &b.addr]);
    create_vmim(&lab, "f8-upgrade", "node-b", Some((slow / 2).max(1)));
    w.until("f8-upgrade copying", |m| phase(m) == "Migrating");
    let old: Vec<String> = ctl.roam.pods().into_iter().map(|(p, _)| p).collect();
    ctl.roam.rollout_restart();
    let now: Vec<String> = ctl.roam.pods().into_iter().map(|(p, _)| p).collect();
    assert!(
        now.iter().all(|p| !old.contains(p)),
        "every controller pod replaced: {old:?} → {now:?}"
    );
    eprintln!(
        "  rolled out ({old:?} → {now:?}) with f8-upgrade in {}",
        vmim(&lab, "f8-upgrade")
            .map(|m| phase(&m).to_string())
            .unwrap_or_default()
    );
    let m = wait_end(&lab, &ctl, "f8-upgrade");
    assert_ended(&lab, &ctl, &m, "Succeeded", None);
    assert_settled(&lab, &b, &ctl, "node-b");
    assert_one_flip(&addr, "node-b", &ctl);
    eprintln!(
        "controller rolled out during a copy: Succeeded in {:?}",
        t.elapsed()
    );

    eprintln!("all fault scenarios in {:?}", t0.elapsed());
}
