//! A VM's launcher as the VM and migration controllers see it (thin I/O around
//! [`roam_core::launcher`]): its pod in the VM's namespace and, with runners
//! (`--runner-namespace`), the runner in roam's namespace that runs the VM. Without runners
//! every function here is the pod alone, with no request more.
//!
//! A runner belongs to one launcher pod (its UID, [`runner_of`]): made once the pod exists
//! (for a VM on a volume, once the pod runs, so that the kubelet has mounted the volume),
//! made again if it goes, and deleted with its pod or once its pod is gone: by its VM's
//! teardown and, whether or not the VM still exists, by the runners' own controller ([`run`]).

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::runtime::controller::{Action, Config as ControllerConfig};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{Controller, watcher};
use kube::{Api, ResourceExt};

use super::Context;
use super::retry::{Retry, object_key};
use crate::error::{Error, Result};
use crate::launcher::{
    LAUNCHER_LABEL, LauncherSpec, RUNNER_LABEL, RUNNER_VM_ANNOTATION, RUNNER_VM_LABEL,
    claim_host_dir, launcher_view, pod_running, runner_name, runner_of, runner_pod, vm_key,
};
use roam_api::{Boot, VirtualMachine};

fn runners_api(ctx: &Context) -> Option<Api<Pod>> {
    let r = ctx.config.vm.runners.as_ref()?;
    Some(Api::namespaced(ctx.client.clone(), &r.namespace))
}

/// Launcher pod `p` with its runner's state ([`launcher_view`]): the pod itself without
/// runners.
pub(super) async fn view(ctx: &Context, p: Pod) -> Result<Pod> {
    let Some(api) = runners_api(ctx) else {
        return Ok(p);
    };
    let runner = runner_of_pod(&api, &p).await?;
    Ok(launcher_view(&p, runner.as_ref(), true))
}

/// The runner of launcher pod `p`, if it has one (a runner of an earlier pod of the same
/// name is not).
async fn runner_of_pod(api: &Api<Pod>, p: &Pod) -> Result<Option<Pod>> {
    let name = runner_name(&p.namespace().unwrap_or_default(), &p.name_any());
    let r = api.get_opt(&name).await?;
    Ok(r.filter(|r| runner_of(r).map(|(_, _, uid)| uid) == p.metadata.uid))
}

/// Whether a runner of roam's is bound to launcher pod `p` (its UID): roam made it for that
/// very pod, in a namespace no tenant writes. `false` without runners.
pub(super) async fn has_runner(ctx: &Context, p: &Pod) -> Result<bool> {
    let Some(api) = runners_api(ctx) else {
        return Ok(false);
    };
    Ok(runner_of_pod(&api, p).await?.is_some())
}

/// Delete launcher pod `p`, that very pod (a UID precondition: never another of the same
/// name), and any runner of its name.
pub(super) async fn delete_exact(ctx: &Context, p: &Pod) -> Result<()> {
    let ns = p.namespace().unwrap_or_default();
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let dp = DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            uid: p.metadata.uid.clone(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(&p.name_any(), &dp).await {
        Ok(_) => {}
        Err(e) if Error::is_not_found(&e) || Error::is_conflict(&e) => {}
        Err(e) => return Err(e.into()),
    }
    if let Some(api) = runners_api(ctx) {
        delete_named(&api, &runner_name(&ns, &p.name_any())).await?;
    }
    Ok(())
}

/// The launcher pods the VM's runners belong to (each that very pod, by UID), found from
/// roam's namespace, where tenants cannot write: a launcher pod whose labels or owner were
/// stripped in the VM's namespace is still the VM's. None without runners.
pub(super) async fn of_runners(ctx: &Context, vm: &VirtualMachine) -> Result<Vec<Pod>> {
    let Some(api) = runners_api(ctx) else {
        return Ok(vec![]);
    };
    let uid = vm.uid().unwrap_or_default();
    let mut pods = Vec::new();
    for r in api
        .list(&ListParams::default().labels(&format!("{RUNNER_VM_LABEL}={uid}")))
        .await?
        .items
    {
        let Some((ns, name, pod_uid)) = runner_of(&r) else {
            continue;
        };
        if let Some(p) = Api::<Pod>::namespaced(ctx.client.clone(), &ns)
            .get_opt(&name)
            .await?
            .filter(|p| p.metadata.uid.as_deref() == Some(pod_uid.as_str()))
        {
            pods.push(p);
        }
    }
    Ok(pods)
}

/// The runner of existing launcher pod `launcher` (of `vm`, as `spec` says), made if it is
/// missing; the launcher's view. A runner left by an earlier pod of the same name is deleted
/// first.
pub(super) async fn ensure_runner(
    ctx: &Context,
    vm: &VirtualMachine,
    spec: &LauncherSpec<'_>,
    launcher: Pod,
) -> Result<Pod> {
    let Some(api) = runners_api(ctx) else {
        return Ok(launcher);
    };
    let name = runner_name(&vm.namespace().unwrap_or_default(), &spec.pod);
    let existing = api.get_opt(&name).await?;
    if let Some(r) = &existing {
        if runner_of(r).map(|(_, _, uid)| uid) == launcher.metadata.uid {
            return Ok(launcher_view(&launcher, Some(r), true));
        }
        if r.metadata.deletion_timestamp.is_none() {
            tracing::info!(vm = %vm_key(vm), runner = %name, "deleting the runner of an earlier launcher pod");
            delete_named(&api, &name).await?;
        }
        return Ok(launcher_view(&launcher, None, true));
    }
    if launcher.metadata.deletion_timestamp.is_some() {
        return Ok(launcher_view(&launcher, None, true));
    }
    let volume_dir = match &vm.spec.boot {
        Boot::Volume { claim_name, .. } => {
            if !pod_running(&launcher) {
                // the kubelet mounts the volume before the pod's container starts
                return Ok(launcher_view(&launcher, None, true));
            }
            Some(volume_dir(ctx, vm, claim_name, &launcher).await?)
        }
        _ => None,
    };
    let pod = runner_pod(&ctx.config.vm, vm, spec, &launcher, volume_dir.as_deref())?;
    let created = match api.create(&PostParams::default(), &pod).await {
        Ok(r) => r,
        Err(e) if Error::is_conflict(&e) => api.get(&name).await?,
        Err(e) => return Err(e.into()),
    };
    tracing::info!(vm = %vm_key(vm), pod = %spec.pod, runner = %name, node = %spec.node, "runner created");
    Ok(launcher_view(&launcher, Some(&created), true))
}

/// Where launcher pod `launcher`'s node shows the VM's boot volume `claim_name`.
async fn volume_dir(
    ctx: &Context,
    vm: &VirtualMachine,
    claim_name: &str,
    launcher: &Pod,
) -> Result<String> {
    let ns = vm.namespace().unwrap_or_default();
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &ns);
    let claim = claims.get(claim_name).await?;
    let pv_name = claim.spec.and_then(|s| s.volume_name).ok_or_else(|| {
        Error::Conflict(format!("claim {ns}/{claim_name} is bound to no volume yet"))
    })?;
    let pv = Api::<PersistentVolume>::all(ctx.client.clone())
        .get(&pv_name)
        .await?;
    let runners = ctx.config.vm.runners.as_ref().expect("called with runners");
    claim_host_dir(
        &runners.kubelet_root,
        launcher.metadata.uid.as_deref().unwrap_or_default(),
        &pv,
    )
    .map_err(|problem| Error::invalid_vm(vm_key(vm), problem))
}

async fn delete_named(api: &Api<Pod>, name: &str) -> Result<()> {
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(e) if Error::is_not_found(&e) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Delete launcher pod `ns/name` and its runner.
pub(super) async fn delete(ctx: &Context, ns: &str, name: &str) -> Result<()> {
    delete_named(&Api::namespaced(ctx.client.clone(), ns), name).await?;
    if let Some(api) = runners_api(ctx) {
        delete_named(&api, &runner_name(ns, name)).await?;
    }
    Ok(())
}

/// Delete runner `r` if its launcher pod, that very pod (by UID), is gone (and the runner is
/// not already going).
async fn delete_if_orphaned(ctx: &Context, api: &Api<Pod>, r: &Pod) -> Result<()> {
    if r.metadata.deletion_timestamp.is_some() {
        return Ok(());
    }
    let exists = match runner_of(r) {
        Some((ns, pod, uid)) => Api::<Pod>::namespaced(ctx.client.clone(), &ns)
            .get_opt(&pod)
            .await?
            .is_some_and(|p| p.metadata.uid.as_deref() == Some(uid.as_str())),
        None => false,
    };
    if !exists {
        tracing::info!(runner = %r.name_any(), vm = ?r.annotations().get(RUNNER_VM_ANNOTATION), "its launcher pod is gone: deleting the runner");
        delete_named(api, &r.name_any()).await?;
    }
    Ok(())
}

/// Delete the runners of `vm` whose launcher pod is gone (or was replaced by another of the
/// same name); how many of its runners are left. 0 without runners.
pub(super) async fn sweep(ctx: &Context, vm: &VirtualMachine) -> Result<usize> {
    let Some(api) = runners_api(ctx) else {
        return Ok(0);
    };
    let uid = vm.uid().unwrap_or_default();
    let runners = api
        .list(&ListParams::default().labels(&format!("{RUNNER_VM_LABEL}={uid}")))
        .await?
        .items;
    for r in &runners {
        delete_if_orphaned(ctx, &api, r).await?;
    }
    Ok(runners.len())
}

/// The runners' own controller (with runners only): a runner whose launcher pod is gone is
/// deleted, whether or not its VM still exists — a VM removed without its teardown finalizer
/// (`kubectl patch` of the finalizers) has no teardown to sweep its runners, but its launcher
/// pods go with it (the garbage collector) and this finds their runners. A launcher pod's
/// change (its deletion above all) is its runner's.
pub(super) async fn run(ctx: Arc<Context>) {
    let Some(r) = ctx.config.vm.runners.as_ref() else {
        return;
    };
    let runner_ns = r.namespace.clone();
    let runners: Api<Pod> = Api::namespaced(ctx.client.clone(), &runner_ns);
    let launchers: Api<Pod> = match &ctx.config.pod_namespace {
        Some(ns) => Api::namespaced(ctx.client.clone(), ns),
        None => Api::all(ctx.client.clone()),
    };
    let retry = Retry::new("runner_errors");
    let policy = retry.clone();
    Controller::new(
        runners,
        watcher::Config::default().labels(&format!("{RUNNER_LABEL}=true")),
    )
    .watches(
        launchers,
        watcher::Config::default().labels(&format!("{LAUNCHER_LABEL}=true")),
        move |p| {
            let name = runner_name(&p.namespace()?, &p.name_any());
            Some(ObjectRef::new(&name).within(&runner_ns))
        },
    )
    .with_config(ControllerConfig::default().concurrency(ctx.config.concurrency))
    .run(
        move |r, c| {
            let retry = retry.clone();
            async move { retry.outcome(&object_key(&*r), reconcile_runner(r, c).await) }
        },
        move |r, e, c| policy.policy(&object_key(&*r), e, &c.metrics),
        ctx.clone(),
    )
    .for_each(|r| async move {
        if let Err(e) = r {
            tracing::debug!(error = %e, "runner reconcile");
        }
    })
    .await;
}

/// Runner `r`: deleted once its launcher pod is gone; left alone while the pod exists. Not
/// limited to this controller's namespaces (`--namespace-selector`): a runner is made after
/// its pod and bound to the pod's UID, so one whose pod is gone is garbage whoever made it —
/// and a namespace deleted with a VM whose finalizer was patched away is out of every scope
/// by then, its runner left for nobody otherwise.
pub(super) async fn reconcile_runner(r: Arc<Pod>, ctx: Arc<Context>) -> Result<Action> {
    if let Some(api) = runners_api(&ctx) {
        delete_if_orphaned(&ctx, &api, &r).await?;
    }
    Ok(Action::await_change())
}
