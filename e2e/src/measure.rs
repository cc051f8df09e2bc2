//! Measurements: ping silences, packet captures, percentiles.

use std::process::Command;
use std::time::Duration;

use crate::lab::try_run;
use crate::netns::TestNetns;

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
