//! Retries of failed reconciles, per object: exponential backoff from [`BASE`] to [`MAX`],
//! reset by a reconcile that succeeds. A single failure (a conflict, a shim restarting) is
//! retried soon; an API server or shim that keeps failing is not hammered. Bad input never
//! gets here: the reconcilers report it (status condition, Event) and wait for a change.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::Resource;
use kube::runtime::controller::Action;

use super::metrics::Metrics;
use crate::error::Error;

/// The first retry's delay.
pub const BASE: Duration = Duration::from_millis(500);
/// The longest delay between retries.
pub const MAX: Duration = Duration::from_secs(60);

/// The delay before retry number `failures` (1 after the first failure).
pub fn backoff(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    BASE.saturating_mul(1 << doublings).min(MAX)
}

/// `namespace/name` of an object (`name` for a cluster-scoped one).
pub fn object_key<K: Resource>(o: &K) -> String {
    let m = o.meta();
    match &m.namespace {
        Some(ns) => format!("{ns}/{}", m.name.as_deref().unwrap_or_default()),
        None => m.name.clone().unwrap_or_default(),
    }
}

/// The failures in a row of one controller's objects.
pub struct Retry {
    /// The metric counting this controller's errors, e.g. `pod_errors`.
    metric: &'static str,
    failures: Mutex<HashMap<String, u32>>,
}

impl Retry {
    /// A controller's retries, counted under `metric`.
    pub fn new(metric: &'static str) -> Arc<Retry> {
        Arc::new(Retry {
            metric,
            failures: Mutex::new(HashMap::new()),
        })
    }

    fn failures(&self) -> std::sync::MutexGuard<'_, HashMap<String, u32>> {
        self.failures.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Pass a reconcile's result on; a success forgets the object's failures.
    pub fn outcome<T>(&self, key: &str, r: Result<T, Error>) -> Result<T, Error> {
        if r.is_ok() {
            self.failures().remove(key);
        }
        r
    }

    /// The error policy: log, count, and retry after the object's backoff.
    pub fn policy(&self, key: &str, e: &Error, metrics: &Metrics) -> Action {
        let n = {
            let mut f = self.failures();
            let n = f.entry(key.to_string()).or_default();
            *n = n.saturating_add(1);
            *n
        };
        let wait = backoff(n);
        tracing::warn!(object = %key, error = %e, failures = n, retry_in = ?wait, "reconcile failed");
        metrics.count(self.metric, e.reason());
        Action::requeue(wait)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        assert_eq!(backoff(1), BASE);
        assert_eq!(backoff(2), BASE * 2);
        assert_eq!(backoff(4), BASE * 8);
        assert_eq!(backoff(8), MAX);
        assert_eq!(backoff(u32::MAX), MAX);
        assert_eq!(backoff(0), BASE);
    }

    #[test]
    fn a_success_resets_only_its_object() {
        let r = Retry::new("test_errors");
        let m = Metrics::default();
        let e = || Error::Conflict("x".into());
        assert_eq!(r.policy("ns/a", &e(), &m), Action::requeue(BASE));
        assert_eq!(r.policy("ns/a", &e(), &m), Action::requeue(BASE * 2));
        assert_eq!(r.policy("ns/b", &e(), &m), Action::requeue(BASE));
        assert!(r.outcome("ns/a", Ok::<(), Error>(())).is_ok());
        assert_eq!(r.policy("ns/a", &e(), &m), Action::requeue(BASE));
        // a failure does not reset
        assert!(r.outcome("ns/b", Err::<(), _>(e())).is_err());
        assert_eq!(r.policy("ns/b", &e(), &m), Action::requeue(BASE * 2));
    }
}
