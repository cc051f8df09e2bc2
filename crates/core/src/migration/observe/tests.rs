use super::*;
use k8s_openapi::api::core::v1::{ContainerStatus, PodStatus};
use roam_shim_api::api::{Incoming, Job as ShimJob, JobStats, MigrateParameters};

fn status(domain: DomainState) -> Status {
    Status {
        vm: "ns_demo".into(),
        node: "node-a".into(),
        domain,
        incoming: false,
        job: None,
        last_incoming: None,
        instance: Some("demo-launcher".into()),
        resets: 0,
        ports: vec![],
        torn_down: false,
    }
}

fn shim_job(id: u64, state: JobState) -> ShimJob {
    ShimJob {
        id,
        state,
        target: "http://10.0.0.2:17100".into(),
        target_node: Some("node-b".into()),
        request: MigrateParameters {
            bandwidth_mib_s: None,
            max_downtime_ms: None,
            auto_converge: false,
            post_copy: false,
            timeout_s: 600,
        },
        started_unix_ns: 1_000_000_000,
        finished_unix_ns: None,
        error: None,
        stats: JobStats::default(),
    }
}

fn with_job(domain: DomainState, j: ShimJob) -> Status {
    Status {
        job: Some(j),
        ..status(domain)
    }
}

fn pod(phase: &str, restarts: i32) -> Pod {
    Pod {
        status: Some(PodStatus {
            phase: Some(phase.into()),
            container_statuses: Some(vec![ContainerStatus {
                restart_count: restarts,
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[test]
fn the_shim_of_a_pod_is_known_by_its_instance() {
    let s = status(DomainState::Running);
    assert!(is_shim_of(&s, "demo-launcher", false));
    assert!(!is_shim_of(&s, "demo-1-target", true), "another pod's shim");
    let old = Status {
        instance: None,
        ..s
    };
    assert!(!is_shim_of(&old, "p", false));
    assert!(
        is_shim_of(&old, "p", true),
        "an old shim, trusted once Running"
    );
}

#[test]
fn the_target_pod_is_ready_when_its_shim_answers() {
    let s = status(DomainState::Absent);
    assert_eq!(target_pod_state(None, "t", Some(&s)), PodState::Absent);
    let mut deleting = pod("Running", 0);
    deleting.metadata.deletion_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        ));
    assert_eq!(
        target_pod_state(Some(&deleting), "t", Some(&s)),
        PodState::Absent
    );
    assert_eq!(
        target_pod_state(Some(&pod("Failed", 0)), "t", Some(&s)),
        PodState::Failed("pod t failed".into())
    );
    assert_eq!(
        target_pod_state(Some(&pod("Pending", 0)), "t", None),
        PodState::Starting
    );
    // the shim answers before the kubelet reports the pod Running
    assert_eq!(
        target_pod_state(Some(&pod("Pending", 0)), "t", Some(&s)),
        PodState::Ready
    );
}

#[test]
fn the_guest_is_on_the_target_after_an_incoming_migration_or_a_restart() {
    let mut s = status(DomainState::Running);
    assert!(!guest_on_target(Some(&pod("Running", 0)), Some(&s)));
    assert!(
        guest_on_target(Some(&pod("Running", 1)), Some(&s)),
        "a restarted shim"
    );
    s.incoming = true;
    assert!(!guest_on_target(Some(&pod("Running", 1)), Some(&s)));
    s.last_incoming = Some(Incoming {
        resumed_unix_ns: 5,
        stats: JobStats::default(),
    });
    assert!(guest_on_target(Some(&pod("Running", 0)), Some(&s)));
    s.domain = DomainState::Paused;
    assert!(!guest_on_target(Some(&pod("Running", 0)), Some(&s)));
    assert!(!guest_on_target(None, None));
}

#[test]
fn only_a_running_copy_to_this_target_is_adopted() {
    let url = "http://10.0.0.2:17100";
    let running = with_job(DomainState::Running, shim_job(3, JobState::Running));
    assert_eq!(unrecorded_job(Some(&running), url), Some(3));
    assert_eq!(
        unrecorded_job(Some(&running), "http://10.0.0.3:17100"),
        None
    );
    let done = with_job(DomainState::Running, shim_job(3, JobState::Failed));
    assert_eq!(unrecorded_job(Some(&done), url), None);
    assert_eq!(unrecorded_job(None, url), None);
}

#[test]
fn the_job_is_read_from_the_source_shim() {
    let r = with_job(DomainState::Running, shim_job(2, JobState::Running));
    assert_eq!(job(Some(&r), None), Job::None);
    assert_eq!(job(None, Some(2)), Job::Unknown);
    assert_eq!(job(Some(&r), Some(1)), Job::Unknown, "another job");
    assert_eq!(job(Some(&r), Some(2)), Job::Running);
    let p = with_job(DomainState::Paused, shim_job(2, JobState::Running));
    assert_eq!(job(Some(&p), Some(2)), Job::Paused);
    let c = with_job(DomainState::Absent, shim_job(2, JobState::Completed));
    assert_eq!(job(Some(&c), Some(2)), Job::Completed);
    let mut failed = shim_job(2, JobState::Failed);
    failed.error = Some("connection reset".into());
    let f = with_job(DomainState::Running, failed);
    assert_eq!(
        job(Some(&f), Some(2)),
        Job::Failed("connection reset".into())
    );
    let a = with_job(DomainState::Running, shim_job(2, JobState::Aborted));
    assert_eq!(job(Some(&a), Some(2)), Job::Failed("Aborted".into()));
}

#[test]
fn the_guest_is_where_a_shim_sees_it() {
    assert_eq!(guest_at(true, None), GuestAt::Target);
    assert_eq!(
        guest_at(false, Some(&status(DomainState::Paused))),
        GuestAt::Source
    );
    assert_eq!(
        guest_at(false, Some(&status(DomainState::Absent))),
        GuestAt::Unknown
    );
    assert_eq!(guest_at(false, None), GuestAt::Unknown);
}

#[test]
fn a_timeout_counts_from_the_start() {
    let start: k8s_openapi::jiff::Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
    let later = |s: i64| start + k8s_openapi::jiff::SignedDuration::from_secs(s);
    assert!(!timed_out(Some(60), Some(start), later(60)));
    assert!(timed_out(Some(60), Some(start), later(61)));
    assert!(!timed_out(None, Some(start), later(6000)));
    assert!(!timed_out(Some(60), None, later(6000)));
}

#[test]
fn with_post_copy_the_shim_acts_at_the_deadline_and_the_controller_later() {
    assert_eq!(give_up_after(Some(3), false), Some(3));
    assert_eq!(give_up_after(Some(3), true), Some(3 + POST_COPY_BACKSTOP_S));
    assert_eq!(give_up_after(None, true), None);
    assert_eq!(give_up_after(Some(u64::MAX), true), Some(u64::MAX));
}

#[test]
fn progress_and_figures_come_from_the_recorded_job() {
    let mut j = shim_job(4, JobState::Running);
    j.stats = JobStats {
        data_total: Some(400),
        data_processed: Some(100),
        data_remaining: Some(300),
        iteration: Some(2),
        ..Default::default()
    };
    let s = with_job(DomainState::Running, j.clone());
    let mut st = VirtualMachineMigrationStatus::default();
    record_progress(&mut st, Some(&s));
    assert!(st.progress.is_none(), "no job recorded: not ours");
    st.job_id = Some(4);
    record_progress(&mut st, Some(&s));
    let p = st.progress.clone().unwrap();
    assert_eq!(
        (p.percent.as_deref(), p.memory_remaining, p.iteration),
        (Some("25%"), 300, 2)
    );
    assert_eq!(st.downtime_ms, None);

    j.state = JobState::Completed;
    j.finished_unix_ns = Some(3_500_000_000);
    j.stats.downtime_ms = Some(42);
    record_progress(&mut st, Some(&with_job(DomainState::Absent, j)));
    assert_eq!(
        st.progress.as_ref().unwrap().percent.as_deref(),
        Some("100%")
    );
    assert_eq!(
        (st.downtime_ms, st.downtime.as_deref()),
        (Some(42), Some("42ms"))
    );
    assert_eq!(st.job_ms, Some(2500), "from the job's start and end");
}

#[test]
fn the_landing_gives_the_pause_from_suspension_to_resume() {
    let mut st = VirtualMachineMigrationStatus {
        progress: Some(Progress {
            percent: Some("97%".into()),
            memory_remaining: 12,
            ..Default::default()
        }),
        ..Default::default()
    };
    let mut t = status(DomainState::Running);
    record_landing(&mut st, Some(&t), Some(1));
    assert_eq!(st.pause_ms, None, "no landing yet");
    t.last_incoming = Some(Incoming {
        resumed_unix_ns: 9_000_000,
        stats: JobStats {
            downtime_ms: Some(7),
            elapsed_ms: Some(900),
            ..Default::default()
        },
    });
    record_landing(&mut st, Some(&t), Some(2_000_000));
    assert_eq!(
        (st.pause_ms, st.downtime_ms, st.job_ms),
        (Some(7), Some(7), Some(900))
    );
    let p = st.progress.unwrap();
    assert_eq!(
        (p.percent.as_deref(), p.memory_remaining),
        (Some("100%"), 0)
    );
    // a suspension after the resume (another migration's) gives no pause
    let mut st = VirtualMachineMigrationStatus::default();
    record_landing(&mut st, Some(&t), Some(10_000_000));
    assert_eq!(st.pause_ms, None);
}

#[test]
fn a_failing_target_launcher_is_said_then_cleared() {
    let mut st = VirtualMachineMigrationStatus::default();
    let now = Time("2026-01-01T00:00:00Z".parse().unwrap());
    // nothing wrong, nothing said
    record_target_trouble(&mut st, None, &now);
    assert!(st.conditions.is_empty());
    record_target_trouble(&mut st, Some("container libvirtd CrashLoopBackOff"), &now);
    let c = &st.conditions[0];
    assert_eq!(
        (
            c.type_.as_str(),
            c.status.as_str(),
            c.reason.as_str(),
            c.message.as_str()
        ),
        (
            "TargetLauncher",
            "False",
            "LauncherFailing",
            "container libvirtd CrashLoopBackOff"
        )
    );
    // it recovered: True again, one condition
    record_target_trouble(&mut st, None, &now);
    assert_eq!(st.conditions.len(), 1);
    assert_eq!(
        (
            st.conditions[0].status.as_str(),
            st.conditions[0].reason.as_str()
        ),
        ("True", "Running")
    );
}
