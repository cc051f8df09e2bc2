//! The address operator's refill: each node's warm pool topped up with unowned Addresses
//! (one create per IP, labelled with the Network), and an Address soft-deleted longer ago
//! than the Network's grace reclaimed with a delete that holds its resourceVersion.

use serde_json::json;

use super::super::fixtures::{Expect, Scenario, context};
use super::super::operator::refill;
use super::{address, network_with};
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
