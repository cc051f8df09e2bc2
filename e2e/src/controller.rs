//! roam-controller started by a test against the lab.

use std::path::PathBuf;
use std::process::Command;

use std::time::Duration;

use crate::lab::{Lab, workspace_binary};

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
                "--sb",
                lab.sb_tcp(),
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
        self.get("/metrics").map(|(_, body)| body)
    }

    /// GET `path` from its metrics address: the status code and the body (`None`: no
    /// answer).
    pub fn get(&self, path: &str) -> Option<(u16, String)> {
        http_get(&self.metrics, path)
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

/// roam as `e2e/lab up` installed it from deploy/ (the lab overlay `e2e/deploy/lab`): the
/// roam-controller Deployment in `roam-system`, two replicas, one holding the Lease. The
/// demo and the tests that need no controller of their own use it; a crash is a SIGKILL of
/// the leader's process on its node (the kubelet restarts the container), and every pod's
/// log (the current and the previous container's) is read with `kubectl logs`.
#[derive(Clone)]
pub struct Installed {
    lab: Lab,
}

/// The installation's namespace, Deployment and Lease.
pub const INSTALLED_NAMESPACE: &str = "roam-system";
const DEPLOYMENT: &str = "roam-controller";
const POD_LABEL: &str = "app.kubernetes.io/name=roam-controller";

impl Installed {
    /// The installation, once a running pod of it holds the Lease (a test fails loudly if
    /// the lab has none: `e2e/lab up` installs it).
    pub fn get(lab: &Lab) -> Installed {
        let me = Installed { lab: lab.clone() };
        crate::lab::wait_until_else(
            Duration::from_secs(180),
            "the installed roam-controller (e2e/lab up installs it) to hold its Lease",
            || me.leader(),
            || me.describe(),
        );
        me
    }

    /// The pod holding the Lease, if it is one of the Deployment's and running.
    pub fn leader(&self) -> Option<String> {
        let holder = self.kubectl_json(&["get", "lease", DEPLOYMENT])?["spec"]["holderIdentity"]
            .as_str()?
            .to_string();
        let pod = self.kubectl_json(&["get", "pod", &holder])?;
        (pod["status"]["phase"] == "Running").then_some(holder)
    }

    /// The Deployment's pods: (name, node).
    pub fn pods(&self) -> Vec<(String, String)> {
        self.kubectl_json(&["get", "pods", "-l", POD_LABEL])
            .and_then(|l| l["items"].as_array().cloned())
            .unwrap_or_default()
            .iter()
            .map(|p| {
                (
                    p["metadata"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    p["spec"]["nodeName"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                )
            })
            .collect()
    }

    /// How often the kubelet restarted pod `pod`'s container.
    pub fn restarts(&self, pod: &str) -> u64 {
        self.kubectl_json(&["get", "pod", pod])
            .and_then(|p| p["status"]["containerStatuses"][0]["restartCount"].as_u64())
            .unwrap_or(0)
    }

    /// The PID (in the host's PID namespace) of pod `pod`'s roam-controller process.
    pub fn pid(&self, pod: &str) -> Option<u32> {
        let want = format!("POD_NAME={pod}");
        std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
            if comm.trim() != "roam-controller" {
                return None;
            }
            let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
            env.split(|b| *b == 0)
                .any(|kv| kv == want.as_bytes())
                .then_some(pid)
        })
    }

    /// SIGKILL the leader's process (a crash, no graceful shutdown) and wait until a
    /// controller leads again: the same pod's container restarted by the kubelet, or the
    /// standby once the Lease expired; returns the crashed pod's name.
    pub fn crash_leader(&self) -> String {
        let pod = crate::lab::wait_until(Duration::from_secs(60), "a leader", || self.leader());
        let before = self.restarts(&pod);
        let pid = self
            .pid(&pod)
            .unwrap_or_else(|| panic!("no roam-controller process of pod {pod} on this host"));
        sigkill(pid);
        crate::lab::wait_until_else(
            Duration::from_secs(120),
            &format!("a leader after {pod}'s crash"),
            || {
                let leader = self.leader()?;
                let back = leader != pod || self.restarts(&pod) > before;
                (back && self.pid(&leader).is_some()).then_some(())
            },
            || self.describe(),
        );
        pod
    }

    /// Set (`Some`) or remove (`None`) environment variable `key` of the controller
    /// (`kubectl set env`), and wait until the rollout is done and a new pod leads.
    pub fn set_env(&self, key: &str, value: Option<&str>) {
        let kv = match value {
            Some(v) => format!("{key}={v}"),
            None => format!("{key}-"),
        };
        self.kubectl(&["set", "env", &format!("deploy/{DEPLOYMENT}"), &kv])
            .unwrap_or_else(|e| panic!("kubectl set env {kv}: {e}"));
        self.wait_rolled_out();
    }

    /// Wait until the Deployment's rollout is complete and one of its current pods leads.
    pub fn wait_rolled_out(&self) {
        self.kubectl(&[
            "rollout",
            "status",
            &format!("deploy/{DEPLOYMENT}"),
            "--timeout=300s",
        ])
        .unwrap_or_else(|e| panic!("rollout: {e}\n{}", self.describe()));
        crate::lab::wait_until_else(
            Duration::from_secs(120),
            "a pod of the rolled-out Deployment to hold the Lease",
            || {
                let leader = self.leader()?;
                self.pods().iter().any(|(p, _)| *p == leader).then_some(())
            },
            || self.describe(),
        );
    }

    /// Every pod's log, the previous container's first (a crashed one), each under a header.
    pub fn log_text(&self) -> String {
        let mut out = String::new();
        for (pod, node) in self.pods() {
            for prev in [true, false] {
                let mut args = vec!["logs", pod.as_str()];
                if prev {
                    args.push("--previous");
                }
                if let Ok(text) = self.kubectl(&args) {
                    let which = if prev {
                        "previous container"
                    } else {
                        "container"
                    };
                    out += &format!("===== {pod} on {node} ({which})\n{text}");
                }
            }
        }
        out
    }

    /// The last `n` lines of each pod's current log (and its previous container's).
    pub fn log_tail(&self, n: usize) -> String {
        let mut out = String::new();
        for block in self.log_text().split("===== ").filter(|b| !b.is_empty()) {
            let (head, body) = block.split_once('\n').unwrap_or((block, ""));
            let lines: Vec<&str> = body.lines().collect();
            out += &format!(
                "===== {head}\n{}\n",
                lines[lines.len().saturating_sub(n)..].join("\n")
            );
        }
        out
    }

    /// GET `path` from pod `pod`'s metrics and probe port (host network: its node's
    /// address, port 9090).
    pub fn http(&self, pod: &str, path: &str) -> Option<(u16, String)> {
        let node = self
            .pods()
            .into_iter()
            .find(|(p, _)| p == pod)
            .map(|(_, n)| n)?;
        http_get(&format!("{}:9090", self.lab.node(&node).ip), path)
    }

    /// The leader's resident set size in KiB.
    pub fn rss_kib(&self) -> Option<u64> {
        let pid = self.pid(&self.leader()?)?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        status
            .lines()
            .find(|l| l.starts_with("VmRSS:"))?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    }

    /// `kubectl get pods,deploy` and the Lease: what a failure message shows.
    pub fn describe(&self) -> String {
        let pods = self
            .kubectl(&["get", "deploy,pods,lease", "-o", "wide"])
            .unwrap_or_else(|e| e);
        format!("--- {INSTALLED_NAMESPACE}:\n{pods}\n{}", self.log_tail(20))
    }

    fn kubectl(&self, args: &[&str]) -> Result<String, String> {
        let mut all = vec!["-n", INSTALLED_NAMESPACE];
        all.extend_from_slice(args);
        crate::lab::try_kubectl(&self.lab, &all)
    }

    fn kubectl_json(&self, args: &[&str]) -> Option<serde_json::Value> {
        let mut all = args.to_vec();
        all.extend_from_slice(&["-o", "json"]);
        serde_json::from_str(&self.kubectl(&all).ok()?).ok()
    }
}

/// GET `path` from `addr` (`HOST:PORT`) over plain HTTP/1.1: the status code and the body
/// (`None`: no answer).
pub fn http_get(addr: &str, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
        .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let (head, body) = out.split_once("\r\n\r\n")?;
    let code = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, body.to_string()))
}

fn sigkill(pid: u32) {
    let _ = Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status();
}
