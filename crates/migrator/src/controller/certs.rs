//! The node-certificate signer (on when roam-controller has `--pki-namespace`): keeps the
//! roam CA in that namespace (the Secret `roam-ca`, made on the first start; its certificate
//! also in the ConfigMap `roam-ca`, which every node may read), and answers the
//! CertificateSigningRequests for [`roam_pki::SIGNER_NAME`] that nodes file: approved and
//! signed when [`roam_pki::review`] finds a node asking for its own name, Denied with the
//! reason otherwise. A request someone else approved is still reviewed before it is signed
//! (Failed if it does not pass). The policy is roam-pki's; this is the I/O.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Secret};
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use roam_pki::{Ca, NodeFacts, Requester, SIGNER_NAME};
use serde_json::json;

use super::Context;
use crate::error::{Error, Result};

/// The Secret (keys `ca.crt`, `ca.key`) and ConfigMap (key `ca.crt`) of the roam CA.
pub const CA_NAME: &str = "roam-ca";

/// The signer's settings.
#[derive(Clone, Debug)]
pub struct PkiConfig {
    /// Where the CA's Secret and ConfigMap live (`roam-system`).
    pub namespace: String,
    /// How long a node certificate is valid (nodes renew after two thirds).
    pub node_validity: Duration,
    /// How long a new CA is valid.
    pub ca_validity: Duration,
}

/// roam-controller's own client identity for the node API ([`roam_pki::CONTROLLER_NAME`]),
/// issued from the roam CA when first needed and again after two thirds of its life.
#[derive(Default)]
pub struct ControllerIdentity {
    current: tokio::sync::Mutex<Option<(roam_shim_api::tls::Identity, SystemTime, SystemTime)>>,
}

impl ControllerIdentity {
    /// The identity, issued (from the CA in `pki.namespace`, made if there is none) when
    /// there is none yet or the current one is due for renewal.
    pub async fn get(
        &self,
        client: &kube::Client,
        pki: &PkiConfig,
    ) -> Result<roam_shim_api::tls::Identity> {
        let mut current = self.current.lock().await;
        let now = SystemTime::now();
        if let Some((id, from, until)) = current.as_ref()
            && !roam_pki::renewal_due(*from, *until, now)
        {
            return Ok(id.clone());
        }
        let ca = ensure_ca(client, pki).await?;
        let (key, cert) = ca
            .controller_identity(now, pki.node_validity)
            .map_err(pki_error)?;
        let info = roam_pki::cert_info(&cert).map_err(pki_error)?;
        let id = roam_shim_api::tls::Identity::from_pem(
            &key,
            &cert,
            ca.cert_pem(),
            "roam-controller's node-API identity",
        );
        tracing::info!(until = ?info.not_after, "issued roam-controller's node-API client certificate");
        *current = Some((id.clone(), info.not_before, info.not_after));
        Ok(id)
    }
}

pub(super) async fn run(ctx: Arc<Context>, pki: PkiConfig) {
    loop {
        if let Err(e) = serve(&ctx, &pki).await {
            tracing::warn!(error = %e, "node certificate signer failed; retrying");
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
}

async fn serve(ctx: &Context, pki: &PkiConfig) -> Result<()> {
    let ca = ensure_ca(&ctx.client, pki).await?;
    let api: Api<CertificateSigningRequest> = Api::all(ctx.client.clone());
    let config = watcher::Config::default().fields(&format!("spec.signerName={SIGNER_NAME}"));
    let mut requests = watcher(api.clone(), config).applied_objects().boxed();
    while let Some(csr) = requests
        .try_next()
        .await
        .map_err(|e| Error::Stopped(format!("the CSR watch failed: {e}")))?
    {
        if let Err(e) = answer(ctx, &api, &ca, pki, &csr).await {
            tracing::warn!(csr = %csr.name_any(), error = %e, "could not answer a node certificate request");
        }
    }
    Err(Error::Stopped("the CSR watch ended".into()))
}

/// The roam CA from its Secret, made (Secret and ConfigMap) if there is none.
pub(super) async fn ensure_ca(client: &kube::Client, pki: &PkiConfig) -> Result<Ca> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &pki.namespace);
    let ca = match secrets.get_opt(CA_NAME).await? {
        Some(s) => from_secret(&s, &pki.namespace)?,
        None => {
            let ca = Ca::generate(SystemTime::now(), pki.ca_validity).map_err(pki_error)?;
            let secret: Secret = serde_json::from_value(json!({
                "metadata": {"name": CA_NAME, "namespace": pki.namespace,
                             "labels": {"app.kubernetes.io/part-of": "roam"}},
                "type": "Opaque",
                "stringData": {"ca.crt": ca.cert_pem(), "ca.key": ca.key_pem()},
            }))
            .map_err(|e| Error::Pki(e.to_string()))?;
            match secrets.create(&PostParams::default(), &secret).await {
                Ok(_) => {
                    tracing::info!(namespace = %pki.namespace, "made the roam CA (Secret {CA_NAME})");
                    ca
                }
                // another replica made it first: use theirs
                Err(kube::Error::Api(s)) if s.code == 409 => {
                    from_secret(&secrets.get(CA_NAME).await?, &pki.namespace)?
                }
                Err(e) => return Err(e.into()),
            }
        }
    };
    // what nodes trust: the CA's certificate, readable by every node
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), &pki.namespace);
    let want = BTreeMap::from([("ca.crt".to_string(), ca.cert_pem().to_string())]);
    let map: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": CA_NAME, "namespace": pki.namespace,
                     "labels": {"app.kubernetes.io/part-of": "roam"}},
        "data": want,
    }))
    .map_err(|e| Error::Pki(e.to_string()))?;
    match maps.get_opt(CA_NAME).await? {
        Some(m) if m.data.as_ref() == Some(&want) => {}
        Some(_) => {
            maps.patch(
                CA_NAME,
                &PatchParams::default(),
                &Patch::Merge(json!({"data": want})),
            )
            .await?;
        }
        None => {
            if let Err(e) = maps.create(&PostParams::default(), &map).await
                && !matches!(&e, kube::Error::Api(s) if s.code == 409)
            {
                return Err(e.into());
            }
        }
    }
    Ok(ca)
}

fn from_secret(s: &Secret, namespace: &str) -> Result<Ca> {
    let field = |k: &str| {
        s.data
            .as_ref()
            .and_then(|d| d.get(k))
            .and_then(|b| String::from_utf8(b.0.clone()).ok())
            .ok_or_else(|| {
                Error::Pki(format!(
                    "the Secret {namespace}/{CA_NAME} has no {k}: delete it and roam-controller \
                     makes a new CA (every node then asks for a new certificate)"
                ))
            })
    };
    Ca::from_pem(&field("ca.crt")?, &field("ca.key")?).map_err(pki_error)
}

fn pki_error(e: roam_pki::Error) -> Error {
    Error::Pki(e.to_string())
}

/// Whether `csr` has a condition of `kind` that is True.
fn has_condition(csr: &CertificateSigningRequest, kind: &str) -> bool {
    csr.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == kind && c.status == "True"))
}

pub(super) async fn answer(
    ctx: &Context,
    api: &Api<CertificateSigningRequest>,
    ca: &Ca,
    pki: &PkiConfig,
    csr: &CertificateSigningRequest,
) -> Result<()> {
    if csr.spec.signer_name != SIGNER_NAME
        || has_condition(csr, "Denied")
        || has_condition(csr, "Failed")
        || csr
            .status
            .as_ref()
            .and_then(|s| s.certificate.as_ref())
            .is_some()
    {
        return Ok(());
    }
    let name = csr.name_any();
    let username = csr.spec.username.clone().unwrap_or_default();
    let groups = csr.spec.groups.clone().unwrap_or_default();
    // the node the requester says it is: its facts, if it exists
    let facts = match username.strip_prefix("system:node:") {
        Some(n) if !n.is_empty() => node_facts(&ctx.client, n).await?,
        _ => None,
    };
    let verdict = roam_pki::review(
        &csr.spec.request.0,
        Requester {
            username: &username,
            groups: &groups,
        },
        |_| facts,
    );
    let approved = has_condition(csr, "Approved");
    let (request, node) = match verdict {
        Ok(ok) => ok,
        Err(refusal) => {
            // approved by someone else but not a request roam signs: Failed, not Denied
            // (an approval cannot be taken back)
            let (kind, subresource) = match approved {
                true => ("Failed", "status"),
                false => ("Denied", "approval"),
            };
            tracing::warn!(csr = %name, %username, reason = refusal.reason, message = %refusal.message, "node certificate request refused");
            let patch = Patch::Merge(condition(csr, kind, refusal.reason, &refusal.message));
            match subresource {
                "approval" => {
                    api.patch_approval(&name, &PatchParams::default(), &patch)
                        .await?
                }
                _ => {
                    api.patch_status(&name, &PatchParams::default(), &patch)
                        .await?
                }
            };
            return Ok(());
        }
    };
    if !approved {
        let message = format!("{username} asked for its own node certificate");
        api.patch_approval(
            &name,
            &PatchParams::default(),
            &Patch::Merge(condition(csr, "Approved", "RoamNodeCertificate", &message)),
        )
        .await?;
    }
    let pem = ca
        .issue(&request, &node, SystemTime::now(), pki.node_validity)
        .map_err(pki_error)?;
    api.patch_status(
        &name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"certificate": ByteString(pem.into_bytes())}})),
    )
    .await?;
    tracing::info!(csr = %name, node = %node.name, "signed a node certificate");
    Ok(())
}

/// A merge patch setting `status.conditions` to `csr`'s conditions and `kind` (the API
/// server refuses an update that drops an Approved or Denied condition).
fn condition(
    csr: &CertificateSigningRequest,
    kind: &str,
    reason: &str,
    message: &str,
) -> serde_json::Value {
    let mut conditions: Vec<serde_json::Value> = csr
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .filter(|c| c.type_ != kind)
        .filter_map(|c| serde_json::to_value(c).ok())
        .collect();
    conditions.push(json!({
        "type": kind, "status": "True", "reason": reason, "message": message,
        "lastUpdateTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::now()),
    }));
    json!({"status": {"conditions": conditions}})
}

/// Node `name`'s name and addresses, `None` if there is no such Node.
async fn node_facts(client: &kube::Client, name: &str) -> Result<Option<NodeFacts>> {
    let nodes: Api<Node> = Api::all(client.clone());
    let Some(node) = nodes.get_opt(name).await? else {
        return Ok(None);
    };
    let addresses = node
        .status
        .and_then(|s| s.addresses)
        .unwrap_or_default()
        .into_iter()
        .filter(|a| a.type_ == "InternalIP" || a.type_ == "ExternalIP")
        .filter_map(|a| a.address.parse::<IpAddr>().ok())
        .collect();
    Ok(Some(NodeFacts {
        name: name.to_string(),
        addresses,
    }))
}
