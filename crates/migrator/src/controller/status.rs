//! The one writer of each kind's status: one merge-patch builder per kind, so that what a
//! status holds is written in one way. A VM's status is written by the VM controller and,
//! while a migration runs, by the migration controller (where the VM runs, its migration):
//! both through [`vm`]. A Network's by the network controller and the operator's counts,
//! through [`network`] (which keeps the index's copy current). A migration's through
//! [`migration`].
//!
//! Merge patches, not server-side apply. An apply sends every field its manager owns (one
//! left out is removed), so each write here would have to be the whole status built from
//! the cached object, which can lag this process's own last write by a watch event: a step
//! that writes `phase` would put back the `pod` the step before it just replaced. A merge
//! patch carries only what the decision changed, and each status field here has one writer,
//! so there is no other manager's field to keep. (1.20, the lab's API server, has apply in
//! beta; the argument holds on a current one.)

use std::sync::Arc;

use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};

use super::Context;
use crate::error::Result;
use roam_api::{Network, VirtualMachine, VirtualMachineMigration};

/// Merge `fields` into VM `vm`'s status.
pub(super) async fn vm(ctx: &Context, vm: &VirtualMachine, fields: Value) -> Result<()> {
    let api: Api<VirtualMachine> =
        Api::namespaced(ctx.client.clone(), &vm.namespace().unwrap_or_default());
    api.patch_status(
        &vm.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&json!({ "status": fields })),
    )
    .await?;
    Ok(())
}

/// Merge `fields` into Network `name`'s status; the index holds what was stored.
pub(super) async fn network(ctx: &Context, name: &str, fields: Value) -> kube::Result<Network> {
    let api: Api<Network> = Api::all(ctx.client.clone());
    let written = api
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(&json!({ "status": fields })),
        )
        .await?;
    remember(ctx, &written);
    Ok(written)
}

/// Replace Network `next`'s status, its resourceVersion the precondition (a 409: another
/// writer was first); the index holds what was stored.
pub(super) async fn network_replace(ctx: &Context, next: &Network) -> kube::Result<Network> {
    let api: Api<Network> = Api::all(ctx.client.clone());
    let written = api
        .replace_status(&next.name_any(), &PostParams::default(), next)
        .await?;
    remember(ctx, &written);
    Ok(written)
}

fn remember(ctx: &Context, n: &Network) {
    ctx.index
        .lock()
        .expect("index lock")
        .network_objects
        .insert(n.name_any(), Arc::new(n.clone()));
}

/// Merge `fields` into migration `m`'s status; what was stored.
pub(super) async fn migration(
    ctx: &Context,
    m: &VirtualMachineMigration,
    fields: Value,
) -> kube::Result<VirtualMachineMigration> {
    let api: Api<VirtualMachineMigration> =
        Api::namespaced(ctx.client.clone(), &m.namespace().unwrap_or_default());
    api.patch_status(
        &m.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&json!({ "status": fields })),
    )
    .await
}
