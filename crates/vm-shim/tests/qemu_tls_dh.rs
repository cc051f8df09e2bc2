//! The migration TLS directory `roam-shim libvirtd` lays out is one a real QEMU loads as the
//! incoming side of a migration (`tls-creds-x509`, endpoint server: what libvirt adds to the
//! target QEMU for `VIR_MIGRATE_TLS`), and QEMU takes its Diffie-Hellman group from it
//! instead of generating one — a prime search of 0.1–0.5 s that every migration's target
//! spent before the group was there. Needs `qemu-system-x86_64` (CI installs it for the lab).

use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime};

use roam_vm_shim::libvirtd::{self, CA_CERT, NODE_CERT, NODE_KEY, QEMU_PKI};

/// Start QEMU with nothing but the migration's server credentials from `dir`, quit at once,
/// and return what it printed (its `qcrypto_tls_creds_load_dh` trace names the DH file, or
/// `<generated>`).
fn qemu_loads_server_creds(dir: &std::path::Path) -> String {
    let mut qemu = Command::new("qemu-system-x86_64")
        .args(["-machine", "none", "-nodefaults", "-display", "none"])
        .args(["-monitor", "stdio", "-trace", "qcrypto_tls_creds_load_dh"])
        .arg("-object")
        .arg(format!(
            "tls-creds-x509,id=migrate-tls,endpoint=server,verify-peer=on,dir={}",
            dir.display()
        ))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("qemu-system-x86_64 (e2e/labkit/deps.sh installs it)");
    use std::io::Write;
    // the monitor reads "quit" once the object is made; a refused object ends QEMU first
    let _ = qemu.stdin.take().unwrap().write_all(b"quit\n");
    let out = qemu.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "QEMU refused the credentials: {text}");
    text
}

#[test]
fn qemu_takes_the_migration_tls_dir_and_its_dh_group() {
    let run = std::env::temp_dir().join(format!("roam-qemu-tls-dh-{}", std::process::id()));
    let pki = run.join("node-pki");
    std::fs::create_dir_all(&pki).unwrap();
    let now = SystemTime::now();
    let day = Duration::from_secs(86_400);
    let ca = roam_pki::Ca::generate(now, day).unwrap();
    let node = roam_pki::NodeFacts {
        name: "node-a".into(),
        addresses: vec!["10.0.0.11".parse().unwrap()],
    };
    let (key, cert) = roam_pki::node_identity(&ca, &node, now, day).unwrap();
    std::fs::write(pki.join(NODE_KEY), key).unwrap();
    std::fs::write(pki.join(NODE_CERT), cert).unwrap();
    std::fs::write(pki.join(CA_CERT), ca.cert_pem()).unwrap();
    libvirtd::link_tls(&run, &pki).unwrap();
    let dir = run.join(QEMU_PKI);

    let with_group = qemu_loads_server_creds(&dir);
    let dh_file = dir.join("dh-params.pem");
    assert!(
        with_group.contains(&format!("filename={}", dh_file.display())),
        "QEMU did not load the bundled group: {with_group}"
    );

    // without the file QEMU generates a group itself: what the test guards against
    std::fs::remove_file(&dh_file).unwrap();
    let without = qemu_loads_server_creds(&dir);
    assert!(
        without.contains("filename=<generated>"),
        "expected QEMU to generate DH parameters without the file: {without}"
    );
    let _ = std::fs::remove_dir_all(&run);
}
