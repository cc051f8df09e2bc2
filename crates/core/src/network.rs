//! A `Network` spec → a validated [`NetworkPlan`] (defaults filled in, every field checked),
//! overlapping Networks, the nodes' transit addresses, and the OVN planner's input; who may
//! attach to it in [`access`].

pub mod access;
pub mod decide;

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::time::Duration;

use roam_contract::keys::NETWORK_LABEL;
use roam_contract::mac_for_ip;
use roam_dhcp_opts::Ipv4Net;
use roam_dhcp_opts::MacAddr;
use roam_network::topology::{NodeSpec, OverlaySpec, UnderlaySpec};

use super::pool::AddressRange;
use crate::error::{Error, Result};
use roam_api::{NetworkMode, NetworkSpec, TransitAddress};

/// Default warm pool size per node.
pub const DEFAULT_POOL_SIZE: u32 = 10;
/// Default refill period.
pub const DEFAULT_REFILL_SECONDS: u32 = 30;
/// Default reclaim grace.
pub const DEFAULT_GRACE_SECONDS: u32 = 600;
/// The MTU of a data centre's node network, which carries the overlay's geneve tunnels and
/// the VLANs.
pub const UNDERLAY_MTU: u16 = 1500;
/// What geneve costs an overlay packet on the way between nodes, with room to spare: outer
/// IPv4 (20) or IPv6 (40), UDP (8), geneve with OVN's option (16) and the inner Ethernet
/// header (14) — 58 or 78 bytes; 100 as OVN-Kubernetes reserves.
pub const ENCAPSULATION_OVERHEAD: u16 = 100;
/// Default MTU of an overlay Network: what a full-size packet may be so that, encapsulated,
/// it still crosses a 1500-byte underlay (1400). An underlay (VLAN) Network is not
/// encapsulated: [`UNDERLAY_MTU`].
pub const DEFAULT_MTU: u16 = UNDERLAY_MTU - ENCAPSULATION_OVERHEAD;
/// Default physical network of an underlay.
pub const DEFAULT_PHYSNET: &str = "physnet";
/// Default overlay transit network.
pub const DEFAULT_TRANSIT: &str = "169.254.0.0/20";
/// The smallest MTU a Network may set (IPv4's minimum datagram every host must take).
pub const MIN_MTU: u16 = 576;
/// The largest MTU a Network may set (a jumbo frame).
pub const MAX_MTU: u16 = 9000;
/// The longest Network name: it is a label value (at most 63 characters) on its Addresses.
pub const MAX_NAME: usize = 63;

/// A Network, validated, with its defaults filled in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetworkPlan {
    /// The Network's name.
    pub name: String,
    /// Overlay or underlay.
    pub mode: NetworkMode,
    /// The VLAN tag (underlay).
    pub vlan: Option<u16>,
    /// Where addresses come from (subnet, gateway, excluded ranges).
    pub range: AddressRange,
    /// Unreserved addresses kept per node.
    pub pool_size: usize,
    /// Refill period.
    pub refill: Duration,
    /// Reclaim grace.
    pub grace: Duration,
    /// MTU.
    pub mtu: u16,
    /// DNS servers.
    pub dns: Vec<Ipv4Addr>,
    /// Underlay: the physical network.
    pub physnet: String,
    /// Overlay: the transit network.
    pub transit: Ipv4Net,
    /// Which namespaces may attach, and which service classes they may ask for.
    pub access: access::Access,
}

impl NetworkPlan {
    /// The subnet.
    pub fn subnet(&self) -> Ipv4Net {
        self.range.subnet
    }

    /// The gateway.
    pub fn gateway(&self) -> Ipv4Addr {
        self.range.gateway
    }

    /// The prefix length a workload's interface gets: 32 on the overlay, the subnet's on
    /// the underlay.
    pub fn prefix_len(&self) -> u8 {
        match self.mode {
            NetworkMode::Overlay => 32,
            NetworkMode::Underlay => self.range.subnet.prefix_len(),
        }
    }

    /// The fabric router's transit address: the transit network's first host.
    pub fn fabric_ip(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.transit.network()) + 1)
    }

    /// What already answers with `mac` on this Network, if anything: OVN's routers and DHCP
    /// server. A workload given one of these MACs would steal its traffic (the node's
    /// gateway, ARP replies), so a requested MAC equal to one is refused.
    pub fn reserved_mac(&self, mac: MacAddr) -> Option<String> {
        match self.mode {
            NetworkMode::Overlay => {
                if mac == mac_for_ip(self.gateway()) {
                    return Some(format!("the gateway {}'s router port", self.gateway()));
                }
                // the fabric router and every node router take 0a:58 + their transit IP
                let o = mac.octets();
                let ip = Ipv4Addr::new(o[2], o[3], o[4], o[5]);
                (self.transit.contains(&ip) && mac == mac_for_ip(ip))
                    .then(|| format!("a router port on the transit network {}", self.transit))
            }
            NetworkMode::Underlay => self
                .vlan
                .filter(|v| mac == roam_network::topology::dhcp_server_mac(*v))
                .map(|v| format!("OVN's DHCP server on VLAN {v}")),
        }
    }
}

fn invalid(network: &str, field: &'static str, value: impl ToString, problem: &str) -> Error {
    Error::InvalidNetwork {
        network: network.into(),
        field,
        value: value.to_string(),
        problem: problem.into(),
    }
}

fn parse_net(network: &str, field: &'static str, s: &str) -> Result<Ipv4Net> {
    let net: Ipv4Net = s.parse().map_err(|_| {
        invalid(
            network,
            field,
            s,
            "expected an IPv4 network a.b.c.d/len, e.g. 100.64.0.0/16",
        )
    })?;
    if net.network() != net.addr() {
        return Err(invalid(
            network,
            field,
            s,
            &format!("host bits are set; did you mean {}?", net.trunc()),
        ));
    }
    Ok(net)
}

fn parse_excluded(network: &str, s: &str) -> Result<(Ipv4Addr, Ipv4Addr)> {
    let bad = || {
        invalid(
            network,
            "excluded",
            s,
            "expected a.b.c.d/len or a.b.c.d-e.f.g.h (first ≤ last)",
        )
    };
    if let Some((a, b)) = s.split_once('-') {
        let a: Ipv4Addr = a.trim().parse().map_err(|_| bad())?;
        let b: Ipv4Addr = b.trim().parse().map_err(|_| bad())?;
        if a > b {
            return Err(bad());
        }
        Ok((a, b))
    } else if s.contains('/') {
        let n: Ipv4Net = s.trim().parse().map_err(|_| bad())?;
        Ok((n.network(), n.broadcast()))
    } else {
        let a: Ipv4Addr = s.trim().parse().map_err(|_| bad())?;
        Ok((a, a))
    }
}

/// Validate `spec` and fill in its defaults. Nothing is created for a Network that fails.
pub fn validate_network(name: &str, spec: &NetworkSpec) -> Result<NetworkPlan> {
    if name.len() > MAX_NAME {
        return Err(invalid(
            name,
            "metadata.name",
            name,
            &format!(
                "at most {MAX_NAME} characters: it is the value of every Address's {NETWORK_LABEL} label"
            ),
        ));
    }
    let subnet = parse_net(name, "subnet", &spec.subnet)?;
    if subnet.prefix_len() > 30 {
        return Err(invalid(
            name,
            "subnet",
            &spec.subnet,
            "too small: a Network needs at least a /30",
        ));
    }
    let vlan = match (spec.mode, spec.vlan) {
        (_, Some(tag)) if !(1..=4094).contains(&tag) => {
            return Err(invalid(
                name,
                "vlan",
                tag,
                "a VLAN tag is 1–4094 (0 and 4095 are reserved by 802.1Q)",
            ));
        }
        (NetworkMode::Underlay, None) => {
            return Err(invalid(
                name,
                "vlan",
                "none",
                "an underlay Network needs its VLAN tag",
            ));
        }
        (NetworkMode::Overlay, Some(tag)) => {
            return Err(invalid(
                name,
                "vlan",
                tag,
                "an overlay Network has no VLAN tag; use mode: underlay for a VLAN",
            ));
        }
        (_, v) => v,
    };
    let host =
        |ip: Ipv4Addr| subnet.contains(&ip) && ip != subnet.network() && ip != subnet.broadcast();
    let gateway = match &spec.gateway {
        Some(g) => {
            let ip: Ipv4Addr = g
                .parse()
                .map_err(|_| invalid(name, "gateway", g, "expected an IPv4 address"))?;
            if !host(ip) {
                return Err(invalid(
                    name,
                    "gateway",
                    g,
                    &format!("must be a host address of the subnet {subnet}"),
                ));
            }
            ip
        }
        None => Ipv4Addr::from(u32::from(subnet.network()) + 1),
    };
    let excluded = spec
        .excluded
        .iter()
        .map(|e| parse_excluded(name, e))
        .collect::<Result<Vec<_>>>()?;
    if let Some((e, _)) = spec
        .excluded
        .iter()
        .zip(&excluded)
        .find(|(_, (a, b))| !subnet.contains(a) || !subnet.contains(b))
    {
        return Err(invalid(
            name,
            "excluded",
            e,
            &format!("not inside the subnet {subnet}: exclude only addresses of the subnet"),
        ));
    }
    let dns = spec
        .dns
        .iter()
        .map(|d| {
            d.parse()
                .map_err(|_| invalid(name, "dns", d, "expected an IPv4 address"))
        })
        .collect::<Result<Vec<Ipv4Addr>>>()?;
    let mtu = spec.mtu.unwrap_or(match spec.mode {
        NetworkMode::Overlay => DEFAULT_MTU,
        NetworkMode::Underlay => UNDERLAY_MTU,
    });
    if !(MIN_MTU..=MAX_MTU).contains(&mtu) {
        return Err(invalid(
            name,
            "mtu",
            mtu,
            &format!(
                "{MIN_MTU}–{MAX_MTU} (the IPv4 minimum to a jumbo frame); an overlay's also leaves \
                 {ENCAPSULATION_OVERHEAD} bytes of the node network's MTU for geneve"
            ),
        ));
    }
    let physnet = spec
        .physnet
        .clone()
        .unwrap_or_else(|| DEFAULT_PHYSNET.into());
    if physnet.is_empty()
        || physnet
            .chars()
            .any(|c| c == ',' || c == ':' || c.is_whitespace())
    {
        return Err(invalid(
            name,
            "physnet",
            &physnet,
            "non-empty, without ',' ':' or whitespace (ovn-bridge-mappings syntax)",
        ));
    }
    let transit = parse_net(
        name,
        "transitSubnet",
        spec.transit_subnet.as_deref().unwrap_or(DEFAULT_TRANSIT),
    )?;
    if spec.mode == NetworkMode::Overlay {
        if transit.prefix_len() > 29 {
            return Err(invalid(
                name,
                "transitSubnet",
                transit,
                "too small: use a /29 or larger",
            ));
        }
        if transit.contains(&subnet.network()) || subnet.contains(&transit.network()) {
            return Err(invalid(
                name,
                "transitSubnet",
                transit,
                &format!("overlaps the subnet {subnet}"),
            ));
        }
    }
    let pool_size = spec.pool_size_per_node.unwrap_or(DEFAULT_POOL_SIZE);
    if pool_size > 1000 {
        return Err(invalid(name, "poolSizePerNode", pool_size, "at most 1000"));
    }
    let refill = spec.refill_period_seconds.unwrap_or(DEFAULT_REFILL_SECONDS);
    if refill == 0 {
        return Err(invalid(name, "refillPeriodSeconds", 0, "at least 1"));
    }
    let grace = spec.reclaim_grace_seconds.unwrap_or(DEFAULT_GRACE_SECONDS);
    if grace == 0 {
        return Err(invalid(
            name,
            "reclaimGraceSeconds",
            0,
            "at least 1: with no grace a restarting or migrating workload's address goes to \
             the next claimant at once",
        ));
    }
    let access = access::validate_access(name, spec)?;
    let range = AddressRange {
        subnet,
        gateway,
        excluded,
    };
    Ok(NetworkPlan {
        name: name.into(),
        mode: spec.mode,
        vlan,
        range,
        pool_size: pool_size as usize,
        refill: Duration::from_secs(refill.into()),
        grace: Duration::from_secs(grace.into()),
        mtu,
        dns,
        physnet,
        transit,
        access,
    })
}

/// The fields the Network's held Addresses depend on that differ between the plan being
/// served and the edited one (empty: the edit may apply while Addresses are held). A held
/// Address keeps its IP, MAC and VLAN: a new subnet, gateway, mode, VLAN, physnet or
/// transit network would leave it outside what OVN is then told.
pub fn in_use_changes(served: &NetworkPlan, next: &NetworkPlan) -> Vec<&'static str> {
    [
        ("subnet", served.subnet() != next.subnet()),
        ("gateway", served.gateway() != next.gateway()),
        ("mode", served.mode != next.mode),
        ("vlan", served.vlan != next.vlan),
        ("physnet", served.physnet != next.physnet),
        ("transitSubnet", served.transit != next.transit),
    ]
    .into_iter()
    .filter_map(|(f, changed)| changed.then_some(f))
    .collect()
}

/// A Network as the overlap check sees it: name, creation order key, subnet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetworkRange {
    /// The Network.
    pub name: String,
    /// Orders Networks oldest first (e.g. the creation timestamp as RFC 3339 text); ties
    /// are broken by name.
    pub created: String,
    /// Its subnet.
    pub subnet: Ipv4Net,
}

impl NetworkRange {
    /// Network `n`'s range (`None`: no name, or a subnet that does not parse, which its
    /// validation refuses).
    pub fn of(n: &roam_api::Network) -> Option<NetworkRange> {
        Some(NetworkRange {
            name: n.metadata.name.clone()?,
            created: n
                .metadata
                .creation_timestamp
                .as_ref()
                .map(|t| t.0.to_string())
                .unwrap_or_default(),
            subnet: n.spec.subnet.parse::<Ipv4Net>().ok()?.trunc(),
        })
    }
}

fn overlaps(a: &Ipv4Net, b: &Ipv4Net) -> bool {
    a.contains(&b.network()) || b.contains(&a.network())
}

/// The Networks refused for overlapping an older one, each with the error to report. The
/// oldest of a group of overlapping Networks keeps working; a refused Network does not make
/// others refused. Run it on a direct LIST from the API server, not on a cache: a cache may
/// not hold a Network just created, and both would be accepted.
pub fn overlapping(networks: &[NetworkRange]) -> Vec<(String, Error)> {
    let mut sorted: Vec<&NetworkRange> = networks.iter().collect();
    sorted.sort_by(|a, b| (&a.created, &a.name).cmp(&(&b.created, &b.name)));
    let mut accepted: Vec<&NetworkRange> = Vec::new();
    let mut refused = Vec::new();
    for n in sorted {
        if let Some(old) = accepted.iter().find(|o| overlaps(&o.subnet, &n.subnet)) {
            refused.push((
                n.name.clone(),
                Error::OverlappingNetworks {
                    network: n.name.clone(),
                    subnet: n.subnet.to_string(),
                    other: old.name.clone(),
                    other_subnet: old.subnet.to_string(),
                },
            ));
        } else {
            accepted.push(n);
        }
    }
    refused
}

/// Transit addresses for `nodes`: every node already in `existing` keeps its address (also
/// nodes that are gone: a node that comes back gets its address again), and each new node gets
/// the lowest free host address after the fabric router's. Returns `None` when nothing
/// changes (no write needed).
pub fn assign_transit(
    plan: &NetworkPlan,
    existing: &[TransitAddress],
    nodes: &[String],
) -> Result<Option<Vec<TransitAddress>>> {
    let mut out: Vec<TransitAddress> = existing.to_vec();
    let mut used: BTreeSet<Ipv4Addr> = existing.iter().filter_map(|t| t.ip.parse().ok()).collect();
    used.insert(plan.fabric_ip());
    let known: BTreeSet<&str> = existing.iter().map(|t| t.node.as_str()).collect();
    let mut changed = false;
    let first = u32::from(plan.transit.network()) + 1;
    let last = u32::from(plan.transit.broadcast()) - 1;
    let mut next = first;
    let mut sorted: Vec<&String> = nodes
        .iter()
        .filter(|n| !known.contains(n.as_str()))
        .collect();
    sorted.sort();
    sorted.dedup();
    for node in sorted {
        while next <= last && used.contains(&Ipv4Addr::from(next)) {
            next += 1;
        }
        if next > last {
            return Err(Error::TransitExhausted {
                network: plan.name.clone(),
                subnet: plan.transit.to_string(),
                node: node.clone(),
            });
        }
        let ip = Ipv4Addr::from(next);
        used.insert(ip);
        out.push(TransitAddress {
            node: node.clone(),
            ip: ip.to_string(),
        });
        changed = true;
    }
    Ok(changed.then_some(out))
}

/// The overlay planner's input: the network and those of `nodes` that have a transit
/// address (MACs derived from the IPs: stable, locally administered, unique per network).
pub fn overlay_input(
    plan: &NetworkPlan,
    transit: &[TransitAddress],
    nodes: &[String],
) -> (OverlaySpec, Vec<NodeSpec>) {
    let spec = OverlaySpec {
        name: plan.name.clone(),
        subnet: plan.subnet(),
        gateway: plan.gateway(),
        gateway_mac: mac_for_ip(plan.gateway()),
        join_subnet: plan.transit,
        fabric_ip: plan.fabric_ip(),
        fabric_mac: mac_for_ip(plan.fabric_ip()),
        mtu: plan.mtu,
        dns: plan.dns.clone(),
    };
    let wanted: BTreeSet<&str> = nodes.iter().map(String::as_str).collect();
    let mut specs: Vec<NodeSpec> = transit
        .iter()
        .filter(|t| wanted.contains(t.node.as_str()))
        .filter_map(|t| {
            let ip: Ipv4Addr = t.ip.parse().ok()?;
            Some(NodeSpec {
                name: t.node.clone(),
                join_ip: ip,
                join_mac: mac_for_ip(ip),
            })
        })
        .collect();
    specs.sort_by(|a, b| a.name.cmp(&b.name));
    (spec, specs)
}

/// The underlay planner's input.
pub fn underlay_input(plan: &NetworkPlan) -> Option<UnderlaySpec> {
    Some(UnderlaySpec {
        name: plan.name.clone(),
        vlan: plan.vlan?,
        subnet: plan.subnet(),
        gateway: plan.gateway(),
        physnet: plan.physnet.clone(),
        mtu: plan.mtu,
        dns: plan.dns.clone(),
    })
}

/// The label selector for the Addresses of the managed Networks `names` (`label` is the
/// Address label naming its Network); `None` when no Network is managed (watch nothing).
pub fn address_selector<'a>(
    label: &str,
    names: impl IntoIterator<Item = &'a String>,
) -> Option<String> {
    let names: Vec<&str> = names.into_iter().map(String::as_str).collect();
    (!names.is_empty()).then(|| format!("{label} in ({})", names.join(",")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    pub(crate) fn spec(subnet: &str) -> NetworkSpec {
        NetworkSpec {
            subnet: subnet.into(),
            ..Default::default()
        }
    }

    fn field(e: Error) -> &'static str {
        match e {
            Error::InvalidNetwork { field, .. } => field,
            other => panic!("expected InvalidNetwork, got {other}"),
        }
    }

    #[test]
    fn defaults_are_filled_in() {
        let p = validate_network("ovl", &spec("100.64.0.0/16")).unwrap();
        assert_eq!(p.gateway(), Ipv4Addr::new(100, 64, 0, 1));
        assert_eq!(p.pool_size, 10);
        assert_eq!(p.refill, Duration::from_secs(30));
        assert_eq!(p.grace, Duration::from_secs(600));
        assert_eq!(
            p.mtu, 1400,
            "full-size packets cross a 1500 underlay after geneve"
        );
        assert_eq!(p.prefix_len(), 32);
        assert_eq!(p.fabric_ip(), Ipv4Addr::new(169, 254, 0, 1));
        assert!(!p.range.allows(p.gateway()));
    }

    #[test]
    fn bad_specs_name_their_field() {
        let mut s = spec("100.64.0.0/16");
        s.mode = NetworkMode::Underlay;
        for tag in [0, 4095] {
            s.vlan = Some(tag);
            assert_eq!(field(validate_network("v", &s).unwrap_err()), "vlan");
        }
        s.vlan = None;
        assert_eq!(field(validate_network("v", &s).unwrap_err()), "vlan");
        s.vlan = Some(116);
        let p = validate_network("v", &s).unwrap();
        assert_eq!(p.prefix_len(), 16);
        assert_eq!(underlay_input(&p).unwrap().vlan, 116);
        assert_eq!(p.mtu, 1500, "a VLAN is not encapsulated");

        assert_eq!(
            field(validate_network("o", &spec("100.64.0.1/16")).unwrap_err()),
            "subnet"
        );
        assert_eq!(
            field(validate_network("o", &spec("nonsense")).unwrap_err()),
            "subnet"
        );
        let mut s = spec("100.64.0.0/16");
        s.gateway = Some("100.65.0.1".into());
        assert_eq!(field(validate_network("o", &s).unwrap_err()), "gateway");
        let mut s = spec("100.64.0.0/16");
        s.excluded = vec!["100.64.0.9-100.64.0.2".into()];
        assert_eq!(field(validate_network("o", &s).unwrap_err()), "excluded");
        let mut s = spec("169.254.0.0/16");
        s.transit_subnet = None;
        assert_eq!(
            field(validate_network("o", &s).unwrap_err()),
            "transitSubnet"
        );
        let mut s = spec("100.64.0.0/16");
        s.vlan = Some(5);
        assert_eq!(field(validate_network("o", &s).unwrap_err()), "vlan");
    }

    #[test]
    fn an_excluded_range_outside_the_subnet_is_refused() {
        for e in ["10.0.0.0/24", "100.64.0.250-100.64.1.3", "100.65.0.1"] {
            let mut s = spec("100.64.0.0/24");
            s.excluded = vec!["100.64.0.2-100.64.0.9".into(), e.into()];
            let err = validate_network("o", &s).unwrap_err();
            let msg = err.to_string();
            assert_eq!(field(err), "excluded", "{e}");
            assert!(msg.contains(e), "names the bad one: {msg}");
        }
    }

    #[test]
    fn an_mtu_outside_576_to_9000_is_refused() {
        for (mtu, ok) in [
            (575, false),
            (576, true),
            (9000, true),
            (9001, false),
            (0, false),
        ] {
            let mut s = spec("100.64.0.0/24");
            s.mtu = Some(mtu);
            match validate_network("o", &s) {
                Ok(p) => assert!(ok && p.mtu == mtu, "{mtu}"),
                Err(e) => assert!(!ok && field(e) == "mtu", "{mtu}"),
            }
        }
    }

    #[test]
    fn a_zero_reclaim_grace_is_refused() {
        let mut s = spec("100.64.0.0/24");
        s.reclaim_grace_seconds = Some(0);
        assert_eq!(
            field(validate_network("o", &s).unwrap_err()),
            "reclaimGraceSeconds"
        );
        s.reclaim_grace_seconds = Some(1);
        assert_eq!(
            validate_network("o", &s).unwrap().grace,
            Duration::from_secs(1)
        );
    }

    #[test]
    fn a_network_name_longer_than_a_label_value_is_refused() {
        let s = spec("100.64.0.0/24");
        assert!(validate_network(&"n".repeat(MAX_NAME), &s).is_ok());
        let e = validate_network(&"n".repeat(MAX_NAME + 1), &s).unwrap_err();
        assert_eq!(field(e), "metadata.name");
    }

    #[test]
    fn reserved_macs_are_the_routers_and_the_dhcp_servers() {
        let p = validate_network("o", &spec("100.64.0.0/24")).unwrap();
        assert!(p.reserved_mac(mac_for_ip(p.gateway())).is_some());
        assert!(p.reserved_mac(mac_for_ip(p.fabric_ip())).is_some());
        assert!(
            p.reserved_mac(mac_for_ip("169.254.15.254".parse().unwrap()))
                .is_some()
        );
        assert!(
            p.reserved_mac(mac_for_ip("169.254.16.1".parse().unwrap()))
                .is_none()
        );
        assert!(
            p.reserved_mac(mac_for_ip("100.64.0.20".parse().unwrap()))
                .is_none()
        );
        let mut s = spec("10.1.0.0/24");
        s.mode = NetworkMode::Underlay;
        s.vlan = Some(300);
        let v = validate_network("v", &s).unwrap();
        assert!(
            v.reserved_mac(roam_network::topology::dhcp_server_mac(300))
                .is_some()
        );
        assert!(
            v.reserved_mac(roam_network::topology::dhcp_server_mac(301))
                .is_none()
        );
        assert!(
            v.reserved_mac(mac_for_ip(v.gateway())).is_none(),
            "the VLAN's router is not OVN's"
        );
    }

    #[test]
    fn an_edit_of_what_held_addresses_depend_on_is_named() {
        let served = validate_network("o", &spec("100.64.0.0/24")).unwrap();
        let mut s = spec("100.64.0.0/24");
        s.pool_size_per_node = Some(20);
        s.mtu = Some(1300);
        s.excluded = vec!["100.64.0.200-100.64.0.210".into()];
        s.dns = vec!["10.0.0.53".into()];
        let next = validate_network("o", &s).unwrap();
        assert!(
            in_use_changes(&served, &next).is_empty(),
            "pool, MTU, DNS, excluded may change"
        );
        let mut s = spec("100.64.0.0/23");
        s.gateway = Some("100.64.0.254".into());
        s.transit_subnet = Some("169.254.16.0/20".into());
        let next = validate_network("o", &s).unwrap();
        assert_eq!(
            in_use_changes(&served, &next),
            ["subnet", "gateway", "transitSubnet"]
        );
        let mut s = spec("100.64.0.0/24");
        s.mode = NetworkMode::Underlay;
        s.vlan = Some(10);
        s.physnet = Some("dc".into());
        let next = validate_network("o", &s).unwrap();
        assert_eq!(in_use_changes(&served, &next), ["mode", "vlan", "physnet"]);
    }

    #[test]
    fn excluded_ranges_are_never_handed_out() {
        let mut s = spec("100.64.0.0/24");
        s.excluded = vec![
            "100.64.0.2-100.64.0.9".into(),
            "100.64.0.128/25".into(),
            "100.64.0.20".into(),
        ];
        let p = validate_network("o", &s).unwrap();
        for d in [2, 9, 20, 128, 200, 255] {
            assert!(!p.range.allows(Ipv4Addr::new(100, 64, 0, d)), "{d}");
        }
        assert!(p.range.allows(Ipv4Addr::new(100, 64, 0, 10)));
    }

    fn range(name: &str, created: &str, subnet: &str) -> NetworkRange {
        NetworkRange {
            name: name.into(),
            created: created.into(),
            subnet: subnet.parse().unwrap(),
        }
    }

    #[test]
    fn the_younger_of_two_overlapping_networks_is_refused() {
        let refused = overlapping(&[
            range("b", "2026-01-02T00:00:00Z", "100.64.1.0/24"),
            range("a", "2026-01-01T00:00:00Z", "100.64.0.0/16"),
            range("c", "2026-01-03T00:00:00Z", "100.65.0.0/16"),
            range("d", "2026-01-04T00:00:00Z", "100.64.1.128/25"),
        ]);
        let names: Vec<&str> = refused.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["b", "d"]);
        assert!(matches!(&refused[0].1, Error::OverlappingNetworks { other, .. } if other == "a"));
    }

    #[test]
    fn transit_addresses_are_kept_and_new_nodes_get_the_lowest_free() {
        let p = validate_network("o", &spec("100.64.0.0/16")).unwrap();
        let t = |n: &str, ip: &str| TransitAddress {
            node: n.into(),
            ip: ip.into(),
        };
        let nodes = vec!["node-b".to_string(), "node-a".to_string()];
        let first = assign_transit(&p, &[], &nodes).unwrap().unwrap();
        assert_eq!(
            first,
            [t("node-a", "169.254.0.2"), t("node-b", "169.254.0.3")]
        );
        assert_eq!(
            assign_transit(&p, &first, &nodes).unwrap(),
            None,
            "stable: nothing to write"
        );
        // node-a leaves, node-c arrives: node-a's address is kept for it, node-c gets a new one
        let next = assign_transit(&p, &first, &["node-b".into(), "node-c".into()])
            .unwrap()
            .unwrap();
        assert_eq!(next[..2], first[..]);
        assert_eq!(next[2], t("node-c", "169.254.0.4"));
        let (o, n) = overlay_input(&p, &next, &["node-c".into(), "node-b".into()]);
        assert_eq!(o.fabric_ip, Ipv4Addr::new(169, 254, 0, 1));
        assert_eq!(
            n.iter().map(|n| n.name.as_str()).collect::<Vec<_>>(),
            ["node-b", "node-c"]
        );
    }

    #[test]
    fn a_full_transit_network_is_an_error() {
        let mut s = spec("100.64.0.0/16");
        s.transit_subnet = Some("169.254.0.0/29".into());
        let p = validate_network("o", &s).unwrap();
        let nodes: Vec<String> = (0..6).map(|i| format!("n{i}")).collect();
        assert!(assign_transit(&p, &[], &nodes[..5]).is_ok());
        assert!(matches!(
            assign_transit(&p, &[], &nodes).unwrap_err(),
            Error::TransitExhausted { .. }
        ));
    }

    proptest! {
        #[test]
        fn transit_assignment_is_unique_and_stable(
            rounds in proptest::collection::vec(proptest::collection::btree_set(0u8..40, 0..12), 1..6)
        ) {
            let p = validate_network("o", &spec("100.64.0.0/16")).unwrap();
            let mut have: Vec<TransitAddress> = vec![];
            for round in rounds {
                let nodes: Vec<String> = round.iter().map(|i| format!("n{i}")).collect();
                let before = have.clone();
                if let Some(next) = assign_transit(&p, &have, &nodes).unwrap() {
                    have = next;
                }
                // nobody loses or changes an address
                prop_assert_eq!(&have[..before.len()], &before[..]);
                // every current node has one; all distinct; none is the fabric's
                let ips: BTreeSet<&str> = have.iter().map(|t| t.ip.as_str()).collect();
                prop_assert_eq!(ips.len(), have.len());
                prop_assert!(!ips.contains("169.254.0.1"));
                for n in &nodes {
                    prop_assert!(have.iter().any(|t| &t.node == n));
                }
            }
        }

        #[test]
        fn overlap_check_leaves_an_overlap_free_set(
            nets in proptest::collection::vec((0u8..8, 20u8..28), 1..10)
        ) {
            let ranges: Vec<NetworkRange> = nets
                .iter()
                .enumerate()
                .map(|(i, (third, plen))| {
                    let n: Ipv4Net = format!("100.64.{third}.0/{plen}").parse().unwrap();
                    NetworkRange { name: format!("n{i}"), created: format!("{i:03}"), subnet: n.trunc() }
                })
                .collect();
            let refused: BTreeSet<String> = overlapping(&ranges).into_iter().map(|(n, _)| n).collect();
            let kept: Vec<&NetworkRange> = ranges.iter().filter(|r| !refused.contains(&r.name)).collect();
            for (i, a) in kept.iter().enumerate() {
                for b in &kept[i + 1..] {
                    prop_assert!(!overlaps(&a.subnet, &b.subnet));
                }
            }
            // the oldest is always kept
            prop_assert!(!refused.contains("n0"));
        }
    }

    #[test]
    fn address_selector_names_every_managed_network() {
        let names: std::collections::BTreeSet<String> = ["b".into(), "a".into()].into();
        assert_eq!(
            address_selector("roam.dev/network", &names).as_deref(),
            Some("roam.dev/network in (a,b)")
        );
        assert_eq!(address_selector("roam.dev/network", &[]), None);
    }
}
