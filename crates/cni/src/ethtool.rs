//! Turning off a pod interface's transmit offloads (checksum, segmentation) through the
//! kernel's ethtool generic-netlink family (`ETHTOOL_MSG_FEATURES_SET`, Linux ≥ 5.6) — what
//! `ethtool -K eth0 tx off gso off tso off` does, without the tool and without an ioctl.
//!
//! Why: OVS's userspace datapath (`datapath_type=netdev`) reads a veth through a
//! packet socket and gets the pod's packets as the kernel handed them to the veth: with a
//! partial checksum and, for TCP, as one large GSO frame. ICMP passes, TCP stalls. With the
//! offloads off, the pod's kernel sends finished, MTU-sized frames. The kernel datapath needs
//! none of this; roam-cni does it when the bridge's datapath is `netdev`.
//!
//! The message encoding and reply parsing are pure functions (unit-tested); [`disable_tx_offloads`]
//! is the thin adapter (a blocking generic-netlink socket in the pod's namespace).

use netlink_sys::{Socket, protocols::NETLINK_GENERIC};

use crate::error::{Error, Result};

/// The features `ethtool -K IF tx off gso off tso off` turns off on a veth.
pub const TX_OFFLOADS: &[&str] = &[
    "tx-checksum-ip-generic",
    "tx-checksum-sctp",
    "tx-generic-segmentation",
    "tx-tcp-segmentation",
    "tx-tcp-ecn-segmentation",
    "tx-tcp-mangleid-segmentation",
    "tx-tcp6-segmentation",
];

const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLMSG_ERROR: u16 = 0x2;
const NLMSG_DONE: u16 = 0x3;
const NLA_F_NESTED: u16 = 0x8000;
const GENL_ID_CTRL: u16 = 0x10;
const CTRL_CMD_GETFAMILY: u8 = 3;
const CTRL_ATTR_FAMILY_ID: u16 = 1;
const CTRL_ATTR_FAMILY_NAME: u16 = 2;
const ETHTOOL_GENL_VERSION: u8 = 1;
const ETHTOOL_MSG_FEATURES_SET: u8 = 12;
const ETHTOOL_A_FEATURES_HEADER: u16 = 1;
const ETHTOOL_A_FEATURES_WANTED: u16 = 3;
const ETHTOOL_A_HEADER_DEV_NAME: u16 = 2;
const ETHTOOL_A_HEADER_FLAGS: u16 = 3;
const ETHTOOL_FLAG_OMIT_REPLY: u32 = 1 << 1;
const ETHTOOL_A_BITSET_BITS: u16 = 3;
const ETHTOOL_A_BITSET_BITS_BIT: u16 = 1;
const ETHTOOL_A_BITSET_BIT_NAME: u16 = 2;

fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// A netlink attribute: length, type, payload, padded to 4 bytes.
fn nla(kind: u16, payload: &[u8]) -> Vec<u8> {
    let len = 4 + payload.len();
    let mut v = Vec::with_capacity(align4(len));
    v.extend_from_slice(&(len as u16).to_ne_bytes());
    v.extend_from_slice(&kind.to_ne_bytes());
    v.extend_from_slice(payload);
    v.resize(align4(len), 0);
    v
}

fn nest(kind: u16, children: &[u8]) -> Vec<u8> {
    nla(kind | NLA_F_NESTED, children)
}

fn cstr(s: &str) -> Vec<u8> {
    let mut v = s.as_bytes().to_vec();
    v.push(0);
    v
}

/// A generic netlink request: nlmsghdr + genlmsghdr + attributes.
fn genl(family: u16, seq: u32, cmd: u8, version: u8, attrs: &[u8]) -> Vec<u8> {
    let len = 16 + 4 + attrs.len();
    let mut v = Vec::with_capacity(len);
    v.extend_from_slice(&(len as u32).to_ne_bytes());
    v.extend_from_slice(&family.to_ne_bytes());
    v.extend_from_slice(&(NLM_F_REQUEST | NLM_F_ACK).to_ne_bytes());
    v.extend_from_slice(&seq.to_ne_bytes());
    v.extend_from_slice(&0u32.to_ne_bytes());
    v.extend_from_slice(&[cmd, version, 0, 0]);
    v.extend_from_slice(attrs);
    v
}

/// `CTRL_CMD_GETFAMILY` for the `ethtool` family.
pub fn family_request(seq: u32) -> Vec<u8> {
    genl(
        GENL_ID_CTRL,
        seq,
        CTRL_CMD_GETFAMILY,
        1,
        &nla(CTRL_ATTR_FAMILY_NAME, &cstr("ethtool")),
    )
}

/// `ETHTOOL_MSG_FEATURES_SET` turning `features` off on `ifname` (the bits listed without a
/// value, no `NOMASK`: only these change).
pub fn features_off_request(family: u16, seq: u32, ifname: &str, features: &[&str]) -> Vec<u8> {
    let mut header = nla(ETHTOOL_A_HEADER_DEV_NAME, &cstr(ifname));
    header.extend(nla(
        ETHTOOL_A_HEADER_FLAGS,
        &ETHTOOL_FLAG_OMIT_REPLY.to_ne_bytes(),
    ));
    let bits: Vec<u8> = features
        .iter()
        .flat_map(|f| {
            nest(
                ETHTOOL_A_BITSET_BITS_BIT,
                &nla(ETHTOOL_A_BITSET_BIT_NAME, &cstr(f)),
            )
        })
        .collect();
    let mut attrs = nest(ETHTOOL_A_FEATURES_HEADER, &header);
    attrs.extend(nest(
        ETHTOOL_A_FEATURES_WANTED,
        &nest(ETHTOOL_A_BITSET_BITS, &bits),
    ));
    genl(
        family,
        seq,
        ETHTOOL_MSG_FEATURES_SET,
        ETHTOOL_GENL_VERSION,
        &attrs,
    )
}

/// What the kernel answered to request `seq`.
#[derive(Debug, PartialEq, Eq)]
pub enum Reply {
    /// The ACK (error 0).
    Ack,
    /// An error, as a negative errno.
    Error(i32),
    /// The controller's answer: the family's id.
    Family(u16),
    /// Nothing about `seq` in this datagram.
    Nothing,
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// Parse one datagram of netlink messages for what concerns request `seq`.
pub fn parse_reply(buf: &[u8], seq: u32) -> Reply {
    let mut at = 0;
    while at + 16 <= buf.len() {
        let (Some(len), Some(kind), Some(mseq)) =
            (u32_at(buf, at), u16_at(buf, at + 4), u32_at(buf, at + 8))
        else {
            break;
        };
        let len = len as usize;
        if len < 16 || at + len > buf.len() {
            break;
        }
        let msg = &buf[at..at + len];
        if mseq == seq {
            match kind {
                NLMSG_ERROR => {
                    let code = u32_at(msg, 16).map(|c| c as i32).unwrap_or(-1);
                    return if code == 0 {
                        Reply::Ack
                    } else {
                        Reply::Error(code)
                    };
                }
                NLMSG_DONE => {}
                GENL_ID_CTRL => {
                    // attributes after nlmsghdr (16) + genlmsghdr (4)
                    let mut a = 20;
                    while a + 4 <= msg.len() {
                        let (Some(alen), Some(akind)) = (u16_at(msg, a), u16_at(msg, a + 2)) else {
                            break;
                        };
                        if alen < 4 {
                            break;
                        }
                        if akind & !NLA_F_NESTED == CTRL_ATTR_FAMILY_ID
                            && let Some(id) = u16_at(msg, a + 4)
                        {
                            return Reply::Family(id);
                        }
                        a += align4(alen as usize);
                    }
                }
                _ => {}
            }
        }
        at += align4(len);
    }
    Reply::Nothing
}

fn exchange(sock: &Socket, request: &[u8], seq: u32, what: &str) -> Result<Reply> {
    let fail = |reason: String| Error::Netlink {
        action: what.into(),
        reason,
    };
    sock.send(request, 0).map_err(|e| fail(e.to_string()))?;
    loop {
        let (buf, _) = sock.recv_from_full().map_err(|e| fail(e.to_string()))?;
        match parse_reply(&buf, seq) {
            Reply::Nothing => continue,
            Reply::Error(code) => {
                return Err(fail(std::io::Error::from_raw_os_error(-code).to_string()));
            }
            r => return Ok(r),
        }
    }
}

/// A generic-netlink socket (create it inside the namespace it is for).
pub fn socket() -> Result<Socket> {
    let mut sock = Socket::new(NETLINK_GENERIC).map_err(|e| Error::Netlink {
        action: "open a generic netlink socket".into(),
        reason: e.to_string(),
    })?;
    sock.bind_auto().map_err(|e| Error::Netlink {
        action: "bind a generic netlink socket".into(),
        reason: e.to_string(),
    })?;
    Ok(sock)
}

/// Turn [`TX_OFFLOADS`] off on `ifname`, through `sock` (a socket of the interface's namespace).
pub fn disable_tx_offloads(sock: &Socket, ifname: &str) -> Result<()> {
    let family = match exchange(
        sock,
        &family_request(1),
        1,
        "find the ethtool netlink family",
    )? {
        Reply::Family(id) => id,
        _ => {
            // the ACK came without the family: the kernel has no ethtool netlink (< 5.6)
            return Err(Error::Netlink {
                action: "find the ethtool netlink family".into(),
                reason: "not offered by this kernel (Linux 5.6 or later has it)".into(),
            });
        }
    };
    let request = features_off_request(family, 2, ifname, TX_OFFLOADS);
    exchange(
        sock,
        &request,
        2,
        &format!("turn transmit offloads off on {ifname}"),
    )
    .map(|_| ())
}
