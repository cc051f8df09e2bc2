//! Helpers for roam's lab-backed tests: where the lab's parts are, running tools, waiting on
//! conditions, and test network namespaces that clean up after themselves.
//!
//! Every test here needs the lab (`e2e/lab up`). Without it a test fails loudly and says
//! how to start it; it never skips.

pub mod startlog;

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

/// The lab's parts, read from the environment (`eval "$(e2e/lab env)"`) or, failing that,
/// from the `lab.env` file that `e2e/lab up` writes.
#[derive(Clone, Debug)]
pub struct Lab {
    vars: HashMap<String, String>,
}

/// One lab node: its namespaces and daemons.
#[derive(Clone, Debug)]
pub struct Node {
    /// `node-a` or `node-b`: also the OVN chassis name and the Kubernetes Node name.
    pub name: String,
    /// The node's network namespace (`ip -n` works with it).
    pub netns: String,
    /// The node's address on the lab bridge (API traffic, migration stream).
    pub ip: String,
    /// The node's local Open_vSwitch database, `unix:PATH`.
    pub ovs_db: String,
    /// The node's libvirtd, a `qemu+unix://` URI.
    pub libvirt: String,
}

impl Node {
    /// Remove `port` from the node's `br-int` and delete its device (a tap, a veth end) in
    /// the node's namespace. Best effort, for clean-ups: what is not there is fine.
    pub fn remove_port(&self, port: &str) {
        let db = format!("--db={}", self.ovs_db);
        let _ = try_run(
            "ovs-vsctl",
            &[&db, "--if-exists", "del-port", "br-int", port],
        );
        let _ = try_run("ip", &["-n", &self.netns, "link", "del", port]);
    }

    /// Destroy libvirt domain `name` on this node. Best effort, for clean-ups.
    pub fn destroy_domain(&self, name: &str) {
        let _ = try_run("virsh", &["-c", &self.libvirt, "destroy", name]);
    }
}

impl Lab {
    /// The running lab. Panics with instructions when it is not up.
    pub fn get() -> Lab {
        let dir = std::env::var("ROAM_LAB_DIR").unwrap_or_else(|_| "/var/tmp/roam/lab".into());
        let file = PathBuf::from(&dir).join("lab.env");
        let mut vars: HashMap<String, String> = std::fs::read_to_string(&file)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        for (k, v) in std::env::vars() {
            if k.starts_with("ROAM_") || k == "KUBECONFIG" || k.starts_with("OVN_") {
                vars.insert(k, v);
            }
        }
        let lab = Lab { vars };
        if lab.var_opt("OVN_NB_DB").is_none() || lab.var_opt("KUBECONFIG").is_none() {
            panic!(
                "the roam lab is not up ({} missing): run `sudo e2e/lab up` first (the tests need a real \
                 kube-apiserver, OVN and libvirt; they are never skipped)",
                file.display()
            );
        }
        lab
    }

    fn var_opt(&self, k: &str) -> Option<&str> {
        self.vars
            .get(k)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }

    /// A lab variable; panics naming it when missing.
    pub fn var(&self, k: &str) -> &str {
        self.var_opt(k).unwrap_or_else(|| {
            panic!("lab variable {k} is not set; is the lab up (e2e/lab status)?")
        })
    }

    /// The lab's kubeconfig file.
    pub fn kubeconfig(&self) -> &str {
        self.var("KUBECONFIG")
    }

    /// A kube-rs client for the lab's API server, from the lab's kubeconfig.
    pub async fn kube_client(&self) -> kube::Client {
        use kube::config::{KubeConfigOptions, Kubeconfig};
        let kc = Kubeconfig::read_from(self.kubeconfig()).expect("read the lab kubeconfig");
        let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .expect("the lab kubeconfig is valid");
        kube::Client::try_from(config).expect("build a kube client")
    }

    /// kubectl built from the same source as the lab's API server.
    pub fn kubectl(&self) -> &str {
        self.var("ROAM_KUBECTL")
    }

    /// OVN northbound database (unix socket).
    pub fn nb(&self) -> &str {
        self.var("OVN_NB_DB")
    }

    /// OVN northbound database over TCP on loopback.
    pub fn nb_tcp(&self) -> &str {
        self.var("ROAM_OVN_NB_TCP")
    }

    /// A node by name (`node-a`, `node-b`).
    pub fn node(&self, name: &str) -> Node {
        let key = name.replace('-', "_").to_uppercase();
        let get = |what: &str| self.var(&format!("ROAM_{key}_{what}")).to_string();
        Node {
            name: name.to_string(),
            netns: get("NETNS"),
            ip: get("IP"),
            ovs_db: get("OVS_DB"),
            libvirt: get("LIBVIRT"),
        }
    }

    /// The guest kernel and initramfs.
    pub fn guest(&self) -> (String, String) {
        (
            self.var("ROAM_GUEST_KERNEL").into(),
            self.var("ROAM_GUEST_INITRD").into(),
        )
    }

    /// The lab's state directory.
    pub fn dir(&self) -> PathBuf {
        PathBuf::from(self.var("ROAM_LAB_DIR"))
    }
}

/// What the lab guest's init (`e2e/guest/initramfs/init`) prints on the serial console at
/// every boot: one more than before means the guest rebooted (the kernel's own banner is
/// below the lab guests' `loglevel=5`).
pub const GUEST_BOOT_MARKER: &str = "ROAM-GUEST-INIT";

/// How many times the guest booted, from its serial log.
pub fn guest_boots(serial: &str) -> usize {
    serial.matches(GUEST_BOOT_MARKER).count()
}

/// Run a program; panic with its output if it fails. Returns stdout.
pub fn run(program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    if !out.status.success() {
        panic!(
            "{program} {} failed ({}):\nstdout: {}\nstderr: {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Run the lab's kubectl against the lab's API server; panics with kubectl's stderr.
pub fn kubectl(lab: &Lab, args: &[&str]) -> String {
    let mut all = vec!["--kubeconfig", lab.kubeconfig()];
    all.extend_from_slice(args);
    run(lab.kubectl(), &all)
}

/// Run the lab's kubectl against the lab's API server; `Ok(stdout)` or `Err(stderr)`.
pub fn try_kubectl(lab: &Lab, args: &[&str]) -> Result<String, String> {
    let mut all = vec!["--kubeconfig", lab.kubeconfig()];
    all.extend_from_slice(args);
    try_run(lab.kubectl(), &all)
}

/// Apply roam's CRDs (`deploy/crds`) and wait until the API server serves every one of them.
pub fn apply_crds(lab: &Lab) {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/crds");
    kubectl(
        lab,
        &["apply", "--server-side", "--force-conflicts", "-f", dir],
    );
    for crd in [
        "virtualmachines.roam.dev",
        "virtualmachinemigrations.roam.dev",
        "networks.roam.dev",
        "addresses.roam.dev",
    ] {
        kubectl(
            lab,
            &[
                "wait",
                "--for=condition=Established",
                "--timeout=60s",
                "crd",
                crd,
            ],
        );
    }
}

/// Run a program; `Ok(stdout)` or `Err(stderr)`.
pub fn try_run(program: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// `ovn-nbctl` against the lab's NB database.
pub fn nbctl(lab: &Lab, args: &[&str]) -> String {
    let db = format!("--db={}", lab.nb());
    let mut all = vec![db.as_str(), "--timeout=30"];
    all.extend_from_slice(args);
    run("ovn-nbctl", &all)
}

/// `ovs-vsctl` against a node's Open_vSwitch database.
pub fn vsctl(node: &Node, args: &[&str]) -> String {
    let db = format!("--db={}", node.ovs_db);
    let mut all = vec![db.as_str(), "--timeout=30"];
    all.extend_from_slice(args);
    run("ovs-vsctl", &all)
}

/// Poll `f` until it returns `Some`, for at most `timeout`; panic naming `what` otherwise.
pub fn wait_until<T>(timeout: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        if Instant::now() > deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// [`wait_until`], but on timeout the panic message carries `report()` (the state that
/// explains the failure: OVN rows, logs).
pub fn wait_until_else<T>(
    timeout: Duration,
    what: &str,
    f: impl FnMut() -> Option<T>,
    report: impl FnOnce() -> String,
) -> T {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_until(timeout, what, f)
    })) {
        Ok(v) => v,
        Err(_) => panic!(
            "timed out after {timeout:?} waiting for {what}\n{}",
            report()
        ),
    }
}

/// The rows about any of `needles` (MACs, IPs) in OVN: the logical switch ports and static routes
/// that name it in the northbound database, and the southbound bindings of those ports with
/// the chassis they are on. Never panics (for failure reports).
pub fn ovn_rows_about(lab: &Lab, needles: &[&str]) -> String {
    let about = |l: &str| needles.iter().any(|n| l.contains(n));
    let nb = format!("--db={}", lab.nb());
    let sb = format!("--db={}", lab.var("OVN_SB_DB"));
    let list = |db: &str, prog: &str, cols: &str, table: &str| {
        try_run(
            prog,
            &[
                db,
                "--timeout=10",
                "--format=csv",
                "--data=bare",
                "--no-headings",
                &format!("--columns={cols}"),
                "list",
                table,
            ],
        )
        .unwrap_or_else(|e| format!("({prog} list {table}: {e})"))
    };
    let mut out = String::new();
    let lsps = list(
        &nb,
        "ovn-nbctl",
        "name,addresses,options,up",
        "Logical_Switch_Port",
    );
    let mut names = vec![];
    out.push_str("NB Logical_Switch_Port:\n");
    for l in lsps.lines().filter(|l| about(l)) {
        names.extend(l.split(',').next().map(str::to_string));
        out.push_str(&format!("  {l}\n"));
    }
    out.push_str("NB Logical_Router_Static_Route:\n");
    let routes = list(
        &nb,
        "ovn-nbctl",
        "ip_prefix,nexthop,output_port,policy",
        "Logical_Router_Static_Route",
    );
    for l in routes.lines().filter(|l| about(l)) {
        out.push_str(&format!("  {l}\n"));
    }
    let chassis = list(&sb, "ovn-sbctl", "_uuid,hostname", "Chassis");
    out.push_str("SB Port_Binding (chassis by hostname):\n");
    let bindings = list(
        &sb,
        "ovn-sbctl",
        "logical_port,chassis,additional_chassis,requested_chassis,up",
        "Port_Binding",
    );
    for l in bindings
        .lines()
        .filter(|l| names.iter().any(|n| l.starts_with(&format!("{n},"))))
    {
        let mut l = l.to_string();
        for c in chassis.lines() {
            if let Some((uuid, host)) = c.split_once(',') {
                l = l.replace(uuid, host);
            }
        }
        out.push_str(&format!("  {l}\n"));
    }
    out
}

/// A network namespace owned by a test, deleted when dropped. Names start with `roam-t-`
/// so that `e2e/lab down` removes any a killed test left behind.
#[derive(Debug)]
pub struct TestNetns {
    /// The namespace name.
    pub name: String,
}

impl TestNetns {
    /// Create `roam-t-<suffix>` (replacing a stale one of the same name).
    pub fn new(suffix: &str) -> TestNetns {
        let name = format!("roam-t-{suffix}");
        let _ = try_run("ip", &["netns", "del", &name]);
        run("ip", &["netns", "add", &name]);
        run("ip", &["-n", &name, "link", "set", "lo", "up"]);
        // keep DHCP clients from rewriting the host's resolv.conf
        let etc = PathBuf::from("/etc/netns").join(&name);
        std::fs::create_dir_all(&etc).expect("create /etc/netns entry");
        std::fs::write(etc.join("resolv.conf"), format!("# {name}\n")).expect("write resolv.conf");
        TestNetns { name }
    }

    /// Run a program inside the namespace; panic on failure.
    pub fn run(&self, program: &str, args: &[&str]) -> String {
        let mut all = vec!["netns", "exec", self.name.as_str(), program];
        all.extend_from_slice(args);
        run("ip", &all)
    }

    /// Run a program inside the namespace; `Ok(stdout)` or `Err(stderr)`.
    pub fn try_run(&self, program: &str, args: &[&str]) -> Result<String, String> {
        let mut all = vec!["netns", "exec", self.name.as_str(), program];
        all.extend_from_slice(args);
        try_run("ip", &all)
    }

    /// One ping to `ip` with a 1 s deadline.
    pub fn ping_once(&self, ip: &str) -> bool {
        self.try_run("ping", &["-n", "-c", "1", "-W", "1", ip])
            .is_ok()
    }
}

impl Drop for TestNetns {
    fn drop(&mut self) {
        // whatever a test left running in it (a DHCP client daemon, a pinger) goes with it
        if let Ok(pids) = try_run("ip", &["netns", "pids", &self.name]) {
            for pid in pids.split_whitespace() {
                let _ = try_run("kill", &["-9", pid]);
            }
        }
        let _ = try_run("ip", &["netns", "del", &self.name]);
        let _ = std::fs::remove_dir_all(PathBuf::from("/etc/netns").join(&self.name));
    }
}

/// Attach a test namespace to OVN on `node`: an OVS internal port on the node's `br-int`
/// bound to logical port `lsp`, moved into `ns` with `mac`, up, and no address (for DHCP).
pub fn attach_netns(node: &Node, ns: &TestNetns, port: &str, lsp: &str, mac: &str) {
    vsctl(
        node,
        &[
            "--may-exist",
            "add-port",
            "br-int",
            port,
            "--",
            "set",
            "interface",
            port,
            "type=internal",
            &format!("external_ids:iface-id={lsp}"),
        ],
    );
    wait_until(Duration::from_secs(20), "internal port to appear", || {
        try_run("ip", &["-n", &node.netns, "link", "show", port]).ok()
    });
    run(
        "ip",
        &["-n", &node.netns, "link", "set", port, "netns", &ns.name],
    );
    ns.run("ip", &["link", "set", port, "address", mac]);
    ns.run("ip", &["link", "set", port, "up"]);
}

/// [`attach_netns`], then a /32 `ip` whose gateway `gw` is on-link (roam's overlay plumbing,
/// done with `ip` here).
pub fn plug_netns(
    node: &Node,
    ns: &TestNetns,
    port: &str,
    lsp: &str,
    mac: &str,
    ip: &str,
    gw: &str,
) {
    attach_netns(node, ns, port, lsp, mac);
    ns.run("ip", &["addr", "add", &format!("{ip}/32"), "dev", port]);
    ns.run("ip", &["route", "add", gw, "dev", port, "scope", "link"]);
    ns.run("ip", &["route", "add", "default", "via", gw, "dev", port]);
}

/// An overlay network for a lab test, on nodes node-a and node-b, disjoint from every other
/// test's: subnet `100.<octet>.0.0/16` (gateway `.0.1`), transit `169.254.<octet>.0/24`
/// (fabric `.1`, nodes `.11`/`.12`), MACs `0a:00:00:e2:<octet>:..`.
pub fn overlay_fixture(
    name: &str,
    octet: u8,
) -> (
    roam_network::topology::OverlaySpec,
    Vec<roam_network::topology::NodeSpec>,
) {
    use roam_dhcp_opts::MacAddr;
    use std::net::Ipv4Addr;
    let spec = roam_network::topology::OverlaySpec {
        name: name.into(),
        subnet: format!("100.{octet}.0.0/16").parse().expect("a /16"),
        gateway: Ipv4Addr::new(100, octet, 0, 1),
        gateway_mac: MacAddr::new([0x0a, 0, 0, 0xe2, octet, 0x01]),
        join_subnet: format!("169.254.{octet}.0/24").parse().expect("a /24"),
        fabric_ip: Ipv4Addr::new(169, 254, octet, 1),
        fabric_mac: MacAddr::new([0x0a, 0, 0, 0xe2, octet, 0xfe]),
        mtu: 1400,
        dns: vec![],
    };
    let nodes = ["node-a", "node-b"]
        .iter()
        .enumerate()
        .map(|(i, n)| roam_network::topology::NodeSpec {
            name: (*n).into(),
            join_ip: Ipv4Addr::new(169, 254, octet, 11 + i as u8),
            join_mac: MacAddr::new([0x0a, 0, 0, 0xe2, octet, 0x11 + i as u8]),
        })
        .collect();
    (spec, nodes)
}

/// Reconcile `topology` for `network` on the lab's NB database.
pub fn reconcile_on_lab(
    lab: &Lab,
    network: &str,
    topology: &roam_network::topology::Topology,
) -> roam_network::topology::ReconcileReport {
    let rt = tokio::runtime::Runtime::new().expect("a tokio runtime");
    rt.block_on(async {
        let client = roam_ovsdb::Client::connect(lab.nb())
            .await
            .expect("connect to the lab's NB");
        roam_network::northbound::reconcile(&client, network, topology)
            .await
            .unwrap_or_else(|e| panic!("reconcile {network}: {e}"))
    })
}

/// A test's overlay network on the lab: removes the network's OVN rows (reconciling it to
/// nothing) and the test's OVS ports when created (leftovers of a killed run) and when dropped
/// (also after a failure midway).
pub struct LabNetwork {
    /// The lab.
    pub lab: Lab,
    /// The network's name.
    pub network: String,
    /// OVS ports the test plugs, as (node, port).
    pub ovs_ports: Vec<(String, String)>,
}

impl LabNetwork {
    /// Take charge of `network` and the OVS ports `(node, port)`, cleaning up leftovers first.
    pub fn new(lab: &Lab, network: &str, ovs_ports: &[(&str, &str)]) -> LabNetwork {
        let n = LabNetwork {
            lab: lab.clone(),
            network: network.into(),
            ovs_ports: ovs_ports
                .iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect(),
        };
        n.clean();
        n
    }

    fn clean(&self) {
        reconcile_on_lab(
            &self.lab,
            &self.network,
            &roam_network::topology::Topology::default(),
        );
        for (node, port) in &self.ovs_ports {
            let db = format!("--db={}", self.lab.node(node).ovs_db);
            let _ = try_run(
                "ovs-vsctl",
                &[&db, "--if-exists", "del-port", "br-int", port],
            );
        }
    }
}

impl Drop for LabNetwork {
    fn drop(&mut self) {
        self.clean();
    }
}

/// `ovn-trace` of `microflow` entering logical datapath `datapath` (a switch or router
/// name), against the lab's southbound database, after `ovn-nbctl --wait=sb sync` (so the
/// logical flows of everything committed so far are there). `args` go before the datapath
/// (e.g. `--minimal`, `--ct=new`). Returns the trace's output (panics if ovn-trace fails).
pub fn ovn_trace(lab: &Lab, datapath: &str, microflow: &str, args: &[&str]) -> String {
    nbctl(lab, &["--wait=sb", "sync"]);
    let db = format!("--db={}", lab.var("OVN_SB_DB"));
    let mut all = vec![db.as_str()];
    all.extend_from_slice(args);
    all.push(datapath);
    all.push(microflow);
    let trace = run("ovn-trace", &all);
    // ovn-trace reports a bad microflow on stdout and exits 0
    if trace.starts_with("error") || trace.contains("error parsing flow") {
        panic!("ovn-trace {datapath} {microflow:?}: {trace}");
    }
    trace
}

/// The logical ports an `ovn-trace` output sends the packet out of (its `output("P")`
/// actions that reach a port: `output;` alone is not one), in order. Accepts both the
/// detailed form (`output("P")` / `/* output to "P" */`) and the `--minimal` form.
pub fn trace_outputs(trace: &str) -> Vec<String> {
    let mut out = Vec::new();
    for marker in ["output(\"", "output to \""] {
        let mut rest = trace;
        while let Some(i) = rest.find(marker) {
            rest = &rest[i + marker.len()..];
            if let Some(end) = rest.find('"') {
                let port = rest[..end].to_string();
                if !out.contains(&port) {
                    out.push(port);
                }
            }
        }
    }
    out
}

/// The physical network mapping `physnet:bridge` added to a node's
/// `external_ids:ovn-bridge-mappings` (keeping every other entry), removed again on drop.
/// The read-modify-write of that one string is serialized across test processes with
/// `flock` on a file in the lab directory, so parallel tests mapping different physical
/// networks never lose each other's entries. The bridge is deleted on drop too.
pub struct BridgeMapping {
    node: Node,
    lock: PathBuf,
    entry: String,
    bridge: String,
}

impl BridgeMapping {
    /// Create `bridge` (userspace datapath) on `node` if missing and map `physnet` to it.
    pub fn add(lab: &Lab, node: &Node, physnet: &str, bridge: &str) -> BridgeMapping {
        vsctl(
            node,
            &[
                "--may-exist",
                "add-br",
                bridge,
                "--",
                "set",
                "bridge",
                bridge,
                "datapath_type=netdev",
            ],
        );
        let m = BridgeMapping {
            node: node.clone(),
            lock: lab.dir().join("bridge-mappings.lock"),
            entry: format!("{physnet}:{bridge}"),
            bridge: bridge.to_string(),
        };
        m.edit(true);
        m
    }

    /// Rewrite the mapping list without any entry for this physical network, plus ours if
    /// `add`.
    fn edit(&self, add: bool) {
        let physnet = self.entry.split(':').next().unwrap_or_default();
        let script = format!(
            "set -e; db='--db={db}'; \
             cur=$(ovs-vsctl $db --if-exists get open . external_ids:ovn-bridge-mappings | tr -d '\"'); \
             new=$(echo \"$cur\" | tr ',' '\\n' | grep -v '^{physnet}:' | grep -v '^$' | paste -sd, -); \
             if [ {add} = 1 ]; then new=\"${{new:+$new,}}{entry}\"; fi; \
             if [ -n \"$new\" ]; then ovs-vsctl $db set open . external_ids:ovn-bridge-mappings=\"\\\"$new\\\"\"; \
             else ovs-vsctl $db remove open . external_ids ovn-bridge-mappings; fi",
            db = self.node.ovs_db,
            add = u8::from(add),
            entry = self.entry,
        );
        let lock = self.lock.to_string_lossy().into_owned();
        let res = try_run("flock", &[&lock, "sh", "-c", &script]);
        if add {
            res.unwrap_or_else(|e| panic!("map {} on {}: {e}", self.entry, self.node.name));
        } else if let Err(e) = res {
            eprintln!("unmap {} on {}: {e}", self.entry, self.node.name);
        }
    }

    /// The node's current mapping list.
    pub fn current(node: &Node) -> String {
        let db = format!("--db={}", node.ovs_db);
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
        .unwrap_or_default()
        .trim()
        .trim_matches('"')
        .to_string()
    }
}

impl Drop for BridgeMapping {
    fn drop(&mut self) {
        self.edit(false);
        let db = format!("--db={}", self.node.ovs_db);
        let _ = try_run("ovs-vsctl", &[&db, "--if-exists", "del-br", &self.bridge]);
    }
}

/// An `ovn-trace` microflow: an ICMP echo request entering through logical port `inport`.
pub fn icmp_microflow(inport: &str, eth_src: &str, eth_dst: &str, src: &str, dst: &str) -> String {
    format!(
        "inport==\"{inport}\" && eth.src=={eth_src} && eth.dst=={eth_dst} && ip4.src=={src} && \
         ip4.dst=={dst} && ip.ttl==64 && icmp4.type==8 && icmp4.code==0"
    )
}
// ---------------------------------------------------------------------------------------
// roam-shim on the lab (tests/lab_shim.rs, benches/shim.rs)
// ---------------------------------------------------------------------------------------

/// `program` run inside `node`'s network and mount namespaces, the way the lab runs node
/// daemons (`nsenter` into the node's holder process): the node's `/run` holds its libvirt
/// and OVS sockets at their usual paths.
pub fn node_command(lab: &Lab, node: &str, program: &str) -> Command {
    let key = node.replace('-', "_").to_uppercase();
    let pid = lab.var(&format!("ROAM_{key}_HOLDER_PID")).to_string();
    let mut c = Command::new("nsenter");
    c.args(["-t", &pid, "-m", "-n", "--", program]);
    c
}

/// The `roam-shim` binary of this build (`cargo build --workspace` builds it; the tests do
/// not build it themselves).
pub fn shim_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's own path");
    // target/debug/deps/<test> or target/debug/<bench>
    exe.ancestors()
        .skip(1)
        .take(2)
        .map(|d| d.join("roam-shim"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "no roam-shim binary next to {}: run `cargo build -p roam-vm-shim --bin roam-shim` first",
                exe.display()
            )
        })
}

/// Build binary `bin` of workspace package `pkg` now (a debug build; quick when it is up to
/// date) and return its path.
pub fn workspace_binary(pkg: &str, bin: &str) -> PathBuf {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .current_dir(&root)
        .args(["build", "-q", "-p", pkg, "--bin", bin])
        .status()
        .unwrap_or_else(|e| panic!("run cargo build for {bin}: {e}"));
    assert!(status.success(), "building {bin} failed");
    std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| root.join("target"))
        .join("debug")
        .join(bin)
}

/// One VM as the lab's shim tests describe it.
#[derive(Clone, Debug)]
pub struct ShimVm {
    /// Domain name.
    pub name: String,
    /// Tap name (same on both nodes).
    pub tap: String,
    /// OVN logical port.
    pub ovn_port: String,
    /// MAC.
    pub mac: String,
    /// API token.
    pub token: String,
    /// Directory for state files, logs, the serial log and the token file.
    pub dir: PathBuf,
}

impl ShimVm {
    /// The guest's serial log.
    pub fn serial_log(&self) -> PathBuf {
        self.dir.join(format!("{}.serial.log", self.name))
    }

    /// The token file.
    pub fn token_file(&self) -> PathBuf {
        self.dir.join("token")
    }

    /// The serial log's text so far.
    pub fn serial_text(&self) -> String {
        std::fs::read(self.serial_log())
            .map(|b| String::from_utf8_lossy(&b).into_owned())
            .unwrap_or_default()
    }
}

/// A roam-shim process in a lab node; stopped (SIGTERM) when dropped.
pub struct ShimProcess {
    /// The node.
    pub node: String,
    /// The API's URL.
    pub url: String,
    /// Its log file.
    pub log: PathBuf,
    child: Option<std::process::Child>,
}

impl ShimProcess {
    /// The flags for `vm` on `node`, serving on `port`, in `mode` (`boot` or `incoming`).
    pub fn args(lab: &Lab, vm: &ShimVm, node: &str, port: u16, mode: &str) -> Vec<String> {
        let n = lab.node(node);
        let (kernel, initrd) = lab.guest();
        let state = vm.dir.join(format!("{node}.state.json"));
        [
            ("name", vm.name.clone()),
            ("vcpus", "1".into()),
            ("memory-mib", "256".into()),
            ("kernel", kernel),
            ("initrd", initrd),
            ("cmdline", "console=ttyS0 quiet panic=-1".into()),
            ("mac", vm.mac.clone()),
            ("tap", vm.tap.clone()),
            ("ovn-port", vm.ovn_port.clone()),
            ("serial-log", vm.serial_log().display().to_string()),
            ("node", node.into()),
            // the node's own paths, as in a launcher pod with hostPath /run/libvirt and
            // /run/openvswitch
            ("libvirt-uri", "qemu:///system".into()),
            ("ovs-db", "unix:/run/openvswitch/db.sock".into()),
            // how the other node's libvirtd reaches this one (peer-to-peer migration)
            ("peer-libvirt-uri", n.libvirt.clone()),
            ("migration-uri", format!("tcp://{}", n.ip)),
            ("listen", format!("{}:{port}", n.ip)),
            ("token-file", vm.token_file().display().to_string()),
            ("state-file", state.display().to_string()),
            ("mode", mode.into()),
        ]
        .into_iter()
        .flat_map(|(k, v)| [format!("--{k}"), v])
        .collect()
    }

    /// Start the shim for `vm` on `node` with `args` (see [`ShimProcess::args`]); its log
    /// goes to `<vm.dir>/<node>-<port>.log` (appended).
    pub fn start_with(
        lab: &Lab,
        vm: &ShimVm,
        node: &str,
        port: u16,
        args: &[String],
    ) -> ShimProcess {
        let n = lab.node(node);
        let log = vm.dir.join(format!("{node}-{port}.log"));
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .expect("open the shim's log");
        let child = node_command(lab, node, shim_binary().to_str().expect("a UTF-8 path"))
            .args(args)
            .stdin(std::process::Stdio::null())
            .stdout(out.try_clone().expect("dup the log"))
            .stderr(out)
            .spawn()
            .expect("start roam-shim");
        ShimProcess {
            node: node.into(),
            url: format!("http://{}:{port}", n.ip),
            log,
            child: Some(child),
        }
    }

    /// Start the shim for `vm` on `node` (see [`ShimProcess::args`]).
    pub fn start(lab: &Lab, vm: &ShimVm, node: &str, port: u16, mode: &str) -> ShimProcess {
        Self::start_with(lab, vm, node, port, &Self::args(lab, vm, node, port, mode))
    }

    /// The last `n` lines of its log.
    pub fn log_tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// Whether the process has exited (its status then).
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// SIGKILL (a crash), and reap it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGTERM, and wait (up to 20 s, then SIGKILL) for it to exit.
    pub fn stop(&mut self) -> Option<std::process::ExitStatus> {
        let mut child = self.child.take()?;
        let _ = try_run("kill", &["-TERM", &child.id().to_string()]);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(Some(st)) = child.try_wait() {
                return Some(st);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                return child.wait().ok();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for ShimProcess {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `ping -D` from a test namespace every `interval_s` seconds; [`Pinger::stop`] gives the
/// replies and the longest silence between two replies.
pub struct Pinger {
    child: std::process::Child,
    /// Drains ping's output while it runs: an unread pipe fills after ~800 replies (64 KiB,
    /// 1.6 s at 2 ms) and ping then blocks, so the silence that matters would never be seen.
    reader: Option<std::thread::JoinHandle<String>>,
}

impl Pinger {
    /// Start pinging `ip` from `ns`.
    pub fn start(ns: &TestNetns, ip: &str, interval_s: &str) -> Pinger {
        let mut child = Command::new("ip")
            .args([
                "netns", "exec", &ns.name, "ping", "-n", "-D", "-i", interval_s, "-W", "1", ip,
            ])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start ping");
        let mut stdout = child.stdout.take().expect("ping's stdout");
        let reader = std::thread::spawn(move || {
            use std::io::Read;
            let mut out = String::new();
            let _ = stdout.read_to_string(&mut out);
            out
        });
        Pinger {
            child,
            reader: Some(reader),
        }
    }

    /// Stop; returns (replies, longest silence between two replies).
    pub fn stop(mut self) -> (usize, Duration) {
        let _ = try_run("kill", &["-INT", &self.child.id().to_string()]);
        let _ = self.child.wait();
        let out = self
            .reader
            .take()
            .and_then(|r| r.join().ok())
            .unwrap_or_default();
        let stamps: Vec<f64> = out
            .lines()
            .filter(|l| l.contains("bytes from"))
            .filter_map(|l| l.strip_prefix('[')?.split(']').next()?.parse().ok())
            .collect();
        let longest = stamps.windows(2).map(|w| w[1] - w[0]).fold(0.0, f64::max);
        (stamps.len(), Duration::from_secs_f64(longest))
    }
}

impl Drop for Pinger {
    fn drop(&mut self) {
        // after stop() it has exited; after a failure it must not outlive the test
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A shim test's overlay network: `spec` over node-a and node-b, the VM's port (`vm_port`,
/// OVN DHCP on, hosted on node-a) and a probe port without DHCP on node-b; reconciled on the
/// lab's NB. The VM's logical port is `<vm_port.name>.node-a`; multi-chassis options for a
/// migration are set on it with [`set_port_chassis`].
pub fn shim_network(
    lab: &Lab,
    spec: &roam_network::topology::OverlaySpec,
    nodes: &[roam_network::topology::NodeSpec],
    ports: &[roam_network::topology::PortSpec],
) {
    let topology = roam_network::topology::plan_overlay(spec, nodes, ports)
        .unwrap_or_else(|e| panic!("plan {}: {e}", spec.name));
    reconcile_on_lab(lab, &spec.name, &topology);
    nbctl(lab, &["--wait=hv", "sync"]);
}

/// Where OVN may bind logical port `lsp`: `chassis` (one: a plain binding; two: the
/// multi-chassis binding of a live migration, the second activated by the guest's RARP).
pub fn set_port_chassis(lab: &Lab, lsp: &str, chassis: &[&str]) {
    let requested = format!("requested-chassis={}", chassis.join(","));
    let mut args = vec!["--wait=hv", "lsp-set-options", lsp, requested.as_str()];
    if chassis.len() > 1 {
        args.push("activation-strategy=rarp");
    }
    nbctl(lab, &args);
}

/// Removes a shim test's VM from the lab: its domain on both nodes, its taps and OVS ports,
/// its state files; when created (leftovers of a killed run) and when dropped. Drop the
/// shim processes first (they are started after this guard, so they drop before it).
pub struct ShimVmCleanup {
    /// The lab.
    pub lab: Lab,
    /// The VM.
    pub vm: ShimVm,
}

impl ShimVmCleanup {
    /// Take charge of `vm`, cleaning leftovers first; creates its directory and token file.
    pub fn new(lab: &Lab, vm: &ShimVm) -> ShimVmCleanup {
        let c = ShimVmCleanup {
            lab: lab.clone(),
            vm: vm.clone(),
        };
        c.clean();
        std::fs::create_dir_all(&vm.dir).expect("create the VM's directory");
        std::fs::write(vm.token_file(), format!("{}\n", vm.token)).expect("write the token");
        let _ = std::fs::remove_file(vm.serial_log());
        c
    }

    fn clean(&self) {
        for n in ["node-a", "node-b"] {
            let node = self.lab.node(n);
            node.destroy_domain(&self.vm.name);
            node.remove_port(&self.vm.tap);
            let _ = std::fs::remove_file(self.vm.dir.join(format!("{n}.state.json")));
        }
    }
}

impl Drop for ShimVmCleanup {
    fn drop(&mut self) {
        self.clean();
    }
}
/// The PID that holds `node`'s network and mount namespaces (`nsenter -t PID -m -n`).
pub fn holder_pid(lab: &Lab, node: &str) -> String {
    lab.var(&format!(
        "ROAM_{}_HOLDER_PID",
        node.replace('-', "_").to_uppercase()
    ))
    .to_string()
}

/// Run a program inside `node`'s network and mount namespaces; `Ok(stdout)` or `Err(stderr)`.
pub fn node_try_run(lab: &Lab, node: &str, program: &str, args: &[&str]) -> Result<String, String> {
    let pid = holder_pid(lab, node);
    let mut all = vec!["-t", pid.as_str(), "-m", "-n", "--", program];
    all.extend_from_slice(args);
    try_run("nsenter", &all)
}

/// A network namespace created inside a node's mount namespace (as containerd creates a
/// pod's), at `/run/netns/<name>` of that node; deleted when dropped.
#[derive(Debug)]
pub struct NodeNetns {
    /// The namespace's name.
    pub name: String,
    /// Its path inside the node's mount namespace (what a runtime passes as CNI_NETNS).
    pub path: String,
    pid: String,
}

impl NodeNetns {
    /// Create `name` on `node` (replacing a stale one), with `lo` up.
    pub fn new(lab: &Lab, node: &str, name: &str) -> NodeNetns {
        let ns = NodeNetns {
            name: name.into(),
            path: format!("/run/netns/{name}"),
            pid: holder_pid(lab, node),
        };
        ns.netns(&["del", name]).ok();
        ns.netns(&["add", name])
            .unwrap_or_else(|e| panic!("create netns {name} on {node}: {e}"));
        ns.run("ip", &["link", "set", "lo", "up"]);
        ns
    }

    fn netns(&self, args: &[&str]) -> Result<String, String> {
        let mut all = vec!["-t", self.pid.as_str(), "-m", "--", "ip", "netns"];
        all.extend_from_slice(args);
        try_run("nsenter", &all)
    }

    /// Run a program inside the namespace; `Ok(stdout)` or `Err(stderr)`.
    pub fn try_run(&self, program: &str, args: &[&str]) -> Result<String, String> {
        let mut all = vec!["exec", self.name.as_str(), program];
        all.extend_from_slice(args);
        self.netns(&all)
    }

    /// Run a program inside the namespace; panic on failure.
    pub fn run(&self, program: &str, args: &[&str]) -> String {
        self.try_run(program, args)
            .unwrap_or_else(|e| panic!("{program} {} in {}: {e}", args.join(" "), self.name))
    }

    /// One ping to `ip` with a 1 s deadline.
    pub fn ping_once(&self, ip: &str) -> bool {
        self.try_run("ping", &["-n", "-c", "1", "-W", "1", ip])
            .is_ok()
    }
}

impl Drop for NodeNetns {
    fn drop(&mut self) {
        let _ = self.netns(&["del", &self.name]);
    }
}

/// The roam-cni binary of this checkout (`cargo build -p roam-cni` builds it; CI builds the
/// whole workspace first). Panics when it is missing or older than a source it was built from
/// (per cargo's dep-info), except while the thread is already panicking (cleanup).
pub fn cni_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("the test's own path");
    // target/<profile>/deps/<test> → target/<profile>/roam-cni
    let bin = exe
        .parent()
        .and_then(|d| d.parent())
        .expect("target/<profile>")
        .join("roam-cni");
    if std::thread::panicking() {
        return bin;
    }
    let built = std::fs::metadata(&bin)
        .and_then(|m| m.modified())
        .unwrap_or_else(|e| {
            panic!(
                "{}: {e}; build it first: cargo build -p roam-cni",
                bin.display()
            )
        });
    // "target/debug/roam-cni: src1 src2 ..." (paths with spaces are escaped with '\ ')
    let dep_info = std::fs::read_to_string(bin.with_extension("d")).unwrap_or_default();
    let sources = dep_info
        .lines()
        .next()
        .and_then(|l| l.split_once(": "))
        .map(|(_, deps)| deps.replace("\\ ", "\u{0}"))
        .unwrap_or_default();
    for src in sources.split_whitespace().map(|s| s.replace('\u{0}', " ")) {
        if let Ok(m) = std::fs::metadata(&src).and_then(|m| m.modified()) {
            assert!(
                m <= built,
                "{} is older than {src}: rebuild it with cargo build -p roam-cni",
                bin.display()
            );
        }
    }
    bin
}

/// What a CNI plugin printed and returned.
#[derive(Debug)]
pub struct CniOutput {
    /// Exit status.
    pub status: i32,
    /// stdout.
    pub stdout: String,
    /// stderr.
    pub stderr: String,
}

impl CniOutput {
    /// stdout as JSON; panics naming the output when it is not.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("CNI output is not JSON ({e}): {self:?}"))
    }
}

/// Run the roam-cni binary as a container runtime does: inside `node`'s network and mount
/// namespaces, with exactly the environment `env` (nothing inherited) and `stdin`.
pub fn invoke_cni(lab: &Lab, node: &str, env: &[(&str, &str)], stdin: &str) -> CniOutput {
    use std::io::Write;
    use std::process::Stdio;
    let pid = holder_pid(lab, node);
    let bin = cni_binary();
    let mut child = Command::new("nsenter")
        .args(["-t", &pid, "-m", "-n", "--"])
        .arg(&bin)
        .env_clear()
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run roam-cni");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin.as_bytes())
        .expect("write the config");
    let out = child.wait_with_output().expect("wait for roam-cni");
    CniOutput {
        status: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// A pod that no kubelet runs (its nodeSelector matches no node), carrying the
/// `roam.dev/addresses` annotation `addresses` when given: what roam-cni reads.
pub fn unscheduled_pod(name: &str, addresses: Option<&str>) -> serde_json::Value {
    let mut annotations = serde_json::Map::new();
    if let Some(a) = addresses {
        annotations.insert(
            roam_contract::keys::ADDRESSES.into(),
            serde_json::Value::String(a.into()),
        );
    }
    serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "nodeSelector": {"roam.dev/e2e-no-such-node": "true"},
            "containers": [{"name": "c", "image": "lab.local/busybox:1.35", "imagePullPolicy": "Never"}],
        },
    })
}
/// A `roam-controller` process started by a test, killed when dropped. Its log goes to a
/// file under the lab directory; [`ControllerProcess::log_tail`] shows the end of it (a test
/// prints it on failure).
pub struct ControllerProcess {
    /// The child process.
    pub child: std::process::Child,
    /// Its log file.
    pub log: PathBuf,
    /// Its metrics address (`127.0.0.1:PORT`).
    pub metrics: String,
}

impl ControllerProcess {
    /// The `roam-controller` binary: `$ROAM_CONTROLLER_BIN`, else the workspace's debug build
    /// (built now if missing or stale: `cargo build -p roam-migrator --bin roam-controller`).
    pub fn binary() -> PathBuf {
        if let Ok(p) = std::env::var("ROAM_CONTROLLER_BIN") {
            return PathBuf::from(p);
        }
        workspace_binary("roam-migrator", "roam-controller")
    }

    /// Start roam-controller against the lab's API server and NB (TCP), metrics on
    /// `127.0.0.1:<metrics_port>`, with `args` added (e.g. `--network-selector`,
    /// `--leader-elect false`). `name` names the log file.
    pub fn start(lab: &Lab, name: &str, metrics_port: u16, args: &[&str]) -> ControllerProcess {
        Self::start_binary(&Self::binary(), lab, name, metrics_port, args)
    }

    /// [`ControllerProcess::start`] with a given binary (no build check: a quick restart).
    pub fn start_binary(
        binary: &std::path::Path,
        lab: &Lab,
        name: &str,
        metrics_port: u16,
        args: &[&str],
    ) -> ControllerProcess {
        Self::start_binary_env(binary, lab, name, metrics_port, args, &[])
    }

    /// [`ControllerProcess::start_binary`] with `env` added to its environment (e.g.
    /// `ROAM_FAILPOINT`).
    pub fn start_binary_env(
        binary: &std::path::Path,
        lab: &Lab,
        name: &str,
        metrics_port: u16,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> ControllerProcess {
        let log = lab.dir().join(format!("{name}.log"));
        let file = std::fs::File::create(&log).expect("create the controller log");
        let metrics = format!("127.0.0.1:{metrics_port}");
        let child = Command::new(binary)
            .args([
                "--kubeconfig",
                lab.kubeconfig(),
                "--nb",
                lab.nb_tcp(),
                "--metrics-addr",
                &metrics,
                "--identity",
                name,
            ])
            .args(args)
            .env("RUST_LOG", "info,roam_migrator=debug,kube=warn")
            .env("NO_COLOR", "1")
            .envs(env.iter().copied())
            .stdout(file.try_clone().expect("dup log"))
            .stderr(file)
            .spawn()
            .expect("start roam-controller");
        ControllerProcess {
            child,
            log,
            metrics,
        }
    }

    /// The last `n` lines of its log.
    pub fn log_tail(&self, n: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// Its whole log.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// GET its `/metrics`.
    pub fn scrape(&self) -> Option<String> {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(&self.metrics).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).ok()?;
        out.split_once("\r\n\r\n").map(|(_, b)| b.to_string())
    }

    /// Its resident set size in KiB, from `/proc/PID/status`.
    pub fn rss_kib(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).ok()?;
        status
            .lines()
            .find(|l| l.starts_with("VmRSS:"))?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    }

    /// Kill it now (SIGKILL: no graceful shutdown, as a crash would).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ControllerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A VLAN wire with a ToR for lab tests: physical network `physnet` mapped to `bridge` on
/// both nodes ([`BridgeMapping`]), the two bridges joined by a veth pair (`wire`: node-a's
/// end, node-b's end), and a ToR namespace (`TestNetns`) holding one access port per VLAN —
/// an internal port of node-b's bridge tagged with the VLAN, moved into the namespace and
/// given its address. What a leftover of a killed run left is removed first; everything is
/// removed on drop.
pub struct VlanTor {
    /// The ToR's namespace (its access ports are named as given to [`VlanTor::new`]).
    pub tor: TestNetns,
    lab: Lab,
    bridge: String,
    wire: (String, String),
    ports: Vec<String>,
    _mappings: Vec<BridgeMapping>,
}

impl VlanTor {
    /// Set it up; `vlans` lists (access port name ≤ 15 characters, VLAN tag, the ToR's
    /// `address/len` on it).
    pub fn new(
        lab: &Lab,
        physnet: &str,
        bridge: &str,
        wire: (&str, &str),
        tor_suffix: &str,
        vlans: &[(&str, u16, &str)],
    ) -> VlanTor {
        let (a, b) = (lab.node("node-a"), lab.node("node-b"));
        let ports: Vec<String> = vlans.iter().map(|(p, _, _)| p.to_string()).collect();
        Self::remove(lab, bridge, (wire.0, wire.1), &ports);
        let mappings = vec![
            BridgeMapping::add(lab, &a, physnet, bridge),
            BridgeMapping::add(lab, &b, physnet, bridge),
        ];
        run(
            "ip",
            &[
                "link", "add", wire.0, "netns", &a.netns, "type", "veth", "peer", "name", wire.1,
                "netns", &b.netns,
            ],
        );
        for (node, end) in [(&a, wire.0), (&b, wire.1)] {
            run("ip", &["-n", &node.netns, "link", "set", end, "up"]);
            vsctl(node, &["--may-exist", "add-port", bridge, end]);
        }
        let tor = TestNetns::new(tor_suffix);
        for (port, tag, addr) in vlans {
            vsctl(
                &b,
                &[
                    "--may-exist",
                    "add-port",
                    bridge,
                    port,
                    &format!("tag={tag}"),
                    "--",
                    "set",
                    "interface",
                    port,
                    "type=internal",
                ],
            );
            wait_until(Duration::from_secs(20), "the ToR port to appear", || {
                try_run("ip", &["-n", &b.netns, "link", "show", port]).ok()
            });
            run(
                "ip",
                &["-n", &b.netns, "link", "set", port, "netns", &tor.name],
            );
            tor.run("ip", &["addr", "add", addr, "dev", port]);
            tor.run("ip", &["link", "set", port, "up"]);
        }
        VlanTor {
            tor,
            lab: lab.clone(),
            bridge: bridge.into(),
            wire: (wire.0.into(), wire.1.into()),
            ports,
            _mappings: mappings,
        }
    }

    fn remove(lab: &Lab, bridge: &str, wire: (&str, &str), ports: &[String]) {
        let (a, b) = (lab.node("node-a"), lab.node("node-b"));
        let db = format!("--db={}", b.ovs_db);
        for p in ports {
            let _ = try_run("ovs-vsctl", &[&db, "--if-exists", "del-port", bridge, p]);
        }
        let _ = try_run("ip", &["-n", &a.netns, "link", "del", wire.0]);
        let _ = try_run("ip", &["-n", &b.netns, "link", "del", wire.1]);
    }
}

impl Drop for VlanTor {
    fn drop(&mut self) {
        // the ports and the wire here; the namespace and the bridges (mappings) as fields
        Self::remove(
            &self.lab,
            &self.bridge,
            (&self.wire.0, &self.wire.1),
            &self.ports,
        );
    }
}
