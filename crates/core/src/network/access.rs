//! Who may attach to a Network and which service classes they may ask for: the Network's
//! `namespaces`, `namespaceSelector`, `allNamespaces` and `serviceClasses`, validated into an
//! [`Access`], and the two decisions made with it ([`may_attach`], [`may_mark`]). A tenant
//! names any Network it likes in its pod's annotation or its VM's interfaces; only the
//! Network, which the cluster admin writes, says whether that namespace may have it.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use roam_contract::qos::{Marking, ServiceClass};

use crate::error::{Error, Result};
use roam_api::NetworkSpec;

/// The class a Network allows only when it lists it: routing protocols' CS6, which a
/// tenant's traffic must not share with the network's own control traffic.
pub const LISTED_ONLY: ServiceClass = ServiceClass::NetworkControl;

/// One requirement of a label selector (Kubernetes' semantics).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Requirement {
    /// The label is there with one of the values.
    In(String, BTreeSet<String>),
    /// The label is absent, or there with none of the values.
    NotIn(String, BTreeSet<String>),
    /// The label is there (any value).
    Exists(String),
    /// The label is absent.
    DoesNotExist(String),
}

impl Requirement {
    /// Whether `labels` meet this requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        match self {
            Requirement::In(k, values) => labels.get(k).is_some_and(|v| values.contains(v)),
            Requirement::NotIn(k, values) => labels.get(k).is_none_or(|v| !values.contains(v)),
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::DoesNotExist(k) => !labels.contains_key(k),
        }
    }
}

/// A validated label selector: it matches when every requirement does (an empty one matches
/// every set of labels, as `{}` does in Kubernetes).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Selector(pub Vec<Requirement>);

impl Selector {
    /// Whether `labels` meet every requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.iter().all(|r| r.matches(labels))
    }
}

/// A Network's access rules, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Access {
    /// Namespaces named in `namespaces`.
    pub namespaces: BTreeSet<String>,
    /// `namespaceSelector`.
    pub selector: Option<Selector>,
    /// `allNamespaces`.
    pub all_namespaces: bool,
    /// The classes interfaces may ask for, besides `standard` (always allowed).
    pub classes: BTreeSet<ServiceClass>,
}

impl Default for Access {
    /// What a Network that says nothing allows: no namespace, every class but
    /// [`LISTED_ONLY`].
    fn default() -> Access {
        Access {
            namespaces: BTreeSet::new(),
            selector: None,
            all_namespaces: false,
            classes: default_classes(),
        }
    }
}

fn default_classes() -> BTreeSet<ServiceClass> {
    ServiceClass::ALL
        .into_iter()
        .filter(|c| *c != LISTED_ONLY)
        .collect()
}

impl Access {
    /// Whether namespace `namespace`, labelled `labels`, may attach: it is named, or it
    /// matches the selector, or every namespace may.
    pub fn admits(&self, namespace: &str, labels: &BTreeMap<String, String>) -> bool {
        self.all_namespaces
            || self.namespaces.contains(namespace)
            || self.selector.as_ref().is_some_and(|s| s.matches(labels))
    }

    /// Whether [`Access::admits`] depends on the namespace's labels: the controller reads
    /// them only then.
    pub fn needs_labels(&self, namespace: &str) -> bool {
        !self.all_namespaces && !self.namespaces.contains(namespace) && self.selector.is_some()
    }

    /// Whether an interface may ask for `class` (`standard`, DF, is always allowed).
    pub fn allows(&self, class: ServiceClass) -> bool {
        class == ServiceClass::Standard || self.classes.contains(&class)
    }

    /// Who may attach, in words (the Network's Ready message).
    pub fn describe(&self) -> String {
        if self.all_namespaces {
            return "every namespace may attach".into();
        }
        let names: Vec<&str> = self.namespaces.iter().map(String::as_str).collect();
        match (names.is_empty(), self.selector.is_some()) {
            (true, false) => "no namespace may attach yet: set namespaces, namespaceSelector \
                or allNamespaces"
                .into(),
            (true, true) => "the namespaces namespaceSelector matches may attach".into(),
            (false, false) => format!("namespaces {} may attach", names.join(", ")),
            (false, true) => format!(
                "namespaces {} and those namespaceSelector matches may attach",
                names.join(", ")
            ),
        }
    }

    /// The classes allowed, by name, `standard` among them.
    pub fn allowed_names(&self) -> Vec<&'static str> {
        ServiceClass::ALL
            .into_iter()
            .filter(|c| self.allows(*c))
            .map(ServiceClass::name)
            .collect()
    }
}

fn invalid(network: &str, field: &'static str, value: impl ToString, problem: &str) -> Error {
    Error::InvalidNetwork {
        network: network.into(),
        field,
        value: value.to_string(),
        problem: problem.into(),
    }
}

/// Whether `s` is an RFC 1123 label (a namespace name; a label name part without `_`/`.`).
fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// Whether `s` is a label value: empty, or at most 63 of `[A-Za-z0-9_.-]`, starting and
/// ending with a letter or digit.
fn is_label_value(s: &str) -> bool {
    s.is_empty()
        || (s.len() <= 63
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
            && s.starts_with(|c: char| c.is_ascii_alphanumeric())
            && s.ends_with(|c: char| c.is_ascii_alphanumeric()))
}

/// Whether `s` is a label key: `[prefix/]name`, the prefix a DNS subdomain (at most 253),
/// the name a non-empty label value.
fn is_label_key(s: &str) -> bool {
    let (prefix, name) = match s.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, s),
    };
    let prefix_ok = prefix.is_none_or(|p| p.len() <= 253 && p.split('.').all(is_dns_label));
    prefix_ok && !name.is_empty() && is_label_value(name)
}

const KEY_RULE: &str = "a label key is [prefix/]name: the name at most 63 of letters, digits, \
    '-', '_' and '.', starting and ending with a letter or digit; the prefix a DNS subdomain";
const VALUE_RULE: &str = "a label value is empty or at most 63 of letters, digits, '-', '_' \
    and '.', starting and ending with a letter or digit";

fn selector(network: &str, s: &LabelSelector) -> Result<Selector> {
    const FIELD: &str = "namespaceSelector";
    let mut reqs = Vec::new();
    for (k, v) in s.match_labels.iter().flatten() {
        if !is_label_key(k) {
            return Err(invalid(
                network,
                FIELD,
                format!("matchLabels {k}"),
                KEY_RULE,
            ));
        }
        if !is_label_value(v) {
            return Err(invalid(
                network,
                FIELD,
                format!("matchLabels {k}: {v}"),
                VALUE_RULE,
            ));
        }
        reqs.push(Requirement::In(k.clone(), BTreeSet::from([v.clone()])));
    }
    for e in s.match_expressions.iter().flatten() {
        let shown = format!(
            "matchExpressions {{key: {}, operator: {}, values: {:?}}}",
            e.key,
            e.operator,
            e.values.clone().unwrap_or_default()
        );
        if !is_label_key(&e.key) {
            return Err(invalid(network, FIELD, shown, KEY_RULE));
        }
        let values: BTreeSet<String> = e.values.iter().flatten().cloned().collect();
        if let Some(bad) = values.iter().find(|v| !is_label_value(v)) {
            return Err(invalid(
                network,
                FIELD,
                shown,
                &format!("{bad:?}: {VALUE_RULE}"),
            ));
        }
        let r = match e.operator.as_str() {
            "In" | "NotIn" if values.is_empty() => {
                return Err(invalid(
                    network,
                    FIELD,
                    shown,
                    &format!("operator {} needs at least one value", e.operator),
                ));
            }
            "Exists" | "DoesNotExist" if !values.is_empty() => {
                return Err(invalid(
                    network,
                    FIELD,
                    shown,
                    &format!("operator {} takes no values", e.operator),
                ));
            }
            "In" => Requirement::In(e.key.clone(), values),
            "NotIn" => Requirement::NotIn(e.key.clone(), values),
            "Exists" => Requirement::Exists(e.key.clone()),
            "DoesNotExist" => Requirement::DoesNotExist(e.key.clone()),
            _ => {
                return Err(invalid(
                    network,
                    FIELD,
                    shown,
                    "the operator is one of In, NotIn, Exists, DoesNotExist",
                ));
            }
        };
        reqs.push(r);
    }
    Ok(Selector(reqs))
}

/// Validate the access fields of Network `network`'s `spec`.
pub fn validate_access(network: &str, spec: &NetworkSpec) -> Result<Access> {
    if let Some(bad) = spec.namespaces.iter().find(|n| !is_dns_label(n)) {
        return Err(invalid(
            network,
            "namespaces",
            bad,
            "not a namespace name (lower-case letters, digits and '-', at most 63 characters)",
        ));
    }
    let selector = spec
        .namespace_selector
        .as_ref()
        .map(|s| selector(network, s))
        .transpose()?;
    let classes = match &spec.service_classes {
        None => default_classes(),
        Some(list) => list
            .iter()
            .map(|c| {
                c.parse::<ServiceClass>().map_err(|e| {
                    invalid(
                        network,
                        "serviceClasses",
                        c,
                        &format!(
                            "{e}; a Network lists classes without a drop precedence (an \
                             interface's low-latency-data:1 is allowed by low-latency-data)"
                        ),
                    )
                })
            })
            .collect::<Result<_>>()?,
    };
    Ok(Access {
        namespaces: spec.namespaces.iter().cloned().collect(),
        selector,
        all_namespaces: spec.all_namespaces,
        classes,
    })
}

/// Whether `workload` (e.g. `pod ns/web`) in namespace `namespace`, labelled `labels`, may
/// attach its interface `interface` to Network `network`; the refusal names what the
/// cluster admin must add.
pub fn may_attach(
    workload: &str,
    interface: &str,
    network: &str,
    access: &Access,
    namespace: &str,
    labels: &BTreeMap<String, String>,
) -> Result<()> {
    if access.admits(namespace, labels) {
        return Ok(());
    }
    Err(Error::NetworkNotAllowed {
        workload: workload.into(),
        interface: interface.into(),
        network: network.into(),
        namespace: namespace.into(),
    })
}

/// Whether `workload`'s interface `interface` on Network `network` may ask for service
/// class `class` (`None`: no class, always allowed).
pub fn may_mark(
    workload: &str,
    interface: &str,
    network: &str,
    access: &Access,
    class: Option<&str>,
) -> Result<()> {
    let Some(given) = class else { return Ok(()) };
    // an unknown class never gets this far (the interface's parser refuses it); were it to,
    // it is allowed by no Network
    if given
        .parse::<Marking>()
        .is_ok_and(|m| access.allows(m.class))
    {
        return Ok(());
    }
    Err(Error::ServiceClassNotAllowed {
        workload: workload.into(),
        interface: interface.into(),
        network: network.into(),
        class: given.into(),
        allowed: access.allowed_names().join(", "),
    })
}

#[cfg(test)]
mod tests;
