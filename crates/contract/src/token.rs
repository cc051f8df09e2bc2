//! The VM's API token as a shim checks it: its SHA-256 digest.
//!
//! A shim never needs the token itself — it only checks what a caller presents — so it can be
//! given the digest (`--token-sha256`) instead of a token file. The controller does exactly
//! that: the launcher pod carries the digest on its command line and mounts no Secret, so the
//! target pod's start never waits on the kubelet fetching one (a new pod's Secret is refused by
//! the API server's node authorizer until it learns the pod is on that node, then retried
//! later). The token is 192 random bits, so its digest, readable by whoever may read the pod,
//! gives nothing away.

use std::fmt;

use ring::digest::{SHA256, SHA256_OUTPUT_LEN, digest};
use subtle::ConstantTimeEq;

/// The SHA-256 digest of a VM's API token.
#[derive(Clone, PartialEq, Eq)]
pub struct TokenDigest([u8; SHA256_OUTPUT_LEN]);

impl TokenDigest {
    /// The digest of `token` (as sent in `Authorization: Bearer <token>`).
    pub fn of(token: &str) -> TokenDigest {
        let d = digest(&SHA256, token.as_bytes());
        let mut out = [0u8; SHA256_OUTPUT_LEN];
        out.copy_from_slice(d.as_ref());
        TokenDigest(out)
    }

    /// A digest written as 64 hexadecimal digits (either case).
    pub fn parse_hex(text: &str) -> Result<TokenDigest, String> {
        let t = text.trim();
        if t.len() != 2 * SHA256_OUTPUT_LEN || !t.is_ascii() {
            return Err(format!(
                "{t:?} is not a SHA-256 digest: give 64 hexadecimal digits (sha256sum of the token)"
            ));
        }
        if let Some(c) = t.chars().find(|c| !c.is_ascii_hexdigit()) {
            return Err(format!(
                "{t:?} is not a SHA-256 digest: {c:?} is not a hexadecimal digit"
            ));
        }
        let mut out = [0u8; SHA256_OUTPUT_LEN];
        for (i, b) in out.iter_mut().enumerate() {
            *b = u8::from_str_radix(&t[2 * i..2 * i + 2], 16).expect("two hexadecimal digits");
        }
        Ok(TokenDigest(out))
    }

    /// Whether `given` is the token of this digest. The digests are compared in constant
    /// time; an empty token never matches.
    pub fn matches(&self, given: &str) -> bool {
        !given.is_empty() && bool::from(TokenDigest::of(given).0.ct_eq(&self.0))
    }
}

impl fmt::Display for TokenDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

/// Not the digest itself: a log line or a panic message has no use for it.
impl fmt::Debug for TokenDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TokenDigest(..)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_digest() {
        // sha256sum of "abc" (FIPS 180-2, appendix B.1)
        let d = TokenDigest::of("abc");
        assert_eq!(
            d.to_string(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(TokenDigest::parse_hex(&d.to_string().to_uppercase()), Ok(d));
    }

    #[test]
    fn matches_only_its_token() {
        let d = TokenDigest::of("s3cret");
        assert!(d.matches("s3cret"));
        assert!(!d.matches("s3creT"));
        assert!(!d.matches("s3cre"));
        assert!(!d.matches(""));
        assert!(!TokenDigest::of("").matches(""));
    }

    #[test]
    fn bad_hex_is_refused_with_the_reason() {
        assert!(
            TokenDigest::parse_hex("abc")
                .unwrap_err()
                .contains("64 hexadecimal")
        );
        let g = "g".repeat(64);
        assert!(
            TokenDigest::parse_hex(&g)
                .unwrap_err()
                .contains("not a hexadecimal digit")
        );
        // from_str_radix takes a sign; a digest has none
        let signed = format!("+f{}", "0".repeat(62));
        assert!(TokenDigest::parse_hex(&signed).is_err());
        let wide = "é".repeat(32);
        assert!(TokenDigest::parse_hex(&wide).is_err());
        assert_eq!(format!("{:?}", TokenDigest::of("x")), "TokenDigest(..)");
    }
}
