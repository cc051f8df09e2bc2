//! The task that owns one OVSDB socket.
//!
//! It writes requests (through a separate writer task, so a stalled peer never blocks
//! reading or the probe timer), routes replies to their callers by `id`, routes
//! `update`/`update2` notifications to monitors by their monitor id, answers the server's
//! `echo`, and runs the client-side inactivity probe: after `interval` with nothing
//! received it sends an `echo`, and if still nothing arrives within `timeout` the
//! connection is declared dead and closed.
//!
//! When the task ends every waiting caller is failed: with [`Error::Protocol`] if the
//! server sent something that is not JSON-RPC, otherwise by dropping its reply channel,
//! which the caller reports as [`Error::Disconnected`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Map, Value, json};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::framing::Framer;
use crate::Error;

/// What became of a request.
pub(crate) enum Outcome {
    /// The reply's `result`.
    Result(Value),
    /// The reply's non-null `error`.
    RpcError(Value),
    /// The reply (or the connection) was malformed.
    Failed(Error),
}

/// What a monitor's consumer receives, in the order the server sent it.
pub(crate) enum Feed {
    /// The reply to `monitor` / `monitor_cond` (`method` says which): the initial rows.
    Initial { method: String, updates: Value },
    /// An `update` or `update2` notification's table updates.
    Update { method: String, updates: Value },
    /// Re-establishing the monitor failed, or the connection broke the protocol.
    Failed(Error),
    /// The server sent `monitor_canceled`.
    Canceled,
}

/// Route the reply of a `monitor`/`monitor_cond` call, and the notifications after it,
/// to a monitor's feed.
pub(crate) struct MonitorRoute {
    /// The monitor id (the `json-value` of the request).
    pub id: String,
    /// The monitor's feed.
    pub feed: mpsc::UnboundedSender<Feed>,
    /// Also report a failed monitor request on the feed (nobody awaits the reply).
    pub report_failure: bool,
}

/// Instructions from [`super::Client`] handles to the task.
pub(crate) enum Command {
    /// Send a request and deliver its outcome.
    Call {
        id: u64,
        method: String,
        message: Value,
        reply: oneshot::Sender<Outcome>,
        /// For a monitor request: where its reply and updates go.
        monitor: Option<MonitorRoute>,
        /// For a monitor_cancel: stop routing this monitor id.
        unroute: Option<String>,
    },
    /// The caller gave up waiting (timeout): drop the pending entry.
    Forget(u64),
    /// A monitor was dropped: stop routing it and tell the server, without waiting.
    CancelMonitor(String),
}

/// Client-side inactivity probe settings.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Probe {
    pub interval: Duration,
    pub timeout: Duration,
}

/// State shared between the task and the handles.
#[derive(Default)]
pub(crate) struct Shared {
    /// Why the connection closed, once it has.
    pub close_reason: Mutex<Option<String>>,
}

struct Pending {
    method: String,
    reply: oneshot::Sender<Outcome>,
    monitor: Option<MonitorRoute>,
}

/// The routing state of one connection.
struct Router {
    pending: HashMap<u64, Pending>,
    monitors: HashMap<String, mpsc::UnboundedSender<Feed>>,
    out: mpsc::UnboundedSender<Vec<u8>>,
    internal_seq: u64,
}

/// The prefix of ids of requests the task sends by itself (probes, cancellations); caller
/// requests use integer ids, so the two never collide.
const INTERNAL_ID: &str = "roam-internal-";

/// Run the connection until the peer closes it, it breaks the protocol, it stops answering
/// the probe, or every handle is dropped.
pub(crate) async fn run<S: AsyncRead + AsyncWrite + Send + 'static>(
    stream: S,
    mut cmds: mpsc::UnboundedReceiver<Command>,
    probe: Option<Probe>,
    shared: Arc<Shared>,
    endpoint: String,
) {
    let (mut rd, wr) = tokio::io::split(stream);
    let (out, out_rx) = mpsc::unbounded_channel();
    let mut writer = tokio::spawn(write_loop(wr, out_rx));
    let mut router = Router {
        pending: HashMap::new(),
        monitors: HashMap::new(),
        out,
        internal_seq: 0,
    };
    let mut framer = Framer::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut last_rx = Instant::now();
    let mut probe_deadline: Option<Instant> = None;
    let (reason, quiet) = loop {
        let wake = probe.map(|p| probe_deadline.unwrap_or(last_rx + p.interval));
        let far = Instant::now() + Duration::from_secs(3600);
        tokio::select! {
            cmd = cmds.recv() => match cmd {
                Some(cmd) => router.command(cmd),
                None => break ("every client handle was dropped".to_string(), true),
            },
            n = rd.read(&mut buf) => {
                let n = match n {
                    Ok(0) => break ("the server closed the connection".to_string(), false),
                    Ok(n) => n,
                    Err(e) => break (format!("read failed: {e}"), false),
                };
                // any traffic proves the server alive, even part of a long message
                last_rx = Instant::now();
                probe_deadline = None;
                framer.push(&buf[..n]);
                if let Err(fatal) = router.drain(&mut framer) {
                    router.fail_all(&fatal);
                    break (fatal, false);
                }
            }
            _ = tokio::time::sleep_until(wake.unwrap_or(far)), if wake.is_some() => {
                let p = probe.expect("the timer only runs with a probe");
                if probe_deadline.is_some() {
                    break (format!(
                        "no reply to the inactivity probe: nothing received for {:?} (echo sent after {:?} idle); the server is hung or unreachable",
                        p.interval + p.timeout, p.interval
                    ), false);
                }
                router.send_internal("echo", json!(["roam-probe"]));
                probe_deadline = Some(Instant::now() + p.timeout);
            }
            res = &mut writer => {
                let why = match res {
                    Ok(Err(e)) => format!("write failed: {e}"),
                    _ => "the writer stopped".to_string(),
                };
                break (why, false);
            }
        }
    };
    if quiet {
        // every handle dropped: what was queued goes out, then a clean close (for ssl: a TLS
        // close_notify, or ovsdb-server logs each closed connection as a truncated session)
        drop(router);
        let _ = tokio::time::timeout(Duration::from_secs(1), &mut writer).await;
    }
    writer.abort();
    if quiet {
        tracing::debug!(%endpoint, %reason, "OVSDB connection closed");
    } else {
        tracing::warn!(%endpoint, %reason, "OVSDB connection closed");
    }
    *shared
        .close_reason
        .lock()
        .unwrap_or_else(|e| e.into_inner()) = Some(reason);
    // dropping `router` fails every waiting caller with Disconnected and closes the feeds
}

async fn write_loop<W: AsyncWrite + Unpin>(
    mut wr: W,
    mut rx: mpsc::UnboundedReceiver<Vec<u8>>,
) -> std::io::Result<()> {
    while let Some(bytes) = rx.recv().await {
        wr.write_all(&bytes).await?;
    }
    // the connection is being closed on purpose: a TLS close_notify, then the TCP FIN
    wr.shutdown().await
}

fn encode(v: &Value) -> Vec<u8> {
    serde_json::to_vec(v).expect("a JSON value serializes")
}

impl Router {
    fn command(&mut self, cmd: Command) {
        match cmd {
            Command::Call {
                id,
                method,
                message,
                reply,
                monitor,
                unroute,
            } => {
                if let Some(m) = &unroute {
                    self.monitors.remove(m);
                }
                if let Some(route) = &monitor {
                    self.monitors.insert(route.id.clone(), route.feed.clone());
                }
                // if the writer is gone the loop ends on its next turn and fails this call
                let _ = self.out.send(encode(&message));
                self.pending.insert(
                    id,
                    Pending {
                        method,
                        reply,
                        monitor,
                    },
                );
            }
            Command::Forget(id) => {
                if let Some(p) = self.pending.remove(&id)
                    && let Some(route) = p.monitor
                {
                    // the server may still create the monitor: cancel it
                    self.monitors.remove(&route.id);
                    self.send_internal("monitor_cancel", json!([route.id]));
                }
            }
            Command::CancelMonitor(id) => {
                if self.monitors.remove(&id).is_some() {
                    self.send_internal("monitor_cancel", json!([id]));
                }
            }
        }
    }

    fn send_internal(&mut self, method: &str, params: Value) {
        self.internal_seq += 1;
        let id = format!("{INTERNAL_ID}{}", self.internal_seq);
        let _ = self.out.send(encode(
            &json!({"method": method, "params": params, "id": id}),
        ));
    }

    /// Handle every complete message in `framer`; `Err` is a fatal protocol violation.
    fn drain(&mut self, framer: &mut Framer) -> Result<(), String> {
        loop {
            match framer.next_value() {
                Ok(Some(msg)) => self.handle(msg)?,
                Ok(None) => return Ok(()),
                Err(e) => return Err(format!("{e}; connection closed")),
            }
        }
    }

    /// Handle one message; `Err` is a fatal protocol violation.
    fn handle(&mut self, msg: Value) -> Result<(), String> {
        let Value::Object(msg) = msg else {
            return Err(format!(
                "server sent a JSON-RPC message that is not an object: {}; connection closed",
                truncate(&msg)
            ));
        };
        if let Some(method) = msg.get("method") {
            let Some(method) = method.as_str() else {
                return Err(format!(
                    "server sent a request whose method is not a string: {}; connection closed",
                    truncate(&Value::Object(msg))
                ));
            };
            self.on_request(method, &msg);
            return Ok(());
        }
        if msg.contains_key("id") {
            self.on_reply(msg);
            return Ok(());
        }
        Err(format!(
            "server sent an object that is neither a request nor a reply: {}; connection closed",
            truncate(&Value::Object(msg))
        ))
    }

    /// A request or notification from the server.
    fn on_request(&mut self, method: &str, msg: &Map<String, Value>) {
        let id = msg.get("id").cloned().unwrap_or(Value::Null);
        let params = msg.get("params").cloned().unwrap_or(Value::Null);
        match method {
            "echo" if !id.is_null() => {
                let _ = self
                    .out
                    .send(encode(&json!({"id": id, "result": params, "error": null})));
            }
            "update" | "update2" => {
                let (monitor, updates) = match params.as_array().map(Vec::as_slice) {
                    Some([Value::String(m), updates]) => (m.as_str(), updates.clone()),
                    Some([Value::String(m)]) => (m.as_str(), Value::Null),
                    _ => {
                        tracing::warn!(method, params = %truncate(&params), "ignoring an OVSDB update that names no monitor");
                        return;
                    }
                };
                match self.monitors.get(monitor) {
                    Some(feed) => {
                        let _ = feed.send(Feed::Update {
                            method: method.to_string(),
                            updates,
                        });
                    }
                    // normal for a moment after a monitor was cancelled
                    None => tracing::debug!(monitor, "ignoring an update for an unknown monitor"),
                }
            }
            "monitor_canceled" => {
                let monitor = params
                    .get(0)
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string();
                if let Some(feed) = self.monitors.remove(&monitor) {
                    let _ = feed.send(Feed::Canceled);
                }
            }
            _ if !id.is_null() => {
                tracing::debug!(method, "answering an unknown request from the server");
                let _ = self.out.send(encode(
                    &json!({"id": id, "result": null, "error": "unknown method"}),
                ));
            }
            _ => tracing::debug!(method, "ignoring OVSDB notification"),
        }
    }

    /// A reply to one of our requests.
    fn on_reply(&mut self, msg: Map<String, Value>) {
        let id = msg.get("id").cloned().unwrap_or(Value::Null);
        let pending = match &id {
            Value::Number(n) => n.as_u64().and_then(|n| self.pending.remove(&n)),
            Value::String(s) if s.starts_with(INTERNAL_ID) => {
                if let Some(e) = msg.get("error").filter(|e| !e.is_null()) {
                    tracing::debug!(%id, error = %e, "internal OVSDB request failed");
                }
                return;
            }
            _ => None,
        };
        let Some(Pending {
            method,
            reply,
            monitor,
        }) = pending
        else {
            // a caller that timed out, or a confused server
            tracing::warn!(%id, "ignoring an OVSDB reply to an unknown request id");
            return;
        };
        let outcome = if let Some(e) = msg.get("error").filter(|e| !e.is_null()) {
            Outcome::RpcError(e.clone())
        } else if let Some(r) = msg.get("result") {
            Outcome::Result(r.clone())
        } else {
            Outcome::Failed(Error::Protocol(format!(
                "the reply to {method} has neither \"result\" nor \"error\": {}",
                truncate(&Value::Object(msg.clone()))
            )))
        };
        let Some(route) = monitor else {
            let _ = reply.send(outcome);
            return;
        };
        // a monitor request: the initial rows go to the feed, ahead of any update the
        // server sends after this reply
        let failure = match outcome {
            Outcome::Result(updates) if updates.is_object() => {
                let _ = route.feed.send(Feed::Initial {
                    method: method.clone(),
                    updates,
                });
                let _ = reply.send(Outcome::Result(Value::Null));
                return;
            }
            Outcome::Result(other) => Error::Protocol(format!(
                "the reply to {method} is not an object of table updates: {}",
                truncate(&other)
            )),
            Outcome::RpcError(error) => Error::Rpc { method, error },
            Outcome::Failed(e) => e,
        };
        self.monitors.remove(&route.id);
        if route.report_failure {
            let _ = route.feed.send(Feed::Failed(copy_error(&failure)));
        }
        let _ = reply.send(Outcome::Failed(failure));
    }

    /// The connection is being closed for a protocol violation: tell every waiter why.
    fn fail_all(&mut self, reason: &str) {
        let msg = format!(
            "{reason} (requests in flight have an unknown outcome: re-read the database before retrying a transaction)"
        );
        for (_, p) in self.pending.drain() {
            let _ = p.reply.send(Outcome::Failed(Error::Protocol(msg.clone())));
        }
        for (_, feed) in self.monitors.drain() {
            let _ = feed.send(Feed::Failed(Error::Protocol(msg.clone())));
        }
    }
}

/// The errors a monitor request can end with, duplicated for the feed (Error is not Clone).
fn copy_error(e: &Error) -> Error {
    match e {
        Error::Rpc { method, error } => Error::Rpc {
            method: method.clone(),
            error: error.clone(),
        },
        other => Error::Protocol(other.to_string()),
    }
}

/// A message for a log or an error, cut to a readable length.
fn truncate(v: &Value) -> String {
    let s = v.to_string();
    if s.len() <= 200 {
        return s;
    }
    let mut end = 200;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}... ({} bytes)", &s[..end], s.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn router() -> (Router, mpsc::UnboundedReceiver<Vec<u8>>) {
        let (out, rx) = mpsc::unbounded_channel();
        (
            Router {
                pending: HashMap::new(),
                monitors: HashMap::new(),
                out,
                internal_seq: 0,
            },
            rx,
        )
    }

    fn sent(rx: &mut mpsc::UnboundedReceiver<Vec<u8>>) -> Value {
        serde_json::from_slice(&rx.try_recv().expect("something was sent")).unwrap()
    }

    fn call(r: &mut Router, id: u64, monitor: Option<MonitorRoute>) -> oneshot::Receiver<Outcome> {
        let (tx, rx) = oneshot::channel();
        r.command(Command::Call {
            id,
            method: if monitor.is_some() {
                "monitor_cond"
            } else {
                "transact"
            }
            .into(),
            message: json!({"id": id}),
            reply: tx,
            monitor,
            unroute: None,
        });
        rx
    }

    #[test]
    fn server_echo_is_answered_and_replies_are_routed() {
        let (mut r, mut out) = router();
        r.handle(json!({"method": "echo", "params": ["x"], "id": "echo"}))
            .unwrap();
        assert_eq!(
            sent(&mut out),
            json!({"id": "echo", "result": ["x"], "error": null})
        );

        let mut rx = call(&mut r, 5, None);
        sent(&mut out);
        r.handle(json!({"id": 5, "result": ["ok"], "error": null}))
            .unwrap();
        assert!(matches!(rx.try_recv(), Ok(Outcome::Result(v)) if v == json!(["ok"])));

        let mut rx = call(&mut r, 6, None);
        r.handle(json!({"id": 6, "result": null, "error": "unknown database"}))
            .unwrap();
        assert!(
            matches!(rx.try_recv(), Ok(Outcome::RpcError(v)) if v == json!("unknown database"))
        );
    }

    #[test]
    fn malformed_replies_are_protocol_errors() {
        let (mut r, _out) = router();
        let mut rx = call(&mut r, 1, None);
        r.handle(json!({"id": 1})).unwrap();
        assert!(
            matches!(rx.try_recv(), Ok(Outcome::Failed(Error::Protocol(m))) if m.contains("neither")),
        );
        // replies to unknown ids are ignored, not fatal
        r.handle(json!({"id": 99, "result": []})).unwrap();
        r.handle(json!({"id": "roam-internal-3", "result": {}}))
            .unwrap();
        // non-objects and objects that are neither request nor reply are fatal
        assert!(
            r.handle(json!([1, 2]))
                .unwrap_err()
                .contains("not an object")
        );
        assert!(
            r.handle(json!({"result": 1}))
                .unwrap_err()
                .contains("neither")
        );
        assert!(r.handle(json!({"method": 5, "id": 1})).is_err());
        // fatal errors reach every waiter as Protocol
        let mut rx = call(&mut r, 2, None);
        r.fail_all("invalid JSON");
        assert!(
            matches!(rx.try_recv(), Ok(Outcome::Failed(Error::Protocol(m))) if m.contains("invalid JSON") && m.contains("unknown outcome")),
        );
    }

    #[test]
    fn monitor_replies_and_updates_are_routed_in_order() {
        let (mut r, mut out) = router();
        let (feed, mut rx_feed) = mpsc::unbounded_channel();
        let mut ack = call(
            &mut r,
            1,
            Some(MonitorRoute {
                id: "m1".into(),
                feed,
                report_failure: false,
            }),
        );
        sent(&mut out);
        r.handle(json!({"id": 1, "result": {"T": {}}, "error": null}))
            .unwrap();
        r.handle(json!({"id": null, "method": "update2", "params": ["m1", {"T": {}}]}))
            .unwrap();
        // unknown monitors and nameless updates are ignored
        r.handle(json!({"id": null, "method": "update2", "params": ["m2", {}]}))
            .unwrap();
        r.handle(json!({"id": null, "method": "update", "params": 3}))
            .unwrap();
        assert!(matches!(ack.try_recv(), Ok(Outcome::Result(Value::Null))));
        assert!(
            matches!(rx_feed.try_recv(), Ok(Feed::Initial { method, .. }) if method == "monitor_cond")
        );
        assert!(
            matches!(rx_feed.try_recv(), Ok(Feed::Update { method, .. }) if method == "update2")
        );
        assert!(rx_feed.try_recv().is_err());

        // dropping the monitor cancels it on the server
        r.command(Command::CancelMonitor("m1".into()));
        let cancel = sent(&mut out);
        assert_eq!(cancel["method"], "monitor_cancel");
        assert_eq!(cancel["params"], json!(["m1"]));
        r.handle(json!({"id": null, "method": "update2", "params": ["m1", {}]}))
            .unwrap();
        assert!(rx_feed.try_recv().is_err());

        // a failed monitor request is reported on the feed when asked to
        let (feed, mut rx_feed) = mpsc::unbounded_channel();
        let mut ack = call(
            &mut r,
            2,
            Some(MonitorRoute {
                id: "m3".into(),
                feed,
                report_failure: true,
            }),
        );
        r.handle(json!({"id": 2, "result": [], "error": null}))
            .unwrap();
        assert!(matches!(
            ack.try_recv(),
            Ok(Outcome::Failed(Error::Protocol(_)))
        ));
        assert!(matches!(
            rx_feed.try_recv(),
            Ok(Feed::Failed(Error::Protocol(_)))
        ));
        assert!(!r.monitors.contains_key("m3"));
    }

    #[test]
    fn unknown_server_requests_get_an_error_reply() {
        let (mut r, mut out) = router();
        r.handle(json!({"method": "lock", "params": [], "id": 7}))
            .unwrap();
        assert_eq!(sent(&mut out)["error"], "unknown method");
        r.handle(json!({"method": "locked", "params": [], "id": null}))
            .unwrap();
        assert!(out.try_recv().is_err());
    }
}
