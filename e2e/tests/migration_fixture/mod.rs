//! Shared by the lab_migration tests and the migration benchmark: a Network, a VirtualMachine
//! booted by the installed roam (e2e/deploy/lab: the roam-controller Deployment `e2e/lab up`
//! applies) in a real launcher pod on node-a, a client namespace on OVN that pings it, and the
//! helpers to migrate it and stream TCP to it.
#![allow(dead_code)]

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use roam_e2e::{Installed, Lab, LabNetwork, TestNetns, VmCleanup, wait_until};
pub use roam_e2e::{apply_crds, kubectl, try_kubectl};
use serde_json::{Value, json};

/// The names and address blocks of one fixture, so that several can share the lab.
#[derive(Clone, Copy, Debug)]
pub struct Names {
    /// Kubernetes namespace (VMs, migrations, pods).
    pub ns: &'static str,
    /// The Network.
    pub net: &'static str,
    /// The VirtualMachine.
    pub vm: &'static str,
    /// The overlay subnet and its gateway.
    pub subnet: &'static str,
    pub gw: &'static str,
    /// The transit subnet.
    pub transit: &'static str,
    /// The name under which the client pod's network namespace is reachable (`roam-t-<cli>`).
    pub cli: &'static str,
}

/// The lab_migration test's and the migration benchmark's names.
pub const H8: Names = Names {
    ns: "h8-mig",
    net: "h8mig",
    vm: "h8vm",
    subnet: "100.150.0.0/24",
    gw: "100.150.0.1",
    transit: "169.254.150.0/24",
    cli: "h8cli",
};

pub const NS: &str = H8.ns;
pub const VM: &str = H8.vm;
pub const LONG: Duration = Duration::from_secs(120);

pub fn get(lab: &Lab, args: &[&str]) -> Option<Value> {
    let mut all = args.to_vec();
    all.extend_from_slice(&["-o", "json"]);
    serde_json::from_str(&try_kubectl(lab, &all).ok()?).ok()
}

/// `kubectl create` of `objects` (one List manifest).
pub fn create(lab: &Lab, objects: &[Value]) {
    let list = json!({"apiVersion": "v1", "kind": "List", "items": objects});
    roam_e2e::kubectl_manifest(lab, "create", &list)
        .unwrap_or_else(|e| panic!("kubectl create: {e}"));
}

/// Where the installed roam's launchers write VM logs, on every node (its --vm-log-dir).
pub const VM_LOG_DIR: &str = "/var/log/roam/vms";

/// The guest's serial log: what each node's QEMU wrote of it (node-a's, then node-b's), read
/// from the node's own disk.
pub fn serial(lab: &Lab, n: &Names) -> String {
    roam_e2e::node_files(lab, &format!("{VM_LOG_DIR}/{}_{}.serial.log", n.ns, n.vm))
}

/// The guest's eth0 MTU, as its init reports it over HTTP (`/mtu`, refreshed every second).
pub fn guest_mtu(cli_ns: &TestNetns, ip: &str) -> Option<u16> {
    cli_ns
        .try_run("curl", &["-fsS", "-m", "3", &format!("http://{ip}/mtu")])
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Everything the test creates: the namespace (VMs, migrations — finalizers dropped —, pods,
/// Secrets), the Network and its Addresses, the VM's domain and tap on both nodes, its logs;
/// removed first (a killed run's leftovers) and on drop.
pub struct Fixture {
    _cleanup: VmCleanup,
}

impl Fixture {
    pub fn new(lab: &Lab, n: &Names) -> Fixture {
        // a launcher killed without its shim's shutdown leaves the tap and its OVS port
        let tap = roam_core::vm::tap_name(&format!("{}/{}", n.ns, n.vm));
        let cleanup = VmCleanup::new(lab)
            .namespace(n.ns)
            .network(n.net)
            .vm(&format!("{}_{}", n.ns, n.vm), &[&tap])
            .node_path(&format!("{VM_LOG_DIR}/{}_{}.serial.log", n.ns, n.vm))
            .cleaned();
        apply_crds(lab);
        kubectl(lab, &["create", "namespace", n.ns]);
        Fixture { _cleanup: cleanup }
    }
}

/// Migration `name`'s `status.switchoverMs` (the pause → the target activated the VM's ports,
/// patched in by a task of its own), waiting up to 30 s for it to appear.
pub fn switchover_ms(lab: &Lab, ns: &str, name: &str) -> Option<u64> {
    let until = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let ms = get(lab, &["-n", ns, "get", "vmim", name])
            .and_then(|m| m["status"]["switchoverMs"].as_u64());
        if ms.is_some() || std::time::Instant::now() > until {
            return ms;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

pub fn vm(lab: &Lab, n: &Names) -> Value {
    get(lab, &["-n", n.ns, "get", "vm", n.vm]).expect("the VM")
}

pub fn migrations(lab: &Lab, n: &Names) -> Vec<Value> {
    get(
        lab,
        &[
            "-n",
            n.ns,
            "get",
            "vmim",
            "-l",
            &format!("roam.dev/vm={}", n.vm),
        ],
    )
    .and_then(|l| l["items"].as_array().cloned())
    .unwrap_or_default()
}

/// The Events about object `name` in the fixture's namespace (type, reason, message, note).
pub fn events_of(lab: &Lab, n: &Names, name: &str) -> String {
    events_in(lab, n.ns, name)
}

/// The Events about object `name` in namespace `ns` (type, reason, message, note).
pub fn events_in(lab: &Lab, ns: &str, name: &str) -> String {
    try_kubectl(
        lab,
        &[
            "-n",
            ns,
            "get",
            "events",
            "--field-selector",
            &format!("involvedObject.name={name}"),
            "-o",
            "custom-columns=T:.type,R:.reason,M:.message,N:.note",
        ],
    )
    .unwrap_or_default()
}

/// [`migrate_in`] the H8 fixture.
pub fn migrate(lab: &Lab, to: &str) -> Value {
    migrate_in(lab, &H8, to)
}

/// Annotate and wait for the new migration to end; returns it.
pub fn migrate_in(lab: &Lab, n: &Names, to: &str) -> Value {
    let before: Vec<String> = migrations(lab, n)
        .iter()
        .map(|m| m["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    kubectl(
        lab,
        &[
            "-n",
            n.ns,
            "annotate",
            "vm",
            n.vm,
            &format!("roam.dev/migrate-to={to}"),
        ],
    );
    wait_until(LONG, "the migration to end", || {
        let m = migrations(lab, n)
            .into_iter()
            .find(|m| !before.contains(&m["metadata"]["name"].as_str().unwrap().to_string()))?;
        let phase = m["status"]["phase"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        ["Succeeded", "Failed", "Aborted"]
            .contains(&phase.as_str())
            .then_some(m)
    })
    .pipe(|m| {
        assert!(
            vm(lab, n)["metadata"]["annotations"]["roam.dev/migrate-to"].is_null(),
            "the annotation is removed"
        );
        m
    })
}

pub trait Pipe: Sized {
    fn pipe<T>(self, f: impl FnOnce(Self) -> T) -> T {
        f(self)
    }
}
impl<T> Pipe for T {}

/// A TCP echo stream from the client namespace to the guest's port 7: one line every 10 ms,
/// every line must come back; `stop` says how many bytes went both ways and whether it broke.
pub struct Stream {
    child: Child,
}

pub const STREAM_PY: &str = r#"
import socket, sys, time, os
s = socket.create_connection((sys.argv[1], 7), timeout=5)
s.settimeout(30)
stop = sys.argv[2]
sent = got = 0
f = s.makefile('rb')
i = 0
try:
    while not os.path.exists(stop):
        line = b'roam %08d\n' % i
        s.sendall(line); sent += len(line)
        back = f.readline()
        if back != line:
            print('BROKEN mismatch', sent, got, flush=True); sys.exit(1)
        got += len(back); i += 1
        if i == 1: print('CONNECTED', flush=True)
        time.sleep(0.01)
except Exception as e:
    print('BROKEN', type(e).__name__, e, sent, got, flush=True); sys.exit(1)
print('OK', sent, got, flush=True)
"#;

impl Stream {
    pub fn start(lab: &Lab, ns: &TestNetns, ip: &str) -> (Stream, std::path::PathBuf) {
        let stop = lab
            .dir()
            .join(format!("h8-stream-stop-{}", std::process::id()));
        let _ = std::fs::remove_file(&stop);
        let mut child = Command::new("ip")
            .args([
                "netns",
                "exec",
                &ns.name,
                "python3",
                "-c",
                STREAM_PY,
                ip,
                stop.to_str().unwrap(),
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the TCP stream");
        let mut line = String::new();
        BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .expect("stream output");
        assert_eq!(
            line.trim(),
            "CONNECTED",
            "the TCP stream connects to the guest"
        );
        (Stream { child }, stop)
    }

    pub fn stop(mut self, stop: &std::path::Path) -> String {
        std::fs::File::create(stop)
            .and_then(|mut f| f.write_all(b"x"))
            .expect("stop file");
        use std::io::Read;
        let mut out = String::new();
        if let Some(mut o) = self.child.stdout.take() {
            let _ = o.read_to_string(&mut out);
        }
        let _ = self.child.wait();
        let _ = std::fs::remove_file(stop);
        out.trim().to_string()
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let _ = self.child.kill();
    }
}

/// Everything [`boot`] set up; dropped in this order.
pub struct Booted {
    /// The client pod's network namespace (roam-cni plumbed it on node-a).
    pub cli_ns: TestNetns,
    /// The installed roam-controller.
    pub ctl: Installed,
    /// The Kubernetes objects.
    pub fixture: Fixture,
    /// The Network's OVN rows.
    pub ovn: LabNetwork,
    /// The guest's IP, MAC and Address name.
    pub ip: String,
    pub mac: String,
    pub addr: String,
    /// The fixture's names.
    pub n: Names,
}

/// [`boot_with`] the H8 names.
/// A string the guest holds in memory (on its kernel command line, also in the domain's
/// XML): a capture of the node link during a migration must not contain it.
pub const GUEST_MARKER: &str = "roam-guest-secret-4b1d9e";

pub fn boot(lab: &Lab) -> Booted {
    boot_with(lab, &H8)
}

/// Create the Network and the VM (on node-a) for the installed roam, wait for the VM to run
/// and take its lease, plumb a client on node-a and wait until it pings the guest.
pub fn boot_with(lab: &Lab, n: &Names) -> Booted {
    let lab = lab.clone();
    let Names {
        ns, net, vm: vmn, ..
    } = *n;
    let ovn = LabNetwork::new(&lab, net, &[]);
    let fixture = Fixture::new(&lab, n);
    let ctl = Installed::get(&lab);
    let (kernel, initrd) = lab.guest();
    create(
        &lab,
        &[
            json!({"apiVersion": "roam.dev/v1alpha1", "kind": "Network",
                   "metadata": {"name": net},
                   "spec": {"subnet": n.subnet, "transitSubnet": n.transit,
                            "poolSizePerNode": 2, "namespaces": [ns]}}),
            json!({"apiVersion": "roam.dev/v1alpha1", "kind": "VirtualMachine",
                   "metadata": {"name": vmn, "namespace": ns},
                   "spec": {"cpu": 1, "memoryMiB": 256, "node": "node-a",
                            "boot": {"kernel": {"kernel": kernel, "initrd": initrd,
                                                "cmdline": format!("console=ttyS0 loglevel=5 panic=-1 roam_marker={GUEST_MARKER}")}}}}),
        ],
    );
    let status = wait_until(LONG, "the VM Running on node-a", || {
        let v = vm(&lab, n);
        (v["status"]["phase"] == "Running").then(|| v["status"].clone())
    });
    assert_eq!(status["node"], "node-a", "{status}");
    let ip = status["interfaces"][0]["ip"]
        .as_str()
        .expect("an IP")
        .to_string();
    let mac = status["interfaces"][0]["mac"]
        .as_str()
        .expect("a MAC")
        .to_string();
    let addr = status["interfaces"][0]["address"]
        .as_str()
        .expect("its Address")
        .to_string();
    let src_pod = status["pod"].as_str().unwrap().to_string();
    let pod = get(&lab, &["-n", ns, "get", "pod", &src_pod]).expect("the launcher pod");
    assert_eq!(pod["spec"]["nodeName"], "node-a");
    assert!(
        pod["spec"]["hostNetwork"].is_null(),
        "the VM's pod is an ordinary pod"
    );
    assert_eq!(
        pod["status"]["phase"], "Running",
        "started by the real kubelet"
    );
    // its runner runs the VM, in roam-system, on the same node, host-networked
    let (rns, rname) = roam_e2e::runner_of_launcher(&lab, ns, &src_pod);
    assert_eq!(rns, roam_e2e::RUNNER_NAMESPACE, "a runner runs the VM");
    let runner = get(&lab, &["-n", &rns, "get", "pod", &rname]).expect("the runner");
    assert_eq!(runner["spec"]["nodeName"], "node-a");
    assert_eq!(runner["spec"]["hostNetwork"], true);
    assert_eq!(runner["status"]["phase"], "Running");
    wait_until(LONG, "the guest's /32 lease from OVN (serial log)", || {
        let s = serial(&lab, n);
        (s.contains(&format!("lease of {ip} obtained")) && s.contains("ROAM-GUEST-SERVICES-UP"))
            .then_some(())
    });

    // the same console in `kubectl logs` of the launcher pod (its console container)
    wait_until(LONG, "the guest's console in kubectl logs", || {
        let logs = try_kubectl(&lab, &["-n", ns, "logs", &src_pod]).ok()?;
        (logs.contains(&format!("lease of {ip} obtained"))
            && logs.contains("ROAM-GUEST-SERVICES-UP"))
        .then_some(())
    });

    // a client on node-a: a pod roam-cni (the node's CNI) plumbed with its address
    create(&lab, &[roam_e2e::sleeper_pod(ns, "client", "node-a")]);
    let cli = wait_until(LONG, "the client's address", || {
        let p = get(&lab, &["-n", ns, "get", "pod", "client"])?;
        let a: Vec<Value> =
            serde_json::from_str(p["metadata"]["annotations"]["roam.dev/addresses"].as_str()?)
                .ok()?;
        a.first().cloned()
    });
    let cli_ns = TestNetns::of_pod(&lab, ns, "client", n.cli);
    cli_ns.assert_overlay_eth0(cli["ip"].as_str().unwrap(), n.gw);
    wait_until(LONG, "the client pings the guest", || {
        cli_ns.ping_once(&ip).then_some(())
    });
    Booted {
        cli_ns,
        ctl,
        fixture,
        ovn,
        ip,
        mac,
        addr,
        n: *n,
    }
}

/// The state that explains a guest that does not answer: its Address, its OVN rows, its
/// serial log's tail (and how many times the guest booted: its init's marker — the kernel's
/// banner is below the fixture's loglevel).
pub fn network_report(lab: &Lab, b: &Booted) -> String {
    let addr = try_kubectl(lab, &["get", "address", &b.addr, "-o", "json"]).unwrap_or_else(|e| e);
    let serial = serial(lab, &b.n);
    let boots = roam_e2e::guest_boots(&serial);
    let tail: Vec<&str> = serial.lines().rev().take(20).collect();
    let tail: Vec<&str> = tail.into_iter().rev().collect();
    format!(
        "--- Address {}:\n{addr}\n--- OVN rows for {} / {}:\n{}--- serial log ({boots} boot(s)), last lines:\n{}\n",
        b.addr,
        b.mac,
        b.ip,
        roam_e2e::ovn_rows_about(lab, &[&b.mac, &b.ip]),
        tail.join("\n")
    )
}
