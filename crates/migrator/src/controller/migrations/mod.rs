//! The migration controller: thin I/O around [`roam_core::migration`]. Each reconcile
//! fetches the migration and its VM, observes ([`run::Run::observe`]: the launcher pods, the
//! shims' view of the guest and of libvirt's job, where the Addresses point), steps, acts
//! (every action idempotent) and writes status. Background [`tasks`] have the target
//! announce the guest's NICs the moment the source pauses (OVN activates its ports there)
//! and wake the reconcile when there is news.

mod run;
mod tasks;
mod writes;

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

use crate::controller::{now, status};
use kube::runtime::controller::{Action as KAction, Config as ControllerConfig};
use kube::runtime::{Controller, watcher};
use kube::{Api, Resource, ResourceExt};
use serde_json::json;

use super::retry::Retry;
use super::{Context, vms};
use crate::error::Result;
use roam_api::{VirtualMachine, VirtualMachineMigration, VirtualMachineMigrationStatus, VmPhase};
use roam_core::migration::validate::{accept, target_not_ready, target_unfit};
use roam_core::migration::{Decision, Observed, Phase, end, step};
use roam_core::placement;
use run::Run;
use tasks::Local;
use writes::{patch_status, set_finalizer};

pub(super) async fn run(ctx: Arc<Context>) {
    let api: Api<VirtualMachineMigration> = match &ctx.config.pod_namespace {
        Some(ns) => Api::namespaced(ctx.client.clone(), ns),
        None => Api::all(ctx.client.clone()),
    };
    let (local, kicked) = Local::new();
    let retry = Retry::new("migration_errors");
    let policy = retry.clone();
    Controller::new(api, watcher::Config::default())
        .with_config(ControllerConfig::default().concurrency(ctx.config.concurrency))
        .reconcile_on(kicked)
        .run(
            move |m, c| {
                let (local, retry) = (local.clone(), retry.clone());
                async move { retry.outcome(&key_of(&m), reconcile(m, c, local).await) }
            },
            move |m, e, c| policy.policy(&key_of(&m), e, &c.metrics),
            ctx.clone(),
        )
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(error = %e, "migration reconcile");
            }
        })
        .await;
}

fn now_micro() -> MicroTime {
    MicroTime(k8s_openapi::jiff::Timestamp::now())
}

/// `namespace/name`.
fn key_of(m: &VirtualMachineMigration) -> String {
    format!("{}/{}", m.namespace().unwrap_or_default(), m.name_any())
}

/// Whether the VM's status names `m` as its migration.
fn names(vm: Option<&VirtualMachine>, m: &VirtualMachineMigration) -> bool {
    vm.and_then(|v| v.status.as_ref())
        .and_then(|s| s.migration.as_deref())
        == Some(m.name_any().as_str())
}

async fn reconcile(
    m: Arc<VirtualMachineMigration>,
    ctx: Arc<Context>,
    local: Local,
) -> Result<KAction> {
    let (ns, key) = (m.namespace().unwrap_or_default(), key_of(&m));
    if !ctx.in_scope(&ns).await? {
        // another roam-controller's namespace (--namespace-selector)
        return Ok(KAction::await_change());
    }
    ctx.wait_synced().await;
    // decide on the object as it is now, not on a cached copy older than our last write
    let api: Api<VirtualMachineMigration> = Api::namespaced(ctx.client.clone(), &ns);
    let Some(mut m) = api.get_opt(&m.name_any()).await? else {
        local.stop_all(&key);
        return Ok(KAction::await_change());
    };
    let mut st = m.status.clone().unwrap_or_default();
    let deleted = m.metadata.deletion_timestamp.is_some();
    if st.phase.is_terminal() {
        local.stop_all(&key);
        if deleted {
            return finalized(&ctx, &mut m).await;
        }
    } else if !deleted {
        set_finalizer(&ctx, &mut m, true).await?;
    }
    let vms_api: Api<VirtualMachine> = Api::namespaced(ctx.client.clone(), &ns);
    let mut vm = vms_api.get_opt(&m.spec.vm).await?;
    // A finished migration the VM no longer names is history (its outcome is recorded, or a
    // newer migration moved the VM since): settling it again would pull the address back.
    if st.phase.is_terminal() && !names(vm.as_ref(), &m) {
        return finalized(&ctx, &mut m).await;
    }
    let refused = match st.phase {
        Phase::Pending => check(&ctx, &m, vm.as_ref(), &mut st).await?,
        _ => None,
    };
    let (source, target) = match (&vm, refused, &st.source_node, &st.target_node) {
        (Some(_), None, Some(s), Some(t)) => (s.clone(), t.clone()),
        (_, refused, ..) => {
            let why = refused.unwrap_or_else(|| match vm {
                None => "the VirtualMachine is gone".into(),
                Some(_) => "no source or target node".into(),
            });
            let d = step(st.phase, &Observed::refused(why));
            return record(&ctx, &local, &mut m, vm.as_ref(), st, &d).await;
        }
    };
    let mut vm = vm.take().expect("matched above");
    if !st.phase.is_terminal() && !deleted && !names(Some(&vm), &m) {
        // claim the VM for this migration
        status::vm(
            &ctx,
            &vm,
            json!({"migration": m.name_any(), "phase": VmPhase::Migrating}),
        )
        .await?;
        vm.status.get_or_insert_default().migration = Some(m.name_any());
    }
    let mut run = Run::new(&ctx, &local, &m, &vm, (source, target), &mut st).await?;
    let o = run.observe(&m, &mut st, deleted).await?;
    let d = step(st.phase, &o);
    tracing::debug!(migration = %key, ?o, ?d, "step");
    run.watch_running_job(&m, &o).await?;
    for a in &d.actions {
        run.act(a, &o, &mut m, &mut st).await?;
    }
    run.follow(&m, &d, &o).await?;
    record(&ctx, &local, &mut m, Some(&vm), st, &d).await
}

/// Pending: check the spec against the VM and the target node, and record source and
/// target. `Some(why)`: refused.
async fn check(
    ctx: &Context,
    m: &VirtualMachineMigration,
    vm: Option<&VirtualMachine>,
    st: &mut VirtualMachineMigrationStatus,
) -> Result<Option<String>> {
    st.start_time.get_or_insert_with(now);
    let t = match accept(m, vm, st) {
        Err(why) => return Ok(Some(why)),
        Ok(t) => t,
    };
    if vms::ready_node_ip(ctx, &t).await?.is_none() {
        return Ok(Some(target_not_ready(&t)));
    }
    // a named target, too, must take the VM's launcher pod as the scheduler would place it:
    // not cordoned, its taints tolerated, the VM's node selector, the memory
    let vm = vm.expect("accept refuses a migration without its VM");
    // a disk on a volume does not move: only a claim both nodes can mount lets the VM go
    if let Some((name, claim)) = vms::boot_claim(ctx, vm).await?
        && let Some(why) = roam_core::vm::volume::blocks_migration(&name, claim.as_ref())
    {
        return Ok(Some(why));
    }
    let facts = vms::node_facts(ctx).await?;
    Ok(facts
        .iter()
        .find(|n| n.name == t)
        .and_then(|n| placement::unfit(n, &vms::need_of(ctx, vm)))
        .map(|why| target_unfit(&t, &why)))
}

/// A migration that is over: its finalizer goes.
async fn finalized(ctx: &Context, m: &mut VirtualMachineMigration) -> Result<KAction> {
    set_finalizer(ctx, m, false).await?;
    Ok(KAction::await_change())
}

/// Record decision `d`: the phase and its reason; at the end the VM is handed back (to the
/// target's pod when it succeeded, else the source's) and Events tell the outcome before
/// the status does; the finalizer goes once nothing is left to do.
async fn record(
    ctx: &Context,
    local: &Local,
    m: &mut VirtualMachineMigration,
    vm: Option<&VirtualMachine>,
    mut st: VirtualMachineMigrationStatus,
    d: &Decision,
) -> Result<KAction> {
    let key = key_of(m);
    let was = st.phase;
    st.enter(d.phase, now_micro);
    if d.reason.is_some() {
        st.reason = d.reason.clone();
    }
    if let Some(back) = end::hand_back(&st) {
        // its tasks end with it: none may act on the VM's next migration
        local.end(&key);
        st.completion_time.get_or_insert_with(now);
        if let Some(vm) = vm.filter(|v| names(Some(v), m)) {
            let mut patch = json!({"migration": null, "phase": VmPhase::Running});
            if let Some((node, pod)) = back.at {
                patch["node"] = json!(node);
                patch["pod"] = json!(pod);
            }
            if st.phase == Phase::Succeeded {
                patch["podUID"] = json!(back.pod_uid);
            }
            status::vm(ctx, vm, patch).await?;
        }
    }
    if was != st.phase {
        tell(ctx, m, vm, &st, was).await;
    }
    patch_status(ctx, m, &st).await?;
    let next = end::next(d, m.metadata.deletion_timestamp.is_some());
    if next.release {
        set_finalizer(ctx, m, false).await?;
    }
    Ok(next
        .requeue
        .map_or_else(KAction::await_change, KAction::requeue))
}

/// A phase change: logged, and an Event on the migration and on the VM. At the end the
/// Events are stored before the phase is written: a controller killed in between decides
/// (and tells) again, where one killed after the write would never tell.
async fn tell(
    ctx: &Context,
    m: &VirtualMachineMigration,
    vm: Option<&VirtualMachine>,
    st: &VirtualMachineMigrationStatus,
    was: Phase,
) {
    let name = m.name_any();
    let warn = matches!(st.phase, Phase::Failed | Phase::Aborted);
    let ms = |v: Option<u64>| v.map(|d| d.to_string()).unwrap_or("?".into());
    let note = match (&st.reason, st.phase) {
        (Some(r), Phase::Failed | Phase::Aborted) => format!("{name}: {:?}: {r}", st.phase),
        (_, Phase::Succeeded) => format!(
            "{name}: {} → {}, downtime {} ms, switchover {} ms",
            st.source_node.as_deref().unwrap_or("?"),
            st.target_node.as_deref().unwrap_or("?"),
            ms(st.downtime_ms),
            ms(st.switchover_ms),
        ),
        _ => format!("{name}: {:?}", st.phase),
    };
    tracing::info!(migration = %name, from = ?was, to = ?st.phase, reason = ?st.reason, "migration phase");
    let reason = format!("Migration{:?}", st.phase);
    let refs = std::iter::once(m.object_ref(&())).chain(vm.map(|v| v.object_ref(&())));
    for r in refs {
        if st.phase.is_terminal() {
            ctx.event_now(r, warn, &reason, "Migrate", note.clone())
                .await;
        } else {
            ctx.event(r, warn, &reason, "Migrate", note.clone());
        }
    }
}

/// The reconcile with its own background tasks, as one controller process runs it: for the
/// controller tests (a new one is a restarted controller; dropping it kills the old one's tasks).
#[cfg(test)]
pub(super) struct TestReconciler {
    local: Local,
    _kicked: futures::channel::mpsc::UnboundedReceiver<
        kube::runtime::reflector::ObjectRef<VirtualMachineMigration>,
    >,
}

#[cfg(test)]
impl TestReconciler {
    pub(super) fn new() -> TestReconciler {
        let (local, kicked) = Local::new();
        TestReconciler {
            local,
            _kicked: kicked,
        }
    }

    pub(super) async fn reconcile(
        &self,
        m: Arc<VirtualMachineMigration>,
        ctx: Arc<Context>,
    ) -> Result<KAction> {
        reconcile(m, ctx, self.local.clone()).await
    }
}

#[cfg(test)]
impl Drop for TestReconciler {
    fn drop(&mut self) {
        self.local.abort_all();
    }
}
