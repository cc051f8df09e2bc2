//! The OVN syncer, against a recorded NB: the Network's topology and its Addresses' ports
//! planned from the index and written as one transaction; a live Address on a node that is
//! not the Network's, or a released one, gets no port.

use serde_json::Value;

use super::super::fixtures::context;
use super::super::ovn;
use super::{address, network};
use roam_core::claim::ovn_port;

/// The rows `ops` insert into `table`: their `name`s.
fn inserted(ops: &[Value], table: &str) -> Vec<String> {
    ops.iter()
        .filter(|op| op["op"] == "insert" && op["table"] == table)
        .filter_map(|op| op["row"]["name"].as_str().map(String::from))
        .collect()
}

/// [`address`] with its IP's own MAC (the planner refuses two ports with one MAC).
fn addr(name: &str, ip: &str, owner: &str, host: &str) -> roam_api::Address {
    let mut a = address(name, "a", ip, Some(owner), host);
    a.spec.mac = roam_contract::mac_for_ip(ip.parse().unwrap()).to_string();
    a
}

#[tokio::test]
async fn a_network_and_its_addresses_ports_are_written_in_one_transaction() {
    let mut net = network("a", "10.1.0.0/24", "2024-01-01T00:00:00Z");
    // the nodes' transit addresses, as the network controller assigned them
    net.status = Some(roam_api::NetworkStatus {
        transit: ["node-a", "node-b"]
            .iter()
            .zip(["169.254.0.2", "169.254.0.3"])
            .map(|(node, ip)| roam_api::TransitAddress {
                node: node.to_string(),
                ip: ip.into(),
            })
            .collect(),
        ..Default::default()
    });
    let pod = addr("a-10-1-0-5", "10.1.0.5", "ns:p", "node-a");
    let vm = addr("a-10-1-0-6", "10.1.0.6", "ns/vm", "node-b");
    let mut released = addr("a-10-1-0-7", "10.1.0.7", "ns:q", "node-a");
    released.spec.reserved = false;
    released.spec.deleted = true;
    let elsewhere = addr("a-10-1-0-8", "10.1.0.8", "ns:r", "node-z");
    let (ctx, api) = context(
        std::slice::from_ref(&net),
        &["node-a", "node-b"],
        &[pod.clone(), vm.clone(), released.clone(), elsewhere],
    );
    let mut known = None;
    ovn::sync(&ctx, "a", &mut known).await.expect("a sync");
    let txns = api.nb.transactions.lock().unwrap().clone();
    assert_eq!(txns.len(), 1, "one transaction: {txns:?}");
    let ops = &txns[0];
    let switches = inserted(ops, "Logical_Switch");
    for node in ["node-a", "node-b"] {
        assert!(
            switches.iter().any(|s| s.contains(node)),
            "a switch for {node}: {switches:?}"
        );
    }
    let ports = inserted(ops, "Logical_Switch_Port");
    let pod_port = ovn_port(&pod.spec, "a-10-1-0-5", "node-a");
    let vm_port = ovn_port(&vm.spec, "a-10-1-0-6", "node-b");
    assert_ne!(pod_port, vm_port);
    assert!(ports.contains(&pod_port), "{pod_port} in {ports:?}");
    assert!(ports.contains(&vm_port), "{vm_port} in {ports:?}");
    assert!(
        !ports
            .iter()
            .any(|p| p.contains("10-1-0-7") || p.contains("10-1-0-8")),
        "no port for a released Address or one on an unknown node: {ports:?}"
    );
    // the transaction says what it is (ovsdb-server logs the comment)
    assert!(
        ops.iter().any(|op| op["op"] == "comment"),
        "a comment op: {ops:?}"
    );
}
