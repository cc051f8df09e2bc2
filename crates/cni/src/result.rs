//! The CNI result of an ADD (spec 1.1 §Success, with the older shapes for 0.3.x–1.0.0), built
//! from the plan; and the `prevResult` a runtime hands back on CHECK and DEL, parsed: pure.

use std::net::Ipv4Addr;
use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::config::{AttachmentKey, at_least};
use crate::error::{Error, Result};
use crate::plan::{InterfacePlan, mac_string};

/// `RT_SCOPE_LINK`, the scope of an on-link route.
pub const SCOPE_LINK: u8 = 253;

/// An interface of a result.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResultInterface {
    /// Its name.
    pub name: String,
    /// Its MAC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
    /// Its MTU (1.1.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtu: Option<u32>,
    /// The netns path of a container interface; absent for a host interface.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sandbox: Option<String>,
}

/// An address of a result.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResultIp {
    /// `A/P`.
    pub address: String,
    /// The gateway.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<Ipv4Addr>,
    /// Index into `interfaces`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interface: Option<usize>,
}

/// A route of a result.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResultRoute {
    /// `D/P`.
    pub dst: String,
    /// The next hop; absent for an on-link route.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gw: Option<Ipv4Addr>,
    /// The metric (1.1.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<u32>,
    /// The scope (1.1.0): 253 for an on-link route.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scope: Option<u8>,
}

/// A CNI result (the fields roam-cni produces and checks).
#[derive(Clone, Debug, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct CniResult {
    /// `interfaces`.
    #[serde(default)]
    pub interfaces: Vec<ResultInterface>,
    /// `ips`.
    #[serde(default)]
    pub ips: Vec<ResultIp>,
    /// `routes`.
    #[serde(default)]
    pub routes: Vec<ResultRoute>,
}

/// The result of an ADD: per interface, the host veth and the pod interface; the pod
/// interface's address and routes.
pub fn build(plans: &[InterfacePlan], netns: &Path) -> CniResult {
    let mut r = CniResult::default();
    for p in plans {
        r.interfaces.push(ResultInterface {
            name: p.host_ifname.clone(),
            mac: None,
            mtu: Some(p.mtu),
            sandbox: None,
        });
        r.interfaces.push(ResultInterface {
            name: p.pod_ifname.clone(),
            mac: Some(mac_string(&p.mac)),
            mtu: Some(p.mtu),
            sandbox: Some(netns.display().to_string()),
        });
        r.ips.push(ResultIp {
            address: format!("{}/{}", p.ip, p.prefix_len),
            gateway: Some(p.gateway),
            interface: Some(r.interfaces.len() - 1),
        });
        for route in &p.routes {
            r.routes.push(ResultRoute {
                dst: format!("{}/{}", route.dst, route.prefix_len),
                gw: route.via,
                priority: Some(route.metric),
                scope: route.via.is_none().then_some(SCOPE_LINK),
            });
        }
    }
    r
}

/// The one address of an isolated launcher pod ([`crate::kube::Attachment::Isolated`]):
/// link-local, reachable from nowhere.
pub const ISOLATED_IP: Ipv4Addr = Ipv4Addr::new(169, 254, 1, 1);

/// The result of an isolated ADD: the pod's dummy interface and [`ISOLATED_IP`], no route.
pub fn isolated(ifname: &str, netns: &Path) -> CniResult {
    CniResult {
        interfaces: vec![ResultInterface {
            name: ifname.to_string(),
            mac: None,
            mtu: None,
            sandbox: Some(netns.display().to_string()),
        }],
        ips: vec![ResultIp {
            address: format!("{ISOLATED_IP}/32"),
            gateway: None,
            interface: Some(0),
        }],
        routes: vec![],
    }
}

/// The result as JSON in the shape of `cni_version`: 1.1.0 carries interface MTUs and route
/// priority and scope; before 1.0.0 every IP carries `"version": "4"`.
pub fn render(r: &CniResult, cni_version: &str) -> Value {
    let v11 = at_least(cni_version, "1.1.0");
    let v10 = at_least(cni_version, "1.0.0");
    let interfaces: Vec<Value> = r
        .interfaces
        .iter()
        .map(|i| {
            let mut i = i.clone();
            if !v11 {
                i.mtu = None;
            }
            json!(i)
        })
        .collect();
    let ips: Vec<Value> = r
        .ips
        .iter()
        .map(|ip| {
            let mut v = json!(ip);
            if !v10 {
                v["version"] = json!("4");
            }
            v
        })
        .collect();
    let routes: Vec<Value> = r
        .routes
        .iter()
        .map(|route| {
            let mut route = route.clone();
            if !v11 {
                route.priority = None;
                route.scope = None;
            }
            json!(route)
        })
        .collect();
    json!({
        "cniVersion": cni_version,
        "interfaces": interfaces,
        "ips": ips,
        "routes": routes,
        "dns": {},
    })
}

/// Parse a `prevResult`.
pub fn parse_prev(v: &Value) -> Result<CniResult> {
    serde_json::from_value(v.clone()).map_err(|e| Error::InvalidConfig {
        field: "prevResult".into(),
        problem: format!("is not a CNI result: {e}"),
    })
}

/// `D/P` → (D, P).
pub fn parse_cidr(s: &str) -> Option<(Ipv4Addr, u8)> {
    let (ip, p) = s.split_once('/')?;
    let p: u8 = p.parse().ok()?;
    (p <= 32).then_some(())?;
    Some((ip.parse().ok()?, p))
}

/// The host interfaces a result names for an attachment (those without a sandbox).
pub fn host_interfaces(r: &CniResult) -> Vec<String> {
    r.interfaces
        .iter()
        .filter(|i| i.sandbox.is_none())
        .map(|i| i.name.clone())
        .collect()
}

/// The attachment's key in words, for messages.
pub fn describe(key: &AttachmentKey) -> String {
    format!("container {} interface {}", key.container_id, key.ifname)
}
