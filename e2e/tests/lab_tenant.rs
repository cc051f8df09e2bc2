//! A tenant, through the installed roam: a ServiceAccount bound to Kubernetes' own `edit`
//! ClusterRole in its namespace (roam's `roam-edit` aggregates into it), talking to the API
//! server with its own token ([`Tenant`]), tries what it can. It creates a VM, migrates it
//! and deletes it (all allowed). Refused or harmless, each checked:
//! - a VM booting from a host path (refused with the reason, nothing created);
//! - a kernel command line that closes the domain's XML and adds a disk of `/etc/shadow` and
//!   a QEMU argument (the VM runs with that text as its command line; no QEMU argument but
//!   `-append`'s holds any of it);
//! - a pod it labels as the VM's and annotates with the VM's Address (forged in the form
//!   roam-controller writes: an address of its own, the VM's Address untouched), and one
//!   that also poses as the VM's launcher pod (no network at all);
//! - a pod of the launcher's name made before the VM (not adopted: the VM waits), a
//!   launcher stripped of roam's labels and owner (its runner still found and removed);
//! - the VM's launcher pod: unprivileged (no privileged container, host path or host
//!   network), `exec` into it is user nobody with no capability, and it holds no
//!   ServiceAccount token;
//! - from its own pod: the runner's node API, its migration proxy and OVN's databases answer
//!   nothing in clear (TLS with client certificates only);
//! - the runner, in roam-system (exec, get), roam's Secrets and the platform's Networks: out
//!   of reach.
//!
//! Elsewhere: a Network of another namespace and the network-control class (lab_network_access),
//! privileged and host pods (lab_pod_security), quotas (lab_quota), disk images that name
//! host files (lab_volume), another node's certificate at the node API and the migration
//! proxy (lab_migration).

use std::time::Duration;

use roam_e2e::{Installed, Lab, Tenant, VmCleanup, apply_crds, kubectl, try_kubectl, wait_until};
use serde_json::{Value, json};

const NS: &str = "p11-tenant";
const NET: &str = "p11tenant";
const SA: &str = "tenant";
const LONG: Duration = Duration::from_secs(240);

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

#[test]
fn a_tenant_with_edit_runs_migrates_and_deletes_vms_and_reaches_nothing_else() {
    let lab = Lab::get();
    let tap = |n: &str| roam_core::vm::tap_name(&format!("{NS}/{n}"));
    let _cleanup = VmCleanup::new(&lab)
        .namespace(NS)
        .network(NET)
        .vm(&format!("{NS}_t1"), &[&tap("t1")])
        .vm(&format!("{NS}_t2"), &[&tap("t2")])
        .vm(&format!("{NS}_t3"), &[&tap("t3")])
        .vm(&format!("{NS}_t4"), &[&tap("t4")])
        .cleaned();
    apply_crds(&lab);
    let ctl = Installed::get(&lab);
    kubectl(&lab, &["create", "namespace", NS]);
    let net = json!({"apiVersion": "roam.dev/v1alpha1", "kind": "Network",
        "metadata": {"name": NET},
        "spec": {"subnet": "100.163.0.0/24", "transitSubnet": "169.254.163.0/24", "poolSizePerNode": 2,
                 "namespaces": [NS]}});
    roam_e2e::kubectl_manifest(&lab, "create", &net).expect("create the Network");
    let tenant = roam_e2e::Tenant::create(&lab, NS, SA, LONG);

    // a VM, created by the tenant, runs
    let (kernel, initrd) = lab.guest();
    tenant
        .create_object(&vm("t1", &kernel, &initrd))
        .expect("the tenant creates a VM");
    let st = wait_until(LONG, "t1 Running", || {
        let v = get(&lab, &["-n", NS, "get", "vm", "t1"])?;
        (v["status"]["phase"] == "Running").then(|| v["status"].clone())
    });
    let ip = st["interfaces"][0]["ip"].as_str().unwrap().to_string();
    let address = st["interfaces"][0]["address"].as_str().unwrap().to_string();

    // one that boots from a host path: refused, with the reason, nothing created
    tenant
        .create_object(&vm("t2", "/etc/shadow", &initrd))
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
    let (ok, out, _) = tenant.kubectl(&[
        "-n",
        NS,
        "get",
        "pods",
        "-l",
        "roam.dev/vm=t2",
        "-o",
        "name",
    ]);
    assert!(ok && out.trim().is_empty(), "no launcher for t2: {out}");

    // the tenant migrates it
    let (ok, _, err) = tenant.kubectl(&[
        "-n",
        NS,
        "annotate",
        "vm",
        "t1",
        "roam.dev/migrate-to=node-b",
    ]);
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
    let (ok, out, err) = tenant.kubectl(&[
        "-n",
        NS,
        "exec",
        &launcher,
        "--",
        "cat",
        "/proc/self/status",
    ]);
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
    let runner = roam_core::launcher::runner_name(NS, &launcher);
    get(&lab, &["-n", "roam-system", "get", "pod", &runner]).expect("t1's runner");
    for args in [
        &["-n", "roam-system", "exec", runner.as_str(), "--", "id"][..],
        &["-n", "roam-system", "get", "pods"],
    ] {
        let (ok, _, err) = tenant.kubectl(args);
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
    tenant
        .create_object(&forger)
        .expect("the tenant creates a pod");
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
    tenant
        .create_object(&impostor)
        .expect("the tenant creates the impostor");
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

    the_launcher_holds_no_token(&tenant, &launcher);
    nothing_answers_in_clear(&lab, &tenant, &st);
    no_xml_in_the_cmdline(&lab, &tenant, &kernel, &initrd);
    nothing_is_adopted_by_name(&lab, &tenant, &kernel, &initrd);
    strip_the_launcher_then_delete(&lab, &tenant);

    // roam's Secrets: out of reach
    for args in [
        &["-n", "roam-system", "get", "secrets"][..],
        &["-n", "roam-system", "get", "secret", "roam-ca"],
        &["get", "secrets", "--all-namespaces"],
    ] {
        let (ok, _, err) = tenant.kubectl(args);
        assert!(!ok && err.contains("forbidden"), "{args:?}: {err}");
    }
    // nor the platform's objects
    let (ok, _, err) = tenant.kubectl(&["delete", "network", NET]);
    assert!(!ok && err.contains("forbidden"), "{err}");

    // the tenant deletes its VMs: gone, and t1's domain with them
    // (t3 is gone already: strip_the_launcher_then_delete)
    let (ok, _, err) = tenant.kubectl(&["-n", NS, "delete", "vm", "t1", "t2"]);
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

/// The VM's launcher pod, where the tenant may exec, holds no ServiceAccount token: there
/// is no launcher's token to call the API server with.
fn the_launcher_holds_no_token(tenant: &Tenant, launcher: &str) {
    let (ok, out, err) = tenant.kubectl(&[
        "-n",
        NS,
        "exec",
        launcher,
        "--",
        "cat",
        "/var/run/secrets/kubernetes.io/serviceaccount/token",
    ]);
    assert!(!ok, "a token in the launcher pod: {out}");
    assert!(err.contains("No such file"), "{err}");
    let (ok, mounts, err) =
        tenant.kubectl(&["-n", NS, "exec", launcher, "--", "cat", "/proc/self/mounts"]);
    assert!(ok, "{err}");
    assert!(!mounts.contains("serviceaccount"), "{mounts}");
}

/// From the tenant's own pod (the forger, on node-b with an address of its own): the node
/// API of t1's runner, its migration proxy (the only thing on t1's libvirt port: its libvirtd
/// has no network socket) and OVN's databases take TLS only — a request in clear gets no
/// answer in clear.
fn nothing_answers_in_clear(lab: &Lab, tenant: &Tenant, t1: &Value) {
    let node = lab.node(t1["node"].as_str().expect("t1's node"));
    let shim_port = t1["shimPort"].as_u64().expect("t1's shim port") as u16;
    let proxy_port =
        roam_core::launcher::libvirt_port((17100, 17199), shim_port).expect("t1's libvirt port");
    let central = |v: &str| v.trim_start_matches("ssl:").to_string();
    let endpoints = [
        ("t1's node API", format!("{} {shim_port}", node.ip)),
        ("t1's migration proxy", format!("{} {proxy_port}", node.ip)),
        (
            "OVN's NB",
            central(lab.var("ROAM_OVN_NB_SSL")).replace(':', " "),
        ),
        (
            "OVN's SB",
            central(lab.var("ROAM_OVN_SB_SSL")).replace(':', " "),
        ),
    ];
    for (what, hostport) in endpoints {
        // an HTTP request, and libvirt's RPC hello would look no different: bytes in clear
        let script = format!(
            "printf 'GET /v1/status HTTP/1.0\\r\\n\\r\\n' | nc -w 5 {hostport}; echo rc=$?"
        );
        let (ok, out, err) =
            tenant.kubectl(&["-n", NS, "exec", "forger", "--", "sh", "-c", &script]);
        assert!(ok, "{what}: exec: {err}");
        let text = out.to_lowercase();
        assert!(
            !text.contains("http/") && !text.contains("ovsdb") && !text.contains("\"result\""),
            "{what} ({hostport}) answered the tenant in clear: {out}"
        );
        eprintln!(
            "{what} ({hostport}) from the tenant's pod: {} bytes, {}",
            out.len(),
            out.lines().last().unwrap_or_default()
        );
    }
}

/// A kernel command line that closes the domain's XML element and adds a disk of
/// `/etc/shadow` and a QEMU argument: the VM runs with that text as its command line, and
/// no argument of its QEMU but `-append`'s holds any of it.
fn no_xml_in_the_cmdline(lab: &Lab, tenant: &Tenant, kernel: &str, initrd: &str) {
    let injected = "console=ttyS0 roam.x=</cmdline></os><devices><disk type='file' device='disk'>\
        <source file='/etc/shadow'/><target dev='vdz' bus='virtio'/></disk></devices>\
        <qemu:commandline><qemu:arg value='-drive'/></qemu:commandline><os><cmdline>";
    let mut t4 = vm("t4", kernel, initrd);
    t4["spec"]["boot"]["kernel"]["cmdline"] = json!(injected);
    tenant.create_object(&t4).expect("the tenant creates t4");
    wait_until(LONG, "t4 Running", || {
        let v = get(lab, &["-n", NS, "get", "vm", "t4"])?;
        (v["status"]["phase"] == "Running").then_some(())
    });
    let (pid, _) = wait_until(LONG, "t4's QEMU", || {
        roam_e2e::qemu_processes(&format!("guest={NS}_t4"))
            .into_iter()
            .next()
    });
    let argv: Vec<String> = std::fs::read(format!("/proc/{pid}/cmdline"))
        .expect("t4's QEMU's command line")
        .split(|b| *b == 0)
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let append = argv.iter().position(|a| a == "-append").expect("-append");
    assert!(
        argv[append + 1].contains("/etc/shadow"),
        "{:?}",
        argv[append + 1]
    );
    for (i, a) in argv.iter().enumerate() {
        if i != append + 1 {
            assert!(
                !a.contains("shadow") && !a.contains("vdz"),
                "QEMU's argument {i} holds the injected text: {a}"
            );
        }
    }
    let (ok, _, err) = tenant.kubectl(&["-n", NS, "delete", "vm", "t4", "--wait=true"]);
    assert!(ok, "{err}");
}

/// The QEMU processes of VM `name` of this namespace on the machine (any node).
fn qemus_of(name: &str) -> usize {
    roam_e2e::qemu_processes(&format!("guest={NS}_{name}")).len()
}

/// A pod the tenant made under a VM's launcher name before the VM, with roam's labels: roam
/// neither uses nor deletes it, and makes no runner for it; the VM waits
/// (`LauncherInTheWay`, an Event naming the pod). Once the tenant deletes it, roam makes its
/// own and the VM runs.
fn nothing_is_adopted_by_name(lab: &Lab, tenant: &Tenant, kernel: &str, initrd: &str) {
    let mut squatter = roam_e2e::sleeper_pod(NS, "t3-launcher", "node-a");
    squatter["metadata"]["labels"] = json!({"roam.dev/vm": "t3", "roam.dev/launcher": "true"});
    squatter["spec"]
        .as_object_mut()
        .unwrap()
        .remove("priorityClassName");
    tenant
        .create_object(&squatter)
        .expect("the tenant makes a pod of the launcher's name");
    let squatter_uid = wait_until(LONG, "the squatter's UID", || {
        get(lab, &["-n", NS, "get", "pod", "t3-launcher"])?["metadata"]["uid"]
            .as_str()
            .map(String::from)
    });
    tenant
        .create_object(&vm("t3", kernel, initrd))
        .expect("the tenant creates t3");
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
    let runner = roam_core::launcher::runner_name(NS, "t3-launcher");
    assert!(
        get(lab, &["-n", "roam-system", "get", "pod", &runner]).is_none(),
        "no runner for a pod roam did not make"
    );
    assert_eq!(qemus_of("t3"), 0);
    let p = get(lab, &["-n", NS, "get", "pod", "t3-launcher"]).expect("the squatter stays");
    assert_eq!(p["metadata"]["uid"], squatter_uid.as_str(), "not deleted");
    // the tenant removes it: roam makes its own pod, the VM runs
    let (ok, _, err) = tenant.kubectl(&["-n", NS, "delete", "pod", "t3-launcher", "--wait=true"]);
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
fn strip_the_launcher_then_delete(lab: &Lab, tenant: &Tenant) {
    let st = get(lab, &["-n", NS, "get", "vm", "t3"]).expect("t3")["status"].clone();
    let launcher = st["pod"].as_str().expect("t3's launcher").to_string();
    let runner = roam_core::launcher::runner_name(NS, &launcher);
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
        let (ok, _, err) = tenant.kubectl(args);
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
