//! Who may attach to a Network, through the installed roam, as a tenant: a ServiceAccount
//! bound to Kubernetes' own `edit` in its namespace (as in lab_tenant), with its own token.
//!
//! - A pod asking for another namespace's Network is refused: the controller's Warning
//!   Event and `roam.dev/error` name the Network and the namespace, roam-cni fails the
//!   sandbox with that reason (the kubelet's FailedCreatePodSandBox Event), and no Address
//!   is claimed for it. A VM asking for it gets `Ready=False/NetworkNotAllowed` and an Event,
//!   no launcher pod and no Address.
//! - A pod asking for `network-control` (CS6) on a cluster-wide Network is refused likewise
//!   (`ServiceClassNotAllowed`).
//! - The admin adds the namespace to the Network, and lists the class: the same pod and VM
//!   then start, with addresses of the Network, and the pod's Address carries the class.

use std::time::Duration;

use roam_e2e::{Installed, Lab, VmCleanup, apply_crds, kubectl, try_kubectl, wait_until};
use serde_json::{Value, json};

/// The tenant's namespace.
const NS: &str = "p12-tenant";
/// Another team's namespace, the only one its Network admits at first.
const OTHER_NS: &str = "p12-other";
/// The other team's Network.
const OTHER_NET: &str = "p12other";
/// A cluster-wide Network (allNamespaces), with the default service classes.
const OPEN_NET: &str = "p12open";
const SA: &str = "tenant";
const LONG: Duration = Duration::from_secs(300);

fn get(lab: &Lab, args: &[&str]) -> Option<Value> {
    let mut all = args.to_vec();
    all.extend_from_slice(&["-o", "json"]);
    serde_json::from_str(&try_kubectl(lab, &all).ok()?).ok()
}

/// A tenant's pod on node-a whose `roam.dev/interfaces` is `interfaces` (no priority class:
/// a tenant may not use the lab sleeper's critical one).
fn pod(name: &str, interfaces: Value) -> Value {
    let mut p = roam_e2e::sleeper_pod(NS, name, "node-a");
    p["metadata"]["annotations"] = json!({"roam.dev/interfaces": interfaces.to_string()});
    p["spec"]
        .as_object_mut()
        .unwrap()
        .remove("priorityClassName");
    p
}

/// The Events in the tenant's namespace about `name`, as (reporting component, reason,
/// message).
fn events(lab: &Lab, name: &str) -> Vec<(String, String, String)> {
    get(
        lab,
        &[
            "-n",
            NS,
            "get",
            "events",
            "--field-selector",
            &format!("involvedObject.name={name}"),
        ],
    )
    .and_then(|v| v["items"].as_array().cloned())
    .unwrap_or_default()
    .iter()
    .map(|e| {
        let s = |k: &str| e[k].as_str().unwrap_or_default().to_string();
        let from = match s("reportingComponent") {
            c if c.is_empty() => e["source"]["component"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
            c => c,
        };
        (from, s("reason"), s("message"))
    })
    .collect()
}

/// The owners of the Addresses of Network `net`.
fn owners(lab: &Lab, net: &str) -> Vec<String> {
    get(
        lab,
        &["get", "addresses", "-l", &format!("roam.dev/network={net}")],
    )
    .and_then(|v| v["items"].as_array().cloned())
    .unwrap_or_default()
    .iter()
    .filter_map(|a| a["spec"]["owner"].as_str().map(String::from))
    .collect()
}

/// A refused pod: roam-controller's Warning Event `reason` and its `roam.dev/error` both
/// hold every one of `needles`, and so does the kubelet's sandbox failure (roam-cni's error
/// JSON); the pod does not run.
fn assert_pod_refused(lab: &Lab, name: &str, reason: &str, needles: &[&str]) {
    let error = wait_until(LONG, &format!("{name}'s roam.dev/error"), || {
        let p = get(lab, &["-n", NS, "get", "pod", name])?;
        p["metadata"]["annotations"]["roam.dev/error"]
            .as_str()
            .map(String::from)
    });
    for n in needles {
        assert!(
            error.contains(n),
            "{name}'s roam.dev/error lacks {n:?}: {error}"
        );
    }
    let (_, _, note) = wait_until(LONG, &format!("a {reason} Event about {name}"), || {
        events(lab, name)
            .into_iter()
            .find(|(from, r, _)| from == "roam-controller" && r == reason)
    });
    for n in needles {
        assert!(note.contains(n), "the {reason} Event lacks {n:?}: {note}");
    }
    // the kubelet's: roam-cni failed ADD at once with the controller's reason (code 107),
    // not after its annotation timeout
    let (_, _, sandbox) = wait_until(LONG, &format!("{name}'s sandbox failure"), || {
        events(lab, name).into_iter().find(|(_, r, m)| {
            r == "FailedCreatePodSandBox" && needles.iter().all(|n| m.contains(n))
        })
    });
    assert!(
        sandbox.contains("roam-controller gives pod"),
        "roam-cni's refusal in the sandbox failure: {sandbox}"
    );
    let p = get(lab, &["-n", NS, "get", "pod", name]).expect("the pod");
    assert_ne!(p["status"]["phase"], "Running", "{p}");
    assert!(
        p["metadata"]["annotations"]["roam.dev/addresses"].is_null(),
        "{p}"
    );
}

/// The pod Running, with the one address roam-controller published for it: (IP, Address).
fn running(lab: &Lab, name: &str) -> (String, String) {
    wait_until(LONG, &format!("{name} Running"), || {
        let p = get(lab, &["-n", NS, "get", "pod", name])?;
        if p["status"]["phase"] != "Running" {
            return None;
        }
        let a: Vec<Value> =
            serde_json::from_str(p["metadata"]["annotations"]["roam.dev/addresses"].as_str()?)
                .ok()?;
        Some((
            a.first()?["ip"].as_str()?.to_string(),
            a.first()?["address"].as_str()?.to_string(),
        ))
    })
}

#[test]
fn a_tenant_attaches_only_where_a_network_admits_its_namespace_and_class() {
    let lab = Lab::get();
    let tap = roam_core::vm::tap_name(&format!("{NS}/n1"));
    let _cleanup = VmCleanup::new(&lab)
        .namespace(NS)
        .network(OTHER_NET)
        .network(OPEN_NET)
        .kubectl(&[
            "delete",
            "namespace",
            OTHER_NS,
            "--ignore-not-found",
            "--wait=true",
            "--timeout=120s",
        ])
        .vm(&format!("{NS}_n1"), &[&tap])
        .cleaned();
    apply_crds(&lab);
    let ctl = Installed::get(&lab);
    for ns in [NS, OTHER_NS] {
        kubectl(&lab, &["create", "namespace", ns]);
    }
    for net in [
        json!({"apiVersion": "roam.dev/v1alpha1", "kind": "Network",
            "metadata": {"name": OTHER_NET},
            "spec": {"subnet": "100.164.0.0/24", "transitSubnet": "169.254.164.0/24",
                     "poolSizePerNode": 2, "namespaces": [OTHER_NS]}}),
        json!({"apiVersion": "roam.dev/v1alpha1", "kind": "Network",
            "metadata": {"name": OPEN_NET},
            "spec": {"subnet": "100.165.0.0/24", "transitSubnet": "169.254.165.0/24",
                     "poolSizePerNode": 2, "allNamespaces": true}}),
    ] {
        roam_e2e::kubectl_manifest(&lab, "create", &net).expect("create the Network");
    }
    for net in [OTHER_NET, OPEN_NET] {
        wait_until(LONG, &format!("{net} Ready"), || {
            let v = get(&lab, &["get", "network", net])?;
            v["status"]["conditions"]
                .as_array()?
                .iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
                .then_some(())
        });
    }
    let tenant = roam_e2e::Tenant::create(&lab, NS, SA, LONG);
    wait_until(LONG, "the default ServiceAccount", || {
        try_kubectl(&lab, &["-n", NS, "get", "serviceaccount", "default"]).ok()
    });
    // what the admin sees: who may attach
    let ready =
        get(&lab, &["get", "network", OTHER_NET]).expect("the Network")["status"]["conditions"][0]
            ["message"]
            .clone();
    assert!(
        ready
            .as_str()
            .is_some_and(|m| m.contains(&format!("namespaces {OTHER_NS} may attach"))),
        "{ready}"
    );

    // --- refused: another namespace's Network, for a pod and a VM ---
    tenant
        .create_object(&pod(
            "intruder",
            json!([{"mode": "overlay", "network": OTHER_NET, "interface": {"name": "eth0"}}]),
        ))
        .unwrap_or_else(|e| panic!("the tenant creates it: {e}"));
    let (kernel, initrd) = lab.guest();
    tenant
        .create_object(
            &json!({"apiVersion": "roam.dev/v1alpha1", "kind": "VirtualMachine",
            "metadata": {"name": "n1", "namespace": NS},
            "spec": {"cpu": 1, "memoryMiB": 192, "node": "node-a",
                     "boot": {"kernel": {"kernel": kernel, "initrd": initrd,
                                         "cmdline": "console=ttyS0 loglevel=5 panic=-1"}},
                     "interfaces": [{"name": "eth0", "network": OTHER_NET}]}}),
        )
        .unwrap_or_else(|e| panic!("the tenant creates it: {e}"));
    let not_yours = [
        &format!("namespace {NS} may not attach to network {OTHER_NET}")[..],
        "spec.namespaces",
    ];
    assert_pod_refused(&lab, "intruder", "NetworkNotAllowed", &not_yours);
    let msg = wait_until(LONG, "n1 refused", || {
        let v = get(&lab, &["-n", NS, "get", "vm", "n1"])?;
        let c = v["status"]["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == "Ready" && c["reason"] == "NetworkNotAllowed")?
            .clone();
        c["message"].as_str().map(String::from)
    });
    for n in not_yours
        .iter()
        .chain(&[&format!("virtual machine {NS}/n1")[..]])
    {
        assert!(msg.contains(n), "n1's condition lacks {n:?}: {msg}");
    }
    wait_until(LONG, "n1's NetworkNotAllowed Event", || {
        events(&lab, "n1")
            .into_iter()
            .find(|(from, r, m)| {
                from == "roam-controller" && r == "NetworkNotAllowed" && m.contains(OTHER_NET)
            })
            .map(|_| ())
    });
    let (ok, out, err) = tenant.kubectl(&[
        "-n",
        NS,
        "get",
        "pods",
        "-l",
        "roam.dev/vm=n1",
        "-o",
        "name",
    ]);
    assert!(
        ok && out.trim().is_empty(),
        "no launcher pod for n1: {out}{err}"
    );
    let taken = owners(&lab, OTHER_NET);
    assert!(
        !taken.iter().any(|o| o.starts_with(NS)),
        "nothing of {OTHER_NET} claimed for {NS}: {taken:?}"
    );

    // --- refused: network-control on the cluster-wide Network ---
    tenant
        .create_object(&pod(
            "router",
            json!([{"mode": "overlay", "network": OPEN_NET,
                    "interface": {"name": "eth0", "service_class": "network-control"}}]),
        ))
        .unwrap_or_else(|e| panic!("the tenant creates it: {e}"));
    assert_pod_refused(
        &lab,
        "router",
        "ServiceClassNotAllowed",
        &[
            &format!("network {OPEN_NET} does not allow service class network-control")[..],
            "spec.serviceClasses",
        ],
    );
    let taken = owners(&lab, OPEN_NET);
    assert!(
        !taken.iter().any(|o| o.starts_with(NS)),
        "nothing of {OPEN_NET} claimed for {NS}: {taken:?}"
    );
    // the tenant cannot let itself in
    let (ok, _, err) = tenant.kubectl(&[
        "patch",
        "network",
        OTHER_NET,
        "--type=merge",
        "-p",
        &json!({"spec": {"allNamespaces": true}}).to_string(),
    ]);
    assert!(!ok && err.contains("forbidden"), "{err}");

    // --- the admin lets the namespace in and lists the class: the same pod and VM start ---
    kubectl(
        &lab,
        &[
            "patch",
            "network",
            OTHER_NET,
            "--type=merge",
            "-p",
            &json!({"spec": {"namespaces": [OTHER_NS, NS]}}).to_string(),
        ],
    );
    kubectl(
        &lab,
        &[
            "patch",
            "network",
            OPEN_NET,
            "--type=merge",
            "-p",
            &json!({"spec": {"serviceClasses": ["network-control"]}}).to_string(),
        ],
    );
    let (ip, _) = running(&lab, "intruder");
    assert!(
        ip.starts_with("100.164.0."),
        "an address of {OTHER_NET}: {ip}"
    );
    let (_, address) = running(&lab, "router");
    let a = get(&lab, &["get", "address", &address]).expect("the router's Address");
    assert_eq!(
        (
            a["spec"]["owner"].as_str(),
            a["spec"]["serviceClass"].as_str()
        ),
        (
            Some(format!("{NS}:router").as_str()),
            Some("network-control")
        ),
        "{a}"
    );
    let st = wait_until(LONG, "n1 Running", || {
        let v = get(&lab, &["-n", NS, "get", "vm", "n1"])?;
        (v["status"]["phase"] == "Running").then(|| v["status"].clone())
    });
    let vm_ip = st["interfaces"][0]["ip"].as_str().unwrap_or_default();
    assert!(
        vm_ip.starts_with("100.164.0."),
        "n1 on {OTHER_NET}: {st}\n{}",
        ctl.log_tail(30)
    );
    assert!(
        owners(&lab, OTHER_NET).contains(&format!("{NS}/n1")),
        "n1's Address"
    );
}
