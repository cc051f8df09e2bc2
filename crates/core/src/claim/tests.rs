use super::*;
use crate::network::validate_network;
use proptest::prelude::*;
use roam_api::NetworkSpec;

pub(crate) fn net() -> NetworkPlan {
    let spec = NetworkSpec {
        mode: NetworkMode::Overlay,
        vlan: None,
        subnet: "100.64.0.0/24".into(),
        gateway: None,
        excluded: vec!["100.64.0.2-100.64.0.9".into()],
        pool_size_per_node: Some(3),
        refill_period_seconds: None,
        reclaim_grace_seconds: None,
        dns: vec![],
        mtu: Some(1400),
        physnet: None,
        transit_subnet: None,
        ..Default::default()
    };
    validate_network("ovl", &spec).unwrap()
}

pub(crate) fn vlan_net() -> NetworkPlan {
    let spec = NetworkSpec {
        mode: NetworkMode::Underlay,
        vlan: Some(116),
        subnet: "10.250.116.0/24".into(),
        gateway: None,
        excluded: vec![],
        pool_size_per_node: None,
        refill_period_seconds: None,
        reclaim_grace_seconds: None,
        dns: vec![],
        mtu: None,
        physnet: None,
        transit_subnet: None,
        ..Default::default()
    };
    validate_network("v116", &spec).unwrap()
}

pub(crate) fn addr(host: &str, last: u8, owner: Option<&str>) -> Address {
    let n = net();
    let ip = Ipv4Addr::new(100, 64, 0, last);
    let mut spec = pool_address(&n, ip, mac_for_ip(ip), host);
    if let Some(o) = owner {
        spec.owner = Some(o.into());
        spec.reserved = true;
        spec.interface = Some("eth0".into());
    }
    Address::new(&address_name("ovl", ip), spec)
}

fn ann(json: &str) -> BTreeMap<String, String> {
    [(INTERFACES.to_string(), json.to_string())].into()
}

#[test]
fn resolve_finds_the_network_per_interface() {
    let nets = vec![net(), vlan_net()];
    let r = resolve("ns/p", &BTreeMap::new(), &nets).unwrap();
    assert_eq!((r.len(), r[0].network.name.as_str()), (1, "ovl"));
    let r = resolve(
        "ns/p",
        &ann(r#"[{"mode":"overlay","interface":{"name":"eth0"}},
                 {"mode":"underlay","interface":{"name":"eth1","dhcp":"true"},"vlan":{"tag":"116"}}]"#),
        &nets,
    )
    .unwrap();
    assert_eq!(r[1].network.name, "v116");
    let e = resolve(
        "ns/p",
        &ann(r#"[{"mode":"underlay","interface":{"name":"eth1"},"vlan":{"tag":"117"}}]"#),
        &nets,
    )
    .unwrap_err();
    assert!(matches!(e, Error::NoNetwork { .. }), "{e}");
    assert!(e.to_string().contains("VLAN 117"), "{e}");
    let e = resolve("ns/p", &ann("{not json"), &nets).unwrap_err();
    assert_eq!(e.reason(), "InvalidInterfaces");
    let e = resolve(
        "ns/p",
        &ann(r#"[{"mode":"bridge","interface":{"name":"eth0"}}]"#),
        &nets,
    )
    .unwrap_err();
    assert!(e.is_bad_input() && e.to_string().contains("bridge"), "{e}");
    let e = resolve(
        "ns/p",
        &ann(r#"[{"mode":"underlay","interface":{"name":"eth0"},"vlan":{"tag":4095}}]"#),
        &nets,
    )
    .unwrap_err();
    assert!(e.to_string().contains("vlan.tag"), "{e}");
    let e = resolve(
        "ns/p",
        &BTreeMap::new(),
        &[net(), {
            let mut n = net();
            n.name = "ovl2".into();
            n
        }],
    )
    .unwrap_err();
    assert!(e.to_string().contains("name one"), "{e}");
}

fn one<'a>(nets: &'a [NetworkPlan], json: Option<&str>) -> Resolved<'a> {
    let a = json.map(ann).unwrap_or_default();
    resolve("ns/p", &a, nets).unwrap().remove(0)
}

/// [`net`] admitting namespace `ns` only, with the default classes.
fn net_for(ns: &str) -> NetworkPlan {
    let mut n = net();
    n.access.namespaces = [ns.to_string()].into();
    n
}

#[test]
fn a_new_attachment_is_checked_against_the_networks_access_and_a_held_one_is_not() {
    let nets = vec![net_for("ns")];
    let none = BTreeMap::new();
    let r = vec![one(&nets, None)];
    may_use("pod ns/p", "ns", &none, "ns:p", &r, &[]).expect("ns is named");
    let e = may_use("pod other/p", "other", &none, "other:p", &r, &[]).unwrap_err();
    assert_eq!(e.reason(), "NetworkNotAllowed", "{e}");
    assert!(e.to_string().contains("namespace other"), "{e}");

    // a class the Network does not allow, on an interface it admits
    let cs6 = vec![one(
        &nets,
        Some(
            r#"[{"mode":"overlay","interface":{"name":"eth0","service_class":"network-control"}}]"#,
        ),
    )];
    let e = may_use("pod ns/p", "ns", &none, "ns:p", &cs6, &[]).unwrap_err();
    assert_eq!(e.reason(), "ServiceClassNotAllowed", "{e}");

    // what the owner already holds live on the Network stays its own (access revoked after
    // it attached): not asked again, unless it asks for another class
    let held = addr("node-a", 40, Some("other:p")).spec;
    may_use("pod other/p", "other", &none, "other:p", &r, &[&held]).expect("held");
    let e = may_use("pod other/p", "other", &none, "other:p", &cs6, &[&held]).unwrap_err();
    assert_eq!(e.reason(), "ServiceClassNotAllowed", "{e}");
    let mut held_cs6 = held.clone();
    held_cs6.service_class = Some("network-control".into());
    may_use("pod other/p", "other", &none, "other:p", &cs6, &[&held_cs6]).expect("unchanged");

    // ... but not what it held once (released), another owner's or another interface's
    let mut released = held.clone();
    released.deleted = true;
    let mut eth1 = held.clone();
    eth1.interface = Some("eth1".into());
    let someone_else = addr("node-a", 41, Some("other:q")).spec;
    for h in [&released, &eth1, &someone_else] {
        let e = may_use("pod other/p", "other", &none, "other:p", &r, &[h]).unwrap_err();
        assert_eq!(e.reason(), "NetworkNotAllowed", "{h:?}");
    }
}

#[test]
fn every_interface_is_checked_before_any_is_claimed() {
    let mut open = net_for("ns");
    open.name = "open".into();
    open.access.all_namespaces = true;
    let mut closed = vlan_net();
    closed.access.namespaces = ["elsewhere".to_string()].into();
    let nets = vec![open, closed];
    let r = resolve(
        "ns/p",
        &ann(r#"[{"mode":"overlay","interface":{"name":"eth0"}},
                 {"mode":"underlay","interface":{"name":"eth1"},"vlan":{"tag":"116"}}]"#),
        &nets,
    )
    .unwrap();
    let e = may_use("pod ns/p", "ns", &BTreeMap::new(), "ns:p", &r, &[]).unwrap_err();
    assert!(
        e.to_string().contains("interface eth1") && e.to_string().contains("network v116"),
        "the second interface's Network refuses: {e}"
    );
}

#[test]
fn reuse_by_owner_wins_then_the_lowest_free_on_the_node_then_a_new_address() {
    let nets = vec![net()];
    let r = one(&nets, None);
    let mut mine = addr("node-a", 40, Some("ns-p"));
    mine.spec.deleted = true;
    let free_b = addr("node-b", 12, None);
    let free_b2 = addr("node-b", 11, None);
    let free_a = addr("node-a", 10, None);
    let all = [
        mine.clone(),
        free_b.clone(),
        free_b2.clone(),
        free_a.clone(),
    ];
    let refs: Vec<&Address> = all.iter().collect();
    let none = BTreeSet::new();
    assert_eq!(
        decide("ns/p", "ns-p", "node-b", &r, &refs, &none).unwrap(),
        Step::Reuse {
            name: mine.metadata.name.clone().unwrap()
        }
    );
    assert_eq!(
        decide("ns/q", "ns-q", "node-b", &r, &refs, &none).unwrap(),
        Step::Claim {
            name: free_b2.metadata.name.clone().unwrap()
        }
    );
    // the lowest lost a race: the next one
    let skip: BTreeSet<Ipv4Addr> = [Ipv4Addr::new(100, 64, 0, 11)].into();
    assert_eq!(
        decide("ns/q", "ns-q", "node-b", &r, &refs, &skip).unwrap(),
        Step::Claim {
            name: free_b.metadata.name.clone().unwrap()
        }
    );
    // empty pool on node-c: a new address with the lowest IP unused anywhere
    assert_eq!(
        decide("ns/q", "ns-q", "node-c", &r, &refs, &none).unwrap(),
        Step::Create {
            ip: Ipv4Addr::new(100, 64, 0, 13),
            mac: mac_for_ip(Ipv4Addr::new(100, 64, 0, 13))
        }
    );
    // a double claim (two racing controllers): the lowest IP is reused
    let mut second = addr("node-b", 45, Some("ns-p"));
    second.spec.deleted = false;
    let with_second = [mine.clone(), second, free_b.clone()];
    let refs2: Vec<&Address> = with_second.iter().collect();
    assert_eq!(
        decide("ns/p", "ns-p", "node-b", &r, &refs2, &none).unwrap(),
        Step::Reuse {
            name: mine.metadata.name.clone().unwrap()
        }
    );
    // another interface of the same owner does not reuse eth0's address
    let nets2 = vec![net()];
    let r1 = one(
        &nets2,
        Some(r#"[{"mode":"overlay","interface":{"name":"eth1"}}]"#),
    );
    assert!(matches!(
        decide("ns/p", "ns-p", "node-b", &r1, &refs, &none).unwrap(),
        Step::Claim { .. }
    ));
}

#[test]
fn static_ips_are_checked_and_locked() {
    let nets = vec![net()];
    let taken = addr("node-a", 50, Some("ns-other"));
    let free = addr("node-b", 51, None);
    let all = [taken, free.clone()];
    let refs: Vec<&Address> = all.iter().collect();
    let none = BTreeSet::new();
    let req =
        |ip: &str| format!(r#"[{{"mode":"overlay","interface":{{"name":"eth0","ip":"{ip}"}}}}]"#);
    let r = one(&nets, Some(&req("100.64.0.50")));
    let e = decide("ns/p", "ns-p", "node-a", &r, &refs, &none).unwrap_err();
    assert!(
        matches!(&e, Error::Taken { holder, .. } if holder == "ns-other"),
        "{e}"
    );
    let r = one(&nets, Some(&req("100.64.0.51")));
    assert_eq!(
        decide("ns/p", "ns-p", "node-a", &r, &refs, &none).unwrap(),
        Step::Claim {
            name: free.metadata.name.clone().unwrap()
        },
        "a free pool address with that IP is claimed, wherever it was"
    );
    let r = one(&nets, Some(&req("100.64.0.60")));
    assert!(matches!(
        decide("ns/p", "ns-p", "node-a", &r, &refs, &none).unwrap(),
        Step::Create { .. }
    ));
    for outside in ["100.64.1.5", "100.64.0.1", "100.64.0.5"] {
        let r = one(&nets, Some(&req(outside)));
        let e = decide("ns/p", "ns-p", "node-a", &r, &refs, &none).unwrap_err();
        assert_eq!(e.reason(), "StaticIpOutsideSubnet", "{outside}: {e}");
    }
    // a static IP that lost its creation race is taken
    let skip: BTreeSet<Ipv4Addr> = [Ipv4Addr::new(100, 64, 0, 60)].into();
    let r = one(&nets, Some(&req("100.64.0.60")));
    assert_eq!(
        decide("ns/p", "ns-p", "node-a", &r, &refs, &skip)
            .unwrap_err()
            .reason(),
        "AddressTaken"
    );
}

#[test]
fn vlan_static_with_the_wrong_mask_is_refused_and_dhcp_is_recorded() {
    let nets = vec![vlan_net()];
    let r = one(
        &nets,
        Some(
            r#"[{"mode":"underlay","interface":{"name":"eth0","ip":"10.250.116.20","mask":"255.255.0.0"},"vlan":{"tag":116}}]"#,
        ),
    );
    let e = decide("ns/p", "ns-p", "node-a", &r, &[], &BTreeSet::new()).unwrap_err();
    assert_eq!(e.reason(), "StaticIpOutsideSubnet");
    let r = one(
        &nets,
        Some(
            r#"[{"mode":"underlay","interface":{"name":"eth0","dhcp":true,"service_class":"bulk"},"vlan":{"tag":116}}]"#,
        ),
    );
    let Step::Create { ip, mac } =
        decide("ns/p", "ns-p", "node-a", &r, &[], &BTreeSet::new()).unwrap()
    else {
        panic!("an empty VLAN pool creates")
    };
    let spec = claimed(
        &pool_address(r.network, ip, mac, "node-a"),
        "ns-p",
        "node-a",
        &r,
    );
    assert!(spec.dhcp && spec.reserved);
    assert_eq!(spec.vlan.as_ref().unwrap().tag, 116);
    let a = Address::new(&new_address_name(r.network, ip), spec);
    let pa = pod_addresses("node-a", std::slice::from_ref(&r), &[&a]).unwrap();
    assert_eq!(
        (pa[0].prefix_len, pa[0].vlan, pa[0].dhcp),
        (24, Some(116), true)
    );
    let (ports, skipped) = desired_ports([&a], &["node-a".to_string()].into());
    assert!(skipped.is_empty());
    assert_eq!(ports[0].marking.unwrap().dscp(), 14);
}

#[test]
fn a_requested_mac_held_by_another_is_refused() {
    let nets = vec![net()];
    let other = addr("node-a", 70, Some("ns-other"));
    let mac = other.spec.mac.clone();
    let all = [other];
    let refs: Vec<&Address> = all.iter().collect();
    let r = one(
        &nets,
        Some(&format!(
            r#"[{{"mode":"overlay","interface":{{"name":"eth0","mac":"{mac}"}}}}]"#
        )),
    );
    let e = decide("ns/p", "ns-p", "node-a", &r, &refs, &BTreeSet::new()).unwrap_err();
    assert_eq!(e.reason(), "AddressTaken");
}

#[test]
fn a_requested_mac_of_a_router_or_dhcp_server_is_refused() {
    let nets = vec![net(), vlan_net()];
    let ask = |mode: &str, mac: &str| {
        let json = match mode {
            "overlay" => {
                format!(r#"[{{"mode":"overlay","interface":{{"name":"eth0","mac":"{mac}"}}}}]"#)
            }
            _ => format!(
                r#"[{{"mode":"underlay","vlan":{{"tag":116}},"interface":{{"name":"eth0","mac":"{mac}"}}}}]"#
            ),
        };
        let r = one(&nets, Some(&json));
        decide("ns/p", "ns-p", "node-a", &r, &[], &BTreeSet::new())
    };
    for (mode, mac, what) in [
        ("overlay", "0a:58:64:40:00:01", "gateway"),
        ("overlay", "0a:58:a9:fe:00:01", "transit"),
        ("overlay", "0a:58:a9:fe:00:07", "transit"),
        ("underlay", "0a:00:00:d4:00:74", "DHCP server"),
    ] {
        let e = ask(mode, mac).unwrap_err();
        assert_eq!(e.reason(), "ReservedMac", "{mac}: {e}");
        assert!(e.to_string().contains(what), "{e}");
        assert!(e.is_bad_input());
    }
    // the same bytes where nothing uses them are a workload's to take
    assert!(ask("overlay", "0a:58:64:40:00:50").is_ok());
    assert!(ask("underlay", "0a:00:00:d4:00:75").is_ok());
}

#[test]
fn ports_come_from_live_addresses_on_known_nodes() {
    let mut live = addr("node-a", 80, Some("ns-a"));
    live.spec.service_class = Some("lowlatency".into());
    let mut deleted = addr("node-a", 81, Some("ns-b"));
    deleted.spec.deleted = true;
    let free = addr("node-a", 82, None);
    let elsewhere = addr("node-x", 83, Some("ns-c"));
    let (ports, skipped) = desired_ports(
        [&live, &deleted, &free, &elsewhere],
        &["node-a".to_string()].into(),
    );
    assert_eq!(ports.len(), 1);
    assert_eq!(ports[0].name, "ovl-100-64-0-80");
    assert_eq!(ports[0].marking.unwrap().dscp(), 22);
    assert_eq!(skipped.len(), 1);
    let nets = vec![net()];
    let r = one(&nets, None);
    let pa = pod_addresses("node-a", std::slice::from_ref(&r), &[&live]).unwrap();
    assert_eq!(pa[0].port, "ovl-100-64-0-80.node-a");
    assert_eq!(
        (
            pa[0].prefix_len,
            pa[0].gateway.to_string().as_str(),
            pa[0].mtu
        ),
        (32, "100.64.0.1", 1400)
    );
}

proptest! {
    /// Any sequence of pods claiming, leaving and coming back on random nodes, applied one
    /// decision at a time: no IP and no MAC is ever held twice, and an owner that comes back
    /// gets the same IP and MAC.
    #[test]
    fn claims_never_share_an_ip_and_owners_get_theirs_back(
        events in proptest::collection::vec((0u8..30, 0u8..3, any::<bool>()), 1..120)
    ) {
        let nets = vec![net()];
        let r = one(&nets, None);
        let mut store: BTreeMap<String, Address> = BTreeMap::new();
        let mut first: BTreeMap<String, (String, String)> = BTreeMap::new();
        for (pod, node, leave) in events {
            let owner = format!("ns-p{pod}");
            let node = format!("node-{node}");
            if leave {
                for a in store.values_mut().filter(|a| a.spec.owner.as_deref() == Some(owner.as_str())) {
                    a.spec.deleted = true;
                }
                continue;
            }
            let refs: Vec<&Address> = store.values().collect();
            let step = match decide("ns/p", &owner, &node, &r, &refs, &BTreeSet::new()) {
                Ok(s) => s,
                Err(Error::Exhausted { .. }) => continue,
                Err(e) => return Err(TestCaseError::fail(e.to_string())),
            };
            let (name, spec) = match step {
                Step::Reuse { name } | Step::Claim { name } => {
                    let spec = claimed(&store[&name].spec, &owner, &node, &r);
                    (name, spec)
                }
                Step::Create { ip, mac } => (
                    new_address_name(r.network, ip),
                    claimed(&pool_address(r.network, ip, mac, &node), &owner, &node, &r),
                ),
            };
            prop_assert!(store.get(&name).is_none_or(|a| a.spec.owner.as_ref().is_none_or(|o| o == &owner)));
            let got = (spec.ip.clone(), spec.mac.clone());
            if let Some(prev) = first.get(&owner) {
                prop_assert_eq!(prev, &got, "same IP and MAC back");
            } else {
                first.insert(owner.clone(), got);
            }
            store.insert(name.clone(), Address::new(&name, spec));
            let ips: BTreeSet<&str> = store.values().map(|a| a.spec.ip.as_str()).collect();
            let macs: BTreeSet<&str> = store.values().map(|a| a.spec.mac.as_str()).collect();
            prop_assert_eq!(ips.len(), store.len());
            prop_assert_eq!(macs.len(), store.len());
        }
    }
}

#[test]
fn the_ovn_port_is_per_node_on_the_overlay_and_one_on_a_vlan() {
    let mut spec: AddressSpec = serde_json::from_value(serde_json::json!({
        "network": "n", "ip": "100.64.0.5", "mac": "0a:58:64:40:00:05", "reserved": true
    }))
    .unwrap();
    assert_eq!(
        ovn_port(&spec, "n-100-64-0-5", "node-a"),
        "n-100-64-0-5.node-a"
    );
    assert_eq!(
        ovn_port(&spec, "n-100-64-0-5", "node-b"),
        "n-100-64-0-5.node-b"
    );
    spec.vlan = Some(AddressVlan {
        tag: 140,
        local_subnet: "100.142.140.0/24".into(),
    });
    assert_eq!(ovn_port(&spec, "n-100-64-0-5", "node-a"), "n-100-64-0-5");
    assert_eq!(ovn_port(&spec, "n-100-64-0-5", "node-b"), "n-100-64-0-5");
}

#[test]
fn a_default_interface_takes_the_one_network_that_admits_its_namespace() {
    let other = {
        let mut n = net();
        n.name = "ovl2".into();
        n
    };
    let nets = [net(), other];
    let admitting = |names: &[&str]| names.iter().map(|n| n.to_string()).collect();
    // another namespace's Network is no choice
    let r = resolve_for("ns/p", &BTreeMap::new(), &nets, &admitting(&["ovl2"])).unwrap();
    assert_eq!(r[0].network.name, "ovl2");
    // none or both admitting: still ambiguous, name one
    for a in [admitting(&[]), admitting(&["ovl", "ovl2"])] {
        let e = resolve_for("ns/p", &BTreeMap::new(), &nets, &a).unwrap_err();
        assert!(e.to_string().contains("name one"), "{a:?}: {e}");
    }
    // a named Network is taken as named (its access rules decide later, with their reason)
    let r = resolve_for(
        "ns/p",
        &ann(r#"[{"mode":"overlay","network":"ovl","interface":{"name":"eth0"}}]"#),
        &nets,
        &admitting(&["ovl2"]),
    )
    .unwrap();
    assert_eq!(r[0].network.name, "ovl");
}

#[test]
fn a_claim_writes_only_what_changes_and_records_the_pod() {
    let nets = [net()];
    let r = one(&nets, None);
    let recorded = |a: &Address| {
        a.metadata
            .annotations
            .as_ref()
            .and_then(|m| m.get(POD_ANNOTATION))
            .cloned()
    };
    // the owner's Address, already claimed here for this pod: nothing to write
    let mut mine = addr("node-a", 20, Some("ns:p"));
    mine.spec = claimed(&mine.spec, "ns:p", "node-a", &r);
    mine.metadata.annotations = Some([(POD_ANNOTATION.to_string(), "ns/p".to_string())].into());
    let reuse = Step::Reuse {
        name: mine.metadata.name.clone().unwrap(),
    };
    assert!(matches!(
        write_for(&reuse, Some(&mine), "ns/p", "ns:p", "node-a", &r),
        Some(Write::Nothing)
    ));
    // the same owner back on node-b: it moves there
    match write_for(&reuse, Some(&mine), "ns/p2", "ns:p", "node-b", &r) {
        Some(Write::Replace { address, moving }) => {
            assert!(moving);
            assert_eq!(address.spec.host.as_deref(), Some("node-b"));
            assert_eq!(recorded(&address).as_deref(), Some("ns/p2"));
        }
        other => panic!("{other:?}"),
    }
    // a pool Address: claimed in place, not a move
    let free = addr("node-a", 21, None);
    let claim = Step::Claim {
        name: free.metadata.name.clone().unwrap(),
    };
    match write_for(&claim, Some(&free), "ns/p", "ns:p", "node-a", &r) {
        Some(Write::Replace { address, moving }) => {
            assert!(!moving);
            assert!(address.spec.reserved && address.spec.owner.as_deref() == Some("ns:p"));
            assert_eq!(recorded(&address).as_deref(), Some("ns/p"));
        }
        other => panic!("{other:?}"),
    }
    // gone from the index meanwhile: decide again
    assert!(write_for(&claim, None, "ns/p", "ns:p", "node-a", &r).is_none());
    // a new Address: labelled with its Network, the pod recorded
    let ip = Ipv4Addr::new(100, 64, 0, 30);
    let create = Step::Create {
        ip,
        mac: mac_for_ip(ip),
    };
    match write_for(&create, None, "ns/p", "ns:p", "node-a", &r) {
        Some(Write::Create(a)) => {
            assert_eq!(a.spec.ip, "100.64.0.30");
            assert_eq!(
                a.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(NETWORK_LABEL)),
                Some(&"ovl".to_string())
            );
            assert_eq!(recorded(&a).as_deref(), Some("ns/p"));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_pod_is_annotated_only_when_its_addresses_change_or_an_error_is_shown() {
    let nets = [net()];
    let r = one(&nets, None);
    let mut a = addr("node-a", 20, Some("ns:p"));
    a.spec = claimed(&a.spec, "ns:p", "node-a", &r);
    let resolved = [r];
    let held = [&a];
    let (json, published) = publication("ns/p", "node-a", &resolved, &held, &BTreeMap::new())
        .unwrap()
        .expect("a new pod is annotated");
    assert_eq!(published.len(), 1);
    assert_eq!(published[0].ip.to_string(), "100.64.0.20");
    let done: BTreeMap<String, String> = [(ADDRESSES.to_string(), json.clone())].into();
    assert!(
        publication("ns/p", "node-a", &resolved, &held, &done)
            .unwrap()
            .is_none(),
        "already says so"
    );
    let mut refused = done.clone();
    refused.insert(
        roam_contract::keys::ERROR_ANNOTATION.into(),
        "an earlier refusal".into(),
    );
    let again = publication("ns/p", "node-a", &resolved, &held, &refused).unwrap();
    assert_eq!(again.map(|(j, _)| j), Some(json), "the error is cleared");
}
