//! roam-cni ADD and DEL latency on the lab's real node (needs `e2e/lab up` and
//! `cargo build -p roam-cni`): `cargo bench --profile dev -p roam-e2e --bench cni` (the dev
//! profile measures target/debug/roam-cni; with the release profile, build roam-cni with
//! `--release` first).
//!
//! N pods (default 200; `ROAM_BENCH_PODS`) on node-a, each with its OVN port (one reconcile)
//! and its `roam.dev/addresses` already on the pod; per pod a network namespace inside the
//! node. Then ADD for every pod, one after the other, as a runtime execs the plugin (inside the
//! node's namespaces, the config on stdin), then DEL for every pod. Each figure is the wall
//! time of one invocation, process start to exit, including `nsenter`; the VERSION line is
//! that fixed cost alone. Printed, never asserted (the machine is shared and noisy).
//!
//! Names: overlay `h6-bench` (100.132.0.0/16), Kubernetes namespace `h6-bench-<pid>`, netns and
//! container IDs `h6b<i>`.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, DeleteParams, PostParams};
use roam_contract::annotation::{Mode, PodAddress, addresses_annotation};
use roam_e2e::{
    Lab, LabNetwork, NodeNetns, PortBuilder, address_objects, delete_addresses, invoke_cni,
    node_kubeconfig, overlay_fixture, percentile, put_addresses, reconcile_on_lab, try_run,
    unscheduled_pod, wait_until,
};
use roam_network::topology::{PortSpec, overlay_port_name, plan_overlay};
use serde_json::json;

const NET: &str = "h6-bench";
const OCTET: u8 = 132;

fn port(i: usize) -> PortSpec {
    let ip =
        std::net::Ipv4Addr::from(u32::from(std::net::Ipv4Addr::new(100, OCTET, 1, 0)) + i as u32);
    PortBuilder::new(format!("b{i}"), ip, "node-a").build()
}

fn address(p: &PortSpec) -> String {
    addresses_annotation(&[PodAddress {
        name: "eth0".into(),
        network: NET.into(),
        mode: Mode::Overlay,
        // as roam-controller names them: the port after its Address
        address: p.name.clone(),
        port: overlay_port_name(&p.name, &p.node),
        ip: p.ip,
        prefix_len: 32,
        mac: p.mac.to_string(),
        gateway: std::net::Ipv4Addr::new(100, OCTET, 0, 1),
        metric: 0,
        mtu: 1400,
        dhcp: false,
        vlan: None,
        service_class: None,
    }])
    .expect("a valid annotation")
}

fn report(what: &str, mut d: Vec<Duration>) {
    d.sort();
    let mean = d.iter().sum::<Duration>() / d.len() as u32;
    println!(
        "{what:<8} n={:<4} p50 {:>7.1} ms  p99 {:>7.1} ms  mean {:>7.1} ms  max {:>7.1} ms",
        d.len(),
        percentile(&d, 0.5).as_secs_f64() * 1e3,
        percentile(&d, 0.99).as_secs_f64() * 1e3,
        mean.as_secs_f64() * 1e3,
        d.last().unwrap().as_secs_f64() * 1e3,
    );
}

/// The pods, the namespaces and the attachments; removed when dropped.
struct Cleanup {
    lab: Lab,
    rt: tokio::runtime::Runtime,
    pods: Api<Pod>,
    n: usize,
    k8s_ns: String,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        delete_addresses(&self.lab, NET);
        let conf = json!({"cniVersion": "1.1.0", "name": NET, "type": "roam-cni",
            "cni.dev/valid-attachments": []});
        let _ = invoke_cni(
            &self.lab,
            "node-a",
            &[("CNI_COMMAND", "GC"), ("CNI_PATH", "/opt/cni/bin")],
            &conf.to_string(),
        );
        let pods = self.pods.clone();
        let n = self.n;
        self.rt.block_on(async move {
            let dp = DeleteParams::default().grace_period(0);
            let all = (0..n).map(|i| {
                let pods = pods.clone();
                let dp = dp.clone();
                async move {
                    let _ = pods.delete(&format!("h6b{i}"), &dp).await;
                }
            });
            futures::future::join_all(all).await;
        });
        let _ = try_run(
            self.lab.kubectl(),
            &[
                "--kubeconfig",
                self.lab.kubeconfig(),
                "delete",
                "namespace",
                &self.k8s_ns,
                "--wait=false",
            ],
        );
    }
}

fn main() {
    let n: usize = std::env::var("ROAM_BENCH_PODS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let lab = Lab::get();
    let rt = tokio::runtime::Runtime::new().expect("a tokio runtime");
    let client = rt.block_on(lab.kube_client());
    let network = LabNetwork::new(&lab, NET, &[]);
    let (spec, nodes) = overlay_fixture(NET, OCTET);
    let ports: Vec<PortSpec> = (0..n).map(port).collect();
    reconcile_on_lab(
        &lab,
        NET,
        &plan_overlay(&spec, &nodes, &ports).expect("plan"),
    );

    // the pods' namespace, deleted at the end
    let k8s_ns = format!("h6-bench-{}", std::process::id());
    let nss: Api<Namespace> = Api::all(client.clone());
    let _ = rt.block_on(nss.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": k8s_ns}})).unwrap(),
    ));
    wait_until(Duration::from_secs(60), "default ServiceAccount", || {
        try_run(
            lab.kubectl(),
            &[
                "--kubeconfig",
                lab.kubeconfig(),
                "-n",
                &k8s_ns,
                "get",
                "serviceaccount",
                "default",
            ],
        )
        .ok()
    });
    let pods: Api<Pod> = Api::namespaced(client, &k8s_ns);
    let cleanup = Cleanup {
        lab: lab.clone(),
        rt,
        pods: pods.clone(),
        n,
        k8s_ns: k8s_ns.clone(),
    };
    // as roam-controller: each pod's Address object, which roam-cni checks its annotation
    // against (untimed)
    put_addresses(
        &lab,
        ports
            .iter()
            .enumerate()
            .flat_map(|(i, p)| address_objects(&k8s_ns, &format!("h6b{i}"), None, &address(p)))
            .collect(),
    );
    cleanup.rt.block_on(async {
        let all = ports.iter().enumerate().map(|(i, p)| {
            let pods = pods.clone();
            let pod: Pod =
                serde_json::from_value(unscheduled_pod(&format!("h6b{i}"), Some(&address(p))))
                    .unwrap();
            async move {
                let _ = pods
                    .delete(&format!("h6b{i}"), &DeleteParams::default().grace_period(0))
                    .await;
                pods.create(&PostParams::default(), &pod).await
            }
        });
        for r in futures::future::join_all(all).await {
            r.expect("create a pod");
        }
    });
    let netns: Vec<NodeNetns> = (0..n)
        .map(|i| NodeNetns::new(&lab, "node-a", &format!("h6b{i}")))
        .collect();
    let conf = json!({"cniVersion": "1.1.0", "name": NET, "type": "roam-cni",
        "kubeconfig": node_kubeconfig(&lab), "annotationTimeoutSeconds": 20})
    .to_string();
    println!("roam-cni: {}", roam_e2e::cni_binary().display());

    let mut version = vec![];
    for _ in 0..20 {
        let t = Instant::now();
        let out = invoke_cni(&lab, "node-a", &[("CNI_COMMAND", "VERSION")], "");
        version.push(t.elapsed());
        assert_eq!(out.status, 0, "{out:?}");
    }
    let env = |cmd: &'static str, i: usize, ns: &NodeNetns| {
        (
            cmd,
            format!("h6b{i}"),
            ns.path.clone(),
            format!("K8S_POD_NAMESPACE={k8s_ns};K8S_POD_NAME=h6b{i}"),
        )
    };
    let call = |(cmd, cid, path, args): (&str, String, String, String)| {
        let t = Instant::now();
        let out = invoke_cni(
            &lab,
            "node-a",
            &[
                ("CNI_COMMAND", cmd),
                ("CNI_CONTAINERID", &cid),
                ("CNI_NETNS", &path),
                ("CNI_IFNAME", "eth0"),
                ("CNI_ARGS", &args),
                ("CNI_PATH", "/opt/cni/bin"),
            ],
            &conf,
        );
        let d = t.elapsed();
        assert_eq!(out.status, 0, "{cmd} {cid}: {out:?}");
        d
    };
    let t0 = Instant::now();
    let adds: Vec<Duration> = netns
        .iter()
        .enumerate()
        .map(|(i, ns)| call(env("ADD", i, ns)))
        .collect();
    let add_total = t0.elapsed();
    let t0 = Instant::now();
    let dels: Vec<Duration> = netns
        .iter()
        .enumerate()
        .map(|(i, ns)| call(env("DEL", i, ns)))
        .collect();
    let del_total = t0.elapsed();

    println!("roam-cni on node-a, {n} pods, one invocation at a time (wall time per exec):");
    report("VERSION", version);
    report("ADD", adds);
    report("DEL", dels);
    println!(
        "totals: {n} ADDs {:.2} s, {n} DELs {:.2} s",
        add_total.as_secs_f64(),
        del_total.as_secs_f64()
    );
    drop(netns);
    drop(cleanup);
    drop(network);
}
