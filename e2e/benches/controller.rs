//! Benchmark of roam-controller on the lab's real API server and OVN (needs `e2e/lab up`):
//! `cargo bench -p roam-e2e --bench controller`.
//!
//! 1. 1000 pods (`ROAM_BENCH_PODS`) created at once, bound to two fake nodes (Node objects
//!    without a kubelet: nothing runs them, the controller still claims, programs OVN and
//!    annotates): time until all are annotated → pods/s; per pod, **claim → annotation** (the
//!    Address claimed for the pod, seen by a watch on Addresses, → the pod's
//!    `roam.dev/addresses` seen by a watch on pods) and create → annotation (from the pod's
//!    create request; includes queueing before the claim), each p50/p90/p99/max (targets
//!    ≥ 100 pods/s, claim → annotation p99 ≤ 100 ms).
//! 2. The controller's RSS (from /proc) once it also holds 10 000 more Addresses
//!    (`ROAM_BENCH_ADDRESSES`) (target ≤ 150 MB).
//!
//! The controller is roam as shipped: the release build in the image `e2e/lab up` installed
//! (`lab.local/roam-controller:dev`), run as a pod of its own on node-a with this bench's
//! selectors (the installed Deployment leaves the bench's namespace and Networks alone).
//! `ROAM_BENCH_CONCURRENCY` sets its `--concurrency` (its default otherwise),
//! `ROAM_CLAIMS_IN_FLIGHT` its `--claims-in-flight`; `ROAM_BENCH_ADDRESSES=0` skips part 2. Figures are printed; nothing is asserted (the machine is shared and noisy).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use roam_api::{Address, AddressSpec, Network};
use roam_e2e::{ControllerProcess, Lab, LabNetwork, percentile};
use serde_json::json;

const NS: &str = "h5-bench";
const NET: &str = "h5-bench";
const RSS_NET: &str = "h5-bench-rss";
const NODES: [&str; 2] = ["h5-bench-1", "h5-bench-2"];

fn env_usize(k: &str, d: usize) -> usize {
    std::env::var(k)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(d)
}

async fn cleanup(client: &kube::Client) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let force = DeleteParams {
        grace_period_seconds: Some(0),
        ..Default::default()
    };
    let _ = pods.delete_collection(&force, &ListParams::default()).await;
    let nss: Api<Namespace> = Api::all(client.clone());
    let _ = nss.delete(NS, &DeleteParams::default()).await;
    let nets: Api<Network> = Api::all(client.clone());
    let addrs: Api<Address> = Api::all(client.clone());
    for n in [NET, RSS_NET] {
        let _ = nets.delete(n, &DeleteParams::default()).await;
        let _ = addrs
            .delete_collection(
                &DeleteParams::default(),
                &ListParams::default().labels(&format!("roam.dev/network={n}")),
            )
            .await;
    }
    let nodes: Api<Node> = Api::all(client.clone());
    for n in NODES {
        let _ = nodes.delete(n, &DeleteParams::default()).await;
    }
    // wait for the namespace to go, so a next run can create it again
    for _ in 0..600 {
        if nss.get_opt(NS).await.ok().flatten().is_none() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn main() {
    let lab = Lab::get();
    let n_pods = env_usize("ROAM_BENCH_PODS", 1000);
    let n_addrs = env_usize("ROAM_BENCH_ADDRESSES", 10_000);
    let rt = tokio::runtime::Runtime::new().expect("tokio");
    let client = rt.block_on(lab.kube_client());
    rt.block_on(cleanup(&client));
    let _ovn = (
        LabNetwork::new(&lab, NET, &[]),
        LabNetwork::new(&lab, RSS_NET, &[]),
    );
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/crds");
    roam_e2e::run(
        lab.kubectl(),
        &[
            "--kubeconfig",
            lab.kubeconfig(),
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            dir,
        ],
    );
    rt.block_on(async {
        let nss: Api<Namespace> = Api::all(client.clone());
        nss.create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"metadata": {"name": NS, "labels": {roam_e2e::TEST_LABEL: "true"}}}),
            )
            .unwrap(),
        )
        .await
        .expect("namespace");
        let nodes: Api<Node> = Api::all(client.clone());
        for n in NODES {
            let node: Node = serde_json::from_value(
                json!({"metadata": {"name": n, "labels": {"roam.dev/test": "h5-fake"}}}),
            )
            .unwrap();
            nodes
                .create(&PostParams::default(), &node)
                .await
                .expect("fake node");
        }
        let nets: Api<Network> = Api::all(client.clone());
        for (name, subnet, transit, pool) in [
            (NET, "100.142.0.0/16", "169.254.142.0/24", 10),
            (RSS_NET, "100.143.0.0/16", "169.254.143.0/24", 0),
        ] {
            let net: Network = serde_json::from_value(json!({
                "apiVersion": "roam.dev/v1alpha1", "kind": "Network",
                "metadata": {"name": name, "labels": {"roam.dev/test": "h5-bench"}},
                "spec": {"subnet": subnet, "transitSubnet": transit, "poolSizePerNode": pool,
                         "namespaces": [NS]}
            }))
            .unwrap();
            nets.create(&PostParams::default(), &net)
                .await
                .expect("network");
        }
    });
    let concurrency = std::env::var("ROAM_BENCH_CONCURRENCY").ok();
    let mut args = vec![
        "--leader-elect",
        "false",
        "--network-selector",
        "roam.dev/test=h5-bench",
        "--pod-namespace",
        NS,
        "--node-selector",
        "roam.dev/test=h5-fake",
    ];
    if let Some(c) = &concurrency {
        args.extend(["--concurrency", c.as_str()]);
    }
    let in_flight = std::env::var("ROAM_CLAIMS_IN_FLIGHT").ok();
    if let Some(c) = &in_flight {
        args.extend(["--claims-in-flight", c.as_str()]);
    }
    let ctl = ControllerProcess::start(&lab, "h5-bench-ctl", 18040, &args);
    println!(
        "controller {} (release build, a pod on node-a; --concurrency {}, --claims-in-flight {})",
        roam_e2e::CONTROLLER_IMAGE,
        concurrency.as_deref().unwrap_or("default"),
        in_flight.as_deref().unwrap_or("default")
    );
    let result = rt.block_on(bench(&client, &ctl, n_pods, n_addrs));
    let rss_idle = ctl.rss_kib();
    drop(ctl);
    rt.block_on(cleanup(&client));
    match result {
        Ok(()) => println!(
            "controller RSS at the end: {} MiB",
            rss_idle.unwrap_or(0) / 1024
        ),
        Err(e) => panic!("benchmark failed: {e}"),
    }
}

async fn bench(
    client: &kube::Client,
    ctl: &ControllerProcess,
    n_pods: usize,
    n_addrs: usize,
) -> anyhow::Result<()> {
    let addrs: Api<Address> = Api::all(client.clone());
    // the warm pools are there
    let t = Instant::now();
    loop {
        let l = addrs
            .list(&ListParams::default().labels(&format!("roam.dev/network={NET}")))
            .await?;
        if l.items.len() >= 2 * 10 {
            break;
        }
        anyhow::ensure!(
            t.elapsed() < Duration::from_secs(120),
            "pools not filled: {}",
            ctl.log_tail(30)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!("warm pools (2 nodes × 10) ready in {:?}", t.elapsed());

    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let sent: Arc<Mutex<HashMap<String, Instant>>> = Default::default();
    let seen: Arc<Mutex<HashMap<String, Instant>>> = Default::default();
    let refused: Arc<Mutex<Option<String>>> = Default::default();
    let watch = {
        let seen = seen.clone();
        let refused = refused.clone();
        let pods = pods.clone();
        tokio::spawn(async move {
            let mut s = watcher(pods, watcher::Config::default())
                .default_backoff()
                .applied_objects()
                .boxed();
            while let Ok(Some(p)) = s.try_next().await {
                let ann = p.metadata.annotations.clone().unwrap_or_default();
                if let Some(e) = ann.get("roam.dev/error") {
                    *refused.lock().unwrap() = Some(e.clone());
                }
                if ann.contains_key("roam.dev/addresses")
                    && let Some(n) = p.metadata.name
                {
                    seen.lock().unwrap().entry(n).or_insert_with(Instant::now);
                }
            }
        })
    };
    // the Address claimed for each pod (its roam.dev/pod annotation), first seen
    let claimed: Arc<Mutex<HashMap<String, Instant>>> = Default::default();
    let addr_watch = {
        let claimed = claimed.clone();
        let addrs = addrs.clone();
        tokio::spawn(async move {
            let wc = watcher::Config::default().labels(&format!("roam.dev/network={NET}"));
            let mut s = watcher(addrs, wc)
                .default_backoff()
                .applied_objects()
                .boxed();
            while let Ok(Some(a)) = s.try_next().await {
                if !a.spec.reserved || a.spec.deleted {
                    continue;
                }
                let ann = a.metadata.annotations.clone().unwrap_or_default();
                if let Some(pod) = ann.get("roam.dev/pod")
                    && let Some(name) = pod.strip_prefix(&format!("{NS}/"))
                {
                    claimed
                        .lock()
                        .unwrap()
                        .entry(name.to_string())
                        .or_insert_with(Instant::now);
                }
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let start = Instant::now();
    let creates = futures::stream::iter((0..n_pods).map(|i| {
        let pods = pods.clone();
        let sent = sent.clone();
        async move {
            let name = format!("b{i:05}");
            let p: Pod = serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": NS, "annotations": {
                    "roam.dev/interfaces": format!(r#"[{{"mode":"overlay","network":"{NET}","interface":{{"name":"eth0"}}}}]"#)}},
                "spec": {"nodeName": NODES[i % 2], "terminationGracePeriodSeconds": 0,
                         "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.2"}]}
            }))
            .unwrap();
            sent.lock().unwrap().insert(name, Instant::now());
            pods.create(&PostParams::default(), &p).await.map(|_| ())
        }
    }))
    .buffer_unordered(64)
    .collect::<Vec<_>>()
    .await;
    let created_in = start.elapsed();
    let failed = creates.iter().filter(|r| r.is_err()).count();
    anyhow::ensure!(
        failed == 0,
        "{failed} pod creates failed: {:?}",
        creates.iter().find(|r| r.is_err())
    );
    println!("{n_pods} pods created in {created_in:?}");
    let deadline = Instant::now() + Duration::from_secs(900);
    loop {
        let n = seen.lock().unwrap().len();
        if n >= n_pods {
            break;
        }
        if let Some(e) = refused.lock().unwrap().clone() {
            anyhow::bail!("a pod was refused: {e}");
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "only {n} of {n_pods} pods annotated after 900 s:\n{}",
            ctl.log_tail(40)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    watch.abort();
    addr_watch.abort();
    let (sent, seen) = (sent.lock().unwrap().clone(), seen.lock().unwrap().clone());
    let claimed = claimed.lock().unwrap().clone();
    let last = seen.values().max().copied().unwrap();
    let total = last - start;
    let since = |from: &HashMap<String, Instant>| {
        let mut lat: Vec<Duration> = from
            .iter()
            .filter_map(|(n, t0)| Some(seen.get(n)?.saturating_duration_since(*t0)))
            .collect();
        lat.sort();
        lat
    };
    let show = |what: &str, lat: &[Duration], target: &str| {
        println!(
            "{what} ({} pods): p50 {:?}, p90 {:?}, p99 {:?}, max {:?}{target}",
            lat.len(),
            percentile(lat, 0.5),
            percentile(lat, 0.9),
            percentile(lat, 0.99),
            lat.last().copied().unwrap_or_default()
        )
    };
    println!(
        "all {n_pods} annotated {total:?} after the first create: {:.1} pods/s (target ≥ 100)",
        n_pods as f64 / total.as_secs_f64()
    );
    show(
        "claim → roam.dev/addresses",
        &since(&claimed),
        " (target p99 ≤ 100 ms)",
    );
    show("create → roam.dev/addresses", &since(&sent), "");
    anyhow::ensure!(
        claimed.len() == n_pods,
        "the Address watch saw a claim for only {} of {n_pods} pods",
        claimed.len()
    );
    if let Some(m) = ctl.scrape() {
        for l in m.lines().filter(|l| {
            l.starts_with("roam_pod_address_duration_seconds")
                || l.starts_with("roam_claim_to_annotation_seconds")
                || l.starts_with("roam_ovn_wait_seconds")
                || l.starts_with("roam_claim_duration_seconds_sum")
                || l.starts_with("roam_claim_duration_seconds_count")
                || l.starts_with("roam_events_total")
        }) {
            println!("  {l}");
        }
    }
    println!(
        "controller RSS with {n_pods} pods: {} MiB",
        ctl.rss_kib().unwrap_or(0) / 1024
    );

    if n_addrs == 0 {
        return Ok(());
    }
    // 10 000 more Addresses (unclaimed, on the fake nodes)
    let t = Instant::now();
    let made = futures::stream::iter((0..n_addrs).map(|i| {
        let addrs = addrs.clone();
        async move {
            let ip = std::net::Ipv4Addr::from(
                u32::from(std::net::Ipv4Addr::new(100, 143, 0, 10)) + i as u32,
            );
            let mut a = Address::new(
                &roam_api::address_name(RSS_NET, ip),
                AddressSpec {
                    network: RSS_NET.into(),
                    ip: ip.to_string(),
                    mac: roam_contract::mac_for_ip(ip).to_string(),
                    gateway: None,
                    owner: None,
                    host: Some(NODES[i % 2].into()),
                    reserved: false,
                    deleted: false,
                    deletion_time: None,
                    vlan: None,
                    interface: None,
                    dhcp: false,
                    service_class: None,
                },
            );
            a.metadata.labels =
                Some([("roam.dev/network".to_string(), RSS_NET.to_string())].into());
            addrs.create(&PostParams::default(), &a).await.map(|_| ())
        }
    }))
    .buffer_unordered(64)
    .collect::<Vec<_>>()
    .await;
    let failed = made.iter().filter(|r| r.is_err()).count();
    anyhow::ensure!(failed == 0, "{failed} address creates failed");
    println!("{n_addrs} Addresses created in {:?}", t.elapsed());
    let want = format!("roam_addresses{{network=\"{RSS_NET}\",state=\"free\"}} {n_addrs}");
    let t = Instant::now();
    loop {
        if ctl.scrape().is_some_and(|m| m.contains(&want)) {
            break;
        }
        anyhow::ensure!(
            t.elapsed() < Duration::from_secs(300),
            "the controller did not index {n_addrs} Addresses"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    println!(
        "controller RSS with {n_pods} pods and {} Addresses: {} MiB (target ≤ 150 MB)",
        n_addrs + n_pods + 20,
        ctl.rss_kib().unwrap_or(0) / 1024
    );
    Ok(())
}
