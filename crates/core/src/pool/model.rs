//! The address pool's decisions over plain data, no Kubernetes types: the address operator
//! and the pod controller feed it what the API server holds and act on what it answers.
//!
//! - per node and network, a warm pool of unreserved addresses is kept at its target size
//!   ([`refill`]);
//! - a workload that appears takes the address whose owner matches it — the same IP and MAC
//!   again after a migration or restart — or else claims an unreserved one on its node
//!   ([`choose`]);
//! - a workload that goes away leaves its address soft-deleted; it is reclaimed only after the
//!   grace period ([`reclaimable`]), so a workload that reappears elsewhere gets it back.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::time::{Duration, SystemTime};

use roam_dhcp_opts::{Ipv4Net, MacAddr};

/// One address as the pool sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolAddress {
    /// Its IP.
    pub ip: Ipv4Addr,
    /// Its MAC.
    pub mac: MacAddr,
    /// The node it lives on.
    pub host: Option<String>,
    /// Who holds it.
    pub owner: Option<String>,
    /// Claimed.
    pub reserved: bool,
    /// Soft-deleted (its workload went away).
    pub deleted: bool,
    /// When it was soft-deleted.
    pub deletion_time: Option<SystemTime>,
}

/// Where a network's addresses come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AddressRange {
    /// The subnet.
    pub subnet: Ipv4Net,
    /// The gateway (never handed out).
    pub gateway: Ipv4Addr,
    /// Ranges never handed out, as inclusive `(first, last)` pairs.
    pub excluded: Vec<(Ipv4Addr, Ipv4Addr)>,
}

impl AddressRange {
    /// Whether `ip` may be handed out: a host address of the subnet, not the gateway, not
    /// excluded.
    pub fn allows(&self, ip: Ipv4Addr) -> bool {
        self.subnet.contains(&ip)
            && (self.subnet.prefix_len() >= 31
                || (ip != self.subnet.network() && ip != self.subnet.broadcast()))
            && ip != self.gateway
            && !self.excluded.iter().any(|&(a, b)| a <= ip && ip <= b)
    }

    /// Up to `n` addresses that may be handed out and are not in `used`, lowest first.
    pub fn free(&self, used: &BTreeSet<Ipv4Addr>, n: usize) -> Vec<Ipv4Addr> {
        let first = u32::from(self.subnet.network());
        let last = u32::from(self.subnet.broadcast());
        (first..=last)
            .map(Ipv4Addr::from)
            .filter(|ip| self.allows(*ip) && !used.contains(ip))
            .take(n)
            .collect()
    }
}

/// What a workload gets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Choice {
    /// Its own address again (a migration or a restart): update `host`, clear `deleted`.
    Reuse(Ipv4Addr),
    /// A fresh claim of this unreserved address (with the object's resourceVersion as the
    /// precondition; on conflict, choose again).
    Claim(Ipv4Addr),
    /// Nothing is free on the node: the pool is exhausted (report it; the operator refills).
    Exhausted,
}

/// The address for `owner` on `node`: its own if one exists (wherever it lives, deleted or
/// not), else the lowest unreserved, not deleted address on `node`.
pub fn choose(addresses: &[PoolAddress], owner: &str, node: &str) -> Choice {
    if let Some(a) = addresses.iter().find(|a| a.owner.as_deref() == Some(owner)) {
        return Choice::Reuse(a.ip);
    }
    addresses
        .iter()
        .filter(|a| {
            !a.reserved && !a.deleted && a.owner.is_none() && a.host.as_deref() == Some(node)
        })
        .map(|a| a.ip)
        .min()
        .map_or(Choice::Exhausted, Choice::Claim)
}

/// Whether a soft-deleted address may be reclaimed at `now`: its grace period has passed.
/// An address without a deletion time is not reclaimed (it is repaired, not freed).
pub fn reclaimable(a: &PoolAddress, now: SystemTime, grace: Duration) -> bool {
    a.deleted
        && a.deletion_time
            .is_some_and(|t| now.duration_since(t).is_ok_and(|elapsed| elapsed >= grace))
}

/// New addresses to create so that `node` has `target` unreserved ones: free IPs (none used
/// by any address of the network, wherever it lives) and fresh MACs from `mac_for`.
pub fn refill(
    addresses: &[PoolAddress],
    range: &AddressRange,
    node: &str,
    target: usize,
    mut mac_for: impl FnMut(Ipv4Addr) -> MacAddr,
) -> Vec<PoolAddress> {
    let ready = addresses
        .iter()
        .filter(|a| !a.reserved && !a.deleted && a.host.as_deref() == Some(node))
        .count();
    let used: BTreeSet<Ipv4Addr> = addresses.iter().map(|a| a.ip).collect();
    range
        .free(&used, target.saturating_sub(ready))
        .into_iter()
        .map(|ip| PoolAddress {
            ip,
            mac: mac_for(ip),
            host: Some(node.to_string()),
            owner: None,
            reserved: false,
            deleted: false,
            deletion_time: None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use roam_contract::mac_for_ip;

    use super::*;

    fn range() -> AddressRange {
        AddressRange {
            subnet: "100.64.0.0/24".parse().unwrap(),
            gateway: "100.64.0.1".parse().unwrap(),
            excluded: vec![("100.64.0.2".parse().unwrap(), "100.64.0.9".parse().unwrap())],
        }
    }

    fn addr(last: u8, host: &str) -> PoolAddress {
        let ip = Ipv4Addr::new(100, 64, 0, last);
        PoolAddress {
            ip,
            mac: mac_for_ip(ip),
            host: Some(host.into()),
            owner: None,
            reserved: false,
            deleted: false,
            deletion_time: None,
        }
    }

    #[test]
    fn free_skips_network_broadcast_gateway_excluded_and_used() {
        let used: BTreeSet<_> = [Ipv4Addr::new(100, 64, 0, 10)].into();
        let free = range().free(&used, 3);
        assert_eq!(
            free,
            [
                Ipv4Addr::new(100, 64, 0, 11),
                Ipv4Addr::new(100, 64, 0, 12),
                Ipv4Addr::new(100, 64, 0, 13)
            ]
        );
        assert!(!range().allows("100.64.0.255".parse().unwrap()));
        assert!(!range().allows("100.64.0.0".parse().unwrap()));
        assert!(!range().allows("100.64.1.5".parse().unwrap()));
        // a full range yields what is left, not more
        let all: BTreeSet<_> = (0..=255).map(|d| Ipv4Addr::new(100, 64, 0, d)).collect();
        assert!(range().free(&all, 5).is_empty());
    }

    #[test]
    fn refill_tops_up_the_node_to_its_target() {
        let mut have = vec![addr(10, "node-a"), addr(11, "node-b")];
        have.push(PoolAddress {
            reserved: true,
            owner: Some("ns-p".into()),
            ..addr(12, "node-a")
        });
        let new = refill(&have, &range(), "node-a", 4, mac_for_ip);
        assert_eq!(new.len(), 3, "one unreserved on node-a already");
        assert!(
            new.iter()
                .all(|a| a.host.as_deref() == Some("node-a") && !a.reserved)
        );
        let ips: Vec<_> = new.iter().map(|a| a.ip.octets()[3]).collect();
        assert_eq!(
            ips,
            [13, 14, 15],
            "no IP of the network is reused, wherever it lives"
        );
        assert!(refill(&have, &range(), "node-b", 1, mac_for_ip).is_empty());
    }

    #[test]
    fn the_same_owner_gets_the_same_address_back_on_another_node() {
        let mut a = addr(20, "node-a");
        a.owner = Some("default/vm1".into());
        a.reserved = true;
        a.deleted = true;
        a.deletion_time =
            Some(SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_800_000_000));
        let addresses = vec![a, addr(21, "node-b")];
        assert_eq!(
            choose(&addresses, "default/vm1", "node-b"),
            Choice::Reuse(Ipv4Addr::new(100, 64, 0, 20))
        );
    }

    #[test]
    fn a_new_owner_claims_the_lowest_free_address_on_its_node() {
        let mut taken = addr(30, "node-b");
        taken.reserved = true;
        taken.owner = Some("x".into());
        let addresses = vec![
            addr(33, "node-b"),
            taken,
            addr(31, "node-a"),
            addr(32, "node-b"),
        ];
        assert_eq!(
            choose(&addresses, "default-p", "node-b"),
            Choice::Claim(Ipv4Addr::new(100, 64, 0, 32))
        );
        assert_eq!(choose(&addresses, "default-p", "node-c"), Choice::Exhausted);
    }

    #[test]
    fn deleted_addresses_wait_out_their_grace() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let grace = Duration::from_secs(600);
        let mut a = addr(40, "node-a");
        a.deleted = true;
        a.deletion_time = Some(t0);
        assert!(!reclaimable(&a, t0 + Duration::from_secs(599), grace));
        assert!(reclaimable(&a, t0 + Duration::from_secs(600), grace));
        // clock skew: a deletion time in the future is not reclaimable
        assert!(!reclaimable(&a, t0 - Duration::from_secs(5), grace));
        a.deletion_time = None;
        assert!(!reclaimable(&a, t0 + Duration::from_secs(10_000), grace));
        a.deleted = false;
        a.deletion_time = Some(t0);
        assert!(!reclaimable(&a, t0 + Duration::from_secs(10_000), grace));
    }
}
