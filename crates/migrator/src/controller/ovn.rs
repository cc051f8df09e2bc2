//! The OVN side: per Network, a syncer that reconciles the whole topology (level-based: the
//! desired ports are every live Address with a host), debounced and batched — requests that
//! arrive while a reconcile runs are served together by the next one, so a thousand claims
//! are a handful of reconciles, not a thousand. A pod waits for the reconcile that covers its
//! claim before its address is published.
//!
//! The route controller: an Address that moved to another host while live gets its /32
//! flipped first ([`flip_route`]: one small transaction), then the full reconcile converges.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use std::collections::BTreeMap;

use futures::future::BoxFuture;
use roam_network::northbound::{apply, flip_route, read_actual, reconcile};
use roam_network::topology::{
    ActualState, NodeSpec, PortSpec, ReconcileReport, Topology, check, diff, plan_overlay,
    plan_underlay,
};
use roam_ovsdb::ReconnectingClient;
use serde_json::Value;
use tokio::sync::{Notify, mpsc, watch};

use super::Context;
use super::index::Moved;
use crate::error::{Error, Result};
use roam_api::{Address, NetworkMode};
use roam_core::claim::desired_ports;
use roam_core::network::{overlay_input, underlay_input};
use roam_core::ovn::{Delta, additions_only, delta};

pub(super) struct OvnSync {
    requested: AtomicU64,
    /// The next sync re-reads the network (after a route flip: the known rows changed).
    full: std::sync::atomic::AtomicBool,
    /// Writes to the network's rows behind the syncer's back (route flips), counted: a
    /// reconcile that read the rows before one of them would apply a stale diff (the flip's
    /// /32 added a second time), so the syncer reconciles again from a fresh read when this
    /// moved while it worked.
    behind: AtomicU64,
    kick: Notify,
    applied: watch::Sender<u64>,
    task: std::sync::Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl Drop for OvnSync {
    fn drop(&mut self) {
        if let Some(t) = self.task.lock().expect("task lock").take() {
            t.abort();
        }
    }
}

/// The OVN syncers' state: the OVN connections, one syncer per Network, the Addresses being
/// written, and the route controller's queue of host moves.
pub(crate) struct State {
    /// OVN northbound.
    nb: ReconnectingClient,
    /// OVN southbound (read only), when configured.
    sb: Option<ReconnectingClient>,
    /// The syncers' reads and writes of the NB (the NB client; a recording in tests).
    rows: Box<dyn Rows>,
    syncers: Mutex<HashMap<String, Arc<OvnSync>>>,
    /// Addresses being written right now, by name (see [`Tentative`]).
    tentative: Mutex<HashMap<String, Arc<Address>>>,
    flips: mpsc::UnboundedSender<Moved>,
}

impl State {
    pub(crate) fn new(
        (nb, sb): (ReconnectingClient, Option<ReconnectingClient>),
        rows: Box<dyn Rows>,
    ) -> (State, mpsc::UnboundedReceiver<Moved>) {
        let (flips, rx) = mpsc::unbounded_channel();
        let s = State {
            nb,
            sb,
            rows,
            syncers: Mutex::new(HashMap::new()),
            tentative: Mutex::new(HashMap::new()),
            flips,
        };
        (s, rx)
    }

    /// Hand a host move to the route controller.
    pub(crate) fn flip(&self, m: Moved) {
        let _ = self.flips.send(m);
    }
}

/// An Address being written, shown to the OVN syncer as written until the guard drops (a
/// claim's port is programmed while its write is in flight; a switchover's route is moved
/// before its write): a reconcile in between plans with it instead of undoing it.
pub(crate) struct Tentative {
    ctx: Arc<Context>,
    name: String,
}

impl Tentative {
    /// Show `a` (as it is about to be written) to the syncer.
    pub(crate) fn show(ctx: &Arc<Context>, a: Address) -> Tentative {
        let name = a.metadata.name.clone().unwrap_or_default();
        ctx.ovn
            .tentative
            .lock()
            .expect("tentative lock")
            .insert(name.clone(), Arc::new(a));
        Tentative {
            ctx: ctx.clone(),
            name,
        }
    }
}

impl Drop for Tentative {
    fn drop(&mut self) {
        self.ctx
            .ovn
            .tentative
            .lock()
            .expect("tentative lock")
            .remove(&self.name);
    }
}

fn syncer(ctx: &Arc<Context>, network: &str) -> Arc<OvnSync> {
    let mut map = ctx.ovn.syncers.lock().expect("ovn lock");
    if let Some(s) = map.get(network) {
        return s.clone();
    }
    let (applied, _) = watch::channel(0);
    let s = Arc::new(OvnSync {
        requested: AtomicU64::new(0),
        full: std::sync::atomic::AtomicBool::new(true),
        behind: AtomicU64::new(0),
        kick: Notify::new(),
        applied,
        task: std::sync::Mutex::new(None),
    });
    // the task holds a weak reference: the map owns the syncer, removing it stops the task
    let task = tokio::spawn(sync_loop(
        ctx.clone(),
        network.to_string(),
        Arc::downgrade(&s),
    ));
    *s.task.lock().expect("task lock") = Some(task);
    map.insert(network.to_string(), s.clone());
    s
}

/// Ask for a reconcile of `network`; returns the ticket to [`wait`] for.
pub(super) fn request(ctx: &Arc<Context>, network: &str) -> u64 {
    let s = syncer(ctx, network);
    let ticket = s.requested.fetch_add(1, Ordering::SeqCst) + 1;
    s.kick.notify_one();
    ticket
}

/// Wait until a reconcile that started after `ticket` was issued has applied.
pub(super) async fn wait(ctx: &Arc<Context>, network: &str, ticket: u64) -> Result<()> {
    let s = syncer(ctx, network);
    let mut rx = s.applied.subscribe();
    drop(s);
    match tokio::time::timeout(Duration::from_secs(30), rx.wait_for(|v| *v >= ticket)).await {
        Ok(Ok(_)) => Ok(()),
        _ => Err(Error::Ovn(
            roam_ovsdb::Error::Timeout {
                method: format!("reconcile of network {network}"),
                secs: 30,
            }
            .into(),
        )),
    }
}

/// What this controller last wrote to (or read from) OVN for a Network: the parent rows
/// (switches, routers, with their UUIDs), the workload ports, the nodes. With it, a batch
/// that only adds ports is one small transaction (no re-read of the network); anything else
/// — a port removed or changed, a node added — is a full reconcile.
pub(super) struct Known {
    parents: ActualState,
    ports: BTreeMap<String, PortSpec>,
    nodes: BTreeSet<String>,
}

async fn sync_loop(ctx: Arc<Context>, network: String, s: std::sync::Weak<OvnSync>) {
    // nothing is reconciled from a partial index: a controller that has listed the Networks
    // but not yet the Addresses would plan the network without its workloads and remove the
    // ports and routes of live pods until the Addresses are listed (at every leader change)
    ctx.wait_synced().await;
    let mut known: Option<Known> = None;
    loop {
        let Some(me) = s.upgrade() else { return };
        let pending = me.requested.load(Ordering::SeqCst) > *me.applied.borrow();
        if !pending {
            // a permit is stored when nobody waits, so a request in between is not missed
            let kick = async { me.kick.notified().await };
            kick.await;
            continue;
        }
        tokio::time::sleep(ctx.config.ovn_debounce).await;
        if !ctx
            .index
            .lock()
            .expect("index lock")
            .addresses_listed_for(&network)
        {
            // a Network just added to the managed set: its Addresses' watch is listing.
            // Planned without them, the network would lose its workloads' rows; the request
            // stays pending (its waiters keep waiting) until the list lands.
            drop(me);
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        }
        let target = me.requested.load(Ordering::SeqCst);
        let full = me.full.swap(false, Ordering::SeqCst);
        let behind = me.behind.load(Ordering::SeqCst);
        drop(me);
        if full {
            known = None;
        }
        match sync(&ctx, &network, &mut known).await {
            Ok(()) => {
                if let Some(me) = s.upgrade() {
                    me.applied.send_if_modified(|v| {
                        let changed = *v < target;
                        *v = (*v).max(target);
                        changed
                    });
                    if me.behind.load(Ordering::SeqCst) != behind {
                        // a flip landed while this reconcile worked: check its result afresh
                        me.full.store(true, Ordering::SeqCst);
                        me.requested.fetch_add(1, Ordering::SeqCst);
                    }
                }
            }
            Err(e) => {
                known = None;
                tracing::warn!(network, error = %e, "OVN reconcile failed; retrying");
                ctx.metrics.count("ovn_errors", e.reason());
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

/// Plans the topology for a list of ports (all of them, or a batch of new ones).
type Planner = Box<dyn Fn(&[PortSpec]) -> Result<Topology> + Send>;

/// What the index wants for `network`: its workload ports, its nodes
/// (the planner's node list for the overlay), and the planner (for all or some of the ports).
struct Wanted {
    ports: Vec<PortSpec>,
    nodes: BTreeSet<String>,
    plan_subset: Planner,
}

fn wanted(ctx: &Context, network: &str) -> Result<Option<Wanted>> {
    let idx = ctx.index.lock().expect("index lock");
    let Some(plan) = idx.networks.get(network).cloned() else {
        return Ok(None);
    };
    let mut addresses = idx.of_network(network);
    // claims being written: their ports are programmed while the write is in flight
    {
        let tentative = ctx.ovn.tentative.lock().expect("tentative lock");
        if tentative.values().any(|a| a.spec.network == network) {
            let mut by_name: BTreeMap<String, Arc<roam_api::Address>> = addresses
                .into_iter()
                .filter_map(|a| Some((a.metadata.name.clone()?, a)))
                .collect();
            for (name, a) in tentative.iter() {
                if a.spec.network == network {
                    by_name.insert(name.clone(), a.clone());
                }
            }
            addresses = by_name.into_values().collect();
        }
    }
    let nodes: Vec<String> = idx.nodes.iter().cloned().collect();
    match plan.mode {
        NetworkMode::Overlay => {
            let transit = idx.transit(network);
            let (spec, node_specs) = overlay_input(&plan, &transit, &nodes);
            let names: BTreeSet<String> = node_specs.iter().map(|n| n.name.clone()).collect();
            let (ports, skipped) = desired_ports(addresses.iter().map(|a| &**a), &names);
            if !skipped.is_empty() {
                tracing::debug!(network, ?skipped, "addresses without a port");
            }
            Ok(Some(Wanted {
                ports,
                nodes: names,
                plan_subset: Box::new(move |p| Ok(plan_overlay(&spec, &node_specs, p)?)),
            }))
        }
        NetworkMode::Underlay => {
            let names: BTreeSet<String> = nodes.into_iter().collect();
            let (ports, _) = desired_ports(addresses.iter().map(|a| &**a), &names);
            let Some(spec) = underlay_input(&plan) else {
                return Ok(None);
            };
            Ok(Some(Wanted {
                ports,
                nodes: names,
                plan_subset: Box::new(move |p| Ok(plan_underlay(&spec, p)?)),
            }))
        }
    }
}

/// What the OVN syncer reads of and writes to the northbound database: the NB itself
/// ([`ReconnectingClient`]), or in the controller's tests a recording of its transactions.
pub(crate) trait Rows: Send + Sync {
    /// The rows `network` owns, as they are.
    fn read<'a>(&'a self, network: &'a str) -> BoxFuture<'a, Result<ActualState>>;
    /// Apply `ops` as one transaction.
    fn apply(&self, ops: Vec<Value>) -> BoxFuture<'_, Result<ReconcileReport>>;
}

impl Rows for ReconnectingClient {
    fn read<'a>(&'a self, network: &'a str) -> BoxFuture<'a, Result<ActualState>> {
        Box::pin(async move { Ok(read_actual(&self.client()?, network).await?) })
    }
    fn apply(&self, ops: Vec<Value>) -> BoxFuture<'_, Result<ReconcileReport>> {
        Box::pin(async move { Ok(apply(&self.client()?, ops).await?) })
    }
}

/// Bring `network`'s OVN rows to what the index wants: only the new ports when nothing else
/// changed since `known`, else a full read + diff + apply (one transaction either way).
pub(super) async fn sync(
    ctx: &Arc<Context>,
    network: &str,
    known: &mut Option<Known>,
) -> Result<()> {
    let Some(w) = wanted(ctx, network)? else {
        return Ok(());
    };
    let rows = &*ctx.ovn.rows;
    let started = std::time::Instant::now();
    if let Some(k) = known.as_mut()
        && k.nodes == w.nodes
    {
        match delta(&k.ports, &w.ports) {
            Delta::Nothing => return Ok(()),
            Delta::Add(new) => {
                let subset = additions_only((w.plan_subset)(&new)?, &new);
                // the parents exist (with the UUIDs we know), no child row is in `parents`:
                // the diff inserts the new children and adds them to their parents, nothing else
                let mut ops = diff(&k.parents, &subset, network);
                ops.push(roam_ovsdb::ops::comment(&format!(
                    "roam: {} new ports in network {network}",
                    new.len()
                )));
                let report = rows.apply(ops).await?;
                for p in new {
                    k.ports.insert(p.name.clone(), p);
                }
                tracing::debug!(network, %report, took = ?started.elapsed(), "OVN ports added");
                return Ok(());
            }
            Delta::Full => {}
        }
    }
    let full = (w.plan_subset)(&w.ports)?;
    check(&full, network)?;
    let actual = rows.read(network).await?;
    let mut ops = diff(&actual, &full, network);
    let inserted_parents = ops.iter().any(|op| {
        op["op"] == "insert" && (op["table"] == "Logical_Switch" || op["table"] == "Logical_Router")
    });
    if !ops.is_empty() {
        ops.push(roam_ovsdb::ops::comment(&format!(
            "roam: reconcile network {network}"
        )));
        let report = rows.apply(ops).await?;
        tracing::info!(network, %report, took = ?started.elapsed(), "OVN topology reconciled");
    }
    *known = (!inserted_parents).then(|| Known {
        parents: ActualState {
            switches: actual.switches,
            routers: actual.routers,
            ..Default::default()
        },
        ports: w.ports.into_iter().map(|p| (p.name.clone(), p)).collect(),
        nodes: w.nodes,
    });
    Ok(())
}

/// Remove every OVN row of `network` (its Network object is gone).
pub(super) async fn remove(ctx: &Arc<Context>, network: &str) {
    if let Some(s) = ctx.ovn.syncers.lock().expect("ovn lock").remove(network)
        && let Some(t) = s.task.lock().expect("task lock").take()
    {
        t.abort();
    }
    match ctx.ovn.nb.client() {
        Ok(client) => {
            if let Err(e) = reconcile(&client, network, &Topology::default()).await {
                tracing::warn!(network, error = %e, "cannot remove the OVN rows of a deleted Network");
            }
        }
        Err(e) => tracing::warn!(network, error = %e, "no OVN connection"),
    }
}

/// Reconcile every Network now and then (drift repair; catches anything a missed request
/// left behind).
pub(super) async fn resync(ctx: Arc<Context>) {
    loop {
        tokio::time::sleep(Duration::from_secs(30)).await;
        let names: Vec<String> = ctx
            .index
            .lock()
            .expect("index lock")
            .networks
            .keys()
            .cloned()
            .collect();
        for n in names {
            request(&ctx, &n);
        }
    }
}

/// Note a write to `network`'s rows behind its syncer's back (see [`OvnSync::behind`]).
fn wrote_behind(ctx: &Context, network: &str) {
    if let Some(s) = ctx.ovn.syncers.lock().expect("ovn lock").get(network) {
        s.behind.fetch_add(1, Ordering::SeqCst);
    }
}

/// The two nodes of a move in an overlay network, as the planner sees them (`None`: not an
/// overlay, or a node unknown).
fn node_pair(ctx: &Context, network: &str, from: &str, to: &str) -> Option<(NodeSpec, NodeSpec)> {
    let idx = ctx.index.lock().expect("index lock");
    match idx.networks.get(network) {
        Some(plan) if plan.mode == NetworkMode::Overlay => {
            let (_, specs) = overlay_input(
                plan,
                &idx.transit(network),
                &[from.to_string(), to.to_string()],
            );
            let f = specs.iter().find(|n| n.name == from).cloned();
            let t = specs.iter().find(|n| n.name == to).cloned();
            f.zip(t)
        }
        _ => None,
    }
}

/// The route controller: flip a moved Address's /32, then let the full reconcile converge.
pub(super) async fn route_flips(ctx: Arc<Context>, mut rx: mpsc::UnboundedReceiver<Moved>) {
    while let Some(m) = rx.recv().await {
        let nodes = node_pair(&ctx, &m.network, &m.from, &m.to);
        if let (Some((from, to)), Ok(ip), Ok(client)) = (nodes, m.ip.parse(), ctx.ovn.nb.client()) {
            let started = std::time::Instant::now();
            match flip_route(&client, &m.network, ip, &from, &to).await {
                Ok(r) => {
                    wrote_behind(&ctx, &m.network);
                    tracing::info!(address = %m.address, from = %m.from, to = %m.to, result = ?r, took = ?started.elapsed(), "route flipped");
                    ctx.metrics.count("route_flips", "moved");
                }
                // e.g. no route on the old host yet: the reconcile below programs it
                Err(e) => {
                    tracing::debug!(address = %m.address, error = %e, "no fast flip; the reconcile converges")
                }
            }
        }
        request(&ctx, &m.network);
    }
}

/// How often [`wait_for_activation`] reads the SB.
const ACTIVATION_POLL: Duration = Duration::from_millis(2);

/// Wait until `chassis` has activated every one of the multi-chassis `ports` (the guest's
/// RARP reached the target and its ovn-controller carries the ports' traffic there), reading
/// their `Port_Binding`s from the southbound database every 2 ms. How long it took; `None`
/// without a southbound database configured, after `timeout`, or when the SB cannot be read
/// (a figure for the status: nothing waits on it).
pub(super) async fn wait_for_activation(
    ctx: &Context,
    ports: &[String],
    chassis: &str,
    timeout: Duration,
) -> Option<Duration> {
    let client = ctx.ovn.sb.as_ref()?.client().ok()?;
    // one select per port (`logical_port` is a plain string column: a set of several names
    // is not a valid condition on it)
    let selects: Vec<serde_json::Value> = ports
        .iter()
        .map(|p| {
            roam_ovsdb::ops::select(
                "Port_Binding",
                vec![roam_ovsdb::ops::cond(
                    "logical_port",
                    "==",
                    serde_json::json!(p),
                )],
                Some(&["logical_port", "options"]),
            )
        })
        .collect();
    let started = std::time::Instant::now();
    while started.elapsed() < timeout {
        let got = match client.transact("OVN_Southbound", selects.clone()).await {
            Ok(got) => got,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the southbound database: no switchover figure");
                return None;
            }
        };
        let rows: Vec<serde_json::Value> = got
            .iter()
            .filter_map(|r| r["rows"].as_array())
            .flatten()
            .cloned()
            .collect();
        if roam_core::ovn::all_activated(&rows, ports, chassis) {
            return Some(started.elapsed());
        }
        tokio::time::sleep(ACTIVATION_POLL).await;
    }
    None
}
