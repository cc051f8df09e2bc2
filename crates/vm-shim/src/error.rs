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
}
