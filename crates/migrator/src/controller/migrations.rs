//! The migration controller: thin I/O around [`crate::migration::step`]. Each reconcile
//! observes (the VM, the target pod and its shim, the source shim's job and domain, where
//! the Address's host points), steps, performs the idempotent actions and writes status.
//!
//! The switchover does not wait for a reconcile: once the copy starts, a task long-polls the
//! source shim's events and, as soon as `suspended-for-migration` arrives, flips the VM's /32s
//! in OVN itself (one small transaction per Address, ahead of the Address writes, which follow
//! in parallel: no API round trip stands between the pause and the flip), inside the pause
//! window; `switchoverMs` is the time from that event to the flip's commit, `chassisSyncMs`
//! the time until every chassis reports it in its data plane.
//!
//! Nor does the rest wait for a requeue: a task polls a starting target shim (until the shim
//! of *this* target pod answers, by its `instance`) and the switchover task, on the
//! migration's end events, wake the reconcile through [`Controller::reconcile_on`].

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use futures::channel::mpsc;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action as KAction, Config as ControllerConfig};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{Controller, watcher};
use kube::{Api, Resource, ResourceExt};
use roam_shim_api::api::{DomainState, JobState, MigrateRequest, Status};
use roam_shim_api::events::Lifecycle;
use serde_json::json;
use tokio::task::AbortHandle;

use super::vms::{self, LauncherSpec, vm_key};
use super::{Context, Tentative};
use crate::api::{
    Address, Progress, VirtualMachine, VirtualMachineMigration, VirtualMachineMigrationStatus,
    VmPhase,
};
use crate::core::claim::{ALSO_ON, also_on};
use crate::core::vm::{Move, Placement, When, flipped_in_pause, moves, ports_on, route_at};
use crate::error::{Error, Result};
use crate::migration::{Action, GuestAt, Job, Observed, Phase, PodState, RouteAt, step};

pub use roam_contract::keys::MIGRATION_FINALIZER as FINALIZER;

/// This process's helpers of the reconcile: the background tasks running and the way they
/// wake a migration's reconcile.
#[derive(Clone)]
struct Local {
    tasks: Arc<Mutex<Tasks>>,
    /// When each migration's source paused for the final copy (its event's time, ns since
    /// the epoch), for `pauseMs`.
    suspended: Arc<Mutex<BTreeMap<String, u64>>>,
    kick: mpsc::UnboundedSender<ObjectRef<VirtualMachineMigration>>,
}

/// The background tasks of this process's migrations by key — `ns/name` for the switchover
/// task, `Ready:ns/name` and `Landed:ns/name` for the target waits — so that one runs per key
/// and a migration's end stops all of its own. A task left running past its migration would
/// act on the next one: a switchover task of a failed migration flips the route at the next
/// migration's pause (its source shim is the same; an aborted copy that never paused sends
/// no event that ends the task).
#[derive(Default)]
struct Tasks {
    next_id: u64,
    running: BTreeMap<String, (u64, Option<AbortHandle>)>,
}

impl Local {
    fn kick(&self, m: &VirtualMachineMigration) {
        let _ = self.kick.unbounded_send(ObjectRef::from_obj(m));
    }

    fn tasks(&self) -> std::sync::MutexGuard<'_, Tasks> {
        self.tasks.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a task runs under `key`.
    fn running(&self, key: &str) -> bool {
        self.tasks().running.contains_key(key)
    }

    /// Run `task` unless one under `key` runs already; the key is free again when it ends.
    fn spawn_once(
        &self,
        key: String,
        task: impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        let id = {
            let mut t = self.tasks();
            if t.running.contains_key(&key) {
                return;
            }
            t.next_id += 1;
            let id = t.next_id;
            t.running.insert(key.clone(), (id, None));
            id
        };
        let (tasks, k) = (self.tasks.clone(), key.clone());
        let handle = tokio::spawn(async move {
            task.await;
            let mut t = tasks.lock().unwrap_or_else(|e| e.into_inner());
            if t.running.get(&k).is_some_and(|(i, _)| *i == id) {
                t.running.remove(&k);
            }
        });
        if let Some(e) = self.tasks().running.get_mut(&key).filter(|(i, _)| *i == id) {
            e.1 = Some(handle.abort_handle());
        }
    }

    /// Stop every task of migration `ns/name` (it ended); returns how many were running.
    fn stop_all(&self, ns_name: &str) -> usize {
        let mut t = self.tasks();
        let suffix = format!(":{ns_name}");
        let keys: Vec<String> = t
            .running
            .keys()
            .filter(|k| *k == ns_name || k.ends_with(&suffix))
            .cloned()
            .collect();
        for k in &keys {
            if let Some((_, Some(h))) = t.running.remove(k) {
                h.abort();
            }
        }
        keys.len()
    }
}

pub(super) async fn run(ctx: Arc<Context>) {
    let api: Api<VirtualMachineMigration> = match &ctx.config.pod_namespace {
        Some(ns) => Api::namespaced(ctx.client.clone(), ns),
        None => Api::all(ctx.client.clone()),
    };
    let (kick, kicked) = mpsc::unbounded();
    let local = Local {
        tasks: Arc::new(Mutex::new(Tasks::default())),
        suspended: Arc::default(),
        kick,
    };
    Controller::new(api, watcher::Config::default())
        .with_config(ControllerConfig::default().concurrency(ctx.config.concurrency))
        .reconcile_on(kicked)
        .run(
            move |m, c| reconcile(m, c, local.clone()),
            error_policy,
            ctx.clone(),
        )
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(error = %e, "migration reconcile");
            }
        })
        .await;
}

fn error_policy(m: Arc<VirtualMachineMigration>, e: &Error, ctx: Arc<Context>) -> KAction {
    tracing::warn!(migration = %m.name_any(), error = %e, "migration reconcile failed; retrying");
    ctx.metrics.count("migration_errors", e.reason());
    KAction::requeue(Duration::from_secs(1))
}

fn now() -> Time {
    Time(k8s_openapi::jiff::Timestamp::now())
}

fn now_micro() -> MicroTime {
    MicroTime(k8s_openapi::jiff::Timestamp::now())
}

fn unix_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or_default()
}

/// Write `host` and `also-on` of the VM's Address (resourceVersion precondition, retried on
/// fresh data); the index sees the move and the route controller flips the /32 at once.
async fn move_address(ctx: &Arc<Context>, name: &str, host: &str, also: &[&str]) -> Result<()> {
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
                super::ovn::request(ctx, &w.spec.network);
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

/// Write every [`Move`] of the VM's Addresses (see [`crate::core::vm::moves`]).
async fn apply_moves(ctx: &Arc<Context>, ms: Vec<Move>) -> Result<()> {
    for m in ms {
        let also: Vec<&str> = m.also_on.iter().map(String::as_str).collect();
        move_address(ctx, &m.address, &m.host, &also).await?;
    }
    Ok(())
}

async fn patch_status(
    ctx: &Context,
    m: &VirtualMachineMigration,
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
        Ok(_) => Ok(()),
        Err(e) if Error::is_not_found(&e) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

async fn patch_vm_status(
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

async fn set_finalizer(ctx: &Context, m: &VirtualMachineMigration, on: bool) -> Result<()> {
    let mut f: Vec<String> = m.finalizers().to_vec();
    let has = f.iter().any(|x| x == FINALIZER);
    if has == on {
        return Ok(());
    }
    if on {
        f.push(FINALIZER.into());
    } else {
        f.retain(|x| x != FINALIZER);
    }
    let api: Api<VirtualMachineMigration> =
        Api::namespaced(ctx.client.clone(), &m.namespace().unwrap_or_default());
    match api
        .patch(
            &m.name_any(),
            &PatchParams::default(),
            &Patch::Merge(
                &json!({"metadata": {"finalizers": f, "resourceVersion": m.resource_version()}}),
            ),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(e) if Error::is_not_found(&e) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

async fn reconcile(
    m: Arc<VirtualMachineMigration>,
    ctx: Arc<Context>,
    local: Local,
) -> Result<KAction> {
    ctx.wait_synced().await;
    let ns = m.namespace().unwrap_or_default();
    let mname = m.name_any();
    // decide on the object as it is now, not on a cached copy older than our last write
    let api: Api<VirtualMachineMigration> = Api::namespaced(ctx.client.clone(), &ns);
    let Some(m) = api.get_opt(&mname).await?.map(Arc::new) else {
        local.stop_all(&format!("{ns}/{mname}"));
        return Ok(KAction::await_change());
    };
    let mut st = m.status.clone().unwrap_or_default();
    if st.phase.is_terminal() {
        local.stop_all(&format!("{ns}/{mname}"));
    }
    let deleted = m.metadata.deletion_timestamp.is_some();
    if st.phase.is_terminal() && deleted {
        set_finalizer(&ctx, &m, false).await?;
        return Ok(KAction::await_change());
    }
    if !st.phase.is_terminal() && !deleted {
        set_finalizer(&ctx, &m, true).await?;
    }
    let vms_api: Api<VirtualMachine> = Api::namespaced(ctx.client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let vm = vms_api.get_opt(&m.spec.vm).await?;
    // A finished migration the VM no longer names is history (its outcome is recorded, or a
    // newer migration moved the VM since): settling it again — as a restarted controller
    // would, for every old migration — would pull the address back to where it once went.
    let vm_names_it = vm
        .as_ref()
        .and_then(|v| v.status.as_ref())
        .and_then(|s| s.migration.as_deref())
        == Some(mname.as_str());
    if st.phase.is_terminal() && !vm_names_it {
        set_finalizer(&ctx, &m, false).await?;
        return Ok(KAction::await_change());
    }
    // --- Pending: validate, record source and target
    let mut invalid: Option<String> = None;
    if st.phase == Phase::Pending {
        st.start_time.get_or_insert_with(now);
        match &vm {
            None => invalid = Some(format!("VirtualMachine {ns}/{} does not exist", m.spec.vm)),
            Some(v) => {
                let vs = v.status.clone().unwrap_or_default();
                let source = vs.node.clone();
                st.source_node = source.clone();
                st.source_pod = vs.pod.clone();
                st.target_node = m.spec.target_node.clone();
                match (&m.spec.target_node, &source) {
                    _ if !(vs.phase == VmPhase::Running
                        || (vs.phase == VmPhase::Migrating && vs.migration.as_deref() == Some(mname.as_str())))
                        || vs.migration.as_deref().is_some_and(|x| x != mname) =>
                    {
                        invalid = Some(match &vs.migration {
                            Some(other) if other != &mname => format!("migration {other} of this VM is under way; wait for it to end"),
                            _ => format!("the VM is {:?}, not Running", vs.phase),
                        })
                    }
                    (None, _) => invalid = Some("no target node: set spec.targetNode (or annotate roam.dev/migrate-to=NODE|auto with another Ready node)".into()),
                    (Some(t), Some(s)) if t == s => invalid = Some(format!("the VM already runs on {t}; name another node")),
                    (Some(t), _) => {
                        if vms::ready_node_ip(&ctx, t).await?.is_none() {
                            invalid = Some(format!("target node {t} does not exist or is not Ready"));
                        }
                    }
                }
            }
        }
    }
    let Some(vm) = vm else {
        st.enter(Phase::Failed, now_micro);
        st.reason = invalid.or(Some("the VirtualMachine is gone".into()));
        patch_status(&ctx, &m, &st).await?;
        set_finalizer(&ctx, &m, false).await?;
        return Ok(KAction::await_change());
    };
    let vst = vm.status.clone().unwrap_or_default();
    if invalid.is_none()
        && !st.phase.is_terminal()
        && vst.migration.as_deref() != Some(mname.as_str())
    {
        // claim the VM for this migration
        patch_vm_status(
            &ctx,
            &vm,
            json!({"migration": mname, "phase": VmPhase::Migrating}),
        )
        .await?;
    }
    let (Some(source), Some(target)) = (st.source_node.clone(), st.target_node.clone()) else {
        return finish_invalid(
            &ctx,
            &m,
            &vm,
            st,
            invalid.unwrap_or("no source or target node".into()),
        )
        .await;
    };
    if let Some(why) = invalid {
        return finish_invalid(&ctx, &m, &vm, st, why).await;
    }
    let port = vst.shim_port.unwrap_or_default();
    let token = vms::token(&ctx, &vm).await?;
    let source_ip = vms::ready_node_ip(&ctx, &source).await?.unwrap_or_default();
    let target_ip = vms::ready_node_ip(&ctx, &target).await?;
    let target_pod_name = st
        .target_pod
        .clone()
        .unwrap_or_else(|| format!("{mname}-target"));
    st.target_pod = Some(target_pod_name.clone());
    let addresses = vms::vm_addresses(&ctx, &vm);
    let placements: Vec<Placement> = addresses.iter().map(|a| Placement::of(a)).collect();
    // --- observe
    let target_pod = pods.get_opt(&target_pod_name).await?;
    // the target's shim, asked as soon as its pod exists (not when the kubelet gets round to
    // reporting it Running); only the shim of this very pod counts
    let target_status: Option<Status> = match (&target_pod, &target_ip) {
        (Some(p), Some(ip)) if p.metadata.deletion_timestamp.is_none() => {
            let running = p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
            vms::client(&vm, ip, port, &token)?
                .status()
                .await
                .ok()
                .filter(|s| is_shim_of(s, &target_pod_name, running))
        }
        _ => None,
    };
    let pod_state = match &target_pod {
        None => PodState::Absent,
        Some(p) if p.metadata.deletion_timestamp.is_some() => PodState::Absent,
        Some(p) if p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Failed") => {
            PodState::Failed(format!("pod {target_pod_name} failed"))
        }
        Some(_) if target_status.is_some() => PodState::Ready,
        Some(_) => PodState::Starting,
    };
    let source_pod_exists = match &st.source_pod {
        Some(p) => pods
            .get_opt(p)
            .await?
            .is_some_and(|p| p.metadata.deletion_timestamp.is_none()),
        None => false,
    };
    let source_client = vms::client(&vm, &source_ip, port, &token)?;
    // a restarted target shim knows no incoming migration: its domain running is enough
    let target_restarted = target_pod
        .as_ref()
        .and_then(|p| p.status.as_ref()?.container_statuses.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.restart_count > 0));
    let on_target = target_status.as_ref().is_some_and(|s| {
        s.domain == DomainState::Running
            && (s.last_incoming.is_some() || (target_restarted && !s.incoming))
    });
    // once the guest runs on the target the source's answer changes nothing (the target's
    // completed job has the figures), and while libvirt tears the source domain down it can
    // take seconds: do not ask
    let source_status = if source_pod_exists && !on_target {
        tokio::time::timeout(Duration::from_secs(10), source_client.status())
            .await
            .ok()
            .and_then(|r| r.ok())
    } else {
        None
    };
    // a job this migration started whose id was never written (the controller died between
    // starting it and recording it): adopt it — unwatched, its pause would pass without the
    // route flip, and starting it again only meets "a job is running"
    if st.job_id.is_none()
        && let (Some(s), Some(ip)) = (&source_status, &target_ip)
        && let Some(j) = s
            .job
            .as_ref()
            .filter(|j| !j.state.is_final() && j.target == vms::shim_url(ip, port))
    {
        tracing::info!(migration = %mname, job = j.id, "adopting the copy this migration started");
        st.job_id = Some(j.id);
    }
    let job = match (&source_status, st.job_id) {
        (_, None) => Job::None,
        (None, Some(_)) => Job::Unknown,
        (Some(s), Some(id)) => match s.job.as_ref().filter(|j| j.id == id) {
            None => Job::Unknown,
            Some(j) => match j.state {
                JobState::Preparing | JobState::Running => {
                    if s.domain == DomainState::Paused {
                        Job::Paused
                    } else {
                        Job::Running
                    }
                }
                JobState::Completed => Job::Completed,
                JobState::Aborted | JobState::Failed => {
                    Job::Failed(j.error.clone().unwrap_or_else(|| format!("{:?}", j.state)))
                }
            },
        },
    };
    if let Some(j) = source_status
        .as_ref()
        .and_then(|s| s.job.as_ref())
        .filter(|j| Some(j.id) == st.job_id)
    {
        let s = &j.stats;
        let total = s.data_total.unwrap_or_default();
        let processed = s.data_processed.unwrap_or_default();
        st.progress = Some(Progress {
            percent: Some(if j.state == JobState::Completed {
                "100%".into()
            } else {
                Progress::percent_of(processed, total)
            }),
            memory_total: total,
            memory_processed: processed,
            memory_remaining: s.data_remaining.unwrap_or_default(),
            iteration: s.iteration.unwrap_or_default(),
            dirty_rate: s.dirty_rate_pages_s.unwrap_or_default(),
        });
        if j.state == JobState::Completed {
            if let Some(d) = s.downtime_ms {
                st.downtime_ms = Some(d);
                st.downtime = Some(format!("{d}ms"));
            }
            st.job_ms = s.elapsed_ms.or_else(|| {
                j.finished_unix_ns
                    .map(|f| (f.saturating_sub(j.started_unix_ns)) / 1_000_000)
            });
        }
    }
    if on_target
        && let Some(inc) = target_status
            .as_ref()
            .and_then(|s| s.last_incoming.as_ref())
    {
        // libvirt's completed job as the target saw it (the source's job may not say so yet)
        if let Some(d) = inc.stats.downtime_ms {
            st.downtime_ms = Some(d);
            st.downtime = Some(format!("{d}ms"));
        }
        if let Some(e) = inc.stats.elapsed_ms {
            st.job_ms = Some(e);
        }
        if let Some(&at) = local
            .suspended
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&format!("{ns}/{mname}"))
            && inc.resumed_unix_ns > at
        {
            st.pause_ms = Some((inc.resumed_unix_ns - at) / 1_000_000);
        }
        if let Some(p) = st.progress.as_mut() {
            p.percent = Some("100%".into());
            p.memory_remaining = 0;
        }
    }
    let guest = if on_target {
        GuestAt::Target
    } else if source_status
        .as_ref()
        .is_some_and(|s| matches!(s.domain, DomainState::Running | DomainState::Paused))
    {
        GuestAt::Source
    } else {
        GuestAt::Unknown
    };
    let route = route_at(&placements, &target);
    let target_port = ports_on(&placements, &target);
    let timed_out = m.spec.timeout_seconds.is_some_and(|t| {
        st.start_time
            .as_ref()
            .is_some_and(|s| (k8s_openapi::jiff::Timestamp::now() - s.0).get_seconds() > t as i64)
    });
    let o = Observed {
        invalid: None,
        deleted,
        timed_out,
        target_pod: pod_state,
        target_port,
        source_pod: source_pod_exists,
        job,
        guest,
        route,
    };
    let was = st.phase;
    let d = step(st.phase, &o);
    tracing::debug!(migration = %mname, ?o, ?d, "step");
    // the task that flips the route at the pause, for the source's events after `after`
    let watch_switchover = |ip: &str, after: u64| -> Result<()> {
        let target_client = vms::client(&vm, ip, port, &token)?;
        spawn_switchover(
            &ctx,
            &m,
            &source_client,
            after,
            flipped_in_pause(&placements),
            &source,
            &target,
            (target_client, target_pod_name.clone()),
            &local,
        );
        Ok(())
    };
    // a restarted controller watches a running job's events again (the switchover flip)
    let key = format!("{ns}/{mname}");
    if o.job == Job::Running
        && !local.running(&key)
        && let Some(ip) = &target_ip
    {
        watch_switchover(ip, last_seq(&source_client).await)?;
    }
    // --- act
    for a in &d.actions {
        match a {
            Action::CreateTarget => {
                let Some(ip) = &target_ip else { continue };
                if addresses.is_empty() {
                    continue;
                }
                apply_moves(
                    &ctx,
                    moves(&placements, When::PrepareTarget, &source, &target),
                )
                .await?;
                let networks: BTreeSet<&str> =
                    addresses.iter().map(|a| a.spec.network.as_str()).collect();
                for n in networks {
                    let t = super::ovn::request(&ctx, n);
                    super::ovn::wait(&ctx, n, t).await?;
                }
                if target_pod.is_none() {
                    let refs: Vec<&Address> = addresses.iter().map(|a| &**a).collect();
                    let nics = crate::core::vm::nics_of_addresses(&vm_key(&vm), &target, &refs);
                    let l = LauncherSpec {
                        pod: target_pod_name.clone(),
                        node: &target,
                        node_ip: ip,
                        mode: "incoming",
                        migration: Some(&mname),
                        nics: &nics,
                        port,
                        token: &token,
                    };
                    let pod = vms::launcher_pod(&ctx.config.vm, &vm, &l)?;
                    match pods.create(&PostParams::default(), &pod).await {
                        Ok(_) => {}
                        Err(e) if Error::is_conflict(&e) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
            }
            Action::StartMigration => {
                let Some(ip) = &target_ip else { continue };
                let req = MigrateRequest {
                    target: vms::shim_url(ip, port),
                    target_token: token.clone(),
                    bandwidth_mib_s: m.spec.bandwidth_mib_per_second,
                    max_downtime_ms: m.spec.max_downtime_ms,
                    auto_converge: m.spec.auto_converge,
                    post_copy: m.spec.allow_post_copy,
                    timeout_s: m.spec.timeout_seconds,
                };
                // the events after this point are this job's
                let after = last_seq(&source_client).await;
                let job = source_client
                    .migrate(&req)
                    .await
                    .map_err(|source| Error::Shim {
                        vm: vm_key(&vm),
                        source,
                    })?;
                super::failpoint("migration-started");
                st.job_id = Some(job.id);
                // record the job before anything else can happen
                patch_status(&ctx, &m, &st).await?;
                watch_switchover(ip, after)?;
            }
            Action::AbortMigration => {
                if let Err(e) = source_client.abort().await {
                    tracing::warn!(migration = %mname, error = %e, "abort");
                }
            }
            Action::RouteToTarget => {
                // in the pause only the /32s flip; once the guest runs there, every port
                let when = if o.guest == GuestAt::Target {
                    When::GuestOnTarget
                } else {
                    When::Paused
                };
                apply_moves(&ctx, moves(&placements, when, &source, &target)).await?;
            }
            Action::RouteToSource => {
                apply_moves(
                    &ctx,
                    moves(&placements, When::GuestOnSource, &source, &target),
                )
                .await?;
            }
            Action::DeleteSource => {
                // the VM is the target's now, then the source pod goes
                patch_vm_status(&ctx, &vm, json!({"node": target, "pod": target_pod_name})).await?;
                if let Some(p) = &st.source_pod {
                    match pods.delete(p, &DeleteParams::default()).await {
                        Ok(_) => {}
                        Err(e) if Error::is_not_found(&e) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
            }
            Action::DeleteTarget => {
                match pods
                    .delete(&target_pod_name, &DeleteParams::default())
                    .await
                {
                    Ok(_) => {}
                    Err(e) if Error::is_not_found(&e) => {}
                    Err(e) => return Err(e.into()),
                }
                if o.route == RouteAt::Source {
                    apply_moves(&ctx, moves(&placements, When::TargetGone, &source, &target))
                        .await?;
                }
            }
        }
    }
    if d.phase == Phase::TargetScheduling
        && let Some(ip) = &target_ip
    {
        let client = vms::client(&vm, ip, port, &token)?;
        spawn_target_wait(&m, client, target_pod_name.clone(), Wait::Ready, &local);
    }
    st.enter(d.phase, now_micro);
    if d.reason.is_some() {
        st.reason = d.reason.clone();
    }
    if st.phase.is_terminal() {
        // its tasks end with it: none may act on the VM's next migration
        let stopped = local.stop_all(&key);
        local
            .suspended
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&key);
        if stopped > 0 {
            tracing::debug!(migration = %key, stopped, "background tasks stopped");
        }
        st.completion_time.get_or_insert_with(now);
        // the world settled: the port lives only where the guest runs (now: this is the
        // migration's last reconcile — once the VM no longer names it, it is history)
        let when = if st.phase == Phase::Succeeded {
            Some(When::Succeeded { source_pod: false })
        } else if o.guest == GuestAt::Source {
            Some(When::RolledBack)
        } else {
            None
        };
        if let Some(when) = when {
            apply_moves(&ctx, moves(&placements, when, &source, &target)).await?;
        }
        if vst.migration.as_deref() == Some(mname.as_str()) {
            let (node, pod) = if st.phase == Phase::Succeeded {
                (target.clone(), target_pod_name.clone())
            } else {
                (source.clone(), st.source_pod.clone().unwrap_or_default())
            };
            patch_vm_status(
                &ctx,
                &vm,
                json!({"migration": null, "phase": VmPhase::Running, "node": node, "pod": pod}),
            )
            .await?;
        }
    }
    if was != st.phase {
        let warn = matches!(st.phase, Phase::Failed | Phase::Aborted);
        let note = match (&st.reason, st.phase) {
            (Some(r), Phase::Failed | Phase::Aborted) => format!("{mname}: {:?}: {r}", st.phase),
            _ if st.phase == Phase::Succeeded => format!(
                "{mname}: {source} → {target}, downtime {} ms, switchover {} ms",
                st.downtime_ms.map(|d| d.to_string()).unwrap_or("?".into()),
                st.switchover_ms
                    .map(|d| d.to_string())
                    .unwrap_or("?".into())
            ),
            _ => format!("{mname}: {:?}", st.phase),
        };
        tracing::info!(migration = %mname, from = ?was, to = ?st.phase, reason = ?st.reason, "migration phase");
        let reason = format!("Migration{:?}", st.phase);
        if st.phase.is_terminal() {
            // published before the phase is written: a controller killed in between
            // decides (and tells) again, where one killed after the write would never tell
            for r in [m.object_ref(&()), vm.object_ref(&())] {
                ctx.event_now(r, warn, &reason, "Migrate", note.clone())
                    .await;
            }
        } else {
            ctx.event(m.object_ref(&()), warn, &reason, "Migrate", note.clone());
            ctx.event(vm.object_ref(&()), warn, &reason, "Migrate", note);
        }
    }
    patch_status(&ctx, &m, &st).await?;
    if st.phase.is_terminal() {
        if deleted || d.actions.is_empty() {
            set_finalizer(&ctx, &m, false).await?;
        }
        return Ok(if d.actions.is_empty() {
            KAction::await_change()
        } else {
            KAction::requeue(Duration::from_millis(300))
        });
    }
    // the fast paths are woken by the tasks; this is the fallback (and the progress refresh)
    Ok(KAction::requeue(Duration::from_millis(500)))
}

/// The sequence number of the shim's last event (0 if it cannot say): what follows is news.
async fn last_seq(shim: &roam_shim_api::client::ShimClient) -> u64 {
    shim.events(0, Duration::ZERO)
        .await
        .map(|e| e.events.last().map(|e| e.seq).unwrap_or(0))
        .unwrap_or(0)
}

/// Whether `s` comes from the shim of `pod`: by its `instance`; a shim too old to say is
/// trusted once its pod is Running.
fn is_shim_of(s: &Status, pod: &str, pod_running: bool) -> bool {
    match &s.instance {
        Some(i) => i == pod,
        None => pod_running,
    }
}

/// What a target-polling task waits for.
#[derive(Clone, Copy, Debug)]
enum Wait {
    /// The shim of the target pod answers: the copy can start.
    Ready,
    /// The guest runs on the target: the migration can end.
    Landed,
}

/// Poll the target's shim (every 50 ms, no API calls) until `what` holds, then wake the
/// reconcile, so nothing waits for a requeue.
fn spawn_target_wait(
    m: &VirtualMachineMigration,
    client: roam_shim_api::client::ShimClient,
    pod: String,
    what: Wait,
    local: &Local,
) {
    let key = format!(
        "{what:?}:{}/{}",
        m.namespace().unwrap_or_default(),
        m.name_any()
    );
    let (l, m) = (local.clone(), m.clone());
    local.spawn_once(key, async move {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(300);
        while tokio::time::Instant::now() < deadline {
            if let Ok(s) = client.status().await
                && is_shim_of(&s, &pod, false)
                && match what {
                    Wait::Ready => true,
                    Wait::Landed => s.domain == DomainState::Running && s.last_incoming.is_some(),
                }
            {
                l.kick(&m);
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
}

async fn finish_invalid(
    ctx: &Context,
    m: &VirtualMachineMigration,
    vm: &VirtualMachine,
    mut st: VirtualMachineMigrationStatus,
    why: String,
) -> Result<KAction> {
    tracing::warn!(migration = %m.name_any(), reason = %why, "migration refused");
    st.enter(Phase::Failed, now_micro);
    st.reason = Some(why.clone());
    st.completion_time.get_or_insert_with(now);
    patch_status(ctx, m, &st).await?;
    if vm.status.as_ref().and_then(|s| s.migration.as_deref()) == Some(m.name_any().as_str()) {
        patch_vm_status(
            ctx,
            vm,
            json!({"migration": null, "phase": VmPhase::Running}),
        )
        .await?;
    }
    let note = format!("{}: {why}", m.name_any());
    ctx.event(
        m.object_ref(&()),
        true,
        "MigrationFailed",
        "Migrate",
        note.clone(),
    );
    ctx.event(vm.object_ref(&()), true, "MigrationFailed", "Migrate", note);
    set_finalizer(ctx, m, false).await?;
    Ok(KAction::await_change())
}

/// How long the switchover waits for every chassis to report the flip (a figure for the
/// status, not a step anything waits on).
const CHASSIS_SYNC_TIMEOUT: Duration = Duration::from_secs(2);

/// At the pause: flip the VM's overlay /32s in OVN now — each moved Address shown to the
/// syncer until its write lands, the writes in parallel (the reconcile is woken when they
/// are done) — and time every chassis catching up. Returns (pause → flip committed, flip →
/// every chassis has it), for the status. A flip that fails is logged: the Addresses'
/// writes then move the route through the route controller, as they always did, and the
/// first figure is pause → written.
async fn flip_at_pause(
    ctx: &Arc<Context>,
    (key, m, l): (&str, &VirtualMachineMigration, &Local),
    addresses: &[String],
    (source_node, target_node): (&str, &str),
    paused_at_ns: u64,
) -> (Option<u64>, Option<u64>) {
    let moved: Vec<Address> = {
        let idx = ctx.index.lock().expect("index lock");
        addresses
            .iter()
            .filter_map(|n| idx.address(n))
            .map(|a| {
                let mut a = (*a).clone();
                a.spec.host = Some(target_node.to_string());
                a.annotations_mut()
                    .insert(ALSO_ON.into(), source_node.to_string());
                a
            })
            .collect()
    };
    let shown: Vec<Tentative> = moved
        .iter()
        .map(|a| Tentative::show(ctx, a.clone()))
        .collect();
    let mut marks = vec![];
    for a in &moved {
        match super::ovn::flip_ahead(ctx, a, source_node, target_node).await {
            Ok((_, mark)) => marks.extend(mark),
            Err(e) => {
                tracing::warn!(migration = %key, address = %a.name_any(), error = %e, "switchover: no direct flip; the Address write moves the route")
            }
        }
    }
    let flipped = !moved.is_empty() && marks.len() == moved.len();
    let since_pause = || unix_ns().saturating_sub(paused_at_ns) / 1_000_000;
    let flipped_ms = flipped.then(since_pause);
    let also = [source_node];
    let writes = async {
        let r = futures::future::try_join_all(
            addresses
                .iter()
                .map(|a| move_address(ctx, a, target_node, &also)),
        )
        .await;
        let written_ms = since_pause();
        l.kick(m);
        r.map(|_| written_ms)
    };
    let sync = async {
        let nb_cfg = marks.iter().copied().max()?;
        let started = Instant::now();
        match super::ovn::wait_for_chassis(ctx, nb_cfg, CHASSIS_SYNC_TIMEOUT).await {
            Ok(took) => Some(took.as_millis() as u64),
            Err(e) => {
                tracing::warn!(migration = %key, error = %e, waited = ?started.elapsed(), "switchover: the chassis did not all report the flip");
                None
            }
        }
    };
    let (written, synced) = tokio::join!(writes, sync);
    // the syncer sees the Addresses as written (or not) from here on
    drop(shown);
    // without a direct flip the route moved with the write (the route controller's flip)
    let switchover_ms = match written {
        Ok(written_ms) => flipped_ms.or(Some(written_ms)),
        Err(e) => {
            tracing::warn!(migration = %key, error = %e, "switchover: Address write failed; OVN is re-read");
            for a in &moved {
                super::ovn::request_full(ctx, &a.spec.network);
            }
            flipped_ms
        }
    };
    tracing::info!(migration = %key, ?switchover_ms, chassis_sync_ms = ?synced, "route flipped in the pause window");
    (switchover_ms, synced)
}

/// Long-poll the source shim's events; at `suspended-for-migration` flip the routes (the
/// VM's overlay Addresses) to the target at once and record how long that took.
#[allow(clippy::too_many_arguments)]
fn spawn_switchover(
    ctx: &Arc<Context>,
    m: &VirtualMachineMigration,
    source: &roam_shim_api::client::ShimClient,
    after: u64,
    addresses: Vec<String>,
    source_node: &str,
    target_node: &str,
    (target_client, target_pod): (roam_shim_api::client::ShimClient, String),
    local: &Local,
) {
    let key = format!("{}/{}", m.namespace().unwrap_or_default(), m.name_any());
    let (ctx, client, source_node, target_node, l) = (
        ctx.clone(),
        source.clone(),
        source_node.to_string(),
        target_node.to_string(),
        local.clone(),
    );
    let m = m.clone();
    local.spawn_once(key.clone(), async move {
        let mut seq = after;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(3600);
        while tokio::time::Instant::now() < deadline {
            let evs = match client.events(seq, Duration::from_secs(25)).await {
                Ok(e) => e.events,
                Err(e) => {
                    tracing::debug!(error = %e, "source events");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            };
            let mut done = false;
            for e in evs {
                seq = seq.max(e.seq);
                match e.kind {
                    Lifecycle::SuspendedForMigration | Lifecycle::SuspendedForPostCopy => {
                        l.suspended
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .insert(key.clone(), e.at_unix_ns);
                        // the guest lands on the target within the pause: end the migration
                        // as soon as it does
                        spawn_target_wait(
                            &m,
                            target_client.clone(),
                            target_pod.clone(),
                            Wait::Landed,
                            &l,
                        );
                        if addresses.is_empty() {
                            // VLAN ports only: the target's binding activates on the guest's
                            // RARP, there is no route to flip
                            continue;
                        }
                        let (switchover_ms, chassis_sync_ms) = flip_at_pause(
                            &ctx,
                            (&key, &m, &l),
                            &addresses,
                            (&source_node, &target_node),
                            e.at_unix_ns,
                        )
                        .await;
                        let api: Api<VirtualMachineMigration> =
                            Api::namespaced(ctx.client.clone(), &m.namespace().unwrap_or_default());
                        let _ = api
                            .patch_status(
                                &m.name_any(),
                                &PatchParams::default(),
                                &Patch::Merge(&json!({"status": {
                                    "switchoverMs": switchover_ms,
                                    "chassisSyncMs": chassis_sync_ms,
                                }})),
                            )
                            .await;
                    }
                    Lifecycle::MigratedAway
                    | Lifecycle::Resumed
                    | Lifecycle::Stopped
                    | Lifecycle::Failed => {
                        done = true;
                    }
                    _ => {}
                }
            }
            if done {
                // the guest runs on one side now: decide without waiting for a requeue
                l.kick(&m);
                break;
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A task that runs until it is aborted, and tells (by dropping its guard) when it ends.
    fn forever(ended: &Arc<()>) -> impl std::future::Future<Output = ()> + Send + 'static {
        let guard = ended.clone();
        async move {
            let _guard = guard;
            std::future::pending::<()>().await
        }
    }

    async fn until_dropped(ended: &Arc<()>) {
        for _ in 0..1000 {
            if Arc::strong_count(ended) == 1 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("the task did not end");
    }

    #[tokio::test]
    async fn a_migrations_end_stops_its_tasks_and_only_its() {
        let (kick, _kicked) = mpsc::unbounded();
        let local = Local {
            tasks: Arc::new(Mutex::new(Tasks::default())),
            suspended: Arc::default(),
            kick,
        };
        let (mine, other) = (Arc::new(()), Arc::new(()));
        local.spawn_once("ns/m1".into(), forever(&mine));
        local.spawn_once("Landed:ns/m1".into(), forever(&mine));
        local.spawn_once("ns/m10".into(), forever(&other));
        local.spawn_once("Ready:ns/m10".into(), forever(&other));
        // one per key: a second switchover task for m1 is not started
        local.spawn_once("ns/m1".into(), forever(&mine));
        assert_eq!(Arc::strong_count(&mine), 3);
        assert!(local.running("ns/m1"));

        assert_eq!(local.stop_all("ns/m1"), 2);
        until_dropped(&mine).await;
        assert!(!local.running("ns/m1") && !local.running("Landed:ns/m1"));
        // m10 shares the prefix, not the name: untouched
        assert!(local.running("ns/m10") && local.running("Ready:ns/m10"));
        assert_eq!(Arc::strong_count(&other), 3);
        // the key is free again
        let again = Arc::new(());
        local.spawn_once("ns/m1".into(), forever(&again));
        assert!(local.running("ns/m1"));
        assert_eq!(local.stop_all("ns/m1"), 1);
        until_dropped(&again).await;
    }

    #[tokio::test]
    async fn a_task_that_ends_frees_its_key() {
        let (kick, _kicked) = mpsc::unbounded();
        let local = Local {
            tasks: Arc::new(Mutex::new(Tasks::default())),
            suspended: Arc::default(),
            kick,
        };
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        local.spawn_once("ns/m".into(), async move {
            let _ = rx.await;
        });
        assert!(local.running("ns/m"));
        tx.send(()).unwrap();
        for _ in 0..1000 {
            if !local.running("ns/m") {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("the finished task still holds its key");
    }
}
