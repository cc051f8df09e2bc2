//! Kubernetes API adapter: wait, bounded, for the pod's `roam.dev/addresses` annotation and
//! for the Address objects it names to say they are the pod's ([`crate::trust`]).

use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::config::{KubeConfigOptions, Kubeconfig};
use roam_contract::annotation::{PodAddress, parse_addresses};
use roam_contract::keys::{ADDRESSES, LAUNCHER_LABEL};
use roam_contract::owner::{owner_key, refs_of};

use crate::error::{Error, Result};
use crate::trust::{Verdict, verdict};

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

/// What a pod is to be given.
#[derive(Debug)]
pub enum Attachment {
    /// The addresses of its `roam.dev/addresses`, every one the pod's.
    Addresses(Vec<PodAddress>),
    /// No network: a VM's launcher pod (labelled `roam.dev/launcher`), whose VM has the
    /// VM's addresses through its runner; the pod itself only shows the console. A pod that
    /// forges the label only cuts itself off.
    Isolated,
}

/// The pod's `roam.dev/addresses`, parsed, once it is there and every Address it names is
/// the pod's; waits at most `timeout`. A pod that does not exist, a malformed annotation, a
/// pod roam-controller refused (`roam.dev/error` without addresses), or a request the API
/// server refuses, is an error at once; addresses that are not the pod's (roam-controller
/// replaces an annotation it did not write) and an API server that does not answer are
/// waited out until the deadline.
pub async fn wait_addresses(
    kubeconfig: &Path,
    namespace: &str,
    name: &str,
    timeout: Duration,
) -> Result<Attachment> {
    let started = Instant::now();
    let deadline = started + timeout;
    let client = client(kubeconfig).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let gvk = GroupVersionKind::gvk("roam.dev", "v1alpha1", "Address");
    let addresses: Api<DynamicObject> = Api::all_with(
        client,
        &ApiResource::from_gvk_with_plural(&gvk, "addresses"),
    );
    let mut pause = Duration::from_millis(50);
    let mut last_error: Option<String> = None;
    let mut not_the_pods: Option<String> = None;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left.max(Duration::from_millis(1)), pods.get_opt(name)).await {
            Ok(Ok(Some(pod))) => {
                last_error = None;
                let labels = pod.metadata.labels.clone().unwrap_or_default();
                if labels.get(LAUNCHER_LABEL).map(String::as_str) == Some("true") {
                    return Ok(Attachment::Isolated);
                }
                let node = pod.spec.as_ref().and_then(|s| s.node_name.clone());
                let annotations = pod.metadata.annotations.unwrap_or_default();
                let mut checked_out = None;
                if let Some(v) = annotations.get(ADDRESSES) {
                    let list = parse_addresses(v).map_err(|source| Error::BadAnnotation {
                        namespace: namespace.into(),
                        pod: name.into(),
                        source: Box::new(source),
                    })?;
                    let owners = refs_of(pod.metadata.owner_references.as_ref());
                    let owner = owner_key(namespace, name, &labels, &owners);
                    match first_problem(&addresses, &list, &owner, node.as_deref()).await {
                        Ok(None) => checked_out = Some(list),
                        Ok(Some(p)) => not_the_pods = Some(p),
                        Err(e) => last_error = Some(e),
                    }
                }
                match verdict(&annotations, checked_out.is_some()) {
                    Verdict::Plumb => {
                        return Ok(Attachment::Addresses(checked_out.unwrap_or_default()));
                    }
                    Verdict::Refused(reason) => {
                        return Err(Error::Refused {
                            namespace: namespace.into(),
                            pod: name.into(),
                            reason,
                        });
                    }
                    Verdict::Wait => {}
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
            if let Some(problem) = not_the_pods {
                return Err(Error::NotThePods {
                    namespace: namespace.into(),
                    pod: name.into(),
                    problem,
                });
            }
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

/// The first of `list` that is not the pod's ([`crate::trust::address_problem`]);
/// `Err`: an Address could not be read.
async fn first_problem(
    addresses: &Api<DynamicObject>,
    list: &[PodAddress],
    owner: &str,
    node: Option<&str>,
) -> std::result::Result<Option<String>, String> {
    for pa in list {
        let obj = addresses
            .get_opt(&pa.address)
            .await
            .map_err(|e| format!("get Address {}: {e}", pa.address))?;
        let spec = obj.as_ref().and_then(|o| o.data.get("spec"));
        if let Some(p) = crate::trust::address_problem(pa, spec, owner, node) {
            return Ok(Some(p));
        }
    }
    Ok(None)
}
