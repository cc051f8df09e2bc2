//! Pod Security as the lab enforces it: PodSecurityPolicy (its Kubernetes 1.20 has no Pod
//! Security admission), the `restricted` level everywhere (policy roam-restricted) and the
//! `privileged` one only in kube-system and roam-system (roam-privileged), by RoleBindings
//! there (e2e/labkit/pod-security.yaml, e2e/deploy/lab/pod-security.yaml).
//!
//! A tenant — a ServiceAccount bound to Kubernetes' own `edit` in its namespace, with its own
//! token — is refused, by admission (403), a privileged pod, a pod with a host path and a pod
//! on the host network, each with the policy's reason, and none of them is stored; its pod of
//! the `restricted` level is admitted (by roam-restricted) and runs. A VM it creates runs: its
//! launcher pod, which roam-controller makes in the tenant's namespace, is admitted by
//! roam-restricted (the only policy there for roam-controller and the pod), the VM's runner in
//! roam-system by roam-privileged. roam-system carries Pod Security admission's `privileged`
//! label (deploy/), for clusters that enforce with it.

use std::time::Duration;

use roam_e2e::{Installed, Lab, VmCleanup, apply_crds, kubectl, try_kubectl, wait_until};
use serde_json::{Value, json};

const NS: &str = "p33-psp";
const NET: &str = "p33psp";
const SA: &str = "tenant";
const LONG: Duration = Duration::from_secs(240);
/// The annotation PodSecurityPolicy admission puts on a pod: the policy that admitted it.
const PSP_ANNOTATION: &str = "kubernetes.io/psp";

fn get(lab: &Lab, args: &[&str]) -> Option<Value> {
    let mut all = args.to_vec();
    all.extend_from_slice(&["-o", "json"]);
    serde_json::from_str(&try_kubectl(lab, &all).ok()?).ok()
}

/// The tenant's pod `name` of the `restricted` level (busybox as nobody, no priority class:
/// a tenant has no use of the lab sleeper's critical one).
fn restricted(name: &str) -> Value {
    let mut p = roam_e2e::sleeper_pod(NS, name, "node-a");
    p["spec"]
        .as_object_mut()
        .unwrap()
        .remove("priorityClassName");
    p
}

/// `kubectl auth can-i use podsecuritypolicy/POLICY -n NS --as WHO`: "yes" or "no".
fn can_use(lab: &Lab, who: &str, policy: &str, ns: &str) -> String {
    let out = std::process::Command::new(lab.kubectl())
        .args(["--kubeconfig", lab.kubeconfig(), "auth", "can-i", "use"])
        .arg(format!("podsecuritypolicy/{policy}"))
        .args(["-n", ns])
        .arg(format!("--as={who}"))
        .output()
        .expect("run kubectl");
    // "no" exits 1; either is an answer
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn an_edit_tenant_gets_only_restricted_pods_and_its_vm_runs() {
    let lab = Lab::get();
    let tap = roam_core::vm::tap_name(&format!("{NS}/v1"));
    let _cleanup = VmCleanup::new(&lab)
        .namespace(NS)
        .network(NET)
        .vm(&format!("{NS}_v1"), &[&tap])
        .cleaned();
    apply_crds(&lab);
    let ctl = Installed::get(&lab);

    // who may use which policy: roam-restricted everyone, everywhere; roam-privileged only
    // roam-system's ServiceAccounts in roam-system (and kube-system's in kube-system)
    let controller = "system:serviceaccount:roam-system:roam-controller";
    let tenant = format!("system:serviceaccount:{NS}:{SA}");
    for (who, policy, ns, want) in [
        (tenant.as_str(), "roam-restricted", NS, "yes"),
        (tenant.as_str(), "roam-privileged", NS, "no"),
        (controller, "roam-restricted", NS, "yes"),
        (controller, "roam-privileged", NS, "no"),
        (controller, "roam-privileged", "roam-system", "yes"),
        (
            "system:serviceaccount:kube-system:roam-cni",
            "roam-privileged",
            "kube-system",
            "yes",
        ),
        (tenant.as_str(), "roam-privileged", "roam-system", "no"),
    ] {
        assert_eq!(
            can_use(&lab, who, policy, ns),
            want,
            "{who} may use {policy} in {ns}"
        );
    }
    let sys = get(&lab, &["get", "namespace", "roam-system"]).expect("roam-system");
    assert_eq!(
        sys["metadata"]["labels"]["pod-security.kubernetes.io/enforce"], "privileged",
        "deploy/ labels roam-system for Pod Security admission: {}",
        sys["metadata"]
    );

    kubectl(&lab, &["create", "namespace", NS]);
    let net = json!({"apiVersion": "roam.dev/v1alpha1", "kind": "Network",
        "metadata": {"name": NET},
        "spec": {"subnet": "100.173.0.0/24", "transitSubnet": "169.254.173.0/24", "poolSizePerNode": 2,
                 "namespaces": [NS]}});
    roam_e2e::kubectl_manifest(&lab, "create", &net).expect("create the Network");
    let tenant = roam_e2e::Tenant::create(&lab, NS, SA, LONG);
    wait_until(LONG, "the default ServiceAccount", || {
        try_kubectl(&lab, &["-n", NS, "get", "serviceaccount", "default"]).ok()
    });

    // refused by admission: each pod is the restricted one with one thing of `privileged`
    let mut privileged = restricted("privileged");
    privileged["spec"]["containers"][0]["securityContext"] = json!({"privileged": true});
    let mut host_path = restricted("host-path");
    host_path["spec"]["volumes"] =
        json!([{"name": "host", "hostPath": {"path": "/var/lib/roam", "type": "Directory"}}]);
    host_path["spec"]["containers"][0]["volumeMounts"] =
        json!([{"name": "host", "mountPath": "/host", "readOnly": true}]);
    let mut host_network = restricted("host-network");
    host_network["spec"]["hostNetwork"] = json!(true);
    for (pod, reason) in [
        (&privileged, "Privileged containers are not allowed"),
        (&host_path, "hostPath volumes are not allowed to be used"),
        (&host_network, "Host network is not allowed to be used"),
    ] {
        let name = pod["metadata"]["name"].as_str().unwrap();
        let err = tenant
            .create_object(pod)
            .expect_err(&format!("the tenant's {name} pod is refused"));
        // kubectl's rendering of a 403 with reason Forbidden, from PodSecurityPolicy
        assert!(
            err.contains("Error from server (Forbidden)")
                && err.contains("PodSecurityPolicy: unable to admit pod")
                && err.contains(reason),
            "{name}: {err}"
        );
        assert!(
            get(&lab, &["-n", NS, "get", "pod", name]).is_none(),
            "{name} is not stored"
        );
    }

    // admitted: the restricted pod, by roam-restricted, and it runs (as nobody)
    tenant
        .create_object(&restricted("plain"))
        .expect("the tenant's restricted pod");
    let p = wait_until(LONG, "the restricted pod Running", || {
        let p = get(&lab, &["-n", NS, "get", "pod", "plain"])?;
        (p["status"]["phase"] == "Running").then_some(p)
    });
    assert_eq!(
        p["metadata"]["annotations"][PSP_ANNOTATION], "roam-restricted",
        "{}",
        p["metadata"]
    );

    // a VM the tenant creates: its launcher pod (roam-controller's, in the tenant's
    // namespace) admitted by roam-restricted, its runner (roam-system) by roam-privileged
    let (kernel, initrd) = lab.guest();
    tenant
        .create_object(
            &json!({"apiVersion": "roam.dev/v1alpha1", "kind": "VirtualMachine",
            "metadata": {"name": "v1", "namespace": NS},
            "spec": {"cpu": 1, "memoryMiB": 192, "node": "node-a",
                     "boot": {"kernel": {"kernel": kernel, "initrd": initrd,
                                         "cmdline": "console=ttyS0 loglevel=5 panic=-1"}}}}),
        )
        .expect("the tenant creates a VM");
    let st = wait_until(LONG, "v1 Running", || {
        let v = get(&lab, &["-n", NS, "get", "vm", "v1"])?;
        (v["status"]["phase"] == "Running").then(|| v["status"].clone())
    });
    let launcher = st["pod"].as_str().expect("v1's launcher pod").to_string();
    let pod = get(&lab, &["-n", NS, "get", "pod", &launcher]).expect("v1's launcher pod");
    assert_eq!(
        pod["metadata"]["annotations"][PSP_ANNOTATION],
        "roam-restricted",
        "{}\n{}",
        pod["metadata"],
        ctl.log_tail(30)
    );
    let runner = roam_core::launcher::runner_name(NS, &launcher);
    let r = get(&lab, &["-n", "roam-system", "get", "pod", &runner]).expect("v1's runner");
    assert_eq!(
        r["metadata"]["annotations"][PSP_ANNOTATION], "roam-privileged",
        "{}",
        r["metadata"]
    );

    let (ok, _, err) = tenant.kubectl(&["-n", NS, "delete", "vm", "v1"]);
    assert!(ok, "the tenant deletes its VM: {err}");
    wait_until(LONG, "v1 gone", || {
        try_kubectl(&lab, &["-n", NS, "get", "vm", "v1"])
            .is_err()
            .then_some(())
    });
}
