//! One reconcile of a migration past its checks: what it reads (the pods, the shims) and
//! what it does for each of [`step`](roam_core::migration::step)'s actions.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::PostParams;
use kube::{Api, ResourceExt};
use roam_shim_api::api::MigrateRequest;
use roam_shim_api::client::ShimClient;
use serde_json::json;

use super::tasks::{self, Local, Wait};
use super::writes::{apply_moves, patch_status};
use super::{key_of, vms};
use crate::controller::{Context, failpoint, launchers, now, ovn, status};
use roam_api::{Address, VirtualMachine, VirtualMachineMigration, VirtualMachineMigrationStatus};
use roam_core::adoption::{Adoption, CREATING, Found, adoption};
use roam_core::vm::readiness::{condition, set_condition};

/// The migration's condition about its target launcher pod, and its reason when the
/// namespace's quota refused the pod.
const TARGET_LAUNCHER: &str = "TargetLauncher";
const QUOTA_EXCEEDED: &str = "QuotaExceeded";
use crate::error::{Error, Result};
use crate::launcher::{LauncherSpec, Mode, launcher_pod, launcher_trouble, shim_url, vm_key};
use roam_core::migration::observe::{
    give_up_after, guest_at, guest_on_target, is_shim_of, job, live, pod_running, record_landing,
    record_progress, record_target_trouble, target_pod_state, timed_out, unrecorded_job,
};
use roam_core::migration::{
    Action, Decision, GuestAt, Job, Observed, Phase, PodState, PortsAt, end,
};
use roam_core::vm::{
    Placement, When, activated_on_target, moves, nics_of_addresses, ports_at, ports_on,
};

/// What a reconcile knows of the migration's two ends.
pub(super) struct Run {
    ctx: Arc<Context>,
    local: Local,
    vm: VirtualMachine,
    key: String,
    source: String,
    target: String,
    target_ip: Option<String>,
    port: u16,
    token: String,
    target_pod: String,
    /// Whether roam's target pod exists (a pod of the name roam did not create does not
    /// count).
    target_pod_exists: bool,
    /// The target pod's UID, when it is roam's.
    target_pod_uid: Option<String>,
    /// The VM's launcher pod's recorded UID (the source pod).
    source_pod_uid: Option<String>,
    addresses: Vec<Arc<Address>>,
    placements: Vec<Placement>,
    pods: Api<Pod>,
    source_client: ShimClient,
}

impl Run {
    /// Look up the nodes, the VM's token and Addresses; name the target pod in `st`.
    pub(super) async fn new(
        ctx: &Arc<Context>,
        local: &Local,
        m: &VirtualMachineMigration,
        vm: &VirtualMachine,
        (source, target): (String, String),
        st: &mut VirtualMachineMigrationStatus,
    ) -> Result<Run> {
        let port = vm
            .status
            .as_ref()
            .and_then(|s| s.shim_port)
            .unwrap_or_default();
        let token = vms::token(ctx, vm).await?;
        let source_ip = vms::ready_node_ip(ctx, &source).await?.unwrap_or_default();
        let target_ip = vms::ready_node_ip(ctx, &target).await?;
        let target_pod = st
            .target_pod
            .get_or_insert_with(|| format!("{}-target", m.name_any()))
            .clone();
        let addresses = vms::vm_addresses(ctx, vm);
        let placements = addresses.iter().map(|a| Placement::of(a)).collect();
        Ok(Run {
            ctx: ctx.clone(),
            local: local.clone(),
            key: key_of(m),
            source_client: vms::client(ctx, vm, &source, &source_ip, port, &token).await?,
            vm: vm.clone(),
            source,
            target,
            target_ip,
            port,
            token,
            target_pod,
            target_pod_exists: false,
            target_pod_uid: None,
            source_pod_uid: vm.status.as_ref().and_then(|s| s.pod_uid.clone()),
            addresses,
            placements,
            pods: Api::namespaced(ctx.client.clone(), &m.namespace().unwrap_or_default()),
        })
    }

    /// The target shim's client (on the target node at `node_ip`).
    async fn client(&self, node_ip: &str) -> Result<ShimClient> {
        vms::client(
            &self.ctx,
            &self.vm,
            &self.target,
            node_ip,
            self.port,
            &self.token,
        )
        .await
    }

    /// Read the pods and ask the shims; the job's figures go into `st`.
    pub(super) async fn observe(
        &mut self,
        m: &VirtualMachineMigration,
        st: &mut VirtualMachineMigrationStatus,
        deleted: bool,
    ) -> Result<Observed> {
        // only the pod roam created, with its runner's state (the target's shim runs there)
        let (target_pod, in_the_way) = self.target(st).await?;
        self.target_pod_exists = target_pod.is_some();
        self.target_pod_uid = target_pod.as_ref().and_then(|p| p.metadata.uid.clone());
        // the target's shim, asked as soon as its pod exists (not when the kubelet gets
        // round to reporting it Running); only the shim of this very pod counts
        let target_status = match (live(target_pod.as_ref()), &self.target_ip) {
            (Some(p), Some(ip)) => self
                .client(ip)
                .await?
                .status()
                .await
                .ok()
                .filter(|s| is_shim_of(s, &self.target_pod, pod_running(p))),
            _ => None,
        };
        let source_pod = match &st.source_pod {
            Some(p) => live(self.pods.get_opt(p).await?.as_ref()).is_some(),
            None => false,
        };
        let on_target = guest_on_target(target_pod.as_ref(), target_status.as_ref());
        // once the guest runs on the target the source's answer changes nothing (the
        // target's completed job has the figures), and while libvirt tears the source domain
        // down it can take seconds: do not ask
        let source_status = if source_pod && !on_target {
            tokio::time::timeout(Duration::from_secs(10), self.source_client.status())
                .await
                .ok()
                .and_then(|r| r.ok())
        } else {
            None
        };
        if st.job_id.is_none()
            && let Some(ip) = &self.target_ip
            && let Some(id) = unrecorded_job(
                source_status.as_ref(),
                &shim_url(ip, self.port, vms::node_api_tls(&self.ctx)),
            )
        {
            tracing::info!(migration = %self.key, job = id, "adopting the copy this migration started");
            st.job_id = Some(id);
        }
        record_progress(st, source_status.as_ref());
        let trouble = live(target_pod.as_ref()).and_then(launcher_trouble);
        record_target_trouble(st, trouble.as_deref(), &now());
        if on_target {
            record_landing(st, target_status.as_ref(), self.local.paused_at(&self.key));
        }
        let start = st.start_time.as_ref().map(|t| t.0);
        Ok(Observed {
            invalid: None,
            deleted,
            timed_out: timed_out(
                give_up_after(m.spec.timeout_seconds, m.spec.allow_post_copy),
                start,
                k8s_openapi::jiff::Timestamp::now(),
            ),
            target_pod: match in_the_way {
                Some(why) => PodState::Failed(why),
                None => target_pod_state(
                    target_pod.as_ref(),
                    &self.target_pod,
                    target_status.as_ref(),
                ),
            },
            target_port: ports_on(&self.placements, &self.target),
            target_uninstalled: target_status
                .as_ref()
                .map(|s| s.uninstalled_ports())
                .unwrap_or_default(),
            source_pod,
            job: job(source_status.as_ref(), st.job_id),
            guest: guest_at(on_target, source_status.as_ref()),
            ports: ports_at(&self.placements, &self.target),
        })
    }

    /// The target pod if it is roam's ([`adoption`]), with its runner's state; or why a pod
    /// of its name is in the way. A UID proven now is recorded in `st`; a pod whose creation
    /// was not recorded is deleted (it is made again).
    async fn target(
        &self,
        st: &mut VirtualMachineMigrationStatus,
    ) -> Result<(Option<Pod>, Option<String>)> {
        let Some(p) = self.pods.get_opt(&self.target_pod).await? else {
            // the namespace's quota refused it: the migration ends, the VM stays
            let refused = st
                .conditions
                .iter()
                .find(|c| c.type_ == TARGET_LAUNCHER && c.reason == QUOTA_EXCEEDED)
                .map(|c| c.message.clone());
            return Ok((None, refused));
        };
        // a runner proves a pod only when no UID is recorded (see adoption): asked only then
        let has_runner = match st.target_pod_uid {
            None => launchers::has_runner(&self.ctx, &p).await?,
            Some(_) => false,
        };
        let uid = p.metadata.uid.clone().unwrap_or_default();
        let found = Found {
            uid: &uid,
            has_runner,
        };
        match adoption(&self.target_pod, st.target_pod_uid.as_deref(), Some(found)) {
            Adoption::Ours | Adoption::Create => {}
            Adoption::Record => st.target_pod_uid = Some(uid),
            Adoption::Replace => {
                tracing::info!(migration = %self.key, pod = %self.target_pod, "a target pod whose creation was not recorded: deleting it, then making it again");
                launchers::delete_exact(&self.ctx, &p).await?;
                return Ok((None, None));
            }
            Adoption::InTheWay(why) => return Ok((None, Some(why))),
        }
        Ok((Some(launchers::view(&self.ctx, p).await?), None))
    }

    /// Start the task that follows the source's events after `after` (the pause: the
    /// switchover's figure; the guest landing: the migration can end).
    fn watch_switchover(
        &self,
        m: &VirtualMachineMigration,
        target: ShimClient,
        after: u64,
    ) -> Result<()> {
        tasks::spawn_switchover(
            &self.ctx,
            m,
            &self.source_client,
            after,
            activated_on_target(&self.placements),
            &self.target,
            (target, self.target_pod.clone()),
            &self.local,
        );
        Ok(())
    }

    /// A restarted controller follows a running job's events again.
    pub(super) async fn watch_running_job(
        &self,
        m: &VirtualMachineMigration,
        o: &Observed,
    ) -> Result<()> {
        if o.job == Job::Running
            && !self.local.running(&self.key)
            && let Some(ip) = &self.target_ip
        {
            let target = self.client(ip).await?;
            self.watch_switchover(m, target, tasks::last_seq(&self.source_client).await)?;
        }
        Ok(())
    }

    async fn apply(&self, when: When) -> Result<()> {
        apply_moves(
            &self.ctx,
            moves(&self.placements, when, &self.source, &self.target),
        )
        .await
    }

    /// Delete launcher pod `name` and its runner: that very pod when its UID is known.
    async fn delete_pod(&self, name: &str, uid: Option<&str>) -> Result<()> {
        let ns = self.vm.namespace().unwrap_or_default();
        match uid.filter(|u| *u != CREATING) {
            Some(uid) => {
                let mut p = Pod::default();
                p.metadata.name = Some(name.to_string());
                p.metadata.namespace = Some(ns);
                p.metadata.uid = Some(uid.to_string());
                launchers::delete_exact(&self.ctx, &p).await
            }
            None => launchers::delete(&self.ctx, &ns, name).await,
        }
    }

    /// Carry out `a` (idempotent).
    pub(super) async fn act(
        &self,
        a: &Action,
        o: &Observed,
        m: &mut VirtualMachineMigration,
        st: &mut VirtualMachineMigrationStatus,
    ) -> Result<()> {
        match a {
            Action::CreateTarget => self.create_target(m, st).await,
            Action::StartMigration => {
                let Some(ip) = &self.target_ip else {
                    return Ok(());
                };
                let req = MigrateRequest {
                    target: shim_url(ip, self.port, vms::node_api_tls(&self.ctx)),
                    target_token: self.token.clone(),
                    bandwidth_mib_s: m.spec.bandwidth_mib_per_second,
                    max_downtime_ms: m.spec.max_downtime_ms,
                    auto_converge: m.spec.auto_converge,
                    post_copy: m.spec.allow_post_copy,
                    timeout_s: m.spec.timeout_seconds,
                    // the source holds the target to the node chosen here (its address is
                    // what its roam certificate names)
                    target_node: Some(self.target.clone()),
                    target_address: Some(ip.clone()),
                };
                // the target's client before the job starts: nothing can keep the switchover
                // from being watched once it runs
                let target = self.client(ip).await?;
                // the events after this point are this job's
                let after = tasks::last_seq(&self.source_client).await;
                let job = self
                    .source_client
                    .migrate(&req)
                    .await
                    .map_err(|source| Error::Shim {
                        vm: vm_key(&self.vm),
                        source,
                    })?;
                failpoint("migration-started");
                st.job_id = Some(job.id);
                // record the job before anything else can happen
                patch_status(&self.ctx, m, st).await?;
                self.watch_switchover(m, target, after)
            }
            Action::AbortMigration => {
                if let Err(e) = self.source_client.abort().await {
                    tracing::warn!(migration = %self.key, error = %e, "abort");
                }
                Ok(())
            }
            // once the guest runs there, every port's main chassis is the target; in the
            // pause nothing moves (the target's binding activates on the guest's RARP)
            Action::PortsToTarget if o.guest == GuestAt::Target => {
                self.apply(When::GuestOnTarget).await
            }
            Action::PortsToTarget => Ok(()),
            Action::PortsToSource => self.apply(When::GuestOnSource).await,
            Action::DeleteSource => {
                // the VM is the target's now, then the source pod goes
                status::vm(
                    &self.ctx,
                    &self.vm,
                    json!({"node": self.target, "pod": self.target_pod,
                           "podUID": self.target_pod_uid}),
                )
                .await?;
                match &st.source_pod {
                    Some(p) => self.delete_pod(p, self.source_pod_uid.as_deref()).await,
                    None => Ok(()),
                }
            }
            Action::DeleteTarget => {
                // only roam's own target: a pod in the way is not roam's to delete
                if let Some(uid) = &self.target_pod_uid {
                    self.delete_pod(&self.target_pod, Some(uid)).await?;
                }
                if o.ports == PortsAt::Source {
                    self.apply(When::TargetGone).await?;
                }
                Ok(())
            }
        }
    }

    /// The VM's ports on the target too (programmed before the pod exists), then the
    /// target launcher pod, pinned to the target node, waiting for the incoming migration.
    async fn create_target(
        &self,
        m: &mut VirtualMachineMigration,
        st: &mut VirtualMachineMigrationStatus,
    ) -> Result<()> {
        let Some(ip) = &self.target_ip else {
            return Ok(());
        };
        if self.addresses.is_empty() {
            return Ok(());
        }
        self.apply(When::PrepareTarget).await?;
        let networks: BTreeSet<&str> = self
            .addresses
            .iter()
            .map(|a| a.spec.network.as_str())
            .collect();
        for n in networks {
            let t = ovn::request(&self.ctx, n);
            ovn::wait(&self.ctx, n, t).await?;
        }
        if self.target_pod_exists {
            return self.ensure_target_runner(m).await;
        }
        let nics = self.target_nics();
        let name = m.name_any();
        let l = self.target_spec(ip, &name, &nics);
        let pod = launcher_pod(&self.ctx.config.vm, &self.vm, &l)?;
        // recorded before it exists: a restart in between finds the name claimed
        st.target_pod_uid = Some(CREATING.into());
        patch_status(&self.ctx, m, st).await?;
        // a pod made between the look and this create is not ours: the next reconcile
        // replaces it (CREATING is recorded)
        let pod = match self.pods.create(&PostParams::default(), &pod).await {
            Ok(p) => p,
            Err(e) => match Error::quota_refusal(&e) {
                Some(why) => {
                    tracing::info!(migration = %self.key, %why, "the target pod is over quota");
                    set_condition(
                        &mut st.conditions,
                        condition(
                            TARGET_LAUNCHER,
                            false,
                            QUOTA_EXCEEDED,
                            &format!(
                                "target pod {} does not fit the namespace's quota (during a \
                                 migration the VM has two launcher pods): {why}",
                                self.target_pod
                            ),
                            None,
                            &now(),
                        ),
                    );
                    return patch_status(&self.ctx, m, st).await;
                }
                None => return Err(e.into()),
            },
        };
        st.target_pod_uid = pod.metadata.uid.clone();
        patch_status(&self.ctx, m, st).await?;
        // with runners, the target's runner too (the new pod's UID is its)
        launchers::ensure_runner(&self.ctx, &self.vm, &l, pod).await?;
        Ok(())
    }

    fn target_nics(&self) -> Vec<roam_core::vm::VmNic> {
        let refs: Vec<&Address> = self.addresses.iter().map(|a| &**a).collect();
        nics_of_addresses(&vm_key(&self.vm), &self.target, &refs)
    }

    fn target_spec<'a>(
        &'a self,
        ip: &'a str,
        migration: &'a str,
        nics: &'a [roam_core::vm::VmNic],
    ) -> LauncherSpec<'a> {
        LauncherSpec {
            pod: self.target_pod.clone(),
            node: &self.target,
            node_ip: ip,
            mode: Mode::Incoming,
            migration: Some(migration),
            source: Some(&self.source),
            nics,
            port: self.port,
            token: &self.token,
        }
    }

    /// With runners: the existing target pod's runner, made if it is missing (e.g. a VM on a
    /// volume, whose runner waits for its pod to run). Nothing without runners.
    async fn ensure_target_runner(&self, m: &VirtualMachineMigration) -> Result<()> {
        let (Some(ip), Some(_)) = (&self.target_ip, &self.ctx.config.vm.runners) else {
            return Ok(());
        };
        let Some(pod) = self.pods.get_opt(&self.target_pod).await? else {
            return Ok(());
        };
        if pod.metadata.deletion_timestamp.is_some() {
            return Ok(());
        }
        let nics = self.target_nics();
        let name = m.name_any();
        launchers::ensure_runner(
            &self.ctx,
            &self.vm,
            &self.target_spec(ip, &name, &nics),
            pod,
        )
        .await?;
        Ok(())
    }

    /// After the actions: a scheduling target is polled until its shim answers; a migration
    /// that ended leaves the ports only where the guest runs.
    pub(super) async fn follow(
        &self,
        m: &VirtualMachineMigration,
        d: &Decision,
        o: &Observed,
    ) -> Result<()> {
        if d.phase == Phase::TargetScheduling
            && let Some(ip) = &self.target_ip
        {
            let client = self.client(ip).await?;
            tasks::spawn_target_wait(m, client, self.target_pod.clone(), Wait::Ready, &self.local);
            if self.target_pod_exists {
                self.ensure_target_runner(m).await?;
            }
        }
        if d.phase.is_terminal() {
            // no task may act on the VM once it settled
            self.local.end(&self.key);
        }
        if let Some(when) = end::ports_at_end(d, o.guest) {
            self.apply(when).await?;
        }
        Ok(())
    }
}
