//! Typed rows of the OVN northbound tables roam uses (schema `OVN_Northbound` 7.x, checked
//! against `/usr/share/ovn/ovn-nb.ovsschema`).
//!
//! Read them with [`select_all`](super::select_all) or a [`Monitor`](super::Monitor);
//! serialize one for an insert with [`insert_op`](super::insert_op). Reference columns hold
//! [`Uuid`]s; inside a transaction that inserts the target too, put
//! `["named-uuid", ..]` into the JSON instead.

use serde::{Deserialize, Serialize};

use super::atom::{OvsMap, OvsSet, Uuid, optional};
use super::row::table_row;

/// The northbound database name.
pub const DATABASE: &str = "OVN_Northbound";

/// A `string → string` map column such as `external_ids`.
pub type StringMap = OvsMap<String, String>;

/// `Logical_Switch`: an L2 segment.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct LogicalSwitch {
    /// `_uuid`
    #[serde(rename = "_uuid", skip_serializing)]
    pub uuid: Uuid,
    /// Name (not necessarily unique).
    pub name: String,
    /// Its ports (`Logical_Switch_Port`, strong references).
    pub ports: OvsSet<Uuid>,
    /// Settings such as `subnet`, `exclude_ips`, `mcast_snoop`.
    pub other_config: StringMap,
    /// Owner's bookkeeping.
    pub external_ids: StringMap,
    /// Its QoS rules (`QoS`, strong references).
    pub qos_rules: OvsSet<Uuid>,
    /// Its DNS records (`DNS`, weak references).
    pub dns_records: OvsSet<Uuid>,
}
table_row!(
    LogicalSwitch,
    DATABASE,
    "Logical_Switch",
    [
        "name",
        "ports",
        "other_config",
        "external_ids",
        "qos_rules",
        "dns_records"
    ]
);

/// `Logical_Switch_Port`: a port of a logical switch (a VM or pod interface, a router
/// attachment, a localnet port...).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct LogicalSwitchPort {
    /// `_uuid`
    #[serde(rename = "_uuid", skip_serializing)]
    pub uuid: Uuid,
    /// Name, unique across all logical switch ports (the `iface-id` of the OVS interface).
    pub name: String,
    /// `""` for a VM/pod port, or `router`, `localnet`, `localport`, `external`, ...
    #[serde(rename = "type")]
    pub kind: String,
    /// `"MAC [IP..]"` entries, `router`, `unknown`, `dynamic`.
    pub addresses: OvsSet<String>,
    /// Addresses the port may send from.
    pub port_security: OvsSet<String>,
    /// Type-specific options, e.g. `router-port`, `network_name`.
    pub options: StringMap,
    /// DHCPv4 options served to the port (`DHCP_Options`, weak reference).
    #[serde(with = "optional")]
    pub dhcpv4_options: Option<Uuid>,
    /// VLAN tag of a nested or localnet port (1..4095).
    #[serde(with = "optional")]
    pub tag: Option<i64>,
    /// Requested VLAN tag (0..4095; 0 asks for a dynamic one).
    #[serde(with = "optional")]
    pub tag_request: Option<i64>,
    /// Set by ovn-northd when the port is bound and up.
    #[serde(with = "optional")]
    pub up: Option<bool>,
    /// Administrative state (`None` means enabled).
    #[serde(with = "optional")]
    pub enabled: Option<bool>,
    /// Owner's bookkeeping.
    pub external_ids: StringMap,
}
table_row!(
    LogicalSwitchPort,
    DATABASE,
    "Logical_Switch_Port",
    [
        "name",
        "type",
        "addresses",
        "port_security",
        "options",
        "dhcpv4_options",
        "tag",
        "tag_request",
        "up",
        "enabled",
        "external_ids"
    ]
);

/// `Logical_Router`: an L3 router.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct LogicalRouter {
    /// `_uuid`
    #[serde(rename = "_uuid", skip_serializing)]
    pub uuid: Uuid,
    /// Name (not necessarily unique).
    pub name: String,
    /// Its ports (`Logical_Router_Port`, strong references).
    pub ports: OvsSet<Uuid>,
    /// Its static routes (`Logical_Router_Static_Route`, strong references).
    pub static_routes: OvsSet<Uuid>,
    /// Its NAT rules (`NAT`, strong references).
    pub nat: OvsSet<Uuid>,
    /// Options such as `chassis`, `dynamic_neigh_routers`.
    pub options: StringMap,
    /// Owner's bookkeeping.
    pub external_ids: StringMap,
}
table_row!(
    LogicalRouter,
    DATABASE,
    "Logical_Router",
    [
        "name",
        "ports",
        "static_routes",
        "nat",
        "options",
        "external_ids"
    ]
);

/// `Logical_Router_Port`: a router interface.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct LogicalRouterPort {
    /// `_uuid`
    #[serde(rename = "_uuid", skip_serializing)]
    pub uuid: Uuid,
    /// Name, unique across all logical router ports.
    pub name: String,
    /// Ethernet address, e.g. `0a:00:00:00:00:01`.
    pub mac: String,
    /// IP networks in CIDR form, e.g. `10.0.0.1/24` (at least one).
    pub networks: OvsSet<String>,
    /// Options such as `gateway_mtu`.
    pub options: StringMap,
    /// Owner's bookkeeping.
    pub external_ids: StringMap,
}
table_row!(
    LogicalRouterPort,
    DATABASE,
    "Logical_Router_Port",
    ["name", "mac", "networks", "options", "external_ids"]
);

/// The `policy` of a static route.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(from = "String", into = "String")]
pub enum RoutePolicy {
    /// `dst-ip`: match the destination (the default when unset).
    DstIp,
    /// `src-ip`: match the source.
    SrcIp,
    /// A value this version of roam does not know.
    Other(String),
}

impl From<String> for RoutePolicy {
    fn from(s: String) -> Self {
        match s.as_str() {
            "dst-ip" => RoutePolicy::DstIp,
            "src-ip" => RoutePolicy::SrcIp,
            _ => RoutePolicy::Other(s),
        }
    }
}

impl From<RoutePolicy> for String {
    fn from(p: RoutePolicy) -> String {
        match p {
            RoutePolicy::DstIp => "dst-ip".into(),
            RoutePolicy::SrcIp => "src-ip".into(),
            RoutePolicy::Other(s) => s,
        }
    }
}

/// `Logical_Router_Static_Route`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct LogicalRouterStaticRoute {
    /// `_uuid`
    #[serde(rename = "_uuid", skip_serializing)]
    pub uuid: Uuid,
    /// The matched prefix, e.g. `10.1.2.3/32` or `0.0.0.0/0`.
    pub ip_prefix: String,
    /// The next hop, e.g. `10.0.0.254` (or `discard`).
    pub nexthop: String,
    /// The router port to send through, if not derived from `nexthop`.
    #[serde(with = "optional")]
    pub output_port: Option<String>,
    /// Source- or destination-based (`None` is destination).
    #[serde(with = "optional")]
    pub policy: Option<RoutePolicy>,
    /// Route table name (`""` is the main table).
    pub route_table: String,
    /// Owner's bookkeeping.
    pub external_ids: StringMap,
}
table_row!(
    LogicalRouterStaticRoute,
    DATABASE,
    "Logical_Router_Static_Route",
    [
        "ip_prefix",
        "nexthop",
        "output_port",
        "policy",
        "route_table",
        "external_ids"
    ]
);

/// The `type` of a NAT rule.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(from = "String", into = "String")]
pub enum NatType {
    /// `snat`
    Snat,
    /// `dnat`
    Dnat,
    /// `dnat_and_snat`
    DnatAndSnat,
    /// A value this version of roam does not know (`""` for a default-constructed row).
    Other(String),
}

impl Default for NatType {
    fn default() -> Self {
        NatType::Other(String::new())
    }
}

impl From<String> for NatType {
    fn from(s: String) -> Self {
        match s.as_str() {
            "snat" => NatType::Snat,
            "dnat" => NatType::Dnat,
            "dnat_and_snat" => NatType::DnatAndSnat,
            _ => NatType::Other(s),
        }
    }
}

impl From<NatType> for String {
    fn from(t: NatType) -> String {
        match t {
            NatType::Snat => "snat".into(),
            NatType::Dnat => "dnat".into(),
            NatType::DnatAndSnat => "dnat_and_snat".into(),
            NatType::Other(s) => s,
        }
    }
}

/// `NAT`: a NAT rule of a logical router.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Nat {
    /// `_uuid`
    #[serde(rename = "_uuid", skip_serializing)]
    pub uuid: Uuid,
    /// The kind of translation.
    #[serde(rename = "type")]
    pub kind: NatType,
    /// The external address.
    pub external_ip: String,
    /// The internal address or network.
    pub logical_ip: String,
    /// Owner's bookkeeping.
    pub external_ids: StringMap,
}
table_row!(
    Nat,
    DATABASE,
    "NAT",
    ["type", "external_ip", "logical_ip", "external_ids"]
);

/// `DHCP_Options`: what OVN's native DHCP server answers for a CIDR.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct DhcpOptions {
    /// `_uuid`
    #[serde(rename = "_uuid", skip_serializing)]
    pub uuid: Uuid,
    /// The subnet, e.g. `10.0.0.5/32`.
    pub cidr: String,
    /// DHCP options: `lease_time`, `router`, `server_id`, `server_mac`, ...
    pub options: StringMap,
    /// Owner's bookkeeping.
    pub external_ids: StringMap,
}
table_row!(
    DhcpOptions,
    DATABASE,
    "DHCP_Options",
    ["cidr", "options", "external_ids"]
);

/// The `direction` of a QoS rule.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(from = "String", into = "String")]
pub enum QosDirection {
    /// `from-lport`: traffic sent by the port.
    FromLport,
    /// `to-lport`: traffic sent to the port.
    ToLport,
    /// A value this version of roam does not know (`""` for a default-constructed row).
    Other(String),
}

impl Default for QosDirection {
    fn default() -> Self {
        QosDirection::Other(String::new())
    }
}

impl From<String> for QosDirection {
    fn from(s: String) -> Self {
        match s.as_str() {
            "from-lport" => QosDirection::FromLport,
            "to-lport" => QosDirection::ToLport,
            _ => QosDirection::Other(s),
        }
    }
}

impl From<QosDirection> for String {
    fn from(d: QosDirection) -> String {
        match d {
            QosDirection::FromLport => "from-lport".into(),
            QosDirection::ToLport => "to-lport".into(),
            QosDirection::Other(s) => s,
        }
    }
}

/// `QoS`: marking and rate limiting for traffic matching a logical-flow expression.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Qos {
    /// `_uuid`
    #[serde(rename = "_uuid", skip_serializing)]
    pub uuid: Uuid,
    /// Higher wins (0..32767).
    pub priority: i64,
    /// Which traffic of the port.
    pub direction: QosDirection,
    /// Logical-flow match expression, e.g. `inport == "vm1"`.
    #[serde(rename = "match")]
    pub match_: String,
    /// `dscp` → value (0..63).
    pub action: OvsMap<String, i64>,
    /// `rate` (kbps) and `burst` (kb) → value.
    pub bandwidth: OvsMap<String, i64>,
    /// Owner's bookkeeping.
    pub external_ids: StringMap,
}
table_row!(
    Qos,
    DATABASE,
    "QoS",
    [
        "priority",
        "direction",
        "match",
        "action",
        "bandwidth",
        "external_ids"
    ]
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::row::{TableRow, assert_columns_match, decode_row};
    use serde_json::json;

    #[test]
    fn declared_columns_are_the_serialized_ones() {
        assert_columns_match::<LogicalSwitch>();
        assert_columns_match::<LogicalSwitchPort>();
        assert_columns_match::<LogicalRouter>();
        assert_columns_match::<LogicalRouterPort>();
        assert_columns_match::<LogicalRouterStaticRoute>();
        assert_columns_match::<Nat>();
        assert_columns_match::<DhcpOptions>();
        assert_columns_match::<Qos>();
    }

    #[test]
    fn decodes_a_server_row() {
        let u = "550e8400-e29b-41d4-a716-446655440000";
        let lsp: LogicalSwitchPort = serde_json::from_value(json!({
            "_uuid": ["uuid", u],
            "_version": ["uuid", u],
            "name": "vm1",
            "type": "",
            "addresses": "0a:00:00:00:00:05 10.0.0.5",
            "port_security": ["set", []],
            "options": ["map", [["requested-chassis", "node-a"]]],
            "dhcpv4_options": ["uuid", u],
            "tag": ["set", []],
            "tag_request": 0,
            "up": true,
            "enabled": ["set", []],
            "external_ids": ["map", []],
            "parent_name": ["set", []]
        }))
        .unwrap();
        assert_eq!(lsp.uuid(), u.parse().unwrap());
        assert_eq!(lsp.addresses.len(), 1);
        assert_eq!(lsp.dhcpv4_options, Some(u.parse().unwrap()));
        assert_eq!(
            (lsp.tag, lsp.tag_request, lsp.up, lsp.enabled),
            (None, Some(0), Some(true), None)
        );
        assert_eq!(lsp.options["requested-chassis"], "node-a");

        // monitor rows carry no _uuid and maybe only some columns
        let row = json!({"type": "dnat_and_snat", "external_ip": "1.2.3.4"});
        let nat: Nat = decode_row("NAT", &u.parse().unwrap(), row.as_object().unwrap()).unwrap();
        assert_eq!(nat.kind, NatType::DnatAndSnat);
        assert_eq!(nat.logical_ip, "");
        assert_eq!(nat.uuid.to_string(), u);

        let r: LogicalRouterStaticRoute =
            serde_json::from_value(json!({"policy": "src-ip"})).unwrap();
        assert_eq!(r.policy, Some(RoutePolicy::SrcIp));
        let q: Qos = serde_json::from_value(
            json!({"direction": "sideways", "bandwidth": ["map", [["rate", 1000]]]}),
        )
        .unwrap();
        assert_eq!(q.direction, QosDirection::Other("sideways".into()));
        assert_eq!(q.bandwidth["rate"], 1000);
        // wrong types are decode errors naming the row
        let e = decode_row::<Qos>(
            "QoS",
            &u.parse().unwrap(),
            json!({"priority": "high"}).as_object().unwrap(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("QoS row"), "{e}");
    }

    #[test]
    fn serializes_an_insert_row_without_uuid() {
        let nat = Nat {
            uuid: "550e8400-e29b-41d4-a716-446655440000".parse().unwrap(),
            kind: NatType::Snat,
            external_ip: "192.0.2.1".into(),
            logical_ip: "10.0.0.0/24".into(),
            external_ids: [("roam".to_string(), "1".to_string())].into(),
        };
        assert_eq!(
            crate::row_json(&nat),
            json!({"type": "snat", "external_ip": "192.0.2.1", "logical_ip": "10.0.0.0/24", "external_ids": ["map", [["roam", "1"]]]})
        );
    }
}
