use std::net::Ipv4Addr;

use super::*;
use crate::claim::tests::{net, vlan_net};
use crate::claim::{ALSO_ON, claimed, pool_address};
use roam_api::{AddressVlan, Boot, VmInterface};
use roam_contract::mac_for_ip;

const VM: &str = "ns/vm1";

fn spec(interfaces: Vec<VmInterface>) -> VirtualMachineSpec {
    VirtualMachineSpec {
        cpu: 1,
        memory_mib: 256,
        boot: Boot::Kernel {
            kernel: "/k".into(),
            initrd: None,
            cmdline: None,
        },
        interfaces,
        node: None,
        node_selector: Default::default(),
        tolerations: vec![],
    }
}

fn iface(name: &str) -> VmInterface {
    VmInterface {
        name: name.into(),
        ..Default::default()
    }
}

fn err_of(r: Result<Vec<Resolved<'_>>>) -> String {
    match r {
        Ok(v) => panic!("accepted: {v:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn no_interfaces_is_one_dhcp_overlay_eth0() {
    let nets = [net(), vlan_net()];
    let r = resolve_vm(VM, &spec(vec![]), &nets).unwrap();
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].network.name, "ovl");
    assert_eq!(r[0].request.interface.name, "eth0");
    assert!(r[0].request.interface.dhcp);
}

#[test]
fn the_mode_follows_the_vlan_tag_or_the_named_network() {
    let nets = [net(), vlan_net()];
    let by_tag = VmInterface {
        vlan: Some(116),
        ..iface("eth0")
    };
    let by_name = VmInterface {
        network: Some("v116".into()),
        ..iface("eth0")
    };
    for i in [by_tag, by_name] {
        let r = resolve_vm(VM, &spec(vec![i]), &nets).unwrap();
        assert_eq!(r[0].network.name, "v116");
        assert!(r[0].request.interface.dhcp, "a VM's VLAN address by DHCP");
    }
}

#[test]
fn overlay_plus_vlan_is_two_interfaces_on_their_networks() {
    let nets = [net(), vlan_net()];
    let s = spec(vec![
        iface("eth0"),
        VmInterface {
            mode: Some("underlay".into()),
            network: Some("v116".into()),
            ..iface("eth1")
        },
    ]);
    let r = resolve_vm(VM, &s, &nets).unwrap();
    let got: Vec<(&str, &str)> = r
        .iter()
        .map(|r| (r.request.interface.name.as_str(), r.network.name.as_str()))
        .collect();
    assert_eq!(got, [("eth0", "ovl"), ("eth1", "v116")]);
}

#[test]
fn a_static_ip_is_a_dhcp_reservation_unless_dhcp_is_off() {
    let nets = [net(), vlan_net()];
    let pinned = VmInterface {
        vlan: Some(116),
        ip: Some("10.250.116.50".into()),
        ..iface("eth0")
    };
    let r = resolve_vm(VM, &spec(vec![pinned.clone()]), &nets).unwrap();
    assert_eq!(
        r[0].request.interface.ip,
        Some(Ipv4Addr::new(10, 250, 116, 50))
    );
    assert!(r[0].request.interface.dhcp, "served by OVN's DHCP");
    let own = VmInterface {
        dhcp: Some(false),
        ..pinned
    };
    let r = resolve_vm(VM, &spec(vec![own]), &nets).unwrap();
    assert!(!r[0].request.interface.dhcp);
    let nothing = VmInterface {
        dhcp: Some(false),
        ..iface("eth0")
    };
    let e = err_of(resolve_vm(VM, &spec(vec![nothing]), &nets));
    assert!(e.contains("dhcp false needs a static ip"), "{e}");
}

#[test]
fn bad_interfaces_are_refused_with_the_reason() {
    let nets = [net(), vlan_net()];
    let missing = VmInterface {
        mode: Some("underlay".into()),
        network: Some("nope".into()),
        ..iface("eth0")
    };
    let e = err_of(resolve_vm(VM, &spec(vec![missing]), &nets));
    assert!(
        e.contains("nope") && e.contains("missing or invalid"),
        "{e}"
    );
    let not_vlan = VmInterface {
        mode: Some("underlay".into()),
        network: Some("ovl".into()),
        ..iface("eth0")
    };
    let e = err_of(resolve_vm(VM, &spec(vec![not_vlan]), &nets));
    assert!(e.contains("Network ovl is Overlay"), "{e}");
    let wrong_tag = VmInterface {
        network: Some("v116".into()),
        vlan: Some(117),
        ..iface("eth0")
    };
    let e = err_of(resolve_vm(VM, &spec(vec![wrong_tag]), &nets));
    assert!(e.contains("VLAN 116"), "{e}");
    let same = spec(vec![
        VmInterface {
            network: Some("v116".into()),
            ..iface("eth0")
        },
        VmInterface {
            vlan: Some(116),
            ..iface("eth1")
        },
    ]);
    let e = err_of(resolve_vm(VM, &same, &nets));
    assert!(e.contains("eth0 and eth1 are both on Network v116"), "{e}");
    let dup = spec(vec![iface("eth0"), iface("eth0")]);
    let e = err_of(resolve_vm(VM, &dup, &nets));
    assert!(e.contains("eth0"), "{e}");
    let mode = VmInterface {
        mode: Some("bridge".into()),
        ..iface("eth0")
    };
    assert!(resolve_vm(VM, &spec(vec![mode]), &nets).is_err());
}

fn held(r: &Resolved<'_>, last: u8, node: &str) -> Address {
    let n = r.network;
    let ip = match n.vlan {
        Some(_) => Ipv4Addr::new(10, 250, 116, last),
        None => Ipv4Addr::new(100, 64, 0, last),
    };
    let base = pool_address(n, ip, mac_for_ip(ip), node);
    let s = claimed(&base, VM, node, r);
    Address::new(&roam_api::address_name(&n.name, ip), s)
}

#[test]
fn nics_are_per_interface_in_order_with_their_own_tap_and_port() {
    let nets = [net(), vlan_net()];
    let s = spec(vec![
        iface("eth0"),
        VmInterface {
            vlan: Some(116),
            ..iface("eth1")
        },
    ]);
    let r = resolve_vm(VM, &s, &nets).unwrap();
    let a0 = held(&r[0], 20, "node-a");
    assert_eq!(
        nics(VM, "node-a", &r, &[&a0]),
        None,
        "eth1 has no Address yet"
    );
    let a1 = held(&r[1], 30, "node-a");
    let n = nics(VM, "node-a", &r, &[&a1, &a0]).unwrap();
    assert_eq!(n.len(), 2);
    assert_eq!(
        (n[0].name.as_str(), n[0].ip.as_str()),
        ("eth0", "100.64.0.20")
    );
    assert_eq!(n[0].tap, tap_name(VM));
    assert_eq!(
        n[0].ovn_port, "ovl-100-64-0-20",
        "overlay: one mobile port, whatever the node"
    );
    assert_eq!(
        (n[1].name.as_str(), n[1].ip.as_str()),
        ("eth1", "10.250.116.30")
    );
    assert_eq!(n[1].tap, format!("{}1", tap_name(VM)));
    assert!(n[1].tap.len() <= 15);
    assert_eq!(n[1].ovn_port, "v116-10-250-116-30", "VLAN: one port");
    // on the target: the same ports (bound on both chassis while the VM migrates)
    let t = nics_of_addresses(VM, "node-b", &[&a1, &a0]);
    assert_eq!(t[0].ovn_port, "ovl-100-64-0-20");
    assert_eq!(t[1].ovn_port, "v116-10-250-116-30");
    assert_eq!(
        t.iter().map(|n| &n.tap).collect::<Vec<_>>(),
        n.iter().map(|n| &n.tap).collect::<Vec<_>>(),
        "the same taps on every node"
    );
    let st = interface_status(&n);
    assert_eq!(st.len(), 2);
    assert_eq!(st[1].address.as_deref(), Some("v116-10-250-116-30"));
}

#[test]
fn interface_names_sort_numerically() {
    let mut v = vec!["eth10", "eth2", "eth0"];
    v.sort_by_key(|n| iface_order(n));
    assert_eq!(v, ["eth0", "eth2", "eth10"]);
}

fn place(name: &str, host: &str, also: &[&str]) -> Placement {
    Placement {
        address: name.into(),
        host: Some(host.into()),
        also_on: also.iter().map(|s| s.to_string()).collect(),
    }
}

fn moved(m: &[Move]) -> Vec<(&str, &str, Vec<&str>)> {
    m.iter()
        .map(|m| {
            (
                m.address.as_str(),
                m.host.as_str(),
                m.also_on.iter().map(String::as_str).collect(),
            )
        })
        .collect()
}

#[test]
fn a_switchover_keeps_every_port_multi_chassis_until_the_guest_runs_on_the_target() {
    let (a, b) = ("node-a", "node-b");
    let start = [place("ovl", a, &[]), place("vlan", a, &[])];
    assert_eq!(ports_at(&start, b), PortsAt::Source);
    assert!(!ports_on(&start, b));
    // before the target pod: every port on both nodes
    let m = moves(&start, When::PrepareTarget, a, b);
    assert_eq!(moved(&m), [("ovl", a, vec![b]), ("vlan", a, vec![b])]);
    let copying = [place("ovl", a, &[b]), place("vlan", a, &[b])];
    assert!(ports_on(&copying, b));
    assert!(
        moves(&copying, When::PrepareTarget, a, b).is_empty(),
        "idempotent"
    );
    // the pause changes nothing: the guest's RARP activates the target's bindings
    assert_eq!(ports_at(&copying, b), PortsAt::Source);
    assert_eq!(activated_on_target(&copying), ["ovl", "vlan"]);
    // the guest runs on the target: every port's main chassis follows
    let m = moves(&copying, When::GuestOnTarget, a, b);
    assert_eq!(moved(&m), [("ovl", b, vec![a]), ("vlan", b, vec![a])]);
    let on_b = [place("ovl", b, &[a]), place("vlan", b, &[a])];
    assert_eq!(ports_at(&on_b, b), PortsAt::Target);
    // succeeded: single-chassis once the source pod is gone
    assert!(moves(&on_b, When::Succeeded { source_pod: true }, a, b).is_empty());
    let m = moves(&on_b, When::Succeeded { source_pod: false }, a, b);
    assert_eq!(moved(&m), [("ovl", b, vec![]), ("vlan", b, vec![])]);
}

#[test]
fn a_failed_copy_goes_back_to_the_source_everywhere() {
    let (a, b) = ("node-a", "node-b");
    let copying = [place("ovl", a, &[b]), place("vlan", a, &[b])];
    assert!(
        moves(&copying, When::GuestOnSource, a, b).is_empty(),
        "the source never stopped carrying them"
    );
    let m = moves(&copying, When::RolledBack, a, b);
    assert_eq!(moved(&m), [("ovl", a, vec![]), ("vlan", a, vec![])]);
    assert_eq!(
        moved(&moves(&copying, When::TargetGone, a, b)),
        moved(&moves(&copying, When::RolledBack, a, b))
    );
    // a guest back on the source after its ports had moved (a controller that saw it land
    // first): the ports come back
    let on_b = [place("ovl", b, &[a])];
    assert_eq!(
        moved(&moves(&on_b, When::GuestOnSource, a, b)),
        [("ovl", a, vec![b])]
    );
    assert_eq!(
        ports_at(&[], b),
        PortsAt::Source,
        "no address: never at the target"
    );
    assert!(!ports_on(&[], b));
}

#[test]
fn placements_read_the_address() {
    let nets = [net(), vlan_net()];
    let r = resolve_vm(
        VM,
        &spec(vec![VmInterface {
            vlan: Some(116),
            ..iface("eth0")
        }]),
        &nets,
    )
    .unwrap();
    let mut a = held(&r[0], 40, "node-a");
    a.spec.vlan = Some(AddressVlan {
        tag: 116,
        local_subnet: "10.250.116.0/24".into(),
    });
    a.metadata.annotations = Some([(ALSO_ON.to_string(), "node-b".to_string())].into());
    let p = Placement::of(&a);
    assert_eq!(p.address, a.metadata.name.clone().unwrap());
    assert_eq!(p.host.as_deref(), Some("node-a"));
    assert_eq!(p.also_on, ["node-b"]);
}

#[test]
fn two_vms_picked_at_once_never_share_a_shim_port() {
    let mut book = PortBook::new();
    let none = std::collections::BTreeMap::new();
    // the same start (their hashes collide), neither status written yet
    let a = book.pick("uid-a", 55, (17300, 17399), &none).unwrap();
    let b = book.pick("uid-b", 55, (17300, 17399), &none).unwrap();
    assert_eq!(a, 17355);
    assert_ne!(
        a, b,
        "the second VM does not get the first one's reserved port"
    );
    assert_eq!(
        book.pick("uid-a", 55, (17300, 17399), &none),
        Some(a),
        "stable"
    );
    // once the statuses show them, the reservations end and the statuses rule
    let used =
        std::collections::BTreeMap::from([("uid-a".to_string(), a), ("uid-b".to_string(), b)]);
    let c = book.pick("uid-c", 55, (17300, 17399), &used).unwrap();
    assert!(c != a && c != b);
    assert!(
        !book.pending.contains_key("uid-a") && !book.pending.contains_key("uid-b"),
        "{book:?}"
    );
    // a full range
    let mut small = PortBook::new();
    assert_eq!(small.pick("x", 0, (1, 1), &none), Some(1));
    assert_eq!(small.pick("y", 0, (1, 1), &none), None);
    assert_eq!(small.pick("y", 0, (2, 1), &none), None, "an empty range");
}

#[test]
fn guest_resets_are_counted_per_shim_and_summed_over_pods() {
    let at = |total, pod: &str, shim_count| GuestResets {
        total,
        pod: pod.into(),
        shim_count,
    };
    // nothing seen, nothing recorded
    assert_eq!(account_resets(None, "p1", 0), (None, 0));
    // the first reset
    let (r, new) = account_resets(None, "p1", 1);
    assert_eq!((r.clone(), new), (Some(at(1, "p1", 1)), 1));
    // the same count again: nothing new
    assert_eq!(account_resets(r.as_ref(), "p1", 1), (r.clone(), 0));
    // two more on the same shim
    let (r, new) = account_resets(r.as_ref(), "p1", 3);
    assert_eq!((r.clone(), new), (Some(at(3, "p1", 3)), 2));
    // migrated: the target's shim counts from 0
    assert_eq!(
        account_resets(r.as_ref(), "p2", 0),
        (Some(at(3, "p2", 0)), 0)
    );
    let (r, new) = account_resets(r.as_ref(), "p2", 1);
    assert_eq!((r.clone(), new), (Some(at(4, "p2", 1)), 1));
    // the shim restarted in its pod (lower count): its count is new
    let (r, new) = account_resets(Some(&at(4, "p2", 5)), "p2", 2);
    assert_eq!((r, new), (Some(at(6, "p2", 2)), 2));
}
