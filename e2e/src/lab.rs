//! The running lab: where its parts are (`lab.env`), running tools and kubectl against it,
//! waiting on conditions, and building the workspace binaries the tests start.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

/// The lab's parts, read from the environment (`eval "$(e2e/lab env)"`) or, failing that,
/// from the `lab.env` file that `e2e/lab up` writes.
#[derive(Clone, Debug)]
pub struct Lab {
    vars: HashMap<String, String>,
}

/// One lab node: its namespaces and daemons.
#[derive(Clone, Debug)]
pub struct Node {
    /// `node-a` or `node-b`: also the OVN chassis name and the Kubernetes Node name.
    pub name: String,
    /// The node's network namespace (`ip -n` works with it).
    pub netns: String,
    /// The node's address on the lab bridge (API traffic, migration stream).
    pub ip: String,
    /// The node's local Open_vSwitch database, `unix:PATH`.
    pub ovs_db: String,
}

impl Node {
    /// Remove `port` from the node's `br-int` and delete its device (a tap, a veth end) in
    /// the node's namespace. Best effort, for clean-ups: what is not there is fine.
    pub fn remove_port(&self, port: &str) {
        let db = format!("--db={}", self.ovs_db);
        let _ = try_run(
            "ovs-vsctl",
            &[&db, "--if-exists", "del-port", "br-int", port],
        );
        let _ = try_run("ip", &["-n", &self.netns, "link", "del", port]);
    }

    /// Destroy libvirt domain `name` of a component test on this node (in the node's
    /// [`TestLibvirt`], if it runs: a launcher pod's domain goes with its pod). Best effort,
    /// for clean-ups.
    pub fn destroy_domain(&self, lab: &Lab, name: &str) {
        let uri = TestLibvirt::host_uri(lab, &self.name);
        let _ = try_run("virsh", &["-c", &uri, "destroy", name]);
    }
}

impl Lab {
    fn env_file() -> PathBuf {
        let dir = std::env::var("ROAM_LAB_DIR").unwrap_or_else(|_| "/var/tmp/roam/lab".into());
        PathBuf::from(&dir).join("lab.env")
    }

    /// What the environment and `lab.env` say, whether or not the lab is up.
    fn read() -> Lab {
        let mut vars: HashMap<String, String> = std::fs::read_to_string(Lab::env_file())
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        for (k, v) in std::env::vars() {
            if k.starts_with("ROAM_") || k == "KUBECONFIG" || k.starts_with("OVN_") {
                vars.insert(k, v);
            }
        }
        Lab { vars }
    }

    /// The running lab. Panics with instructions when it is not up.
    pub fn get() -> Lab {
        let file = Lab::env_file();
        let lab = Lab::read();
        if lab.var_opt("OVN_NB_DB").is_none() || lab.var_opt("KUBECONFIG").is_none() {
            panic!(
                "the roam lab is not up ({} missing): run `sudo e2e/lab up` first (the tests need a real \
                 kube-apiserver, OVN and libvirt; they are never skipped)",
                file.display()
            );
        }
        lab
    }

    fn var_opt(&self, k: &str) -> Option<&str> {
        self.vars
            .get(k)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }

    /// A lab variable; panics naming it when missing.
    pub fn var(&self, k: &str) -> &str {
        self.var_opt(k).unwrap_or_else(|| {
            panic!("lab variable {k} is not set; is the lab up (e2e/lab status)?")
        })
    }

    /// The lab's kubeconfig file.
    pub fn kubeconfig(&self) -> &str {
        self.var("KUBECONFIG")
    }

    /// A kube-rs client for the lab's API server, from the lab's kubeconfig.
    pub async fn kube_client(&self) -> kube::Client {
        use kube::config::{KubeConfigOptions, Kubeconfig};
        let kc = Kubeconfig::read_from(self.kubeconfig()).expect("read the lab kubeconfig");
        let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .expect("the lab kubeconfig is valid");
        kube::Client::try_from(config).expect("build a kube client")
    }

    /// kubectl built from the same source as the lab's API server.
    pub fn kubectl(&self) -> &str {
        self.var("ROAM_KUBECTL")
    }

    /// OVN northbound database (unix socket).
    pub fn nb(&self) -> &str {
        self.var("OVN_NB_DB")
    }

    /// OVN northbound database over TCP on loopback.
    pub fn nb_tcp(&self) -> &str {
        self.var("ROAM_OVN_NB_TCP")
    }

    /// The southbound database over TCP on the host's loopback (the tests' own tools; nodes and
    /// controllers reach it over TLS: `ROAM_OVN_SB_SSL`).
    pub fn sb_tcp(&self) -> &str {
        self.var("ROAM_OVN_SB_TCP")
    }

    /// The lab's nodes (`node-a`, `node-b`, and `node-c` with `ROAM_LAB_NODES=3`).
    pub fn nodes(&self) -> Vec<String> {
        self.var("ROAM_NODES")
            .split_whitespace()
            .map(String::from)
            .collect()
    }

    /// A node by name (`node-a`, `node-b`).
    pub fn node(&self, name: &str) -> Node {
        let key = name.replace('-', "_").to_uppercase();
        let get = |what: &str| self.var(&format!("ROAM_{key}_{what}")).to_string();
        Node {
            name: name.to_string(),
            netns: get("NETNS"),
            ip: get("IP"),
            ovs_db: get("OVS_DB"),
        }
    }

    /// The guest kernel and initramfs.
    pub fn guest(&self) -> (String, String) {
        (
            self.var("ROAM_GUEST_KERNEL").into(),
            self.var("ROAM_GUEST_INITRD").into(),
        )
    }

    /// The lab's state directory.
    pub fn dir(&self) -> PathBuf {
        PathBuf::from(self.var("ROAM_LAB_DIR"))
    }

    /// `path` as node `node` sees it (through its holder process's root: the node's own
    /// mount namespace, e.g. its own `/var/log/roam`): for a test to read a node's files.
    pub fn node_path(&self, node: &str, path: &str) -> PathBuf {
        PathBuf::from(format!("/proc/{}/root{path}", holder_pid(self, node)))
    }
}

/// A libvirtd on a lab node for the component tests that drive libvirt or roam-shim
/// themselves (lab_vm, lab_shim, the shim bench). No node has a libvirtd of its own — roam's
/// launcher pods each run theirs — so this one is a pod too: the launcher image's
/// `roam-shim libvirtd`, host network, listening for migrating peers on the node's address at
/// libvirt's usual port, with its sockets in the node's `/run/roam-test-libvirt` (where a
/// shim the test starts in the node finds them). Started by the first test that asks, then
/// shared by every test of the lab, as a node's daemon would be.
#[derive(Clone, Debug)]
pub struct TestLibvirt {
    /// Its unix socket as this process (on the host) reaches it.
    pub uri: String,
    /// Its unix socket as a process inside the node reaches it.
    pub node_uri: String,
    /// How another node's libvirtd reaches it (peer-to-peer migration).
    pub peer_uri: String,
}

/// The node directory of the test libvirtd's sockets.
const TEST_LIBVIRT_RUN: &str = "/run/roam-test-libvirt";
/// Its namespace.
const TEST_LIBVIRT_NS: &str = "roam-test-libvirt";

impl TestLibvirt {
    /// The host's view of the test libvirtd's socket on `node` (whether it runs or not).
    fn host_uri(lab: &Lab, node: &str) -> String {
        let sock = lab.node_path(node, &format!("{TEST_LIBVIRT_RUN}/libvirt-sock"));
        format!("qemu+unix:///system?socket={}", sock.display())
    }
}

impl Lab {
    /// The test libvirtd on `node`, started now if it does not run (see [`TestLibvirt`]).
    pub fn test_libvirt(&self, node: &str) -> TestLibvirt {
        let n = self.node(node);
        let uri = TestLibvirt::host_uri(self, node);
        let answers = || try_run("virsh", &["-c", &uri, "version"]).is_ok();
        if !answers() {
            let guest_dir = std::path::Path::new(self.var("ROAM_GUEST_KERNEL"))
                .parent()
                .expect("the guest's directory")
                .display()
                .to_string();
            let lab_dir = self.dir().display().to_string();
            let pod = format!("libvirtd-{node}");
            let host = |name: &str, path: &str| serde_json::json!({"name": name, "hostPath": {"path": path, "type": "DirectoryOrCreate"}});
            let manifest = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": [
                {"apiVersion": "v1", "kind": "Namespace",
                 "metadata": {"name": TEST_LIBVIRT_NS, "labels": {TEST_LABEL: "true"}}},
                {"apiVersion": "v1", "kind": "Pod",
                 "metadata": {"name": pod, "namespace": TEST_LIBVIRT_NS},
                 "spec": {
                    "nodeName": node,
                    "hostNetwork": true,
                    // pause reaps QEMU (see roam's launcher pods)
                    "shareProcessNamespace": true,
                    "automountServiceAccountToken": false,
                    "terminationGracePeriodSeconds": 5,
                    "containers": [{
                        "name": "libvirtd",
                        "image": self.var("ROAM_LAUNCHER_IMAGE"),
                        "imagePullPolicy": "Never",
                        "args": ["libvirtd", "--listen", format!("{}:16509", n.ip)],
                        "securityContext": {"privileged": true},
                        "volumeMounts": [
                            {"name": "run", "mountPath": "/run/libvirt"},
                            // the tests' serial logs and token files, and the guest
                            {"name": "lab", "mountPath": lab_dir},
                            {"name": "guest", "mountPath": guest_dir, "readOnly": true},
                        ],
                    }],
                    "volumes": [host("run", TEST_LIBVIRT_RUN), host("lab", &lab_dir), host("guest", &guest_dir)],
                 }},
            ]});
            kubectl_manifest(self, "apply", &manifest)
                .unwrap_or_else(|e| panic!("start the test libvirtd on {node}: {e}"));
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(180);
            while !answers() {
                if std::time::Instant::now() > deadline {
                    let ns = ["-n", TEST_LIBVIRT_NS];
                    panic!(
                        "the test libvirtd on {node} does not answer at {uri} after 180 s:\n{}\n{}",
                        try_kubectl(self, &[ns[0], ns[1], "describe", "pod", &pod])
                            .unwrap_or_else(|e| e),
                        try_kubectl(self, &[ns[0], ns[1], "logs", &pod, "--tail=30"])
                            .unwrap_or_else(|e| e),
                    );
                }
                std::thread::sleep(std::time::Duration::from_millis(200));
            }
        }
        TestLibvirt {
            uri,
            node_uri: format!("qemu+unix:///system?socket={TEST_LIBVIRT_RUN}/libvirt-sock"),
            peer_uri: format!("qemu+tcp://{}/system", n.ip),
        }
    }
}

/// The pods of VM `ns/vm` that may run it (as JSON): its launcher pods and, with runners,
/// their runners in roam-system. Each of them runs its own libvirtd ([`launcher_libvirt`]).
pub fn launcher_pods_running(lab: &Lab, ns: &str, vm: &str) -> Vec<serde_json::Value> {
    use roam_contract::keys::{RUNNER_LABEL, RUNNER_VM_ANNOTATION};
    let list = |ns: &str, label: &str| -> Vec<serde_json::Value> {
        try_kubectl(lab, &["-n", ns, "get", "pods", "-l", label, "-o", "json"])
            .ok()
            .and_then(|out| serde_json::from_str::<serde_json::Value>(&out).ok())
            .and_then(|v| v["items"].as_array().cloned())
            .unwrap_or_default()
    };
    let mut pods = list(ns, &format!("{}={vm}", roam_contract::keys::VM_LABEL));
    // with runners (as installed), the runner in roam-system runs the VM
    pods.extend(
        list(RUNNER_NAMESPACE, &format!("{RUNNER_LABEL}=true"))
            .into_iter()
            .filter(|p| p["metadata"]["annotations"][RUNNER_VM_ANNOTATION] == format!("{ns}/{vm}")),
    );
    pods
}

/// The namespace of the installed roam's VM runners.
pub const RUNNER_NAMESPACE: &str = "roam-system";

/// The pod that runs launcher pod `ns/pod`'s VM, as `(namespace, name)`: its runner in
/// roam-system when it has one (roam as installed), else the pod itself.
pub fn runner_of_launcher(lab: &Lab, ns: &str, pod: &str) -> (String, String) {
    use roam_contract::keys::{RUNNER_LABEL, RUNNER_OF_ANNOTATION};
    let label = format!("{RUNNER_LABEL}=true");
    let runner = try_kubectl(
        lab,
        &[
            "-n",
            RUNNER_NAMESPACE,
            "get",
            "pods",
            "-l",
            &label,
            "-o",
            "json",
        ],
    )
    .ok()
    .and_then(|out| serde_json::from_str::<serde_json::Value>(&out).ok())
    .and_then(|v| {
        v["items"].as_array()?.iter().find_map(|p| {
            (p["metadata"]["annotations"][RUNNER_OF_ANNOTATION] == format!("{ns}/{pod}"))
                .then(|| p["metadata"]["name"].as_str().map(String::from))?
        })
    });
    match runner {
        Some(r) => (RUNNER_NAMESPACE.to_string(), r),
        None => (ns.to_string(), pod.to_string()),
    }
}

/// The libvirtd of VM `vm`'s launcher on `node` (namespace `ns`; the pod that runs it, see
/// [`launcher_pods_running`]), as a URI for virsh on the lab's host, or `None` when the VM
/// has no live launcher there. A libvirtd with a `--listen` (plain TCP, roam without node
/// identities) is reached there; else (as installed) it has UNIX sockets only, and the URI
/// names its socket in the pod's `libvirt` volume on the node (the test acts as an admin of
/// that node).
pub fn launcher_libvirt(lab: &Lab, ns: &str, vm: &str, node: &str) -> Option<String> {
    launcher_pods_running(lab, ns, vm).iter().find_map(|p| {
        if p["spec"]["nodeName"] != node || !p["metadata"]["deletionTimestamp"].is_null() {
            return None;
        }
        let c = p["spec"]["containers"]
            .as_array()?
            .iter()
            .find(|c| c["name"] == "libvirtd")?;
        let args: Vec<&str> = c["args"]
            .as_array()?
            .iter()
            .filter_map(|a| a.as_str())
            .collect();
        match args.iter().position(|a| *a == "--listen") {
            Some(i) => Some(format!("qemu+tcp://{}/system", args.get(i + 1)?)),
            None => {
                let uid = p["metadata"]["uid"].as_str()?;
                let sock = lab.node_path(
                    node,
                    &format!(
                        "/var/lib/kubelet/pods/{uid}/volumes/kubernetes.io~empty-dir/libvirt/libvirt-sock"
                    ),
                );
                // a socket's path has at most 107 bytes: a short link to it (connect follows)
                let link = lab.dir().join(format!("libvirt-{}.sock", &uid[..uid.len().min(13)]));
                let _ = std::fs::remove_file(&link);
                std::os::unix::fs::symlink(&sock, &link).ok()?;
                Some(format!("qemu+unix:///system?socket={}", link.display()))
            }
        }
    })
}

/// What the lab guest's init (`e2e/guest/initramfs/init`) prints on the serial console at
/// every boot: one more than before means the guest rebooted (the kernel's own banner is
/// below the lab guests' `loglevel=5`).
pub const GUEST_BOOT_MARKER: &str = "ROAM-GUEST-INIT";

/// How many times the guest booted, from its serial log.
pub fn guest_boots(serial: &str) -> usize {
    serial.matches(GUEST_BOOT_MARKER).count()
}

/// `program` as the lab runs it: OVN's and Open vSwitch's tools (`ovn-*`, `ovs-*`,
/// `ovsdb-*`) from the lab's own OVN release (`ROAM_OVN_BIN`, newer than the host's
/// packages: a tool must speak its databases' schema), anything else as PATH finds it.
pub fn tool(program: &str) -> String {
    static OVN_BIN: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    let bin = OVN_BIN.get_or_init(|| Lab::read().var_opt("ROAM_OVN_BIN").map(String::from));
    match bin {
        Some(dir)
            if !program.contains('/')
                && ["ovn-", "ovs-", "ovsdb-"]
                    .iter()
                    .any(|p| program.starts_with(p)) =>
        {
            format!("{dir}/{program}")
        }
        _ => program.to_string(),
    }
}

/// Run a program; panic with its output if it fails. Returns stdout.
pub fn run(program: &str, args: &[&str]) -> String {
    let out = Command::new(tool(program))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    if !out.status.success() {
        panic!(
            "{program} {} failed ({}):\nstdout: {}\nstderr: {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Run the lab's kubectl against the lab's API server; panics with kubectl's stderr.
pub fn kubectl(lab: &Lab, args: &[&str]) -> String {
    let mut all = vec!["--kubeconfig", lab.kubeconfig()];
    all.extend_from_slice(args);
    run(lab.kubectl(), &all)
}

/// The QEMU processes on this machine (every node's) whose command line holds `needle`
/// (`guest=NS_NAME` for a VM's, a file's path): their PIDs and command lines.
pub fn qemu_processes(needle: &str) -> Vec<(u32, String)> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let c = std::fs::read(e.path().join("cmdline")).ok()?;
            let c = String::from_utf8_lossy(&c).replace('\0', " ");
            (c.contains("qemu-system") && c.contains(needle)).then_some((pid, c))
        })
        .collect()
}

/// Who QEMU process `pid` runs as: its real, effective, saved and filesystem uids and gids,
/// its effective capabilities, and the files of `secrets` its mount namespace shows.
#[derive(Clone, Debug)]
pub struct QemuIdentity {
    /// The `Uid:` line's four values.
    pub uids: Vec<u32>,
    /// The `Gid:` line's four values.
    pub gids: Vec<u32>,
    /// The supplementary groups (`Groups:`).
    pub groups: Vec<u32>,
    /// `CapEff`, as the hexadecimal mask.
    pub cap_eff: u64,
    /// The block and character devices of its `/dev` its uid and gids may open for reading
    /// or writing, by their permission bits.
    pub open_devices: Vec<String>,
    /// The paths of `secrets` that exist in its mount namespace.
    pub visible: Vec<String>,
}

/// [`QemuIdentity`] of `pid`, or `None` when it is gone.
pub fn qemu_identity(pid: u32, secrets: &[&str]) -> Option<QemuIdentity> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let ids = |key: &str| -> Vec<u32> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .map(|v| {
                v.split_whitespace()
                    .filter_map(|n| n.parse().ok())
                    .collect()
            })
            .unwrap_or_default()
    };
    let cap_eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())?;
    let visible = secrets
        .iter()
        .filter(|p| std::path::Path::new(&format!("/proc/{pid}/root{p}")).exists())
        .map(|p| p.to_string())
        .collect();
    let (uids, gids, groups) = (ids("Uid:"), ids("Gid:"), ids("Groups:"));
    let mut open_devices = vec![];
    let mut dirs = vec![std::path::PathBuf::from(format!("/proc/{pid}/root/dev"))];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            use std::os::unix::fs::{FileTypeExt, MetadataExt};
            let Ok(m) = std::fs::symlink_metadata(e.path()) else {
                continue;
            };
            let t = m.file_type();
            if t.is_dir() && !t.is_symlink() {
                dirs.push(e.path());
                continue;
            }
            if !(t.is_block_device() || t.is_char_device()) {
                continue;
            }
            let mode = m.mode();
            let bits = if uids.first() == Some(&m.uid()) {
                mode >> 6
            } else if gids.first() == Some(&m.gid()) || groups.contains(&m.gid()) {
                mode >> 3
            } else {
                mode
            } & 0o6;
            if bits != 0 {
                open_devices.push(e.path().display().to_string());
            }
        }
    }
    Some(QemuIdentity {
        uids,
        gids,
        groups,
        cap_eff,
        visible,
        open_devices,
    })
}

/// Wait (up to `timeout`) for an Event of `reason` about object `name` in namespace `ns`.
pub fn wait_for_event(lab: &Lab, timeout: std::time::Duration, ns: &str, reason: &str, name: &str) {
    let selector = format!("reason={reason},involvedObject.name={name}");
    wait_until(
        timeout,
        &format!("a {reason} Event about {ns}/{name}"),
        || {
            let found = try_kubectl(
                lab,
                &[
                    "-n",
                    ns,
                    "get",
                    "events",
                    "--field-selector",
                    &selector,
                    "-o",
                    "name",
                ],
            )
            .ok()?;
            (!found.trim().is_empty()).then_some(())
        },
    );
}

/// Run the lab's kubectl against the lab's API server; `Ok(stdout)` or `Err(stderr)`.
pub fn try_kubectl(lab: &Lab, args: &[&str]) -> Result<String, String> {
    let mut all = vec!["--kubeconfig", lab.kubeconfig()];
    all.extend_from_slice(args);
    try_run(lab.kubectl(), &all)
}

/// A pod that only sleeps, pinned to lab node `node` (busybox from the nodes' containerd;
/// critical priority: the lab's kubelets may report disk pressure, and an evicted pod is a
/// finished pod, whose address is released). Not on the host network: roam-cni plumbs it.
/// Of the `restricted` Pod Security level ([`restricted_pod`]).
pub fn sleeper_pod(ns: &str, name: &str, node: &str) -> serde_json::Value {
    let mut pod = serde_json::json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"nodeName": node, "priorityClassName": "system-node-critical",
                 "terminationGracePeriodSeconds": 0,
                 "containers": [{"name": "c", "image": "lab.local/busybox:1.35",
                                 "imagePullPolicy": "Never", "command": ["sleep", "3600"]}]}});
    restricted_pod(&mut pod);
    pod
}

/// The user a [`restricted_pod`] runs as (nobody).
pub const RESTRICTED_UID: u32 = 65534;

/// Make `pod` one of the Pod Security Standards' `restricted` level: user nobody, the
/// runtime's default seccomp profile, and containers with every capability dropped and no
/// privilege escalation. The lab enforces that level on every namespace but kube-system and
/// roam-system (e2e/labkit/pod-security.yaml), so a tenant's pods must be of it. So must a
/// pod the admin makes where the installed roam-controller annotates it: PodSecurityPolicy
/// checks a pod again on every update, against the policies its updater or its
/// ServiceAccount may use (not the admin's).
pub fn restricted_pod(pod: &mut serde_json::Value) {
    pod["spec"]["securityContext"] = serde_json::json!({
        "runAsNonRoot": true, "runAsUser": RESTRICTED_UID, "runAsGroup": RESTRICTED_UID,
        "seccompProfile": {"type": "RuntimeDefault"}});
    for c in pod["spec"]["containers"]
        .as_array_mut()
        .into_iter()
        .flatten()
    {
        c["securityContext"] = serde_json::json!({
            "allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}});
    }
}

/// The label of a namespace, Network or Node that belongs to a test running a
/// roam-controller of its own: the installed roam (e2e/deploy/lab) leaves those be.
pub const TEST_LABEL: &str = "roam.dev/test";

/// Create namespace `ns` for a test that runs its own roam-controller: labelled
/// [`TEST_LABEL`], so the installed roam serves none of its pods, VMs and migrations.
pub fn create_test_namespace(lab: &Lab, ns: &str) {
    let manifest = serde_json::json!({"apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": ns, "labels": {TEST_LABEL: "true"}}});
    kubectl_manifest(lab, "create", &manifest)
        .unwrap_or_else(|e| panic!("create namespace {ns}: {e}"));
}

/// `kubectl <verb> -f` of `manifest` (an object or a List), written to a file under the lab
/// directory for the call; `Ok(stdout)` or `Err(stderr)`.
pub fn kubectl_manifest(
    lab: &Lab,
    verb: &str,
    manifest: &serde_json::Value,
) -> Result<String, String> {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let file = lab
        .dir()
        .join(format!("manifest-{}-{n}.json", std::process::id()));
    std::fs::write(&file, manifest.to_string()).map_err(|e| format!("write {file:?}: {e}"))?;
    let r = try_kubectl(lab, &[verb, "-f", file.to_str().expect("a UTF-8 path")]);
    let _ = std::fs::remove_file(&file);
    r
}

/// File `path` as each node has it on its own disk, node-a's then node-b's, … (a VM's serial
/// log, written on each node it ran on), concatenated; a node without it adds nothing.
pub fn node_files(lab: &Lab, path: &str) -> String {
    lab.nodes()
        .iter()
        .map(|node| {
            std::fs::read(lab.node_path(node, path))
                .map(|b| String::from_utf8_lossy(&b).into_owned())
                .unwrap_or_default()
        })
        .collect()
}

/// Apply roam's CRDs (`deploy/crds`) and wait until the API server serves every one of them.
pub fn apply_crds(lab: &Lab) {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/crds");
    kubectl(
        lab,
        &["apply", "--server-side", "--force-conflicts", "-f", dir],
    );
    for crd in [
        "virtualmachines.roam.dev",
        "virtualmachinemigrations.roam.dev",
        "networks.roam.dev",
        "addresses.roam.dev",
    ] {
        kubectl(
            lab,
            &[
                "wait",
                "--for=condition=Established",
                "--timeout=60s",
                "crd",
                crd,
            ],
        );
    }
}

/// Run a program; `Ok(stdout)` or `Err(stderr)`.
pub fn try_run(program: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(tool(program))
        .args(args)
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// Poll `f` until it returns `Some`, for at most `timeout`; panic naming `what` otherwise.
pub fn wait_until<T>(timeout: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        if Instant::now() > deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// [`wait_until`], but on timeout the panic message carries `report()` (the state that
/// explains the failure: OVN rows, logs).
pub fn wait_until_else<T>(
    timeout: Duration,
    what: &str,
    f: impl FnMut() -> Option<T>,
    report: impl FnOnce() -> String,
) -> T {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_until(timeout, what, f)
    })) {
        Ok(v) => v,
        Err(_) => panic!(
            "timed out after {timeout:?} waiting for {what}\n{}",
            report()
        ),
    }
}

/// `program` run inside `node`'s network and mount namespaces, the way the lab runs node
/// daemons (`nsenter` into the node's holder process): the node's `/run` holds its libvirt
/// and OVS sockets at their usual paths.
pub fn node_command(lab: &Lab, node: &str, program: &str) -> Command {
    let key = node.replace('-', "_").to_uppercase();
    let pid = lab.var(&format!("ROAM_{key}_HOLDER_PID")).to_string();
    let mut c = Command::new("nsenter");
    c.args(["-t", &pid, "-m", "-n", "--", &tool(program)]);
    c
}

/// Build binary `bin` of workspace package `pkg` now (a debug build; quick when it is up to
/// date) and return its path.
pub fn workspace_binary(pkg: &str, bin: &str) -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .current_dir(&root)
        .args(["build", "-q", "-p", pkg, "--bin", bin])
        .status()
        .unwrap_or_else(|e| panic!("run cargo build for {bin}: {e}"));
    assert!(status.success(), "building {bin} failed");
    std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| root.join("target"))
        .join("debug")
        .join(bin)
}

/// The PID that holds `node`'s network and mount namespaces (`nsenter -t PID -m -n`).
pub fn holder_pid(lab: &Lab, node: &str) -> String {
    lab.var(&format!(
        "ROAM_{}_HOLDER_PID",
        node.replace('-', "_").to_uppercase()
    ))
    .to_string()
}

/// Run a program inside `node`'s network and mount namespaces; `Ok(stdout)` or `Err(stderr)`.
pub fn node_try_run(lab: &Lab, node: &str, program: &str, args: &[&str]) -> Result<String, String> {
    let pid = holder_pid(lab, node);
    let mut all = vec!["-t", pid.as_str(), "-m", "-n", "--", program];
    all.extend_from_slice(args);
    try_run("nsenter", &all)
}

/// A kubeconfig for the lab's API server that authenticates as `system_ns/sa` with the token
/// Kubernetes 1.20 put in the service account's Secret (the lab's kube-controller-manager
/// creates it), written under the lab directory.
pub fn service_account_kubeconfig(lab: &Lab, system_ns: &str, sa: &str) -> std::path::PathBuf {
    let (secret, token) = service_account_secret(lab, system_ns, sa);
    let s: serde_json::Value = serde_json::from_str(&kubectl(
        lab,
        &["-n", system_ns, "get", "secret", &secret, "-o", "json"],
    ))
    .expect("the token Secret as JSON");
    let ca = s["data"]["ca.crt"]
        .as_str()
        .expect("ca.crt in the token Secret");
    let server = kubectl(
        lab,
        &[
            "config",
            "view",
            "--raw",
            "--minify",
            "-o",
            "jsonpath={.clusters[0].cluster.server}",
        ],
    );
    let kc = serde_json::json!({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "lab", "cluster": {"server": server.trim(), "certificate-authority-data": ca}}],
        "users": [{"name": sa, "user": {"token": token.trim()}}],
        "contexts": [{"name": sa, "context": {"cluster": "lab", "user": sa}}],
        "current-context": sa,
    });
    let path = lab.dir().join(format!("{sa}.kubeconfig"));
    std::fs::write(&path, kc.to_string()).expect("write the service account's kubeconfig");
    path
}

/// The token of ServiceAccount `system_ns/sa` (from the Secret Kubernetes 1.20 made for it).
pub fn service_account_token(lab: &Lab, system_ns: &str, sa: &str) -> String {
    service_account_secret(lab, system_ns, sa)
        .1
        .trim()
        .to_string()
}

/// The name of ServiceAccount `system_ns/sa`'s token Secret and the token, once there.
fn service_account_secret(lab: &Lab, system_ns: &str, sa: &str) -> (String, String) {
    let secret = wait_until(
        std::time::Duration::from_secs(180),
        "the service account's token Secret",
        || {
            let s: serde_json::Value = serde_json::from_str(
                &try_kubectl(
                    lab,
                    &["-n", system_ns, "get", "serviceaccount", sa, "-o", "json"],
                )
                .ok()?,
            )
            .ok()?;
            s["secrets"][0]["name"].as_str().map(str::to_string)
        },
    );
    let token = wait_until(
        std::time::Duration::from_secs(180),
        "the token in the Secret",
        || {
            try_kubectl(
                lab,
                &[
                    "-n",
                    system_ns,
                    "get",
                    "secret",
                    &secret,
                    "-o",
                    "go-template={{.data.token | base64decode}}",
                ],
            )
            .ok()
            .filter(|t| !t.trim().is_empty())
        },
    );
    (secret, token)
}
