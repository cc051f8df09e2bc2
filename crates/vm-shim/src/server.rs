//! The API server (see [`crate::api`] for the endpoints): hyper's HTTP/1.1 server, JSON
//! bodies, the token checked before routing. hyper rather than a framework: it is already in
//! roam's dependency tree (through kube), the API has seven routes, and the auth check sits
//! in front of every one of them in a dozen lines.

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{AUTHORIZATION, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde::Serialize;
use serde_json::Value;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::api::{self, ApiError, Health, MAX_EVENT_WAIT_MS, path};
use crate::shim::Shim;
use crate::{Error, Result, auth};

/// Largest request body accepted.
const MAX_BODY: usize = 64 * 1024;

fn json_response(status: u16, body: &impl Serialize) -> Response<Full<Bytes>> {
    let bytes = serde_json::to_vec(body).expect("API types serialize");
    Response::builder()
        .status(StatusCode::from_u16(status).expect("a valid status"))
        .header(CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(bytes)))
        .expect("a valid response")
}

fn error_response(e: &Error) -> Response<Full<Bytes>> {
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

async fn route(shim: &Shim, req: Request<Incoming>) -> Result<(u16, Value)> {
    let (method, p) = (req.method().clone(), req.uri().path().to_string());
    if method == Method::GET && p == path::HEALTH {
        let c = shim.config();
        return ok(
            200,
            Health {
                ok: true,
                version: env!("CARGO_PKG_VERSION").into(),
                vm: c.vm.name.clone(),
                node: c.node.clone(),
            },
        );
    }
    let authorized = req
        .headers()
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(auth::bearer)
        .is_some_and(|t| shim.token_ok(t));
    if !authorized {
        return Err(Error::Unauthorized);
    }
    let query = req.uri().query().map(str::to_string);
    match (method, p.as_str()) {
        (Method::GET, path::STATUS) => ok(200, shim.status().await),
        (Method::POST, path::PREPARE) => ok(200, shim.prepare().await?),
        (Method::POST, path::MIGRATE) => {
            let body = Limited::new(req.into_body(), MAX_BODY)
                .collect()
                .await
                .map_err(|e| Error::BadRequest(format!("cannot read the body: {e}")))?
                .to_bytes();
            let mreq: api::MigrateRequest = serde_json::from_slice(&body).map_err(|e| {
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

async fn handle(shim: Shim, req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let (m, p) = (req.method().clone(), req.uri().path().to_string());
    Ok(match route(&shim, req).await {
        Ok((status, body)) => json_response(status, &body),
        Err(e) => {
            tracing::info!(method = %m, path = %p, "API error: {e}");
            error_response(&e)
        }
    })
}

/// Serve the API on `listener` until `shutdown` turns true; then stop accepting and give
/// open requests a second to finish.
pub async fn serve(shim: Shim, listener: TcpListener, mut shutdown: watch::Receiver<bool>) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, _) = match accepted {
                    Ok(s) => s,
                    Err(e) => {
                        tracing::warn!("accept: {e}");
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let shim = shim.clone();
                conns.spawn(async move {
                    let svc = hyper::service::service_fn(move |req| handle(shim.clone(), req));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
            _ = shutdown.changed() => break,
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
        }
    }
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        while conns.join_next().await.is_some() {}
    })
    .await;
    conns.abort_all();
}

#[cfg(test)]
mod tests {
    use super::*;

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
