//! Every target's check over its seeds (`seeds/NAME/`), the saved findings
//! (`regressions/NAME/`), and deterministic pseudo-random inputs: the seeds mutated the way
//! a fuzzer would (bit flips, JSON punctuation, insertions, deletions, copies, splices) and
//! plain random bytes. Deterministic (a fixed xorshift seed per target) and fast, so that
//! CI runs them with `cargo test --workspace`.

use std::fs;
use std::path::{Path, PathBuf};

type Target = fn(&[u8]);

const TARGETS: &[(&str, Target)] = &[
    ("ovsdb_framing", super::ovsdb_framing),
    ("ovsdb_datum", super::ovsdb_datum),
    ("ovsdb_monitor_update", super::ovsdb_monitor_update),
    ("ovsdb_client", super::ovsdb_client),
    ("annotation_interfaces", super::annotation_interfaces),
    ("annotation_addresses", super::annotation_addresses),
    ("migrate_to", super::migrate_to),
    ("cni_config", super::cni_config),
    ("cni_env", super::cni_env),
    ("cni_prev_result", super::cni_prev_result),
    ("shim_api_request", super::shim_api_request),
    ("shim_config", super::shim_config),
    ("dhcp_rfc3442", super::dhcp_rfc3442),
    ("dhcp_ovn_options", super::dhcp_ovn_options),
    ("net_parsers", super::net_parsers),
    ("disk_image", super::disk_image),
    ("vm_spec", super::vm_spec),
    ("node_csr", super::node_csr),
];

/// Mutated inputs per target, and random ones.
const MUTATED: usize = 3000;
const RANDOM: usize = 300;

/// xorshift64*: small, deterministic, good enough to pick mutations.
struct Rng(u64);

impl Rng {
    fn new(name: &str) -> Rng {
        // a different, fixed stream per target (FNV-1a of its name)
        let seed = name.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
        });
        Rng(seed | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number in `0..n` (`n` > 0).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Bytes a mutation likes to put in: JSON's and the text formats' punctuation, digits,
/// boundaries.
const INTERESTING: &[u8] = b"{}[]\":,\\0123456789-+./=;\n \t\0\x7f\xff\xc3eE";

/// One to four mutations of `input`; `other` is another seed to splice from.
fn mutate(rng: &mut Rng, input: &[u8], other: &[u8]) -> Vec<u8> {
    let mut v = input.to_vec();
    for _ in 0..=rng.below(4) {
        let len = v.len();
        match rng.below(8) {
            0 if len > 0 => {
                let i = rng.below(len);
                v[i] ^= 1 << rng.below(8);
            }
            1 if len > 0 => {
                let i = rng.below(len);
                v[i] = INTERESTING[rng.below(INTERESTING.len())];
            }
            2 => {
                let i = rng.below(len + 1);
                v.insert(i, INTERESTING[rng.below(INTERESTING.len())]);
            }
            3 if len > 0 => {
                let start = rng.below(len);
                let end = (start + 1 + rng.below(8)).min(len);
                v.drain(start..end);
            }
            4 if len > 0 => {
                let start = rng.below(len);
                let end = (start + 1 + rng.below(16)).min(len);
                let chunk = v[start..end].to_vec();
                let at = rng.below(len + 1);
                v.splice(at..at, chunk);
            }
            5 if !other.is_empty() => {
                let cut = rng.below(len + 1);
                let from = rng.below(other.len());
                v.truncate(cut);
                v.extend_from_slice(&other[from..]);
            }
            6 if len > 0 => v.truncate(rng.below(len)),
            _ => {
                let i = rng.below(len + 1);
                v.insert(i, rng.next() as u8);
            }
        }
    }
    v
}

/// The files of `dir`, sorted by name (none when it does not exist).
fn files(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let Ok(entries) = fs::read_dir(dir) else {
        return vec![];
    };
    let mut out: Vec<(PathBuf, Vec<u8>)> = entries
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.is_file())
        .map(|p| {
            let data = fs::read(&p).expect("a readable file");
            (p, data)
        })
        .collect();
    out.sort();
    out
}

fn dir(kind: &str, target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(kind)
        .join(target)
}

fn run(name: &str, target: Target) {
    let seeds = files(&dir("seeds", name));
    assert!(!seeds.is_empty(), "no seeds for {name}");
    for (path, data) in seeds.iter().chain(&files(&dir("regressions", name))) {
        eprintln!("{name}: {}", path.display());
        target(data);
    }
    let mut rng = Rng::new(name);
    for _ in 0..MUTATED {
        let (_, base) = &seeds[rng.below(seeds.len())];
        let (_, other) = &seeds[rng.below(seeds.len())];
        let input = mutate(&mut rng, base, other);
        target(&input);
    }
    for _ in 0..RANDOM {
        let len = rng.below(96);
        let input: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        target(&input);
    }
}

macro_rules! target_tests {
    ($($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                run(stringify!($name), super::$name);
            }
        )*
    };
}

target_tests!(
    ovsdb_framing,
    ovsdb_datum,
    ovsdb_monitor_update,
    ovsdb_client,
    annotation_interfaces,
    annotation_addresses,
    migrate_to,
    cni_config,
    cni_env,
    cni_prev_result,
    shim_api_request,
    shim_config,
    dhcp_rfc3442,
    dhcp_ovn_options,
    net_parsers,
    disk_image,
    vm_spec,
    node_csr,
);

/// Every target has a test above, a binary in Cargo.toml, a fuzz_targets file and seeds.
#[test]
fn every_target_is_wired() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let manifest = fs::read_to_string(root.join("Cargo.toml")).expect("Cargo.toml");
    let bins = manifest.matches("[[bin]]").count();
    assert_eq!(bins, TARGETS.len(), "one [[bin]] per target");
    for (name, _) in TARGETS {
        let file = root.join("fuzz_targets").join(format!("{name}.rs"));
        let src = fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        assert!(
            src.contains(&format!("roam_fuzz::{name}(data)")),
            "{}",
            file.display()
        );
        assert!(
            manifest.contains(&format!("name = \"{name}\"")),
            "{name} in Cargo.toml"
        );
        assert!(!files(&dir("seeds", name)).is_empty(), "seeds/{name}");
    }
}

/// The mutator and the RNG are deterministic: the same stream for the same name.
#[test]
fn inputs_are_deterministic() {
    let (mut a, mut b) = (Rng::new("x"), Rng::new("x"));
    let seed = br#"{"a":[1,2,3]}"#;
    for _ in 0..100 {
        assert_eq!(mutate(&mut a, seed, seed), mutate(&mut b, seed, seed));
    }
}

fn seed(target: &str, name: &str) -> Vec<u8> {
    fs::read(dir("seeds", target).join(name)).expect("a seed")
}

fn seed_text(target: &str, name: &str) -> String {
    String::from_utf8(seed(target, name)).expect("a UTF-8 seed")
}

/// The seeds are valid inputs, so that the checks behind the parsers run from the start
/// (an invalid seed would only exercise the error paths).
#[test]
fn seeds_reach_the_checks() {
    use roam_cni::config::{Command, parse_conf, parse_env};
    use roam_contract::annotation::{parse_addresses, parse_interfaces};
    use roam_shim_api::launch::LaunchArgs;

    assert_eq!(
        parse_addresses(&seed_text(
            "annotation_addresses",
            "overlay_and_underlay.json"
        ))
        .unwrap()
        .len(),
        2
    );
    for name in ["native_types.json", "overlay_default.json", "network.json"] {
        parse_interfaces(&seed_text("annotation_interfaces", name)).unwrap();
    }
    for (name, command) in [
        ("add.bin", Command::Add),
        ("check.bin", Command::Check),
        ("del.bin", Command::Del),
        ("gc.bin", Command::Gc),
        ("status_tcp.bin", Command::Status),
    ] {
        let data = seed("cni_config", name);
        let conf = parse_conf(command, &data[1..]).unwrap();
        if let Some(p) = &conf.prev_result {
            roam_cni::result::parse_prev(p).unwrap();
        }
    }
    for name in ["add.env", "del.env", "check.env", "gc.env"] {
        let text = seed_text("cni_env", name);
        let vars: std::collections::BTreeMap<&str, &str> =
            text.lines().filter_map(|l| l.split_once('=')).collect();
        parse_env(|k| vars.get(k).map(|v| v.to_string())).unwrap();
    }
    for name in ["kernel_boot.args", "disk_boot.args"] {
        let words: Vec<String> = seed_text("shim_config", name)
            .split('\0')
            .map(str::to_string)
            .collect();
        LaunchArgs::parse(&words).unwrap();
    }
    let text = seed_text("shim_config", "config_file.args");
    let mut words: Vec<String> = text.split('\0').map(str::to_string).collect();
    let file = words.remove(0);
    assert_eq!(
        LaunchArgs::parse_with_file(&file, &words)
            .unwrap()
            .nics
            .len(),
        2
    );
    let req: roam_shim_api::api::MigrateRequest =
        serde_json::from_slice(&seed("shim_api_request", "migrate.json")).unwrap();
    req.validate().unwrap();
    for name in ["overlay_row.txt", "minimal_row.txt"] {
        let text = seed_text("dhcp_ovn_options", name);
        let mut lines = text.lines();
        let row = roam_dhcp_opts::DhcpOptionsRow {
            cidr: lines.next().unwrap().into(),
            options: lines
                .filter_map(|l| l.split_once('='))
                .map(|(k, v)| (k.into(), v.into()))
                .collect(),
        };
        roam_dhcp_opts::Lease::from_ovn(&row).unwrap();
    }
    roam_dhcp_opts::rfc3442::decode(&seed("dhcp_rfc3442", "mixed.bin")).unwrap();
    for name in ["overlay_lines.txt", "underlay_lines.txt", "small_lines.txt"] {
        let spec = super::spec_of_lines(&seed_text("net_parsers", name));
        roam_core::network::validate_network("n", &spec).unwrap();
    }
    for name in ["spec.json", "overlay_spec.json"] {
        let spec = serde_json::from_slice(&seed("net_parsers", name)).unwrap();
        roam_core::network::validate_network("n", &spec).unwrap();
    }
    for name in ["monitor_reply_rfc.json", "nat_qos.json"] {
        let v = serde_json::from_slice(&seed("ovsdb_monitor_update", name)).unwrap();
        roam_ovsdb::parse_table_updates(&v).unwrap();
    }
    for (name, events) in [
        ("monitor_cond.bin", 3),
        ("monitor.bin", 3),
        ("auto.bin", 2),
        ("canceled.bin", 1),
    ] {
        let before = super::EVENTS.with(|n| n.get());
        super::ovsdb_client(&seed("ovsdb_client", name));
        let seen = super::EVENTS.with(|n| n.get()) - before;
        assert_eq!(seen, events, "monitor events of {name}");
    }
    for name in ["update2_T.json", "update2_modify.json"] {
        let v = serde_json::from_slice(&seed("ovsdb_monitor_update", name)).unwrap();
        roam_ovsdb::parse_table_updates2(&v).unwrap();
    }
    // the disk image seeds: one accepted plain qcow2, one refused for its backing file
    let limits = roam_disk_image::Limits::default();
    let plain = seed("disk_image", "plain.qcow2");
    assert!(
        roam_disk_image::inspect(&plain, 1 << 20, roam_disk_image::Format::Qcow2, &limits).is_ok()
    );
    let backing = seed("disk_image", "backing.qcow2");
    assert!(matches!(
        roam_disk_image::inspect(&backing, 1 << 20, roam_disk_image::Format::Qcow2, &limits),
        Err(roam_disk_image::Error::BackingFile { .. })
    ));
    // the VM seeds pass the controller's checks; the migration seed is accepted
    for name in ["vm.json", "volume.json"] {
        let vm: roam_api::VirtualMachine =
            serde_json::from_str(&seed_text("vm_spec", name)).unwrap();
        let problems =
            roam_core::vm::validate::problems("ns", "vm", &vm.spec, Some("/var/lib/roam/images"));
        assert_eq!(problems, Vec::<String>::new(), "{name}");
    }
    let m: roam_api::VirtualMachineMigration =
        serde_json::from_str(&seed_text("vm_spec", "vmim.json")).unwrap();
    assert_eq!(m.spec.target_node.as_deref(), Some("node-b"));
    // the node-a request passes the review as node-a's
    let groups = ["system:nodes".to_string()];
    let asker = roam_pki::Requester {
        username: "system:node:node-a",
        groups: &groups,
    };
    let facts = |n: &str| {
        Some(roam_pki::NodeFacts {
            name: n.to_string(),
            addresses: vec![],
        })
    };
    assert!(roam_pki::review(&seed("node_csr", "node-a.pem"), asker, facts).is_ok());
    assert!(roam_pki::review(&seed("node_csr", "node-b.pem"), asker, facts).is_err());
}
