//! A small async client of the shim's API (see [`crate::api`]): what a source shim uses to
//! prepare its target, and what the migrator uses to drive and watch a migration.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::{AUTHORIZATION, CONTENT_TYPE};
use hyper::{Method, Request};
use hyper_rustls::{FixedServerNameResolver, HttpsConnector};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use rustls_pki_types::ServerName;
use serde::de::DeserializeOwned;

use crate::api::{
    self, Announced, ApiError, Events, Health, Job, MigrateRequest, Prepared, Status, TornDown,
    path,
};
use crate::tls::ClientTls;
use crate::{Error, Result};

/// An error with its causes: hyper's own message ("client error (Connect)") says little.
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

/// Deadline of one request (the events long poll adds its wait).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// How long an idle connection is kept for the next request: well under the shim's idle
/// bound ([`crate::serve::Limits::header_read_timeout`], 10 s), so that a request is never
/// sent on a connection the shim is closing as idle.
pub const POOL_IDLE_TIMEOUT: Duration = Duration::from_secs(5);
const _: () = assert!(
    2 * POOL_IDLE_TIMEOUT.as_millis()
        <= crate::serve::Limits::DEFAULT
            .header_read_timeout
            .as_millis(),
    "the client must drop an idle connection well before the server closes it"
);

/// A client of one shim.
#[derive(Clone, Debug)]
pub struct ShimClient {
    base: String,
    token: String,
    http: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
}

impl ShimClient {
    /// A client of the shim at `base` (`http://HOST:PORT`) with the VM's `token`, over plain
    /// HTTP (a shim without its node's identity).
    pub fn new(base: &str, token: &str) -> Result<ShimClient> {
        if !base.starts_with("http://") {
            return Err(Error::BadRequest(format!(
                "{base:?}: a plain client takes http://HOST:PORT; https needs the client's TLS \
                 identity (ShimClient::with_tls)"
            )));
        }
        Self::build(base, token, None)
    }

    /// A client of the shim at `base` (`https://HOST:PORT`) over mutual TLS: it presents
    /// `tls.identity` and takes only a certificate of the roam CA that names
    /// `tls.server_name` (the node the shim should run on), whatever address it dials.
    pub fn with_tls(base: &str, token: &str, tls: &ClientTls) -> Result<ShimClient> {
        if !base.starts_with("https://") {
            return Err(Error::BadRequest(format!(
                "{base:?}: a TLS client takes https://HOST:PORT"
            )));
        }
        Self::build(base, token, Some(tls))
    }

    fn build(base: &str, token: &str, tls: Option<&ClientTls>) -> Result<ShimClient> {
        let probe = MigrateRequest {
            target: base.into(),
            target_token: token.into(),
            bandwidth_mib_s: None,
            max_downtime_ms: None,
            auto_converge: false,
            post_copy: false,
            timeout_s: None,
            target_node: tls.map(|t| t.server_name.clone()),
            target_address: None,
        };
        probe.validate().map_err(Error::BadRequest)?;
        let mut conn = HttpConnector::new();
        conn.set_connect_timeout(Some(Duration::from_secs(5)));
        conn.set_nodelay(true);
        // the TLS layer wraps it (it refuses https itself otherwise)
        conn.enforce_http(false);
        let conn = match tls {
            Some(t) => {
                let name = ServerName::try_from(t.server_name.clone()).map_err(|e| {
                    Error::BadRequest(format!("node name {:?}: {e}", t.server_name))
                })?;
                hyper_rustls::HttpsConnectorBuilder::new()
                    .with_tls_config(t.identity.client_config()?)
                    .https_only()
                    .with_server_name_resolver(FixedServerNameResolver::new(name))
                    .enable_http1()
                    .wrap_connector(conn)
            }
            // plain http:// only (checked above): the TLS settings are never used
            None => hyper_rustls::HttpsConnectorBuilder::new()
                .with_tls_config(
                    tokio_rustls::rustls::ClientConfig::builder_with_provider(Arc::new(
                        tokio_rustls::rustls::crypto::ring::default_provider(),
                    ))
                    .with_safe_default_protocol_versions()
                    .map_err(|e| Error::Tls(e.to_string()))?
                    .with_root_certificates(tokio_rustls::rustls::RootCertStore::empty())
                    .with_no_client_auth(),
                )
                .https_or_http()
                .enable_http1()
                .wrap_connector(conn),
        };
        Ok(ShimClient {
            base: base.trim_end_matches('/').to_string(),
            token: token.to_string(),
            http: Client::builder(TokioExecutor::new())
                .pool_idle_timeout(POOL_IDLE_TIMEOUT)
                .pool_timer(TokioTimer::new())
                .build(conn),
        })
    }

    /// The shim's URL.
    pub fn base(&self) -> &str {
        &self.base
    }

    fn peer_err(&self, status: Option<u16>, message: impl Into<String>) -> Error {
        Error::Peer {
            url: self.base.clone(),
            status,
            message: message.into(),
        }
    }

    async fn call<T: DeserializeOwned>(
        &self,
        method: Method,
        path_and_query: &str,
        body: Option<Vec<u8>>,
        timeout: Duration,
    ) -> Result<T> {
        let url = format!("{}{path_and_query}", self.base);
        let req = Request::builder()
            .method(method)
            .uri(&url)
            .header(AUTHORIZATION, format!("Bearer {}", self.token))
            .header(CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body.unwrap_or_default())))
            .map_err(|e| self.peer_err(None, format!("bad request {url}: {e}")))?;
        let resp = tokio::time::timeout(timeout, async {
            let resp = self.http.request(req).await?;
            let status = resp.status().as_u16();
            let bytes = resp.into_body().collect().await?.to_bytes();
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>((status, bytes))
        })
        .await
        .map_err(|_| self.peer_err(None, format!("no answer within {timeout:?}")))?
        .map_err(|e| self.peer_err(None, format!("unreachable: {}", chain(e.as_ref()))))?;
        let (status, bytes) = resp;
        if !(200..300).contains(&status) {
            let message = serde_json::from_slice::<ApiError>(&bytes)
                .map(|e| e.error)
                .unwrap_or_else(|_| String::from_utf8_lossy(&bytes).into_owned());
            return Err(self.peer_err(Some(status), message));
        }
        serde_json::from_slice(&bytes)
            .map_err(|e| self.peer_err(Some(status), format!("unexpected answer: {e}")))
    }

    /// `GET /v1/health`.
    pub async fn health(&self) -> Result<Health> {
        self.call(Method::GET, path::HEALTH, None, REQUEST_TIMEOUT)
            .await
    }

    /// `GET /v1/status`.
    pub async fn status(&self) -> Result<Status> {
        self.call(Method::GET, path::STATUS, None, REQUEST_TIMEOUT)
            .await
    }

    /// `POST /v1/prepare` (on a migration's target).
    pub async fn prepare(&self) -> Result<Prepared> {
        self.call(Method::POST, path::PREPARE, None, REQUEST_TIMEOUT)
            .await
    }

    /// `POST /v1/migrate` (on the source).
    pub async fn migrate(&self, req: &MigrateRequest) -> Result<Job> {
        let body = serde_json::to_vec(req).expect("a request serializes");
        self.call(Method::POST, path::MIGRATE, Some(body), REQUEST_TIMEOUT)
            .await
    }

    /// `GET /v1/progress`.
    pub async fn progress(&self) -> Result<Job> {
        self.call(Method::GET, path::PROGRESS, None, REQUEST_TIMEOUT)
            .await
    }

    /// `POST /v1/abort`.
    pub async fn abort(&self) -> Result<Job> {
        self.call(Method::POST, path::ABORT, None, REQUEST_TIMEOUT)
            .await
    }

    /// `POST /v1/teardown`: the VM is deleted (idempotent).
    pub async fn teardown(&self) -> Result<TornDown> {
        self.call(Method::POST, path::TEARDOWN, None, REQUEST_TIMEOUT)
            .await
    }

    /// `POST /v1/announce` (on a migration's target, at the pause).
    pub async fn announce(&self) -> Result<Announced> {
        self.call(Method::POST, path::ANNOUNCE, None, REQUEST_TIMEOUT)
            .await
    }

    /// `GET /v1/events`: events after `after`, waiting up to `wait` for one.
    pub async fn events(&self, after: u64, wait: Duration) -> Result<Events> {
        let wait_ms = wait.as_millis().min(api::MAX_EVENT_WAIT_MS as u128);
        self.call(
            Method::GET,
            &format!("{}?after={after}&wait_ms={wait_ms}", path::EVENTS),
            None,
            REQUEST_TIMEOUT + Duration::from_millis(wait_ms as u64),
        )
        .await
    }

    /// Poll `progress` until job `id` is over (or `timeout`); returns the final job.
    pub async fn wait_job(&self, id: u64, timeout: Duration) -> Result<Job> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let job = self.progress().await?;
            if job.id == id && job.state.is_final() {
                return Ok(job);
            }
            if tokio::time::Instant::now() > deadline {
                return Err(self.peer_err(
                    None,
                    format!("job {id} still {:?} after {timeout:?}", job.state),
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::{self, Limits, Response, StatusCode};

    /// A shim-like server on 127.0.0.1 within the default limits: health answers, anything
    /// else echoes the body's length.
    async fn server() -> (String, tokio::sync::oneshot::Sender<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(serve::serve(
            listener,
            Limits::default(),
            async move {
                let _ = stopped.await;
            },
            |req: serve::Request<Bytes>| async move {
                let body: Response<serve::Body> = if req.uri().path() == path::HEALTH {
                    serve::response(
                        StatusCode::OK,
                        "application/json",
                        r#"{"ok":true,"version":"v"}"#,
                    )
                } else {
                    serve::response(
                        StatusCode::NOT_FOUND,
                        "application/json",
                        format!(
                            r#"{{"code":"not-found","error":"{} bytes"}}"#,
                            req.body().len()
                        ),
                    )
                };
                body
            },
        ));
        (url, stop)
    }

    #[tokio::test]
    async fn a_request_over_the_servers_body_limit_is_refused_saying_the_limit() {
        let (url, _stop) = server().await;
        let c = ShimClient::new(&url, "tok").unwrap();
        assert_eq!(c.health().await.unwrap().version, "v");
        let req = MigrateRequest {
            target: "http://10.0.0.1:1".into(),
            target_token: "t".repeat(Limits::DEFAULT.max_body_bytes),
            bandwidth_mib_s: None,
            max_downtime_ms: None,
            auto_converge: false,
            post_copy: false,
            timeout_s: None,
            target_node: None,
            target_address: None,
        };
        let e = c.migrate(&req).await.unwrap_err();
        match &e {
            Error::Peer {
                status: Some(413),
                message,
                ..
            } => assert!(message.contains("over 65536 bytes"), "{message}"),
            other => panic!("expected a 413, got {other:?}"),
        }
        assert!(e.is_bad_input(), "fix the request rather than retry it");
        // the connection the 413 closed does not break the next request
        assert_eq!(c.health().await.unwrap().version, "v");
    }
}
