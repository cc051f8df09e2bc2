//! roam-shim on the lab: the VM a shim test describes, the shim process in a node, and the
//! overlay network its VM sits on.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::{Duration, Instant};

pub use roam_shim_api::launch::Mode;
use roam_shim_api::launch::{
    self, LaunchArgs, LaunchBoot, LaunchNic, LaunchToken, Migration, MigrationUri, OvsDb,
};

use crate::fixtures::VmCleanup;
use crate::lab::{Lab, node_command, try_run};
use crate::ovn::{nbctl, reconcile_on_lab};

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
    /// The launch arguments for `vm` on `node`, serving on `port`, in `mode`.
    pub fn launch_args(lab: &Lab, vm: &ShimVm, node: &str, port: u16, mode: Mode) -> LaunchArgs {
        let n = lab.node(node);
        let libvirt = lab.test_libvirt(node);
        let (kernel, initrd) = lab.guest();
        let ip: IpAddr = n.ip.parse().expect("the node's IP");
        LaunchArgs {
            name: vm.name.clone(),
            vcpus: 1,
            memory_mib: 256,
            boot: LaunchBoot::Kernel {
                kernel: kernel.into(),
                initrd: Some(initrd.into()),
                cmdline: "console=ttyS0 quiet panic=-1".into(),
            },
            nics: vec![LaunchNic {
                mac: vm.mac.parse().expect("the VM's MAC"),
                tap: vm.tap.clone(),
                ovn_port: vm.ovn_port.clone(),
            }],
            serial_log: vm.serial_log(),
            node: node.into(),
            // the node's test libvirtd (a pod of the launcher image), and the node's OVS as
            // a launcher pod with hostPath /run/openvswitch reaches it
            libvirt_uri: libvirt.node_uri,
            ovs_db: OvsDb::node(),
            // how the other node's libvirtd reaches this one (peer-to-peer migration): over
            // the node network, as between two hosts
            migration: Migration::Plain {
                peer_libvirt_uri: libvirt.peer_uri,
                migration_uri: MigrationUri::tcp(n.ip.clone()).expect("the node's IP"),
            },
            bridge: launch::DEFAULT_BRIDGE.into(),
            listen: SocketAddr::new(ip, port),
            token: LaunchToken::File(vm.token_file()),
            state_file: vm.dir.join(format!("{node}.state.json")),
            mode,
            kvm: false,
            instance: None,
            image_root: None,
            pki_dir: None,
        }
    }

    /// The command line of [`ShimProcess::launch_args`].
    pub fn args(lab: &Lab, vm: &ShimVm, node: &str, port: u16, mode: Mode) -> Vec<String> {
        Self::launch_args(lab, vm, node, port, mode).to_args()
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
    pub fn start(lab: &Lab, vm: &ShimVm, node: &str, port: u16, mode: Mode) -> ShimProcess {
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

impl ShimVm {
    /// The guard that removes this VM from the lab: its domain and tap on both nodes and its
    /// state files; a killed run's leftovers are removed now. Also creates the VM's directory
    /// and token file. Start the shims after it, so that they stop before it cleans.
    pub fn cleanup(&self, lab: &Lab) -> VmCleanup {
        let guard = VmCleanup::new(lab)
            .vm(&self.name, &[&self.tap])
            .path(self.dir.join("node-a.state.json"))
            .path(self.dir.join("node-b.state.json"))
            .cleaned();
        std::fs::create_dir_all(&self.dir).expect("create the VM's directory");
        std::fs::write(self.token_file(), format!("{}\n", self.token)).expect("write the token");
        let _ = std::fs::remove_file(self.serial_log());
        guard
    }
}
