//! Who holds a workload's addresses: the owner key an Address records (`spec.owner`), shared
//! by roam-controller (which claims for it) and roam-cni (which plumbs only what the
//! Address says is this pod's).
//!
//! Unambiguous by construction: a VM is `namespace/name`, a pod `namespace:name` — neither
//! `/` nor `:` can occur in a namespace, a pod name or a label value, so two workloads never
//! share a key (the old `namespace-name` made `a-b`/`c` and `a`/`b-c` one owner).

use std::collections::BTreeMap;

use crate::keys::{LAUNCHER_LABEL, VM_LABEL};

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

/// The API group of roam's VirtualMachine (an ownerReference's `apiVersion` is
/// `GROUP/VERSION`).
pub const VM_GROUP: &str = "roam.dev";
/// The kind of roam's VirtualMachine.
pub const VM_KIND: &str = "VirtualMachine";

/// One of a pod's ownerReferences, the fields an owner key reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OwnerRef<'a> {
    /// `apiVersion`: `group/version`.
    pub api_version: &'a str,
    /// `kind`.
    pub kind: &'a str,
    /// `name`: the owner, in the pod's namespace.
    pub name: &'a str,
    /// `controller`: the owner is the pod's managing controller.
    pub controller: bool,
}

impl OwnerRef<'_> {
    /// Whether this reference makes VirtualMachine `vm` the pod's controller.
    fn controls_as_vm(&self, vm: &str) -> bool {
        self.controller
            && self.kind == VM_KIND
            && self.name == vm
            && self.api_version.split_once('/').map(|(g, _)| g) == Some(VM_GROUP)
    }
}

/// A pod's ownerReferences (`metadata.ownerReferences`) as [`OwnerRef`]s.
#[cfg(feature = "k8s")]
pub fn refs_of(
    refs: Option<&Vec<k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference>>,
) -> Vec<OwnerRef<'_>> {
    refs.into_iter()
        .flatten()
        .map(|o| OwnerRef {
            api_version: &o.api_version,
            kind: &o.kind,
            name: &o.name,
            controller: o.controller == Some(true),
        })
        .collect()
}

/// The owner key of pod `namespace/name` with `labels` and `owners` (its ownerReferences):
/// the VirtualMachine its [`VM_LABEL`] names (a VM's launcher pods — both of a migration —
/// share it) when the pod is a launcher ([`LAUNCHER_LABEL`] `true`) and that VM of the pod's
/// own namespace is also its controlling ownerReference, as on the launcher pods
/// roam-controller creates; else the pod itself. A label alone, an annotation, or a value
/// naming another namespace does not make a pod a VM's. A pod that forges all of it is a
/// launcher to roam: roam-cni gives a launcher pod no network (the VM's addresses are only
/// ever on its runner's taps), so it takes nothing of the VM's.
pub fn owner_key(
    namespace: &str,
    name: &str,
    labels: &BTreeMap<String, String>,
    owners: &[OwnerRef<'_>],
) -> String {
    let launcher = labels.get(LAUNCHER_LABEL).map(String::as_str) == Some("true");
    match labels.get(VM_LABEL) {
        Some(vm)
            if launcher
                && !vm.is_empty()
                && !vm.contains('/')
                && owners.iter().any(|o| o.controls_as_vm(vm)) =>
        {
            vm_owner(namespace, vm)
        }
        _ => pod_owner(namespace, name),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labelled(vm: &str) -> BTreeMap<String, String> {
        [
            (VM_LABEL.into(), vm.into()),
            (LAUNCHER_LABEL.into(), "true".into()),
        ]
        .into()
    }

    fn vm_ref(name: &str) -> OwnerRef<'_> {
        OwnerRef {
            api_version: "roam.dev/v1alpha1",
            kind: VM_KIND,
            name,
            controller: true,
        }
    }

    #[test]
    fn a_launcher_of_the_pods_own_namespace_is_its_vms() {
        let none = BTreeMap::new();
        assert_eq!(owner_key("ns", "p", &none, &[]), "ns:p");
        let vm = labelled("vm1");
        assert_eq!(
            owner_key("ns", "vm1-launcher", &vm, &[vm_ref("vm1")]),
            "ns/vm1"
        );
        assert!(is_vm_owner(&owner_key("ns", "l", &vm, &[vm_ref("vm1")])));
        assert!(!is_vm_owner(&owner_key("ns", "l", &none, &[vm_ref("vm1")])));
    }

    #[test]
    fn a_label_without_the_vms_controller_reference_is_not_the_vm() {
        let vm = labelled("vm1");
        assert_eq!(owner_key("ns", "p", &vm, &[]), "ns:p", "label only");
        let not_controller = OwnerRef {
            controller: false,
            ..vm_ref("vm1")
        };
        let other_vm = vm_ref("vm2");
        let other_group = OwnerRef {
            api_version: "evil.dev/v1alpha1",
            ..vm_ref("vm1")
        };
        let other_kind = OwnerRef {
            kind: "ReplicaSet",
            ..vm_ref("vm1")
        };
        let no_version = OwnerRef {
            api_version: "roam.dev",
            ..vm_ref("vm1")
        };
        for r in [
            not_controller,
            other_vm,
            other_group,
            other_kind,
            no_version,
        ] {
            assert_eq!(owner_key("ns", "p", &vm, &[r]), "ns:p", "{r:?}");
        }
    }

    #[test]
    fn only_a_launcher_pod_is_its_vms() {
        let vm_only: BTreeMap<String, String> = [(VM_LABEL.into(), "vm1".into())].into();
        assert_eq!(
            owner_key("ns", "p", &vm_only, &[vm_ref("vm1")]),
            "ns:p",
            "the VM's label and reference on a pod that is not a launcher"
        );
        let mut not_true = labelled("vm1");
        not_true.insert(LAUNCHER_LABEL.into(), "yes".into());
        assert_eq!(owner_key("ns", "p", &not_true, &[vm_ref("vm1")]), "ns:p");
    }

    #[test]
    fn another_namespaces_vm_cannot_be_named() {
        let other = labelled("other/vm1");
        assert_eq!(owner_key("ns", "p", &other, &[vm_ref("other/vm1")]), "ns:p");
        assert_eq!(owner_key("ns", "p", &labelled(""), &[vm_ref("")]), "ns:p");
    }

    #[test]
    fn keys_that_collided_before_do_not() {
        let none = BTreeMap::new();
        assert_ne!(
            owner_key("a-b", "c", &none, &[]),
            owner_key("a", "b-c", &none, &[])
        );
        // a pod named like a VM is not the VM
        assert_ne!(pod_owner("ns", "demo"), vm_owner("ns", "demo"));
    }
}
