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
//! With `--disk IMAGE` it first opens and checks the VM's disk image and pins it at
//! [`crate::disk::PINNED`] (see [`crate::disk`]): this container is the mount namespace QEMU
//! runs in, and an image it refuses starts no libvirtd (the container fails with the reason,
//! which the VM's condition quotes).
//!
//! QEMU's settings (`/etc/libvirt/qemu.conf`: root, no cgroups, no namespaces, no virtlogd)
//! are the image's (`deploy/launcher/qemu.conf`).
//!
//! With `--pki-dir` (the node's roam PKI directory, which roam-node keeps: `node.key`,
//! `node.crt`, `ca.crt`) the migration is mutually authenticated and encrypted: libvirtd
//! listens with TLS only (no plain TCP), asks every client for a certificate of the roam CA,
//! and presents the node's; [`tls_layout`] lays out the same files under the names libvirt's
//! client (`?pkipath=`) and QEMU's migration TLS (`migrate_tls_x509_cert_dir` in the image's
//! qemu.conf) look for, as symbolic links, so a renewed certificate is what the next
//! migration uses. Beside them goes [`DH_PARAMS`], the RFC 7919 group QEMU's incoming side
//! would otherwise generate itself for every migration (see there).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use roam_shim_api::launch;

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
    /// The node's roam PKI directory: TLS with client certificates instead of plain TCP.
    pub pki_dir: Option<PathBuf>,
    /// The VM's disk image, checked and pinned for QEMU before libvirtd starts.
    pub disk: Option<Disk>,
    /// The nodes whose roam certificates the TLS listener takes (`--allowed-peer`, repeated):
    /// its own node and, on a migration's target, the source. Empty: any roam certificate.
    pub allowed_peers: Vec<String>,
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
pub const USAGE: &str = "roam-shim libvirtd --listen IP:PORT [--libvirtd PATH(/usr/sbin/libvirtd)] [--run-dir DIR(/run/libvirt)] [--pki-dir DIR [--allowed-peer NODE]...] [--disk IMAGE [--disk-format raw|qcow2(qcow2)] [--disk-access read-only|read-write(read-write)] [--image-root DIR(/)]]";

/// Parse `roam-shim libvirtd`'s flags (pure).
pub fn parse(args: &[String]) -> Result<Args, String> {
    let mut listen = None;
    let mut libvirtd = PathBuf::from(LIBVIRTD);
    let mut run_dir = PathBuf::from(RUN_DIR);
    let mut pki_dir = None;
    let (mut image, mut format, mut read_only, mut root) = (None, None, None, None);
    let mut allowed_peers = Vec::new();
    let absolute = |flag: &str, value: &str| {
        let d = PathBuf::from(value);
        if d.is_absolute() {
            Ok(d)
        } else {
            Err(format!("{flag} {value}: give an absolute path"))
        }
    };
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
            "--pki-dir" => pki_dir = Some(absolute(flag, value)?),
            "--allowed-peer" => {
                // a node name (a DNS subdomain): it goes into libvirtd's configuration quoted
                let ok = !value.is_empty()
                    && value.len() <= 253
                    && value.chars().all(|c| {
                        c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.'
                    });
                if !ok {
                    return Err(format!(
                        "--allowed-peer {value:?}: give a node's name (lowercase letters, digits, '-', '.')"
                    ));
                }
                allowed_peers.push(value.clone());
            }
            launch::flag::DISK => image = Some(absolute(flag, value)?),
            launch::flag::IMAGE_ROOT => root = Some(absolute(flag, value)?),
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
    let listen = listen.ok_or_else(|| format!("--listen is required; usage: {USAGE}"))?;
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
    if !allowed_peers.is_empty() && pki_dir.is_none() {
        return Err(format!(
            "--allowed-peer names the certificates the TLS listener takes: give --pki-dir; usage: {USAGE}"
        ));
    }
    Ok(Args {
        listen,
        libvirtd,
        run_dir,
        pki_dir,
        disk,
        allowed_peers,
    })
}

/// The daemon's configuration (pure): unix sockets in `run_dir` for the pod's shim, a
/// network socket on `listen` for a migration's source libvirtd, the daemon's own
/// `host_uuid`, logs on stderr (the container's log).
///
/// With `pki_dir` the network socket is TLS only: the node's certificate and key, the roam
/// CA, and every client must present a certificate of that CA (`tls_no_verify_certificate =
/// 0`). Without, plain TCP without authentication (the tests' own libvirtds).
pub fn config(
    listen: SocketAddr,
    host_uuid: &str,
    run_dir: &Path,
    pki_dir: Option<&Path>,
    allowed_peers: &[String],
) -> String {
    let ip = listen.ip().to_string();
    let network = match pki_dir {
        None => format!(
            "listen_tls = 0\n\
             listen_tcp = 1\n\
             listen_addr = \"{ip}\"\n\
             tcp_port = \"{port}\"\n\
             auth_tcp = \"none\"\n",
            port = listen.port()
        ),
        Some(p) => format!(
            "listen_tls = 1\n\
             listen_tcp = 0\n\
             listen_addr = \"{ip}\"\n\
             tls_port = \"{port}\"\n\
             auth_tls = \"none\"\n\
             tls_no_verify_certificate = 0\n\
             key_file = \"{key}\"\n\
             cert_file = \"{cert}\"\n\
             ca_file = \"{ca}\"\n\
             {allowed}",
            port = listen.port(),
            key = p.join(NODE_KEY).display(),
            cert = p.join(NODE_CERT).display(),
            ca = p.join(CA_CERT).display(),
            allowed = allowed_dn_list(allowed_peers),
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

/// `tls_allowed_dn_list` for the nodes `peers` (a roam node certificate's subject is
/// `CN=<node>`); nothing for none (any certificate of the roam CA).
fn allowed_dn_list(peers: &[String]) -> String {
    if peers.is_empty() {
        return String::new();
    }
    let dns: Vec<String> = peers.iter().map(|p| format!("\"CN={p}\"")).collect();
    format!("tls_allowed_dn_list = [{}]\n", dns.join(", "))
}

/// The node's key, certificate and the CA bundle in its PKI directory (roam-node's names).
pub const NODE_KEY: &str = "node.key";
/// See [`NODE_KEY`].
pub const NODE_CERT: &str = "node.crt";
/// See [`NODE_KEY`].
pub const CA_CERT: &str = "ca.crt";

/// Where, under the run directory, libvirt's client finds its certificates (the peer URI's
/// `?pkipath=`: `/run/libvirt/pki/libvirt`).
pub const CLIENT_PKI: &str = "pki/libvirt";
/// Where QEMU's migration TLS finds its certificates (the image's qemu.conf
/// `migrate_tls_x509_cert_dir`: `/run/libvirt/pki/qemu`).
pub const QEMU_PKI: &str = "pki/qemu";

/// The links that give libvirt's client and QEMU the node's identity (pure): (directory under
/// the run directory, file name there, the PKI directory's file it points to).
pub fn tls_layout() -> Vec<(&'static str, &'static str, &'static str)> {
    vec![
        (CLIENT_PKI, "cacert.pem", CA_CERT),
        (CLIENT_PKI, "clientcert.pem", NODE_CERT),
        (CLIENT_PKI, "clientkey.pem", NODE_KEY),
        (QEMU_PKI, "ca-cert.pem", CA_CERT),
        (QEMU_PKI, "server-cert.pem", NODE_CERT),
        (QEMU_PKI, "server-key.pem", NODE_KEY),
        (QEMU_PKI, "client-cert.pem", NODE_CERT),
        (QEMU_PKI, "client-key.pem", NODE_KEY),
    ]
}

/// The Diffie-Hellman group QEMU's migration TLS server offers (`dh-params.pem` in
/// [`QEMU_PKI`]): RFC 7919's ffdhe3072, a published group (PKCS#3, as GnuTLS exports
/// `gnutls_ffdhe_3072_group_prime`; `openssl dhparam -text` names it `GROUP: ffdhe3072`).
/// Without the file, QEMU's incoming side (`tls-creds-x509`, endpoint server) calls
/// `gnutls_dh_params_generate2(2048)` in every target QEMU: a prime search of 0.1–0.5 s on an
/// idle core of this machine, more beside two guests, spent inside every migration. A
/// published group is also what RFC 7919 asks servers to use; TLS 1.3 key exchange is ECDHE
/// anyway, the group only matters to a TLS 1.2 DHE suite.
pub const DH_PARAMS: &str = include_str!("ffdhe3072.pem");

/// Make [`tls_layout`]'s links under `run_dir` to the files of `pki_dir`, and write
/// [`DH_PARAMS`] beside QEMU's.
pub fn link_tls(run_dir: &Path, pki_dir: &Path) -> std::io::Result<()> {
    for (dir, name, target) in tls_layout() {
        let d = run_dir.join(dir);
        std::fs::create_dir_all(&d)?;
        let link = d.join(name);
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(pki_dir.join(target), &link)?;
    }
    std::fs::write(run_dir.join(QEMU_PKI).join("dh-params.pem"), DH_PARAMS)
}

/// What is missing from the node's PKI directory, if anything (the certificate roam-node
/// asks for may not be there yet on a node that just joined).
pub fn pki_missing(pki_dir: &Path) -> Option<String> {
    let missing: Vec<&str> = [NODE_KEY, NODE_CERT, CA_CERT]
        .into_iter()
        .filter(|f| !pki_dir.join(f).is_file())
        .collect();
    (!missing.is_empty()).then(|| {
        format!(
            "no {} in {}: roam-node (DaemonSet roam-system/roam-node) puts the node's \
             certificate there; is it running and ready on this node?",
            missing.join(", "),
            pki_dir.display()
        )
    })
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
            None,
            &[],
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
            "[fd00::1]:18105".parse().unwrap(),
            "u",
            Path::new("/r"),
            None,
            &[],
        );
        assert!(c.contains("listen_addr = \"fd00::1\""), "{c}");
    }

    #[test]
    fn with_the_nodes_pki_the_daemon_listens_with_tls_only_and_verifies_clients() {
        let c = config(
            "10.0.0.11:18105".parse().unwrap(),
            "u",
            Path::new("/run/libvirt"),
            Some(Path::new("/var/lib/roam/pki")),
            &[],
        );
        for line in [
            "listen_tls = 1",
            "listen_tcp = 0",
            "tls_port = \"18105\"",
            "listen_addr = \"10.0.0.11\"",
            "tls_no_verify_certificate = 0",
            "key_file = \"/var/lib/roam/pki/node.key\"",
            "cert_file = \"/var/lib/roam/pki/node.crt\"",
            "ca_file = \"/var/lib/roam/pki/ca.crt\"",
        ] {
            assert!(c.lines().any(|l| l == line), "missing {line:?} in\n{c}");
        }
        assert!(!c.contains("auth_tcp"), "{c}");
        let a = parse(&s(&[
            "--listen",
            "10.0.0.11:1",
            "--pki-dir",
            "/var/lib/roam/pki",
        ]))
        .unwrap();
        assert_eq!(a.pki_dir, Some(PathBuf::from("/var/lib/roam/pki")));
        assert!(parse(&s(&["--listen", "10.0.0.11:1", "--pki-dir", "pki"])).is_err());
        assert!(
            !c.contains("tls_allowed_dn_list"),
            "any roam certificate: {c}"
        );
    }

    #[test]
    fn only_the_named_nodes_certificates_open_the_daemon() {
        let a = parse(&s(&[
            "--listen",
            "10.0.0.12:1",
            "--pki-dir",
            "/p",
            "--allowed-peer",
            "node-b",
            "--allowed-peer",
            "node-a",
        ]))
        .unwrap();
        assert_eq!(a.allowed_peers, vec!["node-b", "node-a"]);
        let c = config(
            a.listen,
            "u",
            &a.run_dir,
            a.pki_dir.as_deref(),
            &a.allowed_peers,
        );
        assert!(
            c.lines()
                .any(|l| l == "tls_allowed_dn_list = [\"CN=node-b\", \"CN=node-a\"]"),
            "{c}"
        );
        for (args, says) in [
            (
                vec!["--listen", "10.0.0.1:1", "--allowed-peer", "node-a"],
                "give --pki-dir",
            ),
            (
                vec![
                    "--listen",
                    "10.0.0.1:1",
                    "--pki-dir",
                    "/p",
                    "--allowed-peer",
                    "n\", x",
                ],
                "a node's name",
            ),
            (
                vec![
                    "--listen",
                    "10.0.0.1:1",
                    "--pki-dir",
                    "/p",
                    "--allowed-peer",
                    "",
                ],
                "a node's name",
            ),
        ] {
            let e = parse(&s(&args)).unwrap_err();
            assert!(e.contains(says), "{args:?}: {e}");
        }
    }

    #[test]
    fn the_tls_links_point_at_the_nodes_files() {
        let run = std::env::temp_dir().join(format!("roam-libvirtd-tls-{}", std::process::id()));
        let pki = run.join("node-pki");
        std::fs::create_dir_all(&pki).unwrap();
        assert!(
            pki_missing(&pki)
                .unwrap()
                .contains("node.key, node.crt, ca.crt")
        );
        for f in [NODE_KEY, NODE_CERT, CA_CERT] {
            std::fs::write(pki.join(f), f).unwrap();
        }
        assert_eq!(pki_missing(&pki), None);
        link_tls(&run, &pki).unwrap();
        // twice: a restarted container finds the links already there
        link_tls(&run, &pki).unwrap();
        let read = |p: &str| std::fs::read_to_string(run.join(p)).unwrap();
        assert_eq!(read("pki/libvirt/clientkey.pem"), NODE_KEY);
        assert_eq!(read("pki/qemu/server-cert.pem"), NODE_CERT);
        assert_eq!(read("pki/qemu/ca-cert.pem"), CA_CERT);
        // a renewed certificate is what the links show
        std::fs::write(pki.join(NODE_CERT), "renewed").unwrap();
        assert_eq!(read("pki/qemu/client-cert.pem"), "renewed");
        assert_eq!(read("pki/qemu/dh-params.pem"), DH_PARAMS);
        let _ = std::fs::remove_dir_all(&run);
    }

    #[test]
    fn uuids_differ() {
        let (a, b) = (new_host_uuid().unwrap(), new_host_uuid().unwrap());
        assert_eq!(a.len(), 36);
        assert_ne!(a, b);
    }
}
