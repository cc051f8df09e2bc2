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
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(&self.metrics).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
            .ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).ok()?;
        let (head, body) = out.split_once("\r\n\r\n")?;
        let code = head.split_whitespace().nth(1)?.parse().ok()?;
        Some((code, body.to_string()))
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
