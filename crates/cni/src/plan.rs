//! What to plumb for one attachment, decided from the pod's published addresses: pure.
//!
//! Every interface of the pod's `roam.dev/addresses` is plumbed by the one ADD the runtime
//! makes (CNI_IFNAME must be one of them, normally `eth0`): a veth pair per interface, the
//! pod side named and addressed per the annotation, the host side in the node's integration
//! bridge bound to the interface's OVN port.
//!
//! The host side's name is derived from the attachment's key (network name, container ID,
//! CNI_IFNAME) and the interface's position, so DEL finds it from the spec's variables alone:
//! `rm` + 11 hex digits of a stable hash of the key + 2 hex digits of the position.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use roam_contract::annotation::{Mode, PodAddress, PodRoute};

use crate::config::AttachmentKey;
use crate::error::{Error, Result};

/// `external_ids` keys roam-cni sets on the OVS `Interface` it creates.
pub mod ids {
    pub use roam_contract::keys::{
        ATTACHED_MAC, CNI_CONTAINER as CONTAINER, CNI_IFNAME as IFNAME, CNI_NETWORK as NETWORK,
        IFACE_ID, POD_IFNAME,
    };
}

/// Prefix of every host-side veth roam-cni creates.
pub const HOST_PREFIX: &str = "rm";

/// One interface to plumb.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InterfacePlan {
    /// The interface's name inside the pod (`eth0`, `eth1`, …).
    pub pod_ifname: String,
    /// The host side of the veth pair (an OVS port of the bridge).
    pub host_ifname: String,
    /// The pod interface's MAC.
    pub mac: [u8; 6],
    /// Its MTU (both ends).
    pub mtu: u32,
    /// Overlay or underlay.
    pub mode: Mode,
    /// Its address.
    pub ip: Ipv4Addr,
    /// The address's prefix length (32 on the overlay).
    pub prefix_len: u8,
    /// The gateway.
    pub gateway: Ipv4Addr,
    /// The routes to add, in order.
    pub routes: Vec<PodRoute>,
    /// The OVS Interface's `external_ids`.
    pub external_ids: BTreeMap<String, String>,
}

/// FNV-1a, 64 bits: stable across builds and Rust versions (the std hasher is not), so a
/// DEL by a newer roam-cni still finds what an older one created.
fn fnv1a(parts: &[&str]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for b in p.bytes().chain([0u8]) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

/// The host-side name stem (without the position) of every veth of an attachment.
pub fn host_stem(network: &str, key: &AttachmentKey) -> String {
    let h = fnv1a(&[network, &key.container_id, &key.ifname]);
    format!("{HOST_PREFIX}{:011x}", h & 0xfff_ffff_ffff)
}

/// The host-side name of the `index`th interface of an attachment (15 characters).
pub fn host_ifname(network: &str, key: &AttachmentKey, index: u8) -> String {
    format!("{}{index:02x}", host_stem(network, key))
}

/// The plan for an attachment: one [`InterfacePlan`] per interface of the annotation, in its
/// order. CNI_IFNAME must be one of them.
pub fn plan(
    network: &str,
    key: &AttachmentKey,
    pod: (&str, &str),
    addresses: &[PodAddress],
) -> Result<Vec<InterfacePlan>> {
    if !addresses.iter().any(|a| a.name == key.ifname) {
        return Err(Error::NoSuchInterface {
            ifname: key.ifname.clone(),
            namespace: pod.0.into(),
            pod: pod.1.into(),
            listed: addresses.iter().map(|a| a.name.clone()).collect(),
        });
    }
    if addresses.len() > 255 {
        return Err(Error::BadAnnotation {
            namespace: pod.0.into(),
            pod: pod.1.into(),
            source: Box::new(roam_contract::annotation::AnnotationError::InvalidField {
                interface: key.ifname.clone(),
                field: "(list)",
                value: addresses.len().to_string(),
                problem: "at most 255 interfaces per pod".into(),
            }),
        });
    }
    addresses
        .iter()
        .enumerate()
        .map(|(i, a)| {
            let mac = a.mac().map_err(|source| Error::BadAnnotation {
                namespace: pod.0.into(),
                pod: pod.1.into(),
                source: Box::new(source),
            })?;
            let mac: [u8; 6] = mac.into();
            let mac_text = a.mac.to_ascii_lowercase();
            let external_ids = [
                (ids::IFACE_ID, a.port.as_str()),
                (ids::ATTACHED_MAC, mac_text.as_str()),
                (ids::NETWORK, network),
                (ids::CONTAINER, key.container_id.as_str()),
                (ids::IFNAME, key.ifname.as_str()),
                (ids::POD_IFNAME, a.name.as_str()),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
            Ok(InterfacePlan {
                pod_ifname: a.name.clone(),
                host_ifname: host_ifname(network, key, i as u8),
                mac,
                mtu: u32::from(a.mtu),
                mode: a.mode,
                ip: a.ip,
                prefix_len: a.prefix_len,
                gateway: a.gateway,
                routes: a.routes(),
                external_ids,
            })
        })
        .collect()
}

/// `aa:bb:cc:dd:ee:ff`.
pub fn mac_string(mac: &[u8; 6]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}
