//! A tenant, through the installed roam: a ServiceAccount bound to Kubernetes' own `edit`
//! ClusterRole in its namespace (roam's `roam-edit` aggregates into it), talking to the API
//! server with its own token. It creates a VM, migrates it and deletes it (all allowed);
//! a VM booting from a host path is refused with the reason; a pod it labels as the VM's and
//! annotates with the VM's address gets an address of its own and takes nothing from the
//! VM, nor does one that also poses as the VM's launcher pod (no network at all); roam's Secrets (the CA, the shims' tokens) are out of its reach. The VM's launcher pod
//! in its namespace is unprivileged (no privileged container, host path or host network): an
//! `exec` into it is user nobody with no capability, and the runner that runs the VM, in
//! roam-system, is out of the tenant's reach (exec, get).

use std::path::{Path, PathBuf};
use std::time::Duration;

use roam_e2e::{Installed, Lab, VmCleanup, apply_crds, kubectl, try_kubectl, wait_until};
use serde_json::{Value, json};

const NS: &str = "p11-tenant";
const NET: &str = "p11tenant";
const SA: &str = "tenant";
const LONG: Duration = Duration::from_secs(240);

/// kubectl as the tenant: (success, stdout, stderr).
fn as_tenant(lab: &Lab, kubeconfig: &Path, args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new(lab.kubectl())
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .output()
        .expect("run kubectl");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `kubectl create -f -` of `object` as the tenant.
fn create_as_tenant(lab: &Lab, kubeconfig: &Path, object: &Value) -> Result<(), String> {
    use std::io::Write;
    let mut child = std::process::Command::new(lab.kubectl())
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["create", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run kubectl");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(object.to_string().as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

fn get(lab: &Lab, args: &[&str]) -> Option<Value> {
    let mut all = args.to_vec();
    all.extend_from_slice(&["-o", "json"]);
    serde_json::from_str(&try_kubectl(lab, &all).ok()?).ok()
}

fn vm(name: &str, kernel: &str, initrd: &str) -> Value {
    json!({"apiVersion": "roam.dev/v1alpha1", "kind": "VirtualMachine",
           "metadata": {"name": name, "namespace": NS},
           "spec": {"cpu": 1, "memoryMiB": 192, "node": "node-a",
                    "boot": {"kernel": {"kernel": kernel, "initrd": initrd,
                                        "cmdline": "console=ttyS0 loglevel=5 panic=-1"}}}})
}

/// Removes the tenant's kubeconfig (it holds a token) when dropped.
struct RemoveFile(PathBuf);

impl Drop for RemoveFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn a_tenant_with_edit_runs_migrates_and_deletes_vms_and_reaches_nothing_else() {
    let lab = Lab::get();
    let tap = |n: &str| roam_migrator::core::vm::tap_name(&format!("{NS}/{n}"));
    let _cleanup = VmCleanup::new(&lab)
        .namespace(NS)
        .network(NET)
        .vm(&format!("{NS}_t1"), &[&tap("t1")])
        .vm(&format!("{NS}_t2"), &[&tap("t2")])
        .vm(&format!("{NS}_t3"), &[&tap("t3")])
        .cleaned();
    apply_crds(&lab);
    let ctl = Installed::get(&lab);
    kubectl(&lab, &["create", "namespace", NS]);
    let net = json!({"apiVersion": "roam.dev/v1alpha1", "kind": "Network",
        "metadata": {"name": NET},
        "spec": {"subnet": "100.163.0.0/24", "transitSubnet": "169.254.163.0/24", "poolSizePerNode": 2,
                 "namespaces": [NS]}});
    roam_e2e::kubectl_manifest(&lab, "create", &net).expect("create the Network");
    kubectl(&lab, &["-n", NS, "create", "serviceaccount", SA]);
    kubectl(
        &lab,
        &[
            "-n",
            NS,
            "create",
            "rolebinding",
            "tenant-edit",
            "--clusterrole=edit",
            &format!("--serviceaccount={NS}:{SA}"),
        ],
    );
    let kc = roam_e2e::service_account_kubeconfig(&lab, NS, SA);
    let _kc = RemoveFile(kc.clone());
    // roam-edit aggregates into edit (the cluster's aggregation controller, soon)
    wait_until(LONG, "edit covering roam's VMs", || {
        let (yes, out, _) = as_tenant(
            &lab,
            &kc,
            &[
                "-n",
                NS,
                "auth",
                "can-i",
                "create",
                "virtualmachines.roam.dev",
            ],
        );
        (yes && out.trim() == "yes").then_some(())
    });

    // a VM, created by the tenant, runs
    let (kernel, initrd) = lab.guest();
    create_as_tenant(&lab, &kc, &vm("t1", &kernel, &initrd)).expect("the tenant creates a VM");
    let st = wait_until(LONG, "t1 Running", || {
        let v = get(&lab, &["-n", NS, "get", "vm", "t1"])?;
        (v["status"]["phase"] == "Running").then(|| v["status"].clone())
    });
    let ip = st["interfaces"][0]["ip"].as_str().unwrap().to_string();
    let address = st["interfaces"][0]["address"].as_str().unwrap().to_string();

    // one that boots from a host path: refused, with the reason, nothing created
    create_as_tenant(&lab, &kc, &vm("t2", "/etc/shadow", &initrd))
        .expect("the API server takes the object");
    let msg = wait_until(LONG, "t2 refused", || {
        let v = get(&lab, &["-n", NS, "get", "vm", "t2"])?;
        let c = v["status"]["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["reason"] == "InvalidVirtualMachine")?
            .clone();
        c["message"].as_str().map(String::from)
    });
    assert!(msg.contains("outside the image store"), "{msg}");
    let (ok, out, _) = as_tenant(
        &lab,
        &kc,
        &[
            "-n",
            NS,
            "get",
            "pods",
            "-l",
            "roam.dev/vm=t2",
            "-o",
            "name",
        ],
    );
    assert!(ok && out.trim().is_empty(), "no launcher for t2: {out}");

    // the tenant migrates it
    let (ok, _, err) = as_tenant(
        &lab,
        &kc,
        &[
            "-n",
            NS,
            "annotate",
            "vm",
            "t1",
            "roam.dev/migrate-to=node-b",
        ],
    );
    assert!(ok, "the tenant annotates its VM: {err}");
    let st = wait_until(LONG, "t1 Running on node-b", || {
        let v = get(&lab, &["-n", NS, "get", "vm", "t1"])?;
        (v["status"]["phase"] == "Running"
            && v["status"]["node"] == "node-b"
            && v["status"]["migration"].is_null())
        .then(|| v["status"].clone())
    });
    assert_eq!(
        st["interfaces"][0]["ip"],
        ip.as_str(),
        "{}",
        ctl.log_tail(30)
    );

    // its launcher pod: unprivileged, and what the tenant can exec into there can do nothing
    let launcher = st["pod"].as_str().expect("t1's launcher pod").to_string();
    let pod = get(&lab, &["-n", NS, "get", "pod", &launcher]).expect("t1's launcher pod");
    let spec = &pod["spec"];
    assert!(spec["hostNetwork"].is_null(), "{spec}");
    assert!(
        spec["volumes"]
            .as_array()
            .is_some_and(|v| v.iter().all(|v| v["hostPath"].is_null())),
        "no host path: {spec}"
    );
    assert!(
        spec["containers"].as_array().is_some_and(|cs| cs
            .iter()
            .all(|c| c["securityContext"]["privileged"] != true
                && c["securityContext"]["capabilities"]["drop"][0] == "ALL")),
        "no privileged container: {spec}"
    );
    let (ok, out, err) = as_tenant(
        &lab,
        &kc,
        &[
            "-n",
            NS,
            "exec",
            &launcher,
            "--",
            "cat",
            "/proc/self/status",
        ],
    );
    assert!(ok, "the tenant execs into its VM's pod: {err}");
    let field = |k: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix(k))
            .map(|v| v.split_whitespace().next().unwrap_or_default().to_string())
    };
    assert_eq!(field("Uid:").as_deref(), Some("65534"), "{out}");
    assert_eq!(
        field("CapEff:").as_deref(),
        Some("0000000000000000"),
        "{out}"
    );
    assert_eq!(field("NoNewPrivs:").as_deref(), Some("1"), "{out}");
    // the runner that runs the VM: in roam-system, out of reach
    let runner = roam_migrator::core::launcher::runner_name(NS, &launcher);
    get(&lab, &["-n", "roam-system", "get", "pod", &runner]).expect("t1's runner");
    for args in [
        &["-n", "roam-system", "exec", runner.as_str(), "--", "id"][..],
        &["-n", "roam-system", "get", "pods"],
    ] {
        let (ok, _, err) = as_tenant(&lab, &kc, args);
        assert!(!ok && err.contains("forbidden"), "{args:?}: {err}");
    }

    // a pod labelled as the VM's and annotated with the VM's address: its own address, the
    // VM's Address untouched
    // (the launcher pod has no address of its own: the forged annotation is written from the
    // VM's Address, in the form roam-controller writes for a pod, and is one the CNI would
    // parse)
    let a = get(&lab, &["get", "address", &address]).expect("t1's Address");
    let stolen = json!([{"name": "eth0", "network": NET, "mode": "overlay",
        "address": address, "port": address, "ip": ip, "prefixLen": 32,
        "mac": a["spec"]["mac"], "gateway": "100.163.0.1", "mtu": 1400, "dhcp": true}])
    .to_string();
    roam_contract::annotation::parse_addresses(&stolen).expect("a well-formed forgery");
    let mut forger = roam_e2e::sleeper_pod(NS, "forger", "node-b");
    forger["metadata"]["labels"] = json!({"roam.dev/vm": "t1"});
    forger["metadata"]["annotations"] = json!({"roam.dev/addresses": stolen});
    // the lab's sleeper is critical priority (disk pressure); a tenant has no such class
    forger["spec"]
        .as_object_mut()
        .unwrap()
        .remove("priorityClassName");
    create_as_tenant(&lab, &kc, &forger).expect("the tenant creates a pod");
    let own = wait_until(
        LONG,
        "the forger Running with an address of its own",
        || {
            let p = get(&lab, &["-n", NS, "get", "pod", "forger"])?;
            if p["status"]["phase"] != "Running" {
                return None;
            }
            let a: Vec<Value> =
                serde_json::from_str(p["metadata"]["annotations"]["roam.dev/addresses"].as_str()?)
                    .ok()?;
            a.first()?["ip"].as_str().map(String::from)
        },
    );
    assert_ne!(own, ip, "the forger must not get the VM's IP");
    let a = get(&lab, &["get", "address", &address]).expect("t1's Address");
    assert_eq!(
        (a["spec"]["owner"].as_str(), a["spec"]["host"].as_str()),
        (Some(format!("{NS}/t1").as_str()), Some("node-b")),
        "{a}"
    );

    // the same forgery on a pod that also claims to be t1's launcher (the launcher label and
    // t1 as its controlling owner): roam takes it for a launcher, and roam-cni gives a
    // launcher pod no network (the VM's addresses are only on its runner's taps)
    let t1_uid = get(&lab, &["-n", NS, "get", "vm", "t1"]).expect("t1")["metadata"]["uid"]
        .as_str()
        .expect("t1's UID")
        .to_string();
    let mut impostor = roam_e2e::sleeper_pod(NS, "impostor", "node-b");
    impostor["metadata"]["labels"] = json!({"roam.dev/vm": "t1", "roam.dev/launcher": "true"});
    impostor["metadata"]["annotations"] = json!({"roam.dev/addresses": stolen});
    impostor["metadata"]["ownerReferences"] = json!([{"apiVersion": "roam.dev/v1alpha1",
        "kind": "VirtualMachine", "name": "t1", "uid": t1_uid, "controller": true}]);
    impostor["spec"]
        .as_object_mut()
        .unwrap()
        .remove("priorityClassName");
    create_as_tenant(&lab, &kc, &impostor).expect("the tenant creates the impostor");
    let pod_ip = wait_until(LONG, "the impostor Running", || {
        let p = get(&lab, &["-n", NS, "get", "pod", "impostor"])?;
        (p["status"]["phase"] == "Running")
            .then(|| p["status"]["podIP"].as_str().map(String::from))?
    });
    assert_eq!(
        pod_ip,
        roam_cni::result::ISOLATED_IP.to_string(),
        "isolated, not the VM's {ip}"
    );
    let a = get(&lab, &["get", "address", &address]).expect("t1's Address");
    assert_eq!(
        (a["spec"]["owner"].as_str(), a["spec"]["host"].as_str()),
        (Some(format!("{NS}/t1").as_str()), Some("node-b")),
        "{a}"
    );
    let v = get(&lab, &["-n", NS, "get", "vm", "t1"]).expect("t1");
    assert_eq!(v["status"]["phase"], "Running", "t1 runs on: {v}");

    nothing_is_adopted_by_name(&lab, &kc, &kernel, &initrd);
    strip_the_launcher_then_delete(&lab, &kc);

    // roam's Secrets: out of reach
    for args in [
        &["-n", "roam-system", "get", "secrets"][..],
        &["-n", "roam-system", "get", "secret", "roam-ca"],
        &["get", "secrets", "--all-namespaces"],
    ] {
        let (ok, _, err) = as_tenant(&lab, &kc, args);
        assert!(!ok && err.contains("forbidden"), "{args:?}: {err}");
    }
    // nor the platform's objects
    let (ok, _, err) = as_tenant(&lab, &kc, &["delete", "network", NET]);
    assert!(!ok && err.contains("forbidden"), "{err}");

    // the tenant deletes its VMs: gone, and t1's domain with them
    // (t3 is gone already: strip_the_launcher_then_delete)
    let (ok, _, err) = as_tenant(&lab, &kc, &["-n", NS, "delete", "vm", "t1", "t2"]);
    assert!(ok, "the tenant deletes its VMs: {err}");
    for n in ["t1", "t2", "t3"] {
        wait_until(LONG, &format!("{n} gone"), || {
            try_kubectl(&lab, &["-n", NS, "get", "vm", n])
                .is_err()
                .then_some(())
        });
    }
    let node_b = lab.node("node-b");
    let ports = roam_e2e::run(
        "ovs-vsctl",
        &[&format!("--db={}", node_b.ovs_db), "list-ports", "br-int"],
    );
    assert!(
        !ports.lines().any(|p| p == tap("t1")),
        "t1's port is gone from node-b: {ports}"
    );
}

/// The QEMU processes of VM `name` of this namespace on the machine (any node).
fn qemus_of(name: &str) -> usize {
    roam_e2e::qemu_processes(&format!("guest={NS}_{name}")).len()
}

/// A pod the tenant made under a VM's launcher name before the VM, with roam's labels: roam
/// neither uses nor deletes it, and makes no runner for it; the VM waits
/// (`LauncherInTheWay`, an Event naming the pod). Once the tenant deletes it, roam makes its
/// own and the VM runs.
fn nothing_is_adopted_by_name(lab: &Lab, kc: &Path, kernel: &str, initrd: &str) {
    let mut squatter = roam_e2e::sleeper_pod(NS, "t3-launcher", "node-a");
    squatter["metadata"]["labels"] = json!({"roam.dev/vm": "t3", "roam.dev/launcher": "true"});
    squatter["spec"]
        .as_object_mut()
        .unwrap()
        .remove("priorityClassName");
    create_as_tenant(lab, kc, &squatter).expect("the tenant makes a pod of the launcher's name");
    let squatter_uid = wait_until(LONG, "the squatter's UID", || {
        get(lab, &["-n", NS, "get", "pod", "t3-launcher"])?["metadata"]["uid"]
            .as_str()
            .map(String::from)
    });
    create_as_tenant(lab, kc, &vm("t3", kernel, initrd)).expect("the tenant creates t3");
    let msg = wait_until(LONG, "t3 waiting for the pod in the way", || {
        let v = get(lab, &["-n", NS, "get", "vm", "t3"])?;
        let c = v["status"]["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["reason"] == "LauncherInTheWay")?
            .clone();
        (v["status"]["phase"] == "Pending").then(|| c["message"].as_str().map(String::from))?
    });
    assert!(
        msg.contains("t3-launcher") && msg.contains("did not create"),
        "{msg}"
    );
    roam_e2e::wait_for_event(lab, LONG, NS, "LauncherInTheWay", "t3");
    let runner = roam_migrator::core::launcher::runner_name(NS, "t3-launcher");
    assert!(
        get(lab, &["-n", "roam-system", "get", "pod", &runner]).is_none(),
        "no runner for a pod roam did not make"
    );
    assert_eq!(qemus_of("t3"), 0);
    let p = get(lab, &["-n", NS, "get", "pod", "t3-launcher"]).expect("the squatter stays");
    assert_eq!(p["metadata"]["uid"], squatter_uid.as_str(), "not deleted");
    // the tenant removes it: roam makes its own pod, the VM runs
    let (ok, _, err) = as_tenant(
        lab,
        kc,
        &["-n", NS, "delete", "pod", "t3-launcher", "--wait=true"],
    );
    assert!(ok, "{err}");
    let st = wait_until(LONG, "t3 Running in roam's own pod", || {
        let v = get(lab, &["-n", NS, "get", "vm", "t3"])?;
        (v["status"]["phase"] == "Running").then(|| v["status"].clone())
    });
    let p = get(lab, &["-n", NS, "get", "pod", "t3-launcher"]).expect("t3's launcher pod");
    assert_ne!(p["metadata"]["uid"], squatter_uid.as_str());
    assert_eq!(st["podUID"], p["metadata"]["uid"], "the UID roam recorded");
}

/// The tenant strips roam's labels and the VM's ownership from the VM's launcher pod, then
/// deletes the VM: roam finds the pod from its runner in roam-system all the same, so the VM
/// goes only once its QEMU and runner are gone.
fn strip_the_launcher_then_delete(lab: &Lab, kc: &Path) {
    let st = get(lab, &["-n", NS, "get", "vm", "t3"]).expect("t3")["status"].clone();
    let launcher = st["pod"].as_str().expect("t3's launcher").to_string();
    let runner = roam_migrator::core::launcher::runner_name(NS, &launcher);
    for args in [
        &[
            "-n",
            NS,
            "label",
            "pod",
            launcher.as_str(),
            "roam.dev/launcher-",
            "roam.dev/vm-",
        ][..],
        &[
            "-n",
            NS,
            "patch",
            "pod",
            launcher.as_str(),
            "--type=json",
            "-p",
            r#"[{"op": "remove", "path": "/metadata/ownerReferences"}]"#,
        ],
        &["-n", NS, "delete", "vm", "t3", "--wait=false"],
    ] {
        let (ok, _, err) = as_tenant(lab, kc, args);
        assert!(ok, "{args:?}: {err}");
    }
    wait_until(LONG, "t3 gone", || {
        try_kubectl(lab, &["-n", NS, "get", "vm", "t3"])
            .is_err()
            .then_some(())
    });
    assert_eq!(qemus_of("t3"), 0, "t3's QEMU went before the VM did");
    assert!(
        get(lab, &["-n", "roam-system", "get", "pod", &runner])
            .is_none_or(|r| !r["metadata"]["deletionTimestamp"].is_null()),
        "t3's runner went before the VM did"
    );
}
