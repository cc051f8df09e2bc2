//! The migration controller, reconcile by reconcile: its happy path (Pending → TargetScheduling
//! → TargetReady → Migrating → Switchover → Succeeded), the switchover task at the pause
//! (nothing to write: the VM's port is multi-chassis), an abort (deleted while Migrating), a refused spec, and a restarted controller that
//! adopts a copy in flight. The shims are fakes on loopback (127.0.0.1 the source node,
//! 127.0.0.2 the target), the API server the mock of [`super::super::fixtures`].

use std::net::SocketAddr;
use std::sync::Arc;

use serde_json::{Value, json};

use super::super::Context;
use super::super::fixtures::{
    ApiServerVerifier, Expect, FakeShim, Scenario, context, job, shim_status,
};
use super::super::migrations::TestReconciler;
use super::{address, cordoned, network, node, pod, token_secret, vm};
use roam_api::{Address, VirtualMachine, VirtualMachineMigration};
use roam_core::migration::Phase;
use roam_shim_api::api::{DomainState, Incoming, JobState, JobStats, PortState};
use roam_shim_api::events::Lifecycle;

const MIGS: &str = "/apis/roam.dev/v1alpha1/namespaces/ns/virtualmachinemigrations";
const VMS: &str = "/apis/roam.dev/v1alpha1/namespaces/ns/virtualmachines";
const PODS: &str = "/api/v1/namespaces/ns/pods";
const ADDR: &str = "/apis/roam.dev/v1alpha1/addresses/net-10-1-0-5";

/// A VM running on node-a (its shim on 127.0.0.1), node-b Ready (127.0.0.2), and a
/// migration `mig` of it to `target`.
struct World {
    ctx: Arc<Context>,
    api: ApiServerVerifier,
    source: FakeShim,
    target: FakeShim,
}

async fn world(target: &str) -> World {
    let source = FakeShim::start(
        "127.0.0.1:0".parse().unwrap(),
        shim_status("node-a", DomainState::Running, "demo-launcher"),
    )
    .await
    .expect("a source shim");
    let port = source.addr.port();
    let target_shim = FakeShim::start(
        SocketAddr::from(([127, 0, 0, 2], port)),
        shim_status("node-b", DomainState::Absent, "mig-target"),
    )
    .await
    .expect("a target shim on the source's port");
    let addr = address("net-10-1-0-5", "net", "10.1.0.5", Some("ns/demo"), "node-a");
    let (ctx, api) = context(
        &[network("net", "10.1.0.0/24", "2024-01-01T00:00:00Z")],
        &["node-a", "node-b"],
        std::slice::from_ref(&addr),
    );
    api.put(&node("node-a", "127.0.0.1"));
    api.put(&node("node-b", "127.0.0.2"));
    api.put(&addr);
    api.put(&token_secret());
    let mut v = vm();
    v.status = Some(
        serde_json::from_value(json!({"phase": "Running", "node": "node-a",
                                      "pod": "demo-launcher", "shimPort": port}))
        .unwrap(),
    );
    api.put(&v);
    let mut launcher = pod("demo-launcher", "node-a", json!({}));
    launcher.metadata.labels = Some([("roam.dev/launcher".to_string(), "true".to_string())].into());
    api.put(&launcher);
    api.put(&migration(target));
    World {
        ctx,
        api,
        source,
        target: target_shim,
    }
}

fn migration(target: &str) -> VirtualMachineMigration {
    serde_json::from_value(json!({
        "apiVersion": "roam.dev/v1alpha1", "kind": "VirtualMachineMigration",
        "metadata": {"name": "mig", "namespace": "ns", "uid": "mig-uid",
                     "labels": {"roam.dev/vm": "demo"}},
        "spec": {"vm": "demo", "targetNode": target},
    }))
    .unwrap()
}

impl World {
    fn mig(&self) -> VirtualMachineMigration {
        self.api.get(&format!("{MIGS}/mig")).expect("the migration")
    }
    fn phase(&self) -> Phase {
        self.mig().status.unwrap_or_default().phase
    }
    fn address(&self) -> Address {
        self.api.get(ADDR).expect("the Address")
    }
    async fn reconcile(&self, r: &TestReconciler) {
        self.try_reconcile(r).await.expect("reconcile");
    }
    async fn try_reconcile(&self, r: &TestReconciler) -> crate::Result<()> {
        r.reconcile(Arc::new(self.mig()), self.ctx.clone())
            .await
            .map(|_| ())
    }
    /// The target pod runs and its shim answers, waiting for the copy.
    fn target_starts(&self) {
        let mut p: k8s_openapi::api::core::v1::Pod = self
            .api
            .get(&format!("{PODS}/mig-target"))
            .expect("the target pod");
        p.status = serde_json::from_value(json!({"phase": "Running"})).unwrap();
        self.api.put(&p);
        self.target.update(|s| {
            s.status.domain = DomainState::Paused;
            s.status.incoming = true;
        });
    }
    /// Steps 1-3 of the happy path, unchecked: the copy runs.
    async fn to_migrating(&self, r: &TestReconciler) {
        self.api.expect(Scenario::Free);
        self.reconcile(r).await;
        self.target_starts();
        self.reconcile(r).await;
        self.reconcile(r).await;
        assert_eq!(self.phase(), Phase::Migrating);
    }
}

/// What every reconcile of a running migration reads first, in order.
fn observe(with_finalizer_patch: bool) -> Vec<Expect> {
    let mut v = vec![Expect::get(format!("{MIGS}/mig"))];
    if with_finalizer_patch {
        v.push(
            Expect::patch(format!("{MIGS}/mig?"))
                .with(json!({"metadata": {"finalizers": ["roam.dev/migration"]}})),
        );
    }
    v.push(Expect::get(format!("{VMS}/demo")));
    v
}

/// The pods that count against the nodes (placement).
const PODS_LIVE: &str =
    "/api/v1/pods?&fieldSelector=status.phase%21%3DSucceeded%2Cstatus.phase%21%3DFailed";

fn reads() -> Vec<Expect> {
    vec![
        Expect::get("/api/v1/namespaces/roam-system/secrets/roam-shim-token-vm-uid"),
        Expect::get("/api/v1/nodes/node-a"),
        Expect::get("/api/v1/nodes/node-b"),
        Expect::get(format!("{PODS}/mig-target")),
        Expect::get(format!("{PODS}/demo-launcher")),
    ]
}

fn status_patch(fields: Value) -> Expect {
    Expect::patch(format!("{MIGS}/mig/status?")).with(json!({ "status": fields }))
}

fn steps(parts: Vec<Vec<Expect>>) -> Scenario {
    Scenario::Steps(parts.into_iter().flatten().collect())
}

#[tokio::test]
async fn the_happy_path_step_by_step() {
    let w = world("node-b").await;
    let r = TestReconciler::new();

    // Pending: finalizer, validation, the VM claimed, the port prepared on the target, the
    // target pod created
    w.api.expect(steps(vec![
        observe(true),
        vec![
            Expect::get("/api/v1/nodes/node-b"),
            // the named target takes the VM as the scheduler would (placement)
            Expect::get("/api/v1/nodes?"),
            Expect::get(PODS_LIVE),
            Expect::patch(format!("{VMS}/demo/status?"))
                .with(json!({"status": {"migration": "mig", "phase": "Migrating"}})),
        ],
        reads(),
        vec![
            Expect::get(ADDR),
            Expect::put(format!("{ADDR}?")).with(json!({
                "metadata": {"annotations": {"roam.dev/also-on": "node-b"}},
                "spec": {"host": "node-a"},
            })),
            // the target pod is claimed in the migration's status before it exists, then
            // its UID recorded
            status_patch(json!({"targetPod": "mig-target", "targetPodUID": "creating"})),
            Expect::post(format!("{PODS}?")).with(json!({
                "metadata": {"name": "mig-target", "annotations": {"roam.dev/migration": "mig"}},
                "spec": {"nodeName": "node-b"},
            })),
            Expect::patch(format!("{MIGS}/mig/status?")),
            status_patch(json!({"phase": "TargetScheduling", "sourceNode": "node-a",
                                "targetNode": "node-b", "sourcePod": "demo-launcher",
                                "targetPod": "mig-target"})),
        ],
    ]));
    w.reconcile(&r).await;
    let bodies = w.api.done().await;
    let target_pod = bodies
        .iter()
        .find(|b| b["metadata"]["name"] == "mig-target")
        .expect("the target pod");
    let shim = target_pod["spec"]["containers"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == "shim"))
        .expect("the shim's container");
    let args = shim["args"].to_string();
    assert!(args.contains("\"incoming\""), "{args}");
    assert_eq!(w.phase(), Phase::TargetScheduling);

    // the target's shim answers, but its node's ovn-controller has not installed the VM's
    // port yet: no copy (at the pause the port must be there, ready to activate)
    w.target_starts();
    w.target.update(|s| {
        s.status.ports = vec![PortState {
            port: "ns.demo-0".into(),
            tap: "tap0".into(),
            installed: false,
        }]
    });
    w.source.take_calls();
    w.api.expect(steps(vec![observe(false), reads()]));
    w.reconcile(&r).await;
    w.api.done().await;
    assert!(w.source.state.lock().unwrap().migrate.is_none());
    assert_eq!(w.phase(), Phase::TargetScheduling);

    // TargetScheduling → TargetReady: the port is installed; the copy starts and its job id
    // is written before anything else
    w.target.update(|s| s.status.ports[0].installed = true);
    w.api.expect(steps(vec![
        observe(false),
        reads(),
        vec![
            status_patch(json!({"phase": "TargetScheduling", "jobId": 7})),
            status_patch(json!({"phase": "TargetReady", "jobId": 7})),
        ],
    ]));
    w.reconcile(&r).await;
    w.api.done().await;
    let migrate = w
        .source
        .state
        .lock()
        .unwrap()
        .migrate
        .clone()
        .expect("a migrate request");
    assert_eq!(
        migrate.target,
        format!("http://127.0.0.2:{}", w.source.addr.port())
    );
    assert_eq!(migrate.target_token, "t0ken");
    let calls = w.source.take_calls();
    assert_eq!(
        calls.iter().filter(|c| *c == "POST /v1/migrate").count(),
        1,
        "{calls:?}"
    );

    // TargetReady → Migrating: the job runs
    w.api.expect(steps(vec![
        observe(false),
        reads(),
        vec![status_patch(json!({"phase": "Migrating"}))],
    ]));
    w.reconcile(&r).await;
    w.api.done().await;

    // the pause: the VM's port is bound on both chassis; the target announces the VM (its
    // binding there activates on that RARP); nothing to write (and without a southbound
    // database, no figure to record)
    w.api.expect(Scenario::Steps(vec![]));
    w.target.take_calls();
    w.source.update(|s| s.status.domain = DomainState::Paused);
    let seq = w.source.event(Lifecycle::SuspendedForMigration);
    w.source.handled(seq).await;
    w.api.done().await;
    assert!(
        w.target
            .take_calls()
            .contains(&"POST /v1/announce".to_string()),
        "the target announced at the pause"
    );

    // Migrating → Switchover
    w.api.expect(steps(vec![
        observe(false),
        reads(),
        vec![status_patch(json!({"phase": "Switchover"}))],
    ]));
    w.reconcile(&r).await;
    w.api.done().await;

    // the guest runs on the target: the VM is the target's, the source pod goes, the
    // port lives only on the target, the VM is released
    w.target.update(|s| {
        s.status.domain = DomainState::Running;
        s.status.incoming = false;
        s.status.last_incoming = Some(Incoming {
            resumed_unix_ns: 2,
            stats: JobStats {
                downtime_ms: Some(42),
                ..Default::default()
            },
        });
    });
    w.source.update(|s| {
        s.status.domain = DomainState::Absent;
        s.status.job = Some(job(7, JobState::Completed, "x"));
    });
    // first the Address: hosted on the target (its main chassis), the source still bound
    // while its pod exists
    w.api.expect(steps(vec![
        observe(false),
        reads(),
        vec![
            Expect::get(ADDR),
            Expect::put(format!("{ADDR}?")).with(json!({
                "metadata": {"annotations": {"roam.dev/also-on": "node-a"}},
                "spec": {"host": "node-b"},
            })),
            status_patch(json!({"phase": "Switchover", "downtimeMs": 42})),
        ],
    ]));
    w.reconcile(&r).await;
    w.api.done().await;
    w.api.expect(steps(vec![
        observe(false),
        reads(),
        vec![
            Expect::patch(format!("{VMS}/demo/status?"))
                .with(json!({"status": {"node": "node-b", "pod": "mig-target"}})),
            Expect::delete(format!("{PODS}/demo-launcher?")),
            Expect::get(ADDR),
            Expect::put(format!("{ADDR}?")).with(json!({"spec": {"host": "node-b"}})),
            Expect::patch(format!("{VMS}/demo/status?")).with(json!({"status": {
                "migration": null, "phase": "Running", "node": "node-b", "pod": "mig-target"}})),
            status_patch(json!({"phase": "Succeeded", "downtimeMs": 42})),
        ],
    ]));
    w.reconcile(&r).await;
    w.api.done().await;
    assert!(
        !w.address()
            .metadata
            .annotations
            .unwrap_or_default()
            .contains_key("roam.dev/also-on")
    );
    w.api.events(&["MigrationSucceeded"]).await;

    // history: the VM no longer names it, the finalizer goes
    w.api.expect(Scenario::Steps(vec![
        Expect::get(format!("{MIGS}/mig")),
        Expect::get(format!("{VMS}/demo")),
        Expect::patch(format!("{MIGS}/mig?")).with(json!({"metadata": {"finalizers": []}})),
    ]));
    w.reconcile(&r).await;
    w.api.done().await;
    let v: VirtualMachine = w.api.get(&format!("{VMS}/demo")).unwrap();
    assert_eq!(v.status.unwrap().node.as_deref(), Some("node-b"));
}

#[tokio::test]
async fn a_migration_deleted_while_migrating_aborts_the_copy_and_rolls_back() {
    let w = world("node-b").await;
    let r = TestReconciler::new();
    w.to_migrating(&r).await;
    let mut m = w.mig();
    m.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        k8s_openapi::jiff::Timestamp::now(),
    ));
    w.api.put(&m);

    // the copy is stopped first; the phase stays until libvirt says it stopped
    w.source.take_calls();
    w.api.expect(steps(vec![
        observe(false),
        reads(),
        vec![status_patch(
            json!({"phase": "Migrating", "reason": "the migration was deleted"}),
        )],
    ]));
    w.reconcile(&r).await;
    w.api.done().await;
    assert!(
        w.source
            .take_calls()
            .contains(&"POST /v1/abort".to_string())
    );

    // aborted: the target pod goes, the port only on the source, the VM released, the
    // finalizer removed
    w.api.expect(steps(vec![
        observe(false),
        reads(),
        vec![
            Expect::delete(format!("{PODS}/mig-target?")),
            // the target is gone: the port only on the source
            Expect::get(ADDR),
            Expect::put(format!("{ADDR}?")).with(json!({"spec": {"host": "node-a"}})),
            // rolled back: read again, already so, not written
            Expect::get(ADDR),
            Expect::patch(format!("{VMS}/demo/status?")).with(json!({"status": {
                "migration": null, "phase": "Running", "node": "node-a", "pod": "demo-launcher"}})),
            status_patch(json!({"phase": "Aborted", "reason": "the migration was deleted"})),
            // on the resourceVersion the status write returned: accepted
            Expect::patch(format!("{MIGS}/mig?")).with(json!({"metadata": {"finalizers": []}})),
        ],
    ]));
    w.reconcile(&r).await;
    w.api.done().await;
    assert_eq!(w.phase(), Phase::Aborted);
    let also = w.address().metadata.annotations.unwrap_or_default();
    assert!(!also.contains_key("roam.dev/also-on"), "{also:?}");
    w.api.events(&["MigrationAborted"]).await;
}

#[tokio::test]
async fn a_migration_to_the_node_the_vm_runs_on_is_refused() {
    let w = world("node-a").await;
    let r = TestReconciler::new();
    w.api.expect(steps(vec![
        observe(true),
        vec![
            status_patch(json!({"phase": "Failed",
                                "reason": "the VM already runs on node-a; name another node"})),
            // nothing left to do: the finalizer goes in the same reconcile
            Expect::patch(format!("{MIGS}/mig?")).with(json!({"metadata": {"finalizers": []}})),
        ],
    ]));
    w.reconcile(&r).await;
    w.api.done().await;
    // the next reconcile (the status write's watch event) finds finished history
    w.api.expect(Scenario::Steps(vec![
        Expect::get(format!("{MIGS}/mig")),
        Expect::get(format!("{VMS}/demo")),
    ]));
    w.reconcile(&r).await;
    w.api.done().await;
    w.api.events(&["MigrationFailed"]).await;
    // nothing was asked of the shims
    assert!(w.source.take_calls().is_empty());
}

#[tokio::test]
async fn a_named_target_the_scheduler_would_not_use_is_refused() {
    let w = world("node-b").await;
    w.api.put(&cordoned("node-b", "127.0.0.2"));
    let r = TestReconciler::new();
    w.api.expect(steps(vec![
        observe(true),
        vec![
            Expect::get("/api/v1/nodes/node-b"),
            Expect::get("/api/v1/nodes?"),
            Expect::get(PODS_LIVE),
            status_patch(json!({"phase": "Failed",
                                "reason": "target node node-b cannot take the VM: cordoned \
                                           (spec.unschedulable); name another node or use \
                                           migrate-to=auto"})),
            Expect::patch(format!("{MIGS}/mig?")).with(json!({"metadata": {"finalizers": []}})),
        ],
    ]));
    w.reconcile(&r).await;
    w.api.done().await;
    w.api.events(&["MigrationFailed"]).await;
    // nothing created, nothing asked of the shims, the VM untouched
    assert!(
        w.api
            .get::<k8s_openapi::api::core::v1::Pod>(&format!("{PODS}/mig-target"))
            .is_none()
    );
    assert!(w.source.take_calls().is_empty());
    assert_eq!(w.address().spec.host.as_deref(), Some("node-a"));
}

#[tokio::test]
async fn a_restarted_controller_adopts_the_copy_in_flight_and_follows_its_events() {
    let w = world("node-b").await;
    let first = TestReconciler::new();
    w.to_migrating(&first).await;
    // the controller dies; as if it died before the job id was written
    drop(first);
    let mut m = w.mig();
    if let Some(st) = m.status.as_mut() {
        st.job_id = None;
    }
    w.api.put(&m);

    let second = TestReconciler::new();
    w.source.take_calls();
    w.api.expect(steps(vec![
        observe(false),
        reads(),
        vec![status_patch(json!({"phase": "Migrating", "jobId": 7}))],
    ]));
    w.reconcile(&second).await;
    w.api.done().await;
    // no second copy
    assert!(
        !w.source
            .take_calls()
            .contains(&"POST /v1/migrate".to_string())
    );

    // its switchover task follows the adopted job's events (the pause changes nothing in
    // the API: the port is multi-chassis)
    w.source.take_calls();
    w.api.expect(Scenario::Steps(vec![]));
    let seq = w.source.event(Lifecycle::SuspendedForMigration);
    w.source.handled(seq).await;
    w.api.done().await;
}

/// A pod a tenant made under the target's name before roam made its own: the migration
/// fails before any memory moves, its reason naming the pod; the VM stays where it runs;
/// roam deletes neither that pod nor the VM's own.
#[tokio::test]
async fn a_target_pod_roam_did_not_create_fails_the_migration_and_is_left_alone() {
    let w = world("node-b").await;
    let r = TestReconciler::new();
    let mut forged = pod("mig-target", "node-b", json!({"roam.dev/migration": "mig"}));
    forged.metadata.labels = Some([("roam.dev/launcher".to_string(), "true".to_string())].into());
    w.api.put(&forged);
    w.api.expect(Scenario::Free);
    for _ in 0..4 {
        w.reconcile(&r).await;
        if w.phase().is_terminal() {
            break;
        }
    }
    let bodies = w.api.done().await;
    let st = w.mig().status.unwrap_or_default();
    assert_eq!(st.phase, Phase::Failed, "{st:?}");
    let reason = st.reason.unwrap_or_default();
    assert!(
        reason.contains("mig-target") && reason.contains("did not create"),
        "{reason}"
    );
    assert!(
        !bodies.iter().any(|b| b["metadata"]["name"] == "mig-target"),
        "no target pod created over it"
    );
    for p in ["mig-target", "demo-launcher"] {
        assert!(
            w.api
                .get::<k8s_openapi::api::core::v1::Pod>(&format!("{PODS}/{p}"))
                .is_some(),
            "{p} is left alone"
        );
    }
    let v: VirtualMachine = w.api.get(&format!("{VMS}/demo")).unwrap();
    let vst = v.status.unwrap_or_default();
    assert_eq!(
        (vst.node.as_deref(), vst.pod.as_deref()),
        (Some("node-a"), Some("demo-launcher"))
    );
}

/// A target pod the namespace's ResourceQuota refuses (during a migration a VM has two
/// launcher pods): the migration fails with the quota's words; the VM stays where it runs.
#[tokio::test]
async fn a_target_pod_over_quota_fails_the_migration() {
    let w = world("node-b").await;
    let r = TestReconciler::new();
    w.api.refuse_creates(
        PODS,
        403,
        "pods \"mig-target\" is forbidden: exceeded quota: small, requested: requests.memory=448Mi, used: requests.memory=448Mi, limited: requests.memory=600Mi",
    );
    w.api.expect(Scenario::Free);
    for _ in 0..4 {
        w.reconcile(&r).await;
        if w.phase().is_terminal() {
            break;
        }
    }
    w.api.done().await;
    let st = w.mig().status.unwrap_or_default();
    assert_eq!(st.phase, Phase::Failed, "{st:?}");
    let reason = st.reason.unwrap_or_default();
    assert!(
        reason.contains("exceeded quota: small") && reason.contains("two launcher pods"),
        "{reason}"
    );
    let v: VirtualMachine = w.api.get(&format!("{VMS}/demo")).unwrap();
    assert_eq!(v.status.unwrap_or_default().node.as_deref(), Some("node-a"));
}
