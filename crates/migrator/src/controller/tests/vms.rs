//! The VM controller: a VM's first reconcile, and a claim that loses its race.

use std::sync::Arc;

use kube::ResourceExt;
use serde_json::json;

use super::super::fixtures::{Expect, Scenario, context};
use super::super::launchers::reconcile_runner;
use super::super::vms::{Vms, reconcile};
use super::{address, cordoned, network, node, pod, token_secret, vm};
use roam_api::{Address, VirtualMachine, VmPhase};

const VMS: &str = "/apis/roam.dev/v1alpha1/namespaces/ns/virtualmachines";
/// The pods that count against the nodes (placement).
const PODS_LIVE: &str =
    "/api/v1/pods?&fieldSelector=status.phase%21%3DSucceeded%2Cstatus.phase%21%3DFailed";

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
        // held from now on until it is torn down on every node
        Expect::patch(format!("{VMS}/demo?"))
            .with(json!({"metadata": {"finalizers": ["roam.dev/teardown"]}})),
        Expect::get("/api/v1/nodes?"),
        Expect::get(PODS_LIVE),
        Expect::get("/api/v1/nodes/node-a"),
        Expect::post("/apis/roam.dev/v1alpha1/addresses?").with(json!({
            "spec": {"network": "net", "owner": "ns/demo", "host": "node-a", "reserved": true},
            "metadata": {"annotations": {"roam.dev/pod": "ns/demo-launcher"}},
        })),
        Expect::get("/apis/roam.dev/v1alpha1/virtualmachines?"),
        Expect::get("/api/v1/namespaces/roam-system/secrets/roam-shim-token-vm-uid"),
        Expect::post("/api/v1/namespaces/roam-system/secrets?"),
        Expect::get("/api/v1/namespaces/ns/pods/demo-launcher"),
        // the pod is claimed in the VM's status before it exists, then its UID recorded
        Expect::patch(format!("{VMS}/demo/status?"))
            .with(json!({"status": {"pod": "demo-launcher", "podUID": "creating"}})),
        Expect::post("/api/v1/namespaces/ns/pods?").with(json!({
            "metadata": {"name": "demo-launcher", "labels": {"roam.dev/launcher": "true"}},
            "spec": {"nodeName": "node-a", "hostNetwork": true},
        })),
        Expect::patch(format!("{VMS}/demo/status?")),
        Expect::patch(format!("{VMS}/demo/status?")).with(json!({
            "status": {"phase": "Starting", "node": "node-a", "pod": "demo-launcher"},
        })),
    ]));
    let action = reconcile(Arc::new(vm()), Vms::new(ctx.clone()))
        .await
        .expect("reconcile");
    let bodies = api.done().await;
    assert_eq!(
        action,
        kube::runtime::controller::Action::requeue(std::time::Duration::from_secs(1))
    );
    let ip = bodies[4]["spec"]["ip"].as_str().expect("an IP").to_string();
    assert!(ip.starts_with("10.1.0."), "{ip}");
    let uid = bodies[11]["status"]["podUID"]
        .as_str()
        .expect("the pod's UID");
    let pod: k8s_openapi::api::core::v1::Pod = api
        .get("/api/v1/namespaces/ns/pods/demo-launcher")
        .expect("the launcher pod");
    assert_eq!(
        pod.metadata.uid.as_deref(),
        Some(uid),
        "the created pod's UID"
    );
    let st = status(&api, "demo");
    assert_eq!(st.pod_uid.as_deref(), Some(uid), "kept by the last write");
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
        Expect::patch(format!("{VMS}/demo?")),
        Expect::get("/api/v1/nodes/node-a"),
        Expect::post("/apis/roam.dev/v1alpha1/addresses?")
            .with(json!({"metadata": {"name": "net-10-1-0-2"}, "spec": {"ip": "10.1.0.2"}})),
        Expect::get("/apis/roam.dev/v1alpha1/addresses/net-10-1-0-2"),
        Expect::post("/apis/roam.dev/v1alpha1/addresses?")
            .with(json!({"metadata": {"name": "net-10-1-0-3"}, "spec": {"ip": "10.1.0.3", "owner": "ns/demo"}})),
        Expect::get("/apis/roam.dev/v1alpha1/virtualmachines?"),
        Expect::get("/api/v1/namespaces/roam-system/secrets/roam-shim-token-vm-uid"),
        Expect::post("/api/v1/namespaces/roam-system/secrets?"),
        Expect::get("/api/v1/namespaces/ns/pods/demo-launcher"),
        Expect::patch(format!("{VMS}/demo/status?")),
        Expect::post("/api/v1/namespaces/ns/pods?"),
        Expect::patch(format!("{VMS}/demo/status?")),
        Expect::patch(format!("{VMS}/demo/status?"))
            .with(json!({"status": {"interfaces": [{"ip": "10.1.0.3"}]}})),
    ]));
    reconcile(Arc::new(v), Vms::new(ctx.clone()))
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

/// A VM without `spec.node` goes where the scheduler's constraints allow and the most memory
/// is left — not to the first name — and waits in Scheduling, saying why, when no node fits.
#[tokio::test]
async fn a_vm_without_a_node_goes_where_it_fits_best_or_says_why_none_fits() {
    let (ctx, api) = context(
        &[network("net", "10.1.0.0/24", "2024-01-01T00:00:00Z")],
        &["node-a", "node-b", "node-c"],
        &[],
    );
    // node-a: 8 GiB, 7.5 GiB requested by a pod; node-b: 8 GiB, nothing requested;
    // node-c: cordoned
    api.put(&node("node-a", "127.0.0.1"));
    api.put(&node("node-b", "127.0.0.2"));
    api.put(&cordoned("node-c", "127.0.0.3"));
    let busy: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "big", "namespace": "other"},
        "spec": {"nodeName": "node-a", "containers": [{"name": "c", "image": "x",
                 "resources": {"requests": {"memory": "7680Mi"}}}]},
    }))
    .unwrap();
    api.put(&busy);
    api.put(&vm());
    let _ = reconcile(Arc::new(vm()), Vms::new(ctx.clone()))
        .await
        .expect("reconcile");
    let st = status(&api, "demo");
    assert_eq!(st.node.as_deref(), Some("node-b"), "{st:?}");

    // now none fits: the VM asks for more than any node has
    let mut big = vm();
    big.metadata.name = Some("huge".into());
    big.spec.memory_mib = 16384;
    api.put(&big);
    let _ = reconcile(Arc::new(big), Vms::new(ctx.clone()))
        .await
        .expect("reconcile");
    let st = status(&api, "huge");
    assert_eq!(st.phase, VmPhase::Scheduling);
    let ready = ready(&st);
    assert_eq!(ready.reason, "NoNode");
    // node-b's 8192 MiB less the first VM's launcher (256 + 192 MiB) just created there
    assert!(
        ready.message.contains("node-c: cordoned")
            && ready
                .message
                .contains("node-b: 7744 MiB of memory free, the launcher requests 16576 MiB"),
        "{}",
        ready.message
    );
}

/// `roam.dev/migrate-to=auto`: a migration to the node that fits best other than the VM's
/// own; when none fits, no migration, and the VM's condition and an Event say why. The
/// annotation goes either way.
#[tokio::test]
async fn migrate_to_auto_picks_a_node_that_fits_or_refuses_with_the_reasons() {
    let (ctx, api) = context(
        &[network("net", "10.1.0.0/24", "2024-01-01T00:00:00Z")],
        &["node-a", "node-b", "node-c"],
        &[],
    );
    api.put(&node("node-a", "127.0.0.1"));
    api.put(&cordoned("node-b", "127.0.0.2"));
    api.put(&node("node-c", "127.0.0.3"));
    let running = |name: &str| {
        let mut v = vm();
        v.metadata.name = Some(name.into());
        v.metadata.annotations =
            Some([("roam.dev/migrate-to".to_string(), "auto".to_string())].into());
        v.status = Some(roam_api::VirtualMachineStatus {
            phase: VmPhase::Running,
            node: Some("node-a".into()),
            ..Default::default()
        });
        v
    };
    api.put(&running("demo"));
    let _ = reconcile(Arc::new(running("demo")), Vms::new(ctx.clone()))
        .await
        .expect("reconcile");
    let migrations: Vec<roam_api::VirtualMachineMigration> =
        api.list("/apis/roam.dev/v1alpha1/namespaces/ns/virtualmachinemigrations");
    assert_eq!(migrations.len(), 1, "{migrations:?}");
    assert_eq!(migrations[0].spec.target_node.as_deref(), Some("node-c"));
    let v = api
        .get::<VirtualMachine>(&format!("{VMS}/demo"))
        .expect("the VM");
    assert!(
        !v.annotations().contains_key("roam.dev/migrate-to"),
        "annotation removed"
    );

    // node-c cordoned too: nothing fits
    api.put(&cordoned("node-c", "127.0.0.3"));
    api.put(&running("other"));
    let _ = reconcile(Arc::new(running("other")), Vms::new(ctx.clone()))
        .await
        .expect("reconcile");
    let migrations: Vec<roam_api::VirtualMachineMigration> =
        api.list("/apis/roam.dev/v1alpha1/namespaces/ns/virtualmachinemigrations");
    assert_eq!(migrations.len(), 1, "no second migration: {migrations:?}");
    let v = api
        .get::<VirtualMachine>(&format!("{VMS}/other"))
        .expect("the VM");
    assert!(
        !v.annotations().contains_key("roam.dev/migrate-to"),
        "annotation removed"
    );
    let c = v
        .status
        .unwrap_or_default()
        .conditions
        .into_iter()
        .find(|c| c.type_ == "MigrationRequest")
        .expect("a MigrationRequest condition");
    assert_eq!(c.reason, "NoTargetNode");
    assert_eq!(
        c.message,
        "migrate-to=auto: no node can take the VM: node-b: cordoned (spec.unschedulable); \
         node-c: cordoned (spec.unschedulable)"
    );
    api.events(&["MigrationRequested", "MigrationRejected"])
        .await;
}

/// A deleted VM: its launcher's shim tears it down (domain, taps, OVS ports) before the pod
/// is deleted, a pod that only carries the VM's labels is left alone, and the finalizer goes
/// only once no launcher pod is left — until then the VM, and with it its Address, is held.
#[tokio::test]
async fn a_deleted_vm_is_torn_down_on_its_node_before_it_goes() {
    use super::super::fixtures::{FakeShim, shim_status};
    use roam_shim_api::api::DomainState;

    let shim = FakeShim::start(
        "127.0.0.1:0".parse().unwrap(),
        shim_status("node-a", DomainState::Running, "demo-launcher"),
    )
    .await
    .expect("a shim");
    let port = shim.addr.port();
    let addr = address("net-10-1-0-5", "net", "10.1.0.5", Some("ns/demo"), "node-a");
    let (ctx, api) = context(
        &[network("net", "10.1.0.0/24", "2024-01-01T00:00:00Z")],
        &["node-a"],
        std::slice::from_ref(&addr),
    );
    api.put(&node("node-a", "127.0.0.1"));
    api.put(&addr);
    api.put(&token_secret());
    let mut v = vm();
    v.metadata.finalizers = Some(vec!["roam.dev/teardown".into()]);
    v.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
    ));
    v.status = Some(
        serde_json::from_value(json!({"phase": "Running", "node": "node-a",
                                      "pod": "demo-launcher", "shimPort": port}))
        .unwrap(),
    );
    api.put(&v);
    let launcher_labels: std::collections::BTreeMap<String, String> = [
        ("roam.dev/launcher".to_string(), "true".to_string()),
        ("roam.dev/vm".to_string(), "demo".to_string()),
    ]
    .into();
    let mut launcher = pod("demo-launcher", "node-a", json!({}));
    launcher.metadata.labels = Some(launcher_labels.clone());
    launcher.metadata.owner_references = Some(vec![
        serde_json::from_value(json!({
        "apiVersion": "roam.dev/v1alpha1", "kind": "VirtualMachine", "name": "demo",
        "uid": "vm-uid", "controller": true}))
        .unwrap(),
    ]);
    launcher.status = Some(
        serde_json::from_value(json!({"phase": "Running", "containerStatuses": [
            {"name": "shim", "ready": true, "restartCount": 0, "image": "i", "imageID": "",
             "state": {"running": {}}}]}))
        .unwrap(),
    );
    api.put(&launcher);
    // a pod of the tenant's that only looks like the VM's launcher
    let mut forged = pod("impostor", "node-a", json!({}));
    forged.metadata.labels = Some(launcher_labels);
    api.put(&forged);

    let pods_of_vm = "/api/v1/namespaces/ns/pods?&labelSelector=roam.dev%2Fvm%3Ddemo";
    api.expect(Scenario::Steps(vec![
        Expect::get(pods_of_vm),
        Expect::get("/api/v1/nodes/node-a"),
        Expect::get("/api/v1/namespaces/roam-system/secrets/roam-shim-token-vm-uid"),
        Expect::delete("/api/v1/namespaces/ns/pods/demo-launcher?"),
        Expect::patch(format!("{VMS}/demo/status?")).with(json!({
            "status": {"conditions": [{"type": "Ready", "status": "False", "reason": "Deleting"}]},
        })),
    ]));
    reconcile(Arc::new(v.clone()), Vms::new(ctx.clone()))
        .await
        .expect("reconcile");
    api.done().await;
    assert_eq!(shim.take_calls(), vec!["POST /v1/teardown".to_string()]);
    api.events(&["TornDown"]).await;
    assert!(
        api.get::<k8s_openapi::api::core::v1::Pod>("/api/v1/namespaces/ns/pods/impostor")
            .is_some(),
        "a pod the VM does not control is not the controller's to delete"
    );

    // the launcher is gone: the token Secret (in roam's namespace) and the finalizer go,
    // nothing else is asked
    let v = api
        .get::<VirtualMachine>(&format!("{VMS}/demo"))
        .expect("still held");
    let token = "/api/v1/namespaces/roam-system/secrets/roam-shim-token-vm-uid";
    api.expect(Scenario::Steps(vec![
        Expect::get(pods_of_vm),
        Expect::delete(format!("{token}?")),
        Expect::patch(format!("{VMS}/demo?")).with(json!({"metadata": {"finalizers": []}})),
    ]));
    reconcile(Arc::new(v), Vms::new(ctx.clone()))
        .await
        .expect("reconcile");
    api.done().await;
    assert!(shim.take_calls().is_empty(), "no second teardown");
    assert!(
        api.get::<k8s_openapi::api::core::v1::Secret>(token)
            .is_none(),
        "the token goes with its VM"
    );
}

/// A spec no retry can fix (0 vCPUs, a boot path with `..`): one status write and one
/// Warning Event that name every problem; no finalizer, Address, Secret or pod — and no
/// requeue: only an edit brings it back.
#[tokio::test]
async fn a_vm_whose_spec_cannot_run_is_refused_before_anything_is_created() {
    let (ctx, api) = context(
        &[network("net", "10.1.0.0/24", "2024-01-01T00:00:00Z")],
        &["node-a"],
        &[],
    );
    api.put(&node("node-a", "127.0.0.1"));
    let mut bad = vm();
    bad.spec.cpu = 0;
    bad.spec.boot = roam_api::Boot::Kernel {
        kernel: "/g/../etc/shadow".into(),
        initrd: None,
        cmdline: None,
    };
    api.put(&bad);
    api.expect(Scenario::Steps(vec![
        Expect::patch(format!("{VMS}/demo/status?")).with(json!({"status": {"phase": "Failed"}})),
    ]));
    let action = reconcile(Arc::new(bad), Vms::new(ctx.clone()))
        .await
        .expect("reconcile");
    api.done().await;
    assert_eq!(action, kube::runtime::controller::Action::await_change());
    let st = status(&api, "demo");
    let ready = ready(&st);
    assert_eq!(ready.reason, "InvalidVirtualMachine");
    assert!(
        ready.message.contains("cpu 0: use 1 to 255")
            && ready.message.contains("kernel path \"/g/../etc/shadow\""),
        "{}",
        ready.message
    );
    assert_eq!(st.node, None);
    assert_eq!(st.pod, None);
    api.events(&["InvalidVirtualMachine"]).await;
}

/// A VM pinned (`spec.node`) to a node that could never hold it — fewer allocatable CPUs
/// than its vCPUs — is refused at once, saying how to fix it, instead of waiting in
/// Scheduling forever; nothing is created for it.
#[tokio::test]
async fn a_vm_pinned_to_a_node_too_small_for_it_is_refused() {
    let (ctx, api) = context(
        &[network("net", "10.1.0.0/24", "2024-01-01T00:00:00Z")],
        &["node-a"],
        &[],
    );
    let mut small = node("node-a", "127.0.0.1");
    if let Some(a) = small.status.as_mut().and_then(|s| s.allocatable.as_mut()) {
        a.insert(
            "cpu".into(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("2".into()),
        );
    }
    api.put(&small);
    let mut v = vm();
    v.spec.cpu = 4;
    v.spec.node = Some("node-a".into());
    api.put(&v);
    let _ = reconcile(Arc::new(v), Vms::new(ctx.clone()))
        .await
        .expect("reconcile");
    let st = status(&api, "demo");
    assert_eq!(st.phase, VmPhase::Failed, "{st:?}");
    let ready = ready(&st);
    assert!(
        ready.message.contains(
            "node node-a has 2 allocatable CPUs, the VM 4 vCPUs: pin it to a larger node"
        ),
        "{}",
        ready.message
    );
    assert!(
        api.list::<Address>("/apis/roam.dev/v1alpha1/addresses")
            .iter()
            .all(|a| a.spec.owner.is_none())
    );
    assert!(
        api.get::<k8s_openapi::api::core::v1::Pod>("/api/v1/namespaces/ns/pods/demo-launcher")
            .is_none()
    );
    api.events(&["InvalidVirtualMachine"]).await;
}

/// VM `ns/name`'s status as stored.
fn status(
    api: &super::super::fixtures::ApiServerVerifier,
    name: &str,
) -> roam_api::VirtualMachineStatus {
    api.get::<VirtualMachine>(&format!("{VMS}/{name}"))
        .and_then(|v| v.status)
        .expect("a status")
}

/// The `Ready` condition of `st`.
fn ready(
    st: &roam_api::VirtualMachineStatus,
) -> &k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
    st.conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .expect("Ready")
}

/// [`super::super::fixtures::config`] with the privilege split on.
fn with_runners() -> crate::controller::Config {
    let mut c = super::super::fixtures::config();
    c.vm.runners = Some(crate::launcher::RunnerConfig {
        namespace: "roam-system".into(),
        kubelet_root: "/var/lib/kubelet".into(),
    });
    c
}

/// The runner in roam-system of VM ns/demo's launcher pod `ns/demo-launcher` of UID
/// `launcher_uid`, on node-a.
fn runner_of_launcher(launcher_uid: &str) -> k8s_openapi::api::core::v1::Pod {
    let mut r = pod(
        &crate::launcher::runner_name("ns", "demo-launcher"),
        "node-a",
        json!({
        "roam.dev/launcher": "ns/demo-launcher", "roam.dev/launcher-uid": launcher_uid,
        "roam.dev/vm": "ns/demo"}),
    );
    r.metadata.namespace = Some("roam-system".into());
    r.metadata.labels = Some(
        [
            ("roam.dev/runner".to_string(), "true".to_string()),
            ("roam.dev/vm-uid".to_string(), "vm-uid".to_string()),
        ]
        .into(),
    );
    r
}

/// With runners: the unprivileged launcher pod in the VM's namespace first, then its runner
/// in roam-system, bound to the pod's UID; then the sweep finds the runner's pod alive.
#[tokio::test]
async fn with_runners_a_new_vm_gets_an_unprivileged_launcher_pod_then_its_runner() {
    let (ctx, api) = super::super::fixtures::context_with(
        with_runners(),
        &[network("net", "10.1.0.0/24", "2024-01-01T00:00:00Z")],
        &["node-a"],
        &[],
    );
    api.put(&node("node-a", "127.0.0.1"));
    let mut v = vm();
    v.spec.node = Some("node-a".into());
    api.put(&v);
    let runner = crate::launcher::runner_name("ns", "demo-launcher");
    let runners = "/api/v1/namespaces/roam-system/pods";
    api.expect(Scenario::Steps(vec![
        Expect::patch(format!("{VMS}/demo?")),
        Expect::get("/api/v1/nodes/node-a"),
        Expect::post("/apis/roam.dev/v1alpha1/addresses?"),
        Expect::get("/apis/roam.dev/v1alpha1/virtualmachines?"),
        Expect::get("/api/v1/namespaces/roam-system/secrets/roam-shim-token-vm-uid"),
        Expect::post("/api/v1/namespaces/roam-system/secrets?"),
        Expect::get("/api/v1/namespaces/ns/pods/demo-launcher"),
        Expect::patch(format!("{VMS}/demo/status?")),
        Expect::post("/api/v1/namespaces/ns/pods?").with(json!({
            "metadata": {"name": "demo-launcher", "labels": {"roam.dev/launcher": "true"}},
            "spec": {"nodeName": "node-a",
                     "securityContext": {"runAsNonRoot": true,
                                         "seccompProfile": {"type": "RuntimeDefault"}}},
        })),
        Expect::patch(format!("{VMS}/demo/status?")),
        Expect::get(format!("{runners}/{runner}")),
        Expect::post(format!("{runners}?")).with(json!({
            "metadata": {"name": runner, "labels": {"roam.dev/runner": "true",
                                                    "roam.dev/vm-uid": "vm-uid"},
                         "annotations": {"roam.dev/launcher": "ns/demo-launcher",
                                         "roam.dev/vm": "ns/demo"}},
            "spec": {"nodeName": "node-a", "hostNetwork": true},
        })),
        Expect::get(format!(
            "{runners}?&labelSelector=roam.dev%2Fvm-uid%3Dvm-uid"
        )),
        Expect::get("/api/v1/namespaces/ns/pods/demo-launcher"),
        Expect::patch(format!("{VMS}/demo/status?")).with(json!({
            "status": {"phase": "Starting", "node": "node-a", "pod": "demo-launcher"},
        })),
    ]));
    reconcile(Arc::new(v), Vms::new(ctx.clone()))
        .await
        .expect("reconcile");
    let bodies = api.done().await;
    assert!(
        bodies[8]["spec"]["hostNetwork"].is_null(),
        "the launcher pod is not host-networked: {}",
        bodies[8]
    );
    let launcher: k8s_openapi::api::core::v1::Pod = api
        .get("/api/v1/namespaces/ns/pods/demo-launcher")
        .expect("the launcher pod");
    let stored: k8s_openapi::api::core::v1::Pod =
        api.get(&format!("{runners}/{runner}")).expect("the runner");
    assert_eq!(
        stored.annotations().get("roam.dev/launcher-uid"),
        launcher.metadata.uid.as_ref(),
        "the runner is this very pod's"
    );
}

/// With runners, a deleted VM whose launcher pod is gone is held until its runner is gone too:
/// the teardown deletes the runner, then lets the VM go.
#[tokio::test]
async fn with_runners_a_deleted_vm_waits_for_its_runner_to_go() {
    let (ctx, api) = super::super::fixtures::context_with(
        with_runners(),
        &[network("net", "10.1.0.0/24", "2024-01-01T00:00:00Z")],
        &["node-a"],
        &[],
    );
    api.put(&token_secret());
    let mut v = vm();
    v.metadata.finalizers = Some(vec!["roam.dev/teardown".into()]);
    v.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
    ));
    api.put(&v);
    let r = runner_of_launcher("gone-uid");
    let runner = r.name_any();
    api.put(&r);
    let pods_of_vm = "/api/v1/namespaces/ns/pods?&labelSelector=roam.dev%2Fvm%3Ddemo";
    let runners_of_vm =
        "/api/v1/namespaces/roam-system/pods?&labelSelector=roam.dev%2Fvm-uid%3Dvm-uid";
    api.expect(Scenario::Steps(vec![
        Expect::get(pods_of_vm),
        // the pods the VM's runners run for, whatever their labels say
        Expect::get(runners_of_vm),
        Expect::get("/api/v1/namespaces/ns/pods/demo-launcher"),
        Expect::get(runners_of_vm),
        Expect::get("/api/v1/namespaces/ns/pods/demo-launcher"),
        Expect::delete(format!("/api/v1/namespaces/roam-system/pods/{runner}?")),
        Expect::patch(format!("{VMS}/demo/status?")).with(json!({
            "status": {"conditions": [{"type": "Ready", "status": "False", "reason": "Deleting"}]},
        })),
    ]));
    reconcile(Arc::new(v), Vms::new(ctx.clone()))
        .await
        .expect("reconcile");
    api.done().await;
    let v = api
        .get::<VirtualMachine>(&format!("{VMS}/demo"))
        .expect("still held");
    let token = "/api/v1/namespaces/roam-system/secrets/roam-shim-token-vm-uid";
    api.expect(Scenario::Steps(vec![
        Expect::get(pods_of_vm),
        Expect::get(runners_of_vm),
        Expect::get(runners_of_vm),
        Expect::delete(format!("{token}?")),
        Expect::patch(format!("{VMS}/demo?")).with(json!({"metadata": {"finalizers": []}})),
    ]));
    reconcile(Arc::new(v), Vms::new(ctx.clone()))
        .await
        .expect("reconcile");
    api.done().await;
}

/// The runners' own controller, whatever became of the VM (here: none, as after its
/// finalizer was patched away): a runner whose launcher pod exists stays; once the pod is
/// gone, or replaced by another pod of the same name, the runner is deleted. Also under a
/// `--namespace-selector` that no longer lists the pod's namespace (a namespace deleted with
/// such a VM): the controller asks the API server nothing about namespaces (the steps would
/// refuse the question).
#[tokio::test]
async fn a_runner_goes_once_its_launcher_pod_is_gone_even_without_its_vm() {
    let scoped = crate::controller::Config {
        namespace_selector: Some("!roam.dev/test".into()),
        ..with_runners()
    };
    let (ctx, api) = super::super::fixtures::context_with(scoped, &[], &["node-a"], &[]);
    let r = runner_of_launcher("demo-launcher-uid");
    let runner = format!("/api/v1/namespaces/roam-system/pods/{}", r.name_any());
    api.put(&r);
    let mut launcher = pod("demo-launcher", "node-a", json!({}));
    launcher.metadata.labels = Some([("roam.dev/launcher".to_string(), "true".to_string())].into());
    api.put(&launcher);
    let launcher_path = "/api/v1/namespaces/ns/pods/demo-launcher";

    // the pod is there: nothing to do
    assert!(
        runner_reconciled(&api, &ctx, &r, &runner, vec![Expect::get(launcher_path)]).await,
        "the runner of a pod that exists stays"
    );

    // another pod of the same name (a new launcher): this runner is not its
    launcher.metadata.uid = Some("another-uid".into());
    api.put(&launcher);
    let steps = vec![
        Expect::get(launcher_path),
        Expect::delete(format!("{runner}?")),
    ];
    assert!(
        !runner_reconciled(&api, &ctx, &r, &runner, steps).await,
        "the runner of a pod that is gone is deleted"
    );
}

/// Reconcile runner `r` (stored at `path`) with the API server expecting `steps`: whether the
/// runner is still there afterwards.
async fn runner_reconciled(
    api: &super::super::fixtures::ApiServerVerifier,
    ctx: &Arc<crate::controller::Context>,
    r: &k8s_openapi::api::core::v1::Pod,
    path: &str,
    steps: Vec<Expect>,
) -> bool {
    api.expect(Scenario::Steps(steps));
    reconcile_runner(Arc::new(r.clone()), ctx.clone())
        .await
        .expect("reconcile");
    api.done().await;
    api.get::<k8s_openapi::api::core::v1::Pod>(path).is_some()
}

/// A pod a tenant made under the launcher's name, with roam's labels and the VM as its
/// controlling owner: roam neither uses nor deletes it; the VM waits (Pending,
/// `LauncherInTheWay`, an Event naming the pod) and no runner is made for it.
#[tokio::test]
async fn a_pod_roam_did_not_create_is_not_the_vms_launcher() {
    let (ctx, api) = super::super::fixtures::context_with(
        with_runners(),
        &[network("net", "10.1.0.0/24", "2024-01-01T00:00:00Z")],
        &["node-a"],
        &[],
    );
    api.put(&node("node-a", "127.0.0.1"));
    api.put(&token_secret());
    let mut v = vm();
    v.spec.node = Some("node-a".into());
    api.put(&v);
    let mut forged = pod("demo-launcher", "node-a", json!({}));
    forged.metadata.labels = Some(
        [("roam.dev/launcher", "true"), ("roam.dev/vm", "demo")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    );
    forged.metadata.owner_references = Some(vec![
        k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "roam.dev/v1alpha1".into(),
            kind: "VirtualMachine".into(),
            name: "demo".into(),
            uid: "vm-uid".into(),
            controller: Some(true),
            block_owner_deletion: None,
        },
    ]);
    api.put(&forged);
    let runner = crate::launcher::runner_name("ns", "demo-launcher");
    api.expect(Scenario::Steps(vec![
        Expect::patch(format!("{VMS}/demo?")),
        Expect::get("/api/v1/nodes/node-a"),
        Expect::post("/apis/roam.dev/v1alpha1/addresses?"),
        Expect::get("/apis/roam.dev/v1alpha1/virtualmachines?"),
        Expect::get("/api/v1/namespaces/roam-system/secrets/roam-shim-token-vm-uid"),
        Expect::get("/api/v1/namespaces/ns/pods/demo-launcher"),
        // is a runner of roam's bound to it? none
        Expect::get(format!("/api/v1/namespaces/roam-system/pods/{runner}")),
        Expect::patch(format!("{VMS}/demo/status?")).with(json!({"status": {
            "phase": "Pending",
            "conditions": [{"type": "Ready", "status": "False", "reason": "LauncherInTheWay"}],
        }})),
    ]));
    let action = reconcile(Arc::new(v), Vms::new(ctx.clone()))
        .await
        .expect("reconcile");
    api.done().await;
    assert_eq!(
        action,
        kube::runtime::controller::Action::requeue(std::time::Duration::from_secs(10))
    );
    let st = status(&api, "demo");
    let why = &st.conditions[0].message;
    assert!(
        why.contains("demo-launcher") && why.contains("did not create"),
        "{why}"
    );
    assert_eq!(
        st.pod_uid, None,
        "nothing recorded for a pod roam did not make"
    );
    api.events(&["LauncherInTheWay"]).await;
    assert!(
        api.get::<k8s_openapi::api::core::v1::Pod>("/api/v1/namespaces/ns/pods/demo-launcher")
            .is_some(),
        "the tenant's pod is left alone"
    );
}

/// A creation roam recorded (`creating`) but whose pod's UID it never wrote (a restart in
/// between): the pod under the name may be roam's or another's, and nothing runs in it yet;
/// it is deleted — that very pod, by UID — and made again at the next reconcile.
#[tokio::test]
async fn an_unrecorded_creation_is_deleted_by_uid_and_made_again() {
    let (ctx, api) = context(
        &[network("net", "10.1.0.0/24", "2024-01-01T00:00:00Z")],
        &["node-a"],
        &[],
    );
    api.put(&node("node-a", "127.0.0.1"));
    api.put(&token_secret());
    let mut v = vm();
    v.spec.node = Some("node-a".into());
    v.status = Some(roam_api::VirtualMachineStatus {
        pod: Some("demo-launcher".into()),
        pod_uid: Some(roam_core::adoption::CREATING.into()),
        shim_port: Some(17000),
        ..Default::default()
    });
    api.put(&v);
    api.put(&pod("demo-launcher", "node-a", json!({})));
    api.expect(Scenario::Steps(vec![
        Expect::patch(format!("{VMS}/demo?")),
        Expect::get("/api/v1/nodes/node-a"),
        Expect::post("/apis/roam.dev/v1alpha1/addresses?"),
        Expect::get("/api/v1/namespaces/roam-system/secrets/roam-shim-token-vm-uid"),
        Expect::get("/api/v1/namespaces/ns/pods/demo-launcher"),
        Expect::delete("/api/v1/namespaces/ns/pods/demo-launcher?")
            .with(json!({"preconditions": {"uid": "demo-launcher-uid"}})),
    ]));
    let action = reconcile(Arc::new(v), Vms::new(ctx.clone()))
        .await
        .expect("reconcile");
    api.done().await;
    assert_eq!(
        action,
        kube::runtime::controller::Action::requeue(std::time::Duration::from_secs(1))
    );
}

const QUOTA: &str = "pods \"demo-launcher\" is forbidden: exceeded quota: small, requested: requests.memory=448Mi, used: requests.memory=0, limited: requests.memory=300Mi";

/// A launcher pod the namespace's ResourceQuota refuses: the VM waits (Pending,
/// `QuotaExceeded` quoting the quota, an Event), nothing runs; once the quota lets it, the pod
/// is made.
#[tokio::test]
async fn a_vm_over_its_namespaces_quota_waits_naming_the_quota() {
    let (ctx, api) = context(
        &[network("net", "10.1.0.0/24", "2024-01-01T00:00:00Z")],
        &["node-a"],
        &[],
    );
    api.put(&node("node-a", "127.0.0.1"));
    api.put(&token_secret());
    let mut v = vm();
    v.spec.node = Some("node-a".into());
    api.put(&v);
    api.refuse_creates("/api/v1/namespaces/ns/pods", 403, QUOTA);
    api.expect(Scenario::Free);
    let action = reconcile(Arc::new(v), Vms::new(ctx.clone()))
        .await
        .expect("reconcile");
    api.done().await;
    assert_eq!(
        action,
        kube::runtime::controller::Action::requeue(std::time::Duration::from_secs(15))
    );
    let st = status(&api, "demo");
    assert_eq!(st.phase, VmPhase::Pending);
    let c = &st.conditions[0];
    assert_eq!(c.reason, "QuotaExceeded");
    assert!(
        c.message.contains("exceeded quota: small") && c.message.contains("requests.memory=300Mi"),
        "{}",
        c.message
    );
    api.events(&["QuotaExceeded"]).await;
    assert!(
        api.get::<k8s_openapi::api::core::v1::Pod>("/api/v1/namespaces/ns/pods/demo-launcher")
            .is_none()
    );
}
