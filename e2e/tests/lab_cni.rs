//! roam-cni on the lab's real nodes, invoked exactly as a container runtime does (CNI_COMMAND,
//! CNI_CONTAINERID, CNI_NETNS, CNI_IFNAME, CNI_ARGS with K8S_POD_NAMESPACE/K8S_POD_NAME,
//! CNI_PATH, the config on stdin; nothing else in the environment) inside a node's network and
//! mount namespaces, against network namespaces the test creates on that node. The pods'
//! `roam.dev/addresses` annotations are written by the test, as roam-controller would, on pods
//! no kubelet runs; their OVN ports come from roam-network's planner and reconciler.
//!
//! Names: overlay `h6-cni` (100.130.0.0/16), VLAN network `h6-vlan` (tag 406, 198.18.6.0/24,
//! physnet `h6phys` on `br-h6phys`), namespaces `h6-*`, container IDs `h6*`.

use std::net::Ipv4Addr;
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, DeleteParams, PostParams};
use roam_cni::config::AttachmentKey;
use roam_contract::annotation::{Mode, PodAddress, addresses_annotation};
use roam_e2e::{
    CniOutput, Lab, LabNetwork, NodeNetns, PortBuilder, address_objects, delete_addresses,
    invoke_cni, node_kubeconfig, node_try_run, overlay_fixture, put_addresses, reconcile_on_lab,
    try_run, unscheduled_pod, vsctl, wait_until,
};
use roam_network::topology::{PortSpec, UnderlaySpec, plan_overlay, plan_underlay};
use serde_json::{Value, json};

const NET: &str = "h6-cni";
const OCTET: u8 = 130;
const GW: &str = "100.130.0.1";
const VNET: &str = "h6-vlan";
const VLAN: u16 = 406;
const VGW: &str = "198.18.6.1";
const PHYSNET: &str = "h6phys";
const PHYS_BRIDGE: &str = "br-h6phys";
const TOR: &str = "h6tor";
const WAIT: Duration = Duration::from_secs(90);

/// The tests share the network and the node: one at a time.
static LOCK: Mutex<()> = Mutex::new(());

/// Overlay port `c<i>`: 100.130.1.<i> on `node`.
fn port(i: u8, node: &str) -> PortSpec {
    PortBuilder::new(format!("c{i}"), Ipv4Addr::new(100, OCTET, 1, i), node).build()
}

/// The overlay ports of every test.
fn ports() -> Vec<PortSpec> {
    vec![
        port(1, "node-a"),
        port(2, "node-b"),
        port(3, "node-a"),
        port(4, "node-a"),
        port(5, "node-a"),
    ]
}

/// What roam-controller publishes for overlay port `p` as interface `ifname`.
fn overlay_address(p: &PortSpec, ifname: &str) -> PodAddress {
    PodAddress {
        name: ifname.into(),
        network: NET.into(),
        mode: Mode::Overlay,
        // as roam-controller names them: the port after its Address
        address: p.name.clone(),
        port: roam_network::topology::overlay_port_name(&p.name, &p.node),
        ip: p.ip,
        prefix_len: 32,
        mac: p.mac.to_string(),
        gateway: GW.parse().unwrap(),
        metric: 0,
        mtu: 1400,
        dhcp: false,
        vlan: None,
        service_class: None,
    }
}

/// The lab, a runtime, the test namespace and the overlay with every test's ports; removes
/// the pods it made, the overlay's OVN rows and every leftover attachment when dropped.
struct Env {
    lab: Lab,
    /// The test's Kubernetes namespace, `h6-cni-<test>-<pid>` (deleted when dropped).
    k8s_ns: String,
    rt: tokio::runtime::Runtime,
    pods: Api<Pod>,
    made: Vec<String>,
    /// Networks whose Address objects it wrote.
    networks: std::cell::RefCell<Vec<String>>,
    _net: LabNetwork,
    _lock: std::sync::MutexGuard<'static, ()>,
}

impl Env {
    fn new(test: &str) -> Env {
        let lock = LOCK.lock().unwrap_or_else(|p| p.into_inner());
        let k8s_ns = format!("h6-cni-{test}-{}", std::process::id());
        let lab = Lab::get();
        let rt = tokio::runtime::Runtime::new().expect("a tokio runtime");
        let client = rt.block_on(lab.kube_client());
        let net = LabNetwork::new(&lab, NET, &[]);
        let (spec, nodes) = overlay_fixture(NET, OCTET);
        reconcile_on_lab(
            &lab,
            NET,
            &plan_overlay(&spec, &nodes, &ports()).expect("a valid plan"),
        );
        let nss: Api<Namespace> = Api::all(client.clone());
        let _ = rt.block_on(
            nss.create(
                &PostParams::default(),
                &serde_json::from_value(
                    json!({"metadata": {"name": k8s_ns, "labels": {roam_e2e::TEST_LABEL: "true"}}}),
                )
                .unwrap(),
            ),
        );
        // the namespace's default ServiceAccount must exist before pods can be created
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
        let env = Env {
            pods: Api::namespaced(client, &k8s_ns),
            k8s_ns,
            lab,
            rt,
            made: vec![],
            networks: Default::default(),
            _net: net,
            _lock: lock,
        };
        let failed = env.sweep();
        assert!(failed.is_empty(), "{failed:?}");
        env
    }

    /// A pod (no kubelet runs it) with `addresses` as its annotation (none: no annotation).
    fn pod(&mut self, name: &str, addresses: Option<&str>) {
        let _ = self.rt.block_on(
            self.pods
                .delete(name, &DeleteParams::default().grace_period(0)),
        );
        wait_until(Duration::from_secs(30), "a stale pod to go", || {
            self.rt
                .block_on(self.pods.get_opt(name))
                .ok()
                .flatten()
                .is_none()
                .then_some(())
        });
        let pod: Pod = serde_json::from_value(unscheduled_pod(name, addresses)).unwrap();
        // as roam-controller: the Address objects first, which roam-cni checks the
        // annotation against
        self.addresses(name, None, addresses);
        self.rt
            .block_on(self.pods.create(&PostParams::default(), &pod))
            .unwrap_or_else(|e| panic!("create pod {name}: {e}"));
        self.made.push(name.into());
    }

    /// The Address objects behind pod `name`'s annotation (on `node`, if it runs), as
    /// roam-controller holds them; removed when dropped.
    fn addresses(&self, name: &str, node: Option<&str>, annotation: Option<&str>) {
        let objects = address_objects(&self.k8s_ns, name, node, annotation.unwrap_or("[]"));
        let mut networks = self.networks.borrow_mut();
        for o in &objects {
            let net = o["spec"]["network"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            if !networks.contains(&net) {
                networks.push(net);
            }
        }
        put_addresses(&self.lab, objects);
    }

    /// The config the runtime writes on stdin, with `extra` fields merged in.
    fn conf(&self, extra: Value) -> String {
        let mut c = json!({
            "cniVersion": "1.1.0",
            "name": NET,
            "type": "roam-cni",
            "kubeconfig": node_kubeconfig(&self.lab),
            "annotationTimeoutSeconds": 20,
        });
        for (k, v) in extra.as_object().expect("an object") {
            if v.is_null() {
                c.as_object_mut().unwrap().remove(k);
            } else {
                c[k] = v.clone();
            }
        }
        c.to_string()
    }

    /// Run `command` for container `cid` with the runtime's full environment.
    fn cni(
        &self,
        node: &str,
        command: &str,
        cid: &str,
        netns: &str,
        pod: &str,
        conf: &str,
    ) -> CniOutput {
        let args = format!(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE={};K8S_POD_NAME={pod};K8S_POD_INFRA_CONTAINER_ID={cid}",
            self.k8s_ns
        );
        let env = [
            ("CNI_COMMAND", command),
            ("CNI_CONTAINERID", cid),
            ("CNI_NETNS", netns),
            ("CNI_IFNAME", "eth0"),
            ("CNI_ARGS", args.as_str()),
            ("CNI_PATH", "/opt/cni/bin"),
        ];
        invoke_cni(&self.lab, node, &env, conf)
    }

    /// Everything of attachment `cid`/eth0 still on `node`: host veths and OVS interfaces.
    fn leftovers(&self, node: &str, cid: &str) -> Vec<String> {
        let stem = roam_cni::plan::host_stem(
            NET,
            &AttachmentKey {
                container_id: cid.into(),
                ifname: "eth0".into(),
            },
        );
        let links = node_try_run(&self.lab, node, "ip", &["-o", "link", "show"]).unwrap();
        let mut left: Vec<String> = links
            .lines()
            .filter_map(|l| l.split(": ").nth(1))
            .map(|n| n.split('@').next().unwrap_or(n).to_string())
            .filter(|n| n.starts_with(&stem))
            .map(|n| format!("veth {n}"))
            .collect();
        let ifaces = vsctl(
            &self.lab.node(node),
            &[
                "--bare",
                "--columns=name",
                "find",
                "interface",
                &format!("external_ids:\"roam.dev/cni-container\"={cid}"),
            ],
        );
        left.extend(
            ifaces
                .split_whitespace()
                .map(|n| format!("OVS interface {n}")),
        );
        left
    }

    /// Remove every attachment of this network from both nodes (a killed run's leftovers).
    fn sweep(&self) -> Vec<String> {
        let mut failed = vec![];
        for (node, name) in ["node-a", "node-b"].into_iter().map(|n| (n, NET)) {
            let conf = self
                .conf(json!({"kubeconfig": null, "cni.dev/valid-attachments": [], "name": name}));
            let out = invoke_cni(
                &self.lab,
                node,
                &[("CNI_COMMAND", "GC"), ("CNI_PATH", "/opt/cni/bin")],
                &conf,
            );
            if out.status != 0 {
                failed.push(format!("GC on {node}: {out:?}"));
            }
        }
        failed
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        for f in self.sweep() {
            eprintln!("cleanup: {f}");
        }
        for p in &self.made {
            let _ = self.rt.block_on(
                self.pods
                    .delete(p, &DeleteParams::default().grace_period(0)),
            );
        }
        for n in self.networks.borrow().iter() {
            delete_addresses(&self.lab, n);
        }
        // its pods go with it
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

fn ip_json(ns: &NodeNetns, args: &[&str]) -> Value {
    let mut all = vec!["-j"];
    all.extend_from_slice(args);
    serde_json::from_str(&ns.run("ip", &all)).expect("ip -j prints JSON")
}

/// (mac, mtu, state, [addr/plen]) of `dev` in `ns`.
fn link_facts(ns: &NodeNetns, dev: &str) -> (String, u64, String, Vec<String>) {
    let v = ip_json(ns, &["addr", "show", "dev", dev]);
    let l = &v[0];
    let addrs = l["addr_info"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["family"] == "inet")
        .map(|a| format!("{}/{}", a["local"].as_str().unwrap(), a["prefixlen"]))
        .collect();
    (
        l["address"].as_str().unwrap().into(),
        l["mtu"].as_u64().unwrap(),
        l["operstate"].as_str().unwrap_or("").into(),
        addrs,
    )
}

/// The routes of `ns` as `dst|gateway|dev|scope|metric` lines.
fn routes(ns: &NodeNetns) -> Vec<String> {
    ip_json(ns, &["route", "show"])
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            format!(
                "{}|{}|{}|{}|{}",
                r["dst"].as_str().unwrap_or(""),
                r["gateway"].as_str().unwrap_or(""),
                r["dev"].as_str().unwrap_or(""),
                r["scope"].as_str().unwrap_or(""),
                r["metric"].as_u64().unwrap_or(0),
            )
        })
        .collect()
}

/// A TCP exchange from `client` to `server_ip` (a listener in `server` on `server_node`):
/// the datapath carries more than ICMP (checksums, segments).
fn tcp_across(
    lab: &Lab,
    server: &NodeNetns,
    server_node: &str,
    client: &NodeNetns,
    server_ip: &str,
) {
    use std::process::{Command, Stdio};
    let pid = roam_e2e::holder_pid(lab, server_node);
    let listener = Command::new("timeout")
        .args([
            "30",
            "nsenter",
            "-t",
            &pid,
            "-m",
            "--",
            "ip",
            "netns",
            "exec",
            &server.name,
        ])
        .args(["busybox", "nc", "-l", "-p", "5001"])
        // an open stdin until the client is done: busybox nc stops at its stdin's EOF, and
        // with an inherited /dev/null it could stop before the connection's last segments
        // were read (seen: 4096 of 5200 bytes on a loaded machine). wait_with_output closes it.
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the listener");
    let payload = "roam-cni-tcp-".repeat(400); // several segments
    wait_until(
        Duration::from_secs(20),
        "a TCP connection across OVN",
        || {
            client
                .try_run(
                    "sh",
                    &[
                        "-c",
                        &format!("echo {payload} | busybox nc -w 5 {server_ip} 5001"),
                    ],
                )
                .ok()
        },
    );
    let out = listener.wait_with_output().expect("the listener ends");
    let got = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        got.trim(),
        payload,
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn annotation(list: &[PodAddress]) -> String {
    addresses_annotation(list).expect("a valid annotation")
}

#[test]
fn add_check_del_on_the_overlay_across_nodes() {
    let mut env = Env::new("ovl");
    let (p1, p2) = (port(1, "node-a"), port(2, "node-b"));
    env.pod("h6-c1", Some(&annotation(&[overlay_address(&p1, "eth0")])));
    env.pod("h6-c2", Some(&annotation(&[overlay_address(&p2, "eth0")])));
    let ns1 = NodeNetns::new(&env.lab, "node-a", "h6-c1");
    let ns2 = NodeNetns::new(&env.lab, "node-b", "h6-c2");
    let conf = env.conf(json!({}));

    let add1 = env.cni("node-a", "ADD", "h6c1", &ns1.path, "h6-c1", &conf);
    assert_eq!(add1.status, 0, "{add1:?}");
    let r1 = add1.json();
    println!("ADD result: {r1}");
    let host1 = r1["interfaces"][0]["name"].as_str().unwrap().to_string();
    assert!(host1.starts_with("rm") && host1.len() == 15, "{r1}");
    assert!(r1["interfaces"][0].get("sandbox").is_none(), "{r1}");
    assert_eq!(
        r1["interfaces"][1],
        json!({"name": "eth0", "mac": p1.mac.to_string(), "mtu": 1400, "sandbox": ns1.path})
    );
    assert_eq!(r1["cniVersion"], "1.1.0");
    assert_eq!(
        r1["ips"],
        json!([{"address": "100.130.1.1/32", "gateway": GW, "interface": 1}])
    );
    assert_eq!(
        r1["routes"],
        json!([
            {"dst": "100.130.0.1/32", "priority": 0, "scope": 253},
            {"dst": "0.0.0.0/0", "gw": GW, "priority": 0},
        ])
    );

    // inside the pod: the /32, the MAC, the MTU, the on-link gateway route and the default
    // route through it
    let (mac, mtu, state, addrs) = link_facts(&ns1, "eth0");
    assert_eq!(mac, p1.mac.to_string());
    assert_eq!(mtu, 1400);
    assert_eq!(state, "UP");
    assert_eq!(addrs, vec!["100.130.1.1/32"]);
    let rs = routes(&ns1);
    assert!(rs.contains(&format!("{GW}||eth0|link|0")), "{rs:?}");
    assert!(rs.contains(&format!("default|{GW}|eth0||0")), "{rs:?}");
    assert_eq!(rs.len(), 2, "{rs:?}");

    // on the node: the host veth is up and an OVS port bound to the OVN port
    let a = env.lab.node("node-a");
    let link = node_try_run(&env.lab, "node-a", "ip", &["-o", "link", "show", &host1]).unwrap();
    assert!(link.contains("state UP") || link.contains(",UP"), "{link}");
    let iface_id = vsctl(&a, &["get", "interface", &host1, "external_ids:iface-id"]);
    assert_eq!(iface_id.trim().trim_matches('"'), "c1.node-a");
    let ports = vsctl(&a, &["list-ports", "br-int"]);
    assert!(ports.lines().any(|p| p == host1), "{ports}");

    // the other pod on node-b, and traffic across OVN both ways
    let add2 = env.cni("node-b", "ADD", "h6c2", &ns2.path, "h6-c2", &conf);
    assert_eq!(add2.status, 0, "{add2:?}");
    wait_until(
        WAIT,
        "pod c1 (node-a) to reach c2 (node-b) over OVN",
        || ns1.ping_once("100.130.1.2").then_some(()),
    );
    assert!(ns2.ping_once("100.130.1.1") || ns2.ping_once("100.130.1.1"));
    tcp_across(&env.lab, &ns2, "node-b", &ns1, "100.130.1.2");

    // CHECK agrees with the ADD's result
    let check_conf = env.conf(json!({"prevResult": r1}));
    let check = env.cni("node-a", "CHECK", "h6c1", &ns1.path, "h6-c1", &check_conf);
    assert_eq!((check.status, check.stdout.trim()), (0, ""), "{check:?}");

    // ADD again (the runtime retried): the same result, still connected
    let again = env.cni("node-a", "ADD", "h6c1", &ns1.path, "h6-c1", &conf);
    assert_eq!(again.status, 0, "{again:?}");
    assert_eq!(again.json(), r1);
    wait_until(WAIT, "c1 to reach c2 after a repeated ADD", || {
        ns1.ping_once("100.130.1.2").then_some(())
    });

    // drift: the default route deleted behind the plugin's back
    ns1.run("ip", &["route", "del", "default"]);
    let check = env.cni("node-a", "CHECK", "h6c1", &ns1.path, "h6-c1", &check_conf);
    assert_eq!(check.status, 1, "{check:?}");
    let e = check.json();
    println!("CHECK after drift: {e}");
    assert_eq!(e["code"], 104);
    assert!(
        e["msg"]
            .as_str()
            .unwrap()
            .contains("route 0.0.0.0/0 via 100.130.0.1 metric 0 is missing"),
        "{e}"
    );
    // and a MAC changed
    ns1.run(
        "ip",
        &["link", "set", "eth0", "address", "0a:58:64:82:01:99"],
    );
    let e = env
        .cni("node-a", "CHECK", "h6c1", &ns1.path, "h6-c1", &check_conf)
        .json();
    assert!(
        e["msg"]
            .as_str()
            .unwrap()
            .contains("has MAC 0a:58:64:82:01:99"),
        "{e}"
    );

    // DEL removes everything; a second DEL succeeds
    let del = env.cni("node-a", "DEL", "h6c1", &ns1.path, "h6-c1", &check_conf);
    assert_eq!((del.status, del.stdout.trim()), (0, ""), "{del:?}");
    assert_eq!(env.leftovers("node-a", "h6c1"), Vec::<String>::new());
    assert!(ns1.try_run("ip", &["link", "show", "eth0"]).is_err());
    let del = env.cni("node-a", "DEL", "h6c1", &ns1.path, "h6-c1", &check_conf);
    assert_eq!(del.status, 0, "{del:?}");

    // DEL with only what the spec guarantees: no netns, no CNI_ARGS, no kubeconfig, no prevResult
    let minimal = env.conf(json!({"kubeconfig": null, "annotationTimeoutSeconds": null}));
    let del = invoke_cni(
        &env.lab,
        "node-b",
        &[
            ("CNI_COMMAND", "DEL"),
            ("CNI_CONTAINERID", "h6c2"),
            ("CNI_IFNAME", "eth0"),
            ("CNI_PATH", "/opt/cni/bin"),
        ],
        &minimal,
    );
    assert_eq!(del.status, 0, "{del:?}");
    assert_eq!(env.leftovers("node-b", "h6c2"), Vec::<String>::new());
    assert!(ns2.try_run("ip", &["link", "show", "eth0"]).is_err());
}

/// node-a's physical-network bridge with the VLAN's "ToR" on an access port, moved into a
/// namespace; removed (with the bridge mapping) when dropped.
struct Underlay {
    lab: Lab,
    before: Option<String>,
    _tor: Option<NodeNetns>,
    _net: LabNetwork,
}

fn mappings(lab: &Lab) -> Option<String> {
    let db = format!("--db={}", lab.node("node-a").ovs_db);
    try_run(
        "ovs-vsctl",
        &[
            &db,
            "--if-exists",
            "get",
            "open",
            ".",
            "external_ids:ovn-bridge-mappings",
        ],
    )
    .ok()
    .map(|s| s.trim().trim_matches('"').to_string())
    .map(|m| {
        m.split(',')
            .filter(|e| !e.is_empty() && !e.starts_with(&format!("{PHYSNET}:")))
            .collect::<Vec<_>>()
            .join(",")
    })
    .filter(|s| !s.is_empty())
}

impl Underlay {
    fn new(lab: &Lab) -> Underlay {
        let net = LabNetwork::new(lab, VNET, &[]);
        let mut u = Underlay {
            lab: lab.clone(),
            before: mappings(lab),
            _tor: None,
            _net: net,
        };
        u.clean();
        let a = lab.node("node-a");
        let spec = UnderlaySpec {
            name: VNET.into(),
            vlan: VLAN,
            subnet: "198.18.6.0/24".parse().unwrap(),
            gateway: VGW.parse().unwrap(),
            physnet: PHYSNET.into(),
            mtu: 1500,
            dns: vec![],
        };
        reconcile_on_lab(lab, VNET, &plan_underlay(&spec, &[vport()]).expect("plan"));
        vsctl(
            &a,
            &[
                "--may-exist",
                "add-br",
                PHYS_BRIDGE,
                "--",
                "set",
                "bridge",
                PHYS_BRIDGE,
                "datapath_type=netdev",
            ],
        );
        let ours = format!("{PHYSNET}:{PHYS_BRIDGE}");
        let all = match mappings(lab) {
            Some(m) => format!("{m},{ours}"),
            None => ours,
        };
        vsctl(
            &a,
            &[
                "set",
                "open",
                ".",
                &format!("external_ids:ovn-bridge-mappings=\"{all}\""),
            ],
        );
        vsctl(
            &a,
            &[
                "--may-exist",
                "add-port",
                PHYS_BRIDGE,
                TOR,
                &format!("tag={VLAN}"),
                "--",
                "set",
                "interface",
                TOR,
                "type=internal",
            ],
        );
        wait_until(Duration::from_secs(20), "the ToR port to appear", || {
            node_try_run(lab, "node-a", "ip", &["link", "show", TOR]).ok()
        });
        let tor = NodeNetns::new(lab, "node-a", "h6-tor");
        node_try_run(
            lab,
            "node-a",
            "ip",
            &["link", "set", TOR, "netns", &tor.name],
        )
        .expect("move the ToR port");
        tor.run("ip", &["addr", "add", &format!("{VGW}/24"), "dev", TOR]);
        tor.run("ip", &["link", "set", TOR, "up"]);
        u._tor = Some(tor);
        u
    }

    fn clean(&self) {
        let db = format!("--db={}", self.lab.node("node-a").ovs_db);
        let _ = try_run(
            "ovs-vsctl",
            &[&db, "--if-exists", "del-port", PHYS_BRIDGE, TOR],
        );
        // other tests may map their own physical networks meanwhile: re-read, drop ours
        let _ = match mappings(&self.lab).or(self.before.clone()) {
            Some(m) => try_run(
                "ovs-vsctl",
                &[
                    &db,
                    "set",
                    "open",
                    ".",
                    &format!("external_ids:ovn-bridge-mappings=\"{m}\""),
                ],
            ),
            None => try_run(
                "ovs-vsctl",
                &[
                    &db,
                    "remove",
                    "open",
                    ".",
                    "external_ids",
                    "ovn-bridge-mappings",
                ],
            ),
        };
        let _ = try_run("ovs-vsctl", &[&db, "--if-exists", "del-br", PHYS_BRIDGE]);
    }
}

impl Drop for Underlay {
    fn drop(&mut self) {
        self._tor = None;
        self.clean();
    }
}

/// The VLAN workload port on node-a.
fn vport() -> PortSpec {
    PortBuilder::new("u1", Ipv4Addr::new(198, 18, 6, 10), "node-a")
        .dhcp(true)
        .build()
}

#[test]
fn a_two_interface_pod_overlay_eth0_and_vlan_eth1() {
    let mut env = Env::new("two");
    let under = Underlay::new(&env.lab);
    let p3 = port(3, "node-a");
    let v = vport();
    let eth1 = PodAddress {
        name: "eth1".into(),
        network: VNET.into(),
        mode: Mode::Underlay,
        address: v.name.clone(),
        port: roam_network::topology::vlan_port_name(&v.name),
        ip: v.ip,
        prefix_len: 24,
        mac: v.mac.to_string(),
        gateway: VGW.parse().unwrap(),
        metric: 100,
        mtu: 1500,
        dhcp: true,
        vlan: Some(VLAN),
        service_class: Some("bulk".into()),
    };
    env.pod(
        "h6-c3",
        Some(&annotation(&[overlay_address(&p3, "eth0"), eth1])),
    );
    let ns = NodeNetns::new(&env.lab, "node-a", "h6-c3");
    let conf = env.conf(json!({}));
    let add = env.cni("node-a", "ADD", "h6c3", &ns.path, "h6-c3", &conf);
    assert_eq!(add.status, 0, "{add:?}");
    let r = add.json();
    println!("ADD result: {r}");
    let names: Vec<&str> = r["interfaces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        (names.len(), names[1], names[3]),
        (4, "eth0", "eth1"),
        "{r}"
    );
    assert_eq!(
        r["ips"],
        json!([
            {"address": "100.130.1.3/32", "gateway": GW, "interface": 1},
            {"address": "198.18.6.10/24", "gateway": VGW, "interface": 3},
        ])
    );

    let (mac, mtu, _, addrs) = link_facts(&ns, "eth1");
    assert_eq!(
        (mac, mtu, addrs),
        (v.mac.to_string(), 1500, vec!["198.18.6.10/24".to_string()])
    );
    let (_, mtu0, _, addrs0) = link_facts(&ns, "eth0");
    assert_eq!((mtu0, addrs0), (1400, vec!["100.130.1.3/32".to_string()]));
    let rs = routes(&ns);
    for want in [
        format!("default|{GW}|eth0||0"),
        format!("default|{VGW}|eth1||100"),
        format!("{GW}||eth0|link|0"),
        "198.18.6.0/24||eth1|link|0".to_string(),
    ] {
        assert!(rs.contains(&want), "{want} not in {rs:?}");
    }
    let a = env.lab.node("node-a");
    for (host, lsp) in [(names[0], "c3.node-a"), (names[2], "u1")] {
        let id = vsctl(&a, &["get", "interface", host, "external_ids:iface-id"]);
        assert_eq!(id.trim().trim_matches('"'), lsp);
    }

    // eth1 reaches the VLAN's gateway through the localnet port; eth0 the anycast gateway
    wait_until(WAIT, "eth1 to reach the VLAN's ToR", || {
        ns.ping_once(VGW).then_some(())
    });
    wait_until(WAIT, "eth0 to reach the overlay's gateway", || {
        ns.ping_once(GW).then_some(())
    });

    let del = env.cni("node-a", "DEL", "h6c3", &ns.path, "h6-c3", &conf);
    assert_eq!(del.status, 0, "{del:?}");
    assert_eq!(env.leftovers("node-a", "h6c3"), Vec::<String>::new());
    for dev in ["eth0", "eth1"] {
        assert!(ns.try_run("ip", &["link", "show", dev]).is_err(), "{dev}");
    }
    drop(ns);
    drop(under);
}

/// A CNI error: (exit status, code, msg).
fn error_of(out: &CniOutput) -> (i32, u64, String) {
    let e = out.json();
    assert!(e["details"].as_str().is_some_and(|d| !d.is_empty()), "{e}");
    assert!(e["cniVersion"].is_string(), "{e}");
    (
        out.status,
        e["code"].as_u64().unwrap(),
        e["msg"].as_str().unwrap().to_string(),
    )
}

#[test]
fn status_version_gc_and_bad_input() {
    let mut env = Env::new("bad");
    let full = |cmd: &'static str| -> Vec<(&'static str, &'static str)> {
        vec![("CNI_COMMAND", cmd), ("CNI_PATH", "/opt/cni/bin")]
    };

    // VERSION and STATUS
    let v = invoke_cni(
        &env.lab,
        "node-a",
        &full("VERSION"),
        r#"{"cniVersion":"1.0.0"}"#,
    )
    .json();
    assert_eq!(v["cniVersion"], "1.0.0");
    assert!(
        v["supportedVersions"]
            .as_array()
            .unwrap()
            .contains(&json!("1.1.0"))
    );
    let st = invoke_cni(&env.lab, "node-a", &full("STATUS"), &env.conf(json!({})));
    assert_eq!((st.status, st.stdout.trim()), (0, ""), "{st:?}");
    let st = invoke_cni(
        &env.lab,
        "node-a",
        &full("STATUS"),
        &env.conf(json!({"ovsDb": "unix:/run/h6-no-such.sock"})),
    );
    let (s, code, msg) = error_of(&st);
    assert_eq!(
        (s, code),
        (1, 51),
        "no OVS: existing pods are cut off too: {msg}"
    );
    assert!(msg.contains("/run/h6-no-such.sock"), "{msg}");
    let st = invoke_cni(
        &env.lab,
        "node-a",
        &full("STATUS"),
        &env.conf(json!({"kubeconfig": "/run/h6-no-such.kubeconfig"})),
    );
    let (s, code, msg) = error_of(&st);
    assert_eq!((s, code), (1, 50), "{msg}");
    assert!(msg.contains("h6-no-such.kubeconfig"), "{msg}");
    let st = invoke_cni(
        &env.lab,
        "node-a",
        &full("STATUS"),
        &env.conf(json!({"cniVersion": "1.0.0"})),
    );
    assert_eq!(error_of(&st).1, 1, "STATUS is a 1.1.0 command");

    // GC: a valid attachment stays, a stale one goes
    let p4 = port(4, "node-a");
    env.pod("h6-c4", Some(&annotation(&[overlay_address(&p4, "eth0")])));
    let ns4 = NodeNetns::new(&env.lab, "node-a", "h6-c4");
    let conf = env.conf(json!({}));
    let add = env.cni("node-a", "ADD", "h6c4", &ns4.path, "h6-c4", &conf);
    assert_eq!(add.status, 0, "{add:?}");
    let gc = |valid: Value| {
        invoke_cni(
            &env.lab,
            "node-a",
            &full("GC"),
            &env.conf(json!({"cni.dev/valid-attachments": valid, "kubeconfig": null})),
        )
    };
    let out = gc(json!([{"containerID": "h6c4", "ifname": "eth0"}]));
    assert_eq!(out.status, 0, "{out:?}");
    assert_eq!(env.leftovers("node-a", "h6c4").len(), 2, "kept");
    let out = gc(json!([{"containerID": "h6other", "ifname": "eth0"}]));
    assert_eq!(out.status, 0, "{out:?}");
    assert_eq!(env.leftovers("node-a", "h6c4"), Vec::<String>::new());
    assert!(ns4.try_run("ip", &["link", "show", "eth0"]).is_err());

    // bad input: the spec's error JSON, and nothing left behind
    let ns5 = NodeNetns::new(&env.lab, "node-a", "h6-c5");
    let p5 = port(5, "node-a");
    env.pod("h6-c5", Some(&annotation(&[overlay_address(&p5, "eth0")])));
    // the lab's kubeconfig, pointed at a port where nothing listens
    let dead_api =
        std::env::temp_dir().join(format!("h6-dead-api-{}.kubeconfig", std::process::id()));
    let kc = std::fs::read_to_string(env.lab.kubeconfig()).expect("the lab's kubeconfig");
    let server = kc
        .lines()
        .find_map(|l| l.trim().strip_prefix("server: "))
        .expect("a server line")
        .to_string();
    std::fs::write(&dead_api, kc.replace(&server, "https://127.0.0.1:1")).unwrap();
    let cases: Vec<(&str, CniOutput, u64, &str)> = vec![
        (
            "config not JSON",
            env.cni("node-a", "ADD", "h6c5", &ns5.path, "h6-c5", "{not json"),
            6,
            "not valid JSON",
        ),
        (
            "unsupported cniVersion",
            env.cni(
                "node-a",
                "ADD",
                "h6c5",
                &ns5.path,
                "h6-c5",
                &env.conf(json!({"cniVersion": "9.9.9"})),
            ),
            1,
            "\"9.9.9\" is not supported",
        ),
        (
            "missing CNI_NETNS",
            env.cni("node-a", "ADD", "h6c5", "", "h6-c5", &conf),
            4,
            "CNI_NETNS is not set",
        ),
        (
            "a namespace that is gone",
            env.cni(
                "node-a",
                "ADD",
                "h6c5",
                "/run/netns/h6-gone",
                "h6-c5",
                &conf,
            ),
            3,
            "/run/netns/h6-gone does not exist",
        ),
        (
            "no K8S_POD_NAME",
            invoke_cni(
                &env.lab,
                "node-a",
                &[
                    ("CNI_COMMAND", "ADD"),
                    ("CNI_CONTAINERID", "h6c5"),
                    ("CNI_NETNS", &ns5.path),
                    ("CNI_IFNAME", "eth0"),
                    ("CNI_ARGS", "K8S_POD_NAMESPACE=h6-cni"),
                    ("CNI_PATH", "/opt/cni/bin"),
                ],
                &conf,
            ),
            4,
            "has no K8S_POD_NAME",
        ),
        (
            "CHECK without prevResult",
            env.cni("node-a", "CHECK", "h6c5", &ns5.path, "h6-c5", &conf),
            7,
            "prevResult",
        ),
        (
            "a pod that does not exist",
            env.cni("node-a", "ADD", "h6c5", &ns5.path, "h6-nope", &conf),
            101,
            "h6-nope does not exist",
        ),
        (
            "an API server that does not answer",
            env.cni(
                "node-a",
                "ADD",
                "h6c5",
                &ns5.path,
                "h6-c5",
                &env.conf(json!({
                    "kubeconfig": dead_api.to_str().unwrap(),
                    "annotationTimeoutSeconds": 1,
                })),
            ),
            11,
            "Kubernetes API unreachable",
        ),
    ];
    let _ = std::fs::remove_file(&dead_api);
    for (what, out, code, text) in cases {
        let (s, c, msg) = error_of(&out);
        println!("{what}: {}", out.stdout.trim());
        assert_eq!((s, c), (1, code), "{what}: {out:?}");
        assert!(msg.contains(text), "{what}: {msg}");
        assert_eq!(
            env.leftovers("node-a", "h6c5"),
            Vec::<String>::new(),
            "{what}"
        );
    }

    // an annotation that never comes: try again later, after the configured bound
    env.pod("h6-noann", None);
    let out = env.cni(
        "node-a",
        "ADD",
        "h6c5",
        &ns5.path,
        "h6-noann",
        &env.conf(json!({"annotationTimeoutSeconds": 1})),
    );
    let (s, c, msg) = error_of(&out);
    assert_eq!((s, c), (1, 11), "{out:?}");
    assert!(
        msg.contains("has no roam.dev/addresses annotation after 1 s"),
        "{msg}"
    );
    assert_eq!(env.leftovers("node-a", "h6c5"), Vec::<String>::new());

    // a pod roam-controller refused (its roam.dev/error, no addresses): said at once, with
    // the controller's reason, not after the annotation timeout
    env.pod("h6-refused", None);
    roam_e2e::kubectl(
        &env.lab,
        &[
            "-n",
            &env.k8s_ns,
            "annotate",
            "pod",
            "h6-refused",
            "roam.dev/error=no overlay Network: create one",
        ],
    );
    let started = std::time::Instant::now();
    let out = env.cni(
        "node-a",
        "ADD",
        "h6c5",
        &ns5.path,
        "h6-refused",
        &env.conf(json!({"annotationTimeoutSeconds": 600})),
    );
    let (s, c, msg) = error_of(&out);
    assert_eq!((s, c), (1, 107), "{out:?}");
    assert!(
        msg.contains("gives pod") && msg.contains("no overlay Network: create one"),
        "{msg}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(300),
        "answered before the 600 s annotation timeout"
    );
    assert_eq!(env.leftovers("node-a", "h6c5"), Vec::<String>::new());

    // a malformed annotation
    env.pod("h6-bad", Some(r#"[{"name": "eth0"}]"#));
    let out = env.cni("node-a", "ADD", "h6c5", &ns5.path, "h6-bad", &conf);
    let (s, c, msg) = error_of(&out);
    assert_eq!((s, c), (1, 100), "{out:?}");
    assert!(msg.contains("roam.dev/addresses is malformed"), "{msg}");
    assert_eq!(env.leftovers("node-a", "h6c5"), Vec::<String>::new());

    // an annotation its creator wrote, naming another pod's address (IP, MAC and OVN port):
    // no Address says it is this pod's, so nothing is plumbed, and once the bound runs out
    // the error names the Address and its holder
    let victim = annotation(&[overlay_address(&p5, "eth0")]);
    env.pod("h6-victim", Some(&victim));
    let forged: Pod = serde_json::from_value(unscheduled_pod("h6-forged", Some(&victim))).unwrap();
    env.rt
        .block_on(env.pods.create(&PostParams::default(), &forged))
        .expect("create the forged pod");
    env.made.push("h6-forged".into());
    let out = env.cni(
        "node-a",
        "ADD",
        "h6c5",
        &ns5.path,
        "h6-forged",
        &env.conf(json!({"annotationTimeoutSeconds": 2})),
    );
    let (s, c, msg) = error_of(&out);
    assert_eq!((s, c), (1, 100), "{out:?}");
    assert!(
        msg.contains("is not roam-controller's")
            && msg.contains(&format!(
                "is held by {0}:h6-victim, not by {0}:h6-forged",
                env.k8s_ns
            )),
        "{msg}"
    );
    assert_eq!(env.leftovers("node-a", "h6c5"), Vec::<String>::new());
    assert!(ns5.try_run("ip", &["link", "show", "eth0"]).is_err());

    // a failure midway (the second interface's name is taken in the pod: `lo`) rolls back
    // the first, fully plumbed interface
    let mut lo = overlay_address(&p5, "lo");
    lo.address = "c5-second".into();
    lo.port = "c5-second.node-a".into();
    lo.mac = "0a:58:64:82:01:55".into();
    lo.ip = "100.130.1.55".parse().unwrap();
    env.pod(
        "h6-half",
        Some(&annotation(&[overlay_address(&p5, "eth0"), lo])),
    );
    let out = env.cni("node-a", "ADD", "h6c5", &ns5.path, "h6-half", &conf);
    let (s, c, msg) = error_of(&out);
    println!("failed midway: {}", out.stdout.trim());
    assert_eq!((s, c), (1, 103), "{out:?}");
    assert!(
        msg.contains("create veth pair") && msg.contains("lo"),
        "{msg}"
    );
    assert_eq!(env.leftovers("node-a", "h6c5"), Vec::<String>::new());
    assert!(ns5.try_run("ip", &["link", "show", "eth0"]).is_err());
}

/// A busybox pod on `node` with `annotation` set at creation.
fn node_pod(name: &str, node: &str, annotation: Option<&str>) -> Pod {
    let mut meta = json!({"name": name, "labels": {"roam.dev/e2e": "h6-cni"}});
    if let Some(a) = annotation {
        meta["annotations"] = json!({roam_contract::keys::ADDRESSES: a});
    }
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            // the shared machine's disk often sits under kubelet's imagefs threshold (15%
            // free): a critical pod is admitted under DiskPressure and never evicted
            "priorityClassName": "system-node-critical",
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "c",
                "image": "lab.local/busybox:1.35",
                "imagePullPolicy": "Never",
                // a TCP server: 2000 lines of 13 bytes to whoever connects on 5001
                "command": ["sh", "-c",
                    "while :; do yes roam-cni-tcp | head -n 2000 | nc -l -p 5001; done & exec sleep 3600"],
            }],
        },
    }))
    .expect("pod JSON")
}

/// Under DiskPressure kubelet's image GC removes every unused image, the lab's local ones
/// included (they cannot be pulled): import them again, as `e2e/lab up` does, when missing.
fn ensure_images(lab: &Lab) {
    let cache = std::env::var("ROAM_CACHE").unwrap_or_else(|_| "/var/cache/roam".into());
    for node in ["node-a", "node-b"] {
        let have = node_try_run(lab, node, "ctr", &["-n", "k8s.io", "images", "ls", "-q"])
            .unwrap_or_default();
        for (image, tar) in [
            ("registry.k8s.io/pause:3.2", "pause.tar"),
            ("lab.local/busybox:1.35", "busybox.tar"),
        ] {
            if !have.lines().any(|l| l == image) {
                let tar = format!("{cache}/images/{tar}");
                node_try_run(
                    lab,
                    node,
                    "ctr",
                    &["-n", "k8s.io", "images", "import", &tar],
                )
                .unwrap_or_else(|e| panic!("import {tar} on {node}: {e}"));
            }
        }
    }
}

/// The IP of pod `name` once its container is running and ready.
fn pod_ip(pods: &Api<Pod>, rt: &tokio::runtime::Runtime, name: &str) -> Option<String> {
    let p = rt.block_on(pods.get_opt(name)).ok()??;
    let st = p.status?;
    (st.phase.as_deref() == Some("Running")).then_some(())?;
    st.container_statuses?.first()?.ready.then_some(())?;
    st.pod_ip
}

/// Deletes the pods it names, and waits until they are gone, when dropped.
struct DeletePods<'a> {
    env: &'a Env,
    names: Vec<String>,
}

impl DeletePods<'_> {
    fn delete_and_wait(&mut self) -> Result<(), String> {
        for n in &self.names {
            let _ = self
                .env
                .rt
                .block_on(self.env.pods.delete(n, &DeleteParams::default()));
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        while std::time::Instant::now() < deadline {
            let left: Vec<&String> = self
                .names
                .iter()
                .filter(|n| !matches!(self.env.rt.block_on(self.env.pods.get_opt(n)), Ok(None)))
                .collect();
            if left.is_empty() {
                self.names.clear();
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        Err(format!("pods {:?} still there after 120 s", self.names))
    }
}

impl Drop for DeletePods<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.delete_and_wait() {
            eprintln!("cleanup: {e}");
        }
    }
}

#[test]
fn real_nodes_get_pod_interfaces_from_roam_cni_through_containerd() {
    const NODE_NET: &str = "h6-node";
    const NODE_OCTET: u8 = 131;
    let env = Env::new("node");
    let lab = env.lab.clone();
    let net = LabNetwork::new(&lab, NODE_NET, &[]);
    let (spec, nodes) = overlay_fixture(NODE_NET, NODE_OCTET);
    let gw = spec.gateway;
    let ports: Vec<PortSpec> = [(1u8, "node-a"), (2, "node-b")]
        .into_iter()
        .map(|(i, node)| {
            PortBuilder::new(format!("k{i}"), Ipv4Addr::new(100, NODE_OCTET, 1, i), node).build()
        })
        .collect();
    reconcile_on_lab(
        &lab,
        NODE_NET,
        &plan_overlay(&spec, &nodes, &ports).expect("plan"),
    );
    let annotations: Vec<String> = ports
        .iter()
        .map(|p| {
            let mut a = overlay_address(p, "eth0");
            a.network = NODE_NET.into();
            a.gateway = gw;
            annotation(&[a])
        })
        .collect();
    let names = ["h6-pod-a", "h6-pod-b"];
    for n in names {
        let _ = env
            .rt
            .block_on(env.pods.delete(n, &DeleteParams::default().grace_period(0)));
    }

    ensure_images(&lab);
    // roam-cni is the nodes' CNI, installed by roam's DaemonSet (e2e/lab up applies deploy/):
    // its installer's conflist is the node's only one, with the plugin's own kubeconfig
    for node in ["node-a", "node-b"] {
        let conf_dir = lab.node_path(node, "/etc/cni/net.d");
        let mut files: Vec<String> = std::fs::read_dir(&conf_dir)
            .unwrap_or_else(|e| panic!("{}: {e}", conf_dir.display()))
            .flatten()
            .map(|f| f.file_name().to_string_lossy().into_owned())
            .collect();
        files.sort();
        assert_eq!(
            files,
            ["00-roam.conflist", "roam-cni.kubeconfig"],
            "{node}: what roam-cni's installer wrote, nothing else"
        );
        let list: Value = serde_json::from_slice(
            &std::fs::read(conf_dir.join("00-roam.conflist")).expect("read the conflist"),
        )
        .expect("the conflist is JSON");
        let mut plugin = list["plugins"][0].clone();
        plugin["name"] = list["name"].clone();
        plugin["cniVersion"] = list["cniVersion"].clone();
        let conf = roam_cni::config::parse_conf(
            roam_cni::config::Command::Add,
            plugin.to_string().as_bytes(),
        )
        .unwrap_or_else(|e| panic!("{node}: {e}: {list}"));
        assert_eq!(
            conf.kubeconfig.as_deref(),
            Some(std::path::Path::new("/etc/cni/net.d/roam-cni.kubeconfig")),
            "{node}: the DaemonSet's ServiceAccount, written by its installer"
        );
        assert_eq!(conf.ovs_db, "unix:/run/openvswitch/db.sock");
    }
    let mut pods_guard = DeletePods {
        env: &env,
        names: names.iter().map(|n| n.to_string()).collect(),
    };
    for (i, (n, node)) in names.iter().zip(["node-a", "node-b"]).enumerate() {
        env.addresses(n, Some(node), Some(&annotations[i]));
        env.rt
            .block_on(env.pods.create(
                &PostParams::default(),
                &node_pod(n, node, Some(&annotations[i])),
            ))
            .unwrap_or_else(|e| panic!("create {n}: {e}"));
    }
    let kubectl = |args: &[&str]| {
        let mut all = vec!["--kubeconfig", lab.kubeconfig(), "-n", &env.k8s_ns];
        all.extend_from_slice(args);
        try_run(lab.kubectl(), &all)
    };
    let ips: Vec<String> = names
        .iter()
        .map(|n| {
            let deadline = std::time::Instant::now() + Duration::from_secs(120);
            loop {
                if let Some(ip) = pod_ip(&env.pods, &env.rt, n) {
                    break ip;
                }
                if std::time::Instant::now() > deadline {
                    panic!(
                        "{n} Running with an IP in time:\n{}",
                        kubectl(&["describe", "pod", n]).unwrap_or_else(|e| e)
                    );
                }
                std::thread::sleep(Duration::from_millis(200));
            }
        })
        .collect();
    // the addresses of the pods' annotations
    assert_eq!(ips, vec!["100.131.1.1", "100.131.1.2"], "pod IPs");
    let link = kubectl(&["exec", names[0], "--", "ip", "addr", "show", "eth0"]).unwrap();
    assert!(link.contains("inet 100.131.1.1/32"), "{link}");
    assert!(link.contains(&ports[0].mac.to_string()), "{link}");
    assert!(link.contains("mtu 1400"), "{link}");
    let routes = kubectl(&["exec", names[0], "--", "ip", "route"]).unwrap();
    assert!(
        routes.contains("default via 100.131.0.1 dev eth0"),
        "{routes}"
    );
    assert!(
        routes.contains("100.131.0.1 dev eth0 scope link"),
        "{routes}"
    );
    // ping exits 0 once one reply came: wait for a round with both (the first echo of a
    // new path can go while the flows are still being installed)
    let ping = wait_until(WAIT, "pod-a to ping pod-b through OVN", || {
        kubectl(&[
            "exec", names[0], "--", "ping", "-c", "2", "-W", "2", &ips[1],
        ])
        .ok()
        .filter(|out| out.contains("2 packets received"))
    });
    assert!(ping.contains("2 packets received"), "{ping}");
    let tcp = wait_until(
        WAIT,
        "pod-a to read 26000 bytes from pod-b over TCP",
        || {
            let out = kubectl(&[
                "exec",
                names[0],
                "--",
                "sh",
                "-c",
                &format!("nc -w 5 {} 5001 | wc -c", ips[1]),
            ]);
            out.ok().filter(|out| out.trim() == "26000")
        },
    );
    assert_eq!(tcp.trim(), "26000");

    // the host side: an OVS port per pod, bound to its OVN port
    let host_ports: Vec<(String, String)> = [("node-a", "k1.node-a"), ("node-b", "k2.node-b")]
        .iter()
        .map(|(node, lsp)| {
            let out = vsctl(
                &lab.node(node),
                &[
                    "--bare",
                    "--columns=name",
                    "find",
                    "interface",
                    &format!("external_ids:iface-id=\"{lsp}\""),
                ],
            );
            let name = out.trim().to_string();
            assert!(
                name.starts_with("rm") && name.len() == 15,
                "{node}: {out:?}"
            );
            (node.to_string(), name)
        })
        .collect();

    // deleting the pods removes every veth and OVS port
    pods_guard.delete_and_wait().expect("both pods deleted");
    for (node, host) in &host_ports {
        wait_until(
            Duration::from_secs(60),
            "the pod's veth and OVS port to go",
            || {
                let link = node_try_run(&lab, node, "ip", &["link", "show", host]);
                let port = vsctl(
                    &lab.node(node),
                    &[
                        "--bare",
                        "--columns=name",
                        "find",
                        "interface",
                        &format!("name={host}"),
                    ],
                );
                (link.is_err() && port.trim().is_empty()).then_some(())
            },
        );
    }
    drop(pods_guard);
    drop(net);
}

#[test]
fn the_node_installer_manifest_is_accepted_by_the_api_server() {
    let lab = Lab::get();
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/cni-daemonset.yaml");
    let out = try_run(
        lab.kubectl(),
        &[
            "--kubeconfig",
            lab.kubeconfig(),
            "apply",
            "--dry-run=server",
            "-f",
            manifest,
        ],
    )
    .unwrap_or_else(|e| panic!("server-side dry run of {manifest}: {e}"));
    for object in [
        "serviceaccount/roam-cni",
        "clusterrole.rbac.authorization.k8s.io/roam-cni",
        "clusterrolebinding.rbac.authorization.k8s.io/roam-cni",
        "daemonset.apps/roam-cni",
    ] {
        assert!(out.contains(object), "{object} not in {out}");
    }
    assert_eq!(out.matches("(server dry run)").count(), 4, "{out}");
}
