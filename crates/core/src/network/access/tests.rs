use super::*;
use proptest::prelude::*;
use serde_json::{Value, json};

/// A Network spec with `fields` besides its subnet.
fn spec(fields: Value) -> NetworkSpec {
    let mut full = json!({"subnet": "10.1.0.0/24"});
    full.as_object_mut()
        .expect("an object")
        .extend(fields.as_object().expect("an object").clone());
    serde_json::from_value(full).expect("a NetworkSpec")
}

fn access(fields: Value) -> Access {
    validate_access("net", &spec(fields)).expect("valid")
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The field and message of the refusal of `fields`.
fn refused(fields: Value) -> (&'static str, String) {
    match validate_access("net", &spec(fields.clone())) {
        Err(e @ Error::InvalidNetwork { field, .. }) => (field, e.to_string()),
        other => panic!("{fields}: expected InvalidNetwork, got {other:?}"),
    }
}

#[test]
fn a_network_that_says_nothing_admits_no_namespace_and_every_class_but_network_control() {
    let a = access(json!({}));
    assert_eq!(a, Access::default());
    assert!(!a.admits("default", &labels(&[])));
    assert!(!a.admits("kube-system", &labels(&[("a", "b")])));
    for c in ServiceClass::ALL {
        assert_eq!(a.allows(c), c != ServiceClass::NetworkControl, "{c:?}");
    }
}

#[test]
fn a_namespace_is_admitted_when_named_or_selected_or_all_are() {
    let named = access(json!({"namespaces": ["team-a", "team-b"]}));
    assert!(named.admits("team-a", &labels(&[])));
    assert!(named.admits("team-b", &labels(&[])));
    assert!(!named.admits("team-c", &labels(&[])));
    assert!(!named.needs_labels("team-a"));
    assert!(
        !named.needs_labels("team-c"),
        "no selector: labels decide nothing"
    );

    let selected = access(json!({"namespaceSelector": {
        "matchLabels": {"tier": "web"},
        "matchExpressions": [
            {"key": "env", "operator": "In", "values": ["prod", "staging"]},
            {"key": "quarantined", "operator": "DoesNotExist"},
            {"key": "team", "operator": "NotIn", "values": ["red"]},
            {"key": "roam.dev/tenant", "operator": "Exists"},
        ],
    }}));
    let ok = labels(&[("tier", "web"), ("env", "prod"), ("roam.dev/tenant", "x")]);
    assert!(selected.needs_labels("any"));
    assert!(selected.admits("any", &ok));
    let with = |k: &str, v: &str| {
        let mut l = ok.clone();
        l.insert(k.into(), v.into());
        l
    };
    let without = |k: &str| {
        let mut l = ok.clone();
        l.remove(k);
        l
    };
    assert!(selected.admits("any", &with("team", "blue")));
    assert!(!selected.admits("any", &with("team", "red")), "NotIn");
    assert!(
        !selected.admits("any", &with("quarantined", "")),
        "DoesNotExist"
    );
    assert!(!selected.admits("any", &with("env", "dev")), "In");
    assert!(!selected.admits("any", &without("env")), "In needs the key");
    assert!(!selected.admits("any", &without("tier")), "matchLabels");
    assert!(
        !selected.admits("any", &without("roam.dev/tenant")),
        "Exists"
    );

    let all = access(json!({"allNamespaces": true}));
    assert!(all.admits("anything", &labels(&[])));
    assert!(!all.needs_labels("anything"));

    // an empty selector selects every namespace, as in Kubernetes
    assert!(access(json!({"namespaceSelector": {}})).admits("x", &labels(&[])));
}

#[test]
fn who_may_attach_is_described_for_the_networks_ready_message() {
    for (fields, want) in [
        (json!({}), "no namespace may attach yet: set namespaces"),
        (
            json!({"allNamespaces": true, "namespaces": ["a"]}),
            "every namespace",
        ),
        (
            json!({"namespaces": ["b", "a"]}),
            "namespaces a, b may attach",
        ),
        (
            json!({"namespaceSelector": {}}),
            "namespaceSelector matches",
        ),
        (
            json!({"namespaces": ["a"], "namespaceSelector": {}}),
            "namespaces a and those namespaceSelector matches",
        ),
    ] {
        let d = access(fields.clone()).describe();
        assert!(d.contains(want), "{fields}: {d}");
    }
}

#[test]
fn listed_classes_are_allowed_and_standard_always() {
    let a = access(json!({"serviceClasses": ["telephony", "lowlatency", "Network_Control"]}));
    let allowed: BTreeSet<ServiceClass> = ServiceClass::ALL
        .into_iter()
        .filter(|c| a.allows(*c))
        .collect();
    assert_eq!(
        allowed,
        BTreeSet::from([
            ServiceClass::Telephony,
            ServiceClass::LowLatencyData,
            ServiceClass::NetworkControl,
            ServiceClass::Standard,
        ])
    );
    let none = access(json!({"serviceClasses": []}));
    assert_eq!(none.allowed_names(), ["standard"]);
}

#[test]
fn bad_access_fields_name_their_field_and_the_rule() {
    for (fields, field, needle) in [
        (
            json!({"namespaces": ["Team_A"]}),
            "namespaces",
            "not a namespace name",
        ),
        (
            json!({"namespaces": [""]}),
            "namespaces",
            "not a namespace name",
        ),
        (
            json!({"namespaces": ["-a"]}),
            "namespaces",
            "not a namespace name",
        ),
        (
            json!({"namespaceSelector": {"matchExpressions": [{"key": "a", "operator": "Equals", "values": ["b"]}]}}),
            "namespaceSelector",
            "one of In, NotIn, Exists, DoesNotExist",
        ),
        (
            json!({"namespaceSelector": {"matchExpressions": [{"key": "a", "operator": "in", "values": ["b"]}]}}),
            "namespaceSelector",
            "one of In, NotIn",
        ),
        (
            json!({"namespaceSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]}}),
            "namespaceSelector",
            "needs at least one value",
        ),
        (
            json!({"namespaceSelector": {"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["b"]}]}}),
            "namespaceSelector",
            "takes no values",
        ),
        (
            json!({"namespaceSelector": {"matchExpressions": [{"key": "", "operator": "Exists"}]}}),
            "namespaceSelector",
            "label key",
        ),
        (
            json!({"namespaceSelector": {"matchLabels": {"a b": "c"}}}),
            "namespaceSelector",
            "label key",
        ),
        (
            json!({"namespaceSelector": {"matchLabels": {"Bad.Prefix/x": "c"}}}),
            "namespaceSelector",
            "label key",
        ),
        (
            json!({"namespaceSelector": {"matchLabels": {"a": "-c"}}}),
            "namespaceSelector",
            "label value",
        ),
        (
            json!({"namespaceSelector": {"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["ok", "not ok"]}]}}),
            "namespaceSelector",
            "label value",
        ),
        (
            json!({"serviceClasses": ["gold"]}),
            "serviceClasses",
            "unknown service class",
        ),
        (
            json!({"serviceClasses": ["low-latency-data:1"]}),
            "serviceClasses",
            "without a drop precedence",
        ),
    ] {
        let (f, msg) = refused(fields.clone());
        assert_eq!(f, field, "{fields}: {msg}");
        assert!(msg.contains(needle), "{fields}: {msg}");
        assert!(msg.contains("network net"), "names the Network: {msg}");
    }
    // a prefixed key and the edge lengths are fine
    access(json!({"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": "team-a",
        "a": "",
        "b": "x".repeat(63),
    }}}));
    assert_eq!(
        refused(json!({"namespaceSelector": {"matchLabels": {"b": "x".repeat(64)}}})).0,
        "namespaceSelector"
    );
    access(json!({"namespaces": ["a".repeat(63)]}));
    assert_eq!(
        refused(json!({"namespaces": ["a".repeat(64)]})).0,
        "namespaces"
    );
}

#[test]
fn refusals_name_the_network_the_namespace_and_what_the_admin_adds() {
    let a = access(json!({"namespaces": ["team-a"]}));
    let e = may_attach("pod team-b/web", "eth0", "net", &a, "team-b", &labels(&[]))
        .expect_err("team-b is not admitted");
    assert_eq!(e.reason(), "NetworkNotAllowed");
    assert!(e.is_bad_input());
    let m = e.to_string();
    for needle in [
        "pod team-b/web",
        "interface eth0",
        "namespace team-b",
        "network net",
        "spec.namespaces",
        "spec.namespaceSelector",
        "spec.allNamespaces",
    ] {
        assert!(m.contains(needle), "{needle}: {m}");
    }
    may_attach("pod team-a/web", "eth0", "net", &a, "team-a", &labels(&[])).expect("named");

    let e = may_mark("pod team-a/web", "eth0", "net", &a, Some("network-control"))
        .expect_err("CS6 is not allowed by default");
    assert_eq!(e.reason(), "ServiceClassNotAllowed");
    assert!(e.is_bad_input());
    let m = e.to_string();
    for needle in [
        "pod team-a/web",
        "network net",
        "service class network-control",
        "spec.serviceClasses",
        "telephony",
    ] {
        assert!(m.contains(needle), "{needle}: {m}");
    }
    assert!(!m.contains("allows network-control"), "{m}");
    for ok in [
        None,
        Some("standard"),
        Some("telephony"),
        Some("bulk"),
        Some("low-latency-data:1"),
    ] {
        may_mark("pod team-a/web", "eth0", "net", &a, ok).expect("allowed by default");
    }
    let only_web = access(json!({"serviceClasses": ["low-latency-data"]}));
    may_mark("p", "eth0", "net", &only_web, Some("lowlatency")).expect("an alias");
    may_mark("p", "eth0", "net", &only_web, Some("low-latency-data:1")).expect("any precedence");
    may_mark("p", "eth0", "net", &only_web, Some("standard")).expect("standard always");
    assert!(may_mark("p", "eth0", "net", &only_web, Some("telephony")).is_err());
    assert!(may_mark("p", "eth0", "net", &only_web, Some("gold")).is_err());
}

fn arb_labels() -> impl Strategy<Value = BTreeMap<String, String>> {
    proptest::collection::btree_map("[abc]", "[xyz]", 0..4)
}

fn arb_requirement() -> impl Strategy<Value = (String, String, Vec<String>)> {
    (
        "[abc]",
        prop_oneof![
            Just("In".to_string()),
            Just("NotIn".to_string()),
            Just("Exists".to_string()),
            Just("DoesNotExist".to_string()),
        ],
        proptest::collection::vec("[xyz]", 1..3),
    )
}

/// A Network's access fields as a spec would give them.
fn arb_fields() -> impl Strategy<Value = Value> {
    (
        proptest::collection::vec("ns-[abc]", 0..3),
        proptest::option::of((
            proptest::collection::btree_map("[abc]", "[xyz]", 0..3),
            proptest::collection::vec(arb_requirement(), 0..3),
        )),
        any::<bool>(),
    )
        .prop_map(|(names, selector, all)| {
            let mut v = json!({"namespaces": names, "allNamespaces": all});
            if let Some((match_labels, exprs)) = selector {
                let exprs: Vec<Value> = exprs
                    .into_iter()
                    .map(|(key, op, values)| match op.as_str() {
                        "Exists" | "DoesNotExist" => json!({"key": key, "operator": op}),
                        _ => json!({"key": key, "operator": op, "values": values}),
                    })
                    .collect();
                v["namespaceSelector"] =
                    json!({"matchLabels": match_labels, "matchExpressions": exprs});
            }
            v
        })
}

/// What Kubernetes' label selector semantics say, written from the spec's fields directly.
fn selector_oracle(sel: &Value, labels: &BTreeMap<String, String>) -> bool {
    let ml = sel["matchLabels"].as_object().cloned().unwrap_or_default();
    let labels_ok = ml
        .iter()
        .all(|(k, v)| labels.get(k).map(String::as_str) == v.as_str());
    let exprs = sel["matchExpressions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let exprs_ok = exprs.iter().all(|e| {
        let key = e["key"].as_str().unwrap();
        let values: Vec<&str> = e["values"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let got = labels.get(key).map(String::as_str);
        match e["operator"].as_str().unwrap() {
            "In" => got.is_some_and(|g| values.contains(&g)),
            "NotIn" => !got.is_some_and(|g| values.contains(&g)),
            "Exists" => got.is_some(),
            _ => got.is_none(),
        }
    });
    labels_ok && exprs_ok
}

proptest! {
    /// A namespace is admitted exactly when it is named, its labels match the selector, or
    /// all are; a Network never needs labels it does not look at.
    #[test]
    fn admission_is_named_or_selected_or_all(
        fields in arb_fields(),
        ns in "ns-[abcd]",
        l in arb_labels(),
        other in arb_labels(),
    ) {
        let a = access(fields.clone());
        let named = fields["namespaces"].as_array().unwrap().iter().any(|n| n == &json!(ns));
        let all = fields["allNamespaces"] == json!(true);
        let selected = fields.get("namespaceSelector").is_some_and(|s| selector_oracle(s, &l));
        prop_assert_eq!(a.admits(&ns, &l), named || all || selected);
        if !a.needs_labels(&ns) {
            prop_assert_eq!(a.admits(&ns, &l), a.admits(&ns, &other));
        }
        let refusal = may_attach("w", "eth0", "net", &a, &ns, &l);
        prop_assert_eq!(refusal.is_ok(), a.admits(&ns, &l));
    }

    /// Without serviceClasses every class but network-control; with it, the listed ones and
    /// standard, nothing else.
    #[test]
    fn classes_allowed_are_the_listed_ones_and_standard(
        listed in proptest::option::of(proptest::collection::btree_set(0usize..12, 0..12)),
        asked in 0usize..12,
        precedence in proptest::option::of(1u8..=3),
    ) {
        let names = listed.as_ref().map(|l| {
            l.iter().map(|i| ServiceClass::ALL[*i].name()).collect::<Vec<_>>()
        });
        let a = access(match &names {
            Some(n) => json!({"serviceClasses": n}),
            None => json!({}),
        });
        let class = ServiceClass::ALL[asked];
        let want = class == ServiceClass::Standard
            || match &listed {
                Some(l) => l.contains(&asked),
                None => class != ServiceClass::NetworkControl,
            };
        prop_assert_eq!(a.allows(class), want);
        let text = match (precedence, class.af_class()) {
            (Some(p), Some(_)) => format!("{}:{p}", class.name()),
            _ => class.name().to_string(),
        };
        prop_assert_eq!(may_mark("w", "eth0", "net", &a, Some(&text)).is_ok(), want);
        prop_assert!(may_mark("w", "eth0", "net", &a, None).is_ok());
    }
}
