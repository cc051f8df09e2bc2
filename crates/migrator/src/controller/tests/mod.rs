//! The controllers' requests, checked against the mock API server of [`super::fixtures`]:
//! builders of the test objects here, one module per controller.

mod access;
mod certs;
mod migrations;
mod networks;
mod operator;
mod ovn;
mod pods;
mod vms;

use k8s_openapi::api::core::v1::{Node, Pod, Secret};
use serde_json::json;

use roam_api::{Address, Network, VirtualMachine};

/// An overlay Network created at `created` (RFC 3339) that namespace `ns` may attach to.
pub(super) fn network(name: &str, subnet: &str, created: &str) -> Network {
    network_with(
        name,
        created,
        json!({"subnet": subnet, "namespaces": ["ns"]}),
    )
}

/// A Network with `spec`, created at `created` (RFC 3339).
pub(super) fn network_with(name: &str, created: &str, spec: serde_json::Value) -> Network {
    let mut n: Network = serde_json::from_value(json!({
        "apiVersion": "roam.dev/v1alpha1", "kind": "Network",
        "metadata": {"name": name, "creationTimestamp": created, "generation": 1},
        "spec": spec,
    }))
    .expect("a Network");
    n.metadata.resource_version = Some("1".into());
    n
}

/// A Ready node with `ip` as its InternalIP.
pub(super) fn node(name: &str, ip: &str) -> Node {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name},
        "status": {
            "conditions": [{"type": "Ready", "status": "True"}],
            "addresses": [{"type": "InternalIP", "address": ip}],
            "allocatable": {"memory": "8Gi"},
        },
    }))
    .expect("a Node")
}

/// [`node`], cordoned (`spec.unschedulable`).
pub(super) fn cordoned(name: &str, ip: &str) -> Node {
    let mut n = node(name, ip);
    n.spec = Some(k8s_openapi::api::core::v1::NodeSpec {
        unschedulable: Some(true),
        ..Default::default()
    });
    n
}

/// VM `ns/demo` (one overlay interface on the default Network).
pub(super) fn vm() -> VirtualMachine {
    serde_json::from_value(json!({
        "apiVersion": "roam.dev/v1alpha1", "kind": "VirtualMachine",
        "metadata": {"name": "demo", "namespace": "ns", "uid": "vm-uid", "generation": 1},
        "spec": {"cpu": 1, "memoryMiB": 256,
                 "boot": {"kernel": {"kernel": "/g/vmlinuz"}}},
    }))
    .expect("a VirtualMachine")
}

/// The VM's shim token Secret.
pub(super) fn token_secret() -> Secret {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "roam-shim-token-vm-uid", "namespace": "roam-system"},
        "data": {"token": "dDBrZW4="},
    }))
    .expect("a Secret")
}

/// An Address `name` of Network `net` with `ip`, owned by `owner` on `host` (claimed), or a
/// free pool one.
pub(super) fn address(name: &str, net: &str, ip: &str, owner: Option<&str>, host: &str) -> Address {
    let mut a: Address = serde_json::from_value(json!({
        "apiVersion": "roam.dev/v1alpha1", "kind": "Address",
        "metadata": {"name": name, "labels": {"roam.dev/network": net}},
        "spec": {"network": net, "ip": ip, "mac": "0a:58:0a:00:00:05", "owner": owner,
                 "host": host, "reserved": owner.is_some(), "interface": "eth0"},
    }))
    .expect("an Address");
    a.metadata.resource_version = Some("1".into());
    a
}

/// A pod `ns/name` scheduled on `node`, with `annotations`.
pub(super) fn pod(name: &str, node: &str, annotations: serde_json::Value) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "ns", "uid": format!("{name}-uid"),
                     "annotations": annotations},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]},
        "status": {"phase": "Running"},
    }))
    .expect("a Pod")
}
