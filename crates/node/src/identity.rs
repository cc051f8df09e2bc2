//! The node's identity on disk and the API calls that get it (thin I/O around
//! [`crate::need`] and roam-pki).
//!
//! The PKI directory holds `node.key` (0600, made here, never sent anywhere), `node.crt`
//! (the roam CA's certificate for this node) and `ca.crt` (the CA bundle roam-controller
//! publishes in the ConfigMap `roam-ca`). Each is replaced whole (written beside, then
//! renamed), so a reader never sees half a file.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{ObjectMeta, PostParams};

use crate::{Error, Need, Result};

/// The node's PKI directory.
#[derive(Clone, Debug)]
pub struct Files {
    /// The directory (`/var/lib/roam/pki`).
    pub dir: PathBuf,
}

impl Files {
    /// The node's key.
    pub fn key(&self) -> PathBuf {
        self.dir.join("node.key")
    }

    /// The node's certificate.
    pub fn cert(&self) -> PathBuf {
        self.dir.join("node.crt")
    }

    /// The CA bundle the node trusts.
    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }
}

/// A file's text, `None` if it does not exist.
pub fn read(path: &Path) -> Result<Option<String>> {
    match std::fs::read_to_string(path) {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(Error::Io {
            path: path.display().to_string(),
            source,
        }),
    }
}

/// Replace `path` with `text` (mode `mode`): written beside it, synced, then renamed.
pub fn write_atomic(path: &Path, text: &str, mode: u32) -> Result<()> {
    let io = |source| Error::Io {
        path: path.display().to_string(),
        source,
    };
    let tmp = path.with_extension("new");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&tmp).map_err(io)?;
        f.set_permissions(std::fs::Permissions::from_mode(mode))
            .map_err(io)?;
        f.write_all(text.as_bytes()).map_err(io)?;
        f.sync_all().map_err(io)?;
    }
    std::fs::rename(&tmp, path).map_err(io)
}

/// The roam CA bundle from the ConfigMap `roam-ca` in `namespace`.
pub async fn ca_bundle(client: &kube::Client, namespace: &str) -> Result<String> {
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    maps.get_opt("roam-ca")
        .await?
        .and_then(|m| m.data?.remove("ca.crt"))
        .filter(|c| !c.trim().is_empty())
        .ok_or_else(|| Error::NoCa {
            namespace: namespace.into(),
        })
}

/// File a CertificateSigningRequest for `node`'s certificate with `key_pem` (as the node:
/// `client` holds the node's credential) and wait up to `wait` for the certificate.
pub async fn request(
    client: &kube::Client,
    node: &str,
    key_pem: &str,
    wait: Duration,
) -> Result<String> {
    let api: Api<CertificateSigningRequest> = Api::all(client.clone());
    let csr = CertificateSigningRequest {
        metadata: ObjectMeta {
            generate_name: Some(format!("roam-node-{node}-")),
            labels: Some([("roam.dev/node".to_string(), node.to_string())].into()),
            ..Default::default()
        },
        spec: CertificateSigningRequestSpec {
            request: ByteString(roam_pki::node_request(key_pem, node)?.into_bytes()),
            signer_name: roam_pki::SIGNER_NAME.into(),
            usages: Some(
                [
                    "digital signature",
                    "key encipherment",
                    "server auth",
                    "client auth",
                ]
                .map(String::from)
                .to_vec(),
            ),
            ..Default::default()
        },
        status: None,
    };
    let created = api.create(&PostParams::default(), &csr).await?;
    let name = created.metadata.name.unwrap_or_default();
    tracing::info!(csr = %name, "asked for this node's certificate");
    let deadline = Instant::now() + wait;
    loop {
        let csr = api.get(&name).await?;
        let status = csr.status.unwrap_or_default();
        if let Some(cert) = status.certificate.filter(|c| !c.0.is_empty()) {
            return String::from_utf8(cert.0).map_err(|_| {
                Error::Pki(roam_pki::Error::Certificate(format!(
                    "the certificate of {name} is not PEM text"
                )))
            });
        }
        if let Some(c) = status
            .conditions
            .unwrap_or_default()
            .into_iter()
            .find(|c| (c.type_ == "Denied" || c.type_ == "Failed") && c.status == "True")
        {
            return Err(Error::Refused {
                csr: name,
                outcome: c.type_,
                reason: c.reason.unwrap_or_default(),
                message: c.message.unwrap_or_default(),
            });
        }
        if Instant::now() >= deadline {
            return Err(Error::NoAnswer {
                csr: name,
                seconds: wait.as_secs(),
            });
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// One pass: trust the current CA bundle, and make a key or ask for a certificate if
/// [`crate::need`] says so. Returns why a certificate was renewed, if it was.
pub async fn ensure(
    client: &kube::Client,
    node: &str,
    files: &Files,
    ca_namespace: &str,
    wait: Duration,
) -> Result<Option<String>> {
    let ca = ca_bundle(client, ca_namespace).await?;
    if read(&files.ca())?.as_deref() != Some(ca.as_str()) {
        write_atomic(&files.ca(), &ca, 0o644)?;
    }
    let mut key = read(&files.key())?;
    let cert = read(&files.cert())?;
    let why = match crate::need(
        node,
        key.as_deref(),
        cert.as_deref(),
        &ca,
        SystemTime::now(),
    ) {
        Need::Nothing => return Ok(None),
        Need::Key(why) => {
            let k = roam_pki::new_key()?;
            write_atomic(&files.key(), &k, 0o600)?;
            key = Some(k);
            why.to_string()
        }
        Need::Certificate(why) => why,
        Need::Renew => "two thirds of the certificate's life have passed".into(),
    };
    let key = key.unwrap_or_default();
    let cert = request(client, node, &key, wait).await?;
    // what came back must be what was asked for
    match crate::need(node, Some(&key), Some(&cert), &ca, SystemTime::now()) {
        Need::Nothing => {}
        other => {
            return Err(Error::Pki(roam_pki::Error::Certificate(format!(
                "the signed certificate is not usable: {other:?}"
            ))));
        }
    }
    write_atomic(&files.cert(), &cert, 0o644)?;
    Ok(Some(why))
}

/// Whether the identity on disk is usable now (the readiness check): the certificate names
/// `node`, is for the key, was signed by the trusted CA and is valid at this moment.
pub fn check(node: &str, files: &Files) -> std::result::Result<(), String> {
    let get = |p: &Path| {
        read(p)
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("no {}", p.display()))
    };
    let (key, cert, ca) = (get(&files.key())?, get(&files.cert())?, get(&files.ca())?);
    let info = roam_pki::cert_info(&cert).map_err(|e| e.to_string())?;
    let now = SystemTime::now();
    if now < info.not_before || now >= info.not_after {
        return Err("the certificate is not valid now".into());
    }
    match crate::need(node, Some(&key), Some(&cert), &ca, now) {
        // renewal due: the certificate still serves until it ends
        Need::Nothing | Need::Renew => Ok(()),
        Need::Key(why) => Err(why.into()),
        Need::Certificate(why) => Err(why),
    }
}
