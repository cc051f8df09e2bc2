//! OVN and Open_vSwitch on the lab: `ovn-nbctl`/`ovs-vsctl`, reconciling a topology on the
//! NB database, `ovn-trace`, and the rows that explain a failure.

use crate::lab::{Lab, Node, run, try_run};

/// `ovn-nbctl` against the lab's NB database.
pub fn nbctl(lab: &Lab, args: &[&str]) -> String {
    let db = format!("--db={}", lab.nb());
    let mut all = vec![db.as_str(), "--timeout=30"];
    all.extend_from_slice(args);
    run("ovn-nbctl", &all)
}

/// `ovs-vsctl` against a node's Open_vSwitch database.
pub fn vsctl(node: &Node, args: &[&str]) -> String {
    let db = format!("--db={}", node.ovs_db);
    let mut all = vec![db.as_str(), "--timeout=30"];
    all.extend_from_slice(args);
    run("ovs-vsctl", &all)
}

/// The rows about any of `needles` (MACs, IPs) in OVN: the logical switch ports and static routes
/// that name it in the northbound database, and the southbound bindings of those ports with
/// the chassis they are on. Never panics (for failure reports).
pub fn ovn_rows_about(lab: &Lab, needles: &[&str]) -> String {
    let about = |l: &str| needles.iter().any(|n| l.contains(n));
    let nb = format!("--db={}", lab.nb());
    let sb = format!("--db={}", lab.var("OVN_SB_DB"));
    let list = |db: &str, prog: &str, cols: &str, table: &str| {
        try_run(
            prog,
            &[
                db,
                "--timeout=10",
                "--format=csv",
                "--data=bare",
                "--no-headings",
                &format!("--columns={cols}"),
                "list",
                table,
            ],
        )
        .unwrap_or_else(|e| format!("({prog} list {table}: {e})"))
    };
    let mut out = String::new();
    let lsps = list(
        &nb,
        "ovn-nbctl",
        "name,addresses,options,up",
        "Logical_Switch_Port",
    );
    let mut names = vec![];
    out.push_str("NB Logical_Switch_Port:\n");
    for l in lsps.lines().filter(|l| about(l)) {
        names.extend(l.split(',').next().map(str::to_string));
        out.push_str(&format!("  {l}\n"));
    }
    out.push_str("NB Logical_Router_Static_Route:\n");
    let routes = list(
        &nb,
        "ovn-nbctl",
        "ip_prefix,nexthop,output_port,policy",
        "Logical_Router_Static_Route",
    );
    for l in routes.lines().filter(|l| about(l)) {
        out.push_str(&format!("  {l}\n"));
    }
    let chassis = list(&sb, "ovn-sbctl", "_uuid,hostname", "Chassis");
    out.push_str("SB Port_Binding (chassis by hostname):\n");
    let bindings = list(
        &sb,
        "ovn-sbctl",
        "logical_port,chassis,additional_chassis,requested_chassis,up",
        "Port_Binding",
    );
    for l in bindings
        .lines()
        .filter(|l| names.iter().any(|n| l.starts_with(&format!("{n},"))))
    {
        let mut l = l.to_string();
        for c in chassis.lines() {
            if let Some((uuid, host)) = c.split_once(',') {
                l = l.replace(uuid, host);
            }
        }
        out.push_str(&format!("  {l}\n"));
    }
    out
}

/// Reconcile `topology` for `network` on the lab's NB database.
pub fn reconcile_on_lab(
    lab: &Lab,
    network: &str,
    topology: &roam_network::topology::Topology,
) -> roam_network::topology::ReconcileReport {
    let rt = tokio::runtime::Runtime::new().expect("a tokio runtime");
    rt.block_on(async {
        let client = roam_ovsdb::Client::connect(lab.nb())
            .await
            .expect("connect to the lab's NB");
        roam_network::northbound::reconcile(&client, network, topology)
            .await
            .unwrap_or_else(|e| panic!("reconcile {network}: {e}"))
    })
}

/// A test's overlay network on the lab: removes the network's OVN rows (reconciling it to
/// nothing) and the test's OVS ports when created (leftovers of a killed run) and when dropped
/// (also after a failure midway).
pub struct LabNetwork {
    /// The lab.
    pub lab: Lab,
    /// The network's name.
    pub network: String,
    /// OVS ports the test plugs, as (node, port).
    pub ovs_ports: Vec<(String, String)>,
}

impl LabNetwork {
    /// Take charge of `network` and the OVS ports `(node, port)`, cleaning up leftovers first.
    pub fn new(lab: &Lab, network: &str, ovs_ports: &[(&str, &str)]) -> LabNetwork {
        let n = LabNetwork {
            lab: lab.clone(),
            network: network.into(),
            ovs_ports: ovs_ports
                .iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect(),
        };
        n.clean();
        n
    }

    fn clean(&self) {
        reconcile_on_lab(
            &self.lab,
            &self.network,
            &roam_network::topology::Topology::default(),
        );
        for (node, port) in &self.ovs_ports {
            let db = format!("--db={}", self.lab.node(node).ovs_db);
            let _ = try_run(
                "ovs-vsctl",
                &[&db, "--if-exists", "del-port", "br-int", port],
            );
        }
    }
}

impl Drop for LabNetwork {
    fn drop(&mut self) {
        self.clean();
    }
}

/// `ovn-trace` of `microflow` entering logical datapath `datapath` (a switch or router
/// name), against the lab's southbound database, after `ovn-nbctl --wait=sb sync` (so the
/// logical flows of everything committed so far are there). `args` go before the datapath
/// (e.g. `--minimal`, `--ct=new`). Returns the trace's output (panics if ovn-trace fails).
pub fn ovn_trace(lab: &Lab, datapath: &str, microflow: &str, args: &[&str]) -> String {
    nbctl(lab, &["--wait=sb", "sync"]);
    let db = format!("--db={}", lab.var("OVN_SB_DB"));
    let mut all = vec![db.as_str()];
    all.extend_from_slice(args);
    all.push(datapath);
    all.push(microflow);
    let trace = run("ovn-trace", &all);
    // ovn-trace reports a bad microflow on stdout and exits 0
    if trace.starts_with("error") || trace.contains("error parsing flow") {
        panic!("ovn-trace {datapath} {microflow:?}: {trace}");
    }
    trace
}

/// The logical ports an `ovn-trace` output sends the packet out of (its `output("P")`
/// actions that reach a port: `output;` alone is not one), in order. Accepts both the
/// detailed form (`output("P")` / `/* output to "P" */`) and the `--minimal` form.
pub fn trace_outputs(trace: &str) -> Vec<String> {
    let mut out = Vec::new();
    for marker in ["output(\"", "output to \""] {
        let mut rest = trace;
        while let Some(i) = rest.find(marker) {
            rest = &rest[i + marker.len()..];
            if let Some(end) = rest.find('"') {
                let port = rest[..end].to_string();
                if !out.contains(&port) {
                    out.push(port);
                }
            }
        }
    }
    out
}

/// An `ovn-trace` microflow: an ICMP echo request entering through logical port `inport`.
pub fn icmp_microflow(inport: &str, eth_src: &str, eth_dst: &str, src: &str, dst: &str) -> String {
    format!(
        "inport==\"{inport}\" && eth.src=={eth_src} && eth.dst=={eth_dst} && ip4.src=={src} && \
         ip4.dst=={dst} && ip.ttl==64 && icmp4.type==8 && icmp4.code==0"
    )
}

/// Where OVN may bind logical port `lsp`: `chassis` (one: a plain binding; two: the
/// multi-chassis binding of a live migration, the second activated by the guest's RARP).
pub fn set_port_chassis(lab: &Lab, lsp: &str, chassis: &[&str]) {
    let requested = format!("requested-chassis={}", chassis.join(","));
    let mut args = vec!["--wait=hv", "lsp-set-options", lsp, requested.as_str()];
    if chassis.len() > 1 {
        args.push("activation-strategy=rarp");
    }
    nbctl(lab, &args);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trace_outputs_reads_both_forms_once_each_in_order() {
        let detailed = "output(\"lsp-b\");\n/* output to \"lsp-b\", type \"\" */\noutput;\n\
                        output(\"lsp-c\");";
        assert_eq!(trace_outputs(detailed), vec!["lsp-b", "lsp-c"]);
        assert_eq!(trace_outputs("output;\nnext;"), Vec::<String>::new());
    }
}
