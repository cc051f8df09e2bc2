//! The `roam.dev/v1alpha1` custom resources, as Rust types. `crdgen` writes their CRDs to
//! `deploy/crds/`; CI fails when the checked-in YAML is stale.

mod address;
mod network;

pub use address::{Address, AddressSpec, AddressStatus, AddressVlan, address_name};
pub use network::{Network, NetworkMode, NetworkSpec, NetworkStatus, TransitAddress};

/// The API group.
pub const GROUP: &str = "roam.dev";

/// Every CRD of the group, in the order `crdgen` writes them.
pub fn crds()
-> Vec<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition>
{
    use kube::CustomResourceExt;
    vec![Network::crd(), Address::crd()]
}
