//! Unit tests of [`diff`](super::diff): the operations are applied to an in-memory model of
//! the northbound tables that enforces what ovsdb-server would (strong references point at
//! existing rows, a child is referenced by exactly one parent, a row being deleted is no
//! longer referenced, unique names), so each test checks both the ops and their outcome.

use std::collections::{BTreeMap, BTreeSet};
use std::net::Ipv4Addr;

use roam_dhcp_opts::MacAddr;
use serde_json::{Map, Value, json};

use super::*;
use crate::topology::{NodeSpec, OverlaySpec, PortSpec, plan_overlay};
use roam_ovsdb::{TableRow, row_json};

const NET: &str = "ovl";

/// The tables the reconciler writes, as JSON rows by UUID.
#[derive(Clone, Debug, Default)]
struct Db {
    tables: BTreeMap<&'static str, BTreeMap<Uuid, Map<String, Value>>>,
    next: u128,
}

const TABLES: [&str; 8] = [
    "Logical_Switch",
    "Logical_Switch_Port",
    "Logical_Router",
    "Logical_Router_Port",
    "Logical_Router_Static_Route",
    "DHCP_Options",
    "QoS",
    "NAT",
];

/// (parent table, column, child table) of the strong references roam uses.
const REFS: [(&str, &str, &str); 5] = [
    ("Logical_Router", "nat", "NAT"),
    ("Logical_Switch", "ports", "Logical_Switch_Port"),
    ("Logical_Switch", "qos_rules", "QoS"),
    ("Logical_Router", "ports", "Logical_Router_Port"),
    (
        "Logical_Router",
        "static_routes",
        "Logical_Router_Static_Route",
    ),
];

fn to_rows<T: TableRow>(rows: &[T]) -> BTreeMap<Uuid, Map<String, Value>> {
    rows.iter()
        .map(|r| {
            let Value::Object(m) = row_json(r) else {
                unreachable!()
            };
            (r.uuid(), m)
        })
        .collect()
}

fn from_rows<T: TableRow>(rows: &BTreeMap<Uuid, Map<String, Value>>) -> Vec<T> {
    rows.iter()
        .map(|(u, r)| {
            let mut r = r.clone();
            r.insert("_uuid".into(), u.to_json());
            serde_json::from_value(Value::Object(r)).expect("row decodes")
        })
        .collect()
}

fn uuids(v: &Value) -> Vec<Uuid> {
    match v {
        Value::Array(a) if a.len() == 2 && a[0] == "set" => {
            a[1].as_array().unwrap().iter().flat_map(uuids).collect()
        }
        Value::Array(a) if a.len() == 2 && a[0] == "uuid" => vec![Uuid::from_json(v).unwrap()],
        _ => vec![],
    }
}

/// Replace `["named-uuid", n]` by the UUID given to `n`.
fn resolve(v: &mut Value, names: &BTreeMap<String, Uuid>) {
    if let Value::Object(m) = v {
        m.values_mut().for_each(|e| resolve(e, names));
    }
    if let Value::Array(a) = v {
        if a.len() == 2 && a[0] == "named-uuid" {
            let n = a[1].as_str().unwrap();
            *v = names
                .get(n)
                .unwrap_or_else(|| panic!("named-uuid {n} never inserted"))
                .to_json();
            return;
        }
        a.iter_mut().for_each(|e| resolve(e, names));
    }
}

fn named_refs(v: &Value) -> Vec<String> {
    match v {
        Value::Array(a) if a.len() == 2 && a[0] == "named-uuid" => {
            vec![a[1].as_str().unwrap().to_string()]
        }
        Value::Array(a) => a.iter().flat_map(named_refs).collect(),
        Value::Object(m) => m.values().flat_map(named_refs).collect(),
        _ => vec![],
    }
}

fn target(op: &Value) -> Uuid {
    let w = &op["where"];
    assert_eq!(w[0][0], "_uuid", "ops address rows by uuid: {op}");
    Uuid::from_json(&w[0][2]).unwrap()
}

impl Db {
    fn from_state(s: &ActualState) -> Db {
        let mut db = Db::default();
        db.tables.insert(TABLES[0], to_rows(&s.switches));
        db.tables.insert(TABLES[1], to_rows(&s.switch_ports));
        db.tables.insert(TABLES[2], to_rows(&s.routers));
        db.tables.insert(TABLES[3], to_rows(&s.router_ports));
        db.tables.insert(TABLES[4], to_rows(&s.routes));
        db.tables.insert(TABLES[5], to_rows(&s.dhcp_options));
        db.tables.insert(TABLES[6], to_rows(&s.qos));
        db.tables.insert(TABLES[7], to_rows(&s.nat));
        db.next = 1 + db.tables.values().map(BTreeMap::len).sum::<usize>() as u128 * 1000;
        db
    }

    fn state(&self) -> ActualState {
        ActualState {
            switches: from_rows(&self.tables[TABLES[0]]),
            switch_ports: from_rows(&self.tables[TABLES[1]]),
            routers: from_rows(&self.tables[TABLES[2]]),
            router_ports: from_rows(&self.tables[TABLES[3]]),
            routes: from_rows(&self.tables[TABLES[4]]),
            dhcp_options: from_rows(&self.tables[TABLES[5]]),
            qos: from_rows(&self.tables[TABLES[6]]),
            nat: from_rows(&self.tables[TABLES[7]]),
        }
    }

    fn table(&mut self, t: &str) -> &mut BTreeMap<Uuid, Map<String, Value>> {
        let key = TABLES.iter().find(|k| **k == t).expect("known table");
        self.tables.entry(key).or_default()
    }

    /// Apply a transaction like ovsdb-server would, or panic.
    fn apply(&mut self, ops: &[Value]) {
        let mut names = BTreeMap::new();
        for op in ops.iter().filter(|o| o["op"] == "insert") {
            self.next += 1;
            let name = op["uuid-name"].as_str().expect("inserts are named");
            assert!(
                names
                    .insert(name.to_string(), Uuid(uuid::Uuid::from_u128(self.next)))
                    .is_none(),
                "uuid-name {name} used twice"
            );
        }
        let mut deleted = BTreeSet::new();
        for op in ops {
            let mut op = op.clone();
            resolve(&mut op, &names);
            let table = op["table"].as_str().unwrap_or_default().to_string();
            match op["op"].as_str().unwrap() {
                "insert" => {
                    let u = names[op["uuid-name"].as_str().unwrap()];
                    let row = op["row"].as_object().unwrap().clone();
                    self.table(&table).insert(u, row);
                }
                "update" => {
                    let u = target(&op);
                    let row = self
                        .table(&table)
                        .get_mut(&u)
                        .unwrap_or_else(|| panic!("update of missing row {u}"));
                    for (k, v) in op["row"].as_object().unwrap() {
                        assert_ne!(k, "name", "names are identities, never updated");
                        row.insert(k.clone(), v.clone());
                    }
                }
                "mutate" => {
                    let u = target(&op);
                    let row = self
                        .table(&table)
                        .get_mut(&u)
                        .unwrap_or_else(|| panic!("mutate of missing row {u}"));
                    for m in op["mutations"].as_array().unwrap() {
                        let col = m[0].as_str().unwrap();
                        let mut set: BTreeSet<Uuid> =
                            uuids(row.get(col).unwrap_or(&json!(["set", []])))
                                .into_iter()
                                .collect();
                        for x in uuids(&m[2]) {
                            match m[1].as_str().unwrap() {
                                "insert" => set.insert(x),
                                "delete" => set.remove(&x),
                                other => panic!("mutator {other}"),
                            };
                        }
                        row.insert(
                            col.into(),
                            ops::set(set.iter().map(Uuid::to_json).collect()),
                        );
                    }
                }
                "delete" => {
                    let u = target(&op);
                    assert!(
                        self.table(&table).remove(&u).is_some(),
                        "delete of missing row {u}"
                    );
                    deleted.insert(u);
                }
                "comment" => {}
                other => panic!("unexpected op {other}"),
            }
        }
        self.check_integrity();
    }

    fn check_integrity(&self) {
        let mut parents: BTreeMap<Uuid, usize> = BTreeMap::new();
        for (pt, col, ct) in REFS {
            for row in self.tables[pt].values() {
                for u in uuids(row.get(col).unwrap_or(&json!(["set", []]))) {
                    assert!(
                        self.tables[ct].contains_key(&u),
                        "{pt}.{col} references missing {ct} row {u}"
                    );
                    *parents.entry(u).or_default() += 1;
                }
            }
        }
        for ct in [
            "Logical_Switch_Port",
            "Logical_Router_Port",
            "Logical_Router_Static_Route",
            "QoS",
            "NAT",
        ] {
            for u in self.tables[ct].keys() {
                assert_eq!(
                    parents.get(u).copied().unwrap_or(0),
                    1,
                    "{ct} row {u} must have exactly one parent"
                );
            }
        }
        for t in ["Logical_Switch_Port", "Logical_Router_Port"] {
            let names: Vec<&Value> = self.tables[t].values().map(|r| &r["name"]).collect();
            let unique: BTreeSet<String> = names.iter().map(|n| n.to_string()).collect();
            assert_eq!(names.len(), unique.len(), "{t} names are unique");
        }
        // weak reference: a deleted DHCP_Options row would vanish from the port; roam
        // never leaves one dangling
        for row in self.tables["Logical_Switch_Port"].values() {
            for u in uuids(row.get("dhcpv4_options").unwrap_or(&Value::Null)) {
                assert!(self.tables["DHCP_Options"].contains_key(&u));
            }
        }
    }
}

fn mac(s: &str) -> MacAddr {
    s.parse().unwrap()
}

fn spec() -> OverlaySpec {
    OverlaySpec {
        name: NET.into(),
        subnet: "100.64.0.0/16".parse().unwrap(),
        gateway: "100.64.0.1".parse().unwrap(),
        gateway_mac: mac("0a:00:00:00:00:01"),
        join_subnet: "169.254.100.0/24".parse().unwrap(),
        fabric_ip: "169.254.100.1".parse().unwrap(),
        fabric_mac: mac("0a:00:00:00:ff:01"),
        mtu: 1400,
        dns: vec!["10.96.0.10".parse().unwrap()],
    }
}

fn nodes() -> Vec<NodeSpec> {
    (0..2)
        .map(|i| NodeSpec {
            name: format!("node-{i}"),
            join_ip: Ipv4Addr::new(169, 254, 100, 10 + i),
            join_mac: MacAddr::new([0x0a, 0, 0, 0, 0xfe, i]),
        })
        .collect()
}

fn port(i: u8, node: &str) -> PortSpec {
    PortSpec {
        name: format!("p{i}"),
        mac: MacAddr::new([0x0a, 0x58, 0, 0, 0, i]),
        ip: Ipv4Addr::new(100, 64, 1, i),
        node: node.into(),
        also_on: vec![],
        dhcp: true,
        marking: (i == 1).then(|| "lowlatency".parse().unwrap()),
        mobile: false,
    }
}

fn plan(ports: &[PortSpec]) -> Topology {
    plan_overlay(&spec(), &nodes(), ports).unwrap()
}

/// The database after reconciling `t` from nothing.
fn applied(t: &Topology) -> Db {
    let mut db = Db::from_state(&ActualState::default());
    db.apply(&diff(&ActualState::default(), t, NET));
    db
}

fn ops_on<'v>(ops: &'v [Value], table: &str) -> Vec<&'v Value> {
    ops.iter().filter(|o| o["table"] == table).collect()
}

fn uuid_of(db: &Db, table: &str, column: &str, value: &str) -> Uuid {
    let hits: Vec<Uuid> = db.tables[table]
        .iter()
        .filter(|(_, r)| r[column] == value)
        .map(|(u, _)| *u)
        .collect();
    assert_eq!(hits.len(), 1, "{table} {column}={value}: {hits:?}");
    hits[0]
}

#[test]
fn from_nothing_everything_is_inserted_in_one_go() {
    let t = plan(&[port(1, "node-0"), port(2, "node-1")]);
    let ops = diff(&ActualState::default(), &t, NET);
    assert!(ops.iter().all(|o| o["op"] == "insert"), "{ops:#?}");
    let r = ReconcileReport::from_ops(&ops);
    let ins = |t: &str| r.table(t).inserted;
    assert_eq!(ins("Logical_Switch"), 4); // two node switches + join + mobile
    assert_eq!(ins("Logical_Router"), 3); // two node routers + fabric
    assert_eq!(ins("Logical_Router_Port"), 6);
    assert_eq!(ins("Logical_Switch_Port"), 3 + 3 + 2); // gw peers, join peers, workloads
    assert_eq!(ins("Logical_Router_Static_Route"), 4 + 2 + 2);
    assert_eq!(ins("DHCP_Options"), 2);
    assert_eq!(ins("QoS"), 1);
    assert_eq!(r.totals().updated + r.totals().deleted, 0);
    // every named-uuid is defined by an earlier insert
    let mut defined = BTreeSet::new();
    for o in &ops {
        for n in named_refs(&o["row"]) {
            assert!(defined.contains(&n), "{n} used before its insert: {o}");
        }
        defined.insert(o["uuid-name"].as_str().unwrap().to_string());
    }

    let db = applied(&t);
    let s = db.state();
    assert!(
        s.switches
            .iter()
            .chain(s.switches.iter())
            .all(|ls| ls.external_ids[OWNER_KEY] == NET)
    );
    let lsp = s
        .switch_ports
        .iter()
        .find(|p| p.name == "p1.node-0")
        .unwrap();
    assert_eq!(lsp.kind, "");
    assert_eq!(
        lsp.addresses.iter().collect::<Vec<_>>(),
        ["0a:58:00:00:00:01 100.64.1.1"]
    );
    assert_eq!(lsp.port_security, lsp.addresses);
    assert_eq!(lsp.options["requested-chassis"], "node-0");
    assert_eq!(lsp.external_ids[OWNER_KEY], NET);
    let dhcp = s
        .dhcp_options
        .iter()
        .find(|d| Some(d.uuid) == lsp.dhcpv4_options)
        .unwrap();
    assert_eq!(dhcp.cidr, "100.64.1.1/32");
    assert_eq!(dhcp.external_ids[PORT_KEY], "p1.node-0");
    assert_eq!(dhcp.options["router"], "100.64.0.1");
    let peer = s
        .switch_ports
        .iter()
        .find(|p| p.name == "ovl-node-0-gw")
        .unwrap();
    assert_eq!(peer.kind, "router");
    assert_eq!(peer.addresses.iter().collect::<Vec<_>>(), ["router"]);
    assert_eq!(peer.options["router-port"], "ovl-node-0-rtr-gw");
    let q = &s.qos[0];
    assert_eq!(
        (
            q.priority,
            &q.direction,
            q.match_.as_str(),
            q.action["dscp"]
        ),
        (
            100,
            &nb::QosDirection::FromLport,
            "inport == \"p1.node-0\"",
            22
        )
    );
    let ls0 = s.switches.iter().find(|l| l.name == "ovl-node-0").unwrap();
    assert!(ls0.qos_rules.contains(&q.uuid));
    let lrp = s
        .router_ports
        .iter()
        .find(|p| p.name == "ovl-fabric-join")
        .unwrap();
    assert_eq!(lrp.mac, "0a:00:00:00:ff:01");
    assert_eq!(
        lrp.networks.iter().collect::<Vec<_>>(),
        ["169.254.100.1/24"]
    );
    let local = s
        .routes
        .iter()
        .find(|r| r.ip_prefix == "100.64.1.1/32" && r.output_port.is_some())
        .unwrap();
    assert_eq!(local.nexthop, "100.64.1.1");
    assert_eq!(local.output_port.as_deref(), Some("ovl-node-0-rtr-gw"));
    let half = s
        .routes
        .iter()
        .find(|r| r.ip_prefix == "100.64.128.0/17")
        .unwrap();
    assert_eq!(
        (half.nexthop.as_str(), &half.output_port),
        ("169.254.100.1", &None)
    );
}

#[test]
fn the_same_plan_again_is_no_ops() {
    let t = plan(&[port(1, "node-0"), port(2, "node-1")]);
    let db = applied(&t);
    assert_eq!(diff(&db.state(), &t, NET), Vec::<Value>::new());
    assert!(ReconcileReport::from_ops(&[]).is_empty());
    // an empty plan deletes everything the network owns
    let mut db = db;
    let ops = diff(&db.state(), &Topology::default(), NET);
    assert!(ops.iter().all(|o| o["op"] == "delete"), "{ops:#?}");
    db.apply(&ops);
    assert!(db.state().is_empty());
}

#[test]
fn a_route_flip_is_exactly_three_route_changes() {
    let mut p2 = port(2, "node-1");
    p2.also_on = vec!["node-0".into()];
    let before = plan(&[port(1, "node-0"), p2.clone()]);
    let mut db = applied(&before);
    p2.node = "node-0".into();
    p2.also_on = vec!["node-1".into()];
    let after = plan(&[port(1, "node-0"), p2]);

    let ops = diff(&db.state(), &after, NET);
    let routes = ops_on(&ops, "Logical_Router_Static_Route");
    assert_eq!(routes.len(), 3, "{ops:#?}");
    let fabric_route = db.tables["Logical_Router_Static_Route"]
        .iter()
        .find(|(_, r)| r["ip_prefix"] == "100.64.1.2/32" && r["nexthop"] == "169.254.100.11")
        .map(|(u, _)| *u)
        .unwrap();
    let old_local = db.tables["Logical_Router_Static_Route"]
        .iter()
        .find(|(_, r)| r["ip_prefix"] == "100.64.1.2/32" && r["nexthop"] == "100.64.1.2")
        .map(|(u, _)| *u)
        .unwrap();
    let update = routes.iter().find(|o| o["op"] == "update").unwrap();
    assert_eq!(target(update), fabric_route);
    assert_eq!(update["row"], json!({"nexthop": "169.254.100.10"}));
    let delete = routes.iter().find(|o| o["op"] == "delete").unwrap();
    assert_eq!(target(delete), old_local);
    let insert = routes.iter().find(|o| o["op"] == "insert").unwrap();
    assert_eq!(insert["row"]["ip_prefix"], "100.64.1.2/32");
    assert_eq!(insert["row"]["nexthop"], "100.64.1.2");
    assert_eq!(insert["row"]["output_port"], "ovl-node-0-rtr-gw");
    // and the two routers' static_routes sets: nothing else
    let lr0 = uuid_of(&db, "Logical_Router", "name", "ovl-node-0-rtr");
    let lr1 = uuid_of(&db, "Logical_Router", "name", "ovl-node-1-rtr");
    let mutates = ops_on(&ops, "Logical_Router");
    assert_eq!(mutates.len(), 2, "{ops:#?}");
    for m in &mutates {
        assert_eq!(m["op"], "mutate");
        let (router, mutator) = (target(m), m["mutations"][0][1].as_str().unwrap());
        assert_eq!(m["mutations"].as_array().unwrap().len(), 1);
        assert_eq!(m["mutations"][0][0], "static_routes");
        match mutator {
            "insert" => assert_eq!(router, lr0),
            "delete" => {
                assert_eq!(router, lr1);
                assert_eq!(uuids(&m["mutations"][0][2]), [old_local]);
            }
            other => panic!("{other}"),
        }
    }
    assert_eq!(ops.len(), 5, "{ops:#?}");
    let r = ReconcileReport::from_ops(&ops);
    assert_eq!(
        r.table("Logical_Router_Static_Route"),
        TableCounts {
            inserted: 1,
            updated: 1,
            deleted: 1
        }
    );
    assert_eq!(r.table("Logical_Router").updated, 2);

    db.apply(&ops);
    assert!(diff(&db.state(), &after, NET).is_empty());
}

#[test]
fn a_removed_port_takes_its_dhcp_options_and_qos_along() {
    let mut db = applied(&plan(&[port(1, "node-0"), port(2, "node-1")]));
    let lsp = uuid_of(&db, "Logical_Switch_Port", "name", "p1.node-0");
    let dhcp = uuid_of(&db, "DHCP_Options", "cidr", "100.64.1.1/32");
    let qos = uuid_of(&db, "QoS", "match", "inport == \"p1.node-0\"");
    let ls0 = uuid_of(&db, "Logical_Switch", "name", "ovl-node-0");

    let after = plan(&[port(2, "node-1")]);
    let ops = diff(&db.state(), &after, NET);
    let deletes: BTreeSet<(String, Uuid)> = ops
        .iter()
        .filter(|o| o["op"] == "delete")
        .map(|o| (o["table"].as_str().unwrap().to_string(), target(o)))
        .collect();
    for (t, u) in [
        ("Logical_Switch_Port", lsp),
        ("DHCP_Options", dhcp),
        ("QoS", qos),
    ] {
        assert!(
            deletes.contains(&(t.to_string(), u)),
            "{t} deleted: {ops:#?}"
        );
    }
    let unref: Vec<(String, Vec<Uuid>)> = ops_on(&ops, "Logical_Switch")
        .iter()
        .map(|o| {
            assert_eq!((o["op"].as_str(), target(o)), (Some("mutate"), ls0));
            let m = &o["mutations"][0];
            assert_eq!(m[1], "delete");
            (m[0].as_str().unwrap().to_string(), uuids(&m[2]))
        })
        .collect();
    assert_eq!(
        unref,
        [
            ("ports".to_string(), vec![lsp]),
            ("qos_rules".to_string(), vec![qos])
        ]
    );
    // its two /32 routes go too; nothing is inserted or updated
    assert_eq!(ops_on(&ops, "Logical_Router_Static_Route").len(), 2);
    assert!(
        ops.iter()
            .all(|o| o["op"] == "delete" || o["op"] == "mutate")
    );
    let r = ReconcileReport::from_ops(&ops);
    assert_eq!(r.table("Logical_Switch_Port").deleted, 1);
    assert_eq!(r.table("DHCP_Options").deleted, 1);
    assert_eq!(r.table("QoS").deleted, 1);
    assert_eq!(r.table("Logical_Switch").updated, 1);

    db.apply(&ops);
    assert!(diff(&db.state(), &after, NET).is_empty());
}

#[test]
fn changed_columns_are_updated_in_place_and_foreign_rows_are_left_alone() {
    let t = plan(&[port(1, "node-0"), port(2, "node-1")]);
    let mut db = applied(&t);
    let ls0 = uuid_of(&db, "Logical_Switch", "name", "ovl-node-0");
    // a foreign port in our switch (not owned: not part of the actual state roam reads)
    let foreign = Uuid(uuid::Uuid::from_u128(
        0xf0f0_f0f0_f0f0_f0f0_f0f0_f0f0_f0f0_f0f0,
    ));
    let mut s = db.state();
    s.switches
        .iter_mut()
        .find(|l| l.uuid == ls0)
        .unwrap()
        .ports
        .insert(foreign);
    // someone's extra external_ids key on a switch survives, a drifted column is repaired
    s.switches[0]
        .external_ids
        .insert("other".into(), "x".into());
    let p2 = s
        .switch_ports
        .iter_mut()
        .find(|p| p.name == "p2.node-1")
        .unwrap();
    p2.options
        .insert("requested-chassis".into(), "elsewhere".into());

    let mut spec2 = spec();
    spec2.mtu = 1300;
    let t2 = plan_overlay(&spec2, &nodes(), &[port(1, "node-0"), port(2, "node-1")]).unwrap();
    let ops = diff(&s, &t2, NET);
    assert!(ops.iter().all(|o| o["op"] == "update"), "{ops:#?}");
    assert!(
        !Value::from(ops.clone())
            .to_string()
            .contains(&foreign.to_string())
    );
    let dhcp = ops_on(&ops, "DHCP_Options");
    assert_eq!(dhcp.len(), 2);
    assert!(
        dhcp.iter()
            .all(|o| o["row"]["options"].to_string().contains("1300"))
    );
    let lsp = ops_on(&ops, "Logical_Switch_Port");
    assert_eq!(lsp.len(), 1);
    assert_eq!(
        lsp[0]["row"],
        json!({"options": ["map", [["requested-chassis", "node-1"]]]})
    );
    assert_eq!(ops.len(), 3, "{ops:#?}");
    db.apply(&ops);
}

#[test]
fn garbage_switches_routers_and_duplicates_are_deleted() {
    let t = plan(&[port(1, "node-0")]);
    let mut db = applied(&t);
    // a second owned switch with the same name, and a leftover router of a gone node
    let extra = diff(
        &ActualState::default(),
        &Topology {
            switches: [(
                "ovl-node-0".to_string(),
                crate::topology::LogicalSwitch {
                    name: "ovl-node-0".into(),
                    ..Default::default()
                },
            )]
            .into(),
            routers: [(
                "ovl-node-9".to_string(),
                crate::topology::LogicalRouter {
                    name: "ovl-node-9".into(),
                    routes: [StaticRoute {
                        ip_prefix: "100.64.0.0/17".parse().unwrap(),
                        nexthop: "169.254.100.1".parse().unwrap(),
                        output_port: None,
                    }]
                    .into(),
                    ..Default::default()
                },
            )]
            .into(),
        },
        NET,
    );
    db.apply(&extra);
    let ops = diff(&db.state(), &t, NET);
    let r = ReconcileReport::from_ops(&ops);
    assert_eq!(r.table("Logical_Switch").deleted, 1, "{ops:#?}");
    assert_eq!(r.table("Logical_Router").deleted, 1);
    assert_eq!(r.table("Logical_Router_Static_Route").deleted, 1);
    assert_eq!(r.totals().inserted, 0);
    db.apply(&ops);
    assert!(diff(&db.state(), &t, NET).is_empty());
    assert_eq!(db.state().switches.len(), 4);
}

#[test]
fn the_report_counts_rows_once() {
    let u = |n: u128| Uuid(uuid::Uuid::from_u128(n)).to_json();
    let w = |n| vec![ops::cond("_uuid", "==", u(n))];
    let ops = vec![
        ops::insert("QoS", json!({}), Some("a")),
        ops::update("Logical_Switch", w(1), json!({})),
        ops::mutate("Logical_Switch", w(1), vec![]),
        ops::mutate("Logical_Switch", w(2), vec![]),
        ops::update("QoS", w(3), json!({})),
        ops::delete("QoS", w(3)),
        ops::comment("x"),
    ];
    let r = ReconcileReport::from_ops(&ops);
    assert_eq!(
        r.table("Logical_Switch"),
        TableCounts {
            inserted: 0,
            updated: 2,
            deleted: 0
        }
    );
    assert_eq!(
        r.table("QoS"),
        TableCounts {
            inserted: 1,
            updated: 0,
            deleted: 1
        }
    );
    assert_eq!(r.to_string(), "Logical_Switch +0 ~2 -0, QoS +1 ~0 -1");
    assert_eq!(ReconcileReport::default().to_string(), "no changes");
}

#[test]
fn check_refuses_what_ovn_cannot_realize() {
    let network = "ovl";
    let ok = |t: &Topology| check(t, network);
    let invalid = |r: Result<()>| match r {
        Err(crate::Error::InvalidTopology { reason, .. }) => reason,
        other => panic!("expected InvalidTopology, got {other:?}"),
    };
    // the planner's own output is realizable
    let t = plan(&[port(1, "node-0")]);
    ok(&t).expect("unique names");

    let mut clash = t.clone();
    clash.switches.get_mut("ovl-join").unwrap().ports.insert(
        "ovl-fabric-join".into(),
        SwitchPort {
            name: "ovl-fabric-join".into(),
            kind: SwitchPortKind::Router {
                router_port: "ovl-fabric-join".into(),
            },
        },
    );
    let reason = invalid(ok(&clash));
    assert!(
        reason.contains("\"ovl-fabric-join\"") && reason.contains("switch ovl-join"),
        "{reason}"
    );

    let mut dangling = t.clone();
    if let Some(SwitchPort {
        kind: SwitchPortKind::Router { router_port },
        ..
    }) = dangling
        .switches
        .get_mut("ovl-join")
        .unwrap()
        .ports
        .get_mut("ovl-join-ovl-fabric")
    {
        *router_port = "nowhere".into();
    }
    assert!(invalid(ok(&dangling)).contains("nowhere"));

    let mut wrong_out = t.clone();
    wrong_out
        .routers
        .get_mut("ovl-fabric")
        .unwrap()
        .routes
        .insert(StaticRoute {
            ip_prefix: "100.64.9.9/32".parse().unwrap(),
            nexthop: "169.254.100.10".parse().unwrap(),
            output_port: Some("ovl-node-0-rtr-gw".into()),
        });
    assert!(invalid(ok(&wrong_out)).contains("ovl-node-0-rtr-gw"));

    let mut dscp = t.clone();
    dscp.switches
        .get_mut("ovl-node-0")
        .unwrap()
        .qos
        .insert(QosRule {
            r#match: "inport == \"p1.node-0\"".into(),
            dscp: 64,
        });
    assert!(invalid(ok(&dscp)).contains("DSCP 64"));
    dscp.switches.get_mut("ovl-node-0").unwrap().qos = [QosRule {
        r#match: "inport == \"p1.node-0\"".into(),
        dscp: 63,
    }]
    .into();
    ok(&dscp).expect("DSCP 63 is one");
}

// ---- the VLAN underlay ----

fn vlan_spec() -> crate::topology::UnderlaySpec {
    crate::topology::UnderlaySpec {
        name: NET.into(),
        vlan: 116,
        subnet: "192.0.2.0/24".parse().unwrap(),
        gateway: "192.0.2.1".parse().unwrap(),
        physnet: "physnet1".into(),
        mtu: 1500,
        dns: vec![],
    }
}

fn vlan_port(i: u8, node: &str) -> PortSpec {
    PortSpec {
        name: format!("w{i}"),
        mac: MacAddr::new([0x0a, 0x58, 0xc0, 0, 2, i]),
        ip: Ipv4Addr::new(192, 0, 2, 10 + i),
        node: node.into(),
        also_on: vec![],
        dhcp: i % 2 == 1,
        marking: None,
        mobile: false,
    }
}

fn vlan_plan(ports: &[PortSpec]) -> Topology {
    let t = crate::topology::plan_underlay(&vlan_spec(), ports).unwrap();
    check(&t, NET).expect("realizable");
    t
}

#[test]
fn a_vlan_network_lands_with_a_tagged_localnet_port() {
    let t = vlan_plan(&[vlan_port(1, "node-0"), vlan_port(2, "node-1")]);
    let ops = diff(&ActualState::default(), &t, NET);
    assert!(ops.iter().all(|o| o["op"] == "insert"), "{ops:#?}");
    let r = ReconcileReport::from_ops(&ops);
    assert_eq!(r.table("Logical_Switch").inserted, 1);
    assert_eq!(r.table("Logical_Switch_Port").inserted, 3);
    assert_eq!(r.table("DHCP_Options").inserted, 1);
    assert_eq!(r.totals().inserted, 5);
    let ln_op = ops_on(&ops, "Logical_Switch_Port")
        .into_iter()
        .find(|o| o["row"]["name"] == "ovl-ln")
        .unwrap();
    assert_eq!(ln_op["row"]["tag"], json!(116));
    // workload ports carry no tag column at all
    assert!(
        ops_on(&ops, "Logical_Switch_Port")
            .iter()
            .filter(|o| o["row"]["name"] != "ovl-ln")
            .all(|o| o["row"].get("tag").is_none())
    );

    let db = applied(&t);
    let s = db.state();
    assert_eq!(s.switches.len(), 1);
    assert_eq!(s.switches[0].name, "ovl-vlan116");
    assert_eq!(s.switches[0].ports.len(), 3);
    let ln = s.switch_ports.iter().find(|p| p.name == "ovl-ln").unwrap();
    assert_eq!(ln.kind, "localnet");
    assert_eq!(ln.addresses.iter().collect::<Vec<_>>(), ["unknown"]);
    assert!(ln.port_security.is_empty());
    assert_eq!(ln.options.len(), 1);
    assert_eq!(ln.options["network_name"], "physnet1");
    assert_eq!(ln.tag, Some(116));
    assert_eq!(ln.dhcpv4_options, None);
    assert_eq!(ln.external_ids[OWNER_KEY], NET);
    let w1 = s.switch_ports.iter().find(|p| p.name == "w1").unwrap();
    assert_eq!(w1.kind, "");
    assert_eq!(w1.tag, None);
    assert_eq!(
        w1.addresses.iter().collect::<Vec<_>>(),
        ["0a:58:c0:00:02:01 192.0.2.11"]
    );
    assert_eq!(w1.options["requested-chassis"], "node-0");
    let dhcp = s
        .dhcp_options
        .iter()
        .find(|d| Some(d.uuid) == w1.dhcpv4_options)
        .unwrap();
    assert_eq!(dhcp.cidr, "192.0.2.0/24");
    assert_eq!(dhcp.options["router"], "192.0.2.1");
    assert_eq!(dhcp.external_ids[PORT_KEY], "w1");
    let w2 = s.switch_ports.iter().find(|p| p.name == "w2").unwrap();
    assert_eq!(w2.dhcpv4_options, None);

    // the same plan again: nothing
    assert_eq!(diff(&s, &t, NET), Vec::<Value>::new());
}

#[test]
fn a_drifted_localnet_port_is_repaired_column_by_column() {
    let t = vlan_plan(&[vlan_port(1, "node-0")]);
    let mut db = applied(&t);
    let ln = uuid_of(&db, "Logical_Switch_Port", "name", "ovl-ln");
    for drift in [Some(200), None] {
        let mut s = db.state();
        let row = s.switch_ports.iter_mut().find(|p| p.uuid == ln).unwrap();
        row.tag = drift;
        let ops = diff(&s, &t, NET);
        assert_eq!(ops.len(), 1, "{ops:#?}");
        assert_eq!(target(&ops[0]), ln);
        assert_eq!(ops[0]["row"], json!({"tag": 116}), "tag {drift:?}");
    }
    // someone turned it into a plain port on another physnet: every column comes back
    let mut s = db.state();
    let row = s.switch_ports.iter_mut().find(|p| p.uuid == ln).unwrap();
    row.kind = String::new();
    row.addresses = Default::default();
    row.options = [("network_name".to_string(), "other".to_string())].into();
    let ops = diff(&s, &t, NET);
    assert_eq!(ops.len(), 1, "{ops:#?}");
    assert_eq!(
        ops[0]["row"],
        json!({
            "type": "localnet",
            "addresses": ["set", ["unknown"]],
            "options": ["map", [["network_name", "physnet1"]]],
        })
    );

    // a plan that drops the tag (an untagged physical network) clears the column
    let mut untagged = t.clone();
    let ls = untagged.switches.get_mut("ovl-vlan116").unwrap();
    ls.ports.get_mut("ovl-ln").unwrap().kind = SwitchPortKind::Localnet {
        network_name: "physnet1".into(),
        tag: None,
    };
    let ops = diff(&db.state(), &untagged, NET);
    assert_eq!(ops.len(), 1, "{ops:#?}");
    assert_eq!(ops[0]["row"], json!({"tag": ["set", []]}));
    db.apply(&ops);
    assert_eq!(
        db.state()
            .switch_ports
            .iter()
            .find(|p| p.uuid == ln)
            .unwrap()
            .tag,
        None
    );
    assert!(diff(&db.state(), &untagged, NET).is_empty());
}

#[test]
fn moving_a_network_to_another_vlan_replaces_its_switch_in_one_go() {
    let t = vlan_plan(&[vlan_port(1, "node-0")]);
    let mut db = applied(&t);
    let mut s2 = vlan_spec();
    s2.vlan = 117;
    let t2 = crate::topology::plan_underlay(&s2, &[vlan_port(1, "node-0")]).unwrap();
    let ops = diff(&db.state(), &t2, NET);
    let r = ReconcileReport::from_ops(&ops);
    assert_eq!(
        r.table("Logical_Switch"),
        TableCounts {
            inserted: 1,
            updated: 0,
            deleted: 1
        }
    );
    assert_eq!(
        r.table("Logical_Switch_Port"),
        TableCounts {
            inserted: 2,
            updated: 0,
            deleted: 2
        }
    );
    // the DHCP row follows its port (same port name): kept, only its server MAC changes
    assert_eq!(
        r.table("DHCP_Options"),
        TableCounts {
            inserted: 0,
            updated: 1,
            deleted: 0
        }
    );
    let dhcp = ops_on(&ops, "DHCP_Options");
    assert!(
        dhcp[0]["row"]["options"]
            .to_string()
            .contains("0a:00:00:d4:00:75")
    );
    db.apply(&ops);
    let s = db.state();
    assert_eq!(s.switches[0].name, "ovl-vlan117");
    assert_eq!(
        s.switch_ports
            .iter()
            .find(|p| p.name == "ovl-ln")
            .unwrap()
            .tag,
        Some(117)
    );
    assert!(diff(&s, &t2, NET).is_empty());
}

#[test]
fn a_migrating_vlan_port_is_multi_chassis_with_rarp_activation_then_single_again() {
    let mut p = vlan_port(1, "node-0");
    p.also_on = vec!["node-1".into()];
    let t = vlan_plan(std::slice::from_ref(&p));
    let mut db = applied(&t);
    let w1 = db
        .state()
        .switch_ports
        .into_iter()
        .find(|x| x.name == "w1")
        .unwrap();
    assert_eq!(w1.options["requested-chassis"], "node-0,node-1");
    assert_eq!(w1.options["activation-strategy"], "rarp");
    assert!(diff(&db.state(), &t, NET).is_empty(), "idempotent");

    // switchover complete: the same row, target only, no activation strategy
    p.node = "node-1".into();
    p.also_on.clear();
    let after = vlan_plan(&[p]);
    let ops = diff(&db.state(), &after, NET);
    assert_eq!(ops.len(), 1, "{ops:#?}");
    assert_eq!(ops[0]["op"], "update");
    assert_eq!(target(&ops[0]), w1.uuid);
    assert_eq!(
        ops[0]["row"],
        json!({"options": ["map", [["requested-chassis", "node-1"]]]})
    );
    db.apply(&ops);
    assert!(diff(&db.state(), &after, NET).is_empty());
}

// ---- egress and management ports ----

fn egress() -> crate::topology::EgressSpec {
    crate::topology::EgressSpec {
        vlan: 300,
        physnet: "physnet1".into(),
        subnet: "198.51.100.0/24".parse().unwrap(),
        gateway: "198.51.100.1".parse().unwrap(),
        router_ip: "198.51.100.5".parse().unwrap(),
        router_mac: mac("0a:00:00:00:e5:01"),
        join_ip: "169.254.100.2".parse().unwrap(),
        join_mac: mac("0a:00:00:00:e5:02"),
        chassis: "node-1".into(),
    }
}

fn mgmt(node: u8) -> crate::topology::MgmtPort {
    crate::topology::MgmtPort {
        node: format!("node-{node}"),
        ip: Ipv4Addr::new(100, 64, 0, 10 + node),
        mac: MacAddr::new([0x0a, 0, 0, 0, 0x4d, node]),
    }
}

fn plan_with(ports: &[PortSpec], extras: &crate::topology::OverlayExtras) -> Topology {
    let t = crate::topology::plan_overlay_with(&spec(), &nodes(), ports, extras).unwrap();
    check(&t, NET).expect("realizable");
    t
}

fn full_extras() -> crate::topology::OverlayExtras {
    crate::topology::OverlayExtras {
        egress: Some(egress()),
        mgmt: vec![mgmt(0), mgmt(1)],
    }
}

#[test]
fn egress_lands_as_a_gateway_router_with_snat_and_a_second_reconcile_is_a_no_op() {
    let t = plan_with(&[port(1, "node-0")], &full_extras());
    let ops = diff(&ActualState::default(), &t, NET);
    let nat = ops_on(&ops, "NAT");
    assert_eq!(nat.len(), 1);
    assert_eq!(nat[0]["row"]["type"], "snat");
    assert_eq!(nat[0]["row"]["external_ip"], "198.51.100.5");
    assert_eq!(nat[0]["row"]["logical_ip"], "100.64.0.0/16");
    assert_eq!(
        nat[0]["row"]["external_ids"],
        json!(["map", [[OWNER_KEY, NET]]])
    );
    let db = applied(&t);
    let s = db.state();
    let gr = s
        .routers
        .iter()
        .find(|r| r.name == "ovl-vlan300-rtr")
        .unwrap();
    assert_eq!(gr.options["chassis"], "node-1");
    assert_eq!(gr.nat.len(), 1);
    let route = |router: &str, prefix: &str| {
        let lr = s.routers.iter().find(|r| r.name == router).unwrap();
        s.routes
            .iter()
            .filter(|r| lr.static_routes.contains(&r.uuid) && r.ip_prefix == prefix)
            .map(|r| r.nexthop.clone())
            .collect::<Vec<_>>()
    };
    // node router → fabric → VLAN router → VLAN gateway; back: subnet → fabric
    assert_eq!(route("ovl-node-0-rtr", "0.0.0.0/0"), ["169.254.100.1"]);
    assert_eq!(route("ovl-node-1-rtr", "0.0.0.0/0"), ["169.254.100.1"]);
    assert_eq!(route("ovl-fabric", "0.0.0.0/0"), ["169.254.100.2"]);
    assert_eq!(route("ovl-vlan300-rtr", "0.0.0.0/0"), ["198.51.100.1"]);
    assert_eq!(route("ovl-vlan300-rtr", "100.64.0.0/16"), ["169.254.100.1"]);
    // management ports: an LSP on the node's switch, routed like a workload
    let m0 = s
        .switch_ports
        .iter()
        .find(|p| p.name == "ovl-node-0-mgmt")
        .unwrap();
    assert_eq!(
        m0.addresses.iter().collect::<Vec<_>>(),
        ["0a:00:00:00:4d:00 100.64.0.10"]
    );
    assert_eq!(m0.options["requested-chassis"], "node-0");
    assert_eq!(m0.dhcpv4_options, None);
    assert_eq!(route("ovl-node-1-rtr", "100.64.0.11/32"), ["100.64.0.11"]);
    assert_eq!(route("ovl-fabric", "100.64.0.11/32"), ["169.254.100.11"]);
    let ln = s.switch_ports.iter().find(|p| p.name == "ovl-ln").unwrap();
    assert_eq!(ln.tag, Some(300));
    // every row is owned
    assert!(s.nat.iter().all(|r| r.external_ids[OWNER_KEY] == NET));
    assert!(s.routers.iter().all(|r| r.external_ids[OWNER_KEY] == NET));

    assert!(
        diff(&s, &t, NET).is_empty(),
        "a second reconcile is a no-op"
    );
}

#[test]
fn a_changed_egress_is_updated_in_place_and_a_removed_one_is_deleted_whole() {
    let before = plan_with(&[port(1, "node-0")], &full_extras());
    let mut db = applied(&before);
    let nat = db.state().nat[0].uuid;
    let mut e = egress();
    e.router_ip = "198.51.100.6".parse().unwrap();
    e.chassis = "node-0".into();
    let moved = plan_with(
        &[port(1, "node-0")],
        &crate::topology::OverlayExtras {
            egress: Some(e),
            mgmt: vec![mgmt(0), mgmt(1)],
        },
    );
    let ops = diff(&db.state(), &moved, NET);
    assert!(ops.iter().all(|o| o["op"] == "update"), "{ops:#?}");
    let n = ops_on(&ops, "NAT");
    assert_eq!(n.len(), 1);
    assert_eq!(target(n[0]), nat);
    assert_eq!(n[0]["row"], json!({"external_ip": "198.51.100.6"}));
    let lr = ops_on(&ops, "Logical_Router");
    assert_eq!(lr.len(), 1);
    assert_eq!(
        lr[0]["row"],
        json!({"options": ["map", [["chassis", "node-0"]]]})
    );
    assert_eq!(
        ops_on(&ops, "Logical_Router_Port").len(),
        1,
        "the VLAN port's address"
    );
    assert_eq!(ops.len(), 3, "{ops:#?}");
    db.apply(&ops);
    assert!(diff(&db.state(), &moved, NET).is_empty());

    // without egress: its router (with ports, routes, NAT), its switch and the default
    // routes go, in one transaction; the management ports stay
    let bare = plan_with(
        &[port(1, "node-0")],
        &crate::topology::OverlayExtras {
            egress: None,
            mgmt: vec![mgmt(0), mgmt(1)],
        },
    );
    let ops = diff(&db.state(), &bare, NET);
    let r = ReconcileReport::from_ops(&ops);
    assert_eq!(r.table("NAT").deleted, 1);
    assert_eq!(r.table("Logical_Router").deleted, 1);
    assert_eq!(r.table("Logical_Switch").deleted, 1);
    // 2 on the gateway router + 3 default routes (two node routers, the fabric)
    assert_eq!(r.table("Logical_Router_Static_Route").deleted, 5);
    assert_eq!(r.totals().inserted, 0);
    db.apply(&ops);
    let s = db.state();
    assert!(s.nat.is_empty());
    assert!(!s.routes.iter().any(|r| r.ip_prefix == "0.0.0.0/0"));
    assert!(s.switch_ports.iter().any(|p| p.name == "ovl-node-1-mgmt"));
    assert!(diff(&s, &bare, NET).is_empty());
    // and the bare plan of plan_overlay is the same as no extras
    assert!(diff(&s, &plan(&[port(1, "node-0")]), NET).len() > 1);
}

#[test]
fn a_foreign_nat_row_on_the_gateway_router_is_left_alone() {
    let t = plan_with(&[], &full_extras());
    let db = applied(&t);
    let mut s = db.state();
    let foreign = Uuid(uuid::Uuid::from_u128(0xfeed));
    s.routers
        .iter_mut()
        .find(|r| r.name == "ovl-vlan300-rtr")
        .unwrap()
        .nat
        .insert(foreign);
    let ops = diff(&s, &t, NET);
    assert!(ops.is_empty(), "{ops:#?}");
    // an owned NAT row nothing wants is removed from the router and deleted
    let mut extra = db.state();
    let gr = extra
        .routers
        .iter_mut()
        .find(|r| r.name == "ovl-vlan300-rtr")
        .unwrap();
    let stale = Uuid(uuid::Uuid::from_u128(0xbeef));
    gr.nat.insert(stale);
    extra.nat.push(roam_ovsdb::nb::Nat {
        uuid: stale,
        kind: roam_ovsdb::nb::NatType::Snat,
        external_ip: "198.51.100.9".into(),
        logical_ip: "100.64.0.0/17".into(),
        external_ids: [(OWNER_KEY.to_string(), NET.to_string())].into(),
    });
    let ops = diff(&extra, &t, NET);
    assert_eq!(ops.len(), 2, "{ops:#?}");
    assert!(
        ops.iter()
            .any(|o| o["op"] == "delete" && target(o) == stale)
    );
    assert!(ops.iter().any(|o| o["op"] == "mutate"
        && o["mutations"].to_string().contains(&stale.to_string())));
}

#[test]
fn check_refuses_snat_on_a_router_that_is_not_a_gateway_router() {
    let mut t = plan_with(&[], &full_extras());
    t.routers
        .get_mut("ovl-vlan300-rtr")
        .unwrap()
        .options
        .clear();
    match check(&t, NET) {
        Err(crate::Error::InvalidTopology { reason, .. }) => {
            assert!(reason.contains("ovl-vlan300-rtr"), "{reason}");
            assert!(reason.contains("options:chassis"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
}
