//! The one error type of `roam-shim-api`.

/// Result with [`Error`] as the default error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong talking to a shim, or with a shim's command line.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A launch argument (flag or config file key) is missing or malformed.
    #[error("{flag}: {problem}")]
    LaunchArg {
        /// The flag at fault, as written on the command line (`--listen`), or `--config`
        /// for the config file itself.
        flag: String,
        /// What is wrong and what is expected.
        problem: String,
    },
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
