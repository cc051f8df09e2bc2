//! roam-node's errors.

/// What kept the node's identity from being made or renewed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file of the node's PKI directory could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The API server refused or failed a request.
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// A key, request or certificate could not be made or read.
    #[error(transparent)]
    Pki(#[from] roam_pki::Error),
    /// There is no roam CA to trust yet.
    #[error(
        "no ConfigMap {namespace}/roam-ca (or no ca.crt in it): roam-controller with \
         --pki-namespace {namespace} makes it on its first start; is it running?"
    )]
    NoCa {
        /// Where it was looked for.
        namespace: String,
    },
    /// The signer refused the request.
    #[error("the certificate request {csr} was {outcome} ({reason}): {message}")]
    Refused {
        /// The CertificateSigningRequest.
        csr: String,
        /// `Denied` or `Failed`.
        outcome: String,
        /// Its reason.
        reason: String,
        /// Its message.
        message: String,
    },
    /// No answer came in time.
    #[error(
        "the certificate request {csr} got no certificate in {seconds} s: is roam-controller \
         (the signer, --pki-namespace) running and leading?"
    )]
    NoAnswer {
        /// The CertificateSigningRequest.
        csr: String,
        /// How long was waited.
        seconds: u64,
    },
}

/// roam-node's result.
pub type Result<T> = std::result::Result<T, Error>;
