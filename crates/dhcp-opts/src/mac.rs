//! The DHCP server's Ethernet address (`server_mac`).

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

/// A 48-bit Ethernet MAC address, written `0a:00:00:00:00:01` (lowercase).
///
/// Parsing accepts upper- or lowercase hex but insists on six two-digit
/// octets separated by `:`, the form OVN's `server_mac` option uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MacAddr([u8; 6]);

impl MacAddr {
    /// The MAC with these six octets.
    pub const fn new(octets: [u8; 6]) -> Self {
        Self(octets)
    }

    /// The six octets.
    pub const fn octets(self) -> [u8; 6] {
        self.0
    }

    /// Whether the group bit (lowest bit of the first octet) is set.
    /// Broadcast `ff:ff:ff:ff:ff:ff` is multicast too.
    pub const fn is_multicast(self) -> bool {
        self.0[0] & 0x01 != 0
    }

    /// Whether this is `ff:ff:ff:ff:ff:ff`.
    pub const fn is_broadcast(self) -> bool {
        matches!(self.0, [0xff, 0xff, 0xff, 0xff, 0xff, 0xff])
    }

    /// Whether this is `00:00:00:00:00:00`.
    pub const fn is_zero(self) -> bool {
        matches!(self.0, [0, 0, 0, 0, 0, 0])
    }
}

impl From<[u8; 6]> for MacAddr {
    fn from(octets: [u8; 6]) -> Self {
        Self(octets)
    }
}

impl From<MacAddr> for [u8; 6] {
    fn from(mac: MacAddr) -> Self {
        mac.0
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c, d, e, g] = self.0;
        write!(f, "{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{g:02x}")
    }
}

impl FromStr for MacAddr {
    type Err = Error;

    fn from_str(input: &str) -> Result<Self> {
        let invalid = |problem: String| Error::InvalidMac {
            input: input.to_owned(),
            problem,
        };
        let parts: Vec<&str> = input.split(':').collect();
        if parts.len() != 6 {
            return Err(invalid(format!(
                "found {} ':'-separated fields, expected 6",
                parts.len()
            )));
        }
        let mut octets = [0u8; 6];
        for (i, (part, octet)) in parts.iter().zip(octets.iter_mut()).enumerate() {
            if part.len() != 2 || !part.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(invalid(format!(
                    "octet {} ({part:?}) is not two hex digits",
                    i + 1
                )));
            }
            *octet = u8::from_str_radix(part, 16)
                .map_err(|_| invalid(format!("octet {} ({part:?}) is not hex", i + 1)))?;
        }
        Ok(Self(octets))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_displays_lowercase() {
        let mac: MacAddr = "0A:00:00:00:00:01".parse().unwrap();
        assert_eq!(mac, MacAddr::new([0x0a, 0, 0, 0, 0, 1]));
        assert_eq!(mac.to_string(), "0a:00:00:00:00:01");
        let mac: MacAddr = "de:ad:be:ef:00:ff".parse().unwrap();
        assert_eq!(mac.to_string(), "de:ad:be:ef:00:ff");
        assert_eq!(<[u8; 6]>::from(mac), mac.octets());
        assert_eq!(MacAddr::from(mac.octets()), mac);
    }

    #[test]
    fn classifies() {
        let unicast = MacAddr::new([0x0a, 0, 0, 0, 0, 1]);
        assert!(!unicast.is_multicast() && !unicast.is_broadcast() && !unicast.is_zero());
        let multicast = MacAddr::new([0x01, 0x00, 0x5e, 0, 0, 1]);
        assert!(multicast.is_multicast() && !multicast.is_broadcast());
        let broadcast = MacAddr::new([0xff; 6]);
        assert!(broadcast.is_multicast() && broadcast.is_broadcast());
        assert!(MacAddr::new([0; 6]).is_zero());
    }

    fn problem(input: &str) -> String {
        match input.parse::<MacAddr>() {
            Err(Error::InvalidMac {
                input: got,
                problem,
            }) => {
                assert_eq!(got, input);
                problem
            }
            other => panic!("{input:?} parsed as {other:?}"),
        }
    }

    #[test]
    fn rejects_malformed() {
        assert_eq!(problem(""), "found 1 ':'-separated fields, expected 6");
        assert_eq!(
            problem("0a:00:00:00:00"),
            "found 5 ':'-separated fields, expected 6"
        );
        assert_eq!(
            problem("0a:00:00:00:00:01:02"),
            "found 7 ':'-separated fields, expected 6"
        );
        assert_eq!(
            problem("0a-00-00-00-00-01"),
            "found 1 ':'-separated fields, expected 6"
        );
        assert_eq!(
            problem("a:00:00:00:00:01"),
            "octet 1 (\"a\") is not two hex digits"
        );
        assert_eq!(
            problem("0a:00:00:0g:00:01"),
            "octet 4 (\"0g\") is not two hex digits"
        );
        assert_eq!(
            problem("0a:00:00:00:00:+1"),
            "octet 6 (\"+1\") is not two hex digits"
        );
        assert_eq!(
            problem("0a:00:00:00:00:001"),
            "octet 6 (\"001\") is not two hex digits"
        );
        let msg = "zz".parse::<MacAddr>().unwrap_err().to_string();
        assert!(msg.contains("like 0a:00:00:00:00:01"), "{msg}");
    }
}
