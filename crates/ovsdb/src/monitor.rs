//! Monitors: RFC 7047 `monitor` (4.1.5) and the `monitor_cond` extension (ovsdb-server(7)
//! 4.1.12) with `update2` notifications.
//!
//! A [`Monitor`] keeps a replica of the monitored rows and columns. Whatever the method,
//! it yields [`MonitorEvent`]s in one normalized form, [`TableUpdates`]: for every changed
//! row, its complete `old` and `new` contents (of the monitored columns). The `update2`
//! differences are applied to the replica using the schema, and the columns that
//! `update2` omits because they hold their default value are filled in.
//!
//! The raw notification forms are available too: [`parse_table_updates`] and
//! [`parse_table_updates2`].

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};
use tokio::sync::mpsc;

use super::atom::Uuid;
use super::client::Client;
use super::connection::Feed;
use super::reconnect;
use super::row::{TableRow, decode_row};
use super::schema::DatabaseSchema;
use crate::{Error, Result};

/// A row as JSON: column name → RFC 7047 value.
pub type Row = Map<String, Value>;

/// Changed rows by table, then by row UUID.
pub type TableUpdates = BTreeMap<String, BTreeMap<Uuid, RowUpdate>>;

/// The `update2` form of [`TableUpdates`] (ovsdb-server(7) 4.1.14).
pub type TableUpdates2 = BTreeMap<String, BTreeMap<Uuid, RowUpdate2>>;

/// A change to one row.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RowUpdate {
    /// The row before the change; `None` for an inserted (or initial) row. In the events of
    /// a [`Monitor`] this is the complete previous row (monitored columns); in the raw RFC
    /// 7047 form ([`parse_table_updates`]) it holds only the changed columns.
    pub old: Option<Row>,
    /// The row after the change; `None` for a deleted row.
    pub new: Option<Row>,
}

/// One row of an `update2` notification.
#[derive(Clone, Debug, PartialEq)]
pub enum RowUpdate2 {
    /// A row of the initial state (without the columns that hold their default value).
    Initial(Row),
    /// An inserted row (without the columns that hold their default value).
    Insert(Row),
    /// The changed columns: the new value of a single-valued column, the difference for a
    /// set or map.
    Modify(Row),
    /// The row was deleted.
    Delete,
}

/// What a [`Monitor`] yields.
#[derive(Clone, Debug, PartialEq)]
pub enum MonitorEvent {
    /// The complete contents of the monitored tables (every monitored table is present,
    /// possibly empty). Delivered first, and again after a
    /// [`ReconnectingClient`](super::ReconnectingClient) re-established the monitor on a new
    /// connection: replace whatever state you derived from earlier events.
    Initial(TableUpdates),
    /// Changes committed since the previous event.
    Update(TableUpdates),
}

impl MonitorEvent {
    /// The rows of the event.
    pub fn updates(&self) -> &TableUpdates {
        match self {
            MonitorEvent::Initial(u) | MonitorEvent::Update(u) => u,
        }
    }

    /// Whether this is an [`Initial`](MonitorEvent::Initial) state.
    pub fn is_initial(&self) -> bool {
        matches!(self, MonitorEvent::Initial(_))
    }
}

impl RowUpdate {
    /// A new row (inserted, or part of the initial state).
    pub fn is_insert(&self) -> bool {
        self.old.is_none() && self.new.is_some()
    }

    /// A modified row.
    pub fn is_modify(&self) -> bool {
        self.old.is_some() && self.new.is_some()
    }

    /// A deleted row.
    pub fn is_delete(&self) -> bool {
        self.old.is_some() && self.new.is_none()
    }

    /// The columns whose value differs between `old` and `new`.
    pub fn changed_columns(&self) -> Vec<&str> {
        fn get<'a>(r: &'a Option<Row>, c: &str) -> Option<&'a Value> {
            r.as_ref()?.get(c)
        }
        let mut cols: Vec<&str> = self
            .old
            .iter()
            .chain(self.new.iter())
            .flat_map(|r| r.keys())
            .map(String::as_str)
            .filter(|c| get(&self.old, c) != get(&self.new, c))
            .collect();
        cols.sort_unstable();
        cols.dedup();
        cols
    }

    /// `new` decoded as a typed row (see [`TableRow`]).
    pub fn new_as<T: DeserializeOwned>(&self, table: &str, uuid: &Uuid) -> Result<Option<T>> {
        self.new
            .as_ref()
            .map(|r| decode_row(table, uuid, r))
            .transpose()
    }

    /// `old` decoded as a typed row.
    pub fn old_as<T: DeserializeOwned>(&self, table: &str, uuid: &Uuid) -> Result<Option<T>> {
        self.old
            .as_ref()
            .map(|r| decode_row(table, uuid, r))
            .transpose()
    }
}

/// Which monitor request to send.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MonitorMethod {
    /// `monitor_cond` if the server knows it, else `monitor`.
    #[default]
    Auto,
    /// RFC 7047 `monitor` (`update` notifications; no conditions).
    Monitor,
    /// `monitor_cond` (`update2` notifications; conditions allowed).
    MonitorCond,
}

/// Which kinds of change a monitor reports (all by default).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MonitorSelect {
    /// Report the initial rows.
    pub initial: bool,
    /// Report inserted rows.
    pub insert: bool,
    /// Report deleted rows.
    pub delete: bool,
    /// Report modified rows.
    pub modify: bool,
}

impl Default for MonitorSelect {
    fn default() -> Self {
        MonitorSelect {
            initial: true,
            insert: true,
            delete: true,
            modify: true,
        }
    }
}

/// What to watch in one table.
#[derive(Clone, Debug, PartialEq)]
pub struct MonitorRequest {
    /// The table.
    pub table: String,
    /// The columns to watch; `None` for all of them.
    pub columns: Option<Vec<String>>,
    /// `monitor_cond` only: watch only rows matching ANY of these conditions
    /// (`[column, function, value]`, see [`super::ops::cond`], or `true`/`false`). `None`
    /// watches every row. Note that ovsdb-server 3.1 treats an empty array as "no row".
    pub conditions: Option<Vec<Value>>,
    /// Which kinds of change to report; `None` for all.
    pub select: Option<MonitorSelect>,
}

impl MonitorRequest {
    /// Watch every row and column of `table`.
    pub fn table(table: &str) -> Self {
        MonitorRequest {
            table: table.to_string(),
            columns: None,
            conditions: None,
            select: None,
        }
    }

    /// Watch the table and columns of a typed row.
    pub fn for_row<T: TableRow>() -> Self {
        Self::table(T::TABLE).columns(T::COLUMNS)
    }

    /// Watch only these columns.
    pub fn columns(mut self, columns: &[&str]) -> Self {
        self.columns = Some(columns.iter().map(|c| c.to_string()).collect());
        self
    }

    /// Watch only rows matching any of `conditions` (needs `monitor_cond`).
    pub fn conditions(mut self, conditions: Vec<Value>) -> Self {
        self.conditions = Some(conditions);
        self
    }

    /// Report only these kinds of change.
    pub fn select(mut self, select: MonitorSelect) -> Self {
        self.select = Some(select);
        self
    }

    fn to_json(&self, with_conditions: bool) -> Value {
        let mut r = json!({});
        if let Some(c) = &self.columns {
            r["columns"] = json!(c);
        }
        if with_conditions && let Some(w) = &self.conditions {
            r["where"] = json!(w);
        }
        if let Some(s) = &self.select {
            r["select"] = json!({
                "initial": s.initial, "insert": s.insert, "delete": s.delete, "modify": s.modify
            });
        }
        r
    }
}

/// A validated set of monitor requests, reusable to re-create the monitor.
#[derive(Debug)]
pub(crate) struct MonitorSpec {
    pub schema: Arc<DatabaseSchema>,
    requests: BTreeMap<String, Vec<MonitorRequest>>,
    /// The monitored columns of each table.
    columns: BTreeMap<String, Vec<String>>,
}

impl MonitorSpec {
    /// Check `requests` against `schema`.
    pub fn new(schema: Arc<DatabaseSchema>, requests: Vec<MonitorRequest>) -> Result<Self> {
        if requests.is_empty() {
            return Err(Error::InvalidValue {
                table: "-".into(),
                column: "-".into(),
                reason: "a monitor needs at least one table".into(),
            });
        }
        let mut by_table: BTreeMap<String, Vec<MonitorRequest>> = BTreeMap::new();
        let mut columns: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for r in requests {
            let ts = schema.table(&r.table)?;
            let cols = match &r.columns {
                Some(cols) => {
                    for c in cols {
                        schema.column(&r.table, c)?;
                    }
                    cols.clone()
                }
                None => ts.columns.keys().cloned().collect(),
            };
            for cond in r.conditions.iter().flatten() {
                if let Some(c) = cond.get(0).and_then(Value::as_str) {
                    schema.column(&r.table, c)?;
                }
            }
            let all = columns.entry(r.table.clone()).or_default();
            all.extend(cols);
            all.sort();
            all.dedup();
            by_table.entry(r.table.clone()).or_default().push(r);
        }
        Ok(MonitorSpec {
            schema,
            requests: by_table,
            columns,
        })
    }

    pub fn has_conditions(&self) -> bool {
        self.requests
            .values()
            .flatten()
            .any(|r| r.conditions.is_some())
    }

    /// The request parameters `[db, id, {table: [request..]}]`.
    pub fn params(&self, method: MonitorMethod, id: &str) -> Value {
        let cond = method != MonitorMethod::Monitor;
        let tables: Map<String, Value> = self
            .requests
            .iter()
            .map(|(t, rs)| {
                (
                    t.clone(),
                    Value::Array(rs.iter().map(|r| r.to_json(cond)).collect()),
                )
            })
            .collect();
        json!([self.schema.name, id, tables])
    }

    /// `row` with every monitored column the server left out set to its default.
    fn complete(&self, table: &str, mut row: Row) -> Row {
        if let (Some(cols), Ok(ts)) = (self.columns.get(table), self.schema.table(table)) {
            for c in cols {
                if !row.contains_key(c)
                    && let Some(cs) = ts.column(c)
                {
                    row.insert(c.clone(), cs.ty.default_json());
                }
            }
        }
        row
    }
}

static NEXT_MONITOR: AtomicU64 = AtomicU64::new(1);

/// A fresh monitor id (the `json-value` of the monitor request), unique in this process.
pub(crate) fn next_monitor_id() -> String {
    format!(
        "roam-monitor-{}",
        NEXT_MONITOR.fetch_add(1, Ordering::Relaxed)
    )
}

/// Who to tell when the monitor is cancelled.
pub(crate) enum Owner {
    Client(Client),
    Reconnecting(Arc<reconnect::Shared>),
}

/// A live monitor. Dropping it cancels it on the server (`monitor_cancel`, not awaited).
///
/// ```no_run
/// # async fn f(nb: roam_ovsdb::Client) -> roam_ovsdb::Result<()> {
/// use roam_ovsdb::{MonitorEvent, MonitorRequest, nb::LogicalSwitch};
/// let mut m = nb.monitor("OVN_Northbound", vec![MonitorRequest::for_row::<LogicalSwitch>()]).await?;
/// loop {
///     match m.next().await? {
///         MonitorEvent::Initial(_) => { /* resync from m.typed::<LogicalSwitch>()? */ }
///         MonitorEvent::Update(changes) => { /* apply changes */ }
///     }
/// }
/// # }
/// ```
pub struct Monitor {
    id: String,
    spec: Arc<MonitorSpec>,
    method: MonitorMethod,
    feed: mpsc::UnboundedReceiver<Feed>,
    replica: BTreeMap<String, BTreeMap<Uuid, Row>>,
    owner: Option<Owner>,
}

impl std::fmt::Debug for Monitor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Monitor")
            .field("id", &self.id)
            .field("db", &self.spec.schema.name)
            .field("method", &self.method)
            .field("tables", &self.spec.columns.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Monitor {
    pub(crate) fn new(
        id: String,
        spec: Arc<MonitorSpec>,
        method: MonitorMethod,
        feed: mpsc::UnboundedReceiver<Feed>,
        owner: Owner,
    ) -> Self {
        Monitor {
            id,
            spec,
            method,
            feed,
            replica: BTreeMap::new(),
            owner: Some(owner),
        }
    }

    /// The monitor id sent to the server.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The monitored database.
    pub fn database(&self) -> &str {
        &self.spec.schema.name
    }

    /// The method in use ([`MonitorMethod::Monitor`] or [`MonitorMethod::MonitorCond`]).
    pub fn method(&self) -> MonitorMethod {
        self.method
    }

    /// The monitored columns of `table`.
    pub fn columns(&self, table: &str) -> Option<&[String]> {
        self.spec.columns.get(table).map(Vec::as_slice)
    }

    /// Wait for the next event: the [`Initial`](MonitorEvent::Initial) state first, then
    /// [`Update`](MonitorEvent::Update)s.
    ///
    /// Errors: [`Error::Disconnected`] once the connection of a plain [`Client`] closed
    /// (create a new monitor on a new connection); [`Error::Protocol`] or
    /// [`Error::Decode`] for a malformed notification (it is skipped: the replica may then
    /// be stale, so resync by re-creating the monitor); [`Error::Rpc`] if a
    /// [`ReconnectingClient`](super::ReconnectingClient) could not re-establish it;
    /// [`Error::MonitorCanceled`] if the server cancelled it.
    pub async fn next(&mut self) -> Result<MonitorEvent> {
        match self.feed.recv().await {
            Some(feed) => self.process(feed),
            None => Err(Error::Disconnected(format!("monitor {}", self.id))),
        }
    }

    /// The next event if one is already queued, without waiting.
    pub fn try_next(&mut self) -> Option<Result<MonitorEvent>> {
        match self.feed.try_recv() {
            Ok(feed) => Some(self.process(feed)),
            Err(mpsc::error::TryRecvError::Empty) => None,
            Err(mpsc::error::TryRecvError::Disconnected) => {
                Some(Err(Error::Disconnected(format!("monitor {}", self.id))))
            }
        }
    }

    /// The current rows of `table` (monitored columns only), as of the last event returned.
    pub fn rows(&self, table: &str) -> Option<&BTreeMap<Uuid, Row>> {
        self.replica.get(table)
    }

    /// The current rows of `T`'s table, decoded; `T`'s columns must be monitored (missing
    /// ones take their default).
    pub fn typed<T: TableRow>(&self) -> Result<Vec<T>> {
        self.replica
            .get(T::TABLE)
            .into_iter()
            .flatten()
            .map(|(uuid, row)| decode_row(T::TABLE, uuid, row))
            .collect()
    }

    /// Cancel the monitor on the server and wait for it to confirm.
    pub async fn cancel(mut self) -> Result<()> {
        match self.owner.take() {
            Some(Owner::Client(c)) => c.cancel_monitor(&self.id).await,
            Some(Owner::Reconnecting(r)) => r.cancel_monitor(&self.id).await,
            None => Ok(()),
        }
    }

    fn process(&mut self, feed: Feed) -> Result<MonitorEvent> {
        match feed {
            Feed::Initial { method, updates } => {
                let parsed = if method == "monitor" {
                    parse_table_updates(&updates)
                        .map(|u| self.rfc_initial(u))
                        .map_err(|e| self.malformed(&method, e))?
                } else {
                    parse_table_updates2(&updates)
                        .map_err(|e| self.malformed(&method, e))
                        .and_then(|u| self.normalize2(u, true))?
                };
                let mut event: TableUpdates = self
                    .spec
                    .columns
                    .keys()
                    .map(|t| (t.clone(), BTreeMap::new()))
                    .collect();
                event.extend(parsed);
                self.replica.clear();
                self.apply(&event);
                Ok(MonitorEvent::Initial(event))
            }
            Feed::Update { method, updates } => {
                let event = if method == "update" {
                    parse_table_updates(&updates)
                        .map(|u| self.normalize(u))
                        .map_err(|e| self.malformed(&method, e))?
                } else {
                    parse_table_updates2(&updates)
                        .map_err(|e| self.malformed(&method, e))
                        .and_then(|u| self.normalize2(u, false))?
                };
                self.apply(&event);
                Ok(MonitorEvent::Update(event))
            }
            Feed::Failed(e) => Err(e),
            Feed::Canceled => Err(Error::MonitorCanceled(self.id.clone())),
        }
    }

    fn malformed(&self, method: &str, e: String) -> Error {
        Error::Protocol(format!(
            "{method} for monitor {} is malformed ({e}); it was skipped",
            self.id
        ))
    }

    fn rfc_initial(&self, updates: TableUpdates) -> TableUpdates {
        updates
            .into_iter()
            .map(|(t, rows)| {
                let rows = rows
                    .into_iter()
                    .filter_map(|(u, ru)| {
                        ru.new.map(|new| {
                            let new = Some(self.spec.complete(&t, new));
                            (u, RowUpdate { old: None, new })
                        })
                    })
                    .collect();
                (t, rows)
            })
            .collect()
    }

    /// RFC 7047 update: `new` is complete, `old` only has the changed columns; take the
    /// complete old row from the replica.
    fn normalize(&self, updates: TableUpdates) -> TableUpdates {
        updates
            .into_iter()
            .map(|(t, rows)| {
                let current = self.replica.get(&t);
                let rows = rows
                    .into_iter()
                    .map(|(u, ru)| {
                        let old = match (current.and_then(|c| c.get(&u)), ru.old) {
                            (Some(full), Some(_)) => Some(full.clone()),
                            (_, old) => old,
                        };
                        let new = ru.new.map(|n| self.spec.complete(&t, n));
                        (u, RowUpdate { old, new })
                    })
                    .collect();
                (t, rows)
            })
            .collect()
    }

    /// update2: complete inserted rows with defaults, apply modifications to the replica's
    /// rows, take deleted rows from the replica.
    fn normalize2(&self, updates: TableUpdates2, initial: bool) -> Result<TableUpdates> {
        let mut out = TableUpdates::new();
        for (t, rows) in updates {
            let current = self.replica.get(&t);
            let mut changes = BTreeMap::new();
            for (u, ru) in rows {
                let old = if initial {
                    None
                } else {
                    current.and_then(|c| c.get(&u)).cloned()
                };
                let change = match ru {
                    RowUpdate2::Initial(row) | RowUpdate2::Insert(row) => RowUpdate {
                        old: None,
                        new: Some(self.spec.complete(&t, row)),
                    },
                    RowUpdate2::Modify(diff) => {
                        let Some(old) = old else {
                            return Err(Error::Protocol(format!(
                                "update2 for monitor {} modifies row {u} of {t}, which it never announced; it was skipped (re-create the monitor to resync)",
                                self.id
                            )));
                        };
                        let mut new = old.clone();
                        for (col, d) in diff {
                            let cs = self.spec.schema.column(&t, &col)?;
                            let cur = new
                                .get(&col)
                                .cloned()
                                .unwrap_or_else(|| cs.ty.default_json());
                            let v = cs.ty.apply_diff(&cur, &d).map_err(|reason| Error::Decode {
                                what: format!("update2 of {t}.{col} for row {u}"),
                                reason,
                            })?;
                            new.insert(col, v);
                        }
                        RowUpdate {
                            old: Some(old),
                            new: Some(new),
                        }
                    }
                    RowUpdate2::Delete => {
                        if old.is_none() {
                            tracing::debug!(monitor = %self.id, table = %t, row = %u, "update2 deletes a row it never announced");
                        }
                        RowUpdate { old, new: None }
                    }
                };
                changes.insert(u, change);
            }
            out.insert(t, changes);
        }
        Ok(out)
    }

    fn apply(&mut self, event: &TableUpdates) {
        for (t, rows) in event {
            let table = self.replica.entry(t.clone()).or_default();
            for (u, ru) in rows {
                match &ru.new {
                    Some(new) => {
                        table.insert(*u, new.clone());
                    }
                    None => {
                        table.remove(u);
                    }
                }
            }
        }
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        match self.owner.take() {
            Some(Owner::Client(c)) => c.cancel_monitor_nowait(&self.id),
            Some(Owner::Reconnecting(r)) => r.forget_monitor(&self.id),
            None => {}
        }
    }
}

fn parse_rows<T>(
    v: &Value,
    mut row: impl FnMut(&str, &Value) -> std::result::Result<T, String>,
) -> std::result::Result<BTreeMap<String, BTreeMap<Uuid, T>>, String> {
    let tables = v
        .as_object()
        .ok_or_else(|| format!("table updates are not an object: {v}"))?;
    tables
        .iter()
        .map(|(t, rows)| {
            let rows = rows
                .as_object()
                .ok_or_else(|| format!("updates of table {t} are not an object"))?;
            let rows = rows
                .iter()
                .map(|(u, r)| {
                    let uuid: Uuid = u
                        .parse()
                        .map_err(|e| format!("row key {u:?} of table {t} is not a uuid: {e}"))?;
                    Ok((uuid, row(t, r).map_err(|e| format!("row {u} of {t}: {e}"))?))
                })
                .collect::<std::result::Result<_, String>>()?;
            Ok((t.clone(), rows))
        })
        .collect()
}

fn as_row(v: &Value) -> std::result::Result<Row, String> {
    v.as_object()
        .cloned()
        .ok_or_else(|| format!("row is not an object: {v}"))
}

/// Parse RFC 7047 `<table-updates>` (the `monitor` reply and `update` notifications).
pub fn parse_table_updates(v: &Value) -> std::result::Result<TableUpdates, String> {
    parse_rows(v, |_, r| {
        let obj = r.as_object().ok_or("not an object")?;
        let old = obj.get("old").map(as_row).transpose()?;
        let new = obj.get("new").map(as_row).transpose()?;
        if old.is_none() && new.is_none() {
            return Err("neither \"old\" nor \"new\"".into());
        }
        Ok(RowUpdate { old, new })
    })
}

/// Parse `<table-updates2>` (the `monitor_cond` reply and `update2` notifications).
pub fn parse_table_updates2(v: &Value) -> std::result::Result<TableUpdates2, String> {
    parse_rows(v, |_, r| {
        let obj = r.as_object().ok_or("not an object")?;
        if obj.len() != 1 {
            return Err(format!("expected one of initial/insert/modify/delete: {r}"));
        }
        let (kind, row) = obj.iter().next().expect("one member");
        Ok(match kind.as_str() {
            "initial" => RowUpdate2::Initial(as_row(row)?),
            "insert" => RowUpdate2::Insert(as_row(row)?),
            "modify" => RowUpdate2::Modify(as_row(row)?),
            "delete" => RowUpdate2::Delete,
            other => return Err(format!("unknown row update kind {other:?}")),
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const U1: &str = "550e8400-e29b-41d4-a716-446655440000";
    const U2: &str = "6ba7b810-9dad-11d1-80b4-00c04fd430c8";

    fn schema() -> Arc<DatabaseSchema> {
        Arc::new(
            DatabaseSchema::from_json(&json!({
                "name": "Test", "version": "1",
                "tables": {"T": {"columns": {
                    "name": {"type": "string"},
                    "tag": {"type": {"key": "integer", "min": 0, "max": 1}},
                    "addrs": {"type": {"key": "string", "min": 0, "max": "unlimited"}},
                    "opts": {"type": {"key": "string", "value": "string", "min": 0, "max": "unlimited"}}
                }}}
            }))
            .unwrap(),
        )
    }

    fn monitor() -> (Monitor, mpsc::UnboundedSender<Feed>) {
        let spec = MonitorSpec::new(schema(), vec![MonitorRequest::table("T")]).unwrap();
        let (tx, rx) = mpsc::unbounded_channel();
        let m = Monitor {
            id: "m".into(),
            spec: Arc::new(spec),
            method: MonitorMethod::MonitorCond,
            feed: rx,
            replica: BTreeMap::new(),
            owner: None,
        };
        (m, tx)
    }

    fn u(s: &str) -> Uuid {
        s.parse().unwrap()
    }

    fn feed(tx: &mpsc::UnboundedSender<Feed>, method: &str, updates: Value) {
        let f = if method.starts_with("monitor") {
            Feed::Initial {
                method: method.into(),
                updates,
            }
        } else {
            Feed::Update {
                method: method.into(),
                updates,
            }
        };
        tx.send(f).unwrap();
    }

    #[test]
    fn parses_both_update_forms() {
        let v = json!({"T": {U1: {"new": {"name": "a"}}, U2: {"old": {"name": "b"}, "new": {"name": "c"}}}});
        let p = parse_table_updates(&v).unwrap();
        assert!(p["T"][&u(U1)].is_insert());
        assert!(p["T"][&u(U2)].is_modify());
        assert_eq!(p["T"][&u(U2)].changed_columns(), vec!["name"]);
        let v2 = json!({"T": {U1: {"insert": {"name": "a"}}, U2: {"delete": null}}});
        let p2 = parse_table_updates2(&v2).unwrap();
        assert_eq!(p2["T"][&u(U2)], RowUpdate2::Delete);
        for bad in [
            json!([]),
            json!({"T": []}),
            json!({"T": {"not-a-uuid": {"new": {}}}}),
            json!({"T": {U1: {}}}),
            json!({"T": {U1: {"new": 5}}}),
        ] {
            assert!(parse_table_updates(&bad).is_err(), "{bad}");
        }
        for bad in [
            json!({"T": {U1: {"insert": {}, "delete": null}}}),
            json!({"T": {U1: {"upsert": {}}}}),
            json!({"T": {U1: {"modify": []}}}),
        ] {
            assert!(parse_table_updates2(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn update2_is_normalized_against_the_replica() {
        let (mut m, tx) = monitor();
        feed(
            &tx,
            "monitor_cond",
            json!({"T": {U1: {"initial": {"name": "a", "addrs": ["set", ["x", "y"]]}}}}),
        );
        let ev = m.try_next().unwrap().unwrap();
        let MonitorEvent::Initial(init) = &ev else {
            panic!("{ev:?}")
        };
        // defaults are filled in for omitted columns
        assert_eq!(
            init["T"][&u(U1)].new.as_ref().unwrap(),
            json!({"name": "a", "addrs": ["set", ["x", "y"]], "tag": ["set", []], "opts": ["map", []]}).as_object().unwrap()
        );
        feed(
            &tx,
            "update2",
            json!({"T": {U1: {"modify": {"tag": 5, "addrs": ["set", ["x", "z"]], "opts": ["map", [["k", "v"]]]}}}}),
        );
        let ev = m.try_next().unwrap().unwrap();
        let ru = &ev.updates()["T"][&u(U1)];
        assert!(ru.is_modify());
        assert_eq!(ru.old.as_ref().unwrap()["tag"], json!(["set", []]));
        let new = ru.new.as_ref().unwrap();
        assert_eq!(new["tag"], json!(5));
        assert_eq!(new["addrs"], json!(["set", ["y", "z"]]));
        assert_eq!(new["opts"], json!(["map", [["k", "v"]]]));
        assert_eq!(ru.changed_columns(), vec!["addrs", "opts", "tag"]);
        assert_eq!(m.rows("T").unwrap()[&u(U1)]["tag"], json!(5));

        feed(
            &tx,
            "update2",
            json!({"T": {U1: {"delete": null}, U2: {"insert": {"name": "b"}}}}),
        );
        let ev = m.try_next().unwrap().unwrap();
        assert!(ev.updates()["T"][&u(U1)].is_delete());
        assert_eq!(
            ev.updates()["T"][&u(U1)].old.as_ref().unwrap()["tag"],
            json!(5)
        );
        assert!(ev.updates()["T"][&u(U2)].is_insert());
        assert_eq!(m.rows("T").unwrap().len(), 1);

        // malformed updates are Protocol errors and leave the replica alone
        feed(
            &tx,
            "update2",
            json!({"T": {U1: {"modify": {"name": "zz"}}}}),
        );
        assert!(
            matches!(m.try_next(), Some(Err(Error::Protocol(e))) if e.contains("never announced"))
        );
        feed(&tx, "update2", json!("garbage"));
        assert!(matches!(m.try_next(), Some(Err(Error::Protocol(e))) if e.contains("malformed")));
        feed(&tx, "update2", json!({"T": {U2: {"modify": {"tag": "x"}}}}));
        assert!(matches!(m.try_next(), Some(Err(Error::Decode { .. }))));
        assert_eq!(m.rows("T").unwrap()[&u(U2)]["tag"], json!(["set", []]));

        // a new initial state replaces the replica
        feed(&tx, "monitor_cond", json!({}));
        let ev = m.try_next().unwrap().unwrap();
        assert_eq!(
            ev,
            MonitorEvent::Initial(BTreeMap::from([("T".to_string(), BTreeMap::new())]))
        );
        assert!(m.rows("T").unwrap().is_empty());
        assert!(m.try_next().is_none());
        drop(tx);
        assert!(matches!(m.try_next(), Some(Err(Error::Disconnected(_)))));
    }

    #[test]
    fn rfc_updates_get_complete_old_rows() {
        let (mut m, tx) = monitor();
        feed(
            &tx,
            "monitor",
            json!({"T": {U1: {"new": {"name": "a", "tag": 1, "addrs": ["set", []], "opts": ["map", []]}}}}),
        );
        assert!(m.try_next().unwrap().unwrap().is_initial());
        feed(
            &tx,
            "update",
            json!({"T": {U1: {"old": {"tag": 1}, "new": {"name": "a", "tag": 2, "addrs": ["set", []], "opts": ["map", []]}}}}),
        );
        let ev = m.try_next().unwrap().unwrap();
        let ru = &ev.updates()["T"][&u(U1)];
        assert_eq!(ru.old.as_ref().unwrap()["name"], json!("a"));
        assert_eq!(ru.changed_columns(), vec!["tag"]);
        feed(
            &tx,
            "update",
            json!({"T": {U1: {"old": {"name": "a", "tag": 2, "addrs": ["set", []], "opts": ["map", []]}}}}),
        );
        assert!(m.try_next().unwrap().unwrap().updates()["T"][&u(U1)].is_delete());
        tx.send(Feed::Canceled).unwrap();
        assert!(matches!(m.try_next(), Some(Err(Error::MonitorCanceled(_)))));
    }

    #[test]
    fn requests_are_validated_and_serialized() {
        let s = schema();
        let spec = MonitorSpec::new(
            s.clone(),
            vec![
                MonitorRequest::table("T")
                    .columns(&["name"])
                    .conditions(vec![json!(["name", "==", "a"])]),
                MonitorRequest::table("T")
                    .columns(&["tag"])
                    .select(MonitorSelect {
                        initial: false,
                        ..Default::default()
                    }),
            ],
        )
        .unwrap();
        assert!(spec.has_conditions());
        assert_eq!(spec.columns["T"], vec!["name", "tag"]);
        assert_eq!(
            spec.params(MonitorMethod::MonitorCond, "id"),
            json!(["Test", "id", {"T": [
                {"columns": ["name"], "where": [["name", "==", "a"]]},
                {"columns": ["tag"], "select": {"initial": false, "insert": true, "delete": true, "modify": true}}
            ]}])
        );
        assert_eq!(
            spec.params(MonitorMethod::Monitor, "id")[2]["T"][0],
            json!({"columns": ["name"]})
        );
        assert!(matches!(
            MonitorSpec::new(s.clone(), vec![MonitorRequest::table("X")]),
            Err(Error::UnknownTable { .. })
        ));
        assert!(matches!(
            MonitorSpec::new(
                s.clone(),
                vec![MonitorRequest::table("T").columns(&["nope"])]
            ),
            Err(Error::UnknownColumn { .. })
        ));
        assert!(matches!(
            MonitorSpec::new(
                s.clone(),
                vec![MonitorRequest::table("T").conditions(vec![json!(["nope", "==", 1])])]
            ),
            Err(Error::UnknownColumn { .. })
        ));
        assert!(MonitorSpec::new(s, vec![]).is_err());
    }
}
