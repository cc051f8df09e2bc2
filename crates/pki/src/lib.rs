//! roam's own PKI, pure (no I/O): the roam CA, one certificate per node, and the policy that
//! decides which node may have which certificate.
//!
//! How a node gets its certificate: roam-node, on the node, makes a key that never leaves
//! the node and files a Kubernetes CertificateSigningRequest for [`SIGNER_NAME`] with the
//! node's own credential (the kubelet's), so the API server records the requester as
//! `system:node:NAME`, which no other node can claim. roam-controller, which holds the CA
//! (a Secret in `roam-system`), [`review`]s the request: only a node may ask, only for its
//! own name. The certificate it [`Ca::issue`]s takes nothing but the public key from the
//! request: its names (the node's name and addresses, from the Node object) and usages
//! (TLS server and client) are the controller's. A node's certificate therefore names that
//! node only, and a peer that checks the name it expects (`node-b`) refuses another node's.
//!
//! Rotation: a node asks again once two thirds of its certificate's life have passed
//! ([`renewal_due`]), or when the CA it trusts no longer signed it ([`signed_by`]).

mod error;

use std::net::IpAddr;
use std::time::{Duration, SystemTime};

use rcgen::{
    BasicConstraints, CertificateParams, CertificateSigningRequestParams, DistinguishedName,
    DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose, PublicKeyData,
    SanType, SerialNumber,
};
use time::OffsetDateTime;

pub use error::{Error, Result};

/// The `signerName` of roam's node certificates.
pub const SIGNER_NAME: &str = "roam.dev/node";

/// The common name of roam-controller's client certificate for the node API. No node can
/// have it: a Node's name is a DNS subdomain (no `:`), and [`review`] signs only a node's own
/// name.
pub const CONTROLLER_NAME: &str = "system:roam-controller";

/// The Kubernetes user name prefix of a node's credential.
const NODE_USER_PREFIX: &str = "system:node:";
/// The group every node's credential carries.
const NODES_GROUP: &str = "system:nodes";

/// How far back a certificate's validity starts, for clocks a little behind the signer's.
const CLOCK_SKEW: Duration = Duration::from_secs(5 * 60);

/// The roam CA: its certificate and key, as PEM (what the `roam-system` Secret holds).
pub struct Ca {
    cert_pem: String,
    key_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl std::fmt::Debug for Ca {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ca").finish_non_exhaustive()
    }
}

impl Ca {
    /// A new CA (an ECDSA P-256 key), valid from `now` for `validity`.
    pub fn generate(now: SystemTime, validity: Duration) -> Result<Ca> {
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(Error::key)?;
        let mut params = CertificateParams::default();
        params.distinguished_name = name("roam-ca");
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        (params.not_before, params.not_after) = window(now, validity)?;
        params.serial_number = Some(serial()?);
        let cert = params.self_signed(&key).map_err(Error::ca)?;
        Ca::from_pem(&cert.pem(), &key.serialize_pem())
    }

    /// The CA from its PEM certificate and key (e.g. read back from the Secret).
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Ca> {
        let key = KeyPair::from_pem(key_pem).map_err(Error::ca)?;
        let info = cert_info(cert_pem)?;
        if !info.is_ca {
            return Err(Error::Ca(format!(
                "the certificate of {:?} is not a CA certificate",
                info.common_name
            )));
        }
        if info.public_key != key.subject_public_key_info() {
            return Err(Error::Ca(
                "the CA's key does not belong to its certificate".into(),
            ));
        }
        let issuer = Issuer::from_ca_cert_pem(cert_pem, key).map_err(Error::ca)?;
        Ok(Ca {
            cert_pem: cert_pem.to_string(),
            key_pem: key_pem.to_string(),
            issuer,
        })
    }

    /// The CA's certificate (PEM): what peers trust.
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The CA's key (PEM): stays in the Secret.
    pub fn key_pem(&self) -> &str {
        &self.key_pem
    }

    /// The certificate of `node` for the public key of `csr` (reviewed: see [`review`]),
    /// valid from `now` for `validity`, PEM. Only the key comes from the request: the names
    /// (the node's name, and its addresses as IP names) and usages (TLS server and client)
    /// are set here.
    pub fn issue(
        &self,
        csr: &CertificateSigningRequestParams,
        node: &NodeFacts,
        now: SystemTime,
        validity: Duration,
    ) -> Result<String> {
        let mut params = CertificateParams::default();
        params.distinguished_name = name(&node.name);
        params.subject_alt_names = std::iter::once(
            node.name
                .clone()
                .try_into()
                .map(SanType::DnsName)
                .map_err(|e| Error::Certificate(format!("node name {:?}: {e}", node.name))),
        )
        .chain(node.addresses.iter().map(|ip| Ok(SanType::IpAddress(*ip))))
        .collect::<Result<_>>()?;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        params.is_ca = IsCa::ExplicitNoCa;
        params.use_authority_key_identifier_extension = true;
        (params.not_before, params.not_after) = window(now, validity)?;
        params.serial_number = Some(serial()?);
        let cert = params
            .signed_by(&csr.public_key, &self.issuer)
            .map_err(|e| Error::Certificate(e.to_string()))?;
        Ok(cert.pem())
    }
}

impl Ca {
    /// A new key and roam-controller's client certificate ([`CONTROLLER_NAME`], TLS client
    /// only, no names to serve under), valid from `now` for `validity`: the controller,
    /// which holds the CA, issues it to itself for the node API.
    pub fn controller_identity(
        &self,
        now: SystemTime,
        validity: Duration,
    ) -> Result<(String, String)> {
        let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(Error::key)?;
        let mut params = CertificateParams::default();
        params.distinguished_name = name(CONTROLLER_NAME);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.is_ca = IsCa::ExplicitNoCa;
        params.use_authority_key_identifier_extension = true;
        (params.not_before, params.not_after) = window(now, validity)?;
        params.serial_number = Some(serial()?);
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(|e| Error::Certificate(e.to_string()))?;
        Ok((key.serialize_pem(), cert.pem()))
    }
}

/// What a node's certificate names: the node and its addresses (from its Node object).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeFacts {
    /// The node's name.
    pub name: String,
    /// Its addresses (InternalIP, ExternalIP).
    pub addresses: Vec<IpAddr>,
}

/// Who filed a CertificateSigningRequest, as the API server recorded it (`spec.username`,
/// `spec.groups`): the requester cannot choose these.
#[derive(Clone, Copy, Debug)]
pub struct Requester<'a> {
    /// `spec.username`.
    pub username: &'a str,
    /// `spec.groups`.
    pub groups: &'a [String],
}

/// Why a request is refused, in words for the CSR's Denied condition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// A CamelCase reason.
    pub reason: &'static str,
    /// What was wrong.
    pub message: String,
}

fn refuse(reason: &'static str, message: String) -> Refusal {
    Refusal { reason, message }
}

/// Review a request for a node certificate: the PEM `request` filed by `requester`. It must
/// come from a node (`system:node:NAME` in the group `system:nodes`), carry a valid
/// signature (the requester holds the key) and ask for exactly `CN=NAME`, NAME being the
/// requester's own node, which must exist (`node`: its facts, `None` if there is no such
/// Node). Returns the parsed request and the node to [`Ca::issue`] for, or why not.
pub fn review(
    request: &[u8],
    requester: Requester<'_>,
    node: impl FnOnce(&str) -> Option<NodeFacts>,
) -> std::result::Result<(CertificateSigningRequestParams, NodeFacts), Refusal> {
    let Some(asker) = requester.username.strip_prefix(NODE_USER_PREFIX) else {
        return Err(refuse(
            "NotANode",
            format!(
                "{:?} is not a node: only a node's own credential ({NODE_USER_PREFIX}NAME) may ask \
                 for a {SIGNER_NAME} certificate",
                requester.username
            ),
        ));
    };
    if asker.is_empty() || !requester.groups.iter().any(|g| g == NODES_GROUP) {
        return Err(refuse(
            "NotANode",
            format!(
                "{:?} is not in the group {NODES_GROUP}: only a node's own credential may ask \
                 for a {SIGNER_NAME} certificate",
                requester.username
            ),
        ));
    }
    let pem = std::str::from_utf8(request)
        .map_err(|_| refuse("BadRequest", "the request is not PEM text".into()))?;
    let csr = CertificateSigningRequestParams::from_pem(pem).map_err(|e| {
        refuse(
            "BadRequest",
            format!("the request is not a signed PKCS#10 request roam can read: {e}"),
        )
    })?;
    let asked: Vec<String> = csr
        .params
        .distinguished_name
        .iter()
        .map(|(t, v)| match (t, dn_text(v)) {
            (DnType::CommonName, Some(s)) => format!("CN={s}"),
            (t, Some(s)) => format!("{t:?}={s}"),
            (t, None) => format!("{t:?}=(not text)"),
        })
        .collect();
    let cn = csr
        .params
        .distinguished_name
        .get(&DnType::CommonName)
        .and_then(dn_text);
    if asked.len() != 1 || cn != Some(asker) {
        return Err(refuse(
            "NotItsOwnName",
            format!(
                "node {asker} asked for [{}]: a node may ask only for CN={asker}",
                asked.join(", ")
            ),
        ));
    }
    let Some(facts) = node(asker) else {
        return Err(refuse("NoSuchNode", format!("there is no Node {asker}")));
    };
    Ok((csr, facts))
}

/// A key and a certificate of `ca` for `node`, as if the node had asked and the request had
/// passed [`review`] (for tests and tools that need a node identity without a cluster).
pub fn node_identity(
    ca: &Ca,
    node: &NodeFacts,
    now: SystemTime,
    validity: Duration,
) -> Result<(String, String)> {
    let key = new_key()?;
    let request = node_request(&key, &node.name)?;
    let csr = CertificateSigningRequestParams::from_pem(&request)
        .map_err(|e| Error::Certificate(e.to_string()))?;
    let cert = ca.issue(&csr, node, now, validity)?;
    Ok((key, cert))
}

/// A new node key (ECDSA P-256), PKCS#8 PEM.
pub fn new_key() -> Result<String> {
    Ok(KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
        .map_err(Error::key)?
        .serialize_pem())
}

/// The PEM request for `node`'s certificate with `key_pem`: `CN=node`, nothing else (the
/// certificate's names and usages are the signer's to set).
pub fn node_request(key_pem: &str, node: &str) -> Result<String> {
    let key = KeyPair::from_pem(key_pem).map_err(Error::key)?;
    let mut params = CertificateParams::default();
    params.distinguished_name = name(node);
    params
        .serialize_request(&key)
        .and_then(|r| r.pem())
        .map_err(|e| Error::Certificate(format!("request for {node}: {e}")))
}

/// What a certificate says, as far as roam reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertInfo {
    /// The subject's common name.
    pub common_name: Option<String>,
    /// DNS names.
    pub dns_names: Vec<String>,
    /// IP addresses.
    pub ips: Vec<IpAddr>,
    /// Valid from.
    pub not_before: SystemTime,
    /// Valid until.
    pub not_after: SystemTime,
    /// Whether it is a CA certificate.
    pub is_ca: bool,
    /// The subject public key (SubjectPublicKeyInfo, DER).
    pub public_key: Vec<u8>,
}

/// The first certificate of a PEM text.
fn first_der(pem: &str) -> Result<Vec<u8>> {
    let (_, p) = x509_parser::pem::parse_x509_pem(pem.as_bytes())
        .map_err(|e| Error::Certificate(format!("not a PEM certificate: {e}")))?;
    if p.label != "CERTIFICATE" {
        return Err(Error::Certificate(format!(
            "a PEM {:?} block, not a CERTIFICATE",
            p.label
        )));
    }
    Ok(p.contents)
}

fn parsed(der: &[u8]) -> Result<x509_parser::certificate::X509Certificate<'_>> {
    let (_, c) = x509_parser::parse_x509_certificate(der)
        .map_err(|e| Error::Certificate(format!("not an X.509 certificate: {e}")))?;
    Ok(c)
}

/// What the first certificate of `pem` says.
pub fn cert_info(pem: &str) -> Result<CertInfo> {
    let der = first_der(pem)?;
    let c = parsed(&der)?;
    let time = |t: &x509_parser::time::ASN1Time| {
        SystemTime::UNIX_EPOCH
            .checked_add(Duration::from_secs(t.timestamp().max(0) as u64))
            .unwrap_or(SystemTime::UNIX_EPOCH)
    };
    let (mut dns_names, mut ips) = (Vec::new(), Vec::new());
    if let Ok(Some(san)) = c.subject_alternative_name() {
        for n in &san.value.general_names {
            match n {
                x509_parser::extensions::GeneralName::DNSName(d) => dns_names.push(d.to_string()),
                x509_parser::extensions::GeneralName::IPAddress(b) => match b.len() {
                    4 => ips.push(IpAddr::from(<[u8; 4]>::try_from(*b).unwrap_or_default())),
                    16 => ips.push(IpAddr::from(<[u8; 16]>::try_from(*b).unwrap_or_default())),
                    _ => {}
                },
                _ => {}
            }
        }
    }
    Ok(CertInfo {
        common_name: c
            .subject()
            .iter_common_name()
            .next()
            .and_then(|a| a.as_str().ok())
            .map(str::to_string),
        dns_names,
        ips,
        not_before: time(&c.validity().not_before),
        not_after: time(&c.validity().not_after),
        is_ca: c.is_ca(),
        public_key: c.public_key().raw.to_vec(),
    })
}

/// The subject's common name of a DER certificate (e.g. the client certificate a TLS
/// server verified), if it has one as text.
pub fn common_name_der(der: &[u8]) -> Option<String> {
    let c = parsed(der).ok()?;
    c.subject()
        .iter_common_name()
        .next()
        .and_then(|a| a.as_str().ok())
        .map(str::to_string)
}

/// Whether the first certificate of `cert_pem` is signed by one of the certificates of
/// `ca_bundle_pem`.
pub fn signed_by(cert_pem: &str, ca_bundle_pem: &str) -> bool {
    let Ok(der) = first_der(cert_pem) else {
        return false;
    };
    let Ok(cert) = parsed(&der) else {
        return false;
    };
    x509_parser::pem::Pem::iter_from_buffer(ca_bundle_pem.as_bytes())
        .filter_map(std::result::Result::ok)
        .any(|ca| {
            parsed(&ca.contents).is_ok_and(|ca| {
                ca.is_ca()
                    && ca.subject() == cert.issuer()
                    && cert.verify_signature(Some(ca.public_key())).is_ok()
            })
        })
}

/// Whether `cert_pem`'s public key is `key_pem`'s.
pub fn key_matches(cert_pem: &str, key_pem: &str) -> bool {
    match (cert_info(cert_pem), KeyPair::from_pem(key_pem)) {
        (Ok(info), Ok(key)) => info.public_key == key.subject_public_key_info(),
        _ => false,
    }
}

/// Whether a certificate valid from `not_before` to `not_after` is due for renewal at
/// `now`: two thirds of its life have passed (or it is expired, or not valid yet by more
/// than the clock skew allowed at issue).
pub fn renewal_due(not_before: SystemTime, not_after: SystemTime, now: SystemTime) -> bool {
    let Ok(life) = not_after.duration_since(not_before) else {
        return true;
    };
    let renew_at = not_before + life * 2 / 3;
    now >= renew_at || now + CLOCK_SKEW * 2 < not_before
}

/// A name's value as text, for the string types a CN comes in.
fn dn_text(v: &rcgen::DnValue) -> Option<&str> {
    match v {
        rcgen::DnValue::Utf8String(s) => Some(s),
        rcgen::DnValue::PrintableString(s) => Some(s.as_str()),
        rcgen::DnValue::Ia5String(s) => Some(s.as_str()),
        _ => None,
    }
}

fn name(cn: &str) -> DistinguishedName {
    let mut n = DistinguishedName::new();
    n.push(DnType::CommonName, cn);
    n
}

fn window(now: SystemTime, validity: Duration) -> Result<(OffsetDateTime, OffsetDateTime)> {
    if validity < Duration::from_secs(60) {
        return Err(Error::Certificate(format!(
            "a validity of {validity:?} is too short: give at least a minute"
        )));
    }
    let from = OffsetDateTime::from(now - CLOCK_SKEW);
    let until = OffsetDateTime::from(now + validity);
    Ok((from, until))
}

/// A random 16-byte serial number (positive: the top bit clear).
fn serial() -> Result<SerialNumber> {
    use ring::rand::SecureRandom;
    let mut b = [0u8; 16];
    ring::rand::SystemRandom::new()
        .fill(&mut b)
        .map_err(|_| Error::Key("the system's random source failed".into()))?;
    b[0] &= 0x7f;
    b[0] |= 0x01;
    Ok(SerialNumber::from_slice(&b))
}

#[cfg(test)]
mod tests;
