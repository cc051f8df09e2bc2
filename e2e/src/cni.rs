//! roam-cni on the lab: the binary, running it as a container runtime does, and the pods it
//! reads.

use std::path::PathBuf;
use std::process::Command;

use crate::lab::{Lab, holder_pid};

/// The roam-cni binary of this checkout (`cargo build -p roam-cni` builds it; CI builds the
/// whole workspace first). Panics when it is missing or older than a source it was built from
/// (per cargo's dep-info), except while the thread is already panicking (cleanup).
pub fn cni_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's own path");
    // target/<profile>/deps/<test> → target/<profile>/roam-cni
    let bin = exe
        .parent()
        .and_then(|d| d.parent())
        .expect("target/<profile>")
        .join("roam-cni");
    if std::thread::panicking() {
        return bin;
    }
    let built = std::fs::metadata(&bin)
        .and_then(|m| m.modified())
        .unwrap_or_else(|e| {
            panic!(
                "{}: {e}; build it first: cargo build -p roam-cni",
                bin.display()
            )
        });
    // "target/debug/roam-cni: src1 src2 ..." (paths with spaces are escaped with '\ ')
    let dep_info = std::fs::read_to_string(bin.with_extension("d")).unwrap_or_default();
    let sources = dep_info
        .lines()
        .next()
        .and_then(|l| l.split_once(": "))
        .map(|(_, deps)| deps.replace("\\ ", "\u{0}"))
        .unwrap_or_default();
    for src in sources.split_whitespace().map(|s| s.replace('\u{0}', " ")) {
        if let Ok(m) = std::fs::metadata(&src).and_then(|m| m.modified()) {
            assert!(
                m <= built,
                "{} is older than {src}: rebuild it with cargo build -p roam-cni",
                bin.display()
            );
        }
    }
    bin
}

/// What a CNI plugin printed and returned.
#[derive(Debug)]
pub struct CniOutput {
    /// Exit status.
    pub status: i32,
    /// stdout.
    pub stdout: String,
    /// stderr.
    pub stderr: String,
}

impl CniOutput {
    /// stdout as JSON; panics naming the output when it is not.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("CNI output is not JSON ({e}): {self:?}"))
    }
}

/// A kubeconfig the plugin can read inside every node (a node sees only its own files, not
/// the control plane's directory): the lab's admin kubeconfig, copied onto each node's disk
/// as `/etc/kubernetes/roam-cni-test.conf` — the test stands in for a runtime whose plugin
/// has credentials of its own. Written once per test process; returns the path as the
/// nodes see it.
pub fn node_kubeconfig(lab: &Lab) -> String {
    const NAME: &str = "roam-cni-test.conf";
    static WRITTEN: std::sync::Once = std::sync::Once::new();
    WRITTEN.call_once(|| {
        let text = std::fs::read(lab.kubeconfig()).expect("read the lab's kubeconfig");
        for node in lab.nodes() {
            let dir = lab.dir().join(node).join("fs_etc_kubernetes");
            let tmp = dir.join(format!(".{NAME}.{}", std::process::id()));
            std::fs::write(&tmp, &text).expect("write the kubeconfig onto the node");
            std::fs::rename(&tmp, dir.join(NAME)).expect("put the kubeconfig in place");
        }
    });
    format!("/etc/kubernetes/{NAME}")
}

/// Run the roam-cni binary as a container runtime does: inside `node`'s network and mount
/// namespaces, with exactly the environment `env` (nothing inherited) and `stdin`.
pub fn invoke_cni(lab: &Lab, node: &str, env: &[(&str, &str)], stdin: &str) -> CniOutput {
    use std::io::Write;
    use std::process::Stdio;
    let pid = holder_pid(lab, node);
    let bin = cni_binary();
    let mut child = Command::new("nsenter")
        .args(["-t", &pid, "-m", "-n", "--"])
        .arg(&bin)
        .env_clear()
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run roam-cni");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin.as_bytes())
        .expect("write the config");
    let out = child.wait_with_output().expect("wait for roam-cni");
    CniOutput {
        status: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// A pod that no kubelet runs (its nodeSelector matches no node), carrying the
/// `roam.dev/addresses` annotation `addresses` when given: what roam-cni reads.
pub fn unscheduled_pod(name: &str, addresses: Option<&str>) -> serde_json::Value {
    let mut annotations = serde_json::Map::new();
    if let Some(a) = addresses {
        annotations.insert(
            roam_contract::keys::ADDRESSES.into(),
            serde_json::Value::String(a.into()),
        );
    }
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "nodeSelector": {"roam.dev/e2e-no-such-node": "true"},
            "containers": [{"name": "c", "image": "lab.local/busybox:1.35", "imagePullPolicy": "Never"}],
        },
    })
}

/// The Address objects roam-controller would hold for pod `namespace/pod` on `node` (`None`:
/// a pod no kubelet runs) whose `roam.dev/addresses` is `annotation`: roam-cni plumbs only
/// what they confirm. Component tests and benches that publish addresses by hand, as the
/// controller, write these too ([`put_addresses`]). Empty when the annotation does not parse
/// (a test of a malformed one).
pub fn address_objects(
    namespace: &str,
    pod: &str,
    node: Option<&str>,
    annotation: &str,
) -> Vec<serde_json::Value> {
    let Ok(list) = roam_contract::annotation::parse_addresses(annotation) else {
        return Vec::new();
    };
    list.iter()
        .map(|pa| {
            let mut spec = serde_json::json!({
                "network": pa.network, "ip": pa.ip.to_string(), "mac": pa.mac,
                "owner": roam_contract::owner::pod_owner(namespace, pod),
                "reserved": true, "interface": pa.name,
            });
            // a pod no kubelet runs: the node its overlay port (`<address>.<node>`) names
            let host = node.or_else(|| pa.port.strip_prefix(&format!("{}.", pa.address)));
            if let Some(n) = host {
                spec["host"] = n.into();
            }
            serde_json::json!({
                "apiVersion": "roam.dev/v1alpha1", "kind": "Address",
                "metadata": {"name": pa.address,
                             "labels": {roam_contract::keys::NETWORK_LABEL: pa.network}},
                "spec": spec,
            })
        })
        .collect()
}

/// Create or replace `objects` (e.g. [`address_objects`]) in one `kubectl apply`.
pub fn put_addresses(lab: &Lab, objects: Vec<serde_json::Value>) {
    if objects.is_empty() {
        return;
    }
    let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": objects});
    crate::lab::kubectl_manifest(lab, "apply", &list)
        .unwrap_or_else(|e| panic!("apply Address objects: {e}"));
}

/// Delete the Address objects of Network `network` (what [`put_addresses`] wrote for it).
pub fn delete_addresses(lab: &Lab, network: &str) {
    let _ = crate::lab::try_kubectl(
        lab,
        &[
            "delete",
            "addresses",
            "-l",
            &format!("{}={network}", roam_contract::keys::NETWORK_LABEL),
            "--wait=false",
        ],
    );
}
