//! The lab's nodes as separate hosts: what runs on a node must not use another node's files,
//! nor OVN central's or the control plane's (a real node has no such paths). The lab hides
//! them from each node's mount namespace (`e2e/labkit/node-inner.sh`); [`foreign_paths`]
//! checks the running processes themselves.

use std::collections::BTreeMap;
use std::path::Path;

use crate::lab::{Lab, holder_pid};

/// The paths no process of `node` may use: the other nodes' directories, OVN central's and
/// the control plane's.
pub fn forbidden_paths(lab: &Lab, node: &str) -> Vec<String> {
    let dir = lab.dir();
    let mut out = vec![
        dir.join("central").display().to_string(),
        dir.join("kube").display().to_string(),
    ];
    for other in lab.nodes().iter().filter(|n| *n != node) {
        out.push(dir.join(other).display().to_string());
    }
    out
}

fn ns(pid: &str, kind: &str) -> Option<String> {
    std::fs::read_link(format!("/proc/{pid}/ns/{kind}"))
        .ok()
        .map(|p| p.display().to_string())
}

/// Which node a process runs on: in the node's network or mount namespace (its daemons,
/// host-network pods, QEMU), or in a cgroup under the node's kubelet's `cgroupRoot` (its
/// pods). `None`: not a node's (the host's own, the tests').
fn node_of(
    pid: &str,
    nodes: &BTreeMap<String, (Option<String>, Option<String>)>,
) -> Option<String> {
    let (net, mnt) = (ns(pid, "net"), ns(pid, "mnt"));
    let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    nodes.iter().find_map(|(node, (nnet, nmnt))| {
        let in_ns = (net.is_some() && net == *nnet) || (mnt.is_some() && mnt == *nmnt);
        let in_cgroup = cgroup.lines().any(|l| {
            l.split(':')
                .nth(2)
                .is_some_and(|p| p.starts_with(&format!("/{node}/")))
        });
        (in_ns || in_cgroup).then(|| node.clone())
    })
}

/// Unix socket inode → bound path, in the network namespace of `pid`.
fn unix_paths(pid: &str) -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/net/unix")).unwrap_or_default();
    text.lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 8).then(|| (f[6].to_string(), f[7].to_string()))
        })
        .collect()
}

/// Every use of a forbidden path by a node's running processes: in their arguments, their
/// working directory, their open files and the paths their unix sockets are bound to. One
/// line per finding (`node-a pid 123 (libvirtd): fd 7 → /var/tmp/roam/lab/node-b/…`).
pub fn foreign_paths(lab: &Lab) -> Vec<String> {
    let nodes: BTreeMap<String, (Option<String>, Option<String>)> = lab
        .nodes()
        .into_iter()
        .map(|n| {
            let pid = holder_pid(lab, &n);
            let spaces = (ns(&pid, "net"), ns(&pid, "mnt"));
            (n, spaces)
        })
        .collect();
    let mut found = vec![];
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return vec!["cannot read /proc".into()];
    };
    for entry in procs.flatten() {
        let pid = entry.file_name().to_string_lossy().into_owned();
        if !pid.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Some(node) = node_of(&pid, &nodes) else {
            continue;
        };
        // the holder itself is the lab's, not the node's: it mounted the cover over them
        if pid == holder_pid(lab, &node) {
            continue;
        }
        let forbidden = forbidden_paths(lab, &node);
        let bad = |s: &str| forbidden.iter().any(|f| s.contains(f.as_str()));
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        let who = format!("{node} pid {pid} ({})", comm.trim());
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let args = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if bad(&args) {
            found.push(format!("{who}: arguments {args}"));
        }
        if let Ok(cwd) = std::fs::read_link(format!("/proc/{pid}/cwd"))
            && bad(&cwd.display().to_string())
        {
            found.push(format!("{who}: working directory {}", cwd.display()));
        }
        let sockets = unix_paths(&pid);
        if let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) {
            for fd in fds.flatten() {
                let Ok(target) = std::fs::read_link(fd.path()) else {
                    continue;
                };
                let t = target.display().to_string();
                let shown = match t.strip_prefix("socket:[").and_then(|s| s.strip_suffix(']')) {
                    Some(inode) => sockets.get(inode).cloned().unwrap_or_default(),
                    None => t,
                };
                if bad(&shown) {
                    found.push(format!(
                        "{who}: fd {} → {shown}",
                        fd.file_name().to_string_lossy()
                    ));
                }
            }
        }
    }
    found
}

/// What `node` sees at `path` (from inside its mount namespace): its entries, or `None`
/// when it cannot read it.
pub fn node_sees(lab: &Lab, node: &str, path: &Path) -> Option<Vec<String>> {
    let pid = holder_pid(lab, node);
    // /proc/PID/root is the process's view of the filesystem, mounts included
    let inside = Path::new("/proc")
        .join(&pid)
        .join("root")
        .join(path.strip_prefix("/").unwrap_or(path));
    let entries = std::fs::read_dir(inside).ok()?;
    let mut out: Vec<String> = entries
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    out.sort();
    Some(out)
}
