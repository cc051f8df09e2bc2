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
        "clusterrole.rbac.authorization.k8s.io/roam-metrics-reader",
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

/// The installed controller's `/metrics` (on the host network, so on every node's address)
/// goes only to a token the API server says may get it: none is 401, a ServiceAccount
/// without the ClusterRole `roam-metrics-reader` 403, one bound to it gets the figures. The
/// probes stay open (the kubelet sends no token).
#[test]
fn metrics_go_only_to_a_token_allowed_to_read_them() {
    let lab = Lab::get();
    let roam = Installed::get(&lab);
    let pod = roam.leader().expect("a leader");
    let ns = "roam-system";
    let manifest = json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": "p14-scraper", "namespace": ns}},
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": "p14-nobody", "namespace": ns}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "p14-scraper"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": "roam-metrics-reader"},
         "subjects": [{"kind": "ServiceAccount", "name": "p14-scraper", "namespace": ns}]},
    ]});
    roam_e2e::kubectl_manifest(&lab, "apply", &manifest).expect("the scrapers");
    let scraper = roam_e2e::service_account_token(&lab, ns, "p14-scraper");
    let nobody = roam_e2e::service_account_token(&lab, ns, "p14-nobody");
    let get = |token: Option<&str>| {
        roam.http_as(&pod, "/metrics", token)
            .expect("an answer from the metrics port")
    };
    let (code, body) = get(None);
    assert_eq!(code, 401, "{body}");
    assert!(body.contains("roam-metrics-reader"), "{body}");
    let (code, body) = get(Some("not-a-token"));
    assert_eq!(code, 401, "{body}");
    let (code, body) = get(Some(&nobody));
    assert_eq!(code, 403, "{body}");
    // (RBAC takes a moment to see a new binding; a refusal is believed for 10 s)
    let body = wait_until_else(
        LONG,
        "the scraper's token allowed",
        || {
            let (code, body) = get(Some(&scraper));
            (code == 200).then_some(body)
        },
        || format!("{:?}", get(Some(&scraper))),
    );
    assert!(
        body.contains("roam_events_total") || body.contains("roam_addresses"),
        "{body}"
    );
    assert_eq!(roam.http(&pod, "/healthz").map(|(c, _)| c), Some(200));
    for name in ["p14-scraper", "p14-nobody"] {
        let _ = try_kubectl(&lab, &["-n", ns, "delete", "serviceaccount", name]);
    }
    let _ = try_kubectl(&lab, &["delete", "clusterrolebinding", "p14-scraper"]);
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

/// A CertificateSigningRequest for signer roam.dev/node asking for `CN=cn`, filed with
/// `kubeconfig` (a node's credential, or the admin's); its name.
fn file_node_csr(lab: &Lab, kubeconfig: &Path, prefix: &str, cn: &str) -> String {
    let key = roam_pki::new_key().unwrap();
    let request = roam_pki::node_request(&key, cn).unwrap();
    let b64 = {
        let out = std::process::Command::new("base64")
            .arg("-w0")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .and_then(|mut c| {
                use std::io::Write;
                c.stdin.take().unwrap().write_all(request.as_bytes())?;
                c.wait_with_output()
            })
            .expect("base64");
        String::from_utf8(out.stdout).unwrap()
    };
    let name = format!("{prefix}-{}", std::process::id());
    let manifest = json!({"apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
        "metadata": {"name": name},
        "spec": {"request": b64, "signerName": "roam.dev/node",
                 "usages": ["digital signature", "key encipherment", "server auth", "client auth"]}});
    let file = lab.dir().join(format!("{name}.json"));
    std::fs::write(&file, manifest.to_string()).unwrap();
    let out = std::process::Command::new(lab.kubectl())
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .arg("create")
        .arg("-f")
        .arg(&file)
        .output()
        .expect("run kubectl");
    let _ = std::fs::remove_file(&file);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    name
}

/// The (type, reason, message) of a CSR's first Denied or Failed condition, once it has one.
fn refused_csr(lab: &Lab, name: &str) -> (String, String, String) {
    wait_until_else(
        LONG,
        &format!("the signer answers {name}"),
        || {
            let v: serde_json::Value =
                serde_json::from_str(&try_kubectl(lab, &["get", "csr", name, "-o", "json"]).ok()?)
                    .ok()?;
            assert!(
                v["status"]["certificate"].is_null(),
                "{name} must get no certificate: {v}"
            );
            v["status"]["conditions"]
                .as_array()?
                .iter()
                .find(|c| c["type"] == "Denied" || c["type"] == "Failed")
                .map(|c| {
                    let s = |k: &str| c[k].as_str().unwrap_or_default().to_string();
                    (s("type"), s("reason"), s("message"))
                })
        },
        || try_kubectl(lab, &["get", "csr", name, "-o", "yaml"]).unwrap_or_else(|e| e),
    )
}

/// Every node has a roam CA certificate naming it (and its address), for a key that stayed
/// on the node, asked for by roam-node (unprivileged: no capability, no ServiceAccount
/// token) with the node's credential; a node asking for another node's name, or anyone
/// who is not a node, is Denied; a node whose certificate is gone gets a new one for the
/// same key.
#[test]
fn every_node_has_a_roam_certificate_for_itself_only() {
    let lab = Lab::get();
    let ca = kubectl(
        &lab,
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
    assert!(roam_pki::cert_info(&ca).unwrap().is_ca, "{ca}");
    let secret = kubectl(
        &lab,
        &[
            "-n",
            "roam-system",
            "get",
            "secret",
            "roam-ca",
            "-o",
            "jsonpath={.data.ca\\.crt}",
        ],
    );
    assert!(!secret.is_empty(), "the CA's Secret holds its certificate");
    let pki = |node: &str, file: &str| lab.node_path(node, &format!("/var/lib/roam/pki/{file}"));
    let read = |node: &str, file: &str| std::fs::read_to_string(pki(node, file)).ok();
    for node in lab.nodes() {
        let cert = wait_until_else(
            LONG,
            &format!("{node}'s certificate"),
            || read(&node, "node.crt"),
            || {
                kubectl(
                    &lab,
                    &["-n", "roam-system", "logs", "ds/roam-node", "--tail=20"],
                )
            },
        );
        let key = read(&node, "node.key").expect("the node's key");
        let info = roam_pki::cert_info(&cert).unwrap();
        assert_eq!(info.common_name.as_deref(), Some(node.as_str()));
        assert_eq!(info.dns_names, std::slice::from_ref(&node));
        let ip: std::net::IpAddr = lab.node(&node).ip.parse().unwrap();
        assert!(info.ips.contains(&ip), "{node}: {:?}", info.ips);
        assert!(roam_pki::signed_by(&cert, &ca), "{node}: not the roam CA's");
        assert!(roam_pki::key_matches(&cert, &key));
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(pki(&node, "node.key"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(
            mode & 0o077,
            0,
            "{node}: the key is the owner's only ({mode:o})"
        );
    }
    // roam-node as installed: no privilege, no capability, no ServiceAccount token
    let ds: serde_json::Value = serde_json::from_str(&kubectl(
        &lab,
        &["-n", "roam-system", "get", "ds", "roam-node", "-o", "json"],
    ))
    .unwrap();
    let spec = &ds["spec"]["template"]["spec"];
    assert_eq!(spec["automountServiceAccountToken"], false);
    let sc = &spec["containers"][0]["securityContext"];
    assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]), "{sc}");
    assert_eq!(sc["allowPrivilegeEscalation"], false, "{sc}");
    assert!(
        sc["privileged"].is_null() || sc["privileged"] == false,
        "{sc}"
    );

    // node-a's own credential asking for node-b's name
    let node_a = lab.dir().join("kube/node-a.kubeconfig");
    let posing = file_node_csr(&lab, &node_a, "roam-test-posing", "node-b");
    let (kind, reason, message) = refused_csr(&lab, &posing);
    assert_eq!(
        (kind.as_str(), reason.as_str()),
        ("Denied", "NotItsOwnName"),
        "{message}"
    );
    assert!(
        message.contains("node node-a asked for [CN=node-b]"),
        "{message}"
    );
    // someone who is not a node (the admin)
    let admin = std::path::PathBuf::from(lab.kubeconfig());
    let stranger = file_node_csr(&lab, &admin, "roam-test-stranger", "node-a");
    let (kind, reason, _) = refused_csr(&lab, &stranger);
    assert_eq!((kind.as_str(), reason.as_str()), ("Denied", "NotANode"));
    for csr in [&posing, &stranger] {
        let _ = try_kubectl(&lab, &["delete", "csr", csr]);
    }

    // renewal: node-a's certificate gone, a new one for the same key
    let before = read("node-a", "node.crt").unwrap();
    let key = read("node-a", "node.key").unwrap();
    std::fs::remove_file(pki("node-a", "node.crt")).unwrap();
    let after = wait_until_else(
        Duration::from_secs(120),
        "node-a's certificate renewed",
        || read("node-a", "node.crt"),
        || {
            kubectl(
                &lab,
                &["-n", "roam-system", "logs", "ds/roam-node", "--tail=20"],
            )
        },
    );
    assert_ne!(after, before, "a new certificate (a new serial)");
    assert!(
        roam_pki::key_matches(&after, &key),
        "for the key the node kept"
    );
    assert!(roam_pki::signed_by(&after, &ca));
}

/// `kubectl auth can-i --list` as `who` (and `groups`) in `namespace`: the resource rules, as
/// `resource [names] [verbs]` lines, sorted; the review APIs every user has left out, and the
/// lab's Pod Security policies (e2e/labkit/pod-security.yaml: not deploy/'s, and checked by
/// lab_pod_security.rs).
fn permissions(lab: &Lab, namespace: &str, who: &str, groups: &[&str]) -> Vec<String> {
    let mut args = vec![
        "auth".to_string(),
        "can-i".into(),
        "--list".into(),
        "-n".into(),
        namespace.into(),
        format!("--as={who}"),
    ];
    args.extend(groups.iter().map(|g| format!("--as-group={g}")));
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = kubectl(lab, &refs);
    let mut rows: Vec<String> = out
        .lines()
        .skip(1)
        .filter(|l| !l.starts_with(' '))
        .filter_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            let resource = *cols.first()?;
            if resource.starts_with("selfsubject") || resource == "podsecuritypolicies.policy" {
                return None;
            }
            // Resources, Non-Resource URLs ([]), Resource Names, Verbs
            let rest = cols[1..].join(" ");
            let rest = rest.strip_prefix("[] ").unwrap_or(&rest);
            Some(format!("{resource} {rest}"))
        })
        .collect();
    rows.sort();
    rows
}

fn sorted(rows: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = rows.iter().map(|s| s.to_string()).collect();
    v.sort();
    v
}

/// roam-controller's ServiceAccount and roam-node (which calls the API server as its node)
/// may do exactly what deploy/ grants, each rule there commented with why: no Secret outside
/// roam-system for the controller, no Secret at all for the nodes.
#[test]
fn roam_has_exactly_the_permissions_it_needs() {
    let lab = Lab::get();
    let controller = "system:serviceaccount:roam-system:roam-controller";
    let everywhere = [
        "signers.certificates.k8s.io [roam.dev/node] [approve sign]",
        "events.events.k8s.io [] [create patch]",
        "virtualmachinemigrations.roam.dev [] [get list watch create patch delete]",
        "addresses.roam.dev [] [get list watch create update delete]",
        "pods [] [get list watch patch create delete]",
        "virtualmachines.roam.dev [] [get list watch patch]",
        "nodes [] [get list watch]",
        "persistentvolumeclaims [] [get]",
        "persistentvolumes [] [get]",
        "certificatesigningrequests.certificates.k8s.io [] [get list watch]",
        "networks.roam.dev [] [list watch]",
        "namespaces [] [list]",
        "certificatesigningrequests.certificates.k8s.io/approval [] [patch]",
        "certificatesigningrequests.certificates.k8s.io/status [] [patch]",
        "virtualmachinemigrations.roam.dev/status [] [patch]",
        "virtualmachines.roam.dev/status [] [patch]",
        "networks.roam.dev/status [] [update patch]",
        "tokenreviews.authentication.k8s.io [] [create]",
        "subjectaccessreviews.authorization.k8s.io [] [create]",
    ];
    // a tenant's namespace: nothing of Secrets or ConfigMaps
    assert_eq!(
        permissions(&lab, "default", controller, &[]),
        sorted(&everywhere),
        "roam-controller in a tenant's namespace"
    );
    let mut own = everywhere.to_vec();
    own.extend([
        "secrets [] [get create delete]",
        "configmaps [] [get create patch]",
        "leases.coordination.k8s.io [] [get create update]",
    ]);
    assert_eq!(
        permissions(&lab, "roam-system", controller, &[]),
        sorted(&own),
        "roam-controller in roam-system"
    );
    // roam-node, as node-a: its certificate request and the CA's ConfigMap, nothing more
    // than RBAC's defaults for every node (the Node authorizer's own grants are not listed)
    let node = |ns: &str| permissions(&lab, ns, "system:node:node-a", &["system:nodes"]);
    let node_rules = ["certificatesigningrequests.certificates.k8s.io [] [create get]"];
    assert_eq!(
        node("default"),
        sorted(&node_rules),
        "a node in a tenant's namespace"
    );
    let mut in_system = node_rules.to_vec();
    in_system.push("configmaps [roam-ca] [get]");
    assert_eq!(
        node("roam-system"),
        sorted(&in_system),
        "a node in roam-system"
    );
    for (who, groups) in [
        (controller, &[][..]),
        ("system:node:node-a", &["system:nodes"][..]),
    ] {
        for ns in ["default", "kube-system"] {
            let mut args = vec![
                "auth".to_string(),
                "can-i".into(),
                "get".into(),
                "secrets".into(),
                "-n".into(),
                ns.into(),
                format!("--as={who}"),
            ];
            args.extend(groups.iter().map(|g| format!("--as-group={g}")));
            // `can-i` says "no" on stdout (for a node with the Node authorizer's reason
            // after it: "no - No Object name found") and exits 1
            let out = std::process::Command::new(lab.kubectl())
                .args(["--kubeconfig", lab.kubeconfig()])
                .args(&args)
                .output()
                .expect("run kubectl");
            let answer = String::from_utf8_lossy(&out.stdout);
            assert!(
                !out.status.success() && answer.split_whitespace().next() == Some("no"),
                "{who} get secrets in {ns}: {answer} {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}
