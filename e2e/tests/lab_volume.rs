//! A VM that boots from a PersistentVolumeClaim of its namespace (`boot.volume`), through the
//! installed roam: a local PersistentVolume on node-a (a directory of node-a's own) bound to
//! a claim holding a raw disk image. A VM whose claim does not exist waits (Pending,
//! `VolumeNotReady`, an Event) with nothing created; one on the bound claim runs, its QEMU
//! opening the image through the launcher pod's mount of the claim and no host directory of
//! images; its migration is refused (the claim is not ReadWriteMany: the disk cannot follow);
//! an image file that is a symbolic link out of the volume is refused by the shim; QEMU opens
//! the checked image where the runner pinned it; and every image that would make QEMU open
//! another file is refused before QEMU starts. A VM booting from a disk of the image store
//! opens it read-only and migrates.

use std::time::Duration;

use roam_e2e::{Installed, Lab, VmCleanup, apply_crds, kubectl, try_kubectl, wait_until};
use serde_json::{Value, json};

const NS: &str = "p10-vol";
const NET: &str = "p10vol";
const PV: &str = "p10-disk";
const CLAIM: &str = "p10-disk";
/// The PersistentVolume's directory on node-a (node-a's own /var/lib/roam).
const PV_DIR: &str = "/var/lib/roam/test-volumes/p10-disk";
const LONG: Duration = Duration::from_secs(180);

fn get(lab: &Lab, args: &[&str]) -> Option<Value> {
    let mut all = args.to_vec();
    all.extend_from_slice(&["-o", "json"]);
    serde_json::from_str(&try_kubectl(lab, &all).ok()?).ok()
}

fn vm(name: &str, claim: &str, file: &str) -> Value {
    json!({"apiVersion": "roam.dev/v1alpha1", "kind": "VirtualMachine",
           "metadata": {"name": name, "namespace": NS},
           "spec": {"cpu": 1, "memoryMiB": 128, "node": "node-a",
                    "boot": {"volume": {"claimName": claim, "file": file, "format": "raw"}}}})
}

/// VM `name`'s phase and the message of its condition `kind` if that has `reason`.
fn condition(lab: &Lab, name: &str, kind: &str, reason: &str) -> Option<(String, String)> {
    let v = get(lab, &["-n", NS, "get", "vm", name])?;
    let c = v["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind && c["reason"] == reason)?
        .clone();
    Some((
        v["status"]["phase"].as_str()?.to_string(),
        c["message"].as_str()?.to_string(),
    ))
}

/// Removes the PersistentVolume, its claim and its directory, also after a failure.
struct VolumeBack<'a>(&'a Lab);

impl Drop for VolumeBack<'_> {
    fn drop(&mut self) {
        let _ = try_kubectl(
            self.0,
            &[
                "-n",
                NS,
                "delete",
                "pvc",
                CLAIM,
                "--ignore-not-found",
                "--wait=false",
            ],
        );
        let _ = try_kubectl(
            self.0,
            &["delete", "pv", PV, "--ignore-not-found", "--wait=false"],
        );
        let _ = std::fs::remove_dir_all(self.0.node_path("node-a", PV_DIR));
    }
}

/// Whether a QEMU process on this machine opens `file` (its command line names it).
fn qemu_opens(file: &str) -> bool {
    !qemus_with(file).is_empty()
}

/// The QEMU processes (on every node) whose command line holds `text`.
fn qemu_pids(text: &str) -> Vec<u32> {
    roam_e2e::qemu_processes(text)
        .into_iter()
        .map(|(pid, _)| pid)
        .collect()
}

fn qemu_img(args: &[&str]) {
    let out = std::process::Command::new("qemu-img")
        .args(args)
        .output()
        .expect("qemu-img (package qemu-utils, installed by e2e/labkit/deps.sh)");
    assert!(
        out.status.success(),
        "qemu-img {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A tenant's tricks with its own volume, each a VM of its own: a qcow2 image over a host
/// file or a device, one whose data is in an external file, a raw image posing as qcow2, a
/// qcow2 image declared raw, a disk of a petabyte. Each VM's runner refuses the image before
/// libvirtd starts: the VM's condition names the trick, an Event says so, no QEMU of it runs
/// and no QEMU anywhere opens the file it names.
fn every_image_that_names_another_file_is_refused(lab: &Lab, dir: &std::path::Path) {
    let p = |n: &str| dir.join(n).display().to_string();
    qemu_img(&[
        "create",
        "-q",
        "-u",
        "-f",
        "qcow2",
        "-b",
        "/etc/hostname",
        "-F",
        "raw",
        &p("backing.qcow2"),
        "64M",
    ]);
    qemu_img(&[
        "create",
        "-q",
        "-u",
        "-f",
        "qcow2",
        "-b",
        "/dev/vda",
        "-F",
        "raw",
        &p("device.qcow2"),
        "64M",
    ]);
    std::fs::write(dir.join("data.raw"), b"").unwrap();
    qemu_img(&[
        "create",
        "-q",
        "-f",
        "qcow2",
        "-o",
        &format!("data_file={},data_file_raw=on", p("data.raw")),
        &p("datafile.qcow2"),
        "64M",
    ]);
    qemu_img(&["create", "-q", "-f", "raw", &p("posing.qcow2"), "1M"]);
    qemu_img(&["create", "-q", "-f", "qcow2", &p("real.qcow2"), "1M"]);
    qemu_img(&[
        "create",
        "-q",
        "-f",
        "qcow2",
        "-o",
        "cluster_size=2M",
        &p("huge.qcow2"),
        "1P",
    ]);
    let tricks = [
        (
            "p10vm5",
            "backing.qcow2",
            "qcow2",
            "backing file \"/etc/hostname\"",
        ),
        (
            "p10vm6",
            "device.qcow2",
            "qcow2",
            "backing file \"/dev/vda\"",
        ),
        ("p10vm7", "datafile.qcow2", "qcow2", "external file"),
        (
            "p10vm8",
            "posing.qcow2",
            "qcow2",
            "declared qcow2 but holds raw data",
        ),
        (
            "p10vm9",
            "real.qcow2",
            "raw",
            "declared raw but holds a qcow2",
        ),
        (
            "p10vm10",
            "huge.qcow2",
            "qcow2",
            "virtual size of 1125899906842624 bytes",
        ),
    ];
    for (name, file, format, _) in tricks {
        let mut v = vm(name, CLAIM, file);
        v["spec"]["boot"]["volume"]["format"] = json!(format);
        roam_e2e::kubectl_manifest(lab, "create", &v).expect("create a VM");
    }
    for (name, file, _, says) in tricks {
        let (phase, msg) = wait_until(LONG, &format!("{name}'s image {file} refused"), || {
            condition(lab, name, "Ready", "LauncherFailing").filter(|(_, m)| m.contains(says))
        });
        assert_ne!(phase, "Running", "{name}");
        assert!(msg.contains(file), "{name}: {msg}");
        roam_e2e::wait_for_event(lab, LONG, NS, "LauncherFailing", name);
        assert_eq!(
            qemu_pids(&format!("guest={NS}_{name}")),
            Vec::<u32>::new(),
            "{name}"
        );
    }
    for host_file in ["/etc/hostname", "/dev/vda", "data.raw"] {
        assert!(!qemu_opens(host_file), "a QEMU opens {host_file}");
    }
    let names: Vec<&str> = tricks.iter().map(|t| t.0).collect();
    kubectl(lab, &[&["-n", NS, "delete", "vm"][..], &names].concat());
    for n in names {
        wait_until(LONG, &format!("{n} gone"), || {
            try_kubectl(lab, &["-n", NS, "get", "vm", n])
                .is_err()
                .then_some(())
        });
    }
}

/// The command lines of the QEMUs (on every node) that name `file`.
fn qemus_with(file: &str) -> Vec<String> {
    roam_e2e::qemu_processes(file)
        .into_iter()
        .map(|(_, c)| c)
        .collect()
}

#[test]
fn a_vm_boots_from_its_namespaces_volume_and_only_from_inside_it() {
    let lab = Lab::get();
    // dropped last: the VMs (and their pods, which use the claim) go first
    let _volume = VolumeBack(&lab);
    let mut cleanup = VmCleanup::new(&lab).namespace(NS).network(NET);
    for name in [
        "p10vm1", "p10vm2", "p10vm3", "p10vm4", "p10vm5", "p10vm6", "p10vm7", "p10vm8", "p10vm9",
        "p10vm10",
    ] {
        let tap = roam_core::vm::tap_name(&format!("{NS}/{name}"));
        cleanup = cleanup.vm(&format!("{NS}_{name}"), &[&tap]);
    }
    let _cleanup = cleanup.cleaned();
    apply_crds(&lab);
    let ctl = Installed::get(&lab);
    kubectl(&lab, &["create", "namespace", NS]);
    let net = json!({"apiVersion": "roam.dev/v1alpha1", "kind": "Network",
        "metadata": {"name": NET},
        "spec": {"subnet": "100.162.0.0/24", "transitSubnet": "169.254.162.0/24", "poolSizePerNode": 1,
                 "namespaces": [NS]}});
    roam_e2e::kubectl_manifest(&lab, "create", &net).expect("create the Network");

    // a claim that does not exist: the VM waits, nothing is created
    roam_e2e::kubectl_manifest(&lab, "create", &vm("p10vm1", "p10-missing", "disk.img"))
        .expect("create p10vm1");
    let (phase, msg) = wait_until(LONG, "p10vm1 waiting for its claim", || {
        condition(&lab, "p10vm1", "Ready", "VolumeNotReady")
    });
    assert_eq!(phase, "Pending");
    assert!(msg.contains("p10-missing does not exist"), "{msg}");
    let events = try_kubectl(
        &lab,
        &[
            "-n",
            NS,
            "get",
            "events",
            "--field-selector",
            "reason=VolumeNotReady,involvedObject.name=p10vm1",
            "-o",
            "name",
        ],
    )
    .unwrap_or_default();
    assert!(!events.trim().is_empty(), "a VolumeNotReady Event");
    let pods = get(&lab, &["-n", NS, "get", "pods", "-l", "roam.dev/vm=p10vm1"]).unwrap();
    assert_eq!(pods["items"].as_array().map(Vec::len), Some(0), "{pods}");

    // a local PersistentVolume on node-a holding a raw disk and a link out of the volume
    let dir = lab.node_path("node-a", PV_DIR);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("disk.img"), vec![0u8; 1 << 20]).unwrap();
    let _ = std::fs::remove_file(dir.join("escape.img"));
    // (to a file every container has: a missing target would be refused as missing)
    std::os::unix::fs::symlink("/etc/hostname", dir.join("escape.img")).unwrap();
    let pv = json!({"apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": PV},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                 "persistentVolumeReclaimPolicy": "Retain", "storageClassName": "p10-local",
                 "local": {"path": PV_DIR},
                 "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                     {"key": "kubernetes.io/hostname", "operator": "In", "values": ["node-a"]}]}]}}}});
    roam_e2e::kubectl_manifest(&lab, "create", &pv).expect("create the PersistentVolume");
    let claim = json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": CLAIM, "namespace": NS},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "p10-local",
                 "volumeName": PV, "resources": {"requests": {"storage": "1Gi"}}}});
    roam_e2e::kubectl_manifest(&lab, "create", &claim).expect("create the claim");
    wait_until(LONG, "the claim Bound", || {
        let c = get(&lab, &["-n", NS, "get", "pvc", CLAIM])?;
        (c["status"]["phase"] == "Bound").then_some(())
    });

    // the VM on the bound claim runs; its QEMU opens the image through the pod's mount
    roam_e2e::kubectl_manifest(&lab, "create", &vm("p10vm2", CLAIM, "disk.img"))
        .expect("create p10vm2");
    wait_until(LONG, "p10vm2 Running", || {
        let v = get(&lab, &["-n", NS, "get", "vm", "p10vm2"])?;
        (v["status"]["phase"] == "Running").then_some(())
    });
    // its QEMU opens the image where the runner pinned it (the checked file, not a path
    // of the volume the tenant can swap), as raw, with no backing store
    let qemu = wait_until(LONG, "p10vm2's QEMU", || {
        qemu_pids(&format!("guest={NS}_p10vm2")).into_iter().next()
    });
    let cmdline = std::fs::read(format!("/proc/{qemu}/cmdline"))
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .unwrap_or_default();
    // (a raw disk is QEMU's file driver alone: no format layer that could read a header)
    assert!(
        cmdline.contains(r#""filename":"/run/roam/disk/vda""#)
            && !cmdline.contains(r#""driver":"qcow2""#)
            && !cmdline.contains("disk.img"),
        "p10vm2's QEMU opens the pinned image, raw: {cmdline}\n{}",
        ctl.log_tail(30)
    );
    use std::os::unix::fs::MetadataExt;
    let pinned = std::fs::metadata(format!("/proc/{qemu}/root/run/roam/disk/vda")).unwrap();
    let original = std::fs::metadata(dir.join("disk.img")).unwrap();
    assert_eq!(
        (pinned.dev(), pinned.ino()),
        (original.dev(), original.ino()),
        "the pinned file is the volume's disk.img"
    );
    // and the rest of the volume is not where QEMU runs
    let volume_in_qemus_view = format!(
        "/proc/{qemu}/root{}/disk.img",
        roam_core::launcher::VOLUME_DIR
    );
    assert!(
        !std::path::Path::new(&volume_in_qemus_view).exists(),
        "QEMU sees the volume: {volume_in_qemus_view}"
    );
    let pod = get(&lab, &["-n", NS, "get", "pod", "-l", "roam.dev/vm=p10vm2"])
        .and_then(|l| l["items"].get(0).cloned())
        .expect("p10vm2's launcher pod");
    let volumes = pod["spec"]["volumes"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        volumes
            .iter()
            .any(|v| v["persistentVolumeClaim"]["claimName"] == CLAIM),
        "{volumes:?}"
    );
    assert!(
        !volumes.iter().any(|v| v["hostPath"]["path"]
            .as_str()
            .is_some_and(|p| p.contains("images"))),
        "no image store: {volumes:?}"
    );

    // its migration is refused: a ReadWriteOnce claim cannot follow it
    kubectl(
        &lab,
        &[
            "-n",
            NS,
            "annotate",
            "vm",
            "p10vm2",
            "roam.dev/migrate-to=node-b",
        ],
    );
    let reason = wait_until(LONG, "p10vm2's migration refused", || {
        let ms = get(&lab, &["-n", NS, "get", "vmim", "-l", "roam.dev/vm=p10vm2"])?;
        ms["items"].as_array()?.iter().find_map(|m| {
            (m["status"]["phase"] == "Failed")
                .then(|| m["status"]["reason"].as_str().map(String::from))?
        })
    });
    assert!(reason.contains("not ReadWriteMany"), "{reason}");
    let v = get(&lab, &["-n", NS, "get", "vm", "p10vm2"]).unwrap();
    assert_eq!(
        (v["status"]["phase"].as_str(), v["status"]["node"].as_str()),
        (Some("Running"), Some("node-a")),
        "the VM stays where it is"
    );

    // an image file that links out of the volume: the shim refuses it
    roam_e2e::kubectl_manifest(&lab, "create", &vm("p10vm3", CLAIM, "escape.img"))
        .expect("create p10vm3");
    let (_, msg) = wait_until(LONG, "p10vm3's launcher refusing the link", || {
        condition(&lab, "p10vm3", "Ready", "LauncherFailing")
            .filter(|(_, m)| m.contains("escape.img"))
    });
    assert!(msg.contains("symbolic link"), "{msg}");
    assert!(!qemu_opens("/etc/hostname"));

    a_disk_of_the_image_store_is_read_only_and_migrates(&lab);

    kubectl(
        &lab,
        &[
            "-n", NS, "delete", "vm", "p10vm1", "p10vm2", "p10vm3", "p10vm4",
        ],
    );
    every_image_that_names_another_file_is_refused(&lab, &dir);
    for n in ["p10vm1", "p10vm2", "p10vm3", "p10vm4"] {
        wait_until(LONG, &format!("{n} gone"), || {
            try_kubectl(&lab, &["-n", NS, "get", "vm", n])
                .is_err()
                .then_some(())
        });
    }
}

/// A disk of the admin's image store (the lab's store is its guest directory, on every node)
/// is every VM's that boots it: QEMU opens it read-only (the runner mounts the store
/// read-only; before, QEMU asked to write it and could not start), and the VM migrates — a
/// read-only disk present on both nodes needs no shared storage.
fn a_disk_of_the_image_store_is_read_only_and_migrates(lab: &Lab) {
    let (kernel, _) = lab.guest();
    let image = std::path::Path::new(&kernel).with_file_name("p10-store-disk.raw");
    struct Unlink(std::path::PathBuf);
    impl Drop for Unlink {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }
    std::fs::write(&image, vec![0u8; 1 << 20]).expect("a disk in the image store");
    let _unlink = Unlink(image.clone());
    let image = image.display().to_string();
    let vm = json!({"apiVersion": "roam.dev/v1alpha1", "kind": "VirtualMachine",
           "metadata": {"name": "p10vm4", "namespace": NS},
           "spec": {"cpu": 1, "memoryMiB": 128, "node": "node-a",
                    "boot": {"disk": {"image": image, "format": "raw"}}}});
    roam_e2e::kubectl_manifest(lab, "create", &vm).expect("create p10vm4");
    wait_until(LONG, "p10vm4 Running", || {
        let v = get(lab, &["-n", NS, "get", "vm", "p10vm4"])?;
        (v["status"]["phase"] == "Running").then_some(())
    });
    let opened_read_only = || {
        qemus_with(&format!("guest={NS}_p10vm4"))
            .iter()
            .map(|c| c.contains(r#""read-only":true"#))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        opened_read_only(),
        vec![true],
        "one QEMU opens {image} (pinned), read-only"
    );
    kubectl(
        lab,
        &[
            "-n",
            NS,
            "annotate",
            "vm",
            "p10vm4",
            "roam.dev/migrate-to=node-b",
        ],
    );
    wait_until(LONG, "p10vm4's migration Succeeded", || {
        let ms = get(lab, &["-n", NS, "get", "vmim", "-l", "roam.dev/vm=p10vm4"])?;
        let phase = ms["items"].as_array()?.first()?["status"]["phase"].clone();
        assert_ne!(phase, "Failed", "p10vm4's migration failed: {ms}");
        (phase == "Succeeded").then_some(())
    });
    let v = get(lab, &["-n", NS, "get", "vm", "p10vm4"]).unwrap();
    assert_eq!(
        (v["status"]["phase"].as_str(), v["status"]["node"].as_str()),
        (Some("Running"), Some("node-b"))
    );
    wait_until(LONG, "one QEMU of p10vm4 left", || {
        (opened_read_only() == vec![true]).then_some(())
    });
}
