//! Who holds a workload's addresses: the owner key an Address records (`spec.owner`), shared
//! by roam-controller (which claims for it) and roam-cni (which plumbs only what the
//! Address says is this pod's).
//!
//! Unambiguous by construction: a VM is `namespace/name`, a pod `namespace:name` — neither
//! `/` nor `:` can occur in a namespace, a pod name or a label value, so two workloads never
//! share a key (the old `namespace-name` made `a-b`/`c` and `a`/`b-c` one owner).

use std::collections::BTreeMap;

use crate::keys::VM_LABEL;

/// The owner key of VirtualMachine `namespace/vm`.
pub fn vm_owner(namespace: &str, vm: &str) -> String {
    format!("{namespace}/{vm}")
}

/// The owner key of a plain pod.
pub fn pod_owner(namespace: &str, name: &str) -> String {
    format!("{namespace}:{name}")
}

/// Whether `owner` is a VirtualMachine's key.
pub fn is_vm_owner(owner: &str) -> bool {
    owner.contains('/')
}

/// The owner key of pod `namespace/name` with `labels`: the VirtualMachine of the same
/// namespace its [`VM_LABEL`] names (a VM's launcher pods — both of a migration — share it),
/// else the pod itself. Only a label counts, and only within the pod's own namespace: an
/// annotation, or a value naming another namespace, does not make a pod another
/// namespace's VM.
pub fn owner_key(namespace: &str, name: &str, labels: &BTreeMap<String, String>) -> String {
    match labels.get(VM_LABEL) {
        Some(vm) if !vm.is_empty() && !vm.contains('/') => vm_owner(namespace, vm),
        _ => pod_owner(namespace, name),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vm_label_makes_the_vm_of_the_pods_own_namespace_the_owner() {
        let none = BTreeMap::new();
        assert_eq!(owner_key("ns", "p", &none), "ns:p");
        let vm: BTreeMap<String, String> = [(VM_LABEL.into(), "vm1".into())].into();
        assert_eq!(owner_key("ns", "vm1-launcher", &vm), "ns/vm1");
        assert!(is_vm_owner(&owner_key("ns", "l", &vm)));
        assert!(!is_vm_owner(&owner_key("ns", "l", &none)));
    }

    #[test]
    fn another_namespaces_vm_cannot_be_named() {
        let other: BTreeMap<String, String> = [(VM_LABEL.into(), "other/vm1".into())].into();
        assert_eq!(owner_key("ns", "p", &other), "ns:p");
        let empty: BTreeMap<String, String> = [(VM_LABEL.into(), String::new())].into();
        assert_eq!(owner_key("ns", "p", &empty), "ns:p");
    }

    #[test]
    fn keys_that_collided_before_do_not() {
        let none = BTreeMap::new();
        assert_ne!(owner_key("a-b", "c", &none), owner_key("a", "b-c", &none));
        // a pod named like a VM is not the VM
        assert_ne!(pod_owner("ns", "demo"), vm_owner("ns", "demo"));
    }
}
