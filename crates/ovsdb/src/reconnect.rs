//! A client that survives a dropped connection.
//!
//! A background supervisor connects, and when the connection drops (the server closed it,
//! crashed, or stopped answering the inactivity probe) reconnects with bounded exponential
//! backoff. On every new connection it re-establishes the monitors created through this
//! client; each then delivers a fresh [`MonitorEvent::Initial`](super::MonitorEvent) state,
//! so the consumer resyncs from it.
//!
//! Requests are never retried: a request in flight when the connection drops fails with
//! [`Error::Disconnected`]. For a `transact` that means its outcome is UNKNOWN (the server
//! may have committed it before the connection broke): re-read the state (e.g. from the
//! monitor's fresh initial state) before deciding to send it again. While no connection is
//! up, requests fail at once with [`Error::NotConnected`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use serde_json::Value;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::client::{Client, ClientOptions, Endpoint};
use super::connection::Feed;
use super::monitor::{self, Monitor, MonitorMethod, MonitorRequest, MonitorSpec, Owner};
use super::schema::DatabaseSchema;
use crate::{Error, Result};

/// Settings of a [`ReconnectingClient`].
#[derive(Clone, Debug)]
pub struct ReconnectOptions {
    /// The first delay before reconnecting (default 100 ms); doubled after every failed
    /// attempt or short-lived connection.
    pub min_backoff: Duration,
    /// The longest delay between attempts (default 5 s). A connection that stayed up this
    /// long resets the delay to `min_backoff`.
    pub max_backoff: Duration,
    /// Settings of each connection (request timeout, inactivity probe).
    pub client: ClientOptions,
}

impl Default for ReconnectOptions {
    fn default() -> Self {
        ReconnectOptions {
            min_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            client: ClientOptions::default(),
        }
    }
}

/// An OVSDB client that reconnects by itself. Cloning shares it. See the
/// [module documentation](self) for the guarantees.
#[derive(Clone)]
pub struct ReconnectingClient {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for ReconnectingClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReconnectingClient")
            .field("endpoint", &self.shared.endpoint.to_string())
            .field("connected", &self.is_connected())
            .finish()
    }
}

pub(crate) struct Shared {
    endpoint: Endpoint,
    state: Mutex<State>,
    connected: watch::Sender<bool>,
    supervisor: Mutex<Option<tokio::task::AbortHandle>>,
}

struct State {
    client: Option<Client>,
    /// Incremented for every new connection.
    generation: u64,
    /// Why the last attempt failed or the last connection closed.
    last_error: String,
    monitors: HashMap<String, Registered>,
}

struct Registered {
    spec: Arc<MonitorSpec>,
    method: MonitorMethod,
    feed: mpsc::UnboundedSender<Feed>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        if let Some(h) = self
            .supervisor
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            h.abort();
        }
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn current(&self) -> Result<(Client, u64)> {
        let st = self.lock();
        match &st.client {
            Some(c) if !c.is_closed() => Ok((c.clone(), st.generation)),
            _ => Err(Error::NotConnected {
                endpoint: self.endpoint.to_string(),
                reason: st.last_error.clone(),
            }),
        }
    }

    /// A new connection is up: publish it and re-establish every monitor on it.
    fn install(&self, client: &Client) {
        let mut st = self.lock();
        st.generation += 1;
        for (id, r) in &st.monitors {
            client.start_monitor_nowait(&r.spec, r.method, id, &r.feed);
        }
        st.client = Some(client.clone());
        drop(st);
        self.connected.send_replace(true);
    }

    fn uninstall(&self, client: &Client, reason: String) {
        let mut st = self.lock();
        if st
            .client
            .as_ref()
            .is_some_and(|c| c.same_connection(client))
        {
            st.client = None;
        }
        st.last_error = reason;
        drop(st);
        self.connected.send_replace(false);
    }

    fn set_error(&self, reason: String) {
        self.lock().last_error = reason;
    }

    /// A monitor was dropped: forget it and cancel it on the current connection.
    pub(crate) fn forget_monitor(&self, id: &str) {
        let mut st = self.lock();
        st.monitors.remove(id);
        if let Some(c) = &st.client {
            c.cancel_monitor_nowait(id);
        }
    }

    /// Forget the monitor and cancel it on the current connection, waiting for the server.
    pub(crate) async fn cancel_monitor(&self, id: &str) -> Result<()> {
        let client = {
            let mut st = self.lock();
            st.monitors.remove(id);
            st.client.clone()
        };
        match client {
            Some(c) if !c.is_closed() => c.cancel_monitor(id).await,
            // not connected: the server has forgotten the monitor with the connection
            _ => Ok(()),
        }
    }
}

impl ReconnectingClient {
    /// Start connecting to `endpoint` in the background and return at once; requests fail
    /// with [`Error::NotConnected`] until the first connection is up (see
    /// [`wait_connected`](Self::wait_connected)). Must be called inside a tokio runtime.
    pub fn start(endpoint: &str, options: ReconnectOptions) -> Result<Self> {
        let endpoint = Endpoint::parse(endpoint)?;
        let (connected, _) = watch::channel(false);
        let shared = Arc::new(Shared {
            endpoint: endpoint.clone(),
            state: Mutex::new(State {
                client: None,
                generation: 0,
                last_error: "not connected yet".into(),
                monitors: HashMap::new(),
            }),
            connected,
            supervisor: Mutex::new(None),
        });
        let task = tokio::spawn(supervise(Arc::downgrade(&shared), endpoint, options));
        *shared.supervisor.lock().unwrap_or_else(|e| e.into_inner()) = Some(task.abort_handle());
        Ok(ReconnectingClient { shared })
    }

    /// [`start`](Self::start), then wait up to `options.client.request_timeout` for the
    /// first connection; fails with [`Error::NotConnected`] (naming the last connection
    /// error) if it does not come up, and stops trying.
    pub async fn connect(endpoint: &str, options: ReconnectOptions) -> Result<Self> {
        let timeout = options.client.request_timeout;
        let c = Self::start(endpoint, options)?;
        c.wait_connected(timeout).await?;
        Ok(c)
    }

    /// Wait until a connection is up, at most `timeout`.
    pub async fn wait_connected(&self, timeout: Duration) -> Result<()> {
        let mut rx = self.shared.connected.subscribe();
        match tokio::time::timeout(timeout, rx.wait_for(|up| *up)).await {
            Ok(Ok(_)) => Ok(()),
            _ => Err(Error::NotConnected {
                endpoint: self.shared.endpoint.to_string(),
                reason: self.shared.lock().last_error.clone(),
            }),
        }
    }

    /// Whether a connection is up right now.
    pub fn is_connected(&self) -> bool {
        self.shared.current().is_ok()
    }

    /// The endpoint.
    pub fn endpoint(&self) -> &Endpoint {
        &self.shared.endpoint
    }

    /// The current connection, for anything [`Client`] offers (e.g.
    /// [`select_all`](super::select_all)). It does not follow reconnections: once it
    /// closes, fetch a new one.
    pub fn client(&self) -> Result<Client> {
        self.shared.current().map(|(c, _)| c)
    }

    /// [`Client::request`] on the current connection.
    pub async fn request(&self, method: &str, params: Value) -> Result<Value> {
        self.client()?.request(method, params).await
    }

    /// [`Client::echo`] on the current connection.
    pub async fn echo(&self, payload: Value) -> Result<Value> {
        self.client()?.echo(payload).await
    }

    /// [`Client::list_dbs`] on the current connection.
    pub async fn list_dbs(&self) -> Result<Vec<String>> {
        self.client()?.list_dbs().await
    }

    /// [`Client::transact`] on the current connection. Never retried: on
    /// [`Error::Disconnected`] the outcome is unknown, re-read before sending it again.
    pub async fn transact(&self, db: &str, ops: Vec<Value>) -> Result<Vec<Value>> {
        self.client()?.transact(db, ops).await
    }

    /// [`Client::transact_checked`] on the current connection.
    pub async fn transact_checked(&self, db: &str, ops: Vec<Value>) -> Result<Vec<Value>> {
        self.client()?.transact_checked(db, ops).await
    }

    /// [`Client::schema`] of the current connection.
    pub async fn schema(&self, db: &str) -> Result<Arc<DatabaseSchema>> {
        self.client()?.schema(db).await
    }

    /// Like [`Client::monitor`], but the monitor is re-established on every new
    /// connection, delivering a fresh [`Initial`](super::MonitorEvent::Initial) state each
    /// time. Needs a connection to set it up.
    pub async fn monitor(&self, db: &str, requests: Vec<MonitorRequest>) -> Result<Monitor> {
        self.monitor_with(db, requests, MonitorMethod::Auto).await
    }

    /// [`monitor`](Self::monitor) with an explicit method.
    pub async fn monitor_with(
        &self,
        db: &str,
        requests: Vec<MonitorRequest>,
        method: MonitorMethod,
    ) -> Result<Monitor> {
        let (client, generation) = self.shared.current()?;
        let spec = Arc::new(MonitorSpec::new(client.schema(db).await?, requests)?);
        let id = monitor::next_monitor_id();
        let (feed, rx) = mpsc::unbounded_channel();
        let method = client.start_monitor(&spec, method, &id, &feed).await?;
        {
            let mut st = self.shared.lock();
            if st.generation != generation
                && let Some(c) = &st.client
            {
                // reconnected meanwhile, and the supervisor did not know this monitor yet
                c.start_monitor_nowait(&spec, method, &id, &feed);
            }
            st.monitors.insert(
                id.clone(),
                Registered {
                    spec: spec.clone(),
                    method,
                    feed,
                },
            );
        }
        Ok(Monitor::new(
            id,
            spec,
            method,
            rx,
            Owner::Reconnecting(self.shared.clone()),
        ))
    }
}

/// Connect, wait for the connection to drop, back off, repeat; until the client is gone.
async fn supervise(weak: Weak<Shared>, endpoint: Endpoint, options: ReconnectOptions) {
    let min = options.min_backoff;
    let max = options.max_backoff.max(min);
    let mut backoff = min;
    let mut failures = 0u32;
    loop {
        let attempt = Client::connect_endpoint(&endpoint, &options.client).await;
        let Some(shared) = weak.upgrade() else { return };
        match attempt {
            Ok(client) => {
                if failures > 0 {
                    tracing::info!(%endpoint, failures, "OVSDB connection re-established");
                }
                failures = 0;
                shared.install(&client);
                drop(shared);
                let up_since = Instant::now();
                client.closed().await;
                let reason = client
                    .close_reason()
                    .unwrap_or_else(|| "connection closed".into());
                let Some(shared) = weak.upgrade() else { return };
                shared.uninstall(&client, reason.clone());
                drop(shared);
                tracing::warn!(%endpoint, %reason, "OVSDB connection lost; reconnecting");
                if up_since.elapsed() >= max {
                    backoff = min;
                }
            }
            Err(e) => {
                failures += 1;
                if failures == 1 {
                    tracing::warn!(%endpoint, error = %e, "cannot connect to OVSDB; retrying with backoff");
                } else {
                    tracing::debug!(%endpoint, error = %e, failures, "OVSDB reconnect attempt failed");
                }
                shared.set_error(e.to_string());
                drop(shared);
            }
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(max);
    }
}
