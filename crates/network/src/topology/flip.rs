//! The fast route flip: move one address's /32 from node X to node Y in one small
//! transaction, without re-reading the network (the full [`reconcile`](super::reconcile) reads
//! every row the network owns, hundreds of milliseconds at a thousand addresses — too slow for
//! a switchover inside a VM's pause window).
//!
//! It changes exactly what the plan says a flip changes: the fabric route's next hop (X's
//! transit address → Y's), X's local route out, Y's local route in. A `wait` on the fabric
//! route makes the transaction fail, changing nothing, if someone else moved the address in
//! between. A reconcile of the plan with the address on Y afterwards has nothing to do.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::overlay::{NodeSpec, gateway_port_name, node_router_name};
use super::reconcile::OWNER_KEY;
use crate::ovsdb::{Client, ops};
use crate::{Error, Result};

const ROUTES: &str = "Logical_Router_Static_Route";
const DB: &str = "OVN_Northbound";

/// What [`flip_route`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flip {
    /// The routes moved.
    Moved,
    /// The address already lived on the target: nothing was sent.
    AlreadyThere,
}

fn owned(network: &str) -> Value {
    ops::cond(
        "external_ids",
        "includes",
        ops::string_map([(OWNER_KEY, network)]),
    )
}

fn uuid_of(row: &Value) -> Option<String> {
    row.get("_uuid")?.get(1)?.as_str().map(str::to_string)
}

fn output_port(row: &Value) -> Option<&str> {
    // an optional column reads as a string, or as an empty set
    row.get("output_port").and_then(Value::as_str)
}

/// Move `ip`'s /32 in overlay `network` from `from` to `to`.
pub async fn flip_route(
    client: &Client,
    network: &str,
    ip: Ipv4Addr,
    from: &NodeSpec,
    to: &NodeSpec,
) -> Result<Flip> {
    Ok(flip(client, network, ip, from, to, false).await?.0)
}

/// [`flip_route`], and the same transaction bumps `NB_Global:nb_cfg` (the mechanism of
/// `ovn-nbctl --wait=hv`): the number it returns (none when nothing moved) is the one
/// [`wait_for_chassis`] waits for, to tell when every chassis has the flip in its data plane.
pub async fn flip_route_marked(
    client: &Client,
    network: &str,
    ip: Ipv4Addr,
    from: &NodeSpec,
    to: &NodeSpec,
) -> Result<(Flip, Option<i64>)> {
    flip(client, network, ip, from, to, true).await
}

async fn flip(
    client: &Client,
    network: &str,
    ip: Ipv4Addr,
    from: &NodeSpec,
    to: &NodeSpec,
    mark: bool,
) -> Result<(Flip, Option<i64>)> {
    let prefix = format!("{ip}/32");
    let invalid = |reason: String| Error::InvalidTopology {
        network: network.to_string(),
        reason,
    };
    let found = client
        .transact(
            DB,
            vec![ops::select(
                ROUTES,
                vec![ops::cond("ip_prefix", "==", json!(prefix)), owned(network)],
                Some(&["_uuid", "nexthop", "output_port"]),
            )],
        )
        .await?;
    let rows = found[0]["rows"].as_array().cloned().unwrap_or_default();
    let (from_gw, to_gw) = (
        gateway_port_name(network, &from.name),
        gateway_port_name(network, &to.name),
    );
    let fabric = rows.iter().find(|r| output_port(r).is_none());
    let local_from = rows
        .iter()
        .find(|r| output_port(r) == Some(from_gw.as_str()));
    let local_to = rows.iter().find(|r| output_port(r) == Some(to_gw.as_str()));
    let Some(fabric) = fabric else {
        return Err(invalid(format!(
            "no fabric route for {prefix}: reconcile the network first"
        )));
    };
    let fabric_hop = fabric["nexthop"].as_str().unwrap_or_default();
    if fabric_hop == to.join_ip.to_string() && local_to.is_some() && local_from.is_none() {
        return Ok((Flip::AlreadyThere, None));
    }
    if fabric_hop != from.join_ip.to_string() {
        return Err(invalid(format!(
            "{prefix} is routed to {fabric_hop}, not to {} ({}): refusing to move it",
            from.name, from.join_ip
        )));
    }
    let Some(local_from) = local_from else {
        return Err(invalid(format!(
            "no local route for {prefix} on {}",
            node_router_name(network, &from.name)
        )));
    };
    let (fabric_uuid, local_uuid) = (
        uuid_of(fabric).unwrap_or_default(),
        uuid_of(local_from).unwrap_or_default(),
    );
    let router = |node: &str| {
        vec![
            ops::cond("name", "==", json!(node_router_name(network, node))),
            owned(network),
        ]
    };
    // both routers exist (or nothing happens)
    let exists = |node: &str| {
        let name = node_router_name(network, node);
        json!({"op": "wait", "table": "Logical_Router", "timeout": 0, "where": router(node),
               "columns": ["name"], "until": "==", "rows": [{"name": name}]})
    };
    let mut txn = vec![
        exists(&from.name),
        exists(&to.name),
        // nobody moved it since we looked
        json!({"op": "wait", "table": ROUTES, "timeout": 0, "where": [ops::cond("_uuid", "==", ops::uuid(&fabric_uuid))],
               "columns": ["nexthop"], "until": "==", "rows": [{"nexthop": from.join_ip.to_string()}]}),
        ops::update(
            ROUTES,
            vec![ops::cond("_uuid", "==", ops::uuid(&fabric_uuid))],
            json!({"nexthop": to.join_ip.to_string()}),
        ),
        ops::mutate(
            "Logical_Router",
            router(&from.name),
            vec![ops::mutation(
                "static_routes",
                "delete",
                ops::set(vec![ops::uuid(&local_uuid)]),
            )],
        ),
        ops::delete(
            ROUTES,
            vec![ops::cond("_uuid", "==", ops::uuid(&local_uuid))],
        ),
    ];
    if local_to.is_none() {
        txn.push(ops::insert(
            ROUTES,
            json!({"ip_prefix": prefix, "nexthop": ip.to_string(), "output_port": to_gw,
                   "external_ids": ops::string_map([(OWNER_KEY, network)])}),
            Some("local"),
        ));
        txn.push(ops::mutate(
            "Logical_Router",
            router(&to.name),
            vec![ops::mutation(
                "static_routes",
                "insert",
                ops::set(vec![ops::named_uuid("local")]),
            )],
        ));
    }
    let marked_at = mark.then(|| {
        txn.push(ops::mutate(
            "NB_Global",
            vec![],
            vec![ops::mutation("nb_cfg", "+=", json!(1))],
        ));
        txn.push(ops::select("NB_Global", vec![], Some(&["nb_cfg"])));
        txn.len() - 1
    });
    txn.push(ops::comment(&format!(
        "roam: route flip {prefix} {} -> {}",
        from.name, to.name
    )));
    let done = client.transact(DB, txn).await?;
    let nb_cfg = match marked_at {
        Some(i) => Some(done[i]["rows"][0]["nb_cfg"].as_i64().ok_or_else(|| {
            Error::Protocol(format!(
                "NB_Global has no nb_cfg after bumping it: {}",
                done[i]
            ))
        })?),
        None => None,
    };
    Ok((Flip::Moved, nb_cfg))
}

/// How often [`wait_for_chassis`] looks at `hv_cfg`.
const SYNC_POLL: Duration = Duration::from_millis(2);

/// Wait until every chassis has applied northbound change `nb_cfg` (from
/// [`flip_route_marked`]): ovn-northd reports in `NB_Global:hv_cfg` the oldest change that
/// every ovn-controller has put in its switch. How long it took; [`Error::NotSynced`] after
/// `timeout`.
pub async fn wait_for_chassis(client: &Client, nb_cfg: i64, timeout: Duration) -> Result<Duration> {
    let started = Instant::now();
    loop {
        let got = client
            .transact(
                DB,
                vec![ops::select("NB_Global", vec![], Some(&["hv_cfg"]))],
            )
            .await?;
        let hv = got[0]["rows"][0]["hv_cfg"].as_i64().unwrap_or_default();
        if hv >= nb_cfg {
            return Ok(started.elapsed());
        }
        if started.elapsed() >= timeout {
            return Err(Error::NotSynced {
                nb_cfg,
                hv_cfg: hv,
                waited_ms: started.elapsed().as_millis() as u64,
            });
        }
        tokio::time::sleep(SYNC_POLL).await;
    }
}
