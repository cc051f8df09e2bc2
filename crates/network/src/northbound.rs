//! roam's one module that reads and writes OVN's northbound database: read the rows a network
//! owns, apply a [`diff`] in one transaction ([`reconcile`]), flip one address's routes
//! ([`flip_route`]) and wait until every chassis has a change ([`wait_for_chassis`]). The
//! decisions are [`crate::topology`]'s, pure; this module only moves them over a [`Client`].

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use roam_contract::keys::OWNER_KEY;
use roam_ovsdb::nb::{self, DATABASE};
use roam_ovsdb::{Client, TableRow, decode_select, ops};
use serde_json::Value;

use crate::topology::{
    ActualState, Flip, FlipPlan, NodeSpec, ReconcileReport, Topology, check, diff, flip_ops,
    flip_select,
};
use crate::{Error, Result};

fn owned_by(network: &str) -> Vec<Value> {
    vec![ops::cond(
        "external_ids",
        "includes",
        ops::string_map([(OWNER_KEY, network)]),
    )]
}

fn select_owned<T: TableRow>(network: &str) -> Value {
    let mut columns = vec!["_uuid"];
    columns.extend_from_slice(T::COLUMNS);
    ops::select(T::TABLE, owned_by(network), Some(&columns))
}

/// Read every row `network` owns, in one transaction (a consistent snapshot).
pub async fn read_actual(client: &Client, network: &str) -> Result<ActualState> {
    let res = client
        .transact(
            DATABASE,
            vec![
                select_owned::<nb::LogicalSwitch>(network),
                select_owned::<nb::LogicalSwitchPort>(network),
                select_owned::<nb::LogicalRouter>(network),
                select_owned::<nb::LogicalRouterPort>(network),
                select_owned::<nb::LogicalRouterStaticRoute>(network),
                select_owned::<nb::DhcpOptions>(network),
                select_owned::<nb::Qos>(network),
                select_owned::<nb::Nat>(network),
            ],
        )
        .await?;
    Ok(ActualState {
        switches: decode_select(&res[0])?,
        switch_ports: decode_select(&res[1])?,
        routers: decode_select(&res[2])?,
        router_ports: decode_select(&res[3])?,
        routes: decode_select(&res[4])?,
        dhcp_options: decode_select(&res[5])?,
        qos: decode_select(&res[6])?,
        nat: decode_select(&res[7])?,
    })
}

/// Send `ops` as one transaction (checked against the schema first: a value the schema
/// refuses fails without sending anything). Nothing is sent for an empty list. Either all
/// of `ops` land or, on any error, none does.
pub async fn apply(client: &Client, ops: Vec<Value>) -> Result<ReconcileReport> {
    let report = ReconcileReport::from_ops(&ops);
    if ops.is_empty() {
        return Ok(report);
    }
    client.transact_checked(DATABASE, ops).await?;
    Ok(report)
}

/// Make the rows `network` owns match `desired`: read them, [`diff`], and [`apply`] the
/// difference in one transaction. Idempotent: when nothing differs, nothing is sent.
///
/// On an error nothing was changed, except for [`roam_ovsdb::Error::Disconnected`] and
/// [`roam_ovsdb::Error::Timeout`], after which the outcome is unknown: reconcile again
/// (it re-reads the database first).
pub async fn reconcile(
    client: &Client,
    network: &str,
    desired: &Topology,
) -> Result<ReconcileReport> {
    check(desired, network)?;
    let actual = read_actual(client, network).await?;
    let mut ops = diff(&actual, desired, network);
    if ops.is_empty() {
        tracing::debug!(network, "OVN topology up to date");
        return Ok(ReconcileReport::default());
    }
    ops.push(ops::comment(&format!("roam: reconcile network {network}")));
    let report = apply(client, ops).await?;
    tracing::info!(network, %report, "OVN topology reconciled");
    Ok(report)
}

/// Move `ip`'s /32 in overlay `network` from `from` to `to` (see [`crate::topology::flip_ops`]).
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
    let found = client
        .transact(DATABASE, vec![flip_select(network, ip)])
        .await?;
    let rows = found[0]["rows"].as_array().cloned().unwrap_or_default();
    let (txn, nb_cfg_at) = match flip_ops(network, ip, from, to, mark, &rows)? {
        FlipPlan::AlreadyThere => return Ok((Flip::AlreadyThere, None)),
        FlipPlan::Send { ops, nb_cfg_at } => (ops, nb_cfg_at),
    };
    let done = client.transact(DATABASE, txn).await?;
    let nb_cfg = match nb_cfg_at {
        Some(i) => Some(done[i]["rows"][0]["nb_cfg"].as_i64().ok_or_else(|| {
            roam_ovsdb::Error::Protocol(format!(
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
                DATABASE,
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
