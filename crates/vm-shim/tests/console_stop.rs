//! `roam-shim console` ends on SIGTERM even as its container's PID 1 (an unprivileged
//! launcher pod's console container has no shared process namespace): the kernel does not
//! deliver a signal to a PID 1 without a handler for it, so the kubelet used to wait out the
//! pod's grace period (30 s) on every VM deletion. Needs root (a PID namespace).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn the_console_as_pid_1_ends_on_sigterm() {
    assert!(
        std::os::unix::fs::MetadataExt::uid(&std::fs::metadata("/proc/self").unwrap()) == 0,
        "this test makes a PID namespace: run it as root (CI does)"
    );
    let dir = std::env::temp_dir().join(format!("roam-console-stop-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let serial = dir.join("serial.log");
    std::fs::write(&serial, "an earlier line\n").unwrap();
    // unshare forks the console into a new PID namespace, where it is PID 1
    let mut unshare = Command::new("unshare")
        .args(["--pid", "--fork", "--kill-child"])
        .arg(env!("CARGO_BIN_EXE_roam-shim"))
        .args(["console", "--file"])
        .arg(&serial)
        .stdout(Stdio::null())
        .spawn()
        .expect("unshare (util-linux)");
    let children = format!("/proc/{0}/task/{0}/children", unshare.id());
    let until = Instant::now() + Duration::from_secs(30);
    let console = loop {
        let c = std::fs::read_to_string(&children).unwrap_or_default();
        if let Some(pid) = c.split_whitespace().next() {
            break pid.parse::<i32>().unwrap();
        }
        assert!(Instant::now() < until, "no console process under unshare");
        std::thread::sleep(Duration::from_millis(50));
    };
    // it runs, and follows (its handlers are set before it reads; give it that moment)
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        unshare.try_wait().unwrap().is_none(),
        "the console exited early"
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(console),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let until = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = unshare.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > until {
            let _ = unshare.kill();
            panic!("the console, PID 1 of its namespace, did not end on SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "a clean exit on SIGTERM: {status}");
    let _ = std::fs::remove_dir_all(&dir);
}
