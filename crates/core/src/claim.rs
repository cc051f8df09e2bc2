//! A pod → its owner key and interface requests → per interface, which Address it gets
//! (reuse by owner, a pool claim, or a new Address for a static IP or an empty pool); the
//! claimed Address's new spec; and the `roam.dev/addresses` the CNI reads.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::str::FromStr;
use std::time::SystemTime;

use roam_contract::annotation::{InterfaceRequest, Mode, PodAddress, parse_interfaces};
use roam_contract::keys::{ADDRESSES, INTERFACES, NETWORK_LABEL, POD_ANNOTATION};
use roam_contract::mac_for_ip;
use roam_dhcp_opts::MacAddr;
use roam_network::topology::{mobile_port_name, overlay_port_name, vlan_port_name};

use super::network::NetworkPlan;
use crate::error::{Error, Result};
use roam_api::{Address, AddressSpec, AddressVlan, NetworkMode, address_name};

pub use roam_contract::keys::{ALSO_ON, VM_LABEL};

/// The nodes of an Address's [`ALSO_ON`] annotation (without its host, sorted, no repeats).
pub fn also_on(a: &Address) -> Vec<String> {
    let host = a.spec.host.as_deref().unwrap_or_default();
    let set: BTreeSet<String> = a
        .metadata
        .annotations
        .as_ref()
        .and_then(|m| m.get(ALSO_ON))
        .map(|v| {
            v.split(',')
                .map(str::trim)
                .filter(|n| !n.is_empty() && *n != host)
                .map(String::from)
                .collect()
        })
        .unwrap_or_default();
    set.into_iter().collect()
}

pub use roam_contract::owner::owner_key;

/// One interface's request with the Network it draws from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resolved<'a> {
    /// The request.
    pub request: InterfaceRequest,
    /// Its Network.
    pub network: &'a NetworkPlan,
}

/// Parse a pod's `roam.dev/interfaces` (absent: one overlay `eth0`) and find each
/// interface's Network among the valid ones: the named one, else for the overlay the only
/// overlay Network, for the underlay the Network of the VLAN tag ([`resolve_for`] with no
/// Network admitting the workload's namespace known).
pub fn resolve<'a>(
    pod: &str,
    annotations: &BTreeMap<String, String>,
    networks: &'a [NetworkPlan],
) -> Result<Vec<Resolved<'a>>> {
    resolve_for(pod, annotations, networks, &BTreeSet::new())
}

/// [`resolve`], where an interface that names no Network and finds several of its mode
/// (and VLAN) takes the one of them that admits the workload's namespace (`admitting`: the
/// names of the Networks whose access rules do): another namespace's Network is not a
/// choice, so it makes no default ambiguous.
pub fn resolve_for<'a>(
    pod: &str,
    annotations: &BTreeMap<String, String>,
    networks: &'a [NetworkPlan],
    admitting: &BTreeSet<String>,
) -> Result<Vec<Resolved<'a>>> {
    let requests = match annotations.get(INTERFACES) {
        Some(json) => parse_interfaces(json).map_err(|source| Error::Annotation {
            pod: pod.into(),
            source,
        })?,
        None => vec![InterfaceRequest::default_overlay()],
    };
    requests
        .into_iter()
        .map(|request| {
            let iface = request.interface.name.clone();
            let none = |problem: String| Error::NoNetwork {
                pod: pod.into(),
                interface: iface.clone(),
                problem,
            };
            let want_mode = match request.mode {
                Mode::Overlay => NetworkMode::Overlay,
                Mode::Underlay => NetworkMode::Underlay,
            };
            let network = if let Some(name) = &request.network {
                let n = networks.iter().find(|n| &n.name == name).ok_or_else(|| {
                    none(format!(
                        "no usable Network {name:?} (missing or invalid: see its status)"
                    ))
                })?;
                if n.mode != want_mode {
                    return Err(none(format!(
                        "Network {name} is {:?}, the interface asks for {}",
                        n.mode, request.mode
                    )));
                }
                if let (Some(v), Some(tag)) = (&request.vlan, n.vlan)
                    && v.tag != tag
                {
                    return Err(none(format!(
                        "Network {name} is VLAN {tag}, the interface asks for VLAN {}",
                        v.tag
                    )));
                }
                n
            } else {
                let candidates: Vec<&NetworkPlan> = networks
                    .iter()
                    .filter(|n| n.mode == want_mode)
                    .filter(|n| match (request.mode, &request.vlan) {
                        (Mode::Underlay, Some(v)) => n.vlan == Some(v.tag),
                        _ => true,
                    })
                    .collect();
                let admitted: Vec<&NetworkPlan> = candidates
                    .iter()
                    .copied()
                    .filter(|n| admitting.contains(&n.name))
                    .collect();
                match (candidates.as_slice(), admitted.as_slice()) {
                    ([one], _) | ([_, _, ..], [one]) => *one,
                    ([], _) => {
                        return Err(none(match &request.vlan {
                            Some(v) if request.mode == Mode::Underlay => {
                                format!("no usable underlay Network has VLAN {}", v.tag)
                            }
                            _ => format!("no usable {} Network exists", request.mode),
                        }));
                    }
                    (many, _) => {
                        return Err(none(format!(
                            "{} {} Networks match ({}); name one with \"network\"",
                            many.len(),
                            request.mode,
                            many.iter()
                                .map(|n| n.name.as_str())
                                .collect::<Vec<_>>()
                                .join(", ")
                        )));
                    }
                }
            };
            Ok(Resolved { request, network })
        })
        .collect()
}

/// Whether `owner`'s interfaces may have what they ask for: each Network must admit the
/// workload's `namespace` (labelled `labels`) and the service class the interface asks for
/// ([`crate::network::access`]). Every interface is checked before any is claimed, so
/// a refusal claims nothing. What the owner already holds stays its own: an interface whose
/// live Address (`addresses`, the owner's and others') is on the Network is not asked again
/// — a revoked namespace keeps its running workloads, their restarts and migrations; only
/// new attachments are refused — and its class is checked only when it asks for another.
pub fn may_use(
    workload: &str,
    namespace: &str,
    labels: &BTreeMap<String, String>,
    owner: &str,
    resolved: &[Resolved<'_>],
    addresses: &[&AddressSpec],
) -> Result<()> {
    use super::network::access::{may_attach, may_mark};
    for r in resolved {
        let f = &r.request.interface;
        let held = addresses
            .iter()
            .find(|a| a.network == r.network.name && held_by(a, owner, &f.name) && is_live(a));
        let access = &r.network.access;
        if held.is_none() {
            may_attach(
                workload,
                &f.name,
                &r.network.name,
                access,
                namespace,
                labels,
            )?;
        }
        if held.is_none_or(|a| a.service_class != f.service_class) {
            may_mark(
                workload,
                &f.name,
                &r.network.name,
                access,
                f.service_class.as_deref(),
            )?;
        }
    }
    Ok(())
}

/// What an interface gets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Its owner's Address again (a restart or a migration): host → this node, deleted
    /// cleared; same IP and MAC.
    Reuse {
        /// The Address.
        name: String,
    },
    /// An unreserved Address of the pool (claimed with its resourceVersion as precondition).
    Claim {
        /// The Address.
        name: String,
    },
    /// A new, already reserved Address (a static IP, or the node's pool is empty): its
    /// creation is the lock on the IP (409: the IP was taken meanwhile, decide again).
    Create {
        /// The IP.
        ip: Ipv4Addr,
        /// The MAC.
        mac: MacAddr,
    },
}

/// Whether Address `a` belongs to `owner`'s interface `iface`. Addresses written before
/// interfaces were recorded count as `eth0`'s.
pub fn held_by(a: &AddressSpec, owner: &str, iface: &str) -> bool {
    a.owner.as_deref() == Some(owner) && a.interface.as_deref().unwrap_or("eth0") == iface
}

fn is_free(a: &AddressSpec) -> bool {
    !a.reserved && !a.deleted && a.owner.is_none()
}

/// Decide the Address for one interface of `owner` on `node`. `addresses` are the Network's
/// Addresses; `skip` the IPs that just lost a race (try others).
pub fn decide(
    pod: &str,
    owner: &str,
    node: &str,
    r: &Resolved<'_>,
    addresses: &[&Address],
    skip: &BTreeSet<Ipv4Addr>,
) -> Result<Step> {
    let net = r.network;
    let iface = r.request.interface.name.as_str();
    let ip_of = |a: &Address| a.spec.ip.parse::<Ipv4Addr>().ok();
    let name_of = |a: &Address| a.metadata.name.clone().unwrap_or_default();
    let requested_mac = r
        .request
        .requested_mac()
        .map_err(|source| Error::Annotation {
            pod: pod.into(),
            source,
        })?;
    if let Some(mac) = requested_mac {
        if let Some(what) = net.reserved_mac(mac) {
            return Err(Error::ReservedMac {
                pod: pod.into(),
                interface: iface.into(),
                mac: mac.to_string(),
                network: net.name.clone(),
                what,
            });
        }
        let text = mac.to_string();
        if let Some(other) = addresses
            .iter()
            .find(|a| a.spec.mac.eq_ignore_ascii_case(&text) && !held_by(&a.spec, owner, iface))
        {
            return Err(Error::Taken {
                pod: pod.into(),
                interface: iface.into(),
                what: format!("MAC {mac}"),
                holder: other.spec.owner.clone().unwrap_or_else(|| name_of(other)),
                network: net.name.clone(),
            });
        }
    }
    // two racing controllers may both have claimed for this interface: every decision takes
    // the lowest IP, so they agree (the sweep hands the others back)
    let mine = addresses
        .iter()
        .filter(|a| held_by(&a.spec, owner, iface))
        .min_by_key(|a| ip_of(a));
    if let Some(static_ip) = r.request.interface.ip {
        if !net.range.allows(static_ip) {
            return Err(Error::StaticIpOutsideSubnet {
                pod: pod.into(),
                interface: iface.into(),
                ip: static_ip,
                network: net.name.clone(),
                subnet: net.subnet().to_string(),
            });
        }
        if let Some(mask) = r.request.interface.mask
            && net.mode == NetworkMode::Underlay
            && roam_contract::annotation::prefix_of_mask(iface, mask).ok()
                != Some(net.subnet().prefix_len())
        {
            return Err(Error::StaticIpOutsideSubnet {
                pod: pod.into(),
                interface: iface.into(),
                ip: static_ip,
                network: net.name.clone(),
                subnet: format!("{} (the mask {mask} does not match)", net.subnet()),
            });
        }
        return match addresses.iter().find(|a| ip_of(a) == Some(static_ip)) {
            Some(a) if held_by(&a.spec, owner, iface) => Ok(Step::Reuse { name: name_of(a) }),
            Some(a) if is_free(&a.spec) && !skip.contains(&static_ip) => {
                Ok(Step::Claim { name: name_of(a) })
            }
            Some(a) => Err(Error::Taken {
                pod: pod.into(),
                interface: iface.into(),
                what: format!("IP {static_ip}"),
                holder: a.spec.owner.clone().unwrap_or_else(|| name_of(a)),
                network: net.name.clone(),
            }),
            None if skip.contains(&static_ip) => Err(Error::Taken {
                pod: pod.into(),
                interface: iface.into(),
                what: format!("IP {static_ip}"),
                holder: "another claim".into(),
                network: net.name.clone(),
            }),
            None => Ok(Step::Create {
                ip: static_ip,
                mac: requested_mac.unwrap_or_else(|| mac_for_ip(static_ip)),
            }),
        };
    }
    if let Some(a) = mine {
        return Ok(Step::Reuse { name: name_of(a) });
    }
    // the lowest free one on this node that did not just lose a race
    if let Some(a) = addresses
        .iter()
        .filter(|a| is_free(&a.spec) && a.spec.host.as_deref() == Some(node))
        .filter(|a| ip_of(a).is_some_and(|ip| !skip.contains(&ip)))
        .min_by_key(|a| ip_of(a))
    {
        return Ok(Step::Claim { name: name_of(a) });
    }
    let used: BTreeSet<Ipv4Addr> = addresses
        .iter()
        .filter_map(|a| ip_of(a))
        .chain(skip.iter().copied())
        .collect();
    match net.range.free(&used, 1).first() {
        Some(&ip) => Ok(Step::Create {
            ip,
            mac: requested_mac.unwrap_or_else(|| mac_for_ip(ip)),
        }),
        None => Err(Error::Exhausted {
            network: net.name.clone(),
            node: node.into(),
        }),
    }
}

/// The spec of a new, unreserved pool Address of `net` on `node`.
pub fn pool_address(net: &NetworkPlan, ip: Ipv4Addr, mac: MacAddr, node: &str) -> AddressSpec {
    AddressSpec {
        network: net.name.clone(),
        ip: ip.to_string(),
        mac: mac.to_string(),
        gateway: None,
        owner: None,
        host: Some(node.into()),
        reserved: false,
        deleted: false,
        deletion_time: None,
        vlan: net.vlan.map(|tag| AddressVlan {
            tag,
            local_subnet: net.subnet().to_string(),
        }),
        interface: None,
        dhcp: false,
        service_class: None,
    }
}

/// `spec` as held by `owner`'s interface on `node`: reserved, host set, deleted cleared,
/// the interface's DHCP choice, service class and requested MAC recorded.
pub fn claimed(spec: &AddressSpec, owner: &str, node: &str, r: &Resolved<'_>) -> AddressSpec {
    let f = &r.request.interface;
    let mut s = spec.clone();
    s.owner = Some(owner.into());
    s.interface = Some(f.name.clone());
    s.host = Some(node.into());
    s.reserved = true;
    s.deleted = false;
    s.deletion_time = None;
    // VMs take their address by DHCP; an underlay interface may ask for it
    s.dhcp = f.dhcp;
    s.service_class = f.service_class.clone();
    if let Ok(Some(mac)) = r.request.requested_mac() {
        s.mac = mac.to_string();
    }
    s
}

/// What a claim [`Step`] writes.
#[derive(Clone, Debug)]
pub enum Write {
    /// Nothing: the owner's Address already says so, and names this pod.
    Nothing,
    /// Replace the Address (resourceVersion precondition) with this one. `moving`: it moves
    /// here from another host, and its OVN port follows the written host only, never a write
    /// that may still lose its race.
    Replace {
        /// The Address to write.
        address: Box<Address>,
        /// It moves from another host.
        moving: bool,
    },
    /// Create this Address (its creation is the lock on the IP).
    Create(Box<Address>),
}

/// What `step` writes for interface `r` of `pod` (owner `owner`) on `node`: the claimed
/// Address, recording the pod ([`POD_ANNOTATION`]). `current`: the Address the step names, as
/// last seen (`None` when it is gone: decide again).
pub fn write_for(
    step: &Step,
    current: Option<&Address>,
    pod: &str,
    owner: &str,
    node: &str,
    r: &Resolved<'_>,
) -> Option<Write> {
    let mut write = match (step, current) {
        (Step::Reuse { .. } | Step::Claim { .. }, Some(cur)) => {
            let reuse = matches!(step, Step::Reuse { .. });
            let spec = claimed(&cur.spec, owner, node, r);
            let recorded = cur
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(POD_ANNOTATION))
                .map(String::as_str)
                == Some(pod);
            if reuse && spec == cur.spec && recorded {
                return Some(Write::Nothing);
            }
            let mut next = cur.clone();
            next.spec = spec;
            Write::Replace {
                address: Box::new(next),
                moving: reuse && cur.spec.host.as_deref().is_some_and(|h| h != node),
            }
        }
        (Step::Create { ip, mac }, _) => {
            let spec = claimed(&pool_address(r.network, *ip, *mac, node), owner, node, r);
            Write::Create(Box::new(new_address(r.network, *ip, spec)))
        }
        _ => return None,
    };
    if let Write::Replace { address: a, .. } | Write::Create(a) = &mut write {
        a.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(POD_ANNOTATION.into(), pod.into());
    }
    Some(write)
}

/// `spec` soft-deleted at `now`: its workload went away; kept for the owner until the grace
/// period ends.
pub fn soft_deleted(
    spec: &AddressSpec,
    now: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
) -> AddressSpec {
    let mut s = spec.clone();
    s.deleted = true;
    s.deletion_time = Some(now);
    s
}

/// Whether `spec` is an address in use that should have an OVN port.
pub fn is_live(spec: &AddressSpec) -> bool {
    spec.reserved && !spec.deleted && spec.host.is_some()
}

/// Deletion time as a `SystemTime`.
pub fn deletion_time(spec: &AddressSpec) -> Option<SystemTime> {
    spec.deletion_time.as_ref().map(|t| SystemTime::from(t.0))
}

/// Whether Address `spec` is held by a VM (its owner is `namespace/name`; a pod's is
/// `namespace:name`, see [`roam_contract::owner`]).
pub fn is_vm_address(spec: &AddressSpec) -> bool {
    spec.owner
        .as_deref()
        .is_some_and(roam_contract::owner::is_vm_owner)
}

/// The OVN logical switch port carrying Address `name` on `node` (the OVS `iface-id`): a
/// VLAN address, and a VM's overlay address (a mobile port), is one multi-chassis port
/// (`<name>`) whatever the node; a pod's overlay address has one per node (`<name>.<node>`).
pub fn ovn_port(spec: &AddressSpec, name: &str, node: &str) -> String {
    if spec.vlan.is_some() {
        vlan_port_name(name)
    } else if is_vm_address(spec) {
        mobile_port_name(name)
    } else {
        overlay_port_name(name, node)
    }
}

/// What to publish on pod `pod` (on `node`) once its interfaces hold `held`: its
/// `roam.dev/addresses` as the CNI reads it, with the addresses it names; `None` when the
/// pod's `annotations` already say so and carry no error (nothing to write).
pub fn publication(
    pod: &str,
    node: &str,
    resolved: &[Resolved<'_>],
    held: &[&Address],
    annotations: &BTreeMap<String, String>,
) -> Result<Option<(String, Vec<PodAddress>)>> {
    let annotation = |source| Error::Annotation {
        pod: pod.into(),
        source,
    };
    let published = pod_addresses(node, resolved, held).map_err(annotation)?;
    let json = roam_contract::annotation::addresses_annotation(&published).map_err(annotation)?;
    let current = annotations.get(ADDRESSES) == Some(&json)
        && !annotations.contains_key(roam_contract::keys::ERROR_ANNOTATION);
    Ok((!current).then_some((json, published)))
}

/// What the pod's `roam.dev/addresses` says: per requested interface, its Address.
pub fn pod_addresses(
    node: &str,
    resolved: &[Resolved<'_>],
    held: &[&Address],
) -> Result<Vec<PodAddress>, roam_contract::annotation::AnnotationError> {
    let mut out = Vec::new();
    for r in resolved {
        let Some(a) = held.iter().find(|a| {
            a.spec.network == r.network.name
                && a.spec.interface.as_deref().unwrap_or("eth0") == r.request.interface.name
        }) else {
            continue;
        };
        let name = a.metadata.name.clone().unwrap_or_default();
        let ip: Ipv4Addr = a.spec.ip.parse().unwrap_or(Ipv4Addr::UNSPECIFIED);
        out.push(PodAddress {
            name: r.request.interface.name.clone(),
            network: r.network.name.clone(),
            mode: r.request.mode,
            address: name.clone(),
            port: ovn_port(&a.spec, &name, node),
            ip,
            prefix_len: r.network.prefix_len(),
            mac: a.spec.mac.clone(),
            gateway: r.network.gateway(),
            metric: r.request.interface.metric,
            mtu: r.network.mtu,
            dhcp: a.spec.dhcp,
            vlan: r.network.vlan,
            service_class: a.spec.service_class.clone(),
        });
    }
    let json = roam_contract::annotation::addresses_annotation(&out)?;
    roam_contract::annotation::parse_addresses(&json)
}

/// The OVN ports a Network should have: one per live Address whose host is a known node.
/// An Address with an unparsable IP, MAC or service class is skipped (it never came from
/// this controller) and reported in the second list.
pub fn desired_ports<'a>(
    addresses: impl IntoIterator<Item = &'a Address>,
    nodes: &BTreeSet<String>,
) -> (Vec<roam_network::topology::PortSpec>, Vec<String>) {
    let mut ports = Vec::new();
    let mut skipped = Vec::new();
    for a in addresses {
        if !is_live(&a.spec) {
            continue;
        }
        let name = a.metadata.name.clone().unwrap_or_default();
        let host = a.spec.host.clone().unwrap_or_default();
        let (Ok(ip), Ok(mac)) = (
            a.spec.ip.parse::<Ipv4Addr>(),
            MacAddr::from_str(&a.spec.mac),
        ) else {
            skipped.push(format!("{name}: unparsable IP or MAC"));
            continue;
        };
        let marking = match a
            .spec
            .service_class
            .as_deref()
            .map(roam_contract::qos::Marking::from_str)
        {
            None => None,
            Some(Ok(m)) => Some(m),
            Some(Err(e)) => {
                skipped.push(format!("{name}: {e}"));
                continue;
            }
        };
        if !nodes.contains(&host) {
            skipped.push(format!("{name}: host {host} is not a node of the network"));
            continue;
        }
        ports.push(roam_network::topology::PortSpec {
            name,
            mac,
            ip,
            also_on: also_on(a)
                .into_iter()
                .filter(|n| nodes.contains(n))
                .collect(),
            node: host,
            dhcp: a.spec.dhcp,
            marking,
            mobile: is_vm_address(&a.spec),
        });
    }
    ports.sort_by(|a, b| a.name.cmp(&b.name));
    (ports, skipped)
}

/// The object name of a new Address for `ip` in `net`.
pub fn new_address_name(net: &NetworkPlan, ip: Ipv4Addr) -> String {
    address_name(&net.name, ip)
}

/// A new Address of `net` for `ip` holding `spec`: its name, and its Network's label (the
/// controllers list a Network's Addresses by it).
pub fn new_address(net: &NetworkPlan, ip: Ipv4Addr, spec: AddressSpec) -> Address {
    let mut a = Address::new(&new_address_name(net, ip), spec);
    a.metadata.labels = Some([(NETWORK_LABEL.to_string(), net.name.clone())].into());
    a
}

#[cfg(test)]
pub(crate) mod tests;
