//! Every label, annotation, finalizer and `external_ids` key roam reads or writes, defined
//! once. Renaming one changes the contract between the controller, the CNI plugin and the
//! shim, and what a running cluster already holds.

// Kubernetes labels

/// The label of a VM launcher pod (and of a VirtualMachineMigration) naming its
/// VirtualMachine.
pub const VM_LABEL: &str = "roam.dev/vm";
/// The label that marks a VM's launcher pod (value `true`).
pub const LAUNCHER_LABEL: &str = "roam.dev/launcher";
/// The label that marks a VM's runner, the privileged pod in roam's namespace that runs the
/// VM of a launcher pod (value `true`).
pub const RUNNER_LABEL: &str = "roam.dev/runner";
/// The label of a runner naming its VM's UID.
pub const RUNNER_VM_LABEL: &str = "roam.dev/vm-uid";
/// The label on an Address naming its Network.
pub const NETWORK_LABEL: &str = "roam.dev/network";

// Kubernetes annotations

/// The pod annotation the workload (or the VM controller) writes: the interfaces it asks
/// for, see [`crate::annotation::parse_interfaces`].
pub const INTERFACES: &str = "roam.dev/interfaces";
/// The pod annotation the controller writes for the CNI plugin: the claimed addresses, see
/// [`crate::annotation::PodAddress`].
pub const ADDRESSES: &str = "roam.dev/addresses";
/// The pod annotation saying why no address was published for it.
pub const ERROR_ANNOTATION: &str = "roam.dev/error";
/// The annotation on an Address naming the pod (`namespace/name`) that last claimed it.
pub const POD_ANNOTATION: &str = "roam.dev/pod";
/// The annotation on an Address listing (comma-separated) the nodes where its port exists
/// too, besides its `host`: a live migration's target before switchover, its source after.
pub const ALSO_ON: &str = "roam.dev/also-on";
/// The annotation on a VirtualMachine that asks for a migration: a node name, or `auto`.
pub const MIGRATE_TO: &str = "roam.dev/migrate-to";
/// The annotation on a migration's target launcher pod: the migration's name.
pub const MIGRATION_ANNOTATION: &str = "roam.dev/migration";

/// The annotation of a runner naming its VM (`namespace/name`).
pub const RUNNER_VM_ANNOTATION: &str = "roam.dev/vm";
/// The annotation of a runner naming its launcher pod (`namespace/name`).
pub const RUNNER_OF_ANNOTATION: &str = "roam.dev/launcher";
/// The annotation of a runner naming its launcher pod's UID: a runner is its launcher's only
/// while that pod lives (a new pod of the same name gets a runner of its own).
pub const RUNNER_OF_UID_ANNOTATION: &str = "roam.dev/launcher-uid";

// Finalizers

/// The finalizer that lets a deleted VirtualMachineMigration abort first.
pub const MIGRATION_FINALIZER: &str = "roam.dev/migration";
/// The finalizer that holds a deleted VirtualMachine until its domain, taps and OVS ports
/// are gone from every node (and with it the hold on its Addresses).
pub const VM_FINALIZER: &str = "roam.dev/teardown";

// OVN northbound `external_ids`

/// The key naming the network that owns a row; roam reads, changes and deletes only rows
/// that carry it.
pub const OWNER_KEY: &str = "roam.dev/network";
/// The key of a `DHCP_Options` row naming the logical switch port it serves.
pub const PORT_KEY: &str = "roam.dev/port";

// Open_vSwitch `Interface` `external_ids`

/// ovn-controller binds the logical switch port of this name to the interface.
pub const IFACE_ID: &str = "iface-id";
/// The MAC of the pod's interface (the convention OVN's CMSes use).
pub const ATTACHED_MAC: &str = "attached-mac";
/// The CNI network name of an attachment made by roam-cni.
pub const CNI_NETWORK: &str = "roam.dev/cni-network";
/// CNI_CONTAINERID of an attachment made by roam-cni.
pub const CNI_CONTAINER: &str = "roam.dev/cni-container";
/// CNI_IFNAME of an attachment made by roam-cni.
pub const CNI_IFNAME: &str = "roam.dev/cni-ifname";
/// The interface's name inside the pod, of an attachment made by roam-cni.
pub const POD_IFNAME: &str = "roam.dev/pod-ifname";
