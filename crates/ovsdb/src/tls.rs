//! `ssl:HOST:PORT`: OVSDB over TLS with a client certificate, as ovsdb-server's `pssl:`
//! remotes require (OVS's SSL always asks for the peer's certificate).
//!
//! The server's certificate must chain to the given CA and name the host roam connects to
//! (a DNS or IP subjectAltName), or the name set with [`TlsSettings::server_name`]: a
//! certificate of another server signed by the same CA does not pass.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls::client::Resumption;
use tokio_rustls::rustls::{ClientConfig, RootCertStore};

use crate::{Error, Result};

/// What an `ssl:` connection presents and trusts. Built once from PEM files
/// ([`TlsSettings::from_pem_files`]); cheap to clone.
#[derive(Clone)]
pub struct TlsSettings {
    config: Arc<ClientConfig>,
    server_name: Option<ServerName<'static>>,
    /// Where it came from, for messages.
    source: String,
}

impl std::fmt::Debug for TlsSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsSettings")
            .field("source", &self.source)
            .field("server_name", &self.server_name)
            .finish()
    }
}

/// The PEM files of an `ssl:` connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// CA certificate(s) the server's certificate must chain to.
    pub ca: PathBuf,
    /// This client's certificate (chain), leaf first.
    pub cert: PathBuf,
    /// This client's private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

fn bad(path: &Path, what: &str, problem: impl std::fmt::Display) -> Error {
    Error::Tls(format!("{what} {}: {problem}", path.display()))
}

impl TlsSettings {
    /// Read the CA, certificate and key; any missing, unreadable or mismatched file is an
    /// error that names it.
    pub fn from_pem_files(files: &TlsFiles) -> Result<Self> {
        let mut roots = RootCertStore::empty();
        let cas: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files.ca)
            .map_err(|e| bad(&files.ca, "CA file", e))?
            .collect::<Result<_, _>>()
            .map_err(|e| bad(&files.ca, "CA file", e))?;
        if cas.is_empty() {
            return Err(bad(&files.ca, "CA file", "holds no PEM certificate"));
        }
        for ca in cas {
            roots.add(ca).map_err(|e| bad(&files.ca, "CA file", e))?;
        }
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files.cert)
            .map_err(|e| bad(&files.cert, "certificate file", e))?
            .collect::<Result<_, _>>()
            .map_err(|e| bad(&files.cert, "certificate file", e))?;
        if chain.is_empty() {
            return Err(bad(
                &files.cert,
                "certificate file",
                "holds no PEM certificate",
            ));
        }
        let key = PrivateKeyDer::from_pem_file(&files.key)
            .map_err(|e| bad(&files.key, "private key file", e))?;
        let mut config = ClientConfig::builder_with_provider(Arc::new(
            tokio_rustls::rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Tls(e.to_string()))?
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .map_err(|e| {
            Error::Tls(format!(
                "certificate {} and key {} do not go together: {e}",
                files.cert.display(),
                files.key.display()
            ))
        })?;
        // Every connection is a full handshake: ovsdb-server (OpenSSL, client certificates
        // required, no session id context) fails a resumed session with an internal error
        // ("session id context uninitialized"), so with rustls' session cache two of every
        // three connections made with one configuration were refused.
        config.resumption = Resumption::disabled();
        Ok(TlsSettings {
            config: Arc::new(config),
            server_name: None,
            source: format!(
                "CA {}, certificate {}",
                files.ca.display(),
                files.cert.display()
            ),
        })
    }

    /// Check the server's certificate against `name` instead of the endpoint's host (for a
    /// server whose certificate names it by DNS name while roam reaches it by address).
    pub fn server_name(mut self, name: &str) -> Result<Self> {
        let n = ServerName::try_from(name.to_string())
            .map_err(|e| Error::Tls(format!("server name {name:?}: {e}")))?;
        self.server_name = Some(n);
        Ok(self)
    }

    /// The TLS session over `tcp` to `host` (the endpoint's host).
    pub(crate) async fn handshake(
        &self,
        host: &str,
        tcp: tokio::net::TcpStream,
        endpoint: &str,
    ) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
        let name = match &self.server_name {
            Some(n) => n.clone(),
            None => ServerName::try_from(host.trim_matches(['[', ']']).to_string())
                .map_err(|e| Error::Tls(format!("host {host:?} of {endpoint}: {e}")))?,
        };
        TlsConnector::from(self.config.clone())
            .connect(name, tcp)
            .await
            .map_err(|e| {
                Error::Tls(format!(
                    "TLS handshake with {endpoint} failed: {e} (trusting {}; the server's \
                     certificate must chain to that CA and name the host, and the server must \
                     trust this client's certificate)",
                    self.source
                ))
            })
    }
}
