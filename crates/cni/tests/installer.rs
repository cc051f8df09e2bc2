//! The node installer (`deploy/cni/install.sh`, run by the DaemonSet) against a scratch host
//! root: it installs the plugin, a kubeconfig roam-cni can load, and a conflist whose plugin
//! configuration roam-cni accepts for every command; without a ServiceAccount it refuses.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use roam_cni::config::{Command as Cni, parse_conf};
use serde_json::Value;

struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let d =
            std::env::temp_dir().join(format!("roam-cni-installer-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        for sub in ["host/opt/cni/bin", "host/etc/cni/net.d", "sa"] {
            std::fs::create_dir_all(d.join(sub)).unwrap();
        }
        Scratch(d)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `install.sh ARG` against the scratch host root `dir`, with nothing of the environment
/// but what a DaemonSet pod would have.
fn script(dir: &Path, arg: &str) -> Command {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/cni/install.sh");
    let mut c = Command::new("sh");
    c.arg(script)
        .arg(arg)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("ROAM_CNI_HOST_ROOT", dir.join("host"))
        .env("ROAM_CNI_BINARY", env!("CARGO_BIN_EXE_roam-cni"))
        .env("ROAM_CNI_SA_DIR", dir.join("sa"))
        .env("KUBERNETES_SERVICE_HOST", "10.96.0.1")
        .env("KUBERNETES_SERVICE_PORT", "443");
    c
}

fn install(dir: &Path) -> std::process::Output {
    script(dir, "--once")
        .env("ROAM_CNI_ANNOTATION_TIMEOUT", "12")
        .output()
        .expect("run install.sh")
}

#[test]
fn the_installer_writes_what_the_plugin_loads() {
    let s = Scratch::new("ok");
    std::fs::write(s.0.join("sa/token"), "tok-123").unwrap();
    std::fs::write(
        s.0.join("sa/ca.crt"),
        "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    let out = install(&s.0);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let bin = s.0.join("host/opt/cni/bin/roam-cni");
    let mode = std::fs::metadata(&bin).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o755);
    let v = Command::new(&bin)
        .env_clear()
        .env("CNI_COMMAND", "VERSION")
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&v.stdout).unwrap();
    assert_eq!(v["cniVersion"], "1.1.0");

    let kc_path = s.0.join("host/etc/cni/net.d/roam-cni.kubeconfig");
    let mode = std::fs::metadata(&kc_path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "the token is a secret");
    let kc = kube::config::Kubeconfig::read_from(&kc_path).expect("a kubeconfig kube-rs loads");
    let cluster = kc.clusters[0].cluster.as_ref().unwrap();
    assert_eq!(cluster.server.as_deref(), Some("https://10.96.0.1:443"));
    assert!(cluster.certificate_authority_data.is_some());
    let user = kc.auth_infos[0].auth_info.as_ref().unwrap();
    assert!(user.token.is_some(), "a token");
    let text = std::fs::read_to_string(&kc_path).unwrap();
    assert!(text.contains("token: tok-123"), "{text}");

    // the runtime hands each plugin its entry of the list, with the list's name and version
    let list: Value = serde_json::from_slice(
        &std::fs::read(s.0.join("host/etc/cni/net.d/00-roam.conflist")).unwrap(),
    )
    .unwrap();
    assert_eq!(list["cniVersion"], "1.0.0");
    assert_eq!(list["plugins"].as_array().unwrap().len(), 1);
    let mut plugin = list["plugins"][0].clone();
    plugin["name"] = list["name"].clone();
    plugin["cniVersion"] = Value::from("1.1.0");
    plugin["cni.dev/valid-attachments"] = serde_json::json!([]);
    for cmd in [Cni::Add, Cni::Del, Cni::Status, Cni::Gc] {
        let c = parse_conf(cmd, plugin.to_string().as_bytes())
            .unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
        assert_eq!(c.name, "roam");
        assert_eq!(
            c.kubeconfig.as_deref(),
            Some(Path::new("/etc/cni/net.d/roam-cni.kubeconfig"))
        );
        assert_eq!(c.ovs_db, "unix:/run/openvswitch/db.sock");
        assert_eq!(c.bridge, "br-int");
        assert_eq!(c.annotation_timeout.as_secs(), 12);
    }
    // nothing half-written is left beside the files
    for d in ["host/opt/cni/bin", "host/etc/cni/net.d"] {
        for f in std::fs::read_dir(s.0.join(d)).unwrap().flatten() {
            assert!(
                !f.file_name().to_string_lossy().ends_with(".tmp"),
                "{:?}",
                f.path()
            );
        }
    }
}

#[test]
fn the_installer_refuses_without_a_service_account() {
    let s = Scratch::new("nosa");
    let out = install(&s.0);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no ServiceAccount token"), "{err}");
    assert!(!s.0.join("host/etc/cni/net.d/00-roam.conflist").exists());
    assert!(!s.0.join("host/opt/cni/bin/roam-cni").exists());
}

/// `install.sh --check` (the DaemonSet's readiness probe) with `ovs_db`: its status and
/// stdout.
fn check(dir: &Path, ovs_db: &str) -> (bool, String) {
    let out = script(dir, "--check")
        .env("ROAM_CNI_OVS_DB", ovs_db)
        .output()
        .expect("run install.sh --check");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// A real `ovsdb-server` with the Open_vSwitch schema and `bridges`, killed on drop.
struct Ovs {
    child: std::process::Child,
    sock: PathBuf,
}

impl Ovs {
    fn start(dir: &Path, bridges: &[&str]) -> Ovs {
        let db = dir.join("conf.db");
        let ok = Command::new("ovsdb-tool")
            .arg("create")
            .arg(&db)
            .arg("/usr/share/openvswitch/vswitch.ovsschema")
            .status()
            .expect("run ovsdb-tool (is openvswitch installed?)");
        assert!(ok.success(), "ovsdb-tool create");
        let sock = dir.join("db.sock");
        let child = Command::new("ovsdb-server")
            .arg(format!("--remote=punix:{}", sock.display()))
            .arg(format!("--unixctl={}", dir.join("ctl").display()))
            .arg("--no-chdir")
            .arg(&db)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start ovsdb-server (is openvswitch installed?)");
        let ovs = Ovs { child, sock };
        let db_arg = format!("--db=unix:{}", ovs.sock.display());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let r = Command::new("ovs-vsctl")
                .args([db_arg.as_str(), "--no-wait", "--timeout=5", "init"])
                .output()
                .expect("run ovs-vsctl");
            if r.status.success() {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "ovsdb-server did not answer: {}",
                String::from_utf8_lossy(&r.stderr)
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        for b in bridges {
            let r = Command::new("ovs-vsctl")
                .args([db_arg.as_str(), "--no-wait", "add-br", b])
                .output()
                .expect("run ovs-vsctl");
            assert!(r.status.success(), "add-br {b}: {r:?}");
        }
        ovs
    }
}

impl Drop for Ovs {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The readiness probe passes only on a node whose OVS answers and has the bridge, and says
/// what is missing otherwise.
#[test]
fn the_readiness_check_asks_the_plugin_about_the_nodes_ovs() {
    let s = Scratch::new("check");
    let (ready, out) = check(&s.0, "unix:/nonexistent/roam/db.sock");
    assert!(!ready, "{out}");
    assert!(
        out.starts_with("roam-cni cannot plug pods on this node: ")
            && out.contains(
                "cannot reach the node's Open_vSwitch database at unix:/nonexistent/roam/db.sock"
            )
            && out.contains("is Open vSwitch with ovn-controller running here?"),
        "{out}"
    );

    let no_bridge = Ovs::start(&s.0, &[]);
    let db = format!("unix:{}", no_bridge.sock.display());
    let (ready, out) = check(&s.0, &db);
    assert!(!ready, "{out}");
    assert!(out.contains("br-int"), "the missing bridge is named: {out}");
    drop(no_bridge);

    let dir = s.0.join("ovs2");
    std::fs::create_dir_all(&dir).unwrap();
    let ovs = Ovs::start(&dir, &["br-int"]);
    let (ready, out) = check(&s.0, &format!("unix:{}", ovs.sock.display()));
    assert!(ready, "a node with OVS and br-int is ready: {out}");
}
