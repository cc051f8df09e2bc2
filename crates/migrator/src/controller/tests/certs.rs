//! The node-certificate signer against the mock API server: the CA made once and read back,
//! a node's request for its own name approved and signed, anything else refused.

use std::time::Duration;

use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use serde_json::json;

use super::node;
use crate::controller::certs::{PkiConfig, answer, ensure_ca};
use crate::controller::fixtures::context;

const CSRS: &str = "/apis/certificates.k8s.io/v1/certificatesigningrequests";

fn pki() -> PkiConfig {
    PkiConfig {
        namespace: "roam-system".into(),
        node_validity: Duration::from_secs(3600),
        ca_validity: Duration::from_secs(24 * 3600),
    }
}

/// A request for `CN=cn` filed as `username` (groups: system:nodes).
fn csr(name: &str, username: &str, cn: &str) -> CertificateSigningRequest {
    let key = roam_pki::new_key().unwrap();
    let request = roam_pki::node_request(&key, cn).unwrap();
    serde_json::from_value(json!({
        "apiVersion": "certificates.k8s.io/v1", "kind": "CertificateSigningRequest",
        "metadata": {"name": name},
        "spec": {"request": k8s_openapi::ByteString(request.into_bytes()),
                 "signerName": "roam.dev/node", "username": username,
                 "groups": ["system:nodes", "system:authenticated"],
                 "usages": ["digital signature", "key encipherment", "server auth", "client auth"]},
    }))
    .unwrap()
}

fn conditions(c: &CertificateSigningRequest) -> Vec<(String, String)> {
    c.status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|c| (c.type_, c.reason.unwrap_or_default()))
        .collect()
}

fn certificate(c: &CertificateSigningRequest) -> Option<String> {
    c.status
        .as_ref()
        .and_then(|s| s.certificate.clone())
        .map(|b| String::from_utf8(b.0).unwrap())
}

#[tokio::test]
async fn the_ca_is_made_once_and_published_for_the_nodes() {
    let (ctx, api) = context(&[], &[], &[]);
    let ca = ensure_ca(&ctx.client, &pki()).await.unwrap();
    let secret: Secret = api
        .get("/api/v1/namespaces/roam-system/secrets/roam-ca")
        .expect("the CA's Secret");
    assert!(secret.data.unwrap().contains_key("ca.key"));
    let map: ConfigMap = api
        .get("/api/v1/namespaces/roam-system/configmaps/roam-ca")
        .expect("the CA's ConfigMap");
    let data = map.data.unwrap();
    assert_eq!(data["ca.crt"], ca.cert_pem());
    assert!(!data.contains_key("ca.key"), "the key stays in the Secret");
    // a second start (or a second replica) uses the same CA
    let again = ensure_ca(&ctx.client, &pki()).await.unwrap();
    assert_eq!(again.cert_pem(), ca.cert_pem());
}

#[tokio::test]
async fn a_nodes_own_request_is_approved_and_signed_and_others_are_refused() {
    let (ctx, api) = context(&[], &["node-a"], &[]);
    api.put(&node("node-a", "10.0.0.1"));
    let pki = pki();
    let ca = ensure_ca(&ctx.client, &pki).await.unwrap();
    let csrs: Api<CertificateSigningRequest> = Api::all(ctx.client.clone());
    let get = |name: &str| -> CertificateSigningRequest {
        api.get(&format!("{CSRS}/{name}")).expect("the CSR")
    };

    let own = csr("own", "system:node:node-a", "node-a");
    api.put(&own);
    answer(&ctx, &csrs, &ca, &pki, &get("own")).await.unwrap();
    let own = get("own");
    assert_eq!(
        conditions(&own),
        [("Approved".into(), "RoamNodeCertificate".into())]
    );
    let cert = certificate(&own).expect("signed");
    let info = roam_pki::cert_info(&cert).unwrap();
    assert_eq!(info.common_name.as_deref(), Some("node-a"));
    assert_eq!(info.ips, ["10.0.0.1".parse::<std::net::IpAddr>().unwrap()]);
    assert!(roam_pki::signed_by(&cert, ca.cert_pem()));
    // answered once: a second look changes nothing
    answer(&ctx, &csrs, &ca, &pki, &own).await.unwrap();
    assert_eq!(certificate(&get("own")), Some(cert));

    // node-a asking for node-b's name; a node that does not exist; not a node
    for (name, user, cn, reason) in [
        ("posing", "system:node:node-a", "node-b", "NotItsOwnName"),
        ("ghost", "system:node:node-z", "node-z", "NoSuchNode"),
        ("admin", "admin", "node-a", "NotANode"),
    ] {
        api.put(&csr(name, user, cn));
        answer(&ctx, &csrs, &ca, &pki, &get(name)).await.unwrap();
        let c = get(name);
        assert_eq!(conditions(&c), [("Denied".into(), reason.into())], "{name}");
        assert_eq!(certificate(&c), None, "{name}");
    }

    // approved by someone else, but not a node's own: Failed, never signed
    let mut forged = csr("forged", "system:node:node-a", "node-b");
    forged.status = Some(
        serde_json::from_value(json!({"conditions": [
            {"type": "Approved", "status": "True", "reason": "ByHand", "message": "ok"}]}))
        .unwrap(),
    );
    api.put(&forged);
    answer(&ctx, &csrs, &ca, &pki, &get("forged"))
        .await
        .unwrap();
    let c = get("forged");
    assert_eq!(
        conditions(&c),
        [
            ("Approved".into(), "ByHand".into()),
            ("Failed".into(), "NotItsOwnName".into())
        ]
    );
    assert_eq!(certificate(&c), None);

    // another signer's request is not roam's to answer
    let mut other = csr("other", "system:node:node-a", "node-a");
    other.spec.signer_name = "kubernetes.io/kube-apiserver-client".into();
    api.put(&other);
    answer(&ctx, &csrs, &ca, &pki, &get("other")).await.unwrap();
    assert!(conditions(&get("other")).is_empty());
}
