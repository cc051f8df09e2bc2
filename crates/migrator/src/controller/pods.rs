//! The pod (sdn) controller: a pod scheduled to a node (not host-network, not finished) gets,
//! per interface, its owner's Address again or a claimed one (resourceVersion preconditions,
//! decided again on conflict); then the Network's OVN ports are reconciled (batched, see
//! [`super::ovn`]); then `roam.dev/addresses` is written on the pod for the CNI.
//!
//! Bad input (a malformed `roam.dev/interfaces`, no matching Network, a Network that does not
//! admit the pod's namespace or the class it asks for, a static IP outside the subnet or
//! taken, an exhausted range) claims nothing for that pod: a Warning Event and the
//! `roam.dev/error` annotation say why (roam-cni fails the pod's ADD with it at once); other
//! pods are unaffected.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::{Action, Config as ControllerConfig};
use kube::runtime::reflector::Store;
use kube::runtime::{Controller, watcher};
use kube::{Api, Resource, ResourceExt};
use roam_contract::keys::ADDRESSES;
use serde_json::json;

use super::retry::{Retry, object_key};
use super::{Context, ERROR_ANNOTATION, POD_ANNOTATION, Tentative, addresses, ovn};
use crate::error::{Error, Result};
use roam_api::Address;
use roam_contract::owner::refs_of;
use roam_core::claim::{
    Resolved, Step, Write, decide, owner_key, publication, resolve_for, write_for,
};

/// The owner key of a pod that holds addresses now: scheduled, not host-network, not
/// finished. `None` for any other pod.
pub fn live_owner(p: &Pod) -> Option<String> {
    let spec = p.spec.as_ref()?;
    spec.node_name.as_ref()?;
    // a VM's launcher pod is host-network but holds its VM's address (the VM controller
    // claims it)
    if spec.host_network == Some(true) && !crate::launcher::is_launcher(p) {
        return None;
    }
    if let Some(phase) = p.status.as_ref().and_then(|s| s.phase.as_deref())
        && (phase == "Succeeded" || phase == "Failed")
    {
        return None;
    }
    let owners = refs_of(p.metadata.owner_references.as_ref());
    Some(owner_key(
        p.metadata.namespace.as_deref().unwrap_or_default(),
        p.metadata.name.as_deref().unwrap_or_default(),
        p.metadata.labels.as_ref().unwrap_or(&BTreeMap::new()),
        &owners,
    ))
}

/// The pod controller's state.
pub(crate) struct State {
    /// The pod watch's cache (once the controller runs).
    store: std::sync::Mutex<Option<Store<Pod>>>,
    /// When this process last wrote a claim (the on-demand refill waits for a quiet moment).
    last_claim: std::sync::Mutex<Option<Instant>>,
    /// (network, IP) being claimed by a reconcile of this process right now.
    inflight: std::sync::Mutex<BTreeSet<(String, Ipv4Addr)>>,
    /// Bounds the claim writes in flight (`claims_in_flight`; none when 0).
    gate: Option<tokio::sync::Semaphore>,
}

impl State {
    pub(crate) fn new(claims_in_flight: usize) -> State {
        State {
            store: Default::default(),
            last_claim: Default::default(),
            inflight: Default::default(),
            gate: (claims_in_flight > 0).then(|| tokio::sync::Semaphore::new(claims_in_flight)),
        }
    }

    /// Record that a claim was written now.
    pub(crate) fn claimed_now(&self) {
        *self.last_claim.lock().expect("claim lock") = Some(Instant::now());
    }

    /// How long since the last claim this process wrote (`None`: none yet).
    pub(crate) fn since_last_claim(&self) -> Option<Duration> {
        self.last_claim
            .lock()
            .expect("claim lock")
            .map(|t| t.elapsed())
    }

    /// The pod watch's cache, once the pod controller runs.
    /// The pod watch's cache, from now on.
    pub(crate) fn set_store(&self, store: Store<Pod>) {
        *self.store.lock().expect("pods lock") = Some(store);
    }

    pub(crate) fn store(&self) -> Option<Store<Pod>> {
        self.store.lock().expect("pods lock").clone()
    }
}

pub(super) async fn run(ctx: Arc<Context>) {
    let api: Api<Pod> = match &ctx.config.pod_namespace {
        Some(ns) => Api::namespaced(ctx.client.clone(), ns),
        None => Api::all(ctx.client.clone()),
    };
    let controller = Controller::new(api, watcher::Config::default())
        .with_config(ControllerConfig::default().concurrency(ctx.config.concurrency));
    ctx.pods.set_store(controller.store());
    let retry = Retry::new("pod_errors");
    let policy = retry.clone();
    controller
        .run(
            move |p, c| {
                let retry = retry.clone();
                async move { retry.outcome(&object_key(&*p), reconcile(p, c).await) }
            },
            move |p, e, c| policy.policy(&object_key(&*p), e, &c.metrics),
            ctx.clone(),
        )
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(error = %e, "pod reconcile");
            }
        })
        .await;
}

fn pod_key(p: &Pod) -> String {
    format!(
        "{}/{}",
        p.metadata.namespace.as_deref().unwrap_or_default(),
        p.metadata.name.as_deref().unwrap_or_default()
    )
}

pub(super) async fn reconcile(pod: Arc<Pod>, ctx: Arc<Context>) -> Result<Action> {
    let started = Instant::now();
    if !ctx
        .in_scope(pod.metadata.namespace.as_deref().unwrap_or_default())
        .await?
    {
        // another roam-controller's namespace (--namespace-selector)
        return Ok(Action::await_change());
    }
    let Some(owner) = live_owner(&pod) else {
        // not scheduled yet, host network, or finished (the sweep soft-deletes its address)
        return Ok(Action::await_change());
    };
    if crate::launcher::is_launcher(&pod) {
        // the VM controller claims a launcher pod's address before creating the pod
        return Ok(Action::await_change());
    }
    if pod.metadata.deletion_timestamp.is_some() {
        // still running while it terminates: its address stays until it is gone
        return Ok(Action::await_change());
    }
    let node = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default();
    let key = pod_key(&pod);
    ctx.wait_synced().await;
    let plans = ctx.index.lock().expect("index lock").plans();
    let annotations = pod.metadata.annotations.clone().unwrap_or_default();
    let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
    let admitting = ctx.admitting(ns, &plans).await?;
    let resolved = match resolve_for(&key, &annotations, &plans, &admitting) {
        Ok(r) => r,
        Err(e) => return report(&ctx, &pod, e.into()).await,
    };
    match ctx
        .may_use(&format!("pod {key}"), ns, &owner, &resolved)
        .await
    {
        Ok(()) => {}
        Err(e) if e.is_bad_input() => return report(&ctx, &pod, e).await,
        Err(e) => return Err(e),
    }
    let mut held: Vec<Arc<Address>> = Vec::new();
    let mut tickets: BTreeMap<String, u64> = BTreeMap::new();
    let mut claimed_at = Instant::now();
    for r in &resolved {
        match claim_pipelined(&ctx, &key, &owner, &node, r).await {
            Ok((a, ticket)) => {
                if let Some(t) = ticket {
                    tickets.insert(r.network.name.clone(), t);
                }
                held.push(a);
                claimed_at = Instant::now();
            }
            Err(e) if e.is_bad_input() => return report(&ctx, &pod, e).await,
            Err(e @ Error::HeldElsewhere { .. }) => {
                tracing::debug!(pod = %key, reason = %e, "waiting for the owner's other pod");
                return Ok(Action::requeue(Duration::from_millis(500)));
            }
            Err(e) => return Err(e),
        }
    }
    let refs: Vec<&Address> = held.iter().map(|a| &**a).collect();
    let Some((json, published)) = publication(&key, &node, &resolved, &refs, &annotations)? else {
        return Ok(Action::await_change());
    };
    // the OVN ports exist before the CNI is told to plumb them: a claim written now was
    // requested with its write (its ticket); an Address reused unchanged is requested here
    let networks: BTreeSet<&str> = resolved.iter().map(|r| r.network.name.as_str()).collect();
    for n in networks {
        if !tickets.contains_key(n) {
            tickets.insert(n.to_string(), ovn::request(&ctx, n));
        }
    }
    let waited = Instant::now();
    for (n, t) in &tickets {
        ovn::wait(&ctx, n, *t).await?;
    }
    ctx.metrics.ovn_wait(waited.elapsed());
    let api: Api<Pod> = Api::namespaced(
        ctx.client.clone(),
        pod.metadata.namespace.as_deref().unwrap_or_default(),
    );
    let patch = json!({"metadata": {"annotations": {ADDRESSES: json, ERROR_ANNOTATION: null}}});
    match api
        .patch(
            &pod.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await
    {
        Ok(_) => {}
        Err(e) if Error::is_not_found(&e) => return Ok(Action::await_change()),
        Err(e) => return Err(e.into()),
    }
    ctx.metrics.annotate_latency(started.elapsed());
    ctx.metrics.claimed_to_annotated(claimed_at.elapsed());
    let summary: Vec<String> = published
        .iter()
        .map(|p| {
            format!(
                "{} {}/{} {} ({})",
                p.name, p.ip, p.prefix_len, p.mac, p.address
            )
        })
        .collect();
    tracing::info!(pod = %key, %owner, %node, addresses = ?summary, took = ?started.elapsed(), "addresses published");
    // counted, not an Event: an Event per pod is one more API write on the claim's path
    // (Events are for failures, soft deletes and reclaims)
    ctx.metrics.count("pods_annotated", &node);
    Ok(Action::await_change())
}

/// Report bad input on the pod: a Warning Event and `roam.dev/error` (written once per
/// distinct message). Nothing was claimed.
async fn report(ctx: &Arc<Context>, pod: &Pod, e: Error) -> Result<Action> {
    let message = e.to_string();
    tracing::warn!(pod = %pod_key(pod), error = %message, "pod refused");
    ctx.metrics.count("pod_refused", e.reason());
    let current = pod.annotations().get(ERROR_ANNOTATION);
    if current != Some(&message) {
        let api: Api<Pod> = Api::namespaced(
            ctx.client.clone(),
            pod.metadata.namespace.as_deref().unwrap_or_default(),
        );
        let patch = json!({"metadata": {"annotations": {ERROR_ANNOTATION: message}}});
        match api
            .patch(
                &pod.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
        {
            Ok(_) => {}
            Err(k) if Error::is_not_found(&k) => return Ok(Action::await_change()),
            Err(k) => return Err(k.into()),
        }
        ctx.event(pod.object_ref(&()), true, e.reason(), "Claim", message);
    }
    // the pool, a Network or the namespace's labels may change: look again later; a fixed
    // annotation retriggers
    Ok(match e {
        Error::Core(e)
            if matches!(
                *e,
                roam_core::Error::Exhausted { .. }
                    | roam_core::Error::NoNetwork { .. }
                    | roam_core::Error::Taken { .. }
                    | roam_core::Error::NetworkNotAllowed { .. }
                    | roam_core::Error::ServiceClassNotAllowed { .. }
            ) =>
        {
            Action::requeue(Duration::from_secs(10))
        }
        _ => Action::await_change(),
    })
}

/// The other live pod of `owner` that holds `a` on another node (a migration's source), if
/// any: the address stays there until that pod is gone.
fn holder_elsewhere(
    ctx: &Context,
    a: &Address,
    pod: &str,
    owner: &str,
    node: &str,
) -> Option<String> {
    if a.spec.deleted || a.spec.host.as_deref() == Some(node) || !a.spec.reserved {
        return None;
    }
    let holder = a.annotations().get(POD_ANNOTATION)?.clone();
    if holder == pod {
        return None;
    }
    let (ns, name) = holder.split_once('/')?;
    let store = ctx.pods.store()?;
    let p = store.get(&kube::runtime::reflector::ObjectRef::new(name).within(ns))?;
    (live_owner(&p).as_deref() == Some(owner) && p.metadata.deletion_timestamp.is_none())
        .then_some(holder)
}

/// An IP being claimed by this process; released when the attempt ends.
struct Inflight {
    ctx: Arc<Context>,
    key: (String, Ipv4Addr),
}

impl Drop for Inflight {
    fn drop(&mut self) {
        self.ctx
            .pods
            .inflight
            .lock()
            .expect("inflight lock")
            .remove(&self.key);
    }
}

/// Claim or reuse the Address of one interface.
pub(super) async fn claim(
    ctx: &Arc<Context>,
    pod: &str,
    owner: &str,
    node: &str,
    r: &Resolved<'_>,
) -> Result<Arc<Address>> {
    Ok(claim_pipelined(ctx, pod, owner, node, r).await?.0)
}

/// Claim or reuse the Address of one interface; when a claim is written, its OVN port is
/// requested at the same time (the syncer programs it while the API write is in flight) and
/// the ticket to [`ovn::wait`] for is returned. A write that loses its race leaves a port
/// nobody wants: the next sync (a full reconcile) removes it.
async fn claim_pipelined(
    ctx: &Arc<Context>,
    pod: &str,
    owner: &str,
    node: &str,
    r: &Resolved<'_>,
) -> Result<(Arc<Address>, Option<u64>)> {
    let mut skip: BTreeSet<Ipv4Addr> = BTreeSet::new();
    // at most `claims_in_flight` claims are decided and written at once (see Config)
    let _gate = match &ctx.pods.gate {
        Some(g) => Some(g.acquire().await.expect("the claim gate is never closed")),
        None => None,
    };
    for _ in 0..32 {
        let started = Instant::now();
        let (step, current, _held) = {
            let idx = ctx.index.lock().expect("index lock");
            let addrs = idx.of_network(&r.network.name);
            let refs: Vec<&Address> = addrs.iter().map(|a| &**a).collect();
            let mut inflight = ctx.pods.inflight.lock().expect("inflight lock");
            // IPs other reconciles of this process are claiming right now: pick another
            // rather than lose a certain race
            let mut avoid = skip.clone();
            avoid.extend(
                inflight
                    .iter()
                    .filter(|(n, _)| *n == r.network.name)
                    .map(|(_, ip)| *ip),
            );
            let step = decide(pod, owner, node, r, &refs, &avoid)?;
            let current = match &step {
                Step::Reuse { name } | Step::Claim { name } => idx.address(name),
                Step::Create { .. } => None,
            };
            let ip = match &step {
                Step::Claim { .. } => current.as_ref().and_then(|c| c.spec.ip.parse().ok()),
                Step::Create { ip, .. } => Some(*ip),
                Step::Reuse { .. } => None,
            };
            let held = ip.map(|ip| {
                inflight.insert((r.network.name.clone(), ip));
                Inflight {
                    ctx: ctx.clone(),
                    key: (r.network.name.clone(), ip),
                }
            });
            (step, current, held)
        };
        if let (Step::Reuse { name }, Some(cur)) = (&step, &current)
            && let Some(holder) = holder_elsewhere(ctx, cur, pod, owner, node)
        {
            return Err(Error::HeldElsewhere {
                pod: pod.into(),
                address: name.clone(),
                holder,
                host: cur.spec.host.clone().unwrap_or_default(),
            });
        }
        // an Address moving to this node (its owner came back elsewhere) is not shown to the
        // OVN syncer before its write succeeds: its port must follow the written host, never
        // a claim that may still lose its race
        let (obj, moving) = match write_for(&step, current.as_deref(), pod, owner, node, r) {
            Some(Write::Nothing) => return Ok((current.expect("a reuse"), None)),
            Some(Write::Replace { address, moving }) => (*address, moving),
            Some(Write::Create(address)) => (*address, false),
            // gone from the index meanwhile: decide again
            None => continue,
        };
        let name = obj.metadata.name.clone().unwrap_or_default();
        let ip: Option<Ipv4Addr> = obj.spec.ip.parse().ok();
        let tentative = (!moving).then(|| Tentative::show(ctx, obj.clone()));
        let early = (!moving).then(|| ovn::request(ctx, &r.network.name));
        let result = match step {
            // into the index as it is written, before it leaves the tentative claims: the
            // syncer always sees it
            Step::Create { .. } => addresses::create(ctx, &obj).await,
            _ => addresses::replace(ctx, &obj).await,
        };
        match result {
            Ok(written) => {
                ctx.metrics.claim_latency(started.elapsed());
                let kind = match step {
                    Step::Reuse { .. } => "reuse",
                    Step::Claim { .. } => "pool",
                    Step::Create { .. } => "create",
                };
                ctx.metrics.count("claims", kind);
                ctx.pods.claimed_now();
                if kind == "create" {
                    // the node's pool ran dry: refill it now, not at the next period
                    ctx.wake.pool.notify_one();
                }
                drop(tentative);
                let ticket = early.unwrap_or_else(|| ovn::request(ctx, &r.network.name));
                return Ok((Arc::new(written), Some(ticket)));
            }
            Err(e) if Error::is_conflict(&e) => {
                // someone was first: look at the object again and decide again
                if !matches!(step, Step::Reuse { .. })
                    && let Some(ip) = ip
                {
                    skip.insert(ip);
                }
                addresses::refresh(ctx, &name).await?;
            }
            Err(e) if Error::is_not_found(&e) => {
                ctx.index.lock().expect("index lock").remove(&name, None);
            }
            Err(e) => return Err(e.into()),
        }
    }
    Err(Error::Conflict(format!(
        "{pod}: 32 claims in a row lost their race"
    )))
}
