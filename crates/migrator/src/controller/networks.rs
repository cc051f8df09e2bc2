//! The network controller: validates the Networks, refuses the younger of two overlapping
//! ones (checked on a direct LIST from the API server, never a cache, which may lag behind a
//! Network just created), gives every node of an overlay its transit address (kept in the
//! Network's status, written with a resourceVersion precondition so two controllers cannot
//! hand out different ones), and reports a `Ready` condition.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::Api;
use kube::Resource;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use super::{Context, NETWORK_LABEL, ovn};
use crate::error::{Error, Result};
use roam_api::{Address, Network, NetworkMode, TransitAddress};
use roam_core::network::{
    NetworkPlan, NetworkRange, assign_transit, in_use_changes, overlapping, validate_network,
};

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
    let ranges: Vec<NetworkRange> = all
        .items
        .iter()
        .filter_map(|n| {
            Some(NetworkRange {
                name: n.metadata.name.clone()?,
                created: n
                    .metadata
                    .creation_timestamp
                    .as_ref()
                    .map(|t| t.0.to_string())
                    .unwrap_or_default(),
                subnet: n
                    .spec
                    .subnet
                    .parse::<roam_dhcp_opts::Ipv4Net>()
                    .ok()?
                    .trunc(),
            })
        })
        .collect();
    let mut refused: BTreeMap<String, Error> = overlapping(&ranges)
        .into_iter()
        .map(|(name, e)| (name, e.into()))
        .collect();
    let mut plans = BTreeMap::new();
    for (name, obj) in &objects {
        let result = validate_network(name, &obj.spec)
            .map_err(Error::from)
            .and_then(|plan| match refused.remove(name) {
                Some(e) => Err(e),
                None => Ok(plan),
            });
        // an edit that held Addresses cannot follow is refused; the served spec stays
        let (result, in_use) = match result {
            Ok(plan) => {
                let (plan, refusal) = guard_in_use(ctx, name, obj, plan).await?;
                (Ok(plan), refusal)
            }
            Err(e) => (Err(e), None),
        };
        let result = match result {
            Ok(plan) if plan.mode == NetworkMode::Overlay => {
                let existing = obj
                    .status
                    .as_ref()
                    .map(|s| s.transit.clone())
                    .unwrap_or_default();
                match assign_transit(&plan, &existing, &nodes) {
                    Ok(Some(transit)) => {
                        write_transit(ctx, obj, transit).await?;
                        Ok(plan)
                    }
                    Ok(None) => Ok(plan),
                    Err(e) => Err(e.into()),
                }
            }
            other => other,
        };
        match (result, in_use) {
            (Ok(plan), Some(e)) => {
                tracing::warn!(network = %name, error = %e, "network edit refused; serving the previous spec");
                ctx.metrics.count("network_errors", e.reason());
                set_ready(ctx, obj, false, e.reason(), e.to_string()).await?;
                plans.insert(name.clone(), plan);
            }
            (Ok(plan), None) => {
                if obj.status.as_ref().and_then(|s| s.served.as_ref()) != Some(&obj.spec) {
                    write_served(ctx, obj).await?;
                }
                set_ready(
                    ctx,
                    obj,
                    true,
                    "Valid",
                    format!(
                        "{:?} network {} gateway {}, {} per node in the warm pool; {}",
                        plan.mode,
                        plan.subnet(),
                        plan.gateway(),
                        plan.pool_size,
                        plan.access.describe()
                    ),
                )
                .await?;
                plans.insert(name.clone(), plan);
            }
            // every refusal of roam-core's, bad input or a transit network that is full
            (Err(e), _) => {
                tracing::warn!(network = %name, error = %e, "network refused");
                ctx.metrics.count("network_errors", e.reason());
                set_ready(ctx, obj, false, e.reason(), e.to_string()).await?;
            }
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

/// `plan` (of the Network's spec) when it may be served, else the plan of the spec served
/// so far with the refusal to report: the edit changes what held Addresses depend on
/// ([`in_use_changes`]). The Addresses are counted on a direct LIST (authoritative, and the
/// cache may not hold a Network's Addresses yet after a restart).
async fn guard_in_use(
    ctx: &Context,
    name: &str,
    obj: &Network,
    plan: NetworkPlan,
) -> Result<(NetworkPlan, Option<Error>)> {
    let Some(served_spec) = obj.status.as_ref().and_then(|s| s.served.as_ref()) else {
        return Ok((plan, None));
    };
    if served_spec == &obj.spec {
        return Ok((plan, None));
    }
    // a served spec that no longer validates (a rule added since) cannot be kept
    let Ok(served) = validate_network(name, served_spec) else {
        return Ok((plan, None));
    };
    let fields = in_use_changes(&served, &plan);
    if fields.is_empty() {
        return Ok((plan, None));
    }
    let api: Api<Address> = Api::all(ctx.client.clone());
    let held = api
        .list(&ListParams::default().labels(&format!("{NETWORK_LABEL}={name}")))
        .await?
        .items
        .iter()
        .filter(|a| a.spec.reserved || a.spec.owner.is_some())
        .count();
    if held == 0 {
        return Ok((plan, None));
    }
    let refusal = Error::from(roam_core::Error::ImmutableWhileInUse {
        network: name.into(),
        fields: fields.join(", "),
        held,
    });
    // who may attach is nothing held Addresses depend on: the edit's rules apply at once
    let served = NetworkPlan {
        access: plan.access,
        ..served
    };
    Ok((served, Some(refusal)))
}

/// Record the Network's spec as the one served.
async fn write_served(ctx: &Context, obj: &Network) -> Result<()> {
    let api: Api<Network> = Api::all(ctx.client.clone());
    let name = obj.metadata.name.clone().unwrap_or_default();
    let written = api
        .patch_status(
            &name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": {"served": obj.spec}})),
        )
        .await?;
    ctx.index
        .lock()
        .expect("index lock")
        .network_objects
        .insert(name, Arc::new(written));
    Ok(())
}

async fn write_transit(ctx: &Context, obj: &Network, transit: Vec<TransitAddress>) -> Result<()> {
    let api: Api<Network> = Api::all(ctx.client.clone());
    let name = obj.metadata.name.clone().unwrap_or_default();
    let mut next = obj.clone();
    next.status.get_or_insert_with(Default::default).transit = transit;
    // resourceVersion precondition: a second controller that read the same version loses
    // and re-reads the winner's assignment
    match api
        .replace_status(&name, &PostParams::default(), &next)
        .await
    {
        Ok(written) => {
            tracing::info!(network = %name, "transit addresses assigned");
            ctx.index
                .lock()
                .expect("index lock")
                .network_objects
                .insert(name, Arc::new(written));
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
        last_transition_time: Time(k8s_openapi::jiff::Timestamp::now()),
    };
    let api: Api<Network> = Api::all(ctx.client.clone());
    let patch =
        json!({"status": {"conditions": [cond], "observedGeneration": obj.metadata.generation}});
    let written = api
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    ctx.index
        .lock()
        .expect("index lock")
        .network_objects
        .insert(name.clone(), Arc::new(written));
    ctx.event(obj.object_ref(&()), !ok, reason, "Validate", message);
    Ok(())
}
