//! roam-shim: the VM runtime inside a launcher pod. It owns one libvirt domain on its node
//! (boots it, or re-attaches to it after a restart, or receives it by live migration) and
//! serves the authenticated migration API (see the library's `api` module).
//!
//! Configuration: `--config FILE` (JSON) and/or `--KEY VALUE` flags (`roam_shim_api::launch`,
//! checked by the library's `config` module). SIGTERM or SIGINT: graceful shutdown; the domain keeps running. Exit status 78
//! ([`roam_shim_api::launch::EXIT_REFUSED_CONFIG`]): the configuration was refused before
//! anything was touched; 1: any other failure.

use anyhow::Context;
use roam_vm_shim::{config, console, libvirtd, proxy, server, shim::Shim};
use tokio::signal::unix::{SignalKind, signal};

const HELP: &str = "\
roam-shim: owns one libvirt domain and serves its migration API

  roam-shim [--config FILE] [--KEY VALUE ...]
  roam-shim libvirtd [--listen IP:PORT] [--libvirtd PATH] [--run-dir DIR]
                     [--disk IMAGE [--disk-format F] [--disk-access A] [--image-root DIR]]
                                   the launcher pod's own libvirtd (its other container)
  roam-shim proxy --listen IP:PORT --allowed-peers NODE,... --pki-dir DIR [--run-dir DIR]
                                   a migration's target side: the source node's streams,
                                   over mutual TLS, to this pod's libvirtd and QEMU
  roam-shim console --file PATH [--to FILE]
                                   the guest's serial console (a file QEMU appends to) on
                                   stdout, for kubectl logs (the pod's console container), or
                                   appended to FILE (a runner's relay to its launcher pod)

keys (JSON file or flags; a flag overrides the file):
  name vcpus memory-mib kernel initrd cmdline | disk disk-format   the VM
  disk-access(read-write|read-only)   read-only: a disk of the image store, shared by all
  mac tap ovn-port serial-log                                      its NIC and console
  nics MAC/TAP/OVN-PORT,...        several NICs (eth0, eth1, ...) instead of mac tap ovn-port
  node libvirt-uri                                                 this node
  migration-proxy IP:PORT allowed-peers NODE,...   migrations through the shims' mutual
                      TLS (needs pki-dir): libvirt and QEMU over the pod's UNIX sockets
  peer-libvirt-uri migration-uri   instead: plain TCP between the libvirtds (tests)
  ovs-db bridge(br-int)                                            this node's OVS
  listen token-file|token-sha256 state-file mode(boot|incoming) kvm   the shim
                                   (token-sha256: the token's SHA-256, 64 hex digits)
  instance                                    who runs it (echoed in /v1/status)
  image-root DIR      boot files only from under DIR (symbolic links resolved)
  pki-dir DIR         the node's roam identity (node.key, node.crt, ca.crt): the API over
                      mutual TLS, a migration's target reached over it
";

fn main() {
    if let Err(e) = real_main() {
        // the error's chain, without a backtrace: it says what is wrong and what to do
        eprintln!("roam-shim: {e:#}");
        // a refused configuration is refused before anything is touched (the controller
        // then knows this shim left nothing on the node)
        let refused = e.chain().any(|c| {
            matches!(
                c.downcast_ref::<roam_vm_shim::Error>(),
                Some(roam_vm_shim::Error::Config(_))
            )
        });
        std::process::exit(if refused {
            roam_shim_api::launch::EXIT_REFUSED_CONFIG
        } else {
            1
        });
    }
}

fn real_main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("--version") => {
            println!("roam-shim {}", env!("CARGO_PKG_VERSION"));
            return Ok(());
        }
        Some("--help") | Some("-h") => {
            print!("{HELP}");
            return Ok(());
        }
        Some("libvirtd") => return exec_libvirtd(&args[1..]),
        Some("proxy") => {
            let a = proxy::parse(&args[1..]).map_err(anyhow::Error::msg)?;
            return tokio::runtime::Runtime::new()?.block_on(run_proxy(a));
        }
        Some("console") => {
            // the guest's console for `kubectl logs`: runs until the pod stops it
            let a = console::parse(&args[1..]).map_err(anyhow::Error::msg)?;
            let follower = console::Follower::start(&a.file);
            // the pod's stop ends it at once (it may be its container's PID 1)
            let stopped = roam_vm_shim::sys::stop_on_terminate().context("signal handlers")?;
            return match &a.to {
                None => follower.run(&mut std::io::stdout().lock(), stopped, console::POLL),
                Some(to) => {
                    let mut out = console::open_relay_target(to)
                        .with_context(|| format!("open {} to relay the console", to.display()))?;
                    follower.run(&mut out, stopped, console::POLL)
                }
            }
            .with_context(|| format!("follow {}", a.file.display()));
        }
        _ => {}
    }
    // everything is checked before anything is touched
    let cfg = config::load(&args)?;
    tokio::runtime::Runtime::new()?.block_on(run(cfg))
}

/// `roam-shim libvirtd`: write the pod's libvirtd configuration, then become libvirtd.
fn exec_libvirtd(args: &[String]) -> anyhow::Result<()> {
    use std::os::unix::process::CommandExt;
    let a = libvirtd::parse(args).map_err(anyhow::Error::msg)?;
    std::fs::create_dir_all(&a.run_dir)
        .with_context(|| format!("create {}", a.run_dir.display()))?;
    if let Some(d) = &a.disk {
        // QEMU runs in this container's mount namespace: it gets the checked file, pinned
        let checked = roam_vm_shim::disk::open(
            &d.root,
            &d.image,
            &d.format,
            &roam_disk_image::Limits::default(),
        )?;
        // QEMU runs unprivileged: its disk must be its own, or readable by it
        roam_vm_shim::disk::give_to(
            &checked,
            &d.image,
            libvirtd::QEMU_UID,
            libvirtd::QEMU_GID,
            d.read_only,
        )?;
        let at = std::path::Path::new(roam_vm_shim::disk::PINNED);
        roam_vm_shim::disk::pin(&checked, at, d.read_only)?;
        // QEMU runs here and needs its one file, not the rest of the volume or the store
        let released = roam_vm_shim::disk::release_root(&d.root)?;
        tracing::info!(image = %d.image.display(), pinned = %at.display(), format = %checked.image.format,
            virtual_size = checked.image.virtual_size, read_only = d.read_only, root_released = released,
            "disk image checked and pinned");
    }
    let uuid = libvirtd::new_host_uuid().context("a host UUID for libvirtd")?;
    let file = a.run_dir.join("roam-libvirtd.conf");
    std::fs::write(&file, libvirtd::config(a.listen, &uuid, &a.run_dir))
        .with_context(|| format!("write {}", file.display()))?;
    tracing::info!(listen = ?a.listen, host_uuid = %uuid, "starting libvirtd");
    let err = std::process::Command::new(&a.libvirtd)
        .args(libvirtd::command_line(&a, &file))
        .exec();
    Err(anyhow::Error::new(err).context(format!("exec {}", a.libvirtd.display())))
}

/// How long a shim that lost libvirtd waits for the SIGTERM of its pod's deletion before it
/// exits to be restarted.
const TERM_AFTER_LOST: std::time::Duration = std::time::Duration::from_secs(2);

async fn run(cfg: config::ShimConfig) -> anyhow::Result<()> {
    let listen = cfg.listen;
    let listener = proxy::bind_when_free(listen, proxy::PORT_WAIT)
        .await
        .with_context(|| format!("listen on {listen}"))?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let shim = Shim::start(cfg).await?;
    tracing::info!(%listen, "serving the migration API");
    let server = tokio::spawn(server::serve(shim.clone(), listener, stop_rx));
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let lost = tokio::select! {
        _ = term.recv() => { tracing::info!("SIGTERM: shutting down"); false }
        _ = int.recv() => { tracing::info!("SIGINT: shutting down"); false }
        _ = shim.lost() => true,
    };
    let _ = stop_tx.send(true);
    let _ = server.await;
    if lost {
        // a pod's deletion stops libvirtd and the shim together: libvirtd, quicker, may go
        // first. A SIGTERM right behind the lost connection is that shutdown, whose taps must
        // not be left behind; without one, exit so that the shim is restarted (and re-attaches)
        let term_follows = tokio::time::timeout(TERM_AFTER_LOST, async {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        })
        .await
        .is_ok();
        anyhow::ensure!(
            term_follows,
            "lost the connection to libvirtd ({}): exiting so that the shim is restarted",
            shim.config().libvirt_uri
        );
        tracing::info!("libvirtd went, then SIGTERM: shutting down");
    }
    shim.shutdown().await;
    Ok(())
}

/// `roam-shim proxy`: the target's side of the migration proxy until SIGTERM.
async fn run_proxy(a: proxy::Args) -> anyhow::Result<()> {
    let sockets = proxy::Sockets::new(&a.run_dir);
    proxy::clear_listening(&sockets)
        .with_context(|| format!("remove {}", sockets.listening().display()))?;
    let l = proxy::bind_when_free(a.listen, proxy::PORT_WAIT)
        .await
        .with_context(|| format!("listen on {} (the migration proxy)", a.listen))?;
    proxy::mark_listening(&sockets, a.listen)
        .with_context(|| format!("write {}", sockets.listening().display()))?;
    let dir = a.pki_dir.clone();
    let tls: proxy::ServerConfigSource = std::sync::Arc::new(move || {
        roam_shim_api::tls::Identity::read_dir(&dir)
            .and_then(|i| i.peer_server_config(&[proxy::ALPN_LIBVIRT, proxy::ALPN_MIGRATION]))
            .map_err(|e| e.to_string())
    });
    tracing::info!(listen = %a.listen, peers = ?a.allowed_peers, "migration proxy");
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let served = tokio::spawn(proxy::serve(
        l,
        tls,
        std::sync::Arc::new(a.allowed_peers),
        sockets,
        stop_rx,
    ));
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    let _ = stop_tx.send(true);
    let _ = served.await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use roam_shim_api::launch::flag;

    #[test]
    fn the_help_names_every_flag() {
        let words: Vec<&str> = super::HELP
            .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
            .map(|w| w.trim_start_matches('-'))
            .collect();
        for f in flag::ALL.iter().chain([&flag::CONFIG]) {
            let key = f.trim_start_matches("--");
            assert!(words.contains(&key), "--help does not mention {f}");
        }
    }
}
