//! roam-cni: the CNI plugin that plumbs a pod's roam address (CNI spec 1.1). The runtime
//! runs it with CNI_COMMAND & co. in the environment and the network configuration on stdin;
//! it prints the result (ADD, VERSION) or the spec's error JSON (and exits non-zero).

use std::io::{Read, Write};

use roam_cni::{Error, config, error_json, run};

fn main() -> anyhow::Result<()> {
    let mut stdin = Vec::new();
    let read = std::io::stdin()
        .read_to_end(&mut stdin)
        .map_err(Error::Stdin);
    let outcome = read
        .and_then(|_| config::parse_env(|k| std::env::var(k).ok()))
        .and_then(|env| {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| Error::Netlink {
                    action: "start the async runtime".into(),
                    reason: e.to_string(),
                })?;
            rt.block_on(run(&env, &stdin))
        });
    let mut out = std::io::stdout().lock();
    match outcome {
        Ok(Some(v)) => {
            serde_json::to_writer(&mut out, &v)?;
            out.write_all(b"\n")?;
            Ok(())
        }
        Ok(None) => Ok(()),
        Err(e) => {
            serde_json::to_writer(&mut out, &error_json(&e, &stdin))?;
            out.write_all(b"\n")?;
            out.flush()?;
            std::process::exit(1);
        }
    }
}
