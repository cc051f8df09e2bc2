//! Placement on a cluster of three nodes (`ROAM_LAB_NODES=3`, as `e2e/test` brings the lab
//! up), through the installed roam: a VM without `spec.node`, and `roam.dev/migrate-to=auto`,
//! go to a node the scheduler's constraints allow — not cordoned, its taints tolerated by the
//! VM's `tolerations`, its labels matching the VM's `nodeSelector` — never simply the first
//! name; the launcher pods carry the VM's selector and tolerations; a VM no node takes stays
//! Scheduling with each node and why in its condition; and a VM whose launcher cannot start
//! says why (the launcher's own last words) in its condition.

use std::time::Duration;

use roam_e2e::{Installed, Lab, VmCleanup, apply_crds, kubectl, try_kubectl, try_run, wait_until};
use serde_json::{Value, json};

const NS: &str = "p9-place";
const NET: &str = "p9place";
const LONG: Duration = Duration::from_secs(180);
const TAINT: &str = "roam.dev/p9-dedicated";
const ZONE: &str = "roam.dev/p9-zone";

fn get(lab: &Lab, args: &[&str]) -> Option<Value> {
    let mut all = args.to_vec();
    all.extend_from_slice(&["-o", "json"]);
    serde_json::from_str(&try_kubectl(lab, &all).ok()?).ok()
}

/// Puts the nodes back as they were (uncordoned, untainted, unlabelled), also after a failure.
struct NodesBack {
    lab: Lab,
}

impl NodesBack {
    fn clean(&self) {
        for n in self.lab.nodes() {
            let _ = try_kubectl(&self.lab, &["uncordon", &n]);
            let _ = try_kubectl(&self.lab, &["taint", "node", &n, &format!("{TAINT}-")]);
            let _ = try_kubectl(&self.lab, &["label", "node", &n, &format!("{ZONE}-")]);
        }
    }
}

impl Drop for NodesBack {
    fn drop(&mut self) {
        self.clean();
    }
}

fn vm(name: &str, extra: Value, kernel: &str, initrd: &str) -> Value {
    let mut spec = json!({"cpu": 1, "memoryMiB": 192,
        "boot": {"kernel": {"kernel": kernel, "initrd": initrd,
                            "cmdline": "console=ttyS0 loglevel=5 panic=-1"}}});
    for (k, v) in extra.as_object().unwrap() {
        spec[k] = v.clone();
    }
    json!({"apiVersion": "roam.dev/v1alpha1", "kind": "VirtualMachine",
           "metadata": {"name": name, "namespace": NS}, "spec": spec})
}

/// VM `name`'s phase and the message of its condition `kind` if that has `reason`.
fn condition(lab: &Lab, name: &str, kind: &str, reason: &str) -> Option<(String, String)> {
    let v = get(lab, &["-n", NS, "get", "vm", name])?;
    let c = v["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind && c["reason"] == reason)?;
    Some((
        v["status"]["phase"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        c["message"].as_str().unwrap_or_default().to_string(),
    ))
}

fn running_on(lab: &Lab, name: &str) -> String {
    let st = wait_until(LONG, &format!("{name} Running"), || {
        let v = get(lab, &["-n", NS, "get", "vm", name])?;
        (v["status"]["phase"] == "Running").then(|| v["status"].clone())
    });
    st["node"].as_str().expect("the VM's node").to_string()
}

#[test]
fn vms_go_where_the_schedulers_constraints_allow() {
    let lab = Lab::get();
    let nodes = lab.nodes();
    assert!(
        nodes.len() >= 3,
        "this test needs a choice of nodes: bring the lab up with ROAM_LAB_NODES=3 (e2e/test does); it has {nodes:?}"
    );
    let (a, b, c) = (nodes[0].as_str(), nodes[1].as_str(), nodes[2].as_str());
    let mut cleanup = VmCleanup::new(&lab).namespace(NS).network(NET);
    for name in [
        "p9vm1", "p9vm2", "p9vm3", "p9vm4", "p9vm5", "p9vm6", "p9vm7",
    ] {
        let tap = roam_core::vm::tap_name(&format!("{NS}/{name}"));
        cleanup = cleanup.vm(&format!("{NS}_{name}"), &[&tap]);
    }
    let _cleanup = cleanup.cleaned();
    let back = NodesBack { lab: lab.clone() };
    back.clean();
    apply_crds(&lab);
    let ctl = Installed::get(&lab);
    kubectl(&lab, &["create", "namespace", NS]);
    let net = json!({"apiVersion": "roam.dev/v1alpha1", "kind": "Network",
        "metadata": {"name": NET},
        "spec": {"subnet": "100.159.0.0/24", "transitSubnet": "169.254.159.0/24", "poolSizePerNode": 1,
                 "namespaces": [NS]}});
    roam_e2e::kubectl_manifest(&lab, "create", &net).expect("create the Network");
    let (kernel, initrd) = lab.guest();

    // node-a cordoned, node-b tainted: a VM without node, selector or tolerations can only go
    // to node-c — not the first name, and not the first that is merely Ready
    kubectl(&lab, &["cordon", a]);
    kubectl(
        &lab,
        &["taint", "node", b, &format!("{TAINT}=db:NoSchedule")],
    );
    roam_e2e::kubectl_manifest(&lab, "create", &vm("p9vm1", json!({}), &kernel, &initrd))
        .expect("create p9vm1");
    assert_eq!(running_on(&lab, "p9vm1"), c, "{}", ctl.log_tail(30));

    // a VM that tolerates node-b's taint and selects its zone goes there, and its launcher
    // pod carries both
    kubectl(&lab, &["label", "node", b, &format!("{ZONE}=b")]);
    let extra = json!({"nodeSelector": {ZONE: "b"},
        "tolerations": [{"key": TAINT, "operator": "Equal", "value": "db", "effect": "NoSchedule"}]});
    roam_e2e::kubectl_manifest(&lab, "create", &vm("p9vm2", extra, &kernel, &initrd))
        .expect("create p9vm2");
    assert_eq!(running_on(&lab, "p9vm2"), b, "{}", ctl.log_tail(30));
    let pod = get(&lab, &["-n", NS, "get", "pod", "-l", "roam.dev/vm=p9vm2"])
        .and_then(|l| l["items"].get(0).cloned())
        .expect("p9vm2's launcher pod");
    assert_eq!(pod["spec"]["nodeSelector"][ZONE], "b", "{pod}");
    assert_eq!(pod["spec"]["tolerations"][0]["key"], TAINT, "{pod}");

    // migrate-to=auto from node-c: node-a is cordoned, node-b tainted → refused, with why
    kubectl(
        &lab,
        &[
            "-n",
            NS,
            "annotate",
            "vm",
            "p9vm1",
            "roam.dev/migrate-to=auto",
        ],
    );
    let why = wait_until(LONG, "p9vm1's auto migration refused", || {
        condition(&lab, "p9vm1", "MigrationRequest", "NoTargetNode").map(|(_, msg)| msg)
    });
    assert!(
        why.contains(a) && why.contains(b),
        "the refusal names the nodes: {why}"
    );
    // node-a uncordoned: the one node that fits
    kubectl(&lab, &["uncordon", a]);
    kubectl(
        &lab,
        &[
            "-n",
            NS,
            "annotate",
            "--overwrite",
            "vm",
            "p9vm1",
            "roam.dev/migrate-to=auto",
        ],
    );
    let m = wait_until(LONG, "p9vm1's auto migration to end", || {
        let l = get(&lab, &["-n", NS, "get", "vmim", "-l", "roam.dev/vm=p9vm1"])?;
        l["items"].as_array()?.iter().find_map(|m| {
            let p = m["status"]["phase"].as_str()?;
            (p == "Succeeded" || p == "Failed").then(|| m.clone())
        })
    });
    assert_eq!(
        m["status"]["phase"],
        "Succeeded",
        "{m}\n{}",
        ctl.log_tail(30)
    );
    assert_eq!(m["spec"]["targetNode"], a, "{m}");
    assert_eq!(running_on(&lab, "p9vm1"), a);

    // a selector no node matches: Scheduling, each node and why
    let extra = json!({"nodeSelector": {ZONE: "nowhere"}});
    roam_e2e::kubectl_manifest(&lab, "create", &vm("p9vm3", extra, &kernel, &initrd))
        .expect("create p9vm3");
    let msg = wait_until(LONG, "p9vm3 Scheduling with why", || {
        let (phase, msg) = condition(&lab, "p9vm3", "Ready", "NoNode")?;
        (phase == "Scheduling").then_some(msg)
    });
    for n in [a, b, c] {
        assert!(msg.contains(n), "the condition names {n}: {msg}");
    }
    assert!(
        get(&lab, &["-n", NS, "get", "pod", "-l", "roam.dev/vm=p9vm3"])
            .is_some_and(|l| l["items"].as_array().is_some_and(|i| i.is_empty())),
        "no launcher pod for a VM no node takes"
    );

    // a launcher that cannot start (its kernel is not on the node): `kubectl get vm` says
    // why, in the launcher's own words
    let missing = std::path::Path::new(&kernel)
        .with_file_name("p9-no-such-vmlinuz")
        .display()
        .to_string();
    roam_e2e::kubectl_manifest(
        &lab,
        "create",
        &vm("p9vm4", json!({"node": a}), &missing, &initrd),
    )
    .expect("create p9vm4");
    let msg = wait_until(LONG, "p9vm4's launcher failing, with why", || {
        let (phase, msg) = condition(&lab, "p9vm4", "Ready", "LauncherFailing")?;
        (phase == "Starting" && msg.contains(&missing)).then_some(msg)
    });
    assert!(
        msg.contains("container shim") && msg.contains("does not exist"),
        "{msg}"
    );

    // boot media only from the admin's image store (the lab installs roam with
    // --image-root set to its guest directory): a host path outside it is refused before
    // anything is created; a link in the store that leads out of it is refused by the shim,
    // and the VM's condition says so
    roam_e2e::kubectl_manifest(
        &lab,
        "create",
        &vm("p9vm5", json!({"node": a}), "/etc/shadow", &initrd),
    )
    .expect("create p9vm5");
    let msg = wait_until(LONG, "p9vm5 refused", || {
        let (phase, msg) = condition(&lab, "p9vm5", "Ready", "InvalidVirtualMachine")?;
        (phase == "Failed").then_some(msg)
    });
    assert!(msg.contains("outside the image store"), "{msg}");
    assert!(
        get(&lab, &["-n", NS, "get", "pod", "-l", "roam.dev/vm=p9vm5"])
            .is_some_and(|l| l["items"].as_array().is_some_and(|i| i.is_empty())),
        "no launcher pod for a VM booting from a host path"
    );
    let escape =
        std::path::Path::new(&kernel).with_file_name(format!("p9-escape-{}", std::process::id()));
    let _ = std::fs::remove_file(&escape);
    std::os::unix::fs::symlink("/etc/hostname", &escape).expect("a link in the image store");
    struct Unlink(std::path::PathBuf);
    impl Drop for Unlink {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    let _unlink = Unlink(escape.clone());
    let escape = escape.display().to_string();
    roam_e2e::kubectl_manifest(
        &lab,
        "create",
        &vm("p9vm6", json!({"node": a}), &escape, &initrd),
    )
    .expect("create p9vm6");
    let msg = wait_until(LONG, "p9vm6's launcher refusing the link", || {
        let (phase, msg) = condition(&lab, "p9vm6", "Ready", "LauncherFailing")?;
        (phase == "Starting" && msg.contains("outside the image store")).then_some(msg)
    });
    assert!(msg.contains("resolves to"), "{msg}");
    // refused before anything was made: no finalizer holds it
    kubectl(&lab, &["-n", NS, "delete", "vm", "p9vm5"]);

    vm_removed_without_its_teardown_leaves_nothing(&lab, &ctl, c, &kernel, &initrd);

    deleted_vms_leave_nothing_on_any_node(
        &lab,
        &ctl,
        &["p9vm1", "p9vm2", "p9vm3", "p9vm4", "p9vm6"],
    );
}

/// A running VM removed without its teardown, while the controller is down (its finalizer
/// patched away, then deleted): the garbage collector deletes its launcher pod, and the
/// controller, back, deletes the runner that pod leaves in roam-system (there is no VM left
/// to sweep it); the runner's shim removes the tap and OVS port once QEMU has let go of
/// them. Nothing of the VM is left on any node.
fn vm_removed_without_its_teardown_leaves_nothing(
    lab: &Lab,
    ctl: &Installed,
    node: &str,
    kernel: &str,
    initrd: &str,
) {
    let name = "p9vm7";
    roam_e2e::kubectl_manifest(
        lab,
        "create",
        &vm(name, json!({"node": node}), kernel, initrd),
    )
    .expect("create p9vm7");
    assert_eq!(running_on(lab, name), node, "{}", ctl.log_tail(30));
    let runners = roam_e2e::launcher_pods_running(lab, NS, name);
    assert!(
        runners
            .iter()
            .any(|p| p["metadata"]["namespace"] == roam_e2e::RUNNER_NAMESPACE),
        "p9vm7 runs in a runner: {runners:?}"
    );
    let stopped = ctl.stop();
    kubectl(
        lab,
        &[
            "-n",
            NS,
            "patch",
            "vm",
            name,
            "--type=merge",
            "-p",
            r#"{"metadata":{"finalizers":null}}"#,
        ],
    );
    kubectl(lab, &["-n", NS, "delete", "vm", name]);
    wait_until(
        LONG,
        "p9vm7's launcher pod deleted by the garbage collector",
        || {
            get(
                lab,
                &["-n", NS, "get", "pod", "-l", &format!("roam.dev/vm={name}")],
            )
            .is_some_and(|l| l["items"].as_array().is_some_and(|i| i.is_empty()))
            .then_some(())
        },
    );
    assert!(
        !roam_e2e::launcher_pods_running(lab, NS, name).is_empty(),
        "the runner is still there while the controller is down"
    );
    stopped.start();
    let domain = format!("{NS}_{name}");
    let tap = roam_core::vm::tap_name(&format!("{NS}/{name}"));
    let nd = lab.node(node);
    roam_e2e::wait_until_else(
        LONG,
        "p9vm7's runner, QEMU, tap and OVS port gone",
        || {
            let ports = roam_e2e::run(
                "ovs-vsctl",
                &[&format!("--db={}", nd.ovs_db), "list-ports", "br-int"],
            );
            (roam_e2e::launcher_pods_running(lab, NS, name).is_empty()
                && !qemu_of(&domain)
                && try_run("ip", &["-n", &nd.netns, "link", "show", &tap]).is_err()
                && !ports.lines().any(|p| p == tap))
            .then_some(())
        },
        || {
            format!(
                "runners: {:?}\nQEMU running: {}\ncontroller:\n{}",
                roam_e2e::launcher_pods_running(lab, NS, name),
                qemu_of(&domain),
                ctl.log_tail(30)
            )
        },
    );
}

/// Whether a QEMU of libvirt domain `domain` runs anywhere on the machine.
fn qemu_of(domain: &str) -> bool {
    let needle = format!("guest={domain},");
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .any(|c| {
            String::from_utf8_lossy(&c)
                .replace('\0', " ")
                .contains(&needle)
        })
}

/// Delete the VMs with kubectl: each is held (finalizer `roam.dev/teardown`) until its
/// shims have destroyed its domain and removed its taps and OVS ports, then goes. Afterwards
/// no node has a domain, tap, OVS port or launcher pod of any of them, and their Addresses
/// were released only after that.
fn deleted_vms_leave_nothing_on_any_node(lab: &Lab, ctl: &Installed, names: &[&str]) {
    let running: Vec<&str> = names
        .iter()
        .copied()
        .filter(|n| {
            get(lab, &["-n", NS, "get", "vm", n]).is_some_and(|v| v["status"]["phase"] == "Running")
        })
        .collect();
    assert!(
        running.len() >= 2,
        "the VMs to delete include running ones: {running:?}"
    );
    for n in names {
        let v = get(lab, &["-n", NS, "get", "vm", n]).expect("the VM");
        assert!(
            v["metadata"]["finalizers"]
                .as_array()
                .is_some_and(|f| f.iter().any(|x| x == "roam.dev/teardown")),
            "{n} is held for its teardown: {}",
            v["metadata"]
        );
    }
    let mut args = vec!["-n", NS, "delete", "vm", "--wait=false"];
    args.extend_from_slice(names);
    kubectl(lab, &args);
    for n in names {
        wait_until(LONG, &format!("{n} torn down and gone"), || {
            try_kubectl(lab, &["-n", NS, "get", "vm", n])
                .is_err()
                .then_some(())
        });
    }
    let pods = get(
        lab,
        &["-n", NS, "get", "pods", "-l", "roam.dev/launcher=true"],
    )
    .expect("the pods");
    assert_eq!(
        pods["items"].as_array().map(Vec::len),
        Some(0),
        "no launcher pod is left: {pods}"
    );
    for n in names {
        let left = roam_e2e::launcher_pods_running(lab, NS, n);
        assert!(left.is_empty(), "no runner of {n} is left: {left:?}");
    }
    for n in names {
        let domain = format!("{NS}_{n}");
        assert!(!qemu_of(&domain), "QEMU of {domain} still runs");
        let tap = roam_core::vm::tap_name(&format!("{NS}/{n}"));
        for node in lab.nodes() {
            let nd = lab.node(&node);
            assert!(
                try_run("ip", &["-n", &nd.netns, "link", "show", &tap]).is_err(),
                "{n}'s tap {tap} is still on {node}"
            );
            let ports = roam_e2e::run(
                "ovs-vsctl",
                &[&format!("--db={}", nd.ovs_db), "list-ports", "br-int"],
            );
            assert!(
                !ports.lines().any(|p| p == tap),
                "{n}'s OVS port {tap} is still on {node}'s br-int: {ports}"
            );
        }
    }
    // the running ones were torn down by their shims, which said what they removed
    let events = get(
        lab,
        &[
            "-n",
            NS,
            "get",
            "events",
            "--field-selector",
            "reason=TornDown",
        ],
    )
    .expect("the Events");
    for n in &running {
        let tap = roam_core::vm::tap_name(&format!("{NS}/{n}"));
        assert!(
            es_core(&events, n, &tap),
            "{n}: no TornDown Event naming its domain and tap {tap}: {events}\n{}",
            ctl.log_tail(40)
        );
    }
    // their Addresses are released (soft-deleted, kept for the grace period) once the VMs
    // are gone, not while they were held
    let owned_by = |owner: &str| -> Vec<Value> {
        get(
            lab,
            &["get", "addresses", "-l", &format!("roam.dev/network={NET}")],
        )
        .and_then(|l| l["items"].as_array().cloned())
        .unwrap_or_default()
        .into_iter()
        .filter(|a| a["spec"]["owner"] == owner)
        .collect()
    };
    for n in names {
        let owner = format!("{NS}/{n}");
        roam_e2e::wait_until_else(
            LONG,
            &format!("{owner}'s Addresses released"),
            || {
                owned_by(&owner)
                    .iter()
                    .all(|a| a["spec"]["deleted"] == true)
                    .then_some(())
            },
            || {
                format!(
                    "its Addresses: {:#?}\npods of {NS}: {}\ncontroller:\n{}",
                    owned_by(&owner),
                    try_kubectl(lab, &["-n", NS, "get", "pods", "-o", "wide"]).unwrap_or_default(),
                    ctl.log_tail(60)
                )
            },
        );
    }
}

/// Whether `events` (core v1) hold one about VM `vm` whose message names a destroyed domain
/// and `tap`.
fn es_core(events: &Value, vm: &str, tap: &str) -> bool {
    events["items"].as_array().is_some_and(|es| {
        es.iter().any(|e| {
            e["involvedObject"]["name"] == vm
                && e["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("domain destroyed") && m.contains(tap))
        })
    })
}
