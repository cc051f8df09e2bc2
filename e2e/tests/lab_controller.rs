//! roam-controller on the lab's real kube-apiserver and OVN, run as a child process: the
//! warm pool fills and refills; a pod gets an Address, its OVN port and `roam.dev/addresses`;
//! a deleted pod's Address is soft-deleted and its port removed; the same owner on the other
//! node gets the same IP and MAC back, its route follows, and traffic reaches it; a grace
//! period that ran out reclaims; a controller killed mid-way and restarted loses nothing;
//! leader election hands over; two controllers racing 1000 claims never hand out an IP twice;
//! bad input is refused and reported, and nothing is claimed for it.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use roam_e2e::{
    ControllerProcess, Lab, LabNetwork, TestNetns, VmCleanup, apply_crds, kubectl, nbctl,
    try_kubectl, try_run, wait_until, wait_until_else,
};
use serde_json::{Value, json};

const LONG: Duration = Duration::from_secs(90);

fn get_json(lab: &Lab, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.extend_from_slice(&["-o", "json"]);
    serde_json::from_str(&kubectl(lab, &all)).expect("kubectl -o json")
}

/// `kubectl create` (or `apply`) of one or more objects.
fn create(lab: &Lab, verb: &str, objects: &[Value]) {
    let list = json!({"apiVersion": "v1", "kind": "List", "items": objects});
    if let Err(e) = roam_e2e::kubectl_manifest(lab, verb, &list) {
        panic!("kubectl {verb} failed: {e}");
    }
}

/// Everything a test creates in Kubernetes, removed when dropped (also after a failure):
/// pods (forced: some sit on fake nodes without a kubelet), the namespace, the Networks, their
/// Addresses, fake Nodes.
struct KubeFixture {
    lab: Lab,
    namespace: String,
    networks: Vec<String>,
    fake_nodes: Vec<String>,
}

impl KubeFixture {
    fn new(lab: &Lab, namespace: &str, networks: &[&str], fake_nodes: &[&str]) -> KubeFixture {
        let f = KubeFixture {
            lab: lab.clone(),
            namespace: namespace.into(),
            networks: networks.iter().map(|s| s.to_string()).collect(),
            fake_nodes: fake_nodes.iter().map(|s| s.to_string()).collect(),
        };
        f.clean();
        apply_crds(lab);
        roam_e2e::create_test_namespace(lab, namespace);
        for n in fake_nodes {
            // a Node object only (no kubelet): pods bound to it are never run
            create(
                lab,
                "create",
                &[
                    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": n, "labels": {"roam.dev/test": "h5-fake"}}}),
                ],
            );
        }
        f
    }

    fn clean(&self) {
        let lab = &self.lab;
        let ns = self.namespace.as_str();
        if try_kubectl(lab, &["get", "namespace", ns]).is_ok() {
            let _ = try_kubectl(
                lab,
                &[
                    "-n",
                    ns,
                    "delete",
                    "pods",
                    "--all",
                    "--grace-period=0",
                    "--force",
                    "--wait=false",
                ],
            );
            let _ = try_kubectl(
                lab,
                &["delete", "namespace", ns, "--wait=true", "--timeout=120s"],
            );
        }
        // one DELETE for all of a network's Addresses (kubectl deletes them one by one)
        let rt = tokio::runtime::Runtime::new().expect("tokio");
        rt.block_on(async {
            let client = lab.kube_client().await;
            let addrs: kube::Api<roam_api::Address> = kube::Api::all(client);
            for n in &self.networks {
                let _ = try_kubectl(lab, &["delete", "network", n, "--ignore-not-found"]);
                let _ = addrs
                    .delete_collection(
                        &kube::api::DeleteParams::default(),
                        &kube::api::ListParams::default().labels(&format!("roam.dev/network={n}")),
                    )
                    .await;
            }
        });
        for n in &self.fake_nodes {
            let _ = try_kubectl(lab, &["delete", "node", n, "--ignore-not-found"]);
        }
        // Events about cluster-scoped objects land in `default`
        for n in &self.networks {
            let _ = try_kubectl(
                lab,
                &[
                    "-n",
                    "default",
                    "delete",
                    "events",
                    "--field-selector",
                    &format!("involvedObject.name={n}"),
                    "--ignore-not-found",
                ],
            );
        }
    }
}

impl Drop for KubeFixture {
    fn drop(&mut self) {
        self.clean();
    }
}

/// Network `name` of the test labelled `label` (its controller's `--network-selector`),
/// that the test's namespace `ns` may attach to.
fn network(name: &str, ns: &str, label: &str, mut spec: Value) -> Value {
    spec["namespaces"] = json!([ns]);
    json!({"apiVersion": "roam.dev/v1alpha1", "kind": "Network",
           "metadata": {"name": name, "labels": {"roam.dev/test": label}}, "spec": spec})
}

/// A pod on a real lab node (critical priority: the lab's kubelets may report disk pressure,
/// and an evicted pod is a finished pod, whose address is released).
fn pod(ns: &str, name: &str, node: &str, annotations: Value, labels: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": ns, "annotations": annotations, "labels": labels},
           "spec": {"nodeName": node, "priorityClassName": "system-node-critical",
                    "terminationGracePeriodSeconds": 0,
                    "containers": [{"name": "c", "image": "lab.local/busybox:1.35",
                                    "imagePullPolicy": "Never", "command": ["sleep", "3600"]}]}})
}

fn addresses(lab: &Lab, network: &str) -> Vec<Value> {
    get_json(
        lab,
        &[
            "get",
            "addresses",
            "-l",
            &format!("roam.dev/network={network}"),
        ],
    )["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn address(lab: &Lab, name: &str) -> Option<Value> {
    try_kubectl(lab, &["get", "address", name, "-o", "json"])
        .ok()
        .map(|s| serde_json::from_str(&s).expect("address json"))
}

fn free_on(addrs: &[Value], node: &str) -> usize {
    addrs
        .iter()
        .filter(|a| {
            let s = &a["spec"];
            s["host"] == node && s["reserved"] != true && s["deleted"] != true
        })
        .count()
}

/// The pod's published addresses, once there.
fn published(lab: &Lab, ns: &str, name: &str) -> Option<Vec<Value>> {
    let p: Value = serde_json::from_str(
        &try_kubectl(lab, &["-n", ns, "get", "pod", name, "-o", "json"]).ok()?,
    )
    .ok()?;
    let a = p["metadata"]["annotations"]["roam.dev/addresses"].as_str()?;
    serde_json::from_str(a).ok()
}

fn pod_error(lab: &Lab, ns: &str, name: &str) -> Option<String> {
    let p: Value = serde_json::from_str(
        &try_kubectl(lab, &["-n", ns, "get", "pod", name, "-o", "json"]).ok()?,
    )
    .ok()?;
    p["metadata"]["annotations"]["roam.dev/error"]
        .as_str()
        .map(str::to_string)
}

fn wait_published(lab: &Lab, ctl: &ControllerProcess, ns: &str, name: &str) -> Value {
    let deadline = std::time::Instant::now() + LONG;
    loop {
        if let Some(list) = published(lab, ns, name) {
            return list[0].clone();
        }
        if std::time::Instant::now() > deadline {
            panic!(
                "pod {ns}/{name} got no roam.dev/addresses in {LONG:?}; controller log:\n{}",
                ctl.log_tail(60)
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The NB row UUID of logical switch port `name` (panics when it does not exist).
fn lsp_uuid(lab: &Lab, name: &str) -> String {
    let out = nbctl(
        lab,
        &[
            "--bare",
            "--columns=_uuid",
            "find",
            "Logical_Switch_Port",
            &format!("name={name}"),
        ],
    );
    let uuid = out.trim().to_string();
    assert!(!uuid.is_empty(), "no logical switch port {name}");
    uuid
}

/// The NB row UUIDs of the static routes for these /32s (sorted; panics when there are none).
fn route_uuids(lab: &Lab, ips: &[&str]) -> Vec<String> {
    let mut all = Vec::new();
    for ip in ips {
        let out = nbctl(
            lab,
            &[
                "--bare",
                "--columns=_uuid",
                "find",
                "Logical_Router_Static_Route",
                &format!("ip_prefix=\"{ip}/32\""),
            ],
        );
        let found: Vec<String> = out.split_whitespace().map(str::to_string).collect();
        assert!(!found.is_empty(), "no static route for {ip}/32");
        all.extend(found);
    }
    all.sort();
    all
}

/// `MAC IP` and the options of a logical switch port, if it exists.
fn lsp(lab: &Lab, name: &str) -> Option<(String, String)> {
    let out = nbctl(
        lab,
        &[
            "--bare",
            "--columns=addresses,options",
            "find",
            "Logical_Switch_Port",
            &format!("name={name}"),
        ],
    );
    let mut lines = out.lines().filter(|l| !l.trim().is_empty());
    Some((
        lines.next()?.trim().to_string(),
        lines.next().unwrap_or_default().trim().to_string(),
    ))
}

/// The fabric router's next hop for `ip`/32 in `network`.
fn fabric_hop(lab: &Lab, network: &str, ip: &str) -> Option<String> {
    let out = nbctl(lab, &["lr-route-list", &format!("{network}-fabric")]);
    out.lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|w| w.first() == Some(&ip) || w.first() == Some(&format!("{ip}/32").as_str()))
        .and_then(|w| w.get(1).map(|s| s.to_string()))
}

fn transit(lab: &Lab, network: &str) -> BTreeMap<String, String> {
    get_json(lab, &["get", "network", network])["status"]["transit"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|t| {
            (
                t["node"].as_str().unwrap().to_string(),
                t["ip"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn lease_holder(lab: &Lab, ns: &str, name: &str) -> Option<String> {
    let l: Value = serde_json::from_str(
        &try_kubectl(lab, &["-n", ns, "get", "lease", name, "-o", "json"]).ok()?,
    )
    .ok()?;
    l["spec"]["holderIdentity"].as_str().map(str::to_string)
}

/// The whole lifecycle of an address on the lab, with two controller restarts in between.
#[test]
fn pool_claim_soft_delete_reuse_on_the_other_node_reclaim_and_restart() {
    let lab = Lab::get();
    let (ns, net, label) = ("h5-life", "h5-life", "h5-life");
    let _fixture = KubeFixture::new(&lab, ns, &[net], &[]);
    let _ovn = LabNetwork::new(&lab, net, &[("node-b", "h5web"), ("node-a", "h5cli")]);
    create(
        &lab,
        "create",
        &[network(
            net,
            ns,
            label,
            json!({"subnet": "100.140.1.0/24", "transitSubnet": "169.254.140.0/24",
            "poolSizePerNode": 3, "refillPeriodSeconds": 2, "mtu": 1400}),
        )],
    );
    let args = |_: &str| {
        vec![
            "--network-selector".to_string(),
            format!("roam.dev/test={label}"),
            "--pod-namespace".into(),
            ns.into(),
            "--lease-namespace".into(),
            ns.into(),
            "--lease-name".into(),
            "h5-life-ctl".into(),
            "--sweep-period-ms".into(),
            "500".into(),
            // other tests' fake nodes are not this network's
            "--node-selector".into(),
            "roam.dev/test!=h5-fake".into(),
        ]
    };
    let start = |id: &str, port: u16| {
        let a = args(id);
        let refs: Vec<&str> = a.iter().map(String::as_str).collect();
        ControllerProcess::start(&lab, id, port, &refs)
    };
    let mut c1 = start("h5-life-c1", 18010);

    // the warm pool fills on both nodes, and refills
    wait_until(LONG, "3 free addresses on node-a and node-b", || {
        let a = addresses(&lab, net);
        (free_on(&a, "node-a") == 3 && free_on(&a, "node-b") == 3).then_some(())
    });
    let victim = addresses(&lab, net)
        .into_iter()
        .find(|a| a["spec"]["host"] == "node-a")
        .unwrap();
    let victim_name = victim["metadata"]["name"].as_str().unwrap().to_string();
    kubectl(&lab, &["delete", "address", &victim_name]);
    wait_until(LONG, "node-a's pool refilled", || {
        let a = addresses(&lab, net);
        (free_on(&a, "node-a") == 3 && a.len() >= 6).then_some(())
    });
    assert_eq!(
        lease_holder(&lab, ns, "h5-life-ctl").as_deref(),
        Some("h5-life-c1")
    );
    let t = transit(&lab, net);
    assert!(
        t.contains_key("node-a") && t.contains_key("node-b"),
        "a transit address per node: {t:?}"
    );
    assert_ne!(t["node-a"], t["node-b"]);

    // a pod on node-a: an Address, its OVN port, the annotation
    create(
        &lab,
        "create",
        &[pod(ns, "web", "node-a", json!({}), json!({}))],
    );
    let web = wait_published(&lab, &c1, ns, "web");
    let (web_ip, web_mac, web_addr) = (
        web["ip"].as_str().unwrap().to_string(),
        web["mac"].as_str().unwrap().to_string(),
        web["address"].as_str().unwrap().to_string(),
    );
    assert_eq!(web["port"], format!("{web_addr}.node-a"));
    assert_eq!(
        (
            web["prefixLen"].as_u64(),
            web["gateway"].as_str(),
            web["mtu"].as_u64()
        ),
        (Some(32), Some("100.140.1.1"), Some(1400))
    );
    let a = address(&lab, &web_addr).expect("the Address");
    assert_eq!(a["spec"]["owner"], "h5-life:web");
    assert_eq!(a["spec"]["host"], "node-a");
    assert_eq!(a["spec"]["interface"], "eth0");
    assert_eq!(a["spec"]["reserved"], true);
    let (addrs, opts) = lsp(&lab, &format!("{web_addr}.node-a"))
        .expect("the OVN port exists when the address is published");
    assert_eq!(addrs, format!("{web_mac} {web_ip}"));
    assert!(opts.contains("requested-chassis=node-a"), "{opts}");
    assert_eq!(
        fabric_hop(&lab, net, &web_ip).as_deref(),
        Some(t["node-a"].as_str())
    );

    create(
        &lab,
        "create",
        &[pod(ns, "db", "node-a", json!({}), json!({}))],
    );
    let db = wait_published(&lab, &c1, ns, "db");
    let db_addr = db["address"].as_str().unwrap().to_string();
    assert_ne!(db["ip"], web["ip"]);

    // the pod goes: soft delete, port gone, the address kept for its owner
    kubectl(
        &lab,
        &[
            "-n",
            ns,
            "delete",
            "pod",
            "web",
            "--grace-period=0",
            "--force",
        ],
    );
    wait_until(
        LONG,
        "web's Address soft-deleted and its port removed",
        || {
            let a = address(&lab, &web_addr)?;
            (a["spec"]["deleted"] == true
                && a["spec"]["deletionTime"].is_string()
                && a["spec"]["owner"] == "h5-life:web"
                && lsp(&lab, &format!("{web_addr}.node-a")).is_none())
            .then_some(())
        },
    );

    // the controller dies; meanwhile db goes and web comes back on node-b
    c1.kill();
    kubectl(
        &lab,
        &[
            "-n",
            ns,
            "delete",
            "pod",
            "db",
            "--grace-period=0",
            "--force",
        ],
    );
    create(
        &lab,
        "create",
        &[pod(ns, "web", "node-b", json!({}), json!({}))],
    );
    // a new controller takes the Lease once c1's has expired, and catches up
    let c2 = start("h5-life-c2", 18011);
    let web2 = wait_published(&lab, &c2, ns, "web");
    assert_eq!(
        lease_holder(&lab, ns, "h5-life-ctl").as_deref(),
        Some("h5-life-c2")
    );
    assert_eq!(
        (web2["ip"].as_str(), web2["mac"].as_str()),
        (Some(web_ip.as_str()), Some(web_mac.as_str())),
        "same owner: same IP and MAC"
    );
    assert_eq!(web2["port"], format!("{web_addr}.node-b"));
    let a = address(&lab, &web_addr).unwrap();
    assert_eq!(
        (a["spec"]["host"].as_str(), a["spec"]["deleted"].as_bool()),
        (Some("node-b"), Some(false))
    );
    let (addrs, opts) = lsp(&lab, &format!("{web_addr}.node-b")).expect("web's port on node-b");
    assert_eq!(addrs, format!("{web_mac} {web_ip}"));
    assert!(opts.contains("requested-chassis=node-b"), "{opts}");
    assert_eq!(
        fabric_hop(&lab, net, &web_ip).as_deref(),
        Some(t["node-b"].as_str()),
        "the route follows the address"
    );
    wait_until(
        LONG,
        "db's delete, missed while the controller was down, is found",
        || {
            let a = address(&lab, &db_addr)?;
            (a["spec"]["deleted"] == true && lsp(&lab, &format!("{db_addr}.node-a")).is_none())
                .then_some(())
        },
    );

    // traffic reaches web on node-b from a client on node-a: the pods as roam-cni (the
    // nodes' CNI) plumbed them from the published addresses
    create(
        &lab,
        "create",
        &[pod(ns, "client", "node-a", json!({}), json!({}))],
    );
    let cli = wait_published(&lab, &c2, ns, "client");
    let web_ns = TestNetns::of_pod(&lab, ns, "web", "h5web");
    let cli_ns = TestNetns::of_pod(&lab, ns, "client", "h5cli");
    web_ns.assert_overlay_eth0(&web_ip, "100.140.1.1");
    cli_ns.assert_overlay_eth0(cli["ip"].as_str().unwrap(), "100.140.1.1");
    wait_until(LONG, "client on node-a pings web on node-b", || {
        cli_ns.ping_once(&web_ip).then_some(())
    });

    // a pod with a VM's label is not the VM's: only a launcher pod is (the launcher label
    // and the VM as its controlling ownerReference), and a VM's launcher pods are the VM
    // controller's, which claims the VM's address before creating them (lab_vm follows that
    // address across a migration; lab_tenant shows a forged launcher takes nothing). A pod
    // with the VM's label alone is its own owner.
    create(
        &lab,
        "create",
        &[pod(
            ns,
            "vm1-label-only",
            "node-a",
            json!({}),
            json!({"roam.dev/vm": "vm1"}),
        )],
    );
    let label_only = wait_published(&lab, &c2, ns, "vm1-label-only");
    let label_only_ip = label_only["ip"].as_str().unwrap().to_string();
    assert_eq!(
        address(&lab, label_only["address"].as_str().unwrap()).unwrap()["spec"]["owner"],
        "h5-life:vm1-label-only",
        "a label without the VM's ownerReference does not make a pod the VM's"
    );

    // a second candidate waits while c2 leads, and takes over when c2 dies
    let c3 = start("h5-life-c3", 18012);
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        lease_holder(&lab, ns, "h5-life-ctl").as_deref(),
        Some("h5-life-c2"),
        "c3 must not take a held Lease"
    );
    assert!(
        !c3.log_text().contains("addresses published"),
        "c3 acted without leading:\n{}",
        c3.log_tail(20)
    );
    let metrics = c2.scrape().expect("c2 serves /metrics");
    assert!(
        metrics.contains("roam_addresses{network=\"h5-life\",state=\"claimed\"}"),
        "{metrics}"
    );
    assert!(
        !metrics.contains("roam_claim_duration_seconds_count 0"),
        "{metrics}"
    );
    // the live workloads' OVN rows, which a new leader must leave alone (same UUIDs: never
    // removed and put back)
    let live_ports = [
        web2["port"].as_str().unwrap().to_string(),
        cli["port"].as_str().unwrap().to_string(),
        label_only["port"].as_str().unwrap().to_string(),
    ];
    let rows_before: Vec<String> = live_ports.iter().map(|p| lsp_uuid(&lab, p)).collect();
    let routes_before = route_uuids(&lab, &[&web_ip, &label_only_ip]);
    drop(c2);
    wait_until(LONG, "c3 leads after c2 died", || {
        (lease_holder(&lab, ns, "h5-life-ctl").as_deref() == Some("h5-life-c3")).then_some(())
    });

    // the grace period runs out: db's address is reclaimed (web's, in use, is not)
    kubectl(
        &lab,
        &[
            "patch",
            "network",
            net,
            "--type=merge",
            "-p",
            r#"{"spec":{"reclaimGraceSeconds":3}}"#,
        ],
    );
    wait_until_else(
        LONG,
        "db's address reclaimed",
        || {
            let gone = address(&lab, &db_addr).is_none_or(|a| a["spec"]["owner"] != "h5-life:db");
            gone.then_some(())
        },
        || {
            format!(
                "db's Address: {}\nthe Network: {}\nc3's log:\n{}",
                address(&lab, &db_addr).unwrap_or_default(),
                try_kubectl(&lab, &["get", "network", net, "-o", "json"]).unwrap_or_default(),
                c3.log_tail(80)
            )
        },
    );
    let a = address(&lab, &web_addr).unwrap();
    assert_eq!(
        (a["spec"]["owner"].as_str(), a["spec"]["deleted"].as_bool()),
        (Some("h5-life:web"), Some(false))
    );
    let rows_after: Vec<String> = live_ports.iter().map(|p| lsp_uuid(&lab, p)).collect();
    assert_eq!(
        rows_after,
        rows_before,
        "the live ports {live_ports:?} were replaced at the leader change; c3's log:\n{}",
        c3.log_tail(40)
    );
    assert_eq!(
        route_uuids(&lab, &[&web_ip, &label_only_ip]),
        routes_before,
        "the live routes were replaced at the leader change; c3's log:\n{}",
        c3.log_tail(40)
    );
    drop(c3);
}

/// Bad input: nothing claimed for that pod, a condition or an Event and `roam.dev/error`
/// say why, other pods are unaffected, and fixing the input fixes the pod.
#[test]
fn bad_input_is_refused_reported_and_claims_nothing() {
    let lab = Lab::get();
    let (ns, label) = ("h5-bad", "h5-bad");
    let nets = [
        "h5-bad",
        "h5-bad-overlap",
        "h5-bad-vlan0",
        "h5-bad-vlan4095",
        "h5-bad-tiny",
        "h5-bad-excl",
        "h5-bad-mtu",
        "h5-bad-grace",
    ];
    let _fixture = KubeFixture::new(&lab, ns, &nets, &[]);
    let _ovn: Vec<LabNetwork> = nets.iter().map(|n| LabNetwork::new(&lab, n, &[])).collect();
    create(
        &lab,
        "create",
        &[network(
            "h5-bad",
            ns,
            label,
            json!({"subnet": "100.140.2.0/24", "transitSubnet": "169.254.141.0/24", "poolSizePerNode": 2}),
        )],
    );
    // created after h5-bad: the younger of the two overlapping networks is refused
    std::thread::sleep(Duration::from_millis(1100));
    create(
        &lab,
        "create",
        &[
            network(
                "h5-bad-overlap",
                ns,
                label,
                json!({"subnet": "100.140.2.128/25", "transitSubnet": "169.254.142.0/24"}),
            ),
            network(
                "h5-bad-vlan0",
                ns,
                label,
                json!({"mode": "underlay", "vlan": 0, "subnet": "100.140.4.0/24"}),
            ),
            network(
                "h5-bad-vlan4095",
                ns,
                label,
                json!({"mode": "underlay", "vlan": 4095, "subnet": "100.140.5.0/24"}),
            ),
            network(
                "h5-bad-tiny",
                ns,
                label,
                json!({"subnet": "100.140.3.0/30", "transitSubnet": "169.254.143.0/24", "poolSizePerNode": 0}),
            ),
            network(
                "h5-bad-excl",
                ns,
                label,
                json!({"subnet": "100.140.7.0/24", "transitSubnet": "169.254.144.0/24",
                       "excluded": ["100.140.8.0/28"]}),
            ),
            network(
                "h5-bad-mtu",
                ns,
                label,
                json!({"subnet": "100.140.10.0/24", "transitSubnet": "169.254.145.0/24", "mtu": 9001}),
            ),
            network(
                "h5-bad-grace",
                ns,
                label,
                json!({"subnet": "100.140.11.0/24", "transitSubnet": "169.254.146.0/24",
                       "reclaimGraceSeconds": 0}),
            ),
        ],
    );
    let ctl = ControllerProcess::start(
        &lab,
        "h5-bad-c",
        18020,
        &[
            "--leader-elect",
            "false",
            "--network-selector",
            &format!("roam.dev/test={label}"),
            "--pod-namespace",
            ns,
            "--node-selector",
            "roam.dev/test!=h5-fake",
        ],
    );
    let ready = |n: &str| -> Option<(String, String, String)> {
        let v = get_json(&lab, &["get", "network", n]);
        let c = v["status"]["conditions"]
            .as_array()?
            .iter()
            .find(|c| c["type"] == "Ready")?
            .clone();
        Some((
            c["status"].as_str()?.into(),
            c["reason"].as_str()?.into(),
            c["message"].as_str()?.into(),
        ))
    };
    let cond = |n: &str| wait_until(LONG, &format!("{n}'s Ready condition"), || ready(n));
    assert_eq!(cond("h5-bad").0, "True");
    let (s, reason, msg) = cond("h5-bad-overlap");
    assert_eq!(
        (s.as_str(), reason.as_str()),
        ("False", "OverlappingNetworks"),
        "{msg}"
    );
    assert!(
        msg.contains("h5-bad") && msg.contains("100.140.2.0/24"),
        "{msg}"
    );
    for n in ["h5-bad-vlan0", "h5-bad-vlan4095"] {
        let (s, reason, msg) = cond(n);
        assert_eq!(
            (s.as_str(), reason.as_str()),
            ("False", "InvalidNetwork"),
            "{msg}"
        );
        assert!(msg.contains("1–4094"), "{msg}");
    }
    for (n, field) in [
        ("h5-bad-excl", "excluded"),
        ("h5-bad-mtu", "mtu"),
        ("h5-bad-grace", "reclaimGraceSeconds"),
    ] {
        let (s, reason, msg) = cond(n);
        assert_eq!(
            (s.as_str(), reason.as_str()),
            ("False", "InvalidNetwork"),
            "{msg}"
        );
        assert!(msg.contains(field), "{n}: {msg}");
    }
    wait_until(LONG, "h5-bad's pool", || {
        (free_on(&addresses(&lab, "h5-bad"), "node-a") == 2).then_some(())
    });
    for n in [
        "h5-bad-overlap",
        "h5-bad-vlan0",
        "h5-bad-vlan4095",
        "h5-bad-excl",
        "h5-bad-mtu",
        "h5-bad-grace",
    ] {
        assert!(
            addresses(&lab, n).is_empty(),
            "nothing is created for refused network {n}"
        );
    }

    let ifaces = |j: &str| json!({"roam.dev/interfaces": j});
    let bad = [
        (
            "malformed",
            ifaces("[{not json"),
            "InvalidInterfaces",
            "malformed",
        ),
        (
            "mode",
            ifaces(r#"[{"mode":"bridge","interface":{"name":"eth0"}}]"#),
            "InvalidInterfaces",
            "bridge",
        ),
        (
            "vlan",
            ifaces(r#"[{"mode":"underlay","interface":{"name":"eth0"},"vlan":{"tag":4095}}]"#),
            "InvalidInterfaces",
            "1–4094",
        ),
        (
            "outside",
            ifaces(
                r#"[{"mode":"overlay","network":"h5-bad","interface":{"name":"eth0","ip":"100.140.9.9"}}]"#,
            ),
            "StaticIpOutsideSubnet",
            "100.140.9.9",
        ),
        (
            "refused-net",
            ifaces(
                r#"[{"mode":"overlay","network":"h5-bad-overlap","interface":{"name":"eth0"}}]"#,
            ),
            "NoNetwork",
            "h5-bad-overlap",
        ),
    ];
    let mut pods: Vec<Value> = bad
        .iter()
        .map(|(n, a, _, _)| pod(ns, n, "node-a", a.clone(), json!({})))
        .collect();
    pods.push(pod(ns, "good", "node-a", ifaces(r#"[{"mode":"overlay","network":"h5-bad","interface":{"name":"eth0","ip":"100.140.2.50"}}]"#), json!({})));
    pods.push(pod(
        ns,
        "tiny1",
        "node-a",
        ifaces(r#"[{"mode":"overlay","network":"h5-bad-tiny","interface":{"name":"eth0"}}]"#),
        json!({}),
    ));
    create(&lab, "create", &pods);
    let good = wait_published(&lab, &ctl, ns, "good");
    assert_eq!(good["ip"], "100.140.2.50", "a static IP is honoured");
    let tiny1 = wait_published(&lab, &ctl, ns, "tiny1");
    assert_eq!(
        tiny1["ip"], "100.140.3.2",
        "the /30's only assignable address"
    );
    // after the good ones hold their addresses: a taken static IP, an exhausted network
    create(
        &lab,
        "create",
        &[
            pod(
                ns,
                "taken",
                "node-a",
                ifaces(
                    r#"[{"mode":"overlay","network":"h5-bad","interface":{"name":"eth0","ip":"100.140.2.50"}}]"#,
                ),
                json!({}),
            ),
            pod(
                ns,
                "tiny2",
                "node-a",
                ifaces(
                    r#"[{"mode":"overlay","network":"h5-bad-tiny","interface":{"name":"eth0"}}]"#,
                ),
                json!({}),
            ),
        ],
    );
    let all_bad: Vec<(&str, &str, &str)> = bad
        .iter()
        .map(|(n, _, r, m)| (*n, *r, *m))
        .chain([
            ("taken", "AddressTaken", "100.140.2.50"),
            ("tiny2", "PoolExhausted", "h5-bad-tiny"),
        ])
        .collect();
    for (name, reason, needle) in &all_bad {
        let err = wait_until(LONG, &format!("roam.dev/error on {name}"), || {
            pod_error(&lab, ns, name)
        });
        assert!(err.contains(needle), "{name}: {err}");
        assert!(
            published(&lab, ns, name).is_none(),
            "{name}: nothing published"
        );
        wait_until(LONG, &format!("a {reason} Event for {name}"), || {
            let ev = kubectl(
                &lab,
                &[
                    "-n",
                    ns,
                    "get",
                    "events",
                    "--field-selector",
                    &format!("involvedObject.name={name}"),
                    "-o",
                    "json",
                ],
            );
            ev.contains(reason).then_some(())
        });
    }
    // nothing was claimed for any refused pod
    let owners: BTreeSet<String> = ["h5-bad", "h5-bad-tiny"]
        .iter()
        .flat_map(|n| addresses(&lab, n))
        .filter_map(|a| a["spec"]["owner"].as_str().map(str::to_string))
        .collect();
    assert_eq!(
        owners,
        ["h5-bad:good".to_string(), "h5-bad:tiny1".to_string()].into(),
        "only the good pods hold addresses"
    );

    // fixing the annotation fixes the pod
    kubectl(
        &lab,
        &[
            "-n",
            ns,
            "annotate",
            "pod",
            "malformed",
            "--overwrite",
            r#"roam.dev/interfaces=[{"mode":"overlay","network":"h5-bad","interface":{"name":"eth0"}}]"#,
        ],
    );
    let fixed = wait_published(&lab, &ctl, ns, "malformed");
    assert!(fixed["ip"].as_str().unwrap().starts_with("100.140.2."));
    wait_until(LONG, "roam.dev/error removed", || {
        pod_error(&lab, ns, "malformed").is_none().then_some(())
    });

    // a new subnet while pods hold addresses of it: refused, the served spec stays in force
    let edit = |subnet: &str| {
        kubectl(
            &lab,
            &[
                "patch",
                "network",
                "h5-bad",
                "--type=merge",
                "-p",
                &json!({"spec": {"subnet": subnet}}).to_string(),
            ],
        )
    };
    edit("100.140.12.0/24");
    let (s, _, msg) = wait_until(LONG, "h5-bad's edit refused", || {
        ready("h5-bad").filter(|(_, r, _)| r == "ImmutableWhileInUse")
    });
    assert_eq!(s, "False", "{msg}");
    assert!(msg.contains("subnet"), "{msg}");
    let served = get_json(&lab, &["get", "network", "h5-bad"]);
    assert_eq!(served["status"]["served"]["subnet"], "100.140.2.0/24");
    create(
        &lab,
        "create",
        &[pod(
            ns,
            "after-edit",
            "node-a",
            ifaces(r#"[{"mode":"overlay","network":"h5-bad","interface":{"name":"eth0"}}]"#),
            json!({}),
        )],
    );
    let after = wait_published(&lab, &ctl, ns, "after-edit");
    assert!(
        after["ip"].as_str().unwrap().starts_with("100.140.2."),
        "claims still come from the served subnet: {after}"
    );
    // reverting the edit makes it Ready again
    edit("100.140.2.0/24");
    wait_until(LONG, "h5-bad Ready again", || {
        ready("h5-bad").filter(|(s, _, _)| s == "True")
    });
}

/// Two controllers without leader election, 1000 pods at once (bound to fake nodes: nothing
/// runs them): every pod gets an address, and no IP is ever held twice.
#[test]
fn two_controllers_racing_1000_claims_hand_out_no_ip_twice() {
    let lab = Lab::get();
    let (ns, net, label) = ("h5-race", "h5-race", "h5-race");
    let nodes = ["h5-bench-r1", "h5-bench-r2"];
    let _fixture = KubeFixture::new(&lab, ns, &[net], &nodes);
    let _ovn = LabNetwork::new(&lab, net, &[]);
    create(
        &lab,
        "create",
        &[network(
            net,
            ns,
            label,
            json!({"subnet": "100.141.0.0/20", "transitSubnet": "169.254.141.0/24", "poolSizePerNode": 10}),
        )],
    );
    let args = [
        "--leader-elect",
        "false",
        "--network-selector",
        "roam.dev/test=h5-race",
        "--pod-namespace",
        ns,
        "--node-selector",
        "roam.dev/test=h5-fake",
        // every reconcile claims at once (the default keeps 2 in flight): the most races
        "--claims-in-flight",
        "0",
    ];
    let c1 = ControllerProcess::start(&lab, "h5-race-c1", 18030, &args);
    let c2 = ControllerProcess::start(&lab, "h5-race-c2", 18031, &args);
    wait_until(LONG, "the pools on the fake nodes", || {
        let a = addresses(&lab, net);
        nodes.iter().all(|n| free_on(&a, n) == 10).then_some(())
    });
    let pods: Vec<Value> = (0..1000)
        .map(|i| {
            json!({"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"name": format!("p{i:04}"), "namespace": ns},
                   "spec": {"nodeName": nodes[i % 2], "terminationGracePeriodSeconds": 0,
                            "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.2"}]}})
        })
        .collect();
    for chunk in pods.chunks(250) {
        create(&lab, "create", chunk);
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(900);
    let published_all = loop {
        let list = get_json(&lab, &["-n", ns, "get", "pods"]);
        let items = list["items"].as_array().cloned().unwrap_or_default();
        let done: Vec<(String, Value)> = items
            .iter()
            .filter_map(|p| {
                let a = p["metadata"]["annotations"]["roam.dev/addresses"].as_str()?;
                let v: Vec<Value> = serde_json::from_str(a).ok()?;
                Some((p["metadata"]["name"].as_str()?.to_string(), v[0].clone()))
            })
            .collect();
        if done.len() == 1000 {
            break done;
        }
        if std::time::Instant::now() > deadline {
            panic!(
                "{} of 1000 pods published after 900 s\nc1:\n{}\nc2:\n{}",
                done.len(),
                c1.log_tail(30),
                c2.log_tail(30)
            );
        }
        std::thread::sleep(Duration::from_secs(2));
    };
    // double claims of one pod (both controllers served it at once) are handed back by the
    // sweep; wait until the annotations are final
    let settled = wait_until(
        Duration::from_secs(120),
        "every pod holds exactly one reserved address",
        || {
            let addrs = addresses(&lab, net);
            let reserved: Vec<&Value> = addrs
                .iter()
                .filter(|a| a["spec"]["reserved"] == true)
                .collect();
            let owners: BTreeSet<&str> = reserved
                .iter()
                .filter_map(|a| a["spec"]["owner"].as_str())
                .collect();
            (reserved.len() == 1000 && owners.len() == 1000).then_some(addrs)
        },
    );
    let by_ip: BTreeMap<String, String> = settled
        .iter()
        .filter(|a| a["spec"]["reserved"] == true)
        .map(|a| {
            (
                a["spec"]["ip"].as_str().unwrap().to_string(),
                a["spec"]["owner"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        by_ip.len(),
        1000,
        "1000 reserved addresses, 1000 distinct IPs"
    );
    // the final annotations: distinct IPs, each held by its pod
    let list = get_json(&lab, &["-n", ns, "get", "pods"]);
    let mut seen = BTreeSet::new();
    for p in list["items"].as_array().unwrap() {
        let name = p["metadata"]["name"].as_str().unwrap();
        let a: Vec<Value> = serde_json::from_str(
            p["metadata"]["annotations"]["roam.dev/addresses"]
                .as_str()
                .unwrap(),
        )
        .unwrap();
        let ip = a[0]["ip"].as_str().unwrap();
        assert!(seen.insert(ip.to_string()), "IP {ip} published twice");
        assert_eq!(
            by_ip.get(ip).map(String::as_str),
            Some(format!("{ns}:{name}").as_str()),
            "{name}'s IP {ip} is held by it"
        );
    }
    assert_eq!(published_all.len(), 1000);
    let claims = |c: &ControllerProcess| c.log_text().matches("addresses published").count();
    println!("c1 published {}, c2 published {}", claims(&c1), claims(&c2));
}

/// A VLAN (underlay) Network: DHCP and static addressing — the address comes
/// from the VLAN's subnet with its mask, the port sits on the VLAN's switch (localnet port
/// tagged), and a DHCP interface's port has OVN DHCP options.
#[test]
fn vlan_network_static_and_dhcp_addresses() {
    let lab = Lab::get();
    let (ns, net, label) = ("h5-vlan", "h5-vlan", "h5-vlan");
    let _fixture = KubeFixture::new(&lab, ns, &[net], &[]);
    let _ovn = LabNetwork::new(&lab, net, &[]);
    create(
        &lab,
        "create",
        &[network(
            net,
            ns,
            label,
            json!({"mode": "underlay", "vlan": 140, "subnet": "100.142.140.0/24",
            "gateway": "100.142.140.254", "poolSizePerNode": 2, "physnet": "h5phys"}),
        )],
    );
    let ctl = ControllerProcess::start(
        &lab,
        "h5-vlan-c",
        18050,
        &[
            "--leader-elect",
            "false",
            "--network-selector",
            &format!("roam.dev/test={label}"),
            "--pod-namespace",
            ns,
            "--node-selector",
            "roam.dev/test!=h5-fake",
        ],
    );
    let ifaces = |j: &str| json!({"roam.dev/interfaces": j});
    create(
        &lab,
        "create",
        &[
            pod(
                ns,
                "dhcp",
                "node-a",
                ifaces(
                    r#"[{"mode":"underlay","interface":{"name":"eth0","dhcp":"true","service_class":"bulk"},"vlan":{"tag":"140"}}]"#,
                ),
                json!({}),
            ),
            pod(
                ns,
                "static",
                "node-b",
                ifaces(
                    r#"[{"mode":"underlay","interface":{"name":"eth0","dhcp":"false","ip":"100.142.140.50","mask":"255.255.255.0","gateway":"100.142.140.254"},"vlan":{"tag":"140"}}]"#,
                ),
                json!({}),
            ),
        ],
    );
    let d = wait_published(&lab, &ctl, ns, "dhcp");
    let s = wait_published(&lab, &ctl, ns, "static");
    assert_eq!(
        (
            d["prefixLen"].as_u64(),
            d["vlan"].as_u64(),
            d["dhcp"].as_bool()
        ),
        (Some(24), Some(140), Some(true))
    );
    assert_eq!(d["gateway"], "100.142.140.254");
    assert_eq!(
        (
            s["ip"].as_str(),
            s["prefixLen"].as_u64(),
            s["dhcp"].as_bool()
        ),
        (Some("100.142.140.50"), Some(24), Some(false))
    );
    let a = address(&lab, d["address"].as_str().unwrap()).unwrap();
    assert_eq!(
        (
            a["spec"]["vlan"]["tag"].as_u64(),
            a["spec"]["serviceClass"].as_str()
        ),
        (Some(140), Some("bulk"))
    );
    // the ports are on the VLAN switch, beside its tagged localnet port
    let sw = nbctl(&lab, &["show", "h5-vlan-vlan140"]);
    for p in [
        d["port"].as_str().unwrap(),
        s["port"].as_str().unwrap(),
        "h5-vlan-ln",
    ] {
        assert!(sw.contains(p), "{p} on the VLAN switch:\n{sw}");
    }
    assert!(sw.contains("tag: 140"), "{sw}");
    let dhcp_opts = nbctl(
        &lab,
        &[
            "--bare",
            "--columns=dhcpv4_options",
            "find",
            "Logical_Switch_Port",
            &format!("name={}", d["port"].as_str().unwrap()),
        ],
    );
    assert!(
        !dhcp_opts.trim().is_empty(),
        "the DHCP interface's port has DHCP options"
    );
    let static_opts = nbctl(
        &lab,
        &[
            "--bare",
            "--columns=dhcpv4_options",
            "find",
            "Logical_Switch_Port",
            &format!("name={}", s["port"].as_str().unwrap()),
        ],
    );
    assert!(
        static_opts.trim().is_empty(),
        "a static interface gets no DHCP options: {static_opts}"
    );
    let cidr = nbctl(
        &lab,
        &[
            "--bare",
            "--columns=cidr",
            "find",
            "DHCP_Options",
            &format!("external_ids:roam.dev/port={}", d["port"].as_str().unwrap()),
        ],
    );
    assert_eq!(
        cidr.trim(),
        "100.142.140.0/24",
        "the lease carries the VLAN's mask"
    );
}

/// `deploy/controller/rbac.yaml` with its names made this test's own (namespace, service
/// account, roles): the rules are the file's, untouched.
fn rbac_manifest(system_ns: &str, name: &str) -> String {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/controller/rbac.yaml"
    ))
    .expect("read deploy/controller/rbac.yaml");
    text.replace("roam-system", system_ns)
        .replace("roam-controller", name)
}

/// Removes the RBAC objects (and the namespace) of [`rbac_manifest`] when dropped.
struct RbacFixture {
    lab: Lab,
    file: std::path::PathBuf,
}

impl RbacFixture {
    fn apply(lab: &Lab, system_ns: &str, name: &str) -> RbacFixture {
        let file = lab.dir().join(format!("{name}-rbac.yaml"));
        std::fs::write(&file, rbac_manifest(system_ns, name)).expect("write the RBAC manifest");
        let f = RbacFixture {
            lab: lab.clone(),
            file,
        };
        f.delete();
        kubectl(lab, &["apply", "-f", f.file.to_str().unwrap()]);
        f
    }

    fn delete(&self) {
        let _ = try_kubectl(
            &self.lab,
            &[
                "delete",
                "--ignore-not-found",
                "--wait=true",
                "--timeout=120s",
                "-f",
                self.file.to_str().unwrap(),
            ],
        );
    }
}

impl Drop for RbacFixture {
    fn drop(&mut self) {
        self.delete();
        let _ = std::fs::remove_file(&self.file);
    }
}

/// Removes a file (the service account's kubeconfig: it holds a token) when dropped.
struct RemoveFile(std::path::PathBuf);

impl Drop for RemoveFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The Events roam-controller stored in `ns` about the object `name`, as (type, reason,
/// note) (the kubelet's own, e.g. a Warning for a missing cluster DNS, are not counted).
fn events_about(lab: &Lab, ns: &str, name: &str) -> Vec<(String, String, String)> {
    get_json(
        lab,
        &[
            "-n",
            ns,
            "get",
            "events",
            "--field-selector",
            &format!("involvedObject.name={name}"),
        ],
    )["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .filter(|e| e["reportingComponent"] == "roam-controller")
        .map(|e| {
            (
                e["type"].as_str().unwrap_or_default().to_string(),
                e["reason"].as_str().unwrap_or_default().to_string(),
                e["message"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

/// roam-controller runs as the ServiceAccount of `deploy/controller/rbac.yaml` (its token, no
/// other credential) with leader election on, and everything it does works: the Lease, the
/// warm pool, the Network's status, a pod's claim and annotation, a bad pod's Warning Event,
/// a soft delete and its Event about the (cluster-scoped) Address stored in the pod's
/// namespace, a VirtualMachine booted (token Secret, launcher pod, status, Events) and
/// live-migrated by annotation (VirtualMachineMigration, finalizer, status, target pod
/// created, source pod deleted). Any request the API server refuses (a verb missing from the
/// ClusterRole) fails the test: the controller logs no "forbidden" and every Event it sent
/// was stored.
#[test]
fn controller_runs_under_its_least_privilege_service_account() {
    let lab = Lab::get();
    let (sys, sa, ns, net, label) = (
        "r5-rbac-system",
        "r5-rbac-ctl",
        "r5-rbac",
        "r5rbac",
        "r5-rbac",
    );
    let _fixture = KubeFixture::new(&lab, ns, &[net], &[]);
    let _ovn = LabNetwork::new(&lab, net, &[]);
    let _rbac = RbacFixture::apply(&lab, sys, sa);
    // the lab's Pod Security (e2e/labkit/pod-security.yaml): without runners
    // (--runner-namespace) the launcher pods this controller makes are privileged, and so are
    // the pods it annotates here (PodSecurityPolicy checks every update again); the lab lets
    // a privileged pod in only where a RoleBinding grants it, as this one does in the VMs'
    // namespace, to the controller's ServiceAccount. Not a permission of rbac.yaml's.
    kubectl(
        &lab,
        &[
            "-n",
            ns,
            "create",
            "rolebinding",
            "r5-rbac-privileged",
            "--clusterrole=roam-psp-privileged",
            &format!("--serviceaccount={sys}:{sa}"),
        ],
    );
    let kubeconfig = roam_e2e::service_account_kubeconfig(&lab, sys, sa);
    let _token = RemoveFile(kubeconfig.clone());
    // each node's own directory (the launcher pods create it)
    let vm_logs = "/var/log/roam/r5-rbac-vms";
    // the VM and its pods go with the namespace; its leftovers on the nodes go here
    let tap = roam_core::vm::tap_name(&format!("{ns}/vm1"));
    let _vm = VmCleanup::new(&lab)
        .kubectl(&[
            "-n",
            ns,
            "delete",
            "vm",
            "vm1",
            "--ignore-not-found",
            "--wait=false",
        ])
        // its teardown finalizer is the test's controller's, gone by then: let it go, or
        // the namespace stays Terminating and the next run cannot create it
        .kubectl(&[
            "-n",
            ns,
            "patch",
            "vm",
            "vm1",
            "--type=merge",
            "-p",
            r#"{"metadata":{"finalizers":null}}"#,
        ])
        .vm(&format!("{ns}_vm1"), &[&tap])
        .node_path(vm_logs)
        .cleaned();
    // the token is the service account's: it may not do what the ClusterRole does not grant
    let as_sa = |args: &[&str]| {
        let mut all = vec!["--kubeconfig", kubeconfig.to_str().unwrap()];
        all.extend_from_slice(args);
        try_run(lab.kubectl(), &all)
    };
    assert!(
        as_sa(&["-n", ns, "get", "configmaps"]).is_err(),
        "the service account reads ConfigMaps: the token is not the service account's"
    );
    as_sa(&["get", "addresses"]).expect("the service account lists Addresses");
    create(
        &lab,
        "create",
        &[network(
            net,
            ns,
            label,
            json!({"subnet": "100.160.0.0/24", "transitSubnet": "169.254.160.0/24",
            "poolSizePerNode": 2, "refillPeriodSeconds": 2, "mtu": 1400}),
        )],
    );
    // a pod in the controller's namespace, with the service account's token (in-cluster)
    let ctl = ControllerProcess::start_as(
        &lab,
        sa,
        18160,
        &[
            "--leader-elect",
            "true",
            "--lease-namespace",
            sys,
            "--lease-name",
            "r5-rbac-lease",
            "--network-selector",
            &format!("roam.dev/test={label}"),
            "--pod-namespace",
            ns,
            "--node-selector",
            "roam.dev/lab=true",
            "--sweep-period-ms",
            "500",
            "--shim-ports",
            "17160-17169",
            "--vm-log-dir",
            vm_logs,
            "--launcher-priority-class",
            "system-node-critical",
        ],
        &[],
        (sys, sa),
    );
    let fail = |what: &str| -> ! {
        panic!("{what}; controller log:\n{}", ctl.log_tail(80));
    };

    // leader election: the Lease in the controller's namespace
    wait_until(LONG, "the Lease held by the controller", || {
        (lease_holder(&lab, sys, "r5-rbac-lease").as_deref() == Some(sa)).then_some(())
    });
    // the warm pool on both nodes; the Network's status (Ready, transit addresses)
    let deadline = std::time::Instant::now() + LONG;
    loop {
        let a = addresses(&lab, net);
        if free_on(&a, "node-a") == 2 && free_on(&a, "node-b") == 2 {
            break;
        }
        if std::time::Instant::now() > deadline {
            fail("no warm pool of 2 on node-a and node-b");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let n = get_json(&lab, &["get", "network", net]);
    let ready = n["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Ready").cloned())
        .unwrap_or_else(|| fail(&format!("no Ready condition: {n}")));
    assert_eq!(ready["status"], "True", "{n}");
    let t = transit(&lab, net);
    assert!(
        t.contains_key("node-a") && t.contains_key("node-b"),
        "{t:?}"
    );

    // a pod: an Address claimed, roam.dev/addresses published
    let ifaces = json!({"roam.dev/interfaces":
        format!(r#"[{{"mode":"overlay","network":"{net}","interface":{{"name":"eth0"}}}}]"#)});
    create(
        &lab,
        "create",
        &[
            pod(ns, "web", "node-a", ifaces, json!({})),
            pod(
                ns,
                "bad",
                "node-a",
                json!({"roam.dev/interfaces": "not json"}),
                json!({}),
            ),
        ],
    );
    let web = wait_published(&lab, &ctl, ns, "web");
    let addr = web["address"].as_str().unwrap().to_string();
    let a = address(&lab, &addr).expect("the Address");
    assert_eq!(
        (
            &a["spec"]["owner"],
            &a["spec"]["host"],
            &a["spec"]["reserved"]
        ),
        (&json!("r5-rbac:web"), &json!("node-a"), &json!(true))
    );
    // bad input: roam.dev/error and a Warning Event on the pod
    wait_until(LONG, "roam.dev/error on the bad pod", || {
        pod_error(&lab, ns, "bad")
    });
    wait_until(LONG, "a Warning Event about the bad pod", || {
        events_about(&lab, ns, "bad")
            .into_iter()
            .find(|(t, _, _)| t == "Warning")
    });

    // the pod goes: the Address is soft-deleted, and the Event about it (a cluster-scoped
    // object) is stored in the pod's namespace
    kubectl(
        &lab,
        &[
            "-n",
            ns,
            "delete",
            "pod",
            "web",
            "--grace-period=0",
            "--force",
        ],
    );
    let deadline = std::time::Instant::now() + LONG;
    loop {
        if address(&lab, &addr).is_some_and(|a| a["spec"]["deleted"] == true) {
            break;
        }
        if std::time::Instant::now() > deadline {
            fail("the Address was not soft-deleted");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let released = wait_until(
        LONG,
        "the AddressReleased Event in the pod's namespace",
        || {
            events_about(&lab, ns, &addr)
                .into_iter()
                .find(|(_, r, _)| r == "AddressReleased")
        },
    );
    assert!(released.2.contains("r5-rbac:web"), "{released:?}");

    // a VirtualMachine: its Address, its token Secret, its launcher pod on node-a (run by
    // the real kubelet: roam-shim boots the guest), its status, its Events
    let (kernel, initrd) = lab.guest();
    create(
        &lab,
        "create",
        &[
            json!({"apiVersion": "roam.dev/v1alpha1", "kind": "VirtualMachine",
                 "metadata": {"name": "vm1", "namespace": ns},
                 "spec": {"cpu": 1, "memoryMiB": 256, "node": "node-a",
                          "boot": {"kernel": {"kernel": kernel, "initrd": initrd,
                                              "cmdline": "console=ttyS0 quiet panic=-1"}}}}),
        ],
    );
    let deadline = std::time::Instant::now() + LONG;
    let status = loop {
        let v = get_json(&lab, &["-n", ns, "get", "vm", "vm1"]);
        if v["status"]["phase"] == "Running" {
            break v["status"].clone();
        }
        if std::time::Instant::now() > deadline {
            fail(&format!("the VM is not Running: {}", v["status"]));
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    assert_eq!(status["node"], "node-a", "{status}");
    assert!(
        status["interfaces"][0]["ip"]
            .as_str()
            .is_some_and(|ip| ip.starts_with("100.160.0.")),
        "{status}"
    );
    let launcher = get_json(
        &lab,
        &[
            "-n",
            ns,
            "get",
            "pod",
            status["pod"].as_str().expect("the launcher pod"),
        ],
    );
    assert_eq!(launcher["spec"]["nodeName"], "node-a");
    assert_eq!(
        launcher["status"]["phase"], "Running",
        "started by the real kubelet"
    );
    // the VM's shim token lives in the controller's own namespace, not the tenant's
    let uid = get_json(&lab, &["-n", ns, "get", "vm", "vm1"])["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_string();
    kubectl(
        &lab,
        &[
            "-n",
            sys,
            "get",
            "secret",
            &format!("roam-shim-token-{uid}"),
        ],
    );
    assert!(
        kubectl(&lab, &["-n", ns, "get", "secrets", "-o", "name"])
            .lines()
            .all(|l| !l.contains("shim-token")),
        "no token in the VM's namespace"
    );
    wait_until(LONG, "the VM's Events", || {
        let ev = events_about(&lab, ns, "vm1");
        ev.iter()
            .any(|(_, r, _)| r == "LauncherCreated")
            .then_some(())
    });

    // and it migrates: a VirtualMachineMigration from the annotation, its finalizer and
    // status, the target launcher pod created and the source one deleted, the VM's status
    kubectl(
        &lab,
        &[
            "-n",
            ns,
            "annotate",
            "vm",
            "vm1",
            "roam.dev/migrate-to=node-b",
        ],
    );
    let deadline = std::time::Instant::now() + LONG;
    let status = loop {
        let v = get_json(&lab, &["-n", ns, "get", "vm", "vm1"]);
        if v["status"]["node"] == "node-b" && v["status"]["phase"] == "Running" {
            break v["status"].clone();
        }
        if std::time::Instant::now() > deadline {
            fail(&format!(
                "the VM did not migrate to node-b: {}",
                v["status"]
            ));
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    let vmims = get_json(&lab, &["-n", ns, "get", "vmim"]);
    let m = &vmims["items"][0];
    assert_eq!(m["status"]["phase"], "Succeeded", "{vmims}");
    wait_until(LONG, "the source launcher pod gone", || {
        try_kubectl(
            &lab,
            &[
                "-n",
                ns,
                "get",
                "pod",
                launcher["metadata"]["name"].as_str()?,
            ],
        )
        .is_err()
        .then_some(())
    });
    assert_ne!(status["pod"], launcher["metadata"]["name"], "{status}");

    // nothing was refused: no 403 in the log, every Event stored
    let log = ctl.log_text();
    let forbidden: Vec<&str> = log
        .lines()
        .filter(|l| l.to_lowercase().contains("forbidden"))
        .collect();
    assert!(
        forbidden.is_empty(),
        "requests refused under the service account:\n{}",
        forbidden.join("\n")
    );
    let metrics = ctl.scrape().expect("metrics");
    assert!(
        !metrics.contains("event=\"k8s_events\",reason=\"failed\""),
        "Events refused:\n{}",
        ctl.log_tail(80)
    );
    assert!(
        metrics.contains("event=\"k8s_events\",reason=\"published\""),
        "{metrics}"
    );
}
