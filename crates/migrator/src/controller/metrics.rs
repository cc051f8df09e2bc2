//! Prometheus metrics in the text exposition format, served over plain HTTP (`GET /metrics`
//! to a client the API server allows, [`super::metrics_auth`]; `GET /healthz`,
//! `GET /readyz`: [`super::health`]) on `roam_shim_api::serve`, the hardened
//! HTTP/1.1 server every roam endpoint runs on, within [`limits`]. Small enough to write here
//! rather than pull in a metrics stack: counters and two latency histograms; the address
//! gauges are computed from the index at scrape time.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use roam_shim_api::serve::{self, Body, Bytes, Limits, Request, Response, StatusCode};
use tokio::net::TcpListener;

/// Histogram bucket upper bounds, seconds.
const BUCKETS: [f64; 12] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

#[derive(Debug, Default, Clone)]
struct Histogram {
    counts: [u64; BUCKETS.len()],
    sum: f64,
    count: u64,
}

impl Histogram {
    fn observe(&mut self, d: Duration) {
        let s = d.as_secs_f64();
        for (i, b) in BUCKETS.iter().enumerate() {
            if s <= *b {
                self.counts[i] += 1;
            }
        }
        self.sum += s;
        self.count += 1;
    }

    fn render(&self, out: &mut String, name: &str) {
        for (i, b) in BUCKETS.iter().enumerate() {
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {}", self.counts[i]);
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "{name}_sum {}", self.sum);
        let _ = writeln!(out, "{name}_count {}", self.count);
    }
}

#[derive(Debug, Default)]
struct Inner {
    claim: Histogram,
    annotate: Histogram,
    claimed_to_annotated: Histogram,
    ovn_wait: Histogram,
    counters: BTreeMap<(String, String), u64>,
}

/// The controller's metrics.
#[derive(Debug, Default, Clone)]
pub struct Metrics {
    inner: Arc<Mutex<Inner>>,
}

/// Per-network address counts at scrape time: (network, free, claimed, deleted).
pub type Gauges = Vec<(String, u32, u32, u32)>;

impl Metrics {
    /// A claim (or reuse) took `d` (decision + API write).
    pub fn claim_latency(&self, d: Duration) {
        self.inner.lock().expect("metrics lock").claim.observe(d);
    }

    /// A pod waited `d` from the start of its reconcile to its `roam.dev/addresses`.
    pub fn annotate_latency(&self, d: Duration) {
        self.inner.lock().expect("metrics lock").annotate.observe(d);
    }

    /// A pod's last claim write returned `d` before its `roam.dev/addresses` was written.
    pub fn claimed_to_annotated(&self, d: Duration) {
        self.inner
            .lock()
            .expect("metrics lock")
            .claimed_to_annotated
            .observe(d);
    }

    /// A pod waited `d` for the OVN reconcile covering its claim.
    pub fn ovn_wait(&self, d: Duration) {
        self.inner.lock().expect("metrics lock").ovn_wait.observe(d);
    }

    /// Count one `event` labelled `label` (e.g. `claims`/`reuse`, `errors`/`PoolExhausted`).
    pub fn count(&self, event: &str, label: &str) {
        *self
            .inner
            .lock()
            .expect("metrics lock")
            .counters
            .entry((event.into(), label.into()))
            .or_default() += 1;
    }

    /// The exposition text.
    pub fn render(&self, gauges: &Gauges) -> String {
        let inner = self.inner.lock().expect("metrics lock");
        let mut out = String::new();
        out.push_str(
            "# HELP roam_addresses Addresses per network and state.\n# TYPE roam_addresses gauge\n",
        );
        for (net, free, claimed, deleted) in gauges {
            for (state, v) in [("free", free), ("claimed", claimed), ("deleted", deleted)] {
                let _ = writeln!(
                    out,
                    "roam_addresses{{network=\"{net}\",state=\"{state}\"}} {v}"
                );
            }
        }
        out.push_str("# HELP roam_claim_duration_seconds Time to claim or reuse one Address (decision and API write).\n# TYPE roam_claim_duration_seconds histogram\n");
        inner.claim.render(&mut out, "roam_claim_duration_seconds");
        out.push_str("# HELP roam_pod_address_duration_seconds Time from a pod's reconcile to its roam.dev/addresses annotation.\n# TYPE roam_pod_address_duration_seconds histogram\n");
        inner
            .annotate
            .render(&mut out, "roam_pod_address_duration_seconds");
        out.push_str("# HELP roam_claim_to_annotation_seconds Time from a pod's claim written to its roam.dev/addresses written.\n# TYPE roam_claim_to_annotation_seconds histogram\n");
        inner
            .claimed_to_annotated
            .render(&mut out, "roam_claim_to_annotation_seconds");
        out.push_str("# HELP roam_ovn_wait_seconds Time a pod waited for the OVN reconcile covering its claim.\n# TYPE roam_ovn_wait_seconds histogram\n");
        inner.ovn_wait.render(&mut out, "roam_ovn_wait_seconds");
        out.push_str("# HELP roam_events_total Claims, reclaims, soft deletes and failures by kind.\n# TYPE roam_events_total counter\n");
        for ((event, label), v) in &inner.counters {
            let _ = writeln!(
                out,
                "roam_events_total{{event=\"{event}\",reason=\"{label}\"}} {v}"
            );
        }
        out
    }
}

/// The content type of every answer: Prometheus' text format, version 0.0.4.
const CONTENT_TYPE: &str = "text/plain; version=0.0.4";

/// The endpoint's limits: 16 connections (its clients are a scraper and the kubelet's
/// probes), 1 KiB of body (every route is a GET), one request per connection (probes and
/// scrapes connect each time, and a connection that closes after its answer holds no slot);
/// otherwise [`Limits::DEFAULT`]: 10 s to send a request head, 16 KiB of head, 10 s for a body.
pub fn limits() -> Limits {
    Limits {
        max_connections: 16,
        max_body_bytes: 1024,
        keep_alive: false,
        ..Limits::DEFAULT
    }
}

/// The answer to a request for `path` (any method).
fn answer(
    path: &str,
    metrics: &Metrics,
    health: &super::health::Health,
    gauges: &dyn Fn() -> Gauges,
) -> Response<Body> {
    let (status, body) = match path {
        "/metrics" => (StatusCode::OK, metrics.render(&gauges())),
        "/healthz" => (StatusCode::OK, "ok\n".to_string()),
        "/readyz" => match health.readiness() {
            (true, text) => (StatusCode::OK, text),
            (false, text) => (StatusCode::SERVICE_UNAVAILABLE, text),
        },
        _ => (
            StatusCode::NOT_FOUND,
            "not found: try /metrics, /healthz or /readyz\n".to_string(),
        ),
    };
    serve::response(status, CONTENT_TYPE, body)
}

/// Serve `/metrics` (to whom `auth` lets: [`super::metrics_auth`]), `/healthz` and `/readyz`
/// on `listener` within [`limits`] until the task is dropped.
pub async fn serve(
    listener: TcpListener,
    metrics: Metrics,
    health: Arc<super::health::Health>,
    gauges: impl Fn() -> Gauges + Send + Sync + 'static,
    auth: super::metrics_auth::MetricsAuth,
) {
    let gauges = Arc::new(gauges);
    serve::serve(
        listener,
        limits(),
        std::future::pending(),
        move |req: Request<Bytes>| {
            let (metrics, health, gauges, auth) = (
                metrics.clone(),
                health.clone(),
                gauges.clone(),
                auth.clone(),
            );
            async move {
                let path = req.uri().path();
                if path == super::metrics_auth::METRICS_PATH {
                    let header = req
                        .headers()
                        .get("authorization")
                        .and_then(|v| v.to_str().ok());
                    if let Err(r) = auth.check(header).await {
                        let status =
                            StatusCode::from_u16(r.status).unwrap_or(StatusCode::FORBIDDEN);
                        return serve::response(status, CONTENT_TYPE, r.message);
                    }
                }
                answer(path, &metrics, &health, &*gauges)
            }
        },
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// `request` sent to `addr`; the whole answer, read until the server closes the
    /// connection (it does after each answer): (status, lowercase head, body).
    async fn http(addr: std::net::SocketAddr, request: &str) -> (u16, String, String) {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(request.as_bytes()).await.unwrap();
        let mut out = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out))
            .await
            .expect("an answer, and the connection closed, within 10 s")
            .unwrap();
        let out = String::from_utf8(out).unwrap();
        let (head, body) = out.split_once("\r\n\r\n").unwrap();
        let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
        (status, head.to_lowercase(), body.to_string())
    }

    #[tokio::test]
    async fn serves_metrics_and_probes_one_request_per_connection() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let health = Arc::new(super::super::health::Health::default());
        let metrics = Metrics::default();
        metrics.count("claims", "new");
        let server = tokio::spawn(serve(
            listener,
            metrics,
            health.clone(),
            || vec![("ovl".into(), 3, 1, 0)],
            super::super::metrics_auth::MetricsAuth::Open,
        ));
        let get = |path: &str| format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n");
        let (status, head, body) = http(addr, &get("/metrics")).await;
        assert_eq!(status, 200, "{head}");
        assert!(
            head.contains("content-type: text/plain; version=0.0.4"),
            "{head}"
        );
        assert!(
            body.contains("roam_addresses{network=\"ovl\",state=\"free\"} 3"),
            "{body}"
        );
        assert!(
            body.contains("roam_events_total{event=\"claims\",reason=\"new\"} 1"),
            "{body}"
        );
        assert_eq!(http(addr, &get("/healthz")).await.2, "ok\n");
        let (status, _, body) = http(addr, &get("/readyz")).await;
        assert_eq!(
            (status, body.as_str()),
            (503, "role: standby\nchecks: not run yet\n")
        );
        health.set("ovn-nb", Ok(()));
        health.set_leading();
        let (status, _, body) = http(addr, &get("/readyz")).await;
        assert_eq!((status, body.as_str()), (200, "role: leader\novn-nb: ok\n"));
        let (status, head, body) = http(addr, &get("/nope")).await;
        assert_eq!(status, 404);
        assert!(head.contains("text/plain; version=0.0.4"), "{head}");
        assert_eq!(body, "not found: try /metrics, /healthz or /readyz\n");
        // a body over the endpoint's 1 KiB is refused
        let (status, _, body) = http(
            addr,
            &format!(
                "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 1025\r\n\r\n{}",
                "x".repeat(1025)
            ),
        )
        .await;
        assert_eq!(status, 413, "{body}");
        assert!(body.contains("over 1024 bytes"), "{body}");
        server.abort();
    }

    #[test]
    fn renders_gauges_histograms_and_counters() {
        let m = Metrics::default();
        m.claim_latency(Duration::from_millis(30));
        m.claim_latency(Duration::from_millis(300));
        m.count("claims", "new");
        let text = m.render(&vec![("ovl".into(), 10, 2, 1)]);
        assert!(
            text.contains("roam_addresses{network=\"ovl\",state=\"free\"} 10"),
            "{text}"
        );
        assert!(
            text.contains("roam_claim_duration_seconds_bucket{le=\"0.05\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("roam_claim_duration_seconds_bucket{le=\"0.5\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("roam_claim_duration_seconds_count 2"),
            "{text}"
        );
        assert!(
            text.contains("roam_events_total{event=\"claims\",reason=\"new\"} 1"),
            "{text}"
        );
    }
}
