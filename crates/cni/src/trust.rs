//! Whether the addresses a pod's `roam.dev/addresses` lists are the pod's (pure): each must be
//! an Address object — which only roam-controller writes — that names this pod's owner,
//! sits on this pod's node and carries the same IP, MAC and Network. The annotation itself
//! is writable by whoever creates the pod, so it is never trusted alone: a pod created with
//! another workload's IP, MAC and port in it is plumbed with none of them.

use std::collections::BTreeMap;

use roam_contract::annotation::PodAddress;
use roam_contract::keys::ERROR_ANNOTATION;
use serde_json::Value;

/// What to do with a pod once its `roam.dev/addresses` (if any) has been checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Its addresses are all its own: plumb them.
    Plumb,
    /// roam-controller refused it (`roam.dev/error`): fail the ADD at once with the reason.
    Refused(String),
    /// Nothing usable yet: look again until the deadline.
    Wait,
}

/// The verdict on a pod with `annotations` whose addresses `checked_out` (every Address
/// they name is the pod's). Addresses that check out win over a `roam.dev/error`: the pod's
/// creator can write that annotation too, and a forged refusal must only ever fail its own
/// pod, never stop what roam-controller published; the refusal counts only when nothing
/// checks out, so a forged `roam.dev/addresses` beside a real refusal is refused too.
pub fn verdict(annotations: &BTreeMap<String, String>, checked_out: bool) -> Verdict {
    if checked_out {
        return Verdict::Plumb;
    }
    match annotations.get(ERROR_ANNOTATION) {
        Some(reason) => Verdict::Refused(reason.clone()),
        None => Verdict::Wait,
    }
}

/// What is wrong with `pa` given the Address object's `spec` (`None`: no such Address), for
/// a pod whose owner key is `owner` on `node`; `None` when it is the pod's. `node` is
/// `None` for a pod bound to no node — one no kubelet runs, so only a test or a tool that
/// drives the plugin by hand — whose host is not compared.
pub fn address_problem(
    pa: &PodAddress,
    spec: Option<&Value>,
    owner: &str,
    node: Option<&str>,
) -> Option<String> {
    let Some(spec) = spec else {
        return Some(format!("Address {} does not exist", pa.address));
    };
    let s = |k: &str| spec.get(k).and_then(Value::as_str);
    let problem = if s("owner") != Some(owner) {
        format!(
            "is held by {}, not by {owner}",
            s("owner").unwrap_or("nobody")
        )
    } else if spec.get("deleted").and_then(Value::as_bool) == Some(true) {
        "is released (its owner went away)".to_string()
    } else if let Some(node) = node.filter(|n| s("host") != Some(*n)) {
        format!("is on node {}, not {node}", s("host").unwrap_or("none"))
    } else if s("ip") != Some(pa.ip.to_string().as_str()) {
        format!("has IP {}, not {}", s("ip").unwrap_or("none"), pa.ip)
    } else if !s("mac").is_some_and(|m| m.eq_ignore_ascii_case(&pa.mac)) {
        format!("has MAC {}, not {}", s("mac").unwrap_or("none"), pa.mac)
    } else if s("network") != Some(pa.network.as_str()) {
        format!(
            "is of network {}, not {}",
            s("network").unwrap_or("none"),
            pa.network
        )
    } else if pa.port != pa.address
        && Some(pa.port.as_str()) != s("host").map(|h| format!("{}.{h}", pa.address)).as_deref()
    {
        // a VLAN or a VM's port is named after its Address, a pod's overlay port after its
        // Address and node (roam_network::topology)
        format!("does not carry OVN port {}", pa.port)
    } else {
        return None;
    };
    Some(format!("Address {} {problem}", pa.address))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_refusal_counts_only_when_no_address_checks_out() {
        let refused = BTreeMap::from([(
            ERROR_ANNOTATION.to_string(),
            "pod ns/web, interface eth0: namespace ns may not attach to network net".to_string(),
        )]);
        assert_eq!(
            verdict(&refused, false),
            Verdict::Refused(refused[ERROR_ANNOTATION].clone())
        );
        assert_eq!(
            verdict(&refused, true),
            Verdict::Plumb,
            "published addresses win"
        );
        assert_eq!(verdict(&BTreeMap::new(), false), Verdict::Wait);
        assert_eq!(verdict(&BTreeMap::new(), true), Verdict::Plumb);
    }

    fn pa() -> PodAddress {
        serde_json::from_value(json!({
            "name": "eth0", "network": "net", "mode": "overlay", "address": "net-10-1-0-5",
            "port": "net-10-1-0-5.node-a", "ip": "10.1.0.5", "prefixLen": 32,
            "mac": "0a:58:0a:01:00:05", "gateway": "10.1.0.1", "mtu": 1400,
        }))
        .unwrap()
    }

    fn spec() -> Value {
        json!({"network": "net", "ip": "10.1.0.5", "mac": "0A:58:0A:01:00:05",
               "owner": "ns:web", "host": "node-a", "reserved": true, "deleted": false})
    }

    #[test]
    fn the_pods_own_address_passes() {
        assert_eq!(
            address_problem(&pa(), Some(&spec()), "ns:web", Some("node-a")),
            None
        );
    }

    #[test]
    fn anything_that_is_not_the_pods_is_named() {
        let with = |k: &str, v: Value| {
            let mut s = spec();
            s[k] = v;
            s
        };
        for (spec, needle) in [
            (
                with("owner", json!("victim:db")),
                "held by victim:db, not by ns:web",
            ),
            (with("owner", Value::Null), "held by nobody"),
            (with("deleted", json!(true)), "released"),
            (with("host", json!("node-b")), "on node node-b"),
            (with("ip", json!("10.1.0.6")), "has IP 10.1.0.6"),
            (with("mac", json!("0a:58:0a:01:00:06")), "has MAC"),
            (with("network", json!("other")), "of network other"),
        ] {
            let p = address_problem(&pa(), Some(&spec), "ns:web", Some("node-a")).expect(needle);
            assert!(
                p.contains(needle) && p.contains("net-10-1-0-5"),
                "{needle}: {p}"
            );
        }
        let p = address_problem(&pa(), None, "ns:web", Some("node-a")).unwrap();
        // a pod bound to no node: the host is not compared, the rest is
        let elsewhere = with("host", json!("node-b"));
        let mut there = pa();
        there.port = "net-10-1-0-5.node-b".into();
        assert_eq!(
            address_problem(&there, Some(&elsewhere), "ns:web", None),
            None
        );
        // ... but its port must still be the Address's on its host
        assert!(address_problem(&pa(), Some(&elsewhere), "ns:web", None).is_some());
        assert!(p.contains("does not exist"), "{p}");
        for port in ["victim-port", "net-10-1-0-5.node-b", "net-10-1-0-50.node-a"] {
            let mut other_port = pa();
            other_port.port = port.into();
            let p = address_problem(&other_port, Some(&spec()), "ns:web", Some("node-a"));
            assert!(p.unwrap().contains(&format!("OVN port {port}")), "{port}");
        }
        let mut mobile = pa();
        mobile.port = mobile.address.clone();
        assert_eq!(
            address_problem(&mobile, Some(&spec()), "ns:web", Some("node-a")),
            None
        );
    }
}
