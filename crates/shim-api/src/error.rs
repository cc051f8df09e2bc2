//! The one error type of `roam-shim-api`.

/// Result with [`Error`] as the default error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong talking to a shim.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The request is malformed (checked before it is sent).
    #[error("bad request: {0}")]
    BadRequest(String),
    /// The shim could not be reached or refused.
    #[error("shim at {url}: {message}")]
    Peer {
        /// The shim's URL.
        url: String,
        /// HTTP status it answered, if it answered.
        status: Option<u16>,
        /// What went wrong.
        message: String,
    },
}
