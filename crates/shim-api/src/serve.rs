//! The hardened HTTP/1.1 server every roam endpoint runs on: roam-shim's API
//! (`roam_vm_shim::server`) and roam-controller's `/metrics`, `/healthz` and `/readyz`
//! (`roam_migrator::controller::metrics`).
//!
//! [`serve`] runs a handler on a `TcpListener` within [`Limits`]:
//!
//! - **a connection cap**: at most [`Limits::max_connections`] connections are open at once.
//!   When all are taken the server stops accepting until one closes: further clients wait in
//!   the kernel's listen backlog (their connect succeeds, their request is answered once a
//!   slot frees) rather than get a 503. Waiting costs the server nothing, needs no answer
//!   written to a client it would rather not serve, and every slot is freed within the
//!   timeouts below, so a legitimate client is only delayed;
//! - **a header-read timeout**, which is also the keep-alive idle bound: a connection that
//!   has not sent a whole request head within [`Limits::header_read_timeout`] of opening, or
//!   of its previous answer, is closed (hyper starts the timer whenever it waits for a head);
//! - **a request head size cap** ([`Limits::max_header_bytes`]): a larger head gets hyper's
//!   `431 Request Header Fields Too Large` and the connection is closed;
//! - **a body limit on every route**: the body is read here, before the handler runs, up to
//!   [`Limits::max_body_bytes`] and within [`Limits::body_read_timeout`]; a larger body gets
//!   `413`, a slower one `408` (JSON [`ApiError`]s that say the limit), and the handler is
//!   never called with it ([`DRAIN_MAX_BYTES`]: how much of a refused body is still read).
//!   Handlers get the whole body as [`Bytes`];
//! - **graceful shutdown**: when `shutdown` resolves the listener is closed (new connections
//!   are refused), idle connections are closed, and open requests get
//!   [`Limits::shutdown_grace`] to finish before their connections are dropped.
//!
//! There is no bound on the handler's own time: cancelling a handler halfway is not safe in
//! general (a shim's `migrate` records its job before it prepares the target), so each
//! handler bounds its own waits (the shim's event long poll: 30 s; its calls to a target:
//! the client's 30 s).

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use http_body_util::BodyExt;
use hyper::body::{Body as _, Incoming};
use hyper::header::{CONNECTION, CONTENT_TYPE};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::JoinSet;

use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::ServerConfig;

use crate::api::ApiError;
pub use crate::tls::Peer;

pub use bytes::Bytes;
pub use hyper::{Method, Request, Response, StatusCode, header};

/// A response body: the whole of it, in memory (roam's answers are small).
pub type Body = http_body_util::Full<Bytes>;

/// The bounds a server keeps; [`Limits::default`] documents the defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Connections open at once (at least 1). Default 64.
    pub max_connections: usize,
    /// Time to send a whole request head, from the connection's start or from the previous
    /// answer (so also how long a keep-alive connection may stay idle). Default 10 s.
    pub header_read_timeout: Duration,
    /// Largest request head (request line and headers), in bytes. Default 16 KiB.
    pub max_header_bytes: usize,
    /// Largest request body, in bytes, on every route. Default 64 KiB.
    pub max_body_bytes: usize,
    /// Time to receive the whole body once the head is in. Default 10 s.
    pub body_read_timeout: Duration,
    /// Keep a connection open for further requests after an answer. Default true; false
    /// answers with `Connection: close` and closes (one request per connection).
    pub keep_alive: bool,
    /// How long open requests may still take once shutdown starts. Default 1 s.
    pub shutdown_grace: Duration,
}

impl Limits {
    /// The defaults: 64 connections, 10 s for a head (and the idle bound), 16 KiB of head,
    /// 64 KiB of body received within 10 s, keep-alive, 1 s of grace at shutdown.
    pub const DEFAULT: Limits = Limits {
        max_connections: 64,
        header_read_timeout: Duration::from_secs(10),
        max_header_bytes: 16 * 1024,
        max_body_bytes: 64 * 1024,
        body_read_timeout: Duration::from_secs(10),
        keep_alive: true,
        shutdown_grace: Duration::from_secs(1),
    };
}

impl Default for Limits {
    fn default() -> Self {
        Limits::DEFAULT
    }
}

/// hyper refuses a connection buffer smaller than this (`http1::Builder::max_buf_size`).
const MIN_BUF: usize = 8192;

/// A response of `status` with `content_type` (a constant: a malformed one panics) and `body`.
pub fn response(
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> Response<Body> {
    let mut r = Response::new(Body::new(body.into()));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, header::HeaderValue::from_static(content_type));
    r
}

/// The server's own refusals: a JSON [`ApiError`]; `close`: and the connection closed after
/// it (when the rest of the request was not read).
fn refusal(status: StatusCode, code: &str, error: String, close: bool) -> Response<Body> {
    let body = serde_json::to_vec(&ApiError {
        code: code.into(),
        error,
    })
    .expect("an ApiError serializes");
    let mut r = response(status, "application/json", body);
    if close {
        r.headers_mut()
            .insert(CONNECTION, header::HeaderValue::from_static("close"));
    }
    r
}

/// A body over the limit is still read (and dropped) up to this many bytes in all, so that
/// the client, still sending, reads the `413` instead of a reset (a socket closed with unread
/// data resets the connection); the connection stays usable. Beyond it, or with
/// `Expect: 100-continue` (the body was not sent yet), the `413` comes at once and the
/// connection is closed.
pub const DRAIN_MAX_BYTES: u64 = 1 << 20;

/// What reading a request body came to.
enum Read {
    /// The whole body, within the limit.
    Whole(Bytes),
    /// Over the limit; `drained`: read to its end (the connection can be reused).
    TooLarge { drained: bool },
    /// Malformed or cut (hyper's error).
    Broken(String),
}

/// Read `body`: up to `max` bytes kept, then (over the limit) up to [`DRAIN_MAX_BYTES`] in
/// all dropped.
async fn read_body(mut body: Incoming, max: usize) -> Read {
    let mut kept = Vec::new();
    let mut seen: u64 = 0;
    loop {
        let frame = match body.frame().await {
            None => break,
            Some(Ok(f)) => f,
            Some(Err(e)) => return Read::Broken(e.to_string()),
        };
        let Ok(data) = frame.into_data() else {
            continue; // trailers
        };
        seen += data.len() as u64;
        if seen > DRAIN_MAX_BYTES {
            return Read::TooLarge { drained: false };
        }
        if seen <= max as u64 {
            kept.extend_from_slice(&data);
        }
    }
    if seen > max as u64 {
        Read::TooLarge { drained: true }
    } else {
        Read::Whole(Bytes::from(kept))
    }
}

/// Read the body within the limits, then hand the request to `handler`.
async fn answer<H, F>(req: Request<Incoming>, limits: &Limits, handler: &H) -> Response<Body>
where
    H: Fn(Request<Bytes>) -> F,
    F: Future<Output = Response<Body>>,
{
    let max = limits.max_body_bytes;
    let too_large = |close: bool| {
        refusal(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too-large",
            format!("the request body is over {max} bytes, this endpoint's limit: send less"),
            close,
        )
    };
    let (parts, body) = req.into_parts();
    // a Content-Length over the limit: refused before the handler, the body drained when
    // that is cheap and the client is sending it anyway
    let declared = body.size_hint().lower();
    let expects_continue = parts
        .headers
        .get(header::EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"));
    if declared > max as u64 && (declared > DRAIN_MAX_BYTES || expects_continue) {
        return too_large(true);
    }
    let body = match tokio::time::timeout(limits.body_read_timeout, read_body(body, max)).await {
        Ok(Read::Whole(b)) => b,
        Ok(Read::TooLarge { drained }) => return too_large(!drained),
        Ok(Read::Broken(e)) => {
            return refusal(
                StatusCode::BAD_REQUEST,
                "bad-request",
                format!("cannot read the request body: {e}"),
                true,
            );
        }
        Err(_) => {
            return refusal(
                StatusCode::REQUEST_TIMEOUT,
                "timeout",
                format!(
                    "the request body did not arrive within {:?}: send the whole request at once",
                    limits.body_read_timeout
                ),
                true,
            );
        }
    };
    handler(Request::from_parts(parts, body)).await
}

/// Where a TLS server's settings come from: called for each connection, so that renewed
/// files are used from the next connection on (an error drops that connection, logged).
pub type TlsSource = Arc<dyn Fn() -> crate::Result<Arc<ServerConfig>> + Send + Sync>;

/// Serve one connection until it closes, or until `stop` turns true (then finish the open
/// request, if any, and close). With `tls` the TLS handshake comes first, within the
/// header-read timeout; every request carries the [`Peer`] in its extensions.
async fn connection<H, F>(
    stream: TcpStream,
    tls: Option<TlsSource>,
    limits: Arc<Limits>,
    handler: Arc<H>,
    stop: watch::Receiver<bool>,
    _permit: OwnedSemaphorePermit,
) where
    H: Fn(Request<Bytes>) -> F + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    let _ = stream.set_nodelay(true);
    let Some(tls) = tls else {
        return http(TokioIo::new(stream), Peer::Plain, limits, handler, stop).await;
    };
    let config = match tls() {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!("cannot serve TLS: {e}");
            return;
        }
    };
    let accepted = tokio::time::timeout(
        limits.header_read_timeout,
        TlsAcceptor::from(config).accept(stream),
    )
    .await;
    let stream = match accepted {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            // a client without TLS, or one that refused the server's certificate, or whose
            // certificate the roam CA did not sign: the client's business
            tracing::debug!("TLS handshake: {e}");
            return;
        }
        Err(_) => {
            tracing::debug!("TLS handshake: not done within the header-read timeout");
            return;
        }
    };
    let peer = stream
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .map_or(Peer::Anonymous, |c| {
            // the verifier checked it chains to the roam CA; a certificate without a common
            // name names nobody roam knows
            crate::tls::peer_name(c).map_or(Peer::Anonymous, Peer::Named)
        });
    http(TokioIo::new(stream), peer, limits, handler, stop).await;
}

/// HTTP/1.1 on an accepted connection (plain or TLS) from `peer`.
async fn http<I, H, F>(
    io: I,
    peer: Peer,
    limits: Arc<Limits>,
    handler: Arc<H>,
    mut stop: watch::Receiver<bool>,
) where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    H: Fn(Request<Bytes>) -> F + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    let l = limits.clone();
    let svc = hyper::service::service_fn(move |mut req: Request<Incoming>| {
        let (limits, handler) = (limits.clone(), handler.clone());
        req.extensions_mut().insert(peer.clone());
        async move { Ok::<_, Infallible>(answer(req, &limits, &*handler).await) }
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(l.header_read_timeout)
        .max_header_size(l.max_header_bytes)
        .max_buf_size(l.max_header_bytes.max(MIN_BUF))
        .keep_alive(l.keep_alive);
    let conn = builder.serve_connection(io, svc);
    let mut conn = std::pin::pin!(conn);
    let stopped = async move {
        // `Err`: the server is gone, as good as stopped
        let _ = stop.wait_for(|s| *s).await;
    };
    let result = tokio::select! {
        r = conn.as_mut() => r,
        () = stopped => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(e) = result {
        // a client that went away, a head too slow or too large: the client's business
        tracing::debug!("HTTP connection: {e}");
    }
}

/// Serve `handler` on `listener` within `limits` (see the [module](self)) until `shutdown`
/// resolves; then stop accepting, close idle connections and give open requests
/// [`Limits::shutdown_grace`] to finish. Plain HTTP: every request's [`Peer`] is
/// [`Peer::Plain`].
pub async fn serve<H, F>(
    listener: TcpListener,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
    handler: H,
) where
    H: Fn(Request<Bytes>) -> F + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    serve_with(listener, None, limits, shutdown, handler).await;
}

/// [`serve`] over TLS with the settings `tls` gives for each connection: a handshake not
/// done within the header-read timeout drops the connection; each request carries its
/// client's [`Peer`] (named by its verified certificate, or anonymous).
pub async fn serve_tls<H, F>(
    listener: TcpListener,
    tls: TlsSource,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
    handler: H,
) where
    H: Fn(Request<Bytes>) -> F + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    serve_with(listener, Some(tls), limits, shutdown, handler).await;
}

async fn serve_with<H, F>(
    listener: TcpListener,
    tls: Option<TlsSource>,
    limits: Limits,
    shutdown: impl Future<Output = ()>,
    handler: H,
) where
    H: Fn(Request<Bytes>) -> F + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    let grace = limits.shutdown_grace;
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let (limits, handler) = (Arc::new(limits), Arc::new(handler));
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut conns = JoinSet::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        // a free slot first, then a connection: while every slot is taken nothing is
        // accepted and new clients wait in the listen backlog
        let permit = tokio::select! {
            p = slots.clone().acquire_owned() => p.expect("the semaphore is never closed"),
            () = &mut shutdown => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => continue,
        };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // e.g. out of file descriptors: try again shortly, not in a busy loop
                    tracing::warn!("accept: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => continue,
        };
        conns.spawn(connection(
            stream,
            tls.clone(),
            limits.clone(),
            handler.clone(),
            stop_rx.clone(),
            permit,
        ));
    }
    drop(listener);
    let _ = stop_tx.send(true);
    let _ = tokio::time::timeout(grace, async { while conns.join_next().await.is_some() {} }).await;
    conns.abort_all();
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::SocketAddr;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::sync::oneshot;

    /// Generous bound on anything the tests wait for (never a measure of speed).
    const BOUND: Duration = Duration::from_secs(10);

    /// Short limits for the tests: what each test exercises is set small.
    fn limits() -> Limits {
        Limits {
            max_connections: 16,
            header_read_timeout: Duration::from_millis(200),
            max_header_bytes: 1024,
            max_body_bytes: 100,
            body_read_timeout: Duration::from_millis(200),
            keep_alive: true,
            shutdown_grace: Duration::from_secs(1),
        }
    }

    /// A test server; dropping it stops it.
    struct Server {
        addr: SocketAddr,
        calls: Arc<AtomicUsize>,
        _stop: oneshot::Sender<()>,
    }

    /// A server whose handler counts its calls and echoes `METHOD PATH BODY-LENGTH`.
    async fn start(limits: Limits) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let calls = Arc::new(AtomicUsize::new(0));
        let c = calls.clone();
        let (stop, stopped) = oneshot::channel::<()>();
        tokio::spawn(serve(
            listener,
            limits,
            async move {
                let _ = stopped.await;
            },
            move |req: Request<Bytes>| {
                c.fetch_add(1, Ordering::SeqCst);
                let text = format!("{} {} {}", req.method(), req.uri().path(), req.body().len());
                async move { response(StatusCode::OK, "text/plain", text) }
            },
        ));
        Server {
            addr,
            calls,
            _stop: stop,
        }
    }

    /// One response off `s`: (status, lowercase head, body), by its Content-Length.
    async fn read_response(s: &mut TcpStream) -> (u16, String, String) {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&buf[..end]).to_lowercase();
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .map(|v| v.trim().parse().unwrap())
                    .unwrap_or(0);
                if buf.len() >= end + 4 + len {
                    let body = String::from_utf8_lossy(&buf[end + 4..end + 4 + len]).into_owned();
                    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
                    return (status, head, body);
                }
            }
            let n = tokio::time::timeout(BOUND, s.read(&mut chunk))
                .await
                .expect("a response within the bound")
                .expect("read");
            assert!(n > 0, "closed before a whole response: {buf:?}");
            buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// Waits until the server closes `s` (EOF or reset), within the bound.
    async fn closed_by_server(s: &mut TcpStream) {
        let mut chunk = [0u8; 256];
        let closed = tokio::time::timeout(BOUND, async {
            loop {
                match s.read(&mut chunk).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        })
        .await;
        assert!(closed.is_ok(), "the server kept the connection open");
    }

    async fn get(s: &mut TcpStream, path: &str) -> (u16, String, String) {
        s.write_all(format!("GET {path} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes())
            .await
            .unwrap();
        read_response(s).await
    }

    #[tokio::test]
    async fn a_client_stalling_in_its_head_is_disconnected() {
        let srv = start(limits()).await;
        let mut s = TcpStream::connect(srv.addr).await.unwrap();
        s.write_all(b"GET /x HTTP/1.1\r\nHost: t\r\nX-Slow: ")
            .await
            .unwrap();
        closed_by_server(&mut s).await;
        // a connection that sends nothing at all, too
        let mut s = TcpStream::connect(srv.addr).await.unwrap();
        closed_by_server(&mut s).await;
        assert_eq!(srv.calls.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn an_idle_keep_alive_connection_is_closed() {
        let srv = start(limits()).await;
        let mut s = TcpStream::connect(srv.addr).await.unwrap();
        let (status, head, body) = get(&mut s, "/a").await;
        assert_eq!((status, body.as_str()), (200, "GET /a 0"), "{head}");
        // kept alive: a second request on the same connection is answered
        assert_eq!(get(&mut s, "/b").await.2, "GET /b 0");
        // then, idle, it is closed after the header timeout
        closed_by_server(&mut s).await;
    }

    #[tokio::test]
    async fn the_connection_past_the_cap_waits_for_a_free_slot() {
        let srv = start(Limits {
            max_connections: 2,
            header_read_timeout: Duration::from_secs(60),
            ..limits()
        })
        .await;
        // the cap (2) connections, each answered and then held open (keep-alive)
        let mut a = TcpStream::connect(srv.addr).await.unwrap();
        let mut b = TcpStream::connect(srv.addr).await.unwrap();
        assert_eq!(get(&mut a, "/a").await.0, 200);
        assert_eq!(get(&mut b, "/b").await.0, 200);
        // the third connects (the listen backlog) but is not served
        let mut c = TcpStream::connect(srv.addr).await.unwrap();
        c.write_all(b"GET /c HTTP/1.1\r\nHost: t\r\n\r\n")
            .await
            .unwrap();
        let mut byte = [0u8; 1];
        let early = tokio::time::timeout(Duration::from_millis(500), c.read(&mut byte)).await;
        assert!(
            early.is_err(),
            "the connection over the cap was served: {early:?}"
        );
        // the first two still work meanwhile
        assert_eq!(get(&mut b, "/b2").await.2, "GET /b2 0");
        assert_eq!(get(&mut a, "/a2").await.2, "GET /a2 0");
        // one closes: the third is served
        drop(a);
        let (status, _, body) = read_response(&mut c).await;
        assert_eq!((status, body.as_str()), (200, "GET /c 0"));
    }

    #[tokio::test]
    async fn a_body_over_the_limit_gets_413_and_never_reaches_the_handler() {
        let srv = start(limits()).await;
        // declared by Content-Length
        let mut s = TcpStream::connect(srv.addr).await.unwrap();
        let body = "x".repeat(101);
        s.write_all(
            format!("POST /p HTTP/1.1\r\nHost: t\r\nContent-Length: 101\r\n\r\n{body}").as_bytes(),
        )
        .await
        .unwrap();
        let (status, head, text) = read_response(&mut s).await;
        assert_eq!(status, 413, "{head}{text}");
        assert!(head.contains("content-type: application/json"), "{head}");
        let e: ApiError = serde_json::from_str(&text).unwrap();
        assert_eq!(e.code, "too-large");
        assert!(e.error.contains("over 100 bytes"), "{}", e.error);
        // that body was read to its end: the connection serves the next request
        assert_eq!(get(&mut s, "/next").await.2, "GET /next 0");
        // chunked, with no length announced: found while reading
        let mut s = TcpStream::connect(srv.addr).await.unwrap();
        s.write_all(
            b"POST /p HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n\
              40\r\naaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\
              40\r\naaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n0\r\n\r\n",
        )
        .await
        .unwrap();
        assert_eq!(read_response(&mut s).await.0, 413);
        // announced over what is worth reading (or with Expect: 100-continue): refused at
        // once, before any of the body is sent, and the connection closed
        for expect in ["", "Expect: 100-continue\r\n"] {
            let mut s = TcpStream::connect(srv.addr).await.unwrap();
            s.write_all(
                format!(
                    "POST /p HTTP/1.1\r\nHost: t\r\n{expect}Content-Length: {}\r\n\r\n",
                    if expect.is_empty() {
                        DRAIN_MAX_BYTES + 1
                    } else {
                        101
                    }
                )
                .as_bytes(),
            )
            .await
            .unwrap();
            let (status, head, _) = read_response(&mut s).await;
            assert_eq!(status, 413, "{head}");
            assert!(head.contains("connection: close"), "{head}");
            closed_by_server(&mut s).await;
        }
        assert_eq!(srv.calls.load(Ordering::SeqCst), 1);
        // the limit itself is accepted, and the handler gets the whole body
        let mut s = TcpStream::connect(srv.addr).await.unwrap();
        let body = "y".repeat(100);
        s.write_all(
            format!("POST /p HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n{body}").as_bytes(),
        )
        .await
        .unwrap();
        assert_eq!(read_response(&mut s).await.2, "POST /p 100");
        assert_eq!(srv.calls.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_body_that_does_not_arrive_gets_408() {
        let srv = start(limits()).await;
        let mut s = TcpStream::connect(srv.addr).await.unwrap();
        s.write_all(b"POST /p HTTP/1.1\r\nHost: t\r\nContent-Length: 50\r\n\r\nonly this")
            .await
            .unwrap();
        let (status, _, text) = read_response(&mut s).await;
        assert_eq!(status, 408, "{text}");
        let e: ApiError = serde_json::from_str(&text).unwrap();
        assert_eq!(e.code, "timeout");
        closed_by_server(&mut s).await;
        assert_eq!(srv.calls.load(Ordering::SeqCst), 0);
    }

    #[tokio::test]
    async fn an_oversized_head_gets_431() {
        let srv = start(limits()).await;
        let mut s = TcpStream::connect(srv.addr).await.unwrap();
        let big = "b".repeat(2048);
        s.write_all(format!("GET /h HTTP/1.1\r\nHost: t\r\nX-Big: {big}\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let (status, _, _) = read_response(&mut s).await;
        assert_eq!(status, 431);
        closed_by_server(&mut s).await;
        assert_eq!(srv.calls.load(Ordering::SeqCst), 0);
        // a head under the limit is served
        let mut s = TcpStream::connect(srv.addr).await.unwrap();
        let ok = "b".repeat(512);
        s.write_all(format!("GET /h HTTP/1.1\r\nHost: t\r\nX-Big: {ok}\r\n\r\n").as_bytes())
            .await
            .unwrap();
        assert_eq!(read_response(&mut s).await.0, 200);
    }

    #[tokio::test]
    async fn without_keep_alive_the_connection_closes_after_the_answer() {
        let srv = start(Limits {
            keep_alive: false,
            header_read_timeout: Duration::from_secs(60),
            ..limits()
        })
        .await;
        let mut s = TcpStream::connect(srv.addr).await.unwrap();
        let (status, head, _) = get(&mut s, "/once").await;
        assert_eq!(status, 200);
        assert!(head.contains("connection: close"), "{head}");
        closed_by_server(&mut s).await;
    }

    #[tokio::test]
    async fn shutdown_stops_accepting_and_lets_open_requests_finish() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let (entered_tx, entered) = tokio::sync::mpsc::unbounded_channel::<()>();
        let release = Arc::new(tokio::sync::Notify::new());
        let r = release.clone();
        let task = tokio::spawn(serve(
            listener,
            Limits {
                header_read_timeout: Duration::from_secs(60),
                shutdown_grace: Duration::from_secs(60),
                ..limits()
            },
            async move {
                let _ = stopped.await;
            },
            move |_req: Request<Bytes>| {
                let (r, entered_tx) = (r.clone(), entered_tx.clone());
                async move {
                    let _ = entered_tx.send(());
                    r.notified().await;
                    response(StatusCode::OK, "text/plain", "finished")
                }
            },
        ));
        let mut entered = entered;
        // a request in flight, and an idle connection
        let mut busy = TcpStream::connect(addr).await.unwrap();
        busy.write_all(b"GET /slow HTTP/1.1\r\nHost: t\r\n\r\n")
            .await
            .unwrap();
        tokio::time::timeout(BOUND, entered.recv())
            .await
            .expect("the handler runs")
            .unwrap();
        let mut idle = TcpStream::connect(addr).await.unwrap();
        stop.send(()).unwrap();
        // the idle connection is closed, new ones are refused
        closed_by_server(&mut idle).await;
        tokio::time::timeout(BOUND, async {
            while TcpStream::connect(addr).await.is_ok() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .expect("the listener closes");
        // the open request still gets its answer, then the server is done
        release.notify_one();
        let (status, _, body) = read_response(&mut busy).await;
        assert_eq!((status, body.as_str()), (200, "finished"));
        tokio::time::timeout(BOUND, task)
            .await
            .expect("serve returns once its requests are done")
            .unwrap();
    }

    #[tokio::test]
    async fn shutdown_drops_a_request_that_outlasts_the_grace() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let (entered_tx, mut entered) = tokio::sync::mpsc::unbounded_channel::<()>();
        let task = tokio::spawn(serve(
            listener,
            Limits {
                shutdown_grace: Duration::from_millis(200),
                ..limits()
            },
            async move {
                let _ = stopped.await;
            },
            move |_req: Request<Bytes>| {
                let _ = entered_tx.send(());
                std::future::pending()
            },
        ));
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /forever HTTP/1.1\r\nHost: t\r\n\r\n")
            .await
            .unwrap();
        tokio::time::timeout(BOUND, entered.recv())
            .await
            .expect("the handler runs")
            .unwrap();
        stop.send(()).unwrap();
        tokio::time::timeout(BOUND, task)
            .await
            .expect("serve returns after the grace")
            .unwrap();
        closed_by_server(&mut s).await;
    }
}
