//! The VirtualMachine controller: a VirtualMachine gets its Address (owner = the VM, claimed
//! on the chosen node with the pod controller's claim code) and its OVN port **before** its
//! launcher pod exists; then a host-network launcher pod pinned to that node runs roam-shim
//! with everything it needs on its command line (MAC, OVN port, tap), so the shim never waits
//! for an annotation. Status: phase, node, interfaces (ip/mac), the shim's port, a Ready
//! condition, Events.
//!
//! The annotation `roam.dev/migrate-to` is answered here too: it becomes a
//! VirtualMachineMigration labelled `roam.dev/vm=<vm>` (see [`super::migrations`]) and is
//! removed. While a migration runs, the migration controller owns the VM's pods and status.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Config as ControllerConfig};
use kube::runtime::{Controller, watcher};
use kube::{Api, Resource, ResourceExt};
use roam_shim_api::api::DomainState;
use roam_shim_api::client::ShimClient;
use roam_shim_api::token::TokenDigest;
use serde_json::json;

use super::{Context, ovn, pods};
use crate::api::{
    Address, Boot, MIGRATE_TO, MigrateTo, VirtualMachine, VirtualMachineMigration,
    VirtualMachineMigrationSpec, VirtualMachineStatus, VmPhase, parse_migrate_to,
};
use crate::core::claim::VM_LABEL;
use crate::core::vm::{
    PortBook, VmNic, account_resets, interface_status, nics as vm_nics, resolve_vm,
};
use crate::error::{Error, Result};

pub use roam_contract::keys::{LAUNCHER_LABEL, MIGRATION_ANNOTATION};
/// The Secret key of a VM's shim token.
const TOKEN_KEY: &str = "token";
/// Where the launcher pod keeps its state.
const STATE_DIR: &str = "/var/lib/roam-shim";

/// What the VM controller needs to build launcher pods.
#[derive(Clone, Debug)]
pub struct VmConfig {
    /// The launcher image (roam-shim).
    pub launcher_image: String,
    /// The ports the shims' APIs may use (host network).
    pub shim_ports: (u16, u16),
    /// How one node's libvirtd reaches another's, `{node}` and `{ip}` replaced.
    pub peer_libvirt_uri: String,
    /// The host directory for the guests' serial logs (hostPath in the launcher pods).
    pub vm_log_dir: String,
    /// The launcher pods' PriorityClass, if any (a critical class keeps a running VM from
    /// being evicted under node pressure).
    pub priority_class: Option<String>,
}

/// Whether `p` is a VM launcher pod.
pub fn is_launcher(p: &Pod) -> bool {
    p.labels().get(LAUNCHER_LABEL).map(String::as_str) == Some("true")
}

/// `namespace/name`.
pub fn vm_key(vm: &VirtualMachine) -> String {
    format!("{}/{}", vm.namespace().unwrap_or_default(), vm.name_any())
}

/// The libvirt domain name of a VM (the same on every node).
pub fn domain_name(ns: &str, vm: &str) -> String {
    format!("{ns}_{vm}")
}

pub use crate::core::vm::tap_name;

/// The shim's URL on a node.
pub fn shim_url(node_ip: &str, port: u16) -> String {
    format!("http://{node_ip}:{port}")
}

/// What a launcher pod needs to know.
pub struct LauncherSpec<'a> {
    /// The pod's name.
    pub pod: String,
    /// Its node.
    pub node: &'a str,
    /// The node's IP.
    pub node_ip: &'a str,
    /// `boot` or `incoming`.
    pub mode: &'a str,
    /// The migration, for a target pod.
    pub migration: Option<&'a str>,
    /// The VM's NICs on this node, in the guest's order.
    pub nics: &'a [VmNic],
    /// The shim's API port.
    pub port: u16,
    /// The VM's API token: the pod carries only its digest (`--token-sha256`), so it mounts
    /// no Secret and its start never waits on the kubelet being allowed to read one.
    pub token: &'a str,
}

/// The launcher pod of `vm` (pure).
pub fn launcher_pod(cfg: &VmConfig, vm: &VirtualMachine, l: &LauncherSpec<'_>) -> Result<Pod> {
    let ns = vm.namespace().unwrap_or_default();
    let name = vm.name_any();
    let serial = format!("{}/{ns}_{name}.serial.log", cfg.vm_log_dir);
    let mut args: Vec<(String, String)> = vec![
        ("name".into(), domain_name(&ns, &name)),
        ("vcpus".into(), vm.spec.cpu.to_string()),
        ("memory-mib".into(), vm.spec.memory_mib.to_string()),
    ];
    let mut host_dirs: BTreeSet<String> = BTreeSet::new();
    let parent = |p: &str| -> Result<String> {
        std::path::Path::new(p)
            .parent()
            .filter(|d| p.starts_with('/') && d != &std::path::Path::new("/"))
            .map(|d| d.display().to_string())
            .ok_or_else(|| Error::InvalidVm {
                vm: vm_key(vm),
                problem: format!("boot path {p:?}: give an absolute path to a file on the nodes"),
            })
    };
    match &vm.spec.boot {
        Boot::Kernel {
            kernel,
            initrd,
            cmdline,
        } => {
            host_dirs.insert(parent(kernel)?);
            args.push(("kernel".into(), kernel.clone()));
            if let Some(i) = initrd {
                host_dirs.insert(parent(i)?);
                args.push(("initrd".into(), i.clone()));
            }
            if let Some(c) = cmdline {
                args.push(("cmdline".into(), c.clone()));
            }
        }
        Boot::Disk { image, format } => {
            host_dirs.insert(parent(image)?);
            args.push(("disk".into(), image.clone()));
            args.push(("disk-format".into(), format.clone()));
        }
    }
    let peer = cfg
        .peer_libvirt_uri
        .replace("{node}", l.node)
        .replace("{ip}", l.node_ip);
    match l.nics {
        [] => {
            return Err(Error::InvalidVm {
                vm: vm_key(vm),
                problem: "a launcher pod without a NIC".into(),
            });
        }
        // one NIC: the flags every roam-shim understands
        [one] => args.extend([
            ("mac".to_string(), one.mac.clone()),
            ("tap".to_string(), one.tap.clone()),
            ("ovn-port".to_string(), one.ovn_port.clone()),
        ]),
        several => args.push((
            "nics".into(),
            several
                .iter()
                .map(|n| format!("{}/{}/{}", n.mac, n.tap, n.ovn_port))
                .collect::<Vec<_>>()
                .join(","),
        )),
    }
    args.extend(
        [
            ("serial-log", serial),
            ("node", l.node.to_string()),
            ("libvirt-uri", "qemu:///system".into()),
            ("ovs-db", "unix:/run/openvswitch/db.sock".into()),
            ("peer-libvirt-uri", peer),
            ("migration-uri", format!("tcp://{}", l.node_ip)),
            ("listen", format!("{}:{}", l.node_ip, l.port)),
            ("token-sha256", TokenDigest::of(l.token).to_string()),
            ("state-file", format!("{STATE_DIR}/state.json")),
            ("mode", l.mode.to_string()),
            ("instance", l.pod.clone()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v)),
    );
    let args: Vec<String> = args
        .into_iter()
        .flat_map(|(k, v)| [format!("--{k}"), v])
        .collect();
    let mut volumes = vec![
        json!({"name": "libvirt", "hostPath": {"path": "/run/libvirt", "type": "Directory"}}),
        json!({"name": "openvswitch", "hostPath": {"path": "/run/openvswitch", "type": "Directory"}}),
        json!({"name": "logs", "hostPath": {"path": cfg.vm_log_dir, "type": "DirectoryOrCreate"}}),
        json!({"name": "state", "emptyDir": {}}),
    ];
    let mut mounts = vec![
        json!({"name": "libvirt", "mountPath": "/run/libvirt"}),
        // libvirt's client looks under /var/run (its LOCALSTATEDIR), not a symlink in every image
        json!({"name": "libvirt", "mountPath": "/var/run/libvirt"}),
        json!({"name": "openvswitch", "mountPath": "/run/openvswitch"}),
        json!({"name": "logs", "mountPath": cfg.vm_log_dir}),
        json!({"name": "state", "mountPath": STATE_DIR}),
    ];
    for (i, d) in host_dirs.iter().enumerate() {
        volumes.push(
            json!({"name": format!("boot{i}"), "hostPath": {"path": d, "type": "Directory"}}),
        );
        mounts.push(json!({"name": format!("boot{i}"), "mountPath": d, "readOnly": true}));
    }
    let mut annotations = BTreeMap::new();
    if let Some(m) = l.migration {
        annotations.insert(MIGRATION_ANNOTATION.to_string(), m.to_string());
    }
    let owner = vm.controller_owner_ref(&()).map(|o| vec![o]);
    let pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": l.pod,
            "namespace": ns,
            "labels": {VM_LABEL: name, LAUNCHER_LABEL: "true"},
            "annotations": annotations,
            "ownerReferences": owner,
        },
        "spec": {
            "nodeName": l.node,
            "priorityClassName": cfg.priority_class,
            "hostNetwork": true,
            "dnsPolicy": "ClusterFirstWithHostNet",
            // the shim never calls the API server: no ServiceAccount token to mount, and its
            // own token comes as a digest on the command line. A Secret a new pod mounts is a
            // race its node's kubelet can lose against the API server's node authorizer
            // (forbidden, then ~1.8 s of cache timeout and mount retries before the sandbox)
            "automountServiceAccountToken": false,
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "containers": [{
                "name": "shim",
                "image": cfg.launcher_image,
                "imagePullPolicy": "IfNotPresent",
                "args": args,
                "securityContext": {"privileged": true},
                "volumeMounts": mounts,
            }],
            "volumes": volumes,
        }
    });
    serde_json::from_value(pod).map_err(|e| Error::InvalidVm {
        vm: vm_key(vm),
        problem: format!("launcher pod: {e}"),
    })
}

/// The name of a VM's token Secret.
pub fn token_secret(vm: &str) -> String {
    format!("{vm}-shim-token")
}

pub(super) async fn run(ctx: Arc<Context>) {
    let api: Api<VirtualMachine> = match &ctx.config.pod_namespace {
        Some(ns) => Api::namespaced(ctx.client.clone(), ns),
        None => Api::all(ctx.client.clone()),
    };
    let pods: Api<Pod> = match &ctx.config.pod_namespace {
        Some(ns) => Api::namespaced(ctx.client.clone(), ns),
        None => Api::all(ctx.client.clone()),
    };
    Controller::new(api, watcher::Config::default())
        .owns(
            pods,
            watcher::Config::default().labels(&format!("{LAUNCHER_LABEL}=true")),
        )
        .with_config(ControllerConfig::default().concurrency(ctx.config.concurrency))
        .run(reconcile, error_policy, ctx.clone())
        .for_each(|r| async move {
            if let Err(e) = r {
                tracing::debug!(error = %e, "vm reconcile");
            }
        })
        .await;
}

fn error_policy(vm: Arc<VirtualMachine>, e: &Error, ctx: Arc<Context>) -> Action {
    tracing::warn!(vm = %vm_key(&vm), error = %e, "vm reconcile failed; retrying");
    ctx.metrics.count("vm_errors", e.reason());
    Action::requeue(Duration::from_secs(2))
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

/// Ready nodes (name, ip) of the node selector, sorted by name.
pub(super) async fn ready_nodes(ctx: &Context) -> Result<Vec<(String, String)>> {
    let api: Api<Node> = Api::all(ctx.client.clone());
    let mut lp = ListParams::default();
    if let Some(s) = &ctx.config.node_selector {
        lp = lp.labels(s);
    }
    let mut out: Vec<(String, String)> = api
        .list(&lp)
        .await?
        .items
        .iter()
        .filter_map(|n| Some((n.name_any(), node_ip_if_ready(n)?)))
        .collect();
    out.sort();
    Ok(out)
}

/// The VM's token (its Secret, created with a random token the first time).
pub(super) async fn token(ctx: &Context, vm: &VirtualMachine) -> Result<String> {
    let ns = vm.namespace().unwrap_or_default();
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
    let name = token_secret(&vm.name_any());
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
        "metadata": {"name": name, "namespace": ns,
                     "labels": {VM_LABEL: vm.name_any()},
                     "ownerReferences": vm.controller_owner_ref(&()).map(|o| vec![o])},
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

/// A shim client for the VM on `node_ip`.
pub(super) fn client(
    vm: &VirtualMachine,
    node_ip: &str,
    port: u16,
    token: &str,
) -> Result<ShimClient> {
    ShimClient::new(&shim_url(node_ip, port), token).map_err(|source| Error::Shim {
        vm: vm_key(vm),
        source,
    })
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

/// Pick a free shim port: one no other VM uses.
async fn allocate_port(ctx: &Context, vm: &VirtualMachine) -> Result<u16> {
    /// Ports picked by this process and not yet in a status (see [`PortBook`]).
    static PORTS: std::sync::Mutex<PortBook> = std::sync::Mutex::new(PortBook::new());
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
    PORTS
        .lock()
        .expect("port book lock")
        .pick(&vm.uid().unwrap_or_default(), start % span, (lo, hi), &used)
        .ok_or_else(|| Error::InvalidVm {
            vm: vm_key(vm),
            problem: format!("no free shim port in {lo}-{hi}; widen --shim-ports"),
        })
}

async fn patch_status(ctx: &Context, vm: &VirtualMachine, st: &VirtualMachineStatus) -> Result<()> {
    if vm.status.as_ref() == Some(st) {
        return Ok(());
    }
    let api: Api<VirtualMachine> =
        Api::namespaced(ctx.client.clone(), &vm.namespace().unwrap_or_default());
    api.patch_status(
        &vm.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&json!({"status": st})),
    )
    .await?;
    Ok(())
}

fn condition(
    type_: &str,
    ok: bool,
    reason: &str,
    message: &str,
    generation: Option<i64>,
) -> Condition {
    Condition {
        type_: type_.into(),
        status: if ok { "True" } else { "False" }.into(),
        reason: reason.into(),
        message: message.chars().take(1000).collect(),
        observed_generation: generation,
        last_transition_time: Time(k8s_openapi::jiff::Timestamp::now()),
    }
}

/// Put `c` into `list`, keeping the transition time when the status did not change.
pub(super) fn set_condition(list: &mut Vec<Condition>, mut c: Condition) {
    if let Some(old) = list.iter_mut().find(|o| o.type_ == c.type_) {
        if old.status == c.status {
            c.last_transition_time = old.last_transition_time.clone();
        }
        *old = c;
    } else {
        list.push(c);
    }
}

async fn reconcile(vm: Arc<VirtualMachine>, ctx: Arc<Context>) -> Result<Action> {
    if vm.metadata.deletion_timestamp.is_some() {
        // the pods and the Secret go with it (owner references); the Address is soft-deleted
        // by the operator's sweep once no launcher pod is left
        return Ok(Action::await_change());
    }
    ctx.wait_synced().await;
    let key = vm_key(&vm);
    let ns = vm.namespace().unwrap_or_default();
    let mut st = vm.status.clone().unwrap_or_default();
    if let Some(value) = vm.annotations().get(MIGRATE_TO).cloned() {
        trigger_migration(&ctx, &vm, &value).await?;
        return Ok(Action::requeue(Duration::from_millis(200)));
    }
    if st.migration.is_some() {
        // the migration controller owns the VM's pods and status until it ends
        return Ok(Action::requeue(Duration::from_secs(5)));
    }
    let gen_ = vm.metadata.generation;
    // the node: where it runs, else the requested one, else the first Ready one
    let node = match st.node.clone().or_else(|| vm.spec.node.clone()) {
        Some(n) => n,
        None => match ready_nodes(&ctx).await?.into_iter().next() {
            Some((n, _)) => n,
            None => {
                st.phase = VmPhase::Scheduling;
                set_condition(
                    &mut st.conditions,
                    condition("Ready", false, "NoNode", "no Ready node", gen_),
                );
                patch_status(&ctx, &vm, &st).await?;
                return Ok(Action::requeue(Duration::from_secs(5)));
            }
        },
    };
    let Some(node_ip) = ready_node_ip(&ctx, &node).await? else {
        st.phase = VmPhase::Scheduling;
        let msg = format!("node {node} does not exist or is not Ready");
        set_condition(
            &mut st.conditions,
            condition("Ready", false, "NodeNotReady", &msg, gen_),
        );
        patch_status(&ctx, &vm, &st).await?;
        return Ok(Action::requeue(Duration::from_secs(5)));
    };
    let pod_name = st
        .pod
        .clone()
        .unwrap_or_else(|| format!("{}-launcher", vm.name_any()));
    let pod_key = format!("{ns}/{pod_name}");
    // every interface's Address, claimed (or reused) on the node before the pod exists;
    // the interfaces are checked first, so bad input claims nothing
    let plans = ctx.index.lock().expect("index lock").plans();
    let resolved = match resolve_vm(&key, &vm.spec, &plans) {
        Ok(r) => r,
        Err(e) => return refuse(&ctx, &vm, st, e).await,
    };
    let mut held: Vec<Arc<Address>> = Vec::new();
    for r in &resolved {
        match pods::claim(&ctx, &pod_key, &key, &node, r).await {
            Ok(a) => held.push(a),
            Err(e) if e.is_bad_input() => return refuse(&ctx, &vm, st, e).await,
            Err(e) => return Err(e),
        }
    }
    let networks: BTreeSet<&str> = resolved.iter().map(|r| r.network.name.as_str()).collect();
    let tickets: Vec<(&str, u64)> = networks
        .iter()
        .map(|n| (*n, ovn::request(&ctx, n)))
        .collect();
    for (n, t) in tickets {
        ovn::wait(&ctx, n, t).await?;
    }
    let held_refs: Vec<&Address> = held.iter().map(|a| &**a).collect();
    let Some(nics) = vm_nics(&key, &node, &resolved, &held_refs) else {
        return Err(Error::Conflict(format!(
            "{key}: an interface has no Address after its claim; retrying"
        )));
    };
    let port = match st.shim_port {
        Some(p) => p,
        None => allocate_port(&ctx, &vm).await?,
    };
    let token = token(&ctx, &vm).await?;
    let pods_api: Api<Pod> = Api::namespaced(ctx.client.clone(), &ns);
    let pod = match pods_api.get_opt(&pod_name).await? {
        Some(p) => p,
        None => {
            let spec = LauncherSpec {
                pod: pod_name.clone(),
                node: &node,
                node_ip: &node_ip,
                mode: "boot",
                migration: None,
                nics: &nics,
                port,
                token: &token,
            };
            let pod = match launcher_pod(&ctx.config.vm, &vm, &spec) {
                Ok(p) => p,
                Err(e) => return refuse(&ctx, &vm, st, e).await,
            };
            let created = match pods_api.create(&PostParams::default(), &pod).await {
                Ok(p) => p,
                Err(e) if Error::is_conflict(&e) => pods_api.get(&pod_name).await?,
                Err(e) => return Err(e.into()),
            };
            let addrs: Vec<String> = nics
                .iter()
                .map(|n| format!("{} {} {}", n.name, n.ip, n.mac))
                .collect();
            tracing::info!(vm = %key, %node, pod = %pod_name, addresses = ?addrs, "launcher pod created");
            ctx.event(
                vm.object_ref(&()),
                false,
                "LauncherCreated",
                "Start",
                format!("launcher pod {pod_name} on {node}, {}", addrs.join(", ")),
            );
            created
        }
    };
    st.node = Some(node.clone());
    st.pod = Some(pod_name.clone());
    st.shim_port = Some(port);
    st.observed_generation = gen_;
    st.interfaces = interface_status(&nics);
    // running: the shim answers and its domain runs
    let mut new_resets = 0;
    let running = if pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running") {
        match client(&vm, &node_ip, port, &token)?.status().await {
            Ok(s) => {
                let (record, new) = account_resets(st.guest_resets.as_ref(), &pod_name, s.resets);
                st.guest_resets = record;
                new_resets = new;
                s.domain == DomainState::Running
            }
            Err(e) => {
                tracing::debug!(vm = %key, error = %e, "shim not answering yet");
                false
            }
        }
    } else {
        false
    };
    let was = st.phase;
    if running {
        st.phase = VmPhase::Running;
        set_condition(
            &mut st.conditions,
            condition("Ready", true, "Running", &format!("runs on {node}"), gen_),
        );
    } else {
        st.phase = if pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Failed") {
            VmPhase::Failed
        } else {
            VmPhase::Starting
        };
        set_condition(
            &mut st.conditions,
            condition(
                "Ready",
                false,
                "Starting",
                &format!("launcher pod {pod_name} on {node} is starting"),
                gen_,
            ),
        );
    }
    patch_status(&ctx, &vm, &st).await?;
    if new_resets > 0 {
        let total = st.guest_resets.as_ref().map_or(new_resets, |r| r.total);
        tracing::warn!(vm = %key, %node, new_resets, total, "the guest reset");
        ctx.event(
            vm.object_ref(&()),
            true,
            "GuestReset",
            "Observe",
            format!(
                "the guest on {node} reset {} ({total} in all): it rebooted, panicked (panic=N) or was reset from outside, and what ran in it is gone; its console log says why",
                if new_resets == 1 { "once".to_string() } else { format!("{new_resets} times") }
            ),
        );
    }
    if was != VmPhase::Running && st.phase == VmPhase::Running {
        ctx.event(
            vm.object_ref(&()),
            false,
            "Running",
            "Start",
            format!("runs on {node}"),
        );
    }
    Ok(if running {
        Action::requeue(Duration::from_secs(30))
    } else {
        Action::requeue(Duration::from_secs(1))
    })
}

/// Bad input: Failed with the reason in status and a Warning Event; nothing created.
async fn refuse(
    ctx: &Context,
    vm: &VirtualMachine,
    mut st: VirtualMachineStatus,
    e: Error,
) -> Result<Action> {
    let msg = e.to_string();
    tracing::warn!(vm = %vm_key(vm), error = %msg, "vm refused");
    let had = st
        .conditions
        .iter()
        .any(|c| c.type_ == "Ready" && c.message == msg);
    st.phase = VmPhase::Failed;
    set_condition(
        &mut st.conditions,
        condition("Ready", false, e.reason(), &msg, vm.metadata.generation),
    );
    patch_status(ctx, vm, &st).await?;
    if !had {
        ctx.event(vm.object_ref(&()), true, e.reason(), "Start", msg);
    }
    Ok(Action::requeue(Duration::from_secs(10)))
}

/// `roam.dev/migrate-to` → a VirtualMachineMigration (or a Warning Event when the value is
/// malformed); the annotation is removed either way.
async fn trigger_migration(ctx: &Context, vm: &VirtualMachine, value: &str) -> Result<()> {
    let ns = vm.namespace().unwrap_or_default();
    let name = vm.name_any();
    let vms: Api<VirtualMachine> = Api::namespaced(ctx.client.clone(), &ns);
    let target = match parse_migrate_to(value) {
        Err(e) => {
            let msg = e.to_string();
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
                    "InvalidAnnotation",
                    &msg,
                    vm.metadata.generation,
                ),
            );
            patch_status(ctx, vm, &st).await?;
            None
        }
        Ok(MigrateTo::Node(n)) => Some(n),
        Ok(MigrateTo::Auto) => {
            let here = vm.status.as_ref().and_then(|s| s.node.clone());
            Some(
                ready_nodes(ctx)
                    .await?
                    .into_iter()
                    .map(|(n, _)| n)
                    .find(|n| Some(n) != here.as_ref())
                    .unwrap_or_default(),
            )
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::VirtualMachineSpec;

    fn vm() -> VirtualMachine {
        let mut v = VirtualMachine::new(
            "demo",
            serde_json::from_value::<VirtualMachineSpec>(json!({
                "cpu": 1, "memoryMiB": 256,
                "boot": {"kernel": {"kernel": "/g/vmlinuz", "initrd": "/g/initrd", "cmdline": "console=ttyS0"}}
            }))
            .unwrap(),
        );
        v.metadata.namespace = Some("ns".into());
        v.metadata.uid = Some("u".into());
        v
    }

    fn cfg() -> VmConfig {
        VmConfig {
            launcher_image: "img".into(),
            shim_ports: (17100, 17199),
            peer_libvirt_uri: "qemu+tcp://{ip}/system".into(),
            vm_log_dir: "/var/log/roam".into(),
            priority_class: None,
        }
    }

    fn nic(i: usize, port: &str) -> VmNic {
        VmNic {
            name: format!("eth{i}"),
            address: format!("a{i}"),
            ip: format!("10.0.0.{}", 10 + i),
            mac: format!("0a:58:64:40:00:0{}", 5 + i),
            tap: crate::core::vm::nic_tap("ns/demo", i),
            ovn_port: port.into(),
        }
    }

    #[test]
    fn taps_are_short_and_distinct() {
        let a = tap_name("ns/demo-launcher");
        let b = tap_name("ns/demo-1-target");
        assert!(a.len() <= 15 && b.len() <= 15);
        assert_ne!(a, b);
        assert_eq!(a, tap_name("ns/demo-launcher"));
    }

    #[test]
    fn several_nics_go_to_the_shim_as_one_nics_flag_in_order() {
        let nics = [nic(0, "a0.node-a"), nic(1, "v150-198-18-150-5")];
        let l = LauncherSpec {
            pod: "demo-launcher".into(),
            node: "node-a",
            node_ip: "10.0.0.1",
            mode: "boot",
            migration: None,
            nics: &nics,
            port: 17100,
            token: "t0ken",
        };
        let p = launcher_pod(&cfg(), &vm(), &l).unwrap();
        let args = p.spec.unwrap().containers[0].args.clone().unwrap();
        assert!(!args.contains(&"--mac".to_string()), "{args:?}");
        let i = args.iter().position(|a| a == "--nics").unwrap();
        assert_eq!(
            args[i + 1],
            format!(
                "0a:58:64:40:00:05/{}/a0.node-a,0a:58:64:40:00:06/{}1/v150-198-18-150-5",
                tap_name("ns/demo"),
                tap_name("ns/demo")
            )
        );
        let none = LauncherSpec { nics: &[], ..l };
        assert!(matches!(
            launcher_pod(&cfg(), &vm(), &none),
            Err(Error::InvalidVm { .. })
        ));
    }

    #[test]
    fn launcher_pod_is_pinned_host_network_with_the_shim_args() {
        let l = LauncherSpec {
            pod: "demo-launcher".into(),
            node: "node-a",
            node_ip: "10.0.0.1",
            mode: "boot",
            migration: None,
            nics: &[VmNic {
                mac: "0a:58:64:40:00:05".into(),
                ovn_port: "a.node-a".into(),
                ..nic(0, "")
            }],
            port: 17100,
            token: "t0ken",
        };
        let p = launcher_pod(&cfg(), &vm(), &l).unwrap();
        let spec = p.spec.unwrap();
        assert_eq!(spec.node_name.as_deref(), Some("node-a"));
        assert_eq!(spec.host_network, Some(true));
        assert_eq!(spec.automount_service_account_token, Some(false));
        // nothing the target node's kubelet must fetch through the node authorizer
        for v in spec.volumes.iter().flatten() {
            assert!(
                v.secret.is_none() && v.config_map.is_none() && v.projected.is_none(),
                "volume {} comes from the API: {v:?}",
                v.name
            );
        }
        let args = spec.containers[0].args.clone().unwrap();
        assert!(!args.contains(&"--token-file".to_string()), "{args:?}");
        assert!(
            !args.iter().any(|a| a.contains("t0ken")),
            "the token itself is not in the pod: {args:?}"
        );
        let get = |k: &str| {
            let i = args.iter().position(|a| a == &format!("--{k}")).unwrap();
            args[i + 1].clone()
        };
        assert_eq!(get("mac"), "0a:58:64:40:00:05");
        assert_eq!(get("ovn-port"), "a.node-a");
        assert_eq!(get("listen"), "10.0.0.1:17100");
        assert_eq!(get("peer-libvirt-uri"), "qemu+tcp://10.0.0.1/system");
        assert_eq!(get("name"), "ns_demo");
        assert_eq!(get("mode"), "boot");
        assert_eq!(get("token-sha256"), TokenDigest::of("t0ken").to_string());
        assert_eq!(
            get("instance"),
            "demo-launcher",
            "the shim says which pod runs it"
        );
        assert!(is_launcher(&Pod {
            metadata: p.metadata.clone(),
            ..Default::default()
        }));
    }

    #[test]
    fn a_relative_kernel_path_is_refused() {
        let mut v = vm();
        v.spec.boot = Boot::Kernel {
            kernel: "vmlinuz".into(),
            initrd: None,
            cmdline: None,
        };
        let l = LauncherSpec {
            pod: "p".into(),
            node: "n",
            node_ip: "1.2.3.4",
            mode: "boot",
            migration: None,
            nics: &[nic(0, "o")],
            port: 1,
            token: "t0ken",
        };
        assert!(matches!(
            launcher_pod(&cfg(), &v, &l),
            Err(Error::InvalidVm { .. })
        ));
    }
}
