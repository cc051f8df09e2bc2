//! roam-node, the node agent (a DaemonSet in `roam-system`). Today it gives its node an
//! identity: a key that never leaves the node and a certificate of the roam CA naming the
//! node, asked for with the node's own credential (the kubelet's) so that no other node can
//! ask for it, and renewed after two thirds of its life or when the CA changes. The peers of
//! a node (roam-controller, the other nodes) check that name. The privileged work of a VM
//! (libvirt and QEMU, its tap and OVS port, the migration transport) is its runner's, a pod
//! per VM in roam-system, not this agent's.
//!
//! [`need`] decides, from what is on disk, whether a new key or certificate is needed
//! (pure); [`identity`] does the I/O.

mod error;
pub mod identity;

use std::time::SystemTime;

pub use error::{Error, Result};

/// What the node's identity needs, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Need {
    /// Key and certificate are good.
    Nothing,
    /// A new key (none, or unreadable), then a certificate for it.
    Key(&'static str),
    /// A new certificate for the key.
    Certificate(String),
    /// A new certificate soon: two thirds of this one's life have passed (it still serves).
    Renew,
}

/// What the node's identity needs: `key`, `cert` (PEM, if present) and the CA bundle the node
/// trusts, for node `node` at `now`.
pub fn need(
    node: &str,
    key: Option<&str>,
    cert: Option<&str>,
    ca_bundle: &str,
    now: SystemTime,
) -> Need {
    let Some(key) = key else {
        return Need::Key("no key yet");
    };
    if roam_pki::node_request(key, node).is_err() {
        return Need::Key("the key on disk is unreadable");
    }
    let Some(cert) = cert else {
        return Need::Certificate("no certificate yet".into());
    };
    let info = match roam_pki::cert_info(cert) {
        Ok(i) => i,
        Err(e) => return Need::Certificate(format!("the certificate on disk is unreadable: {e}")),
    };
    if info.common_name.as_deref() != Some(node) {
        return Need::Certificate(format!(
            "the certificate names {:?}, not {node}",
            info.common_name
        ));
    }
    if !roam_pki::key_matches(cert, key) {
        return Need::Certificate("the certificate is not for the key on disk".into());
    }
    if !roam_pki::signed_by(cert, ca_bundle) {
        return Need::Certificate("the roam CA did not sign the certificate (a new CA?)".into());
    }
    if roam_pki::renewal_due(info.not_before, info.not_after, now) {
        return Need::Renew;
    }
    Need::Nothing
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A key and certificate `ca` issued for `node` (valid a day from `now`).
    fn issued(ca: &roam_pki::Ca, node: &str, now: SystemTime) -> (String, String) {
        let facts = roam_pki::NodeFacts {
            name: node.into(),
            addresses: vec![],
        };
        roam_pki::node_identity(ca, &facts, now, Duration::from_secs(24 * 3600)).unwrap()
    }

    #[test]
    fn what_the_identity_needs() {
        let now = SystemTime::now();
        let ca = roam_pki::Ca::generate(now, Duration::from_secs(365 * 24 * 3600)).unwrap();
        let (key, cert) = issued(&ca, "node-a", now);
        let ca_pem = ca.cert_pem();
        assert_eq!(
            need("node-a", Some(&key), Some(&cert), ca_pem, now),
            Need::Nothing
        );
        assert!(matches!(
            need("node-a", None, Some(&cert), ca_pem, now),
            Need::Key(_)
        ));
        assert!(matches!(
            need("node-a", Some("junk"), Some(&cert), ca_pem, now),
            Need::Key(_)
        ));
        let why = |key: &str, cert: Option<&str>, ca: &str, at: SystemTime| match need(
            "node-a",
            Some(key),
            cert,
            ca,
            at,
        ) {
            Need::Certificate(w) => w,
            other => panic!("{other:?}"),
        };
        assert!(why(&key, None, ca_pem, now).contains("no certificate"));
        assert!(why(&key, Some("junk"), ca_pem, now).contains("unreadable"));
        let (_, b_cert) = issued(&ca, "node-b", now);
        assert!(why(&key, Some(&b_cert), ca_pem, now).contains("names"));
        let other_key = roam_pki::new_key().unwrap();
        assert!(why(&other_key, Some(&cert), ca_pem, now).contains("not for the key"));
        let new_ca = roam_pki::Ca::generate(now, Duration::from_secs(3600)).unwrap();
        assert!(why(&key, Some(&cert), new_ca.cert_pem(), now).contains("CA"));
        // a bundle of the new and the old CA still trusts it
        let bundle = format!("{}{}", new_ca.cert_pem(), ca_pem);
        assert_eq!(
            need("node-a", Some(&key), Some(&cert), &bundle, now),
            Need::Nothing
        );
        let later = now + Duration::from_secs(17 * 3600);
        assert_eq!(
            need("node-a", Some(&key), Some(&cert), ca_pem, later),
            Need::Renew
        );
    }
}
