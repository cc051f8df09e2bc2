//! The one error type of `roam-ovsdb`.

use std::io;

/// Result with [`Error`] as the default error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong talking to an OVSDB server.
///
/// Two kinds ([`Error::is_bad_input`]): the request itself is wrong (a bad endpoint, a name or
/// value the schema refuses, a transaction the server refused for what it asked) and sending
/// it again unchanged fails the same way; or the server or the connection failed, and the
/// same request may succeed later (retry with backoff).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The endpoint string is not `unix:PATH`, `tcp:HOST:PORT` or `ssl:HOST:PORT`.
    #[error("invalid OVSDB endpoint {0:?}: expected unix:PATH, tcp:HOST:PORT or ssl:HOST:PORT")]
    InvalidEndpoint(String),
    /// TLS for an `ssl:` endpoint: a file missing or unusable, no settings given, or a
    /// handshake the server or this client refused.
    #[error("OVSDB TLS: {0}")]
    Tls(String),
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
    /// The connection closed before the answer arrived. For a `transact` the outcome is
    /// UNKNOWN: the server may or may not have committed it, so re-read the database before
    /// deciding whether to send it again (never retry it blindly).
    #[error(
        "OVSDB connection closed before the reply to {0} arrived (a transaction's outcome is unknown: re-read the database before retrying)"
    )]
    Disconnected(String),
    /// A [`ReconnectingClient`](crate::ReconnectingClient) has no connection right
    /// now; it keeps reconnecting in the background.
    #[error(
        "not connected to OVSDB at {endpoint} ({reason}); reconnecting in the background, retry later or wait_connected()"
    )]
    NotConnected {
        /// The endpoint being reconnected to.
        endpoint: String,
        /// Why the last connection attempt failed or the last connection closed.
        reason: String,
    },
    /// The schema has no such table: the request was not sent.
    #[error(
        "database {db} has no table {table:?} (names are case-sensitive; check the table name against the server's schema)"
    )]
    UnknownTable {
        /// The database.
        db: String,
        /// The table named by the request.
        table: String,
    },
    /// The table has no such column: the request was not sent.
    #[error(
        "table {table} of database {db} has no column {column:?} (check the column name; the server's schema version may differ from the one roam was written for)"
    )]
    UnknownColumn {
        /// The database.
        db: String,
        /// The table.
        table: String,
        /// The column named by the request.
        column: String,
    },
    /// A value does not fit its column's type in the schema: the request was not sent.
    #[error("invalid value for column {table}.{column}: {reason}")]
    InvalidValue {
        /// The table.
        table: String,
        /// The column.
        column: String,
        /// What is wrong with the value.
        reason: String,
    },
    /// Data from the server does not decode into the requested Rust type (a row type that
    /// does not match the server's schema, or a malformed database value).
    #[error("cannot decode {what}: {reason}")]
    Decode {
        /// What was being decoded, e.g. `Logical_Switch row 0a1b...`.
        what: String,
        /// The decoder's complaint.
        reason: String,
    },
    /// The server cancelled a monitor by itself (e.g. its database was removed).
    #[error("OVSDB server cancelled monitor {0}; create a new monitor to keep watching")]
    MonitorCanceled(String),
    /// The request needs a protocol feature the server does not offer.
    #[error("unsupported by this OVSDB server: {0}")]
    Unsupported(String),
    /// No answer within the deadline.
    #[error("OVSDB {method} got no reply within {secs} s")]
    Timeout {
        /// The request's method.
        method: String,
        /// The deadline in seconds.
        secs: u64,
    },
}

/// Transaction error tags (RFC 7047 and ovsdb-server) that report a failure of the server or
/// its cluster, an unmet `wait` (`timed out`), a lock not held or a role's missing permission,
/// rather than refuse what the transaction asked for (`constraint violation`, `referential
/// integrity violation`, `unknown column`, `syntax error`, ...).
const SERVER_TAGS: [&str; 8] = [
    "I/O error",
    "resources exhausted",
    "internal error",
    "timed out",
    "not owner",
    "not leader",
    "cluster error",
    "permission error",
];

impl Error {
    /// Whether the request is at fault: fix it rather than send it again (report the error to
    /// whoever wrote the input). `false` means the server or the connection failed: retry
    /// with backoff (after [`Error::Disconnected`] re-read the database first).
    ///
    /// A refused transaction is bad input for the transaction as sent; a caller that built it
    /// from a snapshot of the database should re-read before blaming its own input, since
    /// another writer's change can also break a constraint (a unique index, a reference).
    pub fn is_bad_input(&self) -> bool {
        match self {
            Error::InvalidEndpoint(_)
            // a certificate that does not fit fails again until an admin changes it; a
            // handshake cut short by the network shows as Connect or Io instead
            | Error::Tls(_)
            | Error::UnknownTable { .. }
            | Error::UnknownColumn { .. }
            | Error::InvalidValue { .. } => true,
            Error::Transaction { error, .. } => !SERVER_TAGS.contains(&error.as_str()),
            Error::Connect { .. }
            | Error::Io(_)
            | Error::Protocol(_)
            | Error::Rpc { .. }
            | Error::Disconnected(_)
            | Error::NotConnected { .. }
            | Error::Decode { .. }
            | Error::MonitorCanceled(_)
            | Error::Unsupported(_)
            | Error::Timeout { .. } => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn txn(tag: &str) -> Error {
        Error::Transaction {
            index: 0,
            op: "insert".into(),
            error: tag.into(),
            details: None,
        }
    }

    #[test]
    fn tells_a_refused_request_from_a_failed_server() {
        let s = String::new;
        let cases = [
            (Error::InvalidEndpoint("x".into()), true),
            (
                Error::UnknownTable {
                    db: s(),
                    table: s(),
                },
                true,
            ),
            (
                Error::UnknownColumn {
                    db: s(),
                    table: s(),
                    column: s(),
                },
                true,
            ),
            (
                Error::InvalidValue {
                    table: s(),
                    column: s(),
                    reason: s(),
                },
                true,
            ),
            (txn("constraint violation"), true),
            (txn("referential integrity violation"), true),
            (txn("duplicate uuid-name"), true),
            (txn("domain error"), true),
            (txn("range error"), true),
            (txn("syntax error"), true),
            (txn("unknown column"), true),
            (txn("I/O error"), false),
            (txn("resources exhausted"), false),
            (txn("internal error"), false),
            (txn("timed out"), false),
            (txn("not owner"), false),
            (txn("not leader"), false),
            (txn("cluster error"), false),
            (txn("permission error"), false),
            (
                Error::Connect {
                    endpoint: s(),
                    source: io::ErrorKind::ConnectionRefused.into(),
                },
                false,
            ),
            (Error::Io(io::ErrorKind::BrokenPipe.into()), false),
            (Error::Protocol(s()), false),
            (
                Error::Rpc {
                    method: "transact".into(),
                    error: serde_json::json!("unknown database"),
                },
                false,
            ),
            (Error::Disconnected("transact".into()), false),
            (
                Error::NotConnected {
                    endpoint: s(),
                    reason: s(),
                },
                false,
            ),
            (
                Error::Decode {
                    what: s(),
                    reason: s(),
                },
                false,
            ),
            (Error::MonitorCanceled(s()), false),
            (Error::Unsupported(s()), false),
            (
                Error::Timeout {
                    method: "transact".into(),
                    secs: 1,
                },
                false,
            ),
        ];
        for (e, bad) in cases {
            assert_eq!(e.is_bad_input(), bad, "{e}");
        }
    }
}
