//! Builders for RFC 7047 transaction operations (section 5.2) and OVSDB atoms.

use serde_json::{Value, json};

/// `insert` of `row` into `table`; `uuid_name` lets later operations of the same
/// transaction refer to the new row as `["named-uuid", uuid_name]`.
pub fn insert(table: &str, row: Value, uuid_name: Option<&str>) -> Value {
    let mut op = json!({"op": "insert", "table": table, "row": row});
    if let Some(n) = uuid_name {
        op["uuid-name"] = json!(n);
    }
    op
}

/// `select` of `columns` (all when `None`) from the rows of `table` matching `where_`.
pub fn select(table: &str, where_: Vec<Value>, columns: Option<&[&str]>) -> Value {
    let mut op = json!({"op": "select", "table": table, "where": where_});
    if let Some(c) = columns {
        op["columns"] = json!(c);
    }
    op
}

/// `update` of the rows of `table` matching `where_` with the columns in `row`.
pub fn update(table: &str, where_: Vec<Value>, row: Value) -> Value {
    json!({"op": "update", "table": table, "where": where_, "row": row})
}

/// `mutate` of the rows of `table` matching `where_`.
pub fn mutate(table: &str, where_: Vec<Value>, mutations: Vec<Value>) -> Value {
    json!({"op": "mutate", "table": table, "where": where_, "mutations": mutations})
}

/// `delete` of the rows of `table` matching `where_`.
pub fn delete(table: &str, where_: Vec<Value>) -> Value {
    json!({"op": "delete", "table": table, "where": where_})
}

/// `comment`, recorded in the database log.
pub fn comment(text: &str) -> Value {
    json!({"op": "comment", "comment": text})
}

/// A condition `[column, function, value]`, e.g. `cond("name", "==", json!("ls1"))`.
pub fn cond(column: &str, function: &str, value: Value) -> Value {
    json!([column, function, value])
}

/// A mutation `[column, mutator, value]`, e.g. `mutation("ports", "insert", set(..))`.
pub fn mutation(column: &str, mutator: &str, value: Value) -> Value {
    json!([column, mutator, value])
}

/// A reference to a row by UUID.
pub fn uuid(u: &str) -> Value {
    json!(["uuid", u])
}

/// A reference to a row inserted earlier in the same transaction.
pub fn named_uuid(name: &str) -> Value {
    json!(["named-uuid", name])
}

/// An OVSDB set.
pub fn set(items: Vec<Value>) -> Value {
    json!(["set", items])
}

/// An OVSDB map of strings.
pub fn string_map<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Value {
    let pairs: Vec<Value> = pairs.into_iter().map(|(k, v)| json!([k, v])).collect();
    json!(["map", pairs])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_with_named_uuid() {
        let op = insert("Logical_Switch", json!({"name": "ls1"}), Some("new_ls"));
        assert_eq!(
            op,
            json!({"op":"insert","table":"Logical_Switch","row":{"name":"ls1"},"uuid-name":"new_ls"})
        );
    }

    #[test]
    fn atoms_have_rfc7047_shape() {
        assert_eq!(set(vec![uuid("a")]), json!(["set", [["uuid", "a"]]]));
        assert_eq!(
            string_map([("router", "10.0.0.1")]),
            json!(["map", [["router", "10.0.0.1"]]])
        );
        assert_eq!(cond("name", "==", json!("x")), json!(["name", "==", "x"]));
    }
}
