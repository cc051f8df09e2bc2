//! The network controller's pass: a valid overlay gets its transit addresses (a PUT with the
//! resourceVersion read) and Ready; the younger of two overlapping Networks is refused.

use serde_json::json;

use super::super::fixtures::{Expect, Scenario, context};
use super::super::networks::pass;
use super::network;

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
