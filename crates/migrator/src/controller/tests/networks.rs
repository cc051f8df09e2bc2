//! The network controller's pass: a valid overlay gets its transit addresses (a PUT with the
//! resourceVersion read) and Ready; the younger of two overlapping Networks is refused; an
//! edit that held Addresses cannot follow is refused and the served spec stays.

use serde_json::json;

use super::super::fixtures::{Expect, Scenario, context};
use super::super::networks::pass;
use super::{address, network};
use roam_api::Network;

const NETWORKS: &str = "/apis/roam.dev/v1alpha1/networks";

#[tokio::test]
async fn a_valid_network_is_ready_and_the_younger_overlapping_one_is_refused() {
    let older = network("a", "10.1.0.0/24", "2024-01-01T00:00:00Z");
    let younger = network("b", "10.1.0.128/25", "2024-02-01T00:00:00Z");
    let (ctx, api) = context(&[older.clone(), younger.clone()], &["node-a"], &[]);
    api.put(&older);
    api.put(&younger);
    api.expect(Scenario::Steps(vec![
        // overlaps are checked on a direct LIST, never the watch's cache
        Expect::get(format!("{NETWORKS}?")),
        Expect::put(format!("{NETWORKS}/a/status?")).with(json!({
            "metadata": {"resourceVersion": "1"},
            "status": {"transit": [{"node": "node-a"}]},
        })),
        // the accepted spec is recorded as the one served
        Expect::patch(format!("{NETWORKS}/a/status?")).with(json!({
            "status": {"served": {"subnet": "10.1.0.0/24"}},
        })),
        Expect::patch(format!("{NETWORKS}/a/status?")).with(json!({
            "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "Valid"}],
                       "observedGeneration": 1},
        })),
        Expect::patch(format!("{NETWORKS}/b/status?")).with(json!({
            "status": {"conditions": [{"type": "Ready", "status": "False", "reason": "OverlappingNetworks"}]},
        })),
    ]));
    pass(&ctx).await.expect("a pass");
    api.done().await;
    let events = api.events(&["Valid", "OverlappingNetworks"]).await;
    assert_eq!(events.len(), 2, "{events:?}");
    assert!(ctx.index.lock().unwrap().networks.contains_key("a"));
    assert!(!ctx.index.lock().unwrap().networks.contains_key("b"));

    // nothing changed: the next pass only lists
    api.expect(Scenario::Steps(vec![Expect::get(format!("{NETWORKS}?"))]));
    pass(&ctx).await.expect("a pass");
    api.done().await;
}

/// Network `a` as accepted at 10.1.0.0/24 (served), its spec then edited to `subnet`.
fn edited(subnet: &str) -> Network {
    let mut n = network("a", "10.1.0.0/24", "2024-01-01T00:00:00Z");
    let served = n.spec.clone();
    n.spec.subnet = subnet.into();
    n.metadata.generation = Some(2);
    n.status = Some(roam_api::NetworkStatus {
        served: Some(served),
        transit: vec![roam_api::TransitAddress {
            node: "node-a".into(),
            ip: "169.254.0.2".into(),
        }],
        ..Default::default()
    });
    n
}

#[tokio::test]
async fn a_subnet_edit_while_addresses_are_held_is_refused_and_the_served_spec_stays() {
    let net = edited("10.2.0.0/24");
    let held = address("a-10-1-0-5", "a", "10.1.0.5", Some("ns/vm"), "node-a");
    let (ctx, api) = context(std::slice::from_ref(&net), &["node-a"], &[]);
    api.put(&net);
    api.put(&held);
    api.expect(Scenario::Steps(vec![
        Expect::get(format!("{NETWORKS}?")),
        // the held Addresses are counted on a direct LIST
        Expect::get("/apis/roam.dev/v1alpha1/addresses?&labelSelector=roam.dev%2Fnetwork%3Da"),
        Expect::patch(format!("{NETWORKS}/a/status?")).with(json!({
            "status": {"conditions": [{"type": "Ready", "status": "False",
                                       "reason": "ImmutableWhileInUse"}],
                       "observedGeneration": 2},
        })),
    ]));
    pass(&ctx).await.expect("a pass");
    api.done().await;
    let events = api.events(&["ImmutableWhileInUse"]).await;
    assert_eq!(events.len(), 1, "{events:?}");
    let stored: Network = api.get(&format!("{NETWORKS}/a")).expect("the Network");
    let st = stored.status.expect("a status");
    assert_eq!(
        st.served.expect("served").subnet,
        "10.1.0.0/24",
        "not replaced"
    );
    let msg = &st.conditions[0].message;
    assert!(
        msg.contains("subnet") && msg.contains("1 Addresses"),
        "{msg}"
    );
    let plan = ctx.index.lock().unwrap().networks.get("a").cloned();
    assert_eq!(
        plan.expect("still served").subnet().to_string(),
        "10.1.0.0/24",
        "the previous spec stays in force"
    );
}

#[tokio::test]
async fn a_subnet_edit_with_no_address_held_applies() {
    let net = edited("10.2.0.0/24");
    let free = address("a-10-1-0-6", "a", "10.1.0.6", None, "node-a");
    let (ctx, api) = context(std::slice::from_ref(&net), &["node-a"], &[]);
    api.put(&net);
    api.put(&free);
    api.expect(Scenario::Steps(vec![
        Expect::get(format!("{NETWORKS}?")),
        Expect::get("/apis/roam.dev/v1alpha1/addresses?&labelSelector=roam.dev%2Fnetwork%3Da"),
        Expect::patch(format!("{NETWORKS}/a/status?")).with(json!({
            "status": {"served": {"subnet": "10.2.0.0/24"}},
        })),
        Expect::patch(format!("{NETWORKS}/a/status?")).with(json!({
            "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "Valid"}]},
        })),
    ]));
    pass(&ctx).await.expect("a pass");
    api.done().await;
    let plan = ctx.index.lock().unwrap().networks.get("a").cloned();
    assert_eq!(plan.expect("served").subnet().to_string(), "10.2.0.0/24");
}
