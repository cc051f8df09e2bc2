//! Live migration end to end on the lab, through the Kubernetes API only: the installed
//! roam-controller runs a VirtualMachine in a real launcher pod started by the real kubelet
//! (roam-shim and the pod's own libvirtd in `lab.local/roam-launcher:dev`); the guest gets
//! its /32 lease from OVN (serial log) and answers ping and a TCP echo stream from a client
//! pod on node-a (plumbed by roam-cni, the nodes' CNI). `roam.dev/migrate-to=node-b` ends Succeeded with the same
//! IP and MAC, the source pod gone, the Address's host node-b, ping answered and the TCP
//! stream alive (no reset, every byte echoed); then it migrates back. Bad requests (a
//! malformed annotation, a missing node, the node it is on, a cordoned node, `auto` with
//! every other node cordoned) are refused with the reason in status and an Event, and the VM is untouched; a
//! migration deleted mid-way (slowed by a low bandwidth) is Aborted and the VM keeps running
//! on the source with its address.
//! The way back is driven by the `kubectl roam` plugin (`migrate VM --to NODE --watch`): it
//! exits 0 once the migration Succeeded, after printing its progress. Last, a guest reset
//! (`virsh reset`) shows in the VM's status (`guestResets`) and a `GuestReset` Event; and a
//! migration that cannot converge (1 MiB/s) but allows post-copy switches at its timeout
//! and ends Succeeded on node-b, the TCP stream alive.
//! The Network has no MTU of its own: the guest's is the default (1400) before and after each
//! migration, and with the VM on node-b the client on node-a reaches it through geneve over
//! the lab's 1500-byte node link — 1400-byte pings with DF set and a 4 MiB TCP echo pass, a
//! 1500-byte ping does not.
//! After each migration no process of either node uses another node's paths (the source's
//! libvirtd reaches the target's through the shims' proxies, as installed).
//! The migration is encrypted and authenticated with the nodes' roam certificates: a capture
//! of the node link during the first one holds a control string sent in clear between the
//! nodes but not a marker the guest holds in memory (on its kernel command line); the
//! target runner's migration proxy refuses plain TCP, a client whose certificate another CA
//! signed and another node's roam certificate, and takes one with node-a's certificate (virsh
//! reaches the runner's libvirtd through it). Between the two legs the roam CA is replaced
//! while the VM runs (README: Certificates rotate): every node gets a certificate of the new
//! CA, the guest's TCP stream lives through it, and the way back migrates on the new
//! certificates.

mod migration_fixture;

use std::time::Duration;

use migration_fixture::*;
use roam_e2e::{Lab, foreign_paths, wait_until};
use serde_json::json;

#[test]
fn a_vm_boots_in_a_launcher_pod_and_live_migrates_back_and_forth() {
    let lab = Lab::get();
    let b = boot(&lab);
    let (ctl, cli_ns, ip, mac, addr) = (
        &b.ctl,
        &b.cli_ns,
        b.ip.clone(),
        b.mac.clone(),
        b.addr.clone(),
    );

    let mtu = wait_until(LONG, "the guest's MTU over HTTP", || guest_mtu(cli_ns, &ip));
    assert_eq!(mtu, 1400, "a Network's default MTU, from the DHCP lease");

    // a rolling update of roam's node DaemonSet (roam-cni) while the VM runs: it keeps
    // running in the same pod with its address, its TCP stream and the client pod's
    // connectivity survive, new pods are plumbed by the new installers, and the VM migrates
    // afterwards (the round trip below)
    roll_node_daemonset(&lab, cli_ns, &ip, &mac);

    for (to, from) in [("node-b", "node-a"), ("node-a", "node-b")] {
        let before = vm(&lab, &H8)["status"].clone();
        let (stream, stop) = Stream::start(&lab, cli_ns, &ip);
        std::thread::sleep(Duration::from_millis(500));
        let (m, capture) = if to == "node-a" {
            (migrate_with_plugin(&lab, to), None)
        } else {
            let capture = Capture::start(&lab);
            (migrate(&lab, to), Some(capture))
        };
        let st = &m["status"];
        assert_eq!(st["phase"], "Succeeded", "{m}\n{}", ctl.log_tail(60));
        // (after the phase: a failed migration's capture is empty, and says less)
        if let Some(c) = capture {
            c.check();
        }
        assert_eq!(
            (st["sourceNode"].as_str(), st["targetNode"].as_str()),
            (Some(from), Some(to))
        );
        assert!(
            st["downtimeMs"].is_u64(),
            "libvirt's downtime recorded: {st}"
        );
        assert!(
            switchover_ms(
                &lab,
                H8.ns,
                m["metadata"]["name"].as_str().unwrap_or_default()
            )
            .is_some(),
            "the target activated the VM's port, timed from the pause: {st}\n{}",
            ctl.log_tail(60)
        );
        // every phase it went through, in order, with non-decreasing times
        let tr = st["phaseTransitions"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let phases: Vec<&str> = tr.iter().filter_map(|t| t["phase"].as_str()).collect();
        let order = [
            "TargetScheduling",
            "TargetReady",
            "Migrating",
            "Switchover",
            "Succeeded",
        ];
        let seen: Vec<&str> = phases
            .iter()
            .copied()
            .filter(|p| order.contains(p))
            .collect();
        assert_eq!(seen, order, "phase transitions: {tr:?}");
        let times: Vec<&str> = tr.iter().filter_map(|t| t["time"].as_str()).collect();
        assert_eq!(times.len(), tr.len(), "{tr:?}");
        assert!(
            times.windows(2).all(|w| w[0] <= w[1]),
            "times in order: {tr:?}"
        );
        let v = wait_until(LONG, "the VM Running on the target", || {
            let v = vm(&lab, &H8)["status"].clone();
            (v["phase"] == "Running" && v["node"] == to && v["migration"].is_null()).then_some(v)
        });
        assert_eq!(v["interfaces"][0]["ip"], ip.as_str(), "same IP");
        assert_eq!(v["interfaces"][0]["mac"], mac.as_str(), "same MAC");
        let old_pod = before["pod"].as_str().unwrap();
        wait_until(LONG, "the source pod gone", || {
            get(&lab, &["-n", NS, "get", "pod", old_pod])
                .is_none()
                .then_some(())
        });
        let a = get(&lab, &["get", "address", &addr]).expect("the Address");
        assert_eq!(a["spec"]["host"], to, "{a}");
        wait_until(LONG, "the guest answers ping after the migration", || {
            cli_ns.ping_once(&ip).then_some(())
        });
        // a data centre's MTU: the Network's default (1400) in the guest (from DHCP) before
        // and after; on node-b the client (node-a) reaches it through geneve over the
        // lab's 1500-byte node link: full-size packets with DF set and a bulk transfer pass,
        // a 1500-byte packet does not
        let mtu = wait_until(LONG, "the guest's MTU over HTTP", || guest_mtu(cli_ns, &ip));
        assert_eq!(mtu, 1400, "the guest's MTU after the move");
        if to == "node-b" {
            assert_eq!(
                cli_ns.df_pings(&ip, 1400),
                Ok(3),
                "1400-byte DF pings across nodes"
            );
            // the client's own interface takes 1500: the path drops it, not the sender
            cli_ns.run("ip", &["link", "set", "eth0", "mtu", "1500"]);
            assert_eq!(
                cli_ns.df_pings(&ip, 1500),
                Ok(0),
                "a 1500-byte packet does not fit geneve over the 1500-byte underlay"
            );
            cli_ns
                .bulk_echo(&ip, 4 << 20)
                .unwrap_or_else(|e| panic!("a 4 MiB TCP transfer across nodes: {e}"));
        }
        let out = stream.stop(&stop);
        assert!(
            out.starts_with("OK"),
            "the TCP stream survived the migration: {out}"
        );
        let ev = events_of(&lab, &H8, VM);
        assert!(ev.contains("MigrationSucceeded"), "{ev}");
        // separate hosts: libvirt's peer connection and QEMU's stream went over the node
        // network; no process on either node holds the other's (or central's) paths
        let foreign = foreign_paths(&lab);
        assert!(
            foreign.is_empty(),
            "a node's processes use paths of another host:\n{}",
            foreign.join("\n")
        );
        eprintln!(
            "{from} → {to}: downtime {} ms, switchover {} ms, stream {out}",
            st["downtimeMs"], st["switchoverMs"]
        );
        qemu_is_unprivileged(&format!("guest={NS}_{VM}"));
        if to == "node-b" {
            proxy_takes_only_roam_certificates(&lab, &v);
            the_node_api_takes_only_roam_certificates(&lab, &v);
            // the way back runs on certificates of a new CA, replaced while the VM runs
            rotate_the_ca(&lab, cli_ns, &ip);
        }
    }

    // bad requests: refused with the reason, the VM untouched (on node-a)
    let here = vm(&lab, &H8)["status"].clone();
    kubectl(
        &lab,
        &["-n", NS, "annotate", "vm", VM, "roam.dev/migrate-to=Node_B"],
    );
    wait_until(LONG, "the malformed annotation refused", || {
        let v = vm(&lab, &H8);
        (v["metadata"]["annotations"]["roam.dev/migrate-to"].is_null()
            && events_of(&lab, &H8, VM).contains("MigrationRejected"))
        .then_some(())
    });
    for (to, why) in [
        ("node-z", "does not exist"),
        ("node-a", "already runs on node-a"),
    ] {
        let m = migrate(&lab, to);
        assert_eq!(m["status"]["phase"], "Failed", "{m}");
        let reason = m["status"]["reason"].as_str().unwrap_or_default();
        assert!(reason.contains(why), "{reason}");
        assert!(
            events_of(&lab, &H8, m["metadata"]["name"].as_str().unwrap())
                .contains("MigrationFailed")
        );
    }
    // migrate-to=auto with every other node cordoned: nothing created, the reason on the VM
    // (the guard uncordons them whatever happens)
    {
        let others: Vec<String> = lab
            .nodes()
            .into_iter()
            .filter(|n| here["node"] != n.as_str())
            .collect();
        struct Uncordon<'a>(&'a Lab, &'a [String]);
        impl Drop for Uncordon<'_> {
            fn drop(&mut self) {
                for n in self.1 {
                    let _ = roam_e2e::try_kubectl(self.0, &["uncordon", n]);
                }
            }
        }
        let _guard = Uncordon(&lab, &others);
        for n in &others {
            kubectl(&lab, &["cordon", n]);
        }
        // a named target is held to the same rules: refused, nothing created
        let m = migrate(&lab, &others[0]);
        assert_eq!(m["status"]["phase"], "Failed", "{m}");
        let reason = m["status"]["reason"].as_str().unwrap_or_default();
        assert!(
            reason.contains(&format!(
                "target node {} cannot take the VM: cordoned",
                others[0]
            )),
            "{reason}"
        );
        kubectl(
            &lab,
            &["-n", NS, "annotate", "vm", VM, "roam.dev/migrate-to=auto"],
        );
        let cond = wait_until(LONG, "migrate-to=auto refused", || {
            let v = vm(&lab, &H8);
            if !v["metadata"]["annotations"]["roam.dev/migrate-to"].is_null() {
                return None;
            }
            v["status"]["conditions"]
                .as_array()?
                .iter()
                .find(|c| c["type"] == "MigrationRequest" && c["reason"] == "NoTargetNode")
                .cloned()
        });
        let why: Vec<String> = others
            .iter()
            .map(|n| format!("{n}: cordoned (spec.unschedulable)"))
            .collect();
        assert_eq!(
            cond["message"].as_str().unwrap_or_default(),
            format!(
                "migrate-to=auto: no node can take the VM: {}",
                why.join("; ")
            ),
            "{cond}"
        );
    }
    let v = vm(&lab, &H8)["status"].clone();
    assert_eq!(
        (v["node"].clone(), v["pod"].clone(), v["phase"].clone()),
        (here["node"].clone(), here["pod"].clone(), json!("Running"))
    );
    assert!(cli_ns.ping_once(&ip), "the guest still answers");

    // a migration deleted mid-way (1 MiB/s: it cannot finish) is aborted
    create(
        &lab,
        &[
            json!({"apiVersion": "roam.dev/v1alpha1", "kind": "VirtualMachineMigration",
        "metadata": {"name": "h8-slow", "namespace": NS, "labels": {"roam.dev/vm": VM}},
        "spec": {"vm": VM, "targetNode": "node-b", "bandwidthMibPerSecond": 1}}),
        ],
    );
    wait_until(LONG, "the slow migration copying", || {
        let m = get(&lab, &["-n", NS, "get", "vmim", "h8-slow"])?;
        (m["status"]["phase"] == "Migrating").then_some(())
    });
    kubectl(
        &lab,
        &["-n", NS, "delete", "vmim", "h8-slow", "--wait=false"],
    );
    wait_until(LONG, "the deleted migration gone (aborted first)", || {
        get(&lab, &["-n", NS, "get", "vmim", "h8-slow"])
            .is_none()
            .then_some(())
    });
    assert!(
        events_of(&lab, &H8, VM).contains("MigrationAborted"),
        "{}",
        events_of(&lab, &H8, VM)
    );
    let v = wait_until(LONG, "the VM back to Running on the source", || {
        let v = vm(&lab, &H8)["status"].clone();
        (v["phase"] == "Running" && v["migration"].is_null()).then_some(v)
    });
    assert_eq!(v["node"], "node-a");
    assert_eq!(v["interfaces"][0]["ip"], ip.as_str());
    let a = get(&lab, &["get", "address", &addr]).expect("the Address");
    assert_eq!(a["spec"]["host"], "node-a", "{a}");
    wait_until(LONG, "the target pod gone", || {
        let pods = get(
            &lab,
            &["-n", NS, "get", "pods", "-l", "roam.dev/launcher=true"],
        )?;
        (pods["items"].as_array()?.len() == 1).then_some(())
    });
    wait_until(LONG, "the guest answers after the abort", || {
        cli_ns.ping_once(&ip).then_some(())
    });

    // a guest reset (here from outside; a kernel panic with panic=N looks the same): the
    // domain keeps running, so only the shim's reset count shows it, in status and an Event
    assert!(
        vm(&lab, &H8)["status"]["guestResets"].is_null(),
        "no reset yet: {}",
        vm(&lab, &H8)["status"]
    );
    // the VM's launcher pod's own libvirtd
    let uri = roam_e2e::launcher_libvirt(&lab, NS, VM, "node-a").expect("the VM's pod on node-a");
    roam_e2e::run("virsh", &["-c", &uri, "reset", &format!("{NS}_{VM}")]);
    let r = wait_until(LONG, "the reset in the VM's status", || {
        let r = vm(&lab, &H8)["status"]["guestResets"].clone();
        (!r.is_null()).then_some(r)
    });
    assert_eq!(r["total"], 1, "{r}");
    assert_eq!(r["pod"], v["pod"], "{r}");
    let ev = events_of(&lab, &H8, VM);
    assert!(ev.contains("GuestReset"), "{ev}");
    assert_eq!(vm(&lab, &H8)["status"]["phase"], "Running");
    wait_until(LONG, "the guest answers after its reboot", || {
        cli_ns.ping_once(&ip).then_some(())
    });

    // post-copy: at 1 MiB/s the 256 MiB guest cannot converge (its pre-copy would need
    // minutes, past the controller's timeout + post-copy backstop of 65 s, which would fail
    // it); allowed post-copy, at the 5 s timeout the source shim switches, the guest runs on
    // node-b at once and pulls the rest of its memory: Succeeded, same IP, the TCP stream
    // alive. QEMU runs unprivileged: the lab's nodes allow it userfaultfd (docs/install.md)
    let (stream, stop) = Stream::start(&lab, cli_ns, &ip);
    std::thread::sleep(Duration::from_millis(500));
    create(
        &lab,
        &[
            json!({"apiVersion": "roam.dev/v1alpha1", "kind": "VirtualMachineMigration",
        "metadata": {"name": "h8-postcopy", "namespace": NS, "labels": {"roam.dev/vm": VM}},
        "spec": {"vm": VM, "targetNode": "node-b", "bandwidthMibPerSecond": 1,
                 "allowPostCopy": true, "timeoutSeconds": 5}}),
        ],
    );
    let m = wait_until(LONG, "the post-copy migration ended", || {
        let m = get(&lab, &["-n", NS, "get", "vmim", "h8-postcopy"])?;
        matches!(
            m["status"]["phase"].as_str(),
            Some("Succeeded" | "Failed" | "Aborted")
        )
        .then_some(m)
    });
    assert_eq!(
        m["status"]["phase"],
        "Succeeded",
        "{m}\n{}",
        ctl.log_tail(60)
    );
    let v = wait_until(LONG, "the VM Running on node-b after post-copy", || {
        let v = vm(&lab, &H8)["status"].clone();
        (v["phase"] == "Running" && v["node"] == "node-b" && v["migration"].is_null()).then_some(v)
    });
    assert_eq!(v["interfaces"][0]["ip"], ip.as_str(), "same IP");
    let a = get(&lab, &["get", "address", &addr]).expect("the Address");
    assert_eq!(a["spec"]["host"], "node-b", "{a}");
    wait_until(LONG, "the guest answers after post-copy", || {
        cli_ns.ping_once(&ip).then_some(())
    });
    let out = stream.stop(&stop);
    assert!(
        out.starts_with("OK"),
        "the TCP stream survived post-copy: {out}"
    );
    eprintln!("post-copy node-a → node-b: Succeeded, stream {out}");
}

/// The VM's shim (on `status.node`, installed with the nodes' identities) serves its API over
/// mutual TLS only: plain HTTP gets nothing; without a client certificate only /v1/health
/// answers (403 elsewhere); roam-controller's certificate (issued here from the roam CA, as
/// the controller does) with the VM's token reads the status; another node's certificate may
/// read the status (a migration's source does) but not abort (403); and a client that means
/// another node refuses this node's certificate.
fn the_node_api_takes_only_roam_certificates(lab: &Lab, status: &serde_json::Value) {
    use roam_shim_api::client::ShimClient;
    use roam_shim_api::tls::{ClientTls, Identity};
    let node = status["node"].as_str().unwrap().to_string();
    let other = lab.nodes().into_iter().find(|n| *n != node).unwrap();
    let ip = lab.node(&node).ip;
    let port = status["shimPort"].as_u64().expect("the shim's port");
    let secret = |ns: &str, name: &str, key: &str| {
        let b64 = kubectl(
            lab,
            &[
                "-n",
                ns,
                "get",
                "secret",
                name,
                "-o",
                &format!("jsonpath={{.data.{}}}", key.replace('.', "\\.")),
            ],
        );
        let out = std::process::Command::new("base64")
            .args(["-d"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .and_then(|mut c| {
                use std::io::Write;
                c.stdin.take().unwrap().write_all(b64.as_bytes())?;
                c.wait_with_output()
            })
            .expect("base64");
        String::from_utf8(out.stdout).unwrap()
    };
    let uid = vm(lab, &H8)["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_string();
    let token = secret("roam-system", &format!("roam-shim-token-{uid}"), "token");
    let ca = roam_pki::Ca::from_pem(
        &secret("roam-system", "roam-ca", "ca.crt"),
        &secret("roam-system", "roam-ca", "ca.key"),
    )
    .expect("the roam CA from its Secret");
    let (key, cert) = ca
        .controller_identity(std::time::SystemTime::now(), Duration::from_secs(3600))
        .unwrap();
    let controller = Identity::from_pem(&key, &cert, ca.cert_pem(), "the test, as roam-controller");
    let node_file = |n: &str, f: &str| {
        std::fs::read_to_string(lab.node_path(n, &format!("/var/lib/roam/pki/{f}")))
            .expect("a node's identity")
    };
    let peer = Identity::from_pem(
        &node_file(&other, "node.key"),
        &node_file(&other, "node.crt"),
        ca.cert_pem(),
        &other,
    );
    let https = format!("https://{ip}:{port}");
    let tls = |identity: &Identity, expect: &str| ClientTls {
        identity: identity.clone(),
        server_name: expect.to_string(),
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let plain = ShimClient::new(&format!("http://{ip}:{port}"), &token).unwrap();
        assert!(plain.health().await.is_err(), "plain HTTP must get nothing");
        let ctl = ShimClient::with_tls(&https, &token, &tls(&controller, &node)).unwrap();
        let st = ctl
            .status()
            .await
            .expect("roam-controller's certificate and the token");
        assert_eq!(st.node, node);
        let from_peer = ShimClient::with_tls(&https, &token, &tls(&peer, &node)).unwrap();
        from_peer
            .status()
            .await
            .expect("a node's certificate reads the status (a migration's source does)");
        let e = from_peer.abort().await.unwrap_err();
        assert!(
            matches!(
                &e,
                roam_shim_api::Error::Peer {
                    status: Some(403),
                    ..
                }
            ),
            "a node's certificate may not abort: {e}"
        );
        let posing = ShimClient::with_tls(&https, &token, &tls(&controller, &other)).unwrap();
        let e = posing.status().await.unwrap_err();
        assert!(
            e.to_string().contains("certificate"),
            "a client that means {other} must refuse {node}'s certificate: {e}"
        );
    });
    // no client certificate at all (curl, not verifying the server): health only
    let code = |path: &str| {
        let out = std::process::Command::new("curl")
            .args([
                "-sk",
                "-m",
                "10",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                "-H",
                &format!("Authorization: Bearer {token}"),
                &format!("{https}{path}"),
            ])
            .output()
            .expect("curl");
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    assert_eq!(code("/v1/health"), "200");
    assert_eq!(code("/v1/status"), "403", "the token alone is not enough");
}

/// The CA replaced as the README says (delete the Secret `roam-system/roam-ca`, restart
/// roam-controller) with the VM running and a TCP stream to it: a new CA is published, every
/// node's roam-node gets a certificate of it (same key) within its check period, and the
/// stream and the guest never notice. The next migration (the way back) runs on the new
/// certificates.
fn rotate_the_ca(lab: &Lab, cli_ns: &roam_e2e::TestNetns, ip: &str) {
    let ca_of = |lab: &Lab| {
        kubectl(
            lab,
            &[
                "-n",
                "roam-system",
                "get",
                "configmap",
                "roam-ca",
                "-o",
                "jsonpath={.data.ca\\.crt}",
            ],
        )
    };
    let node_file = |node: &str, file: &str| {
        std::fs::read_to_string(lab.node_path(node, &format!("/var/lib/roam/pki/{file}")))
            .unwrap_or_default()
    };
    let old_ca = ca_of(lab);
    let old_keys: Vec<(String, String)> = lab
        .nodes()
        .into_iter()
        .map(|n| {
            let key = node_file(&n, "node.key");
            assert!(
                roam_pki::signed_by(&node_file(&n, "node.crt"), &old_ca),
                "{n}: a certificate of the current CA before the rotation"
            );
            (n, key)
        })
        .collect();
    let (stream, stop) = Stream::start(lab, cli_ns, ip);
    kubectl(lab, &["-n", "roam-system", "delete", "secret", "roam-ca"]);
    kubectl(
        lab,
        &[
            "-n",
            "roam-system",
            "rollout",
            "restart",
            "deploy/roam-controller",
        ],
    );
    kubectl(
        lab,
        &[
            "-n",
            "roam-system",
            "rollout",
            "status",
            "deploy/roam-controller",
            "--timeout=180s",
        ],
    );
    let new_ca = wait_until(LONG, "a new roam CA published", || {
        let ca = ca_of(lab);
        (!ca.is_empty() && ca != old_ca).then_some(ca)
    });
    assert!(roam_pki::cert_info(&new_ca).unwrap().is_ca, "{new_ca}");
    for (node, key) in &old_keys {
        let cert = roam_e2e::wait_until_else(
            LONG,
            &format!("{node}: a certificate of the new CA"),
            || {
                let cert = node_file(node, "node.crt");
                roam_pki::signed_by(&cert, &new_ca).then_some(cert)
            },
            || {
                kubectl(
                    lab,
                    &["-n", "roam-system", "logs", "ds/roam-node", "--tail=30"],
                )
            },
        );
        assert!(
            !roam_pki::signed_by(&cert, &old_ca),
            "{node}: the old CA did not sign the new certificate"
        );
        assert_eq!(&node_file(node, "node.key"), key, "{node} keeps its key");
        assert_eq!(
            roam_pki::cert_info(&cert).unwrap().common_name.as_deref(),
            Some(node.as_str())
        );
    }
    // the controller (new CA) reaches the shim again once its node has a certificate of the
    // new CA: the VM is Ready again
    wait_until(
        LONG,
        "the VM Running and Ready on the new certificates",
        || {
            let v = vm(lab, &H8);
            let ready = v["status"]["conditions"]
                .as_array()?
                .iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True");
            (v["status"]["phase"] == "Running" && ready).then_some(())
        },
    );
    assert!(cli_ns.ping_once(ip), "the guest answers after the rotation");
    let out = stream.stop(&stop);
    assert!(
        out.starts_with("OK"),
        "the TCP stream lived through the CA rotation: {out}"
    );
}

/// `kubectl -n kube-system rollout restart ds/roam-cni` with the H8 VM running and a TCP
/// stream from the client pod to it; checks what must not change.
fn roll_node_daemonset(lab: &Lab, cli_ns: &roam_e2e::TestNetns, ip: &str, mac: &str) {
    let ds_pods = || -> Vec<String> {
        let l = get(
            lab,
            &[
                "-n",
                "kube-system",
                "get",
                "pods",
                "-l",
                "app.kubernetes.io/name=roam-cni",
            ],
        )
        .expect("roam-cni's pods");
        let mut names: Vec<String> = l["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_string))
            .collect();
        names.sort();
        names
    };
    let before_pods = ds_pods();
    let before = vm(lab, &H8)["status"].clone();
    // the pod that runs the VM: its runner (roam as installed)
    let launcher = |name: &str| {
        let (ns, pod) = roam_e2e::runner_of_launcher(lab, NS, name);
        get(lab, &["-n", &ns, "get", "pod", &pod])
    };
    let restarts = |p: &serde_json::Value| -> Vec<u64> {
        p["status"]["containerStatuses"]
            .as_array()
            .map(|c| {
                c.iter()
                    .filter_map(|c| c["restartCount"].as_u64())
                    .collect()
            })
            .unwrap_or_default()
    };
    let pod_name = before["pod"].as_str().expect("the VM's pod").to_string();
    let restarts_before = restarts(&launcher(&pod_name).expect("the launcher pod"));
    let (stream, stop) = Stream::start(lab, cli_ns, ip);
    std::thread::sleep(Duration::from_millis(500));
    kubectl(
        lab,
        &["-n", "kube-system", "rollout", "restart", "ds/roam-cni"],
    );
    kubectl(
        lab,
        &[
            "-n",
            "kube-system",
            "rollout",
            "status",
            "ds/roam-cni",
            "--timeout=300s",
        ],
    );
    let after_pods = wait_until(LONG, "only the new roam-cni pods left", || {
        let now = ds_pods();
        (now.len() == before_pods.len() && now.iter().all(|p| !before_pods.contains(p)))
            .then_some(now)
    });
    let out = stream.stop(&stop);
    assert!(
        out.starts_with("OK"),
        "the TCP stream survived the DaemonSet's rolling update: {out}"
    );
    let v = vm(lab, &H8)["status"].clone();
    assert_eq!(
        (v["phase"].as_str(), v["node"].clone(), v["pod"].clone()),
        (
            Some("Running"),
            before["node"].clone(),
            before["pod"].clone()
        ),
        "the VM kept running in its pod"
    );
    assert_eq!(v["interfaces"][0]["ip"], ip, "same IP");
    assert_eq!(v["interfaces"][0]["mac"], mac, "same MAC");
    assert_eq!(
        restarts(&launcher(&pod_name).expect("the launcher pod")),
        restarts_before,
        "no launcher container restarted"
    );
    assert!(
        cli_ns.ping_once(ip),
        "the client pod still reaches the guest"
    );
    // the new installers plumb new pods
    create(lab, &[roam_e2e::sleeper_pod(NS, "after-roll", "node-b")]);
    let pod_ip = wait_until(LONG, "a pod created after the rollout runs", || {
        let p = get(lab, &["-n", NS, "get", "pod", "after-roll"])?;
        (p["status"]["phase"] == "Running")
            .then(|| p["status"]["podIP"].as_str().map(str::to_string))
            .flatten()
    });
    assert!(
        pod_ip.starts_with(H8.subnet.trim_end_matches("0/24")),
        "the new pod has an address of the Network: {pod_ip}"
    );
    wait_until(LONG, "the client pod reaches the new pod on node-b", || {
        cli_ns.ping_once(&pod_ip).then_some(())
    });
    kubectl(
        lab,
        &["-n", NS, "delete", "pod", "after-roll", "--wait=false"],
    );
    eprintln!("roam-cni rolled: {before_pods:?} → {after_pods:?}; VM kept its pod, stream {out}");
}

/// `kubectl roam migrate VM --to NODE --watch` (the plugin binary, built now), as a user runs
/// it: it must exit 0 and print the phases it went through; returns the migration it made.
fn migrate_with_plugin(lab: &Lab, to: &str) -> serde_json::Value {
    let bin = roam_e2e::workspace_binary("roam-migrator", "kubectl-roam");
    let before: Vec<String> = migrations(lab, &H8)
        .iter()
        .filter_map(|m| m["metadata"]["name"].as_str().map(str::to_string))
        .collect();
    let out = std::process::Command::new(&bin)
        .args(["migrate", VM, "--to", to, "--watch", "-n", NS])
        .env("KUBECONFIG", lab.kubeconfig())
        .output()
        .expect("run kubectl-roam");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "kubectl roam migrate failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    assert!(
        stdout.contains(&format!("roam.dev/migrate-to={to}"))
            && stdout.contains(&format!("Succeeded: node-b → {to}")),
        "the plugin reports the annotation and the outcome:\n{stdout}"
    );
    migrations(lab, &H8)
        .into_iter()
        .find(|m| {
            !before.contains(
                &m["metadata"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            )
        })
        .expect("the plugin's migration")
}

/// tcpdump on node-b's link to the lab's bridge for TCP between node-a and node-b, from
/// before a migration to after it, with a control string sent in clear between the nodes
/// while it runs.
struct Capture {
    child: std::process::Child,
    file: std::path::PathBuf,
    control: String,
}

impl Capture {
    fn start(lab: &Lab) -> Capture {
        use std::io::BufRead;
        let (a, b) = (lab.node("node-a").ip, lab.node("node-b").ip);
        let file = lab
            .dir()
            .join(format!("migration-{}.pcap", std::process::id()));
        // node-b's port on the lab bridge (roam-up + the last byte of its address): a
        // capture on the bridge itself sees only the host's own traffic, not what it
        // forwards between the nodes
        let port = format!("roam-up{}", b.rsplit('.').next().unwrap_or_default());
        let mut child = std::process::Command::new("tcpdump")
            .args(["-i", &port, "-U", "-s", "0", "-w"])
            .arg(&file)
            .arg(format!("tcp and host {a} and host {b}"))
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run tcpdump");
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stderr)
                .lines()
                .map_while(Result::ok)
            {
                let _ = tx.send(line);
            }
        });
        let deadline = std::time::Instant::now() + LONG;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match rx.recv_timeout(left) {
                Ok(l) if l.contains("listening on") => break,
                Ok(_) => {}
                Err(e) => panic!("tcpdump did not start capturing: {e}"),
            }
        }
        // the control: a string in clear from node-a to node-b, which the capture must hold
        let control = format!("roam-capture-control-{}", std::process::id());
        let mut listener = roam_e2e::node_command(lab, "node-b", "busybox")
            .args(["nc", "-l", "-p", "17999"])
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("a listener on node-b");
        wait_until(
            LONG,
            "the control string sent from node-a to node-b",
            || {
                roam_e2e::node_command(lab, "node-a", "sh")
                    .args(["-c", &format!("echo {control} | busybox nc -w 2 {b} 17999")])
                    .status()
                    .ok()?
                    .success()
                    .then_some(())
            },
        );
        let _ = listener.kill();
        let _ = listener.wait();
        Capture {
            child,
            file,
            control,
        }
    }

    /// Stop the capture: it holds the control string and more than a MiB (the migration's
    /// streams), but not the guest's marker.
    fn check(mut self) {
        let pid = self.child.id().to_string();
        let _ = std::process::Command::new("kill")
            .args(["-INT", &pid])
            .status();
        let _ = self.child.wait();
        let bytes = std::fs::read(&self.file).expect("the capture");
        let _ = std::fs::remove_file(&self.file);
        let holds = |s: &str| bytes.windows(s.len()).any(|w| w == s.as_bytes());
        assert!(
            holds(&self.control),
            "the capture must see the node link in clear (the control string)"
        );
        assert!(
            bytes.len() > 1 << 20,
            "the capture holds the migration's streams: only {} bytes",
            bytes.len()
        );
        assert!(
            !holds(GUEST_MARKER),
            "the guest's marker crossed the node link in clear ({} bytes captured)",
            bytes.len()
        );
        eprintln!(
            "capture of the migration on the node link: {} bytes, the control string in clear, no guest marker",
            bytes.len()
        );
    }
}

/// The VM's QEMU (one, after a migration) runs as uid/gid 107, in no other group, with no
/// capability; its mount namespace has no node key and no roam PKI directory, and of
/// its `/dev` it may open only what any process may (`/dev/null`, `/dev/net/tun`, …): no
/// disk of the node, no `/dev/kvm` (TCG).
fn qemu_is_unprivileged(needle: &str) {
    let procs = wait_until(LONG, "one QEMU of the VM", || {
        let p = roam_e2e::qemu_processes(needle);
        (p.len() == 1).then_some(p)
    });
    let secrets = [
        "/var/lib/roam/pki/node.key",
        "/var/lib/roam/pki",
        "/run/libvirt/pki",
    ];
    let id = roam_e2e::qemu_identity(procs[0].0, &secrets).expect("the VM's QEMU");
    assert_eq!(id.uids, [107; 4], "QEMU's uids: {id:?}");
    assert_eq!(id.gids, [107; 4], "QEMU's gids: {id:?}");
    // libvirt sets the groups of a user without a name to its own group
    assert!(id.groups.iter().all(|g| *g == 107), "QEMU's groups: {id:?}");
    assert_eq!(id.cap_eff, 0, "QEMU has no capability: {id:?}");
    assert!(id.visible.is_empty(), "QEMU sees {:?}", id.visible);
    let world = |d: &str| {
        [
            "null", "zero", "full", "random", "urandom", "tty", "ptmx", "net/tun",
        ]
        .iter()
        .any(|w| d.ends_with(&format!("/dev/{w}")))
            || d.contains("/dev/pts/")
    };
    let odd: Vec<&String> = id.open_devices.iter().filter(|d| !world(d)).collect();
    assert!(odd.is_empty(), "QEMU may open devices of the node: {odd:?}");
}

/// The runner's migration proxy on the target node (`status` is the VM's) takes mutual TLS
/// with a roam CA certificate of its own node or of the migration's source only, and its
/// libvirtd has no network socket: plain TCP, a certificate of another CA and another node's
/// roam certificate get nothing; node-a's own certificate reaches the runner's libvirtd
/// (virsh through a source-side proxy the test runs, as node-a's shim would).
fn proxy_takes_only_roam_certificates(lab: &Lab, status: &serde_json::Value) {
    let node = status["node"].as_str().unwrap();
    let ip = lab.node(node).ip;
    let shim_port = status["shimPort"].as_u64().expect("the shim's port") as u16;
    let port = roam_core::launcher::libvirt_port((17100, 17199), shim_port)
        .expect("the launcher's libvirt port");
    let target: std::net::SocketAddr = format!("{ip}:{port}").parse().unwrap();
    let virsh = |uri: &str| {
        std::process::Command::new("timeout")
            .args(["30", "virsh", "-c", uri, "list", "--all"])
            .output()
            .expect("run virsh")
    };
    let plain = virsh(&format!("qemu+tcp://{ip}:{port}/system"));
    assert!(!plain.status.success(), "plain TCP must be refused");

    let ca = kubectl(
        lab,
        &[
            "-n",
            "roam-system",
            "get",
            "configmap",
            "roam-ca",
            "-o",
            "jsonpath={.data.ca\\.crt}",
        ],
    );
    let dir = lab.dir().join(format!("proxy-pki-{}", std::process::id()));
    let rt = tokio::runtime::Runtime::new().unwrap();
    // virsh through a source side of the proxy with this identity: its output
    let through = |name: &str, key: &str, cert: &str| {
        let d = dir.join(name);
        std::fs::create_dir_all(&d).unwrap();
        let id = roam_shim_api::tls::Identity::from_pem(key, cert, &ca, name);
        let sockets = roam_vm_shim::proxy::Sockets::new(&d);
        let _out = {
            let _in_rt = rt.enter();
            roam_vm_shim::proxy::Outgoing::start(
                &sockets,
                target,
                node,
                id.client_config().unwrap(),
            )
            .unwrap()
        };
        virsh(&sockets.peer_uri())
    };
    // a certificate for "node-a" that another CA signed
    let other =
        roam_pki::Ca::generate(std::time::SystemTime::now(), Duration::from_secs(3600)).unwrap();
    let facts = roam_pki::NodeFacts {
        name: "node-a".into(),
        addresses: vec![],
    };
    let (key, foreign) = roam_pki::node_identity(
        &other,
        &facts,
        std::time::SystemTime::now(),
        Duration::from_secs(3600),
    )
    .unwrap();
    let stranger = through("stranger", &key, &foreign);
    assert!(
        !stranger.status.success(),
        "a certificate of another CA must be refused"
    );
    eprintln!(
        "the proxy refused a stranger: {}",
        String::from_utf8_lossy(&stranger.stderr).trim()
    );
    // node-a's own identity, as its roam-node keeps it
    let file = |f: &str| {
        std::fs::read_to_string(lab.node_path("node-a", &format!("/var/lib/roam/pki/{f}")))
            .expect("node-a's identity")
    };
    let ok = through("node-a", &file("node.key"), &file("node.crt"));
    assert!(
        ok.status.success(),
        "node-a's certificate must reach the runner's libvirtd: {}",
        String::from_utf8_lossy(&ok.stderr)
    );
    // a certificate of the roam CA for a node that is neither this runner's node nor the
    // migration's source: refused (the proxy's allow-list), so one node's key opens no other
    // node's VMs
    let secret = |k: &str| {
        kubectl(
            lab,
            &[
                "-n",
                "roam-system",
                "get",
                "secret",
                "roam-ca",
                "-o",
                &format!("go-template={{{{index .data \"{k}\" | base64decode}}}}"),
            ],
        )
    };
    let roam_ca =
        roam_pki::Ca::from_pem(&secret("ca.crt"), &secret("ca.key")).expect("the roam CA");
    let facts = roam_pki::NodeFacts {
        name: "node-x".into(),
        addresses: vec![],
    };
    let (key, cert) = roam_pki::node_identity(
        &roam_ca,
        &facts,
        std::time::SystemTime::now(),
        Duration::from_secs(3600),
    )
    .unwrap();
    let other_node = through("node-x", &key, &cert);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        !other_node.status.success(),
        "another node's roam certificate must be refused by {node}'s runner"
    );
    eprintln!(
        "the proxy refused another node's certificate: {}",
        String::from_utf8_lossy(&other_node.stderr).trim()
    );
}
