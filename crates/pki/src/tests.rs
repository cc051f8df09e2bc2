use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, SystemTime};

use super::*;

const DAY: Duration = Duration::from_secs(24 * 3600);

fn ca() -> Ca {
    Ca::generate(SystemTime::now(), 365 * DAY).unwrap()
}

fn node_facts(name: &str, last: u8) -> NodeFacts {
    NodeFacts {
        name: name.into(),
        addresses: vec![IpAddr::V4(Ipv4Addr::new(10, 213, 0, last))],
    }
}

fn nodes_group() -> Vec<String> {
    vec!["system:nodes".into(), "system:authenticated".into()]
}

/// A key and the certificate `ca` issues for `node` through the whole flow.
fn node_cert(ca: &Ca, node: &str, last: u8) -> (String, String) {
    let key = new_key().unwrap();
    let request = node_request(&key, node).unwrap();
    let groups = nodes_group();
    let user = format!("system:node:{node}");
    let (csr, facts) = review(
        request.as_bytes(),
        Requester {
            username: &user,
            groups: &groups,
        },
        |n| (n == node).then(|| node_facts(n, last)),
    )
    .unwrap();
    let cert = ca.issue(&csr, &facts, SystemTime::now(), DAY).unwrap();
    (key, cert)
}

#[test]
fn a_ca_reads_back_from_its_pem_and_refuses_a_foreign_key() {
    let ca = ca();
    let again = Ca::from_pem(ca.cert_pem(), ca.key_pem()).unwrap();
    assert_eq!(again.cert_pem(), ca.cert_pem());
    let info = cert_info(ca.cert_pem()).unwrap();
    assert!(info.is_ca);
    assert_eq!(info.common_name.as_deref(), Some("roam-ca"));
    let other = self::ca();
    let e = Ca::from_pem(ca.cert_pem(), other.key_pem()).unwrap_err();
    assert!(e.to_string().contains("does not belong"), "{e}");
    let (key, cert) = node_cert(&ca, "node-a", 1);
    let e = Ca::from_pem(&cert, &key).unwrap_err();
    assert!(e.to_string().contains("not a CA"), "{e}");
}

#[test]
fn a_node_gets_a_certificate_naming_it_with_the_controllers_names_and_usages() {
    let ca = ca();
    let (key, cert) = node_cert(&ca, "node-a", 1);
    let info = cert_info(&cert).unwrap();
    assert_eq!(info.common_name.as_deref(), Some("node-a"));
    assert_eq!(info.dns_names, ["node-a"]);
    assert_eq!(info.ips, [IpAddr::V4(Ipv4Addr::new(10, 213, 0, 1))]);
    assert!(!info.is_ca);
    let life = info.not_after.duration_since(info.not_before).unwrap();
    assert!(
        life > DAY && life <= DAY + Duration::from_secs(600),
        "{life:?}"
    );
    assert!(signed_by(&cert, ca.cert_pem()));
    assert!(!signed_by(&cert, self::ca().cert_pem()), "another CA");
    // a bundle of an old and the current CA: either signer counts
    let bundle = format!("{}{}", self::ca().cert_pem(), ca.cert_pem());
    assert!(signed_by(&cert, &bundle));
    assert!(key_matches(&cert, &key));
    assert!(!key_matches(&cert, &new_key().unwrap()));
}

#[test]
fn the_request_may_ask_for_extras_but_gets_only_the_nodes_names() {
    // a request asking for more (another SAN, a CA) gets what the controller sets
    let ca = ca();
    let key = KeyPair::from_pem(&new_key().unwrap()).unwrap();
    let mut p = CertificateParams::new(vec!["node-b".to_string(), "evil.example".into()]).unwrap();
    p.distinguished_name = name("node-a");
    let request = p.serialize_request(&key).unwrap().pem().unwrap();
    let groups = nodes_group();
    let (csr, facts) = review(
        request.as_bytes(),
        Requester {
            username: "system:node:node-a",
            groups: &groups,
        },
        |n| Some(node_facts(n, 1)),
    )
    .unwrap();
    let cert = ca.issue(&csr, &facts, SystemTime::now(), DAY).unwrap();
    let info = cert_info(&cert).unwrap();
    assert_eq!(info.dns_names, ["node-a"]);
    assert!(!info.is_ca);
}

#[test]
fn only_a_node_may_ask_and_only_for_itself() {
    let key = new_key().unwrap();
    let for_b = node_request(&key, "node-b").unwrap();
    let for_a = node_request(&key, "node-a").unwrap();
    let groups = nodes_group();
    let no_groups: Vec<String> = vec!["system:authenticated".into()];
    let masters: Vec<String> = vec!["system:masters".into()];
    let exists = |n: &str| Some(node_facts(n, 1));
    let refused = |request: &str, username: &str, groups: &[String]| {
        review(request.as_bytes(), Requester { username, groups }, exists).unwrap_err()
    };
    let r = refused(&for_b, "system:node:node-a", &groups);
    assert_eq!(r.reason, "NotItsOwnName");
    assert!(
        r.message.contains("node node-a asked for [CN=node-b]"),
        "{}",
        r.message
    );
    let r = refused(&for_a, "admin", &masters);
    assert_eq!(r.reason, "NotANode");
    let r = refused(
        &for_a,
        "system:serviceaccount:roam-system:roam-node",
        &groups,
    );
    assert_eq!(r.reason, "NotANode");
    let r = refused(&for_a, "system:node:node-a", &no_groups);
    assert_eq!(
        r.reason, "NotANode",
        "a node user name outside system:nodes"
    );
    let r = refused(&for_a, "system:node:", &groups);
    assert_eq!(r.reason, "NotANode");

    // more than the CN in the subject
    let k = KeyPair::from_pem(&key).unwrap();
    let mut p = CertificateParams::default();
    p.distinguished_name = name("node-a");
    p.distinguished_name
        .push(DnType::OrganizationName, "system:masters");
    let with_org = p.serialize_request(&k).unwrap().pem().unwrap();
    let r = refused(&with_org, "system:node:node-a", &groups);
    assert_eq!(r.reason, "NotItsOwnName");
    assert!(
        r.message.contains("OrganizationName=system:masters"),
        "{}",
        r.message
    );

    // not a request, or one whose signature does not hold
    let r = refused("hello", "system:node:node-a", &groups);
    assert_eq!(r.reason, "BadRequest");
    let der = x509_parser::pem::parse_x509_pem(for_a.as_bytes())
        .unwrap()
        .1
        .contents;
    let mut tampered = der.clone();
    let at = tampered.len() - 5;
    tampered[at] ^= 0x55;
    let pem = format!(
        "-----BEGIN CERTIFICATE REQUEST-----\n{}\n-----END CERTIFICATE REQUEST-----\n",
        base64(&tampered)
    );
    let r = refused(&pem, "system:node:node-a", &groups);
    assert_eq!(r.reason, "BadRequest", "{}", r.message);

    // a node that does not exist
    let r = review(
        for_a.as_bytes(),
        Requester {
            username: "system:node:node-a",
            groups: &groups,
        },
        |_| None,
    )
    .unwrap_err();
    assert_eq!(r.reason, "NoSuchNode");
}

#[test]
fn a_node_identity_for_tools_is_what_a_reviewed_request_gets() {
    let ca = ca();
    let (key, cert) = node_identity(&ca, &node_facts("node-c", 3), SystemTime::now(), DAY).unwrap();
    let info = cert_info(&cert).unwrap();
    assert_eq!(info.common_name.as_deref(), Some("node-c"));
    assert_eq!(info.ips, [IpAddr::V4(Ipv4Addr::new(10, 213, 0, 3))]);
    assert!(signed_by(&cert, ca.cert_pem()) && key_matches(&cert, &key));
}

#[test]
fn renewal_is_due_after_two_thirds_of_the_life() {
    let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
    let end = t0 + Duration::from_secs(3000);
    assert!(!renewal_due(t0, end, t0));
    assert!(!renewal_due(t0, end, t0 + Duration::from_secs(1999)));
    assert!(renewal_due(t0, end, t0 + Duration::from_secs(2000)));
    assert!(renewal_due(t0, end, end + Duration::from_secs(1)));
    assert!(
        renewal_due(end, t0, t0),
        "a window that ends before it starts"
    );
    assert!(
        renewal_due(t0, end, t0 - Duration::from_secs(3600)),
        "a certificate far in the future (a clock that jumped back)"
    );
    assert!(!renewal_due(t0, end, t0 - Duration::from_secs(60)));
}

#[test]
fn a_validity_under_a_minute_is_refused() {
    let e = Ca::generate(SystemTime::now(), Duration::from_secs(5)).unwrap_err();
    assert!(e.to_string().contains("too short"), "{e}");
}

fn base64(b: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in b.chunks(3) {
        let n = (c[0] as u32) << 16
            | (*c.get(1).unwrap_or(&0) as u32) << 8
            | *c.get(2).unwrap_or(&0) as u32;
        for i in 0..4 {
            if i <= c.len() {
                out.push(T[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[test]
fn the_controller_identity_is_a_client_certificate_no_node_can_have() {
    let ca = ca();
    let (key, cert) = ca.controller_identity(SystemTime::now(), DAY).unwrap();
    let info = cert_info(&cert).unwrap();
    assert_eq!(info.common_name.as_deref(), Some(CONTROLLER_NAME));
    assert!(info.dns_names.is_empty() && info.ips.is_empty(), "{info:?}");
    assert!(!info.is_ca);
    assert!(signed_by(&cert, ca.cert_pem()));
    assert!(key_matches(&cert, &key));
    let der = first_der(&cert).unwrap();
    assert_eq!(common_name_der(&der).as_deref(), Some(CONTROLLER_NAME));
    assert_eq!(common_name_der(b"not a certificate"), None);
    // a node may not ask for it: its name is no node's own
    let request = node_request(&new_key().unwrap(), CONTROLLER_NAME).unwrap();
    let asker = Requester {
        username: "system:node:node-a",
        groups: &nodes_group(),
    };
    let refused = review(request.as_bytes(), asker, |n| Some(node_facts(n, 1))).unwrap_err();
    assert_eq!(refused.reason, "NotItsOwnName", "{refused:?}");
}
