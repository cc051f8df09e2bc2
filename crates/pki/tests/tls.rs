//! Real TLS handshakes with roam-pki's node certificates (rustls, in memory): a node's
//! certificate passes for its own name and address, not for another node's, and a client
//! with another CA's certificate is refused.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use roam_pki::{Ca, NodeFacts};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{ClientConfig, RootCertStore, ServerConfig};

const DAY: Duration = Duration::from_secs(24 * 3600);

fn new_ca() -> Ca {
    Ca::generate(SystemTime::now(), 365 * DAY).unwrap()
}

/// A key and the certificate `ca` issues for `node` (address 10.213.0.`last`).
fn node_cert(ca: &Ca, node: &str, last: u8) -> (String, String) {
    let facts = NodeFacts {
        name: node.into(),
        addresses: vec![IpAddr::V4(Ipv4Addr::new(10, 213, 0, last))],
    };
    roam_pki::node_identity(ca, &facts, SystemTime::now(), DAY).unwrap()
}

fn certs(pem: &str) -> Vec<CertificateDer<'static>> {
    CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<std::result::Result<_, _>>()
        .unwrap()
}

fn roots(ca: &Ca) -> Arc<RootCertStore> {
    let mut r = RootCertStore::empty();
    for c in certs(ca.cert_pem()) {
        r.add(c).unwrap();
    }
    Arc::new(r)
}

/// A TLS handshake between a server presenting `server` and a client presenting `client`,
/// each trusting `ca`; the client expects the server to be `expect`.
async fn handshake(
    ca: &Ca,
    server: &(String, String),
    client: &(String, String),
    expect: &str,
) -> std::result::Result<(), String> {
    let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let verifier = WebPkiClientVerifier::builder_with_provider(roots(ca), provider.clone())
        .build()
        .unwrap();
    let key = |pem: &str| PrivateKeyDer::from_pem_slice(pem.as_bytes()).unwrap();
    let server_config = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs(&server.1), key(&server.0))
        .unwrap();
    let client_config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots(ca))
        .with_client_auth_cert(certs(&client.1), key(&client.0))
        .unwrap();
    let (a, b) = tokio::io::duplex(64 * 1024);
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server_config));
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client_config));
    let name = ServerName::try_from(expect.to_string()).unwrap();
    let server = tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        let mut s = acceptor.accept(a).await.map_err(|e| e.to_string())?;
        s.write_all(b"ok").await.map_err(|e| e.to_string())?;
        s.shutdown().await.map_err(|e| e.to_string())
    });
    let client = async {
        use tokio::io::AsyncReadExt;
        let mut c = connector
            .connect(name, b)
            .await
            .map_err(|e| e.to_string())?;
        let mut buf = [0u8; 2];
        c.read_exact(&mut buf).await.map_err(|e| e.to_string())?;
        Ok::<_, String>(())
    };
    let c = client.await;
    let s = server.await.unwrap();
    c.and(s)
}

#[tokio::test(flavor = "current_thread")]
async fn a_node_certificate_cannot_pose_as_another_node() {
    let ca = new_ca();
    let a = node_cert(&ca, "node-a", 1);
    let b = node_cert(&ca, "node-b", 2);
    handshake(&ca, &a, &b, "node-a")
        .await
        .expect("node-b reaches node-a");
    handshake(&ca, &a, &b, "10.213.0.1")
        .await
        .expect("by its address too");
    let e = handshake(&ca, &a, &b, "node-b")
        .await
        .expect_err("node-a's certificate is not node-b's");
    assert!(
        e.contains("NotValidForName") || e.contains("not valid for name"),
        "{e}"
    );
    // a client with a certificate of another CA is refused by the server
    let other = new_ca();
    let stranger = node_cert(&other, "node-b", 2);
    assert!(handshake(&ca, &a, &stranger, "node-a").await.is_err());
}
