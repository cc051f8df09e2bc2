//! Prometheus metrics in the text exposition format, served over plain HTTP (`GET /metrics`,
//! `GET /healthz`, `GET /readyz`: [`super::health`]). Small enough to write here rather than pull in a metrics stack: counters
//! and two latency histograms; the address gauges are computed from the index at scrape time.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
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

/// Serve `/metrics`, `/healthz` and `/readyz` on `listener` until the task is dropped.
pub async fn serve(
    listener: TcpListener,
    metrics: Metrics,
    health: Arc<super::health::Health>,
    gauges: impl Fn() -> Gauges + Send + Sync + 'static,
) {
    let gauges = Arc::new(gauges);
    loop {
        let Ok((mut sock, _)) = listener.accept().await else {
            continue;
        };
        let metrics = metrics.clone();
        let gauges = gauges.clone();
        let health = health.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; 4096];
            let mut len = 0;
            while len < buf.len() {
                match tokio::time::timeout(Duration::from_secs(5), sock.read(&mut buf[len..])).await
                {
                    Ok(Ok(0)) | Err(_) | Ok(Err(_)) => break,
                    Ok(Ok(n)) => len += n,
                }
                if buf[..len].windows(4).any(|w| w == b"\r\n\r\n") {
                    break;
                }
            }
            let req = String::from_utf8_lossy(&buf[..len]);
            let path = req.split_whitespace().nth(1).unwrap_or("");
            let (status, body) = match path {
                "/metrics" => ("200 OK", metrics.render(&gauges())),
                "/healthz" => ("200 OK", "ok\n".to_string()),
                "/readyz" => match health.readiness() {
                    (true, text) => ("200 OK", text),
                    (false, text) => ("503 Service Unavailable", text),
                },
                _ => (
                    "404 Not Found",
                    "not found: try /metrics, /healthz or /readyz\n".to_string(),
                ),
            };
            let resp = format!(
                "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = sock.write_all(resp.as_bytes()).await;
            let _ = sock.shutdown().await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
