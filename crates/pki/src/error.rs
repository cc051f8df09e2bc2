//! roam-pki's errors.

/// What went wrong making, reading or signing a key or certificate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A key could not be made or read.
    #[error("key: {0}")]
    Key(String),
    /// The CA's certificate or key is unusable (the `roam-ca` Secret: delete it and
    /// roam-controller makes a new CA, after which every node asks for a new certificate).
    #[error("roam CA: {0}")]
    Ca(String),
    /// A certificate or request could not be made or read.
    #[error("certificate: {0}")]
    Certificate(String),
}

impl Error {
    pub(crate) fn key(e: rcgen::Error) -> Error {
        Error::Key(e.to_string())
    }

    pub(crate) fn ca(e: rcgen::Error) -> Error {
        Error::Ca(e.to_string())
    }
}

/// roam-pki's result.
pub type Result<T> = std::result::Result<T, Error>;
