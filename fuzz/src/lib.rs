//! The checks behind roam's fuzz targets: one function per target, holding the whole check,
//! so that each `fuzz_targets/NAME.rs` is a one-liner and the same checks run in this
//! crate's tests (over `seeds/NAME/` and deterministic pseudo-random inputs).
//!
//! Every function takes arbitrary bytes and must not panic. A panic means an invariant of
//! roam's code was broken; each function's doc comment states the invariants it checks.
//! Inputs are fed to the parsers as the untrusted peer would send them: bytes (OVSDB
//! framing, CNI stdin, request bodies) or UTF-8 text (annotations, environment variables,
//! command lines); input that is not UTF-8 is skipped where the real caller only ever has
//! a `str`.
#![warn(missing_docs)]

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::Path;
use std::str::FromStr;
use std::sync::OnceLock;

use roam_api::{MigrateTo, MigrateToError, NetworkMode, NetworkSpec};
use roam_cni::check::{Observed, ObservedAddr, ObservedLink, ObservedPort, ObservedRoute};
use roam_cni::config::{AttachmentKey, Command};
use roam_cni::result::{CniResult, SCOPE_LINK};
use roam_contract::annotation::{self, Mode};
use roam_core::network as net;
use roam_dhcp_opts::{DhcpOptionsRow, Lease, MacAddr, rfc3442};
use roam_ovsdb::schema::ColumnType;
use roam_ovsdb::{Atom, DatabaseSchema, Datum, Framer, RowUpdate2, TableRow, Uuid};
use roam_shim_api::api;
use roam_shim_api::launch::LaunchArgs;
use roam_shim_api::token::TokenDigest;
use serde_json::{Value, json};

/// The input as text, if it is UTF-8 (the real callers of the text parsers only have `str`).
fn text(data: &[u8]) -> Option<&str> {
    std::str::from_utf8(data).ok()
}

// ---------------------------------------------------------------------------------------
// OVSDB
// ---------------------------------------------------------------------------------------

/// What a framer made of a byte stream: the values, the error that ended it (the
/// connection closes on the first one), and the bytes still pending when no error came.
#[derive(Debug, PartialEq)]
struct Framed {
    values: Vec<Value>,
    error: Option<String>,
    pending: usize,
}

/// Feed `pieces` to a fresh [`Framer`] one after another, taking every complete value after
/// each piece, and stop at the first error (as the connection does).
fn frame<'a>(pieces: impl IntoIterator<Item = &'a [u8]>) -> Framed {
    let mut f = Framer::new();
    let mut values = Vec::new();
    for piece in pieces {
        f.push(piece);
        loop {
            match f.next_value() {
                Ok(Some(v)) => values.push(v),
                Ok(None) => break,
                Err(e) => {
                    return Framed {
                        values,
                        error: Some(e.to_string()),
                        pending: 0,
                    };
                }
            }
        }
    }
    Framed {
        values,
        error: None,
        pending: f.pending(),
    }
}

/// `ovsdb_framing`: the OVSDB stream framer ([`roam_ovsdb::Framer`]).
///
/// Invariants:
/// - the framer never panics, whatever the peer sends;
/// - the stream's cut does not matter: fed in two pieces (cut at a position taken from the
///   input's first byte) or one byte at a time, it yields the same values, the same error
///   and leaves the same number of bytes pending as when fed at once;
/// - it agrees with serde_json: when serde_json's `StreamDeserializer` reads the whole input
///   as a sequence of objects and arrays, the framer yields exactly those values, with
///   nothing pending and no error; and when the framer yields values with nothing pending
///   and no error, serde_json reads the same sequence.
pub fn ovsdb_framing(data: &[u8]) {
    let whole = frame([data]);
    if let Some(&b) = data.first() {
        let cut = usize::from(b) * (data.len() + 1) / 256;
        let (a, rest) = data.split_at(cut.min(data.len()));
        assert_eq!(frame([a, rest]), whole, "cut at {cut}");
    }
    assert_eq!(frame(data.chunks(1)), whole, "fed one byte at a time");
    let stream: Result<Vec<Value>, _> = serde_json::Deserializer::from_slice(data)
        .into_iter::<Value>()
        .collect();
    match stream {
        Ok(values) if values.iter().all(|v| v.is_object() || v.is_array()) => {
            let want = Framed {
                values,
                error: None,
                pending: 0,
            };
            assert_eq!(whole, want, "serde_json reads the stream");
        }
        _ => assert!(
            whole.error.is_some() || whole.pending > 0,
            "the framer accepted a stream serde_json refuses: {whole:?}"
        ),
    }
}

/// A schema with a column of every shape `update2` and `decode` treat differently: scalars
/// of each atomic type, optional values, sets, maps, a single-pair map, constrained and
/// reference types.
fn test_schema() -> &'static DatabaseSchema {
    static SCHEMA: OnceLock<DatabaseSchema> = OnceLock::new();
    SCHEMA.get_or_init(|| {
        DatabaseSchema::from_json(&json!({
            "name": "Fuzz", "version": "1.0.0",
            "tables": {"T": {"columns": test_schema_columns()}}
        }))
        .expect("the fuzz schema parses")
    })
}

/// The columns of [`test_schema`]'s table `T`, as JSON.
fn test_schema_columns() -> Value {
    json!({
        "name": {"type": "string"},
        "n": {"type": "integer"},
        "weight": {"type": "real"},
        "up": {"type": "boolean"},
        "tag": {"type": {"key": {"type": "integer", "minInteger": 1, "maxInteger": 4095}, "min": 0, "max": 1}},
        "kind": {"type": {"key": {"type": "string", "enum": ["set", ["a", "b"]]}}},
        "addrs": {"type": {"key": "string", "min": 0, "max": "unlimited"}},
        "nums": {"type": {"key": "integer", "min": 1, "max": "unlimited"}},
        "reals": {"type": {"key": "real", "min": 0, "max": 4}},
        "flags": {"type": {"key": "boolean", "min": 0, "max": 2}},
        "opts": {"type": {"key": "string", "value": "string", "min": 0, "max": "unlimited"}},
        "rate": {"type": {"key": "string", "value": {"type": "integer", "minInteger": 1}, "min": 0, "max": "unlimited"}},
        "pair": {"type": {"key": "string", "value": "string", "min": 0, "max": 1}},
        "peer": {"type": {"key": {"type": "uuid", "refTable": "T", "refType": "weak"}, "min": 0, "max": 1}},
        "ports": {"type": {"key": {"type": "uuid", "refTable": "T"}, "min": 0, "max": "unlimited"}}
    })
}

/// The columns of [`test_schema`]'s table `T`.
fn test_columns() -> impl Iterator<Item = (&'static String, &'static ColumnType)> {
    test_schema()
        .table("T")
        .expect("table T")
        .columns
        .iter()
        .map(|(name, c)| (name, &c.ty))
}

/// Whether `list` holds `a` (atoms are compared as the code compares them, with `==`).
fn holds(list: &[Atom], a: &Atom) -> bool {
    list.iter().any(|x| x == a)
}

fn unique(list: &[Atom]) -> bool {
    list.iter().enumerate().all(|(i, a)| !holds(&list[..i], a))
}

/// `ovsdb_datum`: OVSDB atoms and values in their RFC 7047 JSON forms ([`Atom::from_json`],
/// [`Datum::from_json`], [`Datum::apply_diff`]) and as a schema decodes them
/// ([`ColumnType::decode`], [`ColumnType::decode_for_transact`], [`ColumnType::apply_diff`]).
///
/// The input is one JSON value. Invariants:
/// - whatever decodes re-encodes to JSON that decodes to the same atom or value (untyped,
///   and for every column type of a test schema, also in a transaction);
/// - for a pair `[current, diff]`: a set difference toggles each element, so two sets
///   without repeated elements give the symmetric difference, without repeats; a map
///   difference applied to a map with unique keys leaves the keys unique;
/// - a column's `apply_diff` yields a value its column type decodes.
pub fn ovsdb_datum(data: &[u8]) {
    let Ok(v) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    if let Ok(a) = Atom::from_json(&v) {
        assert_eq!(Atom::from_json(&a.to_json()), Ok(a.clone()), "atom {v}");
    }
    if let Ok(d) = Datum::from_json(&v) {
        assert_eq!(Datum::from_json(&d.to_json()), Ok(d.clone()), "datum {v}");
    }
    for (name, ty) in test_columns() {
        if let Ok(d) = ty.decode(&v) {
            assert_eq!(ty.decode(&d.to_json()), Ok(d.clone()), "column {name}: {v}");
        }
        if let Ok(d) = ty.decode_for_transact(&v) {
            let again = ty.decode_for_transact(&d.to_json());
            assert_eq!(again, Ok(d), "column {name} in a transaction: {v}");
        }
    }
    let Some([cur, diff]) = v.as_array().map(Vec::as_slice) else {
        return;
    };
    if let (Ok(c), Ok(d)) = (Datum::from_json(cur), Datum::from_json(diff)) {
        let mut out = c.clone();
        match (out.apply_diff(&d), &c, &d) {
            (Ok(()), Datum::Set(c), Datum::Set(d)) if unique(c) && unique(d) => {
                let Datum::Set(o) = &out else {
                    panic!("a set difference made a map: {out:?}")
                };
                assert!(unique(o), "repeated elements after a set difference: {v}");
                for a in c.iter().chain(d) {
                    assert_eq!(holds(o, a), holds(c, a) != holds(d, a), "{a:?} in {v}");
                }
                assert!(o.iter().all(|a| holds(c, a) || holds(d, a)));
            }
            (Ok(()), Datum::Map(c), Datum::Map(_)) => {
                let keys =
                    |m: &[(Atom, Atom)]| m.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>();
                let Datum::Map(o) = &out else {
                    panic!("a map difference made a set: {out:?}")
                };
                if unique(&keys(c)) {
                    assert!(
                        unique(&keys(o)),
                        "repeated keys after a map difference: {v}"
                    );
                }
            }
            (Ok(()), _, _) => {}
            (Err(_), c, d) => assert_ne!(
                std::mem::discriminant(c),
                std::mem::discriminant(d),
                "a difference of the same kind was refused: {v}"
            ),
        }
    }
    for (name, ty) in test_columns() {
        if let Ok(out) = ty.apply_diff(cur, diff) {
            assert!(
                ty.decode(&out).is_ok(),
                "column {name}: apply_diff({cur}, {diff}) = {out}, which does not decode"
            );
        }
    }
}

/// Decode `row` of `T`'s table as `T`; what decodes re-encodes (as an insert's row) to a
/// row that decodes to the same value.
fn typed_row<T: TableRow + PartialEq + std::fmt::Debug>(uuid: &Uuid, row: &roam_ovsdb::Row) {
    if let Ok(t) = roam_ovsdb::decode_row::<T>(T::TABLE, uuid, row) {
        let json = roam_ovsdb::row_json(&t);
        let back = json.as_object().expect("a row is an object");
        let again = roam_ovsdb::decode_row::<T>(T::TABLE, uuid, back);
        assert_eq!(again.ok().as_ref(), Some(&t), "{} row {row:?}", T::TABLE);
    }
}

/// Decode a row as the typed row of its table, if roam has one.
fn typed(table: &str, uuid: &Uuid, row: &roam_ovsdb::Row) {
    use roam_ovsdb::{nb, vswitch};
    macro_rules! tables {
        ($($t:ty),*) => {
            $(if table == <$t as TableRow>::TABLE { typed_row::<$t>(uuid, row); })*
        };
    }
    tables!(
        nb::LogicalSwitch,
        nb::LogicalSwitchPort,
        nb::LogicalRouter,
        nb::LogicalRouterPort,
        nb::LogicalRouterStaticRoute,
        nb::Nat,
        nb::DhcpOptions,
        nb::Qos,
        vswitch::Bridge,
        vswitch::Port,
        vswitch::Interface
    );
}

/// `ovsdb_monitor_update`: monitor replies and `update`/`update2` notifications
/// ([`roam_ovsdb::parse_table_updates`], [`roam_ovsdb::parse_table_updates2`]), the typed
/// rows decoded from them ([`roam_ovsdb::decode_row`]) and the `update2` differences
/// applied with a schema ([`ColumnType::apply_diff`]), as a monitor applies them.
///
/// The input is one JSON value: table updates, or a JSON-RPC `update`/`update2`
/// notification whose `params` are `[monitor-id, table-updates]` (taken apart as the
/// connection does). Invariants:
/// - a parsed `update` row has `old` or `new`, and is exactly one of insert, modify,
///   delete; its changed columns are sorted and unique;
/// - a typed row (`nb::*`, `vswitch::*`) that decodes re-encodes to a row that decodes to
///   the same value;
/// - `update2` applied to a replica as a monitor does: every modified column's new value
///   decodes under its column type.
pub fn ovsdb_monitor_update(data: &[u8]) {
    let Ok(v) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    let updates = match v.get("method").and_then(Value::as_str) {
        Some("update" | "update2") => match v.get("params").and_then(Value::as_array) {
            Some(p) => match p.as_slice() {
                [Value::String(_), u] => u.clone(),
                [Value::String(_)] => Value::Null,
                _ => return,
            },
            None => return,
        },
        _ => v,
    };
    if let Ok(tu) = roam_ovsdb::parse_table_updates(&updates) {
        for (table, rows) in &tu {
            for (uuid, ru) in rows {
                assert!(ru.old.is_some() || ru.new.is_some(), "{table} {uuid}");
                let kinds = [ru.is_insert(), ru.is_modify(), ru.is_delete()];
                assert_eq!(kinds.iter().filter(|k| **k).count(), 1, "{table} {uuid}");
                let cols = ru.changed_columns();
                assert!(cols.windows(2).all(|w| w[0] < w[1]), "{cols:?}");
                for row in ru.old.iter().chain(&ru.new) {
                    typed(table, uuid, row);
                }
            }
        }
    }
    if let Ok(tu2) = roam_ovsdb::parse_table_updates2(&updates) {
        let schema = test_schema();
        // the replica of table T, as a monitor keeps it: initial and inserted rows first
        let mut replica: BTreeMap<Uuid, roam_ovsdb::Row> = BTreeMap::new();
        for (table, rows) in &tu2 {
            for (uuid, ru) in rows {
                match ru {
                    RowUpdate2::Initial(row) | RowUpdate2::Insert(row) => {
                        typed(table, uuid, row);
                        if table == "T" {
                            let mut full = row.clone();
                            for (name, ty) in test_columns() {
                                full.entry(name.clone())
                                    .or_insert_with(|| ty.default_json());
                            }
                            replica.insert(*uuid, full);
                        }
                    }
                    RowUpdate2::Modify(_) | RowUpdate2::Delete => {}
                }
            }
        }
        for (uuid, ru) in tu2.get("T").into_iter().flatten() {
            let RowUpdate2::Modify(diff) = ru else {
                continue;
            };
            let Some(mut row) = replica.get(uuid).cloned() else {
                continue;
            };
            for (col, d) in diff {
                let Ok(cs) = schema.column("T", col) else {
                    continue;
                };
                let cur = row
                    .get(col)
                    .cloned()
                    .unwrap_or_else(|| cs.ty.default_json());
                if let Ok(new) = cs.ty.apply_diff(&cur, d) {
                    assert!(
                        cs.ty.decode(&new).is_ok(),
                        "T.{col}: apply_diff({cur}, {d}) = {new}, which does not decode"
                    );
                    row.insert(col.clone(), new);
                }
            }
        }
    }
}

#[cfg(test)]
thread_local! {
    /// Monitor events checked on this thread (the tests check that the seeds reach them).
    static EVENTS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// A current-thread runtime and a Unix socket listener, one per thread, for
/// [`ovsdb_client`].
struct Harness {
    rt: tokio::runtime::Runtime,
    listener: tokio::net::UnixListener,
    endpoint: String,
}

thread_local! {
    static HARNESS: Harness = {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!("roam-fuzz-{}-{n}.sock", std::process::id()));
        if n == 0 {
            remove_dead_sockets();
        }
        let _ = std::fs::remove_file(&path);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        let listener = {
            let _guard = rt.enter();
            tokio::net::UnixListener::bind(&path).expect("a Unix socket in the temp directory")
        };
        Harness { rt, listener, endpoint: format!("unix:{}", path.display()) }
    };
}

/// Removes the sockets of earlier fuzzing processes that have ended: libFuzzer ends a
/// process with `exit`, which runs no thread-local destructor, so each process's sockets
/// stay behind in the temp directory until the next one starts.
fn remove_dead_sockets() {
    let Ok(dir) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for e in dir.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("roam-fuzz-"))
            .and_then(|n| n.strip_suffix(".sock"))
            .and_then(|n| n.split_once('-'))
            .map(|(pid, _)| pid.to_string())
        else {
            continue;
        };
        if !std::path::Path::new("/proc").join(&pid).exists() {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// The scripted server of [`ovsdb_client`]: answers `get_schema` with [`test_schema`]'s
/// JSON, the first monitor request with `{"id": ID,` + `reply` + `}` followed by `after`
/// (`$MON` in both replaced by the monitor id), then closes its side for writing and reads
/// until the client closes.
async fn scripted_server(mut s: tokio::net::UnixStream, reply: Vec<u8>, after: Vec<u8>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut framer = Framer::new();
    let mut buf = vec![0u8; 16 * 1024];
    let mut answered = false;
    loop {
        let n = match s.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        framer.push(&buf[..n]);
        while let Ok(Some(req)) = framer.next_value() {
            if answered {
                continue;
            }
            let id = req["id"].to_string();
            let out = match req["method"].as_str() {
                Some("get_schema") => {
                    json!({"id": req["id"], "result": schema_json(), "error": null})
                        .to_string()
                        .into_bytes()
                }
                Some("monitor" | "monitor_cond") => {
                    let mon = req["params"][1].as_str().unwrap_or_default().to_string();
                    let sub = |b: &[u8]| {
                        String::from_utf8_lossy(b)
                            .replace("$MON", &mon)
                            .into_bytes()
                    };
                    answered = true;
                    [
                        format!("{{\"id\":{id},").into_bytes(),
                        sub(&reply),
                        b"}".to_vec(),
                        sub(&after),
                    ]
                    .concat()
                }
                _ => continue,
            };
            if s.write_all(&out).await.is_err() {
                return;
            }
            if answered {
                let _ = s.shutdown().await;
            }
        }
    }
}

/// [`test_schema`] as JSON.
fn schema_json() -> &'static Value {
    static JSON: OnceLock<Value> = OnceLock::new();
    JSON.get_or_init(|| {
        json!({
            "name": "Fuzz", "version": "1.0.0",
            "tables": {
                "T": {"columns": test_schema_columns()},
                "U": {"columns": {"name": {"type": "string"}, "t": {"type": {"key": {"type": "uuid", "refTable": "T"}, "min": 0, "max": "unlimited"}}}}
            }
        })
    })
}

/// Check a monitor event against the monitor's replica: every monitored table is in an
/// initial event and the replica then holds exactly its rows; a changed row is in the
/// replica as its `new` value, a deleted one is gone; a `new` row of a monitored table has
/// every monitored column.
fn check_event(m: &roam_ovsdb::Monitor, ev: &roam_ovsdb::MonitorEvent) {
    #[cfg(test)]
    EVENTS.with(|n| n.set(n.get() + 1));
    let updates = ev.updates();
    if ev.is_initial() {
        for t in ["T", "U"] {
            assert!(updates.contains_key(t), "initial event without table {t}");
        }
    }
    for (table, rows) in updates {
        let replica = m.rows(table);
        for (uuid, ru) in rows {
            let held = replica.and_then(|r| r.get(uuid));
            assert_eq!(held, ru.new.as_ref(), "{table} {uuid} in the replica");
            if let (Some(new), Some(cols)) = (&ru.new, m.columns(table)) {
                for c in cols {
                    assert!(
                        new.contains_key(c),
                        "{table} {uuid}: new row without column {c}"
                    );
                }
            }
        }
        if ev.is_initial() {
            let want = rows.values().filter(|r| r.new.is_some()).count();
            assert_eq!(
                replica.map_or(0, |r| r.len()),
                want,
                "initial rows of {table}"
            );
        }
    }
}

/// `ovsdb_client`: a roam-ovsdb [`roam_ovsdb::Client`] and [`roam_ovsdb::Monitor`] talking
/// to a scripted OVSDB server over a Unix socket: the connection's framing and JSON-RPC
/// routing (replies by id, `update`/`update2` notifications by monitor id, `echo`,
/// malformed messages) and the monitor's normalization of what arrives into events and its
/// replica.
///
/// The first byte picks the method (0: `monitor`, 1: `monitor_cond`, else automatic); the
/// rest is `REPLY` [NUL `AFTER`]: the server answers `get_schema` itself (a test schema),
/// then answers the monitor request with `{"id": ID,` `REPLY` `}`, sends `AFTER` (any bytes,
/// e.g. notifications; `$MON` stands for the monitor id) and closes.
///
/// Invariants: nothing panics or hangs; the monitor request ends with a monitor or an
/// error; the monitor's events end with [`roam_ovsdb::Error::Disconnected`] once the server
/// closed; every event agrees with the monitor's replica (see [`check_event`]).
pub fn ovsdb_client(data: &[u8]) {
    use roam_ovsdb::{Client, ClientOptions, MonitorMethod, MonitorRequest};
    let Some((&m, rest)) = data.split_first() else {
        return;
    };
    let method = match m {
        0 => MonitorMethod::Monitor,
        1 => MonitorMethod::MonitorCond,
        _ => MonitorMethod::Auto,
    };
    let (reply, after) = match rest.iter().position(|&b| b == 0) {
        Some(i) => (rest[..i].to_vec(), rest[i + 1..].to_vec()),
        None => (rest.to_vec(), vec![]),
    };
    HARNESS.with(|h| {
        h.rt.block_on(async {
            let options = ClientOptions {
                request_timeout: std::time::Duration::from_secs(5),
                inactivity_probe: None,
                ..ClientOptions::default()
            };
            let (client, accepted) = tokio::join!(
                Client::connect_with(&h.endpoint, options),
                h.listener.accept()
            );
            let client = client.expect("the client connects");
            let (stream, _) = accepted.expect("the server accepts");
            let server = tokio::spawn(scripted_server(stream, reply, after));
            let requests = vec![MonitorRequest::table("T"), MonitorRequest::table("U")];
            if let Ok(mut monitor) = client.monitor_with("Fuzz", requests, method).await {
                loop {
                    match monitor.next().await {
                        Ok(ev) => check_event(&monitor, &ev),
                        Err(roam_ovsdb::Error::Disconnected(_)) => break,
                        Err(_) => {}
                    }
                }
            }
            drop(client);
            server.await.expect("the scripted server ends");
        })
    })
}

// ---------------------------------------------------------------------------------------
// Annotations
// ---------------------------------------------------------------------------------------

/// `annotation_interfaces`: `roam.dev/interfaces`, written by users
/// ([`annotation::parse_interfaces`], [`annotation::InterfaceRequest::marking`],
/// [`annotation::InterfaceRequest::requested_mac`]).
///
/// Invariants: an accepted annotation lists 1 to [`annotation::MAX_INTERFACES`]
/// interfaces with unique names; every interface's service class and MAC parse (the MAC
/// unicast and not zero); a DHCP interface has no static IP; an underlay interface has a
/// VLAN or a network; and the list serialized again parses to the same list.
pub fn annotation_interfaces(data: &[u8]) {
    let Some(s) = text(data) else { return };
    let list = match annotation::parse_interfaces(s) {
        Ok(list) => list,
        Err(e) => {
            let _ = e.to_string();
            return;
        }
    };
    assert!((1..=annotation::MAX_INTERFACES).contains(&list.len()));
    for (i, r) in list.iter().enumerate() {
        assert!(
            list[..i]
                .iter()
                .all(|o| o.interface.name != r.interface.name)
        );
        r.marking().expect("a validated service class parses");
        if let Some(mac) = r.requested_mac().expect("a validated MAC parses") {
            assert!(!mac.is_multicast() && !mac.is_zero(), "{mac}");
        }
        assert!(!(r.interface.dhcp && r.interface.ip.is_some()));
        if r.mode == Mode::Underlay {
            assert!(r.vlan.is_some() || r.network.is_some());
        }
        if let Some(v) = &r.vlan {
            assert!((1..=4094).contains(&v.tag));
        }
    }
    let again = serde_json::to_string(&list).expect("requests serialize");
    assert_eq!(annotation::parse_interfaces(&again), Ok(list), "{again}");
}

/// An observation of the pod and the node that matches `r` exactly: what CHECK sees right
/// after the ADD that returned `r`.
fn observed_for(r: &CniResult) -> Observed {
    let mut obs = Observed::default();
    for i in &r.interfaces {
        let link = ObservedLink {
            name: i.name.clone(),
            mac: i.mac.clone(),
            mtu: i.mtu,
            up: true,
        };
        if i.sandbox.is_some() {
            obs.pod_links.push(link);
        } else {
            obs.host_links.push(link);
            obs.ports.push(ObservedPort {
                name: i.name.clone(),
                iface_id: Some("port".into()),
                ofport: Some(1),
            });
        }
    }
    for ip in &r.ips {
        if let Some((addr, prefix_len)) = roam_cni::result::parse_cidr(&ip.address) {
            let ifname = ip
                .interface
                .and_then(|i| r.interfaces.get(i))
                .map(|i| i.name.clone())
                .unwrap_or_default();
            obs.pod_addrs.push(ObservedAddr {
                ifname,
                ip: addr,
                prefix_len,
            });
        }
    }
    for route in &r.routes {
        if let Some((dst, prefix_len)) = roam_cni::result::parse_cidr(&route.dst) {
            obs.pod_routes.push(ObservedRoute {
                dst,
                prefix_len,
                gw: route.gw,
                ifname: None,
                metric: route.priority.unwrap_or(0),
                scope: if route.scope == Some(SCOPE_LINK) {
                    SCOPE_LINK
                } else {
                    0
                },
            });
        }
    }
    obs
}

/// Whether CHECK can be satisfied at all: every address and route is `A/P`, and interface
/// names are unique on each side (pod, host).
fn satisfiable(r: &CniResult) -> bool {
    let cidrs = r
        .ips
        .iter()
        .map(|i| &i.address)
        .chain(r.routes.iter().map(|x| &x.dst));
    let names_unique = r.interfaces.iter().enumerate().all(|(n, i)| {
        r.interfaces[..n]
            .iter()
            .all(|o| o.name != i.name || o.sandbox.is_some() != i.sandbox.is_some())
    });
    names_unique
        && cidrs
            .into_iter()
            .all(|c| roam_cni::result::parse_cidr(c).is_some())
}

/// A CNI result rendered in every version's shape reads back as `prevResult` to what that
/// version carries; CHECK against what the result promised finds no difference.
fn check_result(r: &CniResult) {
    for version in roam_cni::config::SUPPORTED_VERSIONS {
        let rendered = roam_cni::result::render(r, version);
        let back = roam_cni::result::parse_prev(&rendered).expect("a rendered result parses");
        let mut want = r.clone();
        if !roam_cni::config::at_least(version, "1.1.0") {
            want.interfaces.iter_mut().for_each(|i| i.mtu = None);
            want.routes.iter_mut().for_each(|x| {
                x.priority = None;
                x.scope = None;
            });
        }
        assert_eq!(back, want, "rendered as {version}: {rendered}");
    }
    let _ = roam_cni::check::compare(r, &Observed::default());
    let _ = roam_cni::result::host_interfaces(r);
    if satisfiable(r) {
        let drift = roam_cni::check::compare(r, &observed_for(r));
        assert!(
            drift.is_empty(),
            "CHECK of an exact observation: {drift:?} for {r:?}"
        );
    }
}

/// `annotation_addresses`: `roam.dev/addresses`, read by the CNI plugin
/// ([`annotation::parse_addresses`], [`annotation::addresses_annotation`]), and what the CNI
/// plans and reports from it ([`roam_cni::plan::plan`], [`roam_cni::result::build`]).
///
/// Invariants: an accepted annotation has unique names, parseable unicast MACs and routes
/// (overlay: the gateway on-link, then the default route; underlay: the default route);
/// [`annotation::addresses_annotation`] accepts it and its output parses to the same list;
/// the CNI plans every interface of it, and the result of that plan renders and reads back
/// in every CNI version and satisfies CHECK against an exact observation.
pub fn annotation_addresses(data: &[u8]) {
    let Some(s) = text(data) else { return };
    let list = match annotation::parse_addresses(s) {
        Ok(list) => list,
        Err(e) => {
            let _ = e.to_string();
            return;
        }
    };
    assert!(!list.is_empty());
    for (i, a) in list.iter().enumerate() {
        assert!(list[..i].iter().all(|o| o.name != a.name));
        a.mac().expect("a validated MAC parses");
        let routes = a.routes();
        match a.mode {
            Mode::Overlay => {
                assert_eq!(routes.len(), 2);
                assert_eq!((routes[0].dst, routes[0].prefix_len), (a.gateway, 32));
            }
            Mode::Underlay => assert_eq!(routes.len(), 1),
        }
        let default = routes.last().expect("a default route");
        assert_eq!((default.prefix_len, default.via), (0, Some(a.gateway)));
    }
    let json = annotation::addresses_annotation(&list).expect("a parsed list is valid");
    assert_eq!(
        annotation::parse_addresses(&json).as_ref(),
        Ok(&list),
        "{json}"
    );

    let key = AttachmentKey {
        container_id: "c0ffee".into(),
        ifname: list[0].name.clone(),
    };
    let plans = match roam_cni::plan::plan("roam", &key, ("ns", "pod"), &list) {
        Ok(p) => p,
        // more than 255 interfaces: refused by the CNI, not by the annotation's parser
        Err(_) if list.len() > 255 => return,
        Err(e) => panic!("the CNI refused a valid annotation: {e}"),
    };
    assert_eq!(plans.len(), list.len());
    let r = roam_cni::result::build(&plans, Path::new("/run/netns/fuzz"));
    assert!(satisfiable(&r), "{r:?}");
    check_result(&r);
}

/// `migrate_to`: the `roam.dev/migrate-to` annotation on a VM
/// ([`roam_api::parse_migrate_to`]).
///
/// Invariants: blank is [`MigrateToError::Empty`]; `auto` (trimmed) is [`MigrateTo::Auto`];
/// an accepted node name is the trimmed value, a lowercase RFC 1123 subdomain of at most
/// 253 bytes, and parses to itself.
pub fn migrate_to(data: &[u8]) {
    let Some(s) = text(data) else { return };
    let parsed = roam_api::parse_migrate_to(s);
    let t = s.trim();
    match &parsed {
        Err(MigrateToError::Empty) => assert!(t.is_empty()),
        Err(e) => {
            assert!(!t.is_empty());
            let _ = e.to_string();
        }
        Ok(MigrateTo::Auto) => assert_eq!(t, "auto"),
        Ok(MigrateTo::Node(n)) => {
            assert_eq!(n, t);
            assert!(n.len() <= 253);
            assert!(n.split('.').all(|l| {
                (1..=63).contains(&l.len())
                    && !l.starts_with('-')
                    && !l.ends_with('-')
                    && l.bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            }));
            assert_eq!(roam_api::parse_migrate_to(n), parsed);
        }
    }
}

// ---------------------------------------------------------------------------------------
// CNI
// ---------------------------------------------------------------------------------------

const COMMANDS: [Command; 6] = [
    Command::Add,
    Command::Del,
    Command::Check,
    Command::Version,
    Command::Status,
    Command::Gc,
];

/// `cni_config`: the network configuration the runtime writes to the plugin's stdin
/// ([`roam_cni::config::parse_conf`], [`roam_cni::version`], [`roam_cni::error_json`]).
///
/// The first byte picks the command (ADD, DEL, CHECK, VERSION, STATUS, GC), the rest is
/// stdin. Invariants: an accepted config has a supported version that has the command, a
/// non-empty name and bridge, an OVSDB endpoint that parses, an annotation timeout in
/// (0, 3600] s, a `prevResult` object for CHECK and the valid attachments for GC; VERSION's
/// answer and the error JSON name a supported version.
pub fn cni_config(data: &[u8]) {
    let Some((&c, stdin)) = data.split_first() else {
        return;
    };
    let command = COMMANDS[usize::from(c) % COMMANDS.len()];
    let supported = |v: &Value| {
        v["cniVersion"]
            .as_str()
            .is_some_and(roam_cni::config::is_supported)
    };
    assert!(supported(&roam_cni::version(stdin)));
    match roam_cni::config::parse_conf(command, stdin) {
        Ok(conf) => {
            assert!(roam_cni::config::is_supported(&conf.cni_version));
            assert!(!conf.name.is_empty() && !conf.bridge.is_empty());
            assert!(
                roam_ovsdb::Endpoint::parse(&conf.ovs_db).is_ok(),
                "{}",
                conf.ovs_db
            );
            let t = conf.annotation_timeout.as_secs_f64();
            assert!(t > 0.0 && t <= 3600.0, "{t}");
            if let Some(p) = &conf.prev_result {
                assert!(p.is_object());
                if let Ok(r) = roam_cni::result::parse_prev(p) {
                    check_result(&r);
                }
            }
            match command {
                Command::Add => assert!(conf.kubeconfig.is_some()),
                Command::Check => assert!(conf.prev_result.is_some()),
                Command::Gc => assert!(conf.valid_attachments.is_some()),
                _ => {}
            }
        }
        Err(e) => {
            let _ = (e.code(), e.details());
            assert!(supported(&roam_cni::error_json(&e, stdin)));
        }
    }
}

/// `cni_env`: the CNI environment variables ([`roam_cni::config::parse_env`]).
///
/// The input is `NAME=VALUE` lines (a later line replaces an earlier one). Invariants: an
/// accepted environment has the attachment key exactly for ADD, DEL and CHECK, with a valid
/// container ID and interface name; a network namespace for ADD and CHECK; every
/// `CNI_ARGS` pair it kept came from the variable; asking for the pod never panics.
pub fn cni_env(data: &[u8]) {
    let Some(s) = text(data) else { return };
    let vars: BTreeMap<&str, &str> = s.lines().filter_map(|l| l.split_once('=')).collect();
    let env = match roam_cni::config::parse_env(|k| vars.get(k).map(|v| v.to_string())) {
        Ok(env) => env,
        Err(e) => {
            let _ = (e.code(), e.details(), e.to_string());
            return;
        }
    };
    let keyed = matches!(env.command, Command::Add | Command::Del | Command::Check);
    assert_eq!(env.key.is_some(), keyed);
    if keyed {
        let key = env.key();
        assert!(roam_cni::config::valid_container_id(&key.container_id));
        assert!(roam_cni::config::valid_ifname(&key.ifname));
        let _ = roam_cni::result::describe(key);
        let _ = roam_cni::plan::host_ifname("roam", key, 0);
    }
    if matches!(env.command, Command::Add | Command::Check) {
        assert!(env.netns.is_some());
    }
    let raw = vars.get("CNI_ARGS").copied().unwrap_or_default();
    for (k, v) in &env.args {
        assert!(raw.contains(&format!("{k}={v}")), "{k}={v} not in {raw:?}");
    }
    if let Ok((ns, pod)) = env.pod() {
        assert!(!ns.is_empty() && !pod.is_empty());
    }
}

/// `cni_prev_result`: the `prevResult` a runtime hands back on CHECK and DEL
/// ([`roam_cni::result::parse_prev`]) and CHECK's comparison with it
/// ([`roam_cni::check::compare`]).
///
/// The input is the `prevResult` JSON value. Invariants: a parsed result, rendered in every
/// CNI version's shape, reads back to what that version carries (1.1.0: all of it); CHECK
/// never panics, and finds nothing to report in an observation that matches the result
/// exactly, when the result can be matched at all (its addresses and routes are `A/P`,
/// its interface names unique on each side).
pub fn cni_prev_result(data: &[u8]) {
    let Ok(v) = serde_json::from_slice::<Value>(data) else {
        return;
    };
    if let Ok(r) = roam_cni::result::parse_prev(&v) {
        check_result(&r);
    }
    for ip in v["ips"].as_array().into_iter().flatten() {
        if let Some(a) = ip["address"].as_str()
            && let Some((addr, p)) = roam_cni::result::parse_cidr(a)
        {
            assert!(p <= 32);
            let again = roam_cni::result::parse_cidr(&format!("{addr}/{p}"));
            assert_eq!(again, Some((addr, p)));
        }
    }
}

// ---------------------------------------------------------------------------------------
// The shim's API and command line
// ---------------------------------------------------------------------------------------

/// Parse `data` as `T`; what parses serializes and parses to the same value.
fn round_trip<T>(data: &[u8]) -> Option<T>
where
    T: serde::de::DeserializeOwned + serde::Serialize + PartialEq + std::fmt::Debug,
{
    let t: T = serde_json::from_slice(data).ok()?;
    let json = serde_json::to_vec(&t).expect("API types serialize");
    let again: T = serde_json::from_slice(&json).expect("a serialized value parses");
    assert_eq!(again, t, "{}", String::from_utf8_lossy(&json));
    Some(t)
}

/// `shim_api_request`: the JSON bodies of roam-shim's API: the `migrate` request the shim
/// parses ([`api::MigrateRequest`]) and the answers the controller's client parses
/// ([`api::Status`], [`api::Job`], [`api::Prepared`], [`api::Events`], [`api::TornDown`],
/// [`api::Announced`], [`api::Health`], [`api::ApiError`]); and the token digest
/// ([`TokenDigest::parse_hex`]).
///
/// Invariants: every body that parses serializes and parses back to the same value; a
/// migrate request that validates has a `http://HOST:PORT` target, or an `https://` one and
/// a target node (whose certificate the target must present), a non-blank token,
/// and its limits in range, and its timeout is the one asked for (or the default); a digest
/// that parses prints as the lowercase of its (trimmed) text.
pub fn shim_api_request(data: &[u8]) {
    if let Some(r) = round_trip::<api::MigrateRequest>(data)
        && r.validate().is_ok()
    {
        assert!(r.target.starts_with("http://") || r.target.starts_with("https://"));
        assert_eq!(r.uses_tls(), r.target.starts_with("https://"));
        if r.uses_tls() {
            assert!(r.target_node.as_deref().is_some_and(|n| !n.is_empty()));
        }
        assert!(!r.target_token.trim().is_empty());
        assert!(
            r.bandwidth_mib_s
                .is_none_or(|b| (1..=api::MAX_BANDWIDTH_MIB_S).contains(&b))
        );
        assert!(
            r.max_downtime_ms
                .is_none_or(|d| (1..=api::MAX_DOWNTIME_MS).contains(&d))
        );
        let t = r.timeout().as_secs();
        assert_eq!(t, r.timeout_s.unwrap_or(api::DEFAULT_TIMEOUT_S));
        assert!((1..=api::MAX_TIMEOUT_S).contains(&t));
        let p = api::MigrateParameters::from(&r);
        assert_eq!(p.timeout_s, t);
    }
    let _ = round_trip::<api::Status>(data);
    let _ = round_trip::<api::Job>(data);
    let _ = round_trip::<api::Prepared>(data);
    let _ = round_trip::<api::Events>(data);
    let _ = round_trip::<api::TornDown>(data);
    let _ = round_trip::<api::Announced>(data);
    let _ = round_trip::<api::Health>(data);
    let _ = round_trip::<api::ApiError>(data);
    if let Some(s) = text(data)
        && let Ok(d) = TokenDigest::parse_hex(s)
    {
        assert_eq!(d.to_string(), s.trim().to_ascii_lowercase());
        assert!(TokenDigest::parse_hex(&d.to_string()).is_ok_and(|again| again == d));
    }
}

/// `shim_config`: roam-shim's command line and config file
/// ([`LaunchArgs::parse`], [`LaunchArgs::parse_with_file`], [`LaunchArgs::to_args`]), and
/// the VM limits the shim checks its values with ([`roam_shim_api::limits`]).
///
/// The input is NUL-separated words: the command line after the program name, or, when the
/// first word starts with `{`, a config file's JSON followed by the command line.
/// Invariant: what parses renders (`to_args`) to a command line that parses to the same
/// arguments.
pub fn shim_config(data: &[u8]) {
    let Some(s) = text(data) else { return };
    let mut words: Vec<String> = s.split('\0').map(str::to_string).collect();
    let parsed = if words[0].starts_with('{') {
        let file = words.remove(0);
        LaunchArgs::parse_with_file(&file, &words)
    } else {
        if words == [""] {
            words.clear();
        }
        LaunchArgs::parse(&words)
    };
    let a = match parsed {
        Ok(a) => a,
        Err(e) => {
            let _ = e.to_string();
            return;
        }
    };
    let args = a.to_args();
    match LaunchArgs::parse(&args) {
        Ok(again) => assert_eq!(again, a, "{args:?}"),
        Err(e) => panic!("the rendered command line {args:?} is refused: {e}"),
    }
    use roam_shim_api::launch::LaunchBoot;
    use roam_shim_api::limits;
    let _ = limits::domain_name_problem(&a.name);
    match &a.boot {
        LaunchBoot::Kernel {
            kernel,
            initrd,
            cmdline,
        } => {
            let _ = limits::boot_path_problem("kernel", &kernel.display().to_string());
            if let Some(i) = initrd {
                let _ = limits::boot_path_problem("initrd", &i.display().to_string());
            }
            let _ = limits::cmdline_problem(cmdline);
        }
        LaunchBoot::Disk { image, format, .. } => {
            let _ = limits::boot_path_problem("disk image", &image.display().to_string());
            let _ = limits::disk_format_problem(format);
        }
    }
}

// ---------------------------------------------------------------------------------------
// DHCP options
// ---------------------------------------------------------------------------------------

/// Routes that parse from OVN's form print to a form that parses to the same routes, and
/// encode to an RFC 3442 payload that decodes to them.
fn check_routes(routes: &[roam_dhcp_opts::Route]) {
    let ovn = rfc3442::format_ovn(routes);
    assert_eq!(rfc3442::parse_ovn(&ovn).as_deref(), Ok(routes), "{ovn}");
    let bytes = rfc3442::encode(routes);
    assert_eq!(bytes.len(), rfc3442::encoded_len(routes));
    assert_eq!(rfc3442::decode(&bytes).as_deref(), Ok(routes), "{bytes:?}");
}

/// `dhcp_rfc3442`: DHCP option 121/249 payloads ([`rfc3442::decode`]).
///
/// Invariants: what decodes re-encodes to exactly the same bytes, with the same length as
/// [`rfc3442::encoded_len`] says, and prints in OVN's form to text that parses to the same
/// routes.
pub fn dhcp_rfc3442(data: &[u8]) {
    if let Ok(routes) = rfc3442::decode(data) {
        assert_eq!(rfc3442::encode(&routes), data);
        assert_eq!(rfc3442::encoded_len(&routes), data.len());
        check_routes(&routes);
    }
}

/// `dhcp_ovn_options`: an OVN NB `DHCP_Options` row read back from the database
/// ([`Lease::from_ovn`]) and OVN's route option text ([`rfc3442::parse_ovn`]).
///
/// The input is text: the `cidr` column on the first line, then `option=value` lines.
/// Invariants: a row that reads as a lease is written back (`to_ovn`) to a row that reads as
/// the same lease, with the lease's IP as a /32; a route option that parses prints and
/// encodes to the same routes.
pub fn dhcp_ovn_options(data: &[u8]) {
    let Some(s) = text(data) else { return };
    if let Ok(routes) = rfc3442::parse_ovn(s) {
        check_routes(&routes);
    }
    let mut lines = s.lines();
    let row = DhcpOptionsRow {
        cidr: lines.next().unwrap_or_default().to_string(),
        options: lines
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    };
    for v in row.options.values() {
        if let Ok(routes) = rfc3442::parse_ovn(v) {
            check_routes(&routes);
        }
    }
    if let Ok(lease) = Lease::from_ovn(&row) {
        let back = lease.to_ovn();
        assert_eq!(back.cidr, format!("{}/32", lease.ip()));
        assert_eq!(Lease::from_ovn(&back), Ok(lease), "{back:?}");
    }
}

// ---------------------------------------------------------------------------------------
// MAC, CIDR, Network specs
// ---------------------------------------------------------------------------------------

/// The Network spec of text lines: subnet, gateway (empty: the default), then excluded
/// ranges; overlay, unless the gateway line is `underlay GATEWAY` (then VLAN 10).
fn spec_of_lines(s: &str) -> NetworkSpec {
    let mut lines = s.lines();
    let subnet = lines.next().unwrap_or_default().to_string();
    let gw = lines.next().unwrap_or_default();
    let (mode, vlan, gw) = match gw.strip_prefix("underlay ") {
        Some(g) => (NetworkMode::Underlay, Some(10), g),
        None => (NetworkMode::Overlay, None, gw),
    };
    NetworkSpec {
        mode,
        vlan,
        subnet,
        gateway: (!gw.is_empty()).then(|| gw.to_string()),
        excluded: lines.map(str::to_string).collect(),
        pool_size_per_node: None,
        refill_period_seconds: None,
        reclaim_grace_seconds: None,
        dns: vec![],
        mtu: None,
        physnet: None,
        transit_subnet: None,
        ..Default::default()
    }
}

/// Check what [`net::validate_network`] makes of `spec`.
fn check_network(spec: &NetworkSpec) {
    let Ok(plan) = net::validate_network("fuzz", spec) else {
        return;
    };
    let range = &plan.range;
    let subnet = plan.subnet();
    assert!(subnet.prefix_len() <= 30, "{subnet}");
    assert_eq!(subnet.network(), subnet.addr(), "host bits set in {subnet}");
    let gw = plan.gateway();
    assert!(subnet.contains(&gw) && gw != subnet.network() && gw != subnet.broadcast());
    assert!(!range.allows(gw), "the gateway {gw} is handed out");
    for (a, b) in &range.excluded {
        assert!(
            a <= b && subnet.contains(a) && subnet.contains(b),
            "{a}-{b} in {subnet}"
        );
        assert!(!range.allows(*a) && !range.allows(*b));
    }
    assert!((net::MIN_MTU..=net::MAX_MTU).contains(&plan.mtu));
    assert!(net::in_use_changes(&plan, &plan).is_empty());
    let _ = plan.prefix_len();
    let _ = plan.reserved_mac(roam_contract::mac_for_ip(gw));
    // free() walks the subnet: only small ones, so that one input stays fast
    if subnet.prefix_len() >= 16 {
        let free = range.free(&Default::default(), 8);
        assert!(free.windows(2).all(|w| w[0] < w[1]), "{free:?}");
        assert!(free.iter().all(|ip| range.allows(*ip)));
    }
    match plan.mode {
        NetworkMode::Overlay => {
            assert!(plan.transit.prefix_len() <= 29);
            assert!(
                !plan.transit.contains(&subnet.network())
                    && !subnet.contains(&plan.transit.network())
            );
            assert!(plan.reserved_mac(roam_contract::mac_for_ip(gw)).is_some());
            let fabric = plan.fabric_ip();
            assert!(plan.transit.contains(&fabric));
            let nodes = ["a".to_string(), "b".to_string(), "c".to_string()];
            if let Ok(Some(t)) = net::assign_transit(&plan, &[], &nodes) {
                let ips: Vec<Ipv4Addr> = t.iter().map(|t| t.ip.parse().expect("an IP")).collect();
                for (i, ip) in ips.iter().enumerate() {
                    assert!(plan.transit.contains(ip) && *ip != fabric && !ips[..i].contains(ip));
                }
                let (_, specs) = net::overlay_input(&plan, &t, &nodes);
                assert_eq!(specs.len(), nodes.len());
            }
        }
        NetworkMode::Underlay => {
            assert!(net::underlay_input(&plan).is_some());
        }
    }
}

/// `net_parsers`: MAC addresses ([`MacAddr`]), the CNI's `A/P` addresses
/// ([`roam_cni::result::parse_cidr`]) and Network specs: subnet, gateway and excluded ranges
/// ([`net::validate_network`]).
///
/// The input is text: tried as a MAC and as `A/P`; as a Network spec (JSON when it starts
/// with `{`, else lines: subnet, gateway, excluded ranges). Invariants: a MAC that parses
/// prints as the lowercase of its text, and any six bytes print to a MAC that parses back;
/// an `A/P` that parses has P ≤ 32 and prints back to itself; an accepted Network has a
/// subnet of /30 or larger without host bits, a gateway that is a host of it and never
/// handed out, excluded ranges inside it and never handed out, an MTU in range, free
/// addresses that may be handed out, in order, and (overlay) transit addresses inside the
/// transit network, distinct and not the fabric router's.
pub fn net_parsers(data: &[u8]) {
    if let Some(six) = data.get(..6) {
        let mac = MacAddr::new(six.try_into().expect("six bytes"));
        assert_eq!(mac.to_string().parse::<MacAddr>().ok(), Some(mac));
    }
    let Some(s) = text(data) else { return };
    if let Ok(mac) = MacAddr::from_str(s) {
        assert_eq!(mac.to_string(), s.to_ascii_lowercase());
    }
    if let Some((ip, p)) = roam_cni::result::parse_cidr(s) {
        assert!(p <= 32);
        assert_eq!(
            roam_cni::result::parse_cidr(&format!("{ip}/{p}")),
            Some((ip, p))
        );
    }
    if s.starts_with('{') {
        if let Ok(spec) = serde_json::from_str::<NetworkSpec>(s) {
            check_network(&spec);
        }
    } else {
        check_network(&spec_of_lines(s));
    }
}

// ---------------------------------------------------------------------------------------
// Disk images, VM and migration specs, node certificate requests
// ---------------------------------------------------------------------------------------

/// `disk_image`: a disk image's first bytes as a tenant writes them ([`roam_disk_image::inspect`]),
/// declared raw and qcow2.
///
/// Invariants: an answer for any bytes; an accepted image is within the size limit; an
/// accepted qcow2 image names no backing file (offset and length zero), sets no external
/// data file bit, and probes as qcow2; an accepted raw image probes as raw and its virtual
/// size is the file's.
pub fn disk_image(data: &[u8]) {
    use roam_disk_image::{Format, Limits, Probed, inspect, probe};
    let limits = Limits {
        max_virtual_size: 1 << 40,
    };
    let file_size = data.len() as u64 + u64::from(data.first().copied().unwrap_or(0)) * 4096;
    for declared in [Format::Raw, Format::Qcow2] {
        let Ok(image) = inspect(data, file_size, declared, &limits) else {
            continue;
        };
        assert_eq!(image.format, declared);
        assert!(image.virtual_size <= limits.max_virtual_size);
        match declared {
            Format::Raw => {
                assert_eq!(probe(data), Probed::Raw);
                assert_eq!(image.virtual_size, file_size);
            }
            Format::Qcow2 => {
                assert_eq!(probe(data), Probed::Qcow2);
                assert_eq!(&data[8..20], &[0u8; 12], "no backing file");
                if data[4..8] == 3u32.to_be_bytes() {
                    assert_eq!(data[79] & 0b100, 0, "no external data file");
                }
            }
        }
    }
}

/// `vm_spec`: a VirtualMachine or VirtualMachineMigration as a tenant writes it (JSON), its
/// spec checked as the controller checks it before creating anything
/// ([`roam_core::vm::validate::problems`], [`roam_core::migration::validate::accept`]).
///
/// Invariants: an answer for any object; a VM spec with no problem has a CPU count and
/// memory within the shim's bounds and boot paths that are absolute and plain (under the
/// image store); a migration that is accepted names a target other than the VM's node.
pub fn vm_spec(data: &[u8]) {
    use roam_api::{VirtualMachine, VirtualMachineMigration};
    let Some(s) = text(data) else { return };
    if let Ok(vm) = serde_json::from_str::<VirtualMachine>(s) {
        let problems = roam_core::vm::validate::problems(
            "ns",
            vm.metadata.name.as_deref().unwrap_or("vm"),
            &vm.spec,
            Some("/var/lib/roam/images"),
        );
        if problems.is_empty() {
            assert!((1..=roam_shim_api::limits::MAX_VCPUS).contains(&vm.spec.cpu));
            assert!(
                (roam_shim_api::limits::MIN_MEMORY_MIB..=roam_shim_api::limits::MAX_MEMORY_MIB)
                    .contains(&vm.spec.memory_mib)
            );
            let v = serde_json::to_value(&vm.spec.boot).expect("a boot source");
            for path in ["kernel", "initrd", "image"]
                .iter()
                .filter_map(|k| {
                    v.pointer(&format!("/kernel/{k}"))
                        .or(v.pointer(&format!("/disk/{k}")))
                })
                .filter_map(|p| p.as_str())
            {
                assert!(path.starts_with("/var/lib/roam/images/"), "{path}");
                assert!(!path.split('/').any(|c| c == ".."), "{path}");
            }
        }
    }
    if let Ok(m) = serde_json::from_str::<VirtualMachineMigration>(s) {
        let vm: VirtualMachine = serde_json::from_value(json!({
            "apiVersion": "roam.dev/v1alpha1", "kind": "VirtualMachine",
            "metadata": {"name": m.spec.vm, "namespace": "ns"},
            "spec": {"cpu": 1, "memoryMiB": 64, "boot": {"kernel": {"kernel": "/k"}}},
            "status": {"phase": "Running", "node": "node-a", "pod": "p"},
        }))
        .expect("a VM");
        let mut st = Default::default();
        if let Ok(target) = roam_core::migration::validate::accept(&m, Some(&vm), &mut st) {
            assert_ne!(target, "node-a");
        }
    }
}

/// `node_csr`: a CertificateSigningRequest's request as a node (or anyone) files it
/// ([`roam_pki::review`]), as the requester `system:node:node-a` of `system:nodes`.
///
/// Invariants: an answer for any bytes; a request that passes asks for exactly CN=node-a.
pub fn node_csr(data: &[u8]) {
    let groups = ["system:nodes".to_string()];
    let requester = roam_pki::Requester {
        username: "system:node:node-a",
        groups: &groups,
    };
    let facts = |n: &str| {
        Some(roam_pki::NodeFacts {
            name: n.to_string(),
            addresses: vec![],
        })
    };
    if let Ok((csr, node)) = roam_pki::review(data, requester, facts) {
        assert_eq!(node.name, "node-a");
        let cn = csr
            .params
            .distinguished_name
            .iter()
            .map(|(t, v)| format!("{t:?}={v:?}"))
            .collect::<Vec<_>>();
        assert_eq!(cn.len(), 1, "{cn:?}");
    }
    // anyone else, whatever the request: refused
    let other = roam_pki::Requester {
        username: "system:serviceaccount:ns:sa",
        groups: &[],
    };
    assert!(roam_pki::review(data, other, facts).is_err());
}

#[cfg(test)]
mod tests;
