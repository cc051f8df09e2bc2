//! The connection: a background task that owns the socket, and a cheap handle to it.

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::{mpsc, oneshot};

use super::connection::{self, Command, Feed, MonitorRoute, Outcome, Probe, Shared};
use super::monitor::{self, Monitor, MonitorMethod, MonitorRequest, MonitorSpec, Owner};
use super::schema::DatabaseSchema;
use super::tls::TlsSettings;
use crate::{Error, Result};

/// Where an OVSDB server listens, in OVS's own notation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// `unix:PATH`
    Unix(PathBuf),
    /// `tcp:HOST:PORT`
    Tcp(String),
    /// `ssl:HOST:PORT`: TLS with a client certificate ([`ClientOptions::tls`]).
    Ssl(String),
}

impl Endpoint {
    /// Parse `unix:PATH`, `tcp:HOST:PORT` or `ssl:HOST:PORT` (the form of `OVN_NB_DB`).
    pub fn parse(s: &str) -> Result<Self> {
        if let Some(p) = s.strip_prefix("unix:").filter(|p| !p.is_empty()) {
            return Ok(Endpoint::Unix(PathBuf::from(p)));
        }
        let host_port = |hp: &str| {
            hp.rsplit_once(':')
                .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok())
        };
        if let Some(hp) = s.strip_prefix("tcp:").filter(|hp| host_port(hp)) {
            return Ok(Endpoint::Tcp(hp.to_string()));
        }
        if let Some(hp) = s.strip_prefix("ssl:").filter(|hp| host_port(hp)) {
            return Ok(Endpoint::Ssl(hp.to_string()));
        }
        Err(Error::InvalidEndpoint(s.to_string()))
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Unix(p) => write!(f, "unix:{}", p.display()),
            Endpoint::Tcp(hp) => write!(f, "tcp:{hp}"),
            Endpoint::Ssl(hp) => write!(f, "ssl:{hp}"),
        }
    }
}

/// Settings of one connection.
#[derive(Clone, Debug)]
pub struct ClientOptions {
    /// How long a request may wait for its reply before [`Error::Timeout`] (default 60 s).
    pub request_timeout: Duration,
    /// Send an `echo` after this long without receiving anything from the server
    /// (default 5 s); `None` disables the client-side inactivity probe.
    pub inactivity_probe: Option<Duration>,
    /// How long after the probe's `echo` to wait for any traffic before declaring the
    /// connection dead and closing it (default 5 s). Requests in flight then fail with
    /// [`Error::Disconnected`].
    pub probe_timeout: Duration,
    /// The CA, client certificate and key of `ssl:` endpoints (required for them, unused
    /// for the others).
    pub tls: Option<TlsSettings>,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            request_timeout: Duration::from_secs(60),
            inactivity_probe: Some(Duration::from_secs(5)),
            probe_timeout: Duration::from_secs(5),
            tls: None,
        }
    }
}

/// A connection to one OVSDB server. Cloning shares the connection.
///
/// The connection is not re-established when it drops: once [`is_closed`](Self::is_closed),
/// every request fails with [`Error::Disconnected`]. Use
/// [`ReconnectingClient`](super::ReconnectingClient) for a connection that comes back.
#[derive(Clone)]
pub struct Client {
    cmds: mpsc::UnboundedSender<Command>,
    next_id: Arc<AtomicU64>,
    endpoint: Arc<Endpoint>,
    timeout: Duration,
    shared: Arc<Shared>,
    schemas: Arc<Mutex<HashMap<String, Arc<DatabaseSchema>>>>,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("endpoint", &self.endpoint.to_string())
            .field("closed", &self.is_closed())
            .finish()
    }
}

impl Client {
    /// Connect to `endpoint` (`unix:PATH` or `tcp:HOST:PORT`; `ssl:HOST:PORT` needs
    /// [`ClientOptions::tls`], see [`connect_with`](Self::connect_with)) with the default
    /// [`ClientOptions`].
    pub async fn connect(endpoint: &str) -> Result<Self> {
        Self::connect_with(endpoint, ClientOptions::default()).await
    }

    /// Connect to `endpoint` with explicit options.
    pub async fn connect_with(endpoint: &str, options: ClientOptions) -> Result<Self> {
        Self::connect_endpoint(&Endpoint::parse(endpoint)?, &options).await
    }

    pub(crate) async fn connect_endpoint(ep: &Endpoint, options: &ClientOptions) -> Result<Self> {
        let connect_err = |source| Error::Connect {
            endpoint: ep.to_string(),
            source,
        };
        let (tx, rx) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared::default());
        let probe = options.inactivity_probe.map(|interval| Probe {
            interval,
            timeout: options.probe_timeout,
        });
        let name = ep.to_string();
        match ep {
            Endpoint::Unix(p) => {
                let s = tokio::net::UnixStream::connect(p)
                    .await
                    .map_err(connect_err)?;
                tokio::spawn(connection::run(s, rx, probe, shared.clone(), name));
            }
            Endpoint::Tcp(hp) => {
                let s = tokio::net::TcpStream::connect(hp.as_str())
                    .await
                    .map_err(connect_err)?;
                s.set_nodelay(true)?;
                tokio::spawn(connection::run(s, rx, probe, shared.clone(), name));
            }
            Endpoint::Ssl(hp) => {
                let tls = options.tls.as_ref().ok_or_else(|| {
                    Error::Tls(format!(
                        "{name} needs a CA, a client certificate and its key; none were given"
                    ))
                })?;
                let s = tokio::net::TcpStream::connect(hp.as_str())
                    .await
                    .map_err(connect_err)?;
                s.set_nodelay(true)?;
                let host = hp.rsplit_once(':').map_or(hp.as_str(), |(h, _)| h);
                let s = tls.handshake(host, s, &name).await?;
                tokio::spawn(connection::run(s, rx, probe, shared.clone(), name));
            }
        }
        Ok(Client {
            cmds: tx,
            next_id: Arc::new(AtomicU64::new(1)),
            endpoint: Arc::new(ep.clone()),
            timeout: options.request_timeout,
            shared,
            schemas: Arc::default(),
        })
    }

    /// The same connection with another per-request deadline (default 60 s).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The endpoint this client is connected to.
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// Whether the connection has closed (for good: this client does not reconnect).
    pub fn is_closed(&self) -> bool {
        self.cmds.is_closed()
    }

    /// Wait until the connection closes.
    pub async fn closed(&self) {
        self.cmds.closed().await
    }

    /// Why the connection closed, once it has: e.g. the server closed it, it sent invalid
    /// JSON, or it did not answer the inactivity probe.
    pub fn close_reason(&self) -> Option<String> {
        self.shared
            .close_reason
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Whether two handles share one connection.
    pub(crate) fn same_connection(&self, other: &Client) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }

    /// Send one JSON-RPC request and wait for its result.
    ///
    /// Errors: [`Error::Rpc`] for a JSON-RPC error reply, [`Error::Timeout`] when no reply
    /// came within the deadline, [`Error::Disconnected`] when the connection closed first
    /// (for a `transact`, the outcome is then unknown), [`Error::Protocol`] for a malformed
    /// reply.
    pub async fn request(&self, method: &str, params: Value) -> Result<Value> {
        self.call(method, params, None, None).await
    }

    pub(crate) async fn call(
        &self,
        method: &str,
        params: Value,
        monitor: Option<MonitorRoute>,
        unroute: Option<String>,
    ) -> Result<Value> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        let message = json!({"method": method, "params": params, "id": id});
        self.cmds
            .send(Command::Call {
                id,
                method: method.to_string(),
                message,
                reply: tx,
                monitor,
                unroute,
            })
            .map_err(|_| Error::Disconnected(method.to_string()))?;
        let outcome = match tokio::time::timeout(self.timeout, rx).await {
            Err(_) => {
                let _ = self.cmds.send(Command::Forget(id));
                return Err(Error::Timeout {
                    method: method.to_string(),
                    secs: self.timeout.as_secs_f64().ceil() as u64,
                });
            }
            Ok(Err(_)) => return Err(Error::Disconnected(method.to_string())),
            Ok(Ok(outcome)) => outcome,
        };
        match outcome {
            Outcome::Result(v) => Ok(v),
            Outcome::RpcError(error) => Err(Error::Rpc {
                method: method.to_string(),
                error,
            }),
            Outcome::Failed(e) => Err(e),
        }
    }

    /// RFC 7047 `echo`: the server returns the parameters unchanged.
    pub async fn echo(&self, payload: Value) -> Result<Value> {
        self.request("echo", payload).await
    }

    /// RFC 7047 `list_dbs`.
    pub async fn list_dbs(&self) -> Result<Vec<String>> {
        let v = self.request("list_dbs", json!([])).await?;
        serde_json::from_value(v.clone()).map_err(|e| {
            Error::Protocol(format!(
                "list_dbs reply is not an array of names ({e}): {v}"
            ))
        })
    }

    /// RFC 7047 `transact`: all of `ops` are applied atomically, or none is. Returns one
    /// result per operation; a failed operation becomes [`Error::Transaction`].
    ///
    /// A transaction is never retried by this client. If the connection drops before the
    /// reply ([`Error::Disconnected`]) or the reply does not come in time
    /// ([`Error::Timeout`]), its outcome is unknown: re-read the database before deciding
    /// to send it again.
    pub async fn transact(&self, db: &str, ops: Vec<Value>) -> Result<Vec<Value>> {
        let kinds: Vec<String> = ops
            .iter()
            .map(|o| {
                o.get("op")
                    .and_then(Value::as_str)
                    .unwrap_or("?")
                    .to_string()
            })
            .collect();
        let mut params = vec![json!(db)];
        params.extend(ops);
        let v = self.request("transact", Value::Array(params)).await?;
        check_transact_reply(v, &kinds)
    }

    /// Like [`transact`](Self::transact), but first checks `ops` against the database
    /// schema (fetched once per connection, see [`schema`](Self::schema)): an unknown table
    /// or column, or a value of the wrong type, fails with [`Error::UnknownTable`],
    /// [`Error::UnknownColumn`] or [`Error::InvalidValue`] without sending anything.
    pub async fn transact_checked(&self, db: &str, ops: Vec<Value>) -> Result<Vec<Value>> {
        self.schema(db).await?.validate_transaction(&ops)?;
        self.transact(db, ops).await
    }

    /// RFC 7047 `get_schema`: fetch and parse the schema of `db`.
    pub async fn get_schema(&self, db: &str) -> Result<DatabaseSchema> {
        let v = self.request("get_schema", json!([db])).await?;
        DatabaseSchema::from_json(&v)
    }

    /// The schema of `db`, fetched on first use and then cached for this connection.
    pub async fn schema(&self, db: &str) -> Result<Arc<DatabaseSchema>> {
        if let Some(s) = self.cached_schema(db) {
            return Ok(s);
        }
        let s = Arc::new(self.get_schema(db).await?);
        self.schemas
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(db.to_string(), s.clone());
        Ok(s)
    }

    fn cached_schema(&self, db: &str) -> Option<Arc<DatabaseSchema>> {
        self.schemas
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(db)
            .cloned()
    }

    /// Watch tables of `db`: `monitor_cond` if the server supports it (update2
    /// notifications), else RFC 7047 `monitor`. See [`Monitor`] for what it yields.
    ///
    /// The tables, columns and condition columns of `requests` are checked against the
    /// schema first. The monitor lives until it is dropped or [`Monitor::cancel`]led, or the
    /// connection closes (then [`Monitor::next`] returns [`Error::Disconnected`]).
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
        let spec = Arc::new(MonitorSpec::new(self.schema(db).await?, requests)?);
        let id = monitor::next_monitor_id();
        let (feed, rx) = mpsc::unbounded_channel();
        let method = self.start_monitor(&spec, method, &id, &feed).await?;
        Ok(Monitor::new(
            id,
            spec,
            method,
            rx,
            Owner::Client(self.clone()),
        ))
    }

    /// Send the monitor request and wait for the server to accept it; returns the method
    /// used. The initial rows are delivered on `feed`.
    pub(crate) async fn start_monitor(
        &self,
        spec: &MonitorSpec,
        method: MonitorMethod,
        id: &str,
        feed: &mpsc::UnboundedSender<Feed>,
    ) -> Result<MonitorMethod> {
        let route = || {
            Some(MonitorRoute {
                id: id.to_string(),
                feed: feed.clone(),
                report_failure: false,
            })
        };
        if method != MonitorMethod::Monitor {
            let params = spec.params(MonitorMethod::MonitorCond, id);
            match self.call("monitor_cond", params, route(), None).await {
                Ok(_) => return Ok(MonitorMethod::MonitorCond),
                Err(Error::Rpc { error, .. }) if error == json!("unknown method") => {
                    if method == MonitorMethod::MonitorCond {
                        return Err(Error::Unsupported(format!(
                            "{} does not implement monitor_cond",
                            self.endpoint
                        )));
                    }
                }
                Err(e) => return Err(e),
            }
        }
        if spec.has_conditions() {
            return Err(Error::Unsupported(format!(
                "monitor conditions need monitor_cond, which {} does not implement",
                self.endpoint
            )));
        }
        let params = spec.params(MonitorMethod::Monitor, id);
        self.call("monitor", params, route(), None).await?;
        Ok(MonitorMethod::Monitor)
    }

    /// Send the monitor request without waiting; its reply (or failure) arrives on `feed`.
    pub(crate) fn start_monitor_nowait(
        &self,
        spec: &MonitorSpec,
        method: MonitorMethod,
        id: &str,
        feed: &mpsc::UnboundedSender<Feed>,
    ) {
        let name = match method {
            MonitorMethod::Monitor => "monitor",
            _ => "monitor_cond",
        };
        let call_id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (reply, _) = oneshot::channel();
        let _ = self.cmds.send(Command::Call {
            id: call_id,
            method: name.to_string(),
            message: json!({"method": name, "params": spec.params(method, id), "id": call_id}),
            reply,
            monitor: Some(MonitorRoute {
                id: id.to_string(),
                feed: feed.clone(),
                report_failure: true,
            }),
            unroute: None,
        });
    }

    /// `monitor_cancel`, waiting for the server; a monitor the server does not know (any
    /// more) counts as cancelled.
    pub(crate) async fn cancel_monitor(&self, id: &str) -> Result<()> {
        match self
            .call("monitor_cancel", json!([id]), None, Some(id.to_string()))
            .await
        {
            Ok(_) => Ok(()),
            Err(Error::Rpc { error, .. }) if error == json!("unknown monitor") => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Stop routing monitor `id` and cancel it on the server without waiting.
    pub(crate) fn cancel_monitor_nowait(&self, id: &str) {
        let _ = self.cmds.send(Command::CancelMonitor(id.to_string()));
    }
}

/// Turn a `transact` result array into per-operation results, or the first error in it.
/// RFC 7047 5.2: an error object at index i means operation i failed; an extra trailing
/// error (index == number of operations) means the commit itself failed.
fn check_transact_reply(v: Value, kinds: &[String]) -> Result<Vec<Value>> {
    let Value::Array(results) = v else {
        return Err(Error::Protocol(format!(
            "transact result is not an array: {v}"
        )));
    };
    for (index, r) in results.iter().enumerate() {
        if let Some(err) = r.get("error").and_then(Value::as_str) {
            return Err(Error::Transaction {
                index,
                op: kinds.get(index).cloned().unwrap_or_else(|| "commit".into()),
                error: err.to_string(),
                details: r.get("details").and_then(Value::as_str).map(str::to_string),
            });
        }
    }
    if results.len() < kinds.len() {
        return Err(Error::Protocol(format!(
            "transact returned {} results for {} operations",
            results.len(),
            kinds.len()
        )));
    }
    Ok(results)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints() {
        assert_eq!(
            Endpoint::parse("unix:/run/ovn/ovnnb_db.sock").unwrap(),
            Endpoint::Unix("/run/ovn/ovnnb_db.sock".into())
        );
        assert_eq!(
            Endpoint::parse("tcp:127.0.0.1:6641").unwrap(),
            Endpoint::Tcp("127.0.0.1:6641".into())
        );
        assert_eq!(
            Endpoint::parse("ssl:1.2.3.4:6641").unwrap(),
            Endpoint::Ssl("1.2.3.4:6641".into())
        );
        for bad in [
            "",
            "unix:",
            "tcp:127.0.0.1",
            "tcp::6641",
            "tcp:h:port",
            "ssl:1.2.3.4",
            "/run/x.sock",
        ] {
            assert!(
                matches!(Endpoint::parse(bad), Err(Error::InvalidEndpoint(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn transact_errors_name_the_operation() {
        let kinds = vec!["insert".to_string(), "insert".to_string()];
        let v = json!([{"uuid": ["uuid", "x"]}, {"error": "constraint violation", "details": "duplicate name"}]);
        match check_transact_reply(v, &kinds) {
            Err(Error::Transaction {
                index: 1,
                op,
                error,
                details,
            }) => {
                assert_eq!(op, "insert");
                assert_eq!(error, "constraint violation");
                assert_eq!(details.as_deref(), Some("duplicate name"));
            }
            other => panic!("unexpected {other:?}"),
        }
        // commit failure: one extra error after the operations
        let v = json!([{}, {}, {"error": "referential integrity violation"}]);
        assert!(matches!(
            check_transact_reply(v, &kinds),
            Err(Error::Transaction { index: 2, .. })
        ));
        // short reply
        assert!(matches!(
            check_transact_reply(json!([{}]), &kinds),
            Err(Error::Protocol(_))
        ));
        assert!(matches!(
            check_transact_reply(json!({}), &kinds),
            Err(Error::Protocol(_))
        ));
        assert_eq!(
            check_transact_reply(json!([{}, {"count": 1}]), &kinds)
                .unwrap()
                .len(),
            2
        );
    }
}
