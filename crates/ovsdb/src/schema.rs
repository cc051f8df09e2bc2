//! The database schema (RFC 7047 section 3.2) as returned by `get_schema`: tables → columns
//! → types. Used to reject a transaction naming a table or column that does not exist (a
//! clear error instead of a server round trip), to check values against column types, and to
//! decode values and `update2` differences correctly.

use std::collections::BTreeMap;

use serde_json::Value;

use super::atom::{Atom, Datum, Uuid, tagged};
use crate::{Error, Result};

/// The schema of one database.
#[derive(Clone, Debug, PartialEq)]
pub struct DatabaseSchema {
    /// The database name, e.g. `OVN_Northbound`.
    pub name: String,
    /// The schema version, e.g. `7.0.0`.
    pub version: String,
    /// The schema checksum, if the schema has one.
    pub cksum: Option<String>,
    /// The tables by name.
    pub tables: BTreeMap<String, TableSchema>,
}

/// The schema of one table.
#[derive(Clone, Debug, PartialEq)]
pub struct TableSchema {
    /// The columns by name, without the implicit `_uuid` and `_version`.
    pub columns: BTreeMap<String, ColumnSchema>,
    /// Whether rows live on their own; rows of a non-root table are deleted by the server
    /// when no strong reference points at them any more.
    pub is_root: bool,
    /// The maximum number of rows, if limited.
    pub max_rows: Option<u64>,
    /// Sets of columns whose values must be unique across rows.
    pub indexes: Vec<Vec<String>>,
}

/// The schema of one column.
#[derive(Clone, Debug, PartialEq)]
pub struct ColumnSchema {
    /// The column's type.
    pub ty: ColumnType,
    /// Whether the column is not persisted to disk.
    pub ephemeral: bool,
    /// Whether the column may be changed after the row was inserted.
    pub mutable: bool,
}

/// A column type: a scalar, an optional value, a set or a map.
#[derive(Clone, Debug, PartialEq)]
pub struct ColumnType {
    /// The type of the atoms (of the keys, for a map).
    pub key: BaseType,
    /// The type of the values, for a map.
    pub value: Option<BaseType>,
    /// Minimum number of elements (0 or 1).
    pub min: u64,
    /// Maximum number of elements; `None` is "unlimited".
    pub max: Option<u64>,
}

/// The type of an atom and its constraints.
#[derive(Clone, Debug, PartialEq)]
pub struct BaseType {
    /// The atomic type.
    pub atomic: AtomicType,
    /// The allowed values, if restricted.
    pub enum_values: Option<Vec<Atom>>,
    /// Smallest allowed integer.
    pub min_integer: Option<i64>,
    /// Largest allowed integer.
    pub max_integer: Option<i64>,
    /// Smallest allowed real.
    pub min_real: Option<f64>,
    /// Largest allowed real.
    pub max_real: Option<f64>,
    /// Shortest allowed string.
    pub min_length: Option<u64>,
    /// Longest allowed string.
    pub max_length: Option<u64>,
    /// For a uuid: the table the uuid refers to.
    pub ref_table: Option<String>,
    /// For a reference: strong or weak.
    pub ref_type: RefType,
}

/// The five OVSDB atomic types.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AtomicType {
    /// `integer`
    Integer,
    /// `real`
    Real,
    /// `boolean`
    Boolean,
    /// `string`
    String,
    /// `uuid`
    Uuid,
}

/// How a reference to another table behaves when the target is deleted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RefType {
    /// The target cannot be deleted while referenced.
    #[default]
    Strong,
    /// The reference disappears with the target.
    Weak,
}

/// `_uuid` and `_version`, which every table has without declaring them.
static IMPLICIT_UUID: ColumnSchema = ColumnSchema {
    ty: ColumnType {
        key: BaseType {
            atomic: AtomicType::Uuid,
            enum_values: None,
            min_integer: None,
            max_integer: None,
            min_real: None,
            max_real: None,
            min_length: None,
            max_length: None,
            ref_table: None,
            ref_type: RefType::Strong,
        },
        value: None,
        min: 1,
        max: Some(1),
    },
    ephemeral: false,
    mutable: false,
};

fn bad(what: impl std::fmt::Display) -> Error {
    Error::Protocol(format!("get_schema reply: {what}"))
}

impl DatabaseSchema {
    /// Parse a `get_schema` result (or a `.ovsschema` file's contents).
    pub fn from_json(v: &Value) -> Result<Self> {
        let obj = v
            .as_object()
            .ok_or_else(|| bad(format!("schema is not an object: {v}")))?;
        let name = obj
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| bad("schema has no string \"name\""))?
            .to_string();
        let version = obj
            .get("version")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let cksum = obj.get("cksum").and_then(Value::as_str).map(str::to_string);
        let tables_json = obj
            .get("tables")
            .and_then(Value::as_object)
            .ok_or_else(|| bad(format!("schema {name} has no \"tables\" object")))?;
        let mut tables = BTreeMap::new();
        for (tname, t) in tables_json {
            let table =
                TableSchema::from_json(t).map_err(|e| bad(format!("table {tname}: {e}")))?;
            tables.insert(tname.clone(), table);
        }
        Ok(DatabaseSchema {
            name,
            version,
            cksum,
            tables,
        })
    }

    /// The table called `table`, or [`Error::UnknownTable`].
    pub fn table(&self, table: &str) -> Result<&TableSchema> {
        self.tables.get(table).ok_or_else(|| Error::UnknownTable {
            db: self.name.clone(),
            table: table.to_string(),
        })
    }

    /// The column `table.column` (including the implicit `_uuid` and `_version`), or
    /// [`Error::UnknownTable`] / [`Error::UnknownColumn`].
    pub fn column(&self, table: &str, column: &str) -> Result<&ColumnSchema> {
        self.table(table)?
            .column(column)
            .ok_or_else(|| Error::UnknownColumn {
                db: self.name.clone(),
                table: table.to_string(),
                column: column.to_string(),
            })
    }

    /// Decode a value of `table.column` sent by the server.
    pub fn decode(&self, table: &str, column: &str, value: &Value) -> Result<Datum> {
        self.column(table, column)?
            .ty
            .decode(value)
            .map_err(|reason| Error::Decode {
                what: format!("{table}.{column} value {value}"),
                reason,
            })
    }

    /// Check every operation of a transaction against the schema; see
    /// [`validate_operation`](Self::validate_operation).
    pub fn validate_transaction(&self, ops: &[Value]) -> Result<()> {
        ops.iter().try_for_each(|op| self.validate_operation(op))
    }

    /// Check one transaction operation (as built by [`super::ops`]): its table exists; the
    /// columns of its `row`, `columns`, `where` and `mutations` exist; the values of its
    /// `row` fit the column types (atomic type, set size, enum and range constraints); an
    /// `update` does not change an immutable column. Operations without a table (`comment`,
    /// `commit`, `abort`, `assert`) and unknown ones are left to the server.
    pub fn validate_operation(&self, op: &Value) -> Result<()> {
        let kind = op.get("op").and_then(Value::as_str).unwrap_or_default();
        if !matches!(
            kind,
            "insert" | "select" | "update" | "mutate" | "delete" | "wait"
        ) {
            return Ok(());
        }
        let Some(table) = op.get("table").and_then(Value::as_str) else {
            return Err(Error::InvalidValue {
                table: "?".into(),
                column: "?".into(),
                reason: format!("{kind} operation without a \"table\": {op}"),
            });
        };
        let ts = self.table(table)?;
        let invalid = |column: &str, reason: String| Error::InvalidValue {
            table: table.to_string(),
            column: column.to_string(),
            reason,
        };
        if let Some(row) = op.get("row") {
            let row = row
                .as_object()
                .ok_or_else(|| invalid("?", format!("\"row\" is not an object: {row}")))?;
            for (column, value) in row {
                let cs = self.column(table, column)?;
                if column.starts_with('_') {
                    return Err(invalid(column, "the column is read-only".into()));
                }
                if kind == "update" && !cs.mutable {
                    return Err(invalid(
                        column,
                        "the column is immutable after insert".into(),
                    ));
                }
                cs.ty
                    .decode_for_transact(value)
                    .map_err(|reason| invalid(column, reason))?;
            }
        }
        let names = |member: &str| -> Vec<String> {
            op.get(member)
                .and_then(Value::as_array)
                .map(|items| {
                    items
                        .iter()
                        .filter_map(|item| match item {
                            // a column name, or the first element of a condition/mutation
                            Value::String(s) => Some(s.clone()),
                            Value::Array(a) => {
                                a.first().and_then(Value::as_str).map(str::to_string)
                            }
                            _ => None,
                        })
                        .collect()
                })
                .unwrap_or_default()
        };
        for member in ["columns", "where", "mutations"] {
            for column in names(member) {
                if ts.column(&column).is_none() {
                    return Err(Error::UnknownColumn {
                        db: self.name.clone(),
                        table: table.to_string(),
                        column,
                    });
                }
            }
        }
        Ok(())
    }
}

impl TableSchema {
    fn from_json(v: &Value) -> std::result::Result<Self, String> {
        let obj = v.as_object().ok_or("not an object")?;
        let columns_json = obj
            .get("columns")
            .and_then(Value::as_object)
            .ok_or("no \"columns\" object")?;
        let mut columns = BTreeMap::new();
        for (cname, c) in columns_json {
            let ty = c
                .get("type")
                .ok_or_else(|| format!("column {cname} has no type"))
                .and_then(|t| {
                    ColumnType::from_json(t).map_err(|e| format!("column {cname}: {e}"))
                })?;
            columns.insert(
                cname.clone(),
                ColumnSchema {
                    ty,
                    ephemeral: c.get("ephemeral").and_then(Value::as_bool).unwrap_or(false),
                    mutable: c.get("mutable").and_then(Value::as_bool).unwrap_or(true),
                },
            );
        }
        let indexes = obj
            .get("indexes")
            .and_then(Value::as_array)
            .map(|ix| {
                ix.iter()
                    .filter_map(Value::as_array)
                    .map(|cols| {
                        cols.iter()
                            .filter_map(Value::as_str)
                            .map(str::to_string)
                            .collect()
                    })
                    .collect()
            })
            .unwrap_or_default();
        Ok(TableSchema {
            columns,
            is_root: obj.get("isRoot").and_then(Value::as_bool).unwrap_or(false),
            max_rows: obj.get("maxRows").and_then(Value::as_u64),
            indexes,
        })
    }

    /// The column `name`, including the implicit `_uuid` and `_version`.
    pub fn column(&self, name: &str) -> Option<&ColumnSchema> {
        match name {
            "_uuid" | "_version" => Some(&IMPLICIT_UUID),
            _ => self.columns.get(name),
        }
    }
}

impl AtomicType {
    fn parse(s: &str) -> std::result::Result<Self, String> {
        Ok(match s {
            "integer" => AtomicType::Integer,
            "real" => AtomicType::Real,
            "boolean" => AtomicType::Boolean,
            "string" => AtomicType::String,
            "uuid" => AtomicType::Uuid,
            other => return Err(format!("unknown atomic type {other:?}")),
        })
    }

    /// The name used in schemas, e.g. `integer`.
    pub fn name(self) -> &'static str {
        match self {
            AtomicType::Integer => "integer",
            AtomicType::Real => "real",
            AtomicType::Boolean => "boolean",
            AtomicType::String => "string",
            AtomicType::Uuid => "uuid",
        }
    }

    /// The default atom of this type (what the server omits from `update2` rows).
    pub fn default_atom(self) -> Atom {
        match self {
            AtomicType::Integer => Atom::Integer(0),
            AtomicType::Real => Atom::Real(0.0),
            AtomicType::Boolean => Atom::Boolean(false),
            AtomicType::String => Atom::String(String::new()),
            AtomicType::Uuid => Atom::Uuid(Uuid::NIL),
        }
    }
}

impl BaseType {
    fn simple(atomic: AtomicType) -> Self {
        BaseType {
            atomic,
            enum_values: None,
            min_integer: None,
            max_integer: None,
            min_real: None,
            max_real: None,
            min_length: None,
            max_length: None,
            ref_table: None,
            ref_type: RefType::Strong,
        }
    }

    fn from_json(v: &Value) -> std::result::Result<Self, String> {
        if let Some(s) = v.as_str() {
            return Ok(BaseType::simple(AtomicType::parse(s)?));
        }
        let obj = v.as_object().ok_or_else(|| format!("bad base type {v}"))?;
        let atomic = AtomicType::parse(
            obj.get("type")
                .and_then(Value::as_str)
                .ok_or_else(|| format!("base type without \"type\": {v}"))?,
        )?;
        let mut b = BaseType::simple(atomic);
        if let Some(e) = obj.get("enum") {
            let simple = BaseType::simple(atomic);
            let values = match tagged(e) {
                Some(("set", Value::Array(items))) => items
                    .iter()
                    .map(|i| simple.decode_atom(i, false))
                    .collect::<std::result::Result<Vec<_>, _>>()?,
                _ => vec![simple.decode_atom(e, false)?],
            };
            b.enum_values = Some(values);
        }
        b.min_integer = obj.get("minInteger").and_then(Value::as_i64);
        b.max_integer = obj.get("maxInteger").and_then(Value::as_i64);
        b.min_real = obj.get("minReal").and_then(Value::as_f64);
        b.max_real = obj.get("maxReal").and_then(Value::as_f64);
        b.min_length = obj.get("minLength").and_then(Value::as_u64);
        b.max_length = obj.get("maxLength").and_then(Value::as_u64);
        b.ref_table = obj
            .get("refTable")
            .and_then(Value::as_str)
            .map(str::to_string);
        if obj.get("refType").and_then(Value::as_str) == Some("weak") {
            b.ref_type = RefType::Weak;
        }
        Ok(b)
    }

    /// Decode one atom of this type; `named-uuid` is accepted for a uuid only when
    /// `allow_named` (inside a transaction).
    pub fn decode_atom(&self, v: &Value, allow_named: bool) -> std::result::Result<Atom, String> {
        let want = self.atomic.name();
        let wrong = || format!("expected {want}, got {v}");
        Ok(match self.atomic {
            AtomicType::Integer => Atom::Integer(v.as_i64().ok_or_else(wrong)?),
            AtomicType::Real => Atom::Real(v.as_f64().ok_or_else(wrong)?),
            AtomicType::Boolean => Atom::Boolean(v.as_bool().ok_or_else(wrong)?),
            AtomicType::String => Atom::String(v.as_str().ok_or_else(wrong)?.to_string()),
            AtomicType::Uuid => match tagged(v) {
                Some(("uuid", _)) => Atom::Uuid(Uuid::from_json(v)?),
                Some(("named-uuid", Value::String(n))) if allow_named => Atom::NamedUuid(n.clone()),
                _ => return Err(wrong()),
            },
        })
    }

    /// Check an atom against the enum and range constraints.
    pub fn check(&self, atom: &Atom) -> std::result::Result<(), String> {
        if let Some(allowed) = &self.enum_values
            && !allowed.contains(atom)
        {
            let names: Vec<String> = allowed.iter().map(|a| a.to_json().to_string()).collect();
            return Err(format!(
                "{} is not one of {}",
                atom.to_json(),
                names.join(", ")
            ));
        }
        match atom {
            Atom::Integer(i) => {
                if let Some(min) = self.min_integer
                    && *i < min
                {
                    return Err(format!("{i} is below the minimum {min}"));
                }
                if let Some(max) = self.max_integer
                    && *i > max
                {
                    return Err(format!("{i} is above the maximum {max}"));
                }
            }
            Atom::Real(r) => {
                if let Some(min) = self.min_real
                    && *r < min
                {
                    return Err(format!("{r} is below the minimum {min}"));
                }
                if let Some(max) = self.max_real
                    && *r > max
                {
                    return Err(format!("{r} is above the maximum {max}"));
                }
            }
            _ => {}
        }
        Ok(())
    }
}

impl ColumnType {
    fn from_json(v: &Value) -> std::result::Result<Self, String> {
        if v.is_string() {
            return Ok(ColumnType {
                key: BaseType::from_json(v)?,
                value: None,
                min: 1,
                max: Some(1),
            });
        }
        let obj = v
            .as_object()
            .ok_or_else(|| format!("bad column type {v}"))?;
        let key = BaseType::from_json(obj.get("key").ok_or("column type without \"key\"")?)?;
        let value = obj.get("value").map(BaseType::from_json).transpose()?;
        let min = match obj.get("min") {
            None => 1,
            Some(m) => m.as_u64().ok_or_else(|| format!("bad min {m}"))?,
        };
        let max = match obj.get("max") {
            None => Some(1),
            Some(Value::String(s)) if s == "unlimited" => None,
            Some(m) => Some(m.as_u64().ok_or_else(|| format!("bad max {m}"))?),
        };
        Ok(ColumnType {
            key,
            value,
            min,
            max,
        })
    }

    /// Whether the column is a map.
    pub fn is_map(&self) -> bool {
        self.value.is_some()
    }

    /// Whether the column holds exactly one atom (`min 1, max 1`, no value type).
    pub fn is_scalar(&self) -> bool {
        self.value.is_none() && self.min == 1 && self.max == Some(1)
    }

    /// Whether the column holds at most one element (or pair). `update2` sends the new
    /// value, not a difference, for such columns.
    pub fn is_single_valued(&self) -> bool {
        self.max == Some(1)
    }

    /// The column's default value in JSON (what `update2` omits from initial/insert rows):
    /// `min` default atoms, e.g. `""` for a string, `["set", []]` for an optional value.
    pub fn default_json(&self) -> Value {
        let key = self.key.atomic.default_atom();
        let datum = match (&self.value, self.min) {
            (None, 0) => Datum::Set(vec![]),
            (None, _) => Datum::Set(vec![key]),
            (Some(_), 0) => Datum::Map(vec![]),
            (Some(v), _) => Datum::Map(vec![(key, v.atomic.default_atom())]),
        };
        datum.to_json()
    }

    /// Decode a value sent by the server into a [`Datum`] of this type.
    pub fn decode(&self, v: &Value) -> std::result::Result<Datum, String> {
        self.decode_inner(v, false)
    }

    /// Decode a value to be sent in a transaction: like [`decode`](Self::decode), and also
    /// accepts `named-uuid` references and checks the number of elements and the enum and
    /// range constraints.
    pub fn decode_for_transact(&self, v: &Value) -> std::result::Result<Datum, String> {
        let d = self.decode_inner(v, true)?;
        let n = d.len() as u64;
        if n < self.min || self.max.is_some_and(|max| n > max) {
            let max = self.max.map_or("unlimited".to_string(), |m| m.to_string());
            return Err(format!(
                "{n} element(s), but the column takes {} to {max}",
                self.min
            ));
        }
        match &d {
            Datum::Set(atoms) => atoms.iter().try_for_each(|a| self.key.check(a))?,
            Datum::Map(pairs) => {
                let vt = self.value.as_ref().expect("a map has a value type");
                for (k, v) in pairs {
                    self.key.check(k)?;
                    vt.check(v)?;
                }
            }
        }
        Ok(d)
    }

    fn decode_inner(&self, v: &Value, allow_named: bool) -> std::result::Result<Datum, String> {
        if let Some(vt) = &self.value {
            let Some(("map", Value::Array(pairs))) = tagged(v) else {
                return Err(format!("expected [\"map\", [..]], got {v}"));
            };
            return pairs
                .iter()
                .map(|p| match p.as_array().map(Vec::as_slice) {
                    Some([k, val]) => Ok((
                        self.key.decode_atom(k, allow_named)?,
                        vt.decode_atom(val, allow_named)?,
                    )),
                    _ => Err(format!("map pair is not [key, value]: {p}")),
                })
                .collect::<std::result::Result<_, _>>()
                .map(Datum::Map);
        }
        match tagged(v) {
            Some(("set", Value::Array(items))) => items
                .iter()
                .map(|i| self.key.decode_atom(i, allow_named))
                .collect::<std::result::Result<_, _>>()
                .map(Datum::Set),
            Some(("map", _)) => Err(format!(
                "expected a {} value, got a map",
                self.key.atomic.name()
            )),
            _ => Ok(Datum::Set(vec![self.key.decode_atom(v, allow_named)?])),
        }
    }

    /// Apply an `update2` modification to the column's current value: a single-valued
    /// column (`max 1`: a scalar, an optional value, a map of at most one pair) takes
    /// `diff` as its new value; a larger set or map gets the difference applied (see
    /// [`Datum::apply_diff`]).
    pub fn apply_diff(&self, current: &Value, diff: &Value) -> std::result::Result<Value, String> {
        let d = self.decode(diff)?;
        // ovsdb-server 3.1 sends the new value for every column with max 1, maps included
        if self.is_single_valued() {
            return Ok(d.to_json());
        }
        let mut cur = self.decode(current)?;
        cur.apply_diff(&d)?;
        Ok(cur.to_json())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> DatabaseSchema {
        DatabaseSchema::from_json(&json!({
            "name": "Test",
            "version": "1.2.3",
            "tables": {
                "Port": {
                    "columns": {
                        "name": {"type": "string", "mutable": false},
                        "tag": {"type": {"key": {"type": "integer", "minInteger": 1, "maxInteger": 4095}, "min": 0, "max": 1}},
                        "kind": {"type": {"key": {"type": "string", "enum": ["set", ["a", "b"]]}}},
                        "one": {"type": {"key": {"type": "string", "enum": "only"}, "min": 0, "max": 1}},
                        "addresses": {"type": {"key": "string", "min": 0, "max": "unlimited"}},
                        "networks": {"type": {"key": "string", "min": 1, "max": "unlimited"}},
                        "options": {"type": {"key": "string", "value": "string", "min": 0, "max": "unlimited"}},
                        "rate": {"type": {"key": "string", "value": {"type": "integer", "minInteger": 1}, "min": 0, "max": "unlimited"}},
                        "peer": {"type": {"key": {"type": "uuid", "refTable": "Port", "refType": "weak"}, "min": 0, "max": 1}},
                        "weight": {"type": "real"},
                        "pair": {"type": {"key": "string", "value": "string", "min": 0, "max": 1}},
                        "up": {"type": "boolean"}
                    },
                    "indexes": [["name"]]
                },
                "Root": {"columns": {"ports": {"type": {"key": {"type": "uuid", "refTable": "Port"}, "min": 0, "max": "unlimited"}}}, "isRoot": true, "maxRows": 1}
            }
        }))
        .unwrap()
    }

    #[test]
    fn parses_tables_columns_and_types() {
        let s = schema();
        assert_eq!((s.name.as_str(), s.version.as_str()), ("Test", "1.2.3"));
        let port = s.table("Port").unwrap();
        assert!(!port.is_root);
        assert_eq!(port.indexes, vec![vec!["name".to_string()]]);
        assert!(s.table("Root").unwrap().is_root);
        assert_eq!(s.table("Root").unwrap().max_rows, Some(1));
        let tag = &s.column("Port", "tag").unwrap().ty;
        assert_eq!(
            (tag.min, tag.max, tag.key.max_integer),
            (0, Some(1), Some(4095))
        );
        assert!(tag.is_single_valued() && !tag.is_scalar() && !tag.is_map());
        assert!(s.column("Port", "name").unwrap().ty.is_scalar());
        assert!(!s.column("Port", "name").unwrap().mutable);
        assert_eq!(s.column("Port", "addresses").unwrap().ty.max, None);
        assert!(s.column("Port", "options").unwrap().ty.is_map());
        let peer = &s.column("Port", "peer").unwrap().ty.key;
        assert_eq!(
            (peer.ref_table.as_deref(), peer.ref_type),
            (Some("Port"), RefType::Weak)
        );
        assert_eq!(
            s.column("Port", "kind").unwrap().ty.key.enum_values,
            Some(vec![Atom::String("a".into()), Atom::String("b".into())])
        );
        assert_eq!(
            s.column("Port", "one").unwrap().ty.key.enum_values,
            Some(vec![Atom::String("only".into())])
        );
        assert_eq!(
            s.column("Port", "_uuid").unwrap().ty.key.atomic,
            AtomicType::Uuid
        );
        assert!(DatabaseSchema::from_json(&json!({"name": "x"})).is_err());
        assert!(matches!(
            DatabaseSchema::from_json(&json!({"name": "x", "tables": {"T": {"columns": {"c": {"type": "float"}}}}})),
            Err(Error::Protocol(m)) if m.contains("float")
        ));
    }

    #[test]
    fn unknown_tables_and_columns_are_named() {
        let s = schema();
        let e = s.column("Prot", "name").unwrap_err();
        assert!(
            matches!(&e, Error::UnknownTable { table, .. } if table == "Prot"),
            "{e}"
        );
        assert!(e.to_string().contains("Prot"));
        let e = s.column("Port", "nmae").unwrap_err();
        assert!(
            matches!(&e, Error::UnknownColumn { table, column, .. } if table == "Port" && column == "nmae"),
            "{e}"
        );
        assert!(e.to_string().contains("nmae") && e.to_string().contains("Port"));
    }

    #[test]
    fn decodes_typed_values() {
        let s = schema();
        let d = |c: &str, v: Value| s.decode("Port", c, &v);
        assert_eq!(
            d("name", json!("p")).unwrap(),
            Datum::Set(vec![Atom::String("p".into())])
        );
        assert_eq!(
            d("weight", json!(2)).unwrap(),
            Datum::Set(vec![Atom::Real(2.0)])
        );
        assert_eq!(d("tag", json!(["set", []])).unwrap(), Datum::Set(vec![]));
        assert_eq!(
            d("tag", json!(5)).unwrap(),
            Datum::Set(vec![Atom::Integer(5)])
        );
        assert_eq!(
            d("options", json!(["map", [["a", "b"]]])).unwrap(),
            Datum::Map(vec![(Atom::String("a".into()), Atom::String("b".into()))])
        );
        for (c, v) in [
            ("name", json!(1)),
            ("tag", json!("5")),
            ("up", json!("true")),
            ("options", json!(["set", []])),
            ("addresses", json!(["map", []])),
            ("peer", json!(["named-uuid", "x"])),
        ] {
            assert!(
                matches!(d(c, v.clone()), Err(Error::Decode { .. })),
                "{c} {v}"
            );
        }
    }

    #[test]
    fn defaults_match_what_update2_omits() {
        let s = schema();
        let def = |c: &str| s.column("Port", c).unwrap().ty.default_json();
        assert_eq!(def("name"), json!(""));
        assert_eq!(def("tag"), json!(["set", []]));
        assert_eq!(def("options"), json!(["map", []]));
        assert_eq!(def("up"), json!(false));
        assert_eq!(def("weight"), json!(0.0));
        assert_eq!(def("networks"), json!(""));
        assert_eq!(
            s.column("Port", "_uuid").unwrap().ty.default_json(),
            json!(["uuid", "00000000-0000-0000-0000-000000000000"])
        );
    }

    #[test]
    fn update2_modifications() {
        let s = schema();
        let ty = |c: &str| s.column("Port", c).unwrap().ty.clone();
        // single-valued columns take the new value
        assert_eq!(
            ty("tag").apply_diff(&json!(5), &json!(7)).unwrap(),
            json!(7)
        );
        assert_eq!(
            ty("tag")
                .apply_diff(&json!(7), &json!(["set", []]))
                .unwrap(),
            json!(["set", []])
        );
        assert_eq!(
            ty("name").apply_diff(&json!("a"), &json!("b")).unwrap(),
            json!("b")
        );
        // sets toggle, maps add/replace/remove
        assert_eq!(
            ty("addresses")
                .apply_diff(&json!(["set", ["a", "b"]]), &json!(["set", ["a", "c"]]))
                .unwrap(),
            json!(["set", ["b", "c"]])
        );
        assert_eq!(
            ty("options")
                .apply_diff(
                    &json!(["map", [["x", "1"], ["y", "2"]]]),
                    &json!(["map", [["x", "1"], ["y", "3"]]])
                )
                .unwrap(),
            json!(["map", [["y", "3"]]])
        );
        assert!(
            ty("options")
                .apply_diff(&json!(["map", []]), &json!("x"))
                .is_err()
        );
        // a map of at most one pair takes the new value, as ovsdb-server sends it
        assert_eq!(
            ty("pair")
                .apply_diff(&json!(["map", [["a", "1"]]]), &json!(["map", [["b", "2"]]]))
                .unwrap(),
            json!(["map", [["b", "2"]]])
        );
        assert_eq!(
            ty("pair")
                .apply_diff(&json!(["map", [["b", "2"]]]), &json!(["map", []]))
                .unwrap(),
            json!(["map", []])
        );
    }

    #[test]
    fn validates_operations_before_sending() {
        use crate::ops;
        let s = schema();
        let ok = [
            ops::insert(
                "Port",
                json!({"name": "p", "tag": 5, "kind": "a", "options": ops::string_map([("k", "v")]), "networks": ["set", ["10.0.0.1/24"]]}),
                Some("p"),
            ),
            ops::insert(
                "Root",
                json!({"ports": ["set", [["named-uuid", "p"]]]}),
                None,
            ),
            ops::select(
                "Port",
                vec![ops::cond(
                    "_uuid",
                    "==",
                    ops::uuid("550e8400-e29b-41d4-a716-446655440000"),
                )],
                Some(&["name", "_uuid"]),
            ),
            ops::update(
                "Port",
                vec![ops::cond("name", "==", json!("p"))],
                json!({"tag": ["set", []]}),
            ),
            ops::mutate(
                "Port",
                vec![],
                vec![ops::mutation(
                    "addresses",
                    "insert",
                    ops::set(vec![json!("a")]),
                )],
            ),
            ops::delete("Port", vec![]),
            ops::comment("x"),
        ];
        s.validate_transaction(&ok).unwrap();

        let err = |op: Value| s.validate_operation(&op).unwrap_err();
        assert!(matches!(
            err(ops::insert("Nope", json!({}), None)),
            Error::UnknownTable { .. }
        ));
        for op in [
            ops::insert("Port", json!({"nope": 1}), None),
            ops::select("Port", vec![], Some(&["nope"])),
            ops::delete("Port", vec![ops::cond("nope", "==", json!(1))]),
            ops::mutate(
                "Port",
                vec![],
                vec![ops::mutation("nope", "insert", json!(1))],
            ),
        ] {
            assert!(
                matches!(&err(op.clone()), Error::UnknownColumn { column, .. } if column == "nope"),
                "{op}"
            );
        }
        for (row, what) in [
            (json!({"tag": "5"}), "expected integer"),
            (json!({"tag": 0}), "below the minimum"),
            (json!({"tag": ["set", [1, 2]]}), "element(s)"),
            (json!({"kind": "c"}), "is not one of"),
            (json!({"networks": ["set", []]}), "element(s)"),
            (json!({"rate": ["map", [["r", 0]]]}), "below the minimum"),
            (
                json!({"_uuid": ["uuid", "550e8400-e29b-41d4-a716-446655440000"]}),
                "read-only",
            ),
        ] {
            let e = err(ops::insert("Port", row.clone(), None));
            assert!(
                matches!(&e, Error::InvalidValue { reason, .. } if reason.contains(what)),
                "{row}: {e}"
            );
        }
        let e = err(ops::update("Port", vec![], json!({"name": "q"})));
        assert!(e.to_string().contains("immutable"), "{e}");
    }
}
