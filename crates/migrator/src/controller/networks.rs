//! The network controller: validates the Networks, refuses the younger of two overlapping
//! ones (checked on a direct LIST from the API server, never a cache, which may lag behind a
//! Network just created), gives every node of an overlay its transit address (kept in the
//! Network's status, written with a resourceVersion precondition so two controllers cannot
//! hand out different ones), and reports a `Ready` condition.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::Api;
use kube::Resource;
use kube::api::ListParams;
use serde_json::json;

use super::{Context, NETWORK_LABEL, now, ovn, status};
use crate::error::{Error, Result};
use roam_api::{Address, Network, TransitAddress};
use roam_core::network::{NetworkRange, decide, overlapping};

pub(super) async fn run(ctx: Arc<Context>) {
    loop {
        let _ = tokio::time::timeout(Duration::from_secs(30), ctx.wake.network.notified()).await;
        // gather a burst of changes into one pass
        tokio::time::sleep(Duration::from_millis(50)).await;
        if let Err(e) = pass(&ctx).await {
            tracing::warn!(error = %e, "network pass failed; retrying");
            tokio::time::sleep(Duration::from_millis(500)).await;
            ctx.wake.network.notify_one();
        }
    }
}

pub(super) async fn pass(ctx: &Arc<Context>) -> Result<()> {
    let (objects, nodes, ready) = {
        let idx = ctx.index.lock().expect("index lock");
        (
            idx.network_objects.clone(),
            idx.nodes.iter().cloned().collect::<Vec<_>>(),
            idx.networks_listed && idx.synced[2],
        )
    };
    if !ready {
        return Ok(());
    }
    let api: Api<Network> = Api::all(ctx.client.clone());
    let all = api.list(&ListParams::default()).await?;
    // overlaps are judged on a direct LIST, never the watch's cache
    let ranges: Vec<NetworkRange> = all.items.iter().filter_map(NetworkRange::of).collect();
    let mut overlaps: BTreeMap<String, roam_core::Error> =
        overlapping(&ranges).into_iter().collect();
    let mut plans = BTreeMap::new();
    for (name, obj) in &objects {
        let held = if decide::counts_held(name, &obj.spec, obj.status.as_ref()) {
            held_addresses(ctx, name).await?
        } else {
            0
        };
        let d = decide::decide(decide::View {
            name,
            spec: &obj.spec,
            status: obj.status.as_ref(),
            overlap: overlaps.remove(name.as_str()),
            held,
            nodes: &nodes,
        });
        if let Some(transit) = d.transit {
            write_transit(ctx, obj, transit).await?;
        }
        if d.record_served {
            write_served(ctx, obj).await?;
        }
        if !d.ready.ok {
            tracing::warn!(network = %name, error = %d.ready.message, served = d.serve.is_some(), "network refused");
            ctx.metrics.count("network_errors", d.ready.reason);
        }
        set_ready(ctx, obj, d.ready.ok, d.ready.reason, d.ready.message).await?;
        if let Some(plan) = d.serve {
            plans.insert(name.clone(), plan);
        }
    }
    let before: BTreeSet<String> = ctx
        .index
        .lock()
        .expect("index lock")
        .networks
        .keys()
        .cloned()
        .collect();
    for gone in before.iter().filter(|n| !objects.contains_key(*n)) {
        // the Network object is gone: its OVN rows go too (its Addresses stay, harmless)
        ovn::remove(ctx, gone).await;
    }
    let names: Vec<String> = plans.keys().cloned().collect();
    ctx.index.lock().expect("index lock").networks = plans;
    super::watch::mark_synced(ctx, 1);
    ctx.wake.pool.notify_one();
    for n in names {
        ovn::request(ctx, &n);
    }
    Ok(())
}

/// How many of Network `name`'s Addresses a workload holds, counted on a direct LIST
/// (authoritative: the cache may not hold a Network's Addresses yet after a restart).
async fn held_addresses(ctx: &Context, name: &str) -> Result<usize> {
    let api: Api<Address> = Api::all(ctx.client.clone());
    Ok(api
        .list(&ListParams::default().labels(&format!("{NETWORK_LABEL}={name}")))
        .await?
        .items
        .iter()
        .filter(|a| a.spec.reserved || a.spec.owner.is_some())
        .count())
}

/// Record the Network's spec as the one served.
async fn write_served(ctx: &Context, obj: &Network) -> Result<()> {
    let name = obj.metadata.name.clone().unwrap_or_default();
    status::network(ctx, &name, json!({"served": obj.spec})).await?;
    Ok(())
}

async fn write_transit(ctx: &Context, obj: &Network, transit: Vec<TransitAddress>) -> Result<()> {
    let name = obj.metadata.name.clone().unwrap_or_default();
    let mut next = obj.clone();
    next.status.get_or_insert_with(Default::default).transit = transit;
    // resourceVersion precondition: a second controller that read the same version loses
    // and re-reads the winner's assignment
    match status::network_replace(ctx, &next).await {
        Ok(_) => {
            tracing::info!(network = %name, "transit addresses assigned");
            Ok(())
        }
        Err(e) if Error::is_conflict(&e) => Err(Error::Conflict(format!("Network {name} status"))),
        Err(e) => Err(e.into()),
    }
}

async fn set_ready(
    ctx: &Context,
    obj: &Network,
    ok: bool,
    reason: &str,
    message: String,
) -> Result<()> {
    let status = if ok { "True" } else { "False" };
    let current = obj
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"));
    if current.is_some_and(|c| {
        c.status == status
            && c.reason == reason
            && c.message == message
            && c.observed_generation == obj.metadata.generation
    }) {
        return Ok(());
    }
    let name = obj.metadata.name.clone().unwrap_or_default();
    let cond = Condition {
        type_: "Ready".into(),
        status: status.into(),
        reason: reason.into(),
        message: message.clone(),
        observed_generation: obj.metadata.generation,
        last_transition_time: now(),
    };
    let fields = json!({"conditions": [cond], "observedGeneration": obj.metadata.generation});
    status::network(ctx, &name, fields).await?;
    ctx.event(obj.object_ref(&()), !ok, reason, "Validate", message);
    Ok(())
}
