//! The pod builders (pure, no I/O): a VM's launcher pod and, with the privilege split, its
//! runner. Without runners the launcher is the host-network pod pinned to a node that runs
//! the VM's own libvirtd + QEMU (container `libvirtd`, `roam-shim libvirtd`) and roam-shim
//! with everything it needs on its command line (container `shim`, so the shim never waits
//! for an annotation). The names they go by and what their status says are
//! [`roam_core::launcher`]'s.
//!
//! libvirt and QEMU come in the launcher image, never from the node: the pod's cgroup holds
//! QEMU (its memory request counts the guest's), and the two containers share the pod's
//! `/run/libvirt` (an emptyDir). The pod shares one process namespace, so the pause process
//! reaps QEMU once libvirt lets it go (libvirtd as a container's PID 1 would leave zombies it
//! then waits for). A shim that crashes is restarted alone; its VM runs on in the `libvirtd`
//! container.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use k8s_openapi::api::core::v1::Pod;
use kube::{Resource, ResourceExt};
use roam_contract::token::TokenDigest;
pub use roam_shim_api::launch::Mode;
use roam_shim_api::launch::{
    self, LaunchArgs, LaunchBoot, LaunchNic, LaunchToken, Migration, MigrationUri, OvsDb,
};
use serde_json::json;

use roam_api::{Boot, VirtualMachine};
use roam_core::claim::VM_LABEL;
pub use roam_core::launcher::*;
use roam_core::vm::VmNic;

use crate::error::{Error, Result};
/// Where the launcher pod keeps its state.
const STATE_DIR: &str = "/var/lib/roam-shim";

/// What the VM controller needs to build launcher pods.
#[derive(Clone, Debug)]
pub struct VmConfig {
    /// The launcher image (roam-shim).
    pub launcher_image: String,
    /// The ports the shims' APIs may use (host network). A launcher whose shim has port
    /// `P` listens for migrating libvirtds on `P + N` (N: the range's width, see
    /// [`libvirt_port`]).
    pub shim_ports: (u16, u16),
    /// Without [`VmConfig::node_pki_dir`]: how a source libvirtd reaches a target
    /// launcher's over plain TCP, `{node}`, `{ip}` and `{port}` (the launcher's libvirt port)
    /// replaced. With it, unused: the shims' migration proxies listen on that port.
    pub peer_libvirt_uri: String,
    /// The host directory for the guests' serial logs (hostPath in the launcher pods).
    pub vm_log_dir: String,
    /// The launcher pods' PriorityClass, if any (a critical class keeps a running VM from
    /// being evicted under node pressure).
    pub priority_class: Option<String>,
    /// The nodes' roam PKI directory (roam-node's: the node's key and certificate, the roam
    /// CA), mounted read-only into the shim's container (never libvirtd's, where QEMU runs):
    /// migrations then go through the shims' mutual-TLS proxies, libvirt and QEMU over the
    /// pod's UNIX sockets only, and the shim's API is mutual TLS only (roam-controller
    /// presents its own certificate of the CA). `None`: plain TCP and HTTP.
    pub node_pki_dir: Option<String>,
    /// The admin's image store on the nodes: every boot file must be under it (checked
    /// before anything is created, and by the shim with symbolic links resolved), and it is
    /// the only host directory of boot files the launcher mounts (read-only). `None`: any
    /// absolute path, its directory mounted.
    pub image_root: Option<String>,
    /// vCPUs per CPU the launcher requests
    /// ([`roam_core::placement::DEFAULT_CPU_ALLOCATION_RATIO`] by default).
    pub cpu_allocation_ratio: u32,
    /// The privilege split: the VMs' runners, in roam's namespace (see [`runner_pod`]). `None`:
    /// each VM's launcher pod runs it, with the runner's host powers, in the VM's namespace.
    pub runners: Option<RunnerConfig>,
}

/// Where the VMs' runners live and what they reach on the nodes.
#[derive(Clone, Debug)]
pub struct RunnerConfig {
    /// roam's namespace (roam-system): no tenant can exec into a pod there.
    pub namespace: String,
    /// The kubelet's root directory on the nodes (`/var/lib/kubelet`): a runner reaches its
    /// launcher pod's console volume and boot volume under it.
    pub kubelet_root: String,
}

/// What a launcher pod needs to know.
pub struct LauncherSpec<'a> {
    /// The pod's name.
    pub pod: String,
    /// Its node.
    pub node: &'a str,
    /// The node's IP.
    pub node_ip: &'a str,
    /// Boot the VM, or wait for an incoming migration.
    pub mode: Mode,
    /// The migration, for a target pod.
    pub migration: Option<&'a str>,
    /// The migration's source node, for a target pod: besides its own node, the one node
    /// whose certificate its libvirtd takes (`tls_allowed_dn_list`).
    pub source: Option<&'a str>,
    /// The VM's NICs on this node, in the guest's order.
    pub nics: &'a [VmNic],
    /// The shim's API port.
    pub port: u16,
    /// The VM's API token: the pod carries only its digest (`--token-sha256`), so it mounts
    /// no Secret and its start never waits on the kubelet being allowed to read one.
    pub token: &'a str,
}

/// What a VM's launcher is made of, whether one pod or a launcher and its runner (see
/// [`launcher_pod`]).
struct Parts {
    ns: String,
    name: String,
    /// The shim's command line.
    args: Vec<String>,
    /// The guest's console on the node (QEMU appends to it).
    serial_log: String,
    /// The VM's boot volume, if it boots from one.
    volume_claim: Option<String>,
    /// The host directories of boot files the pod that runs QEMU mounts (read-only).
    host_dirs: BTreeSet<String>,
    /// The disk image's flags for `roam-shim libvirtd`, which checks and pins the image in
    /// the container QEMU runs in before libvirtd starts (none for a kernel boot).
    disk_args: Vec<String>,
    /// Where the launcher's libvirtd listens for a plain migration (the node's IP and the
    /// launcher's libvirt port); `None` with the nodes' identities, where libvirtd has no
    /// network socket and the shim's proxy takes that port.
    plain_listen: Option<SocketAddr>,
    /// With the nodes' identities: where the runner's migration proxy listens and the nodes
    /// it takes (this node, a target's migration source).
    proxy: Option<(SocketAddr, Vec<String>)>,
}

fn parts(cfg: &VmConfig, vm: &VirtualMachine, l: &LauncherSpec<'_>) -> Result<Parts> {
    let ns = vm.namespace().unwrap_or_default();
    let name = vm.name_any();
    let mut host_dirs: BTreeSet<String> = BTreeSet::new();
    let invalid = |problem: String| Error::invalid_vm(vm_key(vm), problem);
    let parent = |p: &str| -> Result<String> {
        std::path::Path::new(p)
            .parent()
            .filter(|d| p.starts_with('/') && d != &std::path::Path::new("/"))
            .map(|d| d.display().to_string())
            .ok_or_else(|| {
                invalid(format!(
                    "boot path {p:?}: give an absolute path to a file on the nodes"
                ))
            })
    };
    let boot = match &vm.spec.boot {
        Boot::Kernel {
            kernel,
            initrd,
            cmdline,
        } => {
            host_dirs.insert(parent(kernel)?);
            if let Some(i) = initrd {
                host_dirs.insert(parent(i)?);
            }
            LaunchBoot::Kernel {
                kernel: kernel.into(),
                initrd: initrd.as_ref().map(PathBuf::from),
                cmdline: cmdline.clone().unwrap_or_default(),
            }
        }
        // an image of the admin's store is every VM's that boots it: read-only (the runner
        // mounts the store read-only too); a volume is the VM's own disk
        Boot::Disk { image, format } => {
            host_dirs.insert(parent(image)?);
            LaunchBoot::Disk {
                image: image.into(),
                format: format.clone(),
                read_only: true,
            }
        }
        Boot::Volume { file, format, .. } => LaunchBoot::Disk {
            image: PathBuf::from(VOLUME_DIR).join(file),
            format: format.clone(),
            read_only: false,
        },
    };
    let volume_claim = match &vm.spec.boot {
        // the tenant's volume is the one place of boot files: no host directory
        Boot::Volume { claim_name, .. } => {
            host_dirs.clear();
            Some(claim_name.clone())
        }
        _ => None,
    };
    if let (Some(root), None) = (&cfg.image_root, &volume_claim) {
        // the image store is the one host directory of boot files in the pod
        host_dirs = BTreeSet::from([root.trim_end_matches('/').to_string()]);
    }
    if l.nics.is_empty() {
        return Err(invalid("a launcher pod without a NIC".into()));
    }
    let nics = l
        .nics
        .iter()
        .map(|n| {
            Ok(LaunchNic {
                mac: n
                    .mac
                    .parse()
                    .map_err(|e| invalid(format!("NIC {}: {e}", n.name)))?,
                tap: n.tap.clone(),
                ovn_port: n.ovn_port.clone(),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let ip: IpAddr = l.node_ip.parse().map_err(|_| {
        invalid(format!(
            "node {} has InternalIP {:?}, not an IP address",
            l.node, l.node_ip
        ))
    })?;
    let libvirt_port = libvirt_port(cfg.shim_ports, l.port).ok_or_else(|| {
        invalid(format!(
            "shim port {} has no libvirt port after the range {}-{}: lower --shim-ports",
            l.port, cfg.shim_ports.0, cfg.shim_ports.1
        ))
    })?;
    let peers: Vec<String> = std::iter::once(l.node)
        .chain(l.source)
        .map(String::from)
        .collect();
    let migration = match &cfg.node_pki_dir {
        // the shim's proxy on the launcher's libvirt port; libvirtd has no network socket
        Some(_) => Migration::Proxy {
            listen: SocketAddr::new(ip, libvirt_port),
            allowed_peers: peers.clone(),
        },
        None => Migration::Plain {
            peer_libvirt_uri: cfg
                .peer_libvirt_uri
                .replace("{node}", l.node)
                .replace("{ip}", l.node_ip)
                .replace("{port}", &libvirt_port.to_string()),
            migration_uri: MigrationUri::tcp(l.node_ip).map_err(invalid)?,
        },
    };
    // the guest's console, a file on the node (QEMU appends to it)
    let serial_log = format!("{}/{ns}_{name}.serial.log", cfg.vm_log_dir);
    // a volume's image must resolve inside the volume (no symbolic link the tenant left
    // there is followed)
    let image_root = match &volume_claim {
        Some(_) => Some(PathBuf::from(VOLUME_DIR)),
        None => cfg.image_root.as_ref().map(PathBuf::from),
    };
    let disk_args = match &boot {
        LaunchBoot::Kernel { .. } => vec![],
        LaunchBoot::Disk {
            image,
            format,
            read_only,
        } => {
            let mut a = vec![
                launch::flag::DISK.to_string(),
                image.display().to_string(),
                launch::flag::DISK_FORMAT.into(),
                format.clone(),
                launch::flag::DISK_ACCESS.into(),
                if *read_only {
                    launch::READ_ONLY
                } else {
                    launch::READ_WRITE
                }
                .into(),
            ];
            if let Some(root) = &image_root {
                a.extend([launch::flag::IMAGE_ROOT.into(), root.display().to_string()]);
            }
            a
        }
    };
    let args = LaunchArgs {
        name: domain_name(&ns, &name),
        vcpus: vm.spec.cpu,
        memory_mib: vm.spec.memory_mib,
        boot,
        nics,
        serial_log: serial_log.clone().into(),
        node: l.node.to_string(),
        libvirt_uri: launch::NODE_LIBVIRT_URI.into(),
        migration,
        ovs_db: OvsDb::node(),
        bridge: launch::DEFAULT_BRIDGE.into(),
        listen: SocketAddr::new(ip, l.port),
        token: LaunchToken::Sha256(TokenDigest::of(l.token)),
        state_file: format!("{STATE_DIR}/state.json").into(),
        mode: l.mode,
        kvm: false,
        instance: Some(l.pod.clone()),
        image_root,
        pki_dir: cfg.node_pki_dir.as_ref().map(PathBuf::from),
    }
    .to_args();
    Ok(Parts {
        ns,
        name,
        args,
        serial_log,
        volume_claim,
        host_dirs,
        disk_args,
        plain_listen: match cfg.node_pki_dir {
            None => Some(SocketAddr::new(ip, libvirt_port)),
            Some(_) => None,
        },
        proxy: cfg
            .node_pki_dir
            .as_ref()
            .map(|_| (SocketAddr::new(ip, libvirt_port), peers)),
    })
}

/// Where the VM's boot volume comes from in the pod that runs QEMU.
enum VolumeSource<'a> {
    /// The claim itself (a pod of the VM's namespace).
    Claim(&'a str),
    /// The claim's mount in the launcher pod, seen from the node (a runner).
    HostDir(&'a str),
}

/// The containers that run the VM (`libvirtd`: libvirtd and QEMU; `shim`: roam-shim) and the
/// volumes they use (pure).
fn vm_containers(
    cfg: &VmConfig,
    p: &Parts,
    volume: Option<VolumeSource<'_>>,
    requests: Option<serde_json::Value>,
) -> (Vec<serde_json::Value>, Vec<serde_json::Value>) {
    let mut volumes = vec![
        // the pod's own libvirtd's sockets and configuration (roam-shim libvirtd)
        json!({"name": "libvirt", "emptyDir": {}}),
        json!({"name": "openvswitch", "hostPath": {"path": "/run/openvswitch", "type": "Directory"}}),
        json!({"name": "logs", "hostPath": {"path": cfg.vm_log_dir, "type": "DirectoryOrCreate"}}),
        json!({"name": "state", "emptyDir": {}}),
    ];
    // what QEMU opens (the serial log, the boot files) is in both containers: the shim
    // checks the files before it asks libvirt for the domain
    let mut vm_mounts = vec![
        json!({"name": "libvirt", "mountPath": "/run/libvirt"}),
        json!({"name": "logs", "mountPath": cfg.vm_log_dir}),
    ];
    match volume {
        Some(VolumeSource::Claim(claim)) => volumes
            .push(json!({"name": "boot-volume", "persistentVolumeClaim": {"claimName": claim}})),
        Some(VolumeSource::HostDir(dir)) => volumes
            .push(json!({"name": "boot-volume", "hostPath": {"path": dir, "type": "Directory"}})),
        None => {}
    }
    if p.volume_claim.is_some() {
        vm_mounts.push(json!({"name": "boot-volume", "mountPath": VOLUME_DIR}));
    }
    for (i, d) in p.host_dirs.iter().enumerate() {
        volumes.push(
            json!({"name": format!("boot{i}"), "hostPath": {"path": d, "type": "Directory"}}),
        );
        vm_mounts.push(json!({"name": format!("boot{i}"), "mountPath": d, "readOnly": true}));
    }
    let mut shim_mounts = vm_mounts.clone();
    if let Some(pki) = &cfg.node_pki_dir {
        // the node's identity for the API's mutual TLS and the calls to a migration's target
        shim_mounts.push(json!({"name": "node-pki", "mountPath": pki, "readOnly": true}));
    }
    shim_mounts.extend([
        // libvirt's client looks under /var/run (its LOCALSTATEDIR), not a symlink in every image
        json!({"name": "libvirt", "mountPath": "/var/run/libvirt"}),
        json!({"name": "openvswitch", "mountPath": "/run/openvswitch"}),
        json!({"name": "state", "mountPath": STATE_DIR}),
        json!({"name": "tun", "mountPath": TUN}),
    ]);
    let mut libvirtd_args = vec!["libvirtd".to_string()];
    if let Some(l) = p.plain_listen {
        libvirtd_args.extend(["--listen".to_string(), l.to_string()]);
    }
    libvirtd_args.extend(p.disk_args.iter().cloned());
    // no node key where QEMU runs: the shim alone holds it (the API, the migration proxy)
    let mut libvirtd_mounts = vm_mounts.clone();
    if let Some(pki) = &cfg.node_pki_dir {
        volumes.push(json!({"name": "node-pki", "hostPath": {"path": pki, "type": "Directory"}}));
    }
    // the one device of the node QEMU's container has (libvirtd opens the VM's taps)
    volumes.push(json!({"name": "tun", "hostPath": {"path": TUN, "type": "CharDevice"}}));
    libvirtd_mounts.push(json!({"name": "tun", "mountPath": TUN}));
    let mut libvirtd = json!({
        "name": "libvirtd",
        "image": cfg.launcher_image,
        "imagePullPolicy": "IfNotPresent",
        "args": libvirtd_args,
        "securityContext": libvirtd_security(),
        // a crash's last log lines become its termination message: the VM's
        // condition quotes them (launcher_trouble)
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": libvirtd_mounts,
    });
    if let Some(r) = requests {
        libvirtd["resources"] = json!({ "requests": r });
    }
    let shim = json!({
        "name": "shim",
        "image": cfg.launcher_image,
        "imagePullPolicy": "IfNotPresent",
        "args": p.args,
        "securityContext": {
            "privileged": false,
            "capabilities": {"drop": ["ALL"], "add": SHIM_CAPABILITIES},
        },
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": shim_mounts,
    });
    let mut containers = vec![libvirtd, shim];
    if let (Some((listen, peers)), Some(pki)) = (&p.proxy, &cfg.node_pki_dir) {
        // a migration's target side, apart from the shim: a restarted shim leaves a running
        // migration's streams alone. Root (the node key is root's) with no capability but
        // DAC_OVERRIDE: it connects to the socket QEMU (uid 107) listens on
        let mut sc = unprivileged();
        sc["capabilities"]["add"] = json!(["DAC_OVERRIDE"]);
        containers.push(json!({
            "name": PROXY_CONTAINER,
            "image": cfg.launcher_image,
            "imagePullPolicy": "IfNotPresent",
            "args": ["proxy", "--listen", listen.to_string(), "--allowed-peers", peers.join(","),
                     "--pki-dir", pki],
            "terminationMessagePolicy": "FallbackToLogsOnError",
            "securityContext": sc,
            "volumeMounts": [
                {"name": "libvirt", "mountPath": "/run/libvirt"},
                {"name": "node-pki", "mountPath": pki, "readOnly": true},
            ],
        }));
    }
    (containers, volumes)
}

/// The runner's container that takes a migration's streams from the source node.
pub const PROXY_CONTAINER: &str = "migration-proxy";

/// The node's TUN/TAP device.
const TUN: &str = "/dev/net/tun";

/// The container libvirtd and QEMU run in: not privileged (its `/dev` is the runtime's
/// minimal one and the TUN device, no disk or other device of the node), with the
/// capabilities libvirtd needs to run QEMU unprivileged and nothing else; QEMU itself runs as
/// uid 107 with none (`deploy/launcher/qemu.conf`).
///
/// Not confined by the node's AppArmor (where the node has it): the runtime's default
/// profile forbids every mount, and the disk image's pin is one; QEMU's confinement is its
/// own user. Kubernetes ≥ 1.30 reads the field, older ones [`APPARMOR_ANNOTATION`].
pub fn libvirtd_security() -> serde_json::Value {
    json!({
        "privileged": false,
        "capabilities": {
            "drop": ["ALL"],
            "add": LIBVIRTD_CAPABILITIES,
        },
        "appArmorProfile": {"type": "Unconfined"},
    })
}

/// The AppArmor annotation of the libvirtd container (Kubernetes before 1.30; later ones
/// take it too, when it agrees with the field): see [`libvirtd_security`].
pub const APPARMOR_ANNOTATION: (&str, &str) = (
    "container.apparmor.security.beta.kubernetes.io/libvirtd",
    "unconfined",
);

/// What libvirtd's container may do, and why: `SYS_ADMIN` — `roam-shim libvirtd` bind-mounts
/// the checked disk image and unmounts the volume in the container's own mount namespace;
/// `NET_ADMIN` — libvirtd opens the VM's tap (made by the shim); `SETUID`, `SETGID`,
/// `SETPCAP` — it starts QEMU as uid/gid 107 with an empty bounding set (libcap-ng drops
/// the bounding set, which takes `SETPCAP`); `CHOWN`, `FOWNER`, `DAC_OVERRIDE` — it gives QEMU its
/// per-domain directories and reaches them, and the VM's disk image is given to QEMU's user;
/// `KILL` — it signals QEMU, which runs as another user.
pub const LIBVIRTD_CAPABILITIES: &[&str] = &[
    "SYS_ADMIN",
    "NET_ADMIN",
    "SETUID",
    "SETGID",
    "SETPCAP",
    "CHOWN",
    "FOWNER",
    "DAC_OVERRIDE",
    "KILL",
];

/// What the shim's container may do, and why: `NET_ADMIN` — it creates the VM's persistent
/// taps, brings them up and removes them (the node's network: the runner has the host's);
/// `DAC_OVERRIDE` — it reads the VM's boot files and disk image to check them, which may
/// belong to QEMU's user or the VM's owner, and on a migration's target connects to the
/// socket QEMU (uid 107) listens on for the incoming stream. Everything else it does is over
/// sockets: OVS's database and bridge, its libvirtd, the API.
pub const SHIM_CAPABILITIES: &[&str] = &["NET_ADMIN", "DAC_OVERRIDE"];

/// A container that can do nothing but read: no privilege, no capability, a read-only root.
fn unprivileged() -> serde_json::Value {
    json!({
        "privileged": false,
        "allowPrivilegeEscalation": false,
        "readOnlyRootFilesystem": true,
        "capabilities": {"drop": ["ALL"]},
    })
}

/// The launcher pod of `vm` (pure). Without runners ([`VmConfig::runners`]) it is the one pod
/// of the VM: host network, pinned to its node, libvirtd, QEMU and the shim in containers
/// with the capabilities they need ([`LIBVIRTD_CAPABILITIES`], [`SHIM_CAPABILITIES`]), the
/// console in one with none. With runners it is the VM's unprivileged
/// pod in its namespace: it holds the VM's resource requests and identity (its Addresses are
/// this pod's), mounts its boot volume and shows its console, while its runner
/// ([`runner_pod`], in roam's namespace) runs the VM.
pub fn launcher_pod(cfg: &VmConfig, vm: &VirtualMachine, l: &LauncherSpec<'_>) -> Result<Pod> {
    let p = parts(cfg, vm, l)?;
    let mut annotations = BTreeMap::new();
    // `kubectl logs POD` shows the guest's serial console (kubectl 1.21 and later read the
    // first annotation, earlier ones the second)
    for a in [
        DEFAULT_CONTAINER_ANNOTATION,
        DEFAULT_LOGS_CONTAINER_ANNOTATION,
    ] {
        annotations.insert(a.to_string(), CONSOLE_CONTAINER.to_string());
    }
    if let Some(m) = l.migration {
        annotations.insert(MIGRATION_ANNOTATION.to_string(), m.to_string());
    }
    // what the scheduler, the kubelet and quotas count against the node: the guest's memory
    // and QEMU's and the shim's own (roam's placement does the same sum)
    let need = roam_core::placement::Need::of(&vm.spec, cfg.cpu_allocation_ratio);
    let requests = json!({
        "memory": format!("{}Mi", need.memory_mib),
        "cpu": format!("{}m", need.millicpu),
    });
    let owner = vm.controller_owner_ref(&()).map(|o| vec![o]);
    if cfg.runners.is_none() {
        // this pod runs libvirtd itself
        annotations.insert(
            APPARMOR_ANNOTATION.0.to_string(),
            APPARMOR_ANNOTATION.1.to_string(),
        );
    }
    let metadata = json!({
        "name": l.pod,
        "namespace": p.ns,
        "labels": {VM_LABEL: p.name, LAUNCHER_LABEL: "true"},
        "annotations": annotations,
        "ownerReferences": owner,
    });
    let pod = match &cfg.runners {
        None => {
            let (mut containers, volumes) = vm_containers(
                cfg,
                &p,
                p.volume_claim.as_deref().map(VolumeSource::Claim),
                Some(requests),
            );
            containers.push(json!({
                // the guest's serial console on this container's output (kubectl logs): it
                // only reads the log directory, with no privilege and no capability
                "name": CONSOLE_CONTAINER,
                "image": cfg.launcher_image,
                "imagePullPolicy": "IfNotPresent",
                "args": ["console", "--file", p.serial_log],
                "terminationMessagePolicy": "FallbackToLogsOnError",
                "securityContext": unprivileged(),
                "volumeMounts": [
                    {"name": "logs", "mountPath": cfg.vm_log_dir, "readOnly": true},
                ],
            }));
            json!({
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": metadata,
                "spec": {
                    "nodeName": l.node,
                    "priorityClassName": cfg.priority_class,
                    "hostNetwork": true,
                    "dnsPolicy": "ClusterFirstWithHostNet",
                    // the shim never calls the API server: no ServiceAccount token to mount, and
                    // its own token comes as a digest on the command line. A Secret a new pod
                    // mounts is a race its node's kubelet can lose against the API server's node
                    // authorizer (forbidden, then a cache timeout and mount retries before the
                    // sandbox starts)
                    "automountServiceAccountToken": false,
                    "restartPolicy": "Always",
                    "terminationGracePeriodSeconds": 30,
                    // the pause process is PID 1 and reaps QEMU's processes (libvirt daemonizes
                    // them)
                    "shareProcessNamespace": true,
                    // the VM's own constraints: the kubelet checks the selector at admission,
                    // and a NoExecute taint the VM tolerates does not evict it
                    "nodeSelector": vm.spec.node_selector,
                    "tolerations": vm.spec.tolerations,
                    "containers": containers,
                    "volumes": volumes,
                }
            })
        }
        Some(_) => {
            let mut volumes = vec![
                // the runner's console relay writes the guest's console here
                json!({"name": CONSOLE_VOLUME, "emptyDir": {}}),
            ];
            let mut mounts = vec![
                json!({"name": CONSOLE_VOLUME, "mountPath": HOLDER_CONSOLE_DIR, "readOnly": true}),
            ];
            if let Some(claim) = &p.volume_claim {
                // the kubelet mounts a volume only for a container that uses it: the console
                // container does (read-only), and the runner finds the mount on the node
                volumes.push(
                    json!({"name": "boot-volume", "persistentVolumeClaim": {"claimName": claim}}),
                );
                mounts.push(
                    json!({"name": "boot-volume", "mountPath": VOLUME_DIR, "readOnly": true}),
                );
            }
            let mut sc = unprivileged();
            sc["runAsNonRoot"] = json!(true);
            json!({
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": metadata,
                "spec": {
                    "nodeName": l.node,
                    "priorityClassName": cfg.priority_class,
                    "automountServiceAccountToken": false,
                    "enableServiceLinks": false,
                    "restartPolicy": "Always",
                    "terminationGracePeriodSeconds": 30,
                    "nodeSelector": vm.spec.node_selector,
                    "tolerations": vm.spec.tolerations,
                    // what the Pod Security Standards' `restricted` profile asks
                    "securityContext": {
                        "runAsNonRoot": true,
                        "runAsUser": NOBODY,
                        "runAsGroup": NOBODY,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [{
                        // the guest's serial console on this container's output (kubectl logs),
                        // as the runner relays it; the VM's requests are this pod's
                        "name": CONSOLE_CONTAINER,
                        "image": cfg.launcher_image,
                        "imagePullPolicy": "IfNotPresent",
                        "args": ["console", "--file", format!("{HOLDER_CONSOLE_DIR}/{CONSOLE_FILE}")],
                        "resources": {"requests": requests},
                        "terminationMessagePolicy": "FallbackToLogsOnError",
                        "securityContext": sc,
                        "volumeMounts": mounts,
                    }],
                    "volumes": volumes,
                }
            })
        }
    };
    serde_json::from_value(pod)
        .map_err(|e| Error::invalid_vm(vm_key(vm), format!("launcher pod: {e}")))
}

/// The launcher pod's volume the runner relays the guest's console into.
pub const CONSOLE_VOLUME: &str = "console";
/// Where the launcher pod's console container reads it.
const HOLDER_CONSOLE_DIR: &str = "/run/roam-console";
/// The console file's name in that volume.
pub const CONSOLE_FILE: &str = "serial.log";
/// Where the runner's relay writes it.
const RELAY_CONSOLE_DIR: &str = "/run/roam-console";
/// The unprivileged user of the launcher pod (nobody).
const NOBODY: u32 = 65534;

/// Where the node shows the VM's boot volume as launcher pod `pod_uid` mounted it (pure):
/// a local volume and a CSI volume are mounted under the kubelet's directory of the pod; a
/// hostPath volume is its path. `Err`: a kind of volume a runner cannot reach.
pub fn claim_host_dir(
    kubelet_root: &str,
    pod_uid: &str,
    pv: &k8s_openapi::api::core::v1::PersistentVolume,
) -> std::result::Result<String, String> {
    let name = pv.metadata.name.clone().unwrap_or_default();
    let spec = pv
        .spec
        .as_ref()
        .ok_or_else(|| format!("PersistentVolume {name} has no spec"))?;
    let pods = format!(
        "{}/pods/{pod_uid}/volumes",
        kubelet_root.trim_end_matches('/')
    );
    if spec.local.is_some() {
        Ok(format!("{pods}/kubernetes.io~local-volume/{name}"))
    } else if spec.csi.is_some() {
        Ok(format!("{pods}/kubernetes.io~csi/{name}/mount"))
    } else if let Some(h) = &spec.host_path {
        Ok(h.path.clone())
    } else {
        Err(format!(
            "PersistentVolume {name} is neither local, CSI nor hostPath: roam's runners reach only those"
        ))
    }
}

/// The runner of launcher pod `launcher` (pure): the host-network pod in roam's
/// namespace that runs the VM — libvirtd and QEMU, the shim, and a relay of the guest's
/// console into the launcher pod's console volume. `volume_dir`: where the node shows the
/// VM's boot volume ([`claim_host_dir`]), for a VM that boots from one.
pub fn runner_pod(
    cfg: &VmConfig,
    vm: &VirtualMachine,
    l: &LauncherSpec<'_>,
    launcher: &Pod,
    volume_dir: Option<&str>,
) -> Result<Pod> {
    let invalid = |problem: String| Error::invalid_vm(vm_key(vm), problem);
    let runners = cfg
        .runners
        .as_ref()
        .ok_or_else(|| invalid("a runner without --runner-namespace".into()))?;
    let p = parts(cfg, vm, l)?;
    let launcher_uid = launcher
        .metadata
        .uid
        .as_deref()
        .ok_or_else(|| invalid(format!("launcher pod {} has no UID yet", l.pod)))?;
    let volume = match (&p.volume_claim, volume_dir) {
        (Some(_), Some(d)) => Some(VolumeSource::HostDir(d)),
        (Some(c), None) => {
            return Err(invalid(format!(
                "claim {c}: where the node mounted it is not known yet"
            )));
        }
        (None, _) => None,
    };
    let (mut containers, mut volumes) = vm_containers(cfg, &p, volume, None);
    let console_dir = format!(
        "{}/pods/{launcher_uid}/volumes/kubernetes.io~empty-dir/{CONSOLE_VOLUME}",
        runners.kubelet_root.trim_end_matches('/')
    );
    volumes.push(
        json!({"name": "console", "hostPath": {"path": console_dir, "type": "DirectoryOrCreate"}}),
    );
    containers.push(json!({
        // the guest's console, copied into the launcher pod's console volume (the file is
        // created there, never followed if it is a link)
        "name": RELAY_CONTAINER,
        "image": cfg.launcher_image,
        "imagePullPolicy": "IfNotPresent",
        "args": ["console", "--file", p.serial_log,
                 "--to", format!("{RELAY_CONSOLE_DIR}/{CONSOLE_FILE}")],
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": {
            "privileged": false,
            "allowPrivilegeEscalation": false,
            "readOnlyRootFilesystem": true,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [
            {"name": "logs", "mountPath": cfg.vm_log_dir, "readOnly": true},
            {"name": "console", "mountPath": RELAY_CONSOLE_DIR},
        ],
    }));
    let mut annotations = BTreeMap::new();
    annotations.insert(
        APPARMOR_ANNOTATION.0.to_string(),
        APPARMOR_ANNOTATION.1.to_string(),
    );
    annotations.insert(RUNNER_VM_ANNOTATION.to_string(), vm_key(vm));
    annotations.insert(
        RUNNER_OF_ANNOTATION.to_string(),
        format!("{}/{}", p.ns, l.pod),
    );
    annotations.insert(
        RUNNER_OF_UID_ANNOTATION.to_string(),
        launcher_uid.to_string(),
    );
    let pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": runner_name(&p.ns, &l.pod),
            "namespace": runners.namespace,
            "labels": {RUNNER_LABEL: "true", RUNNER_VM_LABEL: vm.uid().unwrap_or_default()},
            "annotations": annotations,
        },
        "spec": {
            "nodeName": l.node,
            "priorityClassName": cfg.priority_class,
            "hostNetwork": true,
            "dnsPolicy": "ClusterFirstWithHostNet",
            // the shim never calls the API server (see the one-pod launcher)
            "automountServiceAccountToken": false,
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            // the pause process is PID 1 and reaps QEMU's processes
            "shareProcessNamespace": true,
            // the launcher pod's node takes the VM: the runner goes where it is, whatever
            // the node's taints
            "tolerations": [{"operator": "Exists"}],
            "containers": containers,
            "volumes": volumes,
        }
    });
    serde_json::from_value(pod).map_err(|e| invalid(format!("runner pod: {e}")))
}

/// The runner's container that relays the guest's console to the launcher pod.
pub const RELAY_CONTAINER: &str = "console-relay";

/// A launcher as one pod (pure): launcher pod `launcher` with what its runner `runner` says
/// (with runners, [`VmConfig::runners`]). Its containers are both pods'; it is Running when
/// both are, Failed when either is, Pending otherwise (a runner not there yet, or gone: the
/// controller makes it again). Without runners pass `None` with `runners` false: the pod
/// as it is.
pub fn launcher_view(launcher: &Pod, runner: Option<&Pod>, runners: bool) -> Pod {
    let mut view = launcher.clone();
    if !runners {
        return view;
    }
    let phase = |p: &Pod| {
        p.status
            .as_ref()
            .and_then(|s| s.phase.clone())
            .unwrap_or_else(|| "Pending".into())
    };
    let lp = phase(launcher);
    let merged = match runner.map(phase) {
        _ if lp == "Failed" || lp == "Succeeded" => lp,
        Some(rp) if rp == "Failed" || rp == "Succeeded" => "Failed".into(),
        Some(rp) if rp == "Running" && lp == "Running" => lp,
        _ => "Pending".into(),
    };
    let st = view.status.get_or_insert_with(Default::default);
    st.phase = Some(merged);
    if let Some(rs) = runner
        .and_then(|r| r.status.as_ref())
        .and_then(|s| s.container_statuses.clone())
    {
        st.container_statuses
            .get_or_insert_with(Vec::new)
            .extend(rs);
    }
    view
}

#[cfg(test)]
mod tests {
    use super::*;
    use roam_api::VirtualMachineSpec;
    use roam_core::vm::tap_name;

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
            peer_libvirt_uri: "qemu+tcp://{ip}:{port}/system".into(),
            vm_log_dir: "/var/log/roam".into(),
            priority_class: None,
            node_pki_dir: None,
            image_root: None,
            cpu_allocation_ratio: roam_core::placement::DEFAULT_CPU_ALLOCATION_RATIO,
            runners: None,
        }
    }

    fn shim(spec: &k8s_openapi::api::core::v1::PodSpec) -> &k8s_openapi::api::core::v1::Container {
        spec.containers.iter().find(|c| c.name == "shim").unwrap()
    }

    /// The launcher of a VM that boots on node-a with `nics`, its shim on port 17100.
    fn boot_on_a(nics: &[VmNic]) -> LauncherSpec<'_> {
        LauncherSpec {
            pod: "demo-launcher".into(),
            node: "node-a",
            node_ip: "10.0.0.1",
            mode: Mode::Boot,
            migration: None,
            source: None,
            nics,
            port: 17100,
            token: "t0ken",
        }
    }

    fn nic(i: usize, port: &str) -> VmNic {
        VmNic {
            name: format!("eth{i}"),
            address: format!("a{i}"),
            ip: format!("10.0.0.{}", 10 + i),
            mac: format!("0a:58:64:40:00:0{}", 5 + i),
            tap: roam_core::vm::nic_tap("ns/demo", i),
            ovn_port: port.into(),
        }
    }

    #[test]
    fn kubectl_logs_shows_the_guests_console_from_an_unprivileged_container() {
        let nics = [nic(0, "a.node-a")];
        let p = launcher_pod(&cfg(), &vm(), &boot_on_a(&nics)).unwrap();
        for a in [
            DEFAULT_CONTAINER_ANNOTATION,
            DEFAULT_LOGS_CONTAINER_ANNOTATION,
        ] {
            assert_eq!(
                p.metadata.annotations.as_ref().unwrap()[a],
                CONSOLE_CONTAINER
            );
        }
        let spec = p.spec.unwrap();
        let console = spec
            .containers
            .iter()
            .find(|c| c.name == CONSOLE_CONTAINER)
            .expect("a console container");
        let serial = shim(&spec).args.clone().unwrap();
        let i = serial.iter().position(|a| a == "--serial-log").unwrap();
        assert_eq!(
            console.args.clone().unwrap(),
            ["console", "--file", serial[i + 1].as_str()],
            "it follows the file the shim gives QEMU"
        );
        let sc = console.security_context.as_ref().unwrap();
        assert_eq!(sc.privileged, Some(false));
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(sc.read_only_root_filesystem, Some(true));
        assert_eq!(
            sc.capabilities.as_ref().unwrap().drop.as_deref(),
            Some(&["ALL".to_string()][..])
        );
        let mounts = console.volume_mounts.clone().unwrap();
        assert_eq!(mounts.len(), 1, "the log directory only: {mounts:?}");
        assert_eq!(mounts[0].read_only, Some(true));
    }

    /// The launcher pod's spec of a VM booting from `boot`, with the image store
    /// `/var/lib/roam/images`.
    fn launcher_with_store(boot: serde_json::Value) -> k8s_openapi::api::core::v1::PodSpec {
        let mut v = vm();
        v.spec.boot = serde_json::from_value(boot).unwrap();
        let cfg = VmConfig {
            image_root: Some("/var/lib/roam/images".into()),
            ..cfg()
        };
        let nics = [nic(0, "a.node-a")];
        launcher_pod(&cfg, &v, &boot_on_a(&nics))
            .unwrap()
            .spec
            .unwrap()
    }

    /// A disk of the admin's image store is shared by every VM that boots it: the shim is
    /// told to attach it read-only, and its directory is mounted read-only.
    #[test]
    fn a_disk_of_the_image_store_is_read_only() {
        let spec = launcher_with_store(
            json!({"disk": {"image": "/var/lib/roam/images/base.raw", "format": "raw"}}),
        );
        let args = shim(&spec).args.clone().unwrap();
        let arg = |f: &str| args[args.iter().position(|a| a == f).unwrap() + 1].clone();
        assert_eq!(arg("--disk"), "/var/lib/roam/images/base.raw");
        assert_eq!(arg("--disk-access"), "read-only");
        let c = spec
            .containers
            .iter()
            .find(|x| x.name == "libvirtd")
            .unwrap();
        // the container QEMU runs in checks and pins the image before libvirtd starts
        let a = c.args.clone().unwrap();
        assert!(
            a.ends_with(&[
                "--disk".into(),
                "/var/lib/roam/images/base.raw".into(),
                "--disk-format".into(),
                "raw".into(),
                "--disk-access".into(),
                "read-only".into(),
                "--image-root".into(),
                "/var/lib/roam/images".into(),
            ]),
            "{a:?}"
        );
        assert!(
            c.volume_mounts
                .iter()
                .flatten()
                .any(|m| m.mount_path == "/var/lib/roam/images" && m.read_only == Some(true)),
            "the store's directory, read-only: {:?}",
            c.volume_mounts
        );
    }

    #[test]
    fn a_vm_on_a_volume_mounts_its_claim_and_no_host_directory() {
        let spec = launcher_with_store(
            json!({"volume": {"claimName": "disk1", "file": "images/vm.qcow2"}}),
        );
        let volumes = spec.volumes.clone().unwrap();
        let claim = volumes
            .iter()
            .find_map(|v| v.persistent_volume_claim.as_ref())
            .expect("the claim as a volume");
        assert_eq!(claim.claim_name, "disk1");
        assert!(
            !volumes
                .iter()
                .filter_map(|v| v.host_path.as_ref())
                .any(|h| h.path.contains("images")),
            "no image store: {volumes:?}"
        );
        let args = shim(&spec).args.clone().unwrap();
        let arg = |f: &str| args[args.iter().position(|a| a == f).unwrap() + 1].clone();
        assert_eq!(arg("--disk"), format!("{VOLUME_DIR}/images/vm.qcow2"));
        assert_eq!(arg("--disk-format"), "qcow2");
        assert!(
            !args.iter().any(|a| a == "--disk-access"),
            "the volume is the VM's to write: {args:?}"
        );
        assert_eq!(
            arg("--image-root"),
            VOLUME_DIR,
            "the file must resolve inside the volume"
        );
        let libvirtd = spec.containers.iter().find(|x| x.name == "libvirtd");
        let a = libvirtd.and_then(|c| c.args.clone()).unwrap();
        assert!(
            a.ends_with(&[
                "--disk".into(),
                format!("{VOLUME_DIR}/images/vm.qcow2"),
                "--disk-format".into(),
                "qcow2".into(),
                "--disk-access".into(),
                "read-write".into(),
                "--image-root".into(),
                VOLUME_DIR.into(),
            ]),
            "libvirtd checks and pins the volume's image: {a:?}"
        );
        for c in ["libvirtd", "shim"] {
            let c = spec.containers.iter().find(|x| x.name == c).unwrap();
            assert!(
                c.volume_mounts
                    .iter()
                    .flatten()
                    .any(|m| m.mount_path == VOLUME_DIR && m.read_only.is_none()),
                "{}: the volume, writable (the VM's disk)",
                c.name
            );
        }
    }

    fn split() -> VmConfig {
        VmConfig {
            runners: Some(RunnerConfig {
                namespace: "roam-system".into(),
                kubelet_root: "/var/lib/kubelet".into(),
            }),
            ..cfg()
        }
    }

    /// The launcher pod of a split launcher as the API server returns it (with a UID).
    fn created(mut p: Pod) -> Pod {
        p.metadata.uid = Some("pod-uid".into());
        p
    }

    #[test]
    fn with_runners_the_launcher_pod_is_unprivileged_and_holds_the_requests() {
        let nics = [nic(0, "a.node-a")];
        let p = launcher_pod(&split(), &vm(), &boot_on_a(&nics)).unwrap();
        assert_eq!(p.metadata.namespace.as_deref(), Some("ns"));
        assert!(is_launcher(&p));
        assert!(p.metadata.owner_references.is_some(), "the VM owns it");
        let spec = p.spec.unwrap();
        assert_eq!(
            spec.host_network, None,
            "the pod network, plumbed by roam-cni"
        );
        assert_eq!(spec.node_name.as_deref(), Some("node-a"));
        let psc = spec.security_context.clone().unwrap();
        assert_eq!(psc.run_as_non_root, Some(true));
        assert_eq!(psc.run_as_user, Some(65534));
        assert_eq!(
            psc.seccomp_profile.unwrap().type_,
            "RuntimeDefault",
            "the restricted profile's seccomp"
        );
        assert_eq!(spec.containers.len(), 1, "the console only");
        let c = &spec.containers[0];
        assert_eq!(c.name, CONSOLE_CONTAINER);
        let sc = c.security_context.clone().unwrap();
        assert_eq!(sc.privileged, Some(false));
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(sc.run_as_non_root, Some(true));
        assert_eq!(
            sc.capabilities.unwrap().drop.as_deref(),
            Some(&["ALL".to_string()][..])
        );
        // what the one-pod launcher's libvirtd requests: the guest and QEMU's overhead
        let one = launcher_pod(&cfg(), &vm(), &boot_on_a(&nics)).unwrap();
        let want = one.spec.unwrap().containers[0].resources.clone();
        assert!(want.as_ref().unwrap().requests.as_ref().unwrap()["memory"].0 != "256Mi");
        assert_eq!(c.resources, want);
        let volumes = spec.volumes.unwrap();
        assert!(
            volumes.iter().all(|v| v.host_path.is_none()),
            "no host path: {volumes:?}"
        );
        assert_eq!(volumes.len(), 1);
        assert!(volumes[0].empty_dir.is_some());
    }

    #[test]
    fn a_runner_runs_the_vm_in_roams_namespace_and_relays_the_console() {
        let nics = [nic(0, "a.node-a")];
        let l = boot_on_a(&nics);
        let launcher = created(launcher_pod(&split(), &vm(), &l).unwrap());
        let r = runner_pod(&split(), &vm(), &l, &launcher, None).unwrap();
        assert_eq!(r.metadata.namespace.as_deref(), Some("roam-system"));
        assert_eq!(
            r.metadata.name.as_deref(),
            Some(runner_name("ns", "demo-launcher").as_str())
        );
        assert!(r.metadata.owner_references.is_none());
        assert!(!is_launcher(&r), "the runner holds no address");
        assert_eq!(r.labels()[RUNNER_VM_LABEL], "u");
        assert_eq!(r.annotations()[APPARMOR_ANNOTATION.0], "unconfined");
        assert_eq!(
            runner_of(&r),
            Some(("ns".into(), "demo-launcher".into(), "pod-uid".into()))
        );
        let spec = r.spec.unwrap();
        assert_eq!(spec.host_network, Some(true));
        assert_eq!(spec.node_name.as_deref(), Some("node-a"));
        assert_eq!(spec.share_process_namespace, Some(true));
        let names: Vec<&str> = spec.containers.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["libvirtd", "shim", RELAY_CONTAINER]);
        assert!(
            spec.containers.iter().all(|c| c.resources.is_none()),
            "the launcher pod holds the requests"
        );
        let relay = &spec.containers[2];
        let args = relay.args.clone().unwrap();
        let serial = shim(&spec).args.clone().unwrap();
        let i = serial.iter().position(|a| a == "--serial-log").unwrap();
        assert_eq!(
            args,
            [
                "console",
                "--file",
                serial[i + 1].as_str(),
                "--to",
                "/run/roam-console/serial.log"
            ]
        );
        let console = spec
            .volumes
            .unwrap()
            .into_iter()
            .find(|v| v.name == "console")
            .unwrap();
        assert_eq!(
            console.host_path.unwrap().path,
            "/var/lib/kubelet/pods/pod-uid/volumes/kubernetes.io~empty-dir/console"
        );
        // a launcher pod not created yet has no runner
        let fresh = launcher_pod(&split(), &vm(), &l).unwrap();
        assert!(runner_pod(&split(), &vm(), &l, &fresh, None).is_err());
        // without runners there is none
        assert!(runner_pod(&cfg(), &vm(), &l, &launcher, None).is_err());
    }

    #[test]
    fn a_runner_takes_the_boot_volume_where_the_node_mounted_it() {
        let mut v = vm();
        v.spec.boot =
            serde_json::from_value(json!({"volume": {"claimName": "disk1", "file": "vm.img"}}))
                .unwrap();
        let nics = [nic(0, "a.node-a")];
        let l = boot_on_a(&nics);
        let launcher = created(launcher_pod(&split(), &v, &l).unwrap());
        let spec = launcher.spec.clone().unwrap();
        assert!(
            spec.volumes.iter().flatten().any(|v| v
                .persistent_volume_claim
                .as_ref()
                .map(|c| c.claim_name.as_str())
                == Some("disk1")),
            "the launcher pod mounts the claim"
        );
        assert!(
            spec.containers[0]
                .volume_mounts
                .iter()
                .flatten()
                .any(|m| m.name == "boot-volume" && m.read_only == Some(true)),
            "read-only, so that the kubelet mounts it"
        );
        assert!(
            runner_pod(&split(), &v, &l, &launcher, None).is_err(),
            "not before the node has mounted it"
        );
        let dir = "/var/lib/kubelet/pods/pod-uid/volumes/kubernetes.io~local-volume/pv1";
        let r = runner_pod(&split(), &v, &l, &launcher, Some(dir)).unwrap();
        let rs = r.spec.unwrap();
        let vol = rs
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == "boot-volume")
            .unwrap();
        assert_eq!(vol.host_path.as_ref().unwrap().path, dir);
        assert!(vol.persistent_volume_claim.is_none());
        assert!(
            shim(&rs)
                .volume_mounts
                .iter()
                .flatten()
                .any(|m| m.name == "boot-volume" && m.mount_path == VOLUME_DIR)
        );
    }

    #[test]
    fn the_nodes_mount_of_a_claim() {
        let pv = |spec: serde_json::Value| -> k8s_openapi::api::core::v1::PersistentVolume {
            serde_json::from_value(json!({"metadata": {"name": "pv1"}, "spec": spec})).unwrap()
        };
        assert_eq!(
            claim_host_dir(
                "/var/lib/kubelet/",
                "u1",
                &pv(json!({"local": {"path": "/d"}}))
            )
            .unwrap(),
            "/var/lib/kubelet/pods/u1/volumes/kubernetes.io~local-volume/pv1"
        );
        assert_eq!(
            claim_host_dir(
                "/k",
                "u1",
                &pv(json!({"csi": {"driver": "d", "volumeHandle": "h"}}))
            )
            .unwrap(),
            "/k/pods/u1/volumes/kubernetes.io~csi/pv1/mount"
        );
        assert_eq!(
            claim_host_dir("/k", "u1", &pv(json!({"hostPath": {"path": "/srv/v"}}))).unwrap(),
            "/srv/v"
        );
        let nfs = claim_host_dir(
            "/k",
            "u1",
            &pv(json!({"nfs": {"server": "s", "path": "/"}})),
        );
        assert!(nfs.unwrap_err().contains("neither local, CSI nor hostPath"));
    }

    #[test]
    fn the_launcher_view_is_running_only_when_both_pods_are() {
        let pod = |phase: &str, containers: &[(&str, bool)]| -> Pod {
            serde_json::from_value(json!({
                "metadata": {"name": "p"},
                "status": {"phase": phase, "containerStatuses": containers.iter().map(|(n, w)| {
                    let state = match w {
                        true => json!({"waiting": {"reason": "CrashLoopBackOff", "message": "back-off"}}),
                        false => json!({"running": {}}),
                    };
                    json!({"name": n, "ready": !w, "restartCount": 0, "image": "i", "imageID": "",
                           "state": state})
                }).collect::<Vec<_>>()}
            }))
            .unwrap()
        };
        let l = pod("Running", &[("console", false)]);
        let ok = pod("Running", &[("libvirtd", false), ("shim", false)]);
        let v = launcher_view(&l, Some(&ok), true);
        assert!(pod_running(&v));
        assert_eq!(v.status.unwrap().container_statuses.unwrap().len(), 3);
        assert!(
            !pod_running(&launcher_view(&l, None, true)),
            "no runner yet"
        );
        assert!(!pod_running(&launcher_view(
            &pod("Pending", &[]),
            Some(&ok),
            true
        )));
        let failed = launcher_view(&l, Some(&pod("Failed", &[])), true);
        assert!(pod_failed(&failed));
        let crashing = launcher_view(&l, Some(&pod("Running", &[("shim", true)])), true);
        assert!(
            launcher_trouble(&crashing)
                .unwrap()
                .contains("container shim CrashLoopBackOff"),
            "the runner's trouble is the launcher's"
        );
        // without runners the pod is itself
        assert_eq!(launcher_view(&l, None, false), l);
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
        let l = boot_on_a(&nics);
        let p = launcher_pod(&cfg(), &vm(), &l).unwrap();
        let args = shim(&p.spec.unwrap()).args.clone().unwrap();
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
            Err(Error::Core(e)) if matches!(*e, roam_core::Error::InvalidVm { .. })
        ));
    }

    #[test]
    fn launcher_pod_is_pinned_host_network_with_the_shim_args() {
        let l = LauncherSpec {
            pod: "demo-launcher".into(),
            node: "node-a",
            node_ip: "10.0.0.1",
            mode: Mode::Boot,
            migration: None,
            source: None,
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
        assert_eq!(spec.share_process_namespace, Some(true), "pause reaps QEMU");
        for c in &spec.containers {
            assert_eq!(
                c.termination_message_policy.as_deref(),
                Some("FallbackToLogsOnError"),
                "{}: a crash's log is its message",
                c.name
            );
        }
        assert!(
            spec.tolerations.clone().unwrap_or_default().is_empty(),
            "a VM without tolerations"
        );
        // the guest's 256 MiB and the launcher's overhead, counted against the node, on the
        // container QEMU runs in
        let libvirtd = &spec.containers[0];
        assert_eq!(libvirtd.name, "libvirtd");
        assert_eq!(
            libvirtd.args.clone().unwrap(),
            ["libvirtd", "--listen", "10.0.0.1:17200"],
            "the libvirt port is the shim's in the next block"
        );
        assert!(shim(&spec).resources.is_none());
        let requests = libvirtd.resources.clone().unwrap().requests.unwrap();
        assert_eq!(
            requests["memory"].0,
            format!("{}Mi", 256 + roam_core::placement::LAUNCHER_OVERHEAD_MIB)
        );
        // and its CPU: the VM's vCPUs at the allocation ratio (10 per CPU by default)
        assert_eq!(requests["cpu"].0, "100m");
        // nothing the target node's kubelet must fetch through the node authorizer
        for v in spec.volumes.iter().flatten() {
            assert!(
                v.secret.is_none() && v.config_map.is_none() && v.projected.is_none(),
                "volume {} comes from the API: {v:?}",
                v.name
            );
        }
        // the pod's own libvirtd: nothing of the node's
        for c in &spec.containers {
            for m in c.volume_mounts.iter().flatten() {
                let v = spec
                    .volumes
                    .iter()
                    .flatten()
                    .find(|v| v.name == m.name)
                    .unwrap();
                if m.mount_path.contains("libvirt") {
                    assert!(v.empty_dir.is_some(), "{} {m:?} is {v:?}", c.name);
                }
            }
        }
        let args = shim(&spec).args.clone().unwrap();
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
        assert_eq!(get("peer-libvirt-uri"), "qemu+tcp://10.0.0.1:17200/system");
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
    fn with_the_nodes_pki_the_shim_alone_holds_the_key_and_carries_the_migration() {
        let cfg = VmConfig {
            node_pki_dir: Some("/var/lib/roam/pki".into()),
            ..cfg()
        };
        let nics = [nic(0, "a.node-a")];
        let p = launcher_pod(&cfg, &vm(), &boot_on_a(&nics)).unwrap();
        let spec = p.spec.unwrap();
        let libvirtd = &spec.containers[0];
        // no network socket, no key where QEMU runs
        assert_eq!(libvirtd.args.clone().unwrap(), ["libvirtd"]);
        // not privileged: of the node's devices only the TUN device; the node's AppArmor
        // would forbid the disk image's pin
        assert_eq!(
            p.metadata.annotations.as_ref().unwrap()[APPARMOR_ANNOTATION.0],
            "unconfined"
        );
        let sc = libvirtd.security_context.clone().unwrap();
        assert_eq!(
            sc.app_armor_profile.as_ref().map(|a| a.type_.as_str()),
            Some("Unconfined")
        );
        assert_eq!(sc.privileged, Some(false));
        let caps = sc.capabilities.unwrap();
        assert_eq!(caps.drop.as_deref(), Some(&["ALL".to_string()][..]));
        assert!(
            !caps
                .add
                .unwrap_or_default()
                .iter()
                .any(|c| c == "SYS_PTRACE" || c == "SYS_MODULE" || c == "SYS_RAWIO"),
            "libvirtd's capabilities"
        );
        let host_paths: Vec<String> = spec
            .volumes
            .iter()
            .flatten()
            .filter(|v| {
                libvirtd
                    .volume_mounts
                    .iter()
                    .flatten()
                    .any(|m| m.name == v.name)
            })
            .filter_map(|v| v.host_path.as_ref().map(|h| h.path.clone()))
            .filter(|p| p.starts_with("/dev"))
            .collect();
        assert_eq!(host_paths, ["/dev/net/tun"]);
        assert!(
            !libvirtd
                .volume_mounts
                .iter()
                .flatten()
                .any(|m| m.name == "node-pki"),
            "the node's PKI in the libvirtd container: {:?}",
            libvirtd.volume_mounts
        );
        // the shim serves its API over mutual TLS with the node's certificate, and its
        // proxy takes the launcher's libvirt port, for its own node's certificate only
        let mount = shim(&spec)
            .volume_mounts
            .iter()
            .flatten()
            .find(|m| m.mount_path == "/var/lib/roam/pki")
            .expect("the node's PKI in the shim container");
        assert_eq!(mount.read_only, Some(true));
        let args = shim(&spec).args.clone().unwrap();
        let get = |args: &[String], k: &str| {
            let i = args.iter().position(|a| a == k).unwrap();
            args[i + 1].clone()
        };
        assert_eq!(get(&args, "--pki-dir"), "/var/lib/roam/pki");
        assert_eq!(get(&args, "--migration-proxy"), "10.0.0.1:17200");
        assert_eq!(get(&args, "--allowed-peers"), "node-a");
        // the target side of the proxy runs apart from the shim, with the key and one
        // capability
        let proxy = spec
            .containers
            .iter()
            .find(|c| c.name == PROXY_CONTAINER)
            .expect("the migration proxy's container");
        let pargs = proxy.args.clone().unwrap();
        assert_eq!(pargs[0], "proxy");
        assert_eq!(get(&pargs, "--listen"), "10.0.0.1:17200");
        assert_eq!(get(&pargs, "--allowed-peers"), "node-a");
        let psc = proxy.security_context.clone().unwrap();
        let caps = psc.capabilities.unwrap();
        assert_eq!(caps.add.as_deref(), Some(&["DAC_OVERRIDE".to_string()][..]));
        assert_eq!(caps.drop.as_deref(), Some(&["ALL".to_string()][..]));
        assert_eq!(psc.read_only_root_filesystem, Some(true));
        for plain in ["--peer-libvirt-uri", "--migration-uri"] {
            assert!(!args.iter().any(|a| a == plain), "{plain}: {args:?}");
        }
        assert_eq!(shim_url("10.0.0.1", 17001, true), "https://10.0.0.1:17001");
        assert_eq!(shim_url("10.0.0.1", 17001, false), "http://10.0.0.1:17001");
        // a migration's target also takes the source's, and no other node's
        let target = LauncherSpec {
            mode: Mode::Incoming,
            migration: Some("mig"),
            source: Some("node-b"),
            ..boot_on_a(&nics)
        };
        let p = launcher_pod(&cfg, &vm(), &target).unwrap();
        let args = shim(p.spec.as_ref().unwrap()).args.clone().unwrap();
        assert_eq!(get(&args, "--allowed-peers"), "node-a,node-b");
    }

    #[test]
    fn the_launcher_carries_the_vms_selector_and_tolerations() {
        let mut v = vm();
        v.spec.node_selector = [("zone".to_string(), "b".to_string())].into();
        v.spec.tolerations = vec![
            serde_json::from_value(
                json!({"key": "dedicated", "operator": "Exists", "effect": "NoExecute"}),
            )
            .unwrap(),
        ];
        let nics = [nic(0, "a0.node-a")];
        let l = boot_on_a(&nics);
        let spec = launcher_pod(&cfg(), &v, &l).unwrap().spec.unwrap();
        assert_eq!(spec.node_selector, Some(v.spec.node_selector.clone()));
        assert_eq!(spec.tolerations, Some(v.spec.tolerations.clone()));
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
            mode: Mode::Boot,
            migration: None,
            source: None,
            nics: &[nic(0, "o")],
            port: 1,
            token: "t0ken",
        };
        assert!(matches!(
            launcher_pod(&cfg(), &v, &l),
            Err(Error::Core(e)) if matches!(*e, roam_core::Error::InvalidVm { .. })
        ));
    }
}
