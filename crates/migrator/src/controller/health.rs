//! Liveness and readiness, answered from the moment the process starts (a standby replica
//! waiting for the Lease answers too, or its kubelet would restart it forever).
//!
//! `/healthz` (liveness): the process serves. `/readyz` (readiness): every check passed at
//! its last run — `kubernetes` (the API server answers and roam's CRDs are installed) and
//! `ovn-nb` (the configured endpoint answers OVSDB and serves `OVN_Northbound`). Both checks
//! run every [`PERIOD`] on every replica, leader or not, so a wrong `--nb` or a missing CRD
//! shows in `kubectl get pods` (not ready), in `/readyz`'s body and in the log, never as a
//! silent crash loop.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// How often the checks run.
pub const PERIOD: Duration = Duration::from_secs(10);
/// How long one check may take.
const TIMEOUT: Duration = Duration::from_secs(5);

/// The resources of `roam.dev/v1alpha1` the controller cannot run without.
pub const CRDS: [&str; 4] = [
    "networks",
    "addresses",
    "virtualmachines",
    "virtualmachinemigrations",
];

/// The checks' latest results and the replica's role.
#[derive(Debug, Default)]
pub struct Health {
    checks: Mutex<BTreeMap<&'static str, Result<(), String>>>,
    leading: AtomicBool,
}

impl Health {
    /// Record a check's result; logs when it changes (a failure says what is wrong).
    pub fn set(&self, check: &'static str, result: Result<(), String>) {
        let mut checks = self.checks.lock().unwrap_or_else(|e| e.into_inner());
        let before = checks.insert(check, result.clone());
        if before.as_ref() != Some(&result) {
            match &result {
                Ok(()) => tracing::info!(check, "ready"),
                Err(e) => tracing::warn!(check, error = %e, "not ready"),
            }
        }
    }

    /// This replica holds the Lease (or runs without leader election).
    pub fn set_leading(&self) {
        self.leading.store(true, Ordering::SeqCst);
    }

    /// `/readyz`: ready, and a text with one line per check.
    pub fn readiness(&self) -> (bool, String) {
        let checks = self.checks.lock().unwrap_or_else(|e| e.into_inner());
        let role = if self.leading.load(Ordering::SeqCst) {
            "leader"
        } else {
            "standby"
        };
        render(&checks, role)
    }
}

/// Ready when at least one check ran and none failed. Pure: the endpoint's whole logic.
pub fn render(checks: &BTreeMap<&'static str, Result<(), String>>, role: &str) -> (bool, String) {
    let mut out = format!("role: {role}\n");
    if checks.is_empty() {
        out.push_str("checks: not run yet\n");
        return (false, out);
    }
    let mut ready = true;
    for (name, r) in checks {
        match r {
            Ok(()) => out.push_str(&format!("{name}: ok\n")),
            Err(e) => {
                ready = false;
                out.push_str(&format!("{name}: {e}\n"));
            }
        }
    }
    (ready, out)
}

/// Whether `resources` (the names `roam.dev/v1alpha1` serves) hold every CRD roam needs.
pub fn missing_crds<'a>(served: impl IntoIterator<Item = &'a str>) -> Vec<&'static str> {
    let served: Vec<&str> = served.into_iter().collect();
    CRDS.iter()
        .copied()
        .filter(|c| !served.contains(c))
        .collect()
}

/// The API server answers and serves roam's CRDs.
pub async fn check_kubernetes(client: &kube::Client) -> Result<(), String> {
    let list = tokio::time::timeout(
        TIMEOUT,
        client.list_api_group_resources("roam.dev/v1alpha1"),
    )
    .await
    .map_err(|_| format!("the API server did not answer within {TIMEOUT:?}"))?;
    match list {
        Ok(list) => {
            let missing = missing_crds(list.resources.iter().map(|r| r.name.as_str()));
            if missing.is_empty() {
                Ok(())
            } else {
                Err(format!(
                    "CRDs missing: {} (roam.dev/v1alpha1): install them with `kubectl apply -k deploy/`",
                    missing.join(", ")
                ))
            }
        }
        Err(kube::Error::Api(e)) if e.code == 404 => Err(
            "roam.dev/v1alpha1 is not served: roam's CRDs are not installed (`kubectl apply -k deploy/`)"
                .into(),
        ),
        Err(e) => Err(format!("the API server: {e}")),
    }
}

/// `endpoint` answers OVSDB and serves the OVN northbound database.
pub async fn check_nb(endpoint: &str, tls: Option<&roam_ovsdb::TlsSettings>) -> Result<(), String> {
    let options = roam_ovsdb::ClientOptions {
        tls: tls.cloned(),
        ..Default::default()
    };
    let probe = async {
        let client = roam_ovsdb::Client::connect_with(endpoint, options)
            .await
            .map_err(|e| {
                format!(
                    "cannot connect to the OVN northbound database at {endpoint}: {e} (check --nb)"
                )
            })?;
        let dbs = client
            .list_dbs()
            .await
            .map_err(|e| format!("{endpoint} does not answer OVSDB: {e} (check --nb)"))?;
        if dbs.iter().any(|d| d == "OVN_Northbound") {
            Ok(())
        } else {
            // `_Server` is every ovsdb-server's own
            let dbs: Vec<&String> = dbs.iter().filter(|d| *d != "_Server").collect();
            Err(format!(
                "{endpoint} serves {dbs:?}, not OVN_Northbound: point --nb at OVN's northbound database"
            ))
        }
    };
    tokio::time::timeout(TIMEOUT, probe)
        .await
        .map_err(|_| format!("the OVN northbound database at {endpoint} did not answer within {TIMEOUT:?} (check --nb)"))?
}

/// Run both checks now and every [`PERIOD`], forever.
pub async fn probe(
    health: std::sync::Arc<Health>,
    client: kube::Client,
    nb: String,
    tls: Option<roam_ovsdb::TlsSettings>,
) {
    loop {
        let (k, n) = tokio::join!(check_kubernetes(&client), check_nb(&nb, tls.as_ref()));
        health.set("kubernetes", k);
        health.set("ovn-nb", n);
        tokio::time::sleep(PERIOD).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_ready_until_a_check_ran_then_only_when_all_pass() {
        let mut checks = BTreeMap::new();
        let (ready, text) = render(&checks, "standby");
        assert!(!ready);
        assert_eq!(text, "role: standby\nchecks: not run yet\n");
        checks.insert("kubernetes", Ok(()));
        checks.insert(
            "ovn-nb",
            Err("cannot connect: refused (check --nb)".to_string()),
        );
        let (ready, text) = render(&checks, "leader");
        assert!(!ready);
        assert_eq!(
            text,
            "role: leader\nkubernetes: ok\novn-nb: cannot connect: refused (check --nb)\n"
        );
        checks.insert("ovn-nb", Ok(()));
        assert!(render(&checks, "leader").0);
    }

    #[test]
    fn names_the_missing_crds() {
        assert!(missing_crds(CRDS).is_empty());
        assert_eq!(
            missing_crds(["networks", "addresses", "networks/status"]),
            vec!["virtualmachines", "virtualmachinemigrations"]
        );
        assert_eq!(missing_crds([]), CRDS.to_vec());
    }

    #[test]
    fn set_keeps_the_latest_result() {
        let h = Health::default();
        h.set("ovn-nb", Err("down".into()));
        h.set("ovn-nb", Ok(()));
        h.set_leading();
        assert_eq!(
            h.readiness(),
            (true, "role: leader\novn-nb: ok\n".to_string())
        );
    }
}
