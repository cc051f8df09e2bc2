//! Protocol robustness against a scripted fake server (a tokio `UnixListener` in the test)
//! that sends malformed bytes and wrong-shaped results: the client must answer with a clear
//! `Error::Protocol`, ignore what it cannot attribute, and never panic. The real-server
//! behaviour is covered by `ovsdb_server.rs`.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use roam_ovsdb::Error;
use roam_ovsdb::{Client, ClientOptions, MonitorEvent, MonitorRequest};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};

const PATIENCE: Duration = Duration::from_secs(30);

/// A socket path in a fresh directory, removed on drop.
struct Sock(PathBuf);

impl Sock {
    fn new() -> Self {
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "roam-fake-ovsdb-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Sock(dir.join("s"))
    }
    fn endpoint(&self) -> String {
        format!("unix:{}", self.0.display())
    }
}

impl Drop for Sock {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(self.0.parent().unwrap());
    }
}

/// The server side of one connection.
struct Peer {
    s: UnixStream,
    buf: Vec<u8>,
}

impl Peer {
    /// The next request from the client, skipping the client's own probes.
    async fn recv(&mut self) -> Value {
        loop {
            let mut it = serde_json::Deserializer::from_slice(&self.buf).into_iter::<Value>();
            match it.next() {
                Some(Ok(v)) => {
                    let used = it.byte_offset();
                    self.buf.drain(..used);
                    return v;
                }
                Some(Err(e)) if !e.is_eof() => panic!("client sent invalid JSON: {e}"),
                _ => {}
            }
            let mut chunk = [0u8; 4096];
            let n = self.s.read(&mut chunk).await.unwrap();
            assert!(n > 0, "client closed the connection");
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    async fn raw(&mut self, bytes: &[u8]) {
        self.s.write_all(bytes).await.unwrap();
    }

    async fn send(&mut self, v: Value) {
        self.raw(v.to_string().as_bytes()).await;
    }

    async fn reply(&mut self, id: &Value, result: Value) {
        self.send(json!({"id": id, "result": result, "error": null}))
            .await;
    }
}

/// Serve one connection with `script`; returns the client connected to it.
async fn fake<F, Fut>(script: F) -> (Sock, Client, tokio::task::JoinHandle<()>)
where
    F: FnOnce(Peer) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let sock = Sock::new();
    let listener = UnixListener::bind(&sock.0).unwrap();
    let server = tokio::spawn(async move {
        let (s, _) = listener.accept().await.unwrap();
        script(Peer { s, buf: vec![] }).await;
    });
    let client = Client::connect_with(
        &sock.endpoint(),
        ClientOptions {
            request_timeout: PATIENCE,
            inactivity_probe: None,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    (sock, client, server)
}

fn protocol_error(r: Result<impl std::fmt::Debug, Error>, needle: &str) {
    match r {
        Err(Error::Protocol(m)) => assert!(m.contains(needle), "{m:?} should mention {needle:?}"),
        other => panic!("expected a Protocol error mentioning {needle:?}, got {other:?}"),
    }
}

#[tokio::test]
async fn invalid_json_fails_the_request_with_protocol_and_closes() {
    let (_sock, c, server) = fake(|mut p| async move {
        p.recv().await;
        p.raw(b"{\"id\": 1, \"result\": [}").await;
        // keep the socket open: the client must close it by itself
        let _ = p.recv_eof().await;
    })
    .await;
    protocol_error(c.echo(json!([])).await, "invalid JSON");
    tokio::time::timeout(PATIENCE, c.closed()).await.unwrap();
    assert!(c.close_reason().unwrap().contains("invalid JSON"));
    assert!(matches!(
        c.echo(json!([])).await,
        Err(Error::Disconnected(_))
    ));
    server.await.unwrap();
}

impl Peer {
    /// Wait for the client to close the connection.
    async fn recv_eof(&mut self) -> usize {
        let mut chunk = [0u8; 4096];
        loop {
            match self.s.read(&mut chunk).await {
                Ok(0) | Err(_) => return 0,
                Ok(_) => {}
            }
        }
    }
}

#[tokio::test]
async fn a_non_object_message_is_a_protocol_error() {
    let (_sock, c, server) = fake(|mut p| async move {
        p.recv().await;
        p.raw(b"[1, 2, 3]").await;
        p.recv_eof().await;
    })
    .await;
    protocol_error(c.list_dbs().await, "not an object");
    server.await.unwrap();
}

#[tokio::test]
async fn wrong_shaped_results_are_protocol_errors() {
    let (_sock, c, server) = fake(|mut p| async move {
        let r = p.recv().await; // list_dbs
        p.reply(&r["id"], json!({"OVN_Northbound": true})).await;
        let r = p.recv().await; // transact
        p.reply(&r["id"], json!({"rows": []})).await;
        let r = p.recv().await; // transact with too few results
        p.reply(&r["id"], json!([])).await;
        let r = p.recv().await; // get_schema
        p.reply(&r["id"], json!(["not", "a", "schema"])).await;
        let r = p.recv().await; // echo, answered with neither result nor error
        p.send(json!({"id": r["id"]})).await;
        let r = p.recv().await; // monitor_cond, answered with an array
        assert_eq!(r["method"], "get_schema");
        p.reply(&r["id"], small_schema()).await;
        let r = p.recv().await;
        assert_eq!(r["method"], "monitor_cond");
        p.reply(&r["id"], json!([])).await;
        // the connection survived all of that
        let r = p.recv().await;
        p.reply(&r["id"], json!(["still here"])).await;
        p.recv_eof().await;
    })
    .await;
    protocol_error(c.list_dbs().await, "list_dbs reply is not an array");
    protocol_error(
        c.transact("DB", vec![json!({"op": "comment", "comment": "x"})])
            .await,
        "not an array",
    );
    protocol_error(
        c.transact("DB", vec![json!({"op": "comment", "comment": "x"})])
            .await,
        "0 results for 1 operations",
    );
    protocol_error(c.get_schema("DB").await, "schema is not an object");
    protocol_error(c.echo(json!([])).await, "neither \"result\" nor \"error\"");
    protocol_error(
        c.monitor("DB", vec![MonitorRequest::table("T")]).await,
        "not an object of table updates",
    );
    assert_eq!(c.echo(json!([])).await.unwrap(), json!(["still here"]));
    drop(c);
    server.await.unwrap();
}

fn small_schema() -> Value {
    json!({"name": "DB", "version": "1.0.0", "tables": {"T": {"columns": {
        "name": {"type": "string"},
        "n": {"type": {"key": "integer", "min": 0, "max": 1}}
    }}}})
}

#[tokio::test]
async fn unknown_ids_and_monitors_are_ignored_and_bad_updates_reported() {
    const U: &str = "550e8400-e29b-41d4-a716-446655440000";
    let (_sock, c, server) = fake(|mut p| async move {
        let r = p.recv().await;
        assert_eq!(r["method"], "get_schema");
        p.reply(&r["id"], small_schema()).await;
        let r = p.recv().await;
        assert_eq!(r["method"], "monitor_cond");
        let monitor = r["params"][1].clone();
        assert_eq!(r["params"][2], json!({"T": [{}]}));
        p.reply(&r["id"], json!({"T": {U: {"initial": {"name": "a"}}}}))
            .await;
        // noise the client must shrug off
        p.send(json!({"id": 4242, "result": [], "error": null})).await;
        p.send(json!({"id": "nobody", "result": [], "error": null}))
            .await;
        p.send(json!({"id": null, "method": "update2", "params": ["no-such-monitor", {}]}))
            .await;
        p.send(json!({"id": null, "method": "update2", "params": 17}))
            .await;
        p.send(json!({"id": null, "method": "something_new", "params": []}))
            .await;
        // the server's own echo is answered
        p.send(json!({"id": "srv-echo", "method": "echo", "params": ["ping"]}))
            .await;
        let answer = p.recv().await;
        assert_eq!(answer, json!({"id": "srv-echo", "result": ["ping"], "error": null}));
        // malformed updates for our monitor, then a good one
        p.send(json!({"id": null, "method": "update2", "params": [monitor, "garbage"]}))
            .await;
        p.send(json!({"id": null, "method": "update2", "params": [monitor, {"T": {U: {"modify": {"n": "x"}}}}]}))
            .await;
        p.send(json!({"id": null, "method": "update2", "params": [monitor, {"T": {U: {"modify": {"n": 3}}}}]}))
            .await;
        let r = p.recv().await;
        assert_eq!(r["method"], "echo");
        p.reply(&r["id"], json!(["ok"])).await;
        // the server cancels the monitor by itself
        p.send(json!({"id": null, "method": "monitor_canceled", "params": [monitor]}))
            .await;
        p.recv_eof().await;
    })
    .await;
    let mut m = c
        .monitor("DB", vec![MonitorRequest::table("T")])
        .await
        .unwrap();
    let ev = tokio::time::timeout(PATIENCE, m.next())
        .await
        .unwrap()
        .unwrap();
    assert!(
        matches!(&ev, MonitorEvent::Initial(u) if u["T"].len() == 1),
        "{ev:?}"
    );
    let mut events = vec![];
    for _ in 0..3 {
        events.push(tokio::time::timeout(PATIENCE, m.next()).await.unwrap());
    }
    protocol_error(events.remove(0), "malformed");
    assert!(matches!(events.remove(0), Err(Error::Decode { .. })));
    let ev = events.remove(0).unwrap();
    let row = ev.updates()["T"].values().next().unwrap();
    assert_eq!(row.old.as_ref().unwrap()["n"], json!(["set", []]));
    assert_eq!(row.new.as_ref().unwrap()["n"], json!(3));
    assert_eq!(row.new.as_ref().unwrap()["name"], json!("a"));
    assert_eq!(c.echo(json!([])).await.unwrap(), json!(["ok"]));
    let err = tokio::time::timeout(PATIENCE, m.next())
        .await
        .unwrap()
        .unwrap_err();
    assert!(matches!(err, Error::MonitorCanceled(_)), "{err}");
    drop(m);
    drop(c);
    server.await.unwrap();
}

#[tokio::test]
async fn monitor_falls_back_to_rfc7047_monitor() {
    let (_sock, c, server) = fake(|mut p| async move {
        let r = p.recv().await;
        p.reply(&r["id"], small_schema()).await;
        let r = p.recv().await;
        assert_eq!(r["method"], "monitor_cond");
        p.send(json!({"id": r["id"], "result": null, "error": "unknown method"}))
            .await;
        let r = p.recv().await;
        assert_eq!(r["method"], "monitor");
        let monitor = r["params"][1].clone();
        p.reply(&r["id"], json!({})).await;
        p.send(json!({"id": null, "method": "update", "params": [monitor, {"T": {"550e8400-e29b-41d4-a716-446655440000": {"new": {"name": "x", "n": 1}}}}]}))
            .await;
        p.recv_eof().await;
    })
    .await;
    let mut m = c
        .monitor("DB", vec![MonitorRequest::table("T")])
        .await
        .unwrap();
    assert_eq!(m.method(), roam_ovsdb::MonitorMethod::Monitor);
    let ev = m.next().await.unwrap();
    assert!(
        matches!(&ev, MonitorEvent::Initial(u) if u["T"].is_empty()),
        "{ev:?}"
    );
    let ev = m.next().await.unwrap();
    assert!(ev.updates()["T"].values().next().unwrap().is_insert());
    drop(m);
    drop(c);
    server.await.unwrap();
}
