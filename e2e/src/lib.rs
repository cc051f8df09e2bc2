//! Helpers for roam's lab-backed tests: where the lab's parts are, running tools, waiting on
//! conditions, and test network namespaces that clean up after themselves.
//!
//! Every test here needs the lab (`e2e/lab up`). Without it a test fails loudly and says
//! how to start it; it never skips.

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
        let client = roam_network::ovsdb::Client::connect(lab.nb())
            .await
            .expect("connect to the lab's NB");
        roam_network::topology::reconcile(&client, network, topology)
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
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .current_dir(&root)
            .args([
                "build",
                "-q",
                "-p",
                "roam-migrator",
                "--bin",
                "roam-controller",
            ])
            .status()
            .expect("run cargo build for roam-controller");
        assert!(status.success(), "building roam-controller failed");
        let target = std::env::var("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|_| root.join("target"));
        target.join("debug").join("roam-controller")
    }

    /// Start roam-controller against the lab's API server and NB (TCP), metrics on
    /// `127.0.0.1:<metrics_port>`, with `args` added (e.g. `--network-selector`,
    /// `--leader-elect false`). `name` names the log file.
    pub fn start(lab: &Lab, name: &str, metrics_port: u16, args: &[&str]) -> ControllerProcess {
        let log = lab.dir().join(format!("{name}.log"));
        let file = std::fs::File::create(&log).expect("create the controller log");
        let metrics = format!("127.0.0.1:{metrics_port}");
        let child = Command::new(Self::binary())
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
