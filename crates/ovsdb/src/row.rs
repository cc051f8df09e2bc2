//! Typed rows: a Rust struct per table, decoded from the RFC 7047 row JSON with serde.
//!
//! Row types (see [`super::nb`] and [`super::vswitch`]) implement [`TableRow`]. Their
//! column fields use [`OvsSet`](super::atom::OvsSet), [`OvsMap`](super::atom::OvsMap),
//! [`Uuid`] and [`optional`](super::atom::optional); missing columns take their default, so
//! a row can also be decoded from a monitor that watches only some columns. Serializing a
//! row gives the JSON `row` of an `insert` (without `_uuid`).

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::atom::Uuid;
#[cfg(feature = "client")]
use super::client::Client;
use super::ops;
use crate::{Error, Result};

/// A Rust type for the rows of one table.
pub trait TableRow: DeserializeOwned + Serialize {
    /// The database, e.g. `OVN_Northbound`.
    const DATABASE: &'static str;
    /// The table, e.g. `Logical_Switch`.
    const TABLE: &'static str;
    /// The columns the type reads (without `_uuid`).
    const COLUMNS: &'static [&'static str];
    /// The row's `_uuid`.
    fn uuid(&self) -> Uuid;
}

/// Every row of `T`'s table (only `T`'s columns are fetched).
#[cfg(feature = "client")]
pub async fn select_all<T: TableRow>(client: &Client) -> Result<Vec<T>> {
    select_where(client, vec![]).await
}

/// The rows of `T`'s table matching all `conditions` (see [`ops::cond`]).
#[cfg(feature = "client")]
pub async fn select_where<T: TableRow>(client: &Client, conditions: Vec<Value>) -> Result<Vec<T>> {
    let mut columns = vec!["_uuid"];
    columns.extend_from_slice(T::COLUMNS);
    let res = client
        .transact(
            T::DATABASE,
            vec![ops::select(T::TABLE, conditions, Some(&columns))],
        )
        .await?;
    decode_select::<T>(&res[0])
}

/// Decode the result of a `select` operation (`{"rows": [..]}`) into typed rows.
pub fn decode_select<T: TableRow>(result: &Value) -> Result<Vec<T>> {
    let rows = result
        .get("rows")
        .and_then(Value::as_array)
        .ok_or_else(|| {
            Error::Protocol(format!(
                "select on {} returned no \"rows\" array: {result}",
                T::TABLE
            ))
        })?;
    rows.iter()
        .map(|r| {
            serde_json::from_value(r.clone()).map_err(|e| Error::Decode {
                what: format!(
                    "{} row {}",
                    T::TABLE,
                    r.get("_uuid").map(|u| u.to_string()).unwrap_or_default()
                ),
                reason: e.to_string(),
            })
        })
        .collect()
}

/// Decode a row of `table` identified by `uuid` (as in monitor updates, whose rows do not
/// carry `_uuid`) into `T`.
pub fn decode_row<T: DeserializeOwned>(
    table: &str,
    uuid: &Uuid,
    row: &serde_json::Map<String, Value>,
) -> Result<T> {
    let mut row = row.clone();
    row.insert("_uuid".into(), uuid.to_json());
    serde_json::from_value(Value::Object(row)).map_err(|e| Error::Decode {
        what: format!("{table} row {uuid}"),
        reason: e.to_string(),
    })
}

/// The `row` of an `insert`/`update` for `row`: every column of `T`, without `_uuid`.
pub fn row_json<T: TableRow>(row: &T) -> Value {
    // rows are structs of strings, numbers, OvsSet/OvsMap/Uuid: always representable
    serde_json::to_value(row).expect("a table row serializes to JSON")
}

/// An `insert` of `row` into `T`'s table (see [`ops::insert`]).
pub fn insert_op<T: TableRow>(row: &T, uuid_name: Option<&str>) -> Value {
    ops::insert(T::TABLE, row_json(row), uuid_name)
}

/// Implement [`TableRow`] for a struct with a `uuid` field.
macro_rules! table_row {
    ($ty:ty, $db:expr, $table:literal, [$($col:literal),* $(,)?]) => {
        impl $crate::row::TableRow for $ty {
            const DATABASE: &'static str = $db;
            const TABLE: &'static str = $table;
            const COLUMNS: &'static [&'static str] = &[$($col),*];
            fn uuid(&self) -> $crate::atom::Uuid {
                self.uuid
            }
        }
    };
}
pub(crate) use table_row;

/// Test helper: `T::COLUMNS` are exactly the serialized columns.
#[cfg(test)]
pub(crate) fn assert_columns_match<T: TableRow + Default>() {
    let v = row_json(&T::default());
    let mut serialized: Vec<&str> = v
        .as_object()
        .expect("a row serializes to an object")
        .keys()
        .map(String::as_str)
        .collect();
    serialized.sort_unstable();
    let mut declared = T::COLUMNS.to_vec();
    declared.sort_unstable();
    assert_eq!(serialized, declared, "{}", T::TABLE);
}
