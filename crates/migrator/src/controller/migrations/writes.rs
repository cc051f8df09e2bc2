//! The migration controller's writes: the VM's Addresses moved between nodes (through
//! [`addresses`], their one writer), the migration's and the VM's status, the migration's
//! finalizer.

use std::sync::Arc;

use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use serde_json::json;

use crate::controller::{Context, addresses};
use crate::error::{Error, Result};
use roam_api::{VirtualMachine, VirtualMachineMigration, VirtualMachineMigrationStatus};
use roam_core::vm::Move;

use roam_contract::keys::MIGRATION_FINALIZER as FINALIZER;

/// Write every [`Move`] of the VM's Addresses (see [`roam_core::vm::moves`]).
pub(super) async fn apply_moves(ctx: &Arc<Context>, ms: Vec<Move>) -> Result<()> {
    for m in ms {
        let also: Vec<&str> = m.also_on.iter().map(String::as_str).collect();
        addresses::move_to(ctx, &m.address, &m.host, &also).await?;
    }
    Ok(())
}

/// Write the migration's status; `m` becomes what was stored (a later write's
/// resourceVersion precondition holds).
pub(super) async fn patch_status(
    ctx: &Context,
    m: &mut VirtualMachineMigration,
    st: &VirtualMachineMigrationStatus,
) -> Result<()> {
    if m.status.as_ref() == Some(st) {
        return Ok(());
    }
    let api: Api<VirtualMachineMigration> =
        Api::namespaced(ctx.client.clone(), &m.namespace().unwrap_or_default());
    match api
        .patch_status(
            &m.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&json!({"status": st})),
        )
        .await
    {
        Ok(written) => {
            *m = written;
            Ok(())
        }
        Err(e) if Error::is_not_found(&e) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Merge `patch` into the VM's status.
pub(super) async fn patch_vm_status(
    ctx: &Context,
    vm: &VirtualMachine,
    patch: serde_json::Value,
) -> Result<()> {
    let api: Api<VirtualMachine> =
        Api::namespaced(ctx.client.clone(), &vm.namespace().unwrap_or_default());
    api.patch_status(
        &vm.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&json!({"status": patch})),
    )
    .await?;
    Ok(())
}

/// Add or remove the migration's finalizer (on the resourceVersion `m` holds); `m` becomes
/// what was stored. A migration already gone is fine.
pub(super) async fn set_finalizer(
    ctx: &Context,
    m: &mut VirtualMachineMigration,
    on: bool,
) -> Result<()> {
    match crate::controller::set_finalizer(&ctx.client, m, FINALIZER, on).await {
        Ok(Some(written)) => {
            *m = written;
            Ok(())
        }
        Ok(None) => Ok(()),
        Err(e) if Error::is_not_found(&e) => Ok(()),
        Err(e) => Err(e.into()),
    }
}
