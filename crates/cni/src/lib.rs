//! roam-cni: the CNI plugin (spec 1.1) that plumbs the addresses roam-controller published
//! on a pod (`roam.dev/addresses`, see [`roam_contract::annotation`]).
//!
//! Pure core (no I/O, unit-tested): [`config`] (stdin and environment), [`plan`] (what to
//! plumb per interface, host-side names), [`result`] (the CNI result and `prevResult`),
//! [`check`] (CHECK's comparison), [`trust`] (the annotation's addresses against the
//! Address objects). I/O adapters, thin: [`kube`] (the pod's annotation and its Addresses),
//! [`ovs`] (the node's Open_vSwitch database, through roam-ovsdb),
//! [`netlink`] (rtnetlink in the host's and the pod's namespaces — never the `ip` command).
//! [`run`] wires them per command.
//!
//! - ADD: wait (bounded) for the annotation and for every Address it lists to say it is the
//!   pod's (owner, node, IP, MAC, Network: the annotation alone is never trusted); per interface a veth pair, the pod side named,
//!   MAC'd and MTU'd per the annotation (transmit offloads off when the bridge's datapath is
//!   OVS's userspace one, see [`ethtool`]), the host side a port of `br-int` with
//!   `external_ids:iface-id` = the OVN port; overlay: `A/32`, `GW/32` on-link, default via GW;
//!   underlay: `A/plen`, default via GW. DHCP-annotated interfaces get the same values set
//!   statically (they are what OVN's DHCP row holds; a container has no DHCP client). A
//!   failed ADD removes whatever it created. A VM's launcher pod (labelled
//!   `roam.dev/launcher`) is isolated instead: its VM has the VM's addresses through its
//!   runner, and the pod gets only `CNI_IFNAME` with a link-local address, leading nowhere.
//! - DEL: finds the attachment's ports by `external_ids` (network, container, ifname) and
//!   its veths by their derived names; needs only CNI_CONTAINERID, CNI_IFNAME and the config;
//!   what is already gone is success.
//! - CHECK: compares the pod's links, addresses, routes, the host veths and the OVS ports
//!   with `prevResult`.
//! - STATUS: the node's OVSDB answers and has the bridge. GC: removes the network's
//!   attachments missing from `cni.dev/valid-attachments`.

#![warn(missing_docs)]

pub mod check;
pub mod config;
mod error;
pub mod ethtool;
pub mod kube;
pub mod netlink;
pub mod ovs;
pub mod plan;
pub mod result;
pub mod trust;

use std::collections::BTreeSet;
use std::fs::File;
use std::time::Duration;

use serde_json::{Value, json};

pub use error::{Error, Result, code};

use config::{AttachmentKey, CniEnv, Command, LATEST, NetConf, SUPPORTED_VERSIONS};
use netlink::Netlink;
use ovs::Ovs;
use plan::{InterfacePlan, ids};

/// How long ADD waits for ovs-vswitchd to open the host veths.
const OPEN_TIMEOUT: Duration = Duration::from_secs(10);

/// The VERSION answer for the version the runtime asked about (`stdin` may be empty).
pub fn version(stdin: &[u8]) -> Value {
    let asked = serde_json::from_slice::<Value>(stdin)
        .ok()
        .and_then(|v| {
            v.get("cniVersion")
                .and_then(Value::as_str)
                .map(str::to_string)
        })
        .filter(|v| config::is_supported(v))
        .unwrap_or_else(|| LATEST.into());
    json!({"cniVersion": asked, "supportedVersions": SUPPORTED_VERSIONS})
}

/// The CNI error JSON for `e`, in the version of `stdin`'s config when it names one.
pub fn error_json(e: &Error, stdin: &[u8]) -> Value {
    let v = serde_json::from_slice::<Value>(stdin)
        .ok()
        .and_then(|v| {
            v.get("cniVersion")
                .and_then(Value::as_str)
                .map(str::to_string)
        })
        .filter(|v| config::is_supported(v))
        .unwrap_or_else(|| LATEST.into());
    json!({"cniVersion": v, "code": e.code(), "msg": e.to_string(), "details": e.details()})
}

/// Run one CNI command; `Ok(Some(json))` is printed on stdout, `Ok(None)` prints nothing.
pub async fn run(env: &CniEnv, stdin: &[u8]) -> Result<Option<Value>> {
    if env.command == Command::Version {
        return Ok(Some(version(stdin)));
    }
    let conf = config::parse_conf(env.command, stdin)?;
    match env.command {
        Command::Add => add(env, &conf).await.map(Some),
        Command::Del => del(env, &conf).await.map(|()| None),
        Command::Check => check(env, &conf).await.map(|()| None),
        Command::Status => status(&conf).await.map(|()| None),
        Command::Gc => gc(&conf).await.map(|()| None),
        Command::Version => unreachable!("answered above"),
    }
}

fn open_netns(env: &CniEnv) -> Result<File> {
    let path = env
        .netns
        .clone()
        .expect("ADD and CHECK environments carry CNI_NETNS");
    File::open(&path).map_err(|source| {
        if source.kind() == std::io::ErrorKind::NotFound {
            Error::NetnsGone { path, source }
        } else {
            Error::InvalidEnv {
                var: "CNI_NETNS",
                problem: format!("{} cannot be opened: {source}", path.display()),
            }
        }
    })
}

async fn add(env: &CniEnv, conf: &NetConf) -> Result<Value> {
    let key = env.key();
    let (namespace, pod) = env.pod()?;
    let netns = open_netns(env)?;
    let ovs = Ovs::connect(&conf.ovs_db, &conf.bridge).await?;
    let attachment = kube::wait_addresses(
        conf.kubeconfig
            .as_deref()
            .expect("ADD configs carry a kubeconfig"),
        &namespace,
        &pod,
        conf.annotation_timeout,
    )
    .await?;
    let addresses = match attachment {
        kube::Attachment::Addresses(a) => a,
        kube::Attachment::Isolated => return isolate(env, conf, &netns).await,
    };
    let plans = plan::plan(&conf.name, key, (&namespace, &pod), &addresses)?;
    let host = Netlink::host()?;
    // an earlier ADD of the same attachment that died midway: start clean
    let leftovers = teardown(&conf.name, key, &ovs, &host).await;
    if !leftovers.is_empty() {
        return Err(Error::CleanupIncomplete {
            context: format!(
                "removing what an earlier ADD of {} left",
                result::describe(key)
            ),
            errors: leftovers,
        });
    }
    let tx_offloads = match conf.tx_offloads {
        Some(keep) => keep,
        None => ovs.datapath_type().await? != "netdev",
    };
    match plumb(&plans, &netns, &ovs, &host, tx_offloads).await {
        Ok(()) => {
            let r = result::build(&plans, env.netns.as_deref().expect("checked"));
            Ok(result::render(&r, &conf.cni_version))
        }
        Err(e) => {
            let rollback = teardown(&conf.name, key, &ovs, &host).await;
            if rollback.is_empty() {
                Err(e)
            } else {
                Err(Error::RolledBackBadly {
                    primary: Box::new(e),
                    rollback,
                })
            }
        }
    }
}

/// A launcher pod's network: `CNI_IFNAME` with [`result::ISOLATED_IP`] (a runtime wants an
/// address on it), one end of a veth pair whose other end is in the pod too, down; no route,
/// nothing on the host side.
/// The other end of an isolated pod's interface.
const ISOLATED_PEER: &str = "roam-none";

async fn isolate(env: &CniEnv, conf: &NetConf, netns: &File) -> Result<Value> {
    let pod = Netlink::in_netns(netns)?;
    let ifname = &env.key().ifname;
    if pod.index(ifname).await?.is_none() {
        pod.create_veth_here(ifname, ISOLATED_PEER).await?;
    }
    let index = pod.set_up(ifname).await?;
    let has = pod
        .addresses(&pod.links().await?)
        .await?
        .iter()
        .any(|a| a.ip == result::ISOLATED_IP);
    if !has {
        pod.add_address(index, ifname, result::ISOLATED_IP, 32)
            .await?;
    }
    let r = result::isolated(ifname, env.netns.as_deref().expect("ADD carries CNI_NETNS"));
    Ok(result::render(&r, &conf.cni_version))
}

async fn plumb(
    plans: &[InterfacePlan],
    netns: &File,
    ovs: &Ovs,
    host: &Netlink,
    tx_offloads: bool,
) -> Result<()> {
    let pod = Netlink::in_netns(netns)?;
    let genl = match tx_offloads {
        true => None,
        false => Some(netlink::enter(netns, ethtool::socket)??),
    };
    for p in plans {
        host.create_veth(&p.host_ifname, &p.pod_ifname, p.mac, p.mtu, netns)
            .await?;
        host.set_up(&p.host_ifname).await?;
        ovs.add_port(&p.host_ifname, &p.external_ids).await?;
        if let Some(sock) = &genl {
            ethtool::disable_tx_offloads(sock, &p.pod_ifname)?;
        }
        let index = pod.set_up(&p.pod_ifname).await?;
        pod.add_address(index, &p.pod_ifname, p.ip, p.prefix_len)
            .await?;
        for r in &p.routes {
            pod.add_route(index, &p.pod_ifname, r).await?;
        }
    }
    let names: Vec<String> = plans.iter().map(|p| p.host_ifname.clone()).collect();
    ovs.wait_opened(&names, OPEN_TIMEOUT).await
}

/// Remove every port and veth of the attachment; keeps going past failures and returns
/// them all (empty: nothing of it is left).
async fn teardown(network: &str, key: &AttachmentKey, ovs: &Ovs, host: &Netlink) -> Vec<String> {
    let mut errors = Vec::new();
    let mut names = BTreeSet::new();
    let stem = plan::host_stem(network, key);
    match host.links().await {
        Ok(links) => names.extend(
            links
                .into_iter()
                .map(|(_, l)| l.name)
                .filter(|n| n.starts_with(&stem)),
        ),
        Err(e) => errors.push(e.to_string()),
    }
    let filter = [
        (ids::NETWORK, network),
        (ids::CONTAINER, key.container_id.as_str()),
        (ids::IFNAME, key.ifname.as_str()),
    ];
    match ovs.find(&filter).await {
        Ok(ports) => names.extend(ports.into_iter().map(|p| p.port.name)),
        Err(e) => errors.push(e.to_string()),
    }
    let names: Vec<String> = names.into_iter().collect();
    if let Err(e) = ovs.delete_ports(&names).await {
        errors.push(e.to_string());
    }
    for n in &names {
        if let Err(e) = host.delete(n).await {
            errors.push(e.to_string());
        }
    }
    errors
}

async fn del(env: &CniEnv, conf: &NetConf) -> Result<()> {
    let key = env.key();
    let host = Netlink::host()?;
    let ovs = match Ovs::connect(&conf.ovs_db, &conf.bridge).await {
        Ok(ovs) => ovs,
        Err(e) => {
            // still remove the veths (their pod ends go with them); the ports stay until a
            // retried DEL finds them by external_ids
            let stem = plan::host_stem(&conf.name, key);
            if let Ok(links) = host.links().await {
                for (_, l) in links.into_iter().filter(|(_, l)| l.name.starts_with(&stem)) {
                    let _ = host.delete(&l.name).await;
                }
            }
            return Err(e);
        }
    };
    let errors = teardown(&conf.name, key, &ovs, &host).await;
    if errors.is_empty() {
        Ok(())
    } else {
        Err(Error::CleanupIncomplete {
            context: format!("DEL of {}", result::describe(key)),
            errors,
        })
    }
}

async fn check(env: &CniEnv, conf: &NetConf) -> Result<()> {
    let prev = result::parse_prev(conf.prev_result.as_ref().expect("CHECK configs carry it"))?;
    let netns = open_netns(env)?;
    let pod = Netlink::in_netns(&netns)?;
    let host = Netlink::host()?;
    let ovs = Ovs::connect(&conf.ovs_db, &conf.bridge).await?;
    let pod_links = pod.links().await?;
    let host_names = result::host_interfaces(&prev);
    let observed = check::Observed {
        pod_addrs: pod.addresses(&pod_links).await?,
        pod_routes: pod.routes(&pod_links).await?,
        pod_links: pod_links.into_iter().map(|(_, l)| l).collect(),
        host_links: host
            .links()
            .await?
            .into_iter()
            .map(|(_, l)| l)
            .filter(|l| host_names.contains(&l.name))
            .collect(),
        ports: ovs
            .named(&host_names)
            .await?
            .into_iter()
            .map(|p| p.port)
            .collect(),
    };
    let drifts = check::compare(&prev, &observed);
    if drifts.is_empty() {
        Ok(())
    } else {
        Err(Error::CheckFailed { drifts })
    }
}

async fn status(conf: &NetConf) -> Result<()> {
    // without the node's OVS, existing pods have no datapath either: 51
    let degraded = |reason: String| Error::NotAvailable {
        reason,
        degraded: true,
    };
    let ovs = Ovs::connect(&conf.ovs_db, &conf.bridge)
        .await
        .map_err(|e| degraded(e.to_string()))?;
    if !ovs
        .bridge_exists()
        .await
        .map_err(|e| degraded(e.to_string()))?
    {
        return Err(degraded(format!(
            "bridge {} does not exist in {} (ovn-controller creates it)",
            conf.bridge, conf.ovs_db
        )));
    }
    if let Some(k) = &conf.kubeconfig
        && let Err(e) = std::fs::metadata(k)
    {
        return Err(Error::NotAvailable {
            reason: format!("kubeconfig {}: {e} (the installer writes it)", k.display()),
            degraded: false,
        });
    }
    Ok(())
}

async fn gc(conf: &NetConf) -> Result<()> {
    let valid: BTreeSet<&AttachmentKey> = conf
        .valid_attachments
        .as_ref()
        .expect("GC configs carry the list")
        .iter()
        .collect();
    let ovs = Ovs::connect(&conf.ovs_db, &conf.bridge).await?;
    let host = Netlink::host()?;
    let ports = ovs.find(&[(ids::NETWORK, conf.name.as_str())]).await?;
    let stale: BTreeSet<AttachmentKey> = ports
        .into_iter()
        .filter_map(|p| {
            Some(AttachmentKey {
                container_id: p.external_ids.get(ids::CONTAINER)?.clone(),
                ifname: p.external_ids.get(ids::IFNAME)?.clone(),
            })
        })
        .filter(|k| !valid.contains(k))
        .collect();
    let mut errors = Vec::new();
    for k in &stale {
        errors.extend(teardown(&conf.name, k, &ovs, &host).await);
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(Error::CleanupIncomplete {
            context: format!("GC of {} stale attachment(s)", stale.len()),
            errors,
        })
    }
}

#[cfg(test)]
mod tests;
