//! Measurements: ping silences, packet captures, percentiles.

use std::process::Command;
use std::time::Duration;

use crate::lab::try_run;
use crate::netns::TestNetns;

/// `ping -D` from a test namespace every `interval_s` seconds; [`Pinger::stop`] gives the
/// replies and the longest silence between two replies.
pub struct Pinger {
    child: std::process::Child,
    /// Drains ping's output while it runs: once an unread pipe is full (64 KiB) ping blocks,
    /// and the silence being measured would be ping's own.
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
        ping_silence(&out)
    }
}

impl Drop for Pinger {
    fn drop(&mut self) {
        // after stop() it has exited; after a failure it must not outlive the test
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `tcpdump -n -l -i <iface> <args>` in network namespace `netns`, for at most `timeout_s`
/// seconds; [`Tcpdump::start`] returns once it listens, so no packet sent after is missed.
pub struct Tcpdump {
    child: std::process::Child,
    /// Read until it listens, then kept open: its summary at exit must not hit a closed pipe.
    stderr: std::io::BufReader<std::process::ChildStderr>,
}

impl Tcpdump {
    /// Start it; `args` are further flags and the filter (e.g. `["-c", "5", "icmp"]`). Panics
    /// with what it printed when it ends before listening.
    pub fn start(netns: &str, iface: &str, timeout_s: u32, args: &[&str]) -> Tcpdump {
        use std::io::BufRead;
        let timeout = timeout_s.to_string();
        let mut child = Command::new("ip")
            .args(["netns", "exec", netns, "timeout", &timeout])
            .args(["tcpdump", "-n", "-l", "-i", iface])
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("start tcpdump");
        let stderr = std::io::BufReader::new(child.stderr.take().expect("tcpdump's stderr"));
        // the guard first: a tcpdump that fails below is killed and reaped by its drop
        let mut dump = Tcpdump { child, stderr };
        let mut line = String::new();
        let mut seen = String::new();
        loop {
            line.clear();
            let n = dump.stderr.read_line(&mut line).unwrap_or(0);
            seen.push_str(&line);
            if n == 0 {
                panic!("tcpdump on {iface} in {netns} ended before listening: {seen}");
            }
            if line.contains("listening on") {
                return dump;
            }
        }
    }

    /// Wait for it to end (its packet count or its timeout); returns what it printed.
    pub fn finish(mut self) -> String {
        use std::io::Read;
        let mut out = String::new();
        if let Some(mut stdout) = self.child.stdout.take() {
            let _ = stdout.read_to_string(&mut out);
        }
        let _ = self.child.wait();
        out
    }
}

impl Drop for Tcpdump {
    fn drop(&mut self) {
        // after finish() it has exited; after a failure it must not outlive the test
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// [`Tcpdump`] while `traffic` runs: started (and listening) before it, finished after it;
/// returns what tcpdump printed.
pub fn capture(
    netns: &str,
    iface: &str,
    timeout_s: u32,
    args: &[&str],
    traffic: impl FnOnce(),
) -> String {
    let dump = Tcpdump::start(netns, iface, timeout_s, args);
    traffic();
    dump.finish()
}

/// The RARP frame QEMU sends when a migrated VM resumes, announcing `mac` (`aa:bb:..`), as a
/// Python `bytes` expression (60 bytes, padded).
fn rarp_frame_py(mac: &str) -> String {
    format!(
        "(lambda m: (lambda f: f + bytes(60 - len(f)))(b'\\xff' * 6 + m + b'\\x80\\x35' + \
         bytes([0, 1, 8, 0, 6, 4, 0, 3]) + m + bytes(4) + m + bytes(4)))(bytes.fromhex('{}'))",
        mac.replace(':', "")
    )
}

/// Send one RARP announcing `mac` out of `iface` in namespace `ns`.
pub fn send_rarp(ns: &TestNetns, iface: &str, mac: &str) {
    let script = format!(
        "import socket\ns = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)\n\
         s.bind(('{iface}', 0))\ns.send({})\n",
        rarp_frame_py(mac)
    );
    ns.run("python3", &["-c", &script]);
}

/// A RARP sender started ahead of time in a namespace (socket open, interpreter warm), so
/// that [`RarpTrigger::fire`] sends within microseconds, as QEMU does at the end of a
/// migration.
pub struct RarpTrigger {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    stdout: std::io::BufReader<std::process::ChildStdout>,
}

impl RarpTrigger {
    /// Ready to announce `mac` out of `iface` in `ns`.
    pub fn new(ns: &TestNetns, iface: &str, mac: &str) -> RarpTrigger {
        let script = format!(
            "import socket, sys\ns = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)\n\
             s.bind(('{iface}', 0))\nf = {}\nprint('ready', flush=True)\n\
             for _ in sys.stdin:\n    s.send(f)\n    print('sent', flush=True)\n",
            rarp_frame_py(mac)
        );
        let mut child = Command::new("ip")
            .args(["netns", "exec", &ns.name, "python3", "-u", "-c", &script])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("start the RARP sender");
        let stdin = child.stdin.take().expect("its stdin");
        let stdout = std::io::BufReader::new(child.stdout.take().expect("its stdout"));
        let mut t = RarpTrigger {
            child,
            stdin,
            stdout,
        };
        t.expect_line("ready");
        t
    }

    fn expect_line(&mut self, want: &str) {
        use std::io::BufRead;
        let mut line = String::new();
        self.stdout
            .read_line(&mut line)
            .expect("read the RARP sender");
        assert_eq!(line.trim(), want, "the RARP sender said {line:?}");
    }

    /// Send the RARP now; returns once it is out.
    pub fn fire(&mut self) {
        use std::io::Write;
        self.stdin
            .write_all(b"go\n")
            .and_then(|()| self.stdin.flush())
            .expect("trigger the RARP sender");
        self.expect_line("sent");
    }
}

impl Drop for RarpTrigger {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `p` percentile (0.0..=1.0) of `sorted` by nearest rank; zero when it is empty.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// The longest gap between consecutive `ping -D` replies in `output`, and how many replies.
fn ping_silence(output: &str) -> (usize, Duration) {
    let stamps: Vec<f64> = output
        .lines()
        .filter(|l| l.contains("bytes from"))
        .filter_map(|l| l.strip_prefix('[')?.split(']').next()?.parse().ok())
        .collect();
    let longest = stamps.windows(2).map(|w| w[1] - w[0]).fold(0.0, f64::max);
    (stamps.len(), Duration::from_secs_f64(longest))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentile_picks_the_nearest_rank() {
        let d: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&d, 0.0), Duration::from_millis(1));
        assert_eq!(percentile(&d, 0.5), Duration::from_millis(51));
        assert_eq!(percentile(&d, 0.99), Duration::from_millis(99));
        assert_eq!(percentile(&d, 1.0), Duration::from_millis(100));
        assert_eq!(percentile(&[], 0.5), Duration::ZERO);
    }

    #[test]
    fn ping_silence_is_the_longest_gap_between_replies() {
        let out = "PING 10.0.0.1 (10.0.0.1) 56(84) bytes of data.\n\
                   [1700000000.000100] 64 bytes from 10.0.0.1: icmp_seq=1 ttl=64 time=0.1 ms\n\
                   [1700000000.010100] 64 bytes from 10.0.0.1: icmp_seq=2 ttl=64 time=0.1 ms\n\
                   [1700000000.260100] 64 bytes from 10.0.0.1: icmp_seq=27 ttl=64 time=0.1 ms\n\
                   [1700000000.270100] 64 bytes from 10.0.0.1: icmp_seq=28 ttl=64 time=0.1 ms\n\
                   --- 10.0.0.1 ping statistics ---\n";
        let (replies, longest) = ping_silence(out);
        assert_eq!(replies, 4);
        assert!((longest.as_secs_f64() - 0.25).abs() < 1e-6, "{longest:?}");
        assert_eq!(ping_silence(""), (0, Duration::ZERO));
    }
}
