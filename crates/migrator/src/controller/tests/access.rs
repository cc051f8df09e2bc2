//! A Network's access rules in the controllers: a pod or VM of a namespace the Network does
//! not admit, or asking for a class it does not allow, claims nothing and is told why (the
//! pod's `roam.dev/error` for roam-cni, the VM's condition, a Warning Event); admitted — by
//! name, by its namespace's labels — it attaches as usual. A bad selector makes the Network
//! invalid.

use std::sync::Arc;

use serde_json::json;

use super::super::fixtures::{Expect, Scenario, context};
use super::super::networks::pass;
use super::super::pods::reconcile as reconcile_pod;
use super::super::vms::{Vms, reconcile as reconcile_vm};
use super::{address, network, network_with, node, pod, vm};
use roam_api::{Network, VirtualMachine, VmPhase};

const NAMESPACE_NS: &str = "/api/v1/namespaces?&fieldSelector=metadata.name%3Dns";
const NETWORKS: &str = "/apis/roam.dev/v1alpha1/networks";

/// Network `net` (10.1.0.0/24) with the access `fields`.
fn net(fields: serde_json::Value) -> Network {
    let mut spec = json!({"subnet": "10.1.0.0/24"});
    spec.as_object_mut()
        .unwrap()
        .extend(fields.as_object().unwrap().clone());
    network_with("net", "2024-01-01T00:00:00Z", spec)
}

/// The pod's `roam.dev/error` in the one write (PATCH) of a refusal.
fn refusal(bodies: &[serde_json::Value]) -> String {
    let writes: Vec<&serde_json::Value> = bodies.iter().filter(|b| !b.is_null()).collect();
    assert_eq!(
        writes.len(),
        1,
        "only the pod's refusal is written: {writes:?}"
    );
    assert!(
        writes[0]["metadata"]["annotations"]["roam.dev/addresses"].is_null(),
        "no addresses published: {}",
        writes[0]
    );
    writes[0]["metadata"]["annotations"]["roam.dev/error"]
        .as_str()
        .expect("roam.dev/error")
        .to_string()
}

#[tokio::test]
async fn a_pod_of_a_namespace_the_network_does_not_admit_claims_nothing_and_is_told_why() {
    let pool = address("net-10-1-0-5", "net", "10.1.0.5", None, "node-a");
    let (ctx, api) = context(
        &[net(json!({"namespaces": ["team-a"]}))],
        &["node-a"],
        std::slice::from_ref(&pool),
    );
    api.put(&pool);
    let p = pod("web", "node-a", json!({}));
    api.put(&p);
    // no Address written: the refusal on the pod, for roam-cni, and nothing else
    api.expect(Scenario::Steps(vec![Expect::patch(
        "/api/v1/namespaces/ns/pods/web?",
    )]));
    reconcile_pod(Arc::new(p), ctx.clone())
        .await
        .expect("reconcile");
    let error = refusal(&api.done().await);
    for needle in [
        "pod ns/web",
        "namespace ns",
        "network net",
        "spec.namespaces",
    ] {
        assert!(error.contains(needle), "{needle}: {error}");
    }
    api.events(&["NetworkNotAllowed"]).await;
    let stored: roam_api::Address = api
        .get("/apis/roam.dev/v1alpha1/addresses/net-10-1-0-5")
        .expect("the pool Address");
    assert_eq!(stored.spec.owner, None, "the pool Address is untouched");
}

#[tokio::test]
async fn a_namespace_matching_the_selector_attaches_and_one_that_does_not_is_refused() {
    let pool = address("net-10-1-0-5", "net", "10.1.0.5", None, "node-a");
    let selector = json!({"namespaceSelector": {
        "matchExpressions": [{"key": "team", "operator": "In", "values": ["web", "db"]}],
    }});
    let p = pod("web", "node-a", json!({}));
    let namespace = |team: &str| {
        json!({"apiVersion": "v1", "kind": "Namespace",
               "metadata": {"name": "ns", "labels": {"team": team}}})
    };

    // labelled team=red: its labels are read (once), and refused
    let (ctx, api) = context(
        &[net(selector.clone())],
        &["node-a"],
        std::slice::from_ref(&pool),
    );
    api.put(&pool);
    api.put(&p);
    api.put(&namespace("red"));
    api.expect(Scenario::Steps(vec![
        Expect::get(NAMESPACE_NS),
        Expect::patch("/api/v1/namespaces/ns/pods/web?"),
    ]));
    reconcile_pod(Arc::new(p.clone()), ctx.clone())
        .await
        .expect("reconcile");
    let error = refusal(&api.done().await);
    assert!(error.contains("namespaceSelector"), "{error}");

    // labelled team=web: the selector admits it, the pod claims and is published
    let (ctx, api) = context(&[net(selector)], &["node-a"], std::slice::from_ref(&pool));
    api.put(&pool);
    api.put(&p);
    api.put(&namespace("web"));
    api.expect(Scenario::Steps(vec![
        Expect::get(NAMESPACE_NS),
        Expect::put("/apis/roam.dev/v1alpha1/addresses/net-10-1-0-5?")
            .with(json!({"spec": {"owner": "ns:web", "reserved": true}})),
        Expect::patch("/api/v1/namespaces/ns/pods/web?"),
    ]));
    reconcile_pod(Arc::new(p), ctx.clone())
        .await
        .expect("reconcile");
    let bodies = api.done().await;
    assert!(bodies[2]["metadata"]["annotations"]["roam.dev/addresses"].is_string());
}

#[tokio::test]
async fn a_class_the_network_does_not_allow_claims_nothing_until_it_is_allowed() {
    let pool = address("net-10-1-0-5", "net", "10.1.0.5", None, "node-a");
    let p = pod(
        "router",
        "node-a",
        json!({"roam.dev/interfaces":
            r#"[{"mode":"overlay","interface":{"name":"eth0","service_class":"network-control"}}]"#}),
    );
    // a cluster-wide Network with the default classes: every one but network-control
    let (ctx, api) = context(
        &[net(json!({"allNamespaces": true}))],
        &["node-a"],
        std::slice::from_ref(&pool),
    );
    api.put(&pool);
    api.put(&p);
    api.expect(Scenario::Steps(vec![Expect::patch(
        "/api/v1/namespaces/ns/pods/router?",
    )]));
    reconcile_pod(Arc::new(p.clone()), ctx.clone())
        .await
        .expect("reconcile");
    let error = refusal(&api.done().await);
    for needle in [
        "service class network-control",
        "spec.serviceClasses",
        "network net",
    ] {
        assert!(error.contains(needle), "{needle}: {error}");
    }
    api.events(&["ServiceClassNotAllowed"]).await;

    // the admin lists it: the pod claims, and the Address records the class
    let (ctx, api) = context(
        &[net(
            json!({"allNamespaces": true, "serviceClasses": ["network-control"]}),
        )],
        &["node-a"],
        std::slice::from_ref(&pool),
    );
    api.put(&pool);
    api.put(&p);
    api.expect(Scenario::Steps(vec![
        Expect::put("/apis/roam.dev/v1alpha1/addresses/net-10-1-0-5?")
            .with(json!({"spec": {"owner": "ns:router", "serviceClass": "network-control"}})),
        Expect::patch("/api/v1/namespaces/ns/pods/router?"),
    ]));
    reconcile_pod(Arc::new(p), ctx.clone())
        .await
        .expect("reconcile");
    api.done().await;
}

#[tokio::test]
async fn a_vm_of_a_namespace_the_network_does_not_admit_gets_nothing_and_a_condition() {
    let (ctx, api) = context(&[net(json!({"namespaces": ["team-a"]}))], &["node-a"], &[]);
    api.put(&node("node-a", "127.0.0.1"));
    api.put(&vm());
    // no finalizer, no Address, no launcher pod: only the status
    api.expect(Scenario::Steps(vec![
        Expect::patch("/apis/roam.dev/v1alpha1/namespaces/ns/virtualmachines/demo/status?")
            .with(json!({"status": {"phase": "Failed", "conditions": [
                {"type": "Ready", "status": "False", "reason": "NetworkNotAllowed"}]}})),
    ]));
    reconcile_vm(Arc::new(vm()), Vms::new(ctx.clone()))
        .await
        .expect("reconcile");
    api.done().await;
    api.events(&["NetworkNotAllowed"]).await;
    let stored: VirtualMachine = api
        .get("/apis/roam.dev/v1alpha1/namespaces/ns/virtualmachines/demo")
        .expect("the VM");
    let st = stored.status.expect("a status");
    assert_eq!(st.phase, VmPhase::Failed);
    let msg = &st.conditions[0].message;
    for needle in [
        "virtual machine ns/demo",
        "namespace ns",
        "network net",
        "spec.namespaces",
    ] {
        assert!(msg.contains(needle), "{needle}: {msg}");
    }
    assert!(stored.metadata.finalizers.is_none(), "nothing to tear down");
}

/// A VM that holds its Address (it attached before its namespace lost access) keeps it: its
/// reconcile refuses nothing and goes on as for any running VM.
#[tokio::test]
async fn a_vm_that_holds_its_address_keeps_it_after_its_namespace_loses_access() {
    let mut held = address("net-10-1-0-5", "net", "10.1.0.5", Some("ns/demo"), "node-a");
    held.metadata.annotations = Some([("roam.dev/pod".into(), "ns/demo-launcher".into())].into());
    let (ctx, api) = context(
        &[net(json!({"namespaces": ["team-a"]}))],
        &["node-a"],
        std::slice::from_ref(&held),
    );
    api.put(&node("node-a", "127.0.0.1"));
    api.put(&held);
    let mut v = vm();
    v.spec.node = Some("node-a".into());
    api.put(&v);
    api.expect(Scenario::Free);
    reconcile_vm(Arc::new(v), Vms::new(ctx.clone()))
        .await
        .expect("reconcile");
    let stored: VirtualMachine = api
        .get("/apis/roam.dev/v1alpha1/namespaces/ns/virtualmachines/demo")
        .expect("the VM");
    let st = stored.status.expect("a status");
    assert_ne!(st.phase, VmPhase::Failed, "{:?}", st.conditions);
    assert_eq!(st.interfaces[0].ip, "10.1.0.5");
    assert!(
        api.list::<k8s_openapi::api::core::v1::Pod>("/api/v1/namespaces/ns/pods")
            .iter()
            .any(|p| p.metadata.name.as_deref() == Some("demo-launcher")),
        "its launcher pod"
    );
}

#[tokio::test]
async fn a_bad_selector_or_class_makes_the_network_invalid() {
    for (fields, needle) in [
        (
            json!({"namespaceSelector": {"matchExpressions": [{"key": "team", "operator": "Is", "values": ["a"]}]}}),
            "In, NotIn, Exists, DoesNotExist",
        ),
        (
            json!({"serviceClasses": ["platinum"]}),
            "unknown service class",
        ),
    ] {
        let n = net(fields);
        let (ctx, api) = context(std::slice::from_ref(&n), &["node-a"], &[]);
        api.put(&n);
        api.expect(Scenario::Steps(vec![
            Expect::get(format!("{NETWORKS}?")),
            Expect::patch(format!("{NETWORKS}/net/status?")).with(json!({
                "status": {"conditions": [{"type": "Ready", "status": "False",
                                           "reason": "InvalidNetwork"}]},
            })),
        ]));
        pass(&ctx).await.expect("a pass");
        api.done().await;
        api.events(&["InvalidNetwork"]).await;
        let stored: Network = api.get(&format!("{NETWORKS}/net")).expect("the Network");
        let msg = &stored.status.expect("a status").conditions[0].message;
        assert!(msg.contains(needle), "{needle}: {msg}");
        assert!(
            !ctx.index.lock().unwrap().networks.contains_key("net"),
            "not served"
        );
    }
}

#[tokio::test]
async fn a_valid_network_says_who_may_attach() {
    let n = network("net", "10.1.0.0/24", "2024-01-01T00:00:00Z");
    let (ctx, api) = context(std::slice::from_ref(&n), &["node-a"], &[]);
    api.put(&n);
    api.expect(Scenario::Free);
    pass(&ctx).await.expect("a pass");
    let stored: Network = api.get(&format!("{NETWORKS}/net")).expect("the Network");
    let msg = &stored.status.expect("a status").conditions[0].message;
    assert!(msg.contains("namespaces ns may attach"), "{msg}");
}

/// An edit that held Addresses cannot follow is refused, and the previous spec stays in
/// force — but not its access rules: whom the admin lets in (or out) counts at once.
#[tokio::test]
async fn access_edits_apply_even_while_an_in_use_edit_is_refused() {
    let mut n = network("a", "10.1.0.0/24", "2024-01-01T00:00:00Z");
    let served = n.spec.clone();
    n.spec.subnet = "10.2.0.0/24".into();
    n.spec.namespaces = vec!["team-b".into()];
    n.metadata.generation = Some(2);
    n.status = Some(roam_api::NetworkStatus {
        served: Some(served),
        transit: vec![roam_api::TransitAddress {
            node: "node-a".into(),
            ip: "169.254.0.2".into(),
        }],
        ..Default::default()
    });
    let held = address("a-10-1-0-5", "a", "10.1.0.5", Some("ns/vm"), "node-a");
    let (ctx, api) = context(std::slice::from_ref(&n), &["node-a"], &[]);
    api.put(&n);
    api.put(&held);
    api.expect(Scenario::Free);
    pass(&ctx).await.expect("a pass");
    api.events(&["ImmutableWhileInUse"]).await;
    let plan = ctx.index.lock().unwrap().networks.get("a").cloned();
    let plan = plan.expect("still served");
    assert_eq!(
        plan.subnet().to_string(),
        "10.1.0.0/24",
        "the served subnet"
    );
    assert_eq!(
        plan.access.namespaces,
        ["team-b".to_string()].into(),
        "the edited access"
    );
}
