//! The node API over mutual TLS with real handshakes (rustls on loopback): a server with
//! node-a's roam identity, clients with roam-controller's, node-b's, another CA's or no
//! certificate, and a client that expects node-a but reaches a server with node-b's.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use roam_pki::{Ca, NodeFacts};
use roam_shim_api::api::Health;
use roam_shim_api::client::ShimClient;
use roam_shim_api::serve::{self, Bytes, Limits, Peer, Request};
use roam_shim_api::tls::{CA_FILE, CERT_FILE, ClientTls, Identity, KEY_FILE};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::watch;

const DAY: Duration = Duration::from_secs(24 * 3600);

fn node_identity(ca: &Ca, node: &str) -> Identity {
    let facts = NodeFacts {
        name: node.into(),
        addresses: vec![IpAddr::V4(Ipv4Addr::LOCALHOST)],
    };
    let (key, cert) = roam_pki::node_identity(ca, &facts, SystemTime::now(), DAY).unwrap();
    Identity::from_pem(&key, &cert, ca.cert_pem(), node)
}

fn controller_identity(ca: &Ca) -> Identity {
    let (key, cert) = ca.controller_identity(SystemTime::now(), DAY).unwrap();
    Identity::from_pem(&key, &cert, ca.cert_pem(), "controller")
}

/// A fresh directory for a node's PKI files.
fn pki_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("roam-shim-api-tls-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Write node `node`'s identity from `ca` into `dir`, as roam-node does.
fn write_node(dir: &Path, ca: &Ca, node: &str) {
    let facts = NodeFacts {
        name: node.into(),
        addresses: vec![IpAddr::V4(Ipv4Addr::LOCALHOST)],
    };
    let (key, cert) = roam_pki::node_identity(ca, &facts, SystemTime::now(), DAY).unwrap();
    std::fs::write(dir.join(KEY_FILE), key).unwrap();
    std::fs::write(dir.join(CERT_FILE), cert).unwrap();
    std::fs::write(dir.join(CA_FILE), ca.cert_pem()).unwrap();
}

/// A TLS server with the identity in `dir` (read for each connection) that answers every
/// request with a Health whose `version` describes the request's [`Peer`].
async fn server(dir: PathBuf) -> (SocketAddr, watch::Sender<bool>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, mut stopped) = watch::channel(false);
    let tls: serve::TlsSource = Arc::new(move || Identity::read_dir(&dir)?.server_config());
    tokio::spawn(serve::serve_tls(
        listener,
        tls,
        Limits {
            header_read_timeout: Duration::from_secs(2),
            ..Limits::DEFAULT
        },
        async move {
            let _ = stopped.changed().await;
        },
        |req: Request<Bytes>| {
            let peer = match req.extensions().get::<Peer>() {
                Some(Peer::Named(n)) => format!("named {n}"),
                Some(Peer::Anonymous) => "anonymous".into(),
                Some(Peer::Plain) => "plain".into(),
                None => "none".into(),
            };
            let body = serde_json::to_vec(&Health {
                ok: true,
                version: peer,
            })
            .unwrap();
            async move { serve::response(serve::StatusCode::OK, "application/json", body) }
        },
    ));
    (addr, stop)
}

async fn ask(addr: SocketAddr, identity: &Identity, expect: &str) -> Result<String, String> {
    let tls = ClientTls {
        identity: identity.clone(),
        server_name: expect.into(),
    };
    let c = ShimClient::with_tls(&format!("https://{addr}"), "token", &tls)
        .map_err(|e| e.to_string())?;
    c.health()
        .await
        .map(|h| h.version)
        .map_err(|e| e.to_string())
}

#[tokio::test]
async fn the_node_api_takes_roam_certificates_and_names_the_node_it_reached() {
    let ca = Ca::generate(SystemTime::now(), 365 * DAY).unwrap();
    let dir = pki_dir("a");
    write_node(&dir, &ca, "node-a");
    let (addr, _stop) = server(dir.clone()).await;

    // the controller and a peer node are named by their certificates
    assert_eq!(
        ask(addr, &controller_identity(&ca), "node-a").await,
        Ok(format!("named {}", roam_pki::CONTROLLER_NAME))
    );
    assert_eq!(
        ask(addr, &node_identity(&ca, "node-b"), "node-a").await,
        Ok("named node-b".into())
    );
    // a client that meant node-b refuses node-a's certificate, though the CA is the same
    let e = ask(addr, &controller_identity(&ca), "node-b")
        .await
        .unwrap_err();
    assert!(
        e.contains("certificate") || e.contains("Certificate"),
        "{e}"
    );
    // another CA's client certificate is refused by the server
    let stranger = Ca::generate(SystemTime::now(), 365 * DAY).unwrap();
    let foreign = {
        let (key, cert) = stranger
            .controller_identity(SystemTime::now(), DAY)
            .unwrap();
        // it trusts the real CA, so only the server's check can refuse it
        Identity::from_pem(&key, &cert, ca.cert_pem(), "stranger")
    };
    let e = ask(addr, &foreign, "node-a").await.unwrap_err();
    assert!(e.contains("unreachable"), "{e}");
    // a TLS client without a certificate gets a session, as anonymous (the shim decides per
    // route: only /v1/health)
    assert_eq!(anonymous_health(addr, &ca).await, "anonymous");
    // plain HTTP gets no answer from a TLS server
    let plain = ShimClient::new(&format!("http://{addr}"), "token").unwrap();
    assert!(plain.health().await.is_err());
    // a plain client does not take https, a TLS client not http
    assert!(ShimClient::new(&format!("https://{addr}"), "t").is_err());
    let tls = ClientTls {
        identity: controller_identity(&ca),
        server_name: "node-a".into(),
    };
    assert!(ShimClient::with_tls(&format!("http://{addr}"), "t", &tls).is_err());

    // rotation: the server reads its files for each connection; a new CA's files are used
    // at once, and a client of the old CA no longer gets through
    let new_ca = Ca::generate(SystemTime::now(), 365 * DAY).unwrap();
    write_node(&dir, &new_ca, "node-a");
    assert_eq!(
        ask(addr, &controller_identity(&new_ca), "node-a").await,
        Ok(format!("named {}", roam_pki::CONTROLLER_NAME))
    );
    assert!(
        ask(addr, &controller_identity(&ca), "node-a")
            .await
            .is_err()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_server_without_its_files_drops_the_connection_and_goes_on() {
    let ca = Ca::generate(SystemTime::now(), 365 * DAY).unwrap();
    let dir = pki_dir("missing");
    let (addr, _stop) = server(dir.clone()).await;
    assert!(
        ask(addr, &controller_identity(&ca), "node-a")
            .await
            .is_err()
    );
    let e = Identity::read_dir(&dir).unwrap_err().to_string();
    assert!(e.contains("node.key") && e.contains("roam-node"), "{e}");
    // once roam-node has written them
    write_node(&dir, &ca, "node-a");
    assert_eq!(
        ask(addr, &controller_identity(&ca), "node-a").await,
        Ok(format!("named {}", roam_pki::CONTROLLER_NAME))
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `GET /v1/health` over TLS without a client certificate (trusting `ca`): the body's
/// `version`.
async fn anonymous_health(addr: SocketAddr, ca: &Ca) -> String {
    use rustls_pki_types::pem::PemObject;
    let mut roots = tokio_rustls::rustls::RootCertStore::empty();
    for c in rustls_pki_types::CertificateDer::pem_slice_iter(ca.cert_pem().as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let config = tokio_rustls::rustls::ClientConfig::builder_with_provider(Arc::new(
        tokio_rustls::rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let name = rustls_pki_types::ServerName::try_from("node-a").unwrap();
    let mut s = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .unwrap();
    s.write_all(b"GET /v1/health HTTP/1.1\r\nHost: node-a\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut out = Vec::new();
    // a TLS peer may close without close_notify after the answer: what was read counts
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out)).await;
    let out = String::from_utf8_lossy(&out);
    let body = out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b)
        .unwrap_or_default();
    let h: Health = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {out}"));
    h.version
}
