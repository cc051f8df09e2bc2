//! The one error type of `roam-shim-api`.

/// Result with [`Error`] as the default error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong talking to a shim, or with a shim's command line.
///
/// Two kinds ([`Error::is_bad_input`]): the request or the launch arguments are wrong (checked
/// here, or refused by the shim with a 4xx), or the shim could not be reached, failed (5xx)
/// or is busy (409), and the same request may succeed later (retry with backoff).
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
    /// The TLS identity (key, certificate, CA) could not be read or used.
    #[error("TLS: {0}")]
    Tls(String),
}

impl Error {
    /// Whether the request (or launch argument) is at fault: fix it rather than send it
    /// again, and report it to whoever wrote it. A shim's 4xx answer is, except 408 and 429
    /// (come back later) and 409 (the shim's state conflicts: a job runs, the VM is not there
    /// yet), which may pass once the shim's state changes. `false`: the shim is unreachable,
    /// slow, failed (5xx) or answered nonsense; retry with backoff.
    pub fn is_bad_input(&self) -> bool {
        match self {
            Error::LaunchArg { .. } | Error::BadRequest(_) => true,
            Error::Peer {
                status: Some(s), ..
            } => (400..500).contains(s) && !matches!(s, 408 | 409 | 429),
            Error::Peer { status: None, .. } => false,
            // the node's files: roam-node renews them; a later try may find them
            Error::Tls(_) => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(status: Option<u16>) -> Error {
        Error::Peer {
            url: "http://10.0.0.1:9000".into(),
            status,
            message: "m".into(),
        }
    }

    #[test]
    fn tells_a_refused_request_from_an_unavailable_shim() {
        let cases = [
            (
                Error::LaunchArg {
                    flag: "--listen".into(),
                    problem: "p".into(),
                },
                true,
            ),
            (Error::BadRequest("b".into()), true),
            (peer(Some(400)), true),
            (peer(Some(401)), true),
            (peer(Some(404)), true),
            (peer(Some(408)), false),
            (peer(Some(409)), false),
            (peer(Some(429)), false),
            (peer(Some(500)), false),
            (peer(Some(502)), false),
            // a 2xx whose body does not decode: a shim of another version, not the request
            (peer(Some(200)), false),
            (peer(None), false),
        ];
        for (e, bad) in cases {
            assert_eq!(e.is_bad_input(), bad, "{e:?}");
        }
    }
}
