//! `Address`: one IP + MAC that outlives the pods and nodes it is used on. Its object name
//! is derived from its network and IP, so the API server's name uniqueness is the lock on an
//! IP: two claims of one IP cannot both be created.

use std::net::Ipv4Addr;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// One address. Cluster-scoped; name = [`address_name`]`(network, ip)`.
#[derive(CustomResource, Clone, Debug, PartialEq, Deserialize, Serialize, JsonSchema)]
#[kube(
    group = "roam.dev",
    version = "v1alpha1",
    kind = "Address",
    plural = "addresses",
    status = "AddressStatus",
    printcolumn = r#"{"name":"IP","type":"string","jsonPath":".spec.ip"}"#,
    printcolumn = r#"{"name":"MAC","type":"string","jsonPath":".spec.mac"}"#,
    printcolumn = r#"{"name":"OWNER","type":"string","jsonPath":".spec.owner"}"#,
    printcolumn = r#"{"name":"HOST","type":"string","jsonPath":".spec.host"}"#,
    printcolumn = r#"{"name":"RESERVED","type":"boolean","jsonPath":".spec.reserved"}"#,
    printcolumn = r#"{"name":"DELETED","type":"boolean","jsonPath":".spec.deleted"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct AddressSpec {
    /// The Network it belongs to.
    pub network: String,
    /// The IPv4 address.
    pub ip: String,
    /// The MAC the workload's interface gets (locally administered, generated once).
    pub mac: String,
    /// The node's management address that routes to this address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<String>,
    /// Who holds it: `namespace/name` of a VirtualMachine, or `namespace:name` of a plain pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owner: Option<String>,
    /// The node it lives on now; its /32 route points there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    /// Claimed by a workload.
    #[serde(default)]
    pub reserved: bool,
    /// Its workload went away; kept for the owner until the grace period ends.
    #[serde(default)]
    pub deleted: bool,
    /// When it was marked deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletion_time: Option<Time>,
    /// For underlay addresses: the VLAN and its subnet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vlan: Option<AddressVlan>,
    /// The owner's interface this address is for (`eth0`, `eth1`, …): with several
    /// interfaces, reuse matches owner + network + interface.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<String>,
    /// OVN answers DHCP for it (VMs, DHCP underlay interfaces).
    #[serde(default)]
    pub dhcp: bool,
    /// The RFC 4594 service class its traffic is marked with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_class: Option<String>,
}

/// The VLAN of an underlay address.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AddressVlan {
    /// VLAN tag, 1–4094.
    pub tag: u16,
    /// The VLAN's subnet (`a.b.c.d/len`).
    pub local_subnet: String,
}

/// What the controller observed of an Address.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AddressStatus {
    /// The OVN logical switch port currently carrying it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<String>,
}

/// The object name of `ip`'s Address in `network`: `<network>-<a>-<b>-<c>-<d>`. Two claims
/// of one IP produce one name, so the API server lets only one of them be created.
pub fn address_name(network: &str, ip: Ipv4Addr) -> String {
    let [a, b, c, d] = ip.octets();
    format!("{network}-{a}-{b}-{c}-{d}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::CustomResourceExt;

    #[test]
    fn the_name_is_the_lock_on_the_ip() {
        let ip = Ipv4Addr::new(100, 64, 1, 10);
        assert_eq!(address_name("overlay", ip), "overlay-100-64-1-10");
        assert_eq!(address_name("overlay", ip), address_name("overlay", ip));
        assert_ne!(address_name("overlay", ip), address_name("vlan116", ip));
        assert_ne!(
            address_name("overlay", Ipv4Addr::new(100, 64, 11, 0)),
            address_name("overlay", Ipv4Addr::new(100, 64, 1, 10))
        );
    }

    #[test]
    fn crd_has_the_printer_columns_and_is_cluster_scoped() {
        let crd = Address::crd();
        assert_eq!(crd.metadata.name.as_deref(), Some("addresses.roam.dev"));
        assert_eq!(crd.spec.scope, "Cluster");
        let cols: Vec<String> = crd.spec.versions[0]
            .additional_printer_columns
            .as_ref()
            .unwrap()
            .iter()
            .map(|c| c.name.clone())
            .collect();
        assert_eq!(cols, ["IP", "MAC", "OWNER", "HOST", "RESERVED", "DELETED"]);
    }
}
