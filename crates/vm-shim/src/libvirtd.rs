//! The launcher pod's own libvirtd (`roam-shim libvirtd`): libvirt and QEMU come in roam's
//! launcher image, one daemon per VM, as KubeVirt's virt-launcher does — never the node's.
//!
//! The pod's `libvirtd` container runs `roam-shim libvirtd`: it writes the daemon's
//! configuration into the pod's `/run/libvirt` (an emptyDir the `shim` container shares) and
//! execs `libvirtd`. The daemon listens on the pod's UNIX sockets only: its shim reaches it
//! there, and so does a migration's source — through the shims' mutual-TLS proxies
//! ([`crate::proxy`]), which hold the node's key; neither libvirtd nor QEMU does. Each daemon
//! has a host UUID of its own: libvirt refuses to migrate between two daemons with the same
//! one.
//!
//! With `--listen IP:PORT` the daemon also listens on plain TCP, without authentication: the
//! tests' own libvirtds and the TLS bench's baseline, never what roam ships.
//!
//! With `--disk IMAGE` it first opens and checks the VM's disk image and pins it at
//! [`crate::disk::PINNED`] (see [`crate::disk`]): this container is the mount namespace QEMU
//! runs in, and an image it refuses starts no libvirtd (the container fails with the reason,
//! which the VM's condition quotes).
//!
//! QEMU's settings (`/etc/libvirt/qemu.conf`: an unprivileged user, no cgroups, no
//! namespaces, no virtlogd) are the image's (`deploy/launcher/qemu.conf`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use roam_shim_api::launch;

/// Where the daemon's sockets, its configuration and its pid file live: the pod's emptyDir,
/// also mounted in the shim's container.
pub const RUN_DIR: &str = "/run/libvirt";
/// The daemon in the image.
pub const LIBVIRTD: &str = "/usr/sbin/libvirtd";
/// The user QEMU runs as (`user = "+107"` in the image's `deploy/launcher/qemu.conf`;
/// KubeVirt's qemu user has the same number): no capability, no node key.
pub const QEMU_UID: u32 = 107;
/// QEMU's group (`group = "+107"`).
pub const QEMU_GID: u32 = 107;

/// What `roam-shim libvirtd` was asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Args {
    /// Plain TCP, unauthenticated, for a migration's source libvirtd (the tests' own
    /// daemons). `None`: UNIX sockets only.
    pub listen: Option<SocketAddr>,
    /// The daemon binary.
    pub libvirtd: PathBuf,
    /// The runtime directory (sockets, configuration, pid file).
    pub run_dir: PathBuf,
    /// The VM's disk image, checked and pinned for QEMU before libvirtd starts.
    pub disk: Option<Disk>,
}

/// A disk image for `roam-shim libvirtd` to check and pin ([`crate::disk`]): the shim's own
/// launch flags of the same names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Disk {
    /// The image (`--disk`).
    pub image: PathBuf,
    /// Its declared format (`--disk-format`, default `qcow2`).
    pub format: String,
    /// Read-only (`--disk-access read-only`; default `read-write`).
    pub read_only: bool,
    /// The directory it must lie in (`--image-root`; default `/`).
    pub root: PathBuf,
}

/// The usage line.
pub const USAGE: &str = "roam-shim libvirtd [--listen IP:PORT] [--libvirtd PATH(/usr/sbin/libvirtd)] [--run-dir DIR(/run/libvirt)] [--disk IMAGE [--disk-format raw|qcow2(qcow2)] [--disk-access read-only|read-write(read-write)] [--image-root DIR(/)]]";

/// Parse `roam-shim libvirtd`'s flags (pure).
pub fn parse(args: &[String]) -> Result<Args, String> {
    let mut listen = None;
    let mut libvirtd = PathBuf::from(LIBVIRTD);
    let mut run_dir = PathBuf::from(RUN_DIR);
    let (mut image, mut format, mut read_only, mut root) = (None, None, None, None);
    let absolute = |flag: &str, value: &str| {
        let d = PathBuf::from(value);
        if d.is_absolute() {
            Ok(d)
        } else {
            Err(format!("{flag} {value}: give an absolute path"))
        }
    };
    let known = [
        "listen",
        "libvirtd",
        "run-dir",
        &launch::flag::DISK[2..],
        &launch::flag::IMAGE_ROOT[2..],
        &launch::flag::DISK_FORMAT[2..],
        &launch::flag::DISK_ACCESS[2..],
    ];
    let given = roam_contract::flags::pairs(args.iter().cloned(), &known)
        .map_err(|e| format!("{e}; usage: {USAGE}"))?;
    for (name, value) in given {
        let flag = format!("--{name}");
        let value = &value;
        match flag.as_str() {
            "--listen" => {
                let addr: SocketAddr = value.parse().map_err(|_| {
                    format!("--listen {value:?}: give the node's IP and the pod's libvirt port, e.g. 10.0.0.11:18105")
                })?;
                if addr.ip().is_unspecified() || addr.port() == 0 {
                    return Err(format!(
                        "--listen {value}: give the node's own address and a fixed port (the source of a plain migration connects to it)"
                    ));
                }
                listen = Some(addr);
            }
            "--libvirtd" => libvirtd = value.into(),
            "--run-dir" => run_dir = value.into(),
            launch::flag::DISK => image = Some(absolute(&flag, value)?),
            launch::flag::IMAGE_ROOT => root = Some(absolute(&flag, value)?),
            launch::flag::DISK_FORMAT => format = Some(value.clone()),
            launch::flag::DISK_ACCESS => {
                read_only = Some(match value.as_str() {
                    launch::READ_ONLY => true,
                    launch::READ_WRITE => false,
                    _ => {
                        return Err(format!(
                            "--disk-access {value:?}: give read-only or read-write"
                        ));
                    }
                })
            }
            _ => return Err(format!("unknown flag {flag}; usage: {USAGE}")),
        }
    }
    if !run_dir.is_absolute() {
        return Err(format!(
            "--run-dir {}: give an absolute path",
            run_dir.display()
        ));
    }
    let disk = match image {
        Some(image) => Some(Disk {
            image,
            format: format.unwrap_or_else(|| launch::DEFAULT_DISK_FORMAT.into()),
            read_only: read_only.unwrap_or(false),
            root: root.unwrap_or_else(|| "/".into()),
        }),
        None if format.is_some() || read_only.is_some() || root.is_some() => {
            return Err(format!(
                "--disk-format, --disk-access and --image-root describe a --disk: give it; usage: {USAGE}"
            ));
        }
        None => None,
    };
    Ok(Args {
        listen,
        libvirtd,
        run_dir,
        disk,
    })
}

/// The daemon's configuration (pure): UNIX sockets in `run_dir` (the shim's, and the
/// migration proxy's), the daemon's own `host_uuid`, logs on stderr (the container's log);
/// with `listen`, plain TCP without authentication too (the tests' own daemons).
pub fn config(listen: Option<SocketAddr>, host_uuid: &str, run_dir: &Path) -> String {
    let network = match listen {
        None => "listen_tls = 0\nlisten_tcp = 0\n".to_string(),
        Some(l) => format!(
            "listen_tls = 0\n\
             listen_tcp = 1\n\
             listen_addr = \"{ip}\"\n\
             tcp_port = \"{port}\"\n\
             auth_tcp = \"none\"\n",
            ip = l.ip(),
            port = l.port()
        ),
    };
    format!(
        "# roam-shim libvirtd: this launcher pod's own libvirtd (written at start)\n\
         host_uuid = \"{host_uuid}\"\n\
         unix_sock_dir = \"{run}\"\n\
         unix_sock_group = \"root\"\n\
         unix_sock_ro_perms = \"0777\"\n\
         unix_sock_rw_perms = \"0770\"\n\
         auth_unix_ro = \"none\"\n\
         auth_unix_rw = \"none\"\n\
         {network}\
         log_level = 3\n\
         log_outputs = \"3:stderr\"\n",
        run = run_dir.display(),
    )
}

/// libvirtd's command line: `--listen` enables the TCP socket (with [`Args::listen`]), `-f`
/// the configuration, `-p` a pid file in the run directory.
pub fn command_line(args: &Args, config_file: &Path) -> Vec<String> {
    let mut c: Vec<String> = vec![];
    if args.listen.is_some() {
        c.push("--listen".into());
    }
    c.extend([
        "-f".into(),
        config_file.display().to_string(),
        "-p".into(),
        args.run_dir.join("libvirtd.pid").display().to_string(),
    ]);
    c
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
        let a = parse(&s(&[])).unwrap();
        assert_eq!(a.listen, None);
        assert!(!command_line(&a, Path::new("/c")).contains(&"--listen".to_string()));
        let a = parse(&s(&["--listen", "10.0.0.11:18105"])).unwrap();
        assert_eq!(a.listen, Some("10.0.0.11:18105".parse().unwrap()));
        assert!(command_line(&a, Path::new("/c")).contains(&"--listen".to_string()));
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
        assert_eq!(a.disk, None);
    }

    #[test]
    fn a_disk_is_parsed_with_its_defaults() {
        let listen = ["--listen", "10.0.0.11:18105"];
        let a = parse(&s(&[&listen[..], &["--disk", "/v/d.img"]].concat())).unwrap();
        assert_eq!(
            a.disk,
            Some(Disk {
                image: "/v/d.img".into(),
                format: "qcow2".into(),
                read_only: false,
                root: "/".into()
            })
        );
        let a = parse(&s(&[
            &listen[..],
            &[
                "--disk",
                "/store/d.raw",
                "--disk-format",
                "raw",
                "--disk-access",
                "read-only",
                "--image-root",
                "/store",
            ],
        ]
        .concat()))
        .unwrap();
        assert_eq!(
            a.disk,
            Some(Disk {
                image: "/store/d.raw".into(),
                format: "raw".into(),
                read_only: true,
                root: "/store".into()
            })
        );
        for (extra, says) in [
            (vec!["--disk-format", "raw"], "describe a --disk"),
            (vec!["--disk", "d.img"], "absolute"),
            (
                vec!["--disk", "/d", "--disk-access", "rw"],
                "read-only or read-write",
            ),
        ] {
            let e = parse(&s(&[&listen[..], &extra].concat())).unwrap_err();
            assert!(e.contains(says), "{extra:?}: {e}");
        }
    }

    #[test]
    fn bad_flags_say_what_to_give() {
        for (args, says) in [
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
            Some("10.0.0.11:18105".parse().unwrap()),
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
        let c = config(
            Some("[fd00::1]:18105".parse().unwrap()),
            "u",
            Path::new("/r"),
        );
        assert!(c.contains("listen_addr = \"fd00::1\""), "{c}");
    }

    #[test]
    fn without_listen_the_daemon_has_no_network_socket() {
        let c = config(None, "u", Path::new("/run/libvirt"));
        for line in ["listen_tls = 0", "listen_tcp = 0"] {
            assert!(c.lines().any(|l| l == line), "missing {line:?} in\n{c}");
        }
        for key in ["listen_addr", "tcp_port", "tls_port", "key_file"] {
            assert!(!c.contains(key), "{key} in\n{c}");
        }
        for gone in ["--pki-dir", "--allowed-peer"] {
            let e = parse(&s(&[gone, "x"])).unwrap_err();
            assert!(e.contains("unknown flag"), "{gone}: {e}");
        }
    }

    #[test]
    fn the_images_qemu_conf_runs_qemu_as_the_user_roam_gives_files_to() {
        let conf = include_str!("../../../deploy/launcher/qemu.conf");
        let lines: Vec<&str> = conf.lines().map(str::trim).collect();
        for want in [
            format!("user = \"+{QEMU_UID}\""),
            format!("group = \"+{QEMU_GID}\""),
            "dynamic_ownership = 0".to_string(),
        ] {
            assert!(lines.contains(&want.as_str()), "{want:?} not in qemu.conf");
        }
        assert!(
            !conf.contains("migrate_tls"),
            "QEMU holds no key: the migration's TLS is the shim's"
        );
    }

    #[test]
    fn uuids_differ() {
        let (a, b) = (new_host_uuid().unwrap(), new_host_uuid().unwrap());
        assert_eq!(a.len(), 36);
        assert_ne!(a, b);
    }
}
