//! roam-controller: the Network controller, the address operator, the pod (sdn) controller,
//! the OVN syncer and route flips, and the VM and migration controllers, in one
//! leader-elected process (wiring only: the controllers are in `roam_migrator::controller`).
//!
//! ```text
//! roam-controller [--kubeconfig PATH] [--nb ssl:HOST:PORT|tcp:HOST:PORT|unix:PATH]
//!                 [--sb ssl:HOST:PORT|tcp:HOST:PORT|unix:PATH]
//!                 [--ovn-ca PEM --ovn-cert PEM --ovn-key PEM [--ovn-server-name NAME]]
//!                 [--metrics-addr HOST:PORT|off] [--metrics-auth kubernetes|none]
//!                 [--leader-elect true|false]
//!                 [--lease-namespace NS] [--lease-name NAME] [--identity ID]
//!                 [--network-selector LABELS] [--node-selector LABELS] [--pod-namespace NS]
//!                 [--namespace-selector LABELS]
//!                 [--event-namespace NS (Events about Networks and pod-less Addresses; default)]
//!                 [--concurrency N] [--claims-in-flight N] [--ovn-debounce-ms MS]
//!                 [--sweep-period-ms MS] [--launcher-image IMAGE] [--shim-ports LO-HI]
//!                 [--peer-libvirt-uri TEMPLATE({node},{ip},{port})] [--vm-log-dir DIR]
//!                 [--launcher-priority-class NAME] [--node-pki-dir DIR] [--image-root DIR]
//!                 [--pki-namespace NS [--node-cert-validity-minutes N]]
//!                 [--cpu-allocation-ratio N] [--runner-namespace NS [--kubelet-root-dir DIR]]
//! ```
//!
//! With `--runner-namespace` (the installation sets `roam-system`) a VM's launcher pod in its
//! namespace is unprivileged (its requests, its console, its Addresses) and what runs the VM
//! — libvirtd, QEMU, the shim — is its runner, a privileged pod in that namespace.
//!
//! With `--pki-namespace` (the installation sets `roam-system`) this controller is roam's
//! node-certificate signer: it keeps the roam CA in that namespace (Secret and ConfigMap
//! `roam-ca`, made on the first start) and signs the certificates nodes ask for.
//!
//! Every flag also reads an environment variable (`ROAM_` + the flag in upper snake case,
//! e.g. `ROAM_NB`); `KUBECONFIG` too. Without a kubeconfig the in-cluster configuration is
//! used. When leadership is lost the process exits (status 3), to be restarted as a
//! candidate.

use std::time::Duration;

use anyhow::{Context as _, bail};
use roam_migrator::controller::{self, Config, leader};

struct Flags {
    kubeconfig: Option<String>,
    nb: String,
    sb: Option<String>,
    ovn_tls: Option<roam_ovsdb::TlsSettings>,
    metrics_addr: Option<String>,
    /// Whether `/metrics` asks the API server who may read it (default) or is open.
    metrics_auth_open: bool,
    leader_elect: bool,
    lease_namespace: String,
    lease_name: String,
    identity: String,
    network_selector: Option<String>,
    node_selector: Option<String>,
    pod_namespace: Option<String>,
    namespace_selector: Option<String>,
    event_namespace: String,
    concurrency: u16,
    claims_in_flight: usize,
    ovn_debounce_ms: u64,
    sweep_period_ms: u64,
    launcher_image: String,
    shim_ports: (u16, u16),
    peer_libvirt_uri: String,
    vm_log_dir: String,
    launcher_priority_class: Option<String>,
    node_pki_dir: Option<String>,
    image_root: Option<String>,
    cpu_allocation_ratio: u32,
    runners: Option<roam_migrator::launcher::RunnerConfig>,
    pki: Option<controller::certs::PkiConfig>,
}

const USAGE: &str = "usage: roam-controller [--kubeconfig PATH] [--nb ENDPOINT] [--sb ENDPOINT] \
[--ovn-ca PEM --ovn-cert PEM --ovn-key PEM [--ovn-server-name NAME]] [--metrics-addr ADDR|off] [--metrics-auth kubernetes|none] \
[--leader-elect true|false] [--lease-namespace NS] [--lease-name NAME] [--identity ID] \
[--network-selector LABELS] [--node-selector LABELS] [--pod-namespace NS] [--namespace-selector LABELS] [--event-namespace NS] [--concurrency N] [--claims-in-flight N] [--ovn-debounce-ms MS] \
[--sweep-period-ms MS] [--launcher-image IMAGE] [--shim-ports LO-HI] \
[--peer-libvirt-uri TEMPLATE({node},{ip},{port})] [--vm-log-dir DIR] [--launcher-priority-class NAME] \
[--node-pki-dir DIR] [--image-root DIR] [--pki-namespace NS [--node-cert-validity-minutes N]] \
[--cpu-allocation-ratio N] [--runner-namespace NS [--kubelet-root-dir DIR]] | --version";

fn parse() -> anyhow::Result<Flags> {
    use roam_contract::flags::{self, Parsed};
    let known = [
        "kubeconfig",
        "nb",
        "sb",
        "ovn-ca",
        "ovn-cert",
        "ovn-key",
        "ovn-server-name",
        "metrics-addr",
        "metrics-auth",
        "leader-elect",
        "lease-namespace",
        "lease-name",
        "identity",
        "network-selector",
        "node-selector",
        "pod-namespace",
        "namespace-selector",
        "event-namespace",
        "concurrency",
        "claims-in-flight",
        "ovn-debounce-ms",
        "sweep-period-ms",
        "launcher-image",
        "shim-ports",
        "peer-libvirt-uri",
        "vm-log-dir",
        "launcher-priority-class",
        "pki-namespace",
        "node-cert-validity-minutes",
        "node-pki-dir",
        "image-root",
        "cpu-allocation-ratio",
        "runner-namespace",
        "kubelet-root-dir",
    ];
    let given = match flags::parse(std::env::args().skip(1), &known)
        .map_err(|e| anyhow::anyhow!("{e}\n{USAGE}"))?
    {
        Parsed::Run(given) => given,
        Parsed::Version => {
            println!("roam-controller {}", env!("CARGO_PKG_VERSION"));
            std::process::exit(0);
        }
        Parsed::Help => {
            println!("{USAGE}");
            std::process::exit(0);
        }
    };
    let get = |k: &str| given.get(k);
    let num = |k: &str, default: u64| -> anyhow::Result<u64> {
        get(k).map_or(Ok(default), |v| {
            v.parse()
                .with_context(|| format!("--{k} {v:?}: expected a whole number"))
        })
    };
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "roam-controller".into());
    Ok(Flags {
        kubeconfig: get("kubeconfig").or_else(|| std::env::var("KUBECONFIG").ok()),
        nb: get("nb").unwrap_or_else(|| "tcp:127.0.0.1:6641".into()),
        sb: get("sb"),
        ovn_tls: ovn_tls(&get)?,
        metrics_addr: match get("metrics-addr").as_deref() {
            Some("off") => None,
            Some(a) => Some(a.to_string()),
            None => Some("0.0.0.0:9090".into()),
        },
        metrics_auth_open: match get("metrics-auth").as_deref() {
            None | Some("kubernetes") => false,
            Some("none") => true,
            Some(v) => bail!(
                "--metrics-auth {v:?}: kubernetes (a bearer token the API server allows to get \
                 /metrics) or none (open to anyone who reaches the port)"
            ),
        },
        leader_elect: match get("leader-elect").as_deref() {
            None | Some("true") => true,
            Some("false") => false,
            Some(v) => bail!("--leader-elect {v:?}: expected true or false"),
        },
        lease_namespace: get("lease-namespace")
            .or_else(|| std::env::var("POD_NAMESPACE").ok())
            .unwrap_or_else(|| "roam-system".into()),
        lease_name: get("lease-name").unwrap_or_else(|| "roam-controller".into()),
        identity: get("identity")
            .or_else(|| std::env::var("POD_NAME").ok())
            .unwrap_or_else(|| format!("{host}-{}", std::process::id())),
        network_selector: get("network-selector"),
        node_selector: get("node-selector"),
        pod_namespace: get("pod-namespace"),
        namespace_selector: get("namespace-selector"),
        event_namespace: get("event-namespace").unwrap_or_else(|| "default".into()),
        concurrency: num("concurrency", 32)?.clamp(1, 1024) as u16,
        cpu_allocation_ratio: {
            let r = num(
                "cpu-allocation-ratio",
                roam_core::placement::DEFAULT_CPU_ALLOCATION_RATIO.into(),
            )?;
            anyhow::ensure!(
                (1..=100).contains(&r),
                "--cpu-allocation-ratio {r}: give 1 to 100 vCPUs per requested CPU (1 reserves a CPU per vCPU)"
            );
            r as u32
        },
        runners: match (get("runner-namespace"), get("kubelet-root-dir")) {
            (None, None) => None,
            (None, Some(_)) => bail!("--kubelet-root-dir goes with --runner-namespace"),
            (Some(ns), dir) => {
                let kubelet_root = dir.unwrap_or_else(|| "/var/lib/kubelet".into());
                anyhow::ensure!(
                    kubelet_root.starts_with('/'),
                    "--kubelet-root-dir {kubelet_root:?}: give the kubelet's absolute --root-dir"
                );
                Some(roam_migrator::launcher::RunnerConfig {
                    namespace: ns,
                    kubelet_root: kubelet_root.trim_end_matches('/').to_string(),
                })
            }
        },
        claims_in_flight: num("claims-in-flight", 2)? as usize,
        ovn_debounce_ms: num("ovn-debounce-ms", 20)?,
        sweep_period_ms: num("sweep-period-ms", 2000)?.max(100),
        launcher_image: get("launcher-image")
            .unwrap_or_else(|| "lab.local/roam-launcher:dev".into()),
        shim_ports: {
            let v = get("shim-ports").unwrap_or_else(|| "17100-17199".into());
            let parsed = v
                .split_once('-')
                .and_then(|(a, b)| Some((a.parse::<u16>().ok()?, b.parse::<u16>().ok()?)))
                .filter(|(a, b)| *a > 0 && a <= b);
            let r = parsed
                .with_context(|| format!("--shim-ports {v:?}: expected LO-HI, e.g. 17100-17199"))?;
            // the launchers' libvirtds take the block after
            anyhow::ensure!(
                roam_migrator::launcher::libvirt_port(r, r.1).is_some(),
                "--shim-ports {v}: the launchers' libvirt ports (the next {} ports) pass 65535; lower the range",
                r.1 - r.0 + 1
            );
            r
        },
        peer_libvirt_uri: {
            let tls = get("node-pki-dir").is_some();
            let v = get("peer-libvirt-uri");
            // with the nodes' certificates the shims' proxies carry the migration: libvirtd
            // has no network socket a URI could name
            anyhow::ensure!(
                !(tls && v.is_some()),
                "--peer-libvirt-uri {:?}: with --node-pki-dir migrations go through the shims' \
                 mutual-TLS proxies and libvirtd listens on no network; give the template only \
                 for plain TCP, without --node-pki-dir",
                v.unwrap_or_default()
            );
            let v = v.unwrap_or_else(|| "qemu+tcp://{ip}:{port}/system".into());
            // each launcher's libvirtd listens on a port of its own
            anyhow::ensure!(
                v.contains("{port}"),
                "--peer-libvirt-uri {v:?}: put {{port}} where the target launcher's libvirt port goes, e.g. qemu+tcp://{{ip}}:{{port}}/system"
            );
            v
        },
        vm_log_dir: get("vm-log-dir").unwrap_or_else(|| "/var/log/roam/vms".into()),
        launcher_priority_class: get("launcher-priority-class"),
        image_root: match get("image-root") {
            Some(d) => {
                let d = d.trim_end_matches('/').to_string();
                if let Some(p) = roam_shim_api::limits::boot_path_problem("--image-root", &d) {
                    bail!("{p}: give the absolute path of the nodes' image store");
                }
                Some(d)
            }
            None => None,
        },
        node_pki_dir: match get("node-pki-dir") {
            Some(d) if !d.starts_with('/') => bail!("--node-pki-dir {d:?}: give an absolute path"),
            // the launchers' API is then mutual TLS: this controller's client certificate
            // comes from the roam CA it holds
            Some(d) if get("pki-namespace").is_none() => bail!(
                "--node-pki-dir {d:?}: the launchers then take only roam CA client certificates, \
                 which roam-controller issues itself from the CA it keeps: give --pki-namespace too"
            ),
            d => d,
        },
        pki: match get("pki-namespace") {
            None => {
                anyhow::ensure!(
                    get("node-cert-validity-minutes").is_none(),
                    "--node-cert-validity-minutes is for the node-certificate signer: give --pki-namespace too"
                );
                None
            }
            Some(namespace) => {
                let minutes = num("node-cert-validity-minutes", 24 * 60)?;
                anyhow::ensure!(
                    (10..=366 * 24 * 60).contains(&minutes),
                    "--node-cert-validity-minutes {minutes}: give 10 minutes to a year (nodes renew after two thirds)"
                );
                Some(controller::certs::PkiConfig {
                    namespace,
                    node_validity: Duration::from_secs(minutes * 60),
                    ca_validity: Duration::from_secs(10 * 365 * 24 * 3600),
                })
            }
        },
    })
}

/// `--ovn-ca`, `--ovn-cert`, `--ovn-key` (all or none) and `--ovn-server-name`: what the
/// `ssl:` NB and SB endpoints present and trust. An `ssl:` endpoint without them is refused
/// at start; given for `tcp:` or `unix:` endpoints they are read (so a bad file shows at
/// once) and unused.
fn ovn_tls(
    get: &dyn Fn(&str) -> Option<String>,
) -> anyhow::Result<Option<roam_ovsdb::TlsSettings>> {
    let files = (get("ovn-ca"), get("ovn-cert"), get("ovn-key"));
    let nb = get("nb").unwrap_or_default();
    let any_ssl = nb.starts_with("ssl:") || get("sb").is_some_and(|s| s.starts_with("ssl:"));
    let tls = match files {
        (None, None, None) => {
            anyhow::ensure!(
                !any_ssl,
                "an ssl: OVN endpoint needs --ovn-ca, --ovn-cert and --ovn-key (PEM files: the CA \
                 that signed the OVN databases' certificates, this controller's certificate and key)"
            );
            return Ok(None);
        }
        (Some(ca), Some(cert), Some(key)) => {
            for (flag, file) in [("ovn-ca", &ca), ("ovn-cert", &cert), ("ovn-key", &key)] {
                anyhow::ensure!(
                    std::path::Path::new(file).exists(),
                    "--{flag} {file} does not exist: OVN's databases are reached over ssl: with \
                     the CA and this controller's client certificate; create the Secret \
                     roam-system/roam-ovn-tls (ca.crt, tls.crt, tls.key: README, \"OVN over \
                     TLS\"), which the Deployment mounts at /etc/roam/ovn-tls, or give a tcp: \
                     ROAM_NB and empty ROAM_OVN_CA, ROAM_OVN_CERT and ROAM_OVN_KEY"
                );
            }
            roam_ovsdb::TlsSettings::from_pem_files(&roam_ovsdb::TlsFiles {
                ca: ca.into(),
                cert: cert.into(),
                key: key.into(),
            })?
        }
        _ => bail!("--ovn-ca, --ovn-cert and --ovn-key go together: give all three or none"),
    };
    Ok(Some(match get("ovn-server-name") {
        Some(n) => tls.server_name(&n)?,
        None => tls,
    }))
}

async fn client(kubeconfig: Option<&str>) -> anyhow::Result<kube::Client> {
    let config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("read kubeconfig {path}"))?;
            kube::Config::from_custom_kubeconfig(kc, &Default::default())
                .await
                .with_context(|| format!("kubeconfig {path}"))?
        }
        None => kube::Config::incluster().context(
            "no --kubeconfig and not in a cluster (KUBERNETES_SERVICE_HOST unset): give --kubeconfig",
        )?,
    };
    Ok(kube::Client::try_from(config)?)
}

async fn stop_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).expect("install SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        _ = term.recv() => {},
    }
    tracing::info!("stopping");
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // colours only on a terminal: a pod's log (kubectl logs) and a file get plain text
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none();
    tracing_subscriber::fmt()
        .with_ansi(ansi)
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,kube=warn".into()),
        )
        .init();
    let flags = parse()?;
    let client = client(flags.kubeconfig.as_deref()).await?;
    // served from the start, leader or not: a standby's probes must answer too
    let served = controller::Served::default();
    if let Some(a) = &flags.metrics_addr {
        let listener = tokio::net::TcpListener::bind(a)
            .await
            .with_context(|| format!("listen for metrics on {a}"))?;
        tracing::info!(addr = %listener.local_addr()?, "metrics on /metrics, probes on /healthz and /readyz");
        let auth = if flags.metrics_auth_open {
            controller::metrics_auth::MetricsAuth::Open
        } else {
            controller::metrics_auth::MetricsAuth::kubernetes(client.clone())
        };
        tokio::spawn(served.clone().serve(
            listener,
            client.clone(),
            (flags.nb.clone(), flags.ovn_tls.clone()),
            auth,
        ));
    }
    let config = Config {
        nb: flags.nb.clone(),
        sb: flags.sb.clone(),
        ovn_tls: flags.ovn_tls.clone(),
        network_selector: flags.network_selector.clone(),
        node_selector: flags.node_selector.clone(),
        pod_namespace: flags.pod_namespace.clone(),
        namespace_selector: flags.namespace_selector.clone(),
        event_namespace: flags.event_namespace.clone(),
        concurrency: flags.concurrency,
        claims_in_flight: flags.claims_in_flight,
        ovn_debounce: Duration::from_millis(flags.ovn_debounce_ms),
        sweep_period: Duration::from_millis(flags.sweep_period_ms),
        identity: flags.identity.clone(),
        secret_namespace: flags.lease_namespace.clone(),
        vm: roam_migrator::launcher::VmConfig {
            launcher_image: flags.launcher_image.clone(),
            shim_ports: flags.shim_ports,
            peer_libvirt_uri: flags.peer_libvirt_uri.clone(),
            vm_log_dir: flags.vm_log_dir.clone(),
            priority_class: flags.launcher_priority_class.clone(),
            node_pki_dir: flags.node_pki_dir.clone(),
            image_root: flags.image_root.clone(),
            cpu_allocation_ratio: flags.cpu_allocation_ratio,
            runners: flags.runners.clone(),
        },
        pki: flags.pki.clone(),
    };
    tracing::info!(identity = %flags.identity, nb = %flags.nb, leader_elect = flags.leader_elect, "roam-controller starting");
    if !flags.leader_elect {
        controller::run(client, config, served, stop_signal()).await?;
        return Ok(());
    }
    let lease = leader::LeaderConfig {
        namespace: flags.lease_namespace,
        name: flags.lease_name,
        identity: flags.identity,
        lease_duration: Duration::from_secs(15),
        renew: Duration::from_secs(2),
    };
    tokio::select! {
        _ = leader::acquire(client.clone(), &lease) => {}
        _ = stop_signal() => return Ok(()),
    }
    tokio::select! {
        r = controller::run(client.clone(), config, served, stop_signal()) => {
            r?;
            // stopped (SIGTERM: a rolling update, a drain): the standby need not wait out
            // the lease
            leader::release(client, &lease).await;
        }
        _ = leader::hold(client.clone(), &lease) => {
            tracing::error!("leadership lost: exiting so that no two leaders act at once");
            std::process::exit(3);
        }
    }
    Ok(())
}
