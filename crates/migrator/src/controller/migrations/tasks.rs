//! The migration controller's background tasks: the switchover task, which long-polls the
//! source shim's events and has the target shim announce the guest's NICs the moment the
//! source pauses for the final copy (OVN activates the ports there; no API round trip and no
//! NB write between the pause and the switch), and the tasks that poll a starting or landing
//! target shim. Each wakes the reconcile when there is news.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::channel::mpsc;
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use roam_core::migration::end::{OnSourceEvent, on_source_event};
use roam_shim_api::api::DomainState;
use roam_shim_api::client::ShimClient;
use serde_json::json;
use tokio::task::AbortHandle;

use crate::controller::{Context, ovn, status};
use roam_api::VirtualMachineMigration;
use roam_core::migration::observe::is_shim_of;

/// This process's helpers of the reconcile: the background tasks running and the way they
/// wake a migration's reconcile.
#[derive(Clone)]
pub(super) struct Local {
    tasks: Arc<Mutex<Tasks>>,
    /// When each migration's source paused for the final copy (its event's time, ns since
    /// the epoch), for `pauseMs`.
    suspended: Arc<Mutex<BTreeMap<String, u64>>>,
    kick: mpsc::UnboundedSender<ObjectRef<VirtualMachineMigration>>,
}

/// The background tasks of this process's migrations by key — `ns/name` for the switchover
/// task, `Ready:ns/name` and `Landed:ns/name` for the target waits — so that one runs per key
/// and a migration's end stops all of its own. A task left running past its migration would
/// act on the next one: a switchover task of a failed migration would announce at the next
/// migration's pause (its source shim is the same; an aborted copy that never paused sends
/// no event that ends the task).
#[derive(Default)]
struct Tasks {
    next_id: u64,
    running: BTreeMap<String, (u64, Option<AbortHandle>)>,
}

impl Local {
    /// A new set of helpers, and the stream of migrations they wake.
    pub(super) fn new() -> (
        Local,
        mpsc::UnboundedReceiver<ObjectRef<VirtualMachineMigration>>,
    ) {
        let (kick, kicked) = mpsc::unbounded();
        let local = Local {
            tasks: Arc::new(Mutex::new(Tasks::default())),
            suspended: Arc::default(),
            kick,
        };
        (local, kicked)
    }

    /// When migration `key`'s source paused for the final copy (ns since the epoch).
    pub(super) fn paused_at(&self, key: &str) -> Option<u64> {
        self.suspended
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .copied()
    }

    /// Migration `key` ended: stop its tasks and forget its pause.
    pub(super) fn end(&self, key: &str) {
        let stopped = self.stop_all(key);
        self.suspended
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
        if stopped > 0 {
            tracing::debug!(migration = %key, stopped, "background tasks stopped");
        }
    }

    /// Stop every task (a killed process's tasks die with it).
    #[cfg(test)]
    pub(super) fn abort_all(&self) {
        for (_, (_, h)) in std::mem::take(&mut self.tasks().running) {
            if let Some(h) = h {
                h.abort();
            }
        }
    }

    pub(super) fn kick(&self, m: &VirtualMachineMigration) {
        let _ = self.kick.unbounded_send(ObjectRef::from_obj(m));
    }

    fn tasks(&self) -> std::sync::MutexGuard<'_, Tasks> {
        self.tasks.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a task runs under `key`.
    pub(super) fn running(&self, key: &str) -> bool {
        self.tasks().running.contains_key(key)
    }

    /// Run `task` unless one under `key` runs already; the key is free again when it ends.
    fn spawn_once(
        &self,
        key: String,
        task: impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        let id = {
            let mut t = self.tasks();
            if t.running.contains_key(&key) {
                return;
            }
            t.next_id += 1;
            let id = t.next_id;
            t.running.insert(key.clone(), (id, None));
            id
        };
        let (tasks, k) = (self.tasks.clone(), key.clone());
        let handle = tokio::spawn(async move {
            task.await;
            let mut t = tasks.lock().unwrap_or_else(|e| e.into_inner());
            if t.running.get(&k).is_some_and(|(i, _)| *i == id) {
                t.running.remove(&k);
            }
        });
        if let Some(e) = self.tasks().running.get_mut(&key).filter(|(i, _)| *i == id) {
            e.1 = Some(handle.abort_handle());
        }
    }

    /// Stop every task of migration `ns/name` (it ended); returns how many were running.
    pub(super) fn stop_all(&self, ns_name: &str) -> usize {
        let mut t = self.tasks();
        let suffix = format!(":{ns_name}");
        let keys: Vec<String> = t
            .running
            .keys()
            .filter(|k| *k == ns_name || k.ends_with(&suffix))
            .cloned()
            .collect();
        for k in &keys {
            if let Some((_, Some(h))) = t.running.remove(k) {
                h.abort();
            }
        }
        keys.len()
    }
}

pub(super) fn unix_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or_default()
}

/// The sequence number of the shim's last event (0 if it cannot say): what follows is news.
pub(super) async fn last_seq(shim: &ShimClient) -> u64 {
    shim.events(0, Duration::ZERO)
        .await
        .map(|e| e.events.last().map(|e| e.seq).unwrap_or(0))
        .unwrap_or(0)
}

/// What a target-polling task waits for.
#[derive(Clone, Copy, Debug)]
pub(super) enum Wait {
    /// The shim of the target pod answers and the VM's ports are installed there: the copy
    /// can start.
    Ready,
    /// The guest runs on the target: the migration can end.
    Landed,
}

/// Poll the target's shim (every 50 ms, no API calls) until `what` holds, then wake the
/// reconcile, so nothing waits for a requeue.
pub(super) fn spawn_target_wait(
    m: &VirtualMachineMigration,
    client: ShimClient,
    pod: String,
    what: Wait,
    local: &Local,
) {
    let key = format!(
        "{what:?}:{}/{}",
        m.namespace().unwrap_or_default(),
        m.name_any()
    );
    let (l, m) = (local.clone(), m.clone());
    local.spawn_once(key, async move {
        let started = tokio::time::Instant::now();
        let deadline = started + Duration::from_secs(300);
        while tokio::time::Instant::now() < deadline {
            if let Ok(s) = client.status().await
                && is_shim_of(&s, &pod, false)
                && match what {
                    Wait::Ready => s.uninstalled_ports().is_empty(),
                    Wait::Landed => s.domain == DomainState::Running && s.last_incoming.is_some(),
                }
            {
                if let Wait::Ready = what {
                    tracing::info!(migration = %m.name_any(), pod, ports = ?s.ports, waited_ms = started.elapsed().as_millis() as u64, "the target's shim answers, the VM's ports installed there");
                }
                l.kick(&m);
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
}

/// How long the switchover's figure waits for the target to activate the VM's ports.
const ACTIVATION_TIMEOUT: Duration = Duration::from_secs(10);

/// Record, in the migration's status, pause → the target chassis activated every one of the
/// multi-chassis `ports` (the guest's RARP came in: the network is at the target).
fn spawn_activation_figure(
    ctx: &Arc<Context>,
    m: &VirtualMachineMigration,
    ports: Vec<String>,
    target_node: &str,
    paused_at_ns: u64,
) {
    let (ctx, m, target) = (ctx.clone(), m.clone(), target_node.to_string());
    tokio::spawn(async move {
        let Some(_) = ovn::wait_for_activation(&ctx, &ports, &target, ACTIVATION_TIMEOUT).await
        else {
            tracing::debug!(migration = %m.name_any(), "no activation figure (no SB, or not activated in time)");
            return;
        };
        let ms = unix_ns().saturating_sub(paused_at_ns) / 1_000_000;
        tracing::info!(migration = %m.name_any(), switchover_ms = ms, "the target activated the VM's ports");
        let _ = status::migration(&ctx, &m, json!({"switchoverMs": ms})).await;
    });
}

/// Long-poll the source shim's events; at `suspended-for-migration` (the pause) have the
/// target announce the VM's NICs (OVN then activates their ports there: nothing changes in
/// the NB), time that activation (`activated`), and end the migration as soon as the guest
/// lands.
#[allow(clippy::too_many_arguments)]
pub(super) fn spawn_switchover(
    ctx: &Arc<Context>,
    m: &VirtualMachineMigration,
    source: &ShimClient,
    after: u64,
    activated: Vec<String>,
    target_node: &str,
    (target_client, target_pod): (ShimClient, String),
    local: &Local,
) {
    let key = format!("{}/{}", m.namespace().unwrap_or_default(), m.name_any());
    let (ctx, client, target_node, l) = (
        ctx.clone(),
        source.clone(),
        target_node.to_string(),
        local.clone(),
    );
    let m = m.clone();
    local.spawn_once(key.clone(), async move {
        let mut seq = after;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(3600);
        while tokio::time::Instant::now() < deadline {
            let evs = match client.events(seq, Duration::from_secs(25)).await {
                Ok(e) => e.events,
                Err(e) => {
                    tracing::debug!(error = %e, "source events");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            };
            let mut done = false;
            for e in evs {
                seq = seq.max(e.seq);
                match on_source_event(e.kind) {
                    OnSourceEvent::Switch => {
                        // the switch: the target announces the VM's NICs now, so that OVN
                        // activates its ports there before QEMU resumes the guest (else the
                        // guest's own RARP does, after it resumes)
                        match target_client.announce().await {
                            Ok(a) => tracing::debug!(migration = %key, ports = ?a.ports, "announced on the target"),
                            Err(e) => tracing::warn!(migration = %key, error = %e, "the target did not announce: the guest's own RARP will, once it runs"),
                        }
                        l.suspended
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .insert(key.clone(), e.at_unix_ns);
                        // the guest lands on the target within the pause: end the migration
                        // as soon as it does
                        spawn_target_wait(
                            &m,
                            target_client.clone(),
                            target_pod.clone(),
                            Wait::Landed,
                            &l,
                        );
                        if !activated.is_empty() {
                            spawn_activation_figure(
                                &ctx,
                                &m,
                                activated.clone(),
                                &target_node,
                                e.at_unix_ns,
                            );
                        }
                    }
                    OnSourceEvent::Settled => done = true,
                    OnSourceEvent::Nothing => {}
                }
            }
            if done {
                // the guest runs on one side now: decide without waiting for a requeue
                l.kick(&m);
                break;
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A task that runs until it is aborted, and tells (by dropping its guard) when it ends.
    fn forever(ended: &Arc<()>) -> impl std::future::Future<Output = ()> + Send + 'static {
        let guard = ended.clone();
        async move {
            let _guard = guard;
            std::future::pending::<()>().await
        }
    }

    async fn until_dropped(ended: &Arc<()>) {
        for _ in 0..1000 {
            if Arc::strong_count(ended) == 1 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("the task did not end");
    }

    #[tokio::test]
    async fn a_migrations_end_stops_its_tasks_and_only_its() {
        let (local, _kicked) = Local::new();
        let (mine, other) = (Arc::new(()), Arc::new(()));
        local.spawn_once("ns/m1".into(), forever(&mine));
        local.spawn_once("Landed:ns/m1".into(), forever(&mine));
        local.spawn_once("ns/m10".into(), forever(&other));
        local.spawn_once("Ready:ns/m10".into(), forever(&other));
        // one per key: a second switchover task for m1 is not started
        local.spawn_once("ns/m1".into(), forever(&mine));
        assert_eq!(Arc::strong_count(&mine), 3);
        assert!(local.running("ns/m1"));

        assert_eq!(local.stop_all("ns/m1"), 2);
        until_dropped(&mine).await;
        assert!(!local.running("ns/m1") && !local.running("Landed:ns/m1"));
        // m10 shares the prefix, not the name: untouched
        assert!(local.running("ns/m10") && local.running("Ready:ns/m10"));
        assert_eq!(Arc::strong_count(&other), 3);
        // the key is free again
        let again = Arc::new(());
        local.spawn_once("ns/m1".into(), forever(&again));
        assert!(local.running("ns/m1"));
        assert_eq!(local.stop_all("ns/m1"), 1);
        until_dropped(&again).await;
    }

    #[tokio::test]
    async fn a_task_that_ends_frees_its_key() {
        let (local, _kicked) = Local::new();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        local.spawn_once("ns/m".into(), async move {
            let _ = rx.await;
        });
        assert!(local.running("ns/m"));
        tx.send(()).unwrap();
        for _ in 0..1000 {
            if !local.running("ns/m") {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        panic!("the finished task still holds its key");
    }
}
