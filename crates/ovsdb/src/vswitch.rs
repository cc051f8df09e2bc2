//! Typed rows of a node's local `Open_vSwitch` database (checked against
//! `/usr/share/openvswitch/vswitch.ovsschema` 8.x): the bridges, their ports and the
//! ports' interfaces.

use serde::{Deserialize, Serialize};

use super::atom::{OvsMap, OvsSet, Uuid, optional};
use super::row::table_row;

/// The local database name.
pub const DATABASE: &str = "Open_vSwitch";

/// `Bridge`, e.g. `br-int`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Bridge {
    /// `_uuid`
    #[serde(rename = "_uuid", skip_serializing)]
    pub uuid: Uuid,
    /// Bridge name, unique on the node.
    pub name: String,
    /// Its ports (`Port`).
    pub ports: OvsSet<Uuid>,
}
table_row!(Bridge, DATABASE, "Bridge", ["name", "ports"]);

/// `Port`: a bridge port (one interface, or several for a bond).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Port {
    /// `_uuid`
    #[serde(rename = "_uuid", skip_serializing)]
    pub uuid: Uuid,
    /// Port name, unique on the node.
    pub name: String,
    /// Its interfaces (`Interface`, at least one).
    pub interfaces: OvsSet<Uuid>,
}
table_row!(Port, DATABASE, "Port", ["name", "interfaces"]);

/// `Interface`: a network device attached to a port.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Interface {
    /// `_uuid`
    #[serde(rename = "_uuid", skip_serializing)]
    pub uuid: Uuid,
    /// Interface name (the kernel device for `system` and `internal`).
    pub name: String,
    /// `""` (system), `internal`, `geneve`, `patch`, ...
    #[serde(rename = "type")]
    pub kind: String,
    /// Owner's bookkeeping; OVN binds a logical port by `external_ids:iface-id`.
    pub external_ids: OvsMap<String, String>,
    /// OpenFlow port number, set by ovs-vswitchd (-1 when the interface failed).
    #[serde(with = "optional")]
    pub ofport: Option<i64>,
    /// Type-specific options, e.g. `peer` for a patch port.
    pub options: OvsMap<String, String>,
}
table_row!(
    Interface,
    DATABASE,
    "Interface",
    ["name", "type", "external_ids", "ofport", "options"]
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::row::assert_columns_match;

    #[test]
    fn declared_columns_are_the_serialized_ones() {
        assert_columns_match::<Bridge>();
        assert_columns_match::<Port>();
        assert_columns_match::<Interface>();
    }
}
