//! The two pod annotations that connect the controller and the CNI plugin.
//!
//! - [`INTERFACES`] (`roam.dev/interfaces`), written by the user (or by the VM controller from a
//!   VirtualMachine's `interfaces`): what the workload asks for, per interface — `mode`,
//!   `interface` {dhcp, mac, ip, mask, gateway, name, metric, service_class}, `vlan` {tag,
//!   gateway} — plus an optional `network` (the `Network` object to draw from). Values may be
//!   strings (`"dhcp": "true"`, `"metric": "0"`, `"tag": "10"`) or JSON numbers/booleans.
//!   A pod without it gets one overlay interface `eth0` on the overlay network.
//! - [`ADDRESSES`] (`roam.dev/addresses`), written by the controller once the addresses are
//!   claimed and their OVN ports exist: everything the CNI needs to plumb each interface
//!   ([`PodAddress`]), and nothing it would have to look up. [`PodAddress::routes`] is the
//!   route list the CNI installs.
//!
//! Both are parsed and validated here, as plain data: a malformed annotation is an
//! [`AnnotationError`] naming the interface and the field, and nothing is claimed or plumbed
//! for that pod.

use std::collections::BTreeSet;
use std::fmt;
use std::net::Ipv4Addr;
use std::str::FromStr;

use roam_dhcp_opts::MacAddr;
use serde::{Deserialize, Deserializer, Serialize};

use crate::keys::{ADDRESSES, INTERFACES};
use crate::qos::Marking;

/// Overlay (a /32 behind the anycast gateway) or underlay (a host of a VLAN's subnet).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// roam's /32 network over geneve.
    Overlay,
    /// A tagged VLAN of the enterprise network.
    Underlay,
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Overlay => "overlay",
            Mode::Underlay => "underlay",
        })
    }
}

/// What is wrong with an annotation. Every variant is bad input: the annotation's writer must
/// fix it (report it on the pod); reading it again gives the same error.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AnnotationError {
    /// Not JSON, or not the expected shape (a missing field, an unknown mode, a wrong type).
    #[error(
        "annotation {annotation} is malformed: {problem}; expected a JSON array of \
         {{\"mode\": \"overlay\"|\"underlay\", \"interface\": {{\"name\": \"eth0\", …}}, \"vlan\": {{\"tag\": 10}}}}"
    )]
    Malformed {
        /// Which annotation.
        annotation: &'static str,
        /// serde's description, with line and column.
        problem: String,
    },
    /// The array is empty.
    #[error("annotation {annotation} lists no interface; remove it to get the default eth0")]
    Empty {
        /// Which annotation.
        annotation: &'static str,
    },
    /// One field of one interface is invalid.
    #[error("interface {interface}: {field} {value:?} is invalid: {problem}")]
    InvalidField {
        /// The interface's name (or its index when the name itself is bad).
        interface: String,
        /// The field, e.g. `vlan.tag`.
        field: &'static str,
        /// The value given.
        value: String,
        /// What is allowed.
        problem: String,
    },
    /// Two interfaces have the same name.
    #[error("interface name {0:?} is used twice; each interface needs its own name")]
    DuplicateName(String),
    /// More interfaces than a workload may have.
    #[error(
        "annotation {annotation} lists {count} interfaces; a workload has at most \
         {MAX_INTERFACES} (one Address, tap and OVN port each)"
    )]
    TooMany {
        /// Which annotation.
        annotation: &'static str,
        /// How many it lists.
        count: usize,
    },
}

/// The most interfaces a pod or VM may ask for: a VM's taps are named `<base><index>` in 15
/// bytes, and every interface costs an Address, a tap and an OVN port.
pub const MAX_INTERFACES: usize = 8;

type Result<T, E = AnnotationError> = std::result::Result<T, E>;

/// One interface as the workload asks for it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InterfaceRequest {
    /// `overlay` or `underlay`.
    pub mode: Mode,
    /// The `Network` to draw the address from. Optional: without it, the overlay interface
    /// uses the one overlay Network, an underlay interface the Network of its VLAN tag.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<String>,
    /// The interface's fields.
    pub interface: InterfaceFields,
    /// The VLAN (required for underlay).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vlan: Option<VlanFields>,
}

/// The `interface` object of a request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InterfaceFields {
    /// Address by DHCP (OVN answers) rather than static.
    #[serde(default, deserialize_with = "lenient_bool")]
    pub dhcp: bool,
    /// A requested MAC (static addressing); otherwise the Address's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    /// A requested static IP; otherwise one is claimed from the pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip: Option<Ipv4Addr>,
    /// The mask of a static underlay address (must match the VLAN's subnet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mask: Option<Ipv4Addr>,
    /// The gateway of a static address (must match the Network's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<Ipv4Addr>,
    /// The interface name inside the pod (`eth0`, `eth1`, …).
    pub name: String,
    /// The metric of the interface's default route (default 0).
    #[serde(default, deserialize_with = "lenient_u32")]
    pub metric: u32,
    /// RFC 4594 class, e.g. `lowlatency`, `bulk`, `telephony` (see [`crate::qos`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_class: Option<String>,
}

/// The `vlan` object of a request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VlanFields {
    /// 802.1Q tag, 1–4094.
    #[serde(deserialize_with = "lenient_u16")]
    pub tag: u16,
    /// The VLAN's gateway (informational; the Network's is authoritative).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<Ipv4Addr>,
}

impl InterfaceRequest {
    /// The default interface of a pod without [`INTERFACES`]: overlay `eth0`, pool address.
    pub fn default_overlay() -> Self {
        InterfaceRequest {
            mode: Mode::Overlay,
            network: None,
            interface: InterfaceFields {
                dhcp: false,
                mac: None,
                ip: None,
                mask: None,
                gateway: None,
                name: "eth0".into(),
                metric: 0,
                service_class: None,
            },
            vlan: None,
        }
    }

    /// The DSCP marking its service class asks for (None: no marking).
    pub fn marking(&self) -> Result<Option<Marking>> {
        self.interface
            .service_class
            .as_deref()
            .map(|c| {
                Marking::from_str(c).map_err(|e| AnnotationError::InvalidField {
                    interface: self.interface.name.clone(),
                    field: "interface.service_class",
                    value: c.into(),
                    problem: e.to_string(),
                })
            })
            .transpose()
    }

    /// The requested MAC, parsed.
    pub fn requested_mac(&self) -> Result<Option<MacAddr>> {
        self.interface
            .mac
            .as_deref()
            .map(|m| parse_mac(&self.interface.name, "interface.mac", m))
            .transpose()
    }
}

/// Parse and validate [`INTERFACES`].
pub fn parse_interfaces(json: &str) -> Result<Vec<InterfaceRequest>> {
    let list: Vec<InterfaceRequest> =
        serde_json::from_str(json).map_err(|e| AnnotationError::Malformed {
            annotation: INTERFACES,
            problem: e.to_string(),
        })?;
    if list.is_empty() {
        return Err(AnnotationError::Empty {
            annotation: INTERFACES,
        });
    }
    if list.len() > MAX_INTERFACES {
        return Err(AnnotationError::TooMany {
            annotation: INTERFACES,
            count: list.len(),
        });
    }
    let mut names = BTreeSet::new();
    for r in &list {
        let name = &r.interface.name;
        check_ifname(name)?;
        if !names.insert(name.clone()) {
            return Err(AnnotationError::DuplicateName(name.clone()));
        }
        let bad = |field: &'static str, value: String, problem: &str| {
            Err(AnnotationError::InvalidField {
                interface: name.clone(),
                field,
                value,
                problem: problem.into(),
            })
        };
        if let Some(v) = &r.vlan {
            check_tag(name, v.tag)?;
        }
        match r.mode {
            Mode::Underlay if r.vlan.is_none() && r.network.is_none() => {
                return bad(
                    "vlan",
                    "null".into(),
                    "an underlay interface needs its VLAN (\"vlan\": {\"tag\": N}) or a network",
                );
            }
            _ => {}
        }
        if let (true, Some(ip)) = (r.interface.dhcp, r.interface.ip) {
            return bad(
                "interface.ip",
                ip.to_string(),
                "a DHCP interface cannot also ask for a static IP; set \"dhcp\": \"false\"",
            );
        }
        if let Some(mask) = r.interface.mask {
            prefix_of_mask(name, mask)?;
        }
        if let Some(ip) = r.interface.ip
            && (ip.is_unspecified() || ip.is_broadcast() || ip.is_multicast() || ip.is_loopback())
        {
            return bad(
                "interface.ip",
                ip.to_string(),
                "must be a unicast host address",
            );
        }
        r.requested_mac()?;
        r.marking()?;
    }
    Ok(list)
}

/// One interface as published for the CNI: everything needed to plumb it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PodAddress {
    /// Interface name inside the pod.
    pub name: String,
    /// The `Network` it belongs to.
    pub network: String,
    /// Overlay or underlay.
    pub mode: Mode,
    /// The `Address` object holding it.
    pub address: String,
    /// The OVN logical switch port on this node: the OVS interface's `external_ids:iface-id`.
    pub port: String,
    /// The IP.
    pub ip: Ipv4Addr,
    /// Its prefix length: 32 on the overlay, the VLAN subnet's on the underlay.
    pub prefix_len: u8,
    /// The MAC of the pod's interface.
    pub mac: String,
    /// The gateway: the anycast gateway (overlay) or the VLAN's router (underlay).
    pub gateway: Ipv4Addr,
    /// Metric of the default route through this interface.
    #[serde(default)]
    pub metric: u32,
    /// Interface MTU.
    pub mtu: u16,
    /// OVN answers DHCP for it (the CNI still configures the leased values itself).
    #[serde(default)]
    pub dhcp: bool,
    /// The VLAN tag (underlay).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vlan: Option<u16>,
    /// The service class its traffic is marked with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_class: Option<String>,
}

/// A route the CNI installs for an interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PodRoute {
    /// Destination network.
    pub dst: Ipv4Addr,
    /// Destination prefix length.
    pub prefix_len: u8,
    /// Next hop; `None` = on-link (scope link).
    pub via: Option<Ipv4Addr>,
    /// Route metric.
    pub metric: u32,
}

impl PodAddress {
    /// The routes for this interface, in the order they must be added. Overlay:
    /// the gateway on-link (`GW/32 dev IF`), then `default via GW metric M` — the default
    /// route's gateway is only reachable through the first. Underlay: the connected subnet
    /// comes with the address; only `default via GW metric M`.
    pub fn routes(&self) -> Vec<PodRoute> {
        let default = PodRoute {
            dst: Ipv4Addr::UNSPECIFIED,
            prefix_len: 0,
            via: Some(self.gateway),
            metric: self.metric,
        };
        match self.mode {
            Mode::Overlay => vec![
                PodRoute {
                    dst: self.gateway,
                    prefix_len: 32,
                    via: None,
                    metric: self.metric,
                },
                default,
            ],
            Mode::Underlay => vec![default],
        }
    }

    /// The MAC, parsed.
    pub fn mac(&self) -> Result<MacAddr> {
        parse_mac(&self.name, "mac", &self.mac)
    }

    fn validate(&self) -> Result<()> {
        check_ifname(&self.name)?;
        let bad = |field: &'static str, value: String, problem: &str| {
            Err(AnnotationError::InvalidField {
                interface: self.name.clone(),
                field,
                value,
                problem: problem.into(),
            })
        };
        if self.port.is_empty() {
            return bad("port", String::new(), "the OVN port name is empty");
        }
        match self.mode {
            Mode::Overlay if self.prefix_len != 32 => {
                return bad(
                    "prefixLen",
                    self.prefix_len.to_string(),
                    "an overlay address is a /32",
                );
            }
            Mode::Underlay if !(1..=30).contains(&self.prefix_len) => {
                return bad(
                    "prefixLen",
                    self.prefix_len.to_string(),
                    "an underlay subnet is /1 to /30",
                );
            }
            _ => {}
        }
        if self.gateway == self.ip {
            return bad(
                "gateway",
                self.gateway.to_string(),
                "the gateway is the interface's own address",
            );
        }
        if self.mode == Mode::Underlay {
            let mask = u32::MAX << (32 - self.prefix_len);
            if u32::from(self.gateway) & mask != u32::from(self.ip) & mask {
                return bad(
                    "gateway",
                    self.gateway.to_string(),
                    "an underlay gateway must be on the interface's subnet",
                );
            }
        }
        if !(68..=65535).contains(&self.mtu) {
            return bad("mtu", self.mtu.to_string(), "MTU must be 68–65535");
        }
        if let Some(tag) = self.vlan {
            check_tag(&self.name, tag)?;
        }
        self.mac()?;
        Ok(())
    }
}

/// Parse and validate [`ADDRESSES`].
pub fn parse_addresses(json: &str) -> Result<Vec<PodAddress>> {
    let list: Vec<PodAddress> =
        serde_json::from_str(json).map_err(|e| AnnotationError::Malformed {
            annotation: ADDRESSES,
            problem: e.to_string(),
        })?;
    if list.is_empty() {
        return Err(AnnotationError::Empty {
            annotation: ADDRESSES,
        });
    }
    let mut names = BTreeSet::new();
    for a in &list {
        a.validate()?;
        if !names.insert(a.name.clone()) {
            return Err(AnnotationError::DuplicateName(a.name.clone()));
        }
    }
    Ok(list)
}

/// Serialize [`ADDRESSES`] (validated, so the CNI never sees what it would refuse).
pub fn addresses_annotation(list: &[PodAddress]) -> Result<String> {
    let json = serde_json::to_string(list).expect("plain data serializes");
    parse_addresses(&json)?;
    Ok(json)
}

/// The prefix length of a contiguous netmask.
pub fn prefix_of_mask(interface: &str, mask: Ipv4Addr) -> Result<u8> {
    let m = u32::from(mask);
    let len = m.leading_ones();
    if m.checked_shl(len).unwrap_or(0) != 0 {
        return Err(AnnotationError::InvalidField {
            interface: interface.into(),
            field: "interface.mask",
            value: mask.to_string(),
            problem: "a netmask's ones must be contiguous (e.g. 255.255.255.0)".into(),
        });
    }
    Ok(len as u8)
}

fn check_tag(interface: &str, tag: u16) -> Result<()> {
    if (1..=4094).contains(&tag) {
        Ok(())
    } else {
        Err(AnnotationError::InvalidField {
            interface: interface.into(),
            field: "vlan.tag",
            value: tag.to_string(),
            problem: "a VLAN tag is 1–4094 (0 and 4095 are reserved by 802.1Q)".into(),
        })
    }
}

/// Linux interface names: 1–15 bytes, no `/`, `:` or whitespace, not `.` or `..`.
fn check_ifname(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 15
        && name != "."
        && name != ".."
        && !name
            .chars()
            .any(|c| c == '/' || c == ':' || c.is_whitespace() || c.is_control());
    if ok {
        Ok(())
    } else {
        Err(AnnotationError::InvalidField {
            interface: name.into(),
            field: "interface.name",
            value: name.into(),
            problem: "an interface name is 1–15 characters without '/', ':' or spaces".into(),
        })
    }
}

fn parse_mac(interface: &str, field: &'static str, s: &str) -> Result<MacAddr> {
    let invalid = |problem: String| AnnotationError::InvalidField {
        interface: interface.into(),
        field,
        value: s.into(),
        problem,
    };
    let mac = MacAddr::from_str(s).map_err(|e| invalid(e.to_string()))?;
    if mac.is_multicast() || mac.is_zero() {
        return Err(invalid(
            "an interface MAC must be unicast and non-zero".into(),
        ));
    }
    Ok(mac)
}

/// A value written as a string or natively in JSON.
#[derive(Deserialize)]
#[serde(untagged)]
enum Lenient<T> {
    Native(T),
    Text(String),
}

fn lenient<'de, D: Deserializer<'de>, T: FromStr + Deserialize<'de>>(
    d: D,
    what: &str,
) -> Result<T, D::Error> {
    match Lenient::<T>::deserialize(d)? {
        Lenient::Native(v) => Ok(v),
        Lenient::Text(s) => s
            .trim()
            .parse()
            .map_err(|_| serde::de::Error::custom(format!("{s:?} is not {what}"))),
    }
}

fn lenient_bool<'de, D: Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    lenient(d, "a boolean (true or false)")
}

fn lenient_u32<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    lenient(d, "a non-negative integer")
}

fn lenient_u16<'de, D: Deserializer<'de>>(d: D) -> Result<u16, D::Error> {
    lenient(d, "an integer 0–65535")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The annotation's reference example, values written as strings.
    const EXAMPLE: &str = r#"[
      { "mode": "underlay",
        "interface": { "dhcp": "true", "mac": "00:00:00:8a:62:c4", "ip": "10.0.0.2",
          "mask": "255.255.255.0", "gateway": "10.0.0.1", "name": "eth0", "metric": "0",
          "service_class": "bulk" },
        "vlan": { "tag": "10", "gateway": "10.0.2.254" } },
      { "mode": "overlay",
        "interface": { "dhcp": "false", "mac": "00:00:00:11:22:33", "ip": "192.168.1.2",
          "mask": "255.255.255.0", "gateway": "192.168.1.1", "name": "eth1", "metric": "1024",
          "service_class": "lowlatency" },
        "vlan": { "tag": "192", "gateway": "192.168.1.254" } }
    ]"#;

    fn err(json: &str) -> AnnotationError {
        parse_interfaces(json).unwrap_err()
    }

    #[test]
    fn the_reference_annotation_parses_strings_as_values() {
        // the first interface is dhcp with an ip: roam refuses that combination
        let e = err(EXAMPLE);
        assert!(
            matches!(
                &e,
                AnnotationError::InvalidField {
                    field: "interface.ip",
                    ..
                }
            ),
            "{e}"
        );
        let fixed = EXAMPLE.replacen(
            "\"dhcp\": \"true\", \"mac\": \"00:00:00:8a:62:c4\", \"ip\": \"10.0.0.2\",",
            "\"dhcp\": \"true\", \"mac\": \"00:00:00:8a:62:c4\",",
            1,
        );
        let list = parse_interfaces(&fixed).unwrap();
        assert_eq!(list.len(), 2);
        assert_eq!(list[0].mode, Mode::Underlay);
        assert!(list[0].interface.dhcp);
        assert_eq!(list[0].vlan.as_ref().unwrap().tag, 10);
        assert_eq!(list[1].interface.metric, 1024);
        assert_eq!(list[1].marking().unwrap().unwrap().dscp(), 22);
        assert_eq!(list[0].marking().unwrap().unwrap().dscp(), 14);
        assert_eq!(
            list[1].requested_mac().unwrap().unwrap().to_string(),
            "00:00:00:11:22:33"
        );
    }

    #[test]
    fn native_json_values_are_accepted_too() {
        let list = parse_interfaces(
            r#"[{"mode":"underlay","interface":{"dhcp":true,"name":"eth0","metric":5},"vlan":{"tag":116}}]"#,
        )
        .unwrap();
        assert_eq!(list[0].vlan.as_ref().unwrap().tag, 116);
        assert_eq!(list[0].interface.metric, 5);
    }

    #[test]
    fn bad_annotations_name_the_field() {
        assert!(matches!(err("not json"), AnnotationError::Malformed { .. }));
        assert!(matches!(err("[]"), AnnotationError::Empty { .. }));
        let e = err(r#"[{"mode":"bridge","interface":{"name":"eth0"}}]"#);
        assert!(e.to_string().contains("bridge"), "{e}");
        for tag in ["0", "4095", "\"4095\""] {
            let e = err(&format!(
                r#"[{{"mode":"underlay","interface":{{"name":"eth0"}},"vlan":{{"tag":{tag}}}}}]"#
            ));
            assert!(
                matches!(
                    &e,
                    AnnotationError::InvalidField {
                        field: "vlan.tag",
                        ..
                    }
                ),
                "{tag}: {e}"
            );
        }
        let e = err(r#"[{"mode":"underlay","interface":{"name":"eth0"},"vlan":{"tag":"ten"}}]"#);
        assert!(e.to_string().contains("\"ten\" is not"), "{e}");
        let e = err(r#"[{"mode":"underlay","interface":{"name":"eth0"}}]"#);
        assert!(
            matches!(&e, AnnotationError::InvalidField { field: "vlan", .. }),
            "{e}"
        );
        let e = err(
            r#"[{"mode":"overlay","interface":{"name":"eth0"}},{"mode":"overlay","interface":{"name":"eth0"}}]"#,
        );
        assert_eq!(e, AnnotationError::DuplicateName("eth0".into()));
        let list = |n: usize| {
            let v: Vec<String> = (0..n)
                .map(|i| format!(r#"{{"mode":"overlay","interface":{{"name":"eth{i}"}}}}"#))
                .collect();
            format!("[{}]", v.join(","))
        };
        assert_eq!(parse_interfaces(&list(MAX_INTERFACES)).unwrap().len(), 8);
        let e = err(&list(MAX_INTERFACES + 1));
        assert!(
            matches!(e, AnnotationError::TooMany { count: 9, .. }),
            "{e}"
        );
        let e = err(r#"[{"mode":"overlay","interface":{"name":"a-very-long-interface"}}]"#);
        assert!(matches!(
            &e,
            AnnotationError::InvalidField {
                field: "interface.name",
                ..
            }
        ));
        let e = err(r#"[{"mode":"overlay","interface":{"name":"eth0","service_class":"gold"}}]"#);
        assert!(
            matches!(
                &e,
                AnnotationError::InvalidField {
                    field: "interface.service_class",
                    ..
                }
            ),
            "{e}"
        );
        let e =
            err(r#"[{"mode":"overlay","interface":{"name":"eth0","mac":"01:00:5e:00:00:01"}}]"#);
        assert!(matches!(
            &e,
            AnnotationError::InvalidField {
                field: "interface.mac",
                ..
            }
        ));
        let e = err(
            r#"[{"mode":"underlay","interface":{"name":"eth0","ip":"10.0.0.2","mask":"255.0.255.0"},"vlan":{"tag":1}}]"#,
        );
        assert!(matches!(
            &e,
            AnnotationError::InvalidField {
                field: "interface.mask",
                ..
            }
        ));
        let e = err(r#"[{"mode":"overlay","interface":{"name":"eth0","colour":"red"}}]"#);
        assert!(e.to_string().contains("colour"), "{e}");
    }

    fn overlay() -> PodAddress {
        PodAddress {
            name: "eth0".into(),
            network: "ovl".into(),
            mode: Mode::Overlay,
            address: "ovl-100-64-0-5".into(),
            port: "ovl-100-64-0-5.node-a".into(),
            ip: Ipv4Addr::new(100, 64, 0, 5),
            prefix_len: 32,
            mac: "0a:58:64:40:00:05".into(),
            gateway: Ipv4Addr::new(100, 64, 0, 1),
            metric: 0,
            mtu: 1400,
            dhcp: false,
            vlan: None,
            service_class: None,
        }
    }

    #[test]
    fn overlay_routes_are_gateway_on_link_then_default() {
        let r = overlay().routes();
        assert_eq!(r.len(), 2);
        assert_eq!(
            (r[0].dst, r[0].prefix_len, r[0].via),
            (Ipv4Addr::new(100, 64, 0, 1), 32, None)
        );
        assert_eq!((r[1].dst, r[1].prefix_len), (Ipv4Addr::UNSPECIFIED, 0));
        assert_eq!(r[1].via, Some(Ipv4Addr::new(100, 64, 0, 1)));
    }

    #[test]
    fn underlay_routes_only_the_default() {
        let a = PodAddress {
            mode: Mode::Underlay,
            prefix_len: 24,
            ip: Ipv4Addr::new(192, 0, 2, 10),
            gateway: Ipv4Addr::new(192, 0, 2, 1),
            vlan: Some(10),
            metric: 100,
            ..overlay()
        };
        let json = addresses_annotation(std::slice::from_ref(&a)).unwrap();
        assert_eq!(parse_addresses(&json).unwrap(), vec![a.clone()]);
        let r = a.routes();
        assert_eq!(r.len(), 1);
        assert_eq!(
            (r[0].prefix_len, r[0].via, r[0].metric),
            (0, Some(a.gateway), 100)
        );
    }

    #[test]
    fn published_addresses_are_checked_both_ways() {
        let bad = [
            PodAddress {
                prefix_len: 24,
                ..overlay()
            },
            PodAddress {
                gateway: Ipv4Addr::new(100, 64, 0, 5),
                ..overlay()
            },
            PodAddress {
                mtu: 10,
                ..overlay()
            },
            PodAddress {
                mac: "ff:ff:ff:ff:ff:ff".into(),
                ..overlay()
            },
            PodAddress {
                port: String::new(),
                ..overlay()
            },
            PodAddress {
                vlan: Some(4095),
                ..overlay()
            },
            PodAddress {
                mode: Mode::Underlay,
                prefix_len: 24,
                gateway: Ipv4Addr::new(10, 0, 0, 1),
                ..overlay()
            },
        ];
        for a in bad {
            assert!(
                addresses_annotation(std::slice::from_ref(&a)).is_err(),
                "{a:?}"
            );
        }
        assert!(matches!(
            parse_addresses("{").unwrap_err(),
            AnnotationError::Malformed {
                annotation: ADDRESSES,
                ..
            }
        ));
        let two = serde_json::to_string(&[overlay(), overlay()]).unwrap();
        assert_eq!(
            parse_addresses(&two).unwrap_err(),
            AnnotationError::DuplicateName("eth0".into())
        );
    }

    #[test]
    fn masks() {
        assert_eq!(
            prefix_of_mask("e", Ipv4Addr::new(255, 255, 255, 0)).unwrap(),
            24
        );
        assert_eq!(
            prefix_of_mask("e", Ipv4Addr::new(255, 255, 255, 255)).unwrap(),
            32
        );
        assert_eq!(prefix_of_mask("e", Ipv4Addr::new(0, 0, 0, 0)).unwrap(), 0);
        assert!(prefix_of_mask("e", Ipv4Addr::new(255, 0, 255, 0)).is_err());
    }
}
