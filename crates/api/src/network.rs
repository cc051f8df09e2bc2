//! `Network`: one overlay or VLAN (underlay) network that addresses come from.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Overlay (roam's /32 network over geneve) or underlay (a tagged VLAN of the enterprise
/// network, reached through an OVN localnet port).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum NetworkMode {
    /// Every address a /32, routed to wherever its workload lives.
    #[default]
    Overlay,
    /// A VLAN's subnet, static or DHCP addressing.
    Underlay,
}

/// A network roam hands addresses out of. Cluster-scoped.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Deserialize, Serialize, JsonSchema)]
#[kube(
    group = "roam.dev",
    version = "v1alpha1",
    kind = "Network",
    plural = "networks",
    status = "NetworkStatus",
    printcolumn = r#"{"name":"MODE","type":"string","jsonPath":".spec.mode"}"#,
    printcolumn = r#"{"name":"SUBNET","type":"string","jsonPath":".spec.subnet"}"#,
    printcolumn = r#"{"name":"VLAN","type":"integer","jsonPath":".spec.vlan"}"#,
    printcolumn = r#"{"name":"FREE","type":"integer","jsonPath":".status.free"}"#,
    printcolumn = r#"{"name":"CLAIMED","type":"integer","jsonPath":".status.claimed"}"#,
    printcolumn = r#"{"name":"AGE","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct NetworkSpec {
    /// `overlay` (default) or `underlay`.
    #[serde(default)]
    pub mode: NetworkMode,
    /// VLAN tag (1–4094); required for `underlay`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vlan: Option<u16>,
    /// The range addresses come from, e.g. `100.64.0.0/10` (the default overlay range,
    /// RFC 6598).
    pub subnet: String,
    /// The gateway; for the overlay, the anycast gateway present on every node. Defaults to
    /// the subnet's first host address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<String>,
    /// Ranges never handed out (`a.b.c.d/len` or `a.b.c.d-e.f.g.h`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub excluded: Vec<String>,
    /// Unclaimed addresses kept ready per node (default 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool_size_per_node: Option<u32>,
    /// How often the pool is refilled, in seconds (default 30).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refill_period_seconds: Option<u32>,
    /// How long a deleted workload's address is kept for it before it is reclaimed, in
    /// seconds (default 600: a migrating or restarting workload gets its address back).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reclaim_grace_seconds: Option<u32>,
    /// DNS servers handed out with the address.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dns: Vec<String>,
    /// Interface MTU, in the DHCP lease and the pods' interfaces. Default: 1400 for an overlay
    /// (geneve between nodes costs up to 100 bytes of a 1500-byte node network), 1500 for an
    /// underlay (VLAN, not encapsulated). Raise it only if the node network carries more.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u16>,
    /// Underlay: the physical network the VLAN is on, mapped to a bridge on every node by
    /// `ovn-bridge-mappings` (default `physnet`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub physnet: Option<String>,
    /// Overlay: the transit network between the node routers and the fabric router (default
    /// `169.254.0.0/20`); must not overlap the subnet. Its first host is the fabric router's,
    /// the others are given to nodes, one each, for good (see status `transit`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transit_subnet: Option<String>,
    /// The namespaces whose pods and VMs may attach to this Network, by name. A namespace
    /// may attach when it is named here, or matches `namespaceSelector`, or `allNamespaces`
    /// is true; with none of the three given, no namespace may.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespaces: Vec<String>,
    /// The namespaces that may attach, by their labels (`matchLabels` and
    /// `matchExpressions` with `In`, `NotIn`, `Exists`, `DoesNotExist`). An empty selector
    /// (`{}`) matches every namespace, as in Kubernetes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,
    /// Every namespace may attach: a cluster-wide Network, e.g. the default overlay of plain
    /// pods.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub all_namespaces: bool,
    /// The RFC 4594 service classes (`serviceClass` / `service_class`) its interfaces may
    /// ask for, by name (`telephony`, `low-latency-data`, …, or the aliases `lowlatency` and
    /// `bulk`). An interface without a class (DF, `standard`) is always allowed. Not given:
    /// every class but `network-control` (CS6, the routing protocols' class).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_classes: Option<Vec<String>>,
}

/// What the controller observed of a Network.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetworkStatus {
    /// The generation these figures are for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Unclaimed addresses.
    #[serde(default)]
    pub free: u32,
    /// Claimed addresses.
    #[serde(default)]
    pub claimed: u32,
    /// Soft-deleted addresses waiting out their grace period.
    #[serde(default)]
    pub deleted: u32,
    /// `Ready`, and `Invalid` with the reason when the spec is rejected (e.g. overlapping
    /// another Network, VLAN 0 or 4095).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Overlay: each node's address on the transit network. Assigned once per node and
    /// kept (written with a resourceVersion precondition), so a node's router keeps its
    /// address across controller restarts and leader changes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub transit: Vec<TransitAddress>,
    /// The spec the controller serves: the last one it accepted. While Addresses of the
    /// Network are held, an edit of its subnet, gateway, mode, VLAN, physnet or transit
    /// subnet is refused (condition `ImmutableWhileInUse`) and this spec stays in force.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub served: Option<NetworkSpec>,
}

/// One node's address on an overlay network's transit network.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TransitAddress {
    /// The node.
    pub node: String,
    /// Its router's address on the transit network.
    pub ip: String,
}
