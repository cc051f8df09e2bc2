//! The migration controller's writes: the VM's Addresses moved between nodes, the
//! migration's and the VM's status, the migration's finalizer.

use std::sync::Arc;

use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::json;

use crate::controller::{Context, ovn};
use crate::error::{Error, Result};
use roam_api::{Address, VirtualMachine, VirtualMachineMigration, VirtualMachineMigrationStatus};
use roam_core::claim::{ALSO_ON, also_on};
use roam_core::vm::Move;

use roam_contract::keys::MIGRATION_FINALIZER as FINALIZER;

/// Write `host` and `also-on` of the VM's Address (resourceVersion precondition, retried on
/// fresh data); the index sees the move and the OVN syncer makes `host` the ports' main
/// chassis.
pub(super) async fn move_address(
    ctx: &Arc<Context>,
    name: &str,
    host: &str,
    also: &[&str],
) -> Result<()> {
    let api: Api<Address> = Api::all(ctx.client.clone());
    for _ in 0..8 {
        let mut a = api.get(name).await?;
        let want_also: Vec<String> = also.iter().map(|s| s.to_string()).collect();
        if a.spec.host.as_deref() == Some(host) && also_on(&a) == want_also {
            ctx.upsert(a);
            return Ok(());
        }
        a.spec.host = Some(host.into());
        if want_also.is_empty() {
            a.annotations_mut().remove(ALSO_ON);
        } else {
            a.annotations_mut()
                .insert(ALSO_ON.into(), want_also.join(","));
        }
        match api.replace(name, &PostParams::default(), &a).await {
            Ok(w) => {
                ctx.upsert(w.clone());
                ovn::request(ctx, &w.spec.network);
                return Ok(());
            }
            Err(e) if Error::is_conflict(&e) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(Error::Conflict(format!(
        "address {name}: 8 writes in a row lost their race"
    )))
}

/// Write every [`Move`] of the VM's Addresses (see [`roam_core::vm::moves`]).
pub(super) async fn apply_moves(ctx: &Arc<Context>, ms: Vec<Move>) -> Result<()> {
    for m in ms {
        let also: Vec<&str> = m.also_on.iter().map(String::as_str).collect();
        move_address(ctx, &m.address, &m.host, &also).await?;
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
