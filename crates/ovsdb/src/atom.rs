//! OVSDB values in their RFC 7047 JSON forms (section 5.1).
//!
//! - [`Uuid`] is `["uuid", "<uuid>"]`, [`NamedUuid`] is `["named-uuid", "<id>"]`.
//! - [`OvsSet<T>`] is `["set", [..]]`; a set of exactly one element may also arrive as the bare
//!   element, which is what ovsdb-server sends.
//! - [`OvsMap<K, V>`] is `["map", [[k, v], ..]]`.
//! - [`optional`] is a serde `with` module for columns with `min 0, max 1` (an `Option<T>`).
//! - [`Atom`] and [`Datum`] are the untyped forms, for code that does not know the column
//!   type at compile time (schema-driven decoding lives in [`super::schema`]).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::str::FromStr;

use serde::de::{DeserializeOwned, Error as _};
use serde::ser::SerializeSeq;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Value, json};

/// A row's UUID: `["uuid", "550e8400-e29b-41d4-a716-446655440000"]` on the wire.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Uuid(pub uuid::Uuid);

impl Uuid {
    /// The all-zero UUID, which is also the OVSDB default value of a uuid atom.
    pub const NIL: Uuid = Uuid(uuid::Uuid::nil());

    /// The RFC 7047 JSON form.
    pub fn to_json(&self) -> Value {
        json!(["uuid", self.0.to_string()])
    }

    /// Parse the RFC 7047 JSON form `["uuid", "..."]`.
    pub fn from_json(v: &Value) -> Result<Self, String> {
        match tagged(v) {
            Some(("uuid", Value::String(s))) => {
                s.parse().map_err(|e| format!("bad uuid {s:?}: {e}"))
            }
            _ => Err(format!("expected [\"uuid\", \"<uuid>\"], got {v}")),
        }
    }
}

impl fmt::Display for Uuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl FromStr for Uuid {
    type Err = uuid::Error;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        uuid::Uuid::parse_str(s).map(Uuid)
    }
}

impl From<uuid::Uuid> for Uuid {
    fn from(u: uuid::Uuid) -> Self {
        Uuid(u)
    }
}

impl Serialize for Uuid {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        ("uuid", self.0.to_string()).serialize(s)
    }
}

impl<'de> Deserialize<'de> for Uuid {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Uuid::from_json(&Value::deserialize(d)?).map_err(D::Error::custom)
    }
}

/// A reference to a row inserted earlier in the same transaction (its `uuid-name`):
/// `["named-uuid", "new_ls"]`. Only valid inside a `transact` request.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NamedUuid(pub String);

impl Serialize for NamedUuid {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        ("named-uuid", &self.0).serialize(s)
    }
}

impl<'de> Deserialize<'de> for NamedUuid {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = Value::deserialize(d)?;
        match tagged(&v) {
            Some(("named-uuid", Value::String(s))) => Ok(NamedUuid(s.clone())),
            _ => Err(D::Error::custom(format!(
                "expected [\"named-uuid\", \"<name>\"], got {v}"
            ))),
        }
    }
}

/// `[tag, payload]` with a string tag, the shape of uuid, named-uuid, set and map.
pub(crate) fn tagged(v: &Value) -> Option<(&str, &Value)> {
    match v.as_array()?.as_slice() {
        [Value::String(tag), payload] => Some((tag.as_str(), payload)),
        _ => None,
    }
}

/// An OVSDB set: `["set", [e1, e2, ..]]`, or a bare `e` for a set of one.
///
/// Elements are kept sorted and unique, like the server keeps them. Serializing always
/// produces the `["set", ..]` form, which is valid for every set column.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OvsSet<T: Ord>(pub BTreeSet<T>);

impl<T: Ord> Default for OvsSet<T> {
    fn default() -> Self {
        OvsSet(BTreeSet::new())
    }
}

impl<T: Ord> Deref for OvsSet<T> {
    type Target = BTreeSet<T>;
    fn deref(&self) -> &BTreeSet<T> {
        &self.0
    }
}

impl<T: Ord> DerefMut for OvsSet<T> {
    fn deref_mut(&mut self) -> &mut BTreeSet<T> {
        &mut self.0
    }
}

impl<T: Ord> FromIterator<T> for OvsSet<T> {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Self {
        OvsSet(iter.into_iter().collect())
    }
}

impl<T: Ord> IntoIterator for OvsSet<T> {
    type Item = T;
    type IntoIter = std::collections::btree_set::IntoIter<T>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

impl<'a, T: Ord> IntoIterator for &'a OvsSet<T> {
    type Item = &'a T;
    type IntoIter = std::collections::btree_set::Iter<'a, T>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl<T: Ord, const N: usize> From<[T; N]> for OvsSet<T> {
    fn from(items: [T; N]) -> Self {
        items.into_iter().collect()
    }
}

impl<T: Ord + Serialize> Serialize for OvsSet<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        struct Elems<'a, T: Ord>(&'a BTreeSet<T>);
        impl<T: Ord + Serialize> Serialize for Elems<'_, T> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                let mut seq = s.serialize_seq(Some(self.0.len()))?;
                for e in self.0 {
                    seq.serialize_element(e)?;
                }
                seq.end()
            }
        }
        ("set", Elems(&self.0)).serialize(s)
    }
}

impl<'de, T: Ord + DeserializeOwned> Deserialize<'de> for OvsSet<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = Value::deserialize(d)?;
        set_elements(v)
            .into_iter()
            .map(|e| T::deserialize(e).map_err(D::Error::custom))
            .collect()
    }
}

/// The elements of a set datum: `["set", [..]]` → its elements, anything else → itself
/// as the only element.
fn set_elements(v: Value) -> Vec<Value> {
    match v {
        Value::Array(mut a) if a.len() == 2 && a[0] == "set" && a[1].is_array() => match a.pop() {
            Some(Value::Array(elems)) => elems,
            _ => Vec::new(),
        },
        other => vec![other],
    }
}

/// An OVSDB map: `["map", [[k1, v1], [k2, v2], ..]]`. Keys are unique and kept sorted.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OvsMap<K: Ord, V>(pub BTreeMap<K, V>);

impl<K: Ord, V> Default for OvsMap<K, V> {
    fn default() -> Self {
        OvsMap(BTreeMap::new())
    }
}

impl<K: Ord, V> Deref for OvsMap<K, V> {
    type Target = BTreeMap<K, V>;
    fn deref(&self) -> &BTreeMap<K, V> {
        &self.0
    }
}

impl<K: Ord, V> DerefMut for OvsMap<K, V> {
    fn deref_mut(&mut self) -> &mut BTreeMap<K, V> {
        &mut self.0
    }
}

impl<K: Ord, V> FromIterator<(K, V)> for OvsMap<K, V> {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        OvsMap(iter.into_iter().collect())
    }
}

impl<K: Ord, V> IntoIterator for OvsMap<K, V> {
    type Item = (K, V);
    type IntoIter = std::collections::btree_map::IntoIter<K, V>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

impl<'a, K: Ord, V> IntoIterator for &'a OvsMap<K, V> {
    type Item = (&'a K, &'a V);
    type IntoIter = std::collections::btree_map::Iter<'a, K, V>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl<K: Ord, V, const N: usize> From<[(K, V); N]> for OvsMap<K, V> {
    fn from(items: [(K, V); N]) -> Self {
        items.into_iter().collect()
    }
}

impl<K: Ord + Serialize, V: Serialize> Serialize for OvsMap<K, V> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        struct Pairs<'a, K: Ord, V>(&'a BTreeMap<K, V>);
        impl<K: Ord + Serialize, V: Serialize> Serialize for Pairs<'_, K, V> {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                let mut seq = s.serialize_seq(Some(self.0.len()))?;
                for pair in self.0 {
                    seq.serialize_element(&pair)?;
                }
                seq.end()
            }
        }
        ("map", Pairs(&self.0)).serialize(s)
    }
}

impl<'de, K: Ord + DeserializeOwned, V: DeserializeOwned> Deserialize<'de> for OvsMap<K, V> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = Value::deserialize(d)?;
        let pairs = match tagged(&v) {
            Some(("map", Value::Array(pairs))) => pairs,
            _ => {
                return Err(D::Error::custom(format!(
                    "expected [\"map\", [[key, value], ..]], got {v}"
                )));
            }
        };
        pairs
            .iter()
            .map(|p| match p.as_array().map(Vec::as_slice) {
                Some([k, v]) => Ok((
                    K::deserialize(k).map_err(D::Error::custom)?,
                    V::deserialize(v).map_err(D::Error::custom)?,
                )),
                _ => Err(D::Error::custom(format!(
                    "map pair is not [key, value]: {p}"
                ))),
            })
            .collect()
    }
}

/// serde `with` module for an optional column (`min 0, max 1`) held as `Option<T>`: the
/// server sends the empty set `["set", []]` for `None` and the bare atom for `Some`.
///
/// ```
/// # use roam_ovsdb::atom;
/// #[derive(serde::Deserialize)]
/// struct Port {
///     #[serde(with = "atom::optional", default)]
///     tag: Option<i64>,
/// }
/// let p: Port = serde_json::from_str(r#"{"tag": ["set", []]}"#).unwrap();
/// assert_eq!(p.tag, None);
/// let p: Port = serde_json::from_str(r#"{"tag": 42}"#).unwrap();
/// assert_eq!(p.tag, Some(42));
/// ```
pub mod optional {
    use super::*;

    /// `None` → `["set", []]`, `Some(x)` → `x`.
    pub fn serialize<T: Serialize, S: Serializer>(v: &Option<T>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            Some(x) => x.serialize(s),
            None => ("set", [(); 0]).serialize(s),
        }
    }

    /// `["set", []]` → `None`, `["set", [x]]` or `x` → `Some(x)`; more elements is an error.
    pub fn deserialize<'de, T: DeserializeOwned, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<T>, D::Error> {
        let v = Value::deserialize(d)?;
        let mut elems = set_elements(v);
        match elems.len() {
            0 => Ok(None),
            1 => T::deserialize(elems.remove(0))
                .map(Some)
                .map_err(D::Error::custom),
            n => Err(D::Error::custom(format!(
                "expected at most one value, got a set of {n}"
            ))),
        }
    }
}

/// One untyped OVSDB atom.
#[derive(Clone, Debug, PartialEq)]
pub enum Atom {
    /// A 64-bit integer.
    Integer(i64),
    /// A real (double).
    Real(f64),
    /// A boolean.
    Boolean(bool),
    /// A string.
    String(String),
    /// A row UUID.
    Uuid(Uuid),
    /// A reference to a row inserted by the same transaction.
    NamedUuid(String),
}

impl Atom {
    /// The RFC 7047 JSON form.
    pub fn to_json(&self) -> Value {
        match self {
            Atom::Integer(i) => json!(i),
            Atom::Real(r) => json!(r),
            Atom::Boolean(b) => json!(b),
            Atom::String(s) => json!(s),
            Atom::Uuid(u) => u.to_json(),
            Atom::NamedUuid(n) => json!(["named-uuid", n]),
        }
    }

    /// Decode an atom without knowing its type: a JSON integer is an [`Atom::Integer`], any
    /// other number an [`Atom::Real`] (use the schema to decode a real column exactly).
    pub fn from_json(v: &Value) -> Result<Self, String> {
        match v {
            Value::Bool(b) => Ok(Atom::Boolean(*b)),
            Value::String(s) => Ok(Atom::String(s.clone())),
            Value::Number(n) => {
                if let Some(i) = n.as_i64() {
                    Ok(Atom::Integer(i))
                } else if n.is_u64() {
                    Err(format!("integer {n} does not fit in 64 signed bits"))
                } else {
                    Ok(Atom::Real(n.as_f64().unwrap_or_default()))
                }
            }
            Value::Array(_) => match tagged(v) {
                Some(("uuid", _)) => Uuid::from_json(v).map(Atom::Uuid),
                Some(("named-uuid", Value::String(n))) => Ok(Atom::NamedUuid(n.clone())),
                _ => Err(format!("not an OVSDB atom: {v}")),
            },
            Value::Null | Value::Object(_) => Err(format!("not an OVSDB atom: {v}")),
        }
    }
}

impl Serialize for Atom {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.to_json().serialize(s)
    }
}

impl<'de> Deserialize<'de> for Atom {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Atom::from_json(&Value::deserialize(d)?).map_err(D::Error::custom)
    }
}

/// One untyped OVSDB value: a set of atoms (a scalar is a set of one) or a map.
#[derive(Clone, Debug, PartialEq)]
pub enum Datum {
    /// A set; a scalar column's value is a set of exactly one atom.
    Set(Vec<Atom>),
    /// A map, as (key, value) pairs.
    Map(Vec<(Atom, Atom)>),
}

impl Datum {
    /// The RFC 7047 JSON form, as ovsdb-server writes it: a set of one is the bare atom.
    pub fn to_json(&self) -> Value {
        match self {
            Datum::Set(atoms) if atoms.len() == 1 => atoms[0].to_json(),
            Datum::Set(atoms) => {
                json!(["set", atoms.iter().map(Atom::to_json).collect::<Vec<_>>()])
            }
            Datum::Map(pairs) => json!([
                "map",
                pairs
                    .iter()
                    .map(|(k, v)| json!([k.to_json(), v.to_json()]))
                    .collect::<Vec<_>>()
            ]),
        }
    }

    /// Decode a value without knowing its column type (see [`Atom::from_json`] for numbers).
    pub fn from_json(v: &Value) -> Result<Self, String> {
        match tagged(v) {
            Some(("set", Value::Array(elems))) => elems
                .iter()
                .map(Atom::from_json)
                .collect::<Result<_, _>>()
                .map(Datum::Set),
            Some(("map", Value::Array(pairs))) => pairs
                .iter()
                .map(|p| match p.as_array().map(Vec::as_slice) {
                    Some([k, v]) => Ok((Atom::from_json(k)?, Atom::from_json(v)?)),
                    _ => Err(format!("map pair is not [key, value]: {p}")),
                })
                .collect::<Result<_, _>>()
                .map(Datum::Map),
            Some(("set" | "map", other)) => {
                Err(format!("set/map payload is not an array: {other}"))
            }
            _ => Atom::from_json(v).map(|a| Datum::Set(vec![a])),
        }
    }

    /// The number of elements (set) or pairs (map).
    pub fn len(&self) -> usize {
        match self {
            Datum::Set(a) => a.len(),
            Datum::Map(p) => p.len(),
        }
    }

    /// Whether the set or map is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Apply an `update2` difference (ovsdb-server(7), section 4.1.14) to this set or map:
    /// for a set, the elements of `diff` are toggled (symmetric difference); for a map, a
    /// pair whose key is absent is added, one equal to the current pair is removed, and one
    /// with the same key but another value replaces the value.
    pub fn apply_diff(&mut self, diff: &Datum) -> Result<(), String> {
        match (self, diff) {
            (Datum::Set(cur), Datum::Set(d)) => {
                for a in d {
                    if let Some(i) = cur.iter().position(|c| c == a) {
                        cur.remove(i);
                    } else {
                        cur.push(a.clone());
                    }
                }
                Ok(())
            }
            (Datum::Map(cur), Datum::Map(d)) => {
                for (k, v) in d {
                    match cur.iter().position(|(ck, _)| ck == k) {
                        Some(i) if cur[i].1 == *v => {
                            cur.remove(i);
                        }
                        Some(i) => cur[i].1 = v.clone(),
                        None => cur.push((k.clone(), v.clone())),
                    }
                }
                Ok(())
            }
            (cur, d) => Err(format!(
                "cannot apply a {} difference to a {}",
                kind(d),
                kind(cur)
            )),
        }
    }
}

fn kind(d: &Datum) -> &'static str {
    match d {
        Datum::Set(_) => "set",
        Datum::Map(_) => "map",
    }
}

impl Serialize for Datum {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.to_json().serialize(s)
    }
}

impl<'de> Deserialize<'de> for Datum {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Datum::from_json(&Value::deserialize(d)?).map_err(D::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::from_value;

    const U: &str = "550e8400-e29b-41d4-a716-446655440000";
    const U2: &str = "6ba7b810-9dad-11d1-80b4-00c04fd430c8";

    #[test]
    fn uuid_round_trip() {
        let u: Uuid = from_value(json!(["uuid", U])).unwrap();
        assert_eq!(u.to_string(), U);
        assert_eq!(serde_json::to_value(u).unwrap(), json!(["uuid", U]));
        assert_eq!(u.to_json(), json!(["uuid", U]));
        assert_eq!(U.parse::<Uuid>().unwrap(), u);
        for bad in [
            json!(U),
            json!(["uuid", "nope"]),
            json!(["named-uuid", U]),
            json!(["uuid"]),
        ] {
            assert!(from_value::<Uuid>(bad.clone()).is_err(), "{bad}");
        }
        assert_eq!(Uuid::default(), Uuid::NIL);
    }

    #[test]
    fn named_uuid_round_trip() {
        let n: NamedUuid = from_value(json!(["named-uuid", "ls"])).unwrap();
        assert_eq!(n, NamedUuid("ls".into()));
        assert_eq!(
            serde_json::to_value(&n).unwrap(),
            json!(["named-uuid", "ls"])
        );
        assert!(from_value::<NamedUuid>(json!(["uuid", "ls"])).is_err());
    }

    #[test]
    fn sets_accept_both_forms_and_serialize_as_set() {
        let s: OvsSet<String> = from_value(json!(["set", ["b", "a"]])).unwrap();
        assert_eq!(s, OvsSet::from(["a".to_string(), "b".to_string()]));
        assert_eq!(
            serde_json::to_value(&s).unwrap(),
            json!(["set", ["a", "b"]])
        );
        // a set of one may be the bare element
        let one: OvsSet<String> = from_value(json!("x")).unwrap();
        assert_eq!(one, OvsSet::from(["x".to_string()]));
        assert_eq!(serde_json::to_value(&one).unwrap(), json!(["set", ["x"]]));
        // ... also for uuids, whose bare form is itself an array
        let u: OvsSet<Uuid> = from_value(json!(["uuid", U])).unwrap();
        assert_eq!(u.len(), 1);
        let us: OvsSet<Uuid> = from_value(json!(["set", [["uuid", U], ["uuid", U2]]])).unwrap();
        assert_eq!(us.len(), 2);
        assert_eq!(
            serde_json::to_value(&us).unwrap(),
            json!(["set", [["uuid", U], ["uuid", U2]]])
        );
        let empty: OvsSet<i64> = from_value(json!(["set", []])).unwrap();
        assert!(empty.is_empty());
        assert_eq!(serde_json::to_value(&empty).unwrap(), json!(["set", []]));
        assert!(from_value::<OvsSet<i64>>(json!(["set", ["x"]])).is_err());
    }

    #[test]
    fn maps_round_trip() {
        let m: OvsMap<String, String> =
            from_value(json!(["map", [["router", "10.0.0.1"], ["mtu", "1500"]]])).unwrap();
        assert_eq!(m.get("router").map(String::as_str), Some("10.0.0.1"));
        assert_eq!(
            serde_json::to_value(&m).unwrap(),
            json!(["map", [["mtu", "1500"], ["router", "10.0.0.1"]]])
        );
        let ints: OvsMap<String, i64> = from_value(json!(["map", [["rate", 100]]])).unwrap();
        assert_eq!(ints["rate"], 100);
        let empty: OvsMap<String, String> = from_value(json!(["map", []])).unwrap();
        assert!(empty.is_empty());
        assert_eq!(serde_json::to_value(&empty).unwrap(), json!(["map", []]));
        for bad in [
            json!(["set", []]),
            json!(["map", [["k"]]]),
            json!(["map", {}]),
            json!({}),
        ] {
            assert!(
                from_value::<OvsMap<String, String>>(bad.clone()).is_err(),
                "{bad}"
            );
        }
    }

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Opt {
        #[serde(with = "optional", default)]
        tag: Option<i64>,
        #[serde(with = "optional", default)]
        dhcp: Option<Uuid>,
    }

    #[test]
    fn optional_columns() {
        let o: Opt = from_value(json!({"tag": ["set", []], "dhcp": ["uuid", U]})).unwrap();
        assert_eq!(o.tag, None);
        assert_eq!(o.dhcp, Some(U.parse().unwrap()));
        let o: Opt = from_value(json!({"tag": ["set", [7]]})).unwrap();
        assert_eq!(o.tag, Some(7));
        assert_eq!(o.dhcp, None);
        assert_eq!(
            serde_json::to_value(&o).unwrap(),
            json!({"tag": 7, "dhcp": ["set", []]})
        );
        assert!(from_value::<Opt>(json!({"tag": ["set", [1, 2]]})).is_err());
    }

    #[test]
    fn untyped_atoms_and_datums() {
        assert_eq!(Atom::from_json(&json!(5)).unwrap(), Atom::Integer(5));
        assert_eq!(Atom::from_json(&json!(1.5)).unwrap(), Atom::Real(1.5));
        assert_eq!(Atom::from_json(&json!(true)).unwrap(), Atom::Boolean(true));
        assert_eq!(
            Atom::from_json(&json!("s")).unwrap(),
            Atom::String("s".into())
        );
        assert_eq!(
            Atom::from_json(&json!(["uuid", U])).unwrap(),
            Atom::Uuid(U.parse().unwrap())
        );
        assert_eq!(
            Atom::from_json(&json!(["named-uuid", "x"])).unwrap(),
            Atom::NamedUuid("x".into())
        );
        for bad in [json!(null), json!({}), json!(["set", []]), json!(u64::MAX)] {
            assert!(Atom::from_json(&bad).is_err(), "{bad}");
        }
        for v in [
            json!("scalar"),
            json!(["set", [1, 2]]),
            json!(["set", []]),
            json!(["map", [["k", "v"], ["k2", ["uuid", U]]]]),
            json!(["uuid", U]),
            json!(["named-uuid", "n"]),
        ] {
            let d = Datum::from_json(&v).unwrap();
            assert_eq!(d.to_json(), v, "round trip of {v}");
            let via_serde: Datum = from_value(v.clone()).unwrap();
            assert_eq!(serde_json::to_value(via_serde).unwrap(), v);
        }
        // a set of one is written bare, like ovsdb-server does
        assert_eq!(
            Datum::from_json(&json!(["set", [3]])).unwrap().to_json(),
            json!(3)
        );
        assert!(Datum::from_json(&json!(["map", [[1]]])).is_err());
        assert!(Datum::from_json(&json!(["set", "x"])).is_err());
    }

    #[test]
    fn update2_differences() {
        let s = |v: Value| Datum::from_json(&v).unwrap();
        let mut set = s(json!(["set", ["a", "b"]]));
        set.apply_diff(&s(json!(["set", ["a", "c"]]))).unwrap();
        assert_eq!(set, s(json!(["set", ["b", "c"]])));

        let mut map = s(json!(["map", [["x", "1"], ["y", "2"]]]));
        map.apply_diff(&s(json!(["map", [["y", "3"], ["z", "4"]]])))
            .unwrap();
        assert_eq!(map, s(json!(["map", [["x", "1"], ["y", "3"], ["z", "4"]]])));
        map.apply_diff(&s(json!(["map", [["x", "1"], ["y", "3"]]])))
            .unwrap();
        assert_eq!(map, s(json!(["map", [["z", "4"]]])));

        assert!(set.apply_diff(&map).is_err());
    }
}
