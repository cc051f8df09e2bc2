//! A VirtualMachine's interfaces, pure: which Addresses it needs (one per interface, each on
//! its own Network), the NICs its launcher gets, and per interface what a migration does to
//! its Address at each step. A VM's address (overlay or VLAN) is one multi-chassis port
//! (`requested-chassis=src,dst`, activated on the target by the guest's RARP) whose route
//! never moves: left alone in the pause, made single-chassis once the migration is over.

use std::collections::{BTreeMap, BTreeSet};

use roam_contract::annotation::{InterfaceRequest, parse_interfaces};
use roam_contract::keys::INTERFACES;
use serde_json::json;

use super::claim::{Resolved, held_by, ovn_port, resolve_for};
use super::network::NetworkPlan;
use crate::error::{Error, Result};
use crate::migration::PortsAt;
use roam_api::{Address, GuestResets, NetworkMode, VirtualMachineSpec, VmInterfaceStatus};

/// A tap name (≤ 15 bytes) for a VM (`namespace/name`): the same on every node, since the
/// migrated domain's XML names its tap and the target's libvirt expects that device.
pub fn tap_name(vm_key: &str) -> String {
    // FNV-1a: stable across versions, no dependency
    let mut h: u64 = 0xcbf29ce484222325;
    for b in vm_key.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    format!("rm{:012x}", h & 0xffff_ffff_ffff)
}

/// The tap of a VM's `index`th NIC: [`tap_name`] for the first (as before VMs had several),
/// then that name + the index (15 bytes; a VM has at most 8 NICs).
pub fn nic_tap(vm_key: &str, index: usize) -> String {
    let base = tap_name(vm_key);
    if index == 0 {
        base
    } else {
        format!("{base}{index}")
    }
}

fn invalid(vm: &str, problem: String) -> Error {
    Error::InvalidVm {
        vm: vm.into(),
        problem,
    }
}

/// The interface requests of a VM (`vm` = `namespace/name`), validated like a pod's
/// `roam.dev/interfaces`. Empty spec: one overlay `eth0`. An interface's mode is the one
/// given, else `underlay` when it gives a VLAN tag, else the mode of the Network it names
/// (when that Network exists), else `overlay`. A VM takes every address by DHCP from OVN —
/// the guest cannot be configured from outside — so a static IP is a reservation that DHCP
/// hands out; `dhcp: false` only with a static IP the guest configures itself.
pub fn requests(
    vm: &str,
    spec: &VirtualMachineSpec,
    networks: &[NetworkPlan],
) -> Result<Vec<InterfaceRequest>> {
    if spec.interfaces.is_empty() {
        let mut eth0 = InterfaceRequest::default_overlay();
        eth0.interface.dhcp = true;
        return Ok(vec![eth0]);
    }
    let mut list = Vec::new();
    let mut dhcp = Vec::new();
    for i in &spec.interfaces {
        let mode = match (&i.mode, i.vlan, &i.network) {
            (Some(m), _, _) => m.clone(),
            (None, Some(_), _) => "underlay".into(),
            (None, None, Some(n)) => match networks.iter().find(|p| &p.name == n) {
                Some(p) if p.mode == NetworkMode::Underlay => "underlay".into(),
                _ => "overlay".into(),
            },
            (None, None, None) => "overlay".into(),
        };
        let wants_dhcp = i.dhcp.unwrap_or(true);
        if !wants_dhcp && i.ip.is_none() {
            return Err(invalid(
                vm,
                format!(
                    "interface {}: dhcp false needs a static ip (which the guest configures \
                     itself); leave dhcp out to have OVN hand the address out",
                    i.name
                ),
            ));
        }
        dhcp.push(wants_dhcp);
        // validated as a pod's static interface; DHCP is set below (a VM's static IP is a
        // DHCP reservation)
        let mut f = json!({"name": i.name, "dhcp": i.ip.is_none() && wants_dhcp});
        for (k, v) in [
            ("mac", &i.mac),
            ("ip", &i.ip),
            ("mask", &i.mask),
            ("gateway", &i.gateway),
            ("service_class", &i.service_class),
        ] {
            if let Some(v) = v {
                f[k] = json!(v);
            }
        }
        if let Some(m) = i.metric {
            f["metric"] = json!(m);
        }
        let mut r = json!({"mode": mode, "interface": f});
        if let Some(n) = &i.network {
            r["network"] = json!(n);
        }
        if let Some(t) = i.vlan {
            r["vlan"] = json!({"tag": t});
        }
        list.push(r);
    }
    let mut parsed = parse_interfaces(&serde_json::Value::Array(list).to_string())
        .map_err(|e| invalid(vm, e.to_string()))?;
    for (r, d) in parsed.iter_mut().zip(dhcp) {
        r.interface.dhcp = d;
    }
    Ok(parsed)
}

/// Each interface of a VM with its Network: [`requests`], then the Network of each
/// ([`resolve`]'s rules and errors: a named Network that does not exist, or is not of the
/// interface's mode or VLAN, is refused), and no two interfaces on one Network (an Address
/// is owner + Network + interface; two NICs on one segment is a loop, not a VM). Nothing
/// is claimed when this fails.
pub fn resolve_vm<'a>(
    vm: &str,
    spec: &VirtualMachineSpec,
    networks: &'a [NetworkPlan],
) -> Result<Vec<Resolved<'a>>> {
    resolve_vm_for(vm, spec, networks, &BTreeSet::new())
}

/// [`resolve_vm`] with the Networks admitting the VM's namespace (`admitting`, see
/// [`super::claim::resolve_for`]).
pub fn resolve_vm_for<'a>(
    vm: &str,
    spec: &VirtualMachineSpec,
    networks: &'a [NetworkPlan],
    admitting: &BTreeSet<String>,
) -> Result<Vec<Resolved<'a>>> {
    let reqs = requests(vm, spec, networks)?;
    // as a pod would write them: a static IP without DHCP
    let as_pod: Vec<InterfaceRequest> = reqs
        .iter()
        .cloned()
        .map(|mut r| {
            r.interface.dhcp &= r.interface.ip.is_none();
            r
        })
        .collect();
    let anns = BTreeMap::from([(
        INTERFACES.to_string(),
        serde_json::to_string(&as_pod).map_err(|e| invalid(vm, e.to_string()))?,
    )]);
    // a VM's error names the VM (resolve speaks of pods)
    let mut resolved = resolve_for(vm, &anns, networks, admitting).map_err(|e| match e {
        Error::NoNetwork {
            interface, problem, ..
        } => invalid(vm, format!("interface {interface}: {problem}")),
        e => e,
    })?;
    // resolve re-parsed the annotation: restore the VM's DHCP choice
    for (r, want) in resolved.iter_mut().zip(&reqs) {
        r.request.interface.dhcp = want.interface.dhcp;
    }
    for (i, r) in resolved.iter().enumerate() {
        if let Some(other) = resolved[..i]
            .iter()
            .find(|o| o.network.name == r.network.name)
        {
            return Err(invalid(
                vm,
                format!(
                    "interfaces {} and {} are both on Network {}; give each interface its own Network",
                    other.request.interface.name, r.request.interface.name, r.network.name
                ),
            ));
        }
    }
    Ok(resolved)
}

/// One NIC of a VM on a node: what the launcher needs and what the VM's status shows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VmNic {
    /// The guest's interface name.
    pub name: String,
    /// The Address.
    pub address: String,
    /// Its IP.
    pub ip: String,
    /// Its MAC (the guest NIC's).
    pub mac: String,
    /// The tap on the node.
    pub tap: String,
    /// The OVN port the tap is bound to on this node.
    pub ovn_port: String,
}

/// The NICs of VM `vm` on `node`, in interface order: each interface's Address among
/// `held` (the VM's Addresses). `None` while an interface has no Address yet.
pub fn nics(
    vm: &str,
    node: &str,
    resolved: &[Resolved<'_>],
    held: &[&Address],
) -> Option<Vec<VmNic>> {
    resolved
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let iface = &r.request.interface.name;
            let a = held
                .iter()
                .find(|a| a.spec.network == r.network.name && held_by(&a.spec, vm, iface))?;
            let name = a.metadata.name.clone().unwrap_or_default();
            Some(VmNic {
                name: iface.clone(),
                ip: a.spec.ip.clone(),
                mac: a.spec.mac.clone(),
                tap: nic_tap(vm, i),
                ovn_port: ovn_port(&a.spec, &name, node),
                address: name,
            })
        })
        .collect()
}

/// The NICs of a VM from its Addresses alone (a migration's target, whose VM spec may have
/// changed since it booted): ordered by interface name (`eth0`, `eth1`, … as booted).
pub fn nics_of_addresses(vm: &str, node: &str, held: &[&Address]) -> Vec<VmNic> {
    let mut sorted: Vec<&&Address> = held.iter().collect();
    sorted.sort_by_key(|a| iface_order(a.spec.interface.as_deref().unwrap_or("eth0")));
    sorted
        .into_iter()
        .enumerate()
        .map(|(i, a)| {
            let name = a.metadata.name.clone().unwrap_or_default();
            VmNic {
                name: a.spec.interface.clone().unwrap_or_else(|| "eth0".into()),
                ip: a.spec.ip.clone(),
                mac: a.spec.mac.clone(),
                tap: nic_tap(vm, i),
                ovn_port: ovn_port(&a.spec, &name, node),
                address: name,
            }
        })
        .collect()
}

/// Sort key of an interface name: `eth2` before `eth10`.
fn iface_order(name: &str) -> (String, u64, String) {
    let digits = name.trim_end_matches(|c: char| c.is_ascii_digit());
    let n = name[digits.len()..].parse().unwrap_or(0);
    (digits.to_string(), n, name.to_string())
}

/// The VM status's interfaces for `nics`.
pub fn interface_status(nics: &[VmNic]) -> Vec<VmInterfaceStatus> {
    nics.iter()
        .map(|n| VmInterfaceStatus {
            name: n.name.clone(),
            ip: n.ip.clone(),
            mac: n.mac.clone(),
            address: Some(n.address.clone()),
        })
        .collect()
}

// ---- the shims' API ports ----

/// The shim ports this controller handed out that no VM's status shows yet: two VMs
/// reconciled at the same moment both see the other's port as free in the API, so the pick
/// and its reservation happen under one lock (the caller's) against this book.
#[derive(Debug, Default)]
pub struct PortBook {
    pending: BTreeMap<String, u16>,
}

impl PortBook {
    /// An empty book.
    pub const fn new() -> PortBook {
        PortBook {
            pending: BTreeMap::new(),
        }
    }

    /// A port in `lo..=hi` for the VM `uid`, starting the search at `start` (derived from the
    /// VM, so that picks spread): not in any VM's status (`used`: uid → port) nor reserved
    /// for another VM here; reserved until `used` shows it. The same VM asking again gets
    /// the same port. `None`: the range is full.
    pub fn pick(
        &mut self,
        uid: &str,
        start: u64,
        (lo, hi): (u16, u16),
        used: &BTreeMap<String, u16>,
    ) -> Option<u16> {
        // a reservation ends once the VM's status carries a port (or the VM is gone and its
        // port is in nobody's way: kept until then, harmless)
        self.pending.retain(|u, _| !used.contains_key(u));
        if let Some(p) = self.pending.get(uid) {
            return Some(*p);
        }
        let taken: std::collections::BTreeSet<u16> = used
            .iter()
            .filter(|(u, _)| u.as_str() != uid)
            .map(|(_, p)| *p)
            .chain(self.pending.values().copied())
            .collect();
        let span = (hi.checked_sub(lo)? as u64) + 1;
        let port = (0..span)
            .map(|i| lo + ((start + i) % span) as u16)
            .find(|p| !taken.contains(p))?;
        self.pending.insert(uid.to_string(), port);
        Some(port)
    }
}

// ---- migration: per Address ----

/// Where one of the VM's Addresses is now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// The Address.
    pub address: String,
    /// Its host: its port's main chassis.
    pub host: Option<String>,
    /// The other nodes its port is on (`roam.dev/also-on`).
    pub also_on: Vec<String>,
}

impl Placement {
    /// The placement of Address `a`.
    pub fn of(a: &Address) -> Placement {
        Placement {
            address: a.metadata.name.clone().unwrap_or_default(),
            host: a.spec.host.clone(),
            also_on: super::claim::also_on(a),
        }
    }
}

/// A write of one Address: its host and the other nodes its port is on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Move {
    /// The Address.
    pub address: String,
    /// Its new host.
    pub host: String,
    /// Its new `also-on` (sorted).
    pub also_on: Vec<String>,
}

/// The moments of a migration at which the VM's Addresses move.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum When {
    /// Before the target pod: every port on the target too (VLAN: multi-chassis).
    PrepareTarget,
    /// The guest runs on the target: every Address's host is the target, the source keeps
    /// its port until its pod is gone.
    GuestOnTarget,
    /// The guest runs on the source again (a final copy failed): back to the source, the
    /// target keeps its port while its pod exists.
    GuestOnSource,
    /// The target pod is going (rollback): every port on the source only.
    TargetGone,
    /// Succeeded; `source_pod`: the source pod still exists (its port stays until it goes).
    Succeeded {
        /// The source pod still exists.
        source_pod: bool,
    },
    /// Failed or aborted with the guest on the source: single-chassis on the source.
    RolledBack,
}

/// What to write to the VM's Addresses at `when` of a migration `source` → `target`: only
/// the Addresses that are not there yet.
pub fn moves(addrs: &[Placement], when: When, source: &str, target: &str) -> Vec<Move> {
    let to = |host: &str, also: &[&str]| {
        (
            host.to_string(),
            also.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
        )
    };
    addrs
        .iter()
        .filter_map(|p| {
            let (host, also_on) = match when {
                When::PrepareTarget => to(source, &[target]),
                When::GuestOnTarget => to(target, &[source]),
                When::GuestOnSource => to(source, &[target]),
                When::TargetGone | When::RolledBack => to(source, &[]),
                When::Succeeded { source_pod: true } => to(target, &[source]),
                When::Succeeded { source_pod: false } => to(target, &[]),
            };
            let mut also_on = also_on;
            also_on.sort();
            (p.host.as_deref() != Some(host.as_str()) || p.also_on != also_on).then(|| Move {
                address: p.address.clone(),
                host,
                also_on,
            })
        })
        .collect()
}

/// Where the VM's ports point: at the target once every port's host (its main chassis) is
/// the target, else at the source.
pub fn ports_at(addrs: &[Placement], target: &str) -> PortsAt {
    if !addrs.is_empty() && addrs.iter().all(|p| p.host.as_deref() == Some(target)) {
        PortsAt::Target
    } else {
        PortsAt::Source
    }
}

/// Whether every one of the VM's ports exists on `node` (its host or `also-on` there).
pub fn ports_on(addrs: &[Placement], node: &str) -> bool {
    !addrs.is_empty()
        && addrs
            .iter()
            .all(|p| p.host.as_deref() == Some(node) || p.also_on.iter().any(|n| n == node))
}

/// The ports the guest's RARP activates on the target (every one of the VM's: each is named
/// after its Address): the switchover's figure is the pause → the target's binding of every
/// one of them activated.
pub fn activated_on_target(addrs: &[Placement]) -> Vec<String> {
    addrs.iter().map(|p| p.address.clone()).collect()
}

/// Account the guest resets a launcher's shim reports (`shim_count` from the shim on `pod`)
/// against what status recorded: the new record and how many resets are new. A shim counts
/// from its own start, so a new pod (a migration) or a lower count on the same pod (the shim
/// restarted) starts a new count. `None` while no reset was ever seen.
pub fn account_resets(
    before: Option<&GuestResets>,
    pod: &str,
    shim_count: u64,
) -> (Option<GuestResets>, u64) {
    let (total, new) = match before {
        None => (0, shim_count),
        Some(b) if b.pod == pod && shim_count >= b.shim_count => {
            (b.total, shim_count - b.shim_count)
        }
        Some(b) => (b.total, shim_count),
    };
    if before.is_none() && new == 0 {
        return (None, 0);
    }
    let record = GuestResets {
        total: total + new,
        pod: pod.to_string(),
        shim_count,
    };
    (Some(record), new)
}

pub mod decide;
pub mod readiness;
pub mod teardown;
pub mod validate;
pub mod volume;

#[cfg(test)]
mod tests;
