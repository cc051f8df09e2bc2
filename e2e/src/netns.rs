//! Network namespaces owned by a test: on the host (`TestNetns`, plugged into OVN with
//! [`plug_netns`]) or inside a node's mount namespace as a runtime creates a pod's (`NodeNetns`).

use std::path::PathBuf;
use std::time::Duration;

use crate::lab::{Lab, Node, holder_pid, run, try_run, wait_until};
use crate::ovn::vsctl;

/// A network namespace owned by a test, deleted when dropped. Names start with `roam-t-`
/// so that `e2e/lab down` removes any a killed test left behind.
#[derive(Debug)]
pub struct TestNetns {
    /// The namespace name.
    pub name: String,
    /// A running pod's own namespace (see [`TestNetns::of_pod`]): dropping the name leaves
    /// the namespace and the pod's processes alone.
    pod: bool,
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
        TestNetns { name, pod: false }
    }

    /// The network namespace of the running pod `ns/pod` on a lab node — as roam-cni plumbed
    /// it — named `roam-t-<suffix>` for `ip netns exec` (a bind mount of the namespace of one
    /// of the pod's processes, found through the pod's cgroup on its node). The host's tools
    /// run in it (ping, python3) as in a test's own namespace.
    pub fn of_pod(lab: &Lab, ns: &str, pod: &str, suffix: &str) -> TestNetns {
        // Running: its sandbox is plumbed and its containers started
        let p: serde_json::Value = wait_until(
            Duration::from_secs(120),
            &format!("pod {ns}/{pod} Running"),
            || {
                let out =
                    crate::lab::try_kubectl(lab, &["-n", ns, "get", "pod", pod, "-o", "json"])
                        .ok()?;
                let p: serde_json::Value = serde_json::from_str(&out).ok()?;
                (p["status"]["phase"] == "Running").then_some(p)
            },
        );
        let uid = p["metadata"]["uid"]
            .as_str()
            .expect("a pod's uid")
            .to_string();
        let node = p["spec"]["nodeName"]
            .as_str()
            .unwrap_or_else(|| panic!("pod {ns}/{pod} is not scheduled"))
            .to_string();
        let pid = wait_until(
            Duration::from_secs(120),
            &format!("a running process of pod {ns}/{pod} on {node}"),
            || pod_pid(&node, &uid),
        );
        let name = format!("roam-t-{suffix}");
        let _ = try_run("ip", &["netns", "del", &name]);
        run("ip", &["netns", "attach", &name, &pid]);
        TestNetns { name, pod: true }
    }

    /// Run a program inside the namespace; panic on failure.
    pub fn run(&self, program: &str, args: &[&str]) -> String {
        let program = crate::lab::tool(program);
        let mut all = vec!["netns", "exec", self.name.as_str(), &program];
        all.extend_from_slice(args);
        run("ip", &all)
    }

    /// Run a program inside the namespace; `Ok(stdout)` or `Err(stderr)`.
    pub fn try_run(&self, program: &str, args: &[&str]) -> Result<String, String> {
        let program = crate::lab::tool(program);
        let mut all = vec!["netns", "exec", self.name.as_str(), &program];
        all.extend_from_slice(args);
        try_run("ip", &all)
    }

    /// One ping to `ip` with a 1 s deadline.
    pub fn ping_once(&self, ip: &str) -> bool {
        self.try_run("ping", &["-n", "-c", "1", "-W", "1", ip])
            .is_ok()
    }

    /// Panics unless `eth0` here is plumbed as roam-cni plumbs an overlay interface: `ip`/32,
    /// and the default route via `gw` on it.
    pub fn assert_overlay_eth0(&self, ip: &str, gw: &str) {
        let shown = self.run("ip", &["-4", "-o", "addr", "show", "eth0"]);
        assert!(
            shown.contains(&format!("inet {ip}/32")),
            "{}: eth0 carries the published address {ip}: {shown}",
            self.name
        );
        let routes = self.run("ip", &["-4", "route", "show"]);
        assert!(
            routes.contains(&format!("default via {gw} dev eth0")),
            "{}: the default route is the Network's gateway {gw}: {routes}",
            self.name
        );
    }

    /// Three pings to `ip` of `size` bytes on the wire (IP header included), with Don't
    /// Fragment set (each with a 2 s deadline): how many came back, or `Err` with ping's
    /// output when not all three left this namespace (e.g. larger than its interface's MTU).
    pub fn df_pings(&self, ip: &str, size: u16) -> Result<usize, String> {
        let payload = (size - 28).to_string();
        // ping exits 1 when nothing came back: its summary is on stdout either way
        let out = std::process::Command::new("ip")
            .args(["netns", "exec", &self.name, "ping", "-n", "-M", "do", "-s"])
            .args([payload.as_str(), "-c", "3", "-W", "2", ip])
            .output()
            .map(|o| {
                String::from_utf8_lossy(&o.stdout).into_owned()
                    + &String::from_utf8_lossy(&o.stderr)
            })
            .unwrap_or_else(|e| e.to_string());
        let field = |suffix: &str| -> Option<usize> {
            out.split([',', '\n'])
                .find_map(|f| f.trim().strip_suffix(suffix))
                .and_then(|n| n.trim().trim_start_matches('+').parse().ok())
        };
        if field(" packets transmitted") != Some(3) || field(" errors").is_some() {
            return Err(out);
        }
        Ok(field(" received").unwrap_or(0))
    }

    /// Send `bytes` bytes in one go to the TCP echo service at `ip`:7 and read them back:
    /// `Ok(())` when every byte came back in order (a bulk transfer: full-size segments
    /// both ways).
    pub fn bulk_echo(&self, ip: &str, bytes: usize) -> Result<(), String> {
        const SCRIPT: &str = r#"
import socket, sys, threading
n = int(sys.argv[2]); data = bytes((i * 7 + 3) & 0xff for i in range(n))
s = socket.create_connection((sys.argv[1], 7), timeout=20)
threading.Thread(target=lambda: s.sendall(data), daemon=True).start()
got = bytearray()
while len(got) < n:
    b = s.recv(65536)
    if not b: break
    got += b
print("echoed", len(got), "of", n, "intact" if bytes(got) == data else "CORRUPT")
sys.exit(0 if bytes(got) == data else 1)
"#;
        self.try_run("python3", &["-c", SCRIPT, ip, &bytes.to_string()])
            .map(|_| ())
    }
}

impl Drop for TestNetns {
    fn drop(&mut self) {
        // whatever a test left running in it (a DHCP client daemon, a pinger) goes with it;
        // a pod's own processes stay
        if let Ok(pids) = try_run("ip", &["netns", "pids", &self.name]) {
            for pid in pids.split_whitespace() {
                let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup"));
                if self.pod && cgroup.is_ok_and(|c| c.contains("/kubepods")) {
                    continue;
                }
                let _ = try_run("kill", &["-9", pid]);
            }
        }
        let _ = try_run("ip", &["netns", "del", &self.name]);
        let _ = std::fs::remove_dir_all(PathBuf::from("/etc/netns").join(&self.name));
    }
}

/// A process of the pod with `uid` on `node`: the first in its cgroup (pids hierarchy, under
/// the node's kubelet's cgroupRoot `/<node>`).
fn pod_pid(node: &str, uid: &str) -> Option<String> {
    fn find(dir: &std::path::Path, want: &str) -> Option<PathBuf> {
        for e in std::fs::read_dir(dir).ok()?.flatten() {
            let path = e.path();
            if !path.is_dir() {
                continue;
            }
            if e.file_name().to_string_lossy() == want {
                return Some(path);
            }
            if let Some(found) = find(&path, want) {
                return Some(found);
            }
        }
        None
    }
    let pod_dir = find(
        &PathBuf::from(format!("/sys/fs/cgroup/pids/{node}/kubepods")),
        &format!("pod{uid}"),
    )?;
    std::fs::read_dir(pod_dir).ok()?.flatten().find_map(|c| {
        let procs = std::fs::read_to_string(c.path().join("cgroup.procs")).ok()?;
        procs.split_whitespace().next().map(str::to_string)
    })
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
        let program = crate::lab::tool(program);
        let mut all = vec!["exec", self.name.as_str(), &program];
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
