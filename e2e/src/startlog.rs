//! How a pod started on a lab node, read from the node's logs: the kubelet's (klog), the
//! containerd's (logrus) and the container's own (CRI format). Pure text in, times out.

/// A log line's time in Unix seconds: klog's `I1202 05:06:38.965621 ...` (of `year`, UTC,
/// as the lab's nodes log), containerd's `time="2026-12-02T05:06:38.965621711Z" ...`, or a
/// CRI container log's `2026-12-02T05:06:38.965621711Z stderr F ...`.
pub fn log_time(line: &str, year: i16) -> Option<f64> {
    let ts: k8s_openapi::jiff::Timestamp = if let Some(rest) = line.strip_prefix("time=\"") {
        rest.split('"').next()?.parse().ok()?
    } else if line.starts_with(['I', 'W', 'E', 'F']) && line.get(5..6) == Some(" ") {
        let (mm, dd, time) = (line.get(1..3)?, line.get(3..5)?, line.get(6..21)?);
        format!("{year}-{mm}-{dd}T{time}Z").parse().ok()?
    } else {
        line.split(' ').next()?.parse().ok()?
    };
    Some(ts.as_microsecond() as f64 / 1e6)
}

/// The first line containing every one of `needles`.
fn first_with<'a>(text: &'a str, needles: &[&str]) -> Option<&'a str> {
    text.lines().find(|l| needles.iter().all(|n| l.contains(n)))
}

/// The quoted ID after `marker` in a containerd line (`... returns sandbox id \"ID\"`).
fn id_after<'a>(line: &'a str, marker: &str) -> Option<&'a str> {
    let rest = line.split(marker).nth(1)?.strip_prefix(" \\\"")?;
    rest.split('\\').next()
}

/// The steps of pod `ns/pod`'s start and when each happened (Unix seconds), in order:
/// the kubelet sees it, asks for its sandbox, the sandbox is up, the container `container`
/// is created and started, its process logs its first line, and the line containing
/// `ready_line` (the process is serving). A step a log does not show is left out.
pub fn pod_start(
    kubelet: &str,
    containerd: &str,
    container_log: &str,
    (ns, pod, container): (&str, &str, &str),
    ready_line: &str,
    year: i16,
) -> Vec<(&'static str, f64)> {
    let mut steps = vec![];
    let mut step = |name: &'static str, line: Option<&str>| {
        if let Some(t) = line.and_then(|l| log_time(l, year)) {
            steps.push((name, t));
        }
    };
    let add = format!("\"{pod}_{ns}(");
    step(
        "kubelet sees it",
        first_with(kubelet, &["SyncLoop (ADD", &add]),
    );
    let (meta, in_ns) = (format!("{{Name:{pod},"), format!(",Namespace:{ns},"));
    let sandbox = ["RunPodSandbox for", meta.as_str(), in_ns.as_str()];
    step("sandbox asked", first_with(containerd, &sandbox));
    let up = first_with(
        containerd,
        &[sandbox[0], sandbox[1], sandbox[2], "returns sandbox id"],
    );
    step("sandbox up", up);
    let within = up
        .and_then(|l| id_after(l, "returns sandbox id"))
        .map(|id| format!("within sandbox \\\"{id}\\\""));
    let name = format!("{{Name:{container},");
    let created = within.as_ref().and_then(|w| {
        first_with(
            containerd,
            &["CreateContainer", w, &name, "returns container id"],
        )
    });
    step("container created", created);
    let started = created
        .and_then(|l| id_after(l, "returns container id"))
        .map(|id| format!("StartContainer for \\\"{id}\\\" returns successfully"));
    step(
        "container started",
        started.and_then(|s| first_with(containerd, &[&s])),
    );
    step("its first log line", container_log.lines().next());
    step("it serves", first_with(container_log, &[ready_line]));
    steps
}

/// The lines of `text` containing `needle` and logged between `from` and `to` (Unix seconds).
pub fn lines_between<'a>(
    text: &'a str,
    needle: &str,
    from: f64,
    to: f64,
    year: i16,
) -> Vec<&'a str> {
    text.lines()
        .filter(|l| l.contains(needle))
        .filter(|l| log_time(l, year).is_some_and(|t| t >= from && t <= to))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    // lines as the lab's kubelet 1.20, containerd 1.6 and a launcher pod wrote them
    const KUBELET: &str = r#"I1202 04:43:26.899384    6474 kubelet.go:1888] SyncLoop (ADD, "api"): "web_r5-rbac(76929b96-259e-4a74-b7ae-e4fabb0d9ece)"
I1202 04:43:30.397455    6474 kubelet.go:1888] SyncLoop (ADD, "api"): "vm1-launcher_r5-rbac(b1b68cf3-b496-440e-b882-b95633972777)"
I1202 04:43:30.454804    6474 reconciler.go:224] operationExecutor.VerifyControllerAttachedVolume started for volume "logs""#;
    const CONTAINERD: &str = r#"time="2026-12-02T04:43:30.711915906Z" level=info msg="RunPodSandbox for &PodSandboxMetadata{Name:vm1-launcher,Uid:b1b68cf3-b496-440e-b882-b95633972777,Namespace:r5-rbac,Attempt:0,}"
time="2026-12-02T04:43:30.750000000Z" level=info msg="RunPodSandbox for &PodSandboxMetadata{Name:vm1,Uid:00000000-b496-440e-b882-b95633972777,Namespace:r5-rbac,Attempt:0,} returns sandbox id \"0000\""
time="2026-12-02T04:43:30.789530597Z" level=info msg="RunPodSandbox for &PodSandboxMetadata{Name:vm1-launcher,Uid:b1b68cf3-b496-440e-b882-b95633972777,Namespace:r5-rbac,Attempt:0,} returns sandbox id \"9e869de28aa97f2a4fc99005a092e3f0813eea86a08c22ce06850eddda8e0197\""
time="2026-12-02T04:43:30.794697989Z" level=info msg="CreateContainer within sandbox \"9e869de28aa97f2a4fc99005a092e3f0813eea86a08c22ce06850eddda8e0197\" for container &ContainerMetadata{Name:shim,Attempt:0,}"
time="2026-12-02T04:43:30.810853124Z" level=info msg="CreateContainer within sandbox \"9e869de28aa97f2a4fc99005a092e3f0813eea86a08c22ce06850eddda8e0197\" for &ContainerMetadata{Name:shim,Attempt:0,} returns container id \"ca99d8c8be5c0c835b93b48aa704c3bc99215b1f843913c1bdcaa024e4e26993\""
time="2026-12-02T04:43:30.812000000Z" level=info msg="StartContainer for \"ca99d8c8be5c0c835b93b48aa704c3bc99215b1f843913c1bdcaa024e4e26993\""
time="2026-12-02T04:43:31.010000000Z" level=info msg="StartContainer for \"ca99d8c8be5c0c835b93b48aa704c3bc99215b1f843913c1bdcaa024e4e26993\" returns successfully""#;
    const SHIM: &str = "2026-12-02T04:43:30.990000000Z stderr F 2026-12-02T04:43:30.989Z  INFO roam_shim: starting\n\
        2026-12-02T04:43:31.120000000Z stderr F 2026-12-02T04:43:31.119Z  INFO roam_shim: serving the migration API listen=10.0.0.1:17355\n";

    #[test]
    fn the_three_formats_give_their_times() {
        assert_eq!(
            log_time(KUBELET.lines().next().unwrap(), 2026),
            Some(1796186606.899384)
        );
        assert_eq!(
            log_time(CONTAINERD.lines().next().unwrap(), 2026),
            Some(1796186610.711915)
        );
        assert_eq!(
            log_time(SHIM.lines().next().unwrap(), 2026),
            Some(1796186610.99)
        );
        assert_eq!(log_time("no time here", 2026), None);
    }

    #[test]
    fn a_launcher_start_is_read_step_by_step() {
        let steps = pod_start(
            KUBELET,
            CONTAINERD,
            SHIM,
            ("r5-rbac", "vm1-launcher", "shim"),
            "serving the migration API",
            2026,
        );
        let names: Vec<&str> = steps.iter().map(|(n, _)| *n).collect();
        assert_eq!(
            names,
            [
                "kubelet sees it",
                "sandbox asked",
                "sandbox up",
                "container created",
                "container started",
                "its first log line",
                "it serves"
            ]
        );
        let ms = |i: usize| ((steps[i].1 - steps[0].1) * 1000.0).round();
        // the other pod's sandbox (vm1, id 0000) is not taken for this one's
        assert_eq!(ms(2), 392.0);
        assert_eq!(ms(4), 613.0);
        assert_eq!(ms(6), 723.0);
    }

    #[test]
    fn lines_are_picked_by_text_and_time() {
        let t0 = log_time(KUBELET.lines().nth(1).unwrap(), 2026).unwrap();
        assert_eq!(
            lines_between(KUBELET, "SyncLoop (ADD", t0, t0 + 1.0, 2026).len(),
            1,
            "web's ADD is 3.5 s earlier"
        );
        assert!(lines_between(KUBELET, "no such text", 0.0, f64::MAX, 2026).is_empty());
    }

    #[test]
    fn steps_missing_from_the_logs_are_left_out() {
        let steps = pod_start(KUBELET, "", "", ("r5-rbac", "web", "c"), "serving", 2026);
        assert_eq!(steps.len(), 1);
        assert_eq!(steps[0].0, "kubelet sees it");
    }
}
