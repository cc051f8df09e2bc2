//! The one error type of `roam-network`.

use std::io;

/// Result with [`Error`] as the default error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong talking to OVN or OVS.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The endpoint string is not `unix:PATH` or `tcp:HOST:PORT`.
    #[error("invalid OVSDB endpoint {0:?}: expected unix:PATH or tcp:HOST:PORT")]
    InvalidEndpoint(String),
    /// Connecting to the database server failed.
    #[error(
        "cannot connect to OVSDB at {endpoint}: {source} (is ovsdb-server running and the socket path right?)"
    )]
    Connect {
        /// The endpoint we tried.
        endpoint: String,
        /// The underlying error.
        source: io::Error,
    },
    /// Reading or writing the connection failed.
    #[error("OVSDB connection I/O error: {0}")]
    Io(#[from] io::Error),
    /// The server sent something that is not valid RFC 7047 JSON-RPC.
    #[error("malformed OVSDB message: {0}")]
    Protocol(String),
    /// The server answered a request with a JSON-RPC error.
    #[error("OVSDB {method} failed: {error}")]
    Rpc {
        /// The request's method.
        method: String,
        /// The server's `error` member.
        error: serde_json::Value,
    },
    /// One operation of a transaction failed, so the server applied none of them.
    #[error("OVSDB transaction aborted at operation {index} ({op}): {error}{}", details.as_deref().map(|d| format!(": {d}")).unwrap_or_default())]
    Transaction {
        /// Index of the failing operation in the transaction.
        index: usize,
        /// The `op` of the failing operation.
        op: String,
        /// The error tag, e.g. `constraint violation`.
        error: String,
        /// The server's details, if any.
        details: Option<String>,
    },
    /// The connection closed before the answer arrived; the request's outcome is unknown
    /// for a transaction unless it is re-read.
    #[error("OVSDB connection closed before the reply to {0} arrived")]
    Disconnected(String),
    /// No answer within the deadline.
    #[error("OVSDB {method} got no reply within {secs} s")]
    Timeout {
        /// The request's method.
        method: String,
        /// The deadline in seconds.
        secs: u64,
    },
}
