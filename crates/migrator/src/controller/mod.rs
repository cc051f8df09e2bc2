//! The controllers of the address control plane, thin I/O around [`crate::core`]:
//!
//! - watches ([`watch`]) feed the [`index::Index`] with Addresses, Networks and Nodes;
//! - the network controller ([`networks`]) validates Networks (overlaps checked on a direct
//!   LIST), assigns the nodes' transit addresses and writes status conditions;
//! - the address operator ([`operator`]) keeps every node's warm pool, reclaims soft-deleted
//!   Addresses after their grace, soft-deletes Addresses whose workload is gone, and hands back
//!   double claims;
//! - the pod (sdn) controller ([`pods`]) claims or reuses a pod's Addresses, waits for their
//!   OVN ports, and publishes `roam.dev/addresses`;
//! - the OVN syncer ([`ovn`]) reconciles a Network's OVN topology, debounced and batched, and
//!   the route controller flips a moved Address's /32 first (fast path).

pub mod index;
pub mod leader;
pub mod metrics;
mod migrations;
mod networks;
mod operator;
mod ovn;
mod pods;
pub mod vms;
mod watch;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::Store;
use kube::{Resource, ResourceExt};
use roam_ovsdb::ReconnectingClient;
use tokio::sync::{Notify, mpsc};

use crate::api::Address;
use index::{Index, Moved};
use metrics::Metrics;

pub use roam_contract::keys::{ERROR_ANNOTATION, NETWORK_LABEL, POD_ANNOTATION};

/// What the controllers are told.
#[derive(Clone, Debug)]
pub struct Config {
    /// OVN northbound database, e.g. `tcp:127.0.0.1:6641`.
    pub nb: String,
    /// Only Networks matching this label selector are managed (all when `None`).
    pub network_selector: Option<String>,
    /// Only Nodes matching this label selector take part (all when `None`).
    pub node_selector: Option<String>,
    /// Only pods of this namespace are served (all when `None`).
    pub pod_namespace: Option<String>,
    /// Pods reconciled at once.
    pub concurrency: u16,
    /// Claims decided and written at once (0: as many as reconciles; roam-controller's
    /// default is 2). Few keep the API server's and the OVN syncer's queues short for the pods
    /// already claimed: in a burst a pod waits a little longer for its claim and, once it has
    /// it, is annotated sooner (1000 pods at once on the lab, debug build: 32 → 2 in flight
    /// took claim → annotation p99 from 549 to 161 ms and 81 → 67 pods/s).
    pub claims_in_flight: usize,
    /// How long the OVN syncer gathers requests before reconciling.
    pub ovn_debounce: Duration,
    /// How often soft deletes, double claims and OVN drift are checked.
    pub sweep_period: Duration,
    /// This instance's identity (Events' reporting instance).
    pub identity: String,
    /// Where Events about cluster-scoped objects (Networks, Addresses without a pod) are
    /// stored; an Address's Event goes to its pod's namespace (see [`crate::core::event`]).
    pub event_namespace: String,
    /// Launcher pods (VM controller).
    pub vm: vms::VmConfig,
}

/// An Address being written, shown to the OVN syncer as written until the guard drops (a
/// claim's port is programmed while its write is in flight; a switchover's route is moved
/// before its write): a reconcile in between plans with it instead of undoing it.
pub(crate) struct Tentative {
    ctx: Arc<Context>,
    name: String,
}

impl Tentative {
    /// Show `a` (as it is about to be written) to the syncer.
    pub(crate) fn show(ctx: &Arc<Context>, a: Address) -> Tentative {
        let name = a.metadata.name.clone().unwrap_or_default();
        ctx.tentative
            .lock()
            .expect("tentative lock")
            .insert(name.clone(), Arc::new(a));
        Tentative {
            ctx: ctx.clone(),
            name,
        }
    }
}

impl Drop for Tentative {
    fn drop(&mut self) {
        self.ctx
            .tentative
            .lock()
            .expect("tentative lock")
            .remove(&self.name);
    }
}

/// Shared by every controller.
pub struct Context {
    /// Kubernetes.
    pub client: kube::Client,
    /// Settings.
    pub config: Config,
    /// What the watches and our writes told us.
    pub index: Mutex<Index>,
    /// OVN northbound.
    pub nb: ReconnectingClient,
    /// Metrics.
    pub metrics: Metrics,
    recorder: Recorder,
    ovn: Mutex<HashMap<String, Arc<ovn::OvnSync>>>,
    /// Wakes the address operator (a node's pool ran dry, a Network changed).
    pub pool_kick: Notify,
    /// Wakes the network controller.
    pub network_kick: Notify,
    synced: Notify,
    flips: mpsc::UnboundedSender<Moved>,
    pods: Mutex<Option<Store<Pod>>>,
    /// The managed Networks' names (`None` until the Network watch has listed): the Address
    /// watch follows it.
    managed: tokio::sync::watch::Sender<Option<std::collections::BTreeSet<String>>>,
    /// Claims being written right now, by Address name: the OVN syncer programs their ports
    /// while the API write is in flight (see [`pods`]).
    tentative: Mutex<HashMap<String, Arc<Address>>>,
    /// When this process last wrote a claim (the on-demand refill waits for a quiet moment).
    last_claim: Mutex<Option<std::time::Instant>>,
    /// (network, IP) being claimed by a reconcile of this process right now.
    inflight: Mutex<std::collections::BTreeSet<(String, std::net::Ipv4Addr)>>,
    /// Bounds the claim writes in flight (`claims_in_flight`).
    pub(crate) claim_gate: Option<tokio::sync::Semaphore>,
}

impl Context {
    /// Record `a` (from a watch or our own write) and pass a host move on to the route
    /// controller.
    pub fn upsert(&self, a: Address) -> bool {
        let (changed, moved) = self.index.lock().expect("index lock").upsert(a);
        if let Some(m) = moved {
            let _ = self.flips.send(m);
        }
        changed
    }

    /// Wait until the Addresses, Networks and Nodes are listed.
    pub async fn wait_synced(&self) {
        loop {
            let notified = self.synced.notified();
            if self.index.lock().expect("index lock").is_synced() {
                return;
            }
            notified.await;
        }
    }

    /// Publish an Event (in the background: an Event is never worth delaying a claim).
    /// An Event about a cluster-scoped object is stored in the configured namespace.
    pub fn event(
        &self,
        reference: ObjectReference,
        warning: bool,
        reason: &str,
        action: &str,
        note: String,
    ) {
        self.event_about(reference, None, warning, reason, action, note)
    }

    /// Publish an Event about an Address: stored in the namespace of the pod that claimed
    /// it (its `roam.dev/pod`, also named as the related object), else in the configured one.
    pub fn address_event(
        &self,
        a: &Address,
        warning: bool,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let pod = a.annotations().get(POD_ANNOTATION).cloned();
        self.event_about(a.object_ref(&()), pod, warning, reason, action, note)
    }

    fn event_about(
        &self,
        mut reference: ObjectReference,
        related_pod: Option<String>,
        warning: bool,
        reason: &str,
        action: &str,
        note: String,
    ) {
        // 1.20 refuses an Event about an object without a namespace outside kube-system:
        // `regarding` names the namespace the Event is stored in
        let ns = crate::core::event::event_namespace(
            reference.namespace.as_deref(),
            related_pod.as_deref(),
            &self.config.event_namespace,
        );
        reference.namespace = Some(ns);
        let secondary =
            related_pod
                .as_deref()
                .and_then(|p| p.split_once('/'))
                .map(|(pns, name)| ObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    namespace: Some(pns.into()),
                    name: Some(name.into()),
                    ..Default::default()
                });
        let ev = new_event(warning, reason, action, note, secondary);
        let (recorder, metrics) = (self.recorder.clone(), self.metrics.clone());
        tokio::spawn(async move { publish(&recorder, &metrics, &ev, &reference).await });
    }

    /// Publish an Event about the namespaced object `reference` and wait for the answer (a
    /// failure is logged and counted, not returned): for an Event that must be stored before
    /// the write that follows it.
    pub(crate) async fn event_now(
        &self,
        reference: ObjectReference,
        warning: bool,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let ev = new_event(warning, reason, action, note, None);
        publish(&self.recorder, &self.metrics, &ev, &reference).await;
    }

    /// Record that a claim was written now.
    pub(crate) fn claimed_now(&self) {
        *self.last_claim.lock().expect("claim lock") = Some(std::time::Instant::now());
    }

    /// How long since the last claim this process wrote (`None`: none yet).
    pub(crate) fn since_last_claim(&self) -> Option<Duration> {
        self.last_claim
            .lock()
            .expect("claim lock")
            .map(|t| t.elapsed())
    }

    pub(crate) fn pod_store(&self) -> Option<Store<Pod>> {
        self.pods.lock().expect("pods lock").clone()
    }
}

fn new_event(
    warning: bool,
    reason: &str,
    action: &str,
    note: String,
    secondary: Option<ObjectReference>,
) -> Event {
    Event {
        type_: if warning {
            EventType::Warning
        } else {
            EventType::Normal
        },
        reason: reason.into(),
        note: Some(note.chars().take(1000).collect()),
        action: action.into(),
        secondary,
    }
}

async fn publish(recorder: &Recorder, metrics: &Metrics, ev: &Event, reference: &ObjectReference) {
    match recorder.publish(ev, reference).await {
        Ok(()) => metrics.count("k8s_events", "published"),
        Err(e) => {
            // visible: a missing RBAC verb or a refused Event must not go unnoticed
            tracing::warn!(error = %e, reason = %ev.reason, regarding = ?reference.name, "cannot publish an Event");
            metrics.count("k8s_events", "failed");
        }
    }
}

/// A crash point for the lab's fault tests: with `ROAM_FAILPOINT=<name>` in its
/// environment the process aborts at `name` — a controller killed at an instant no signal
/// sent from outside can hit. Unset (always, in production) it does nothing.
pub(crate) fn failpoint(name: &str) {
    if std::env::var("ROAM_FAILPOINT").is_ok_and(|v| v == name) {
        eprintln!("roam-controller: failpoint {name}: aborting");
        std::process::abort();
    }
}

/// Per-network address counts, for the metrics endpoint.
pub fn gauges(ctx: &Context) -> metrics::Gauges {
    let idx = ctx.index.lock().expect("index lock");
    idx.networks
        .keys()
        .map(|n| {
            let (f, c, d) = idx.counts(n);
            (n.clone(), f, c, d)
        })
        .collect()
}

/// Run every controller (and serve metrics on `metrics_listener`) until `stop` resolves or
/// a controller stops (it never should).
pub async fn run(
    client: kube::Client,
    config: Config,
    metrics_listener: Option<tokio::net::TcpListener>,
    stop: impl std::future::Future<Output = ()>,
) -> crate::Result<()> {
    let nb = ReconnectingClient::start(&config.nb, Default::default())?;
    let (flips_tx, flips_rx) = mpsc::unbounded_channel();
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "roam-controller".into(),
            instance: Some(config.identity.clone()),
        },
    );
    let claim_gate =
        (config.claims_in_flight > 0).then(|| tokio::sync::Semaphore::new(config.claims_in_flight));
    let ctx = Arc::new(Context {
        client,
        config,
        index: Mutex::new(Index::default()),
        nb,
        metrics: Metrics::default(),
        recorder,
        ovn: Mutex::new(HashMap::new()),
        pool_kick: Notify::new(),
        network_kick: Notify::new(),
        synced: Notify::new(),
        flips: flips_tx,
        pods: Mutex::new(None),
        managed: tokio::sync::watch::Sender::new(None),
        last_claim: Mutex::new(None),
        tentative: Mutex::new(HashMap::new()),
        inflight: Mutex::new(Default::default()),
        claim_gate,
    });
    let mut tasks = tokio::task::JoinSet::new();
    if let Some(listener) = metrics_listener {
        let c = ctx.clone();
        tasks.spawn(metrics::serve(listener, ctx.metrics.clone(), move || {
            gauges(&c)
        }));
    }
    tasks.spawn(watch::addresses(ctx.clone()));
    tasks.spawn(watch::networks(ctx.clone()));
    tasks.spawn(watch::nodes(ctx.clone()));
    tasks.spawn(networks::run(ctx.clone()));
    tasks.spawn(operator::run(ctx.clone()));
    tasks.spawn(ovn::resync(ctx.clone()));
    tasks.spawn(ovn::route_flips(ctx.clone(), flips_rx));
    tasks.spawn(pods::run(ctx.clone()));
    tasks.spawn(vms::run(ctx.clone()));
    tasks.spawn(migrations::run(ctx.clone()));
    tokio::select! {
        _ = stop => Ok(()),
        r = tasks.join_next() => Err(crate::Error::Stopped(format!("{r:?}"))),
    }
}
