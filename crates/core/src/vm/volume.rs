//! A VM that boots from a PersistentVolumeClaim (`boot.volume`): whether the claim lets it
//! start, and whether it lets it migrate (pure; the controller reads the claim).

/// What the controller read of the claim: its phase and access modes (`None`: there is no
/// such claim in the VM's namespace).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Claim {
    /// `status.phase`: `Pending`, `Bound` or `Lost`.
    pub phase: Option<String>,
    /// `spec.accessModes`.
    pub access_modes: Vec<String>,
}

/// Why the VM cannot start on claim `name` yet (`None`: it can): the claim must exist and be
/// Bound. Waiting, not refused: the claim may come (or bind) later.
pub fn not_ready(name: &str, claim: Option<&Claim>) -> Option<String> {
    match claim {
        None => Some(format!(
            "the boot volume's PersistentVolumeClaim {name} does not exist in the VM's \
             namespace: create it (a filesystem volume holding the image file)"
        )),
        Some(c) if c.phase.as_deref() == Some("Bound") => None,
        Some(c) => Some(format!(
            "the boot volume's PersistentVolumeClaim {name} is {}, not Bound: it starts once \
             the claim is bound to a volume",
            c.phase.as_deref().unwrap_or("without a phase")
        )),
    }
}

/// Why a VM booted from claim `name` cannot migrate (`None`: it can): the disk does not move
/// with the VM, so both nodes must mount the same volume — the claim must be ReadWriteMany.
pub fn blocks_migration(name: &str, claim: Option<&Claim>) -> Option<String> {
    let shared = claim.is_some_and(|c| c.access_modes.iter().any(|m| m == "ReadWriteMany"));
    (!shared).then(|| {
        format!(
            "the VM boots from PersistentVolumeClaim {name}, which is not ReadWriteMany: its \
             disk cannot be reached from another node (disk migration is not supported yet)"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(phase: &str, modes: &[&str]) -> Claim {
        Claim {
            phase: Some(phase.into()),
            access_modes: modes.iter().map(|m| m.to_string()).collect(),
        }
    }

    #[test]
    fn a_vm_starts_on_a_bound_claim_only() {
        assert!(not_ready("d", None).unwrap().contains("does not exist"));
        let pending = not_ready("d", Some(&claim("Pending", &["ReadWriteOnce"]))).unwrap();
        assert!(pending.contains("is Pending, not Bound"), "{pending}");
        assert!(not_ready("d", Some(&claim("Lost", &[]))).is_some());
        assert!(
            not_ready("d", Some(&Claim::default()))
                .unwrap()
                .contains("without a phase")
        );
        assert_eq!(
            not_ready("d", Some(&claim("Bound", &["ReadWriteOnce"]))),
            None
        );
    }

    #[test]
    fn only_a_shared_claim_lets_the_vm_migrate() {
        for modes in [&["ReadWriteOnce"][..], &["ReadOnlyMany"], &[]] {
            let why = blocks_migration("d", Some(&claim("Bound", modes))).unwrap();
            assert!(why.contains("not ReadWriteMany"), "{why}");
        }
        assert!(blocks_migration("d", None).is_some());
        assert_eq!(
            blocks_migration(
                "d",
                Some(&claim("Bound", &["ReadWriteOnce", "ReadWriteMany"]))
            ),
            None
        );
    }
}
