//! A namespace's ResourceQuota bounds its VMs, through the installed roam (the lab's
//! controller-manager runs the resourcequota controller, as every cluster's does): a VM whose
//! launcher pod would exceed the quota does not start — Pending, `QuotaExceeded` quoting the
//! quota, an Event, no pod — and starts once the quota lets it. The runner that runs the VM
//! in roam-system requests nothing; what it uses (libvirtd, QEMU with the guest, the shim) is
//! bounded by what the launcher pod requests, which the quota counts.

use std::time::Duration;

use roam_e2e::{Lab, VmCleanup, apply_crds, kubectl, try_kubectl, wait_until};
use serde_json::{Value, json};

const NS: &str = "p13-quota";
const NET: &str = "p13quota";
const LONG: Duration = Duration::from_secs(180);

fn get(lab: &Lab, args: &[&str]) -> Option<Value> {
    let mut all = args.to_vec();
    all.extend_from_slice(&["-o", "json"]);
    serde_json::from_str(&try_kubectl(lab, &all).ok()?).ok()
}

fn quota(memory: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "ResourceQuota",
           "metadata": {"name": "small", "namespace": NS},
           "spec": {"hard": {"requests.memory": memory}}})
}

/// Bytes of a quantity of memory as Kubernetes writes a request (`448Mi`, `1Gi`, `512`).
fn bytes(q: &str) -> u64 {
    let (n, unit) = q.split_at(q.find(|c: char| !c.is_ascii_digit()).unwrap_or(q.len()));
    let n: u64 = n.parse().expect("a number");
    n * match unit {
        "" => 1,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        u => panic!("unit {u}"),
    }
}

/// The memory the pod whose container `pid` runs in uses now: its pod cgroup's (v1
/// `memory.usage_in_bytes`, or v2 `memory.current`).
fn pod_memory(pid: u32) -> u64 {
    let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    // v1: "N:memory:PATH"; v2 only: "0::PATH"
    let v1 = cg.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (_, controllers, path) = (f.next()?, f.next()?, f.next()?);
        controllers
            .split(',')
            .any(|c| c == "memory")
            .then_some(path)
    });
    let (file, dir) = match v1 {
        Some(path) => (
            "memory.usage_in_bytes",
            format!("/sys/fs/cgroup/memory{path}"),
        ),
        None => {
            let path = cg.lines().find_map(|l| l.strip_prefix("0::")).unwrap();
            ("memory.current", format!("/sys/fs/cgroup{path}"))
        }
    };
    // the container's cgroup is in its pod's
    let pod = std::path::Path::new(&dir).parent().unwrap();
    std::fs::read_to_string(pod.join(file))
        .unwrap_or_else(|e| panic!("{}: {e}", pod.join(file).display()))
        .trim()
        .parse()
        .unwrap()
}

fn qemu_pid(name: &str) -> Option<u32> {
    roam_e2e::qemu_processes(&format!("guest={NS}_{name}"))
        .first()
        .map(|(pid, _)| *pid)
}

#[test]
fn a_namespaces_quota_bounds_its_vms() {
    let lab = Lab::get();
    let tap = roam_core::vm::tap_name(&format!("{NS}/q1"));
    let _cleanup = VmCleanup::new(&lab)
        .namespace(NS)
        .network(NET)
        .vm(&format!("{NS}_q1"), &[&tap])
        .cleaned();
    apply_crds(&lab);
    kubectl(&lab, &["create", "namespace", NS]);
    let net = json!({"apiVersion": "roam.dev/v1alpha1", "kind": "Network",
        "metadata": {"name": NET},
        "spec": {"subnet": "100.166.0.0/24", "transitSubnet": "169.254.166.0/24",
                 "poolSizePerNode": 1, "namespaces": [NS]}});
    roam_e2e::kubectl_manifest(&lab, "create", &net).expect("create the Network");
    roam_e2e::kubectl_manifest(&lab, "create", &quota("100Mi")).expect("create the quota");
    // the quota controller has counted the namespace (an uncounted quota admits nothing)
    wait_until(LONG, "the quota counted", || {
        let q = get(&lab, &["-n", NS, "get", "resourcequota", "small"])?;
        (!q["status"]["used"].is_null()).then_some(())
    });

    let (kernel, initrd) = lab.guest();
    let vm = json!({"apiVersion": "roam.dev/v1alpha1", "kind": "VirtualMachine",
        "metadata": {"name": "q1", "namespace": NS},
        "spec": {"cpu": 1, "memoryMiB": 128, "node": "node-a",
                 "boot": {"kernel": {"kernel": kernel, "initrd": initrd,
                                     "cmdline": "console=ttyS0 loglevel=5 panic=-1"}}}});
    roam_e2e::kubectl_manifest(&lab, "create", &vm).expect("create q1");
    let msg = wait_until(LONG, "q1 waiting for its quota", || {
        let v = get(&lab, &["-n", NS, "get", "vm", "q1"])?;
        let c = v["status"]["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["reason"] == "QuotaExceeded")?
            .clone();
        (v["status"]["phase"] == "Pending").then(|| c["message"].as_str().map(String::from))?
    });
    assert!(msg.contains("exceeded quota: small"), "{msg}");
    roam_e2e::wait_for_event(&lab, LONG, NS, "QuotaExceeded", "q1");
    let pods = get(&lab, &["-n", NS, "get", "pods"]).unwrap();
    assert_eq!(pods["items"].as_array().map(Vec::len), Some(0), "{pods}");
    assert_eq!(qemu_pid("q1"), None);

    // the quota raised: the VM starts
    roam_e2e::kubectl_manifest(&lab, "apply", &quota("2Gi")).expect("raise the quota");
    let st = wait_until(LONG, "q1 Running", || {
        let v = get(&lab, &["-n", NS, "get", "vm", "q1"])?;
        (v["status"]["phase"] == "Running").then(|| v["status"].clone())
    });
    let launcher = st["pod"].as_str().unwrap().to_string();
    let pod = get(&lab, &["-n", NS, "get", "pod", &launcher]).unwrap();
    let requested: u64 = pod["spec"]["containers"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["resources"]["requests"]["memory"].as_str())
        .map(bytes)
        .sum();
    let q = get(&lab, &["-n", NS, "get", "resourcequota", "small"]).unwrap();
    let used = q["status"]["used"]["requests.memory"]
        .as_str()
        .unwrap_or("0");
    wait_until(LONG, "the quota counting the launcher", || {
        let q = get(&lab, &["-n", NS, "get", "resourcequota", "small"])?;
        (bytes(q["status"]["used"]["requests.memory"].as_str()?) == requested).then_some(())
    });
    // what the runner uses (the guest's memory, QEMU, libvirtd, the shim) stays within what
    // the launcher requests (and the quota counts)
    let qemu = qemu_pid("q1").expect("q1's QEMU");
    let runner_uses = pod_memory(qemu);
    assert!(
        runner_uses <= requested,
        "the runner uses {runner_uses} bytes, the launcher requests {requested} (quota used: {used})"
    );
    eprintln!(
        "q1: runner uses {} MiB, launcher requests {} MiB",
        runner_uses >> 20,
        requested >> 20
    );
    kubectl(&lab, &["-n", NS, "delete", "vm", "q1"]);
    wait_until(LONG, "q1 gone", || {
        try_kubectl(&lab, &["-n", NS, "get", "vm", "q1"])
            .is_err()
            .then_some(())
    });
}
