//! Watches that feed the index: Addresses, Networks (those the selector picks) and Nodes.
//! A watch that breaks is re-listed (kube's watcher, with backoff); a re-list replaces what
//! the index holds, so a delete missed while disconnected is not kept forever.

use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::runtime::{WatchStreamExt, watcher};

use super::Context;
use crate::api::{Address, Network};

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
    ctx.synced.notify_waiters();
}

/// Watch every Address.
pub(super) async fn addresses(ctx: Arc<Context>) {
    let api: Api<Address> = Api::all(ctx.client.clone());
    let mut stream = watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
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
                ctx.index.lock().expect("index lock").relist(list);
                mark_synced(&ctx, 0);
                ctx.pool_kick.notify_one();
            }
            Ok(None) => return,
            Err(e) => tracing::warn!(error = %e, "address watch failed; retrying"),
        }
    }
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
                ctx.network_kick.notify_one();
            }
            Ok(Some(watcher::Event::Delete(n))) => {
                let name = n.metadata.name.clone().unwrap_or_default();
                ctx.index
                    .lock()
                    .expect("index lock")
                    .network_objects
                    .remove(&name);
                ctx.network_kick.notify_one();
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
                ctx.network_kick.notify_one();
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
                    ctx.network_kick.notify_one();
                }
            }
            Ok(Some(watcher::Event::Delete(n))) => {
                if let Some(name) = n.metadata.name {
                    ctx.index.lock().expect("index lock").nodes.remove(&name);
                    ctx.network_kick.notify_one();
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
                ctx.network_kick.notify_one();
            }
            Ok(None) => return,
            Err(e) => tracing::warn!(error = %e, "node watch failed; retrying"),
        }
    }
}
