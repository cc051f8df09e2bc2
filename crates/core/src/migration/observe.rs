//! What a migration's reconcile read — the launcher pods, the shims' answers, the Addresses'
//! placement — translated into what [`super::step`] decides on, and the figures recorded in
//! the migration's status. The reading itself is the controller's.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use roam_shim_api::api::{DomainState, JobState, Status};

use super::{GuestAt, Job, Observed, PodState, PortsAt};
use crate::launcher::pod_failed;
pub use crate::launcher::pod_running;
use roam_api::{Progress, VirtualMachineMigrationStatus};

impl Observed {
    /// A migration refused before anything was created: `step` ends it, touching nothing.
    pub fn refused(why: impl Into<String>) -> Observed {
        Observed {
            invalid: Some(why.into()),
            deleted: false,
            timed_out: false,
            target_pod: PodState::Absent,
            target_port: false,
            target_uninstalled: vec![],
            source_pod: true,
            job: Job::None,
            guest: GuestAt::Source,
            ports: PortsAt::Source,
        }
    }
}

/// Record in `st` what keeps the target launcher's containers from running (pure): condition
/// `TargetLauncher` False with reason `LauncherFailing` and the trouble in words (see
/// [`crate::launcher::launcher_trouble`]) — while a migration waits in
/// TargetScheduling for a target that may still come up, this says why (one that will not
/// ends the migration, see [`target_pod_state`]) —, True again once the trouble is gone.
pub fn record_target_trouble(
    st: &mut VirtualMachineMigrationStatus,
    trouble: Option<&str>,
    now: &Time,
) {
    use crate::vm::readiness::{condition, set_condition};
    const TYPE: &str = "TargetLauncher";
    match trouble {
        Some(t) => set_condition(
            &mut st.conditions,
            condition(TYPE, false, "LauncherFailing", t, None, now),
        ),
        // (only the trouble this records: a refusal recorded elsewhere stands)
        None if st
            .conditions
            .iter()
            .any(|c| c.type_ == TYPE && c.status == "False" && c.reason == "LauncherFailing") =>
        {
            set_condition(
                &mut st.conditions,
                condition(
                    TYPE,
                    true,
                    "Running",
                    "the target launcher's containers run",
                    None,
                    now,
                ),
            )
        }
        None => {}
    }
}

/// Whether `p` exists for the migration (a pod being deleted counts as gone).
pub fn live(p: Option<&Pod>) -> Option<&Pod> {
    p.filter(|p| p.metadata.deletion_timestamp.is_none())
}

/// Whether `s` comes from the shim of `pod`: by its `instance`; a shim too old to say is
/// trusted once its pod is Running.
pub fn is_shim_of(s: &Status, pod: &str, pod_running: bool) -> bool {
    match &s.instance {
        Some(i) => i == pod,
        None => pod_running,
    }
}

/// The target launcher pod's state; `shim` is its shim's answer (already checked to be
/// this pod's). A target whose shim does not answer and that will not come up without a
/// change ([`crate::launcher::target_hopeless`]) has failed: the migration ends and
/// the VM stays on the source, rather than waiting in TargetScheduling.
pub fn target_pod_state(pod: Option<&Pod>, name: &str, shim: Option<&Status>) -> PodState {
    match live(pod) {
        None => PodState::Absent,
        Some(p) if pod_failed(p) => PodState::Failed(format!("pod {name} failed")),
        Some(_) if shim.is_some() => PodState::Ready,
        // it will not come up without a change: the VM stays on the source
        Some(p) if let Some(why) = crate::launcher::target_hopeless(p) => {
            PodState::Failed(format!("pod {name} will not start: {why}"))
        }
        Some(_) => PodState::Starting,
    }
}

/// Whether the guest runs on the target: its domain runs there after an incoming migration
/// (a restarted target shim knows no incoming migration: its domain running is enough).
pub fn guest_on_target(pod: Option<&Pod>, shim: Option<&Status>) -> bool {
    let restarted = pod
        .and_then(|p| p.status.as_ref()?.container_statuses.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.restart_count > 0));
    shim.is_some_and(|s| {
        s.domain == DomainState::Running
            && (s.last_incoming.is_some() || (restarted && !s.incoming))
    })
}

/// A copy to `target_url` that a migration started but never recorded (its controller died
/// in between): its id, to adopt. Unwatched, its pause would pass without the target's announcement.
pub fn unrecorded_job(source: Option<&Status>, target_url: &str) -> Option<u64> {
    source?
        .job
        .as_ref()
        .filter(|j| !j.state.is_final() && j.target == target_url)
        .map(|j| j.id)
}

/// libvirt's job `job_id`, as the source shim reports it.
pub fn job(source: Option<&Status>, job_id: Option<u64>) -> Job {
    let (s, id) = match (source, job_id) {
        (_, None) => return Job::None,
        (None, Some(_)) => return Job::Unknown,
        (Some(s), Some(id)) => (s, id),
    };
    match s.job.as_ref().filter(|j| j.id == id) {
        None => Job::Unknown,
        Some(j) => match j.state {
            JobState::Preparing | JobState::Running if s.domain == DomainState::Paused => {
                Job::Paused
            }
            JobState::Preparing | JobState::Running => Job::Running,
            JobState::Completed => Job::Completed,
            JobState::Aborted | JobState::Failed => {
                Job::Failed(j.error.clone().unwrap_or_else(|| format!("{:?}", j.state)))
            }
        },
    }
}

/// Where the guest runs.
pub fn guest_at(on_target: bool, source: Option<&Status>) -> GuestAt {
    if on_target {
        GuestAt::Target
    } else if source.is_some_and(|s| matches!(s.domain, DomainState::Running | DomainState::Paused))
    {
        GuestAt::Source
    } else {
        GuestAt::Unknown
    }
}

/// How much later than `timeoutSeconds` a migration allowed post-copy gives up: its source
/// shim acts at the deadline itself (switches to post-copy, or aborts a copy that has not
/// started within its grace), so the controller's bound is a backstop for a shim that never
/// did, not a race with the switch.
pub const POST_COPY_BACKSTOP_S: u64 = 60;

/// The controller's bound for a migration of `timeout_seconds`: see [`POST_COPY_BACKSTOP_S`].
pub fn give_up_after(timeout_seconds: Option<u64>, allow_post_copy: bool) -> Option<u64> {
    let backstop = if allow_post_copy {
        POST_COPY_BACKSTOP_S
    } else {
        0
    };
    timeout_seconds.map(|t| t.saturating_add(backstop))
}

/// Whether `timeout_seconds` passed since `start_time` at `now`.
pub fn timed_out(
    timeout_seconds: Option<u64>,
    start_time: Option<k8s_openapi::jiff::Timestamp>,
    now: k8s_openapi::jiff::Timestamp,
) -> bool {
    match (timeout_seconds, start_time) {
        (Some(t), Some(s)) => (now - s).get_seconds() > t as i64,
        _ => false,
    }
}

fn record_downtime(st: &mut VirtualMachineMigrationStatus, downtime_ms: Option<u64>) {
    if let Some(d) = downtime_ms {
        st.downtime_ms = Some(d);
        st.downtime = Some(format!("{d}ms"));
    }
}

/// The copy's progress (and, once it completed, its downtime and duration) from the source
/// shim's report of the recorded job.
pub fn record_progress(st: &mut VirtualMachineMigrationStatus, source: Option<&Status>) {
    let Some(j) = source
        .and_then(|s| s.job.as_ref())
        .filter(|j| Some(j.id) == st.job_id)
    else {
        return;
    };
    let s = &j.stats;
    let total = s.data_total.unwrap_or_default();
    let processed = s.data_processed.unwrap_or_default();
    let completed = j.state == JobState::Completed;
    st.progress = Some(Progress {
        percent: Some(if completed {
            "100%".into()
        } else {
            Progress::percent_of(processed, total)
        }),
        memory_total: total,
        memory_processed: processed,
        memory_remaining: s.data_remaining.unwrap_or_default(),
        iteration: s.iteration.unwrap_or_default(),
        dirty_rate: s.dirty_rate_pages_s.unwrap_or_default(),
    });
    if completed {
        record_downtime(st, s.downtime_ms);
        st.job_ms = s.elapsed_ms.or_else(|| {
            j.finished_unix_ns
                .map(|f| f.saturating_sub(j.started_unix_ns) / 1_000_000)
        });
    }
}

/// The landing as the target saw it (libvirt's completed job there: the source's may not say
/// so yet), and the pause from the source's suspension (`paused_at_ns`) to the target's resume.
pub fn record_landing(
    st: &mut VirtualMachineMigrationStatus,
    target: Option<&Status>,
    paused_at_ns: Option<u64>,
) {
    let Some(inc) = target.and_then(|s| s.last_incoming.as_ref()) else {
        return;
    };
    record_downtime(st, inc.stats.downtime_ms);
    if let Some(e) = inc.stats.elapsed_ms {
        st.job_ms = Some(e);
    }
    if let Some(at) = paused_at_ns.filter(|at| inc.resumed_unix_ns > *at) {
        st.pause_ms = Some((inc.resumed_unix_ns - at) / 1_000_000);
    }
    if let Some(p) = st.progress.as_mut() {
        p.percent = Some("100%".into());
        p.memory_remaining = 0;
    }
}

#[cfg(test)]
mod tests;
