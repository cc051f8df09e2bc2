//! The contract between roam's controller, CNI plugin and shim: the keys they agree on
//! ([`keys`]), the pod annotations they exchange ([`annotation`]), the QoS classes an
//! interface may ask for ([`qos`]) and the MAC an address gets ([`mac_for_ip`]); how
//! roam's daemons read their flags ([`flags`]); the digest of a VM's API token ([`token`]).
//! Plain data, no I/O.
#![warn(missing_docs)]

use std::net::Ipv4Addr;

use roam_dhcp_opts::MacAddr;

pub mod annotation;
pub mod flags;
pub mod keys;
pub mod owner;
pub mod qos;
pub mod token;

/// roam-shim's exit status when it refused its configuration (a bad flag, a boot file that
/// is not there, a corrupt state file) before it touched anything: no tap, no OVS port, no
/// domain (sysexits' `EX_CONFIG`). Any other failure exits 1. The controller reads it from a
/// launcher's last exit.
pub const EXIT_REFUSED_CONFIG: i32 = 78;

/// A locally administered, unicast MAC derived from the IP (`0a:58:` + the IP's octets, as
/// OVN-Kubernetes does): unique within a network because IPs are, and stable, so an address
/// object re-created for the same IP gets the same MAC.
pub fn mac_for_ip(ip: Ipv4Addr) -> MacAddr {
    let [a, b, c, d] = ip.octets();
    MacAddr::new([0x0a, 0x58, a, b, c, d])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macs_are_locally_administered_unicast_and_unique_per_ip() {
        let m = mac_for_ip("100.64.1.10".parse().unwrap());
        assert_eq!(m.to_string(), "0a:58:64:40:01:0a");
        assert!(!m.is_multicast());
        assert_eq!(m.octets()[0] & 0x02, 0x02, "locally administered bit");
        assert_ne!(m, mac_for_ip("100.64.1.11".parse().unwrap()));
    }
}
