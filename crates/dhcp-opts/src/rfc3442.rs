//! RFC 3442 classless static routes: the option 121 (and Microsoft option
//! 249) payload, and OVN's string form of the same list.
//!
//! Each route is one descriptor: a width octet (the destination prefix
//! length, 0..=32), then only the significant octets of the destination,
//! `ceil(width / 8)` of them, then the four octets of the router (`0.0.0.0`
//! for an on-link route).
//!
//! ```
//! use std::net::Ipv4Addr;
//! use roam_dhcp_opts::{Route, rfc3442};
//!
//! let routes = [
//!     Route::host_on_link(Ipv4Addr::new(10, 244, 0, 1)),
//!     Route::from_parts(Ipv4Addr::UNSPECIFIED, 0, Ipv4Addr::new(10, 244, 0, 1))?,
//! ];
//! let bytes = rfc3442::encode(&routes);
//! assert_eq!(bytes, [32, 10, 244, 0, 1, 0, 0, 0, 0, 0, 10, 244, 0, 1]);
//! assert_eq!(rfc3442::decode(&bytes)?, routes);
//! assert_eq!(
//!     rfc3442::format_ovn(&routes),
//!     "{10.244.0.1/32,0.0.0.0, 0.0.0.0/0,10.244.0.1}"
//! );
//! # Ok::<(), roam_dhcp_opts::Error>(())
//! ```
//!
//! # Length
//!
//! A DHCP option carries at most [`MAX_OPTION_LEN`] bytes. RFC 3396 lets a
//! server split a longer value over several options, but OVN does not: it
//! writes the option length into one octet, which wraps. The codec here
//! neither limits nor splits (use [`encoded_len`] to check), while
//! [`Lease`](crate::Lease) refuses routes longer than [`MAX_OPTION_LEN`].

use std::fmt::Write as _;
use std::net::Ipv4Addr;

use crate::error::{Error, Result};
use crate::ovn;
use crate::route::Route;

/// DHCP option code for classless static routes (RFC 3442).
pub const OPTION_CLASSLESS_STATIC_ROUTE: u8 = 121;

/// DHCP option code Microsoft clients read the same routes from.
pub const OPTION_MS_CLASSLESS_STATIC_ROUTE: u8 = 249;

/// The most bytes one DHCP option can carry.
pub const MAX_OPTION_LEN: usize = 255;

/// The encoded length of `routes`: the sum of `1 + ceil(width / 8) + 4`.
pub fn encoded_len(routes: &[Route]) -> usize {
    routes.iter().map(Route::encoded_len).sum()
}

/// The option 121 / 249 payload for `routes`, in order, without the option
/// code and length octets. Not limited to [`MAX_OPTION_LEN`].
pub fn encode(routes: &[Route]) -> Vec<u8> {
    let mut out = Vec::with_capacity(encoded_len(routes));
    for route in routes {
        let dest = route.dest();
        out.push(dest.prefix_len());
        out.extend_from_slice(&dest.addr().octets()[..route.significant_octets()]);
        out.extend_from_slice(&route.gateway().octets());
    }
    out
}

/// The routes in an option 121 / 249 payload (empty input is zero routes).
///
/// Fails with [`Error::Rfc3442WidthTooLarge`] for a width over 32,
/// [`Error::Rfc3442Truncated`] for a descriptor running past the end, and
/// [`Error::Rfc3442InvalidRoute`] for a descriptor whose destination has
/// bits set beyond its width (RFC 3442 §2) or whose router is multicast,
/// broadcast or loopback. Errors give the descriptor's byte offset.
///
/// A successful decode re-encodes to exactly the same bytes.
pub fn decode(bytes: &[u8]) -> Result<Vec<Route>> {
    let mut routes = Vec::new();
    let mut offset = 0;
    while let Some(&width) = bytes.get(offset) {
        if width > 32 {
            return Err(Error::Rfc3442WidthTooLarge { offset, width });
        }
        let significant = usize::from(width).div_ceil(8);
        let needed = 1 + significant + 4;
        let available = bytes.len() - offset;
        let Some(descriptor) = bytes.get(offset..offset + needed) else {
            return Err(Error::Rfc3442Truncated {
                offset,
                width,
                needed,
                available,
            });
        };
        let mut dest = [0u8; 4];
        dest[..significant].copy_from_slice(&descriptor[1..1 + significant]);
        let mut gateway = [0u8; 4];
        gateway.copy_from_slice(&descriptor[1 + significant..]);
        let route = Route::from_parts(Ipv4Addr::from(dest), width, Ipv4Addr::from(gateway))
            .map_err(|error| Error::Rfc3442InvalidRoute {
                offset,
                error: Box::new(error),
            })?;
        routes.push(route);
        offset += needed;
    }
    Ok(routes)
}

/// OVN's string form of `routes`, as the `classless_static_route` and
/// `ms_classless_static_route` options take it:
/// `{10.244.0.1/32,0.0.0.0, 0.0.0.0/0,10.244.0.1}`. Zero routes give `{}`.
pub fn format_ovn(routes: &[Route]) -> String {
    let mut out = String::from("{");
    for (i, route) in routes.iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        // Writing to a String cannot fail.
        let _ = write!(out, "{},{}", route.dest(), route.gateway());
    }
    out.push('}');
    out
}

/// The routes in OVN's string form, as [`format_ovn`] writes it.
///
/// As OVN's own parser, this takes `destination, gateway` pairs separated
/// by commas and/or whitespace inside `{...}`; a destination without
/// `/len` is a /32. Errors name the offending token.
pub fn parse_ovn(value: &str) -> Result<Vec<Route>> {
    parse_ovn_option(ovn::CLASSLESS_STATIC_ROUTE, value)
}

/// [`parse_ovn`], naming `option` in errors.
pub(crate) fn parse_ovn_option(option: &'static str, value: &str) -> Result<Vec<Route>> {
    let tokens = ovn::split_set(option, value)?;
    let mut routes = Vec::with_capacity(tokens.len() / 2);
    let mut pairs = tokens.chunks_exact(2);
    for pair in pairs.by_ref() {
        let (dest, gateway) = (pair[0], pair[1]);
        let (addr, prefix_len) = parse_dest(option, dest)?;
        let gateway_addr = ovn::parse_addr(option, gateway)?;
        let route = Route::from_parts(addr, prefix_len, gateway_addr).map_err(|e| {
            Error::InvalidOvnValue {
                option,
                token: format!("{dest},{gateway}"),
                problem: format!("is not a valid route: {e}"),
            }
        })?;
        routes.push(route);
    }
    if let [dest] = pairs.remainder() {
        return Err(Error::InvalidOvnValue {
            option,
            token: (*dest).to_owned(),
            problem: "has no gateway; entries are \"destination/len,gateway\" pairs, with \
                      gateway 0.0.0.0 for on-link"
                .to_owned(),
        });
    }
    Ok(routes)
}

/// `a.b.c.d/len` (or `a.b.c.d`, a /32) as address and prefix length.
fn parse_dest(option: &'static str, token: &str) -> Result<(Ipv4Addr, u8)> {
    let Some((addr, len)) = token.split_once('/') else {
        return Ok((ovn::parse_addr(option, token)?, 32));
    };
    let addr = ovn::parse_addr(option, addr).map_err(|_| Error::InvalidOvnValue {
        option,
        token: token.to_owned(),
        problem: "is not a destination; expected an IPv4 prefix like 10.17.0.0/16".to_owned(),
    })?;
    let prefix_len = match len.parse::<u8>() {
        Ok(n) if len.bytes().all(|b| b.is_ascii_digit()) => n,
        _ => {
            return Err(Error::InvalidOvnValue {
                option,
                token: token.to_owned(),
                problem: format!("has prefix length {len:?}; expected a number 0..=32"),
            });
        }
    };
    if prefix_len > 32 {
        return Err(Error::InvalidOvnValue {
            option,
            token: token.to_owned(),
            problem: format!("has {}", Error::PrefixTooLong { prefix_len }),
        });
    }
    Ok((addr, prefix_len))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GW: Ipv4Addr = Ipv4Addr::new(10, 244, 0, 1);

    fn route(dest: &str, gw: Ipv4Addr) -> Route {
        Route::new(dest.parse().unwrap(), gw).unwrap()
    }

    fn overlay_routes() -> Vec<Route> {
        vec![
            route("10.244.0.1/32", Ipv4Addr::UNSPECIFIED),
            route("0.0.0.0/0", GW),
        ]
    }

    #[test]
    fn captured_default_route_vector() {
        let routes = [route("0.0.0.0/0", GW)];
        let bytes = [0x00, 0x0a, 0xf4, 0x00, 0x01];
        assert_eq!(encode(&routes), bytes);
        assert_eq!(decode(&bytes).unwrap(), routes);
        assert_eq!(encoded_len(&routes), 5);
    }

    #[test]
    fn captured_overlay_vector() {
        let bytes = [
            0x20, 0x0a, 0xf4, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x0a, 0xf4, 0x00, 0x01,
        ];
        assert_eq!(encode(&overlay_routes()), bytes);
        assert_eq!(decode(&bytes).unwrap(), overlay_routes());
        assert_eq!(encoded_len(&overlay_routes()), 14);
    }

    #[test]
    fn rfc_example_vector() {
        let routes = [route("10.17.0.0/16", Ipv4Addr::new(10, 0, 0, 1))];
        let bytes = [0x10, 0x0a, 0x11, 0x0a, 0x00, 0x00, 0x01];
        assert_eq!(encode(&routes), bytes);
        assert_eq!(decode(&bytes).unwrap(), routes);
    }

    #[test]
    fn rfc_table_widths() {
        // RFC 3442's table of subnet number / mask / destination descriptor.
        let gw = Ipv4Addr::new(1, 2, 3, 4);
        let cases: [(&str, &[u8]); 6] = [
            ("10.0.127.0/24", &[24, 10, 0, 127]),
            ("10.0.0.0/16", &[16, 10, 0]),
            ("10.0.0.0/8", &[8, 10]),
            ("10.0.128.0/18", &[18, 10, 0, 128]),
            ("10.0.0.0/9", &[9, 10, 0]),
            ("0.0.0.0/0", &[0]),
        ];
        for (dest, descriptor) in cases {
            let mut expected = descriptor.to_vec();
            expected.extend_from_slice(&gw.octets());
            assert_eq!(encode(&[route(dest, gw)]), expected, "{dest}");
            assert_eq!(decode(&expected).unwrap(), [route(dest, gw)], "{dest}");
        }
        let host = [32, 10, 1, 2, 3, 1, 2, 3, 4];
        assert_eq!(encode(&[route("10.1.2.3/32", gw)]), host);
    }

    #[test]
    fn empty_is_zero_routes() {
        assert_eq!(decode(&[]).unwrap(), []);
        assert_eq!(encode(&[]), Vec::<u8>::new());
        assert_eq!(encoded_len(&[]), 0);
    }

    #[test]
    fn rejects_wide_width() {
        let e = decode(&[0, 10, 244, 0, 1, 33, 10, 0, 0, 0, 0, 1, 2, 3, 4]).unwrap_err();
        assert_eq!(
            e,
            Error::Rfc3442WidthTooLarge {
                offset: 5,
                width: 33
            }
        );
        assert_eq!(
            e.to_string(),
            "RFC 3442 route descriptor at byte 5: width 33 exceeds 32; the width is the \
             destination prefix length, 0..=32"
        );
        assert!(matches!(
            decode(&[255]),
            Err(Error::Rfc3442WidthTooLarge {
                offset: 0,
                width: 255
            })
        ));
    }

    #[test]
    fn rejects_truncated() {
        assert_eq!(
            decode(&[16, 10, 17, 10, 0, 0]),
            Err(Error::Rfc3442Truncated {
                offset: 0,
                width: 16,
                needed: 7,
                available: 6
            })
        );
        assert_eq!(
            decode(&[0, 10, 244, 0, 1, 24]),
            Err(Error::Rfc3442Truncated {
                offset: 5,
                width: 24,
                needed: 8,
                available: 1
            })
        );
        assert_eq!(
            decode(&[0]).unwrap_err().to_string(),
            "RFC 3442 route descriptor at byte 0 is truncated: width 0 needs 5 bytes (width \
             octet, significant destination octets, 4 router octets) but only 1 remain"
        );
    }

    #[test]
    fn rejects_bits_beyond_width() {
        // 10.0.128.0/17 is fine; 10.0.192.0/17 has bit 18 set.
        assert!(decode(&[17, 10, 0, 128, 1, 2, 3, 4]).is_ok());
        let e = decode(&[0, 10, 244, 0, 1, 17, 10, 0, 192, 1, 2, 3, 4]).unwrap_err();
        assert_eq!(
            e,
            Error::Rfc3442InvalidRoute {
                offset: 5,
                error: Box::new(Error::HostBitsSet {
                    addr: Ipv4Addr::new(10, 0, 192, 0),
                    prefix_len: 17,
                    network: "10.0.128.0/17".parse().unwrap(),
                }),
            }
        );
        assert_eq!(
            e.to_string(),
            "RFC 3442 route descriptor at byte 5: route destination 10.0.192.0/17 has host \
             bits set beyond its 17-bit prefix; use the network address 10.0.128.0/17"
        );
        assert!(matches!(
            decode(&[1, 0x7f, 1, 2, 3, 4]),
            Err(Error::Rfc3442InvalidRoute { offset: 0, .. })
        ));
    }

    #[test]
    fn rejects_unusable_router() {
        let e = decode(&[0, 224, 0, 0, 1]).unwrap_err();
        assert!(
            matches!(
                &e,
                Error::Rfc3442InvalidRoute { offset: 0, error }
                    if matches!(**error, Error::UnusableRouteGateway { .. })
            ),
            "{e:?}"
        );
        assert!(decode(&[0, 255, 255, 255, 255]).is_err());
    }

    #[test]
    fn formats_ovn() {
        assert_eq!(
            format_ovn(&overlay_routes()),
            "{10.244.0.1/32,0.0.0.0, 0.0.0.0/0,10.244.0.1}"
        );
        assert_eq!(format_ovn(&[]), "{}");
        assert_eq!(
            format_ovn(&[route("10.17.0.0/16", Ipv4Addr::new(10, 0, 0, 1))]),
            "{10.17.0.0/16,10.0.0.1}"
        );
    }

    #[test]
    fn parses_ovn() {
        assert_eq!(
            parse_ovn("{10.244.0.1/32,0.0.0.0, 0.0.0.0/0,10.244.0.1}").unwrap(),
            overlay_routes()
        );
        // OVN's lexer takes whitespace and commas alike, and a bare address as /32.
        assert_eq!(
            parse_ovn(" { 10.244.0.1 0.0.0.0 ,0.0.0.0/0 , 10.244.0.1 } ").unwrap(),
            overlay_routes()
        );
        assert_eq!(parse_ovn("{}").unwrap(), []);
        assert_eq!(parse_ovn("{ }").unwrap(), []);
    }

    fn ovn_error(value: &str) -> (String, String) {
        match parse_ovn(value) {
            Err(Error::InvalidOvnValue {
                option,
                token,
                problem,
            }) => {
                assert_eq!(option, "classless_static_route");
                (token, problem)
            }
            other => panic!("{value:?} parsed as {other:?}"),
        }
    }

    #[test]
    fn rejects_malformed_ovn() {
        let (token, problem) = ovn_error("{10.0.0.0/8,1.2.3.4, 0.0.0.0/0}");
        assert_eq!(token, "0.0.0.0/0");
        assert!(problem.starts_with("has no gateway"), "{problem}");

        let (token, problem) = ovn_error("{10.0.0.0/33,1.2.3.4}");
        assert_eq!(token, "10.0.0.0/33");
        assert_eq!(
            problem,
            "has prefix length 33 is longer than 32; an IPv4 prefix length is 0..=32"
        );

        let (token, problem) = ovn_error("{10.0.0.0/x,1.2.3.4}");
        assert_eq!(token, "10.0.0.0/x");
        assert!(problem.contains("\"x\""), "{problem}");
        assert_eq!(ovn_error("{10.0.0.0/+8,1.2.3.4}").0, "10.0.0.0/+8");
        assert_eq!(ovn_error("{10.0.0.0/,1.2.3.4}").0, "10.0.0.0/");
        assert_eq!(ovn_error("{10.0.0/8,1.2.3.4}").0, "10.0.0/8");
        assert_eq!(ovn_error("{10.0.0.0/8,1.2.3}").0, "1.2.3");

        let (token, problem) = ovn_error("{10.0.0.1/24,1.2.3.4}");
        assert_eq!(token, "10.0.0.1/24,1.2.3.4");
        assert!(
            problem.contains("use the network address 10.0.0.0/24"),
            "{problem}"
        );

        let (token, problem) = ovn_error("{0.0.0.0/0,224.0.0.1}");
        assert_eq!(token, "0.0.0.0/0,224.0.0.1");
        assert!(problem.contains("multicast"), "{problem}");

        assert_eq!(ovn_error("10.0.0.0/8,1.2.3.4").0, "10.0.0.0/8,1.2.3.4");
        assert_eq!(ovn_error("{10.0.0.0/8,1.2.3.4").0, "{10.0.0.0/8,1.2.3.4");
        assert_eq!(
            ovn_error("{10.0.0.0/8,,1.2.3.4}").0,
            "{10.0.0.0/8,,1.2.3.4}"
        );
        assert_eq!(ovn_error("").0, "");
    }

    #[test]
    fn ovn_error_message_names_token() {
        assert_eq!(
            parse_ovn("{10.0.0.0/8}").unwrap_err().to_string(),
            "OVN option classless_static_route: \"10.0.0.0/8\" has no gateway; entries are \
             \"destination/len,gateway\" pairs, with gateway 0.0.0.0 for on-link"
        );
    }
}
