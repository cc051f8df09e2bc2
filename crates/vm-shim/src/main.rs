//! roam-shim: the VM runtime inside a launcher pod. It will own one libvirt domain and serve
//! the migration API (roam-shim issue); this binary only identifies itself so far.

use anyhow::bail;

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .init();
    match std::env::args().nth(1).as_deref() {
        Some("--version") => {
            println!("roam-shim {}", env!("CARGO_PKG_VERSION"));
            Ok(())
        }
        _ => bail!("roam-shim: not implemented yet (see README, Status)"),
    }
}
