//! The lab's nodes behave as separate hosts: a node sees neither the other node's files nor
//! OVN central's or the control plane's (the host sees them all), its daemons reach those
//! over the network (ovn-controller → the SB on the lab bridge; the kubelet with its own
//! credentials under /etc/kubernetes; a libvirtd listening on the node's address), no process
//! of a node holds another host's path, and no node runs a libvirtd or QEMU outside a pod.

use roam_e2e::{Lab, forbidden_paths, foreign_paths, node_sees, node_try_run};
use std::path::Path;

#[test]
fn a_node_sees_no_other_hosts_files() {
    let lab = Lab::get();
    for node in lab.nodes() {
        let node = node.as_str();
        for path in forbidden_paths(&lab, node) {
            let from_host = std::fs::read_dir(&path)
                .unwrap_or_else(|e| panic!("{path} on the host: {e}"))
                .count();
            assert!(
                from_host > 0,
                "{path} is empty even on the host: the check proves nothing"
            );
            assert_eq!(
                node_sees(&lab, node, Path::new(&path)),
                Some(vec![]),
                "{node} sees into {path}"
            );
        }
        let own = lab.dir().join(node);
        let mine = node_sees(&lab, node, &own).unwrap_or_default();
        assert!(
            mine.contains(&"logs".to_string()),
            "{node} must see its own {}: {mine:?}",
            own.display()
        );
        // its own credentials, where kubeadm puts them
        let etc = node_sees(&lab, node, Path::new("/etc/kubernetes")).unwrap_or_default();
        assert!(
            etc.contains(&"kubelet.conf".to_string()) && etc.contains(&"pki".to_string()),
            "{node}'s /etc/kubernetes: {etc:?}"
        );
    }
}

#[test]
fn node_daemons_reach_other_hosts_over_the_network_only() {
    let lab = Lab::get();
    let found = foreign_paths(&lab);
    assert!(found.is_empty(), "{}", found.join("\n"));
    for node in lab.nodes() {
        let node = node.as_str();
        let remote = node_try_run(
            &lab,
            node,
            "ovs-vsctl",
            &[
                "--timeout=10",
                "get",
                "open",
                ".",
                "external_ids:ovn-remote",
            ],
        )
        .unwrap_or_else(|e| panic!("{node}'s ovn-remote: {e}"));
        // over the network (the lab's SB takes the node network over TLS), not a socket path
        let remote = remote.trim().trim_matches('"');
        assert!(
            remote.starts_with("ssl:") || remote.starts_with("tcp:"),
            "{node}'s ovn-controller reaches the SB at {remote}"
        );
    }
}

#[test]
fn libvirt_and_qemu_run_only_in_pods() {
    let lab = Lab::get();
    // a libvirtd to look at, and one reached from the other node over the network: node-b's
    // test libvirtd (a pod of roam's launcher image)
    let b = lab.test_libvirt("node-b");
    let out = node_try_run(&lab, "node-a", "virsh", &["-c", &b.peer_uri, "hostname"])
        .unwrap_or_else(|e| panic!("node-a → {}: {e}", b.peer_uri));
    assert!(!out.trim().is_empty(), "{out}");
    // every libvirtd and QEMU on the machine is a container's: its cgroup is a pod's
    let mut pods = 0;
    let mut outside = vec![];
    for e in std::fs::read_dir("/proc").expect("read /proc").flatten() {
        let pid = e.file_name().to_string_lossy().into_owned();
        if !pid.bytes().all(|c| c.is_ascii_digit()) {
            continue;
        }
        let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
        let comm = comm.trim();
        if comm != "libvirtd" && !comm.starts_with("qemu-system") {
            continue;
        }
        let cgroup = std::fs::read_to_string(e.path().join("cgroup")).unwrap_or_default();
        if cgroup.lines().any(|l| l.contains("/kubepods/")) {
            pods += 1;
        } else {
            let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
            outside.push(format!(
                "pid {pid} ({comm}) outside any pod: {} (cgroup {})",
                String::from_utf8_lossy(&cmd).replace('\0', " "),
                cgroup.lines().next().unwrap_or("")
            ));
        }
    }
    assert!(outside.is_empty(), "{}", outside.join("\n"));
    assert!(
        pods > 0,
        "no libvirtd found at all: the check proves nothing"
    );
}
