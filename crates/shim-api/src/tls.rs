//! The node API over mutual TLS, with the roam PKI.
//!
//! With its node's roam identity (roam-node's files, `--pki-dir`) a launcher's shim serves
//! its API over TLS with the node's certificate and asks each client for a certificate of the
//! roam CA: roam-controller's ([`CONTROLLER_NAME`], which the controller issues itself from
//! the CA it holds) or a node's (a migration's source shim, which prepares its target). A
//! client checks that the server's certificate names the node it meant
//! ([`ClientTls::server_name`]), not merely that the roam CA signed it: another node's
//! certificate does not pass. The VM's bearer token is still asked for on top.
//!
//! The server reads the files again for each connection ([`Identity::read_dir`]), so a
//! renewed certificate, or a new CA, is used from the next connection on.

use std::path::Path;
use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{ClientConfig, RootCertStore, ServerConfig};

pub use roam_pki::CONTROLLER_NAME;

use crate::{Error, Result};

/// The key in a roam PKI directory (roam-node's `/var/lib/roam/pki`).
pub const KEY_FILE: &str = "node.key";
/// The certificate in a roam PKI directory.
pub const CERT_FILE: &str = "node.crt";
/// The roam CA's certificate(s) in a roam PKI directory.
pub const CA_FILE: &str = "ca.crt";

/// Who is at the other end of a request, as its connection shows: the server puts it in
/// every request's extensions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Peer {
    /// Plain HTTP (a server without TLS).
    Plain,
    /// TLS without a client certificate.
    Anonymous,
    /// TLS with a client certificate of the roam CA: its common name (a node's name, or
    /// [`CONTROLLER_NAME`]).
    Named(String),
}

/// A roam identity: a key, its certificate and the CA certificate(s) it trusts (PEM).
#[derive(Clone)]
pub struct Identity {
    key_pem: String,
    cert_pem: String,
    ca_pem: String,
    /// Where it came from, for messages.
    source: String,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity")
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

fn tls_error(source: &str, problem: impl std::fmt::Display) -> Error {
    Error::Tls(format!("{source}: {problem}"))
}

fn provider() -> Arc<tokio_rustls::rustls::crypto::CryptoProvider> {
    Arc::new(tokio_rustls::rustls::crypto::ring::default_provider())
}

impl Identity {
    /// An identity from PEM texts; `source` names it in messages.
    pub fn from_pem(key_pem: &str, cert_pem: &str, ca_pem: &str, source: &str) -> Identity {
        Identity {
            key_pem: key_pem.into(),
            cert_pem: cert_pem.into(),
            ca_pem: ca_pem.into(),
            source: source.into(),
        }
    }

    /// The identity in roam PKI directory `dir` ([`KEY_FILE`], [`CERT_FILE`], [`CA_FILE`]).
    pub fn read_dir(dir: &Path) -> Result<Identity> {
        let read = |f: &str| {
            std::fs::read_to_string(dir.join(f)).map_err(|e| {
                Error::Tls(format!(
                    "{}: {e} (roam-node keeps {KEY_FILE}, {CERT_FILE} and {CA_FILE} there: is it \
                     running on this node?)",
                    dir.join(f).display()
                ))
            })
        };
        Ok(Identity {
            key_pem: read(KEY_FILE)?,
            cert_pem: read(CERT_FILE)?,
            ca_pem: read(CA_FILE)?,
            source: dir.display().to_string(),
        })
    }

    /// The certificate (PEM).
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    fn roots(&self) -> Result<RootCertStore> {
        let mut roots = RootCertStore::empty();
        for ca in CertificateDer::pem_slice_iter(self.ca_pem.as_bytes()) {
            let ca = ca.map_err(|e| tls_error(&self.source, format!("the CA file: {e}")))?;
            roots
                .add(ca)
                .map_err(|e| tls_error(&self.source, format!("the CA file: {e}")))?;
        }
        if roots.is_empty() {
            return Err(tls_error(&self.source, "the CA file holds no certificate"));
        }
        Ok(roots)
    }

    fn chain_and_key(&self) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)> {
        let chain: Vec<CertificateDer<'static>> =
            CertificateDer::pem_slice_iter(self.cert_pem.as_bytes())
                .collect::<std::result::Result<_, _>>()
                .map_err(|e| tls_error(&self.source, format!("the certificate: {e}")))?;
        if chain.is_empty() {
            return Err(tls_error(&self.source, "the certificate file holds none"));
        }
        let key = PrivateKeyDer::from_pem_slice(self.key_pem.as_bytes())
            .map_err(|e| tls_error(&self.source, format!("the key: {e}")))?;
        Ok((chain, key))
    }

    /// A server's TLS settings: this identity's certificate, and client certificates of
    /// the roam CA verified when presented (a client without one gets a session too, and
    /// [`Peer::Anonymous`]: the server decides per route).
    pub fn server_config(&self) -> Result<Arc<ServerConfig>> {
        let verifier =
            WebPkiClientVerifier::builder_with_provider(Arc::new(self.roots()?), provider())
                .allow_unauthenticated()
                .build()
                .map_err(|e| tls_error(&self.source, e))?;
        let (chain, key) = self.chain_and_key()?;
        let config = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| tls_error(&self.source, e))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain, key)
            .map_err(|e| tls_error(&self.source, format!("certificate and key: {e}")))?;
        Ok(Arc::new(config))
    }

    /// A server's TLS settings for peers only (the migration proxy): this identity's
    /// certificate, a client certificate of the roam CA required (no anonymous session), and
    /// the application protocols `alpn` offered (a client must ask for one of them).
    pub fn peer_server_config(&self, alpn: &[&[u8]]) -> Result<Arc<ServerConfig>> {
        let verifier =
            WebPkiClientVerifier::builder_with_provider(Arc::new(self.roots()?), provider())
                .build()
                .map_err(|e| tls_error(&self.source, e))?;
        let (chain, key) = self.chain_and_key()?;
        let mut config = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| tls_error(&self.source, e))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain, key)
            .map_err(|e| tls_error(&self.source, format!("certificate and key: {e}")))?;
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Ok(Arc::new(config))
    }

    /// A client's TLS settings: this identity's certificate as the client's, servers'
    /// certificates checked against the roam CA.
    pub fn client_config(&self) -> Result<ClientConfig> {
        let (chain, key) = self.chain_and_key()?;
        ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| tls_error(&self.source, e))?
            .with_root_certificates(self.roots()?)
            .with_client_auth_cert(chain, key)
            .map_err(|e| tls_error(&self.source, format!("certificate and key: {e}")))
    }
}

/// What a client of a shim over TLS presents, and whom it expects.
#[derive(Clone, Debug)]
pub struct ClientTls {
    /// The client's identity (roam-controller's, or the source node's).
    pub identity: Identity,
    /// The node the shim runs on: its certificate must name it (its DNS name), whatever
    /// address the client dials.
    pub server_name: String,
}

/// The common name of a verified client certificate (DER).
pub fn peer_name(cert: &[u8]) -> Option<String> {
    roam_pki::common_name_der(cert)
}
