//! Which node takes a VM — at its start when `spec.node` is unset, and as the target of
//! `roam.dev/migrate-to=auto` — under the constraints the scheduler would apply to its
//! launcher pod: the node is Ready and not cordoned, every taint that keeps pods off
//! (`NoSchedule`, `NoExecute`) is tolerated, its labels match the node selector, and its
//! allocatable memory and CPU less what its pods request hold the launcher's requests. Among the
//! nodes that fit, the one with the most memory left after the VM (the scheduler's
//! least-allocated score), then the name: never simply the first name. When none fits the
//! answer names each node and why, for the VM's or the migration's status.

use std::collections::BTreeMap;

/// Memory a launcher pod requests beyond the guest's: QEMU's own (device model, TCG or KVM
/// structures, I/O buffers) and the shim's. A VM of `memory_mib` requests `memory_mib` +
/// this.
pub const LAUNCHER_OVERHEAD_MIB: u64 = 192;

/// vCPUs per requested CPU, unless the controller is told otherwise
/// (`--cpu-allocation-ratio`): a launcher requests 1000 / 10 = 100 millicores per vCPU, as
/// KubeVirt's default `cpuAllocationRatio` does — guests rarely keep every vCPU busy, and a
/// node's CPUs are shared as the admin chose. Ratio 1 reserves a whole CPU per vCPU.
pub const DEFAULT_CPU_ALLOCATION_RATIO: u32 = 10;

/// The CPU a launcher of `vcpus` requests, in millicores, at `ratio` vCPUs per CPU (rounded
/// up; a ratio of 0 counts as 1).
pub fn launcher_millicpu(vcpus: u32, ratio: u32) -> u64 {
    (u64::from(vcpus) * 1000).div_ceil(u64::from(ratio.max(1)))
}

/// A node's taint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Taint {
    /// Its key.
    pub key: String,
    /// Its value (may be empty).
    pub value: String,
    /// `NoSchedule`, `PreferNoSchedule` or `NoExecute`.
    pub effect: String,
}

/// A pod's toleration.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Toleration {
    /// The taint key; empty with `exists`: every key.
    pub key: String,
    /// `Exists` (any value) rather than `Equal`.
    pub exists: bool,
    /// The value `Equal` wants.
    pub value: String,
    /// The effect it tolerates; empty: every effect.
    pub effect: String,
}

impl Toleration {
    /// Whether it tolerates `t` (Kubernetes' rules).
    pub fn tolerates(&self, t: &Taint) -> bool {
        if !self.effect.is_empty() && self.effect != t.effect {
            return false;
        }
        if self.key.is_empty() {
            return self.exists;
        }
        self.key == t.key && (self.exists || self.value == t.value)
    }
}

/// What the controller knows of a node.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct NodeFacts {
    /// Its name.
    pub name: String,
    /// Its Ready condition is True and it has an InternalIP.
    pub ready: bool,
    /// Cordoned (`spec.unschedulable`).
    pub unschedulable: bool,
    /// Its taints.
    pub taints: Vec<Taint>,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// `status.allocatable.memory`, MiB.
    pub allocatable_mib: u64,
    /// What the pods bound to it (not finished) request, MiB.
    pub requested_mib: u64,
    /// `status.allocatable.cpu`, millicores; `None` when the node does not say.
    pub allocatable_millicpu: Option<u64>,
    /// What the pods bound to it (not finished) request, millicores.
    pub requested_millicpu: u64,
}

/// What the VM's launcher pod needs of a node.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Need {
    /// Its memory request, MiB.
    pub memory_mib: u64,
    /// Its tolerations.
    pub tolerations: Vec<Toleration>,
    /// Labels the node must carry.
    pub node_selector: BTreeMap<String, String>,
    /// The VM's vCPUs: a node with fewer allocatable CPUs cannot run it.
    pub cpus: u32,
    /// Its CPU request, millicores ([`launcher_millicpu`]).
    pub millicpu: u64,
}

impl Need {
    /// What a VM of `memory_mib` needs: its launcher's request (the guest's memory plus
    /// [`LAUNCHER_OVERHEAD_MIB`]); no tolerations and no selector of its own.
    pub fn vm(memory_mib: u64) -> Need {
        Need {
            memory_mib: memory_mib + LAUNCHER_OVERHEAD_MIB,
            ..Need::default()
        }
    }

    /// What VM `spec` needs: its launcher's memory and CPU (at `cpu_ratio` vCPUs per CPU),
    /// its tolerations and node selector.
    pub fn of(spec: &roam_api::VirtualMachineSpec, cpu_ratio: u32) -> Need {
        Need {
            tolerations: spec
                .tolerations
                .iter()
                .map(|t| Toleration {
                    key: t.key.clone().unwrap_or_default(),
                    exists: t.operator.as_deref() == Some("Exists"),
                    value: t.value.clone().unwrap_or_default(),
                    effect: t.effect.clone().unwrap_or_default(),
                })
                .collect(),
            node_selector: spec.node_selector.clone(),
            cpus: spec.cpu,
            millicpu: launcher_millicpu(spec.cpu, cpu_ratio),
            ..Need::vm(spec.memory_mib)
        }
    }
}

/// Whether `n` could ever take `need`, were nothing else on it: its allocatable memory and
/// CPUs. `Some(why)`: never — a VM pinned to it is refused rather than left waiting.
pub fn never_fits(n: &NodeFacts, need: &Need) -> Option<String> {
    if let Some(short) = too_few_cpus(n, need) {
        return Some(format!("node {} has {short}", n.name));
    }
    if let Some(a) = n.allocatable_millicpu.filter(|a| *a < need.millicpu) {
        return Some(format!(
            "node {} has {a}m of allocatable CPU, the launcher requests {}m",
            n.name, need.millicpu
        ));
    }
    (n.allocatable_mib > 0 && n.allocatable_mib < need.memory_mib).then(|| {
        format!(
            "node {} has {} MiB of allocatable memory, the launcher requests {} MiB",
            n.name, n.allocatable_mib, need.memory_mib
        )
    })
}

/// `n` has fewer allocatable CPUs than the VM has vCPUs: how many each (`None`: enough, or
/// the node does not say).
fn too_few_cpus(n: &NodeFacts, need: &Need) -> Option<String> {
    let cpus = n
        .allocatable_millicpu
        .map(|m| m / 1000)
        .filter(|c| *c < u64::from(need.cpus))?;
    Some(format!(
        "{cpus} allocatable CPUs, the VM {} vCPUs",
        need.cpus
    ))
}

/// A CPU quantity (`2`, `1500m`, `0.5`) in millicores, rounded up; `None`: unreadable.
pub fn millicpu(q: &str) -> Option<u64> {
    let q = q.trim();
    let milli: f64 = match q.strip_suffix('m') {
        Some(m) => m.parse().ok()?,
        None => q.parse::<f64>().ok()? * 1000.0,
    };
    (milli.is_finite() && milli >= 0.0).then(|| milli.ceil() as u64)
}

/// A memory quantity (`256Mi`, `1.5Gi`, `512M`, `1073741824`) in MiB, rounded up; `None`:
/// not a memory quantity this understands.
pub fn memory_mib(q: &str) -> Option<u64> {
    let q = q.trim();
    let split = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(q.len());
    let (num, unit) = q.split_at(split);
    let num: f64 = num.parse().ok()?;
    let factor: f64 = match unit {
        "" => 1.0,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "Ki" => 1024.0,
        "Mi" => 1024.0 * 1024.0,
        "Gi" => 1024.0 * 1024.0 * 1024.0,
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        _ => return None,
    };
    let mib = num * factor / (1024.0 * 1024.0);
    (mib.is_finite() && mib >= 0.0).then(|| mib.ceil() as u64)
}

/// Why `n` cannot take `need`; `None`: it can.
pub fn unfit(n: &NodeFacts, need: &Need) -> Option<String> {
    if !n.ready {
        return Some("not Ready".into());
    }
    if n.unschedulable {
        return Some("cordoned (spec.unschedulable)".into());
    }
    if let Some(t) = n.taints.iter().find(|t| {
        (t.effect == "NoSchedule" || t.effect == "NoExecute")
            && !need.tolerations.iter().any(|tol| tol.tolerates(t))
    }) {
        let kv = if t.value.is_empty() {
            t.key.clone()
        } else {
            format!("{}={}", t.key, t.value)
        };
        return Some(format!("taint {kv}:{} not tolerated", t.effect));
    }
    if let Some((k, v)) = need
        .node_selector
        .iter()
        .find(|(k, v)| n.labels.get(*k) != Some(*v))
    {
        return Some(format!("no label {k}={v}"));
    }
    if let Some(short) = too_few_cpus(n, need) {
        return Some(short);
    }
    let free = n.allocatable_mib.saturating_sub(n.requested_mib);
    if free < need.memory_mib {
        return Some(format!(
            "{free} MiB of memory free, the launcher requests {} MiB",
            need.memory_mib
        ));
    }
    if let Some(a) = n.allocatable_millicpu {
        let free = a.saturating_sub(n.requested_millicpu);
        if free < need.millicpu {
            return Some(format!(
                "{free}m of CPU free, the launcher requests {}m",
                need.millicpu
            ));
        }
    }
    None
}

/// The node for `need` among `nodes`, never `exclude` (the VM's current node, for a
/// migration). `Err`: none fits, with each node's reason.
pub fn pick(nodes: &[NodeFacts], exclude: Option<&str>, need: &Need) -> Result<String, String> {
    let mut why = vec![];
    let mut best: Option<(&NodeFacts, u64)> = None;
    for n in nodes {
        if Some(n.name.as_str()) == exclude {
            continue;
        }
        if let Some(reason) = unfit(n, need) {
            why.push(format!("{}: {reason}", n.name));
            continue;
        }
        let left = n.allocatable_mib - n.requested_mib - need.memory_mib;
        let better = match best {
            None => true,
            Some((b, bl)) => left > bl || (left == bl && n.name < b.name),
        };
        if better {
            best = Some((n, left));
        }
    }
    match best {
        Some((n, _)) => Ok(n.name.clone()),
        None if why.is_empty() => Err(match exclude {
            Some(e) => format!("no node other than {e}"),
            None => "no node".into(),
        }),
        None => Err(format!("no node can take the VM: {}", why.join("; "))),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_vm_needs_its_tolerations_and_selector() {
        let spec: roam_api::VirtualMachineSpec = serde_json::from_value(serde_json::json!({
            "cpu": 1, "memoryMiB": 256, "boot": {"kernel": {"kernel": "/k"}},
            "nodeSelector": {"zone": "b"},
            "tolerations": [
                {"key": "dedicated", "operator": "Equal", "value": "vms", "effect": "NoSchedule"},
                {"operator": "Exists"}
            ]
        }))
        .unwrap();
        let need = Need::of(&spec, DEFAULT_CPU_ALLOCATION_RATIO);
        assert_eq!(need.memory_mib, 256 + LAUNCHER_OVERHEAD_MIB);
        assert_eq!(need.millicpu, 100, "1 vCPU at 10 vCPUs per CPU");
        assert_eq!(
            need.node_selector,
            [("zone".to_string(), "b".to_string())].into()
        );
        let taint = |key: &str, value: &str, effect: &str| Taint {
            key: key.into(),
            value: value.into(),
            effect: effect.into(),
        };
        assert!(need.tolerations[0].tolerates(&taint("dedicated", "vms", "NoSchedule")));
        assert!(!need.tolerations[0].tolerates(&taint("dedicated", "db", "NoSchedule")));
        // an empty key with Exists tolerates everything
        assert!(need.tolerations[1].tolerates(&taint("any", "x", "NoExecute")));
        assert_eq!(
            Need::of(
                &roam_api::VirtualMachineSpec {
                    tolerations: vec![],
                    node_selector: Default::default(),
                    ..spec
                },
                1
            ),
            Need {
                cpus: 1,
                millicpu: 1000,
                ..Need::vm(256)
            }
        );
    }

    use super::*;
    use proptest::prelude::*;

    fn node(name: &str, free_mib: u64) -> NodeFacts {
        NodeFacts {
            name: name.into(),
            ready: true,
            allocatable_mib: 8192,
            requested_mib: 8192 - free_mib,
            ..Default::default()
        }
    }

    #[test]
    fn a_node_with_fewer_cpus_than_the_vm_has_vcpus_does_not_fit() {
        let need = Need {
            cpus: 4,
            ..Need::vm(256)
        };
        let small = NodeFacts {
            allocatable_millicpu: Some(2000),
            ..node("node-a", 4000)
        };
        let big = NodeFacts {
            allocatable_millicpu: Some(4000),
            ..node("node-b", 1000)
        };
        assert!(unfit(&small, &need).unwrap().contains("2 allocatable CPUs"));
        assert_eq!(unfit(&big, &need), None);
        assert_eq!(pick(&[small.clone(), big], None, &need).unwrap(), "node-b");
        assert!(never_fits(&small, &need).is_some());
        let unknown = node("node-c", 4000);
        assert_eq!(
            never_fits(&unknown, &need),
            None,
            "a node that does not say"
        );
        let tiny = NodeFacts {
            allocatable_mib: 200,
            requested_mib: 0,
            ..node("node-d", 200)
        };
        assert!(never_fits(&tiny, &need).unwrap().contains("200 MiB"));
        assert_eq!(millicpu("2"), Some(2000));
        assert_eq!(millicpu("1500m"), Some(1500));
        assert_eq!(millicpu("0.5"), Some(500));
        assert_eq!(millicpu(" 0.0001"), Some(1), "rounded up");
        assert_eq!(millicpu("lots"), None);
        assert_eq!(millicpu("-1"), None);
    }

    /// The launcher requests its share of CPU (vCPUs over the allocation ratio): a node whose
    /// pods already request nearly all its CPU does not take it, whatever its memory.
    #[test]
    fn a_node_without_the_cpu_the_launcher_requests_does_not_fit() {
        assert_eq!(launcher_millicpu(1, DEFAULT_CPU_ALLOCATION_RATIO), 100);
        assert_eq!(launcher_millicpu(3, 1), 3000);
        assert_eq!(launcher_millicpu(1, 3), 334, "rounded up");
        assert_eq!(launcher_millicpu(2, 0), 2000, "a ratio of 0 counts as 1");
        let need = Need {
            cpus: 2,
            millicpu: launcher_millicpu(2, 4),
            ..Need::vm(256)
        };
        let busy = NodeFacts {
            allocatable_millicpu: Some(2000),
            requested_millicpu: 1600,
            ..node("node-a", 8000)
        };
        let idle = NodeFacts {
            allocatable_millicpu: Some(2000),
            requested_millicpu: 1500,
            ..node("node-b", 1000)
        };
        assert_eq!(
            unfit(&busy, &need).as_deref(),
            Some("400m of CPU free, the launcher requests 500m")
        );
        assert_eq!(never_fits(&busy, &need), None, "it fits once pods leave");
        assert_eq!(unfit(&idle, &need), None, "exactly enough");
        assert_eq!(pick(&[busy, idle], None, &need).unwrap(), "node-b");
        let small = NodeFacts {
            allocatable_millicpu: Some(2000),
            ..node("node-c", 8000)
        };
        let greedy = Need {
            cpus: 2,
            millicpu: launcher_millicpu(3, 1),
            ..Need::vm(256)
        };
        assert!(
            never_fits(&small, &greedy)
                .unwrap()
                .contains("2000m of allocatable CPU, the launcher requests 3000m")
        );
    }

    #[test]
    fn the_node_with_the_most_memory_left_not_the_first_name() {
        let nodes = [
            node("node-a", 1000),
            node("node-b", 3000),
            node("node-c", 2000),
        ];
        assert_eq!(pick(&nodes, None, &Need::vm(256)), Ok("node-b".into()));
        // a migration never targets the node the VM is on
        assert_eq!(
            pick(&nodes, Some("node-b"), &Need::vm(256)),
            Ok("node-c".into())
        );
        // ties by name
        let tied = [node("node-z", 2000), node("node-y", 2000)];
        assert_eq!(pick(&tied, None, &Need::vm(256)), Ok("node-y".into()));
    }

    #[test]
    fn cordon_readiness_taints_selector_and_memory_each_rule_a_node_out() {
        let mut cordoned = node("c", 4000);
        cordoned.unschedulable = true;
        let mut down = node("d", 4000);
        down.ready = false;
        let mut tainted = node("t", 4000);
        tainted.taints = vec![Taint {
            key: "dedicated".into(),
            value: "gpu".into(),
            effect: "NoSchedule".into(),
        }];
        let mut full = node("f", 300);
        full.labels = [("zone".to_string(), "a".to_string())].into();
        let unlabelled = node("u", 4000);
        let nodes = [cordoned, down, tainted.clone(), full, unlabelled];
        let mut need = Need::vm(256);
        need.node_selector = [("zone".to_string(), "a".to_string())].into();
        let err = pick(&nodes, None, &need).unwrap_err();
        assert_eq!(
            err,
            "no node can take the VM: c: cordoned (spec.unschedulable); d: not Ready; \
             t: taint dedicated=gpu:NoSchedule not tolerated; \
             f: 300 MiB of memory free, the launcher requests 448 MiB; u: no label zone=a"
        );
        // a PreferNoSchedule taint only prefers
        tainted.taints[0].effect = "PreferNoSchedule".into();
        assert_eq!(
            pick(&[tainted.clone()], None, &Need::vm(256)),
            Ok("t".into())
        );
        // a toleration lets it in
        tainted.taints[0].effect = "NoExecute".into();
        let mut need = Need::vm(256);
        need.tolerations = vec![Toleration {
            key: "dedicated".into(),
            exists: true,
            ..Default::default()
        }];
        assert_eq!(pick(&[tainted], None, &need), Ok("t".into()));
        assert_eq!(
            pick(&[node("a", 4000)], Some("a"), &Need::vm(256)),
            Err("no node other than a".into())
        );
    }

    #[test]
    fn memory_quantities() {
        assert_eq!(memory_mib("256Mi"), Some(256));
        assert_eq!(memory_mib("1.5Gi"), Some(1536));
        assert_eq!(memory_mib("24Gi"), Some(24 * 1024));
        assert_eq!(memory_mib("1048576"), Some(1));
        assert_eq!(memory_mib("1000M"), Some(954));
        assert_eq!(memory_mib("16318152Ki"), Some(15936));
        assert_eq!(memory_mib("1"), Some(1), "rounded up");
        assert_eq!(memory_mib("0"), Some(0));
        assert_eq!(memory_mib("12Zi"), None);
        assert_eq!(memory_mib("Mi"), None);
    }

    #[test]
    fn tolerations_follow_kubernetes_rules() {
        let t = Taint {
            key: "k".into(),
            value: "v".into(),
            effect: "NoSchedule".into(),
        };
        let tol = |key: &str, exists: bool, value: &str, effect: &str| Toleration {
            key: key.into(),
            exists,
            value: value.into(),
            effect: effect.into(),
        };
        assert!(tol("k", false, "v", "NoSchedule").tolerates(&t));
        assert!(tol("k", false, "v", "").tolerates(&t));
        assert!(tol("k", true, "", "").tolerates(&t));
        assert!(
            tol("", true, "", "").tolerates(&t),
            "an empty key with Exists: every taint"
        );
        assert!(!tol("", false, "", "").tolerates(&t));
        assert!(!tol("k", false, "w", "").tolerates(&t));
        assert!(!tol("k", true, "", "NoExecute").tolerates(&t));
        assert!(!tol("j", true, "", "").tolerates(&t));
    }

    /// A node named `n<i>`, `i` its position in the cluster (names are unique).
    fn arb_nodes() -> impl Strategy<Value = Vec<NodeFacts>> {
        prop::collection::vec(arb_node(), 0..6).prop_map(|mut nodes| {
            for (i, n) in nodes.iter_mut().enumerate() {
                n.name = format!("n{i}");
            }
            nodes
        })
    }

    fn arb_node() -> impl Strategy<Value = NodeFacts> {
        (
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
            0u64..4096,
            0u64..4096,
            prop::option::of(0u64..4000),
            0u64..4000,
        )
            .prop_map(
                |(ready, cordoned, tainted, alloc, req, cpu, cpu_req)| NodeFacts {
                    name: String::new(),
                    ready,
                    unschedulable: cordoned,
                    taints: if tainted {
                        vec![Taint {
                            key: "k".into(),
                            value: String::new(),
                            effect: "NoSchedule".into(),
                        }]
                    } else {
                        vec![]
                    },
                    labels: BTreeMap::new(),
                    allocatable_mib: alloc,
                    requested_mib: req.min(alloc),
                    allocatable_millicpu: cpu,
                    requested_millicpu: cpu_req.min(cpu.unwrap_or(0)),
                },
            )
    }

    proptest! {
        /// The pick fits, is not excluded, and leaves at least as much memory as any other
        /// node that fits; an error only when no node fits.
        #[test]
        fn the_pick_fits_and_is_the_best(nodes in arb_nodes(),
                                         mem in 0u64..2048, vcpus in 1u32..4,
                                         exclude in prop::option::of(0u8..6)) {
            let exclude = exclude.map(|i| format!("n{i}"));
            let need = Need {
                cpus: vcpus,
                millicpu: launcher_millicpu(vcpus, 2),
                ..Need::vm(mem)
            };
            let fitting: Vec<&NodeFacts> = nodes
                .iter()
                .filter(|n| Some(&n.name) != exclude.as_ref() && unfit(n, &need).is_none())
                .collect();
            match pick(&nodes, exclude.as_deref(), &need) {
                Ok(name) => {
                    prop_assert!(Some(&name) != exclude.as_ref());
                    let chosen = fitting.iter().find(|n| n.name == name).expect("a fitting node");
                    let left = |n: &NodeFacts| n.allocatable_mib - n.requested_mib;
                    prop_assert!(fitting.iter().all(|n| left(n) <= left(chosen)));
                }
                Err(_) => prop_assert!(fitting.is_empty()),
            }
        }
    }
}
