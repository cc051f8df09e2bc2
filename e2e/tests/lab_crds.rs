//! roam's CRDs on the lab's real API server: they install and establish, objects validate
//! against their schemas, the printer columns show, and an Address's derived name is the
//! lock on its IP — a second claim of the same IP cannot be created.

use std::net::Ipv4Addr;
use std::time::Duration;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use roam_api::{Address, AddressSpec, Network, NetworkSpec, address_name, crds};
use roam_e2e::{Lab, run};

#[tokio::test]
async fn crds_install_and_the_address_name_locks_the_ip() {
    let lab = Lab::get();
    let client = lab.kube_client().await;
    let crd_api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let ssa = PatchParams::apply("roam-e2e").force();
    for crd in crds() {
        let name = crd.metadata.name.clone().unwrap();
        crd_api
            .patch(&name, &ssa, &Patch::Apply(&crd))
            .await
            .expect("apply CRD");
        tokio::time::timeout(
            Duration::from_secs(60),
            await_condition(crd_api.clone(), &name, conditions::is_crd_established()),
        )
        .await
        .expect("CRD established in time")
        .expect("watch CRD");
    }

    let networks: Api<Network> = Api::all(client.clone());
    let net_name = format!("e2e-crds-{}", std::process::id());
    let net = Network::new(
        &net_name,
        NetworkSpec {
            mode: Default::default(),
            vlan: None,
            subnet: "100.64.0.0/10".into(),
            gateway: None,
            excluded: vec![],
            pool_size_per_node: Some(10),
            refill_period_seconds: None,
            reclaim_grace_seconds: None,
            dns: vec![],
            mtu: None,
            physnet: None,
            transit_subnet: None,
            namespaces: vec!["default".into()],
            namespace_selector: Some(
                serde_json::from_value(serde_json::json!({
                    "matchLabels": {"team": "web"},
                    "matchExpressions": [{"key": "env", "operator": "In", "values": ["prod"]}],
                }))
                .expect("a LabelSelector"),
            ),
            all_namespaces: false,
            service_classes: Some(vec!["telephony".into(), "network-control".into()]),
        },
    );
    let created = networks
        .create(&PostParams::default(), &net)
        .await
        .expect("create Network");
    // the access fields are in the schema: the API server keeps them (nothing pruned)
    assert_eq!(created.spec, net.spec, "the Network as stored");

    let addresses: Api<Address> = Api::all(client.clone());
    let ip = Ipv4Addr::new(100, 64, 7, 9);
    let name = address_name(&net_name, ip);
    let claim = |mac: &str, owner: &str| {
        Address::new(
            &name,
            AddressSpec {
                network: net_name.clone(),
                ip: ip.to_string(),
                mac: mac.into(),
                gateway: None,
                owner: Some(owner.into()),
                host: Some("node-a".into()),
                reserved: true,
                deleted: false,
                deletion_time: None,
                vlan: None,
                interface: None,
                dhcp: false,
                service_class: None,
            },
        )
    };
    addresses
        .create(
            &PostParams::default(),
            &claim("0a:58:64:40:07:09", "default-a"),
        )
        .await
        .expect("first claim");
    let second = addresses
        .create(
            &PostParams::default(),
            &claim("0a:58:64:40:07:10", "default-b"),
        )
        .await;
    match second {
        Err(kube::Error::Api(e)) => assert_eq!(e.code, 409, "AlreadyExists: {e:?}"),
        other => panic!("a second claim of {ip} must be refused, got {other:?}"),
    }
    let got = addresses.get(&name).await.unwrap();
    assert_eq!(
        got.spec.owner.as_deref(),
        Some("default-a"),
        "the first claim holds the IP"
    );

    // the schema is enforced by the API server (reserved must be a boolean)
    let bad = serde_json::json!({
        "apiVersion": "roam.dev/v1alpha1", "kind": "Address",
        "metadata": {"name": format!("{name}-bad")},
        "spec": {"network": net_name, "ip": "100.64.7.10", "mac": "0a:58:64:40:07:0a", "reserved": "yes"}
    });
    let raw: Api<kube::api::DynamicObject> = Api::all_with(
        client.clone(),
        &kube::discovery::ApiResource::erase::<Address>(&()),
    );
    let bad: kube::api::DynamicObject = serde_json::from_value(bad).unwrap();
    assert!(
        raw.create(&PostParams::default(), &bad).await.is_err(),
        "schema validation rejects reserved=\"yes\""
    );

    let table = run(
        lab.kubectl(),
        &["--kubeconfig", lab.kubeconfig(), "get", "addresses", &name],
    );
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        ["NAME", "IP", "MAC", "OWNER", "HOST", "RESERVED", "DELETED"],
        "{table}"
    );
    assert!(
        table.contains("100.64.7.9") && table.contains("default-a") && table.contains("node-a"),
        "{table}"
    );

    addresses
        .delete(&name, &DeleteParams::default())
        .await
        .unwrap();
    networks
        .delete(&net_name, &DeleteParams::default())
        .await
        .unwrap();
}
