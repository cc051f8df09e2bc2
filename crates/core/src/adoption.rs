//! Whether the pod that holds a launcher's name is the one roam created (pure).
//!
//! A VM's launcher pod and a migration's target pod have names anyone with `edit` in the
//! VM's namespace can guess, and labels and owner references anyone there can write. So a
//! pod is roam's only by its UID, recorded in the VM's (`status.podUID`) or the migration's
//! (`status.targetPodUID`) status, which tenants cannot write:
//! - before creating the pod, roam records [`CREATING`]; once created, its UID;
//! - a pod whose UID is recorded is roam's;
//! - while [`CREATING`] is recorded, a pod of the name may be the one roam created just
//!   before a restart (its UID never recorded) or one made in between: nothing runs in it
//!   yet (a runner is made only for a recorded UID), so it is deleted and created again;
//! - a pod that already has roam's runner (made in roam's namespace, which tenants cannot
//!   write, for that very pod's UID) is roam's from before UIDs were recorded: its UID is
//!   recorded now;
//! - any other pod of the name is in the way: the VM or the migration waits (or fails)
//!   saying so, and roam neither uses nor deletes it.

/// What `status.podUID` / `status.targetPodUID` holds between roam's decision to create the
/// pod and the pod's creation.
pub const CREATING: &str = "creating";

/// The pod found under the launcher's name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Found<'a> {
    /// Its UID.
    pub uid: &'a str,
    /// Whether a runner of roam's is bound to this very pod (its UID).
    pub has_runner: bool,
}

/// What to do with the name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Adoption {
    /// No pod has the name: record [`CREATING`], create it, record its UID.
    Create,
    /// The pod is roam's.
    Ours,
    /// The pod is roam's from before UIDs were recorded: record its UID.
    Record,
    /// roam may have created it without recording it: delete it (nothing runs in it yet)
    /// and create it again.
    Replace,
    /// Another's pod holds the name: why, in words for a condition.
    InTheWay(String),
}

/// Decide for the pod named `name`, given the UID recorded for it and the pod found there.
pub fn adoption(name: &str, recorded: Option<&str>, found: Option<Found<'_>>) -> Adoption {
    let Some(f) = found else {
        return Adoption::Create;
    };
    match recorded {
        Some(uid) if uid == f.uid => Adoption::Ours,
        Some(CREATING) => Adoption::Replace,
        None if f.has_runner => Adoption::Record,
        _ => Adoption::InTheWay(format!(
            "pod {name} exists but roam did not create it (its UID {} is not the one roam \
             recorded): roam neither uses nor deletes a pod it did not make; delete the pod \
             and roam creates its own",
            f.uid
        )),
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn found(uid: &str, has_runner: bool) -> Option<Found<'_>> {
        Some(Found { uid, has_runner })
    }

    #[test]
    fn only_the_recorded_pod_is_roams() {
        assert_eq!(adoption("vm-launcher", None, None), Adoption::Create);
        assert_eq!(adoption("vm-launcher", Some("u1"), None), Adoption::Create);
        assert_eq!(
            adoption("vm-launcher", Some("u1"), found("u1", false)),
            Adoption::Ours
        );
        // a pre-made pod, with or without roam's labels: in the way
        for recorded in [None, Some("u1")] {
            let Adoption::InTheWay(why) = adoption("vm-launcher", recorded, found("u2", false))
            else {
                panic!("in the way");
            };
            assert!(why.contains("vm-launcher") && why.contains("u2"), "{why}");
        }
        // made after roam's own pod of the name went (its UID recorded): in the way too, even
        // with a runner (a runner of another pod cannot be bound to this UID)
        assert!(matches!(
            adoption("vm-launcher", Some("u1"), found("u2", true)),
            Adoption::InTheWay(_)
        ));
    }

    #[test]
    fn an_unrecorded_creation_is_made_again_and_a_runner_proves_an_old_pod() {
        assert_eq!(
            adoption("t", Some(CREATING), found("u3", false)),
            Adoption::Replace
        );
        assert_eq!(adoption("t", None, found("u3", true)), Adoption::Record);
    }

    proptest! {
        /// Whatever is recorded and found, roam uses a pod only if its UID is recorded or a
        /// runner of roam's proves it; it deletes one only while a creation is recorded.
        #[test]
        fn roam_uses_only_what_it_can_prove(
            recorded in proptest::option::of(prop_oneof![Just(CREATING.to_string()), "[a-c]"]),
            uid in "[a-c]",
            has_runner in any::<bool>(),
        ) {
            let a = adoption("p", recorded.as_deref(), Some(Found { uid: &uid, has_runner }));
            match a {
                Adoption::Ours => prop_assert_eq!(recorded.as_deref(), Some(uid.as_str())),
                Adoption::Record => prop_assert!(recorded.is_none() && has_runner),
                Adoption::Replace => prop_assert_eq!(recorded.as_deref(), Some(CREATING)),
                Adoption::InTheWay(_) => {}
                Adoption::Create => prop_assert!(false, "a pod was found"),
            }
        }
    }
}
