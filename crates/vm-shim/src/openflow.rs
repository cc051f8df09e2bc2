//! Just enough OpenFlow 1.0 to hand OVS one frame as if it had come in on a port: `HELLO`,
//! `PACKET_OUT` with `in_port` = that port and one action, output to `OFPP_TABLE` (run it
//! through the flow tables), and a `BARRIER` to know OVS has processed it.
//!
//! What for: a migration target's RARP at the pause. OVN activates a multi-chassis port on a
//! chassis when a RARP comes in on it there; QEMU sends the guest's RARP only once the guest
//! runs on the target (a paused QEMU queues its packets), tens of ms after the pause ends.
//! Sent here at the pause, it switches the network to the target before QEMU resumes the
//! guest. The message encoding is pure and unit-tested; [`packet_in_as_if_from`] does the
//! socket I/O.

use std::path::Path;
use std::time::Duration;

use roam_dhcp_opts::MacAddr;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const VERSION: u8 = 0x01;
const HELLO: u8 = 0;
const ERROR: u8 = 1;
const PACKET_OUT: u8 = 13;
const BARRIER_REQUEST: u8 = 18;
const BARRIER_REPLY: u8 = 19;
/// `OFPP_TABLE`: submit the packet to the first flow table.
const OFPP_TABLE: u16 = 0xfff9;
const NO_BUFFER: u32 = 0xffff_ffff;
/// How long the whole exchange may take.
const TIMEOUT: Duration = Duration::from_secs(2);

fn header(kind: u8, len: usize, xid: u32) -> Vec<u8> {
    let mut h = vec![VERSION, kind];
    h.extend_from_slice(&(len as u16).to_be_bytes());
    h.extend_from_slice(&xid.to_be_bytes());
    h
}

/// `HELLO`.
pub fn hello(xid: u32) -> Vec<u8> {
    header(HELLO, 8, xid)
}

/// `PACKET_OUT` of `frame`, as if received on `in_port`, through the flow tables.
pub fn packet_out(xid: u32, in_port: u16, frame: &[u8]) -> Vec<u8> {
    let len = 8 + 8 + 8 + frame.len();
    let mut m = header(PACKET_OUT, len, xid);
    m.extend_from_slice(&NO_BUFFER.to_be_bytes());
    m.extend_from_slice(&in_port.to_be_bytes());
    m.extend_from_slice(&8u16.to_be_bytes()); // actions_len
    // ofp_action_output: type OUTPUT (0), len 8, port, max_len
    m.extend_from_slice(&0u16.to_be_bytes());
    m.extend_from_slice(&8u16.to_be_bytes());
    m.extend_from_slice(&OFPP_TABLE.to_be_bytes());
    m.extend_from_slice(&0u16.to_be_bytes());
    m.extend_from_slice(frame);
    m
}

/// `BARRIER_REQUEST`.
pub fn barrier(xid: u32) -> Vec<u8> {
    header(BARRIER_REQUEST, 8, xid)
}

/// The RARP request QEMU broadcasts for a NIC with `mac` when a migrated guest lands
/// (`qemu_announce_self`): 60 bytes, padded.
pub fn rarp(mac: &MacAddr) -> Vec<u8> {
    let m = mac.octets();
    let mut f = vec![0xff; 6];
    f.extend_from_slice(&m);
    f.extend_from_slice(&[0x80, 0x35]); // ETH_P_RARP
    f.extend_from_slice(&[0, 1, 8, 0, 6, 4, 0, 3]); // Ethernet, IPv4, 6, 4, reverse request
    f.extend_from_slice(&m);
    f.extend_from_slice(&[0; 4]);
    f.extend_from_slice(&m);
    f.extend_from_slice(&[0; 4]);
    f.resize(60, 0);
    f
}

/// One message's (type, xid) and its total length, from its first 8 bytes.
fn parse_header(h: &[u8; 8]) -> (u8, u16, u32) {
    (
        h[1],
        u16::from_be_bytes([h[2], h[3]]),
        u32::from_be_bytes([h[4], h[5], h[6], h[7]]),
    )
}

/// Hand `frame` to the switch behind the management socket `mgmt` (`<rundir>/<bridge>.mgmt`)
/// as if it came in on OpenFlow port `in_port`, and wait until the switch has processed it.
pub async fn packet_in_as_if_from(mgmt: &Path, in_port: u16, frame: &[u8]) -> Result<(), String> {
    tokio::time::timeout(TIMEOUT, exchange(mgmt, in_port, frame))
        .await
        .map_err(|_| format!("{} did not answer within {TIMEOUT:?}", mgmt.display()))?
}

async fn exchange(mgmt: &Path, in_port: u16, frame: &[u8]) -> Result<(), String> {
    let mut s = tokio::net::UnixStream::connect(mgmt)
        .await
        .map_err(|e| format!("connect to {}: {e}", mgmt.display()))?;
    let mut out = hello(1);
    out.extend(packet_out(2, in_port, frame));
    out.extend(barrier(3));
    s.write_all(&out)
        .await
        .map_err(|e| format!("write to {}: {e}", mgmt.display()))?;
    loop {
        let mut h = [0u8; 8];
        s.read_exact(&mut h)
            .await
            .map_err(|e| format!("read from {}: {e}", mgmt.display()))?;
        let (kind, len, xid) = parse_header(&h);
        let mut body = vec![0u8; (len as usize).saturating_sub(8)];
        s.read_exact(&mut body)
            .await
            .map_err(|e| format!("read from {}: {e}", mgmt.display()))?;
        match kind {
            ERROR => {
                return Err(format!(
                    "{} refused message {xid}: OpenFlow error {:02x?}",
                    mgmt.display(),
                    &body[..body.len().min(4)]
                ));
            }
            BARRIER_REPLY if xid == 3 => return Ok(()),
            // HELLO, echo requests and anything else before the barrier's reply
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_packet_out_carries_the_port_one_output_to_the_table_and_the_frame() {
        let frame = rarp(&"0a:58:64:40:00:05".parse().unwrap());
        let m = packet_out(7, 3, &frame);
        assert_eq!(m.len(), 24 + 60);
        assert_eq!(&m[..8], &[1, 13, 0, 84, 0, 0, 0, 7]);
        assert_eq!(&m[8..12], &[0xff; 4], "no buffer");
        assert_eq!(&m[12..14], &[0, 3], "in_port");
        assert_eq!(&m[14..16], &[0, 8], "actions_len");
        assert_eq!(&m[16..24], &[0, 0, 0, 8, 0xff, 0xf9, 0, 0], "output:TABLE");
        assert_eq!(&m[24..], &frame[..]);
    }

    #[test]
    fn the_rarp_is_what_qemu_sends() {
        let f = rarp(&"0a:58:64:40:00:05".parse().unwrap());
        let mac = [0x0a, 0x58, 0x64, 0x40, 0, 5];
        assert_eq!(f.len(), 60);
        assert_eq!(&f[..6], &[0xff; 6], "broadcast");
        assert_eq!(&f[6..12], &mac, "from the NIC");
        assert_eq!(&f[12..14], &[0x80, 0x35], "RARP");
        assert_eq!(&f[14..22], &[0, 1, 8, 0, 6, 4, 0, 3], "a reverse request");
        assert_eq!(&f[22..28], &mac);
        assert_eq!(&f[32..38], &mac);
        assert!(f[42..].iter().all(|b| *b == 0));
    }

    #[test]
    fn headers_read_back() {
        let b = barrier(9);
        let h: [u8; 8] = b[..8].try_into().unwrap();
        assert_eq!(parse_header(&h), (BARRIER_REQUEST, 8, 9));
        assert_eq!(hello(1), vec![1, 0, 0, 8, 0, 0, 0, 1]);
    }
}
