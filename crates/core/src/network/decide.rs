//! The network controller's decision for one Network in a pass (pure): which plan is served,
//! the transit addresses to record first, whether its spec is recorded as served, and its
//! Ready condition.
//!
//! A Network is served as its spec says unless the spec is invalid or overlaps an older
//! Network (then it is refused and not served), or the edit changes what its held Addresses
//! depend on ([`in_use_changes`]: then the spec served so far stays, with the edit's access
//! rules, and the edit is refused). An overlay's nodes each get a transit address.

use roam_api::{NetworkMode, NetworkSpec, NetworkStatus, TransitAddress};

use super::{NetworkPlan, assign_transit, in_use_changes, validate_network};
use crate::Error;

/// What the controller knows of one Network.
#[derive(Debug)]
pub struct View<'a> {
    /// Its name.
    pub name: &'a str,
    /// Its spec.
    pub spec: &'a NetworkSpec,
    /// Its status (the spec served so far, the transit addresses).
    pub status: Option<&'a NetworkStatus>,
    /// Refused for overlapping an older Network ([`super::overlapping`], on a direct LIST).
    pub overlap: Option<Error>,
    /// Its Addresses held by a workload, counted on a direct LIST when [`counts_held`] says
    /// they matter (else 0).
    pub held: usize,
    /// The cluster's nodes.
    pub nodes: &'a [String],
}

/// Its Ready condition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ready {
    /// True when its spec is served as it is.
    pub ok: bool,
    /// The reason: `Valid`, or the refusal's.
    pub reason: &'static str,
    /// What is served, or what is wrong and what to do.
    pub message: String,
}

/// What to do with the Network.
#[derive(Clone, Debug)]
pub struct Decision {
    /// The plan served (to the pods, the pools and OVN); `None`: not served.
    pub serve: Option<NetworkPlan>,
    /// Transit addresses to record in its status first (an overlay's new nodes).
    pub transit: Option<Vec<TransitAddress>>,
    /// Record its spec as the one served (served as it is now, and different from the last).
    pub record_served: bool,
    /// Its Ready condition.
    pub ready: Ready,
}

/// Whether its held Addresses decide: an edit of a served spec that changes what they depend
/// on. Only then does the controller count them.
pub fn counts_held(name: &str, spec: &NetworkSpec, status: Option<&NetworkStatus>) -> bool {
    edit_in_use(name, spec, status).is_some()
}

/// The served plan and the fields an edit changes that held Addresses depend on (none: the
/// edit may apply whatever is held). A served spec that no longer validates (a rule added
/// since) cannot be kept.
fn edit_in_use(
    name: &str,
    spec: &NetworkSpec,
    status: Option<&NetworkStatus>,
) -> Option<(NetworkPlan, Vec<&'static str>)> {
    let served_spec = status?.served.as_ref().filter(|s| *s != spec)?;
    let served = validate_network(name, served_spec).ok()?;
    let next = validate_network(name, spec).ok()?;
    let fields = in_use_changes(&served, &next);
    (!fields.is_empty()).then_some((served, fields))
}

/// What `v` calls for.
pub fn decide(v: View<'_>) -> Decision {
    let refused = |e: Error| Decision {
        serve: None,
        transit: None,
        record_served: false,
        ready: Ready {
            ok: false,
            reason: e.reason(),
            message: e.to_string(),
        },
    };
    let plan = match (validate_network(v.name, v.spec), v.overlap) {
        (Err(e), _) | (Ok(_), Some(e)) => return refused(e),
        (Ok(plan), None) => plan,
    };
    // an edit that held Addresses cannot follow is refused; the served spec stays, with the
    // edit's access rules (who may attach is nothing held Addresses depend on)
    let (plan, in_use) = match edit_in_use(v.name, v.spec, v.status) {
        Some((served, fields)) if v.held > 0 => {
            let refusal = Error::ImmutableWhileInUse {
                network: v.name.into(),
                fields: fields.join(", "),
                held: v.held,
            };
            let served = NetworkPlan {
                access: plan.access,
                ..served
            };
            (served, Some(refusal))
        }
        _ => (plan, None),
    };
    let transit = match plan.mode {
        NetworkMode::Overlay => {
            let existing = v.status.map(|s| s.transit.as_slice()).unwrap_or_default();
            match assign_transit(&plan, existing, v.nodes) {
                Ok(t) => t,
                Err(e) => return refused(e),
            }
        }
        NetworkMode::Underlay => None,
    };
    let ready = match &in_use {
        Some(e) => Ready {
            ok: false,
            reason: e.reason(),
            message: e.to_string(),
        },
        None => Ready {
            ok: true,
            reason: "Valid",
            message: format!(
                "{:?} network {} gateway {}, {} per node in the warm pool; {}",
                plan.mode,
                plan.subnet(),
                plan.gateway(),
                plan.pool_size,
                plan.access.describe()
            ),
        },
    };
    Decision {
        record_served: in_use.is_none() && v.status.and_then(|s| s.served.as_ref()) != Some(v.spec),
        serve: Some(plan),
        transit,
        ready,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(subnet: &str) -> NetworkSpec {
        serde_json::from_value(serde_json::json!({"subnet": subnet, "namespaces": ["ns"]})).unwrap()
    }

    fn view<'a>(spec: &'a NetworkSpec, status: Option<&'a NetworkStatus>) -> View<'a> {
        View {
            name: "a",
            spec,
            status,
            overlap: None,
            held: 0,
            nodes: &[],
        }
    }

    #[test]
    fn a_new_network_is_served_recorded_and_its_nodes_get_transit_addresses() {
        let s = spec("10.1.0.0/24");
        let nodes = ["node-a".to_string(), "node-b".to_string()];
        let d = decide(View {
            nodes: &nodes,
            ..view(&s, None)
        });
        assert!(d.ready.ok && d.ready.reason == "Valid", "{:?}", d.ready);
        assert!(d.record_served);
        let t = d.transit.expect("transit addresses");
        assert_eq!(t.len(), 2);
        assert_eq!(d.serve.expect("served").subnet().to_string(), "10.1.0.0/24");
    }

    #[test]
    fn an_overlap_or_a_bad_spec_is_refused_and_not_served() {
        let s = spec("10.1.0.0/24");
        let overlap = Error::OverlappingNetworks {
            network: "a".into(),
            subnet: "10.1.0.0/24".into(),
            other: "b".into(),
            other_subnet: "10.1.0.0/16".into(),
        };
        let d = decide(View {
            overlap: Some(overlap),
            ..view(&s, None)
        });
        assert!(d.serve.is_none() && !d.record_served);
        assert_eq!(d.ready.reason, "OverlappingNetworks");
        let bad = spec("10.1.0.0/33");
        let d = decide(view(&bad, None));
        assert!(d.serve.is_none());
        assert_eq!(d.ready.reason, "InvalidNetwork");
    }

    #[test]
    fn an_edit_held_addresses_cannot_follow_keeps_the_served_spec() {
        let served = spec("10.1.0.0/24");
        let edited = spec("10.2.0.0/24");
        let status = NetworkStatus {
            served: Some(served.clone()),
            ..Default::default()
        };
        assert!(counts_held("a", &edited, Some(&status)));
        let d = decide(View {
            held: 3,
            ..view(&edited, Some(&status))
        });
        assert_eq!(d.ready.reason, "ImmutableWhileInUse");
        assert!(
            d.ready.message.contains("3 Addresses"),
            "{}",
            d.ready.message
        );
        assert!(!d.record_served);
        assert_eq!(d.serve.expect("served").subnet().to_string(), "10.1.0.0/24");
        // nothing held: the edit applies and is recorded
        let d = decide(view(&edited, Some(&status)));
        assert!(d.ready.ok && d.record_served);
        assert_eq!(d.serve.expect("served").subnet().to_string(), "10.2.0.0/24");
        // the spec served as it is: nothing to count, nothing to record
        let same = NetworkStatus {
            served: Some(edited.clone()),
            ..Default::default()
        };
        assert!(!counts_held("a", &edited, Some(&same)));
        assert!(!decide(view(&edited, Some(&same))).record_served);
    }
}
