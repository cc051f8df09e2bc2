//! roam-controller in the lab: the installation `e2e/lab up` made ([`Installed`]), and the
//! controllers of tests that need one of their own ([`ControllerProcess`]: fault injection,
//! races, misconfiguration, least privilege) — each a pod, from the installed image.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use serde_json::json;

use crate::lab::{Lab, kubectl_manifest, try_kubectl};

/// The image `e2e/lab up` builds and imports into every node (e2e/labkit/roam.sh).
pub const CONTROLLER_IMAGE: &str = "lab.local/roam-controller:dev";
/// Where a test's controller pod runs by default, and the ServiceAccount it runs as (bound to
/// cluster-admin, as the admin kubeconfig test controllers once ran with).
const TEST_NODE: &str = "node-a";
const TEST_SA: (&str, &str) = ("roam-system", "roam-test-controller");

/// A test's own roam-controller: a pod on node-a (host network, the image `e2e/lab up`
/// installed, restartPolicy Never) with the lab's NB and SB, metrics and probes on
/// `node-a:<metrics_port>`, and the test's flags. Killed (SIGKILL, as a crash) and deleted
/// when dropped; its log is read with `kubectl logs` while it runs and kept in a file under
/// the lab directory once it is gone ([`ControllerProcess::log_tail`]).
pub struct ControllerProcess {
    lab: Lab,
    /// The pod's namespace and name.
    pub namespace: String,
    pub pod: String,
    /// Its log, once the pod is gone.
    pub log: PathBuf,
    /// Its metrics address (`NODE_IP:PORT`).
    pub metrics: String,
    gone: bool,
}

impl ControllerProcess {
    /// Start a controller pod named `name` (also its identity), metrics on
    /// `<metrics_port>`, with `args` added (e.g. `--network-selector`, `--leader-elect
    /// false`), as the test ServiceAccount.
    pub fn start(lab: &Lab, name: &str, metrics_port: u16, args: &[&str]) -> ControllerProcess {
        Self::start_env(lab, name, metrics_port, args, &[])
    }

    /// [`ControllerProcess::start`] with `env` added to its environment (e.g.
    /// `ROAM_FAILPOINT`).
    pub fn start_env(
        lab: &Lab,
        name: &str,
        metrics_port: u16,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> ControllerProcess {
        test_service_account(lab);
        Self::start_as(lab, name, metrics_port, args, env, TEST_SA)
    }

    /// [`ControllerProcess::start_env`] as ServiceAccount `sa` = (namespace, name): the pod
    /// runs in that namespace with that account's token (in-cluster configuration).
    pub fn start_as(
        lab: &Lab,
        name: &str,
        metrics_port: u16,
        args: &[&str],
        env: &[(&str, &str)],
        (namespace, sa): (&str, &str),
    ) -> ControllerProcess {
        let pod = name.to_lowercase().replace('_', "-");
        let metrics = format!("{}:{metrics_port}", lab.node(TEST_NODE).ip);
        ovn_tls_secret(lab, namespace);
        let mut all: Vec<String> = [
            "--nb",
            lab.var("ROAM_OVN_NB_SSL"),
            "--ovn-ca",
            &format!("{OVN_TLS_DIR}/ca.crt"),
            "--ovn-cert",
            &format!("{OVN_TLS_DIR}/tls.crt"),
            "--ovn-key",
            &format!("{OVN_TLS_DIR}/tls.key"),
            "--sb",
            lab.var("ROAM_OVN_SB_SSL"),
            "--metrics-addr",
            &format!("0.0.0.0:{metrics_port}"),
            "--identity",
            name,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        all.extend(args.iter().map(|s| s.to_string()));
        let api = lab.var("ROAM_API_SERVER");
        let (host, port) = api.rsplit_once(':').expect("HOST:PORT");
        let mut envs = vec![
            json!({"name": "KUBERNETES_SERVICE_HOST", "value": host}),
            json!({"name": "KUBERNETES_SERVICE_PORT", "value": port}),
            json!({"name": "RUST_LOG", "value": "info,roam_migrator=debug,kube=warn"}),
            json!({"name": "ROAM_TEST_POD", "value": format!("{namespace}/{pod}")}),
        ];
        envs.extend(env.iter().map(|(k, v)| json!({"name": k, "value": v})));
        let manifest = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod, "namespace": namespace,
                         "labels": {"roam.dev/test-controller": "true"}},
            "spec": {
                "nodeName": TEST_NODE, "hostNetwork": true,
                "dnsPolicy": "ClusterFirstWithHostNet", "restartPolicy": "Never",
                "serviceAccountName": sa, "terminationGracePeriodSeconds": 0,
                // the lab's kubelets report disk pressure on the shared disk
                "priorityClassName": "system-node-critical",
                "containers": [{
                    "name": "controller", "image": CONTROLLER_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["/usr/local/bin/roam-controller"], "args": all,
                    "env": envs,
                    "volumeMounts": [{"name": "ovn-tls", "mountPath": OVN_TLS_DIR,
                                      "readOnly": true}],
                }],
                "volumes": [{"name": "ovn-tls", "secret": {"secretName": OVN_TLS_SECRET}}],
            },
        });
        let me = ControllerProcess {
            lab: lab.clone(),
            namespace: namespace.into(),
            pod: pod.clone(),
            log: lab.dir().join(format!("{pod}.log")),
            metrics,
            gone: false,
        };
        // a previous incarnation of the same name (a restart) must be gone first
        me.delete();
        let _ = std::fs::remove_file(&me.log);
        kubectl_manifest(lab, "create", &manifest)
            .unwrap_or_else(|e| panic!("create controller pod {namespace}/{pod}: {e}"));
        crate::lab::wait_until_else(
            Duration::from_secs(120),
            &format!("controller pod {namespace}/{pod} to run"),
            // the process, and the kubelet reporting it (kubectl logs needs that)
            || {
                me.pid()?;
                let state = me
                    .kubectl(&[
                        "get",
                        "pod",
                        &pod,
                        "-o",
                        "jsonpath={.status.containerStatuses[0].state.running.startedAt}",
                    ])
                    .ok()?;
                (!state.trim().is_empty()).then_some(())
            },
            || {
                format!(
                    "{}\n{}",
                    me.kubectl(&["describe", "pod", &pod]).unwrap_or_else(|e| e),
                    me.log_text()
                )
            },
        );
        me
    }

    /// The PID (in the host's PID namespace) of its roam-controller process.
    pub fn pid(&self) -> Option<u32> {
        process_with_env(&format!("ROAM_TEST_POD={}/{}", self.namespace, self.pod))
    }

    /// The last `n` lines of its log.
    pub fn log_tail(&self, n: usize) -> String {
        let text = self.log_text();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// Its whole log.
    pub fn log_text(&self) -> String {
        if self.gone {
            return std::fs::read_to_string(&self.log).unwrap_or_default();
        }
        self.kubectl(&["logs", &self.pod])
            .unwrap_or_else(|e| format!("(kubectl logs {}: {e})", self.pod))
    }

    /// GET its `/metrics`.
    pub fn scrape(&self) -> Option<String> {
        self.get("/metrics").map(|(_, body)| body)
    }

    /// GET `path` from its metrics address, with the test ServiceAccount's token (which may
    /// read `/metrics`): the status code and the body (`None`: no answer).
    pub fn get(&self, path: &str) -> Option<(u16, String)> {
        static TOKEN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
        let token = TOKEN.get_or_init(|| {
            let (ns, sa) = TEST_SA;
            test_service_account(&self.lab);
            crate::lab::service_account_token(&self.lab, ns, sa)
        });
        http_get_as(&self.metrics, path, Some(token))
    }

    /// Its resident set size in KiB, from `/proc/PID/status`.
    pub fn rss_kib(&self) -> Option<u64> {
        rss_kib(self.pid()?)
    }

    /// Kill it now (SIGKILL: no graceful shutdown, as a crash would), keep its log, delete
    /// its pod.
    pub fn kill(&mut self) {
        if self.gone {
            return;
        }
        if let Some(pid) = self.pid() {
            sigkill(pid);
        }
        let text = self.kubectl(&["logs", &self.pod]).unwrap_or_default();
        let _ = std::fs::write(&self.log, text);
        self.delete();
        self.gone = true;
    }

    /// Delete the pod (if any) and wait until it is gone.
    fn delete(&self) {
        let _ = self.kubectl(&[
            "delete",
            "pod",
            &self.pod,
            "--ignore-not-found",
            "--grace-period=0",
            "--force",
            "--wait=true",
            "--timeout=120s",
        ]);
    }

    fn kubectl(&self, args: &[&str]) -> Result<String, String> {
        let mut all = vec!["-n", self.namespace.as_str()];
        all.extend_from_slice(args);
        try_kubectl(&self.lab, &all)
    }
}

impl Drop for ControllerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `tcp:127.0.0.1:PORT` (the host's view of OVN central) as a node reaches it: central
/// listens on the lab bridge too, the address the API server has (`ROAM_API_SERVER`).
/// Where a test controller pod finds the NB's TLS files (the Secret [`OVN_TLS_SECRET`]).
const OVN_TLS_DIR: &str = "/etc/roam/ovn-tls";
/// The Secret with the lab CA and roam-controller's client certificate, in a test
/// controller's namespace (as the installation's in roam-system).
const OVN_TLS_SECRET: &str = "roam-ovn-tls";

/// [`OVN_TLS_SECRET`] in `namespace`, from the lab's OVN PKI (`ROAM_OVN_PKI`): what an admin
/// gives a controller of its own to reach the NB's `ssl:` remote.
fn ovn_tls_secret(lab: &Lab, namespace: &str) {
    let pki = std::path::Path::new(lab.var("ROAM_OVN_PKI"));
    let pem = |f: &str| {
        let p = pki.join(f);
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
    };
    let secret = json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": OVN_TLS_SECRET, "namespace": namespace},
        "stringData": {"ca.crt": pem("ca.pem"), "tls.crt": pem("roam-controller.pem"),
                       "tls.key": pem("roam-controller.key")},
    });
    kubectl_manifest(lab, "apply", &secret)
        .unwrap_or_else(|e| panic!("Secret {namespace}/{OVN_TLS_SECRET}: {e}"));
}

pub fn lab_endpoint(lab: &Lab, host_view: &str) -> String {
    let port = host_view.rsplit(':').next().unwrap_or_default();
    let bridge = lab
        .var("ROAM_API_SERVER")
        .rsplit_once(':')
        .expect("HOST:PORT")
        .0;
    format!("tcp:{bridge}:{port}")
}

/// The test controllers' ServiceAccount, bound to cluster-admin (created once).
fn test_service_account(lab: &Lab) {
    static DONE: std::sync::Once = std::sync::Once::new();
    DONE.call_once(|| {
        let (ns, sa) = TEST_SA;
        let manifest = json!({"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa, "namespace": ns}},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
             "metadata": {"name": sa},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
             "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns}]},
        ]});
        kubectl_manifest(lab, "apply", &manifest)
            .unwrap_or_else(|e| panic!("the test controllers' ServiceAccount: {e}"));
        // the token controller writes the account's token Secret: wait for it
        crate::lab::wait_until(Duration::from_secs(60), "the test ServiceAccount's token", || {
            let out = try_kubectl(lab, &["-n", ns, "get", "sa", sa, "-o", "jsonpath={.secrets[0].name}"]).ok()?;
            (!out.trim().is_empty()).then_some(())
        });
    });
}

/// The PID of the roam-controller process whose environment holds `entry` (`KEY=VALUE`).
fn process_with_env(entry: &str) -> Option<u32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
        if comm.trim() != "roam-controller" {
            return None;
        }
        let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
        env.split(|b| *b == 0)
            .any(|kv| kv == entry.as_bytes())
            .then_some(pid)
    })
}

fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// roam as `e2e/lab up` installed it from deploy/ (the lab overlay `e2e/deploy/lab`): the
/// roam-controller Deployment in `roam-system`, two replicas, one holding the Lease. The
/// demo and the tests that need no controller of their own use it; a crash is a SIGKILL of
/// the leader's process on its node (the kubelet restarts the container), and every pod's
/// log (the current and the previous container's) is read with `kubectl logs`.
#[derive(Clone)]
pub struct Installed {
    lab: Lab,
}

/// A leader killed by [`Installed::kill_leader`]: its pod and how often the kubelet had
/// restarted it before.
pub struct Crash {
    /// The pod.
    pub pod: String,
    restarts: u64,
}

/// The installed controller stopped by [`Installed::stop`], started again on drop.
pub struct Stopped {
    installed: Installed,
    replicas: u64,
    started: bool,
}

impl Stopped {
    /// Scale the Deployment back and wait until one of its pods leads.
    pub fn start(mut self) {
        self.scale_back();
    }

    fn scale_back(&mut self) {
        if std::mem::replace(&mut self.started, true) {
            return;
        }
        let n = format!("--replicas={}", self.replicas);
        self.installed
            .kubectl(&["scale", &format!("deploy/{DEPLOYMENT}"), &n])
            .unwrap_or_else(|e| panic!("kubectl scale {n}: {e}"));
        self.installed.wait_rolled_out();
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            self.scale_back();
        } else if !self.started {
            // after a failure: put it back, without waiting or panicking again
            let n = format!("--replicas={}", self.replicas);
            let _ = self
                .installed
                .kubectl(&["scale", &format!("deploy/{DEPLOYMENT}"), &n]);
        }
    }
}

/// The installation's namespace, Deployment and Lease.
const INSTALLED_NAMESPACE: &str = "roam-system";
const DEPLOYMENT: &str = "roam-controller";
const POD_LABEL: &str = "app.kubernetes.io/name=roam-controller";

impl Installed {
    /// The installation, once a running pod of it holds the Lease (a test fails loudly if
    /// the lab has none: `e2e/lab up` installs it).
    pub fn get(lab: &Lab) -> Installed {
        let me = Installed { lab: lab.clone() };
        crate::lab::wait_until_else(
            Duration::from_secs(180),
            "the installed roam-controller (e2e/lab up installs it) to hold its Lease",
            || me.leader(),
            || me.describe(),
        );
        me
    }

    /// The pod holding the Lease, if it is one of the Deployment's and running.
    pub fn leader(&self) -> Option<String> {
        let holder = self.kubectl_json(&["get", "lease", DEPLOYMENT])?["spec"]["holderIdentity"]
            .as_str()?
            .to_string();
        let pod = self.kubectl_json(&["get", "pod", &holder])?;
        (pod["status"]["phase"] == "Running").then_some(holder)
    }

    /// The Deployment's pods: (name, node).
    pub fn pods(&self) -> Vec<(String, String)> {
        self.kubectl_json(&["get", "pods", "-l", POD_LABEL])
            .and_then(|l| l["items"].as_array().cloned())
            .unwrap_or_default()
            .iter()
            .map(|p| {
                (
                    p["metadata"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                    p["spec"]["nodeName"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                )
            })
            .collect()
    }

    /// How often the kubelet restarted pod `pod`'s container.
    pub fn restarts(&self, pod: &str) -> u64 {
        self.kubectl_json(&["get", "pod", pod])
            .and_then(|p| p["status"]["containerStatuses"][0]["restartCount"].as_u64())
            .unwrap_or(0)
    }

    /// The PID (in the host's PID namespace) of pod `pod`'s roam-controller process.
    pub fn pid(&self, pod: &str) -> Option<u32> {
        process_with_env(&format!("POD_NAME={pod}"))
    }

    /// SIGKILL the leader's process (a crash, no graceful shutdown) and wait until a
    /// controller leads again ([`Installed::wait_back`]); returns the crashed pod's name.
    pub fn crash_leader(&self) -> String {
        let crash = self.kill_leader();
        self.wait_back(&crash);
        crash.pod
    }

    /// SIGKILL the leader's process, now (a crash, no graceful shutdown).
    pub fn kill_leader(&self) -> Crash {
        let pod = crate::lab::wait_until(Duration::from_secs(60), "a leader", || self.leader());
        let restarts = self.restarts(&pod);
        let pid = self
            .pid(&pod)
            .unwrap_or_else(|| panic!("no roam-controller process of pod {pod} on this host"));
        sigkill(pid);
        Crash { pod, restarts }
    }

    /// Wait until a controller leads again after `crash`: the same pod's container restarted
    /// by the kubelet (at once the first time, then after its growing back-off), or the
    /// standby once the Lease expired (15 s).
    pub fn wait_back(&self, crash: &Crash) {
        crate::lab::wait_until_else(
            Duration::from_secs(120),
            &format!("a leader after {}'s crash", crash.pod),
            || {
                let leader = self.leader()?;
                let back = leader != crash.pod || self.restarts(&crash.pod) > crash.restarts;
                (back && self.pid(&leader).is_some()).then_some(())
            },
            || self.describe(),
        );
    }

    /// Set (`Some`) or remove (`None`) environment variable `key` of the controller
    /// (`kubectl set env`), and wait until the rollout is done and a new pod leads.
    pub fn set_env(&self, key: &str, value: Option<&str>) {
        let kv = match value {
            Some(v) => format!("{key}={v}"),
            None => format!("{key}-"),
        };
        self.kubectl(&["set", "env", &format!("deploy/{DEPLOYMENT}"), &kv])
            .unwrap_or_else(|e| panic!("kubectl set env {kv}: {e}"));
        self.wait_rolled_out();
    }

    /// `kubectl rollout restart` the Deployment (an upgrade's rolling update: one pod at a
    /// time, SIGTERM, a new pod) and wait until it is done and a new pod leads.
    pub fn rollout_restart(&self) {
        self.kubectl(&["rollout", "restart", &format!("deploy/{DEPLOYMENT}")])
            .unwrap_or_else(|e| panic!("kubectl rollout restart: {e}"));
        self.wait_rolled_out();
    }

    /// Stop the controller (its Deployment scaled to 0) and wait until none of its pods is
    /// left; the guard scales it back to its replicas and waits until a pod leads again,
    /// when dropped (also after a failure) or by [`Stopped::start`].
    pub fn stop(&self) -> Stopped {
        let replicas = self
            .kubectl_json(&["get", &format!("deploy/{DEPLOYMENT}")])
            .and_then(|d| d["spec"]["replicas"].as_u64())
            .unwrap_or_else(|| panic!("the Deployment's replicas\n{}", self.describe()));
        self.kubectl(&["scale", &format!("deploy/{DEPLOYMENT}"), "--replicas=0"])
            .unwrap_or_else(|e| panic!("kubectl scale --replicas=0: {e}"));
        let stopped = Stopped {
            installed: self.clone(),
            replicas,
            started: false,
        };
        crate::lab::wait_until_else(
            Duration::from_secs(120),
            "the controller's pods to be gone",
            || self.pods().is_empty().then_some(()),
            || self.describe(),
        );
        stopped
    }

    /// Wait until the Deployment's rollout is complete (its old pods gone) and one of its
    /// current pods leads.
    pub fn wait_rolled_out(&self) {
        self.kubectl(&[
            "rollout",
            "status",
            &format!("deploy/{DEPLOYMENT}"),
            "--timeout=300s",
        ])
        .unwrap_or_else(|e| panic!("rollout: {e}\n{}", self.describe()));
        // `rollout status` is done once the new pods are available; an old one may still be
        // terminating (a standby's SIGTERM takes a moment, more so with a spare node to put
        // its successor on): done means only the Deployment's replicas are left
        crate::lab::wait_until_else(
            Duration::from_secs(120),
            "the old controller pods to be gone",
            || {
                let want = self.kubectl_json(&["get", &format!("deploy/{DEPLOYMENT}")])?["spec"]
                    ["replicas"]
                    .as_u64()?;
                let pods = self.kubectl_json(&["get", "pods", "-l", POD_LABEL])?;
                let pods = pods["items"].as_array()?;
                (pods.len() as u64 == want
                    && pods
                        .iter()
                        .all(|p| p["metadata"]["deletionTimestamp"].is_null()))
                .then_some(())
            },
            || self.describe(),
        );
        crate::lab::wait_until_else(
            Duration::from_secs(120),
            "a pod of the rolled-out Deployment to hold the Lease",
            || {
                let leader = self.leader()?;
                self.pods().iter().any(|(p, _)| *p == leader).then_some(())
            },
            || self.describe(),
        );
    }

    /// Every pod's logs, the previous container's first (a crashed one): (header, text).
    fn logs(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        for (pod, node) in self.pods() {
            for (flag, which) in [
                (Some("--previous"), "previous container"),
                (None, "container"),
            ] {
                let mut args = vec!["logs", pod.as_str()];
                args.extend(flag);
                if let Ok(text) = self.kubectl(&args) {
                    out.push((format!("{pod} on {node} ({which})"), text));
                }
            }
        }
        out
    }

    /// Every pod's log, the previous container's first (a crashed one), each under a header.
    pub fn log_text(&self) -> String {
        self.logs()
            .into_iter()
            .map(|(head, text)| format!("===== {head}\n{text}"))
            .collect()
    }

    /// The last `n` lines of each pod's current log (and its previous container's).
    pub fn log_tail(&self, n: usize) -> String {
        self.logs()
            .into_iter()
            .map(|(head, text)| {
                let lines: Vec<&str> = text.lines().collect();
                let tail = lines[lines.len().saturating_sub(n)..].join("\n");
                format!("===== {head}\n{tail}\n")
            })
            .collect()
    }

    /// GET `path` from pod `pod`'s metrics and probe port (host network: its node's
    /// address, port 9090).
    pub fn http(&self, pod: &str, path: &str) -> Option<(u16, String)> {
        self.http_as(pod, path, None)
    }

    /// [`Installed::http`] with `Authorization: Bearer TOKEN` when `token` is given.
    pub fn http_as(&self, pod: &str, path: &str, token: Option<&str>) -> Option<(u16, String)> {
        let node = self
            .pods()
            .into_iter()
            .find(|(p, _)| p == pod)
            .map(|(_, n)| n)?;
        http_get_as(&format!("{}:9090", self.lab.node(&node).ip), path, token)
    }

    /// `kubectl get pods,deploy` and the Lease: what a failure message shows.
    pub fn describe(&self) -> String {
        let pods = self
            .kubectl(&["get", "deploy,pods,lease", "-o", "wide"])
            .unwrap_or_else(|e| e);
        format!("--- {INSTALLED_NAMESPACE}:\n{pods}\n{}", self.log_tail(20))
    }

    fn kubectl(&self, args: &[&str]) -> Result<String, String> {
        let mut all = vec!["-n", INSTALLED_NAMESPACE];
        all.extend_from_slice(args);
        crate::lab::try_kubectl(&self.lab, &all)
    }

    fn kubectl_json(&self, args: &[&str]) -> Option<serde_json::Value> {
        let mut all = args.to_vec();
        all.extend_from_slice(&["-o", "json"]);
        serde_json::from_str(&self.kubectl(&all).ok()?).ok()
    }
}

/// GET `path` from `addr` (`HOST:PORT`) over plain HTTP/1.1: the status code and the body
/// (`None`: no answer).
pub fn http_get(addr: &str, path: &str) -> Option<(u16, String)> {
    http_get_as(addr, path, None)
}

/// [`http_get`] with `Authorization: Bearer TOKEN` when `token` is given.
pub fn http_get_as(addr: &str, path: &str, token: Option<&str>) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n{auth}\r\n").as_bytes())
        .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let (head, body) = out.split_once("\r\n\r\n")?;
    let code = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, body.to_string()))
}

fn sigkill(pid: u32) {
    let _ = Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status();
}
