//! Images written by the real `qemu-img` (QEMU's own tool; e2e/labkit/deps.sh installs it):
//! the ones it writes plainly are accepted with their virtual size, and every way it has of
//! making an image name another file is refused. A missing qemu-img fails the test.

use std::path::{Path, PathBuf};
use std::process::Command;

use roam_disk_image::{Error, Format, HEAD_LEN, Image, Limits, inspect};

struct Dir(PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn dir(name: &str) -> Dir {
    let d = std::env::temp_dir().join(format!("roam-disk-image-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    Dir(d)
}

fn qemu_img(args: &[&str]) {
    let out = Command::new("qemu-img")
        .args(args)
        .output()
        .expect("qemu-img runs (package qemu-utils; e2e/labkit/deps.sh installs it)");
    assert!(
        out.status.success(),
        "qemu-img {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// What roam's shim reads of a file: its first HEAD_LEN bytes and its size.
fn look(path: &Path, declared: Format) -> Result<Image, Error> {
    let bytes = std::fs::read(path).unwrap();
    let head = &bytes[..bytes.len().min(HEAD_LEN)];
    inspect(head, bytes.len() as u64, declared, &Limits::default())
}

#[test]
fn images_qemu_img_writes_plainly_are_accepted() {
    let d = dir("plain");
    let cases: [(&str, &[&str]); 5] = [
        ("v3.qcow2", &["-o", "compat=1.1"]),
        ("v2.qcow2", &["-o", "compat=0.10"]),
        ("big-clusters.qcow2", &["-o", "cluster_size=2M"]),
        ("zstd.qcow2", &["-o", "compression_type=zstd"]),
        ("extended-l2.qcow2", &["-o", "extended_l2=on"]),
    ];
    for (name, opts) in cases {
        let p = d.0.join(name);
        let mut args = vec!["create", "-q", "-f", "qcow2"];
        args.extend_from_slice(opts);
        args.extend([p.to_str().unwrap(), "3G"]);
        qemu_img(&args);
        assert_eq!(
            look(&p, Format::Qcow2),
            Ok(Image {
                format: Format::Qcow2,
                virtual_size: 3 << 30
            }),
            "{name}"
        );
    }
    let raw = d.0.join("disk.raw");
    qemu_img(&["create", "-q", "-f", "raw", raw.to_str().unwrap(), "5M"]);
    assert_eq!(look(&raw, Format::Raw).map(|i| i.virtual_size), Ok(5 << 20));
}

#[test]
fn every_way_qemu_img_has_of_naming_another_file_is_refused() {
    let d = dir("tricks");
    let p = |n: &str| d.0.join(n).to_str().unwrap().to_string();
    // a backing file on a host path and on a device (-u: qemu-img need not open it here)
    for (name, backing) in [("host.qcow2", "/etc/hostname"), ("dev.qcow2", "/dev/sda")] {
        qemu_img(&[
            "create",
            "-q",
            "-u",
            "-f",
            "qcow2",
            "-b",
            backing,
            "-F",
            "raw",
            &p(name),
            "1G",
        ]);
        let e = look(Path::new(&p(name)), Format::Qcow2).unwrap_err();
        assert_eq!(
            e,
            Error::BackingFile {
                name: backing.into()
            },
            "{name}"
        );
    }
    // an external data file
    std::fs::write(p("data.raw"), b"").unwrap();
    qemu_img(&[
        "create",
        "-q",
        "-f",
        "qcow2",
        "-o",
        &format!("data_file={},data_file_raw=on", p("data.raw")),
        &p("datafile.qcow2"),
        "1G",
    ]);
    let e = look(Path::new(&p("datafile.qcow2")), Format::Qcow2).unwrap_err();
    assert_eq!(
        e,
        Error::DataFile {
            name: p("data.raw")
        }
    );
    // encrypted
    qemu_img(&[
        "create",
        "-q",
        "--object",
        "secret,id=s0,data=roam",
        "-f",
        "qcow2",
        "-o",
        "encrypt.format=luks,encrypt.key-secret=s0,encrypt.iter-time=10",
        &p("luks.qcow2"),
        "16M",
    ]);
    assert_eq!(
        look(Path::new(&p("luks.qcow2")), Format::Qcow2),
        Err(Error::Encrypted)
    );
    // a raw image posing as qcow2 and a qcow2 image declared raw
    qemu_img(&["create", "-q", "-f", "raw", &p("posing.qcow2"), "1M"]);
    assert!(matches!(
        look(Path::new(&p("posing.qcow2")), Format::Qcow2),
        Err(Error::NotDeclared { .. })
    ));
    qemu_img(&["create", "-q", "-f", "qcow2", &p("real.qcow2"), "1M"]);
    assert!(matches!(
        look(Path::new(&p("real.qcow2")), Format::Raw),
        Err(Error::NotDeclared { .. })
    ));
    // a huge virtual size (qemu-img's own ceiling for 2 MiB clusters is far above the limit)
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
    assert!(matches!(
        look(Path::new(&p("huge.qcow2")), Format::Qcow2),
        Err(Error::TooLarge { size, .. }) if size == 1 << 50
    ));
}
