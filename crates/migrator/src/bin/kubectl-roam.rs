//! `kubectl roam`: a kubectl plugin (install the binary as `kubectl-roam` on the PATH).
//!
//! `kubectl roam migrate VM --to NODE|auto [--watch] [-n NS]` annotates the VirtualMachine
//! with `roam.dev/migrate-to`; with `--watch` it follows the VirtualMachineMigration the
//! controller creates for it (label `roam.dev/vm=VM`) with a progress bar, and exits 0 only
//! when the migration succeeded.

use std::collections::BTreeSet;
use std::io::{IsTerminal, Write};
use std::time::Duration;

use anyhow::{Context, bail};
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client};
use roam_api::{MIGRATE_TO, MigrateTo, VirtualMachine, VirtualMachineMigration};
use roam_migrator::cli::{Command, USAGE, VM_LABEL, parse, progress_line};

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (vm, to, watch, namespace) = match parse(&args).map_err(anyhow::Error::msg)? {
        Command::Help => {
            println!("{USAGE}");
            return Ok(());
        }
        Command::Migrate {
            vm,
            to,
            watch,
            namespace,
        } => (vm, to, watch, namespace),
    };
    let client = Client::try_default()
        .await
        .context("connect to the cluster (KUBECONFIG or in-cluster config)")?;
    let ns = namespace.unwrap_or_else(|| client.default_namespace().to_string());
    let vms: Api<VirtualMachine> = Api::namespaced(client.clone(), &ns);
    let vmims: Api<VirtualMachineMigration> = Api::namespaced(client, &ns);
    vms.get(&vm)
        .await
        .with_context(|| format!("VirtualMachine {ns}/{vm}"))?;
    let selector = ListParams::default().labels(&format!("{VM_LABEL}={vm}"));
    let before: BTreeSet<String> = vmims
        .list(&selector)
        .await
        .context("list VirtualMachineMigrations")?
        .items
        .into_iter()
        .filter_map(|m| m.metadata.name)
        .collect();
    let target = match &to {
        MigrateTo::Node(n) => n.clone(),
        MigrateTo::Auto => "auto".into(),
    };
    let patch = serde_json::json!({"metadata": {"annotations": {MIGRATE_TO: target}}});
    vms.patch(&vm, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("annotate VirtualMachine {ns}/{vm}"))?;
    println!("virtualmachine.roam.dev/{vm} annotated {MIGRATE_TO}={target}");
    if !watch {
        return Ok(());
    }
    let tty = std::io::stdout().is_terminal();
    let mut last = String::new();
    let mut waited = Duration::ZERO;
    loop {
        let new = vmims
            .list(&selector)
            .await
            .context("list VirtualMachineMigrations")?
            .items
            .into_iter()
            .find(|m| {
                m.metadata
                    .name
                    .as_ref()
                    .is_some_and(|n| !before.contains(n))
            });
        match new {
            None if waited > Duration::from_secs(30) => bail!(
                "no VirtualMachineMigration for {vm} after 30 s: is roam-controller running? \
                 (kubectl get vm {vm} -o yaml shows its conditions)"
            ),
            None => {}
            Some(m) => {
                let status = m.status.unwrap_or_default();
                let line = progress_line(&status, 30);
                if line != last {
                    if tty {
                        print!("\r\x1b[2K{}: {line}", m.metadata.name.unwrap_or_default());
                    } else {
                        println!("{}: {line}", m.metadata.name.unwrap_or_default());
                    }
                    std::io::stdout().flush().ok();
                    last = line;
                }
                if status.phase.is_terminal() {
                    if tty {
                        println!();
                    }
                    if status.phase == roam_core::migration::Phase::Succeeded {
                        return Ok(());
                    }
                    std::process::exit(1);
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
        waited += Duration::from_millis(250);
    }
}
