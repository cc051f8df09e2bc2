//! rtnetlink adapter: veth pairs, links, addresses and routes, in the host's namespace or in
//! the pod's. A socket belongs to the namespace it was opened in, so [`Netlink::in_netns`]
//! enters the pod's namespace only for the moment it takes to open one (this thread, no
//! await in between) and comes straight back: every later request goes to the pod's kernel
//! state while the process stays in the host's.

use std::fs::File;
use std::net::{IpAddr, Ipv4Addr};
use std::os::fd::AsRawFd;

use futures::TryStreamExt;
use nix::sched::{CloneFlags, setns};
use roam_contract::annotation::PodRoute;
use rtnetlink::packet_route::AddressFamily;
use rtnetlink::packet_route::address::AddressAttribute;
use rtnetlink::packet_route::link::{InfoData, InfoVeth, LinkAttribute, LinkFlags, LinkMessage};
use rtnetlink::packet_route::route::{
    RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteScope,
};
use rtnetlink::{Handle, LinkMessageBuilder, LinkUnspec, LinkVeth, RouteMessageBuilder};

use crate::check::{ObservedAddr, ObservedLink, ObservedRoute};
use crate::error::{Error, Result};
use crate::plan::mac_string;

/// One rtnetlink connection, bound to one network namespace.
pub struct Netlink {
    handle: Handle,
}

fn nl_err(action: impl Into<String>) -> impl FnOnce(rtnetlink::Error) -> Error {
    let action = action.into();
    move |e| Error::Netlink {
        action,
        reason: describe(&e),
    }
}

fn describe(e: &rtnetlink::Error) -> String {
    match e {
        rtnetlink::Error::NetlinkError(m) => m.to_io().to_string(),
        other => other.to_string(),
    }
}

/// The errno of a netlink NACK.
fn errno(e: &rtnetlink::Error) -> Option<i32> {
    match e {
        rtnetlink::Error::NetlinkError(m) => m.to_io().raw_os_error(),
        _ => None,
    }
}

fn is_gone(e: &rtnetlink::Error) -> bool {
    matches!(errno(e), Some(c) if c == nix::errno::Errno::ENODEV as i32 || c == nix::errno::Errno::ENOENT as i32)
}

impl Netlink {
    fn connect() -> Result<Netlink> {
        let (conn, handle, _) = rtnetlink::new_connection().map_err(|e| Error::Netlink {
            action: "open a netlink socket".into(),
            reason: e.to_string(),
        })?;
        tokio::spawn(conn);
        Ok(Netlink { handle })
    }

    /// A connection to the current (host) namespace.
    pub fn host() -> Result<Netlink> {
        Self::connect()
    }

    /// A connection to the namespace `netns` (an open nsfs file).
    pub fn in_netns(netns: &File) -> Result<Netlink> {
        enter(netns, Self::connect)?
    }

    /// The index of link `name`, `None` when there is none.
    pub async fn index(&self, name: &str) -> Result<Option<u32>> {
        let mut links = self
            .handle
            .link()
            .get()
            .match_name(name.to_string())
            .execute();
        match links.try_next().await {
            Ok(Some(m)) => Ok(Some(m.header.index)),
            Ok(None) => Ok(None),
            Err(e) if is_gone(&e) => Ok(None),
            Err(e) => Err(nl_err(format!("look up link {name}"))(e)),
        }
    }

    async fn require(&self, name: &str) -> Result<u32> {
        self.index(name).await?.ok_or_else(|| Error::Netlink {
            action: format!("find link {name}"),
            reason: "it does not exist".into(),
        })
    }

    /// A veth pair: `host` here, `pod` created directly in `netns` with `mac`; both `mtu`.
    pub async fn create_veth(
        &self,
        host: &str,
        pod: &str,
        mac: [u8; 6],
        mtu: u32,
        netns: &File,
    ) -> Result<()> {
        let peer = LinkMessageBuilder::<LinkUnspec>::new()
            .name(pod.to_string())
            .address(mac.to_vec())
            .mtu(mtu)
            .setns_by_fd(netns.as_raw_fd())
            .build();
        let msg = LinkVeth::new(host, pod)
            .mtu(mtu)
            .set_info_data(InfoData::Veth(InfoVeth::Peer(peer)))
            .build();
        self.handle
            .link()
            .add(msg)
            .execute()
            .await
            .map_err(nl_err(format!(
                "create veth pair {host} (host) / {pod} (pod, {})",
                mac_string(&mac)
            )))
    }

    /// Create a veth pair `name`/`peer` with both ends in this namespace: a link that leads
    /// nowhere (the `dummy` kind needs a module not every kernel has).
    pub async fn create_veth_here(&self, name: &str, peer: &str) -> Result<()> {
        self.handle
            .link()
            .add(LinkVeth::new(name, peer).build())
            .execute()
            .await
            .map_err(nl_err(format!("create veth pair {name}/{peer} in the pod")))
    }

    /// Set link `name` up.
    pub async fn set_up(&self, name: &str) -> Result<u32> {
        let index = self.require(name).await?;
        self.handle
            .link()
            .set(LinkUnspec::new_with_index(index).up().build())
            .execute()
            .await
            .map_err(nl_err(format!("set {name} up")))?;
        Ok(index)
    }

    /// Add `ip/prefix_len` to link `index` (named `name`).
    pub async fn add_address(&self, index: u32, name: &str, ip: Ipv4Addr, plen: u8) -> Result<()> {
        self.handle
            .address()
            .add(index, IpAddr::V4(ip), plen)
            .execute()
            .await
            .map_err(nl_err(format!("add address {ip}/{plen} to {name}")))
    }

    /// Add `route` through link `index` (named `name`): on-link (scope link) without a next
    /// hop, else via it.
    pub async fn add_route(&self, index: u32, name: &str, route: &PodRoute) -> Result<()> {
        let mut b = RouteMessageBuilder::<Ipv4Addr>::new()
            .destination_prefix(route.dst, route.prefix_len)
            .output_interface(index)
            .priority(route.metric);
        b = match route.via {
            Some(gw) => b.gateway(gw),
            None => b.scope(RouteScope::Link),
        };
        let via = route
            .via
            .map(|g| format!("via {g}"))
            .unwrap_or("scope link".into());
        self.handle
            .route()
            .add(b.build())
            .execute()
            .await
            .map_err(nl_err(format!(
                "add route {}/{} {via} dev {name} metric {}",
                route.dst, route.prefix_len, route.metric
            )))
    }

    /// Delete link `name`; `Ok(false)` when it was already gone.
    pub async fn delete(&self, name: &str) -> Result<bool> {
        let Some(index) = self.index(name).await? else {
            return Ok(false);
        };
        match self.handle.link().del(index).execute().await {
            Ok(()) => Ok(true),
            Err(e) if is_gone(&e) => Ok(false),
            Err(e) => Err(nl_err(format!("delete link {name}"))(e)),
        }
    }

    async fn link_messages(&self) -> Result<Vec<LinkMessage>> {
        self.handle
            .link()
            .get()
            .execute()
            .try_collect()
            .await
            .map_err(nl_err("list links"))
    }

    /// Every link, with its index.
    pub async fn links(&self) -> Result<Vec<(u32, ObservedLink)>> {
        Ok(self
            .link_messages()
            .await?
            .into_iter()
            .map(|m| {
                let mut l = ObservedLink {
                    name: String::new(),
                    mac: None,
                    mtu: None,
                    up: m.header.flags.contains(LinkFlags::Up),
                };
                for a in &m.attributes {
                    match a {
                        LinkAttribute::IfName(n) => l.name = n.clone(),
                        LinkAttribute::Mtu(v) => l.mtu = Some(*v),
                        LinkAttribute::Address(b) if b.len() == 6 => {
                            let mut mac = [0u8; 6];
                            mac.copy_from_slice(b);
                            l.mac = Some(mac_string(&mac));
                        }
                        _ => {}
                    }
                }
                (m.header.index, l)
            })
            .collect())
    }

    /// Every IPv4 address, with its link's name.
    pub async fn addresses(&self, links: &[(u32, ObservedLink)]) -> Result<Vec<ObservedAddr>> {
        let msgs: Vec<_> = self
            .handle
            .address()
            .get()
            .execute()
            .try_collect()
            .await
            .map_err(nl_err("list addresses"))?;
        Ok(msgs
            .into_iter()
            .filter(|m| m.header.family == AddressFamily::Inet)
            .filter_map(|m| {
                let ip = m.attributes.iter().find_map(|a| match a {
                    AddressAttribute::Local(IpAddr::V4(ip)) => Some(*ip),
                    AddressAttribute::Address(IpAddr::V4(ip)) => Some(*ip),
                    _ => None,
                })?;
                Some(ObservedAddr {
                    ifname: name_of(links, m.header.index),
                    ip,
                    prefix_len: m.header.prefix_len,
                })
            })
            .collect())
    }

    /// Every IPv4 route of the main table.
    pub async fn routes(&self, links: &[(u32, ObservedLink)]) -> Result<Vec<ObservedRoute>> {
        let msgs: Vec<RouteMessage> = self
            .handle
            .route()
            .get(RouteMessageBuilder::<Ipv4Addr>::new().build())
            .execute()
            .try_collect()
            .await
            .map_err(nl_err("list routes"))?;
        Ok(msgs
            .into_iter()
            .filter(|m| {
                let table = m
                    .attributes
                    .iter()
                    .find_map(|a| match a {
                        RouteAttribute::Table(t) => Some(*t),
                        _ => None,
                    })
                    .unwrap_or(u32::from(m.header.table));
                table == u32::from(RouteHeader::RT_TABLE_MAIN)
            })
            .map(|m| {
                let mut r = ObservedRoute {
                    dst: Ipv4Addr::UNSPECIFIED,
                    prefix_len: m.header.destination_prefix_length,
                    gw: None,
                    ifname: None,
                    metric: 0,
                    scope: u8::from(m.header.scope),
                };
                for a in &m.attributes {
                    match a {
                        RouteAttribute::Destination(RouteAddress::Inet(d)) => r.dst = *d,
                        RouteAttribute::Gateway(RouteAddress::Inet(g)) => r.gw = Some(*g),
                        RouteAttribute::Oif(i) => r.ifname = Some(name_of(links, *i)),
                        RouteAttribute::Priority(p) => r.metric = *p,
                        _ => {}
                    }
                }
                r
            })
            .collect())
    }
}

/// Run `f` (which must not block on anything async) with this thread in the namespace
/// `netns`, and come back: sockets `f` opens stay bound to `netns`.
pub fn enter<T>(netns: &File, f: impl FnOnce() -> T) -> Result<T> {
    let host = File::open("/proc/thread-self/ns/net").map_err(|e| Error::Netlink {
        action: "open this thread's network namespace".into(),
        reason: e.to_string(),
    })?;
    setns(netns, CloneFlags::CLONE_NEWNET).map_err(|e| Error::Netlink {
        action: "enter the pod's network namespace".into(),
        reason: format!("{e} (is CNI_NETNS a network namespace?)"),
    })?;
    let out = f();
    if let Err(e) = setns(&host, CloneFlags::CLONE_NEWNET) {
        // continuing would apply host-side changes inside the pod: stop here
        panic!("roam-cni cannot return to the host's network namespace: {e}");
    }
    Ok(out)
}

fn name_of(links: &[(u32, ObservedLink)], index: u32) -> String {
    links
        .iter()
        .find(|(i, _)| *i == index)
        .map(|(_, l)| l.name.clone())
        .unwrap_or_else(|| format!("if{index}"))
}
