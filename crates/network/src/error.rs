//! The one error type of `roam-network`.

/// Result with [`Error`] as the default error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong planning or applying roam's OVN state.
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
