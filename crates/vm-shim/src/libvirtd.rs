//! The launcher pod's own libvirtd (`roam-shim libvirtd`): libvirt and QEMU come in roam's
//! launcher image, one daemon per VM, as KubeVirt's virt-launcher does — never the node's.
//!
//! The pod's `libvirtd` container runs `roam-shim libvirtd --listen IP:PORT`: it writes the
//! daemon's configuration into the pod's `/run/libvirt` (an emptyDir the `shim` container
//! shares) and execs `libvirtd`. The daemon listens on the pod's unix socket for its shim and
//! on `IP:PORT` (the node's address: the pod has the host network) for the source libvirtd of
//! an incoming live migration (peer-to-peer). Each daemon has a host UUID of its own: libvirt
//! refuses to migrate between two daemons with the same one.
//!
//! QEMU's settings (`/etc/libvirt/qemu.conf`: root, no cgroups, no namespaces, no virtlogd)
//! are the image's (`deploy/launcher/qemu.conf`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// Where the daemon's sockets, its configuration and its pid file live: the pod's emptyDir,
/// also mounted in the shim's container.
pub const RUN_DIR: &str = "/run/libvirt";
/// The daemon in the image.
pub const LIBVIRTD: &str = "/usr/sbin/libvirtd";

/// What `roam-shim libvirtd` was asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Args {
    /// Where migrating libvirtds connect (the node's address and the pod's libvirt port).
    pub listen: SocketAddr,
    /// The daemon binary.
    pub libvirtd: PathBuf,
    /// The runtime directory (sockets, configuration, pid file).
    pub run_dir: PathBuf,
}

/// The usage line.
pub const USAGE: &str = "roam-shim libvirtd --listen IP:PORT [--libvirtd PATH(/usr/sbin/libvirtd)] [--run-dir DIR(/run/libvirt)]";

/// Parse `roam-shim libvirtd`'s flags (pure).
pub fn parse(args: &[String]) -> Result<Args, String> {
    let mut listen = None;
    let mut libvirtd = PathBuf::from(LIBVIRTD);
    let mut run_dir = PathBuf::from(RUN_DIR);
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let value = it
            .next()
            .ok_or_else(|| format!("{flag} needs a value; usage: {USAGE}"))?;
        match flag.as_str() {
            "--listen" => {
                let addr: SocketAddr = value.parse().map_err(|_| {
                    format!("--listen {value:?}: give the node's IP and the pod's libvirt port, e.g. 10.0.0.11:18105")
                })?;
                if addr.ip().is_unspecified() || addr.port() == 0 {
                    return Err(format!(
                        "--listen {value}: give the node's own address and a fixed port (the source of a migration connects to it)"
                    ));
                }
                listen = Some(addr);
            }
            "--libvirtd" => libvirtd = value.into(),
            "--run-dir" => run_dir = value.into(),
            _ => return Err(format!("unknown flag {flag}; usage: {USAGE}")),
        }
    }
    let listen = listen.ok_or_else(|| format!("--listen is required; usage: {USAGE}"))?;
    if !run_dir.is_absolute() {
        return Err(format!(
            "--run-dir {}: give an absolute path",
            run_dir.display()
        ));
    }
    Ok(Args {
        listen,
        libvirtd,
        run_dir,
    })
}

/// The daemon's configuration (pure): unix sockets in `run_dir` for the pod's shim, TCP on
/// `listen` for a migration's source libvirtd, the daemon's own `host_uuid`, logs on stderr
/// (the container's log).
///
/// TCP without authentication, as KubeVirt's migration proxy carries it: the node network
/// only (mTLS for the migration is #20).
pub fn config(listen: SocketAddr, host_uuid: &str, run_dir: &Path) -> String {
    let ip = listen.ip().to_string();
    format!(
        "# roam-shim libvirtd: this launcher pod's own libvirtd (written at start)\n\
         host_uuid = \"{host_uuid}\"\n\
         unix_sock_dir = \"{run}\"\n\
         unix_sock_group = \"root\"\n\
         unix_sock_ro_perms = \"0777\"\n\
         unix_sock_rw_perms = \"0770\"\n\
         auth_unix_ro = \"none\"\n\
         auth_unix_rw = \"none\"\n\
         listen_tls = 0\n\
         listen_tcp = 1\n\
         listen_addr = \"{ip}\"\n\
         tcp_port = \"{port}\"\n\
         auth_tcp = \"none\"\n\
         log_level = 3\n\
         log_outputs = \"3:stderr\"\n",
        run = run_dir.display(),
        port = listen.port(),
    )
}

/// libvirtd's command line: `--listen` enables the TCP socket, `-f` the configuration,
/// `-p` a pid file in the run directory.
pub fn command_line(args: &Args, config_file: &Path) -> Vec<String> {
    vec![
        "--listen".into(),
        "-f".into(),
        config_file.display().to_string(),
        "-p".into(),
        args.run_dir.join("libvirtd.pid").display().to_string(),
    ]
}

/// A fresh host UUID (the kernel's random UUID generator).
pub fn new_host_uuid() -> std::io::Result<String> {
    Ok(std::fs::read_to_string("/proc/sys/kernel/random/uuid")?
        .trim()
        .to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn flags_are_parsed_with_defaults() {
        let a = parse(&s(&["--listen", "10.0.0.11:18105"])).unwrap();
        assert_eq!(a.listen, "10.0.0.11:18105".parse().unwrap());
        assert_eq!(a.libvirtd, PathBuf::from(LIBVIRTD));
        assert_eq!(a.run_dir, PathBuf::from(RUN_DIR));
        let a = parse(&s(&[
            "--listen",
            "[fd00::1]:18105",
            "--run-dir",
            "/tmp/x",
            "--libvirtd",
            "/opt/libvirtd",
        ]))
        .unwrap();
        assert_eq!(a.run_dir, PathBuf::from("/tmp/x"));
        assert_eq!(a.libvirtd, PathBuf::from("/opt/libvirtd"));
    }

    #[test]
    fn bad_flags_say_what_to_give() {
        for (args, says) in [
            (vec![], "--listen is required"),
            (vec!["--listen"], "needs a value"),
            (vec!["--listen", "node-a:1"], "node's IP"),
            (vec!["--listen", "0.0.0.0:18105"], "node's own address"),
            (vec!["--listen", "10.0.0.1:0"], "fixed port"),
            (
                vec!["--listen", "10.0.0.1:1", "--run-dir", "rel"],
                "absolute",
            ),
            (vec!["--port", "1"], "unknown flag --port"),
        ] {
            let e = parse(&s(&args)).unwrap_err();
            assert!(e.contains(says), "{args:?}: {e}");
        }
    }

    #[test]
    fn the_config_listens_where_asked_with_its_own_uuid() {
        let c = config(
            "10.0.0.11:18105".parse().unwrap(),
            "7d6f3b36-5a54-4b27-9f0c-3c3a4e2f9a10",
            Path::new("/run/libvirt"),
        );
        for line in [
            "host_uuid = \"7d6f3b36-5a54-4b27-9f0c-3c3a4e2f9a10\"",
            "unix_sock_dir = \"/run/libvirt\"",
            "listen_tcp = 1",
            "listen_addr = \"10.0.0.11\"",
            "tcp_port = \"18105\"",
            "auth_tcp = \"none\"",
            "listen_tls = 0",
        ] {
            assert!(c.lines().any(|l| l == line), "missing {line:?} in\n{c}");
        }
        // IPv6: libvirt takes the bare address
        let c = config("[fd00::1]:18105".parse().unwrap(), "u", Path::new("/r"));
        assert!(c.contains("listen_addr = \"fd00::1\""), "{c}");
    }

    #[test]
    fn uuids_differ() {
        let (a, b) = (new_host_uuid().unwrap(), new_host_uuid().unwrap());
        assert_eq!(a.len(), 36);
        assert_ne!(a, b);
    }
}
