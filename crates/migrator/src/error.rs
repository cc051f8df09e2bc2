//! The one error type of `roam-migrator`.

use std::net::Ipv4Addr;

use roam_contract::annotation::AnnotationError;
use roam_network::topology::PlanError;

/// Result with [`Error`] as the default error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What went wrong in the address control plane.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Network's spec cannot be used (bad subnet, gateway, VLAN tag, excluded range, …).
    #[error("network {network}: {field} {value:?} is invalid: {problem}")]
    InvalidNetwork {
        /// The Network.
        network: String,
        /// The spec field, e.g. `vlan`.
        field: &'static str,
        /// The value given.
        value: String,
        /// What is allowed.
        problem: String,
    },
    /// An edit of a Network that its held Addresses depend on; the served spec stays.
    #[error(
        "network {network}: {fields} cannot change while {held} Addresses of it are held; \
         the previous spec stays in force. Move the workloads to a new Network (or delete \
         them), then edit, or revert the edit"
    )]
    ImmutableWhileInUse {
        /// The Network.
        network: String,
        /// The changed fields, comma-separated.
        fields: String,
        /// How many of its Addresses are held.
        held: usize,
    },
    /// Two Networks' ranges overlap; the younger one is refused.
    #[error(
        "network {network}: subnet {subnet} overlaps {other_subnet} of the older network {other}; \
         give every Network its own range"
    )]
    OverlappingNetworks {
        /// The refused Network.
        network: String,
        /// Its subnet.
        subnet: String,
        /// The Network it overlaps.
        other: String,
        /// That Network's subnet.
        other_subnet: String,
    },
    /// The transit network has no address left for another node.
    #[error(
        "network {network}: transit network {subnet} has no address left for node {node}; \
         use a larger transitSubnet"
    )]
    TransitExhausted {
        /// The Network.
        network: String,
        /// The transit subnet.
        subnet: String,
        /// The node that got none.
        node: String,
    },
    /// A pod's `roam.dev/interfaces` annotation is invalid.
    #[error("pod {pod}: {source}")]
    Annotation {
        /// `namespace/name`.
        pod: String,
        /// What is wrong.
        source: AnnotationError,
    },
    /// No usable Network matches an interface's request.
    #[error("pod {pod}, interface {interface}: {problem}")]
    NoNetwork {
        /// `namespace/name`.
        pod: String,
        /// The interface.
        interface: String,
        /// Which Network was looked for and why none fits.
        problem: String,
    },
    /// A static IP outside its Network's range (or its gateway, or excluded).
    #[error(
        "pod {pod}, interface {interface}: static IP {ip} is not an assignable address of \
         network {network} ({subnet}, gateway and excluded ranges are not assignable)"
    )]
    StaticIpOutsideSubnet {
        /// `namespace/name`.
        pod: String,
        /// The interface.
        interface: String,
        /// The IP asked for.
        ip: Ipv4Addr,
        /// The Network.
        network: String,
        /// Its subnet.
        subnet: String,
    },
    /// A static IP (or MAC) already held by another owner.
    #[error(
        "pod {pod}, interface {interface}: {what} is already held by {holder} in network \
         {network}; choose another or release it"
    )]
    Taken {
        /// `namespace/name`.
        pod: String,
        /// The interface.
        interface: String,
        /// `IP a.b.c.d` or `MAC …`.
        what: String,
        /// Its holder (owner key or Address name).
        holder: String,
        /// The Network.
        network: String,
    },
    /// A requested MAC is one OVN's routers or DHCP server answer with on the Network.
    #[error(
        "pod {pod}, interface {interface}: MAC {mac} is reserved in network {network} ({what}); \
         choose another MAC or leave mac out to get one derived from the IP"
    )]
    ReservedMac {
        /// `namespace/name`.
        pod: String,
        /// The interface.
        interface: String,
        /// The MAC asked for.
        mac: String,
        /// The Network.
        network: String,
        /// What uses it.
        what: String,
    },
    /// A workload's namespace may not attach to the Network its interface asks for (the
    /// Network's `namespaces`, `namespaceSelector`, `allNamespaces`).
    #[error(
        "{workload}, interface {interface}: namespace {namespace} may not attach to network \
         {network}; a cluster admin adds {namespace} to the Network's spec.namespaces, labels \
         the namespace to match its spec.namespaceSelector, or sets spec.allNamespaces: true"
    )]
    NetworkNotAllowed {
        /// `pod namespace/name` or `virtual machine namespace/name`.
        workload: String,
        /// The interface.
        interface: String,
        /// The Network.
        network: String,
        /// The workload's namespace.
        namespace: String,
    },
    /// An interface asks for a service class its Network does not allow (`serviceClasses`).
    #[error(
        "{workload}, interface {interface}: network {network} does not allow service class \
         {class} (it allows {allowed}); ask for one of those, or a cluster admin lists {class} \
         in the Network's spec.serviceClasses, with every other class it is to allow"
    )]
    ServiceClassNotAllowed {
        /// `pod namespace/name` or `virtual machine namespace/name`.
        workload: String,
        /// The interface.
        interface: String,
        /// The Network.
        network: String,
        /// The class asked for.
        class: String,
        /// The classes the Network allows, comma-separated.
        allowed: String,
    },
    /// No free address is left in the Network's range.
    #[error(
        "network {network}: no free address left for node {node} (the range is exhausted); \
         widen the subnet, shrink excluded ranges or the pool size, or free addresses"
    )]
    Exhausted {
        /// The Network.
        network: String,
        /// The node.
        node: String,
    },
    /// The OVN plan of a Network is invalid.
    #[error(transparent)]
    Plan(#[from] PlanError),
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
    /// A VirtualMachine's spec cannot be run as given.
    #[error("virtual machine {vm}: {problem}")]
    InvalidVm {
        /// `namespace/name`.
        vm: String,
        /// What is wrong and what to do.
        problem: String,
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

impl Error {
    /// A short PascalCase reason for Events, conditions and metric labels.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::InvalidNetwork { .. } => "InvalidNetwork",
            Error::OverlappingNetworks { .. } => "OverlappingNetworks",
            Error::ImmutableWhileInUse { .. } => "ImmutableWhileInUse",
            Error::TransitExhausted { .. } => "TransitExhausted",
            Error::Annotation { .. } => "InvalidInterfaces",
            Error::NoNetwork { .. } => "NoNetwork",
            Error::StaticIpOutsideSubnet { .. } => "StaticIpOutsideSubnet",
            Error::Taken { .. } => "AddressTaken",
            Error::ReservedMac { .. } => "ReservedMac",
            Error::NetworkNotAllowed { .. } => "NetworkNotAllowed",
            Error::ServiceClassNotAllowed { .. } => "ServiceClassNotAllowed",
            Error::Exhausted { .. } => "PoolExhausted",
            Error::Plan(_) => "InvalidTopology",
            Error::Ovn(_) => "OvnError",
            Error::Kube(_) => "KubernetesApiError",
            Error::Conflict(_) => "Conflict",
            Error::Stopped(_) => "Stopped",
            Error::Pki(_) => "PkiError",
            Error::HeldElsewhere { .. } => "HeldElsewhere",
            Error::InvalidVm { .. } => "InvalidVirtualMachine",
            Error::Shim { .. } => "ShimError",
        }
    }

    /// Whether the input is at fault (report it and claim nothing until it changes) rather
    /// than the environment (retry with backoff).
    pub fn is_bad_input(&self) -> bool {
        match self {
            Error::InvalidNetwork { .. }
            | Error::OverlappingNetworks { .. }
            | Error::ImmutableWhileInUse { .. }
            | Error::Annotation { .. }
            | Error::NoNetwork { .. }
            | Error::StaticIpOutsideSubnet { .. }
            | Error::Taken { .. }
            | Error::ReservedMac { .. }
            | Error::NetworkNotAllowed { .. }
            | Error::ServiceClassNotAllowed { .. }
            | Error::Exhausted { .. }
            | Error::Plan(_)
            | Error::InvalidVm { .. } => true,
            // OVN refused what was planned from the objects (a topology it cannot realize, a
            // transaction breaking a constraint): the same plan is refused again
            Error::Ovn(e) => e.is_bad_input(),
            // the shim refused the request as invalid (a 4xx other than 408, 409, 429)
            Error::Shim { source, .. } => source.is_bad_input(),
            Error::TransitExhausted { .. }
            | Error::Kube(_)
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
                Error::TransitExhausted {
                    network: s(),
                    subnet: s(),
                    node: s(),
                },
                false,
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
