//! The address operator: the refill (each node's warm pool topped up with unowned
//! Addresses, one create per IP labelled with the Network; an Address soft-deleted longer
//! ago than the Network's grace reclaimed with a delete that holds its resourceVersion) and
//! the sweep (the Address of a pod that is gone, confirmed on the API server, soft-deleted;
//! a live pod's kept; a second claim of one interface handed back).

use serde_json::json;

use super::super::fixtures::{Expect, Scenario, context};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::{reflector, watcher};

use super::super::operator::{refill, sweep};
use super::{address, network, network_with, pod};
use roam_api::Address;

const ADDRESSES: &str = "/apis/roam.dev/v1alpha1/addresses";

#[tokio::test]
async fn a_refill_fills_every_nodes_pool_and_reclaims_after_the_grace() {
    let net = network_with(
        "a",
        "2024-01-01T00:00:00Z",
        json!({"subnet": "10.1.0.0/24", "namespaces": ["ns"], "poolSizePerNode": 2,
               "reclaimGraceSeconds": 60}),
    );
    // released a year before: its grace is long over
    let mut gone = address("a-10-1-0-5", "a", "10.1.0.5", Some("ns/vm"), "node-a");
    gone.spec.deleted = true;
    gone.spec.deletion_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        "2025-01-01T00:00:00Z".parse().unwrap(),
    ));
    // released just now: kept for its owner
    let mut kept = address("a-10-1-0-6", "a", "10.1.0.6", Some("ns/vm2"), "node-b");
    kept.spec.deleted = true;
    kept.spec.deletion_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::now(),
    ));
    let (ctx, api) = context(
        std::slice::from_ref(&net),
        &["node-a", "node-b"],
        &[gone.clone(), kept.clone()],
    );
    api.put(&net);
    api.put(&gone);
    api.put(&kept);
    let pooled = json!({
        "metadata": {"labels": {"roam.dev/network": "a"}},
        "spec": {"network": "a"},
    });
    api.expect(Scenario::Steps(vec![
        Expect::post(format!("{ADDRESSES}?")).with(pooled.clone()),
        Expect::post(format!("{ADDRESSES}?")).with(pooled.clone()),
        Expect::post(format!("{ADDRESSES}?")).with(pooled.clone()),
        Expect::post(format!("{ADDRESSES}?")).with(pooled),
        Expect::delete(format!("{ADDRESSES}/a-10-1-0-5?"))
            .with(json!({"preconditions": {"resourceVersion": "1"}})),
    ]));
    refill(&ctx).await.expect("a refill");
    api.done().await;
    let events = api.events(&["AddressReclaimed"]).await;
    assert_eq!(events, ["AddressReclaimed"]);

    let stored: Vec<Address> = api.list(ADDRESSES);
    let free = |node: &str| {
        stored
            .iter()
            .filter(|a| a.spec.host.as_deref() == Some(node) && a.spec.owner.is_none())
            .map(|a| a.spec.ip.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(free("node-a").len(), 2, "{stored:?}");
    assert_eq!(free("node-b").len(), 2, "{stored:?}");
    let mut ips: Vec<String> = stored.iter().map(|a| a.spec.ip.clone()).collect();
    ips.sort();
    ips.dedup();
    assert_eq!(ips.len(), stored.len(), "no IP twice: {ips:?}");
    assert!(
        !ips.contains(&"10.1.0.5".to_string()),
        "the reclaimed Address is gone"
    );
    assert!(
        ips.contains(&"10.1.0.6".to_string()),
        "the one in its grace stays"
    );
    // the index saw both the creates and the delete
    assert_eq!(ctx.index.lock().unwrap().of_network("a").len(), 5);

    // the pools are full and nothing is due: the next refill sends nothing
    api.expect(Scenario::Steps(vec![]));
    refill(&ctx).await.expect("a refill");
    api.done().await;
}

/// Address `name` of Network `a` at `ip`, held by the plain pod `ns/pod` as its `eth0`.
fn held_by_pod(name: &str, ip: &str, pod: &str) -> Address {
    let mut a = address(name, "a", ip, Some(&format!("ns:{pod}")), "node-a");
    a.metadata.annotations = Some([("roam.dev/pod".to_string(), format!("ns/{pod}"))].into());
    a
}

#[tokio::test]
async fn the_sweep_releases_a_gone_pods_address_once_the_api_server_confirms() {
    let net = network("a", "10.1.0.0/24", "2024-01-01T00:00:00Z");
    let gone = held_by_pod("a-10-1-0-5", "10.1.0.5", "gone");
    let alive = held_by_pod("a-10-1-0-6", "10.1.0.6", "alive");
    // the same pod's eth0 claimed twice (two controllers at once): the higher IP goes back
    let second = held_by_pod("a-10-1-0-7", "10.1.0.7", "alive");
    let addresses = [gone.clone(), alive.clone(), second.clone()];
    let (ctx, api) = context(std::slice::from_ref(&net), &["node-a"], &addresses);
    for a in &addresses {
        api.put(a);
    }
    // the pod watch's cache: only `alive` runs
    let (store, mut writer) = reflector::store::<Pod>();
    writer.apply_watcher_event(&watcher::Event::Init);
    writer.apply_watcher_event(&watcher::Event::InitApply(pod(
        "alive",
        "node-a",
        json!({}),
    )));
    writer.apply_watcher_event(&watcher::Event::InitDone);
    ctx.pods.set_store(store);

    // the second claim goes back at once; the gone pod's Address was just written, and a
    // claim by another controller for a pod this cache has not seen yet would look the
    // same: nothing is done with it for a moment
    api.expect(Scenario::Steps(vec![
        Expect::put(format!("{ADDRESSES}/a-10-1-0-7?")).with(json!({
            "metadata": {"resourceVersion": "1"},
            "spec": {"ip": "10.1.0.7", "host": "node-a"},
        })),
    ]));
    sweep(&ctx, Instant::now()).await.expect("a sweep");
    api.done().await;

    api.expect(Scenario::Steps(vec![
        // confirmed on the API server, not the cache
        Expect::get("/api/v1/namespaces/ns/pods/gone"),
        Expect::put(format!("{ADDRESSES}/a-10-1-0-5?")).with(json!({
            "metadata": {"resourceVersion": "1"},
            "spec": {"owner": "ns:gone", "deleted": true},
        })),
    ]));
    let later = Instant::now() + Duration::from_secs(10);
    sweep(&ctx, later).await.expect("a sweep");
    api.done().await;
    let events = api.events(&["AddressReleased"]).await;
    assert_eq!(events, ["AddressReleased"]);
    let released: Address = api.get(&format!("{ADDRESSES}/a-10-1-0-5")).unwrap();
    assert!(released.spec.deleted && released.spec.deletion_time.is_some());
    let handed_back: Address = api.get(&format!("{ADDRESSES}/a-10-1-0-7")).unwrap();
    assert_eq!(
        (handed_back.spec.owner, handed_back.spec.reserved),
        (None, false)
    );
    let kept: Address = api.get(&format!("{ADDRESSES}/a-10-1-0-6")).unwrap();
    assert_eq!(
        (kept.spec, kept.metadata.resource_version),
        (alive.spec, alive.metadata.resource_version),
        "the live pod's Address is untouched"
    );

    // nothing left to do
    api.expect(Scenario::Steps(vec![]));
    sweep(&ctx, later).await.expect("a sweep");
    api.done().await;
}
