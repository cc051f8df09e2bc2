//! The fast route flip's pure half: move one address's /32 from node X to node Y in one small
//! transaction, without re-reading the network (a full reconcile reads every row the network
//! owns, too slow for a switchover inside a VM's pause window).
//!
//! It changes exactly what the plan says a flip changes: the fabric route's next hop (X's
//! transit address → Y's), X's local route out, Y's local route in. A `wait` on the fabric
//! route makes the transaction fail, changing nothing, if someone else moved the address in
//! between. A reconcile of the plan with the address on Y afterwards has nothing to do.
//! [`crate::northbound::flip_route`] reads the routes ([`flip_select`]) and sends
//! [`flip_ops`]'s transaction.

use std::net::Ipv4Addr;

use roam_contract::keys::OWNER_KEY;
use roam_ovsdb::ops;
use serde_json::{Value, json};

use super::overlay::{NodeSpec, gateway_port_name, mobile_gateway_port_name, node_router_name};
use crate::{Error, Result};

const ROUTES: &str = "Logical_Router_Static_Route";

/// What a route flip did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flip {
    /// The routes moved.
    Moved,
    /// The address already lived on the target: nothing was sent.
    AlreadyThere,
}

/// The transaction a route flip sends, from [`flip_ops`].
#[derive(Clone, Debug, PartialEq)]
pub enum FlipPlan {
    /// The address already lives on the target: send nothing.
    AlreadyThere,
    /// Send `ops`; when the flip bumps `NB_Global:nb_cfg`, `nb_cfg_at` is the index of the
    /// operation whose result holds the new value.
    Send {
        /// The transaction.
        ops: Vec<Value>,
        /// Index of the `select` of `NB_Global:nb_cfg`, when marked.
        nb_cfg_at: Option<usize>,
    },
}

fn owned(network: &str) -> Value {
    ops::cond(
        "external_ids",
        "includes",
        ops::string_map([(OWNER_KEY, network)]),
    )
}

fn uuid_of(row: &Value) -> Option<String> {
    row.get("_uuid")?.get(1)?.as_str().map(str::to_string)
}

fn output_port(row: &Value) -> Option<&str> {
    // an optional column reads as a string, or as an empty set
    row.get("output_port").and_then(Value::as_str)
}

/// The `select` of the owned routes for `ip`'s /32 in `network`: its result's `rows` are
/// what [`flip_ops`] decides from.
pub fn flip_select(network: &str, ip: Ipv4Addr) -> Value {
    ops::select(
        ROUTES,
        vec![
            ops::cond("ip_prefix", "==", json!(format!("{ip}/32"))),
            owned(network),
        ],
        Some(&["_uuid", "nexthop", "output_port"]),
    )
}

/// The transaction that moves `ip`'s /32 in overlay `network` from `from` to `to`, given the
/// routes [`flip_select`] found; `mark` also bumps `NB_Global:nb_cfg` (the mechanism of
/// `ovn-nbctl --wait=hv`). [`Error::InvalidTopology`] when the routes are not where the plan
/// puts them on `from`.
pub fn flip_ops(
    network: &str,
    ip: Ipv4Addr,
    from: &NodeSpec,
    to: &NodeSpec,
    mark: bool,
    rows: &[Value],
) -> Result<FlipPlan> {
    let prefix = format!("{ip}/32");
    let invalid = |reason: String| Error::InvalidTopology {
        network: network.to_string(),
        reason,
    };
    let (from_gw, to_gw) = (
        gateway_port_name(network, &from.name),
        gateway_port_name(network, &to.name),
    );
    let mobile_gw = mobile_gateway_port_name(network);
    if rows
        .iter()
        .any(|r| output_port(r) == Some(mobile_gw.as_str()))
    {
        return Err(invalid(format!(
            "{prefix} is a mobile port's: its route never moves (its chassis binding does)"
        )));
    }
    let fabric = rows.iter().find(|r| output_port(r).is_none());
    let local_from = rows
        .iter()
        .find(|r| output_port(r) == Some(from_gw.as_str()));
    let local_to = rows.iter().find(|r| output_port(r) == Some(to_gw.as_str()));
    let Some(fabric) = fabric else {
        return Err(invalid(format!(
            "no fabric route for {prefix}: reconcile the network first"
        )));
    };
    let fabric_hop = fabric["nexthop"].as_str().unwrap_or_default();
    if fabric_hop == to.join_ip.to_string() && local_to.is_some() && local_from.is_none() {
        return Ok(FlipPlan::AlreadyThere);
    }
    if fabric_hop != from.join_ip.to_string() {
        return Err(invalid(format!(
            "{prefix} is routed to {fabric_hop}, not to {} ({}): refusing to move it",
            from.name, from.join_ip
        )));
    }
    let Some(local_from) = local_from else {
        return Err(invalid(format!(
            "no local route for {prefix} on {}",
            node_router_name(network, &from.name)
        )));
    };
    let (fabric_uuid, local_uuid) = (
        uuid_of(fabric).unwrap_or_default(),
        uuid_of(local_from).unwrap_or_default(),
    );
    let router = |node: &str| {
        vec![
            ops::cond("name", "==", json!(node_router_name(network, node))),
            owned(network),
        ]
    };
    // both routers exist (or nothing happens)
    let exists = |node: &str| {
        let name = node_router_name(network, node);
        json!({"op": "wait", "table": "Logical_Router", "timeout": 0, "where": router(node),
               "columns": ["name"], "until": "==", "rows": [{"name": name}]})
    };
    let mut txn = vec![
        exists(&from.name),
        exists(&to.name),
        // nobody moved it since we looked
        json!({"op": "wait", "table": ROUTES, "timeout": 0, "where": [ops::cond("_uuid", "==", ops::uuid(&fabric_uuid))],
               "columns": ["nexthop"], "until": "==", "rows": [{"nexthop": from.join_ip.to_string()}]}),
        ops::update(
            ROUTES,
            vec![ops::cond("_uuid", "==", ops::uuid(&fabric_uuid))],
            json!({"nexthop": to.join_ip.to_string()}),
        ),
        ops::mutate(
            "Logical_Router",
            router(&from.name),
            vec![ops::mutation(
                "static_routes",
                "delete",
                ops::set(vec![ops::uuid(&local_uuid)]),
            )],
        ),
        ops::delete(
            ROUTES,
            vec![ops::cond("_uuid", "==", ops::uuid(&local_uuid))],
        ),
    ];
    if local_to.is_none() {
        txn.push(ops::insert(
            ROUTES,
            json!({"ip_prefix": prefix, "nexthop": ip.to_string(), "output_port": to_gw,
                   "external_ids": ops::string_map([(OWNER_KEY, network)])}),
            Some("local"),
        ));
        txn.push(ops::mutate(
            "Logical_Router",
            router(&to.name),
            vec![ops::mutation(
                "static_routes",
                "insert",
                ops::set(vec![ops::named_uuid("local")]),
            )],
        ));
    }
    let nb_cfg_at = mark.then(|| {
        txn.push(ops::mutate(
            "NB_Global",
            vec![],
            vec![ops::mutation("nb_cfg", "+=", json!(1))],
        ));
        txn.push(ops::select("NB_Global", vec![], Some(&["nb_cfg"])));
        txn.len() - 1
    });
    txn.push(ops::comment(&format!(
        "roam: route flip {prefix} {} -> {}",
        from.name, to.name
    )));
    Ok(FlipPlan::Send {
        ops: txn,
        nb_cfg_at,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::fixtures::nodes;

    const IP: Ipv4Addr = Ipv4Addr::new(100, 64, 0, 10);

    fn route(uuid: &str, hop: Ipv4Addr, port: Option<&str>) -> Value {
        let mut r = json!({"_uuid": ["uuid", uuid], "nexthop": hop.to_string()});
        r["output_port"] = port.map_or(json!(["set", []]), |p| json!(p));
        r
    }

    /// The fabric route toward `on` and `on`'s local route, as the select reads them.
    fn routes_on(on: &NodeSpec) -> Vec<Value> {
        vec![
            route("f", on.join_ip, None),
            route("l", IP, Some(&gateway_port_name("ovl", &on.name))),
        ]
    }

    #[test]
    fn a_flip_moves_the_fabric_hop_and_both_local_routes_and_marks_nb_cfg() {
        let n = nodes();
        let FlipPlan::Send { ops, nb_cfg_at } =
            flip_ops("ovl", IP, &n[0], &n[1], true, &routes_on(&n[0])).unwrap()
        else {
            panic!("nothing to send");
        };
        let kinds: Vec<&str> = ops.iter().map(|o| o["op"].as_str().unwrap()).collect();
        assert_eq!(
            kinds,
            [
                "wait", "wait", "wait", "update", "mutate", "delete", "insert", "mutate", "mutate",
                "select", "comment"
            ]
        );
        assert_eq!(ops[3]["row"]["nexthop"], n[1].join_ip.to_string());
        let at = nb_cfg_at.unwrap();
        assert_eq!(ops[at]["table"], "NB_Global");
    }

    #[test]
    fn an_address_already_on_the_target_sends_nothing() {
        let n = nodes();
        let plan = flip_ops("ovl", IP, &n[0], &n[1], false, &routes_on(&n[1])).unwrap();
        assert_eq!(plan, FlipPlan::AlreadyThere);
    }

    #[test]
    fn routes_that_are_not_on_the_source_are_refused() {
        let n = nodes();
        let mut elsewhere = routes_on(&n[0]);
        elsewhere[0] = route("f", Ipv4Addr::new(169, 254, 100, 99), None);
        let mobile = vec![route("m", IP, Some("ovl-fabric-mobile"))];
        for rows in [vec![], elsewhere, routes_on(&n[0])[..1].to_vec(), mobile] {
            let err = flip_ops("ovl", IP, &n[0], &n[1], false, &rows).unwrap_err();
            assert!(matches!(err, Error::InvalidTopology { .. }), "{err}");
        }
    }
}
