//! The one error type of `roam-core`: what is wrong with the objects a decision was asked
//! about, said so that the one who wrote them knows what to change.

use std::net::Ipv4Addr;

use roam_contract::annotation::AnnotationError;
use roam_network::topology::PlanError;

/// Result with [`Error`] as the default error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a Network, a pod's interfaces or a VM cannot be served as they are.
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
    /// A VirtualMachine's spec cannot be run as given.
    #[error("virtual machine {vm}: {problem}")]
    InvalidVm {
        /// `namespace/name`.
        vm: String,
        /// What is wrong and what to do.
        problem: String,
    },
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
            Error::InvalidVm { .. } => "InvalidVirtualMachine",
        }
    }

    /// Whether the input is at fault (report it and claim nothing until it changes) rather
    /// than the cluster's state (a transit network that is full frees up as nodes go).
    pub fn is_bad_input(&self) -> bool {
        !matches!(self, Error::TransitExhausted { .. })
    }
}
