//! A mock Kubernetes API server and fake shims for the controller tests (no cluster, no OVN):
//! kube's [`Client`] over a `tower_test` service whose other end is [`ApiServerVerifier`].
//!
//! The verifier keeps the objects a test gives it (by URL path) and answers GET, LIST, POST,
//! PUT (resourceVersion checked), merge PATCH and DELETE from them, as the API server would;
//! every request (Events apart: they are published in the background, in no set order) must be
//! the next one the current [`Scenario`] expects — method, path and query, and the body fields
//! that matter — so a test pins the exact requests of a reconcile.

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use kube::Client;
use kube::client::Body;
use roam_ovsdb::ReconnectingClient;
use roam_shim_api::api::{DomainState, Job, JobState, JobStats, MigrateRequest, Status, path};
use roam_shim_api::events::{Event as ShimEvent, Lifecycle};
use serde_json::{Value, json};
use tokio::sync::Notify;
use tower_test::mock;

use super::{Config, Context};
use roam_api::{Address, Network};
use roam_core::network::validate_network;

/// The NB endpoint of a test [`Context`]: a socket that does not exist. The OVN syncer's
/// reads and writes go to a [`RecordedNb`] instead.
pub(super) const OFFLINE_NB: &str = "unix:/nonexistent/roam-controller-test-nb.sock";

/// The OVN syncer's NB in the controller's tests: reads an empty database (or the rows a
/// test put), records every transaction.
#[derive(Default)]
pub(super) struct RecordedNb {
    /// What a read of a network returns.
    pub(super) rows: Mutex<roam_network::topology::ActualState>,
    /// The transactions applied, in order.
    pub(super) transactions: Mutex<Vec<Vec<Value>>>,
}

impl super::ovn::Rows for Arc<RecordedNb> {
    fn read<'a>(
        &'a self,
        _network: &'a str,
    ) -> futures::future::BoxFuture<'a, crate::Result<roam_network::topology::ActualState>> {
        let rows = self.rows.lock().expect("rows lock").clone();
        Box::pin(async move { Ok(rows) })
    }
    fn apply(
        &self,
        ops: Vec<Value>,
    ) -> futures::future::BoxFuture<'_, crate::Result<roam_network::topology::ReconcileReport>>
    {
        let report = roam_network::topology::ReconcileReport::from_ops(&ops);
        self.transactions
            .lock()
            .expect("transactions lock")
            .push(ops);
        Box::pin(async move { Ok(report) })
    }
}

/// One request a scenario expects.
#[derive(Clone, Debug)]
pub(super) struct Expect {
    method: Method,
    /// Path and query, as kube sends them.
    uri: String,
    /// Fields the body must hold (a JSON subset), if any.
    body: Option<Value>,
}

impl Expect {
    pub(super) fn new(method: Method, uri: impl Into<String>) -> Expect {
        Expect {
            method,
            uri: uri.into(),
            body: None,
        }
    }
    pub(super) fn get(uri: impl Into<String>) -> Expect {
        Expect::new(Method::GET, uri)
    }
    pub(super) fn post(uri: impl Into<String>) -> Expect {
        Expect::new(Method::POST, uri)
    }
    pub(super) fn put(uri: impl Into<String>) -> Expect {
        Expect::new(Method::PUT, uri)
    }
    pub(super) fn patch(uri: impl Into<String>) -> Expect {
        Expect::new(Method::PATCH, uri)
    }
    pub(super) fn delete(uri: impl Into<String>) -> Expect {
        Expect::new(Method::DELETE, uri)
    }
    /// The body holds `fields` (every key given, recursively; arrays compared whole).
    pub(super) fn with(mut self, fields: Value) -> Expect {
        self.body = Some(fields);
        self
    }
}

/// The request sequences of the tests, one variant per reconcile (or background task) step.
/// [`Scenario::requests`] lists what the step must send, in order.
#[derive(Clone, Debug)]
pub(super) enum Scenario {
    /// Any requests, unchecked (setting up).
    Free,
    /// Exactly these requests.
    Steps(Vec<Expect>),
}

impl Scenario {
    fn requests(self) -> Option<VecDeque<Expect>> {
        match self {
            Scenario::Free => None,
            Scenario::Steps(s) => Some(s.into()),
        }
    }
}

#[derive(Default)]
struct ServerState {
    objects: BTreeMap<String, Value>,
    rv: u64,
    expected: Option<VecDeque<Expect>>,
    /// What was sent (`METHOD uri`), Events apart.
    seen: Vec<String>,
    /// The bodies sent, in order (Events apart).
    bodies: Vec<Value>,
    failures: Vec<String>,
    /// Creates (POST to a collection path) the server refuses: (path, code, message), as an
    /// admission plugin would (a ResourceQuota's 403).
    refusals: Vec<(String, u16, String)>,
    /// The Events published: (namespace, reason).
    events: Vec<(String, String)>,
}

/// The mock API server (see the module comment).
pub(super) struct ApiServerVerifier {
    state: Arc<Mutex<ServerState>>,
    task: tokio::task::JoinHandle<()>,
    /// The OVN syncer's NB.
    pub(super) nb: Arc<RecordedNb>,
}

impl Drop for ApiServerVerifier {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The URL path of an object (`/api/v1/namespaces/ns/pods/p`, `/apis/roam.dev/v1/networks/n`).
pub(super) fn object_path(v: &Value) -> String {
    let api_version = v["apiVersion"].as_str().expect("apiVersion");
    let kind = v["kind"].as_str().expect("kind");
    let plural = match kind {
        "Address" => "addresses".to_string(),
        "VirtualMachineMigration" => "virtualmachinemigrations".into(),
        k => format!("{}s", k.to_lowercase()),
    };
    let prefix = if api_version.contains('/') {
        format!("/apis/{api_version}")
    } else {
        format!("/api/{api_version}")
    };
    let name = v["metadata"]["name"].as_str().expect("name");
    match v["metadata"]["namespace"].as_str() {
        Some(ns) => format!("{prefix}/namespaces/{ns}/{plural}/{name}"),
        None => format!("{prefix}/{plural}/{name}"),
    }
}

/// RFC 7386 JSON merge patch.
pub(super) fn merge(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let t = target.as_object_mut().expect("an object");
    for (k, v) in p {
        if v.is_null() {
            t.remove(k);
        } else {
            merge(t.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

/// Whether `actual` holds every field of `want` (objects: the keys given; arrays: as many
/// elements, each holding its counterpart).
fn includes(actual: &Value, want: &Value) -> bool {
    match (actual, want) {
        (Value::Object(a), Value::Object(w)) => w
            .iter()
            .all(|(k, v)| includes(a.get(k).unwrap_or(&Value::Null), v)),
        (Value::Array(a), Value::Array(w)) => {
            a.len() == w.len() && a.iter().zip(w).all(|(a, w)| includes(a, w))
        }
        (a, w) => a == w,
    }
}

fn status(code: u16, message: &str) -> Value {
    let reason = match code {
        403 => "Forbidden",
        404 => "NotFound",
        409 => "Conflict",
        _ => "InternalError",
    };
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
           "message": message, "reason": reason, "code": code})
}

impl ServerState {
    fn next_rv(&mut self) -> String {
        self.rv += 1;
        self.rv.to_string()
    }

    /// Serve one request from the store: (code, body).
    fn serve(&mut self, method: &Method, path: &str, body: &Value) -> (u16, Value) {
        let stored = self.objects.get(path).cloned();
        match *method {
            Method::GET => match stored {
                Some(o) => (200, o),
                None => {
                    // a collection: the objects one segment below it
                    let prefix = format!("{path}/");
                    let items: Vec<Value> = self
                        .objects
                        .iter()
                        .filter(|(k, _)| {
                            k.strip_prefix(&prefix).is_some_and(|r| !r.contains('/'))
                                || (k.contains("/namespaces/") && is_all_namespaces(path, k))
                        })
                        .map(|(_, v)| v.clone())
                        .collect();
                    if items.is_empty() && !is_collection(path) {
                        (404, status(404, &format!("{path} not found")))
                    } else {
                        (
                            200,
                            json!({"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": self.rv.to_string()}, "items": items}),
                        )
                    }
                }
            },
            Method::POST => {
                let mut obj = body.clone();
                // a Secret's stringData is stored as data, base64, as the API server does
                if let Some(Value::Object(strings)) =
                    obj.as_object_mut().and_then(|o| o.remove("stringData"))
                {
                    for (k, v) in strings {
                        let bytes = k8s_openapi::ByteString(
                            v.as_str().unwrap_or_default().as_bytes().to_vec(),
                        );
                        obj["data"][k] = serde_json::to_value(bytes).expect("base64");
                    }
                }
                let p = object_path(&obj);
                if self.objects.contains_key(&p) {
                    return (409, status(409, &format!("{p} already exists")));
                }
                obj["metadata"]["resourceVersion"] = json!(self.next_rv());
                obj["metadata"]["uid"] = json!(format!("uid-{}", self.rv));
                self.objects.insert(p, obj.clone());
                (201, obj)
            }
            Method::PUT => {
                let key = path.trim_end_matches("/status");
                let Some(cur) = self.objects.get(key).cloned() else {
                    return (404, status(404, &format!("{key} not found")));
                };
                if body["metadata"]["resourceVersion"] != cur["metadata"]["resourceVersion"] {
                    return (409, status(409, &format!("{key}: stale resourceVersion")));
                }
                let mut obj = body.clone();
                obj["metadata"]["resourceVersion"] = json!(self.next_rv());
                self.objects.insert(key.to_string(), obj.clone());
                (200, obj)
            }
            Method::PATCH => {
                // a subresource (status, a CSR's approval) patches its object
                let key = path
                    .trim_end_matches("/status")
                    .trim_end_matches("/approval");
                let Some(mut obj) = self.objects.get(key).cloned() else {
                    return (404, status(404, &format!("{key} not found")));
                };
                let want_rv = &body["metadata"]["resourceVersion"];
                if !want_rv.is_null() && *want_rv != obj["metadata"]["resourceVersion"] {
                    return (409, status(409, &format!("{key}: stale resourceVersion")));
                }
                merge(&mut obj, body);
                obj["metadata"]["resourceVersion"] = json!(self.next_rv());
                self.objects.insert(key.to_string(), obj.clone());
                (200, obj)
            }
            Method::DELETE => match self.objects.remove(path) {
                Some(o) => (200, o),
                None => (404, status(404, &format!("{path} not found"))),
            },
            _ => (405, status(405, "method not allowed")),
        }
    }
}

/// `/api/v1/pods` (every namespace) holds `/api/v1/namespaces/x/pods/p`.
fn is_all_namespaces(collection: &str, key: &str) -> bool {
    let Some((group, plural)) = collection.rsplit_once('/') else {
        return false;
    };
    key.strip_prefix(&format!("{group}/namespaces/"))
        .and_then(|r| r.split_once('/'))
        .is_some_and(|(_, rest)| {
            rest.strip_prefix(&format!("{plural}/"))
                .is_some_and(|n| !n.contains('/'))
        })
}

fn is_collection(path: &str) -> bool {
    let last = path.rsplit('/').next().unwrap_or_default();
    [
        "namespaces",
        "nodes",
        "networks",
        "addresses",
        "virtualmachines",
        "virtualmachinemigrations",
        "pods",
    ]
    .contains(&last)
}

impl ApiServerVerifier {
    fn start(handle: mock::Handle<Request<Body>, Response<Body>>) -> ApiServerVerifier {
        let state = Arc::new(Mutex::new(ServerState::default()));
        let s = state.clone();
        let task = tokio::spawn(async move {
            let mut handle = handle;
            while let Some((req, send)) = handle.next_request().await {
                let (parts, body) = req.into_parts();
                let bytes = body
                    .collect()
                    .await
                    .map(|b| b.to_bytes())
                    .unwrap_or_default();
                let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
                let uri = parts.uri.to_string();
                let path = parts.uri.path().to_string();
                let (code, answer) = {
                    let mut st = s.lock().expect("server state");
                    if path.starts_with("/apis/events.k8s.io/") {
                        // Events are published in the background: recorded, not sequenced
                        let ns = path.split('/').nth(5).unwrap_or_default().to_string();
                        let reason = body["reason"].as_str().unwrap_or_default().to_string();
                        st.events.push((ns, reason));
                        (201, body)
                    } else {
                        st.seen.push(format!("{} {uri}", parts.method));
                        st.bodies.push(body.clone());
                        if let Some(exp) = st.expected.as_mut() {
                            match exp.pop_front() {
                                None => st.failures.push(format!(
                                    "unexpected request {} {uri} (the scenario has ended)",
                                    parts.method
                                )),
                                Some(e) => {
                                    if e.method != parts.method || e.uri != uri {
                                        st.failures.push(format!(
                                            "expected {} {}, got {} {uri}",
                                            e.method, e.uri, parts.method
                                        ));
                                    } else if let Some(w) = &e.body
                                        && !includes(&body, w)
                                    {
                                        st.failures.push(format!(
                                            "{} {uri}: body {body} does not hold {w}",
                                            parts.method
                                        ));
                                    }
                                }
                            }
                        }
                        match st
                            .refusals
                            .iter()
                            .find(|(p, ..)| parts.method == Method::POST && *p == path)
                        {
                            Some((_, code, message)) => (*code, status(*code, message)),
                            None => st.serve(&parts.method, &path, &body),
                        }
                    }
                };
                let resp = Response::builder()
                    .status(StatusCode::from_u16(code).expect("a status code"))
                    .header("content-type", "application/json")
                    .body(Body::from(serde_json::to_vec(&answer).expect("json")))
                    .expect("a response");
                send.send_response(resp);
            }
        });
        ApiServerVerifier {
            state,
            task,
            nb: Arc::default(),
        }
    }

    /// Store `obj` (any Kubernetes object) as the API server would hold it.
    /// Refuse every create in collection `path` with `code` and `message` (as an admission
    /// plugin would), from now on.
    pub(super) fn refuse_creates(&self, path: &str, code: u16, message: &str) {
        let mut st = self.state.lock().expect("server state");
        st.refusals
            .push((path.to_string(), code, message.to_string()));
    }

    pub(super) fn put<K: serde::Serialize>(&self, obj: &K) {
        let mut v = serde_json::to_value(obj).expect("an object");
        let mut st = self.state.lock().expect("server state");
        match v["metadata"]["resourceVersion"]
            .as_str()
            .map(str::parse::<u64>)
        {
            // later writes get later versions, as on an API server
            Some(Ok(rv)) => st.rv = st.rv.max(rv),
            _ => v["metadata"]["resourceVersion"] = json!(st.next_rv()),
        }
        st.objects.insert(object_path(&v), v);
    }

    /// The stored object at `path`, deserialized.
    pub(super) fn get<K: serde::de::DeserializeOwned>(&self, path: &str) -> Option<K> {
        let st = self.state.lock().expect("server state");
        st.objects
            .get(path)
            .map(|v| serde_json::from_value(v.clone()).expect("a stored object"))
    }

    /// The stored objects of the collection at `path`, deserialized.
    pub(super) fn list<K: serde::de::DeserializeOwned>(&self, path: &str) -> Vec<K> {
        let st = self.state.lock().expect("server state");
        let prefix = format!("{path}/");
        st.objects
            .iter()
            .filter(|(k, _)| k.strip_prefix(&prefix).is_some_and(|r| !r.contains('/')))
            .map(|(_, v)| serde_json::from_value(v.clone()).expect("a stored object"))
            .collect()
    }

    /// Expect exactly `scenario`'s requests from now on.
    pub(super) fn expect(&self, scenario: Scenario) {
        let mut st = self.state.lock().expect("server state");
        st.expected = scenario.requests();
        st.seen.clear();
        st.bodies.clear();
    }

    /// Wait (up to 5 s) until every expected request came, then check that nothing went
    /// wrong; returns the bodies sent during the scenario.
    pub(super) async fn done(&self) -> Vec<Value> {
        for _ in 0..500 {
            if self
                .state
                .lock()
                .expect("server state")
                .expected
                .as_ref()
                .is_none_or(|e| e.is_empty())
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let mut st = self.state.lock().expect("server state");
        let left: Vec<String> = st
            .expected
            .iter()
            .flatten()
            .map(|e| format!("{} {}", e.method, e.uri))
            .collect();
        assert!(
            st.failures.is_empty() && left.is_empty(),
            "requests sent:\n  {}\nfailures:\n  {}\nexpected but not sent:\n  {}",
            st.seen.join("\n  "),
            st.failures.join("\n  "),
            left.join("\n  ")
        );
        st.expected = Some(VecDeque::new());
        std::mem::take(&mut st.bodies)
    }

    /// Wait (up to 5 s) until Events with these reasons were published; returns every
    /// Event's reason so far.
    pub(super) async fn events(&self, reasons: &[&str]) -> Vec<String> {
        for _ in 0..500 {
            let got: Vec<String> = self
                .state
                .lock()
                .expect("server state")
                .events
                .iter()
                .map(|(_, r)| r.clone())
                .collect();
            if reasons.iter().all(|r| got.iter().any(|g| g == r)) {
                return got;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let st = self.state.lock().expect("server state");
        panic!("Events {reasons:?} not published; got {:?}", st.events);
    }
}

/// The controllers' settings in the tests.
pub(super) fn config() -> Config {
    Config {
        nb: OFFLINE_NB.into(),
        sb: None,
        ovn_tls: None,
        network_selector: None,
        node_selector: None,
        pod_namespace: None,
        namespace_selector: None,
        concurrency: 1,
        claims_in_flight: 0,
        ovn_debounce: Duration::from_millis(1),
        sweep_period: Duration::from_secs(3600),
        identity: "test".into(),
        event_namespace: "roam-system".into(),
        secret_namespace: "roam-system".into(),
        vm: crate::launcher::VmConfig {
            launcher_image: "roam-shim:test".into(),
            shim_ports: (17100, 17199),
            peer_libvirt_uri: "qemu+tcp://{ip}:{port}/system".into(),
            vm_log_dir: "/var/log/roam".into(),
            priority_class: None,
            node_pki_dir: None,
            image_root: None,
            cpu_allocation_ratio: roam_core::placement::DEFAULT_CPU_ALLOCATION_RATIO,
            runners: None,
        },
        pki: None,
    }
}

/// A [`Context`] over the mock API server, its index listed (synced) with `networks` (valid
/// ones planned), `nodes` and `addresses`, and no NB. The one place that builds a Context.
pub(super) fn context(
    networks: &[Network],
    nodes: &[&str],
    addresses: &[Address],
) -> (Arc<Context>, ApiServerVerifier) {
    context_with(config(), networks, nodes, addresses)
}

/// [`context`] with other settings than [`config`]'s.
pub(super) fn context_with(
    config: Config,
    networks: &[Network],
    nodes: &[&str],
    addresses: &[Address],
) -> (Arc<Context>, ApiServerVerifier) {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    let client = Client::new(service, "default");
    let verifier = ApiServerVerifier::start(handle);
    let nb = ReconnectingClient::start(OFFLINE_NB, Default::default()).expect("an NB endpoint");
    let rows = Box::new(verifier.nb.clone());
    let (ctx, _flips) = Context::with_rows(client, config, (nb, None), Default::default(), rows);
    {
        let mut index = ctx.index.lock().expect("index lock");
        for n in networks {
            let name = n.metadata.name.clone().expect("a named Network");
            if let Ok(plan) = validate_network(&name, &n.spec) {
                index.networks.insert(name.clone(), plan);
            }
            index.network_objects.insert(name, Arc::new(n.clone()));
        }
        index.nodes = nodes.iter().map(|n| n.to_string()).collect();
        for a in addresses {
            index.upsert(a.clone());
        }
        index.synced = [true; 3];
        index.networks_listed = true;
        index.addresses_listed = Some(None);
    }
    (ctx, verifier)
}

/// What a fake shim answers and what it was asked.
#[derive(Clone, Debug)]
pub(super) struct ShimState {
    /// `GET /v1/status`.
    pub status: Status,
    /// The event log (`GET /v1/events`).
    pub events: Vec<ShimEvent>,
    /// The requests (`METHOD path`), in order.
    pub calls: Vec<String>,
    /// The last `POST /v1/migrate`.
    pub migrate: Option<MigrateRequest>,
}

/// A fake roam-shim API on a loopback address: answers from a [`ShimState`] the test edits.
pub(super) struct FakeShim {
    pub state: Arc<Mutex<ShimState>>,
    pub addr: SocketAddr,
    changed: Arc<Notify>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeShim {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A shim status: the domain in `domain`, run by pod `instance`.
pub(super) fn shim_status(node: &str, domain: DomainState, instance: &str) -> Status {
    Status {
        vm: "ns_demo".into(),
        node: node.into(),
        domain,
        incoming: false,
        job: None,
        last_incoming: None,
        instance: Some(instance.into()),
        resets: 0,
        ports: vec![],
        torn_down: false,
    }
}

/// A job of the source shim.
pub(super) fn job(id: u64, state: JobState, target: &str) -> Job {
    Job {
        id,
        state,
        target: target.into(),
        target_node: None,
        request: roam_shim_api::api::MigrateParameters {
            bandwidth_mib_s: None,
            max_downtime_ms: None,
            auto_converge: false,
            post_copy: false,
            timeout_s: 600,
        },
        started_unix_ns: 1,
        finished_unix_ns: None,
        error: None,
        stats: JobStats::default(),
    }
}

impl FakeShim {
    /// Serve `status` on `addr` (port 0: an ephemeral one).
    pub(super) async fn start(addr: SocketAddr, status: Status) -> std::io::Result<FakeShim> {
        let listener = tokio::net::TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(Mutex::new(ShimState {
            status,
            events: vec![],
            calls: vec![],
            migrate: None,
        }));
        let changed = Arc::new(Notify::new());
        let (s, c) = (state.clone(), changed.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let (s, c) = (s.clone(), c.clone());
                tokio::spawn(async move {
                    let svc = hyper::service::service_fn(move |req| {
                        let (s, c) = (s.clone(), c.clone());
                        async move { Ok::<_, std::convert::Infallible>(shim_answer(req, &s, &c).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Ok(FakeShim {
            state,
            addr,
            changed,
            task,
        })
    }

    /// Change what the shim answers.
    pub(super) fn update(&self, f: impl FnOnce(&mut ShimState)) {
        f(&mut self.state.lock().expect("shim state"));
        self.changed.notify_waiters();
    }

    /// Append a lifecycle event to the shim's log; its sequence number.
    pub(super) fn event(&self, kind: Lifecycle) -> u64 {
        let mut at = 0;
        self.update(|s| {
            let seq = s.events.len() as u64 + 1;
            at = seq;
            s.events.push(ShimEvent {
                seq,
                kind,
                at_unix_ns: 1,
                node: s.status.node.clone(),
                libvirt: (0, 0),
            });
        });
        at
    }

    /// Wait (up to 5 s) until the shim was asked for the events after `seq`: whoever follows
    /// its events has handled every one up to `seq`.
    pub(super) async fn handled(&self, seq: u64) {
        let asked = format!("after={seq}&");
        for _ in 0..500 {
            let calls = self.state.lock().expect("shim state").calls.clone();
            if calls
                .iter()
                .any(|c| c.starts_with("GET /v1/events?") && c.contains(&asked))
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("nobody asked for the events after {seq}");
    }

    /// The requests so far (`METHOD path?query`), and forget them.
    pub(super) fn take_calls(&self) -> Vec<String> {
        std::mem::take(&mut self.state.lock().expect("shim state").calls)
    }
}

async fn shim_answer(
    req: Request<hyper::body::Incoming>,
    s: &Mutex<ShimState>,
    changed: &Notify,
) -> Response<http_body_util::Full<bytes::Bytes>> {
    let (parts, body) = req.into_parts();
    let bytes = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let path = parts.uri.path().to_string();
    let query: BTreeMap<String, String> = parts
        .uri
        .query()
        .unwrap_or_default()
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    s.lock()
        .expect("shim state")
        .calls
        .push(format!("{} {}", parts.method, parts.uri));
    let answer: Value = match (parts.method.clone(), path.as_str()) {
        (Method::GET, path::STATUS) => json!(s.lock().expect("shim state").status),
        (Method::POST, path::MIGRATE) => {
            let req: MigrateRequest = serde_json::from_slice(&bytes).expect("a MigrateRequest");
            let mut st = s.lock().expect("shim state");
            let j = job(7, JobState::Running, &req.target);
            st.status.job = Some(j.clone());
            st.migrate = Some(req);
            json!(j)
        }
        (Method::POST, path::ANNOUNCE) => json!({"ports": ["announced"]}),
        (Method::POST, path::TEARDOWN) => {
            let mut st = s.lock().expect("shim state");
            let had = st.status.domain != DomainState::Absent;
            st.status.domain = DomainState::Absent;
            st.status.torn_down = true;
            json!({"destroyed_domain": had, "removed_taps": if had { vec!["tap-demo"] } else { vec![] }})
        }
        (Method::POST, path::ABORT) => {
            let mut st = s.lock().expect("shim state");
            let j = st.status.job.as_mut().expect("a job to abort");
            j.state = JobState::Aborted;
            json!(j)
        }
        (Method::GET, path::EVENTS) => {
            let after: u64 = query.get("after").and_then(|v| v.parse().ok()).unwrap_or(0);
            let wait: u64 = query
                .get("wait_ms")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            let deadline = tokio::time::Instant::now() + Duration::from_millis(wait);
            loop {
                let notified = changed.notified();
                let evs: Vec<ShimEvent> = {
                    let st = s.lock().expect("shim state");
                    st.events
                        .iter()
                        .filter(|e| e.seq > after)
                        .cloned()
                        .collect()
                };
                if !evs.is_empty() || tokio::time::Instant::now() >= deadline {
                    let next = evs.last().map_or(after, |e| e.seq);
                    break json!({"events": evs, "next": next});
                }
                let _ = tokio::time::timeout_at(deadline, notified).await;
            }
        }
        _ => {
            return Response::builder()
                .status(404)
                .body(http_body_util::Full::new(bytes::Bytes::from_static(
                    br#"{"code":"not-found","error":"no such path"}"#,
                )))
                .expect("a response");
        }
    };
    Response::builder()
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from(
            serde_json::to_vec(&answer).expect("json"),
        )))
        .expect("a response")
}
