//! roam-cni: the CNI plugin that plumbs a pod's roam address (CNI spec 1.1).
//!
//! So far only VERSION is implemented; every other command answers with a CNI error
//! result saying so, rather than pretending to succeed.

use std::io::Write;

use serde_json::json;

/// CNI versions this plugin speaks.
const SUPPORTED: &[&str] = &["0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];
/// First plugin-specific CNI error code (1-99 are reserved by the spec).
const ERR_NOT_IMPLEMENTED: u32 = 100;

fn main() {
    let command = std::env::var("CNI_COMMAND").unwrap_or_default();
    let (out, code) = match command.as_str() {
        "VERSION" => (
            json!({"cniVersion": "1.1.0", "supportedVersions": SUPPORTED}),
            0,
        ),
        other => (
            json!({
                "cniVersion": "1.1.0",
                "code": ERR_NOT_IMPLEMENTED,
                "msg": format!("roam-cni: CNI_COMMAND {other:?} is not implemented yet"),
                "details": "this build of roam-cni only answers VERSION; see the README's Status section",
            }),
            1,
        ),
    };
    let mut stdout = std::io::stdout().lock();
    let _ = serde_json::to_writer(&mut stdout, &out);
    let _ = stdout.write_all(b"\n");
    std::process::exit(code);
}
