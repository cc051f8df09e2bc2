//! The one error type of `roam-vm-shim`.

/// Result with [`Error`] as the default error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What is wrong with a VM or an operation on it.
///
/// Two kinds ([`Error::is_bad_input`]): the spec, configuration or API request is wrong
/// (an HTTP 4xx), or something the shim relies on failed (libvirt, the node's network, the
/// disk, the target shim: a 5xx) or its state does not allow the request yet (409); those
/// may pass later.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The VM spec is invalid; nothing was started.
    #[error("invalid VM {vm}: {problem}")]
    InvalidSpec {
        /// The VM's name.
        vm: String,
        /// What is wrong and how to fix it.
        problem: String,
    },
    /// The VM's disk image is refused (what it names, its format, its place); nothing was
    /// started.
    #[error("disk image {}: {problem}", image.display())]
    Disk {
        /// The image as the VM names it.
        image: std::path::PathBuf,
        /// What is wrong with it and how to fix it.
        problem: String,
    },
    /// The shim's configuration is invalid; nothing was touched.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// A libvirt call failed.
    #[error("libvirt: {what}: {message}")]
    Libvirt {
        /// What the shim was doing.
        what: String,
        /// libvirt's message.
        message: String,
    },
    /// Creating or removing the VM's tap or its OVS port failed.
    #[error("network plumbing: {what}: {message}")]
    Plumbing {
        /// What the shim was doing.
        what: String,
        /// The cause.
        message: String,
    },
    /// The request conflicts with the shim's state (a job runs, the VM is not here, ...).
    #[error("{0}")]
    Conflict(String),
    /// The request is malformed.
    #[error("bad request: {0}")]
    BadRequest(String),
    /// The client may not call this endpoint (its certificate is not the controller's, or
    /// it has none).
    #[error("forbidden: {0}")]
    Forbidden(String),
    /// Missing or wrong API token.
    #[error("missing or wrong API token: send `Authorization: Bearer <the VM's token>`")]
    Unauthorized,
    /// Unknown API path or method.
    #[error("no such endpoint: {0}")]
    NotFound(String),
    /// Another shim (a migration's target) could not be reached or refused.
    #[error("shim at {url}: {message}")]
    Peer {
        /// The shim's URL.
        url: String,
        /// HTTP status it answered, if it answered.
        status: Option<u16>,
        /// What went wrong.
        message: String,
    },
    /// Local I/O (state file, listener).
    #[error("{what}: {source}")]
    Io {
        /// What the shim was doing.
        what: String,
        /// The cause.
        source: std::io::Error,
    },
}

impl Error {
    /// A libvirt error while doing `what`.
    pub(crate) fn libvirt(what: impl Into<String>, e: virt::error::Error) -> Error {
        Error::Libvirt {
            what: what.into(),
            message: e.to_string(),
        }
    }

    /// A plumbing error while doing `what`.
    pub(crate) fn plumbing(what: impl Into<String>, e: impl std::fmt::Display) -> Error {
        Error::Plumbing {
            what: what.into(),
            message: e.to_string(),
        }
    }

    /// Whether the input is at fault (the VM spec, the shim's configuration, an API request):
    /// report it and do not retry it unchanged. `false`: libvirt, the node, the disk or the
    /// target shim failed, or the shim's state conflicts with the request (a job runs); the
    /// same request may pass later, so retry with backoff.
    pub fn is_bad_input(&self) -> bool {
        match self {
            Error::InvalidSpec { .. }
            | Error::Disk { .. }
            | Error::Config(_)
            | Error::BadRequest(_)
            | Error::Unauthorized
            | Error::Forbidden(_)
            | Error::NotFound(_) => true,
            // the target's answer is this shim's failure to its own caller (a 502)
            Error::Peer { .. }
            | Error::Conflict(_)
            | Error::Libvirt { .. }
            | Error::Plumbing { .. }
            | Error::Io { .. } => false,
        }
    }

    /// The HTTP status and API error code for this error: bad input is a 4xx, the shim's
    /// own failure a 5xx ([`Error::is_bad_input`] decides the rest).
    pub fn http_status(&self) -> (u16, &'static str) {
        match self {
            Error::Unauthorized => (401, "unauthorized"),
            Error::Forbidden(_) => (403, "forbidden"),
            Error::NotFound(_) => (404, "not-found"),
            Error::Conflict(_) => (409, "conflict"),
            Error::Peer { .. } => (502, "target"),
            e if e.is_bad_input() => (400, "bad-request"),
            _ => (500, "internal"),
        }
    }
}

impl From<roam_shim_api::Error> for Error {
    fn from(e: roam_shim_api::Error) -> Error {
        match e {
            e @ roam_shim_api::Error::LaunchArg { .. } => Error::Config(e.to_string()),
            roam_shim_api::Error::BadRequest(m) => Error::BadRequest(m),
            // the node's identity files (roam-node's): unreadable now, maybe not later
            roam_shim_api::Error::Tls(m) => Error::Io {
                what: "the node's roam identity".into(),
                source: std::io::Error::other(m),
            },
            roam_shim_api::Error::Peer {
                url,
                status,
                message,
            } => Error::Peer {
                url,
                status,
                message,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_input_is_a_4xx_and_a_failure_a_5xx() {
        let s = || "x".to_string();
        let cases = [
            (
                Error::InvalidSpec {
                    vm: s(),
                    problem: s(),
                },
                true,
                400,
            ),
            (Error::Config(s()), true, 400),
            (
                Error::Disk {
                    image: s().into(),
                    problem: s(),
                },
                true,
                400,
            ),
            (Error::BadRequest(s()), true, 400),
            (Error::Unauthorized, true, 401),
            (Error::Forbidden(s()), true, 403),
            (Error::NotFound(s()), true, 404),
            (Error::Conflict(s()), false, 409),
            (
                Error::Peer {
                    url: s(),
                    status: Some(400),
                    message: s(),
                },
                false,
                502,
            ),
            (
                Error::Libvirt {
                    what: s(),
                    message: s(),
                },
                false,
                500,
            ),
            (
                Error::Plumbing {
                    what: s(),
                    message: s(),
                },
                false,
                500,
            ),
            (
                Error::Io {
                    what: s(),
                    source: std::io::ErrorKind::PermissionDenied.into(),
                },
                false,
                500,
            ),
        ];
        for (e, bad, status) in cases {
            assert_eq!((e.is_bad_input(), e.http_status().0), (bad, status), "{e}");
        }
    }

    #[test]
    fn a_shim_client_error_keeps_its_kind() {
        let launch = roam_shim_api::Error::LaunchArg {
            flag: "--listen".into(),
            problem: "p".into(),
        };
        assert!(Error::from(launch).is_bad_input());
        assert!(Error::from(roam_shim_api::Error::BadRequest("b".into())).is_bad_input());
    }
}
