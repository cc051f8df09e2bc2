//! A VM's disk image, opened and checked before libvirt is given it, and pinned where its
//! owner cannot reach (I/O).
//!
//! The image is the tenant's file (in its volume) or the administrator's (in the image
//! store), and QEMU runs with more power than its owner. So:
//! - [`open`] resolves the image under its root with `openat2(RESOLVE_BENEATH |
//!   RESOLVE_NO_SYMLINKS)`: no symbolic link is followed, no `..` leads out, no magic link is
//!   taken; the result must be a regular file, and its first bytes go through
//!   [`roam_disk_image::inspect`] (format from the content, no backing or data file, sizes
//!   within bounds);
//! - [`pin`] bind-mounts that very file, through the descriptor [`open`] checked, on
//!   [`PINNED`] in the container that runs QEMU (`roam-shim libvirtd`, before libvirtd
//!   starts). The domain names [`PINNED`] only, with its format and an empty
//!   `<backingStore/>`: whatever the owner does to the volume later (a link swapped in for the
//!   file, a new header) changes nothing QEMU opens.

use std::fs::File;
use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag};
use nix::mount::{MntFlags, MsFlags};
use nix::sys::stat::Mode;
use roam_disk_image::{Format, HEAD_LEN, Image, Limits};

use crate::{Error, Result};

/// Where the container that runs QEMU shows the VM's checked disk image: a file in the
/// container's own tree (not a volume), so nothing the VM's owner writes can replace it.
pub const PINNED: &str = "/run/roam/disk/vda";

/// A disk image [`open`] checked, held by its descriptor.
#[derive(Debug)]
pub struct Checked {
    /// The image's format and virtual size.
    pub image: Image,
    /// The file, opened `O_PATH`: what [`pin`] mounts.
    fd: OwnedFd,
    /// Its device and inode, to tell it from any other file.
    id: (u64, u64),
}

fn refused(image: &Path, problem: impl Into<String>) -> Error {
    Error::Disk {
        image: image.to_path_buf(),
        problem: problem.into(),
    }
}

/// Open `image`, which must lie under `root`, and check it as an image of format `declared`.
pub fn open(root: &Path, image: &Path, declared: &str, limits: &Limits) -> Result<Checked> {
    let format: Format = declared
        .parse()
        .map_err(|e: roam_disk_image::Error| refused(image, e.to_string()))?;
    let rel = image
        .strip_prefix(root)
        .ok()
        .filter(|r| {
            !r.as_os_str().is_empty() && r.components().all(|c| matches!(c, Component::Normal(_)))
        })
        .ok_or_else(|| {
            refused(
                image,
                format!("is not a path inside {}: give a file in it", root.display()),
            )
        })?;
    let dir = nix::fcntl::open(
        root,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| {
        refused(
            image,
            format!(
                "its directory {} cannot be opened here: {e}",
                root.display()
            ),
        )
    })?;
    let how = OpenHow::new()
        .flags(OFlag::O_PATH | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW)
        .resolve(
            ResolveFlag::RESOLVE_BENEATH
                | ResolveFlag::RESOLVE_NO_SYMLINKS
                | ResolveFlag::RESOLVE_NO_MAGICLINKS,
        );
    let fd = nix::fcntl::openat2(&dir, rel, how).map_err(|e| {
        refused(
            image,
            match e {
                Errno::ELOOP => format!(
                    "is or lies behind a symbolic link: roam opens a disk image only through real \
                     directories under {} and follows no link (a link could lead anywhere on \
                     the node); put the image file itself there",
                    root.display()
                ),
                Errno::EXDEV => format!("leads out of {}", root.display()),
                Errno::ENOENT => "does not exist: give the path of an image file".into(),
                Errno::ENOSYS => {
                    "cannot be opened safely: this node's kernel has no openat2 (Linux 5.6 or later)"
                        .into()
                }
                e => format!("cannot be opened: {e}"),
            },
        )
    })?;
    // read through the descriptor just resolved, never the path again (not blocking on a
    // FIFO, never becoming a terminal's controller)
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(fd_path(&fd))
        .map_err(|e| refused(image, format!("cannot be read: {e}")))?;
    let meta = file
        .metadata()
        .map_err(|e| refused(image, format!("cannot be read: {e}")))?;
    if !meta.file_type().is_file() {
        return Err(refused(
            image,
            "is not a regular file (a directory, device, FIFO or socket): give an image file",
        ));
    }
    let head = read_head(&mut file, meta.len())
        .map_err(|e| refused(image, format!("cannot be read: {e}")))?;
    let checked = roam_disk_image::inspect(&head, meta.len(), format, limits)
        .map_err(|e| refused(image, e.to_string()))?;
    Ok(Checked {
        image: checked,
        fd,
        id: (meta.dev(), meta.ino()),
    })
}

/// The first `min(HEAD_LEN, len)` bytes of `file` (fewer if it shrank meanwhile).
fn read_head(file: &mut File, len: u64) -> std::io::Result<Vec<u8>> {
    let want = usize::try_from(len).unwrap_or(HEAD_LEN).min(HEAD_LEN);
    let mut head = Vec::with_capacity(want);
    file.take(want as u64).read_to_end(&mut head)?;
    Ok(head)
}

/// The magic link of one of this process's descriptors.
fn fd_path(fd: &OwnedFd) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()))
}

/// Show the checked file at `at` (a bind mount of its descriptor, read-only, no devices, no
/// set-uid, no exec when `read_only`; otherwise no devices, no set-uid, no exec), replacing
/// whatever was mounted there, and make sure `at` is now that file.
pub fn pin(checked: &Checked, at: &Path, read_only: bool) -> Result<()> {
    let io = |what: String| move |e: std::io::Error| Error::Io { what, source: e };
    if let Some(dir) = at.parent() {
        std::fs::create_dir_all(dir).map_err(io(format!("create {}", dir.display())))?;
    }
    // a mount left by an earlier attempt in this mount namespace goes first
    match nix::mount::umount2(at, MntFlags::MNT_DETACH) {
        Ok(()) | Err(Errno::EINVAL | Errno::ENOENT) => {}
        Err(e) => return Err(io(format!("unmount {}", at.display()))(e.into())),
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(at)
        .map_err(io(format!("create the mount point {}", at.display())))?;
    let source = fd_path(&checked.fd);
    nix::mount::mount(
        Some(&source),
        at,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .map_err(|e| {
        io(match e {
            // an unlinked file cannot be mounted: the check stands, the start fails closed
            Errno::ENOENT => format!(
                "bind-mount the checked image on {}: it was removed since it was checked; \
                 start again",
                at.display()
            ),
            _ => format!("bind-mount the checked image on {}", at.display()),
        })(e.into())
    })?;
    let mut flags = MsFlags::MS_BIND
        | MsFlags::MS_REMOUNT
        | MsFlags::MS_NOSUID
        | MsFlags::MS_NODEV
        | MsFlags::MS_NOEXEC;
    if read_only {
        flags |= MsFlags::MS_RDONLY;
    }
    nix::mount::mount(None::<&str>, at, None::<&str>, flags, None::<&str>)
        .map_err(|e| io(format!("remount {} with its limits", at.display()))(e.into()))?;
    let now = std::fs::metadata(at).map_err(io(format!("look at {}", at.display())))?;
    if (now.dev(), now.ino()) != checked.id {
        return Err(Error::Io {
            what: format!("pin the disk image on {}", at.display()),
            source: std::io::Error::other("the mount shows another file than the one checked"),
        });
    }
    Ok(())
}

/// Whether user `uid` of group `gid` may read (and write, with `write`) a file of permission
/// bits `mode` owned by `owner`/`group`, by those bits alone (pure; no capability, no ACL).
pub fn dac_allows(mode: u32, owner: u32, group: u32, uid: u32, gid: u32, write: bool) -> bool {
    let need = if write { 0o6 } else { 0o4 };
    let bits = if owner == uid {
        (mode >> 6) & 0o7
    } else if group == gid {
        (mode >> 3) & 0o7
    } else {
        mode & 0o7
    };
    bits & need == need
}

/// Make the checked image `image` one QEMU's user (`uid`/`gid`, which has no capability) can
/// open: a writable one — the VM's own disk — is given to it (its owner, and read-write for
/// the owner; KubeVirt gives a volume's disk to its qemu user the same way); a read-only one,
/// a file of the image store that every VM booting it shares, is left as the admin made it
/// and must be readable by that user already: refused otherwise, with what to do.
pub fn give_to(checked: &Checked, image: &Path, uid: u32, gid: u32, read_only: bool) -> Result<()> {
    let io = |what: String| move |e: std::io::Error| Error::Io { what, source: e };
    // the descriptor's magic link is the checked inode itself, never a path resolved again
    let at = fd_path(&checked.fd);
    let meta = std::fs::metadata(&at).map_err(io(format!("look at {}", image.display())))?;
    let mode = meta.mode() & 0o7777;
    if read_only {
        if !dac_allows(mode, meta.uid(), meta.gid(), uid, gid, false) {
            return Err(refused(
                image,
                format!(
                    "QEMU runs as uid {uid} gid {gid}, which may not read it (owner {}:{}, \
                     mode {mode:04o}): make the image store's files readable by all \
                     (chmod o+r)",
                    meta.uid(),
                    meta.gid()
                ),
            ));
        }
        return Ok(());
    }
    if meta.uid() != uid || meta.gid() != gid {
        std::os::unix::fs::chown(&at, Some(uid), Some(gid)).map_err(io(format!(
            "give {} to uid {uid} gid {gid} (QEMU's)",
            image.display()
        )))?;
    }
    // no set-uid/set-gid bit on QEMU's file, and read-write for its owner
    let want = (mode & 0o777) | 0o600;
    if want != mode {
        std::fs::set_permissions(&at, std::fs::Permissions::from_mode(want)).map_err(io(
            format!("make {} read-write for its owner", image.display()),
        ))?;
    }
    Ok(())
}

/// Take `root` (the volume or the image store the image was opened under) out of this mount
/// namespace once the image is pinned: QEMU needs its one file, not the rest of the volume.
/// `Ok(false)`: `root` is not a mount point here (nothing to take) or is `/`.
pub fn release_root(root: &Path) -> Result<bool> {
    if root == Path::new("/") {
        return Ok(false);
    }
    match nix::mount::umount2(root, MntFlags::MNT_DETACH) {
        Ok(()) => Ok(true),
        Err(Errno::EINVAL | Errno::ENOENT) => Ok(false),
        Err(e) => Err(Error::Io {
            what: format!("unmount {} after pinning the disk image", root.display()),
            source: e.into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Dir(PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn dir(name: &str) -> Dir {
        let d = std::env::temp_dir().join(format!("roam-disk-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("sub")).unwrap();
        Dir(d)
    }

    fn problem(r: Result<Checked>) -> String {
        match r {
            Err(Error::Disk { problem, .. }) => problem,
            other => panic!("a refused image, not {other:?}"),
        }
    }

    #[test]
    fn dac_reads_the_owner_group_or_other_bits() {
        // (mode, owner, group, write, allowed) for uid 107 gid 107
        for (mode, owner, group, write, ok) in [
            (0o600, 107, 0, true, true),
            (0o400, 107, 0, true, false),
            (0o644, 0, 0, false, true),
            (0o640, 0, 0, false, false),
            (0o640, 0, 107, false, true),
            (0o660, 0, 107, true, true),
            // the owner's bits count for the owner, even when others may do more
            (0o066, 107, 107, false, false),
            (0o600, 0, 0, false, false),
        ] {
            assert_eq!(
                dac_allows(mode, owner, group, 107, 107, write),
                ok,
                "{mode:o} {owner}:{group} write={write}"
            );
        }
    }

    #[test]
    fn a_writable_image_becomes_qemus_and_a_read_only_one_must_be_readable() {
        let d = dir("give");
        let p = d.0.join("sub/disk.raw");
        std::fs::write(&p, vec![0u8; 4096]).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o4400)).unwrap();
        let c = open(&d.0, &p, "raw", &Limits::default()).unwrap();
        give_to(&c, &p, 107, 108, false).unwrap();
        let m = std::fs::metadata(&p).unwrap();
        assert_eq!((m.uid(), m.gid(), m.mode() & 0o7777), (107, 108, 0o600));
        // the store's image: left alone when others may read it, refused when not
        let q = d.0.join("sub/store.raw");
        std::fs::write(&q, vec![0u8; 4096]).unwrap();
        std::fs::set_permissions(&q, std::fs::Permissions::from_mode(0o644)).unwrap();
        let c = open(&d.0, &q, "raw", &Limits::default()).unwrap();
        give_to(&c, &q, 107, 107, true).unwrap();
        assert_eq!(std::fs::metadata(&q).unwrap().uid(), 0);
        std::fs::set_permissions(&q, std::fs::Permissions::from_mode(0o600)).unwrap();
        match give_to(&c, &q, 107, 107, true) {
            Err(Error::Disk { problem, .. }) => assert!(problem.contains("chmod o+r"), "{problem}"),
            other => panic!("refused, not {other:?}"),
        }
        assert_eq!(
            std::fs::metadata(&q).unwrap().mode() & 0o777,
            0o600,
            "left alone"
        );
    }

    #[test]
    fn an_image_under_its_root_is_opened_and_checked() {
        let d = dir("ok");
        let p = d.0.join("sub/disk.raw");
        std::fs::write(&p, vec![0u8; 4096]).unwrap();
        let c = open(&d.0, &p, "raw", &Limits::default()).unwrap();
        assert_eq!(c.image.virtual_size, 4096);
        assert_eq!(c.image.format, Format::Raw);
    }

    #[test]
    fn links_and_paths_out_of_the_root_are_refused() {
        let d = dir("links");
        std::fs::write(d.0.join("disk.raw"), b"").unwrap();
        let lim = Limits::default();
        // a link to a file inside the root is refused too: no link is followed
        std::os::unix::fs::symlink("disk.raw", d.0.join("inside.raw")).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", d.0.join("out.raw")).unwrap();
        std::os::unix::fs::symlink("sub", d.0.join("subdir")).unwrap();
        for name in ["inside.raw", "out.raw", "subdir/x.raw"] {
            let m = problem(open(&d.0, &d.0.join(name), "raw", &lim));
            assert!(m.contains("symbolic link"), "{name}: {m}");
        }
        let m = problem(open(&d.0, &d.0.join("sub/../../etc/passwd"), "raw", &lim));
        assert!(m.contains("not a path inside"), "{m}");
        let m = problem(open(&d.0, Path::new("/etc/hostname"), "raw", &lim));
        assert!(m.contains("not a path inside"), "{m}");
        let m = problem(open(&d.0, &d.0.join("sub"), "raw", &lim));
        assert!(m.contains("not a regular file"), "{m}");
        let m = problem(open(&d.0, &d.0.join("missing.raw"), "raw", &lim));
        assert!(m.contains("does not exist"), "{m}");
        let m = problem(open(&d.0, &d.0.join("disk.raw"), "vmdk", &lim));
        assert!(m.contains("raw or qcow2"), "{m}");
    }

    #[test]
    fn a_fifo_is_refused_without_blocking() {
        let d = dir("fifo");
        let p = d.0.join("disk.raw");
        nix::unistd::mkfifo(&p, Mode::S_IRWXU).unwrap();
        let m = problem(open(&d.0, &p, "raw", &Limits::default()));
        assert!(m.contains("not a regular file"), "{m}");
    }

    #[test]
    fn the_headers_verdict_is_the_files() {
        let d = dir("header");
        let p = d.0.join("disk.qcow2");
        std::fs::write(&p, vec![0u8; 4096]).unwrap();
        let m = problem(open(&d.0, &p, "qcow2", &Limits::default()));
        assert!(m.contains("declared qcow2 but holds raw"), "{m}");
    }

    /// Root and a mount namespace of its own (this test's thread only): the pinned path is the
    /// checked file even after the original is swapped for a link to a host file.
    #[test]
    fn a_pinned_image_stays_the_checked_file_when_the_original_is_swapped() {
        let d = dir("pin");
        let p = d.0.join("disk.raw");
        std::fs::write(&p, b"the checked image").unwrap();
        let at = d.0.join("pinned/vda");
        let d0 = d.0.clone();
        std::thread::spawn(move || {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS).expect(
                "a mount namespace of this thread's own: this test needs root, as CI runs it",
            );
            nix::mount::mount(
                None::<&str>,
                "/",
                None::<&str>,
                MsFlags::MS_REC | MsFlags::MS_PRIVATE,
                None::<&str>,
            )
            .unwrap();
            let checked = open(&d0, &p, "raw", &Limits::default()).unwrap();
            // the owner swaps the file for a link between the check and the use
            std::fs::rename(&p, d0.join("kept.raw")).unwrap();
            std::os::unix::fs::symlink("/etc/hostname", &p).unwrap();
            pin(&checked, &at, true).unwrap();
            assert_eq!(std::fs::read(&at).unwrap(), b"the checked image");
            // read-only
            let w = std::fs::OpenOptions::new().write(true).open(&at);
            assert_eq!(
                w.unwrap_err().raw_os_error(),
                Some(libc::EROFS),
                "a read-only pin"
            );
            // pinned again (a restart in the same namespace): the old mount goes first
            std::fs::remove_file(&p).unwrap();
            std::fs::write(&p, b"second").unwrap();
            let checked = open(&d0, &p, "raw", &Limits::default()).unwrap();
            pin(&checked, &at, false).unwrap();
            assert_eq!(std::fs::read(&at).unwrap(), b"second");
            // the volume taken away once its image is pinned: the pin stays
            let vol = d0.join("volume");
            std::fs::create_dir_all(&vol).unwrap();
            nix::mount::mount(
                Some(&d0.join("sub")),
                &vol,
                None::<&str>,
                MsFlags::MS_BIND,
                None::<&str>,
            )
            .unwrap();
            std::fs::write(vol.join("img.raw"), b"in the volume").unwrap();
            let checked = open(&vol, &vol.join("img.raw"), "raw", &Limits::default()).unwrap();
            pin(&checked, &at, true).unwrap();
            assert!(release_root(&vol).unwrap());
            assert!(
                !vol.join("img.raw").exists(),
                "the volume is gone from here"
            );
            assert_eq!(std::fs::read(&at).unwrap(), b"in the volume");
            assert!(!release_root(&vol).unwrap(), "not a mount point now");
            assert!(!release_root(Path::new("/")).unwrap());
            // checked, then removed: nothing is pinned
            let checked = open(&d0, &d0.join("kept.raw"), "raw", &Limits::default()).unwrap();
            std::fs::remove_file(d0.join("kept.raw")).unwrap();
            let e = pin(&checked, &at, false).unwrap_err().to_string();
            assert!(e.contains("removed since it was checked"), "{e}");
            assert_eq!(
                std::fs::read(&at).unwrap(),
                b"",
                "the bare mount point, no image"
            );
        })
        .join()
        .unwrap();
    }
}
