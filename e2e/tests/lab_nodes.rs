//! The lab's nodes are real: pods created through the API are placed by kube-scheduler,
//! started by each node's kubelet and containerd from local images, plumbed by the nodes'
//! CNI — roam-cni, installed by roam's DaemonSet — with the addresses the installed
//! roam-controller claimed, serve logs and exec through the API server, reach each other
//! across the nodes, and leave nothing behind on the node when deleted.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, LogParams, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use roam_e2e::{Lab, VmCleanup, run, try_run, wait_until};
use serde_json::json;

fn kubectl(lab: &Lab, args: &[&str]) -> String {
    let mut all = vec!["--kubeconfig", lab.kubeconfig(), "--request-timeout=60s"];
    all.extend_from_slice(args);
    run(lab.kubectl(), &all)
}

/// Containers containerd runs on `node` (the `k8s.io` namespace), by ID.
fn node_containers(lab: &Lab, node: &str) -> String {
    let pid = lab
        .var(&format!(
            "ROAM_{}_HOLDER_PID",
            node.replace('-', "_").to_uppercase()
        ))
        .to_string();
    run(
        "nsenter",
        &[
            "-t",
            &pid,
            "-m",
            "-n",
            "--",
            "ctr",
            "-n",
            "k8s.io",
            "containers",
            "ls",
            "-q",
        ],
    )
}

/// The test's overlay Network (its pods name it: other Networks may exist).
const NET: &str = "lab-nodes";

fn busybox_pod(name: &str, node: &str, message: &str) -> Pod {
    let interfaces =
        format!(r#"[{{"mode":"overlay","network":"{NET}","interface":{{"name":"eth0"}}}}]"#);
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"roam.dev/e2e": "lab-nodes"},
                     "annotations": {"roam.dev/interfaces": interfaces}},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "c",
                "image": "lab.local/busybox:1.35",
                "imagePullPolicy": "Never",
                "command": ["sh", "-c", format!("echo {message}; exec sleep 3600")],
            }],
        },
    }))
    .expect("pod JSON")
}

#[tokio::test]
async fn both_nodes_are_ready_real_kubelets() {
    let lab = Lab::get();
    let nodes: Api<Node> = Api::all(lab.kube_client().await);
    for n in ["node-a", "node-b"] {
        let node = nodes
            .get(n)
            .await
            .unwrap_or_else(|e| panic!("Node {n}: {e}"));
        let status = node.status.expect("node status");
        let info = status.node_info.expect("nodeInfo, reported by a kubelet");
        assert!(info.kubelet_version.starts_with("v1.20"), "{info:?}");
        assert!(
            info.container_runtime_version.starts_with("containerd://"),
            "{info:?}"
        );
        let ready = status
            .conditions
            .unwrap_or_default()
            .into_iter()
            .find(|c| c.type_ == "Ready")
            .expect("Ready");
        assert_eq!(ready.status, "True", "{n}: {ready:?}");
        let labels = node.metadata.labels.unwrap_or_default();
        assert_eq!(labels.get("roam.dev/lab").map(String::as_str), Some("true"));
        assert_eq!(
            labels.get("kubernetes.io/hostname").map(String::as_str),
            Some(n)
        );
    }
}

#[tokio::test]
async fn pods_run_on_both_nodes_with_logs_exec_and_cleanup() {
    let lab = Lab::get();
    let client = lab.kube_client().await;
    let ns = format!("e2e-nodes-{}", std::process::id());
    // served by the installed roam (not a test namespace): roam-cni plumbs the pods
    let _cleanup = VmCleanup::new(&lab).namespace(&ns).network(NET).cleaned();
    kubectl(&lab, &["create", "namespace", &ns]);
    roam_e2e::kubectl_manifest(
        &lab,
        "create",
        &json!({"apiVersion": "roam.dev/v1alpha1", "kind": "Network", "metadata": {"name": NET},
                "spec": {"subnet": "100.161.0.0/24", "transitSubnet": "169.254.161.0/24",
                         "namespaces": [ns]}}),
    )
    .expect("create the Network");
    // the pods ping as root (busybox's ping needs a raw socket), which the lab's Pod Security
    // allows only where it is granted: here, to the namespace's ServiceAccounts (the installed
    // roam-controller annotates the pods, and PodSecurityPolicy checks every update against
    // the policies of the updater or the pod's ServiceAccount, not of the admin who made it)
    kubectl(
        &lab,
        &[
            "-n",
            &ns,
            "create",
            "rolebinding",
            "privileged-pods",
            "--clusterrole=roam-psp-privileged",
            &format!("--group=system:serviceaccounts:{ns}"),
        ],
    );
    // the namespace's default ServiceAccount (kube-controller-manager) must exist first
    wait_until(Duration::from_secs(60), "default ServiceAccount", || {
        try_run(
            lab.kubectl(),
            &[
                "--kubeconfig",
                lab.kubeconfig(),
                "-n",
                &ns,
                "get",
                "serviceaccount",
                "default",
            ],
        )
        .ok()
    });
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);

    let mut ips = vec![];
    for node in ["node-a", "node-b"] {
        let name = format!("bb-{node}");
        pods.create(
            &PostParams::default(),
            &busybox_pod(&name, node, &format!("hello from {node}")),
        )
        .await
        .unwrap_or_else(|e| panic!("create pod on {node}: {e}"));
    }
    for node in ["node-a", "node-b"] {
        let name = format!("bb-{node}");
        tokio::time::timeout(
            Duration::from_secs(120),
            await_condition(pods.clone(), &name, conditions::is_pod_running()),
        )
        .await
        .unwrap_or_else(|_| {
            panic!(
                "{name} Running in time: {}",
                kubectl(&lab, &["-n", &ns, "describe", "pod", &name])
            )
        })
        .expect("watch pod");
        let pod = pods.get(&name).await.unwrap();
        assert_eq!(
            pod.spec.as_ref().unwrap().node_name.as_deref(),
            Some(node),
            "scheduled by kube-scheduler"
        );
        let ip = pod
            .status
            .as_ref()
            .and_then(|s| s.pod_ip.clone())
            .expect("pod IP");
        // the address roam claimed and published, as roam-cni reported it to the runtime
        let published = pod
            .annotations()
            .get("roam.dev/addresses")
            .cloned()
            .unwrap_or_default();
        assert!(ip.starts_with("100.161.0."), "{name}: pod IP {ip}");
        assert!(
            published.contains(&format!("\"ip\":\"{ip}\"")),
            "{name}: pod IP {ip} is the published one: {published}"
        );
        ips.push(ip);

        // logs through the API server from the node's kubelet
        let mut logs = String::new();
        for _ in 0..300 {
            logs = pods
                .logs(&name, &LogParams::default())
                .await
                .unwrap_or_default();
            if logs.contains("hello") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(logs.trim(), format!("hello from {node}"));

        // exec through the API server
        let out = kubectl(
            &lab,
            &["-n", &ns, "exec", &name, "--", "cat", "/proc/1/cmdline"],
        );
        assert!(out.contains("sleep"), "{out}");
    }

    // across the nodes
    let out = kubectl(
        &lab,
        &[
            "-n",
            &ns,
            "exec",
            "bb-node-a",
            "--",
            "ping",
            "-c",
            "2",
            "-W",
            "2",
            &ips[1],
        ],
    );
    assert!(out.contains("2 packets received"), "{out}");

    // deleted pods are cleaned up on their node
    for node in ["node-a", "node-b"] {
        let name = format!("bb-{node}");
        let pod = pods.get(&name).await.unwrap();
        let cid = pod
            .status
            .as_ref()
            .unwrap()
            .container_statuses
            .as_ref()
            .unwrap()[0]
            .container_id
            .clone()
            .expect("container id");
        let cid = cid.trim_start_matches("containerd://").to_string();
        assert!(
            node_containers(&lab, node).contains(&cid),
            "container runs on {node}"
        );
        pods.delete(&name, &DeleteParams::default())
            .await
            .expect("delete pod");
        let uid = pod.uid().unwrap();
        tokio::time::timeout(
            Duration::from_secs(120),
            await_condition(pods.clone(), &name, conditions::is_deleted(&uid)),
        )
        .await
        .expect("pod gone in time")
        .expect("watch pod");
        wait_until(
            Duration::from_secs(60),
            "the container to be removed from the node",
            || (!node_containers(&lab, node).contains(&cid)).then_some(()),
        );
    }
}
