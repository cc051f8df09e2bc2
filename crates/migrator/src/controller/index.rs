//! The controller's in-memory view of the Addresses, Networks and Nodes: fed by watches and
//! by the controller's own writes (the object the API server returned), newest
//! resourceVersion wins. Decisions read it; correctness never depends on it being current —
//! every write carries a precondition (resourceVersion, or the name lock on an IP) and a
//! lost race is decided again on fresh data.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use roam_api::{Address, Network, TransitAddress};
use roam_core::network::NetworkPlan;

/// A routed Address (a pod's overlay /32) whose host moved while it stayed live: its /32
/// must follow (route flip).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Moved {
    /// The Network.
    pub network: String,
    /// The Address.
    pub address: String,
    /// The IP.
    pub ip: String,
    /// Old host.
    pub from: String,
    /// New host.
    pub to: String,
}

/// What the controller knows.
#[derive(Debug, Default)]
pub struct Index {
    addresses: HashMap<String, Arc<Address>>,
    by_network: HashMap<String, BTreeSet<String>>,
    /// The valid Networks' plans, by name.
    pub networks: BTreeMap<String, NetworkPlan>,
    /// Every watched Network object (valid or not), by name.
    pub network_objects: BTreeMap<String, Arc<Network>>,
    /// Kubernetes Nodes.
    pub nodes: BTreeSet<String>,
    /// Initial lists done: addresses, networks (validated), nodes.
    pub synced: [bool; 3],
    /// The Network watch has listed.
    pub networks_listed: bool,
    /// Whose Addresses the Address watch has listed: `None` before its first list,
    /// `Some(None)` every Network's (no Network selector), `Some(Some(set))` those Networks'.
    /// A Network outside it is not reconciled in OVN: its plan without its Addresses would
    /// remove its workloads' ports and routes.
    pub addresses_listed: Option<Option<BTreeSet<String>>>,
    changed: HashMap<String, std::time::Instant>,
}

fn rv(a: &Address) -> Option<u64> {
    a.metadata.resource_version.as_deref()?.parse().ok()
}

fn moved(old: &Address, new: &Address) -> Option<Moved> {
    let live = |a: &Address| roam_core::claim::is_live(&a.spec);
    // only a per-node port's /32 follows its host; a VLAN port and a VM's mobile port keep
    // their routes wherever they are bound
    let routed = new.spec.vlan.is_none() && !roam_core::claim::is_vm_address(&new.spec);
    if routed && live(old) && live(new) && old.spec.host != new.spec.host {
        Some(Moved {
            network: new.spec.network.clone(),
            address: new.metadata.name.clone()?,
            ip: new.spec.ip.clone(),
            from: old.spec.host.clone()?,
            to: new.spec.host.clone()?,
        })
    } else {
        None
    }
}

impl Index {
    /// Whether every initial list is in.
    pub fn is_synced(&self) -> bool {
        self.synced.iter().all(|s| *s)
    }

    /// Take `a` unless a newer version is known. Returns whether it changed the index, and a
    /// move of a live address to another host (the route controller's trigger).
    pub fn upsert(&mut self, a: Address) -> (bool, Option<Moved>) {
        let Some(name) = a.metadata.name.clone() else {
            return (false, None);
        };
        let mut mv = None;
        if let Some(old) = self.addresses.get(&name) {
            if let (Some(o), Some(n)) = (rv(old), rv(&a))
                && o >= n
            {
                return (false, None);
            }
            mv = moved(old, &a);
            if old.spec.network != a.spec.network
                && let Some(set) = self.by_network.get_mut(&old.spec.network)
            {
                set.remove(&name);
            }
        }
        self.by_network
            .entry(a.spec.network.clone())
            .or_default()
            .insert(name.clone());
        self.changed.insert(name.clone(), std::time::Instant::now());
        self.addresses.insert(name, Arc::new(a));
        (true, mv)
    }

    /// Forget `name` (deleted), unless a newer version than `rv_deleted` is known.
    pub fn remove(&mut self, name: &str, rv_deleted: Option<u64>) -> bool {
        if let (Some(old), Some(d)) = (self.addresses.get(name), rv_deleted)
            && rv(old).is_some_and(|o| o > d)
        {
            return false;
        }
        self.changed.remove(name);
        if let Some(old) = self.addresses.remove(name) {
            if let Some(set) = self.by_network.get_mut(&old.spec.network) {
                set.remove(name);
            }
            true
        } else {
            false
        }
    }

    /// Replace everything with a fresh list, keeping what is newer than the list (our own
    /// writes that raced it).
    pub fn relist(&mut self, list: Vec<Address>) {
        let newest = list.iter().filter_map(rv).max().unwrap_or(0);
        let listed: BTreeSet<String> = list
            .iter()
            .filter_map(|a| a.metadata.name.clone())
            .collect();
        let keep: Vec<Address> = self
            .addresses
            .values()
            .filter(|a| {
                !listed.contains(a.metadata.name.as_deref().unwrap_or_default())
                    && rv(a).is_some_and(|r| r > newest)
            })
            .map(|a| (**a).clone())
            .collect();
        self.addresses.clear();
        self.by_network.clear();
        for a in list.into_iter().chain(keep) {
            self.upsert(a);
        }
    }

    /// Whether `network`'s Addresses are listed (see [`Index::addresses_listed`]).
    pub fn addresses_listed_for(&self, network: &str) -> bool {
        match &self.addresses_listed {
            None => false,
            Some(None) => true,
            Some(Some(set)) => set.contains(network),
        }
    }

    /// Forget the Addresses of every Network not in `networks` (no longer managed).
    pub fn retain_networks(&mut self, networks: &BTreeSet<String>) {
        let gone: Vec<String> = self
            .by_network
            .iter()
            .filter(|(n, _)| !networks.contains(*n))
            .flat_map(|(_, names)| names.iter().cloned())
            .collect();
        for name in gone {
            self.remove(&name, None);
        }
    }

    /// How long, at `now`, since this controller last saw `name` change.
    pub fn still_for(&self, name: &str, now: std::time::Instant) -> std::time::Duration {
        self.changed
            .get(name)
            .map(|t| now.saturating_duration_since(*t))
            .unwrap_or(std::time::Duration::MAX)
    }

    /// One Address.
    pub fn address(&self, name: &str) -> Option<Arc<Address>> {
        self.addresses.get(name).cloned()
    }

    /// A Network's Addresses.
    pub fn of_network(&self, network: &str) -> Vec<Arc<Address>> {
        self.by_network
            .get(network)
            .map(|names| {
                names
                    .iter()
                    .filter_map(|n| self.addresses.get(n).cloned())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Every Address.
    pub fn all(&self) -> impl Iterator<Item = &Arc<Address>> {
        self.addresses.values()
    }

    /// The transit addresses recorded in a Network's status.
    pub fn transit(&self, network: &str) -> Vec<TransitAddress> {
        self.network_objects
            .get(network)
            .and_then(|n| n.status.as_ref())
            .map(|s| s.transit.clone())
            .unwrap_or_default()
    }

    /// The valid Networks, as a list.
    pub fn plans(&self) -> Vec<NetworkPlan> {
        self.networks.values().cloned().collect()
    }

    /// Free / claimed / deleted counts of a Network.
    pub fn counts(&self, network: &str) -> (u32, u32, u32) {
        let mut c = (0, 0, 0);
        for a in self.of_network(network) {
            if a.spec.deleted {
                c.2 += 1;
            } else if a.spec.reserved {
                c.1 += 1;
            } else {
                c.0 += 1;
            }
        }
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use roam_api::AddressSpec;

    fn a(name: &str, rv: u64, host: &str, reserved: bool) -> Address {
        let mut a = Address::new(
            name,
            AddressSpec {
                network: "n".into(),
                ip: "100.64.0.5".into(),
                mac: "0a:58:64:40:00:05".into(),
                gateway: None,
                owner: reserved.then(|| "ns-p".into()),
                host: Some(host.into()),
                reserved,
                deleted: false,
                deletion_time: None,
                vlan: None,
                interface: None,
                dhcp: false,
                service_class: None,
            },
        );
        a.metadata.resource_version = Some(rv.to_string());
        a
    }

    #[test]
    fn newest_version_wins_and_moves_are_reported() {
        let mut i = Index::default();
        assert!(i.upsert(a("x", 5, "node-a", true)).0);
        assert!(
            !i.upsert(a("x", 4, "node-b", true)).0,
            "an older watch event is ignored"
        );
        let (changed, mv) = i.upsert(a("x", 7, "node-b", true));
        assert!(changed);
        assert_eq!(mv.unwrap().to, "node-b");
        assert!(
            i.upsert(a("x", 8, "node-a", false)).1.is_none(),
            "not live: no flip"
        );
        assert!(
            !i.remove("x", Some(6)),
            "a delete older than what we know is ignored"
        );
        assert!(i.remove("x", Some(9)));
        assert!(i.of_network("n").is_empty());
        i.upsert(a("y", 100, "node-a", false));
        i.relist(vec![a("z", 50, "node-a", false)]);
        assert!(i.address("y").is_some(), "newer than the list: kept");
        assert!(i.address("z").is_some());
        assert_eq!(i.counts("n"), (2, 0, 0));
    }

    #[test]
    fn only_the_managed_networks_addresses_are_kept() {
        let mut i = Index::default();
        i.upsert(a("x", 5, "node-a", true));
        let mut other = a("o", 9, "node-a", false);
        other.spec.network = "other".into();
        i.upsert(other);
        i.retain_networks(&["n".to_string()].into());
        assert!(i.address("x").is_some());
        assert!(i.address("o").is_none(), "not managed: forgotten");
        assert!(i.of_network("other").is_empty());
        i.retain_networks(&BTreeSet::new());
        assert!(i.address("x").is_none());
    }

    #[test]
    fn a_network_is_reconcilable_only_once_its_addresses_are_listed() {
        let mut idx = Index::default();
        assert!(!idx.addresses_listed_for("n"), "before the first list");
        idx.addresses_listed = Some(Some(["n".to_string()].into()));
        assert!(idx.addresses_listed_for("n"));
        assert!(
            !idx.addresses_listed_for("m"),
            "a Network added to the managed set waits for its list"
        );
        idx.addresses_listed = Some(None);
        assert!(idx.addresses_listed_for("m"), "no selector: every Network");
    }
}
