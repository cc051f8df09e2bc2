//! The one error type of `roam-network`.

/// Result with [`Error`] as the default error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong planning or applying roam's OVN state.
///
/// Two kinds ([`Error::is_bad_input`]): what was asked cannot be applied as given (a topology
/// OVN cannot realize, a transaction the northbound database refuses), or the database or the
/// chassis failed and the same request may succeed later (retry with backoff).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Talking to the northbound database failed.
    #[error(transparent)]
    Ovsdb(#[from] roam_ovsdb::Error),
    /// A desired topology OVN cannot realize (two logical ports with one name, a router
    /// port reference to no router port, ...): nothing was sent.
    #[error("network {network}: the planned topology cannot be applied: {reason}")]
    InvalidTopology {
        /// The network.
        network: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The chassis did not all report a northbound change within the deadline.
    #[error(
        "the chassis did not all apply northbound change {nb_cfg} within {waited_ms} ms (NB_Global hv_cfg is {hv_cfg}): a chassis is down or slow, or ovn-northd does not run"
    )]
    NotSynced {
        /// The change waited for (`NB_Global:nb_cfg`).
        nb_cfg: i64,
        /// What every chassis had applied when the wait ended (`NB_Global:hv_cfg`).
        hv_cfg: i64,
        /// How long it waited.
        waited_ms: u64,
    },
}

impl Error {
    /// Whether what was asked is at fault: the same topology or flip fails again until it
    /// changes (report it; for a flip, reconcile the network first). `false`: the database
    /// or a chassis failed; retry with backoff.
    pub fn is_bad_input(&self) -> bool {
        match self {
            Error::Ovsdb(e) => e.is_bad_input(),
            Error::InvalidTopology { .. } => true,
            Error::NotSynced { .. } => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tells_a_refused_plan_from_a_failed_database() {
        let cases = [
            (
                Error::InvalidTopology {
                    network: "n".into(),
                    reason: "r".into(),
                },
                true,
            ),
            (
                Error::NotSynced {
                    nb_cfg: 2,
                    hv_cfg: 1,
                    waited_ms: 10,
                },
                false,
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
                    secs: 1,
                }
                .into(),
                false,
            ),
        ];
        for (e, bad) in cases {
            assert_eq!(e.is_bad_input(), bad, "{e}");
        }
    }
}
