//! roam-node: the node agent (DaemonSet `roam-node` in `roam-system`).
//!
//! ```text
//! roam-node [--node-name NAME] [--node-kubeconfig PATH] [--pki-dir DIR]
//!           [--ca-namespace NS] [--check-period-seconds N]
//! roam-node check [--node-name NAME] [--pki-dir DIR]     # readiness: exit 0 if the identity is usable
//! ```
//!
//! Every flag also reads `ROAM_` + the flag in upper snake case; `--node-name` also
//! `NODE_NAME` (the DaemonSet passes `spec.nodeName`). `--node-kubeconfig` (default
//! `/etc/kubernetes/kubelet.conf`) is the node's own credential, used for the certificate
//! request and to read the CA's ConfigMap: nothing else.

use std::time::Duration;

use anyhow::{Context as _, bail};
use roam_node::identity::{self, Files};

const USAGE: &str = "usage: roam-node [check] [--node-name NAME] [--node-kubeconfig PATH] \
[--pki-dir DIR] [--ca-namespace NS] [--check-period-seconds N] | --version";

struct Flags {
    check: bool,
    node: String,
    kubeconfig: String,
    files: Files,
    ca_namespace: String,
    period: Duration,
}

fn parse() -> anyhow::Result<Flags> {
    use roam_contract::flags::{self, Parsed};
    let mut args = std::env::args().skip(1).peekable();
    let check = args.peek().map(String::as_str) == Some("check");
    if check {
        args.next();
    }
    let known = [
        "node-name",
        "node-kubeconfig",
        "pki-dir",
        "ca-namespace",
        "check-period-seconds",
    ];
    let given = match flags::parse(args, &known).map_err(|e| anyhow::anyhow!("{e}\n{USAGE}"))? {
        Parsed::Run(given) => given,
        Parsed::Version => {
            println!("roam-node {}", env!("CARGO_PKG_VERSION"));
            std::process::exit(0);
        }
        Parsed::Help => {
            println!("{USAGE}");
            std::process::exit(0);
        }
    };
    let get = |k: &str| given.get(k);
    let node = get("node-name")
        .or_else(|| std::env::var("NODE_NAME").ok().filter(|v| !v.is_empty()))
        .context(
            "give the node's name: --node-name or NODE_NAME (the DaemonSet passes spec.nodeName)",
        )?;
    let period: u64 = match get("check-period-seconds") {
        None => 30,
        Some(v) => v
            .parse()
            .ok()
            .filter(|n| (1..=3600).contains(n))
            .with_context(|| format!("--check-period-seconds {v:?}: give 1 to 3600"))?,
    };
    Ok(Flags {
        check,
        node,
        kubeconfig: get("node-kubeconfig").unwrap_or_else(|| "/etc/kubernetes/kubelet.conf".into()),
        files: Files {
            dir: get("pki-dir")
                .unwrap_or_else(|| "/var/lib/roam/pki".into())
                .into(),
        },
        ca_namespace: get("ca-namespace").unwrap_or_else(|| "roam-system".into()),
        period: Duration::from_secs(period),
    })
}

/// A client with the node's own credential.
async fn node_client(path: &str) -> anyhow::Result<kube::Client> {
    let kc = kube::config::Kubeconfig::read_from(path).with_context(|| {
        format!("read the node's kubeconfig {path} (the kubelet's; set --node-kubeconfig)")
    })?;
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .with_context(|| format!("kubeconfig {path}"))?;
    Ok(kube::Client::try_from(config)?)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let flags = parse()?;
    if flags.check {
        return match identity::check(&flags.node, &flags.files) {
            Ok(()) => Ok(()),
            Err(why) => bail!("node {}: identity not usable: {why}", flags.node),
        };
    }
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
    std::fs::create_dir_all(&flags.files.dir)
        .with_context(|| format!("create {}", flags.files.dir.display()))?;
    let client = node_client(&flags.kubeconfig).await?;
    tracing::info!(node = %flags.node, dir = %flags.files.dir.display(), "roam-node starting");
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut failures = 0u32;
    loop {
        let pause = match identity::ensure(
            &client,
            &flags.node,
            &flags.files,
            &flags.ca_namespace,
            Duration::from_secs(60),
        )
        .await
        {
            Ok(renewed) => {
                if let Some(why) = renewed {
                    tracing::info!(node = %flags.node, %why, "this node's certificate renewed");
                }
                failures = 0;
                flags.period
            }
            Err(e) => {
                tracing::warn!(node = %flags.node, error = %e, "this node's identity: retrying");
                failures = failures.saturating_add(1);
                // 2, 4, 8 … s, at most the check period
                Duration::from_secs(1u64 << failures.min(6)).min(flags.period)
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = term.recv() => return Ok(()),
            _ = tokio::signal::ctrl_c() => return Ok(()),
        }
    }
}
