//! The one error type of `roam-cni`, with the CNI error code each failure is reported with.

use std::path::PathBuf;

/// Result with [`Error`] as the default error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// CNI spec 1.1 well-known error codes (1–99 are reserved by the spec), and roam's own (100+).
pub mod code {
    /// Incompatible CNI version.
    pub const INCOMPATIBLE_VERSION: u32 = 1;
    /// Container unknown or does not exist (the runtime need not clean up).
    pub const UNKNOWN_CONTAINER: u32 = 3;
    /// Invalid necessary environment variables (CNI_COMMAND, CNI_CONTAINERID, ...).
    pub const INVALID_ENV: u32 = 4;
    /// I/O failure (e.g. reading stdin).
    pub const IO_FAILURE: u32 = 5;
    /// Failed to decode content (the configuration is not JSON).
    pub const DECODE: u32 = 6;
    /// Invalid network configuration.
    pub const INVALID_CONFIG: u32 = 7;
    /// Try again later: a transient condition (the address is not published yet, OVS is
    /// restarting).
    pub const TRY_AGAIN_LATER: u32 = 11;
    /// STATUS: the plugin cannot service ADD requests.
    pub const NOT_AVAILABLE: u32 = 50;
    /// STATUS: not available, and existing containers may have limited connectivity.
    pub const NOT_AVAILABLE_DEGRADED: u32 = 51;
    /// roam: the pod's `roam.dev/addresses` annotation is malformed.
    pub const BAD_ANNOTATION: u32 = 100;
    /// roam: the Kubernetes API refused or failed a request.
    pub const KUBE_API: u32 = 101;
    /// roam: the node's Open_vSwitch database refused or failed a request.
    pub const OVSDB: u32 = 102;
    /// roam: a netlink request (link, address, route) failed.
    pub const NETLINK: u32 = 103;
    /// roam: CHECK found the attachment differs from the ADD's result.
    pub const CHECK_FAILED: u32 = 104;
    /// roam: the runtime's interface name is not in the pod's annotation.
    pub const NO_SUCH_INTERFACE: u32 = 105;
    /// roam: removing an attachment (DEL, GC, or what an earlier ADD left) failed midway.
    pub const CLEANUP_INCOMPLETE: u32 = 106;
    /// roam: roam-controller refused the pod addresses (its `roam.dev/error` annotation).
    pub const REFUSED: u32 = 107;
}

/// What went wrong; each variant maps to one CNI error code ([`Error::code`]).
///
/// Two kinds ([`Error::is_bad_input`]): what the runtime or the cluster gave roam-cni is wrong
/// (the environment, the configuration, the pod's annotation, the pod itself) and the same
/// request fails again; or the node or the API server failed, and it may pass later (the
/// transient ones are reported as [`code::TRY_AGAIN_LATER`]).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The configuration's (or the runtime's) cniVersion is not one roam-cni speaks, or the
    /// command needs a newer one.
    #[error("CNI version {version:?} is not supported{}", for_command.map(|c| format!(" for {c}")).unwrap_or_default())]
    IncompatibleVersion {
        /// The version asked for.
        version: String,
        /// The command that needs a newer version, if that is the problem.
        for_command: Option<&'static str>,
        /// The versions that would work.
        supported: Vec<&'static str>,
    },
    /// A required environment variable is missing or invalid.
    #[error("environment variable {var} {problem}")]
    InvalidEnv {
        /// The variable, e.g. `CNI_NETNS`.
        var: &'static str,
        /// What is wrong with it.
        problem: String,
    },
    /// Reading the configuration from stdin failed.
    #[error("cannot read the network configuration from stdin: {0}")]
    Stdin(#[source] std::io::Error),
    /// The configuration is not JSON.
    #[error("the network configuration is not valid JSON: {0}")]
    Decode(String),
    /// The configuration is JSON but not a valid roam-cni configuration.
    #[error("invalid network configuration: field {field}: {problem}")]
    InvalidConfig {
        /// The field, e.g. `annotationTimeoutSeconds`.
        field: String,
        /// What is wrong with it.
        problem: String,
    },
    /// The network namespace does not exist (the container is gone).
    #[error("network namespace {} does not exist", path.display())]
    NetnsGone {
        /// The path from CNI_NETNS.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The pod's address annotation did not appear in time.
    #[error("pod {namespace}/{pod} has no {annotation} annotation after {waited_secs} s")]
    AnnotationTimeout {
        /// The pod's namespace.
        namespace: String,
        /// The pod's name.
        pod: String,
        /// The annotation waited for.
        annotation: &'static str,
        /// How long we waited.
        waited_secs: u64,
    },
    /// roam-controller published no addresses for the pod and said why (`roam.dev/error`):
    /// its `roam.dev/interfaces` asks for something no Network gives, a Network that does not
    /// admit the pod's namespace or the service class it asks for, or its range is
    /// exhausted. Reported at once rather than after the annotation timeout. A pod whose own
    /// annotation forges a refusal only fails itself: addresses that check out are plumbed
    /// whatever it says, and nothing else ever is.
    #[error("roam-controller gives pod {namespace}/{pod} no addresses: {reason}")]
    Refused {
        /// The pod's namespace.
        namespace: String,
        /// The pod's name.
        pod: String,
        /// The controller's message.
        reason: String,
    },
    /// The annotation is there but malformed.
    #[error("pod {namespace}/{pod}: {source}")]
    BadAnnotation {
        /// The pod's namespace.
        namespace: String,
        /// The pod's name.
        pod: String,
        /// What is wrong with it.
        #[source]
        source: Box<roam_contract::annotation::AnnotationError>,
    },
    /// The pod's `roam.dev/addresses` names addresses that are not the pod's (no Address
    /// object says so): written by someone other than roam-controller, or stale.
    #[error("pod {namespace}/{pod}: its roam.dev/addresses is not roam-controller's: {problem}")]
    NotThePods {
        /// The pod's namespace.
        namespace: String,
        /// The pod's name.
        pod: String,
        /// Which Address and what differs.
        problem: String,
    },
    /// The runtime's CNI_IFNAME is not one of the pod's interfaces.
    #[error(
        "CNI_IFNAME {ifname:?} is not an interface of pod {namespace}/{pod} (its annotation lists {listed:?})"
    )]
    NoSuchInterface {
        /// CNI_IFNAME.
        ifname: String,
        /// The pod's namespace.
        namespace: String,
        /// The pod's name.
        pod: String,
        /// The interfaces the annotation lists.
        listed: Vec<String>,
    },
    /// The kubeconfig could not be loaded, or the API server refused the request.
    #[error("Kubernetes API: {0}")]
    Kube(String),
    /// The API server did not answer until the deadline (transient: the runtime retries).
    #[error("Kubernetes API unreachable: {0}")]
    KubeUnreachable(String),
    /// The node's OVSDB could not be reached (transient: the runtime should retry).
    #[error("cannot reach the node's Open_vSwitch database at {endpoint}: {reason}")]
    OvsdbUnreachable {
        /// The endpoint from the configuration.
        endpoint: String,
        /// Why.
        reason: String,
    },
    /// An OVSDB request failed.
    #[error("Open_vSwitch database: {0}")]
    Ovsdb(String),
    /// A netlink request failed.
    #[error("{action}: {reason}")]
    Netlink {
        /// What was being done, e.g. `add address 100.64.0.5/32 to eth0`.
        action: String,
        /// The kernel's answer.
        reason: String,
    },
    /// CHECK found differences from the previous result.
    #[error("the attachment differs from the ADD's result: {}", drifts.join("; "))]
    CheckFailed {
        /// Each difference, in words.
        drifts: Vec<String>,
    },
    /// Removing an attachment failed midway; what is left is listed.
    #[error("{context}: {}", errors.join("; "))]
    CleanupIncomplete {
        /// What was being removed, e.g. `DEL of container abc interface eth0`.
        context: String,
        /// Each failure.
        errors: Vec<String>,
    },
    /// A failed ADD whose rollback also failed: both are reported.
    #[error("{primary} (and the rollback failed: {})", rollback.join("; "))]
    RolledBackBadly {
        /// What made the ADD fail.
        primary: Box<Error>,
        /// What the rollback could not remove.
        rollback: Vec<String>,
    },
    /// STATUS: the plugin cannot add containers right now; `degraded` when what is missing
    /// (the node's OVS) also carries the existing containers' traffic.
    #[error("roam-cni is not ready: {reason}")]
    NotAvailable {
        /// What is missing.
        reason: String,
        /// Existing containers may have limited connectivity too.
        degraded: bool,
    },
}

impl Error {
    /// The CNI error code this error is reported with.
    pub fn code(&self) -> u32 {
        use code::*;
        match self {
            Error::IncompatibleVersion { .. } => INCOMPATIBLE_VERSION,
            Error::InvalidEnv { .. } => INVALID_ENV,
            Error::Stdin(_) => IO_FAILURE,
            Error::Decode(_) => DECODE,
            Error::InvalidConfig { .. } => INVALID_CONFIG,
            Error::NetnsGone { .. } => UNKNOWN_CONTAINER,
            Error::AnnotationTimeout { .. }
            | Error::OvsdbUnreachable { .. }
            | Error::KubeUnreachable(_) => TRY_AGAIN_LATER,
            Error::BadAnnotation { .. } | Error::NotThePods { .. } => BAD_ANNOTATION,
            Error::Refused { .. } => REFUSED,
            Error::NoSuchInterface { .. } => NO_SUCH_INTERFACE,
            Error::Kube(_) => KUBE_API,
            Error::CleanupIncomplete { .. } => CLEANUP_INCOMPLETE,
            Error::Ovsdb(_) => OVSDB,
            Error::Netlink { .. } => NETLINK,
            Error::CheckFailed { .. } => CHECK_FAILED,
            Error::RolledBackBadly { primary, .. } => primary.code(),
            Error::NotAvailable {
                degraded: false, ..
            } => NOT_AVAILABLE,
            Error::NotAvailable { degraded: true, .. } => NOT_AVAILABLE_DEGRADED,
        }
    }

    /// Whether the request is at fault: its environment variables, configuration, pod or the
    /// pod's annotation; the same request fails again until they change, and the error code
    /// says which ([`code::INVALID_ENV`], [`code::INVALID_CONFIG`], ...). `false`: the node
    /// (stdin, netlink, OVS) or the API server failed, or what roam-cni waits for is not
    /// there yet, and the runtime's retry may pass; or CHECK found the attachment changed.
    pub fn is_bad_input(&self) -> bool {
        match self {
            Error::IncompatibleVersion { .. }
            | Error::InvalidEnv { .. }
            | Error::Decode(_)
            | Error::InvalidConfig { .. }
            | Error::NetnsGone { .. }
            | Error::BadAnnotation { .. }
            | Error::NotThePods { .. }
            | Error::Refused { .. }
            | Error::NoSuchInterface { .. }
            // the kubeconfig is unusable, the pod does not exist, or the API server refused
            // (4xx): retrying does not help (unreachable is KubeUnreachable)
            | Error::Kube(_) => true,
            Error::Stdin(_)
            | Error::AnnotationTimeout { .. }
            | Error::KubeUnreachable(_)
            | Error::OvsdbUnreachable { .. }
            | Error::Ovsdb(_)
            | Error::Netlink { .. }
            | Error::CleanupIncomplete { .. }
            | Error::NotAvailable { .. }
            // the attachment drifted after ADD: the pod's state, not the request
            | Error::CheckFailed { .. } => false,
            Error::RolledBackBadly { primary, .. } => primary.is_bad_input(),
        }
    }

    /// The CNI error's `details`: what to do about it.
    pub fn details(&self) -> String {
        match self {
            Error::IncompatibleVersion { supported, .. } => format!(
                "roam-cni speaks cniVersion {}; GC and STATUS need 1.1.0, CHECK 0.4.0 or later",
                supported.join(", ")
            ),
            Error::InvalidEnv { .. } => "the runtime must set CNI_COMMAND, and for ADD and CHECK \
                CNI_CONTAINERID, CNI_NETNS, CNI_IFNAME and CNI_ARGS with K8S_POD_NAMESPACE and \
                K8S_POD_NAME (DEL needs only CNI_CONTAINERID and CNI_IFNAME)"
                .into(),
            Error::Stdin(_) => "the runtime must write the network configuration to stdin".into(),
            Error::Decode(_) => "stdin must hold the plugin's network configuration as JSON \
                (see deploy/cni/00-roam.conflist)"
                .into(),
            Error::InvalidConfig { .. } => "fix the conflist written by the installer \
                (deploy/cni-daemonset.yaml)"
                .into(),
            Error::NetnsGone { .. } => {
                "the container's network namespace is gone; nothing was created".into()
            }
            Error::AnnotationTimeout { .. } => "roam-controller publishes the pod's addresses \
                once its Address is claimed and its OVN port exists; is roam-controller running? \
                The runtime retries; raise annotationTimeoutSeconds in the conflist to wait longer"
                .into(),
            Error::BadAnnotation { .. } => {
                "the controller wrote an annotation roam-cni cannot use; nothing was plumbed".into()
            }
            Error::NotThePods { .. } => "roam-cni plumbs only addresses whose Address \
                object (written by roam-controller alone) names this pod's owner and node; \
                roam-controller replaces an annotation it did not write, so a pod created with \
                one that names other addresses starts once it has; do not set \
                roam.dev/addresses by hand"
                .into(),
            Error::Refused { .. } => "fix the pod's roam.dev/interfaces, or the Network it \
                names: a cluster admin lets the pod's namespace attach (the Network's \
                namespaces, namespaceSelector or allNamespaces) or allows the service class it \
                asks for (serviceClasses); the message and the pod's Events say which. The \
                runtime retries, and the pod starts once roam-controller publishes its addresses"
                .into(),
            Error::NoSuchInterface { .. } => "roam-cni plumbs every interface the annotation \
                lists in one ADD; CNI_IFNAME must be one of them (normally eth0)"
                .into(),
            Error::Kube(_) => "the runtime names the pod in CNI_ARGS (K8S_POD_NAMESPACE, \
                K8S_POD_NAME); the kubeconfig named in the conflist must be valid and its \
                ServiceAccount allowed to get pods"
                .into(),
            Error::KubeUnreachable(_) => "is the API server up and reachable from the node \
                (the kubeconfig's server address)? The runtime retries"
                .into(),
            Error::CleanupIncomplete { .. } => "the runtime retries DEL; what is listed is \
                still on the node (a host veth named rm…, or an OVS port with \
                external_ids:roam.dev/cni-container)"
                .into(),
            Error::OvsdbUnreachable { .. } => "is ovsdb-server running on the node, and is \
                ovsDb in the conflist its socket? The runtime retries"
                .into(),
            Error::Ovsdb(_) => "the node's OVS refused the change; see ovs-vswitchd's log".into(),
            Error::Netlink { .. } => {
                "the kernel refused the change; nothing of the attachment was left behind".into()
            }
            Error::CheckFailed { .. } => "the pod's network was changed after ADD; delete and \
                recreate the pod (or its sandbox) to replumb it"
                .into(),
            Error::RolledBackBadly { primary, .. } => format!(
                "{} — and some of what ADD created is still there; a DEL of this \
                 container removes it",
                primary.details()
            ),
            Error::NotAvailable { .. } => "roam-cni needs the node's OVS (br-int) and its \
                kubeconfig; see the node installer's log"
                .into(),
        }
    }
}
