//! The migration controller's writes: the VM's Addresses moved between nodes (through
//! [`addresses`], their one writer), the migration's and the VM's status, the migration's
//! finalizer.

use std::sync::Arc;

use serde_json::json;

use crate::controller::{Context, addresses, status};
use crate::error::{Error, Result};
use roam_api::{VirtualMachineMigration, VirtualMachineMigrationStatus};
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
    match status::migration(ctx, m, json!(st)).await {
        Ok(written) => {
            *m = written;
            Ok(())
        }
        Err(e) if Error::is_not_found(&e) => Ok(()),
        Err(e) => Err(e.into()),
    }
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
