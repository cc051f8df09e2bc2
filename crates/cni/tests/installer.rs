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

fn install(dir: &Path) -> std::process::Output {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/cni/install.sh");
    Command::new("sh")
        .arg(script)
        .arg("--once")
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("ROAM_CNI_HOST_ROOT", dir.join("host"))
        .env("ROAM_CNI_BINARY", env!("CARGO_BIN_EXE_roam-cni"))
        .env("ROAM_CNI_SA_DIR", dir.join("sa"))
        .env("KUBERNETES_SERVICE_HOST", "10.96.0.1")
        .env("KUBERNETES_SERVICE_PORT", "443")
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
