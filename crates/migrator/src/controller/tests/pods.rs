//! The pod controller: a pod takes a pool Address of its node (PUT with the pool Address's
//! resourceVersion), then `roam.dev/addresses` is published; a malformed `roam.dev/interfaces`
//! claims nothing and is reported once.

use std::sync::Arc;

use serde_json::json;

use super::super::fixtures::{Expect, Scenario, config, context, context_with};
use super::super::pods::reconcile;
use super::{address, network, pod};

#[tokio::test]
async fn a_pod_claims_a_pool_address_then_its_addresses_are_published() {
    let pool = address("net-10-1-0-5", "net", "10.1.0.5", None, "node-a");
    let (ctx, api) = context(
        &[network("net", "10.1.0.0/24", "2024-01-01T00:00:00Z")],
        &["node-a"],
        std::slice::from_ref(&pool),
    );
    api.put(&pool);
    let p = pod("web", "node-a", json!({}));
    api.put(&p);
    api.expect(Scenario::Steps(vec![
        Expect::put("/apis/roam.dev/v1alpha1/addresses/net-10-1-0-5?").with(json!({
            "metadata": {"resourceVersion": "1", "annotations": {"roam.dev/pod": "ns/web"}},
            // a plain pod's owner key is `namespace-name`
            "spec": {"owner": "ns:web", "host": "node-a", "reserved": true},
        })),
        Expect::patch("/api/v1/namespaces/ns/pods/web?"),
    ]));
    reconcile(Arc::new(p), ctx.clone())
        .await
        .expect("reconcile");
    let bodies = api.done().await;
    let published = bodies[1]["metadata"]["annotations"]["roam.dev/addresses"]
        .as_str()
        .expect("roam.dev/addresses");
    assert!(published.contains("10.1.0.5"), "{published}");
    assert!(bodies[1]["metadata"]["annotations"]["roam.dev/error"].is_null());
}

#[tokio::test]
async fn a_bad_interfaces_annotation_claims_nothing_and_is_reported_once() {
    let (ctx, api) = context(
        &[network("net", "10.1.0.0/24", "2024-01-01T00:00:00Z")],
        &["node-a"],
        &[],
    );
    let p = pod("web", "node-a", json!({"roam.dev/interfaces": "not json"}));
    api.put(&p);
    api.expect(Scenario::Steps(vec![Expect::patch(
        "/api/v1/namespaces/ns/pods/web?",
    )]));
    reconcile(Arc::new(p), ctx.clone())
        .await
        .expect("reconcile");
    let bodies = api.done().await;
    let error = bodies[0]["metadata"]["annotations"]["roam.dev/error"]
        .as_str()
        .expect("roam.dev/error");
    assert!(
        error.contains("roam.dev/interfaces") || error.contains("web"),
        "{error}"
    );
    let events = api.events(&["InvalidInterfaces"]).await;
    assert_eq!(events.len(), 1, "one Warning Event: {events:?}");

    // the same error already on the pod: nothing written again
    let p = api
        .get::<k8s_openapi::api::core::v1::Pod>("/api/v1/namespaces/ns/pods/web")
        .expect("the pod");
    api.expect(Scenario::Steps(vec![]));
    reconcile(Arc::new(p), ctx.clone())
        .await
        .expect("reconcile");
    api.done().await;
}

#[tokio::test]
async fn a_pod_outside_the_namespace_selector_is_left_alone() {
    let pool = address("net-10-1-0-5", "net", "10.1.0.5", None, "node-a");
    let list =
        "/api/v1/namespaces?&fieldSelector=metadata.name%3Dns&labelSelector=%21roam.dev%2Ftest";
    // a controller that serves only namespaces without roam.dev/test, and a pool Address
    let scoped = || {
        let config = super::super::Config {
            namespace_selector: Some("!roam.dev/test".into()),
            ..config()
        };
        let net = network("net", "10.1.0.0/24", "2024-01-01T00:00:00Z");
        let (ctx, api) = context_with(config, &[net], &["node-a"], std::slice::from_ref(&pool));
        api.put(&pool);
        (ctx, api)
    };
    let (ctx, api) = scoped();
    let p = pod("web", "node-a", json!({}));
    api.put(&p);
    // the API server lists no namespace `ns` under the selector: one question, no claim,
    // nothing written; asked again the answer comes from the cache
    api.expect(Scenario::Steps(vec![Expect::get(list)]));
    reconcile(Arc::new(p.clone()), ctx.clone())
        .await
        .expect("reconcile");
    api.done().await;
    api.expect(Scenario::Steps(vec![]));
    reconcile(Arc::new(p.clone()), ctx.clone())
        .await
        .expect("reconcile");
    api.done().await;

    // a namespace the selector takes: the pod claims as usual
    let (ctx, api) = scoped();
    api.put(&p);
    api.put(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ns"}}));
    api.expect(Scenario::Steps(vec![
        Expect::get(list),
        Expect::put("/apis/roam.dev/v1alpha1/addresses/net-10-1-0-5?"),
        Expect::patch("/api/v1/namespaces/ns/pods/web?"),
    ]));
    reconcile(Arc::new(p), ctx.clone())
        .await
        .expect("reconcile");
    api.done().await;
}
