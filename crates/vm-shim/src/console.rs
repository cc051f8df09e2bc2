//! `roam-shim console --file PATH [--to FILE]`: the guest's serial console on the launcher
//! pod's output (its `console` container), so that `kubectl logs` shows it; or, with `--to`,
//! appended to `FILE` (a runner's relay into its launcher pod's console volume: the file is
//! created if need be and never followed if it is a symbolic link, the volume being the
//! tenant's pod's). QEMU appends the console to a
//! file on the node (`<serial type='file' append='on'>`); this follows that file from where
//! it ends when the container starts (an earlier VM of the same name on the node wrote what
//! is before), waits for it while it does not exist, and starts over at the beginning of a
//! file that was truncated or replaced.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// `console`'s usage.
pub const USAGE: &str = "roam-shim console --file PATH [--to FILE]";

/// How often the file is looked at.
pub const POLL: Duration = Duration::from_millis(200);

/// What `console` does: follow `file` onto stdout, or onto `to`.
#[derive(Debug, PartialEq, Eq)]
pub struct Args {
    /// The file QEMU appends the console to.
    pub file: PathBuf,
    /// Where it goes: stdout when `None`.
    pub to: Option<PathBuf>,
}

/// `console`'s arguments (pure).
pub fn parse(args: &[String]) -> Result<Args, String> {
    let abs = |flag: &str, path: &str| match path.starts_with('/') {
        true => Ok(PathBuf::from(path)),
        false => Err(format!("{flag} {path}: give an absolute path")),
    };
    match args {
        [flag, path] if flag == "--file" => Ok(Args {
            file: abs(flag, path)?,
            to: None,
        }),
        [flag, path, to_flag, to] if flag == "--file" && to_flag == "--to" => Ok(Args {
            file: abs(flag, path)?,
            to: Some(abs(to_flag, to)?),
        }),
        _ => Err(format!("usage: {USAGE}")),
    }
}

/// `to` opened for appending: created (rw-r--r--) if it is not there, refused if it is a
/// symbolic link (`O_NOFOLLOW`) or not a regular file.
pub fn open_relay_target(to: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(to)?;
    if !f.metadata()?.is_file() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{} is not a regular file", to.display()),
        ));
    }
    Ok(f)
}

/// The file being followed: which one (device and inode) and how far it was read.
struct Open {
    file: File,
    id: (u64, u64),
    pos: u64,
}

fn open(path: &Path, from_end: bool) -> Option<Open> {
    let mut file = File::open(path).ok()?;
    let meta = file.metadata().ok()?;
    let pos = if from_end { meta.len() } else { 0 };
    file.seek(SeekFrom::Start(pos)).ok()?;
    Some(Open {
        file,
        id: (meta.dev(), meta.ino()),
        pos,
    })
}

/// A console file being followed (see the [module](self)).
pub struct Follower {
    path: PathBuf,
    cur: Option<Open>,
}

impl Follower {
    /// Start at the end of `path` as it is now (what is there is an earlier VM's), or at
    /// the start of the file once it exists.
    pub fn start(path: &Path) -> Follower {
        Follower {
            path: path.to_path_buf(),
            cur: open(path, true),
        }
    }

    /// Follow into `out` until `stop` says so, looking every `poll`. Returns when stopped,
    /// or with `out`'s error (e.g. a closed pipe).
    pub fn run(
        self,
        out: &mut impl Write,
        stop: impl Fn() -> bool,
        poll: Duration,
    ) -> std::io::Result<()> {
        follow(&self.path, self.cur, out, stop, poll)
    }
}

fn follow(
    path: &Path,
    mut cur: Option<Open>,
    out: &mut impl Write,
    stop: impl Fn() -> bool,
    poll: Duration,
) -> std::io::Result<()> {
    let mut buf = vec![0u8; 64 * 1024];
    while !stop() {
        let Some(o) = cur.as_mut() else {
            // not there yet (or gone): the next file is read from its start
            std::thread::sleep(poll);
            cur = open(path, false);
            continue;
        };
        match o.file.read(&mut buf) {
            Ok(0) => {
                // at the end: is this still the file, and not cut shorter than what was
                // read? (a file truncated and refilled past that point in between reads
                // shows from there on)
                let replaced = match std::fs::metadata(path) {
                    Ok(m) => (m.dev(), m.ino()) != o.id || m.len() < o.pos,
                    Err(_) => true,
                };
                if replaced {
                    cur = open(path, false);
                } else {
                    out.flush()?;
                    std::thread::sleep(poll);
                }
            }
            Ok(n) => {
                o.pos += n as u64;
                out.write_all(&buf[..n])?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => {
                cur = None;
            }
        }
    }
    out.flush()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};

    /// A `Write` the test reads while the follower writes.
    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Shared {
        fn text(&self) -> String {
            String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
        }

        /// Wait (bounded, generously) until the output is `want`.
        fn wait_for(&self, want: &str) {
            let deadline = std::time::Instant::now() + Duration::from_secs(20);
            while self.text() != want {
                assert!(
                    std::time::Instant::now() < deadline,
                    "console output {:?}, expected {want:?}",
                    self.text()
                );
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }

    /// A follower of `path` started now (in this thread) and run in another: its output,
    /// its stop and its thread.
    fn follow_in_thread(
        path: &Path,
    ) -> (
        Shared,
        Arc<AtomicBool>,
        std::thread::JoinHandle<std::io::Result<()>>,
    ) {
        let out = Shared::default();
        let stop = Arc::new(AtomicBool::new(false));
        let f = Follower::start(path);
        let (mut o, s) = (out.clone(), stop.clone());
        let t = std::thread::spawn(move || {
            f.run(
                &mut o,
                || s.load(Ordering::SeqCst),
                Duration::from_millis(10),
            )
        });
        (out, stop, t)
    }

    fn append(path: &Path, text: &str) {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .unwrap();
        f.write_all(text.as_bytes()).unwrap();
    }

    #[test]
    fn follows_what_is_appended_and_starts_over_on_a_new_file() {
        let dir = std::env::temp_dir().join(format!("roam-console-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("vm.serial.log");
        append(&path, "an earlier VM's boot\n");
        let (out, stop, follower) = follow_in_thread(&path);
        // what was there is skipped; what comes is shown
        append(&path, "Linux version 6.1\n");
        out.wait_for("Linux version 6.1\n");
        append(&path, "login: ");
        out.wait_for("Linux version 6.1\nlogin: ");
        // truncated: read from the start again
        std::fs::write(&path, "").unwrap();
        append(&path, "after truncation\n");
        out.wait_for("Linux version 6.1\nlogin: after truncation\n");
        // replaced (a new file of the same name): from its start
        std::fs::remove_file(&path).unwrap();
        append(&path, "a new file\n");
        out.wait_for("Linux version 6.1\nlogin: after truncation\na new file\n");
        stop.store(true, Ordering::SeqCst);
        follower.join().unwrap().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_file_that_is_not_there_yet_is_waited_for_and_read_whole() {
        let dir = std::env::temp_dir().join(format!("roam-console-w-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("vm.serial.log");
        let (out, stop, follower) = follow_in_thread(&path);
        append(&path, "first line of a new VM\n");
        out.wait_for("first line of a new VM\n");
        stop.store(true, Ordering::SeqCst);
        follower.join().unwrap().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_relay_appends_to_a_file_it_creates_and_refuses_a_link() {
        let dir = std::env::temp_dir().join(format!("roam-console-r-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let to = dir.join("serial.log");
        open_relay_target(&to).unwrap().write_all(b"one\n").unwrap();
        open_relay_target(&to).unwrap().write_all(b"two\n").unwrap();
        assert_eq!(std::fs::read_to_string(&to).unwrap(), "one\ntwo\n");
        // a link the tenant left in its volume is not followed out of it
        let secret = dir.join("secret");
        std::fs::write(&secret, "keep").unwrap();
        let link = dir.join("link.log");
        std::os::unix::fs::symlink(&secret, &link).unwrap();
        assert!(open_relay_target(&link).is_err());
        assert_eq!(std::fs::read_to_string(&secret).unwrap(), "keep");
        // nor is a FIFO written to (O_NONBLOCK: no reader, no hang)
        let fifo = dir.join("fifo.log");
        assert!(
            std::process::Command::new("mkfifo")
                .arg(&fifo)
                .status()
                .unwrap()
                .success()
        );
        assert!(open_relay_target(&fifo).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_arguments_name_an_absolute_file() {
        let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            parse(&s(&["--file", "/var/log/roam/vms/ns_vm.serial.log"])).unwrap(),
            Args {
                file: PathBuf::from("/var/log/roam/vms/ns_vm.serial.log"),
                to: None
            }
        );
        assert_eq!(
            parse(&s(&["--file", "/l/a.log", "--to", "/c/serial.log"])).unwrap(),
            Args {
                file: PathBuf::from("/l/a.log"),
                to: Some(PathBuf::from("/c/serial.log"))
            }
        );
        assert!(
            parse(&s(&["--file", "/l/a.log", "--to", "c.log"]))
                .unwrap_err()
                .contains("absolute")
        );
        assert!(
            parse(&s(&["--file", "x.log"]))
                .unwrap_err()
                .contains("absolute")
        );
        assert!(parse(&s(&[])).unwrap_err().contains(USAGE));
        assert!(parse(&s(&["--path", "/x"])).is_err());
    }
}
