//! The one error type of `roam-migrator`: roam-core's refusals of bad input, and what
//! the I/O met (the API server, OVN, a shim).

/// Result with [`Error`] as the default error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong in the address control plane.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The objects asked about cannot be served as they are (roam-core's decision; boxed,
    /// its words make it the largest variant).
    #[error(transparent)]
    Core(Box<roam_core::Error>),
    /// OVN's northbound database failed.
    #[error("OVN: {0}")]
    Ovn(#[from] roam_network::Error),
    /// The Kubernetes API failed.
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    /// The owner's address is still used by another live pod of the owner on another node
    /// (a migration's source): it moves when that pod is gone (or at switchover).
    #[error(
        "pod {pod}: its owner's address {address} is still in use by {holder} on {host}; waiting"
    )]
    HeldElsewhere {
        /// `namespace/name`.
        pod: String,
        /// The Address.
        address: String,
        /// The pod using it.
        holder: String,
        /// Where.
        host: String,
    },
    /// A VM's roam-shim did not answer or refused.
    #[error("roam-shim of {vm}: {source}")]
    Shim {
        /// `namespace/name`.
        vm: String,
        /// The shim client's error.
        source: roam_shim_api::Error,
    },
    /// A controller task ended (a bug: they run forever).
    #[error("a controller stopped unexpectedly: {0}")]
    Stopped(String),
    /// The roam CA or a node certificate could not be made or read.
    #[error("roam PKI: {0}")]
    Pki(String),
    /// Another writer changed the object first (resourceVersion precondition, or the name
    /// lock on an IP): decide again on fresh data.
    #[error("conflict on {0}: another writer was first; retrying on fresh data")]
    Conflict(String),
}

/// A failure of the northbound client itself (connecting, a request) is an OVN failure.
impl From<roam_ovsdb::Error> for Error {
    fn from(e: roam_ovsdb::Error) -> Self {
        Error::Ovn(e.into())
    }
}

/// An OVN plan refused by the planner is roam-core's refusal of the Network (bad input).
impl From<roam_network::topology::PlanError> for Error {
    fn from(e: roam_network::topology::PlanError) -> Self {
        roam_core::Error::from(e).into()
    }
}

impl From<roam_core::Error> for Error {
    fn from(e: roam_core::Error) -> Self {
        Error::Core(Box::new(e))
    }
}

impl Error {
    /// roam-core's refusal of VM `vm` (`namespace/name`) as it is: `problem` says what to do.
    pub fn invalid_vm(vm: String, problem: String) -> Error {
        roam_core::Error::InvalidVm { vm, problem }.into()
    }

    /// A short PascalCase reason for Events, conditions and metric labels.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::Core(e) => e.reason(),
            Error::Ovn(_) => "OvnError",
            Error::Kube(_) => "KubernetesApiError",
            Error::Conflict(_) => "Conflict",
            Error::Stopped(_) => "Stopped",
            Error::Pki(_) => "PkiError",
            Error::HeldElsewhere { .. } => "HeldElsewhere",
            Error::Shim { .. } => "ShimError",
        }
    }

    /// Whether the input is at fault (report it and claim nothing until it changes) rather
    /// than the environment (retry with backoff).
    pub fn is_bad_input(&self) -> bool {
        match self {
            Error::Core(e) => e.is_bad_input(),
            // OVN refused what was planned from the objects (a topology it cannot realize, a
            // transaction breaking a constraint): the same plan is refused again
            Error::Ovn(e) => e.is_bad_input(),
            // the shim refused the request as invalid (a 4xx other than 408, 409, 429)
            Error::Shim { source, .. } => source.is_bad_input(),
            Error::Kube(_)
            | Error::HeldElsewhere { .. }
            | Error::Stopped(_)
            | Error::Pki(_)
            | Error::Conflict(_) => false,
        }
    }

    /// Whether a Kubernetes error is a 409 (AlreadyExists or a resourceVersion conflict).
    pub fn is_conflict(e: &kube::Error) -> bool {
        matches!(e, kube::Error::Api(s) if s.code == 409)
    }

    /// A ResourceQuota's refusal of a create (a 403 from the quota admission, "exceeded
    /// quota" or "failed quota": a quota that asks for limits the pod does not set): its
    /// message, which names the quota and what was requested, used and limited.
    pub fn quota_refusal(e: &kube::Error) -> Option<String> {
        match e {
            kube::Error::Api(s)
                if s.code == 403
                    && (s.message.contains("exceeded quota")
                        || s.message.contains("failed quota")) =>
            {
                Some(s.message.clone())
            }
            _ => None,
        }
    }

    /// Whether a Kubernetes error is a 404.
    pub fn is_not_found(e: &kube::Error) -> bool {
        matches!(e, kube::Error::Api(s) if s.code == 404)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shim(status: Option<u16>) -> Error {
        Error::Shim {
            vm: "ns/vm".into(),
            source: roam_shim_api::Error::Peer {
                url: "http://10.0.0.1:9000".into(),
                status,
                message: "m".into(),
            },
        }
    }

    #[test]
    fn only_a_quotas_403_is_a_quota_refusal() {
        let api = |code: u16, message: &str| {
            kube::Error::Api(Box::new(
                kube::core::Status::failure(message, "Forbidden").with_code(code),
            ))
        };
        for m in [
            "pods \"p\" is forbidden: exceeded quota: small, requested: requests.memory=448Mi",
            "pods \"p\" is forbidden: failed quota: small: must specify limits.memory",
        ] {
            assert_eq!(Error::quota_refusal(&api(403, m)).as_deref(), Some(m));
        }
        // RBAC's 403 and a 409 are not
        assert_eq!(
            Error::quota_refusal(&api(403, "pods is forbidden: User cannot create")),
            None
        );
        assert_eq!(Error::quota_refusal(&api(409, "exceeded quota")), None);
    }

    #[test]
    fn wrapped_errors_keep_their_kind() {
        let s = String::new;
        let cases = [
            (shim(Some(400)), true),
            (shim(Some(409)), false),
            (shim(Some(503)), false),
            (shim(None), false),
            (
                roam_network::Error::InvalidTopology {
                    network: s(),
                    reason: s(),
                }
                .into(),
                true,
            ),
            (
                roam_ovsdb::Error::Transaction {
                    index: 0,
                    op: "insert".into(),
                    error: "constraint violation".into(),
                    details: None,
                }
                .into(),
                true,
            ),
            (
                roam_ovsdb::Error::Timeout {
                    method: "transact".into(),
                    secs: 30,
                }
                .into(),
                false,
            ),
            (
                roam_core::Error::TransitExhausted {
                    network: s(),
                    subnet: s(),
                    node: s(),
                }
                .into(),
                false,
            ),
            (
                roam_core::Error::InvalidVm {
                    vm: s(),
                    problem: s(),
                }
                .into(),
                true,
            ),
            (
                Error::HeldElsewhere {
                    pod: s(),
                    address: s(),
                    holder: s(),
                    host: s(),
                },
                false,
            ),
            (Error::Conflict(s()), false),
            (Error::Stopped(s()), false),
        ];
        for (e, bad) in cases {
            assert_eq!(e.is_bad_input(), bad, "{e}");
        }
    }
}
