//! The API server (see [`crate::api`] for the endpoints): JSON bodies, `/v1/health` open, the
//! token checked before routing anything else. It runs on `roam_shim_api::serve`, the
//! hardened HTTP/1.1 server (hyper, already in roam's tree through kube) with [`LIMITS`]: the
//! connection cap, the header, idle and body timeouts and the size limits; the body limit
//! holds for every route.

use std::time::Duration;

use roam_shim_api::serve::header::AUTHORIZATION;
use roam_shim_api::serve::{
    self, Body, Bytes, Limits, Method, Peer, Request, Response, StatusCode,
};
use roam_shim_api::tls::{CONTROLLER_NAME, Identity};
use serde::Serialize;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::api::{self, ApiError, Health, MAX_EVENT_WAIT_MS, path};
use crate::shim::Shim;
use crate::{Error, Result, auth};

/// The API's limits: [`Limits::DEFAULT`] — 64 connections, 10 s to send a request head (and
/// the idle bound), 16 KiB of head, 64 KiB of body (a migrate request is well under 1 KiB)
/// received within 10 s, 1 s for open requests at shutdown.
pub const LIMITS: Limits = Limits::DEFAULT;

fn json_response(status: u16, body: &impl Serialize) -> Response<Body> {
    let bytes = serde_json::to_vec(body).expect("API types serialize");
    serve::response(
        StatusCode::from_u16(status).expect("a valid status"),
        "application/json",
        bytes,
    )
}

fn error_response(e: &Error) -> Response<Body> {
    let (status, code) = e.http_status();
    json_response(
        status,
        &ApiError {
            code: code.into(),
            error: e.to_string(),
        },
    )
}

/// `after` and `wait_ms` of the events query (pure).
pub fn parse_events_query(query: Option<&str>) -> Result<(u64, Duration)> {
    let (mut after, mut wait) = (0, 0);
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let n: u64 = v
            .parse()
            .map_err(|_| Error::BadRequest(format!("{k}={v:?}: not a number")))?;
        match k {
            "after" => after = n,
            "wait_ms" => wait = n.min(MAX_EVENT_WAIT_MS),
            _ => {
                return Err(Error::BadRequest(format!(
                    "unknown query parameter {k:?}: use after and wait_ms"
                )));
            }
        }
    }
    Ok((after, Duration::from_millis(wait)))
}

fn ok(status: u16, body: impl Serialize) -> Result<(u16, Value)> {
    Ok((
        status,
        serde_json::to_value(body).expect("API types serialize"),
    ))
}

/// `GET /v1/health`: that the shim serves, and its version; nothing about the VM or the node
/// (it needs no token).
pub fn health() -> Health {
    Health {
        ok: true,
        version: env!("CARGO_PKG_VERSION").into(),
    }
}

/// Whether `peer` may call `method path` (pure). Over TLS ([`Peer::Named`] or
/// [`Peer::Anonymous`]): roam-controller's certificate every route; a node's (a migration's
/// source shim) only what a source asks of its target — `POST /v1/prepare` and
/// `GET /v1/status`; no certificate nothing. Plain HTTP (a shim without its node's
/// identity): the token alone decides.
pub fn peer_allowed(peer: &Peer, method: &Method, path: &str) -> Result<()> {
    match peer {
        Peer::Plain => Ok(()),
        Peer::Named(n) if n == CONTROLLER_NAME => Ok(()),
        Peer::Named(_)
            if (method == Method::POST && path == path::PREPARE)
                || (method == Method::GET && path == path::STATUS) =>
        {
            Ok(())
        }
        Peer::Named(node) => Err(Error::Forbidden(format!(
            "{method} {path}: node {node}'s certificate may only prepare a migration's target \
             (POST {}) and read its status (GET {}); the rest is roam-controller's",
            path::PREPARE,
            path::STATUS
        ))),
        Peer::Anonymous => Err(Error::Forbidden(format!(
            "{method} {path}: this shim takes requests only with a roam CA client certificate \
             (roam-controller's or a node's); only {} is open",
            path::HEALTH
        ))),
    }
}

/// What is answered before the shim is asked: `/v1/health`, open to anyone; for every other
/// route the client's certificate ([`peer_allowed`]; none recorded counts as none) and then
/// the token (`token_ok`). `Ok(None)`: authorized, route it.
fn front(req: &Request<Bytes>, token_ok: impl Fn(&str) -> bool) -> Result<Option<(u16, Value)>> {
    if req.method() == Method::GET && req.uri().path() == path::HEALTH {
        return ok(200, health()).map(Some);
    }
    let peer = req
        .extensions()
        .get::<Peer>()
        .cloned()
        .unwrap_or(Peer::Anonymous);
    peer_allowed(&peer, req.method(), req.uri().path())?;
    let authorized = req
        .headers()
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(auth::bearer)
        .is_some_and(token_ok);
    if !authorized {
        return Err(Error::Unauthorized);
    }
    Ok(None)
}

async fn route(shim: &Shim, req: Request<Bytes>) -> Result<(u16, Value)> {
    if let Some(answer) = front(&req, |t| shim.token_ok(t))? {
        return Ok(answer);
    }
    let query = req.uri().query().map(str::to_string);
    match (req.method().clone(), req.uri().path()) {
        (Method::GET, path::STATUS) => ok(200, shim.status().await),
        (Method::POST, path::PREPARE) => ok(200, shim.prepare().await?),
        (Method::POST, path::MIGRATE) => {
            let mreq: api::MigrateRequest = serde_json::from_slice(req.body()).map_err(|e| {
                Error::BadRequest(format!("the body is not a migrate request: {e}"))
            })?;
            ok(202, shim.migrate(mreq).await?)
        }
        (Method::GET, path::PROGRESS) => match shim.job() {
            Some(j) => ok(200, j),
            None => Err(Error::Conflict(
                "no migration has run on this shim yet".into(),
            )),
        },
        (Method::POST, path::ABORT) => ok(202, shim.abort().await?),
        (Method::POST, path::ANNOUNCE) => ok(200, shim.announce().await?),
        (Method::POST, path::TEARDOWN) => ok(200, shim.teardown().await?),
        (Method::GET, path::EVENTS) => {
            let (after, wait) = parse_events_query(query.as_deref())?;
            ok(200, shim.events(after, wait).await)
        }
        (m, p) => Err(Error::NotFound(format!("{m} {p}"))),
    }
}

/// The answer to a routed request; an error is logged with the request's method and path.
fn reply(method: &Method, path: &str, answer: Result<(u16, Value)>) -> Response<Body> {
    match answer {
        Ok((status, body)) => json_response(status, &body),
        Err(e) => {
            tracing::info!(%method, %path, "API error: {e}");
            error_response(&e)
        }
    }
}

async fn handle(shim: Shim, req: Request<Bytes>) -> Response<Body> {
    let (m, p) = (req.method().clone(), req.uri().path().to_string());
    reply(&m, &p, route(&shim, req).await)
}

/// Serve the API on `listener` within [`LIMITS`] until `shutdown` turns true (or its sender
/// is dropped); then stop accepting and give open requests a second to finish. With the
/// node's identity (`--pki-dir`) over mutual TLS, the files read for each connection (a
/// renewed certificate or a new CA counts from the next one).
pub async fn serve(shim: Shim, listener: TcpListener, mut shutdown: watch::Receiver<bool>) {
    let stop = async move {
        let _ = shutdown.changed().await;
    };
    match shim.config().pki_dir.clone() {
        Some(dir) => {
            let tls: serve::TlsSource =
                std::sync::Arc::new(move || Identity::read_dir(&dir)?.server_config());
            serve::serve_tls(listener, tls, LIMITS, stop, move |req| {
                handle(shim.clone(), req)
            })
            .await;
        }
        None => serve::serve(listener, LIMITS, stop, move |req| handle(shim.clone(), req)).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// The server's front (health, the token check) within [`LIMITS`] on 127.0.0.1, a shim
    /// of token `tok` without libvirt: a request that passes the front is counted and
    /// answered 404. Returns the address, the count and the server's stop.
    async fn front_server() -> (std::net::SocketAddr, Arc<AtomicUsize>, watch::Sender<bool>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let routed = Arc::new(AtomicUsize::new(0));
        let (stop, mut stopped) = watch::channel(false);
        let r = routed.clone();
        tokio::spawn(serve::serve(
            listener,
            LIMITS,
            async move {
                let _ = stopped.changed().await;
            },
            move |req: Request<Bytes>| {
                let answer = front(&req, |t| t == "tok").and_then(|front| {
                    front.ok_or_else(|| {
                        r.fetch_add(1, Ordering::SeqCst);
                        Error::NotFound(format!("routed, with {} bytes", req.body().len()))
                    })
                });
                let resp = reply(req.method(), req.uri().path(), answer);
                async move { resp }
            },
        ));
        (addr, routed, stop)
    }

    /// One request with `Connection: close`: (status, body).
    async fn call(addr: std::net::SocketAddr, head: &str, body: &[u8]) -> (u16, String) {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let req = format!(
            "{head}\r\nHost: t\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        s.write_all(req.as_bytes()).await.unwrap();
        s.write_all(body).await.unwrap();
        let mut out = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out))
            .await
            .expect("an answer within 10 s")
            .unwrap();
        let out = String::from_utf8(out).unwrap();
        let (head, body) = out.split_once("\r\n\r\n").unwrap();
        let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
        (status, body.to_string())
    }

    #[tokio::test]
    async fn health_says_ok_and_the_version_only_to_anyone() {
        let (addr, routed, _stop) = front_server().await;
        let (status, body) = call(addr, "GET /v1/health HTTP/1.1", b"").await;
        assert_eq!(status, 200, "{body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["ok", "version"], "{body}");
        assert_eq!(v["ok"], true);
        assert_eq!(v["version"], env!("CARGO_PKG_VERSION"));
        assert_eq!(routed.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn every_other_route_needs_the_token_and_every_body_is_bounded() {
        let (addr, routed, _stop) = front_server().await;
        for head in ["GET /v1/status HTTP/1.1", "POST /v1/migrate HTTP/1.1"] {
            let (status, body) = call(addr, head, b"{}").await;
            assert_eq!(status, 401, "{head}: {body}");
            let e: ApiError = serde_json::from_str(&body).unwrap();
            assert_eq!(e.code, "unauthorized");
        }
        let (status, body) = call(
            addr,
            "POST /v1/migrate HTTP/1.1\r\nAuthorization: Bearer wrong",
            b"{}",
        )
        .await;
        assert_eq!(status, 401, "{body}");
        assert_eq!(routed.load(Ordering::SeqCst), 0);
        // with the token: routed, with its body
        let auth = "POST /v1/migrate HTTP/1.1\r\nAuthorization: Bearer tok";
        let (status, body) = call(addr, auth, b"{}").await;
        assert_eq!(
            (status, body.contains("routed, with 2 bytes")),
            (404, true),
            "{body}"
        );
        // a body over the limit never reaches the shim
        let big = vec![b' '; LIMITS.max_body_bytes + 1];
        let (status, body) = call(addr, auth, &big).await;
        assert_eq!(status, 413, "{body}");
        let e: ApiError = serde_json::from_str(&body).unwrap();
        assert!(e.error.contains("over 65536 bytes"), "{}", e.error);
        assert_eq!(routed.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn over_tls_the_controller_may_call_everything_a_node_only_what_a_source_asks() {
        let controller = Peer::Named(CONTROLLER_NAME.into());
        let node = Peer::Named("node-b".into());
        let all = [
            (Method::GET, path::STATUS),
            (Method::POST, path::PREPARE),
            (Method::POST, path::MIGRATE),
            (Method::GET, path::PROGRESS),
            (Method::POST, path::ABORT),
            (Method::POST, path::ANNOUNCE),
            (Method::POST, path::TEARDOWN),
            (Method::GET, path::EVENTS),
        ];
        for (m, p) in &all {
            assert!(peer_allowed(&controller, m, p).is_ok(), "{m} {p}");
            assert!(peer_allowed(&Peer::Plain, m, p).is_ok(), "{m} {p}");
            let anon = peer_allowed(&Peer::Anonymous, m, p).unwrap_err();
            assert_eq!(anon.http_status().0, 403, "{m} {p}");
            let by_node = peer_allowed(&node, m, p);
            let source_asks = (*m == Method::POST && *p == path::PREPARE)
                || (*m == Method::GET && *p == path::STATUS);
            assert_eq!(by_node.is_ok(), source_asks, "{m} {p}");
            if let Err(e) = by_node {
                assert!(e.to_string().contains("node node-b's certificate"), "{e}");
            }
        }
        // a node's certificate does not turn a wrong method on an allowed path into a pass
        assert!(peer_allowed(&node, &Method::GET, path::PREPARE).is_err());
    }

    #[tokio::test]
    async fn without_a_recorded_peer_nothing_but_health_passes() {
        let req = |m: Method, p: &str| {
            Request::builder()
                .method(m)
                .uri(p)
                .header(AUTHORIZATION, "Bearer tok")
                .body(Bytes::new())
                .unwrap()
        };
        assert!(front(&req(Method::GET, path::HEALTH), |t| t == "tok").is_ok());
        let e = front(&req(Method::GET, path::STATUS), |t| t == "tok").unwrap_err();
        assert_eq!(e.http_status().0, 403, "{e}");
        let mut plain = req(Method::GET, path::STATUS);
        plain.extensions_mut().insert(Peer::Plain);
        assert!(matches!(front(&plain, |t| t == "tok"), Ok(None)));
    }

    #[test]
    fn events_query() {
        assert_eq!(parse_events_query(None).unwrap(), (0, Duration::ZERO));
        assert_eq!(
            parse_events_query(Some("after=7&wait_ms=250")).unwrap(),
            (7, Duration::from_millis(250))
        );
        assert_eq!(
            parse_events_query(Some("wait_ms=999999")).unwrap().1,
            Duration::from_millis(MAX_EVENT_WAIT_MS)
        );
        assert!(parse_events_query(Some("after=x")).is_err());
        assert!(parse_events_query(Some("since=1")).is_err());
    }

    #[test]
    fn errors_map_to_statuses() {
        assert_eq!(Error::Unauthorized.http_status(), (401, "unauthorized"));
        assert_eq!(Error::Conflict("x".into()).http_status().0, 409);
        assert_eq!(Error::BadRequest("x".into()).http_status().0, 400);
        let peer = Error::Peer {
            url: "u".into(),
            status: None,
            message: "m".into(),
        };
        assert_eq!(peer.http_status().0, 502);
    }
}
