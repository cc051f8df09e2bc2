//! The address operator: every node's warm pool (refilled every `refillPeriodSeconds` and on
//! demand), reclaim after the grace period, and the sweep that soft-deletes the Addresses of
//! workloads that are gone.
//!
//! Deletes are handled level-based, not from delete events: a claimed Address whose owner has
//! no live pod (by the pod cache) is confirmed against the API server (a direct GET or LIST)
//! and then soft-deleted. So a delete that happened while the controller was down, or
//! that a dropped watch missed, is found by the next sweep — nothing is lost on restart —
//! and no finalizer holds pods hostage when the controller is away.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::ListParams;
use kube::{Api, ResourceExt};

use super::{Context, POD_ANNOTATION, addresses, ovn, pods, status};
use crate::error::{Error, Result};
use roam_api::{Address, VirtualMachine};
use roam_contract::keys::VM_FINALIZER;
use roam_core::claim::{new_address, pool_address, soft_deleted};
use roam_core::pool::{duplicates, orphans, pool_actions};

pub(super) async fn run(ctx: Arc<Context>) {
    ctx.wait_synced().await;
    let mut last_refill = Instant::now() - Duration::from_secs(3600);
    // an on-demand refill waiting for the claims to pause
    let mut pending = false;
    let mut last_sweep = Instant::now() - Duration::from_secs(3600);
    loop {
        let period = {
            let idx = ctx.index.lock().expect("index lock");
            idx.networks
                .values()
                .map(|n| n.refill)
                .min()
                .unwrap_or(Duration::from_secs(30))
        };
        let wait = if pending {
            QUIET.min(ctx.config.sweep_period)
        } else {
            ctx.config.sweep_period
        };
        pending |= tokio::time::timeout(wait, ctx.wake.pool.notified())
            .await
            .is_ok();
        if (pending && quiet(&ctx)) || last_refill.elapsed() >= period {
            pending = false;
            last_refill = Instant::now();
            if let Err(e) = refill(&ctx).await {
                tracing::warn!(error = %e, "pool refill failed");
            }
        }
        if last_sweep.elapsed() < ctx.config.sweep_period {
            continue;
        }
        last_sweep = Instant::now();
        if let Err(e) = sweep(&ctx, Instant::now()).await {
            tracing::warn!(error = %e, "sweep failed");
        }
        write_counts(&ctx).await;
    }
}

/// How long the claims must have paused before an on-demand refill.
const QUIET: Duration = Duration::from_millis(300);

/// Whether no claim was written for [`QUIET`]. While pods keep coming, a claim on an empty
/// pool creates its Address directly (one write, like a pool claim), so refilling then would
/// only add writes — a pool Address is one create plus one update — and race the claims for
/// the same IPs: an on-demand refill waits until the burst is over (the periodic one does
/// not wait).
fn quiet(ctx: &Context) -> bool {
    ctx.pods.since_last_claim().is_none_or(|s| s >= QUIET)
}

/// Top up the pools, reclaim, remove strays: for every valid Network.
pub(super) async fn refill(ctx: &Arc<Context>) -> Result<()> {
    let now = SystemTime::now();
    let work: Vec<(
        roam_core::network::NetworkPlan,
        roam_core::pool::PoolActions,
        Vec<Arc<Address>>,
    )> = {
        let idx = ctx.index.lock().expect("index lock");
        let nodes: Vec<String> = idx.nodes.iter().cloned().collect();
        idx.networks
            .values()
            .map(|plan| {
                let addrs = idx.of_network(&plan.name);
                let refs: Vec<&Address> = addrs.iter().map(|a| &**a).collect();
                (
                    plan.clone(),
                    pool_actions(plan, &refs, &nodes, now),
                    addrs.clone(),
                )
            })
            .collect()
    };
    for (plan, actions, addrs) in work {
        let new: Vec<Address> = actions
            .create
            .iter()
            .map(|(node, ip, mac)| new_address(&plan, *ip, pool_address(&plan, *ip, *mac, node)))
            .collect();
        let created = futures::stream::iter(
            new.into_iter()
                .map(|a| async move { addresses::create(ctx, &a).await }),
        )
        .buffer_unordered(8)
        .collect::<Vec<_>>()
        .await;
        let mut n = 0;
        for r in created {
            match r {
                Ok(_) => n += 1,
                // the IP was taken meanwhile (a claim's create, another controller): next round
                Err(e) if Error::is_conflict(&e) => {}
                Err(e) => {
                    tracing::warn!(network = %plan.name, error = %e, "cannot create a pool address")
                }
            }
        }
        if n > 0 {
            tracing::info!(network = %plan.name, created = n, "pool refilled");
            ctx.metrics.count("pool_created", &plan.name);
        }
        let by_name: BTreeMap<String, &Arc<Address>> = addrs
            .iter()
            .filter_map(|a| Some((a.metadata.name.clone()?, a)))
            .collect();
        for name in actions.reclaim.iter().chain(&actions.stray) {
            let Some(a) = by_name.get(name) else { continue };
            match addresses::delete(ctx, a).await {
                Ok(()) => {
                    if actions.reclaim.contains(name) {
                        tracing::info!(address = %name, owner = ?a.spec.owner, "reclaimed after the grace period");
                        ctx.metrics.count("reclaims", &plan.name);
                        ctx.address_event(
                            a,
                            false,
                            "AddressReclaimed",
                            "Reclaim",
                            format!(
                                "{} of {} reclaimed: deleted {} s ago, grace {} s",
                                a.spec.ip,
                                a.spec.owner.as_deref().unwrap_or("?"),
                                roam_core::claim::deletion_time(&a.spec)
                                    .and_then(|t| SystemTime::now().duration_since(t).ok())
                                    .map(|d| d.as_secs())
                                    .unwrap_or(0),
                                plan.grace.as_secs()
                            ),
                        );
                    }
                }
                // changed meanwhile (its owner came back): keep it
                Err(e) if Error::is_conflict(&e) || Error::is_not_found(&e) => {}
                Err(e) => tracing::warn!(address = %name, error = %e, "cannot delete"),
            }
        }
    }
    Ok(())
}

/// Soft-delete the Addresses of workloads that are gone (still at `now` for a moment);
/// hand back double claims.
pub(super) async fn sweep(ctx: &Arc<Context>, now: Instant) -> Result<()> {
    let Some(store) = ctx.pods.store() else {
        return Ok(());
    };
    if store.wait_until_ready().await.is_err() {
        return Ok(());
    }
    let pods = store.state();
    let live: BTreeSet<String> = pods.iter().filter_map(|p| pods::live_owner(p)).collect();
    let (gone, doubles): (Vec<Arc<Address>>, Vec<Arc<Address>>) = {
        let idx = ctx.index.lock().expect("index lock");
        let mut gone = Vec::new();
        let mut doubles = Vec::new();
        for net in idx.networks.keys() {
            let addrs = idx.of_network(net);
            let refs: Vec<&Address> = addrs.iter().map(|a| &**a).collect();
            // only Addresses that have been still for a moment: a claim by another controller
            // for a pod our cache has not seen yet is not an orphan
            gone.extend(
                orphans(&refs, &live)
                    .into_iter()
                    .filter(|a| {
                        idx.still_for(a.metadata.name.as_deref().unwrap_or_default(), now)
                            > Duration::from_secs(2)
                    })
                    .map(|a| Arc::new(a.clone())),
            );
            doubles.extend(duplicates(&refs).into_iter().map(|a| Arc::new(a.clone())));
        }
        (gone, doubles)
    };
    // one Address that cannot be checked or written now (the API server, a namespace's
    // listing) does not hold back the others': it is retried at the next sweep
    let mut failed = None;
    for a in gone {
        match owner_alive(ctx, &a).await {
            Ok(true) => continue,
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(address = ?a.metadata.name, owner = ?a.spec.owner, error = %e, "cannot tell whether the owner lives: retried at the next sweep");
                failed = Some(e);
                continue;
            }
        }
        let spec = soft_deleted(&a.spec, Time(k8s_openapi::jiff::Timestamp::now()));
        let written = match addresses::write_spec(ctx, &a, spec).await {
            Ok(w) => w,
            Err(e) => {
                tracing::warn!(address = ?a.metadata.name, error = %e, "cannot soft-delete: retried at the next sweep");
                failed = Some(e);
                continue;
            }
        };
        if written {
            tracing::info!(address = ?a.metadata.name, owner = ?a.spec.owner, "workload gone: soft-deleted");
            ctx.metrics.count("soft_deletes", &a.spec.network);
            ctx.address_event(
                &a,
                false,
                "AddressReleased",
                "SoftDelete",
                format!(
                    "{} of {} kept for its owner during the grace period",
                    a.spec.ip,
                    a.spec.owner.as_deref().unwrap_or("?")
                ),
            );
            ovn::request(ctx, &a.spec.network);
        }
    }
    for a in doubles {
        let mut spec = a.spec.clone();
        spec.owner = None;
        spec.interface = None;
        spec.reserved = false;
        spec.deleted = false;
        spec.deletion_time = None;
        spec.dhcp = false;
        spec.service_class = None;
        if addresses::write_spec(ctx, &a, spec).await? {
            tracing::warn!(address = ?a.metadata.name, owner = ?a.spec.owner, "second claim of one interface handed back");
            ctx.metrics.count("double_claims", &a.spec.network);
            ovn::request(ctx, &a.spec.network);
        }
    }
    failed.map_or(Ok(()), Err)
}

/// Whether `a`'s owner has a live pod, asked of the API server (not the cache).
async fn owner_alive(ctx: &Context, a: &Address) -> Result<bool> {
    let Some(owner) = &a.spec.owner else {
        return Ok(false);
    };
    let pod = a
        .metadata
        .annotations
        .as_ref()
        .and_then(|m| m.get(POD_ANNOTATION))
        .and_then(|p| p.split_once('/'))
        .map(|(ns, n)| (ns.to_string(), n.to_string()));
    let namespace = match (&pod, owner.split_once('/')) {
        (_, Some((ns, _))) => ns.to_string(),
        (Some((ns, _)), None) => ns.clone(),
        // neither a VM owner nor a recorded pod: nothing to confirm against
        (None, None) => return Ok(false),
    };
    if let Some((ns, name)) = owner.split_once('/') {
        // a deleted VM is held until its teardown is done on every node (its finalizer):
        // until then a tap or OVS port of its address may still be on a node
        let vms: Api<VirtualMachine> = Api::namespaced(ctx.client.clone(), ns);
        if vms
            .get_opt(name)
            .await?
            .is_some_and(|v| v.finalizers().iter().any(|f| f == VM_FINALIZER))
        {
            return Ok(true);
        }
    }
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);
    let candidates: Vec<Pod> = if owner.contains('/') {
        api.list(&ListParams::default()).await?.items
    } else {
        let (_, name) = pod.expect("checked above");
        api.get_opt(&name).await?.into_iter().collect()
    };
    Ok(candidates
        .iter()
        .any(|p| pods::live_owner(p).as_deref() == Some(owner.as_str())))
}

/// Free / claimed / deleted counts into each Network's status (when they changed).
async fn write_counts(ctx: &Context) {
    let work: Vec<(String, (u32, u32, u32), bool)> = {
        let idx = ctx.index.lock().expect("index lock");
        idx.networks
            .keys()
            .map(|n| {
                let c = idx.counts(n);
                let same = idx
                    .network_objects
                    .get(n)
                    .and_then(|o| o.status.as_ref())
                    .is_some_and(|s| (s.free, s.claimed, s.deleted) == c);
                (n.clone(), c, same)
            })
            .collect()
    };
    for (name, (free, claimed, deleted), same) in work {
        if same {
            continue;
        }
        let counts = serde_json::json!({"free": free, "claimed": claimed, "deleted": deleted});
        if let Err(e) = status::network(ctx, &name, counts).await {
            tracing::debug!(network = %name, error = %e, "cannot write counts");
        }
    }
}
