//! Where an Event about an object is stored.
//!
//! An Event lives in a namespace. For a namespaced object (a pod, a VirtualMachine) that is
//! the object's own namespace. Addresses and Networks are cluster-scoped, and Kubernetes 1.20
//! refuses (422) an `events.k8s.io/v1` Event whose `regarding` has no namespace unless the
//! Event is stored in `kube-system`. So an Event about a cluster-scoped object goes to the
//! namespace of the pod it concerns (an Address's `roam.dev/pod`), else to the configured
//! namespace (`--event-namespace`, default `default`), and its `regarding` names that same
//! namespace: `kubectl get events -n <namespace>` shows it, on 1.20 and on later versions.

/// The namespace for an Event about an object in `object_namespace` (`None`: cluster-scoped),
/// concerning the pod `related_pod` (`namespace/name`) if any; `configured` otherwise.
pub fn event_namespace(
    object_namespace: Option<&str>,
    related_pod: Option<&str>,
    configured: &str,
) -> String {
    if let Some(ns) = object_namespace.filter(|ns| !ns.is_empty()) {
        return ns.to_string();
    }
    related_pod
        .and_then(|p| p.split_once('/'))
        .map(|(ns, _)| ns)
        .filter(|ns| !ns.is_empty())
        .unwrap_or(configured)
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::event_namespace;

    #[test]
    fn a_namespaced_object_keeps_its_namespace() {
        assert_eq!(
            event_namespace(Some("apps"), Some("other/p"), "default"),
            "apps"
        );
    }

    #[test]
    fn a_cluster_scoped_object_goes_to_its_pods_namespace() {
        assert_eq!(event_namespace(None, Some("apps/web"), "default"), "apps");
        assert_eq!(
            event_namespace(Some(""), Some("apps/web"), "default"),
            "apps"
        );
    }

    #[test]
    fn without_a_pod_the_configured_namespace() {
        assert_eq!(event_namespace(None, None, "roam-system"), "roam-system");
        // a malformed roam.dev/pod is not a namespace
        assert_eq!(event_namespace(None, Some("web"), "default"), "default");
        assert_eq!(event_namespace(None, Some("/web"), "default"), "default");
    }
}
