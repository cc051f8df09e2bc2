//! The lab's OVN is real: roam's OVSDB client talks RFC 7047 to the NB database over unix
//! and TCP sockets (echo, list_dbs, transact, an aborted transaction that changes nothing),
//! both chassis are registered, and `ovn-trace` shows OVN answering DHCP for a port with
//! roam's /32 lease.

use roam_e2e::{Lab, nbctl, run};
use roam_ovsdb::Error;
use roam_ovsdb::{Client, ops};
use serde_json::json;

#[tokio::test]
async fn ovsdb_echo_list_dbs_and_transact_on_nb() {
    let lab = Lab::get();
    for endpoint in [lab.nb(), lab.nb_tcp()] {
        let nb = Client::connect(endpoint).await.expect("connect to NB");
        assert_eq!(
            nb.echo(json!(["roam", 1])).await.unwrap(),
            json!(["roam", 1])
        );
        assert!(
            nb.list_dbs()
                .await
                .unwrap()
                .contains(&"OVN_Northbound".to_string())
        );

        let name = format!("e2e-ovsdb-{}", endpoint.split(':').next().unwrap());
        nb.transact(
            "OVN_Northbound",
            vec![ops::delete(
                "Logical_Switch",
                vec![ops::cond("name", "==", json!(name))],
            )],
        )
        .await
        .unwrap();
        let res = nb
            .transact(
                "OVN_Northbound",
                vec![
                    ops::insert(
                        "Logical_Switch",
                        json!({"name": name, "external_ids": ops::string_map([("roam.dev/test", "lab_ovn")])}),
                        Some("ls"),
                    ),
                    ops::comment("roam e2e: lab_ovn"),
                ],
            )
            .await
            .expect("insert a logical switch");
        assert!(
            res[0]["uuid"][1].is_string(),
            "insert returns the new row's uuid: {res:?}"
        );

        // cross-check with OVN's own tool
        let listed = nbctl(
            &lab,
            &[
                "--bare",
                "--columns=name",
                "find",
                "Logical_Switch",
                &format!("name={name}"),
            ],
        );
        assert_eq!(listed.trim(), name);

        // A transaction whose second operation fails is aborted as a whole: nothing of it
        // lands in the database.
        let other = format!("{name}-never");
        let err = nb
            .transact(
                "OVN_Northbound",
                vec![
                    ops::insert("Logical_Switch", json!({"name": other}), None),
                    ops::insert(
                        "Logical_Switch_Port",
                        json!({"name": "x", "no_such_column": 1}),
                        None,
                    ),
                ],
            )
            .await
            .expect_err("a bad column must fail the transaction");
        assert!(matches!(err, Error::Transaction { index: 1, .. }), "{err}");
        let rows = nb
            .transact(
                "OVN_Northbound",
                vec![ops::select(
                    "Logical_Switch",
                    vec![ops::cond("name", "==", json!(other))],
                    None,
                )],
            )
            .await
            .unwrap();
        assert_eq!(
            rows[0]["rows"],
            json!([]),
            "the aborted transaction left nothing behind"
        );

        nb.transact(
            "OVN_Northbound",
            vec![ops::delete(
                "Logical_Switch",
                vec![ops::cond("name", "==", json!(name))],
            )],
        )
        .await
        .unwrap();
    }
}

#[tokio::test]
async fn a_wrong_endpoint_is_a_clear_error() {
    let err = Client::connect("unix:/nonexistent/ovnnb_db.sock")
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("/nonexistent/ovnnb_db.sock"),
        "{err}"
    );
    assert!(matches!(
        Client::connect("ovnnb").await,
        Err(Error::InvalidEndpoint(_))
    ));
}

#[test]
fn both_chassis_are_registered_with_geneve() {
    let lab = Lab::get();
    let sb = lab.var("OVN_SB_DB").to_string();
    for node in ["node-a", "node-b"] {
        let encap = run(
            "ovn-sbctl",
            &[
                &format!("--db={sb}"),
                "--bare",
                "--columns=encaps",
                "list",
                "Chassis",
                node,
            ],
        );
        let ty = run(
            "ovn-sbctl",
            &[
                &format!("--db={sb}"),
                "--bare",
                "--columns=type",
                "list",
                "Encap",
                encap.trim(),
            ],
        );
        assert_eq!(ty.trim(), "geneve", "chassis {node}");
    }
}

#[test]
fn ovn_trace_shows_put_dhcp_opts_for_a_32_lease() {
    let lab = Lab::get();
    let (ls, lsp, mac, ip, gw) = (
        "e2e-trace-ls",
        "e2e-trace-port",
        "0a:00:00:e2:e0:11",
        "10.251.1.11",
        "10.251.0.1",
    );
    let _ = roam_e2e::try_run(
        "ovn-nbctl",
        &[&format!("--db={}", lab.nb()), "--if-exists", "ls-del", ls],
    );
    for row in nbctl(
        &lab,
        &[
            "--bare",
            "--columns=_uuid",
            "find",
            "DHCP_Options",
            &format!("cidr=\"{ip}/32\""),
        ],
    )
    .lines()
    {
        nbctl(&lab, &["destroy", "DHCP_Options", row.trim()]);
    }
    nbctl(&lab, &["ls-add", ls]);
    nbctl(
        &lab,
        &[
            "lsp-add",
            ls,
            lsp,
            "--",
            "lsp-set-addresses",
            lsp,
            &format!("{mac} {ip}"),
        ],
    );
    // roam's default lease: the on-link route to the gateway leads (Debian's dhclient installs
    // no routes without it)
    let routes = format!("{{{gw}/32,0.0.0.0, 0.0.0.0/0,{gw}}}");
    let dhcp = nbctl(
        &lab,
        &[
            "create",
            "DHCP_Options",
            &format!("cidr={ip}/32"),
            &format!(
                "options=\"lease_time\"=\"3600\" \"router\"=\"{gw}\" \"server_id\"=\"{gw}\" \
                 \"server_mac\"=\"0a:00:00:00:00:01\" \"classless_static_route\"=\"{routes}\" \"mtu\"=\"1500\""
            ),
        ],
    );
    nbctl(&lab, &["lsp-set-dhcpv4-options", lsp, dhcp.trim()]);
    nbctl(&lab, &["--wait=sb", "sync"]);
    let flow = format!(
        "inport==\"{lsp}\" && eth.src=={mac} && eth.dst==ff:ff:ff:ff:ff:ff && ip4.src==0.0.0.0 && \
         ip4.dst==255.255.255.255 && udp.src==68 && udp.dst==67 && ip.ttl==64"
    );
    let trace = run(
        "ovn-trace",
        &[
            &format!("--db={}", lab.var("OVN_SB_DB")),
            "--minimal",
            ls,
            &flow,
        ],
    );
    let put = trace
        .lines()
        .find(|l| l.contains("put_dhcp_opts"))
        .unwrap_or_else(|| panic!("no put_dhcp_opts in ovn-trace:\n{trace}"));
    assert!(put.contains(&format!("offerip = {ip}")), "{put}");
    assert!(put.contains("netmask = 255.255.255.255"), "{put}");
    assert!(put.contains(&format!("router = {gw}")), "{put}");
    assert!(
        put.contains(&format!(
            "classless_static_route = {{{gw}/32, 0.0.0.0, 0.0.0.0/0, {gw}}}"
        )),
        "{put}"
    );
    assert!(
        trace.contains(&format!("output(\"{lsp}\")"))
            || trace.contains(&format!("output(\\\"{lsp}\\\")")),
        "{trace}"
    );
    nbctl(&lab, &["ls-del", ls]);
    nbctl(&lab, &["destroy", "DHCP_Options", dhcp.trim()]);
}
