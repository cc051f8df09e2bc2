//! The pure parts of the `kubectl roam` plugin: argument parsing and the progress line.

use roam_api::{MigrateTo, VirtualMachineMigrationStatus, parse_migrate_to};
use roam_core::migration::Phase;

pub use roam_contract::keys::VM_LABEL;

/// A parsed `kubectl roam` command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// `kubectl roam migrate VM --to NODE|auto [--watch] [-n NS]`.
    Migrate {
        /// The VirtualMachine.
        vm: String,
        /// Where to.
        to: MigrateTo,
        /// Follow the migration to its end.
        watch: bool,
        /// Namespace (default: the kubeconfig's).
        namespace: Option<String>,
    },
    /// `kubectl roam help`.
    Help,
}

/// The usage text.
pub const USAGE: &str = "\
kubectl roam — live-migrate roam VirtualMachines

usage:
  kubectl roam migrate VM --to NODE|auto [--watch] [-n NAMESPACE]

  Annotates the VirtualMachine with roam.dev/migrate-to; with --watch, follows the
  VirtualMachineMigration the controller creates and shows its progress until it ends
  (exit status 0 when it succeeded).";

/// Parse the arguments after the program name.
pub fn parse(args: &[String]) -> Result<Command, String> {
    let mut it = args.iter();
    match it.next().map(String::as_str) {
        None | Some("help" | "-h" | "--help") => return Ok(Command::Help),
        Some("migrate") => {}
        Some(other) => return Err(format!("unknown command {other:?}\n\n{USAGE}")),
    }
    let (mut vm, mut to, mut watch, mut namespace) = (None, None, false, None);
    while let Some(a) = it.next() {
        let mut value = |flag: &str| {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        match a.as_str() {
            "--to" => to = Some(value("--to")?),
            "-n" | "--namespace" => namespace = Some(value("--namespace")?),
            "-w" | "--watch" => watch = true,
            s if s.starts_with("--to=") => to = Some(s["--to=".len()..].to_string()),
            s if s.starts_with("--namespace=") => {
                namespace = Some(s["--namespace=".len()..].to_string())
            }
            s if s.starts_with('-') => return Err(format!("unknown flag {s:?}\n\n{USAGE}")),
            s if vm.is_none() => vm = Some(s.to_string()),
            s => return Err(format!("unexpected argument {s:?}\n\n{USAGE}")),
        }
    }
    let vm = vm.ok_or_else(|| format!("which VM?\n\n{USAGE}"))?;
    let to = to.ok_or_else(|| format!("--to NODE (or --to auto) is required\n\n{USAGE}"))?;
    let to = parse_migrate_to(&to).map_err(|e| e.to_string())?;
    Ok(Command::Migrate {
        vm,
        to,
        watch,
        namespace,
    })
}

/// One line of progress for a migration's status: phase, a bar of `width` cells, the
/// figures; and the outcome once it ended.
pub fn progress_line(status: &VirtualMachineMigrationStatus, width: usize) -> String {
    let phase = format!("{:?}", status.phase);
    match status.phase {
        Phase::Succeeded => {
            let mut s = format!(
                "{phase}: {} → {}",
                status.source_node.as_deref().unwrap_or("?"),
                status.target_node.as_deref().unwrap_or("?")
            );
            if let Some(d) = status.downtime_ms {
                s += &format!(", VM downtime {d} ms");
            }
            if let Some(d) = status.switchover_ms {
                s += &format!(", ports active on the target {d} ms after the pause");
            }
            s
        }
        Phase::Failed | Phase::Aborted => format!(
            "{phase}: {} (the VM runs on {})",
            status.reason.as_deref().unwrap_or("no reason recorded"),
            status.source_node.as_deref().unwrap_or("its node")
        ),
        _ => {
            let p = status.progress.clone().unwrap_or_default();
            let processed = p.memory_processed.min(p.memory_total);
            let done = (processed as u128 * width as u128)
                .checked_div(p.memory_total as u128)
                .unwrap_or(0) as usize;
            let pct = (processed * 100).checked_div(p.memory_total).unwrap_or(0);
            format!(
                "{phase:<16} [{}{}] {pct:>3}%  iteration {}  remaining {} MiB  dirty {} pages/s",
                "#".repeat(done),
                ".".repeat(width - done),
                p.iteration,
                p.memory_remaining >> 20,
                p.dirty_rate
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use roam_api::Progress;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn parses_the_documented_forms() {
        assert_eq!(
            parse(&args("migrate demo --to node-b --watch")),
            Ok(Command::Migrate {
                vm: "demo".into(),
                to: MigrateTo::Node("node-b".into()),
                watch: true,
                namespace: None
            })
        );
        assert_eq!(
            parse(&args("migrate -n prod demo --to=auto")),
            Ok(Command::Migrate {
                vm: "demo".into(),
                to: MigrateTo::Auto,
                watch: false,
                namespace: Some("prod".into())
            })
        );
        assert_eq!(parse(&[]), Ok(Command::Help));
        for bad in [
            "migrate demo",
            "migrate --to node-b",
            "migrate demo --to Node_B",
            "frob",
            "migrate a b --to x",
            "migrate demo --to",
        ] {
            assert!(parse(&args(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn progress_bar_and_outcomes() {
        let mut st = VirtualMachineMigrationStatus {
            phase: Phase::Migrating,
            progress: Some(Progress {
                memory_total: 256 << 20,
                memory_processed: 64 << 20,
                memory_remaining: 192 << 20,
                iteration: 2,
                dirty_rate: 300,
                ..Progress::default()
            }),
            ..Default::default()
        };
        let line = progress_line(&st, 20);
        assert!(line.contains("[#####...............]  25%"), "{line}");
        assert!(line.contains("remaining 192 MiB"), "{line}");
        st.phase = Phase::Succeeded;
        st.source_node = Some("node-a".into());
        st.target_node = Some("node-b".into());
        st.downtime_ms = Some(87);
        let line = progress_line(&st, 20);
        assert_eq!(line, "Succeeded: node-a → node-b, VM downtime 87 ms");
        st.phase = Phase::Failed;
        st.reason = Some("target pod: ImagePullBackOff".into());
        assert_eq!(
            progress_line(&st, 20),
            "Failed: target pod: ImagePullBackOff (the VM runs on node-a)"
        );
        // no figures yet: an empty bar, no division by zero
        let empty = VirtualMachineMigrationStatus::default();
        assert!(progress_line(&empty, 4).contains("[....]   0%"));
    }
}
