//! The migration's way between two nodes: libvirt and QEMU speak over UNIX sockets of the
//! runner pod only, and the shims carry their streams between the nodes over mutual TLS
//! with the nodes' identities — as KubeVirt's migration proxy does. No libvirtd listens on
//! the network and no QEMU reads a key: the node's key stays with the shim.
//!
//! A live migration (peer-to-peer) opens two kinds of connection from the source node to the
//! target's:
//! - **libvirt's**: the source libvirtd is given `qemu+unix:///system?socket=`
//!   [`Sockets::peer`] as the target's URI; the source shim's [`Outgoing`] listens there and
//!   carries each connection to the target shim, which hands it to its libvirtd's own socket
//!   ([`Sockets::libvirtd`]);
//! - **QEMU's stream**: the migration URI is `unix://` [`Sockets::migration`]: the target
//!   QEMU listens there in its pod, the source QEMU connects there in its own (libvirt takes
//!   the one path for both sides), where the source shim listens; the shims carry it the
//!   same way.
//!
//! Which of the two a connection is, the source says with TLS's application protocol
//! ([`ALPN_LIBVIRT`], [`ALPN_MIGRATION`]); the target takes only certificates of the roam CA
//! whose node is in its allow-list ([`admit`]: its own node and the migration's source,
//! never roam-controller's or another node's), and connects only to those two sockets.

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls_pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_rustls::rustls::{ClientConfig, ServerConfig};
use tokio_rustls::{TlsAcceptor, TlsConnector};

/// The application protocol of libvirt's connection (the source libvirtd to the target's).
pub const ALPN_LIBVIRT: &[u8] = b"roam-libvirt/1";
/// The application protocol of QEMU's migration stream.
pub const ALPN_MIGRATION: &[u8] = b"roam-migration/1";
/// How long a TLS handshake or a connection to the other node may take.
const HANDSHAKE_BOUND: Duration = Duration::from_secs(10);
/// The copy buffers: QEMU's stream is bulk (guest memory), larger buffers mean fewer
/// wake-ups per GiB.
const COPY_BUFFER: usize = 256 * 1024;

/// The runner pod's UNIX sockets of a migration, in the libvirt run directory both of its
/// containers mount (`/run/libvirt`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sockets {
    dir: PathBuf,
}

impl Sockets {
    /// The sockets under `run_dir`.
    pub fn new(run_dir: &Path) -> Sockets {
        Sockets {
            dir: run_dir.to_path_buf(),
        }
    }

    /// The pod's libvirtd (`unix_sock_dir` of [`crate::libvirtd::config`]).
    pub fn libvirtd(&self) -> PathBuf {
        self.dir.join("libvirt-sock")
    }

    /// Where the source libvirtd reaches the target's (the source shim listens).
    pub fn peer(&self) -> PathBuf {
        self.dir.join("roam-migration-peer.sock")
    }

    /// QEMU's stream: on the source the shim listens there and QEMU connects; on the target
    /// QEMU listens there and the shim connects.
    pub fn migration(&self) -> PathBuf {
        self.dir.join("roam-migration.sock")
    }

    /// The target libvirtd's URI as the source libvirtd is given it.
    pub fn peer_uri(&self) -> String {
        format!("qemu+unix:///system?socket={}", self.peer().display())
    }

    /// The migration URI libvirt is given.
    pub fn migration_uri(&self) -> String {
        format!("unix://{}", self.migration().display())
    }

    /// Where the pod's `migration-proxy` says it listens ([`mark_listening`]): the target
    /// shim answers a prepare only then ([`wait_listening`]).
    pub fn listening(&self) -> PathBuf {
        self.dir.join("roam-migration-proxy.listening")
    }
}

/// How long a listener of a runner waits for its port: the VM's runner it replaces on the
/// node (a migration back to a node whose earlier runner still terminates) holds the same
/// ports until it exits, within its pod's 30 s grace period.
pub const PORT_WAIT: Duration = Duration::from_secs(60);

/// Bind `addr`, waiting up to `bound` while another process holds it (and only then: any
/// other error is returned at once) rather than exit into the kubelet's restart back-off.
pub async fn bind_when_free(addr: SocketAddr, bound: Duration) -> std::io::Result<TcpListener> {
    let deadline = tokio::time::Instant::now() + bound;
    let mut told = false;
    loop {
        match TcpListener::bind(addr).await {
            Err(e)
                if e.kind() == std::io::ErrorKind::AddrInUse
                    && tokio::time::Instant::now() < deadline =>
            {
                if !told {
                    tracing::info!(%addr, "the port is in use (a runner of this node still terminating?): waiting up to {bound:?}");
                    told = true;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            r => return r,
        }
    }
}

/// Say that this pod's proxy listens on `addr` (replacing the file at once: the shim never
/// reads half of it).
pub fn mark_listening(sockets: &Sockets, addr: SocketAddr) -> std::io::Result<()> {
    let file = sockets.listening();
    let tmp = file.with_extension("tmp");
    std::fs::write(&tmp, addr.to_string())?;
    std::fs::rename(&tmp, &file)
}

/// Take back [`mark_listening`] (a proxy starting again has not bound yet).
pub fn clear_listening(sockets: &Sockets) -> std::io::Result<()> {
    match std::fs::remove_file(sockets.listening()) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Wait up to `bound` until this pod's proxy listens on `addr`: its port is then its own,
/// not that of an earlier runner on the node, whose proxy would take the source's
/// connections to another libvirtd, or of none, which would refuse them.
pub async fn wait_listening(
    sockets: &Sockets,
    addr: SocketAddr,
    bound: Duration,
) -> Result<(), String> {
    let want = addr.to_string();
    let deadline = tokio::time::Instant::now() + bound;
    loop {
        let seen = std::fs::read_to_string(sockets.listening()).ok();
        if seen.as_deref() == Some(want.as_str()) {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(match seen {
                Some(other) => format!(
                    "the runner's migration-proxy listens on {other}, not {want}: \
                     the pod's containers disagree (a partial upgrade?)"
                ),
                None => format!(
                    "the runner's migration-proxy container has not listened on {want} \
                     within {bound:?}: see its log (kubectl -n <roam namespace> logs <runner> \
                     -c migration-proxy)"
                ),
            });
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What `roam-shim proxy` (the runner's `migration-proxy` container: the target's side,
/// apart from the shim, so that a restarted shim leaves a running migration's streams
/// alone) was asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Args {
    /// Where it takes a source's connections (`--listen IP:PORT`).
    pub listen: SocketAddr,
    /// The nodes whose certificates it takes (`--allowed-peers NODE,...`).
    pub allowed_peers: Vec<String>,
    /// The node's roam PKI directory (`--pki-dir`).
    pub pki_dir: PathBuf,
    /// The pod's libvirt run directory (`--run-dir`, default `/run/libvirt`).
    pub run_dir: PathBuf,
}

/// The usage line.
pub const USAGE: &str = "roam-shim proxy --listen IP:PORT --allowed-peers NODE[,NODE...] --pki-dir DIR [--run-dir DIR(/run/libvirt)]";

/// Parse `roam-shim proxy`'s flags (pure).
pub fn parse(args: &[String]) -> Result<Args, String> {
    let (mut listen, mut peers, mut pki, mut run) = (None, None, None, None);
    let known = ["listen", "allowed-peers", "pki-dir", "run-dir"];
    let given = roam_contract::flags::pairs(args.iter().cloned(), &known)
        .map_err(|e| format!("{e}; usage: {USAGE}"))?;
    for (flag, value) in given {
        match flag.as_str() {
            "listen" => {
                listen =
                    Some(value.parse::<SocketAddr>().map_err(|_| {
                        format!("--listen {value:?}: give this node's IP and a port")
                    })?)
            }
            "allowed-peers" => {
                let list: Vec<String> = value
                    .split(',')
                    .map(str::trim)
                    .filter(|n| !n.is_empty())
                    .map(String::from)
                    .collect();
                if let Some(p) = list
                    .iter()
                    .find_map(|n| roam_shim_api::limits::node_name_problem(n))
                {
                    return Err(format!("--allowed-peers: {p}"));
                }
                peers = Some(list);
            }
            "pki-dir" => pki = Some(PathBuf::from(value)),
            "run-dir" => run = Some(PathBuf::from(value)),
            other => return Err(format!("unknown flag --{other}; usage: {USAGE}")),
        }
    }
    let need = |what: &str| format!("{what} is required; usage: {USAGE}");
    Ok(Args {
        listen: listen.ok_or_else(|| need("--listen"))?,
        allowed_peers: peers.ok_or_else(|| need("--allowed-peers"))?,
        pki_dir: pki.ok_or_else(|| need("--pki-dir"))?,
        run_dir: run.unwrap_or_else(|| PathBuf::from(crate::libvirtd::RUN_DIR)),
    })
}

/// Which stream a connection carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    /// libvirt's connection.
    Libvirt,
    /// QEMU's migration stream.
    Migration,
}

impl Stream {
    /// The application protocol that names it.
    pub fn alpn(self) -> &'static [u8] {
        match self {
            Stream::Libvirt => ALPN_LIBVIRT,
            Stream::Migration => ALPN_MIGRATION,
        }
    }

    /// The local socket a target connects it to.
    pub fn target_socket(self, s: &Sockets) -> PathBuf {
        match self {
            Stream::Libvirt => s.libvirtd(),
            Stream::Migration => s.migration(),
        }
    }
}

/// Whether the target takes a connection (pure): `node` is the common name of the client's
/// verified certificate, `alpn` the protocol TLS agreed on. `Err` says why not.
pub fn admit(
    alpn: Option<&[u8]>,
    node: Option<&str>,
    allowed: &[String],
) -> Result<Stream, String> {
    let node = node.ok_or("a certificate without a common name names no node")?;
    if !allowed.iter().any(|a| a == node) {
        return Err(format!(
            "{node:?} is not a node this VM migrates from (allowed: {})",
            if allowed.is_empty() {
                "none".to_string()
            } else {
                allowed.join(", ")
            }
        ));
    }
    match alpn {
        Some(p) if p == ALPN_LIBVIRT => Ok(Stream::Libvirt),
        Some(p) if p == ALPN_MIGRATION => Ok(Stream::Migration),
        _ => Err(format!("node {node}: no roam migration protocol asked for")),
    }
}

/// The target's TLS settings, made for each connection (a renewed certificate counts from
/// the next one): [`roam_shim_api::tls::Identity::peer_server_config`] with both protocols.
pub type ServerConfigSource = Arc<dyn Fn() -> Result<Arc<ServerConfig>, String> + Send + Sync>;

/// Serve a target's side on `listener` until `stop`: each connection's TLS handshake
/// (`config`), then [`admit`] against `allowed`, then its bytes to and from the local socket.
pub async fn serve(
    listener: TcpListener,
    config: ServerConfigSource,
    allowed: Arc<Vec<String>>,
    sockets: Sockets,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let (tcp, from) = tokio::select! {
            a = listener.accept() => match a {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!("migration proxy: accept: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            // (the guard wait_for returns must not live across an await: it is not Send)
            () = async { drop(stop.wait_for(|s| *s).await) } => return,
        };
        let acceptor = match config() {
            Ok(c) => TlsAcceptor::from(c),
            Err(e) => {
                tracing::warn!(%from, "migration proxy: this node's identity: {e}");
                continue;
            }
        };
        let (allowed, sockets) = (allowed.clone(), sockets.clone());
        tokio::spawn(async move {
            let _ = tcp.set_nodelay(true);
            let tls = match tokio::time::timeout(HANDSHAKE_BOUND, acceptor.accept(tcp)).await {
                Ok(Ok(t)) => t,
                Ok(Err(e)) => {
                    tracing::warn!(%from, "migration proxy: TLS handshake refused: {e}");
                    return;
                }
                Err(_) => {
                    tracing::warn!(%from, "migration proxy: no TLS handshake within {HANDSHAKE_BOUND:?}");
                    return;
                }
            };
            let conn = tls.get_ref().1;
            let node = conn
                .peer_certificates()
                .and_then(|c| c.first())
                .and_then(|c| roam_shim_api::tls::peer_name(c));
            let stream = match admit(conn.alpn_protocol(), node.as_deref(), &allowed) {
                Ok(s) => s,
                Err(why) => {
                    tracing::warn!(%from, "migration proxy: refused: {why}");
                    return;
                }
            };
            let path = stream.target_socket(&sockets);
            let local = match UnixStream::connect(&path).await {
                Ok(u) => u,
                Err(e) => {
                    tracing::warn!(%from, ?stream, "migration proxy: {}: {e}", path.display());
                    return;
                }
            };
            tracing::info!(%from, node = node.as_deref().unwrap_or(""), ?stream, "migration proxy: carrying");
            carry(tls, local, stream).await;
        });
    }
}

/// Copy both ways until both sides are done.
async fn carry<A, B>(mut a: A, mut b: B, stream: Stream)
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    match tokio::io::copy_bidirectional_with_sizes(&mut a, &mut b, COPY_BUFFER, COPY_BUFFER).await {
        Ok((out, back)) => {
            tracing::info!(
                ?stream,
                bytes_out = out,
                bytes_back = back,
                "migration proxy: done"
            )
        }
        // the other side went away (an aborted migration, a QEMU that closed first)
        Err(e) => tracing::info!(?stream, "migration proxy: ended: {e}"),
    }
}

/// A source's side, for one migration: listens on [`Sockets::peer`] and
/// [`Sockets::migration`] and carries each connection to the target shim. Dropped: stops
/// listening and removes the sockets (the connections it carries end with the migration).
pub struct Outgoing {
    tasks: Vec<JoinHandle<()>>,
    paths: Vec<PathBuf>,
}

impl Outgoing {
    /// Listen (in a tokio runtime) for the migration to `target`, whose certificate must name
    /// `node`; `config`: this node's client settings
    /// ([`roam_shim_api::tls::Identity::client_config`]).
    pub fn start(
        sockets: &Sockets,
        target: SocketAddr,
        node: &str,
        config: ClientConfig,
    ) -> std::io::Result<Outgoing> {
        let name = ServerName::try_from(node.to_string()).map_err(|e| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("node {node:?}: not a name a certificate can hold: {e}"),
            )
        })?;
        let mut out = Outgoing {
            tasks: vec![],
            paths: vec![],
        };
        for (path, stream) in [
            (sockets.peer(), Stream::Libvirt),
            (sockets.migration(), Stream::Migration),
        ] {
            // a socket left by an earlier migration of this pod
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
            let listener = UnixListener::bind(&path)?;
            out.paths.push(path.clone());
            // libvirtd (root) connects to the peer socket; QEMU, not root, to the other (the
            // directory is the pod's own: no other pod sees it; and the shim may not chown)
            let mode = match stream {
                Stream::Migration => 0o666,
                Stream::Libvirt => 0o600,
            };
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))?;
            let mut c = config.clone();
            c.alpn_protocols = vec![stream.alpn().to_vec()];
            let connector = TlsConnector::from(Arc::new(c));
            let name = name.clone();
            out.tasks.push(tokio::spawn(async move {
                loop {
                    let local = match listener.accept().await {
                        Ok((u, _)) => u,
                        Err(e) => {
                            tracing::warn!(?stream, "migration proxy: accept: {e}");
                            return;
                        }
                    };
                    let (connector, name) = (connector.clone(), name.clone());
                    tokio::spawn(async move {
                        match connect(&connector, target, name).await {
                            Ok(tls) => carry(local, tls, stream).await,
                            Err(e) => tracing::warn!(%target, ?stream, "migration proxy: {e}"),
                        }
                    });
                }
            }));
        }
        Ok(out)
    }
}

/// TCP then TLS to the target shim, within [`HANDSHAKE_BOUND`].
async fn connect(
    connector: &TlsConnector,
    target: SocketAddr,
    name: ServerName<'static>,
) -> Result<tokio_rustls::client::TlsStream<TcpStream>, String> {
    let go = async {
        // a proxy container restarting refuses for a moment: the bound below covers it
        let tcp = loop {
            match TcpStream::connect(target).await {
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                    tokio::time::sleep(Duration::from_millis(100)).await
                }
                r => break r.map_err(|e| format!("connect: {e}"))?,
            }
        };
        let _ = tcp.set_nodelay(true);
        connector
            .connect(name, tcp)
            .await
            .map_err(|e| format!("TLS handshake: {e}"))
    };
    tokio::time::timeout(HANDSHAKE_BOUND, go)
        .await
        .map_err(|_| format!("no TLS session within {HANDSHAKE_BOUND:?}"))?
}

impl Drop for Outgoing {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
        for p in &self.paths {
            let _ = std::fs::remove_file(p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_allowed_node_asking_for_a_roam_protocol_gets_through() {
        let allowed = vec!["node-a".to_string(), "node-b".to_string()];
        assert_eq!(
            admit(Some(ALPN_LIBVIRT), Some("node-b"), &allowed),
            Ok(Stream::Libvirt)
        );
        assert_eq!(
            admit(Some(ALPN_MIGRATION), Some("node-a"), &allowed),
            Ok(Stream::Migration)
        );
        for (alpn, node, says) in [
            (Some(ALPN_LIBVIRT), Some("node-c"), "not a node"),
            (Some(ALPN_LIBVIRT), Some("roam-controller"), "not a node"),
            (Some(ALPN_LIBVIRT), None, "without a common name"),
            (None, Some("node-b"), "no roam migration protocol"),
            (
                Some(&b"h2"[..]),
                Some("node-b"),
                "no roam migration protocol",
            ),
        ] {
            let e = admit(alpn, node, &allowed).unwrap_err();
            assert!(e.contains(says), "{node:?}: {e}");
        }
        let e = admit(Some(ALPN_LIBVIRT), Some("node-a"), &[]).unwrap_err();
        assert!(e.contains("allowed: none"), "{e}");
    }

    #[test]
    fn proxy_flags() {
        let w = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let a = parse(&w(&[
            "--listen",
            "10.0.0.12:17201",
            "--allowed-peers",
            "node-b,node-a",
            "--pki-dir",
            "/var/lib/roam/pki",
        ]))
        .unwrap();
        assert_eq!(a.allowed_peers, ["node-b", "node-a"]);
        assert_eq!(a.run_dir, Path::new("/run/libvirt"));
        for (args, says) in [
            (w(&["--listen", "x"]), "IP and a port"),
            (w(&["--allowed-peers", "Node_A"]), "lowercase"),
            (
                w(&["--listen", "10.0.0.1:1", "--pki-dir", "/p"]),
                "--allowed-peers is required",
            ),
            (w(&["--port", "1"]), "unknown flag"),
        ] {
            let e = parse(&args).unwrap_err();
            assert!(e.contains(says), "{args:?}: {e}");
        }
    }

    #[test]
    fn the_uris_name_the_pods_sockets() {
        let s = Sockets::new(Path::new("/run/libvirt"));
        assert_eq!(
            s.peer_uri(),
            "qemu+unix:///system?socket=/run/libvirt/roam-migration-peer.sock"
        );
        assert_eq!(s.migration_uri(), "unix:///run/libvirt/roam-migration.sock");
        assert_eq!(s.libvirtd(), Path::new("/run/libvirt/libvirt-sock"));
    }
}
