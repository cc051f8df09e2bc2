//! Unit tests of the pure core: every input error with its CNI code, the plan, the result
//! shapes per version, and CHECK's comparison.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::Path;

use roam_contract::annotation::{Mode, PodAddress};
use serde_json::{Value, json};

use crate::check::{Observed, ObservedAddr, ObservedLink, ObservedPort, ObservedRoute, compare};
use crate::config::{AttachmentKey, Command, parse_conf, parse_env};
use crate::plan::{host_ifname, host_stem, ids, plan};
use crate::result::{build, parse_prev, render};
use crate::{Error, code, error_json, version};

fn env_of(pairs: &[(&str, &str)]) -> Result<crate::config::CniEnv, Error> {
    let map: BTreeMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    parse_env(|k| map.get(k).cloned())
}

const FULL: &[(&str, &str)] = &[
    ("CNI_COMMAND", "ADD"),
    ("CNI_CONTAINERID", "abc123"),
    ("CNI_NETNS", "/run/netns/x"),
    ("CNI_IFNAME", "eth0"),
    (
        "CNI_ARGS",
        "IgnoreUnknown=1;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p",
    ),
    ("CNI_PATH", "/opt/cni/bin"),
];

fn with(overrides: &[(&'static str, Option<&'static str>)]) -> Vec<(&'static str, &'static str)> {
    let mut v: Vec<(&str, &str)> = FULL.to_vec();
    for (k, val) in overrides {
        v.retain(|(kk, _)| kk != k);
        if let Some(val) = val {
            v.push((k, val));
        }
    }
    v
}

fn env_err(overrides: &[(&'static str, Option<&'static str>)]) -> Error {
    env_of(&with(overrides)).unwrap_err()
}

#[test]
fn a_runtimes_full_environment_parses() {
    let env = env_of(FULL).unwrap();
    assert_eq!(env.command, Command::Add);
    assert_eq!(
        env.key(),
        &AttachmentKey {
            container_id: "abc123".into(),
            ifname: "eth0".into()
        }
    );
    assert_eq!(env.pod().unwrap(), ("ns".into(), "p".into()));
    assert_eq!(env.netns.as_deref(), Some(Path::new("/run/netns/x")));
}

#[test]
fn environment_errors_are_code_4_and_name_the_variable() {
    type Overrides = Vec<(&'static str, Option<&'static str>)>;
    let cases: Vec<(Overrides, &str)> = vec![
        (vec![("CNI_COMMAND", None)], "CNI_COMMAND is not set"),
        (vec![("CNI_COMMAND", Some("ATTACH"))], "\"ATTACH\""),
        (
            vec![("CNI_CONTAINERID", None)],
            "CNI_CONTAINERID is not set",
        ),
        (
            vec![("CNI_CONTAINERID", Some("-bad"))],
            "CNI_CONTAINERID \"-bad\" is invalid",
        ),
        (vec![("CNI_CONTAINERID", Some("a/b"))], "is invalid"),
        (vec![("CNI_IFNAME", None)], "CNI_IFNAME is not set"),
        (
            vec![("CNI_IFNAME", Some("a-name-far-too-long"))],
            "not a valid interface name",
        ),
        (
            vec![("CNI_IFNAME", Some("et:h0"))],
            "not a valid interface name",
        ),
        (vec![("CNI_NETNS", None)], "CNI_NETNS is not set"),
        (vec![("CNI_NETNS", Some(""))], "CNI_NETNS is not set"),
        (vec![("CNI_ARGS", Some("K8S_POD_NAME"))], "is not KEY=VALUE"),
    ];
    for (o, text) in cases {
        let e = env_err(&o);
        assert_eq!(e.code(), code::INVALID_ENV, "{o:?}: {e}");
        assert!(e.to_string().contains(text), "{o:?}: {e}");
        assert!(!e.details().is_empty());
    }
    // the pod's name and namespace are only needed by ADD, and checked there
    let env = env_of(&with(&[("CNI_ARGS", Some("K8S_POD_NAMESPACE=ns"))])).unwrap();
    let e = env.pod().unwrap_err();
    assert_eq!(e.code(), code::INVALID_ENV);
    assert!(e.to_string().contains("no K8S_POD_NAME"), "{e}");
    let env = env_of(&with(&[("CNI_ARGS", None)])).unwrap();
    assert!(
        env.pod()
            .unwrap_err()
            .to_string()
            .contains("K8S_POD_NAMESPACE")
    );
}

#[test]
fn del_needs_only_the_container_and_the_ifname() {
    let env = env_of(&[
        ("CNI_COMMAND", "DEL"),
        ("CNI_CONTAINERID", "abc"),
        ("CNI_IFNAME", "eth0"),
    ])
    .unwrap();
    assert_eq!(env.command, Command::Del);
    assert!(env.netns.is_none());
    for cmd in ["VERSION", "STATUS", "GC"] {
        let env = env_of(&[("CNI_COMMAND", cmd)]).unwrap();
        assert!(env.key.is_none(), "{cmd}");
    }
    let e = env_of(&[
        ("CNI_COMMAND", "CHECK"),
        ("CNI_CONTAINERID", "a"),
        ("CNI_IFNAME", "eth0"),
    ])
    .unwrap_err();
    assert!(e.to_string().contains("CNI_NETNS"), "{e}");
}

fn conf(v: Value) -> String {
    let mut base = json!({
        "cniVersion": "1.1.0", "name": "roam", "type": "roam-cni",
        "kubeconfig": "/etc/cni/net.d/roam-cni.kubeconfig",
    });
    for (k, val) in v.as_object().unwrap() {
        if val.is_null() {
            base.as_object_mut().unwrap().remove(k);
        } else {
            base[k] = val.clone();
        }
    }
    base.to_string()
}

fn conf_err(command: Command, v: Value) -> Error {
    parse_conf(command, conf(v).as_bytes()).unwrap_err()
}

#[test]
fn a_full_config_parses_with_defaults() {
    let c = parse_conf(Command::Add, conf(json!({})).as_bytes()).unwrap();
    assert_eq!(c.ovs_db, "unix:/run/openvswitch/db.sock");
    assert_eq!(c.bridge, "br-int");
    assert_eq!(c.annotation_timeout.as_secs(), 30);
    let c = parse_conf(
        Command::Add,
        conf(json!({"annotationTimeoutSeconds": 2.5, "ovsDb": "tcp:127.0.0.1:6640", "bridge": "br-x"}))
            .as_bytes(),
    )
    .unwrap();
    assert_eq!(c.annotation_timeout.as_millis(), 2500);
    assert_eq!(
        (c.ovs_db.as_str(), c.bridge.as_str()),
        ("tcp:127.0.0.1:6640", "br-x")
    );
    // DEL, STATUS: no kubeconfig needed
    parse_conf(Command::Del, conf(json!({"kubeconfig": null})).as_bytes()).unwrap();
    parse_conf(
        Command::Status,
        conf(json!({"kubeconfig": null})).as_bytes(),
    )
    .unwrap();
    let c = parse_conf(
        Command::Gc,
        conf(json!({"cni.dev/valid-attachments": [{"containerID": "a", "ifname": "eth0"}]}))
            .as_bytes(),
    )
    .unwrap();
    assert_eq!(c.valid_attachments.unwrap().len(), 1);
}

#[test]
fn config_errors_carry_the_specs_codes() {
    let e = parse_conf(Command::Add, b"{not json").unwrap_err();
    assert_eq!(e.code(), code::DECODE, "{e}");
    let e = parse_conf(Command::Add, b"").unwrap_err();
    assert_eq!(e.code(), code::DECODE, "{e}");
    let e = parse_conf(Command::Add, b"[1]").unwrap_err();
    assert_eq!(e.code(), code::INVALID_CONFIG, "{e}");

    for (cmd, v, c, text) in [
        (
            Command::Add,
            json!({"cniVersion": "9.9.9"}),
            code::INCOMPATIBLE_VERSION,
            "\"9.9.9\" is not supported",
        ),
        (
            Command::Add,
            json!({"cniVersion": "0.2.0"}),
            code::INCOMPATIBLE_VERSION,
            "not supported",
        ),
        (
            Command::Check,
            json!({"cniVersion": "0.3.1", "prevResult": {}}),
            code::INCOMPATIBLE_VERSION,
            "for CHECK",
        ),
        (
            Command::Status,
            json!({"cniVersion": "1.0.0"}),
            code::INCOMPATIBLE_VERSION,
            "for STATUS",
        ),
        (
            Command::Gc,
            json!({"cniVersion": "1.0.0"}),
            code::INCOMPATIBLE_VERSION,
            "for GC",
        ),
        (
            Command::Add,
            json!({"cniVersion": null}),
            code::INVALID_CONFIG,
            "cniVersion",
        ),
        (
            Command::Add,
            json!({"cniVersion": 1}),
            code::INVALID_CONFIG,
            "must be a string",
        ),
        (
            Command::Add,
            json!({"name": null}),
            code::INVALID_CONFIG,
            "name",
        ),
        (
            Command::Add,
            json!({"name": ""}),
            code::INVALID_CONFIG,
            "must not be empty",
        ),
        (
            Command::Add,
            json!({"type": "bridge"}),
            code::INVALID_CONFIG,
            "expected \"roam-cni\"",
        ),
        (
            Command::Add,
            json!({"type": null}),
            code::INVALID_CONFIG,
            "type",
        ),
        (
            Command::Add,
            json!({"kubeconfig": null}),
            code::INVALID_CONFIG,
            "kubeconfig",
        ),
        (
            Command::Add,
            json!({"ovsDb": "/run/openvswitch/db.sock"}),
            code::INVALID_CONFIG,
            "unix:PATH",
        ),
        (
            Command::Add,
            json!({"bridge": ""}),
            code::INVALID_CONFIG,
            "bridge",
        ),
        (
            Command::Add,
            json!({"annotationTimeoutSeconds": 0}),
            code::INVALID_CONFIG,
            "annotationTimeoutSeconds",
        ),
        (
            Command::Add,
            json!({"annotationTimeoutSeconds": -1}),
            code::INVALID_CONFIG,
            "annotationTimeoutSeconds",
        ),
        (
            Command::Add,
            json!({"annotationTimeoutSeconds": "30"}),
            code::INVALID_CONFIG,
            "annotationTimeoutSeconds",
        ),
        (
            Command::Add,
            json!({"annotationTimeoutSeconds": 7200}),
            code::INVALID_CONFIG,
            "annotationTimeoutSeconds",
        ),
        (
            Command::Del,
            json!({"prevResult": "x"}),
            code::INVALID_CONFIG,
            "prevResult",
        ),
        (
            Command::Check,
            json!({}),
            code::INVALID_CONFIG,
            "prevResult",
        ),
        (
            Command::Gc,
            json!({}),
            code::INVALID_CONFIG,
            "valid-attachments",
        ),
        (
            Command::Gc,
            json!({"cni.dev/valid-attachments": {}}),
            code::INVALID_CONFIG,
            "array",
        ),
        (
            Command::Gc,
            json!({"cni.dev/valid-attachments": [{"containerID": "a"}]}),
            code::INVALID_CONFIG,
            "valid-attachments[0]",
        ),
    ] {
        let e = conf_err(cmd, v.clone());
        assert_eq!(e.code(), c, "{cmd:?} {v}: {e}");
        assert!(e.to_string().contains(text), "{cmd:?} {v}: {e}");
        assert!(!e.details().is_empty());
    }
}

#[test]
fn every_error_has_its_code() {
    use roam_contract::annotation::AnnotationError;
    let io = || std::io::Error::from(std::io::ErrorKind::NotFound);
    let cases: Vec<(Error, u32)> = vec![
        (Error::Stdin(io()), code::IO_FAILURE),
        (
            Error::NetnsGone {
                path: "/x".into(),
                source: io(),
            },
            code::UNKNOWN_CONTAINER,
        ),
        (
            Error::AnnotationTimeout {
                namespace: "n".into(),
                pod: "p".into(),
                annotation: "a",
                waited_secs: 1,
            },
            code::TRY_AGAIN_LATER,
        ),
        (
            Error::OvsdbUnreachable {
                endpoint: "e".into(),
                reason: "r".into(),
            },
            code::TRY_AGAIN_LATER,
        ),
        (
            Error::BadAnnotation {
                namespace: "n".into(),
                pod: "p".into(),
                source: Box::new(AnnotationError::DuplicateName("eth0".into())),
            },
            code::BAD_ANNOTATION,
        ),
        (Error::Kube("k".into()), code::KUBE_API),
        (
            Error::Refused {
                namespace: "n".into(),
                pod: "p".into(),
                reason: "no Network".into(),
            },
            code::REFUSED,
        ),
        (Error::KubeUnreachable("k".into()), code::TRY_AGAIN_LATER),
        (
            Error::CleanupIncomplete {
                context: "DEL".into(),
                errors: vec!["veth".into()],
            },
            code::CLEANUP_INCOMPLETE,
        ),
        (Error::Ovsdb("o".into()), code::OVSDB),
        (
            Error::Netlink {
                action: "a".into(),
                reason: "r".into(),
            },
            code::NETLINK,
        ),
        (
            Error::CheckFailed {
                drifts: vec!["d".into()],
            },
            code::CHECK_FAILED,
        ),
        (
            Error::NoSuchInterface {
                ifname: "eth0".into(),
                namespace: "n".into(),
                pod: "p".into(),
                listed: vec![],
            },
            code::NO_SUCH_INTERFACE,
        ),
        (
            Error::NotAvailable {
                reason: "kubeconfig".into(),
                degraded: false,
            },
            code::NOT_AVAILABLE,
        ),
        (
            Error::NotAvailable {
                reason: "ovs".into(),
                degraded: true,
            },
            code::NOT_AVAILABLE_DEGRADED,
        ),
        (
            Error::RolledBackBadly {
                primary: Box::new(Error::Netlink {
                    action: "a".into(),
                    reason: "r".into(),
                }),
                rollback: vec!["veth rm00 still there".into()],
            },
            code::NETLINK,
        ),
    ];
    for (e, c) in cases {
        assert_eq!(e.code(), c, "{e}");
        assert!(!e.details().is_empty(), "{e}");
        let j = error_json(&e, br#"{"cniVersion": "1.0.0"}"#);
        assert_eq!(j["cniVersion"], "1.0.0");
        assert_eq!(j["code"], c);
        assert_eq!(j["msg"], e.to_string());
        assert_eq!(j["details"], e.details());
    }
    // unusable stdin: the error is still well-formed JSON, in the latest version
    let j = error_json(&Error::Decode("x".into()), b"garbage");
    assert_eq!(j["cniVersion"], "1.1.0");
}

/// A pod whose Network does not admit its namespace (or the class it asks for): roam-cni
/// fails the ADD at once with the spec's error JSON, roam's code for a refusal, the
/// controller's reason as the message and what the admin can change as the details.
#[test]
fn a_refused_network_access_is_a_cni_error_saying_why() {
    let reason = "pod team-b/web, interface eth0: namespace team-b may not attach to network \
        net; a cluster admin adds team-b to the Network's spec.namespaces";
    let e = Error::Refused {
        namespace: "team-b".into(),
        pod: "web".into(),
        reason: reason.into(),
    };
    let j = error_json(
        &e,
        br#"{"cniVersion": "1.1.0", "name": "roam", "type": "roam-cni"}"#,
    );
    assert_eq!(j["cniVersion"], "1.1.0");
    assert_eq!(j["code"], code::REFUSED);
    assert!(
        (100..).contains(&code::REFUSED),
        "a plugin's own code, not one the spec reserves"
    );
    let msg = j["msg"].as_str().expect("msg");
    assert!(msg.contains("team-b/web") && msg.ends_with(reason), "{msg}");
    let details = j["details"].as_str().expect("details");
    for needle in ["namespaces", "namespaceSelector", "serviceClasses"] {
        assert!(details.contains(needle), "{needle}: {details}");
    }
    assert!(e.is_bad_input(), "not retried as a transient failure");
    assert_eq!(
        j.as_object().expect("an object").len(),
        4,
        "cniVersion, code, msg, details: {j}"
    );
}

/// Bad input is reported with a code that names what to fix; everything else with a code the
/// runtime retries on (or a STATUS or CHECK answer).
#[test]
fn bad_input_and_its_code_agree() {
    use roam_contract::annotation::AnnotationError;
    const BAD_INPUT_CODES: [u32; 9] = [
        code::INCOMPATIBLE_VERSION,
        code::UNKNOWN_CONTAINER,
        code::INVALID_ENV,
        code::DECODE,
        code::INVALID_CONFIG,
        code::BAD_ANNOTATION,
        code::KUBE_API,
        code::NO_SUCH_INTERFACE,
        code::REFUSED,
    ];
    let io = || std::io::Error::from(std::io::ErrorKind::NotFound);
    let s = || "x".to_string();
    let netlink = || Error::Netlink {
        action: s(),
        reason: s(),
    };
    let cases: Vec<(Error, bool)> = vec![
        (
            Error::IncompatibleVersion {
                version: "9.9.9".into(),
                for_command: None,
                supported: vec!["1.1.0"],
            },
            true,
        ),
        (
            Error::InvalidEnv {
                var: "CNI_NETNS",
                problem: s(),
            },
            true,
        ),
        (Error::Decode(s()), true),
        (
            Error::InvalidConfig {
                field: s(),
                problem: s(),
            },
            true,
        ),
        (
            Error::NetnsGone {
                path: "/x".into(),
                source: io(),
            },
            true,
        ),
        (
            Error::BadAnnotation {
                namespace: s(),
                pod: s(),
                source: Box::new(AnnotationError::DuplicateName("eth0".into())),
            },
            true,
        ),
        (
            Error::NoSuchInterface {
                ifname: s(),
                namespace: s(),
                pod: s(),
                listed: vec![],
            },
            true,
        ),
        (Error::Kube(s()), true),
        (
            Error::Refused {
                namespace: s(),
                pod: s(),
                reason: s(),
            },
            true,
        ),
        (Error::Stdin(io()), false),
        (
            Error::AnnotationTimeout {
                namespace: s(),
                pod: s(),
                annotation: "a",
                waited_secs: 1,
            },
            false,
        ),
        (Error::KubeUnreachable(s()), false),
        (
            Error::OvsdbUnreachable {
                endpoint: s(),
                reason: s(),
            },
            false,
        ),
        (Error::Ovsdb(s()), false),
        (netlink(), false),
        (
            Error::CleanupIncomplete {
                context: s(),
                errors: vec![],
            },
            false,
        ),
        (
            Error::NotAvailable {
                reason: s(),
                degraded: true,
            },
            false,
        ),
        (Error::CheckFailed { drifts: vec![] }, false),
        (
            Error::RolledBackBadly {
                primary: Box::new(netlink()),
                rollback: vec![],
            },
            false,
        ),
        (
            Error::RolledBackBadly {
                primary: Box::new(Error::NoSuchInterface {
                    ifname: s(),
                    namespace: s(),
                    pod: s(),
                    listed: vec![],
                }),
                rollback: vec![],
            },
            true,
        ),
    ];
    for (e, bad) in cases {
        assert_eq!(e.is_bad_input(), bad, "{e}");
        assert_eq!(
            BAD_INPUT_CODES.contains(&e.code()),
            bad,
            "{e}: code {}",
            e.code()
        );
    }
}

#[test]
fn version_answers_in_the_asked_version() {
    assert_eq!(
        version(br#"{"cniVersion": "0.4.0"}"#)["cniVersion"],
        "0.4.0"
    );
    assert_eq!(version(b"")["cniVersion"], "1.1.0");
    assert_eq!(
        version(br#"{"cniVersion": "7.0.0"}"#)["cniVersion"],
        "1.1.0"
    );
    let v = version(b"");
    assert_eq!(
        v["supportedVersions"],
        json!(["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"])
    );
}

fn overlay() -> PodAddress {
    PodAddress {
        name: "eth0".into(),
        network: "ovl".into(),
        mode: Mode::Overlay,
        address: "ovl-100-64-0-5".into(),
        port: "p5.node-a".into(),
        ip: Ipv4Addr::new(100, 64, 0, 5),
        prefix_len: 32,
        mac: "0A:58:64:40:00:05".into(),
        gateway: Ipv4Addr::new(100, 64, 0, 1),
        metric: 0,
        mtu: 1400,
        dhcp: false,
        vlan: None,
        service_class: None,
    }
}

fn underlay() -> PodAddress {
    PodAddress {
        name: "eth1".into(),
        mode: Mode::Underlay,
        port: "u1.node-a".into(),
        ip: Ipv4Addr::new(192, 0, 2, 10),
        prefix_len: 24,
        mac: "0a:58:c0:00:02:0a".into(),
        gateway: Ipv4Addr::new(192, 0, 2, 1),
        metric: 100,
        mtu: 1500,
        vlan: Some(116),
        dhcp: true,
        ..overlay()
    }
}

fn key(c: &str) -> AttachmentKey {
    AttachmentKey {
        container_id: c.into(),
        ifname: "eth0".into(),
    }
}

#[test]
fn host_names_are_stable_distinct_and_fit_ifnamsiz() {
    let n = host_ifname("roam", &key("abc"), 0);
    assert_eq!(n.len(), 15);
    assert!(n.starts_with("rm") && n.ends_with("00"), "{n}");
    assert_eq!(n, host_ifname("roam", &key("abc"), 0), "deterministic");
    // pinned (FNV-1a of "roam\0abc\0eth0\0", checked with a reference implementation): a
    // DEL by a later build must find what this one created
    assert_eq!(host_stem("roam", &key("abc")), "rm9427ad76713");
    assert!(host_ifname("roam", &key("abc"), 1).ends_with("01"));
    let mut all = std::collections::BTreeSet::new();
    for net in ["roam", "other"] {
        for c in ["abc", "abd", "abc1"] {
            for ifname in ["eth0", "eth1"] {
                let k = AttachmentKey {
                    container_id: c.into(),
                    ifname: ifname.into(),
                };
                assert!(all.insert(host_stem(net, &k)), "{net} {c} {ifname}");
            }
        }
    }
}

#[test]
fn the_plan_covers_every_interface_in_order() {
    let plans = plan("roam", &key("abc"), ("ns", "p"), &[overlay(), underlay()]).unwrap();
    assert_eq!(plans.len(), 2);
    let (o, u) = (&plans[0], &plans[1]);
    assert_eq!(
        (o.pod_ifname.as_str(), u.pod_ifname.as_str()),
        ("eth0", "eth1")
    );
    assert_eq!(o.host_ifname, host_ifname("roam", &key("abc"), 0));
    assert_eq!(u.host_ifname, host_ifname("roam", &key("abc"), 1));
    assert_eq!(o.mac, [0x0a, 0x58, 0x64, 0x40, 0x00, 0x05]);
    assert_eq!((o.mtu, u.mtu), (1400, 1500));
    assert_eq!(o.routes, overlay().routes());
    assert_eq!(o.routes.len(), 2, "GW/32 on-link, then default");
    assert_eq!(
        u.routes.len(),
        1,
        "default only: the subnet comes with the address"
    );
    let ids_of = |p: &crate::plan::InterfacePlan, k: &str| p.external_ids.get(k).cloned().unwrap();
    assert_eq!(ids_of(o, ids::IFACE_ID), "p5.node-a");
    assert_eq!(ids_of(o, ids::ATTACHED_MAC), "0a:58:64:40:00:05");
    assert_eq!(ids_of(u, ids::NETWORK), "roam");
    assert_eq!(ids_of(u, ids::CONTAINER), "abc");
    assert_eq!(ids_of(u, ids::IFNAME), "eth0");
    assert_eq!(ids_of(u, ids::POD_IFNAME), "eth1");
}

#[test]
fn the_runtimes_ifname_must_be_in_the_annotation() {
    let k = AttachmentKey {
        container_id: "abc".into(),
        ifname: "net1".into(),
    };
    let e = plan("roam", &k, ("ns", "p"), &[overlay(), underlay()]).unwrap_err();
    assert_eq!(e.code(), code::NO_SUCH_INTERFACE);
    assert!(e.to_string().contains("[\"eth0\", \"eth1\"]"), "{e}");
}

#[test]
fn an_isolated_launcher_pod_gets_one_link_local_address_and_no_route() {
    let r = crate::result::isolated("eth0", Path::new("/run/netns/x"));
    assert_eq!(
        crate::result::render(&r, "1.0.0"),
        json!({"cniVersion": "1.0.0",
               "interfaces": [{"name": "eth0", "sandbox": "/run/netns/x"}],
               "ips": [{"address": "169.254.1.1/32", "interface": 0}],
               "routes": [], "dns": {}})
    );
    assert!(
        crate::result::host_interfaces(&r).is_empty(),
        "nothing on the host"
    );
}

#[test]
fn results_take_the_shape_of_their_version() {
    let plans = plan("roam", &key("abc"), ("ns", "p"), &[overlay(), underlay()]).unwrap();
    let r = build(&plans, Path::new("/run/netns/x"));
    let v11 = render(&r, "1.1.0");
    assert_eq!(v11["cniVersion"], "1.1.0");
    assert_eq!(v11["interfaces"].as_array().unwrap().len(), 4);
    assert_eq!(
        v11["interfaces"][1],
        json!({"name": "eth0", "mac": "0a:58:64:40:00:05", "mtu": 1400, "sandbox": "/run/netns/x"})
    );
    assert!(v11["interfaces"][0].get("sandbox").is_none());
    assert_eq!(
        v11["ips"],
        json!([
            {"address": "100.64.0.5/32", "gateway": "100.64.0.1", "interface": 1},
            {"address": "192.0.2.10/24", "gateway": "192.0.2.1", "interface": 3},
        ])
    );
    assert_eq!(
        v11["routes"],
        json!([
            {"dst": "100.64.0.1/32", "priority": 0, "scope": 253},
            {"dst": "0.0.0.0/0", "gw": "100.64.0.1", "priority": 0},
            {"dst": "0.0.0.0/0", "gw": "192.0.2.1", "priority": 100},
        ])
    );
    assert_eq!(v11["dns"], json!({}));
    let v10 = render(&r, "1.0.0");
    assert!(v10["interfaces"][1].get("mtu").is_none());
    assert_eq!(v10["routes"][0], json!({"dst": "100.64.0.1/32"}));
    assert!(v10["ips"][0].get("version").is_none());
    let v04 = render(&r, "0.4.0");
    assert_eq!(v04["ips"][0]["version"], "4");
    // a prevResult of any of these versions reads back
    for v in [&v11, &v10, &v04] {
        let back = parse_prev(v).unwrap();
        assert_eq!(back.interfaces.len(), 4);
        assert_eq!(back.ips.len(), 2);
    }
    assert_eq!(parse_prev(&v11).unwrap(), r);
    let e = parse_prev(&json!({"interfaces": "eth0"})).unwrap_err();
    assert_eq!(e.code(), code::INVALID_CONFIG);
}

/// What the kernel and OVS show right after a good ADD of `plans`.
fn observed_ok() -> (crate::result::CniResult, Observed) {
    let plans = plan("roam", &key("abc"), ("ns", "p"), &[overlay(), underlay()]).unwrap();
    let r = build(&plans, Path::new("/run/netns/x"));
    let link = |name: &str, mac: Option<&str>, mtu: u32| ObservedLink {
        name: name.into(),
        mac: mac.map(str::to_string),
        mtu: Some(mtu),
        up: true,
    };
    let route = |dst: [u8; 4], plen, gw: Option<[u8; 4]>, dev: &str, metric, scope| ObservedRoute {
        dst: dst.into(),
        prefix_len: plen,
        gw: gw.map(Ipv4Addr::from),
        ifname: Some(dev.into()),
        metric,
        scope,
    };
    let obs = Observed {
        pod_links: vec![
            link("lo", None, 65536),
            link("eth0", Some("0a:58:64:40:00:05"), 1400),
            link("eth1", Some("0a:58:c0:00:02:0a"), 1500),
        ],
        pod_addrs: vec![
            ObservedAddr {
                ifname: "eth0".into(),
                ip: [100, 64, 0, 5].into(),
                prefix_len: 32,
            },
            ObservedAddr {
                ifname: "eth1".into(),
                ip: [192, 0, 2, 10].into(),
                prefix_len: 24,
            },
        ],
        pod_routes: vec![
            route([100, 64, 0, 1], 32, None, "eth0", 0, 253),
            route([0, 0, 0, 0], 0, Some([100, 64, 0, 1]), "eth0", 0, 0),
            route([0, 0, 0, 0], 0, Some([192, 0, 2, 1]), "eth1", 100, 0),
            route([192, 0, 2, 0], 24, None, "eth1", 0, 253),
        ],
        host_links: plans
            .iter()
            .map(|p| link(&p.host_ifname, Some("aa:bb:cc:dd:ee:ff"), p.mtu))
            .collect(),
        ports: plans
            .iter()
            .map(|p| ObservedPort {
                name: p.host_ifname.clone(),
                iface_id: Some(p.external_ids[ids::IFACE_ID].clone()),
                ofport: Some(3),
            })
            .collect(),
    };
    (r, obs)
}

#[test]
fn check_finds_no_drift_right_after_add_and_allows_added_routes() {
    let (r, mut obs) = observed_ok();
    assert_eq!(compare(&r, &obs), Vec::<String>::new());
    obs.pod_routes.push(ObservedRoute {
        dst: [10, 0, 0, 0].into(),
        prefix_len: 8,
        gw: Some([100, 64, 0, 1].into()),
        ifname: Some("eth0".into()),
        metric: 0,
        scope: 0,
    });
    assert_eq!(
        compare(&r, &obs),
        Vec::<String>::new(),
        "a chained plugin's route"
    );
}

#[test]
fn check_names_each_drift() {
    let (r, ok) = observed_ok();
    let host0 = ok.host_links[0].name.clone();
    type Edit = Box<dyn Fn(&mut Observed)>;
    let cases: Vec<(Edit, String)> = vec![
        (
            Box::new(|o| o.pod_links.retain(|l| l.name != "eth1")),
            "pod interface eth1 is missing".into(),
        ),
        (
            Box::new(|o| o.pod_links[1].mac = Some("0a:00:00:00:00:01".into())),
            "pod interface eth0 has MAC 0a:00:00:00:00:01, not 0a:58:64:40:00:05".into(),
        ),
        (
            Box::new(|o| o.pod_links[1].mtu = Some(1500)),
            "pod interface eth0 has MTU 1500, not 1400".into(),
        ),
        (
            Box::new(|o| o.pod_links[2].up = false),
            "pod interface eth1 is down".into(),
        ),
        (
            Box::new(|o| {
                o.host_links.remove(0);
            }),
            format!("host interface {host0} is missing"),
        ),
        (
            Box::new(|o| {
                o.ports.remove(0);
            }),
            format!("host interface {host0} is not a port of the bridge"),
        ),
        (
            Box::new(|o| o.ports[0].iface_id = None),
            format!("OVS interface {host0} has no external_ids:iface-id"),
        ),
        (
            Box::new(|o| o.ports[0].ofport = Some(-1)),
            format!("OVS could not open interface {host0} (ofport -1)"),
        ),
        (
            Box::new(|o| {
                o.pod_addrs.remove(0);
            }),
            "address 100.64.0.5/32 is missing on eth0".into(),
        ),
        (
            Box::new(|o| o.pod_addrs[1].prefix_len = 25),
            "address 192.0.2.10/24 is missing on eth1".into(),
        ),
        (
            Box::new(|o| {
                o.pod_routes.remove(0);
            }),
            "route 100.64.0.1/32 (on-link) metric 0 is missing".into(),
        ),
        (
            Box::new(|o| {
                o.pod_routes.remove(1);
            }),
            "route 0.0.0.0/0 via 100.64.0.1 metric 0 is missing".into(),
        ),
        (
            Box::new(|o| o.pod_routes[2].metric = 5),
            "route 0.0.0.0/0 via 192.0.2.1 metric 100 is missing".into(),
        ),
        (
            Box::new(|o| o.pod_routes[0].scope = 0),
            "route 100.64.0.1/32 (on-link) metric 0 is missing".into(),
        ),
    ];
    for (edit, want) in cases {
        let mut obs = ok.clone();
        edit(&mut obs);
        let d = compare(&r, &obs);
        assert!(d.contains(&want), "{want:?} not in {d:?}");
    }
}

mod ethtool_messages {
    use crate::ethtool::{Reply, TX_OFFLOADS, family_request, features_off_request, parse_reply};

    fn u16_at(b: &[u8], at: usize) -> u16 {
        u16::from_ne_bytes([b[at], b[at + 1]])
    }

    fn u32_at(b: &[u8], at: usize) -> u32 {
        u32::from_ne_bytes(b[at..at + 4].try_into().unwrap())
    }

    /// The attributes of a region as (type without flags, nested flag, payload).
    fn attrs(b: &[u8]) -> Vec<(u16, bool, &[u8])> {
        let mut out = vec![];
        let mut at = 0;
        while at + 4 <= b.len() {
            let len = u16_at(b, at) as usize;
            let kind = u16_at(b, at + 2);
            out.push((kind & 0x3fff, kind & 0x8000 != 0, &b[at + 4..at + len]));
            at += (len + 3) & !3;
        }
        out
    }

    #[test]
    fn the_family_lookup_asks_the_controller_for_ethtool() {
        let m = family_request(7);
        assert_eq!(u32_at(&m, 0) as usize, m.len());
        assert_eq!(u16_at(&m, 4), 0x10, "GENL_ID_CTRL");
        assert_eq!(u16_at(&m, 6), 0x5, "REQUEST|ACK");
        assert_eq!(u32_at(&m, 8), 7);
        assert_eq!(m[16], 3, "CTRL_CMD_GETFAMILY");
        assert_eq!(attrs(&m[20..]), vec![(2, false, &b"ethtool\0"[..])]);
    }

    #[test]
    fn features_set_names_each_feature_without_a_value() {
        let m = features_off_request(21, 9, "eth0", TX_OFFLOADS);
        assert_eq!(u32_at(&m, 0) as usize, m.len());
        assert_eq!(u16_at(&m, 4), 21, "the family's id");
        assert_eq!(
            (m[16], m[17]),
            (12, 1),
            "ETHTOOL_MSG_FEATURES_SET, version 1"
        );
        let top = attrs(&m[20..]);
        assert_eq!(top.len(), 2);
        let (kind, nested, header) = top[0];
        assert_eq!((kind, nested), (1, true), "ETHTOOL_A_FEATURES_HEADER");
        let header = attrs(header);
        assert_eq!(header[0], (2, false, &b"eth0\0"[..]));
        assert_eq!((header[1].0, u32_at(header[1].2, 0)), (3, 2), "OMIT_REPLY");
        let (kind, nested, wanted) = top[1];
        assert_eq!((kind, nested), (3, true), "ETHTOOL_A_FEATURES_WANTED");
        let bitset = attrs(wanted);
        assert_eq!(
            bitset.len(),
            1,
            "only BITS: no NOMASK, so only the listed bits change"
        );
        assert_eq!((bitset[0].0, bitset[0].1), (3, true));
        let bits = attrs(bitset[0].2);
        assert_eq!(bits.len(), TX_OFFLOADS.len());
        for ((kind, nested, bit), name) in bits.iter().zip(TX_OFFLOADS) {
            assert_eq!((*kind, *nested), (1, true));
            let fields = attrs(bit);
            let mut want = name.as_bytes().to_vec();
            want.push(0);
            assert_eq!(
                fields,
                vec![(2, false, &want[..])],
                "a name and no VALUE: off"
            );
        }
    }

    fn message(kind: u16, seq: u32, payload: &[u8]) -> Vec<u8> {
        let mut v = vec![];
        v.extend_from_slice(&((16 + payload.len()) as u32).to_ne_bytes());
        v.extend_from_slice(&kind.to_ne_bytes());
        v.extend_from_slice(&0u16.to_ne_bytes());
        v.extend_from_slice(&seq.to_ne_bytes());
        v.extend_from_slice(&0u32.to_ne_bytes());
        v.extend_from_slice(payload);
        v
    }

    #[test]
    fn replies_are_matched_to_their_request() {
        let ack = message(2, 5, &0i32.to_ne_bytes());
        assert_eq!(parse_reply(&ack, 5), Reply::Ack);
        assert_eq!(parse_reply(&ack, 6), Reply::Nothing, "another request's");
        let err = message(2, 5, &(-95i32).to_ne_bytes());
        assert_eq!(parse_reply(&err, 5), Reply::Error(-95));
        // the controller's answer: genlmsghdr, then FAMILY_NAME and FAMILY_ID
        let mut p = vec![1, 2, 0, 0];
        p.extend_from_slice(&[12, 0, 2, 0]);
        p.extend_from_slice(b"ethtool\0");
        p.extend_from_slice(&[6, 0, 1, 0, 0x1d, 0, 0, 0]);
        let fam = message(0x10, 5, &p);
        assert_eq!(parse_reply(&fam, 5), Reply::Family(0x1d));
        // two messages in one datagram: the first for another request
        let mut both = message(2, 4, &0i32.to_ne_bytes());
        both.extend(err);
        assert_eq!(parse_reply(&both, 5), Reply::Error(-95));
        assert_eq!(parse_reply(&[1, 2, 3], 5), Reply::Nothing, "garbage");
    }
}

#[test]
fn tx_offloads_is_a_boolean_or_absent() {
    let c = parse_conf(Command::Add, conf(json!({})).as_bytes()).unwrap();
    assert_eq!(c.tx_offloads, None, "decided by the datapath");
    let c = parse_conf(Command::Add, conf(json!({"txOffloads": false})).as_bytes()).unwrap();
    assert_eq!(c.tx_offloads, Some(false));
    let e = conf_err(Command::Add, json!({"txOffloads": "off"}));
    assert_eq!(e.code(), code::INVALID_CONFIG);
    assert!(e.to_string().contains("txOffloads"), "{e}");
}

mod properties {
    use std::net::Ipv4Addr;
    use std::path::Path;

    use proptest::prelude::*;
    use roam_contract::annotation::{Mode, PodAddress};

    use crate::check::{
        Observed, ObservedAddr, ObservedLink, ObservedPort, ObservedRoute, compare,
    };
    use crate::config::{AttachmentKey, Command, parse_conf, parse_env, valid_ifname};
    use crate::plan::{host_ifname, plan};
    use crate::result::{SCOPE_LINK, build, parse_prev, render};
    use crate::{code, error_json};

    proptest! {
        #[test]
        fn any_stdin_is_a_config_or_a_coded_error(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            for cmd in [Command::Add, Command::Del, Command::Check, Command::Status, Command::Gc] {
                if let Err(e) = parse_conf(cmd, &bytes) {
                    prop_assert!([code::INCOMPATIBLE_VERSION, code::DECODE, code::INVALID_CONFIG].contains(&e.code()), "{e}");
                    let j = error_json(&e, &bytes);
                    prop_assert!(j["msg"].as_str().is_some_and(|m| !m.is_empty()));
                }
            }
        }

        #[test]
        fn any_environment_parses_or_is_error_4(
            cmd in prop_oneof![
                Just("ADD".to_string()),
                Just("DEL".to_string()),
                Just("CHECK".to_string()),
                Just("GC".to_string()),
                ".*",
            ],
            id in ".{0,20}", ifname in ".{0,20}", netns in ".{0,20}", args in ".{0,40}",
        ) {
            let vars = [("CNI_COMMAND", cmd.as_str()), ("CNI_CONTAINERID", id.as_str()),
                ("CNI_IFNAME", ifname.as_str()), ("CNI_NETNS", netns.as_str()), ("CNI_ARGS", args.as_str())];
            match parse_env(|k| vars.iter().find(|(kk, _)| *kk == k).map(|(_, v)| v.to_string())) {
                Ok(env) => {
                    if let Some(k) = &env.key {
                        prop_assert!(valid_ifname(&k.ifname));
                        prop_assert!(crate::config::valid_container_id(&k.container_id));
                    }
                }
                Err(e) => prop_assert_eq!(e.code(), code::INVALID_ENV, "{}", e),
            }
        }

        #[test]
        fn host_names_are_always_valid_interface_names(
            net in ".{1,30}", id in "[a-zA-Z0-9][a-zA-Z0-9_.-]{0,70}", ifname in "[a-z0-9]{1,15}", i in any::<u8>(),
        ) {
            let n = host_ifname(&net, &AttachmentKey { container_id: id, ifname }, i);
            prop_assert_eq!(n.len(), 15);
            prop_assert!(valid_ifname(&n) && n.starts_with("rm"));
        }

        #[test]
        fn check_finds_nothing_on_exactly_what_add_built(
            ip in any::<u32>(), gw_low in 1u8..254, plen in 8u8..30, metric in any::<u32>(),
            underlay in any::<bool>(), version in prop_oneof![Just("0.4.0"), Just("1.0.0"), Just("1.1.0")].prop_map(str::to_string),
        ) {
            let ip = Ipv4Addr::from(ip);
            let (prefix_len, gateway) = if underlay {
                let mask = u32::MAX << (32 - plen);
                (plen, Ipv4Addr::from((u32::from(ip) & mask) | u32::from(gw_low)))
            } else {
                (32, Ipv4Addr::from(u32::from(ip) ^ 1))
            };
            prop_assume!(gateway != ip);
            let a = PodAddress {
                name: "eth0".into(), network: "n".into(),
                mode: if underlay { Mode::Underlay } else { Mode::Overlay },
                address: "a".into(), port: "p.node-a".into(), ip, prefix_len,
                mac: "0a:58:00:00:00:01".into(), gateway, metric, mtu: 1400, dhcp: false,
                vlan: underlay.then_some(10), service_class: None,
            };
            let key = AttachmentKey { container_id: "c".into(), ifname: "eth0".into() };
            let plans = plan("n", &key, ("ns", "p"), &[a]).unwrap();
            let rendered = render(&build(&plans, Path::new("/run/netns/x")), &version);
            let prev = parse_prev(&rendered).unwrap();
            let p = &plans[0];
            let obs = Observed {
                pod_links: vec![ObservedLink { name: "eth0".into(), mac: Some("0A:58:00:00:00:01".into()), mtu: Some(1400), up: true }],
                pod_addrs: vec![ObservedAddr { ifname: "eth0".into(), ip, prefix_len }],
                pod_routes: p.routes.iter().map(|r| ObservedRoute {
                    dst: r.dst, prefix_len: r.prefix_len, gw: r.via, ifname: Some("eth0".into()),
                    metric: r.metric, scope: if r.via.is_none() { SCOPE_LINK } else { 0 },
                }).collect(),
                host_links: vec![ObservedLink { name: p.host_ifname.clone(), mac: None, mtu: Some(1400), up: true }],
                ports: vec![ObservedPort { name: p.host_ifname.clone(), iface_id: Some("p.node-a".into()), ofport: Some(5) }],
            };
            prop_assert_eq!(compare(&prev, &obs), Vec::<String>::new());
        }
    }
}
