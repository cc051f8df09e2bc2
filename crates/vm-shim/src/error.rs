//! The one error type of `roam-vm-shim`.

/// Result with [`Error`] as the default error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What is wrong with a VM or an operation on it.
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

    /// The HTTP status and API error code for this error.
    pub fn http_status(&self) -> (u16, &'static str) {
        match self {
            Error::InvalidSpec { .. } | Error::Config(_) | Error::BadRequest(_) => {
                (400, "bad-request")
            }
            Error::Unauthorized => (401, "unauthorized"),
            Error::NotFound(_) => (404, "not-found"),
            Error::Conflict(_) => (409, "conflict"),
            Error::Peer { .. } => (502, "target"),
            Error::Libvirt { .. } | Error::Plumbing { .. } | Error::Io { .. } => (500, "internal"),
        }
    }
}

impl From<roam_shim_api::Error> for Error {
    fn from(e: roam_shim_api::Error) -> Error {
        match e {
            e @ roam_shim_api::Error::LaunchArg { .. } => Error::Config(e.to_string()),
            roam_shim_api::Error::BadRequest(m) => Error::BadRequest(m),
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
