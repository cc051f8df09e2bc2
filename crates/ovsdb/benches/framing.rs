//! The framer on a large monitor reply, read 64 KiB at a time as the connection reads it:
//! the time per MiB should not grow with the message's size. Printed beside the old
//! approach (re-parse the whole buffer on every read), which grows linearly per MiB —
//! quadratically in all.
//!
//! `cargo bench -p roam-ovsdb --bench framing` (ROAM_BENCH_FRAMING_MIB: sizes, default
//! `1,4,8`; the re-parse takes over a minute at 16).

use std::time::{Duration, Instant};

use roam_ovsdb::Framer;
use serde_json::{Value, json};

const READ: usize = 64 * 1024;

/// A monitor reply of about `mib` MiB: Logical_Switch_Port rows as OVN's NB sends them.
fn reply(mib: usize) -> Vec<u8> {
    let mut rows = serde_json::Map::new();
    let mut i = 0u64;
    let mut size = 0;
    while size < mib << 20 {
        let row = json!({"new": {
            "name": format!("ns_pod-{i}"),
            "addresses": ["set", [format!("0a:58:0a:00:{:02x}:{:02x} 10.0.{}.{}", i >> 8 & 255, i & 255, i >> 8 & 255, i & 255)]],
            "external_ids": ["map", [["roam.dev/owner", format!("ns/pod-{i}")], ["roam.dev/network", "default"]]],
            "options": ["map", [["requested-chassis", "node-a"]]],
            "up": true,
        }});
        size += row.to_string().len() + 40;
        rows.insert(uuid::Uuid::new_v4().to_string(), row);
        i += 1;
    }
    serde_json::to_vec(&json!({"id": 1, "error": null, "result": {"Logical_Switch_Port": rows}}))
        .expect("a reply")
}

/// The framer as roam-ovsdb runs it.
fn incremental(bytes: &[u8]) -> (Duration, usize) {
    let t = Instant::now();
    let mut f = Framer::new();
    let mut n = 0;
    for chunk in bytes.chunks(READ) {
        f.push(chunk);
        while let Some(v) = f.next_value().expect("valid JSON") {
            n += usize::from(v.is_object());
        }
    }
    (t.elapsed(), n)
}

/// Before: every read re-parsed the buffer from its start until a value completed.
fn reparse(bytes: &[u8]) -> (Duration, usize) {
    let t = Instant::now();
    let mut buf: Vec<u8> = Vec::new();
    let mut n = 0;
    for chunk in bytes.chunks(READ) {
        buf.extend_from_slice(chunk);
        loop {
            let mut s = serde_json::Deserializer::from_slice(&buf).into_iter::<Value>();
            match s.next() {
                Some(Ok(v)) => {
                    let used = s.byte_offset();
                    buf.drain(..used);
                    n += usize::from(v.is_object());
                }
                Some(Err(e)) if e.is_eof() => break,
                Some(Err(e)) => panic!("{e}"),
                None => break,
            }
        }
    }
    (t.elapsed(), n)
}

fn main() {
    let sizes: Vec<usize> = std::env::var("ROAM_BENCH_FRAMING_MIB")
        .unwrap_or_else(|_| "1,4,8".into())
        .split(',')
        .map(|s| s.trim().parse().expect("sizes in MiB, e.g. 1,4,8"))
        .collect();
    println!(
        "framing: one monitor reply read {} KiB at a time",
        READ / 1024
    );
    println!(
        "{:>8} {:>14} {:>14} {:>14} {:>14} {:>8}",
        "MiB", "framer ms", "framer ms/MiB", "reparse ms", "reparse ms/MiB", "ratio"
    );
    for mib in sizes {
        let bytes = reply(mib);
        let real_mib = bytes.len() as f64 / (1 << 20) as f64;
        // best of 3 for the framer (it is cheap); the re-parse once
        let (new, n) = (0..3).map(|_| incremental(&bytes)).min().expect("runs");
        let (old, m) = reparse(&bytes);
        assert_eq!((n, m), (1, 1), "each found the one reply");
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        println!(
            "{:>8.1} {:>14.1} {:>14.1} {:>14.1} {:>14.1} {:>7.1}x",
            real_mib,
            ms(new),
            ms(new) / real_mib,
            ms(old),
            ms(old) / real_mib,
            ms(old) / ms(new)
        );
    }
}
