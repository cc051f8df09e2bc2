//! The OVN northbound `DHCP_Options` row for a lease, and back.
//!
//! OVN's native DHCP answers a VM from this row: the `cidr` column and the
//! `options` map, whose keys and value syntax are OVN's own (see
//! `ovn-nb(5)`). Multi-valued options use OVN's set syntax, `{a, b}`.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use crate::error::{Error, Result};
use crate::lease::Lease;
use crate::mac::MacAddr;
use crate::rfc3442;

/// Option `router` (DHCP option 3).
pub const ROUTER: &str = "router";
/// Option `server_id` (DHCP option 54).
pub const SERVER_ID: &str = "server_id";
/// Option `server_mac`: the MAC OVN answers from.
pub const SERVER_MAC: &str = "server_mac";
/// Option `dns_server` (DHCP option 6).
pub const DNS_SERVER: &str = "dns_server";
/// Option `classless_static_route` (DHCP option 121).
pub const CLASSLESS_STATIC_ROUTE: &str = "classless_static_route";
/// Option `ms_classless_static_route` (DHCP option 249).
pub const MS_CLASSLESS_STATIC_ROUTE: &str = "ms_classless_static_route";
/// Option `lease_time` (DHCP option 51).
pub const LEASE_TIME: &str = "lease_time";
/// Option `mtu` (DHCP option 26).
pub const MTU: &str = "mtu";

/// Every option roam writes, so [`Lease::from_ovn`] can refuse the rest.
const KNOWN_OPTIONS: [&str; 8] = [
    ROUTER,
    SERVER_ID,
    SERVER_MAC,
    DNS_SERVER,
    CLASSLESS_STATIC_ROUTE,
    MS_CLASSLESS_STATIC_ROUTE,
    LEASE_TIME,
    MTU,
];

/// The columns of an OVN NB `DHCP_Options` row that a lease fills.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct DhcpOptionsRow {
    /// The `cidr` column: the client's address as `10.244.1.11/32`.
    pub cidr: String,
    /// The `options` column, keyed by OVN's option names.
    pub options: BTreeMap<String, String>,
}

impl Lease {
    /// The `DHCP_Options` row OVN needs to hand out this lease.
    ///
    /// `dns_server` is left out when there are no DNS servers, and both
    /// `classless_static_route` and `ms_classless_static_route` (always the
    /// same) are left out when there are no routes.
    ///
    /// ```
    /// use std::net::Ipv4Addr;
    /// use roam_dhcp_opts::{Lease, MacAddr};
    ///
    /// let lease = Lease::builder(
    ///     Ipv4Addr::new(10, 244, 1, 11),
    ///     Ipv4Addr::new(10, 244, 0, 1),
    ///     "0a:00:00:00:00:01".parse()?,
    /// )
    /// .dns_servers([Ipv4Addr::new(10, 96, 0, 10)])
    /// .build()?;
    /// let row = lease.to_ovn();
    /// assert_eq!(row.cidr, "10.244.1.11/32");
    /// assert_eq!(
    ///     row.options["classless_static_route"],
    ///     "{10.244.0.1/32,0.0.0.0, 0.0.0.0/0,10.244.0.1}"
    /// );
    /// assert_eq!(Lease::from_ovn(&row)?, lease);
    /// # Ok::<(), roam_dhcp_opts::Error>(())
    /// ```
    pub fn to_ovn(&self) -> DhcpOptionsRow {
        let mut options = BTreeMap::new();
        let mut put = |key: &str, value: String| {
            options.insert(key.to_owned(), value);
        };
        put(ROUTER, self.router().to_string());
        put(SERVER_ID, self.server_id().to_string());
        put(SERVER_MAC, self.server_mac().to_string());
        if !self.dns_servers().is_empty() {
            put(DNS_SERVER, format_addrs(self.dns_servers()));
        }
        if !self.classless_static_routes().is_empty() {
            let routes = rfc3442::format_ovn(self.classless_static_routes());
            put(MS_CLASSLESS_STATIC_ROUTE, routes.clone());
            put(CLASSLESS_STATIC_ROUTE, routes);
        }
        put(LEASE_TIME, self.lease_time().to_string());
        put(MTU, self.mtu().to_string());
        DhcpOptionsRow {
            cidr: format!("{}/32", self.ip()),
            options,
        }
    }

    /// The lease a `DHCP_Options` row describes, checked as
    /// [`LeaseBuilder::build`](crate::LeaseBuilder::build) checks.
    ///
    /// Strict, so that `Lease::from_ovn(&row)?.to_ovn()` gives `row` back
    /// (up to whitespace): `cidr` must be a /32; `router`, `server_id`,
    /// `server_mac`, `lease_time` and `mtu` must be present; the route
    /// options must both be present with the same routes, or both absent;
    /// and any other option is refused ([`Error::UnknownOvnOption`]) rather
    /// than dropped.
    pub fn from_ovn(row: &DhcpOptionsRow) -> Result<Self> {
        let ip = parse_cidr(&row.cidr)?;
        if let Some(unknown) = row
            .options
            .keys()
            .find(|key| !KNOWN_OPTIONS.contains(&key.as_str()))
        {
            return Err(Error::UnknownOvnOption {
                option: unknown.clone(),
            });
        }
        let required = |option: &'static str| {
            row.options
                .get(option)
                .map(String::as_str)
                .ok_or(Error::MissingOvnOption { option })
        };
        let router = parse_addr(ROUTER, required(ROUTER)?.trim())?;
        let server_id = parse_addr(SERVER_ID, required(SERVER_ID)?.trim())?;
        let server_mac: MacAddr = required(SERVER_MAC)?.trim().parse()?;
        let lease_time = parse_number(LEASE_TIME, required(LEASE_TIME)?)?;
        let lease_time = u32::try_from(lease_time).map_err(|_| Error::InvalidOvnValue {
            option: LEASE_TIME,
            token: lease_time.to_string(),
            problem: "does not fit 32 bits; use at most 4294967295 (infinite)".to_owned(),
        })?;
        let mtu = parse_number(MTU, required(MTU)?)?;
        let mtu = u16::try_from(mtu).map_err(|_| Error::MtuOutOfRange { mtu })?;

        let dns_servers = match row.options.get(DNS_SERVER) {
            None => Vec::new(),
            Some(value) => split_set(DNS_SERVER, value)?
                .into_iter()
                .map(|token| parse_addr(DNS_SERVER, token))
                .collect::<Result<_>>()?,
        };

        let classless = row.options.get(CLASSLESS_STATIC_ROUTE);
        let ms = row.options.get(MS_CLASSLESS_STATIC_ROUTE);
        let routes = match (classless, ms) {
            (None, None) => Vec::new(),
            (Some(_), None) => {
                return Err(Error::MissingOvnOption {
                    option: MS_CLASSLESS_STATIC_ROUTE,
                });
            }
            (None, Some(_)) => {
                return Err(Error::MissingOvnOption {
                    option: CLASSLESS_STATIC_ROUTE,
                });
            }
            (Some(classless), Some(ms)) => {
                let routes = rfc3442::parse_ovn_option(CLASSLESS_STATIC_ROUTE, classless)?;
                let ms_routes = rfc3442::parse_ovn_option(MS_CLASSLESS_STATIC_ROUTE, ms)?;
                if routes != ms_routes {
                    return Err(Error::OvnRouteOptionsDiffer {
                        classless: classless.clone(),
                        ms: ms.clone(),
                    });
                }
                routes
            }
        };

        Self::builder(ip, router, server_mac)
            .server_id(server_id)
            .dns_servers(dns_servers)
            .classless_static_routes(routes)
            .lease_time(lease_time)
            .mtu(mtu)
            .build()
    }
}

impl From<&Lease> for DhcpOptionsRow {
    fn from(lease: &Lease) -> Self {
        lease.to_ovn()
    }
}

impl TryFrom<&DhcpOptionsRow> for Lease {
    type Error = Error;

    fn try_from(row: &DhcpOptionsRow) -> Result<Self> {
        Self::from_ovn(row)
    }
}

/// One address as `1.2.3.4`, several as `{1.2.3.4, 5.6.7.8}`.
fn format_addrs(addrs: &[Ipv4Addr]) -> String {
    match addrs {
        [one] => one.to_string(),
        many => {
            let joined: Vec<String> = many.iter().map(Ipv4Addr::to_string).collect();
            format!("{{{}}}", joined.join(", "))
        }
    }
}

/// The client ip in a `cidr` column, which must be `<ip>/32`.
fn parse_cidr(cidr: &str) -> Result<Ipv4Addr> {
    let invalid = |problem: &str| Error::InvalidOvnCidr {
        cidr: cidr.to_owned(),
        problem: problem.to_owned(),
    };
    let Some((addr, len)) = cidr.trim().split_once('/') else {
        return Err(invalid("has no prefix length"));
    };
    let addr: Ipv4Addr = addr
        .parse()
        .map_err(|_| invalid("does not start with an IPv4 address"))?;
    if len != "32" {
        return Err(invalid("is not a /32"));
    }
    Ok(addr)
}

/// An IPv4 address token of `option`.
pub(crate) fn parse_addr(option: &'static str, token: &str) -> Result<Ipv4Addr> {
    token.parse().map_err(|_| Error::InvalidOvnValue {
        option,
        token: token.to_owned(),
        problem: "is not an IPv4 address; expected dotted decimal like 10.244.0.1".to_owned(),
    })
}

/// A decimal number value of `option`.
fn parse_number(option: &'static str, value: &str) -> Result<u64> {
    let value = value.trim();
    match value.parse::<u64>() {
        Ok(n) if value.bytes().all(|b| b.is_ascii_digit()) => Ok(n),
        _ => Err(Error::InvalidOvnValue {
            option,
            token: value.to_owned(),
            problem: "is not a decimal number".to_owned(),
        }),
    }
}

/// The tokens of an OVN value: one bare token, or `{...}` holding tokens
/// separated by commas and/or whitespace (as OVN's lexer reads them).
pub(crate) fn split_set<'a>(option: &'static str, value: &'a str) -> Result<Vec<&'a str>> {
    let invalid = |problem: &str| Error::InvalidOvnValue {
        option,
        token: value.to_owned(),
        problem: problem.to_owned(),
    };
    let trimmed = value.trim();
    let (inner, braced) = match trimmed.strip_prefix('{') {
        Some(rest) => match rest.strip_suffix('}') {
            Some(inner) => (inner, true),
            None => return Err(invalid("opens '{' but does not close it with '}'")),
        },
        None => (trimmed, false),
    };
    if inner.contains(['{', '}']) {
        return Err(invalid("has a stray brace; write several values as {a, b}"));
    }
    if inner.trim().is_empty() {
        return if braced {
            Ok(Vec::new())
        } else {
            Err(invalid("is empty"))
        };
    }
    let mut tokens = Vec::new();
    for entry in inner.split(',') {
        let before = tokens.len();
        tokens.extend(entry.split_whitespace());
        if tokens.len() == before {
            return Err(invalid("has an empty entry between commas"));
        }
    }
    if !braced && tokens.len() > 1 {
        return Err(invalid(
            "has several values outside braces; OVN needs them as {a, b}",
        ));
    }
    Ok(tokens)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{AddressKind, AddressRole};

    const IP: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 11);
    const GW: Ipv4Addr = Ipv4Addr::new(10, 244, 0, 1);
    const DNS: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);

    fn mac() -> MacAddr {
        "0a:00:00:00:00:01".parse().unwrap()
    }

    fn example() -> Lease {
        Lease::builder(IP, GW, mac())
            .dns_servers([DNS])
            .build()
            .unwrap()
    }

    fn example_row() -> DhcpOptionsRow {
        example().to_ovn()
    }

    fn with(option: &str, value: &str) -> DhcpOptionsRow {
        let mut row = example_row();
        row.options.insert(option.to_owned(), value.to_owned());
        row
    }

    fn without(option: &str) -> DhcpOptionsRow {
        let mut row = example_row();
        row.options.remove(option);
        row
    }

    #[test]
    fn example_row_is_exact() {
        let row = example_row();
        assert_eq!(row.cidr, "10.244.1.11/32");
        let expected: BTreeMap<String, String> = [
            ("lease_time", "3600"),
            ("router", "10.244.0.1"),
            ("server_id", "10.244.0.1"),
            ("server_mac", "0a:00:00:00:00:01"),
            ("dns_server", "10.96.0.10"),
            (
                "classless_static_route",
                "{10.244.0.1/32,0.0.0.0, 0.0.0.0/0,10.244.0.1}",
            ),
            (
                "ms_classless_static_route",
                "{10.244.0.1/32,0.0.0.0, 0.0.0.0/0,10.244.0.1}",
            ),
            ("mtu", "1500"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        assert_eq!(row.options, expected);
        assert_eq!(DhcpOptionsRow::from(&example()), row);
    }

    #[test]
    fn round_trips_example() {
        let lease = example();
        assert_eq!(Lease::from_ovn(&lease.to_ovn()).unwrap(), lease);
        assert_eq!(Lease::try_from(&lease.to_ovn()).unwrap(), lease);
    }

    #[test]
    fn several_dns_servers_use_braces() {
        let lease = example()
            .into_builder()
            .dns_servers([DNS, Ipv4Addr::new(8, 8, 8, 8)])
            .build()
            .unwrap();
        let row = lease.to_ovn();
        assert_eq!(row.options[DNS_SERVER], "{10.96.0.10, 8.8.8.8}");
        assert_eq!(Lease::from_ovn(&row).unwrap(), lease);
    }

    #[test]
    fn omits_empty_dns_and_routes() {
        let lease = example()
            .into_builder()
            .dns_servers([])
            .classless_static_routes([])
            .build()
            .unwrap();
        let row = lease.to_ovn();
        let keys: Vec<&str> = row.options.keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            ["lease_time", "mtu", "router", "server_id", "server_mac"]
        );
        assert_eq!(Lease::from_ovn(&row).unwrap(), lease);
    }

    #[test]
    fn reads_tolerant_whitespace_and_empty_sets() {
        let row = with(DNS_SERVER, " { 10.96.0.10 } ");
        assert_eq!(Lease::from_ovn(&row).unwrap(), example());
        let mut row = with(CLASSLESS_STATIC_ROUTE, "{}");
        row.options
            .insert(MS_CLASSLESS_STATIC_ROUTE.to_owned(), "{ }".to_owned());
        let lease = Lease::from_ovn(&row).unwrap();
        assert_eq!(lease.classless_static_routes(), []);
        let row = with(DNS_SERVER, "{}");
        assert!(Lease::from_ovn(&row).unwrap().dns_servers().is_empty());
    }

    #[test]
    fn rejects_cidr() {
        for (cidr, problem) in [
            ("10.244.1.11", "has no prefix length"),
            ("10.244.1.11/24", "is not a /32"),
            ("10.244.1.11/032", "is not a /32"),
            ("10.244.1/32", "does not start with an IPv4 address"),
            ("", "has no prefix length"),
        ] {
            let mut row = example_row();
            row.cidr = cidr.to_owned();
            assert_eq!(
                Lease::from_ovn(&row),
                Err(Error::InvalidOvnCidr {
                    cidr: cidr.to_owned(),
                    problem: problem.to_owned()
                }),
                "{cidr}"
            );
        }
        let mut row = example_row();
        row.cidr = "10.244.1.11/24".to_owned();
        assert_eq!(
            Lease::from_ovn(&row).unwrap_err().to_string(),
            "OVN DHCP_Options cidr \"10.244.1.11/24\" is not a /32; roam leases are written as \
             <client ip>/32"
        );
    }

    #[test]
    fn rejects_missing_options() {
        for option in [ROUTER, SERVER_ID, SERVER_MAC, LEASE_TIME, MTU] {
            assert_eq!(
                Lease::from_ovn(&without(option)),
                Err(Error::MissingOvnOption { option }),
                "{option}"
            );
        }
        assert_eq!(
            Lease::from_ovn(&without(MS_CLASSLESS_STATIC_ROUTE)),
            Err(Error::MissingOvnOption {
                option: MS_CLASSLESS_STATIC_ROUTE
            })
        );
        assert_eq!(
            Lease::from_ovn(&without(CLASSLESS_STATIC_ROUTE)),
            Err(Error::MissingOvnOption {
                option: CLASSLESS_STATIC_ROUTE
            })
        );
        assert!(
            Lease::from_ovn(&without(MTU))
                .unwrap_err()
                .to_string()
                .contains("lacks the mtu option")
        );
    }

    #[test]
    fn rejects_unknown_option() {
        assert_eq!(
            Lease::from_ovn(&with("domain_name", "\"cluster.local\"")),
            Err(Error::UnknownOvnOption {
                option: "domain_name".to_owned()
            })
        );
    }

    #[test]
    fn rejects_differing_route_options() {
        let row = with(MS_CLASSLESS_STATIC_ROUTE, "{0.0.0.0/0,0.0.0.0}");
        assert_eq!(
            Lease::from_ovn(&row),
            Err(Error::OvnRouteOptionsDiffer {
                classless: "{10.244.0.1/32,0.0.0.0, 0.0.0.0/0,10.244.0.1}".to_owned(),
                ms: "{0.0.0.0/0,0.0.0.0}".to_owned(),
            })
        );
        // Same routes, different spelling: fine.
        let row = with(
            MS_CLASSLESS_STATIC_ROUTE,
            "{10.244.0.1,0.0.0.0,0.0.0.0/0,10.244.0.1}",
        );
        assert_eq!(Lease::from_ovn(&row).unwrap(), example());
    }

    fn invalid_value(row: &DhcpOptionsRow) -> (&'static str, String, String) {
        match Lease::from_ovn(row) {
            Err(Error::InvalidOvnValue {
                option,
                token,
                problem,
            }) => (option, token, problem),
            other => panic!("{row:?} read as {other:?}"),
        }
    }

    #[test]
    fn rejects_malformed_values() {
        let (option, token, _) = invalid_value(&with(ROUTER, "10.244.0"));
        assert_eq!((option, token.as_str()), (ROUTER, "10.244.0"));
        let (option, token, _) = invalid_value(&with(SERVER_ID, "{10.244.0.1}"));
        assert_eq!((option, token.as_str()), (SERVER_ID, "{10.244.0.1}"));
        let (option, token, problem) = invalid_value(&with(LEASE_TIME, "-1"));
        assert_eq!((option, token.as_str()), (LEASE_TIME, "-1"));
        assert_eq!(problem, "is not a decimal number");
        let (option, token, _) = invalid_value(&with(LEASE_TIME, "4294967296"));
        assert_eq!((option, token.as_str()), (LEASE_TIME, "4294967296"));
        let (option, token, _) = invalid_value(&with(MTU, "1500b"));
        assert_eq!((option, token.as_str()), (MTU, "1500b"));
        let (option, token, _) = invalid_value(&with(DNS_SERVER, "{10.96.0.10, dns}"));
        assert_eq!((option, token.as_str()), (DNS_SERVER, "dns"));
        let (option, token, problem) = invalid_value(&with(DNS_SERVER, "10.96.0.10, 8.8.8.8"));
        assert_eq!(
            (option, token.as_str()),
            (DNS_SERVER, "10.96.0.10, 8.8.8.8")
        );
        assert!(problem.contains("outside braces"), "{problem}");
        let (_, _, problem) = invalid_value(&with(DNS_SERVER, "{10.96.0.10"));
        assert!(problem.contains("does not close"), "{problem}");
        let (_, _, problem) = invalid_value(&with(DNS_SERVER, "10.96.0.10}"));
        assert!(problem.contains("stray brace"), "{problem}");
        let (_, _, problem) = invalid_value(&with(DNS_SERVER, "{{10.96.0.10}}"));
        assert!(problem.contains("stray brace"), "{problem}");
        let (_, _, problem) = invalid_value(&with(DNS_SERVER, "{10.96.0.10,}"));
        assert!(problem.contains("empty entry"), "{problem}");
        let (_, _, problem) = invalid_value(&with(DNS_SERVER, ""));
        assert_eq!(problem, "is empty");
        let (option, token, _) = invalid_value(&with(MS_CLASSLESS_STATIC_ROUTE, "{0.0.0.0/0}"));
        assert_eq!(
            (option, token.as_str()),
            (MS_CLASSLESS_STATIC_ROUTE, "0.0.0.0/0")
        );
        assert_eq!(
            Lease::from_ovn(&with(ROUTER, "gw"))
                .unwrap_err()
                .to_string(),
            "OVN option router: \"gw\" is not an IPv4 address; expected dotted decimal like \
             10.244.0.1"
        );
    }

    #[test]
    fn rejects_mtu_out_of_range() {
        assert_eq!(
            Lease::from_ovn(&with(MTU, "70000")),
            Err(Error::MtuOutOfRange { mtu: 70000 })
        );
        assert_eq!(
            Lease::from_ovn(&with(MTU, "67")),
            Err(Error::MtuOutOfRange { mtu: 67 })
        );
    }

    #[test]
    fn rejects_malformed_mac() {
        assert!(matches!(
            Lease::from_ovn(&with(SERVER_MAC, "0a:00:00:00:01")),
            Err(Error::InvalidMac { .. })
        ));
        assert!(matches!(
            Lease::from_ovn(&with(SERVER_MAC, "ff:ff:ff:ff:ff:ff")),
            Err(Error::MulticastServerMac { .. })
        ));
    }

    #[test]
    fn applies_lease_checks() {
        assert_eq!(
            Lease::from_ovn(&with(SERVER_ID, "10.244.1.11")),
            Err(Error::ServerIdIsClient { server_id: IP })
        );
        assert_eq!(
            Lease::from_ovn(&with(LEASE_TIME, "0")),
            Err(Error::ZeroLeaseTime)
        );
        assert_eq!(
            Lease::from_ovn(&with(DNS_SERVER, "255.255.255.255")),
            Err(Error::UnusableAddress {
                role: AddressRole::DnsServer,
                addr: Ipv4Addr::BROADCAST,
                kind: AddressKind::Broadcast
            })
        );
        let mut row = example_row();
        for option in [CLASSLESS_STATIC_ROUTE, MS_CLASSLESS_STATIC_ROUTE] {
            row.options
                .insert(option.to_owned(), "{0.0.0.0/0,10.244.0.1}".to_owned());
        }
        assert!(matches!(
            Lease::from_ovn(&row),
            Err(Error::UnreachableRouteGateway { .. })
        ));
    }

    #[test]
    fn formats_addresses() {
        assert_eq!(format_addrs(&[DNS]), "10.96.0.10");
        assert_eq!(format_addrs(&[DNS, GW]), "{10.96.0.10, 10.244.0.1}");
        assert_eq!(
            split_set(DNS_SERVER, "{10.96.0.10, 10.244.0.1}").unwrap(),
            ["10.96.0.10", "10.244.0.1"]
        );
    }
}
