//! roam-controller's controllers, thin I/O around [`crate::core`]:
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
//!   the route controller flips a moved Address's /32 first (fast path);
//! - the VM controller ([`vms`]) gives a VirtualMachine its Addresses and OVN ports, then its
//!   launcher pod, and reports the VM's phase;
//! - the migration controller ([`migrations`]) drives a VirtualMachineMigration through
//!   [`roam_core::migration::step`];
//! - the node-certificate signer ([`certs`], with `--pki-namespace`) keeps the roam CA and
//!   signs the certificates nodes ask for with their own credential.
//!
//! A failed reconcile is retried per object with backoff ([`retry`]). The tests in `tests/`
//! run the reconcilers against the mock API server of `fixtures.rs`.

mod addresses;
pub mod certs;
#[cfg(test)]
mod fixtures;
pub mod health;
pub mod index;
mod launchers;
pub mod leader;
pub mod metrics;
pub mod metrics_auth;
mod migrations;
mod networks;
mod operator;
mod ovn;
mod pods;
mod retry;
mod status;
#[cfg(test)]
mod tests;
pub mod vms;
mod watch;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Resource, ResourceExt};
use roam_ovsdb::ReconnectingClient;
use tokio::sync::{Notify, mpsc};

use index::{Index, Moved};
use metrics::Metrics;
pub(crate) use ovn::Tentative;
use roam_api::Address;

pub use roam_contract::keys::{ERROR_ANNOTATION, NETWORK_LABEL, POD_ANNOTATION};

/// What the controllers are told.
#[derive(Clone, Debug)]
pub struct Config {
    /// OVN northbound database, e.g. `tcp:127.0.0.1:6641`.
    pub nb: String,
    /// OVN southbound database, read only for the switchover's figure (when the target
    /// chassis activated a migrated VM's ports); `None`: no figure.
    pub sb: Option<String>,
    /// What `ssl:` NB and SB endpoints present and trust (required for them).
    pub ovn_tls: Option<roam_ovsdb::TlsSettings>,
    /// Only Networks matching this label selector are managed (all when `None`).
    pub network_selector: Option<String>,
    /// Only Nodes matching this label selector take part (all when `None`).
    pub node_selector: Option<String>,
    /// Only pods of this namespace are served (all when `None`).
    pub pod_namespace: Option<String>,
    /// Only pods, VirtualMachines and migrations in namespaces whose labels match this
    /// selector are served (all when `None`); see [`Context::in_scope`].
    pub namespace_selector: Option<String>,
    /// Pods reconciled at once.
    pub concurrency: u16,
    /// Claims decided and written at once (0: as many as reconciles; roam-controller's
    /// default is 2). Few keep the API server's and the OVN syncer's queues short for the pods
    /// already claimed: in a burst a pod waits a little longer for its claim and, once it has
    /// it, is annotated sooner (the controller bench measures the trade-off).
    pub claims_in_flight: usize,
    /// How long the OVN syncer gathers requests before reconciling.
    pub ovn_debounce: Duration,
    /// How often soft deletes, double claims and OVN drift are checked.
    pub sweep_period: Duration,
    /// This instance's identity (Events' reporting instance).
    pub identity: String,
    /// Where Events about cluster-scoped objects (Networks, Addresses without a pod) are
    /// stored; an Address's Event goes to its pod's namespace (see [`roam_core::event`]).
    pub event_namespace: String,
    /// Where the VMs' shim token Secrets live: roam-controller's own namespace (the lease
    /// namespace, `roam-system` when installed), never the VMs'.
    pub secret_namespace: String,
    /// Launcher pods (VM controller).
    pub vm: crate::launcher::VmConfig,
    /// The node-certificate signer and the roam CA, when this controller is roam's signer.
    pub pki: Option<certs::PkiConfig>,
}

/// Wakes a controller's loop.
#[derive(Default)]
pub struct Wake {
    /// The address operator (a node's pool ran dry, a Network changed).
    pub pool: Notify,
    /// The network controller.
    pub network: Notify,
    /// Those waiting for the initial lists ([`Context::wait_synced`]).
    synced: Notify,
}

/// What the controllers share: the Kubernetes client, the settings, the index the watches
/// fill, the metrics and Events, and the services controllers ask of each other (the OVN
/// syncer, the pod controller's cache, the namespaces' answers, the shim client identity).
/// State one controller alone keeps lives in that controller's own context (the VM
/// controller's [`vms::Vms`]).
pub struct Context {
    /// Kubernetes.
    pub client: kube::Client,
    /// Settings.
    pub config: Config,
    /// What the watches and our writes told us.
    pub index: Mutex<Index>,
    /// Metrics.
    pub metrics: Metrics,
    recorder: Recorder,
    /// Wakes the operator's and the network controller's loops.
    pub wake: Wake,
    /// The OVN connections and syncers.
    ovn: ovn::State,
    /// The pod controller's cache and claims in flight (the operator reads them).
    pods: pods::State,
    /// The watches' state.
    watch: watch::State,
    /// roam-controller's client certificate for the node API (with `--node-pki-dir`): the
    /// VM and the migration controllers talk to shims.
    pub node_identity: certs::ControllerIdentity,
    /// Namespaces' scope and labels, read at most once per [`SCOPE_TTL`].
    namespaces: Namespaces,
}

/// What the API server said of namespaces, and when.
#[derive(Default)]
struct Namespaces {
    /// Answers to the namespace selector.
    scope: Mutex<std::collections::HashMap<String, (bool, std::time::Instant)>>,
    /// Labels (for the Networks' namespace selectors).
    labels: Mutex<std::collections::HashMap<String, (Labels, std::time::Instant)>>,
}

/// A namespace's labels.
type Labels = std::collections::BTreeMap<String, String>;

/// How long a namespace's answer to the namespace selector is trusted: a namespace
/// relabelled into (or out of) scope takes effect within this, at its objects' next event.
const SCOPE_TTL: Duration = Duration::from_secs(10);

impl Context {
    /// A context for `client`, `config` and the NB client `nb`, and the stream of host moves
    /// the index sees (for [`ovn::route_flips`]).
    pub fn new(
        client: kube::Client,
        config: Config,
        (nb, sb): (ReconnectingClient, Option<ReconnectingClient>),
        metrics: Metrics,
    ) -> (Arc<Context>, mpsc::UnboundedReceiver<Moved>) {
        let rows = Box::new(nb.clone());
        Context::with_rows(client, config, (nb, sb), metrics, rows)
    }

    /// [`Context::new`] with the OVN syncer's NB rows `rows` (the controller's tests record
    /// its transactions).
    pub(crate) fn with_rows(
        client: kube::Client,
        config: Config,
        (nb, sb): (ReconnectingClient, Option<ReconnectingClient>),
        metrics: Metrics,
        rows: Box<dyn ovn::Rows>,
    ) -> (Arc<Context>, mpsc::UnboundedReceiver<Moved>) {
        let (ovn, flips_rx) = ovn::State::new((nb, sb), rows);
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: "roam-controller".into(),
                instance: Some(config.identity.clone()),
            },
        );
        let pods = pods::State::new(config.claims_in_flight);
        let ctx = Context {
            client,
            config,
            index: Mutex::new(Index::default()),
            metrics,
            recorder,
            wake: Wake::default(),
            ovn,
            pods,
            watch: watch::State::default(),
            node_identity: certs::ControllerIdentity::default(),
            namespaces: Namespaces::default(),
        };
        (Arc::new(ctx), flips_rx)
    }

    /// Whether objects of namespace `ns` are ours to serve: always without a namespace
    /// selector; else whether the API server lists `ns` under the selector (asked once per
    /// [`SCOPE_TTL`] per namespace). Lets two roam-controllers share a cluster without
    /// touching each other's pods, VMs and migrations (with disjoint Network selectors).
    pub async fn in_scope(&self, ns: &str) -> Result<bool, kube::Error> {
        let Some(selector) = &self.config.namespace_selector else {
            return Ok(true);
        };
        if let Some((yes, at)) = self.namespaces.scope.lock().expect("scope lock").get(ns)
            && at.elapsed() < SCOPE_TTL
        {
            return Ok(*yes);
        }
        let api: kube::Api<k8s_openapi::api::core::v1::Namespace> =
            kube::Api::all(self.client.clone());
        let lp = kube::api::ListParams::default()
            .labels(selector)
            .fields(&format!("metadata.name={ns}"));
        let yes = api
            .list_metadata(&lp)
            .await?
            .items
            .iter()
            .any(|n| n.metadata.name.as_deref() == Some(ns));
        self.namespaces
            .scope
            .lock()
            .expect("scope lock")
            .insert(ns.to_string(), (yes, std::time::Instant::now()));
        Ok(yes)
    }

    /// The labels of namespace `ns` (none if it does not exist), read with a LIST by name
    /// (the permission `--namespace-selector` already needs) at most once per [`SCOPE_TTL`]:
    /// a namespace relabelled to match a Network's selector may attach within it.
    async fn namespace_labels(&self, ns: &str) -> Result<Labels, kube::Error> {
        if let Some((labels, at)) = self.namespaces.labels.lock().expect("labels lock").get(ns)
            && at.elapsed() < SCOPE_TTL
        {
            return Ok(labels.clone());
        }
        let api: kube::Api<k8s_openapi::api::core::v1::Namespace> =
            kube::Api::all(self.client.clone());
        let lp = kube::api::ListParams::default().fields(&format!("metadata.name={ns}"));
        let labels = api
            .list_metadata(&lp)
            .await?
            .items
            .into_iter()
            .find(|n| n.metadata.name.as_deref() == Some(ns))
            .and_then(|n| n.metadata.labels)
            .unwrap_or_default();
        self.namespaces
            .labels
            .lock()
            .expect("labels lock")
            .insert(ns.to_string(), (labels.clone(), std::time::Instant::now()));
        Ok(labels)
    }

    /// The names of the Networks of `plans` that admit namespace `ns` (its labels read only
    /// when a Network's selector decides): an interface that names no Network picks among
    /// these ([`roam_core::claim::resolve_for`]).
    pub(crate) async fn admitting(
        &self,
        ns: &str,
        plans: &[roam_core::network::NetworkPlan],
    ) -> crate::Result<std::collections::BTreeSet<String>> {
        let labels = if plans.iter().any(|p| p.access.needs_labels(ns)) {
            self.namespace_labels(ns).await?
        } else {
            Labels::new()
        };
        Ok(plans
            .iter()
            .filter(|p| p.access.admits(ns, &labels))
            .map(|p| p.name.clone())
            .collect())
    }

    /// Whether `owner`'s interfaces `resolved` may be given what they ask for, by their
    /// Networks' access rules ([`roam_core::claim::may_use`]): `workload` (`pod ns/name`,
    /// `virtual machine ns/name`) of namespace `ns`. The namespace's labels are read only
    /// when a Network's selector decides.
    pub(crate) async fn may_use(
        &self,
        workload: &str,
        ns: &str,
        owner: &str,
        resolved: &[roam_core::claim::Resolved<'_>],
    ) -> crate::Result<()> {
        let labels = if resolved.iter().any(|r| r.network.access.needs_labels(ns)) {
            self.namespace_labels(ns).await?
        } else {
            Labels::new()
        };
        let held: Vec<Arc<Address>> = {
            let idx = self.index.lock().expect("index lock");
            resolved
                .iter()
                .flat_map(|r| idx.of_network(&r.network.name))
                .filter(|a| a.spec.owner.as_deref() == Some(owner))
                .collect()
        };
        let specs: Vec<&roam_api::AddressSpec> = held.iter().map(|a| &a.spec).collect();
        Ok(roam_core::claim::may_use(
            workload, ns, &labels, owner, resolved, &specs,
        )?)
    }

    /// Record `a` (from a watch or our own write) and pass a host move on to the route
    /// controller.
    pub fn upsert(&self, a: Address) -> bool {
        let (changed, moved) = self.index.lock().expect("index lock").upsert(a);
        if let Some(m) = moved {
            self.ovn.flip(m);
        }
        changed
    }

    /// Wait until the Addresses, Networks and Nodes are listed.
    pub async fn wait_synced(&self) {
        loop {
            let notified = self.wake.synced.notified();
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
        let ns = roam_core::event::event_namespace(
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
/// Add (`on`) or remove `finalizer` on namespaced `obj`, with `obj`'s resourceVersion as
/// precondition (an object changed meanwhile is decided again on its next reconcile).
/// `Ok(None)`: it already was so, nothing written; `Ok(Some(_))`: what was stored.
pub(crate) async fn set_finalizer<K>(
    client: &kube::Client,
    obj: &K,
    finalizer: &str,
    on: bool,
) -> kube::Result<Option<K>>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned,
{
    let mut f: Vec<String> = obj.finalizers().to_vec();
    if f.iter().any(|x| x == finalizer) == on {
        return Ok(None);
    }
    if on {
        f.push(finalizer.into());
    } else {
        f.retain(|x| x != finalizer);
    }
    let api: kube::Api<K> =
        kube::Api::namespaced(client.clone(), &obj.namespace().unwrap_or_default());
    let patch = serde_json::json!({"metadata": {"finalizers": f, "resourceVersion": obj.resource_version()}});
    api.patch(
        &obj.name_any(),
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(&patch),
    )
    .await
    .map(Some)
}

/// The time to stamp a status condition with (roam-core's decisions take it as an
/// argument: they read no clock).
pub(crate) fn now() -> k8s_openapi::apimachinery::pkg::apis::meta::v1::Time {
    k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now())
}

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

/// What the process serves on its metrics address from the start, before it leads: the
/// metrics, the health checks, and the address gauges once the controllers run.
#[derive(Clone, Default)]
pub struct Served {
    /// The controllers' counters and histograms.
    pub metrics: Metrics,
    /// The readiness checks' results.
    pub health: Arc<health::Health>,
    ctx: Arc<std::sync::OnceLock<Arc<Context>>>,
}

impl Served {
    /// Serve `/metrics`, `/healthz` and `/readyz` on `listener`, and run the health checks
    /// against `client` and the NB at `nb`, until the task is dropped.
    pub async fn serve(
        self,
        listener: tokio::net::TcpListener,
        client: kube::Client,
        (nb, tls): (String, Option<roam_ovsdb::TlsSettings>),
        auth: metrics_auth::MetricsAuth,
    ) {
        let ctx = self.ctx.clone();
        let gauges = move || ctx.get().map(|c| gauges(c)).unwrap_or_default();
        tokio::join!(
            metrics::serve(listener, self.metrics, self.health.clone(), gauges, auth),
            health::probe(self.health, client, nb, tls),
        );
    }
}

/// Run every controller until `stop` resolves or a controller stops (it never should);
/// `served` gets the controllers' figures.
pub async fn run(
    client: kube::Client,
    config: Config,
    served: Served,
    stop: impl std::future::Future<Output = ()>,
) -> crate::Result<()> {
    let ovn = roam_ovsdb::ReconnectOptions {
        client: roam_ovsdb::ClientOptions {
            tls: config.ovn_tls.clone(),
            ..Default::default()
        },
        ..Default::default()
    };
    let nb = ReconnectingClient::start(&config.nb, ovn.clone())?;
    let sb = match &config.sb {
        Some(sb) => Some(ReconnectingClient::start(sb, ovn)?),
        None => None,
    };
    let (ctx, flips_rx) = Context::new(client, config, (nb, sb), served.metrics.clone());
    let _ = served.ctx.set(ctx.clone());
    served.health.set_leading();
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(watch::addresses(ctx.clone()));
    tasks.spawn(watch::networks(ctx.clone()));
    tasks.spawn(watch::nodes(ctx.clone()));
    tasks.spawn(networks::run(ctx.clone()));
    tasks.spawn(operator::run(ctx.clone()));
    tasks.spawn(ovn::resync(ctx.clone()));
    tasks.spawn(ovn::route_flips(ctx.clone(), flips_rx));
    tasks.spawn(pods::run(ctx.clone()));
    tasks.spawn(vms::run(vms::Vms::new(ctx.clone())));
    if ctx.config.vm.runners.is_some() {
        tasks.spawn(launchers::run(ctx.clone()));
    }
    tasks.spawn(migrations::run(ctx.clone()));
    if let Some(pki) = ctx.config.pki.clone() {
        tasks.spawn(certs::run(ctx.clone(), pki));
    }
    tokio::select! {
        _ = stop => Ok(()),
        r = tasks.join_next() => Err(crate::Error::Stopped(format!("{r:?}"))),
    }
}
