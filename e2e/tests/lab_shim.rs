//! roam-shim on the lab's two real libvirt nodes with the real guest, driven only through
//! its API: it boots the VM on node-a (tap + OVS port made by the shim, the /32 lease from
//! OVN's DHCP in the serial log), refuses a wrong token (401, nothing happens), a bad request
//! (400) and an unreachable target (502, the VM stays), survives its own restart (re-attaches
//! to the same domain), aborts a slow migration (the VM keeps running on the source),
//! refuses a second migration while one runs (409), and live-migrates node-a → node-b →
//! node-a while a 2 ms ping runs, reporting the suspended-for-migration /
//! resumed-after-migration events in order with their timestamps. Crashed shims (SIGKILL)
//! come back without a second domain (also when the source shim dies mid-migration: the
//! source libvirtd finishes the peer-to-peer migration); a migration past its timeout is
//! aborted, or switched to post-copy when allowed; a killed QEMU is reported; a stopped source
//! shim takes its tap and OVS port along. A bad spec (missing kernel, 0 vCPUs, bad memory) is
//! a clear error and creates nothing.

use std::net::Ipv4Addr;
use std::time::Duration;

use roam_dhcp_opts::MacAddr;
use roam_e2e::{
    Lab, LabNetwork, Pinger, PortBuilder, ShimProcess, ShimVm, TestNetns, node_command, plug_netns,
    set_port_chassis, shim_network, try_run, wait_until,
};
use roam_network::topology::{NodeSpec, OverlaySpec, PortSpec};
use roam_shim_api::Error;
use roam_shim_api::launch::{Mode, flag};
use roam_vm_shim::api::{DomainState, Job, JobState, MigrateRequest, PortState};
use roam_vm_shim::client::ShimClient;
use roam_vm_shim::events::{Event, Lifecycle};
use virt::connect::Connect;

const NET: &str = "h7net";
const VM: &str = "h7vm";
const TAP: &str = "h7vm0";
const GUEST_MAC: &str = "52:54:00:e7:00:0a";
const GUEST_IP: &str = "10.252.0.10";
const GW: &str = "10.252.0.1";
const PROBE_MAC: &str = "0a:00:00:e7:00:20";
const PROBE_IP: &str = "10.252.0.20";
const PROBE_PORT: &str = "h7probe0";
const PORT_A: u16 = 17001;
const PORT_B: u16 = 17002;

/// h7net: workloads in 10.252.0.0/25 (gateway .1), transit 10.252.0.240/28.
fn overlay() -> (OverlaySpec, Vec<NodeSpec>, Vec<PortSpec>) {
    let spec = OverlaySpec {
        name: NET.into(),
        subnet: "10.252.0.0/25".parse().unwrap(),
        gateway: GW.parse().unwrap(),
        gateway_mac: MacAddr::new([0x0a, 0, 0, 0xe7, 0, 0x01]),
        join_subnet: "10.252.0.240/28".parse().unwrap(),
        fabric_ip: Ipv4Addr::new(10, 252, 0, 241),
        fabric_mac: MacAddr::new([0x0a, 0, 0, 0xe7, 0, 0xfe]),
        mtu: 1400,
        dns: vec![],
    };
    let nodes = ["node-a", "node-b"]
        .iter()
        .enumerate()
        .map(|(i, n)| NodeSpec {
            name: (*n).into(),
            join_ip: Ipv4Addr::new(10, 252, 0, 242 + i as u8),
            join_mac: MacAddr::new([0x0a, 0, 0, 0xe7, 0, 0x11 + i as u8]),
        })
        .collect();
    let ports = vec![
        PortBuilder::new(VM, GUEST_IP.parse().unwrap(), "node-a")
            .mac(GUEST_MAC.parse().unwrap())
            .dhcp(true)
            .build(),
        PortBuilder::new("h7probe", PROBE_IP.parse().unwrap(), "node-b")
            .mac(PROBE_MAC.parse().unwrap())
            .build(),
    ];
    (spec, nodes, ports)
}

fn vm(lab: &Lab) -> ShimVm {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    ShimVm {
        name: VM.into(),
        tap: TAP.into(),
        ovn_port: format!("{VM}.node-a"),
        mac: GUEST_MAC.into(),
        token: format!("h7-{nanos:x}"),
        dir: lab.dir().join("h7"),
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Runtime::new().expect("a tokio runtime")
}

/// The domain's state on `node`, as libvirt there sees it (not through the shim).
fn libvirt_state(lab: &Lab, node: &str) -> Option<(u32, bool)> {
    virt::error::clear_error_callback();
    let conn = Connect::open(Some(&lab.test_libvirt(node).uri)).expect("connect to libvirtd");
    let dom = conn.lookup_domain_by_name(VM).ok()?;
    Some((dom.id().unwrap_or(0), dom.is_active().unwrap_or(false)))
}

fn expect_status(e: Error, status: u16) -> String {
    match e {
        Error::Peer {
            status: Some(s),
            message,
            ..
        } if s == status => message,
        other => panic!("expected HTTP {status}, got {other}"),
    }
}

fn migrate_req(target: &ShimProcess, token: &str) -> MigrateRequest {
    MigrateRequest {
        target: target.url.clone(),
        target_token: token.into(),
        bandwidth_mib_s: None,
        max_downtime_ms: None,
        auto_converge: false,
        post_copy: false,
        timeout_s: Some(120),
        target_node: None,
        target_address: None,
    }
}

fn wait_healthy(rt: &tokio::runtime::Runtime, shim: &mut ShimProcess, c: &ShimClient) {
    wait_until(Duration::from_secs(30), "the shim's API", || {
        if let Some(st) = shim.exited() {
            panic!("roam-shim exited ({st}):\n{}", shim.log_tail(30));
        }
        rt.block_on(c.health()).ok()
    });
}

/// All events of `c` so far.
fn events(rt: &tokio::runtime::Runtime, c: &ShimClient) -> Vec<Event> {
    rt.block_on(c.events(0, Duration::ZERO))
        .expect("events")
        .events
}

/// One live migration through the API while a 2 ms ping runs; returns the final job, the
/// longest ping gap, and the (suspended, resumed) events.
fn live_migrate(
    rt: &tokio::runtime::Runtime,
    lab: &Lab,
    probe: &TestNetns,
    from: (&ShimProcess, &ShimClient, &str),
    to: (&ShimProcess, &ShimClient, &str),
    token: &str,
) -> (Job, Duration, Event, Event) {
    let lsp = format!("{VM}.node-a");
    let (seq_from, seq_to) = (
        events(rt, from.1).last().map(|e| e.seq).unwrap_or(0),
        events(rt, to.1).last().map(|e| e.seq).unwrap_or(0),
    );
    // the CMS part the migrator will do: the port may live on both chassis, the target's
    // binding activated by the guest's RARP
    set_port_chassis(lab, &lsp, &[from.2, to.2]);
    let pinger = Pinger::start(probe, GUEST_IP, "0.002");
    std::thread::sleep(Duration::from_millis(300));
    let job = rt
        .block_on(from.1.migrate(&migrate_req(to.0, token)))
        .unwrap_or_else(|e| {
            panic!(
                "migrate {} → {}: {e}\n{}",
                from.2,
                to.2,
                from.0.log_tail(20)
            )
        });
    let job = rt
        .block_on(from.1.wait_job(job.id, Duration::from_secs(120)))
        .expect("the migration ends");
    assert_eq!(
        job.state,
        JobState::Completed,
        "{job:?}\n{}\n{}",
        from.0.log_tail(20),
        to.0.log_tail(20)
    );
    wait_until(
        Duration::from_secs(30),
        "the guest to answer after the migration",
        || probe.ping_once(GUEST_IP).then_some(()),
    );
    let (replies, gap) = pinger.stop();
    assert!(replies > 0, "the guest answered ping while migrating");
    set_port_chassis(lab, &lsp, &[to.2]);

    let source_events = rt
        .block_on(from.1.events(seq_from, Duration::ZERO))
        .unwrap()
        .events;
    let pauses: Vec<&Event> = source_events
        .iter()
        .filter(|e| {
            matches!(
                e.kind,
                Lifecycle::SuspendedForMigration | Lifecycle::SuspendedForPostCopy
            )
        })
        .collect();
    // one pause, reported from QEMU's own STOP (ahead of libvirt's suspended event, which the
    // shim then leaves out): the route flip is never held up by libvirt's domain lock
    assert_eq!(
        pauses.len(),
        1,
        "one pause reported on {}: {source_events:?}",
        from.2
    );
    assert_eq!(
        pauses[0].libvirt,
        (roam_vm_shim::sys::QEMU_STOP_EVENT, 0),
        "the pause came from QEMU's STOP: {source_events:?}"
    );
    let suspended = pauses[0].clone();
    let resumed = wait_until(
        Duration::from_secs(10),
        "the resumed-after-migration event on the target",
        || {
            rt.block_on(to.1.events(seq_to, Duration::from_millis(500)))
                .ok()?
                .events
                .into_iter()
                .find(|e| e.kind == Lifecycle::ResumedAfterMigration)
        },
    );
    assert!(
        suspended.at_unix_ns < resumed.at_unix_ns,
        "the source pauses before the target resumes: {suspended:?} {resumed:?}"
    );
    let src = rt.block_on(from.1.status()).unwrap();
    let dst = rt.block_on(to.1.status()).unwrap();
    assert_eq!(dst.domain, DomainState::Running, "{dst:?}");
    assert_eq!(src.domain, DomainState::Absent, "{src:?}");
    assert!(
        job.stats.downtime_ms.is_some(),
        "the final downtime, from the target's completed job: {job:?}"
    );
    println!(
        "{} → {}: job {} ms, libvirt downtime {:?} ms, longest ping gap {:.1} ms ({replies} replies), \
         suspended → resumed {:.1} ms",
        from.2,
        to.2,
        (job.finished_unix_ns.unwrap() - job.started_unix_ns) / 1_000_000,
        job.stats.downtime_ms,
        gap.as_secs_f64() * 1e3,
        (resumed.at_unix_ns - suspended.at_unix_ns) as f64 / 1e6,
    );
    (job, gap, suspended, resumed)
}

#[test]
fn the_shim_boots_guards_restarts_aborts_and_live_migrates_its_vm() {
    let lab = Lab::get();
    let rt = rt();
    let vm = vm(&lab);
    let network = LabNetwork::new(
        &lab,
        NET,
        &[("node-a", TAP), ("node-b", TAP), ("node-b", PROBE_PORT)],
    );
    let cleanup = vm.cleanup(&lab);
    let (spec, nodes, ports) = overlay();
    shim_network(&lab, &spec, &nodes, &ports);
    let probe = TestNetns::new("h7probe");
    plug_netns(
        &lab.node("node-b"),
        &probe,
        PROBE_PORT,
        "h7probe.node-b",
        PROBE_MAC,
        PROBE_IP,
        GW,
    );

    // boot on node-a; node-b waits for an incoming migration
    let mut a = ShimProcess::start(&lab, &vm, "node-a", PORT_A, Mode::Boot);
    let mut b = ShimProcess::start(&lab, &vm, "node-b", PORT_B, Mode::Incoming);
    let ca = ShimClient::new(&a.url, &vm.token).unwrap();
    let cb = ShimClient::new(&b.url, &vm.token).unwrap();
    wait_healthy(&rt, &mut a, &ca);
    wait_healthy(&rt, &mut b, &cb);
    wait_until(
        Duration::from_secs(180),
        "the guest's DHCP lease from OVN (serial log)",
        || {
            let s = vm.serial_text();
            (s.contains(&format!("lease of {GUEST_IP} obtained from {GW}"))
                && s.contains("ROAM-GUEST-SERVICES-UP"))
            .then_some(())
        },
    );
    let serial = vm.serial_text();
    assert!(serial.contains(&format!("inet {GUEST_IP}/32")), "{serial}");
    assert!(
        serial.contains(&format!("default via {GW} dev eth0")),
        "{serial}"
    );
    let st = rt.block_on(ca.status()).unwrap();
    assert_eq!(
        (st.domain, st.node.as_str()),
        (DomainState::Running, "node-a")
    );
    assert_eq!(
        rt.block_on(cb.status()).unwrap().domain,
        DomainState::Absent
    );
    let started = events(&rt, &ca);
    assert!(
        started.iter().any(|e| e.kind == Lifecycle::Started),
        "{started:?}"
    );
    wait_until(
        Duration::from_secs(60),
        "the guest to answer ping from node-b's test namespace",
        || probe.ping_once(GUEST_IP).then_some(()),
    );
    let (dom_id, _) = libvirt_state(&lab, "node-a").expect("the domain on node-a");

    // a wrong token: 401 with a JSON error, and nothing happens
    let wrong = ShimClient::new(&a.url, "not-the-token").unwrap();
    let msg = expect_status(rt.block_on(wrong.status()).unwrap_err(), 401);
    assert!(msg.contains("token"), "{msg}");
    expect_status(
        rt.block_on(wrong.migrate(&migrate_req(&b, &vm.token)))
            .unwrap_err(),
        401,
    );
    expect_status(rt.block_on(wrong.abort()).unwrap_err(), 401);
    let wrong_b = ShimClient::new(&b.url, "not-the-token").unwrap();
    expect_status(rt.block_on(wrong_b.prepare()).unwrap_err(), 401);
    let st = rt.block_on(ca.status()).unwrap();
    assert!(st.job.is_none(), "no job after refused requests: {st:?}");
    let stb = rt.block_on(cb.status()).unwrap();
    assert!(!stb.incoming, "the target was not prepared: {stb:?}");
    // a shim started to receive its VM plumbs the tap at once and reports its port; this
    // port is requested on node-a only, so node-b's ovn-controller does not install it
    // (lab_migration shows the other side: a migration starts its copy only once it is)
    assert_eq!(
        stb.ports,
        vec![PortState {
            port: vm.ovn_port.clone(),
            tap: TAP.into(),
            installed: false,
        }],
        "{stb:?}"
    );
    assert!(rt.block_on(ca.status()).unwrap().ports.is_empty());
    // the raw answer is JSON with a code
    let raw = try_run(
        "curl",
        &[
            "-s",
            "-H",
            "Authorization: Bearer nope",
            &format!("{}/v1/status", a.url),
        ],
    )
    .unwrap();
    assert!(raw.contains("\"code\":\"unauthorized\""), "{raw}");

    // a bad request (400) and an unreachable target (502): the VM stays where it is
    let mut bad = migrate_req(&b, &vm.token);
    bad.max_downtime_ms = Some(0);
    expect_status(rt.block_on(ca.migrate(&bad)).unwrap_err(), 400);
    let mut nowhere = migrate_req(&b, &vm.token);
    nowhere.target = format!("http://{}:17099", lab.node("node-b").ip);
    let msg = expect_status(rt.block_on(ca.migrate(&nowhere)).unwrap_err(), 502);
    println!("unreachable target: {msg}");
    let st = rt.block_on(ca.status()).unwrap();
    assert_eq!(st.domain, DomainState::Running);
    assert_eq!(st.job.as_ref().map(|j| j.state), Some(JobState::Failed));

    // restart the shim: it re-attaches to the same domain (no second domain, no second tap)
    let exit = a.stop().expect("the shim was running");
    assert!(
        exit.success(),
        "graceful shutdown: {exit}\n{}",
        a.log_tail(10)
    );
    assert_eq!(
        libvirt_state(&lab, "node-a"),
        Some((dom_id, true)),
        "the domain keeps running while its shim is down"
    );
    drop(a);
    let mut a = ShimProcess::start(&lab, &vm, "node-a", PORT_A, Mode::Boot);
    wait_healthy(&rt, &mut a, &ca);
    assert_eq!(libvirt_state(&lab, "node-a"), Some((dom_id, true)));
    assert!(a.log_tail(10).contains("re-attached"), "{}", a.log_tail(10));
    assert_eq!(
        rt.block_on(ca.status()).unwrap().domain,
        DomainState::Running
    );
    assert!(probe.ping_once(GUEST_IP), "the guest still answers");

    // a slow migration (1 MiB/s): a second one is refused (409), an abort leaves the VM on
    // node-a
    let mut slow = migrate_req(&b, &vm.token);
    slow.bandwidth_mib_s = Some(1);
    let job = rt
        .block_on(ca.migrate(&slow))
        .expect("start a slow migration");
    wait_until(
        Duration::from_secs(30),
        "the slow migration to move data",
        || {
            let j = rt.block_on(ca.progress()).ok()?;
            assert!(!j.state.is_final(), "ended early: {j:?}");
            (j.stats.data_processed.unwrap_or(0) > 0).then_some(j)
        },
    );
    let msg = expect_status(
        rt.block_on(ca.migrate(&migrate_req(&b, &vm.token)))
            .unwrap_err(),
        409,
    );
    println!("second migration: {msg}");
    rt.block_on(ca.abort()).expect("abort");
    let aborted = rt
        .block_on(ca.wait_job(job.id, Duration::from_secs(60)))
        .unwrap();
    assert_eq!(aborted.state, JobState::Aborted, "{aborted:?}");
    println!(
        "aborted after {:?} of {:?} bytes: {:?}",
        aborted.stats.data_processed, aborted.stats.data_total, aborted.error
    );
    assert_eq!(libvirt_state(&lab, "node-a"), Some((dom_id, true)));
    wait_until(
        Duration::from_secs(30),
        "node-b's incoming domain to go",
        || (!libvirt_state(&lab, "node-b").is_some_and(|(_, active)| active)).then_some(()),
    );
    assert_eq!(
        rt.block_on(ca.status()).unwrap().domain,
        DomainState::Running
    );
    assert!(probe.ping_once(GUEST_IP), "the guest answers on node-a");
    expect_status(rt.block_on(ca.abort()).unwrap_err(), 409);

    // live migration node-a → node-b → node-a through the API, under a 2 ms ping
    live_migrate(
        &rt,
        &lab,
        &probe,
        (&a, &ca, "node-a"),
        (&b, &cb, "node-b"),
        &vm.token,
    );

    // the VM is on node-b now: node-b cannot prepare for it, node-a cannot migrate it (409)
    let msg = expect_status(rt.block_on(cb.prepare()).unwrap_err(), 409);
    assert!(msg.contains("already on node node-b"), "{msg}");
    let msg = expect_status(
        rt.block_on(ca.migrate(&migrate_req(&b, &vm.token)))
            .unwrap_err(),
        409,
    );
    assert!(msg.contains("does not run on node node-a"), "{msg}");

    // node-a's shim crashes after the switchover and comes back in boot mode: its state file
    // says it booted the VM once, so it does not boot a second copy; it can receive the VM
    a.kill();
    drop(a);
    let mut a = ShimProcess::start(&lab, &vm, "node-a", PORT_A, Mode::Boot);
    wait_healthy(&rt, &mut a, &ca);
    assert_eq!(
        rt.block_on(ca.status()).unwrap().domain,
        DomainState::Absent
    );
    assert!(
        libvirt_state(&lab, "node-a").is_none(),
        "no second domain on node-a"
    );
    assert!(
        a.log_tail(10).contains("not booting it again"),
        "{}",
        a.log_tail(10)
    );
    // node-b's shim crashes while it owns the VM: the VM runs on; the new shim re-attaches
    let (b_id, _) = libvirt_state(&lab, "node-b").expect("the domain on node-b");
    b.kill();
    drop(b);
    assert!(
        probe.ping_once(GUEST_IP),
        "the VM runs while its shim is dead"
    );
    let mut b = ShimProcess::start(&lab, &vm, "node-b", PORT_B, Mode::Incoming);
    wait_healthy(&rt, &mut b, &cb);
    assert_eq!(libvirt_state(&lab, "node-b"), Some((b_id, true)));
    assert!(b.log_tail(10).contains("re-attached"), "{}", b.log_tail(10));

    live_migrate(
        &rt,
        &lab,
        &probe,
        (&b, &cb, "node-b"),
        (&a, &ca, "node-a"),
        &vm.token,
    );
    let st = rt.block_on(ca.status()).unwrap();
    assert_eq!(st.domain, DomainState::Running);
    assert!(
        probe.ping_once(GUEST_IP),
        "the guest answers back on node-a"
    );
    assert_eq!(
        vm.serial_text().matches("ROAM-GUEST-SERVICES-UP").count(),
        1,
        "the guest never rebooted"
    );

    // the timeout: a migration too slow for it is aborted at the deadline; the VM stays
    let mut slow = migrate_req(&b, &vm.token);
    slow.bandwidth_mib_s = Some(1);
    slow.timeout_s = Some(2);
    let job = rt
        .block_on(ca.migrate(&slow))
        .expect("start a slow migration");
    let job = rt
        .block_on(ca.wait_job(job.id, Duration::from_secs(60)))
        .unwrap();
    assert_eq!(job.state, JobState::Aborted, "{job:?}");
    let why = job.error.unwrap_or_default();
    assert!(why.contains("timed out after 2 s"), "{why}");
    assert_eq!(
        rt.block_on(ca.status()).unwrap().domain,
        DomainState::Running
    );

    // post-copy allowed (with auto-converge and a max downtime): at the deadline the shim
    // switches to post-copy and the migration completes on node-b; then back to node-a
    let lsp = format!("{VM}.node-a");
    set_port_chassis(&lab, &lsp, &["node-a", "node-b"]);
    let seq = events(&rt, &ca).last().map(|e| e.seq).unwrap_or(0);
    let mut pc = slow.clone();
    pc.post_copy = true;
    pc.auto_converge = true;
    pc.max_downtime_ms = Some(100);
    let job = rt
        .block_on(ca.migrate(&pc))
        .expect("start a post-copy migration");
    let job = rt
        .block_on(ca.wait_job(job.id, Duration::from_secs(120)))
        .unwrap();
    assert_eq!(
        job.state,
        JobState::Completed,
        "{job:?}\n{}",
        a.log_tail(20)
    );
    set_port_chassis(&lab, &lsp, &["node-b"]);
    let source_events = rt.block_on(ca.events(seq, Duration::ZERO)).unwrap().events;
    let kinds: Vec<Lifecycle> = source_events.iter().map(|e| e.kind).collect();
    assert!(
        kinds.contains(&Lifecycle::SuspendedForPostCopy),
        "the source paused for post-copy: {source_events:?}\n{}",
        a.log_tail(30)
    );
    println!("post-copy: source events {kinds:?}, stats {:?}", job.stats);
    wait_until(Duration::from_secs(30), "the guest on node-b", || {
        probe.ping_once(GUEST_IP).then_some(())
    });
    live_migrate(
        &rt,
        &lab,
        &probe,
        (&b, &cb, "node-b"),
        (&a, &ca, "node-a"),
        &vm.token,
    );

    // the source shim dies mid-migration (SIGKILL): the source libvirtd drives the
    // peer-to-peer migration to its end; the restarted shim does not boot a second copy
    set_port_chassis(&lab, &lsp, &["node-a", "node-b"]);
    let mut medium = migrate_req(&b, &vm.token);
    medium.bandwidth_mib_s = Some(10);
    rt.block_on(ca.migrate(&medium)).expect("start a migration");
    wait_until(
        Duration::from_secs(30),
        "the migration to move data",
        || {
            let j = rt.block_on(ca.progress()).ok()?;
            (j.stats.data_processed.unwrap_or(0) > 0).then_some(())
        },
    );
    a.kill();
    drop(a);
    wait_until(
        Duration::from_secs(120),
        "the migration to complete without its shim",
        || {
            rt.block_on(cb.status())
                .ok()
                .filter(|s| s.domain == DomainState::Running)
        },
    );
    set_port_chassis(&lab, &lsp, &["node-b"]);
    let mut a = ShimProcess::start(&lab, &vm, "node-a", PORT_A, Mode::Boot);
    wait_healthy(&rt, &mut a, &ca);
    assert_eq!(
        rt.block_on(ca.status()).unwrap().domain,
        DomainState::Absent
    );
    live_migrate(
        &rt,
        &lab,
        &probe,
        (&b, &cb, "node-b"),
        (&a, &ca, "node-a"),
        &vm.token,
    );
    assert_eq!(
        vm.serial_text().matches("ROAM-GUEST-SERVICES-UP").count(),
        1,
        "the guest never rebooted"
    );

    // the source shim after a switchover stops cleanly and takes its tap and OVS port along;
    // the VM's shim stops and leaves its VM running
    let node_b = lab.node("node-b");
    assert!(b.stop().expect("running").success(), "{}", b.log_tail(10));
    assert!(
        try_run("ip", &["-n", &node_b.netns, "link", "show", TAP]).is_err(),
        "node-b's tap is gone"
    );
    let ports = roam_e2e::vsctl(&node_b, &["list-ports", "br-int"]);
    assert!(
        !ports.lines().any(|p| p == TAP),
        "node-b's OVS port is gone"
    );
    assert!(a.stop().expect("running").success(), "{}", a.log_tail(10));
    assert!(
        libvirt_state(&lab, "node-a").is_some_and(|(_, active)| active),
        "the VM keeps running without its shim"
    );
    assert!(probe.ping_once(GUEST_IP));

    // the emulator dies (SIGKILL to QEMU): the re-attached shim reports it and sees no domain
    let mut a = ShimProcess::start(&lab, &vm, "node-a", PORT_A, Mode::Boot);
    wait_healthy(&rt, &mut a, &ca);
    let seq = events(&rt, &ca).last().map(|e| e.seq).unwrap_or(0);
    // QEMU runs in the test libvirtd's pod (its pid file holds the pod's pid): found by its
    // `-name guest=<domain>` among the host's processes
    let qemu = qemu_pids(VM);
    assert_eq!(qemu.len(), 1, "one QEMU of {VM}: {qemu:?}");
    try_run("kill", &["-9", &qemu[0]]).expect("kill QEMU");
    let died = wait_until(
        Duration::from_secs(30),
        "the shim to report QEMU's death",
        || {
            rt.block_on(ca.events(seq, Duration::from_millis(500)))
                .ok()?
                .events
                .into_iter()
                .find(|e| matches!(e.kind, Lifecycle::Failed | Lifecycle::Crashed))
        },
    );
    println!("QEMU killed: {:?} (libvirt {:?})", died.kind, died.libvirt);
    assert_eq!(
        rt.block_on(ca.status()).unwrap().domain,
        DomainState::Absent
    );

    drop((a, b));
    drop(probe);
    drop(cleanup);
    drop(network);
}

#[test]
fn a_bad_spec_is_a_clear_error_and_creates_nothing() {
    let lab = Lab::get();
    let mut vm = vm(&lab);
    vm.name = "h7bad".into();
    vm.tap = "h7bad0".into();
    vm.ovn_port = "h7bad.node-a".into();
    vm.dir = lab.dir().join("h7").join("bad");
    let _cleanup = vm.cleanup(&lab);
    let base = ShimProcess::args(&lab, &vm, "node-a", 17010, Mode::Boot);
    let with = |key: &str, value: &str| -> Vec<String> {
        let mut args = base.clone();
        let i = args.iter().position(|a| a == key).expect("a known flag");
        args[i + 1] = value.into();
        args
    };
    let cases = [
        (
            with(flag::KERNEL, "/nonexistent/vmlinuz"),
            "kernel /nonexistent/vmlinuz does not exist",
        ),
        (with(flag::VCPUS, "0"), "0 vCPUs: use 1 to 255"),
        (with(flag::MEMORY_MIB, "4"), "4 MiB of memory: use 32 to"),
        (with(flag::MEMORY_MIB, "lots"), "not a number"),
    ];
    for (args, expect) in cases {
        let out = node_command(&lab, "node-a", roam_e2e::shim_binary().to_str().unwrap())
            .args(&args)
            .output()
            .expect("run roam-shim");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{expect}: roam-shim must fail");
        assert!(stderr.contains(expect), "{stderr:?} should say {expect:?}");
        assert!(libvirt_state_named(&lab, "h7bad").is_none(), "no domain");
        assert!(
            try_run(
                "ip",
                &["-n", &lab.node("node-a").netns, "link", "show", "h7bad0"]
            )
            .is_err(),
            "no tap"
        );
        let ports = roam_e2e::vsctl(&lab.node("node-a"), &["list-ports", "br-int"]);
        assert!(!ports.lines().any(|p| p == "h7bad0"), "no OVS port");
        assert!(!vm.dir.join("node-a.state.json").exists(), "no state file");
    }
}

fn libvirt_state_named(lab: &Lab, name: &str) -> Option<bool> {
    virt::error::clear_error_callback();
    let conn = Connect::open(Some(&lab.test_libvirt("node-a").uri)).expect("connect");
    conn.lookup_domain_by_name(name)
        .ok()
        .map(|d| d.is_active().unwrap_or(false))
}

/// The host pids of the QEMU processes running domain `name`.
fn qemu_pids(name: &str) -> Vec<String> {
    let marker = format!("guest={name},");
    std::fs::read_dir("/proc")
        .expect("read /proc")
        .flatten()
        .filter(|e| {
            let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
            let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
            comm.starts_with("qemu-system") && String::from_utf8_lossy(&cmd).contains(&marker)
        })
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

/// The shim plumbs a port whose `iface-id` a leftover interface on the node still carries
/// (a deleted VM's OVS port, say): the leftover's OVS port goes, so that the node's
/// ovn-controller has one interface to bind the OVN port to — on a real node's OVS.
#[test]
fn a_leftover_interface_with_the_ports_iface_id_is_removed_from_the_bridge() {
    let lab = Lab::get();
    let node = lab.node(&lab.nodes()[0]);
    let db = format!("--db={}", node.ovs_db);
    let (stale, fresh, other, iface) = ("h7stale0", "h7fresh0", "h7other0", "h7-leftover-port");
    let clean = || {
        for p in [stale, fresh, other] {
            let _ = try_run("ovs-vsctl", &[&db, "--if-exists", "del-port", "br-int", p]);
        }
    };
    clean();
    struct Clean<F: Fn()>(F);
    impl<F: Fn()> Drop for Clean<F> {
        fn drop(&mut self) {
            (self.0)()
        }
    }
    let _clean = Clean(clean);
    for (p, id) in [(stale, iface), (other, "h7-another-port")] {
        try_run(
            "ovs-vsctl",
            &[
                &db,
                "add-port",
                "br-int",
                p,
                "--",
                "set",
                "Interface",
                p,
                "type=internal",
                &format!("external_ids:iface-id={id}"),
            ],
        )
        .expect("a leftover port");
    }
    let ovs_db = node.ovs_db.clone();
    rt().block_on(roam_vm_shim::net::ensure_ovs_port(
        &ovs_db, "br-int", fresh, iface,
    ))
    .expect("plumbed");
    let ports = try_run("ovs-vsctl", &[&db, "list-ports", "br-int"]).expect("ports");
    let ports: Vec<&str> = ports.lines().collect();
    assert!(ports.contains(&fresh), "{ports:?}");
    assert!(
        !ports.contains(&stale),
        "the leftover is still there: {ports:?}"
    );
    assert!(
        ports.contains(&other),
        "a port of another iface-id was touched: {ports:?}"
    );
    let id = try_run(
        "ovs-vsctl",
        &[&db, "get", "Interface", fresh, "external_ids:iface-id"],
    )
    .expect("iface-id");
    assert_eq!(id.trim().trim_matches('"'), iface);
}
