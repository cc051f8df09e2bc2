//! The connection: a background task that owns the socket, and a cheap handle to it.

use std::collections::HashMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};

use super::framing::Framer;
use crate::{Error, Result};

/// Where an OVSDB server listens, in OVS's own notation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// `unix:PATH`
    Unix(PathBuf),
    /// `tcp:HOST:PORT`
    Tcp(String),
}

impl Endpoint {
    /// Parse `unix:PATH` or `tcp:HOST:PORT` (the form of `OVN_NB_DB`).
    pub fn parse(s: &str) -> Result<Self> {
        if let Some(p) = s.strip_prefix("unix:").filter(|p| !p.is_empty()) {
            return Ok(Endpoint::Unix(PathBuf::from(p)));
        }
        if let Some(hp) = s.strip_prefix("tcp:")
            && let Some((h, p)) = hp.rsplit_once(':')
            && !h.is_empty()
            && p.parse::<u16>().is_ok()
        {
            return Ok(Endpoint::Tcp(hp.to_string()));
        }
        Err(Error::InvalidEndpoint(s.to_string()))
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Endpoint::Unix(p) => write!(f, "unix:{}", p.display()),
            Endpoint::Tcp(hp) => write!(f, "tcp:{hp}"),
        }
    }
}

type Reply = std::result::Result<Value, Value>;

struct Call {
    id: u64,
    message: Value,
    reply: oneshot::Sender<Reply>,
}

/// A connection to one OVSDB server. Cloning shares the connection.
#[derive(Clone)]
pub struct Client {
    calls: mpsc::Sender<Call>,
    next_id: Arc<AtomicU64>,
    endpoint: Arc<Endpoint>,
    timeout: Duration,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("endpoint", &self.endpoint.to_string())
            .finish()
    }
}

impl Client {
    /// Connect to `endpoint` (`unix:PATH` or `tcp:HOST:PORT`).
    pub async fn connect(endpoint: &str) -> Result<Self> {
        let ep = Endpoint::parse(endpoint)?;
        let connect_err = |source| Error::Connect {
            endpoint: ep.to_string(),
            source,
        };
        let (tx, rx) = mpsc::channel(64);
        match &ep {
            Endpoint::Unix(p) => {
                let s = tokio::net::UnixStream::connect(p)
                    .await
                    .map_err(connect_err)?;
                tokio::spawn(run(s, rx));
            }
            Endpoint::Tcp(hp) => {
                let s = tokio::net::TcpStream::connect(hp.as_str())
                    .await
                    .map_err(connect_err)?;
                s.set_nodelay(true)?;
                tokio::spawn(run(s, rx));
            }
        }
        Ok(Client {
            calls: tx,
            next_id: Arc::new(AtomicU64::new(1)),
            endpoint: Arc::new(ep),
            timeout: Duration::from_secs(60),
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

    /// Send one JSON-RPC request and wait for its result.
    pub async fn request(&self, method: &str, params: Value) -> Result<Value> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        let message = json!({"method": method, "params": params, "id": id});
        self.calls
            .send(Call {
                id,
                message,
                reply: tx,
            })
            .await
            .map_err(|_| Error::Disconnected(method.to_string()))?;
        match tokio::time::timeout(self.timeout, rx).await {
            Err(_) => Err(Error::Timeout {
                method: method.to_string(),
                secs: self.timeout.as_secs(),
            }),
            Ok(Err(_)) => Err(Error::Disconnected(method.to_string())),
            Ok(Ok(Ok(v))) => Ok(v),
            Ok(Ok(Err(error))) => Err(Error::Rpc {
                method: method.to_string(),
                error,
            }),
        }
    }

    /// RFC 7047 `echo`: the server returns the parameters unchanged.
    pub async fn echo(&self, payload: Value) -> Result<Value> {
        self.request("echo", payload).await
    }

    /// RFC 7047 `list_dbs`.
    pub async fn list_dbs(&self) -> Result<Vec<String>> {
        let v = self.request("list_dbs", json!([])).await?;
        serde_json::from_value(v).map_err(|e| Error::Protocol(format!("list_dbs reply: {e}")))
    }

    /// RFC 7047 `transact`: all of `ops` are applied atomically, or none is. Returns one
    /// result per operation; a failed operation becomes [`Error::Transaction`].
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

/// The connection task: writes calls, routes replies, answers the server's echo.
async fn run<S: AsyncRead + AsyncWrite + Send + 'static>(
    stream: S,
    mut calls: mpsc::Receiver<Call>,
) {
    let (mut rd, mut wr) = tokio::io::split(stream);
    let mut pending: HashMap<u64, oneshot::Sender<Reply>> = HashMap::new();
    let mut framer = Framer::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        tokio::select! {
            call = calls.recv() => {
                let Some(call) = call else { break };
                let bytes = serde_json::to_vec(&call.message).expect("a JSON value serializes");
                if let Err(e) = wr.write_all(&bytes).await {
                    tracing::warn!(error = %e, "OVSDB write failed");
                    break;
                }
                pending.insert(call.id, call.reply);
            }
            n = rd.read(&mut buf) => {
                let n = match n {
                    Ok(0) => break,
                    Ok(n) => n,
                    Err(e) => { tracing::warn!(error = %e, "OVSDB read failed"); break; }
                };
                framer.push(&buf[..n]);
                loop {
                    match framer.next_value() {
                        Ok(Some(msg)) => {
                            if let Some(answer) = handle(msg, &mut pending)
                                && wr.write_all(&answer).await.is_err() {
                                break;
                            }
                        }
                        Ok(None) => break,
                        Err(e) => {
                            tracing::warn!(error = %e, "closing OVSDB connection");
                            return;
                        }
                    }
                }
            }
        }
    }
    // dropping `pending` fails every waiting caller with Disconnected
}

/// Handle one incoming message; returns bytes to send back (the answer to a server request).
fn handle(msg: Value, pending: &mut HashMap<u64, oneshot::Sender<Reply>>) -> Option<Vec<u8>> {
    if let Some(method) = msg.get("method").and_then(Value::as_str) {
        // a request or notification from the server
        if method == "echo" {
            let reply = json!({"id": msg["id"], "result": msg["params"], "error": null});
            return Some(serde_json::to_vec(&reply).expect("a JSON value serializes"));
        }
        tracing::debug!(method, "ignoring OVSDB notification");
        return None;
    }
    let id = msg.get("id").and_then(Value::as_u64)?;
    let tx = pending.remove(&id)?;
    let error = msg.get("error").cloned().unwrap_or(Value::Null);
    let reply = if error.is_null() {
        Ok(msg.get("result").cloned().unwrap_or(Value::Null))
    } else {
        Err(error)
    };
    let _ = tx.send(reply);
    None
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
        for bad in [
            "",
            "unix:",
            "tcp:127.0.0.1",
            "tcp::6641",
            "tcp:h:port",
            "ssl:1.2.3.4:6641",
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

    #[test]
    fn server_echo_is_answered_and_replies_are_routed() {
        let mut pending = HashMap::new();
        let answer = handle(
            json!({"method": "echo", "params": ["x"], "id": "echo"}),
            &mut pending,
        )
        .unwrap();
        let answer: Value = serde_json::from_slice(&answer).unwrap();
        assert_eq!(
            answer,
            json!({"id": "echo", "result": ["x"], "error": null})
        );

        let (tx, mut rx) = oneshot::channel();
        pending.insert(5, tx);
        assert!(
            handle(
                json!({"id": 5, "result": ["ok"], "error": null}),
                &mut pending
            )
            .is_none()
        );
        assert_eq!(rx.try_recv().unwrap(), Ok(json!(["ok"])));

        let (tx, mut rx) = oneshot::channel();
        pending.insert(6, tx);
        handle(
            json!({"id": 6, "result": null, "error": "unknown database"}),
            &mut pending,
        );
        assert_eq!(rx.try_recv().unwrap(), Err(json!("unknown database")));
    }
}
