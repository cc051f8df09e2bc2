//! What encrypting the migration costs, on the lab, in one run: the installed roam-controller
//! first switched to plain TCP (`ROAM_NODE_PKI_DIR` empty, the peer URI `qemu+tcp://`, set on
//! its Deployment, a rollout: libvirtd and QEMU straight between the nodes), a VM booted and
//! migrated back and forth `ROAM_BENCH_TLS_RUNS` times (default 6), then the controller as
//! shipped (TLS with the nodes' roam certificates), a new VM, as many
//! migrations (through the shims' mutual-TLS proxies: libvirt's connection and QEMU's stream
//! over the runner pods' UNIX sockets, carried between the nodes by the shims). Per
//! migration, from `status.phaseTransitions`: the copy (Migrating →
//! Switchover), the whole migration (its first phase → Succeeded) and libvirt's downtime.
//! The summary prints the medians and TLS over plain (target: the whole migration ≤ 1.10).
//! The controller is put back as shipped whatever happens. Figures: docs/benchmarks.md.

#[path = "../tests/migration_fixture/mod.rs"]
mod migration_fixture;

use migration_fixture::*;
use roam_e2e::{Lab, wait_until};
use serde_json::Value;

/// Puts the installed controller back as shipped (the Deployment's own env removed) when
/// dropped.
struct Shipped<'a>(&'a Lab);

impl Drop for Shipped<'_> {
    fn drop(&mut self) {
        set_mode(self.0, false);
    }
}

/// Switch the installed controller to plain TCP migrations (`plain`) or back as shipped,
/// and wait for the rollout.
fn set_mode(lab: &Lab, plain: bool) {
    let env: &[&str] = if plain {
        &[
            "ROAM_NODE_PKI_DIR=",
            "ROAM_PEER_LIBVIRT_URI=qemu+tcp://{ip}:{port}/system",
        ]
    } else {
        &["ROAM_NODE_PKI_DIR-", "ROAM_PEER_LIBVIRT_URI-"]
    };
    let mut args = vec!["-n", "roam-system", "set", "env", "deploy/roam-controller"];
    args.extend_from_slice(env);
    let _ = try_kubectl(lab, &args);
    let _ = try_kubectl(
        lab,
        &[
            "-n",
            "roam-system",
            "rollout",
            "status",
            "deploy/roam-controller",
            "--timeout=300s",
        ],
    );
    // the new leader holds the Lease
    let installed = roam_e2e::Installed::get(lab);
    wait_until(LONG, "a controller leading", || installed.leader());
}

/// One migration's (copy ms, whole ms, downtime ms).
type Figures = (f64, f64, f64);

/// Microseconds of an RFC 3339 time.
fn micros(t: &Value) -> Option<i64> {
    let ts: k8s_openapi::jiff::Timestamp = t.as_str()?.parse().ok()?;
    Some(ts.as_microsecond())
}

/// (copy ms, whole ms, downtime ms) of a Succeeded migration.
fn figures(m: &Value) -> Figures {
    let st = &m["status"];
    assert_eq!(st["phase"], "Succeeded", "{m}");
    let tr = st["phaseTransitions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let at = |phase: &str| {
        tr.iter()
            .find(|t| t["phase"] == phase)
            .and_then(|t| micros(&t["time"]))
            .unwrap_or_else(|| panic!("no {phase} in {tr:?}"))
    };
    let first = tr
        .first()
        .and_then(|t| micros(&t["time"]))
        .expect("a phase");
    let copy = (at("Switchover") - at("Migrating")) as f64 / 1000.0;
    let whole = (at("Succeeded") - first) as f64 / 1000.0;
    (copy, whole, st["downtimeMs"].as_f64().unwrap_or(f64::NAN))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn main() {
    let runs: usize = std::env::var("ROAM_BENCH_TLS_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(6);
    let lab = Lab::get();
    let _shipped = Shipped(&lab);
    let mut results: Vec<(&str, Vec<Figures>)> = vec![];
    for (mode, plain) in [("plain", true), ("tls", false)] {
        set_mode(&lab, plain);
        let b = boot(&lab);
        let mut rows = vec![];
        for i in 0..runs {
            let to = if i % 2 == 0 { "node-b" } else { "node-a" };
            let m = migrate(&lab, to);
            let f = figures(&m);
            println!(
                "{mode:>5} {i:>2} → {to}: copy {:>7.1} ms, whole {:>7.1} ms, downtime {:>5.0} ms",
                f.0, f.1, f.2
            );
            rows.push(f);
            // the next one from a settled VM
            wait_until(LONG, "the VM Running on the target", || {
                let v = vm(&lab, &H8)["status"].clone();
                (v["phase"] == "Running" && v["node"] == to && v["migration"].is_null())
                    .then_some(())
            });
        }
        drop(b);
        results.push((mode, rows));
    }
    let med = |rows: &[Figures], k: usize| {
        median(rows.iter().map(|r| [r.0, r.1, r.2][k]).collect::<Vec<_>>())
    };
    println!("\nmedians over {runs} migrations each (256 MiB guest, TCG):");
    println!(
        "{:>6} {:>10} {:>10} {:>10}",
        "", "copy ms", "whole ms", "downtime"
    );
    for (mode, rows) in &results {
        println!(
            "{mode:>6} {:>10.1} {:>10.1} {:>10.0}",
            med(rows, 0),
            med(rows, 1),
            med(rows, 2)
        );
    }
    let (plain, tls) = (&results[0].1, &results[1].1);
    let whole = med(tls, 1) / med(plain, 1);
    println!(
        "tls/plain: copy {:.2}x, whole migration {whole:.2}x (target ≤ 1.10: {})",
        med(tls, 0) / med(plain, 0),
        if whole <= 1.10 { "met" } else { "NOT met" }
    );
}
