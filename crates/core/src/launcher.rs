//! A VM's launcher and runner pods as the controller reads them (pure): the names a VM's
//! pods, domain and shim go by, and what a launcher pod's status says (running, failed, a
//! container's trouble, a migration target that will not come up). The pods themselves are
//! built by `roam-migrator`'s `launcher` module.

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use roam_contract::token::TokenDigest;

use roam_api::VirtualMachine;

pub use roam_contract::keys::{
    LAUNCHER_LABEL, MIGRATION_ANNOTATION, RUNNER_LABEL, RUNNER_OF_ANNOTATION,
    RUNNER_OF_UID_ANNOTATION, RUNNER_VM_ANNOTATION, RUNNER_VM_LABEL,
};

/// Whether `p` is a VM launcher pod.
pub fn is_launcher(p: &Pod) -> bool {
    p.labels().get(LAUNCHER_LABEL).map(String::as_str) == Some("true")
}

/// Whether the pod's phase is Running.
pub fn pod_running(p: &Pod) -> bool {
    p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
}

/// Whether the pod's phase is Failed.
pub fn pod_failed(p: &Pod) -> bool {
    p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Failed")
}

/// What keeps a launcher pod's containers from running, in words for the VM's condition
/// (pure): a container waiting for a reason other than being created (CrashLoopBackOff,
/// ErrImagePull, CreateContainerError, …) with the kubelet's message and the last exit's code
/// and message (the container's last log lines: launcher containers report
/// `FallbackToLogsOnError`). `None` while nothing is wrong.
pub fn launcher_trouble(p: &Pod) -> Option<String> {
    let statuses = p.status.as_ref()?.container_statuses.as_ref()?;
    let troubles: Vec<String> = statuses
        .iter()
        .filter_map(|c| {
            let waiting = c.state.as_ref()?.waiting.as_ref()?;
            let reason = waiting.reason.as_deref().unwrap_or("Waiting");
            if matches!(reason, "ContainerCreating" | "PodInitializing") {
                return None;
            }
            let mut t = format!("container {} {reason}", c.name);
            if let Some(m) = waiting.message.as_deref().filter(|m| !m.is_empty()) {
                t.push_str(&format!(": {}", m.trim()));
            }
            if let Some(last) = c.last_state.as_ref().and_then(|l| l.terminated.as_ref()) {
                t.push_str(&format!("; last exit {}", last.exit_code));
                if let Some(m) = last
                    .message
                    .as_deref()
                    .map(str::trim)
                    .filter(|m| !m.is_empty())
                {
                    // the end of the log says what failed
                    let tail: Vec<&str> = m.lines().rev().take(3).collect();
                    let tail: Vec<&str> = tail.into_iter().rev().collect();
                    t.push_str(&format!(": {}", tail.join(" / ")));
                }
            }
            Some(t)
        })
        .collect();
    (!troubles.is_empty()).then(|| troubles.join("; "))
}

/// How many times a migration target's container may have restarted, still failing, before
/// the migration gives up on that target (the VM keeps running on the source). A VM's own
/// launcher is retried by the kubelet for as long as it takes; a migration's target is not
/// worth that wait.
pub const TARGET_RESTART_BUDGET: i32 = 3;

/// Waiting reasons that only a change (the image, the pod spec, the node) ends.
const HOPELESS_REASONS: [&str; 4] = [
    "ErrImageNeverPull",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CreateContainerError",
];

/// Why migration target launcher `p` will not come up without a change (pure): a container
/// waits on something only a change ends (an image the node lacks under `imagePullPolicy:
/// Never`, an invalid image name or container config), or is still failing after
/// [`TARGET_RESTART_BUDGET`] restarts. The words are [`launcher_trouble`]'s. `None`: it may
/// still come up.
pub fn target_hopeless(p: &Pod) -> Option<String> {
    let statuses = p.status.as_ref()?.container_statuses.as_ref()?;
    let restarts = statuses
        .iter()
        .filter(|c| c.state.as_ref().and_then(|s| s.waiting.as_ref()).is_some())
        .map(|c| c.restart_count)
        .max()
        .unwrap_or(0);
    let permanent = statuses.iter().any(|c| {
        c.state
            .as_ref()
            .and_then(|s| s.waiting.as_ref()?.reason.as_deref())
            .is_some_and(|r| HOPELESS_REASONS.contains(&r))
    });
    let trouble = launcher_trouble(p)?;
    if permanent {
        Some(trouble)
    } else if restarts >= TARGET_RESTART_BUDGET {
        Some(format!("{trouble} (given up after {restarts} restarts)"))
    } else {
        None
    }
}

/// `namespace/name`.
pub fn vm_key(vm: &VirtualMachine) -> String {
    format!("{}/{}", vm.namespace().unwrap_or_default(), vm.name_any())
}

/// The libvirt domain name of a VM (the same on every node).
pub fn domain_name(ns: &str, vm: &str) -> String {
    format!("{ns}_{vm}")
}

/// The libvirt port of the launcher whose shim has `shim_port` (pure): the same offset in
/// the block after the shim ports, so the two ranges never overlap.
pub fn libvirt_port(shim_ports: (u16, u16), shim_port: u16) -> Option<u16> {
    let width = shim_ports.1.checked_sub(shim_ports.0)?.checked_add(1)?;
    shim_port.checked_add(width)
}

/// Where a launcher pod mounts the VM's boot volume (a PersistentVolumeClaim).
pub const VOLUME_DIR: &str = "/var/lib/roam/volume";

/// The launcher pod's container that shows the guest's serial console (`kubectl logs`).
pub const CONSOLE_CONTAINER: &str = "console";
/// The annotation that makes `kubectl logs POD` (and `exec`) pick a given container, from
/// kubectl 1.21 on.
pub const DEFAULT_CONTAINER_ANNOTATION: &str = "kubectl.kubernetes.io/default-container";
/// Its forerunner for `kubectl logs`, which kubectl 1.20 (the lab's) reads.
pub const DEFAULT_LOGS_CONTAINER_ANNOTATION: &str = "kubectl.kubernetes.io/default-logs-container";

/// The shim's URL on a node: `https://` when the launchers have the nodes' roam identities
/// (`tls`: the controller's `--node-pki-dir`), the node API then being mutual TLS only.
pub fn shim_url(node_ip: &str, port: u16, tls: bool) -> String {
    let scheme = if tls { "https" } else { "http" };
    format!("{scheme}://{node_ip}:{port}")
}
/// The runner of launcher pod `ns/pod` (in [`RunnerConfig::namespace`]): a name of its own
/// that no other launcher's can be (a digest of the pod's key; pure).
pub fn runner_name(ns: &str, pod: &str) -> String {
    let d = TokenDigest::of(&format!("{ns}/{pod}")).to_string();
    format!("roam-vm-{}", &d[..24])
}
/// Which launcher pod runner `r` runs for: `(namespace, name, uid)` (pure).
pub fn runner_of(r: &Pod) -> Option<(String, String, String)> {
    let a = r.metadata.annotations.as_ref()?;
    let (ns, pod) = a.get(RUNNER_OF_ANNOTATION)?.split_once('/')?;
    let uid = a.get(RUNNER_OF_UID_ANNOTATION)?;
    Some((ns.to_string(), pod.to_string(), uid.clone()))
}
/// The name of the token Secret of the VM with UID `vm_uid` (in roam-controller's namespace:
/// by UID, as VMs of every namespace share it).
pub fn token_secret(vm_uid: &str) -> String {
    format!("roam-shim-token-{vm_uid}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_libvirt_port_is_the_shim_port_in_the_next_block() {
        assert_eq!(libvirt_port((17100, 17199), 17100), Some(17200));
        assert_eq!(libvirt_port((17100, 17199), 17199), Some(17299));
        assert_eq!(libvirt_port((1, 1), 1), Some(2));
        assert_eq!(libvirt_port((60000, 65535), 65535), None);
        assert_eq!(libvirt_port((5, 4), 5), None);
    }

    #[test]
    fn runner_names_are_distinct_valid_names() {
        let a = runner_name("ns", "demo-launcher");
        let b = runner_name("ns-demo", "launcher");
        assert_ne!(a, b, "no collision of ns-name keys");
        assert!(a.len() <= 63 && a.starts_with("roam-vm-"));
        assert!(
            a.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        );
    }

    #[test]
    fn a_launchers_trouble_is_said_in_words() {
        let pod = |statuses: serde_json::Value| -> Pod {
            serde_json::from_value(json!({"metadata": {"name": "p"},
                "status": {"phase": "Running", "containerStatuses": statuses}}))
            .unwrap()
        };
        let status = |name: &str, state: serde_json::Value, last: serde_json::Value| {
            json!({"name": name, "ready": false, "restartCount": 3, "image": "i", "imageID": "",
                   "state": state, "lastState": last})
        };
        // starting, or running: nothing to say
        assert_eq!(launcher_trouble(&pod(json!([]))), None);
        let creating = status(
            "libvirtd",
            json!({"waiting": {"reason": "ContainerCreating"}}),
            json!({}),
        );
        let running = status("shim", json!({"running": {}}), json!({}));
        assert_eq!(launcher_trouble(&pod(json!([creating, running]))), None);
        // a crash loop: the reason, the kubelet's message, the last exit and its log's end
        let crashing = status(
            "shim",
            json!({"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 40s restarting failed container"}}),
            json!({"terminated": {"exitCode": 1, "message":
                "line 1\nline 2\nline 3\nroam-shim: bad VM spec: kernel /g/vmlinuz: no such file\n"}}),
        );
        let said = launcher_trouble(&pod(json!([running, crashing]))).unwrap();
        assert_eq!(
            said,
            "container shim CrashLoopBackOff: back-off 40s restarting failed container; last exit 1: \
             line 2 / line 3 / roam-shim: bad VM spec: kernel /g/vmlinuz: no such file"
        );
        // an image the node cannot get
        let pulling = status(
            "libvirtd",
            json!({"waiting": {"reason": "ErrImageNeverPull", "message": "image lab.local/x is not present"}}),
            json!({}),
        );
        assert_eq!(
            launcher_trouble(&pod(json!([pulling]))).unwrap(),
            "container libvirtd ErrImageNeverPull: image lab.local/x is not present"
        );
    }

    #[test]
    fn a_migration_gives_up_on_a_target_that_will_not_come_up() {
        let pod = |statuses: serde_json::Value| -> Pod {
            serde_json::from_value(json!({"metadata": {"name": "p"},
                "status": {"phase": "Running", "containerStatuses": statuses}}))
            .unwrap()
        };
        let status = |restarts: i32, state: serde_json::Value| {
            json!({"name": "shim", "ready": false, "restartCount": restarts, "image": "i",
                   "imageID": "", "state": state,
                   "lastState": {"terminated": {"exitCode": 1, "message": "roam-shim: no kernel"}}})
        };
        let crash = json!({"waiting": {"reason": "CrashLoopBackOff", "message": "back-off"}});
        // a crash or two: it may still come up
        for n in 0..TARGET_RESTART_BUDGET {
            assert_eq!(
                target_hopeless(&pod(json!([status(n, crash.clone())]))),
                None
            );
        }
        // still failing after the budget: given up, with why
        assert_eq!(
            target_hopeless(&pod(json!([status(TARGET_RESTART_BUDGET, crash.clone())]))),
            Some(format!(
                "container shim CrashLoopBackOff: back-off; last exit 1: roam-shim: no kernel \
                 (given up after {TARGET_RESTART_BUDGET} restarts)"
            ))
        );
        // restarted as often but running now: fine
        assert_eq!(
            target_hopeless(&pod(json!([status(9, json!({"running": {}}))]))),
            None
        );
        // what no retry ends: at once
        let never = json!({"waiting": {"reason": "ErrImageNeverPull", "message": "not present"}});
        assert!(
            target_hopeless(&pod(json!([status(0, never)])))
                .unwrap()
                .contains("ErrImageNeverPull: not present")
        );
        // being created is no trouble, however many restarts
        let creating = json!({"waiting": {"reason": "ContainerCreating"}});
        assert_eq!(target_hopeless(&pod(json!([status(5, creating)]))), None);
    }
}
