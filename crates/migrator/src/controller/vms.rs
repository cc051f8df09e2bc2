//! The VirtualMachine controller: a VirtualMachine whose Networks admit its namespace and
//! the classes it asks for gets its Address (owner = the VM, claimed on the chosen node with
//! the pod controller's claim code) and its OVN port **before** its launcher pod exists; then
//! a host-network launcher pod pinned to that node runs roam-shim with everything it needs
//! on its command line (MAC, OVN port, tap), so the shim never waits for an annotation.
//! Status: phase, node, interfaces (ip/mac), the shim's port, a Ready condition, Events.
//!
//! The annotation `roam.dev/migrate-to` is answered here too: it becomes a
//! VirtualMachineMigration labelled `roam.dev/vm=<vm>` (see [`super::migrations`]) and is
//! removed. While a migration runs, the migration controller owns the VM's pods and status.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim, Pod, Secret};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Config as ControllerConfig};
use kube::runtime::{Controller, watcher};
use kube::{Api, Resource, ResourceExt};
use roam_shim_api::api::DomainState;
use roam_shim_api::client::ShimClient;
use roam_shim_api::tls::ClientTls;
use serde_json::json;

use super::launchers;
use super::retry::{Retry, object_key};
use super::{Context, now, ovn, pods, status};
use crate::error::{Error, Result};
use crate::launcher::{LAUNCHER_LABEL, LauncherSpec, launcher_pod, shim_url, token_secret, vm_key};
use crate::launcher::{
    Mode, RUNNER_LABEL, RUNNER_VM_ANNOTATION, launcher_trouble, pod_failed, pod_running,
};
use roam_api::{
    Address, MIGRATE_TO, MigrateTo, VirtualMachine, VirtualMachineMigration,
    VirtualMachineMigrationSpec, VirtualMachineStatus, VmPhase, parse_migrate_to,
};
use roam_contract::keys::VM_FINALIZER;
use roam_core::adoption::{Adoption, CREATING, Found, adoption};
use roam_core::claim::VM_LABEL;
use roam_core::placement::{self, Need, NodeFacts, Taint};
use roam_core::vm::decide::{self, Admit, requeue};
use roam_core::vm::readiness::{condition, set_condition};
use roam_core::vm::tap_name;
use roam_core::vm::{VmNic, interface_status, nics as vm_nics, resolve_vm_for};
use roam_core::vm::{teardown, validate, volume};

/// The label of a token Secret naming its VM's namespace.
const VM_NAMESPACE_LABEL: &str = "roam.dev/vm-namespace";
/// The Secret key of a VM's shim token.
const TOKEN_KEY: &str = "token";

/// The VM controller's context: what every controller shares, and the shim ports it picked
/// that no VM's status holds yet (two reconciles at once must not pick the same).
pub(super) struct Vms {
    shared: Arc<Context>,
    ports: std::sync::Mutex<roam_core::vm::PortBook>,
}

impl Vms {
    pub(super) fn new(shared: Arc<Context>) -> Arc<Vms> {
        Arc::new(Vms {
            shared,
            ports: std::sync::Mutex::new(roam_core::vm::PortBook::new()),
        })
    }
}

impl std::ops::Deref for Vms {
    type Target = Context;
    fn deref(&self) -> &Context {
        &self.shared
    }
}

pub(super) async fn run(ctx: Arc<Vms>) {
    let api: Api<VirtualMachine> = match &ctx.config.pod_namespace {
        Some(ns) => Api::namespaced(ctx.client.clone(), ns),
        None => Api::all(ctx.client.clone()),
    };
    let pods: Api<Pod> = match &ctx.config.pod_namespace {
        Some(ns) => Api::namespaced(ctx.client.clone(), ns),
        None => Api::all(ctx.client.clone()),
    };
    let retry = Retry::new("vm_errors");
    let policy = retry.clone();
    let mut controller = Controller::new(api, watcher::Config::default()).owns(
        pods,
        watcher::Config::default().labels(&format!("{LAUNCHER_LABEL}=true")),
    );
    if let Some(r) = &ctx.config.vm.runners {
        // a runner's change is its VM's
        let runners: Api<Pod> = Api::namespaced(ctx.client.clone(), &r.namespace);
        controller = controller.watches(
            runners,
            watcher::Config::default().labels(&format!("{RUNNER_LABEL}=true")),
            |r| {
                let (ns, name) = r.annotations().get(RUNNER_VM_ANNOTATION)?.split_once('/')?;
                Some(kube::runtime::reflector::ObjectRef::new(name).within(ns))
            },
        );
    }
    controller
        .with_config(ControllerConfig::default().concurrency(ctx.config.concurrency))
        .run(
            move |vm, c| {
                let retry = retry.clone();
                async move { retry.outcome(&object_key(&*vm), reconcile(vm, c).await) }
            },
            move |vm, e, c| policy.policy(&object_key(&*vm), e, &c.metrics),
            ctx.clone(),
        )
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(error = %e, "vm reconcile");
            }
        })
        .await;
}

/// A node's InternalIP, if it is Ready.
pub(super) async fn ready_node_ip(ctx: &Context, node: &str) -> Result<Option<String>> {
    let api: Api<Node> = Api::all(ctx.client.clone());
    let Some(n) = api.get_opt(node).await? else {
        return Ok(None);
    };
    Ok(node_ip_if_ready(&n))
}

fn node_ip_if_ready(n: &Node) -> Option<String> {
    let st = n.status.as_ref()?;
    let ready = st
        .conditions
        .as_ref()?
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    if !ready {
        return None;
    }
    st.addresses
        .as_ref()?
        .iter()
        .find(|a| a.type_ == "InternalIP")
        .map(|a| a.address.clone())
}

/// What the scheduler would weigh of each node of the node selector (see
/// [`roam_core::placement`]): readiness, cordon, taints, labels, allocatable memory and
/// CPU and what the pods bound to it (not finished) request.
pub(super) async fn node_facts(ctx: &Context) -> Result<Vec<NodeFacts>> {
    let api: Api<Node> = Api::all(ctx.client.clone());
    let mut lp = ListParams::default();
    if let Some(s) = &ctx.config.node_selector {
        lp = lp.labels(s);
    }
    let nodes = api.list(&lp).await?.items;
    let pods: Api<Pod> = Api::all(ctx.client.clone());
    let live = ListParams::default().fields("status.phase!=Succeeded,status.phase!=Failed");
    // (MiB, millicores) requested on each node
    let mut requested: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for p in pods.list(&live).await?.items {
        let Some(spec) = p.spec else { continue };
        let Some(node) = spec.node_name else { continue };
        let sum = |what: &str, parse: fn(&str) -> Option<u64>| -> u64 {
            spec.containers
                .iter()
                .filter_map(|c| c.resources.as_ref()?.requests.as_ref()?.get(what))
                .filter_map(|q| parse(&q.0))
                .sum()
        };
        let r = requested.entry(node).or_default();
        r.0 += sum("memory", placement::memory_mib);
        r.1 += sum("cpu", placement::millicpu);
    }
    Ok(nodes
        .iter()
        .map(|n| facts_of(n, requested.get(&n.name_any()).copied().unwrap_or_default()))
        .collect())
}

/// What VM `vm`'s launcher pod needs of a node, at the configured CPU allocation ratio.
pub(super) fn need_of(ctx: &Context, vm: &VirtualMachine) -> Need {
    Need::of(&vm.spec, ctx.config.vm.cpu_allocation_ratio)
}

/// What placement needs to know of node `n`, on which pods request `requested` (MiB,
/// millicores).
fn facts_of(n: &Node, requested: (u64, u64)) -> NodeFacts {
    let spec = n.spec.clone().unwrap_or_default();
    let allocatable = |what: &str| {
        n.status
            .as_ref()
            .and_then(|s| s.allocatable.as_ref()?.get(what))
            .map(|q| q.0.clone())
    };
    NodeFacts {
        name: n.name_any(),
        ready: node_ip_if_ready(n).is_some(),
        unschedulable: spec.unschedulable.unwrap_or(false),
        taints: spec
            .taints
            .unwrap_or_default()
            .into_iter()
            .map(|t| Taint {
                key: t.key,
                value: t.value.unwrap_or_default(),
                effect: t.effect,
            })
            .collect(),
        labels: n.labels().clone(),
        allocatable_mib: allocatable("memory")
            .and_then(|q| placement::memory_mib(&q))
            .unwrap_or(0),
        requested_mib: requested.0,
        allocatable_millicpu: allocatable("cpu").and_then(|q| placement::millicpu(&q)),
        requested_millicpu: requested.1,
    }
}

/// The VM's token (its Secret in roam's own namespace, created with a random token the first
/// time). Never in the VM's namespace: a tenant does not read it, and roam-controller needs
/// Secrets in no namespace but its own.
pub(super) async fn token(ctx: &Context, vm: &VirtualMachine) -> Result<String> {
    let ns = ctx.config.secret_namespace.clone();
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
    let name = token_secret(&vm.uid().unwrap_or_default());
    let read = |s: &Secret| {
        s.data
            .as_ref()
            .and_then(|d| d.get(TOKEN_KEY))
            .map(|b| String::from_utf8_lossy(&b.0).trim().to_string())
    };
    if let Some(s) = api.get_opt(&name).await?
        && let Some(t) = read(&s)
    {
        return Ok(t);
    }
    let mut bytes = [0u8; 24];
    use std::io::Read;
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut bytes))
        .map_err(|e| Error::Conflict(format!("read /dev/urandom for a token: {e}")))?;
    let token: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let secret: Secret = serde_json::from_value(json!({
        // no ownerReference (it cannot cross namespaces): the VM's teardown deletes it
        "metadata": {"name": name, "namespace": ns,
                     "labels": {VM_LABEL: vm.name_any(),
                                VM_NAMESPACE_LABEL: vm.namespace().unwrap_or_default()}},
        "stringData": {TOKEN_KEY: token},
    }))
    .expect("a Secret");
    match api.create(&PostParams::default(), &secret).await {
        Ok(_) => Ok(token),
        Err(e) if Error::is_conflict(&e) => {
            let s = api.get(&name).await?;
            read(&s).ok_or_else(|| Error::Conflict(format!("secret {name} has no token")))
        }
        Err(e) => Err(e.into()),
    }
}

/// Whether the shims' API is mutual TLS (the launchers have the nodes' roam identities).
pub(super) fn node_api_tls(ctx: &Context) -> bool {
    ctx.config.vm.node_pki_dir.is_some()
}

/// A shim client for the VM on `node` at `node_ip`: over mutual TLS with roam-controller's
/// certificate when the launchers have the nodes' identities (the shim's certificate must
/// name `node`), else plain HTTP.
pub(super) async fn client(
    ctx: &Context,
    vm: &VirtualMachine,
    node: &str,
    node_ip: &str,
    port: u16,
    token: &str,
) -> Result<ShimClient> {
    let shim = |source| Error::Shim {
        vm: vm_key(vm),
        source,
    };
    if !node_api_tls(ctx) {
        return ShimClient::new(&shim_url(node_ip, port, false), token).map_err(shim);
    }
    let Some(pki) = &ctx.config.pki else {
        return Err(Error::Pki(
            "the launchers serve the node API over mutual TLS (--node-pki-dir) but this \
             controller holds no roam CA to issue its client certificate from: give \
             --pki-namespace"
                .into(),
        ));
    };
    let tls = ClientTls {
        identity: ctx.node_identity.get(&ctx.client, pki).await?,
        server_name: node.to_string(),
    };
    ShimClient::with_tls(&shim_url(node_ip, port, true), token, &tls).map_err(shim)
}

/// The VM's Addresses as the index knows them (not soft-deleted), by interface name.
pub(super) fn vm_addresses(ctx: &Context, vm: &VirtualMachine) -> Vec<Arc<Address>> {
    let owner = vm_key(vm);
    let idx = ctx.index.lock().expect("index lock");
    let mut found: Vec<Arc<Address>> = idx
        .networks
        .keys()
        .flat_map(|n| idx.of_network(n))
        .filter(|a| a.spec.owner.as_deref() == Some(owner.as_str()) && !a.spec.deleted)
        .collect();
    found.sort_by_key(|a| a.spec.interface.clone());
    found
}

/// Add (`on`) or remove the VM's [`VM_FINALIZER`] (see [`super::set_finalizer`]); a VM
/// gone by the time its finalizer is removed is fine.
async fn set_finalizer(ctx: &Context, vm: &VirtualMachine, on: bool) -> Result<()> {
    match super::set_finalizer(&ctx.client, vm, VM_FINALIZER, on).await {
        Ok(_) => Ok(()),
        Err(e) if !on && Error::is_not_found(&e) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// A deleted VM: end its migration, tear it down on every node its launcher pods are on
/// (see [`teardown::plan`]), delete the pods, then let the VM go. Its Addresses stay held
/// until then (see the operator's sweep), so no one else gets an IP, MAC or OVN port whose
/// tap may still be on a node.
async fn teardown(ctx: &Context, vm: &VirtualMachine) -> Result<Action> {
    if !vm.finalizers().iter().any(|f| f == VM_FINALIZER) {
        return Ok(Action::await_change());
    }
    let seen = observe_teardown(ctx, vm).await?;
    let plan = teardown::plan(
        seen.migration.as_ref().map(|(m, _)| m.as_str()),
        &seen.launchers,
    );
    let mut message = teardown::message(&plan);
    match &plan {
        teardown::Plan::Done if launchers::sweep(ctx, vm).await? > 0 => {
            // the launcher pods are gone: their runners go with them
            message = format!("{message}; waiting for the runners to go");
        }
        teardown::Plan::Done => {
            tracing::info!(vm = %vm_key(vm), "torn down on every node: letting it go");
            let_go(ctx, vm).await?;
            return Ok(Action::await_change());
        }
        teardown::Plan::EndMigration(name) => {
            let (_, mig) = seen.migration.as_ref().expect("planned from it");
            end_migration(ctx, vm, name, mig).await?;
        }
        teardown::Plan::Pods(steps) => {
            // read at the pass's first shim teardown, once (a pass that only deletes pods
            // must not make the token Secret again: token() creates a missing one)
            let mut token = None;
            for (pod, step) in steps {
                if let Some(why) = carry_out(ctx, vm, &seen, &mut token, pod, step).await? {
                    message = format!("{message} ({why})");
                }
            }
        }
    }
    let mut next = vm.status.clone().unwrap_or_default();
    let deleting = condition(
        "Ready",
        false,
        "Deleting",
        &message,
        vm.metadata.generation,
        &now(),
    );
    set_condition(&mut next.conditions, deleting);
    patch_status(ctx, vm, &next).await?;
    Ok(Action::requeue(Duration::from_secs(1)))
}

/// What a deleted VM's teardown knows: its migration, its launcher pods (with their runners'
/// state) and the IP of each one's node when it is Ready.
struct TeardownSeen {
    migration: Option<(String, VirtualMachineMigration)>,
    launchers: Vec<teardown::Launcher>,
    /// Per launcher pod, its node and that node's IP (`None`: not Ready, or unscheduled).
    nodes: BTreeMap<String, Option<(String, String)>>,
}

async fn observe_teardown(ctx: &Context, vm: &VirtualMachine) -> Result<TeardownSeen> {
    let ns = vm.namespace().unwrap_or_default();
    let st = vm.status.clone().unwrap_or_default();
    let migration = match &st.migration {
        Some(m) => {
            let api: Api<VirtualMachineMigration> = Api::namespaced(ctx.client.clone(), &ns);
            api.get_opt(m).await?.map(|mig| (m.clone(), mig))
        }
        None => None,
    };
    let pods_api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let uid = vm.uid().unwrap_or_default();
    let mut pods: Vec<Pod> = pods_api
        .list(&ListParams::default().labels(&format!("{VM_LABEL}={}", vm.name_any())))
        .await?
        .items
        .into_iter()
        .filter(|p| teardown::is_launcher_of(p, &uid))
        .collect();
    // and every pod a runner of the VM runs for, whatever its labels say now
    for p in launchers::of_runners(ctx, vm).await? {
        if !pods.iter().any(|q| q.metadata.uid == p.metadata.uid) {
            pods.push(p);
        }
    }
    let mut seen = TeardownSeen {
        migration,
        launchers: Vec::new(),
        nodes: BTreeMap::new(),
    };
    for p in pods {
        // with its runner's state (the shim runs there)
        let p = launchers::view(ctx, p).await?;
        let node = p.spec.as_ref().and_then(|s| s.node_name.clone());
        let ip = match &node {
            Some(n) => ready_node_ip(ctx, n).await?,
            None => None,
        };
        seen.launchers
            .push(teardown::Launcher::of(&p, ip.is_some()));
        seen.nodes
            .insert(p.name_any(), ip.map(|ip| (node.unwrap_or_default(), ip)));
    }
    Ok(seen)
}

/// Torn down everywhere: the VM's token goes, then its finalizer (and with it the VM).
async fn let_go(ctx: &Context, vm: &VirtualMachine) -> Result<()> {
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ctx.config.secret_namespace);
    match secrets
        .delete(
            &token_secret(&vm.uid().unwrap_or_default()),
            &DeleteParams::default(),
        )
        .await
    {
        Ok(_) => {}
        Err(e) if Error::is_not_found(&e) => {}
        Err(e) => return Err(e.into()),
    }
    set_finalizer(ctx, vm, false).await
}

/// A deleted VM's running migration ends first: deleted, its own finalizer aborts the copy
/// (or, past the pause, lets it land).
async fn end_migration(
    ctx: &Context,
    vm: &VirtualMachine,
    name: &str,
    mig: &VirtualMachineMigration,
) -> Result<()> {
    if mig.metadata.deletion_timestamp.is_some() {
        return Ok(());
    }
    let api: Api<VirtualMachineMigration> =
        Api::namespaced(ctx.client.clone(), &vm.namespace().unwrap_or_default());
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => {}
        Err(e) if Error::is_not_found(&e) => {}
        Err(e) => return Err(e.into()),
    }
    tracing::info!(vm = %vm_key(vm), migration = %name, "VM deleted: ending its migration first");
    Ok(())
}

/// One launcher pod's teardown step; `Some`: why it waits (its shim did not answer).
async fn carry_out(
    ctx: &Context,
    vm: &VirtualMachine,
    seen: &TeardownSeen,
    token: &mut Option<String>,
    pod: &str,
    step: &teardown::Step,
) -> Result<Option<String>> {
    let mut waiting = None;
    let delete = match step {
        teardown::Step::Teardown => {
            let (node, node_ip) = seen.nodes.get(pod).cloned().flatten().unwrap_or_default();
            let port = vm
                .status
                .as_ref()
                .and_then(|s| s.shim_port)
                .unwrap_or_default();
            let token = match token {
                Some(t) => t,
                None => token.insert(self::token(ctx, vm).await?),
            };
            match client(ctx, vm, &node, &node_ip, port, token)
                .await?
                .teardown()
                .await
            {
                Ok(done) => {
                    tracing::info!(vm = %vm_key(vm), %pod, destroyed_domain = done.destroyed_domain, removed_taps = ?done.removed_taps, "torn down");
                    ctx.event(
                        vm.object_ref(&()),
                        false,
                        "TornDown",
                        "Delete",
                        teardown::torn_down_note(pod, &done),
                    );
                    true
                }
                Err(e) => {
                    tracing::info!(vm = %vm_key(vm), %pod, error = %e, "teardown: the shim did not answer");
                    waiting = Some(format!("{pod}'s shim: {e}"));
                    false
                }
            }
        }
        teardown::Step::Delete => true,
        teardown::Step::Abandon(why) => {
            tracing::warn!(vm = %vm_key(vm), %pod, %why, "deleting a launcher without a teardown");
            ctx.event(
                vm.object_ref(&()),
                true,
                "TeardownSkipped",
                "Delete",
                format!(
                    "{pod}: deleted without a teardown, its shim never stays up ({why}); a tap or OVS port an earlier run of it made may remain on its node"
                ),
            );
            true
        }
        teardown::Step::Wait(_) => false,
    };
    let terminating = seen.launchers.iter().any(|l| l.pod == pod && l.deleting);
    if delete && !terminating {
        launchers::delete(ctx, &vm.namespace().unwrap_or_default(), pod).await?;
    }
    Ok(waiting)
}

/// Pick a free shim port: one no other VM uses.
async fn allocate_port(ctx: &Vms, vm: &VirtualMachine) -> Result<u16> {
    let api: Api<VirtualMachine> = Api::all(ctx.client.clone());
    let used: BTreeMap<String, u16> = api
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter_map(|v| Some((v.uid()?, v.status.as_ref()?.shim_port?)))
        .collect();
    let (lo, hi) = ctx.config.vm.shim_ports;
    // start at a point derived from the VM, so picks spread over the range
    let start = tap_name(&vm_key(vm))
        .bytes()
        .fold(0u64, |a, b| a.wrapping_mul(31).wrapping_add(b as u64));
    let span = (hi.saturating_sub(lo)) as u64 + 1;
    ctx.ports
        .lock()
        .expect("port book lock")
        .pick(&vm.uid().unwrap_or_default(), start % span, (lo, hi), &used)
        .ok_or_else(|| {
            Error::invalid_vm(
                vm_key(vm),
                format!("no free shim port in {lo}-{hi}; widen --shim-ports"),
            )
        })
}

async fn patch_status(ctx: &Context, vm: &VirtualMachine, st: &VirtualMachineStatus) -> Result<()> {
    if vm.status.as_ref() == Some(st) {
        return Ok(());
    }
    status::vm(ctx, vm, json!(st)).await
}

pub(super) async fn reconcile(vm: Arc<VirtualMachine>, ctx: Arc<Vms>) -> Result<Action> {
    if !ctx.in_scope(&vm.namespace().unwrap_or_default()).await? {
        // another roam-controller's namespace (--namespace-selector)
        return Ok(Action::await_change());
    }
    if vm.metadata.deletion_timestamp.is_some() {
        return teardown(&ctx, &vm).await;
    }
    ctx.wait_synced().await;
    let mut st = vm.status.clone().unwrap_or_default();
    let admit = decide::admit(&observe(&ctx, &vm, &st).await?);
    if let Admit::Refuse {
        reason,
        message,
        until_edited,
    } = admit
    {
        let action = refuse(&ctx, &vm, st, reason, message).await?;
        return Ok(if until_edited {
            Action::await_change()
        } else {
            action
        });
    }
    // before anything exists for it: a deleted VM is held until it is gone from every node
    set_finalizer(&ctx, &vm, true).await?;
    match admit {
        Admit::Refuse { .. } | Admit::Start => {}
        Admit::Migrate(value) => {
            trigger_migration(&ctx, &vm, &value).await?;
            return Ok(Action::requeue(requeue::MIGRATE));
        }
        Admit::HandOff => return Ok(Action::requeue(requeue::HAND_OFF)),
        Admit::WaitForVolume(why) => {
            wait_pending(&ctx, &vm, st, "VolumeNotReady", why).await?;
            return Ok(Action::requeue(requeue::VOLUME));
        }
    }
    let launched = match start(&ctx, &vm, &mut st).await? {
        Started::Launched(l) => l,
        Started::Wait(action) => return Ok(action),
    };
    let out = decide::outcome(&st, &launched, vm.metadata.generation, &now());
    patch_status(&ctx, &vm, &out.status).await?;
    for n in out.notes {
        if n.warning {
            tracing::warn!(vm = %vm_key(&vm), node = %launched.node, reason = n.reason, "{}", n.message);
        }
        ctx.event(vm.object_ref(&()), n.warning, n.reason, n.action, n.message);
    }
    Ok(Action::requeue(out.requeue))
}

/// What [`decide::admit`] needs of a VM, read in the order the decision asks for it: its
/// spec's problems while nothing exists for it, its Networks' refusal while no migration
/// runs, its boot claim while it has no launcher pod.
async fn observe(
    ctx: &Context,
    vm: &VirtualMachine,
    st: &VirtualMachineStatus,
) -> Result<decide::Seen> {
    let mut seen = decide::Seen {
        key: vm_key(vm),
        started: st.node.is_some() || st.pod.is_some(),
        migrate_to: vm.annotations().get(MIGRATE_TO).cloned(),
        migrating: st.migration.is_some(),
        ..Default::default()
    };
    if !seen.started {
        seen.problems = validate::problems(
            &vm.namespace().unwrap_or_default(),
            &vm.name_any(),
            &vm.spec,
            ctx.config.vm.image_root.as_deref(),
        );
        if !seen.problems.is_empty() {
            return Ok(seen);
        }
    }
    if !seen.migrating {
        // a Network that does not admit the VM's namespace, or the class an interface asks
        // for: nothing is claimed or created (the held interfaces of a running VM pass)
        match may_use(ctx, vm).await {
            Ok(()) => {}
            Err(e) if e.is_bad_input() => {
                seen.refused = Some((e.reason(), e.to_string()));
                return Ok(seen);
            }
            Err(e) => return Err(e),
        }
    }
    if st.pod.is_none()
        && seen.migrate_to.is_none()
        && !seen.migrating
        && let Some((claim_name, claim)) = boot_claim(ctx, vm).await?
    {
        seen.volume_not_ready = volume::not_ready(&claim_name, claim.as_ref());
    }
    Ok(seen)
}

/// How far [`start`] got.
enum Started {
    /// The launcher pod is there (and its runner): what it and its shim say.
    Launched(decide::Launched),
    /// Not yet (status written with the reason): look again then.
    Wait(Action),
}

/// Place the VM, claim its Addresses, give it a shim port and its launcher pod (recorded in
/// `st`), then ask its shim. Bad input on the way is refused (status and Event).
async fn start(ctx: &Vms, vm: &VirtualMachine, st: &mut VirtualMachineStatus) -> Result<Started> {
    let (node, node_ip) = match place(ctx, vm, st).await {
        Ok(Some(placed)) => placed,
        Ok(None) => return Ok(Started::Wait(Action::requeue(Duration::from_secs(5)))),
        Err(e) => return refuse_or(ctx, vm, st, e).await,
    };
    let pod_name = st
        .pod
        .clone()
        .unwrap_or_else(|| format!("{}-launcher", vm.name_any()));
    let nics = match claim_addresses(&ctx.shared, vm, &node, &pod_name).await {
        Ok(nics) => nics,
        Err(e) => return refuse_or(ctx, vm, st, e).await,
    };
    let port = match st.shim_port {
        Some(p) => p,
        None => allocate_port(ctx, vm).await?,
    };
    let token = token(ctx, vm).await?;
    let spec = LauncherSpec {
        pod: pod_name.clone(),
        node: &node,
        node_ip: &node_ip,
        mode: Mode::Boot,
        migration: None,
        source: None,
        nics: &nics,
        port,
        token: &token,
    };
    let pod = match ensure_launcher(ctx, vm, st, &spec).await {
        Ok(Launcher::Pod(p)) => *p,
        Ok(Launcher::Replaced) => {
            return Ok(Started::Wait(Action::requeue(Duration::from_secs(1))));
        }
        Ok(Launcher::OverQuota(why)) => {
            let why = format!(
                "the launcher pod, which requests the VM's CPU and memory, does not fit the \
                 namespace's quota: {why}"
            );
            tracing::info!(vm = %vm_key(vm), %why, "over quota");
            wait_pending(ctx, vm, st.clone(), "QuotaExceeded", why).await?;
            // a quota raised or freed is not watched: look again
            return Ok(Started::Wait(Action::requeue(Duration::from_secs(15))));
        }
        Ok(Launcher::InTheWay(why)) => {
            tracing::warn!(vm = %vm_key(vm), %why, "launcher pod in the way");
            wait_pending(ctx, vm, st.clone(), "LauncherInTheWay", why).await?;
            // a tenant's pod is not watched: look again
            return Ok(Started::Wait(Action::requeue(Duration::from_secs(10))));
        }
        Err(e) => return refuse_or(ctx, vm, st, e).await,
    };
    // a runner whose launcher pod is gone (deleted by anyone) goes too: the VM runs only
    // while its pod, which holds its requests, does
    launchers::sweep(ctx, vm).await?;
    let shim = if pod_running(&pod) {
        ask_shim(ctx, vm, &spec, &token).await?
    } else {
        None
    };
    Ok(Started::Launched(decide::Launched {
        node,
        pod: pod_name,
        port,
        interfaces: interface_status(&nics),
        pod_failed: pod_failed(&pod),
        trouble: launcher_trouble(&pod),
        shim,
    }))
}

/// Bad input refused as the VM's (status and Event); any other error retried with backoff.
async fn refuse_or(
    ctx: &Context,
    vm: &VirtualMachine,
    st: &VirtualMachineStatus,
    e: Error,
) -> Result<Started> {
    if !e.is_bad_input() {
        return Err(e);
    }
    let action = refuse(ctx, vm, st.clone(), e.reason(), e.to_string()).await?;
    Ok(Started::Wait(action))
}

/// The VM's node — where it runs, else the requested one, else the one
/// [`placement::pick`] chooses — and its IP; `None` (status written: Scheduling, with why)
/// while there is none.
async fn place(
    ctx: &Context,
    vm: &VirtualMachine,
    st: &mut VirtualMachineStatus,
) -> Result<Option<(String, String)>> {
    let (node, unplaced) = match st.node.clone().or_else(|| vm.spec.node.clone()) {
        Some(n) => (Some(n), None),
        None => match placement::pick(&node_facts(ctx).await?, None, &need_of(ctx, vm)) {
            Ok(n) => (Some(n), None),
            Err(why) => (None, Some(why)),
        },
    };
    let found = match &node {
        Some(n) => Api::<Node>::all(ctx.client.clone()).get_opt(n).await?,
        None => None,
    };
    if let (None, Some(_), Some(n)) = (&st.node, &vm.spec.node, &found) {
        // pinned to a node that could never hold the VM: refused, not waited for
        if let Some(why) = placement::never_fits(&facts_of(n, (0, 0)), &need_of(ctx, vm)) {
            return Err(Error::invalid_vm(
                vm_key(vm),
                format!("{why}: pin it to a larger node (spec.node) or leave spec.node out"),
            ));
        }
    }
    let ip = found.as_ref().and_then(node_ip_if_ready);
    if let (Some(node), Some(ip)) = (node.clone(), ip) {
        return Ok(Some((node, ip)));
    }
    let (reason, msg) = match node {
        None => ("NoNode", unplaced.unwrap_or_else(|| "no node".into())),
        Some(n) => (
            "NodeNotReady",
            format!("node {n} does not exist or is not Ready"),
        ),
    };
    let told = st
        .conditions
        .iter()
        .any(|c| c.type_ == "Ready" && c.reason == reason);
    if !told {
        // once per reason, not on every retry
        ctx.event(vm.object_ref(&()), true, reason, "Schedule", msg.clone());
    }
    st.phase = VmPhase::Scheduling;
    set_condition(
        &mut st.conditions,
        condition("Ready", false, reason, &msg, vm.metadata.generation, &now()),
    );
    patch_status(ctx, vm, st).await?;
    Ok(None)
}

/// Whether the VM's interfaces may have their Networks and service classes
/// ([`Context::may_use`]). Interfaces that name no usable Network pass here: the claim
/// refuses them ([`claim_addresses`]).
async fn may_use(ctx: &Context, vm: &VirtualMachine) -> Result<()> {
    let key = vm_key(vm);
    let plans = ctx.index.lock().expect("index lock").plans();
    let admitting = ctx
        .admitting(&vm.namespace().unwrap_or_default(), &plans)
        .await?;
    let Ok(resolved) = resolve_vm_for(&key, &vm.spec, &plans, &admitting) else {
        return Ok(());
    };
    ctx.may_use(
        &format!("virtual machine {key}"),
        &vm.namespace().unwrap_or_default(),
        &key,
        &resolved,
    )
    .await
}

/// Every interface's Address, claimed (or reused) on `node` before the pod exists, and its
/// OVN port programmed; the interfaces are checked first (and their Networks' access rules
/// in [`reconcile`], before this), so bad input claims nothing.
async fn claim_addresses(
    ctx: &Arc<Context>,
    vm: &VirtualMachine,
    node: &str,
    pod_name: &str,
) -> Result<Vec<VmNic>> {
    let key = vm_key(vm);
    let pod_key = format!("{}/{pod_name}", vm.namespace().unwrap_or_default());
    let plans = ctx.index.lock().expect("index lock").plans();
    let admitting = ctx
        .admitting(&vm.namespace().unwrap_or_default(), &plans)
        .await?;
    let resolved = resolve_vm_for(&key, &vm.spec, &plans, &admitting)?;
    let mut held: Vec<Arc<Address>> = Vec::new();
    for r in &resolved {
        held.push(pods::claim(ctx, &pod_key, &key, node, r).await?);
    }
    let networks: BTreeSet<&str> = resolved.iter().map(|r| r.network.name.as_str()).collect();
    let tickets: Vec<(&str, u64)> = networks
        .iter()
        .map(|n| (*n, ovn::request(ctx, n)))
        .collect();
    for (n, t) in tickets {
        ovn::wait(ctx, n, t).await?;
    }
    let held_refs: Vec<&Address> = held.iter().map(|a| &**a).collect();
    vm_nics(&key, node, &resolved, &held_refs).ok_or_else(|| {
        Error::Conflict(format!(
            "{key}: an interface has no Address after its claim; retrying"
        ))
    })
}

/// The VM's launcher pod: the existing one, or a new one (an Event says where).
/// What became of the VM's launcher pod in one reconcile.
enum Launcher {
    /// roam's pod (with its runner's state).
    Pod(Box<Pod>),
    /// A pod roam may have made without recording it was deleted: made again shortly.
    Replaced,
    /// A pod roam did not create holds the name (why).
    InTheWay(String),
    /// The namespace's ResourceQuota refused the pod (the quota admission's words).
    OverQuota(String),
}

/// The VM's launcher pod, created if missing, with its runner made; only a pod roam created
/// is used ([`adoption`]): its UID is recorded in `st` (and in the VM's status at once: a
/// later write of `st` keeps it).
async fn ensure_launcher(
    ctx: &Context,
    vm: &VirtualMachine,
    st: &mut VirtualMachineStatus,
    spec: &LauncherSpec<'_>,
) -> Result<Launcher> {
    let pods_api: Api<Pod> =
        Api::namespaced(ctx.client.clone(), &vm.namespace().unwrap_or_default());
    let existing = pods_api.get_opt(&spec.pod).await?;
    // a runner proves a pod only when no UID is recorded (see adoption): asked only then
    let has_runner = match &existing {
        Some(p) if st.pod_uid.is_none() => launchers::has_runner(ctx, p).await?,
        _ => false,
    };
    let found = existing.as_ref().map(|p| Found {
        uid: p.metadata.uid.as_deref().unwrap_or_default(),
        has_runner,
    });
    match adoption(&spec.pod, st.pod_uid.as_deref(), found) {
        Adoption::Ours => {
            let p = existing.expect("found");
            return Ok(Launcher::Pod(Box::new(
                launchers::ensure_runner(ctx, vm, spec, p).await?,
            )));
        }
        Adoption::Record => {
            let p = existing.expect("found");
            record_pod(ctx, vm, st, &spec.pod, p.metadata.uid.as_deref()).await?;
            return Ok(Launcher::Pod(Box::new(
                launchers::ensure_runner(ctx, vm, spec, p).await?,
            )));
        }
        Adoption::Replace => {
            let p = existing.expect("found");
            tracing::info!(vm = %vm_key(vm), pod = %spec.pod, "a launcher pod whose creation was not recorded: deleting it, then making it again");
            launchers::delete_exact(ctx, &p).await?;
            return Ok(Launcher::Replaced);
        }
        Adoption::InTheWay(why) => return Ok(Launcher::InTheWay(why)),
        Adoption::Create => {}
    }
    let pod = launcher_pod(&ctx.config.vm, vm, spec)?;
    record_pod(ctx, vm, st, &spec.pod, Some(CREATING)).await?;
    // a pod made between the look and this create is not ours: the next reconcile replaces
    // it (CREATING is recorded)
    let created = match pods_api.create(&PostParams::default(), &pod).await {
        Ok(p) => p,
        Err(e) => match Error::quota_refusal(&e) {
            Some(why) => return Ok(Launcher::OverQuota(why)),
            None => return Err(e.into()),
        },
    };
    record_pod(ctx, vm, st, &spec.pod, created.metadata.uid.as_deref()).await?;
    let addrs: Vec<String> = spec
        .nics
        .iter()
        .map(|n| format!("{} {} {}", n.name, n.ip, n.mac))
        .collect();
    tracing::info!(vm = %vm_key(vm), node = %spec.node, pod = %spec.pod, addresses = ?addrs, "launcher pod created");
    ctx.event(
        vm.object_ref(&()),
        false,
        "LauncherCreated",
        "Start",
        format!(
            "launcher pod {} on {}, {}",
            spec.pod,
            spec.node,
            addrs.join(", ")
        ),
    );
    Ok(Launcher::Pod(Box::new(
        launchers::ensure_runner(ctx, vm, spec, created).await?,
    )))
}

/// Record launcher pod `pod` and `uid` ([`CREATING`] before it exists) in the VM's status,
/// and in `st`.
async fn record_pod(
    ctx: &Context,
    vm: &VirtualMachine,
    st: &mut VirtualMachineStatus,
    pod: &str,
    uid: Option<&str>,
) -> Result<()> {
    let Some(uid) = uid else {
        return Err(Error::Conflict(format!("launcher pod {pod} has no UID")));
    };
    status::vm(ctx, vm, json!({"pod": pod, "podUID": uid})).await?;
    st.pod = Some(pod.to_string());
    st.pod_uid = Some(uid.to_string());
    Ok(())
}

/// Ask the VM's shim whether its domain runs and how many guest resets it counted; `None`
/// while it does not answer (a domain not running yet).
async fn ask_shim(
    ctx: &Context,
    vm: &VirtualMachine,
    spec: &LauncherSpec<'_>,
    token: &str,
) -> Result<Option<(bool, u64)>> {
    match client(ctx, vm, spec.node, spec.node_ip, spec.port, token)
        .await?
        .status()
        .await
    {
        Ok(s) => Ok(Some((s.domain == DomainState::Running, s.resets))),
        Err(e) => {
            tracing::debug!(vm = %vm_key(vm), error = %e, "shim not answering yet");
            Ok(None)
        }
    }
}

/// The claim of a VM that boots from a volume (`boot.volume`), as read now: its name, and
/// its phase and access modes (`None`: no such claim). `None`: the VM boots from no volume.
pub(super) async fn boot_claim(
    ctx: &Context,
    vm: &VirtualMachine,
) -> Result<Option<(String, Option<volume::Claim>)>> {
    let roam_api::Boot::Volume { claim_name, .. } = &vm.spec.boot else {
        return Ok(None);
    };
    let claims: Api<PersistentVolumeClaim> =
        Api::namespaced(ctx.client.clone(), &vm.namespace().unwrap_or_default());
    let claim = claims.get_opt(claim_name).await?.map(|c| volume::Claim {
        phase: c.status.and_then(|s| s.phase),
        access_modes: c.spec.and_then(|s| s.access_modes).unwrap_or_default(),
    });
    Ok(Some((claim_name.clone(), claim)))
}

/// Pending with `reason` and `why` in the Ready condition, and a Warning Event when `why` is
/// new.
async fn wait_pending(
    ctx: &Context,
    vm: &VirtualMachine,
    mut st: VirtualMachineStatus,
    reason: &str,
    why: String,
) -> Result<()> {
    let had = st
        .conditions
        .iter()
        .any(|c| c.type_ == "Ready" && c.message == why);
    st.phase = VmPhase::Pending;
    set_condition(
        &mut st.conditions,
        condition("Ready", false, reason, &why, vm.metadata.generation, &now()),
    );
    patch_status(ctx, vm, &st).await?;
    if !had {
        ctx.event(vm.object_ref(&()), true, reason, "Start", why);
    }
    Ok(())
}

/// Bad input: Failed with the reason in status and a Warning Event (once per message);
/// nothing created.
async fn refuse(
    ctx: &Context,
    vm: &VirtualMachine,
    mut st: VirtualMachineStatus,
    reason: &str,
    msg: String,
) -> Result<Action> {
    tracing::warn!(vm = %vm_key(vm), error = %msg, "vm refused");
    let had = st
        .conditions
        .iter()
        .any(|c| c.type_ == "Ready" && c.message == msg);
    st.phase = VmPhase::Failed;
    set_condition(
        &mut st.conditions,
        condition("Ready", false, reason, &msg, vm.metadata.generation, &now()),
    );
    patch_status(ctx, vm, &st).await?;
    if !had {
        ctx.event(vm.object_ref(&()), true, reason, "Start", msg);
    }
    Ok(Action::requeue(requeue::REFUSED))
}

/// A migration request that creates nothing: a Warning Event and the VM's
/// `MigrationRequest` condition say why.
async fn refuse_migration(
    ctx: &Context,
    vm: &VirtualMachine,
    reason: &str,
    msg: String,
) -> Result<()> {
    tracing::warn!(vm = %vm_key(vm), error = %msg, "migration refused");
    ctx.event(
        vm.object_ref(&()),
        true,
        "MigrationRejected",
        "Migrate",
        msg.clone(),
    );
    let mut st = vm.status.clone().unwrap_or_default();
    set_condition(
        &mut st.conditions,
        condition(
            "MigrationRequest",
            false,
            reason,
            &msg,
            vm.metadata.generation,
            &now(),
        ),
    );
    patch_status(ctx, vm, &st).await
}

/// `roam.dev/migrate-to` → a VirtualMachineMigration (or, when the value is malformed or
/// `auto` finds no node, [`refuse_migration`]); the annotation is removed either way.
async fn trigger_migration(ctx: &Context, vm: &VirtualMachine, value: &str) -> Result<()> {
    let ns = vm.namespace().unwrap_or_default();
    let name = vm.name_any();
    let vms: Api<VirtualMachine> = Api::namespaced(ctx.client.clone(), &ns);
    let target = match parse_migrate_to(value) {
        Err(e) => {
            refuse_migration(ctx, vm, "InvalidAnnotation", e.to_string()).await?;
            None
        }
        Ok(MigrateTo::Node(n)) => Some(n),
        Ok(MigrateTo::Auto) => {
            let here = vm.status.as_ref().and_then(|s| s.node.clone());
            let need = need_of(ctx, vm);
            match placement::pick(&node_facts(ctx).await?, here.as_deref(), &need) {
                Ok(n) => Some(n),
                Err(why) => {
                    refuse_migration(ctx, vm, "NoTargetNode", format!("migrate-to=auto: {why}"))
                        .await?;
                    None
                }
            }
        }
    };
    if let Some(target) = target {
        let millis = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or_default();
        let mut m = VirtualMachineMigration::new(
            &format!("{name}-{millis:x}"),
            VirtualMachineMigrationSpec {
                vm: name.clone(),
                target_node: (!target.is_empty()).then_some(target.clone()),
                bandwidth_mib_per_second: None,
                max_downtime_ms: None,
                auto_converge: false,
                allow_post_copy: false,
                timeout_seconds: None,
            },
        );
        m.metadata.namespace = Some(ns.clone());
        m.metadata.labels = Some([(VM_LABEL.to_string(), name.clone())].into());
        let api: Api<VirtualMachineMigration> = Api::namespaced(ctx.client.clone(), &ns);
        let created = api.create(&PostParams::default(), &m).await?;
        tracing::info!(vm = %vm_key(vm), migration = %created.name_any(), %target, "migration requested");
        ctx.event(
            vm.object_ref(&()),
            false,
            "MigrationRequested",
            "Migrate",
            format!("{} to {target}", created.name_any()),
        );
    }
    vms.patch(
        &name,
        &PatchParams::default(),
        &Patch::Merge(&json!({"metadata": {"annotations": {MIGRATE_TO: null}}})),
    )
    .await?;
    Ok(())
}
