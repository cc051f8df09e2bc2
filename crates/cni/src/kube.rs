//! Kubernetes API adapter: wait, bounded, for the pod's `roam.dev/addresses` annotation.

use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::config::{KubeConfigOptions, Kubeconfig};
use roam_contract::keys::{ADDRESSES, ERROR_ANNOTATION};

use crate::error::{Error, Result};

async fn client(kubeconfig: &Path) -> Result<kube::Client> {
    let kc = Kubeconfig::read_from(kubeconfig)
        .map_err(|e| Error::Kube(format!("read kubeconfig {}: {e}", kubeconfig.display())))?;
    let mut config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
        .await
        .map_err(|e| Error::Kube(format!("kubeconfig {}: {e}", kubeconfig.display())))?;
    config.connect_timeout = Some(Duration::from_secs(5));
    config.read_timeout = Some(Duration::from_secs(10));
    kube::Client::try_from(config).map_err(|e| Error::Kube(format!("build the client: {e}")))
}

/// The pod's `roam.dev/addresses` value, once it is there; waits at most `timeout`.
/// A pod that does not exist, a pod roam-controller refused (`roam.dev/error` without
/// addresses), or a request the API server refuses, is an error at once;
/// an API server that does not answer is retried until the deadline.
pub async fn wait_addresses(
    kubeconfig: &Path,
    namespace: &str,
    name: &str,
    timeout: Duration,
) -> Result<String> {
    let started = Instant::now();
    let deadline = started + timeout;
    let pods: Api<Pod> = Api::namespaced(client(kubeconfig).await?, namespace);
    let mut pause = Duration::from_millis(50);
    let mut last_error: Option<String> = None;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left.max(Duration::from_millis(1)), pods.get_opt(name)).await {
            Ok(Ok(Some(pod))) => {
                last_error = None;
                let annotations = pod.metadata.annotations.unwrap_or_default();
                if let Some(v) = annotations.get(ADDRESSES) {
                    return Ok(v.clone());
                }
                if let Some(reason) = annotations.get(ERROR_ANNOTATION) {
                    return Err(Error::Refused {
                        namespace: namespace.into(),
                        pod: name.into(),
                        reason: reason.clone(),
                    });
                }
            }
            Ok(Ok(None)) => {
                return Err(Error::Kube(format!(
                    "pod {namespace}/{name} does not exist"
                )));
            }
            // refused (401, 403, 422...): retrying will not help
            Ok(Err(kube::Error::Api(status)))
                if (400..500).contains(&status.code) && status.code != 429 =>
            {
                return Err(Error::Kube(format!(
                    "get pod {namespace}/{name}: {}",
                    status.message
                )));
            }
            Ok(Err(e)) => last_error = Some(e.to_string()),
            Err(_) => {}
        }
        if Instant::now() >= deadline {
            return Err(match last_error {
                Some(e) => Error::KubeUnreachable(format!(
                    "get pod {namespace}/{name}: {e} (retried for {timeout:?})"
                )),
                None => Error::AnnotationTimeout {
                    namespace: namespace.into(),
                    pod: name.into(),
                    annotation: ADDRESSES,
                    waited_secs: started.elapsed().as_secs(),
                },
            });
        }
        tokio::time::sleep(pause.min(deadline.saturating_duration_since(Instant::now()))).await;
        pause = (pause * 2).min(Duration::from_millis(500));
    }
}
