//! The reconciler's pure half: the difference ([`diff`]) between the rows one network owns
//! ([`ActualState`]) and a planned [`Topology`], as the operations of ONE transaction, and
//! the [`check`] that OVN can realize a plan at all (logical port names unique across switch
//! and router ports, peers and output ports that exist): ovn-northd would otherwise accept
//! the rows and silently drop a duplicate port. A diff of a plan against its own result is
//! empty. [`crate::northbound`] reads the rows and sends the operations.
//!
//! # Ownership
//!
//! Every row roam creates carries `external_ids:roam.dev/network=<network>` ([`OWNER_KEY`]),
//! and only such rows are read, changed or deleted. A foreign row inside an owned switch or
//! router (a port someone else added) is left alone; an owned child is only considered when
//! an owned parent references it. `DHCP_Options` rows also carry
//! `external_ids:roam.dev/port=<logical switch port>` ([`PORT_KEY`]), the port they serve.
//!
//! # Identity
//!
//! Rows are matched by name (switches, routers, their ports), by `match` within a switch
//! (QoS), by `ip_prefix` within a router (static routes), by `type` and `logical_ip` within a
//! router (NAT) and by the port they serve (DHCP options). A router's `options` are written
//! only when the plan names some (a gateway router's `chassis`). A matched row whose columns
//! differ is updated in place (only the differing columns are written), so a route flip is an update of the fabric route's
//! `nexthop`, a delete of the old node's local route and an insert of the new one. Owned rows
//! that are no longer wanted are deleted and, when they are children, removed from their
//! parent's set with a `mutate ... delete` (references to children are always mutated, never
//! overwritten, so foreign children survive).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt;

use roam_dhcp_opts::DhcpOptionsRow;
use serde_json::{Map, Value, json};

use super::overlay::{
    LogicalRouter, LogicalSwitch, QosRule, RouterPort, SnatRule, StaticRoute, SwitchPort,
    SwitchPortKind, Topology,
};
use roam_contract::keys::{OWNER_KEY, PORT_KEY};
use roam_ovsdb::nb::{self, RoutePolicy, StringMap};
use roam_ovsdb::{Uuid, ops};

use crate::Result;

/// Priority of roam's DSCP marking rules.
pub const QOS_PRIORITY: i64 = 100;

/// The northbound rows one network owns (those whose `external_ids` hold
/// [`OWNER_KEY`]`=<network>`), as read by [`read_actual`](crate::northbound::read_actual).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ActualState {
    /// `Logical_Switch` rows.
    pub switches: Vec<nb::LogicalSwitch>,
    /// `Logical_Switch_Port` rows.
    pub switch_ports: Vec<nb::LogicalSwitchPort>,
    /// `Logical_Router` rows.
    pub routers: Vec<nb::LogicalRouter>,
    /// `Logical_Router_Port` rows.
    pub router_ports: Vec<nb::LogicalRouterPort>,
    /// `Logical_Router_Static_Route` rows.
    pub routes: Vec<nb::LogicalRouterStaticRoute>,
    /// `DHCP_Options` rows.
    pub dhcp_options: Vec<nb::DhcpOptions>,
    /// `QoS` rows.
    pub qos: Vec<nb::Qos>,
    /// `NAT` rows.
    pub nat: Vec<nb::Nat>,
}

impl ActualState {
    /// Whether the network owns no row at all.
    pub fn is_empty(&self) -> bool {
        self.switches.is_empty()
            && self.switch_ports.is_empty()
            && self.routers.is_empty()
            && self.router_ports.is_empty()
            && self.routes.is_empty()
            && self.dhcp_options.is_empty()
            && self.qos.is_empty()
            && self.nat.is_empty()
    }
}

/// Rows inserted, updated and deleted in one table.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TableCounts {
    /// Rows inserted.
    pub inserted: usize,
    /// Rows updated or mutated (each row counted once).
    pub updated: usize,
    /// Rows deleted.
    pub deleted: usize,
}

impl TableCounts {
    /// Whether nothing changed.
    pub fn is_empty(&self) -> bool {
        self.inserted == 0 && self.updated == 0 && self.deleted == 0
    }
}

/// What a reconcile changed, per table (only tables with changes are listed).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReconcileReport {
    /// Counts by table name.
    pub tables: BTreeMap<String, TableCounts>,
}

impl ReconcileReport {
    /// The counts of a transaction's operations: an `insert` inserts one row, a `delete` or
    /// `update`/`mutate` whose `where` is `_uuid == X` affects row X (a row both modified and
    /// deleted counts as deleted).
    pub fn from_ops(ops: &[Value]) -> ReconcileReport {
        let mut report = ReconcileReport::default();
        let mut updated: BTreeSet<(String, String)> = BTreeSet::new();
        let mut deleted: BTreeSet<(String, String)> = BTreeSet::new();
        for op in ops {
            let (Some(kind), Some(table)) = (
                op.get("op").and_then(Value::as_str),
                op.get("table").and_then(Value::as_str),
            ) else {
                continue;
            };
            let target = target_uuid(op).unwrap_or_else(|| op["where"].to_string());
            match kind {
                "insert" => report.entry(table).inserted += 1,
                "update" | "mutate" => {
                    updated.insert((table.to_string(), target));
                }
                "delete" => {
                    deleted.insert((table.to_string(), target));
                }
                _ => {}
            }
        }
        for (table, _) in updated.difference(&deleted) {
            report.entry(table).updated += 1;
        }
        for (table, _) in &deleted {
            report.entry(table).deleted += 1;
        }
        report
    }

    fn entry(&mut self, table: &str) -> &mut TableCounts {
        self.tables.entry(table.to_string()).or_default()
    }

    /// The counts of `table` (zero when it did not change).
    pub fn table(&self, table: &str) -> TableCounts {
        self.tables.get(table).copied().unwrap_or_default()
    }

    /// The counts over all tables.
    pub fn totals(&self) -> TableCounts {
        self.tables
            .values()
            .fold(TableCounts::default(), |a, c| TableCounts {
                inserted: a.inserted + c.inserted,
                updated: a.updated + c.updated,
                deleted: a.deleted + c.deleted,
            })
    }

    /// Whether nothing changed.
    pub fn is_empty(&self) -> bool {
        self.tables.values().all(TableCounts::is_empty)
    }
}

impl fmt::Display for ReconcileReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return f.write_str("no changes");
        }
        let mut first = true;
        for (table, c) in self.tables.iter().filter(|(_, c)| !c.is_empty()) {
            if !first {
                f.write_str(", ")?;
            }
            first = false;
            write!(f, "{table} +{} ~{} -{}", c.inserted, c.updated, c.deleted)?;
        }
        Ok(())
    }
}

/// The row UUID of an operation whose `where` is exactly `[["_uuid", "==", ["uuid", X]]]`.
fn target_uuid(op: &Value) -> Option<String> {
    match op.get("where")?.as_array()?.as_slice() {
        [c] => match c.as_array()?.as_slice() {
            [Value::String(col), Value::String(f), v] if col == "_uuid" && f == "==" => {
                Some(Uuid::from_json(v).ok()?.to_string())
            }
            _ => None,
        },
        _ => None,
    }
}

/// Check that OVN can realize `desired`: logical port names are unique across all switch
/// AND router ports (ovn-northd binds ports by name in one namespace and ignores a
/// duplicate with only a warning, leaving a silently broken datapath), every router-type
/// switch port names a router port of the plan, every route's output port is a port of
/// its router, and every QoS rule's DSCP is one (0..=63: the NB schema bounds it only up to
/// 23.x; later schemas take any 32-bit value for `action`, shared with `mark`).
/// [`reconcile`](crate::northbound::reconcile) refuses a failing plan with
/// [`Error::InvalidTopology`](crate::Error::InvalidTopology) before sending anything.
pub fn check(desired: &Topology, network: &str) -> Result<()> {
    let invalid = |reason: String| {
        Err(crate::Error::InvalidTopology {
            network: network.to_string(),
            reason,
        })
    };
    let mut owners: BTreeMap<&str, String> = BTreeMap::new();
    let switch_ports = desired.switches.values().flat_map(|ls| {
        ls.ports
            .keys()
            .map(move |p| (p, format!("switch {}", ls.name)))
    });
    let router_ports = desired.routers.values().flat_map(|lr| {
        lr.ports
            .keys()
            .map(move |p| (p, format!("router {}", lr.name)))
    });
    for (port, owner) in switch_ports.chain(router_ports) {
        if let Some(first) = owners.insert(port, owner.clone()) {
            return invalid(format!(
                "logical port name {port:?} is used by {first} and by {owner}; OVN needs \
                 names unique across all switch and router ports"
            ));
        }
    }
    for ls in desired.switches.values() {
        for p in ls.ports.values() {
            if let SwitchPortKind::Router { router_port } = &p.kind
                && !desired
                    .routers
                    .values()
                    .any(|lr| lr.ports.contains_key(router_port))
            {
                return invalid(format!(
                    "switch port {} peers with router port {router_port:?}, which no router has",
                    p.name
                ));
            }
        }
    }
    for ls in desired.switches.values() {
        if let Some(q) = ls.qos.iter().find(|q| q.dscp > 63) {
            return invalid(format!(
                "switch {} marks {} with DSCP {}; a DSCP is 0..=63",
                ls.name, q.r#match, q.dscp
            ));
        }
    }
    for lr in desired.routers.values() {
        if !lr.snat.is_empty() && !lr.options.contains_key("chassis") {
            return invalid(format!(
                "router {} has SNAT rules but is not a gateway router (no options:chassis); \
                 OVN would ignore them",
                lr.name
            ));
        }
        for r in &lr.routes {
            if let Some(out) = &r.output_port
                && !lr.ports.contains_key(out)
            {
                return invalid(format!(
                    "route {} on router {} leaves through {out:?}, not a port of that router",
                    r.ip_prefix, lr.name
                ));
            }
        }
    }
    Ok(())
}

/// The operations that turn `actual` (the rows `network` owns) into `desired`: inserts
/// first, then updates and mutations, then deletes. Empty when nothing differs.
pub fn diff(actual: &ActualState, desired: &Topology, network: &str) -> Vec<Value> {
    let mut d = Differ::new(actual, network);
    d.switches(desired);
    d.routers(desired);
    d.garbage_dhcp();
    d.finish()
}

/// A reference to a row: an existing one, or one inserted by the same transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
enum RowRef {
    Existing(Uuid),
    New(String),
}

impl RowRef {
    fn json(&self) -> Value {
        match self {
            RowRef::Existing(u) => u.to_json(),
            RowRef::New(n) => ops::named_uuid(n),
        }
    }
}

fn by_uuid(u: Uuid) -> Vec<Value> {
    vec![ops::cond("_uuid", "==", u.to_json())]
}

fn set_json<I: IntoIterator<Item = Value>>(items: I) -> Value {
    ops::set(items.into_iter().collect())
}

fn string_set(items: &BTreeSet<String>) -> Value {
    set_json(items.iter().map(|s| json!(s)))
}

fn string_map_json(m: &BTreeMap<String, String>) -> Value {
    ops::string_map(m.iter().map(|(k, v)| (k.as_str(), v.as_str())))
}

/// `actual` with `want` merged in, if that changes it.
fn merged_external_ids(
    actual: &StringMap,
    want: &BTreeMap<String, String>,
) -> Option<BTreeMap<String, String>> {
    if want.iter().all(|(k, v)| actual.get(k) == Some(v)) {
        return None;
    }
    let mut m = actual.0.clone();
    m.extend(want.iter().map(|(k, v)| (k.clone(), v.clone())));
    Some(m)
}

/// Actual rows and desired objects matched by identity.
struct Pairing<'a, A, D> {
    /// Same identity: keep, updating what differs.
    pairs: Vec<(&'a A, &'a D)>,
    /// Actual rows nothing desired matches: garbage.
    garbage: Vec<&'a A>,
    /// Desired objects no actual row matches: to insert.
    new: Vec<&'a D>,
}

/// Pair actual rows with desired objects of the same identity key. Within one key, rows
/// that need no change are paired first, then the rest in order (to be updated in place).
fn pair_up<'a, A, D, K: Ord>(
    actual: impl IntoIterator<Item = &'a A>,
    desired: impl IntoIterator<Item = &'a D>,
    key_a: impl Fn(&A) -> K,
    key_d: impl Fn(&D) -> K,
    unchanged: impl Fn(&A, &D) -> bool,
) -> Pairing<'a, A, D> {
    let mut by_key: BTreeMap<K, (Vec<&'a A>, Vec<&'a D>)> = BTreeMap::new();
    for a in actual {
        by_key.entry(key_a(a)).or_default().0.push(a);
    }
    for d in desired {
        by_key.entry(key_d(d)).or_default().1.push(d);
    }
    let mut out = Pairing {
        pairs: Vec::new(),
        garbage: Vec::new(),
        new: Vec::new(),
    };
    for (_, (mut actual, desired)) in by_key {
        let mut changed = Vec::new();
        for d in desired {
            match actual.iter().position(|a| unchanged(a, d)) {
                Some(i) => out.pairs.push((actual.remove(i), d)),
                None => changed.push(d),
            }
        }
        let mut actual = actual.into_iter();
        for d in changed {
            match actual.next() {
                Some(a) => out.pairs.push((a, d)),
                None => out.new.push(d),
            }
        }
        out.garbage.extend(actual);
    }
    out
}

struct Differ<'a> {
    network: &'a str,
    inserts: Vec<Value>,
    updates: Vec<Value>,
    deletes: Vec<Value>,
    next_name: usize,
    lsps: HashMap<Uuid, &'a nb::LogicalSwitchPort>,
    lrps: HashMap<Uuid, &'a nb::LogicalRouterPort>,
    routes: HashMap<Uuid, &'a nb::LogicalRouterStaticRoute>,
    qos: HashMap<Uuid, &'a nb::Qos>,
    nat: HashMap<Uuid, &'a nb::Nat>,
    dhcp_by_port: BTreeMap<&'a str, Vec<&'a nb::DhcpOptions>>,
    dhcp_kept: HashSet<Uuid>,
    actual: &'a ActualState,
}

impl<'a> Differ<'a> {
    fn new(actual: &'a ActualState, network: &'a str) -> Self {
        let mut dhcp_by_port: BTreeMap<&str, Vec<&nb::DhcpOptions>> = BTreeMap::new();
        for row in &actual.dhcp_options {
            let port = row.external_ids.get(PORT_KEY).map_or("", String::as_str);
            dhcp_by_port.entry(port).or_default().push(row);
        }
        Differ {
            network,
            inserts: Vec::new(),
            updates: Vec::new(),
            deletes: Vec::new(),
            next_name: 0,
            lsps: actual.switch_ports.iter().map(|r| (r.uuid, r)).collect(),
            lrps: actual.router_ports.iter().map(|r| (r.uuid, r)).collect(),
            routes: actual.routes.iter().map(|r| (r.uuid, r)).collect(),
            qos: actual.qos.iter().map(|r| (r.uuid, r)).collect(),
            nat: actual.nat.iter().map(|r| (r.uuid, r)).collect(),
            dhcp_by_port,
            dhcp_kept: HashSet::new(),
            actual,
        }
    }

    fn finish(self) -> Vec<Value> {
        let mut all = self.inserts;
        all.extend(self.updates);
        all.extend(self.deletes);
        all
    }

    fn owner(&self) -> BTreeMap<String, String> {
        [(OWNER_KEY.to_string(), self.network.to_string())].into()
    }

    /// Insert `row` (owned) into `table`; returns the reference to the new row.
    fn insert(&mut self, table: &str, mut row: Map<String, Value>) -> RowRef {
        if !row.contains_key("external_ids") {
            row.insert("external_ids".into(), string_map_json(&self.owner()));
        }
        let name = format!("roam_new_{}", self.next_name);
        self.next_name += 1;
        self.inserts
            .push(ops::insert(table, Value::Object(row), Some(&name)));
        RowRef::New(name)
    }

    fn update(&mut self, table: &str, uuid: Uuid, row: Map<String, Value>) {
        if !row.is_empty() {
            self.updates
                .push(ops::update(table, by_uuid(uuid), Value::Object(row)));
        }
    }

    fn mutate_set(
        &mut self,
        table: &str,
        uuid: Uuid,
        column: &str,
        add: Vec<RowRef>,
        remove: Vec<Uuid>,
    ) {
        let mut mutations = Vec::new();
        if !remove.is_empty() {
            mutations.push(ops::mutation(
                column,
                "delete",
                set_json(remove.iter().map(Uuid::to_json)),
            ));
        }
        if !add.is_empty() {
            mutations.push(ops::mutation(
                column,
                "insert",
                set_json(add.iter().map(RowRef::json)),
            ));
        }
        if !mutations.is_empty() {
            self.updates
                .push(ops::mutate(table, by_uuid(uuid), mutations));
        }
    }

    fn delete(&mut self, table: &str, uuid: Uuid) {
        self.deletes.push(ops::delete(table, by_uuid(uuid)));
    }

    fn external_ids_update(
        &self,
        row: &mut Map<String, Value>,
        actual: &StringMap,
        want: &BTreeMap<String, String>,
    ) {
        if let Some(m) = merged_external_ids(actual, want) {
            row.insert("external_ids".into(), string_map_json(&m));
        }
    }

    // ---- switches ----

    fn switches(&mut self, desired: &'a Topology) {
        let (pairs, leftovers) =
            match_by_name(&self.actual.switches, |ls| &ls.name, &desired.switches);
        for (want, keep, duplicates) in pairs {
            for dup in duplicates {
                self.delete_switch(dup);
            }
            self.switch(keep, want);
        }
        for ls in leftovers {
            self.delete_switch(ls);
        }
    }

    fn delete_switch(&mut self, ls: &'a nb::LogicalSwitch) {
        for u in &ls.ports {
            // its DHCP options go with garbage_dhcp, unless a port of the same name elsewhere
            // keeps them
            if self.lsps.contains_key(u) {
                self.delete("Logical_Switch_Port", *u);
            }
        }
        for u in &ls.qos_rules {
            if self.qos.contains_key(u) {
                self.delete("QoS", *u);
            }
        }
        self.delete("Logical_Switch", ls.uuid);
    }

    fn switch(&mut self, actual: Option<&'a nb::LogicalSwitch>, want: &'a LogicalSwitch) {
        let owner = self.owner();
        let Some(ls) = actual else {
            let ports: Vec<RowRef> = want
                .ports
                .values()
                .map(|p| self.new_lsp(p))
                .collect::<Vec<_>>();
            let qos: Vec<RowRef> = want.qos.iter().map(|q| self.new_qos(q)).collect();
            let mut row = Map::new();
            row.insert("name".into(), json!(want.name));
            row.insert("ports".into(), set_json(ports.iter().map(RowRef::json)));
            row.insert("qos_rules".into(), set_json(qos.iter().map(RowRef::json)));
            self.insert("Logical_Switch", row);
            return;
        };
        let mut row = Map::new();
        self.external_ids_update(&mut row, &ls.external_ids, &owner);
        self.update("Logical_Switch", ls.uuid, row);

        // ports, by name
        let actual_ports: Vec<&nb::LogicalSwitchPort> = ls
            .ports
            .iter()
            .filter_map(|u| self.lsps.get(u).copied())
            .collect();
        let ports = pair_up(
            actual_ports,
            want.ports.values(),
            |a| a.name.clone(),
            |d| d.name.clone(),
            |_, _| false,
        );
        for (a, d) in ports.pairs {
            self.update_lsp(a, d);
        }
        let remove: Vec<Uuid> = ports.garbage.iter().map(|a| a.uuid).collect();
        for u in &remove {
            self.delete("Logical_Switch_Port", *u);
        }
        let add: Vec<RowRef> = ports.new.into_iter().map(|d| self.new_lsp(d)).collect();
        self.mutate_set("Logical_Switch", ls.uuid, "ports", add, remove);

        // QoS rules, by match
        let actual_qos: Vec<&nb::Qos> = ls
            .qos_rules
            .iter()
            .filter_map(|u| self.qos.get(u).copied())
            .collect();
        let rules = pair_up(
            actual_qos,
            &want.qos,
            |a| a.match_.clone(),
            |d| d.r#match.clone(),
            qos_equal,
        );
        for (a, d) in rules.pairs {
            let row = self.qos_update(a, d);
            self.update("QoS", a.uuid, row);
        }
        let remove: Vec<Uuid> = rules.garbage.iter().map(|a| a.uuid).collect();
        for u in &remove {
            self.delete("QoS", *u);
        }
        let add: Vec<RowRef> = rules.new.into_iter().map(|d| self.new_qos(d)).collect();
        self.mutate_set("Logical_Switch", ls.uuid, "qos_rules", add, remove);
    }

    /// The desired columns of a switch port (without `name`, `tag` and `dhcpv4_options`).
    fn lsp_columns(p: &SwitchPort) -> (String, BTreeSet<String>, BTreeSet<String>, StringMap) {
        match &p.kind {
            SwitchPortKind::Workload {
                mac,
                ip,
                requested_chassis,
                ..
            } => {
                let addr = format!("{mac} {ip}");
                let mut options: StringMap =
                    [("requested-chassis".to_string(), requested_chassis.clone())].into();
                if requested_chassis.contains(',') {
                    // multi-chassis (a migration): the target carries traffic only once the
                    // VM's RARP has announced it there
                    options.insert("activation-strategy".into(), "rarp".into());
                }
                (String::new(), [addr.clone()].into(), [addr].into(), options)
            }
            SwitchPortKind::Router { router_port } => (
                "router".to_string(),
                ["router".to_string()].into(),
                BTreeSet::new(),
                [("router-port".to_string(), router_port.clone())].into(),
            ),
            SwitchPortKind::Localnet { network_name, .. } => (
                "localnet".to_string(),
                ["unknown".to_string()].into(),
                BTreeSet::new(),
                [("network_name".to_string(), network_name.clone())].into(),
            ),
        }
    }

    /// The desired `tag` column of a switch port (a localnet port's VLAN).
    fn lsp_tag(p: &SwitchPort) -> Option<i64> {
        match &p.kind {
            SwitchPortKind::Localnet { tag, .. } => tag.map(i64::from),
            SwitchPortKind::Workload { .. } | SwitchPortKind::Router { .. } => None,
        }
    }

    fn dhcp_of(p: &SwitchPort) -> Option<&DhcpOptionsRow> {
        match &p.kind {
            SwitchPortKind::Workload { dhcp, .. } => dhcp.as_ref(),
            SwitchPortKind::Router { .. } | SwitchPortKind::Localnet { .. } => None,
        }
    }

    fn new_lsp(&mut self, p: &'a SwitchPort) -> RowRef {
        let dhcp = self.dhcp_for(p, None);
        let (kind, addresses, port_security, options) = Self::lsp_columns(p);
        let mut row = Map::new();
        row.insert("name".into(), json!(p.name));
        row.insert("type".into(), json!(kind));
        row.insert("addresses".into(), string_set(&addresses));
        row.insert("port_security".into(), string_set(&port_security));
        row.insert("options".into(), string_map_json(&options));
        if let Some(tag) = Self::lsp_tag(p) {
            row.insert("tag".into(), json!(tag));
        }
        if let Some(d) = dhcp {
            row.insert("dhcpv4_options".into(), d.json());
        }
        self.insert("Logical_Switch_Port", row)
    }

    fn update_lsp(&mut self, a: &'a nb::LogicalSwitchPort, p: &'a SwitchPort) {
        let dhcp = self.dhcp_for(p, a.dhcpv4_options);
        let (kind, addresses, port_security, options) = Self::lsp_columns(p);
        let mut row = Map::new();
        if a.kind != kind {
            row.insert("type".into(), json!(kind));
        }
        if a.addresses.0 != addresses {
            row.insert("addresses".into(), string_set(&addresses));
        }
        if a.port_security.0 != port_security {
            row.insert("port_security".into(), string_set(&port_security));
        }
        if a.options != options {
            row.insert("options".into(), string_map_json(&options));
        }
        let tag = Self::lsp_tag(p);
        if a.tag != tag {
            row.insert(
                "tag".into(),
                tag.map_or_else(|| ops::set(vec![]), |t| json!(t)),
            );
        }
        let current = a.dhcpv4_options.map(RowRef::Existing);
        if current != dhcp {
            row.insert(
                "dhcpv4_options".into(),
                dhcp.map_or_else(|| ops::set(vec![]), |d| d.json()),
            );
        }
        let owner = self.owner();
        self.external_ids_update(&mut row, &a.external_ids, &owner);
        self.update("Logical_Switch_Port", a.uuid, row);
    }

    /// The DHCP_Options row port `p` must reference (inserting or updating it), or `None`;
    /// `current` is what the port references now (preferred when it is one of ours).
    fn dhcp_for(&mut self, p: &SwitchPort, current: Option<Uuid>) -> Option<RowRef> {
        let want = Self::dhcp_of(p)?;
        let mut rows = self
            .dhcp_by_port
            .get(p.name.as_str())
            .cloned()
            .unwrap_or_default();
        rows.retain(|r| !self.dhcp_kept.contains(&r.uuid));
        if let Some(i) = rows.iter().position(|r| Some(r.uuid) == current) {
            rows.swap(0, i);
        }
        let mut want_ids = self.owner();
        want_ids.insert(PORT_KEY.into(), p.name.clone());
        match rows.first() {
            Some(r) => {
                self.dhcp_kept.insert(r.uuid);
                let mut row = Map::new();
                if r.cidr != want.cidr {
                    row.insert("cidr".into(), json!(want.cidr));
                }
                if r.options.0 != want.options {
                    row.insert("options".into(), string_map_json(&want.options));
                }
                self.external_ids_update(&mut row, &r.external_ids, &want_ids);
                self.update("DHCP_Options", r.uuid, row);
                Some(RowRef::Existing(r.uuid))
            }
            None => {
                let mut row = Map::new();
                row.insert("cidr".into(), json!(want.cidr));
                row.insert("options".into(), string_map_json(&want.options));
                row.insert("external_ids".into(), string_map_json(&want_ids));
                Some(self.insert("DHCP_Options", row))
            }
        }
    }

    /// Owned DHCP_Options rows no desired port uses: deleted.
    fn garbage_dhcp(&mut self) {
        let garbage: Vec<Uuid> = self
            .actual
            .dhcp_options
            .iter()
            .map(|r| r.uuid)
            .filter(|u| !self.dhcp_kept.contains(u))
            .collect();
        for u in garbage {
            self.delete("DHCP_Options", u);
        }
    }

    fn qos_row(q: &QosRule) -> Map<String, Value> {
        let mut row = Map::new();
        row.insert("priority".into(), json!(QOS_PRIORITY));
        row.insert("direction".into(), json!("from-lport"));
        row.insert("match".into(), json!(q.r#match));
        row.insert("action".into(), json!(["map", [["dscp", q.dscp]]]));
        row.insert("bandwidth".into(), json!(["map", []]));
        row
    }

    fn new_qos(&mut self, q: &QosRule) -> RowRef {
        self.insert("QoS", Self::qos_row(q))
    }

    fn qos_update(&self, a: &nb::Qos, q: &QosRule) -> Map<String, Value> {
        let mut row = Self::qos_row(q);
        if a.priority == QOS_PRIORITY {
            row.remove("priority");
        }
        if a.direction == nb::QosDirection::FromLport {
            row.remove("direction");
        }
        row.remove("match");
        if a.action.len() == 1 && a.action.get("dscp") == Some(&i64::from(q.dscp)) {
            row.remove("action");
        }
        if a.bandwidth.is_empty() {
            row.remove("bandwidth");
        }
        self.external_ids_update(&mut row, &a.external_ids, &self.owner());
        row
    }

    // ---- routers ----

    fn routers(&mut self, desired: &'a Topology) {
        let (pairs, leftovers) =
            match_by_name(&self.actual.routers, |lr| &lr.name, &desired.routers);
        for (want, keep, duplicates) in pairs {
            for dup in duplicates {
                self.delete_router(dup);
            }
            self.router(keep, want);
        }
        for lr in leftovers {
            self.delete_router(lr);
        }
    }

    fn delete_router(&mut self, lr: &'a nb::LogicalRouter) {
        for u in &lr.ports {
            if self.lrps.contains_key(u) {
                self.delete("Logical_Router_Port", *u);
            }
        }
        for u in &lr.static_routes {
            if self.routes.contains_key(u) {
                self.delete("Logical_Router_Static_Route", *u);
            }
        }
        for u in &lr.nat {
            if self.nat.contains_key(u) {
                self.delete("NAT", *u);
            }
        }
        self.delete("Logical_Router", lr.uuid);
    }

    fn router(&mut self, actual: Option<&'a nb::LogicalRouter>, want: &'a LogicalRouter) {
        let Some(lr) = actual else {
            let ports: Vec<RowRef> = want.ports.values().map(|p| self.new_lrp(p)).collect();
            let routes: Vec<RowRef> = want.routes.iter().map(|r| self.new_route(r)).collect();
            let nat: Vec<RowRef> = want.snat.iter().map(|n| self.new_snat(n)).collect();
            let mut row = Map::new();
            row.insert("name".into(), json!(want.name));
            row.insert("ports".into(), set_json(ports.iter().map(RowRef::json)));
            row.insert(
                "static_routes".into(),
                set_json(routes.iter().map(RowRef::json)),
            );
            if !nat.is_empty() {
                row.insert("nat".into(), set_json(nat.iter().map(RowRef::json)));
            }
            if !want.options.is_empty() {
                row.insert("options".into(), string_map_json(&want.options));
            }
            self.insert("Logical_Router", row);
            return;
        };
        let mut row = Map::new();
        // options are managed when the plan names some (a gateway router's `chassis`)
        if !want.options.is_empty() && lr.options.0 != want.options {
            row.insert("options".into(), string_map_json(&want.options));
        }
        self.external_ids_update(&mut row, &lr.external_ids, &self.owner());
        self.update("Logical_Router", lr.uuid, row);

        // SNAT rules, by internal network: a changed external address is an update in place
        let actual_nat: Vec<&nb::Nat> = lr
            .nat
            .iter()
            .filter_map(|u| self.nat.get(u).copied())
            .collect();
        let nats = pair_up(
            actual_nat,
            &want.snat,
            |a| (String::from(a.kind.clone()), a.logical_ip.clone()),
            |d| ("snat".to_string(), d.logical_ip.to_string()),
            |a, d| a.external_ip == d.external_ip.to_string(),
        );
        for (a, d) in nats.pairs {
            let mut row = Map::new();
            let ext = d.external_ip.to_string();
            if a.external_ip != ext {
                row.insert("external_ip".into(), json!(ext));
            }
            self.external_ids_update(&mut row, &a.external_ids, &self.owner());
            self.update("NAT", a.uuid, row);
        }
        let remove: Vec<Uuid> = nats.garbage.iter().map(|a| a.uuid).collect();
        for u in &remove {
            self.delete("NAT", *u);
        }
        let add: Vec<RowRef> = nats.new.into_iter().map(|d| self.new_snat(d)).collect();
        self.mutate_set("Logical_Router", lr.uuid, "nat", add, remove);

        let actual_ports: Vec<&nb::LogicalRouterPort> = lr
            .ports
            .iter()
            .filter_map(|u| self.lrps.get(u).copied())
            .collect();
        let ports = pair_up(
            actual_ports,
            want.ports.values(),
            |a| a.name.clone(),
            |d| d.name.clone(),
            |_, _| false,
        );
        for (a, d) in ports.pairs {
            let row = self.lrp_update(a, d);
            self.update("Logical_Router_Port", a.uuid, row);
        }
        let remove: Vec<Uuid> = ports.garbage.iter().map(|a| a.uuid).collect();
        for u in &remove {
            self.delete("Logical_Router_Port", *u);
        }
        let add: Vec<RowRef> = ports.new.into_iter().map(|d| self.new_lrp(d)).collect();
        self.mutate_set("Logical_Router", lr.uuid, "ports", add, remove);

        // routes, by prefix: a changed next hop is an update in place
        let actual_routes: Vec<&nb::LogicalRouterStaticRoute> = lr
            .static_routes
            .iter()
            .filter_map(|u| self.routes.get(u).copied())
            .collect();
        let routes = pair_up(
            actual_routes,
            &want.routes,
            |a| a.ip_prefix.clone(),
            |d| d.ip_prefix.to_string(),
            |a, d| route_update(a, d).is_empty(),
        );
        for (a, d) in routes.pairs {
            let mut row = route_update(a, d);
            self.external_ids_update(&mut row, &a.external_ids, &self.owner());
            self.update("Logical_Router_Static_Route", a.uuid, row);
        }
        let remove: Vec<Uuid> = routes.garbage.iter().map(|a| a.uuid).collect();
        for u in &remove {
            self.delete("Logical_Router_Static_Route", *u);
        }
        let add: Vec<RowRef> = routes.new.into_iter().map(|d| self.new_route(d)).collect();
        self.mutate_set("Logical_Router", lr.uuid, "static_routes", add, remove);
    }

    fn new_lrp(&mut self, p: &RouterPort) -> RowRef {
        let mut row = Map::new();
        row.insert("name".into(), json!(p.name));
        row.insert("mac".into(), json!(p.mac.to_string()));
        row.insert(
            "networks".into(),
            string_set(&p.networks.iter().cloned().collect()),
        );
        self.insert("Logical_Router_Port", row)
    }

    fn lrp_update(&self, a: &nb::LogicalRouterPort, p: &RouterPort) -> Map<String, Value> {
        let mut row = Map::new();
        let mac = p.mac.to_string();
        if a.mac != mac {
            row.insert("mac".into(), json!(mac));
        }
        let networks: BTreeSet<String> = p.networks.iter().cloned().collect();
        if a.networks.0 != networks {
            row.insert("networks".into(), string_set(&networks));
        }
        self.external_ids_update(&mut row, &a.external_ids, &self.owner());
        row
    }

    fn new_snat(&mut self, n: &SnatRule) -> RowRef {
        let mut row = Map::new();
        row.insert("type".into(), json!("snat"));
        row.insert("external_ip".into(), json!(n.external_ip.to_string()));
        row.insert("logical_ip".into(), json!(n.logical_ip.to_string()));
        self.insert("NAT", row)
    }

    fn new_route(&mut self, r: &StaticRoute) -> RowRef {
        let mut row = Map::new();
        row.insert("ip_prefix".into(), json!(r.ip_prefix.to_string()));
        row.insert("nexthop".into(), json!(r.nexthop.to_string()));
        row.insert(
            "output_port".into(),
            r.output_port
                .as_ref()
                .map_or_else(|| ops::set(vec![]), |p| json!(p)),
        );
        self.insert("Logical_Router_Static_Route", row)
    }
}

fn qos_equal(a: &nb::Qos, q: &QosRule) -> bool {
    a.priority == QOS_PRIORITY
        && a.direction == nb::QosDirection::FromLport
        && a.action.len() == 1
        && a.action.get("dscp") == Some(&i64::from(q.dscp))
        && a.bandwidth.is_empty()
}

/// The columns of route `a` that differ from `r` (its `ip_prefix` aside).
fn route_update(a: &nb::LogicalRouterStaticRoute, r: &StaticRoute) -> Map<String, Value> {
    let mut row = Map::new();
    let nexthop = r.nexthop.to_string();
    if a.nexthop != nexthop {
        row.insert("nexthop".into(), json!(nexthop));
    }
    if a.output_port != r.output_port {
        row.insert(
            "output_port".into(),
            r.output_port
                .as_ref()
                .map_or_else(|| ops::set(vec![]), |p| json!(p)),
        );
    }
    if !matches!(a.policy, None | Some(RoutePolicy::DstIp)) {
        row.insert("policy".into(), ops::set(vec![]));
    }
    if !a.route_table.is_empty() {
        row.insert("route_table".into(), json!(""));
    }
    row
}

/// A desired object, the owned row kept for it (if any) and that row's duplicates.
type Matched<'a, D, R> = (&'a D, Option<&'a R>, Vec<&'a R>);

/// Pair each desired object with the owned row of the same name (the first one; further
/// rows of that name are duplicates, garbage), and return the owned rows no desired object
/// names (leftovers, garbage too).
fn match_by_name<'a, D, R>(
    actual: &'a [R],
    name_of: impl Fn(&'a R) -> &'a String,
    desired: &'a BTreeMap<String, D>,
) -> (Vec<Matched<'a, D, R>>, Vec<&'a R>) {
    let mut by_name: BTreeMap<&str, Vec<&'a R>> = BTreeMap::new();
    for row in actual {
        by_name.entry(name_of(row).as_str()).or_default().push(row);
    }
    let pairs = desired
        .iter()
        .map(|(name, want)| {
            let mut rows = by_name
                .remove(name.as_str())
                .unwrap_or_default()
                .into_iter();
            let keep = rows.next();
            (want, keep, rows.collect())
        })
        .collect();
    (pairs, by_name.into_values().flatten().collect())
}

#[cfg(test)]
#[path = "reconcile_tests.rs"]
mod tests;
