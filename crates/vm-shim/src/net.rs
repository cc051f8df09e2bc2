//! The VM's network plumbing on this node: a persistent kernel tap (created with the TUN
//! ioctls, brought up with rtnetlink) added to the node's integration bridge as a plain
//! (system) port whose `external_ids:iface-id` is the VM's OVN logical port, through the
//! node's Open_vSwitch database. On OVS's userspace datapath QEMU cannot open an OVS internal
//! port (vswitchd holds it), so a kernel tap it is. Every step is idempotent: a restarted shim
//! or a second `prepare` finds what is there and leaves it.

use futures::TryStreamExt;
use roam_contract::keys::IFACE_ID;

/// The interface key ovn-controller sets once a port's flows are installed.
const OVN_INSTALLED: &str = "ovn-installed";
use roam_ovsdb::{self as ovsdb, Client, ops};
use serde_json::json;

use crate::{Error, Result, sys};

/// MTU of the tap (the overlay's MTU is handed to the guest by DHCP; the tap only must not
/// be smaller).
pub const TAP_MTU: u32 = 1500;

async fn rtnl() -> Result<rtnetlink::Handle> {
    let (conn, handle, _) =
        rtnetlink::new_connection().map_err(|e| Error::plumbing("open rtnetlink", e))?;
    tokio::spawn(conn);
    Ok(handle)
}

/// Interface `name` of this network namespace, if it exists.
async fn link(name: &str) -> Result<Option<rtnetlink::packet_route::link::LinkMessage>> {
    let handle = rtnl().await?;
    let mut links = handle.link().get().match_name(name.to_string()).execute();
    match links.try_next().await {
        Ok(msg) => Ok(msg),
        // ENODEV: no such interface
        Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -libc::ENODEV => Ok(None),
        Err(e) => Err(Error::plumbing(format!("look up interface {name}"), e)),
    }
}

/// The interface index of `name` in this network namespace, if it exists.
pub async fn link_index(name: &str) -> Result<Option<u32>> {
    Ok(link(name).await?.map(|msg| msg.header.index))
}

/// Whether a process holds the tap `name` open (QEMU, while it runs the VM here): the kernel
/// gives a tap its carrier when a descriptor attaches and takes it away when the last one
/// closes. `None`: no such interface.
pub async fn tap_held(name: &str) -> Result<Option<bool>> {
    Ok(link(name).await?.map(|msg| {
        msg.attributes.iter().any(|a| {
            matches!(
                a,
                rtnetlink::packet_route::link::LinkAttribute::Carrier(c) if *c != 0
            )
        })
    }))
}

/// Create the tap `name` (unless it exists) and bring it up with MTU [`TAP_MTU`].
pub async fn ensure_tap(name: &str) -> Result<()> {
    let index = match link_index(name).await? {
        Some(i) => i,
        None => {
            let n = name.to_string();
            tokio::task::spawn_blocking(move || sys::create_persistent_tap(&n))
                .await
                .map_err(|e| Error::plumbing(format!("create tap {name}"), e))?
                .map_err(|e| Error::plumbing(format!("create tap {name}"), e))?;
            link_index(name).await?.ok_or_else(|| {
                Error::plumbing(
                    format!("create tap {name}"),
                    "the tap vanished right after its creation",
                )
            })?
        }
    };
    let handle = rtnl().await?;
    handle
        .link()
        .set(
            rtnetlink::LinkUnspec::new_with_index(index)
                .mtu(TAP_MTU)
                .up()
                .build(),
        )
        .execute()
        .await
        .map_err(|e| Error::plumbing(format!("bring tap {name} up"), e))
}

/// Delete the tap `name` if it exists.
pub async fn remove_tap(name: &str) -> Result<()> {
    if let Some(index) = link_index(name).await? {
        let handle = rtnl().await?;
        handle
            .link()
            .del(index)
            .execute()
            .await
            .map_err(|e| Error::plumbing(format!("delete tap {name}"), e))?;
    }
    Ok(())
}

async fn ovs(db: &str) -> Result<Client> {
    Client::connect(db)
        .await
        .map_err(|e| Error::plumbing(format!("connect to Open_vSwitch at {db}"), e))
}

/// Add `port` to `bridge` as a system port bound to the OVN logical port `iface_id`; when
/// the port exists, (re)set its `iface-id`. One transaction. Any other interface on this
/// node bound to the same `iface_id` is a leftover (a VM's port is on one node only, and a
/// migration's two ends are on two): its OVS port is removed first, so that ovn-controller
/// never has two interfaces to choose from.
pub async fn ensure_ovs_port(db: &str, bridge: &str, port: &str, iface_id: &str) -> Result<()> {
    let client = ovs(db).await?;
    let what = || format!("add {port} to {bridge} (iface-id {iface_id})");
    let bound: Vec<ovsdb::vswitch::Interface> = ovsdb::select_where(
        &client,
        vec![ops::cond(
            "external_ids",
            "includes",
            ops::string_map([(IFACE_ID, iface_id)]),
        )],
    )
    .await
    .map_err(|e| Error::plumbing(what(), e))?;
    for stale in bound.iter().filter(|i| i.name != port) {
        tracing::warn!(%iface_id, %port, stale = %stale.name, "another interface here carries this port's iface-id (a leftover): removing its OVS port");
        remove_ovs_port(db, bridge, &stale.name).await?;
    }
    let ifaces: Vec<ovsdb::vswitch::Interface> =
        ovsdb::select_where(&client, vec![ops::cond("name", "==", json!(port))])
            .await
            .map_err(|e| Error::plumbing(what(), e))?;
    let ops = if let Some(iface) = ifaces.first() {
        if iface.external_ids.0.get(IFACE_ID).map(String::as_str) == Some(iface_id) {
            return Ok(());
        }
        vec![
            ops::mutate(
                "Interface",
                vec![ops::cond("_uuid", "==", iface.uuid.to_json())],
                vec![ops::mutation(
                    "external_ids",
                    "delete",
                    json!(["set", [IFACE_ID]]),
                )],
            ),
            ops::mutate(
                "Interface",
                vec![ops::cond("_uuid", "==", iface.uuid.to_json())],
                vec![ops::mutation(
                    "external_ids",
                    "insert",
                    ops::string_map([(IFACE_ID, iface_id)]),
                )],
            ),
        ]
    } else {
        vec![
            // the bridge must exist: the mutate below then changes exactly one row
            ops::insert(
                "Interface",
                json!({"name": port, "external_ids": ops::string_map([(IFACE_ID, iface_id)])}),
                Some("iface"),
            ),
            ops::insert(
                "Port",
                json!({"name": port, "interfaces": ops::named_uuid("iface")}),
                Some("port"),
            ),
            ops::mutate(
                "Bridge",
                vec![ops::cond("name", "==", json!(bridge))],
                vec![ops::mutation(
                    "ports",
                    "insert",
                    ops::set(vec![ops::named_uuid("port")]),
                )],
            ),
            json!({"op": "wait", "table": "Bridge", "timeout": 0,
                   "where": [["name", "==", bridge]], "columns": ["name"],
                   "until": "==", "rows": [{"name": bridge}]}),
        ]
    };
    let res = client
        .transact(ovsdb::vswitch::DATABASE, ops)
        .await
        .map_err(|e| Error::plumbing(what(), e))?;
    if let Some(err) = res.iter().find_map(|r| r.get("error")) {
        return Err(Error::plumbing(what(), err));
    }
    Ok(())
}

/// Interface `port`'s row (`None`: no such interface); `what` names the read in an error.
async fn interface(db: &str, port: &str, what: &str) -> Result<Option<ovsdb::vswitch::Interface>> {
    let client = ovs(db).await?;
    let ifaces: Vec<ovsdb::vswitch::Interface> =
        ovsdb::select_where(&client, vec![ops::cond("name", "==", json!(port))])
            .await
            .map_err(|e| Error::plumbing(format!("read {what}"), e))?;
    Ok(ifaces.into_iter().next())
}

/// The OpenFlow port number ovs-vswitchd gave interface `port` (`None`: no such interface,
/// or not (yet) attached).
pub async fn ofport(db: &str, port: &str) -> Result<Option<u16>> {
    let iface = interface(db, port, &format!("{port}'s OpenFlow port")).await?;
    Ok(iface
        .and_then(|i| i.ofport)
        .and_then(|p| u16::try_from(p).ok())
        .filter(|p| *p > 0))
}

/// Whether ovn-controller has claimed the OVN port of interface `port` on this chassis and
/// installed its flows (it sets `external_ids:ovn-installed=true` then; also for a port it
/// binds as an additional chassis, before that binding is activated).
pub async fn ovn_installed(db: &str, port: &str) -> Result<bool> {
    let iface = interface(db, port, &format!("whether OVN installed {port}")).await?;
    Ok(iface
        .is_some_and(|i| i.external_ids.0.get(OVN_INSTALLED).map(String::as_str) == Some("true")))
}

/// The OpenFlow management socket of `bridge` for the Open_vSwitch database `db`
/// (`unix:<rundir>/db.sock` → `<rundir>/<bridge>.mgmt`); `None` for a database reached over
/// TCP (the switch's run directory is then unknown).
pub fn mgmt_socket(db: &str, bridge: &str) -> Option<std::path::PathBuf> {
    let sock = std::path::Path::new(db.strip_prefix("unix:")?);
    Some(sock.parent()?.join(format!("{bridge}.mgmt")))
}

/// Remove `port` from `bridge` (OVS then drops its Port and Interface rows).
pub async fn remove_ovs_port(db: &str, bridge: &str, port: &str) -> Result<()> {
    let client = ovs(db).await?;
    let what = || format!("remove {port} from {bridge}");
    let ports: Vec<ovsdb::vswitch::Port> =
        ovsdb::select_where(&client, vec![ops::cond("name", "==", json!(port))])
            .await
            .map_err(|e| Error::plumbing(what(), e))?;
    let Some(p) = ports.first() else {
        return Ok(());
    };
    let res = client
        .transact(
            ovsdb::vswitch::DATABASE,
            vec![ops::mutate(
                "Bridge",
                vec![ops::cond("name", "==", json!(bridge))],
                vec![ops::mutation(
                    "ports",
                    "delete",
                    ops::set(vec![p.uuid.to_json()]),
                )],
            )],
        )
        .await
        .map_err(|e| Error::plumbing(what(), e))?;
    if let Some(err) = res.iter().find_map(|r| r.get("error")) {
        return Err(Error::plumbing(what(), err));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How [`tap_held`] tells a tap QEMU still uses from one nothing uses any more, on real
    /// taps in a network namespace of the test's own (needs root, as CI runs it).
    #[test]
    fn a_tap_is_held_only_while_a_descriptor_is_attached() {
        std::thread::spawn(|| {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)
                .expect("a network namespace of the test's own (run the tests as root)");
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                assert_eq!(tap_held("roamt0").await.unwrap(), None, "no tap yet");
                sys::create_persistent_tap("roamt0").unwrap();
                assert_eq!(
                    tap_held("roamt0").await.unwrap(),
                    Some(false),
                    "made, not held"
                );
                let qemu = sys::open_tap("roamt0").unwrap();
                assert_eq!(tap_held("roamt0").await.unwrap(), Some(true), "held");
                drop(qemu);
                assert_eq!(tap_held("roamt0").await.unwrap(), Some(false), "let go");
                remove_tap("roamt0").await.unwrap();
                assert_eq!(tap_held("roamt0").await.unwrap(), None, "removed");
            });
        })
        .join()
        .expect("the test thread");
    }
}
