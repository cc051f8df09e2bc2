//! CHECK: compare what the ADD's result promised with what is there now: pure. The
//! adapters read the pod's links, addresses and routes, the host veths and the OVS ports into
//! an [`Observed`]; [`compare`] lists every difference in words.

use std::net::Ipv4Addr;

use crate::result::{CniResult, SCOPE_LINK, parse_cidr};

/// A link as netlink shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObservedLink {
    /// Its name.
    pub name: String,
    /// Its MAC, `aa:bb:..`.
    pub mac: Option<String>,
    /// Its MTU.
    pub mtu: Option<u32>,
    /// Administratively up.
    pub up: bool,
}

/// An IPv4 address on a link.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObservedAddr {
    /// The link's name.
    pub ifname: String,
    /// The address.
    pub ip: Ipv4Addr,
    /// Its prefix length.
    pub prefix_len: u8,
}

/// An IPv4 route of the main table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObservedRoute {
    /// Destination.
    pub dst: Ipv4Addr,
    /// Destination prefix length.
    pub prefix_len: u8,
    /// Next hop.
    pub gw: Option<Ipv4Addr>,
    /// Output link's name.
    pub ifname: Option<String>,
    /// Metric.
    pub metric: u32,
    /// Scope (253 = link).
    pub scope: u8,
}

/// An OVS port of the bridge as the Open_vSwitch database shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObservedPort {
    /// The port's (and interface's) name.
    pub name: String,
    /// Its interface's `external_ids:iface-id`.
    pub iface_id: Option<String>,
    /// Its OpenFlow port number (-1: OVS could not open it).
    pub ofport: Option<i64>,
}

/// The state CHECK compares against the previous result.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Observed {
    /// Links in the pod's namespace.
    pub pod_links: Vec<ObservedLink>,
    /// Addresses in the pod's namespace.
    pub pod_addrs: Vec<ObservedAddr>,
    /// Routes in the pod's namespace.
    pub pod_routes: Vec<ObservedRoute>,
    /// Links in the host's namespace (only those the result names are looked for).
    pub host_links: Vec<ObservedLink>,
    /// The bridge's ports that belong to the attachment.
    pub ports: Vec<ObservedPort>,
}

/// Every difference between `expected` (the ADD's result) and `obs`; empty when none.
/// Routes a later plugin added are not differences (the spec lets chained plugins add).
pub fn compare(expected: &CniResult, obs: &Observed) -> Vec<String> {
    let mut d = Vec::new();
    for i in &expected.interfaces {
        let links = if i.sandbox.is_some() {
            &obs.pod_links
        } else {
            &obs.host_links
        };
        let side = if i.sandbox.is_some() { "pod" } else { "host" };
        let Some(l) = links.iter().find(|l| l.name == i.name) else {
            d.push(format!("{side} interface {} is missing", i.name));
            continue;
        };
        if let (Some(want), Some(have)) = (&i.mac, &l.mac)
            && !want.eq_ignore_ascii_case(have)
        {
            d.push(format!(
                "{side} interface {} has MAC {have}, not {want}",
                i.name
            ));
        }
        if let (Some(want), Some(have)) = (i.mtu, l.mtu)
            && want != have
        {
            d.push(format!(
                "{side} interface {} has MTU {have}, not {want}",
                i.name
            ));
        }
        if !l.up {
            d.push(format!("{side} interface {} is down", i.name));
        }
        if i.sandbox.is_none() {
            match obs.ports.iter().find(|p| p.name == i.name) {
                None => d.push(format!(
                    "host interface {} is not a port of the bridge",
                    i.name
                )),
                Some(p) => {
                    if p.iface_id.as_deref().unwrap_or("").is_empty() {
                        d.push(format!(
                            "OVS interface {} has no external_ids:iface-id",
                            i.name
                        ));
                    }
                    if p.ofport == Some(-1) {
                        d.push(format!(
                            "OVS could not open interface {} (ofport -1)",
                            i.name
                        ));
                    }
                }
            }
        }
    }
    for ip in &expected.ips {
        let Some((addr, plen)) = parse_cidr(&ip.address) else {
            d.push(format!("prevResult address {:?} is not A/P", ip.address));
            continue;
        };
        let ifname = ip
            .interface
            .and_then(|i| expected.interfaces.get(i))
            .map(|i| i.name.clone());
        let found = obs.pod_addrs.iter().any(|a| {
            a.ip == addr && a.prefix_len == plen && ifname.as_ref().is_none_or(|n| *n == a.ifname)
        });
        if !found {
            d.push(format!(
                "address {} is missing{}",
                ip.address,
                ifname.map(|n| format!(" on {n}")).unwrap_or_default()
            ));
        }
    }
    for r in &expected.routes {
        let Some((dst, plen)) = parse_cidr(&r.dst) else {
            d.push(format!("prevResult route {:?} is not D/P", r.dst));
            continue;
        };
        let found = obs.pod_routes.iter().any(|o| {
            o.dst == dst
                && o.prefix_len == plen
                && o.gw == r.gw
                && r.priority.is_none_or(|p| p == o.metric)
                && (r.scope != Some(SCOPE_LINK) || o.scope == SCOPE_LINK)
        });
        if !found {
            let via =
                r.gw.map(|g| format!(" via {g}"))
                    .unwrap_or(" (on-link)".into());
            let metric = r
                .priority
                .map(|m| format!(" metric {m}"))
                .unwrap_or_default();
            d.push(format!("route {}{via}{metric} is missing", r.dst));
        }
    }
    d
}
