//! roam's install (`deploy/`) against the lab's real kube-apiserver, and what the
//! controller's probes say: the whole kustomization passes a server-side dry run; the lab
//! runs roam as `e2e/lab up` installed it (two replicas on two nodes, one leading, both
//! ready, as the Deployment's unprivileged user, nothing of it on the host); a standby
//! replica answers its probes before it leads; a replica pointed at a database that is not
//! OVN's northbound is not ready and says why, in `/readyz` and in its log; the NB and SB
//! take the node network only over TLS with a certificate of their CA, and a chassis's
//! certificate cannot change another node's chassis.

use std::path::Path;
use std::time::Duration;

use serde_json::json;

use roam_e2e::{
    ControllerProcess, Installed, Lab, apply_crds, holder_pid, kubectl, try_kubectl,
    wait_until_else,
};

const LONG: Duration = Duration::from_secs(60);

fn deploy_dir() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy")
        .to_str()
        .expect("utf-8 path")
        .to_string()
}

#[test]
fn the_kustomization_passes_a_server_side_dry_run() {
    let lab = Lab::get();
    // a dry run creates nothing, so the objects in roam-system need the namespace to exist
    if try_kubectl(&lab, &["get", "namespace", "roam-system"]).is_err() {
        kubectl(&lab, &["create", "namespace", "roam-system"]);
    }
    let out = kubectl(
        &lab,
        &[
            "apply",
            "--dry-run=server",
            "-k",
            &deploy_dir(),
            "-o",
            "name",
        ],
    );
    let kinds: Vec<&str> = out.lines().collect();
    for want in [
        "customresourcedefinition.apiextensions.k8s.io/networks.roam.dev",
        "customresourcedefinition.apiextensions.k8s.io/virtualmachinemigrations.roam.dev",
        "clusterrole.rbac.authorization.k8s.io/roam-controller",
        "deployment.apps/roam-controller",
        "service/roam-controller-metrics",
        "daemonset.apps/roam-cni",
    ] {
        assert!(
            kinds.contains(&want),
            "the dry run did not include {want}:\n{out}"
        );
    }
    assert!(
        kinds
            .iter()
            .any(|k| k.starts_with("configmap/roam-controller-config-")),
        "no generated configuration in\n{out}"
    );
}

#[test]
fn the_lab_runs_roam_installed_from_deploy() {
    let lab = Lab::get();
    let roam = Installed::get(&lab);
    let pods = roam.pods();
    assert_eq!(pods.len(), 2, "two replicas: {pods:?}\n{}", roam.describe());
    assert_ne!(
        pods[0].1, pods[1].1,
        "on two nodes (host network, one port)"
    );
    let leader = roam.leader().expect("a leader");
    for (pod, node) in &pods {
        let role = if *pod == leader {
            "role: leader"
        } else {
            "role: standby"
        };
        let body = wait_until_else(
            LONG,
            &format!("{pod}'s /readyz to say {role}"),
            || {
                roam.http(pod, "/readyz")
                    .filter(|(c, b)| *c == 200 && b.contains(role))
                    .map(|(_, b)| b)
            },
            || format!("{:?}\n{}", roam.http(pod, "/readyz"), roam.describe()),
        );
        assert!(body.contains("ovn-nb: ok"), "{body}");
        // the container runs on its node, as the Deployment's user, not on the host
        let pid = roam.pid(pod).expect("its process");
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        let uid = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
        assert!(
            uid.split_whitespace().skip(1).all(|u| u == "65532"),
            "{pod} runs as 65532: {uid}"
        );
        let net = |p: &str| std::fs::read_link(format!("/proc/{p}/ns/net")).ok();
        assert_eq!(
            net(&pid.to_string()),
            net(&holder_pid(&lab, node)),
            "{pod} runs in {node}'s network namespace"
        );
    }
}

/// `/readyz` of `ctl` once it has the wanted status code.
fn readyz(ctl: &ControllerProcess, code: u16) -> String {
    wait_until_else(
        LONG,
        &format!("/readyz answering {code}"),
        || match ctl.get("/readyz") {
            // once the first checks ran (they run at start-up, then every 10 s)
            Some((c, body)) if c == code && !body.contains("not run yet") => Some(body),
            _ => None,
        },
        || {
            format!(
                "last answer: {:?}\n{}",
                ctl.get("/readyz"),
                ctl.log_tail(30)
            )
        },
    )
}

#[test]
fn a_standby_answers_its_probes_and_a_wrong_nb_is_named() {
    let lab = Lab::get();
    apply_crds(&lab);
    let lease = format!("readyz-{}", std::process::id());
    // selectors nobody matches: these controllers must not act on other tests' objects
    let common = [
        "--leader-elect",
        "true",
        "--lease-namespace",
        "default",
        "--lease-name",
        lease.as_str(),
        "--network-selector",
        "roam.dev/test=readyz-none",
        "--pod-namespace",
        "readyz-none",
    ];
    let leader = ControllerProcess::start(&lab, "readyz-leader", 18040, &common);
    let body = readyz(&leader, 200);
    assert!(
        body.contains("kubernetes: ok") && body.contains("ovn-nb: ok"),
        "{body}"
    );
    wait_until_else(
        LONG,
        "the first controller to lead",
        || {
            leader
                .get("/readyz")
                .filter(|(_, b)| b.contains("role: leader"))
        },
        || leader.log_tail(30),
    );

    // the southbound database answers OVSDB, but it is not the northbound
    let mut args = common.to_vec();
    let sb = lab.var("ROAM_OVN_SB_SSL").to_string();
    args.extend(["--nb", sb.as_str()]);
    let standby = ControllerProcess::start(&lab, "readyz-standby", 18041, &args);
    let body = readyz(&standby, 503);
    assert!(body.contains("role: standby"), "{body}");
    assert!(
        body.contains("serves [\"OVN_Southbound\"], not OVN_Northbound"),
        "{body}"
    );
    assert!(body.contains("kubernetes: ok"), "{body}");
    assert_eq!(
        standby.get("/healthz").map(|(c, _)| c),
        Some(200),
        "a standby must pass its liveness probe"
    );
    let log = standby.log_text();
    assert!(
        log.contains("not ready") && log.contains("not OVN_Northbound"),
        "the log must say what is wrong:\n{log}"
    );

    // nothing listening at all
    let mut args = common.to_vec();
    args.extend(["--nb", "tcp:127.0.0.1:1"]);
    let nowhere = ControllerProcess::start(&lab, "readyz-nowhere", 18042, &args);
    let body = readyz(&nowhere, 503);
    assert!(
        body.contains("cannot connect to the OVN northbound database at tcp:127.0.0.1:1"),
        "{body}"
    );
    drop((leader, standby, nowhere));
    let _ = try_kubectl(
        &lab,
        &[
            "-n",
            "default",
            "delete",
            "lease",
            &lease,
            "--ignore-not-found",
        ],
    );
}

/// The lab's NB and SB take the nodes' network only over TLS with a client certificate of
/// their CA: roam-controller's certificate (the one the installation mounts) reads both;
/// plain TCP, and a certificate the CA did not sign, get nothing. On the SB a chassis's
/// certificate may change its own Chassis row but not another node's (OVN's RBAC).
#[test]
fn ovn_takes_the_node_network_only_over_tls() {
    let lab = Lab::get();
    let nb = lab.var("ROAM_OVN_NB_SSL").to_string();
    let sb = lab.var("ROAM_OVN_SB_SSL").to_string();
    assert!(nb.starts_with("ssl:10.213.0.1:"), "{nb}");
    assert!(sb.starts_with("ssl:10.213.0.1:"), "{sb}");
    let pki = Path::new(lab.var("ROAM_OVN_PKI")).to_path_buf();
    let tmp = lab.dir().join("tls-stranger");
    std::fs::create_dir_all(&tmp).unwrap();
    // a self-signed client certificate: no CA of the NB's signed it
    let out = std::process::Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=stranger",
            "-keyout",
        ])
        .arg(tmp.join("stranger.key"))
        .arg("-out")
        .arg(tmp.join("stranger.pem"))
        .output()
        .expect("run openssl");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let options = |cert: &Path, key: &Path| roam_ovsdb::ClientOptions {
        request_timeout: Duration::from_secs(10),
        tls: Some(
            roam_ovsdb::TlsSettings::from_pem_files(&roam_ovsdb::TlsFiles {
                ca: pki.join("ca.pem"),
                cert: cert.into(),
                key: key.into(),
            })
            .expect("usable PEM files"),
        ),
        ..Default::default()
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        for (endpoint, db) in [(&nb, "OVN_Northbound"), (&sb, "OVN_Southbound")] {
            let roam = roam_ovsdb::Client::connect_with(
                endpoint,
                options(
                    &pki.join("roam-controller.pem"),
                    &pki.join("roam-controller.key"),
                ),
            )
            .await
            .expect("roam-controller's certificate connects");
            let dbs = roam.list_dbs().await.expect("list_dbs over TLS");
            assert!(dbs.iter().any(|d| d == db), "{endpoint}: {dbs:?}");

            let stranger = async {
                let c = roam_ovsdb::Client::connect_with(
                    endpoint,
                    options(&tmp.join("stranger.pem"), &tmp.join("stranger.key")),
                )
                .await?;
                c.list_dbs().await
            };
            let e = stranger
                .await
                .expect_err("a certificate no CA of the database's signed");
            eprintln!("{endpoint}: stranger refused: {e}");

            let plain = roam_ovsdb::Client::connect_with(
                &endpoint.replacen("ssl:", "tcp:", 1),
                roam_ovsdb::ClientOptions {
                    request_timeout: Duration::from_secs(10),
                    ..Default::default()
                },
            )
            .await
            .expect("the port takes a TCP connection");
            assert!(
                plain.list_dbs().await.is_err(),
                "{endpoint}: plain TCP gets no answer"
            );
        }

        // node-a's chassis certificate, as node-a's ovn-controller holds it
        let a_pki = lab.dir().join("node-a/ovs/pki");
        let chassis_a = roam_ovsdb::Client::connect_with(
            &sb,
            options(&a_pki.join("chassis.pem"), &a_pki.join("chassis.key")),
        )
        .await
        .expect("node-a's chassis certificate connects");
        let mark = |chassis: &str, value: &str| {
            vec![json!({"op": "mutate", "table": "Chassis",
                        "where": [["name", "==", chassis]],
                        "mutations": [["external_ids", "insert",
                                       ["map", [["roam-rbac-test", value]]]]]})]
        };
        let unmark = |chassis: &str| {
            vec![json!({"op": "mutate", "table": "Chassis",
                        "where": [["name", "==", chassis]],
                        "mutations": [["external_ids", "delete",
                                       ["set", ["roam-rbac-test"]]]]})]
        };
        let own = chassis_a
            .transact("OVN_Southbound", mark("node-a", "own"))
            .await
            .expect("a chassis may change its own row");
        assert_eq!(own[0]["count"], 1, "{own:?}");
        chassis_a
            .transact("OVN_Southbound", unmark("node-a"))
            .await
            .expect("and change it back");
        let e = chassis_a
            .transact("OVN_Southbound", mark("node-b", "posing"))
            .await
            .expect_err("node-a's certificate must not change node-b's chassis");
        assert!(e.to_string().contains("RBAC"), "{e}");
        eprintln!("node-a posing as node-b refused: {e}");
    });
    let _ = std::fs::remove_dir_all(&tmp);
}
