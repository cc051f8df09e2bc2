//! The `roam.dev/v1alpha1` custom resources, as Rust types: the bottom layer of roam's
//! controller (`roam-core` decides over them, `roam-migrator` reads and writes them). kube's
//! derive only, no client. `crdgen` writes their CRDs to `deploy/crds/`; CI fails when the
//! checked-in YAML is stale.
#![warn(missing_docs)]

mod address;
mod network;
mod vm;
mod vmim;

pub use address::{Address, AddressSpec, AddressStatus, AddressVlan, address_name};
pub use network::{Network, NetworkMode, NetworkSpec, NetworkStatus, TransitAddress};
pub use vm::{
    Boot, GuestResets, MIGRATE_TO, MIGRATE_TO_AUTO, MigrateTo, MigrateToError, VirtualMachine,
    VirtualMachineSpec, VirtualMachineStatus, VmInterface, VmInterfaceStatus, VmPhase,
    is_dns_subdomain, parse_migrate_to,
};
pub use vmim::{
    Phase, Progress, VirtualMachineMigration, VirtualMachineMigrationSpec,
    VirtualMachineMigrationStatus,
};

/// The API group.
pub const GROUP: &str = "roam.dev";

/// Every CRD of the group, in the order `crdgen` writes them.
pub fn crds()
-> Vec<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>
{
    use kube::CustomResourceExt;
    vec![
        Network::crd(),
        Address::crd(),
        VirtualMachine::crd(),
        VirtualMachineMigration::crd(),
    ]
}

#[cfg(test)]
mod tests {
    /// Kubernetes ≤ 1.20 (the lab's API server) rejects a CRD whose schema defaults a string
    /// to `""` ("default: Invalid value: null"): optional strings must be `Option`s.
    #[test]
    fn no_crd_defaults_a_string_to_empty() {
        fn walk(v: &serde_json::Value, path: &str, bad: &mut Vec<String>) {
            match v {
                serde_json::Value::Object(m) => {
                    if m.get("default") == Some(&serde_json::Value::String(String::new())) {
                        bad.push(path.to_string());
                    }
                    for (k, v) in m {
                        walk(v, &format!("{path}.{k}"), bad);
                    }
                }
                serde_json::Value::Array(a) => a.iter().for_each(|v| walk(v, path, bad)),
                _ => {}
            }
        }
        let mut bad = vec![];
        for crd in super::crds() {
            let name = crd.metadata.name.clone().unwrap_or_default();
            walk(&serde_json::to_value(&crd).unwrap(), &name, &mut bad);
        }
        assert!(bad.is_empty(), "string fields defaulting to \"\": {bad:?}");
    }
}
