//! roam-controller: the VM, migration, address, pod and route controllers in one
//! leader-elected process. The controllers arrive with the address-control-plane and
//! live-migration issues; this binary only identifies itself so far.

use anyhow::bail;

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .init();
    match std::env::args().nth(1).as_deref() {
        Some("--version") => {
            println!("roam-controller {}", env!("CARGO_PKG_VERSION"));
            Ok(())
        }
        _ => bail!("roam-controller: the controllers are not implemented yet (see README, Status)"),
    }
}
