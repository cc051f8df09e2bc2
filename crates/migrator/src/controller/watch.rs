//! Watches that feed the index: Addresses, Networks (those the selector picks) and Nodes.
//! With a Network selector, only the managed Networks' Addresses are watched (label
//! `roam.dev/network in (...)`), the watch started again when that set changes.
//! A watch that breaks is re-listed (kube's watcher, with backoff); a re-list replaces what
//! the index holds, so a delete missed while disconnected is not kept forever.

use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::runtime::{WatchStreamExt, watcher};

use super::Context;
use roam_api::{Address, Network};

/// The watches' state: the managed Networks' names (`None` until the Network watch has
/// listed), which the Address watch follows.
#[derive(Default)]
pub(crate) struct State {
    managed: tokio::sync::watch::Sender<Option<std::collections::BTreeSet<String>>>,
}

fn rv_of<K: kube::Resource>(k: &K) -> Option<u64> {
    k.meta().resource_version.as_deref()?.parse().ok()
}

pub(super) fn mark_synced(ctx: &Context, which: usize) {
    let mut idx = ctx.index.lock().expect("index lock");
    if !idx.synced[which] {
        idx.synced[which] = true;
        tracing::info!(
            which = ["addresses", "networks", "nodes"][which],
            "initial list done"
        );
    }
    drop(idx);
    ctx.wake.synced.notify_waiters();
}

/// Watch the Addresses of the managed Networks (every Address without a Network selector).
pub(super) async fn addresses(ctx: Arc<Context>) {
    let api: Api<Address> = Api::all(ctx.client.clone());
    if ctx.config.network_selector.is_none() {
        return watch_addresses(&ctx, api, watcher::Config::default(), None).await;
    }
    let mut managed = ctx.watch.managed.subscribe();
    loop {
        let names = match managed.wait_for(Option::is_some).await {
            Ok(n) => n.clone().unwrap_or_default(),
            Err(_) => return,
        };
        match roam_core::network::address_selector(super::NETWORK_LABEL, &names) {
            None => {
                // no managed Network: no Address of ours
                {
                    let mut idx = ctx.index.lock().expect("index lock");
                    idx.relist(Vec::new());
                    idx.retain_networks(&names);
                    idx.addresses_listed = Some(Some(names.clone()));
                }
                mark_synced(&ctx, 0);
                if managed.changed().await.is_err() {
                    return;
                }
            }
            Some(selector) => {
                tracing::info!(%selector, "watching the managed Networks' Addresses");
                let wc = watcher::Config::default().labels(&selector);
                tokio::select! {
                    _ = watch_addresses(&ctx, api.clone(), wc, Some(&names)) => return,
                    r = managed.changed() => if r.is_err() { return },
                }
            }
        }
    }
}

/// Feed the index from a watch of `api` (with `wc`); `scope`: the managed Networks (an
/// Address of another one is forgotten at a re-list).
async fn watch_addresses(
    ctx: &Arc<Context>,
    api: Api<Address>,
    wc: watcher::Config,
    scope: Option<&std::collections::BTreeSet<String>>,
) {
    let mut stream = watcher(api, wc).default_backoff().boxed();
    let mut init: Vec<Address> = Vec::new();
    loop {
        match stream.try_next().await {
            Ok(Some(watcher::Event::Apply(a))) => {
                ctx.upsert(a);
            }
            Ok(Some(watcher::Event::Delete(a))) => {
                let name = a.metadata.name.clone().unwrap_or_default();
                ctx.index
                    .lock()
                    .expect("index lock")
                    .remove(&name, rv_of(&a));
            }
            Ok(Some(watcher::Event::Init)) => init.clear(),
            Ok(Some(watcher::Event::InitApply(a))) => init.push(a),
            Ok(Some(watcher::Event::InitDone)) => {
                let list = std::mem::take(&mut init);
                tracing::info!(addresses = list.len(), "addresses listed");
                let networks: Vec<String> = {
                    let mut idx = ctx.index.lock().expect("index lock");
                    idx.relist(list);
                    if let Some(scope) = scope {
                        idx.retain_networks(scope);
                    }
                    idx.addresses_listed = Some(scope.cloned());
                    idx.networks.keys().cloned().collect()
                };
                mark_synced(ctx, 0);
                ctx.wake.pool.notify_one();
                // a re-list may carry changes the watch missed: reconcile every Network
                // (a syncer held back for want of these Addresses goes on by itself)
                for n in networks {
                    super::ovn::request(ctx, &n);
                }
            }
            Ok(None) => return,
            Err(e) => tracing::warn!(error = %e, "address watch failed; retrying"),
        }
    }
}

/// Tell the Address watch which Networks are managed now.
fn set_managed(ctx: &Context) {
    let names: std::collections::BTreeSet<String> = ctx
        .index
        .lock()
        .expect("index lock")
        .network_objects
        .keys()
        .cloned()
        .collect();
    ctx.watch.managed.send_if_modified(|m| {
        let changed = m.as_ref() != Some(&names);
        *m = Some(names);
        changed
    });
}

/// Watch the Networks the selector picks.
pub(super) async fn networks(ctx: Arc<Context>) {
    let api: Api<Network> = Api::all(ctx.client.clone());
    let mut wc = watcher::Config::default();
    if let Some(sel) = &ctx.config.network_selector {
        wc = wc.labels(sel);
    }
    let mut stream = watcher(api, wc).default_backoff().boxed();
    let mut init = Vec::new();
    loop {
        match stream.try_next().await {
            Ok(Some(watcher::Event::Apply(n))) => {
                let name = n.metadata.name.clone().unwrap_or_default();
                ctx.index
                    .lock()
                    .expect("index lock")
                    .network_objects
                    .insert(name, Arc::new(n));
                set_managed(&ctx);
                ctx.wake.network.notify_one();
            }
            Ok(Some(watcher::Event::Delete(n))) => {
                let name = n.metadata.name.clone().unwrap_or_default();
                ctx.index
                    .lock()
                    .expect("index lock")
                    .network_objects
                    .remove(&name);
                set_managed(&ctx);
                ctx.wake.network.notify_one();
            }
            Ok(Some(watcher::Event::Init)) => init.clear(),
            Ok(Some(watcher::Event::InitApply(n))) => init.push(n),
            Ok(Some(watcher::Event::InitDone)) => {
                {
                    let mut idx = ctx.index.lock().expect("index lock");
                    idx.network_objects = std::mem::take(&mut init)
                        .into_iter()
                        .filter_map(|n: Network| Some((n.metadata.name.clone()?, Arc::new(n))))
                        .collect();
                    idx.networks_listed = true;
                }
                set_managed(&ctx);
                ctx.wake.network.notify_one();
            }
            Ok(None) => return,
            Err(e) => tracing::warn!(error = %e, "network watch failed; retrying"),
        }
    }
}

/// Watch the Nodes.
pub(super) async fn nodes(ctx: Arc<Context>) {
    let api: Api<Node> = Api::all(ctx.client.clone());
    let mut wc = watcher::Config::default();
    if let Some(sel) = &ctx.config.node_selector {
        wc = wc.labels(sel);
    }
    let mut stream = watcher(api, wc).default_backoff().boxed();
    let mut init = Vec::new();
    loop {
        match stream.try_next().await {
            Ok(Some(watcher::Event::Apply(n))) => {
                if let Some(name) = n.metadata.name
                    && ctx.index.lock().expect("index lock").nodes.insert(name)
                {
                    ctx.wake.network.notify_one();
                }
            }
            Ok(Some(watcher::Event::Delete(n))) => {
                if let Some(name) = n.metadata.name {
                    ctx.index.lock().expect("index lock").nodes.remove(&name);
                    ctx.wake.network.notify_one();
                }
            }
            Ok(Some(watcher::Event::Init)) => init.clear(),
            Ok(Some(watcher::Event::InitApply(n))) => {
                if let Some(name) = n.metadata.name {
                    init.push(name);
                }
            }
            Ok(Some(watcher::Event::InitDone)) => {
                ctx.index.lock().expect("index lock").nodes =
                    std::mem::take(&mut init).into_iter().collect();
                mark_synced(&ctx, 2);
                ctx.wake.network.notify_one();
            }
            Ok(None) => return,
            Err(e) => tracing::warn!(error = %e, "node watch failed; retrying"),
        }
    }
}
