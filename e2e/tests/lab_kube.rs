//! The lab's Kubernetes is real: a kube-rs client creates a CRD, an object of it, and sees
//! the object arrive through a watch. (The lab's Nodes are checked in lab_nodes.rs.)

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{CustomResource, CustomResourceExt, ResourceExt};
use roam_e2e::Lab;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A throw-away kind, only for this test.
#[derive(CustomResource, Deserialize, Serialize, Clone, Debug, JsonSchema)]
#[kube(group = "e2e.roam.dev", version = "v1", kind = "Smoke", namespaced)]
pub struct SmokeSpec {
    message: String,
}

#[tokio::test]
async fn crd_object_is_seen_through_a_watch() {
    let lab = Lab::get();
    let client = lab.kube_client().await;
    let version = client
        .apiserver_version()
        .await
        .expect("API server answers /version");
    assert_eq!(version.major, "1", "{version:?}");

    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let ssa = PatchParams::apply("roam-e2e").force();
    crds.patch("smokes.e2e.roam.dev", &ssa, &Patch::Apply(Smoke::crd()))
        .await
        .expect("apply CRD");
    tokio::time::timeout(
        Duration::from_secs(60),
        await_condition(
            crds,
            "smokes.e2e.roam.dev",
            conditions::is_crd_established(),
        ),
    )
    .await
    .expect("CRD established in time")
    .expect("watch the CRD");

    let smokes: Api<Smoke> = Api::namespaced(client.clone(), "default");
    let name = format!("smoke-{}", std::process::id());
    let watch_api = smokes.clone();
    let wanted = name.clone();
    let seen = tokio::spawn(async move {
        let mut stream = watcher(watch_api, watcher::Config::default())
            .applied_objects()
            .boxed();
        while let Some(obj) = stream.try_next().await.expect("watch stream") {
            if obj.name_any() == wanted {
                return obj.spec.message;
            }
        }
        panic!("watch ended without the object");
    });
    smokes
        .create(
            &PostParams::default(),
            &Smoke::new(
                &name,
                SmokeSpec {
                    message: "hello roam".into(),
                },
            ),
        )
        .await
        .expect("create object");
    let message = tokio::time::timeout(Duration::from_secs(60), seen)
        .await
        .expect("object seen through the watch in time")
        .expect("watch task");
    assert_eq!(message, "hello roam");
    smokes
        .delete(&name, &DeleteParams::default())
        .await
        .expect("delete object");
}
