//! The one writer of Address objects: the address allocator's. The pod and VM controllers'
//! claims, the operator's pools, reclaims and sweep, and a migration's moves all write
//! through here, and every write that succeeds goes into the index at once (the watch
//! confirms it later), so that the next decision sees it.

use std::sync::Arc;

use kube::api::{DeleteParams, PostParams, Preconditions};
use kube::{Api, ResourceExt};

use super::{Context, ovn};
use crate::error::{Error, Result};
use roam_api::{Address, AddressSpec};
use roam_core::claim::{ALSO_ON, also_on};

fn api(ctx: &Context) -> Api<Address> {
    Api::all(ctx.client.clone())
}

/// Create `a` (its creation is the lock on its IP: a 409 means the IP was taken); into the
/// index when it was.
pub(super) async fn create(ctx: &Context, a: &Address) -> kube::Result<Address> {
    let written = api(ctx).create(&PostParams::default(), a).await?;
    ctx.upsert(written.clone());
    Ok(written)
}

/// Replace `a` with its resourceVersion as precondition (a 409: someone was first); into
/// the index when it was written.
pub(super) async fn replace(ctx: &Context, a: &Address) -> kube::Result<Address> {
    let name = a.metadata.name.clone().unwrap_or_default();
    let written = api(ctx).replace(&name, &PostParams::default(), a).await?;
    ctx.upsert(written.clone());
    Ok(written)
}

/// Delete `a` if it is still the version seen (a 409 or 404: it changed or went meanwhile);
/// out of the index when it was.
pub(super) async fn delete(ctx: &Context, a: &Address) -> kube::Result<()> {
    let name = a.metadata.name.clone().unwrap_or_default();
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            resource_version: a.metadata.resource_version.clone(),
            uid: None,
        }),
        ..Default::default()
    };
    api(ctx).delete(&name, &dp).await?;
    ctx.index.lock().expect("index lock").remove(&name, None);
    Ok(())
}

/// Read Address `name` again (after a lost race) into the index: its current version, or
/// its absence.
pub(super) async fn refresh(ctx: &Context, name: &str) -> Result<()> {
    match api(ctx).get_opt(name).await? {
        Some(fresh) => {
            ctx.upsert(fresh);
        }
        None => {
            ctx.index.lock().expect("index lock").remove(name, None);
        }
    }
    Ok(())
}

/// Replace `a`'s spec with a resourceVersion precondition. `Ok(false)`: someone changed it
/// first, or it is gone (the caller decides again on fresh data).
pub(super) async fn write_spec(ctx: &Context, a: &Address, spec: AddressSpec) -> Result<bool> {
    let mut next = a.clone();
    next.spec = spec;
    match replace(ctx, &next).await {
        Ok(_) => Ok(true),
        Err(e) if Error::is_conflict(&e) || Error::is_not_found(&e) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Write `host` and `also-on` of a VM's Address `name` (resourceVersion precondition,
/// retried on fresh data); the index sees the move and the OVN syncer makes `host` the
/// ports' main chassis.
pub(super) async fn move_to(
    ctx: &Arc<Context>,
    name: &str,
    host: &str,
    also: &[&str],
) -> Result<()> {
    for _ in 0..8 {
        let mut a = api(ctx).get(name).await?;
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
        match replace(ctx, &a).await {
            Ok(w) => {
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
