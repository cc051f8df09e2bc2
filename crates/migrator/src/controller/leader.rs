//! Leader election on a `coordination.k8s.io/v1` Lease (served by every Kubernetes since
//! 1.14, the lab's 1.20 included), written here rather than taken from a crate: ~100 lines
//! of get / replace-with-resourceVersion, the same protocol as client-go's leaderelection.
//!
//! A candidate takes the Lease when it is free or its holder has not renewed it within
//! `leaseDurationSeconds`; the holder renews it every `renew`. Every write carries the
//! resourceVersion it read, so two candidates can never both take it. A holder that cannot
//! renew before its lease would expire stops leading (roam-controller exits, and its
//! Deployment starts it again as a candidate): two leaders never act at once for longer
//! than the clock skew between them.

use std::time::{Duration, SystemTime};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::PostParams;

use crate::error::{Error, Result};

/// Where the Lease is and who we are.
#[derive(Clone, Debug)]
pub struct LeaderConfig {
    /// The Lease's namespace.
    pub namespace: String,
    /// The Lease's name.
    pub name: String,
    /// This candidate's identity (pod name, or host + pid).
    pub identity: String,
    /// How long a Lease holds without renewal.
    pub lease_duration: Duration,
    /// How often the holder renews.
    pub renew: Duration,
}

fn micro(t: SystemTime) -> Option<MicroTime> {
    Timestamp::try_from(t).ok().map(MicroTime)
}

/// Whether `me` may take (or keep) a Lease with `spec` at `now`.
pub fn can_take(spec: Option<&LeaseSpec>, me: &str, now: SystemTime) -> bool {
    let Some(spec) = spec else { return true };
    match spec.holder_identity.as_deref() {
        None | Some("") => true,
        Some(h) if h == me => true,
        Some(_) => {
            let duration =
                Duration::from_secs(spec.lease_duration_seconds.unwrap_or(15).max(1) as u64);
            match &spec.renew_time {
                Some(t) => SystemTime::from(t.0) + duration < now,
                None => true,
            }
        }
    }
}

/// The Lease spec after `me` takes or renews it at `now`.
pub fn taken(spec: Option<&LeaseSpec>, me: &str, duration: Duration, now: SystemTime) -> LeaseSpec {
    let mut s = spec.cloned().unwrap_or_default();
    let changed = s.holder_identity.as_deref() != Some(me);
    if changed {
        s.holder_identity = Some(me.into());
        s.acquire_time = micro(now);
        s.lease_transitions = Some(s.lease_transitions.unwrap_or(0) + i32::from(spec.is_some()));
    }
    s.lease_duration_seconds = Some(duration.as_secs() as i32);
    s.renew_time = micro(now);
    s
}

/// The Lease spec after its holder `me` gives it up (a graceful stop: a rolling update),
/// as client-go's `ReleaseOnCancel` does: no holder, so that a standby takes it at its next
/// try instead of waiting out the lease. `None`: not ours to release.
pub fn released(spec: Option<&LeaseSpec>, me: &str) -> Option<LeaseSpec> {
    let s = spec?;
    if s.holder_identity.as_deref() != Some(me) {
        return None;
    }
    Some(LeaseSpec {
        holder_identity: Some(String::new()),
        lease_duration_seconds: Some(1),
        ..s.clone()
    })
}

/// Give the Lease up if we still hold it (best effort: on failure the standby waits out the
/// lease, as after a crash).
pub async fn release(client: kube::Client, cfg: &LeaderConfig) {
    let api: Api<Lease> = Api::namespaced(client, &cfg.namespace);
    let result = async {
        let Some(mut lease) = api.get_opt(&cfg.name).await? else {
            return Ok::<bool, Error>(false);
        };
        let Some(spec) = released(lease.spec.as_ref(), &cfg.identity) else {
            return Ok(false);
        };
        lease.spec = Some(spec);
        api.replace(&cfg.name, &PostParams::default(), &lease)
            .await?;
        Ok(true)
    }
    .await;
    match result {
        Ok(true) => tracing::info!(lease = %cfg.name, "released the Lease"),
        Ok(false) => {}
        Err(e) => tracing::warn!(lease = %cfg.name, error = %e, "could not release the Lease"),
    }
}

/// One attempt to take or renew the Lease: `Ok(true)` when we hold it now.
async fn try_take(api: &Api<Lease>, cfg: &LeaderConfig) -> Result<bool> {
    let now = SystemTime::now();
    match api.get_opt(&cfg.name).await? {
        None => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(cfg.name.clone()),
                    namespace: Some(cfg.namespace.clone()),
                    ..Default::default()
                },
                spec: Some(taken(None, &cfg.identity, cfg.lease_duration, now)),
            };
            match api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(e) if Error::is_conflict(&e) => Ok(false),
                Err(e) => Err(e.into()),
            }
        }
        Some(mut lease) => {
            if !can_take(lease.spec.as_ref(), &cfg.identity, now) {
                return Ok(false);
            }
            lease.spec = Some(taken(
                lease.spec.as_ref(),
                &cfg.identity,
                cfg.lease_duration,
                now,
            ));
            match api.replace(&cfg.name, &PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(e) if Error::is_conflict(&e) => Ok(false),
                Err(e) => Err(e.into()),
            }
        }
    }
}

/// Wait until we hold the Lease.
pub async fn acquire(client: kube::Client, cfg: &LeaderConfig) {
    let api: Api<Lease> = Api::namespaced(client, &cfg.namespace);
    loop {
        match try_take(&api, cfg).await {
            Ok(true) => {
                tracing::info!(lease = %cfg.name, identity = %cfg.identity, "leading");
                return;
            }
            Ok(false) => tracing::trace!(lease = %cfg.name, "another candidate leads; waiting"),
            Err(e) => {
                tracing::warn!(lease = %cfg.name, error = %e, "cannot read or take the Lease; retrying")
            }
        }
        tokio::time::sleep(cfg.renew).await;
    }
}

/// Keep renewing; returns when leadership is lost (someone else holds the Lease, or no
/// renewal succeeded for a whole lease duration).
pub async fn hold(client: kube::Client, cfg: &LeaderConfig) {
    let api: Api<Lease> = Api::namespaced(client, &cfg.namespace);
    let mut last_ok = std::time::Instant::now();
    loop {
        tokio::time::sleep(cfg.renew).await;
        match try_take(&api, cfg).await {
            Ok(true) => last_ok = std::time::Instant::now(),
            Ok(false) => {
                tracing::error!(lease = %cfg.name, "the Lease was taken by another candidate");
                return;
            }
            Err(e) => tracing::warn!(lease = %cfg.name, error = %e, "cannot renew the Lease"),
        }
        // stop before the lease could expire at the others' end
        if last_ok.elapsed() + cfg.renew >= cfg.lease_duration {
            tracing::error!(lease = %cfg.name, "could not renew the Lease in time");
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_is_taken_only_when_free_expired_or_ours() {
        let t0 = SystemTime::now();
        let d = Duration::from_secs(15);
        assert!(can_take(None, "a", t0));
        let held = taken(None, "a", d, t0);
        assert_eq!(held.lease_transitions, Some(0));
        assert!(can_take(Some(&held), "a", t0 + Duration::from_secs(1)));
        assert!(!can_take(Some(&held), "b", t0 + Duration::from_secs(14)));
        assert!(can_take(Some(&held), "b", t0 + Duration::from_secs(16)));
        let by_b = taken(Some(&held), "b", d, t0 + Duration::from_secs(16));
        assert_eq!(by_b.holder_identity.as_deref(), Some("b"));
        assert_eq!(by_b.lease_transitions, Some(1));
        let renewed = taken(Some(&by_b), "b", d, t0 + Duration::from_secs(18));
        assert_eq!(renewed.lease_transitions, Some(1));
        assert_eq!(renewed.acquire_time, by_b.acquire_time);
    }

    #[test]
    fn a_released_lease_is_free_at_once_and_only_its_holder_releases_it() {
        let t0 = SystemTime::now();
        let held = taken(None, "a", Duration::from_secs(15), t0);
        assert_eq!(released(Some(&held), "b"), None, "not b's");
        assert_eq!(released(None, "a"), None);
        let free = released(Some(&held), "a").expect("a holds it");
        assert!(can_take(Some(&free), "b", t0), "b takes it without waiting");
        let by_b = taken(Some(&free), "b", Duration::from_secs(15), t0);
        assert_eq!(by_b.lease_transitions, Some(1));
        assert_eq!(by_b.holder_identity.as_deref(), Some("b"));
    }
}
