//! The migration proxy with real TLS and real UNIX sockets: a source shim's [`Outgoing`]
//! carries what its libvirtd and QEMU write to the pod's sockets to a target shim's
//! [`proxy::serve`], which hands each stream to the target pod's socket its protocol names —
//! and to nobody else: a node outside the allow-list, roam-controller's certificate, a
//! client without a certificate and a certificate of another CA get nothing through.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use roam_shim_api::tls::Identity;
use roam_vm_shim::proxy::{self, Outgoing, Sockets};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, UnixListener, UnixStream};

const DAY: Duration = Duration::from_secs(86_400);

fn node(ca: &roam_pki::Ca, name: &str) -> Identity {
    let facts = roam_pki::NodeFacts {
        name: name.into(),
        addresses: vec!["127.0.0.1".parse().unwrap()],
    };
    let (key, cert) = roam_pki::node_identity(ca, &facts, SystemTime::now(), DAY).unwrap();
    Identity::from_pem(&key, &cert, ca.cert_pem(), name)
}

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("roam-proxy-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A stand-in for the target pod's libvirtd or QEMU at `path`: answers each connection
/// with `tag` and then echoes what it reads.
fn echo(path: PathBuf, tag: &'static [u8]) {
    let l = UnixListener::bind(path).unwrap();
    tokio::spawn(async move {
        loop {
            let (mut u, _) = l.accept().await.unwrap();
            tokio::spawn(async move {
                u.write_all(tag).await.unwrap();
                let mut buf = vec![0; 64 * 1024];
                loop {
                    match u.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => {
                            if u.write_all(&buf[..n]).await.is_err() {
                                return;
                            }
                        }
                    }
                }
            });
        }
    });
}

/// A target shim's proxy taking `allowed`, its pod's sockets in `run`.
async fn target(ca: &roam_pki::Ca, run: &Path, allowed: &[&str]) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let sockets = Sockets::new(run);
    echo(sockets.libvirtd(), b"libvirtd:");
    echo(sockets.migration(), b"qemu:");
    serve_as_node_b(ca, l, sockets, allowed);
    addr
}

/// node-b's proxy on `l`, for good.
fn serve_as_node_b(ca: &roam_pki::Ca, l: TcpListener, sockets: Sockets, allowed: &[&str]) {
    let id = node(ca, "node-b");
    let config: proxy::ServerConfigSource = Arc::new(move || {
        id.peer_server_config(&[proxy::ALPN_LIBVIRT, proxy::ALPN_MIGRATION])
            .map_err(|e| e.to_string())
    });
    let (_tx, rx) = tokio::sync::watch::channel(false);
    std::mem::forget(_tx);
    let allowed = Arc::new(allowed.iter().map(|s| s.to_string()).collect());
    tokio::spawn(proxy::serve(l, config, allowed, sockets, rx));
}

/// node-a's source side of a migration to node-b's proxy at `addr`, its sockets in `run`.
fn source_as_node_a(ca: &roam_pki::Ca, run: &Path, addr: SocketAddr) -> (Sockets, Outgoing) {
    let sockets = Sockets::new(run);
    let out = Outgoing::start(
        &sockets,
        addr,
        "node-b",
        node(ca, "node-a").client_config().unwrap(),
    )
    .unwrap();
    (sockets, out)
}

/// Through `socket`: what comes back for `send`, or an empty answer when the proxy hung up.
async fn through(socket: &Path, send: &[u8], want: usize) -> Vec<u8> {
    let mut u = UnixStream::connect(socket).await.unwrap();
    u.write_all(send).await.unwrap();
    let mut got = vec![0; want];
    let read = tokio::time::timeout(Duration::from_secs(30), u.read_exact(&mut got)).await;
    match read {
        Ok(Ok(_)) => got,
        Ok(Err(_)) => vec![],
        Err(_) => panic!(
            "no answer and no hang-up within 30 s through {}",
            socket.display()
        ),
    }
}

#[tokio::test]
async fn each_stream_reaches_the_socket_its_protocol_names() {
    let ca = roam_pki::Ca::generate(SystemTime::now(), DAY).unwrap();
    let (src, dst) = (dir("src"), dir("dst"));
    let addr = target(&ca, &dst, &["node-a", "node-b"]).await;
    let (sockets, _out) = source_as_node_a(&ca, &src, addr);
    assert_eq!(
        through(&sockets.peer(), b"rpc", 12).await,
        b"libvirtd:rpc".to_vec()
    );
    // a stream of many buffers arrives whole and in order
    let big: Vec<u8> = (0..4 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
    let mut want = b"qemu:".to_vec();
    want.extend(&big);
    let got = through(&sockets.migration(), &big, want.len()).await;
    assert!(got == want, "the migration stream came back altered");
    drop(_out);
    assert!(
        !sockets.peer().exists() && !sockets.migration().exists(),
        "the source's sockets are removed with the migration"
    );
}

#[tokio::test]
async fn no_other_identity_gets_through() {
    let ca = roam_pki::Ca::generate(SystemTime::now(), DAY).unwrap();
    let dst = dir("dst-refuse");
    let addr = target(&ca, &dst, &["node-a", "node-b"]).await;
    let now = SystemTime::now();
    let (ckey, ccert) = ca.controller_identity(now, DAY).unwrap();
    let controller = Identity::from_pem(&ckey, &ccert, ca.cert_pem(), "roam-controller");
    let other_ca = roam_pki::Ca::generate(now, DAY).unwrap();
    let mut foreign = node(&other_ca, "node-a").client_config().unwrap();
    // it trusts the target's CA, but its own certificate is another CA's
    foreign = {
        let own = node(&ca, "node-a");
        let mut c = own.client_config().unwrap();
        c.client_auth_cert_resolver = foreign.client_auth_cert_resolver.clone();
        c
    };
    for (who, config) in [
        ("node-c", node(&ca, "node-c").client_config().unwrap()),
        ("roam-controller", controller.client_config().unwrap()),
        ("another CA's node-a", foreign),
    ] {
        let src = dir(&format!("src-{}", who.replace(' ', "-")));
        let sockets = Sockets::new(&src);
        let _out = Outgoing::start(&sockets, addr, "node-b", config).unwrap();
        for s in [sockets.peer(), sockets.migration()] {
            assert_eq!(
                through(&s, b"x", 5).await,
                Vec::<u8>::new(),
                "{who} got through {}",
                s.display()
            );
        }
    }
    // a client without a certificate gets no session
    let plain = tokio_rustls_client_without_cert(&ca);
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls_pki_types::ServerName::try_from("node-b").unwrap();
    let session = tokio_rustls::TlsConnector::from(Arc::new(plain))
        .connect(name, tcp)
        .await;
    if let Ok(mut s) = session {
        // TLS 1.3: the server's refusal arrives with the first read
        let _ = s.write_all(b"x").await;
        let mut b = [0u8; 1];
        assert!(
            !matches!(s.read(&mut b).await, Ok(n) if n > 0),
            "a client without a certificate got an answer"
        );
    }
}

fn tokio_rustls_client_without_cert(ca: &roam_pki::Ca) -> tokio_rustls::rustls::ClientConfig {
    use rustls_pki_types::pem::PemObject;
    let mut roots = tokio_rustls::rustls::RootCertStore::empty();
    for c in rustls_pki_types::CertificateDer::pem_slice_iter(ca.cert_pem().as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let mut c = tokio_rustls::rustls::ClientConfig::builder_with_provider(Arc::new(
        tokio_rustls::rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    c.alpn_protocols = vec![proxy::ALPN_LIBVIRT.to_vec()];
    c
}

/// A migration back to a node whose earlier runner still terminates: that runner's proxy
/// holds the port. The new one waits for it rather than fail and says it listens only once
/// the port is its own (the target shim answers a prepare only then). A source connecting
/// while no proxy listens (one restarting) is refused and tries again rather than reset its
/// libvirt connection.
#[tokio::test]
async fn a_proxy_waits_for_its_port_and_says_when_it_listens() {
    let ca = roam_pki::Ca::generate(SystemTime::now(), DAY).unwrap();
    let (src, dst) = (dir("late-src"), dir("late-dst"));
    let target_sockets = Sockets::new(&dst);
    echo(target_sockets.libvirtd(), b"libvirtd:");
    // the earlier runner's proxy
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = held.local_addr().unwrap();
    proxy::clear_listening(&target_sockets).unwrap();
    let binding = tokio::spawn(proxy::bind_when_free(addr, Duration::from_secs(30)));
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!binding.is_finished(), "bound a port another socket holds");
    let not_yet = proxy::wait_listening(&target_sockets, addr, Duration::from_millis(200)).await;
    assert!(
        not_yet.unwrap_err().contains("has not listened"),
        "a prepare must not pass before the proxy listens"
    );
    drop(held);
    let l = tokio::time::timeout(Duration::from_secs(30), binding)
        .await
        .expect("bound once the port is free")
        .unwrap()
        .unwrap();
    proxy::mark_listening(&target_sockets, addr).unwrap();
    proxy::wait_listening(&target_sockets, addr, Duration::from_secs(5))
        .await
        .unwrap();
    // another address in the file is a disagreement, said as such
    let other: SocketAddr = "127.0.0.1:1".parse().unwrap();
    let e = proxy::wait_listening(&target_sockets, other, Duration::from_millis(100))
        .await
        .unwrap_err();
    assert!(e.contains("not 127.0.0.1:1"), "{e}");

    // the proxy restarts: for a moment nothing listens, and the source connects then
    drop(l);
    proxy::clear_listening(&target_sockets).unwrap();
    assert!(!target_sockets.listening().exists());
    let (sockets, _out) = source_as_node_a(&ca, &src, addr);
    let answer = tokio::spawn({
        let peer = sockets.peer();
        async move { through(&peer, b"rpc", 12).await }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let l = proxy::bind_when_free(addr, Duration::from_secs(30))
        .await
        .unwrap();
    serve_as_node_b(&ca, l, target_sockets, &["node-a", "node-b"]);
    assert_eq!(answer.await.unwrap(), b"libvirtd:rpc".to_vec());
}
