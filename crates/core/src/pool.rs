//! The address operator's decisions over one Network's Addresses: what to create so every
//! node has its warm pool, what to reclaim after the grace period, which claimed Addresses lost
//! their workload (soft delete), and which are a second claim of one owner's interface
//! (two racing controllers) to hand back.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;
use std::str::FromStr;
use std::time::SystemTime;

use roam_contract::mac_for_ip;
use roam_dhcp_opts::MacAddr;

use super::claim::deletion_time;
use super::network::NetworkPlan;
use roam_api::Address;

mod model;
pub use model::{AddressRange, Choice, PoolAddress, choose, reclaimable, refill};

/// An Address as the pool sees it (`None` when its IP or MAC does not parse).
pub fn pool_view(a: &Address) -> Option<PoolAddress> {
    Some(PoolAddress {
        ip: a.spec.ip.parse().ok()?,
        mac: MacAddr::from_str(&a.spec.mac).ok()?,
        host: a.spec.host.clone(),
        owner: a.spec.owner.clone(),
        reserved: a.spec.reserved,
        deleted: a.spec.deleted,
        deletion_time: deletion_time(&a.spec),
    })
}

/// What the operator does for a Network now.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolActions {
    /// New unreserved Addresses: (node, IP, MAC).
    pub create: Vec<(String, Ipv4Addr, MacAddr)>,
    /// Soft-deleted Addresses whose grace has passed: delete them (IP free again).
    pub reclaim: Vec<String>,
    /// Unreserved Addresses on nodes that no longer exist: delete them.
    pub stray: Vec<String>,
}

/// Top up every node's warm pool to the Network's size (IPs unused anywhere in the network;
/// MACs derived from the IP: stable, locally administered, unique per network — a retried
/// create produces the same object), and reclaim what waited out its grace.
pub fn pool_actions(
    net: &NetworkPlan,
    addresses: &[&Address],
    nodes: &[String],
    now: SystemTime,
) -> PoolActions {
    let views: Vec<(String, PoolAddress)> = addresses
        .iter()
        .filter_map(|a| Some((a.metadata.name.clone()?, pool_view(a)?)))
        .collect();
    let mut plain: Vec<PoolAddress> = views.iter().map(|(_, v)| v.clone()).collect();
    // unparsable addresses still hold their IP
    for a in addresses {
        if let Ok(ip) = a.spec.ip.parse::<Ipv4Addr>()
            && !plain.iter().any(|p| p.ip == ip)
        {
            plain.push(PoolAddress {
                ip,
                mac: mac_for_ip(ip),
                host: None,
                owner: Some("?".into()),
                reserved: true,
                deleted: false,
                deletion_time: None,
            });
        }
    }
    let mut actions = PoolActions::default();
    let mut sorted = nodes.to_vec();
    sorted.sort();
    sorted.dedup();
    for node in &sorted {
        for new in refill(&plain, &net.range, node, net.pool_size, mac_for_ip) {
            actions.create.push((node.clone(), new.ip, new.mac));
            plain.push(new);
        }
    }
    let known: BTreeSet<&str> = sorted.iter().map(String::as_str).collect();
    for (name, v) in &views {
        if reclaimable(v, now, net.grace) {
            actions.reclaim.push(name.clone());
        } else if !v.reserved
            && !v.deleted
            && v.owner.is_none()
            && v.host.as_deref().is_some_and(|h| !known.contains(h))
        {
            actions.stray.push(name.clone());
        }
    }
    actions
}

/// Claimed, not yet deleted Addresses whose owner has no live workload: soft-delete them.
/// `live` is the set of owner keys with a live pod (confirm each against the API server
/// before acting: a cache may not have seen a pod that another controller just served).
pub fn orphans<'a>(addresses: &[&'a Address], live: &BTreeSet<String>) -> Vec<&'a Address> {
    addresses
        .iter()
        .filter(|a| a.spec.reserved && !a.spec.deleted)
        .filter(|a| a.spec.owner.as_ref().is_none_or(|o| !live.contains(o)))
        .copied()
        .collect()
}

/// Second claims of one owner's interface in one Network (two controllers served the same
/// pod at once): all but the lowest IP per (owner, interface) — the one every controller's
/// [`decide`](super::claim::decide) reuses — to hand back to the pool.
pub fn duplicates<'a>(addresses: &[&'a Address]) -> Vec<&'a Address> {
    let mut groups: BTreeMap<(String, String), Vec<&'a Address>> = BTreeMap::new();
    for a in addresses.iter().filter(|a| a.spec.reserved) {
        if let Some(owner) = &a.spec.owner {
            let iface = a.spec.interface.clone().unwrap_or_else(|| "eth0".into());
            groups.entry((owner.clone(), iface)).or_default().push(a);
        }
    }
    let mut out = Vec::new();
    for group in groups.into_values() {
        if group.len() < 2 {
            continue;
        }
        let mut group = group;
        group.sort_by_key(|a| a.spec.ip.parse::<Ipv4Addr>().ok());
        out.extend(group.into_iter().skip(1));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::claim::tests::{addr, net};
    use std::time::Duration;

    #[test]
    fn every_node_gets_its_pool_and_ips_are_never_shared() {
        let n = net();
        let have = [addr("node-a", 10, None), addr("node-b", 11, Some("x-y"))];
        let refs: Vec<&Address> = have.iter().collect();
        let act = pool_actions(
            &n,
            &refs,
            &["node-a".into(), "node-b".into()],
            SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_800_000_000),
        );
        let on = |node: &str| act.create.iter().filter(|c| c.0 == node).count();
        assert_eq!(on("node-a"), n.pool_size - 1);
        assert_eq!(on("node-b"), n.pool_size);
        let ips: BTreeSet<Ipv4Addr> = act.create.iter().map(|c| c.1).collect();
        assert_eq!(ips.len(), act.create.len());
        assert!(!ips.contains(&Ipv4Addr::new(100, 64, 0, 10)));
        assert!(!ips.contains(&Ipv4Addr::new(100, 64, 0, 11)));
        assert!(
            act.create
                .iter()
                .all(|(_, ip, mac)| *mac == mac_for_ip(*ip))
        );
    }

    #[test]
    fn reclaim_waits_for_the_grace_and_strays_go() {
        let n = net();
        let t0 = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_800_000_000);
        let mut gone = addr("node-a", 20, Some("ns-p"));
        gone.spec.deleted = true;
        gone.spec.deletion_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            (t0 - Duration::from_secs(601)).try_into().unwrap(),
        ));
        let mut fresh = gone.clone();
        fresh.metadata.name = Some("fresh".into());
        fresh.spec.ip = "100.64.0.21".into();
        fresh.spec.deletion_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            (t0 - Duration::from_secs(10)).try_into().unwrap(),
        ));
        let stray = addr("node-gone", 22, None);
        let all = [gone.clone(), fresh, stray.clone()];
        let refs: Vec<&Address> = all.iter().collect();
        let act = pool_actions(&n, &refs, &["node-a".into()], t0);
        assert_eq!(act.reclaim, [gone.metadata.name.clone().unwrap()]);
        assert_eq!(act.stray, [stray.metadata.name.clone().unwrap()]);
    }

    #[test]
    fn orphans_and_duplicates() {
        let a = addr("node-a", 30, Some("ns-a"));
        let b = addr("node-a", 31, Some("ns-b"));
        let b2 = addr("node-b", 32, Some("ns-b"));
        let mut del = addr("node-a", 33, Some("ns-c"));
        del.spec.deleted = true;
        let all = [a.clone(), b.clone(), b2.clone(), del];
        let refs: Vec<&Address> = all.iter().collect();
        let live: BTreeSet<String> = ["ns-b".to_string()].into();
        let o: Vec<&str> = orphans(&refs, &live)
            .iter()
            .map(|a| a.spec.ip.as_str())
            .collect();
        assert_eq!(
            o,
            ["100.64.0.30"],
            "deleted ones are not soft-deleted again"
        );
        let d: Vec<&str> = duplicates(&refs)
            .iter()
            .map(|a| a.spec.ip.as_str())
            .collect();
        assert_eq!(d, ["100.64.0.32"], "the lowest IP is kept");
    }
}
