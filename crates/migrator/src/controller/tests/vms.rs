//! The VM controller: a VM's first reconcile, and a claim that loses its race.

use std::sync::Arc;

use serde_json::json;

use super::super::fixtures::{Expect, Scenario, context};
use super::super::vms::reconcile;
use super::{address, network, node, vm};
use crate::api::{Address, VirtualMachine, VmPhase};

const VMS: &str = "/apis/roam.dev/v1alpha1/namespaces/ns/virtualmachines";

/// Claim, port, token, launcher pod, status: in this order, each once.
#[tokio::test]
async fn a_new_vm_claims_its_address_then_gets_its_launcher_pod() {
    let (ctx, api) = context(
        &[network("net", "10.1.0.0/24", "2024-01-01T00:00:00Z")],
        &["node-a"],
        &[],
    );
    api.put(&node("node-a", "127.0.0.1"));
    api.put(&vm());
    api.expect(Scenario::Steps(vec![
        Expect::get("/api/v1/nodes?"),
        Expect::get("/api/v1/nodes/node-a"),
        Expect::post("/apis/roam.dev/v1alpha1/addresses?").with(json!({
            "spec": {"network": "net", "owner": "ns/demo", "host": "node-a", "reserved": true},
            "metadata": {"annotations": {"roam.dev/pod": "ns/demo-launcher"}},
        })),
        Expect::get("/apis/roam.dev/v1alpha1/virtualmachines?"),
        Expect::get("/api/v1/namespaces/ns/secrets/demo-shim-token"),
        Expect::post("/api/v1/namespaces/ns/secrets?"),
        Expect::get("/api/v1/namespaces/ns/pods/demo-launcher"),
        Expect::post("/api/v1/namespaces/ns/pods?").with(json!({
            "metadata": {"name": "demo-launcher", "labels": {"roam.dev/launcher": "true"}},
            "spec": {"nodeName": "node-a", "hostNetwork": true},
        })),
        Expect::patch(format!("{VMS}/demo/status?")).with(json!({
            "status": {"phase": "Starting", "node": "node-a", "pod": "demo-launcher"},
        })),
    ]));
    let action = reconcile(Arc::new(vm()), ctx.clone())
        .await
        .expect("reconcile");
    let bodies = api.done().await;
    assert_eq!(
        action,
        kube::runtime::controller::Action::requeue(std::time::Duration::from_secs(1))
    );
    let ip = bodies[2]["spec"]["ip"].as_str().expect("an IP").to_string();
    assert!(ip.starts_with("10.1.0."), "{ip}");
    let st = api
        .get::<VirtualMachine>(&format!("{VMS}/demo"))
        .and_then(|v| v.status)
        .expect("a status");
    assert_eq!(st.phase, VmPhase::Starting);
    assert_eq!(st.interfaces[0].ip, ip);
    api.events(&["LauncherCreated"]).await;
}

/// A 409 on the Address's create (another controller took the IP, our watch has not seen it
/// yet): the controller reads the winner and claims the next IP.
#[tokio::test]
async fn a_claim_that_loses_its_race_reads_the_winner_and_takes_another_ip() {
    let (ctx, api) = context(
        &[network("net", "10.1.0.0/24", "2024-01-01T00:00:00Z")],
        &["node-a"],
        &[],
    );
    api.put(&node("node-a", "127.0.0.1"));
    api.put(&address(
        "net-10-1-0-2",
        "net",
        "10.1.0.2",
        Some("ns/other"),
        "node-a",
    ));
    let mut v = vm();
    v.spec.node = Some("node-a".into());
    api.put(&v);
    api.expect(Scenario::Steps(vec![
        Expect::get("/api/v1/nodes/node-a"),
        Expect::post("/apis/roam.dev/v1alpha1/addresses?")
            .with(json!({"metadata": {"name": "net-10-1-0-2"}, "spec": {"ip": "10.1.0.2"}})),
        Expect::get("/apis/roam.dev/v1alpha1/addresses/net-10-1-0-2"),
        Expect::post("/apis/roam.dev/v1alpha1/addresses?")
            .with(json!({"metadata": {"name": "net-10-1-0-3"}, "spec": {"ip": "10.1.0.3", "owner": "ns/demo"}})),
        Expect::get("/apis/roam.dev/v1alpha1/virtualmachines?"),
        Expect::get("/api/v1/namespaces/ns/secrets/demo-shim-token"),
        Expect::post("/api/v1/namespaces/ns/secrets?"),
        Expect::get("/api/v1/namespaces/ns/pods/demo-launcher"),
        Expect::post("/api/v1/namespaces/ns/pods?"),
        Expect::patch(format!("{VMS}/demo/status?"))
            .with(json!({"status": {"interfaces": [{"ip": "10.1.0.3"}]}})),
    ]));
    reconcile(Arc::new(v), ctx.clone())
        .await
        .expect("reconcile");
    api.done().await;
    // the winner is known now, untouched
    let winner = ctx
        .index
        .lock()
        .unwrap()
        .address("net-10-1-0-2")
        .expect("the winner");
    assert_eq!(winner.spec.owner.as_deref(), Some("ns/other"));
    let stored: Address = api
        .get("/apis/roam.dev/v1alpha1/addresses/net-10-1-0-2")
        .unwrap();
    assert_eq!(stored.spec.owner.as_deref(), Some("ns/other"));
}
