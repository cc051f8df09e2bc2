//! The node's Open_vSwitch database adapter (through roam-ovsdb): the bridge ports of an
//! attachment, created with their `external_ids` in one transaction and removed by name in
//! one transaction.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use roam_ovsdb::vswitch::{Bridge, DATABASE, Interface, Port};
use roam_ovsdb::{Client, ClientOptions, TableRow, ops, select_where};
use serde_json::{Value, json};

use crate::check::ObservedPort;
use crate::error::{Error, Result};
use crate::plan::ids;

/// How long to wait to connect, and for each request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// A port of the bridge that roam-cni created, with its interface's `external_ids`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttachmentPort {
    /// What CHECK compares.
    pub port: ObservedPort,
    /// The interface's `external_ids`.
    pub external_ids: BTreeMap<String, String>,
}

/// A connection to the node's Open_vSwitch database, for one bridge.
pub struct Ovs {
    client: Client,
    bridge: String,
}

fn ovs_err(what: &str) -> impl FnOnce(roam_ovsdb::Error) -> Error + '_ {
    move |e| Error::Ovsdb(format!("{what}: {e}"))
}

impl Ovs {
    /// Connect to `endpoint`; unreachable is [`Error::OvsdbUnreachable`] (try again later).
    pub async fn connect(endpoint: &str, bridge: &str) -> Result<Ovs> {
        let unreachable = |reason: String| Error::OvsdbUnreachable {
            endpoint: endpoint.into(),
            reason,
        };
        let options = ClientOptions {
            request_timeout: REQUEST_TIMEOUT,
            inactivity_probe: None,
            ..ClientOptions::default()
        };
        let client = tokio::time::timeout(REQUEST_TIMEOUT, Client::connect_with(endpoint, options))
            .await
            .map_err(|_| unreachable(format!("no connection within {REQUEST_TIMEOUT:?}")))?
            .map_err(|e| unreachable(e.to_string()))?;
        Ok(Ovs {
            client,
            bridge: bridge.into(),
        })
    }

    /// The bridge's name.
    pub fn bridge(&self) -> &str {
        &self.bridge
    }

    /// Does the bridge exist?
    pub async fn bridge_exists(&self) -> Result<bool> {
        let rows: Vec<Bridge> = select_where(
            &self.client,
            vec![ops::cond("name", "==", json!(self.bridge))],
        )
        .await
        .map_err(ovs_err("read the bridge"))?;
        Ok(!rows.is_empty())
    }

    /// The bridge's `datapath_type` (`""`/`system`: the kernel's; `netdev`: userspace).
    pub async fn datapath_type(&self) -> Result<String> {
        let res = self
            .client
            .transact(
                DATABASE,
                vec![ops::select(
                    "Bridge",
                    vec![ops::cond("name", "==", json!(self.bridge))],
                    Some(&["datapath_type"]),
                )],
            )
            .await
            .map_err(ovs_err("read the bridge's datapath type"))?;
        Ok(res[0]["rows"]
            .get(0)
            .and_then(|r| r.get("datapath_type"))
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string())
    }

    /// Add port `name` (a system interface of the same name) to the bridge with
    /// `external_ids`, in one transaction.
    pub async fn add_port(
        &self,
        name: &str,
        external_ids: &BTreeMap<String, String>,
    ) -> Result<()> {
        let ids = ops::string_map(external_ids.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        let txn = vec![
            ops::insert(
                Interface::TABLE,
                json!({"name": name, "type": "", "external_ids": ids}),
                Some("iface"),
            ),
            ops::insert(
                Port::TABLE,
                json!({"name": name, "interfaces": ops::named_uuid("iface")}),
                Some("port"),
            ),
            ops::mutate(
                "Bridge",
                vec![ops::cond("name", "==", json!(self.bridge))],
                vec![ops::mutation(
                    "ports",
                    "insert",
                    ops::set(vec![ops::named_uuid("port")]),
                )],
            ),
            ops::comment(&format!("roam-cni: add port {name}")),
        ];
        let res = self
            .client
            .transact(DATABASE, txn)
            .await
            .map_err(ovs_err(&format!("add port {name} to {}", self.bridge)))?;
        if res
            .get(2)
            .and_then(|r| r.get("count"))
            .and_then(Value::as_u64)
            != Some(1)
        {
            return Err(Error::Ovsdb(format!(
                "add port {name}: bridge {} does not exist on this node (is ovn-controller set up?)",
                self.bridge
            )));
        }
        Ok(())
    }

    /// Wait until ovs-vswitchd has opened every interface in `names` (ofport > 0), for at
    /// most `timeout`.
    pub async fn wait_opened(&self, names: &[String], timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let mut pending = Vec::new();
            for n in names {
                let row = self.interface_row(n).await?;
                match row
                    .as_ref()
                    .and_then(|r| r.get("ofport"))
                    .and_then(Value::as_i64)
                {
                    Some(p) if p > 0 => {}
                    Some(-1) => {
                        let why = row
                            .as_ref()
                            .and_then(|r| r.get("error"))
                            .and_then(Value::as_str)
                            .unwrap_or("no reason given")
                            .to_string();
                        return Err(Error::Ovsdb(format!(
                            "ovs-vswitchd could not open interface {n}: {why}"
                        )));
                    }
                    _ => pending.push(n.clone()),
                }
            }
            if pending.is_empty() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(Error::Ovsdb(format!(
                    "ovs-vswitchd did not open {} within {timeout:?} (is it running?)",
                    pending.join(", ")
                )));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    async fn interface_row(&self, name: &str) -> Result<Option<Value>> {
        let res = self
            .client
            .transact(
                DATABASE,
                vec![ops::select(
                    "Interface",
                    vec![ops::cond("name", "==", json!(name))],
                    Some(&["ofport", "error"]),
                )],
            )
            .await
            .map_err(ovs_err(&format!("read interface {name}")))?;
        Ok(res[0]
            .get("rows")
            .and_then(Value::as_array)
            .and_then(|r| r.first())
            .cloned())
    }

    /// Ports whose interface's `external_ids` include every pair of `ids`.
    pub async fn find(&self, filter: &[(&str, &str)]) -> Result<Vec<AttachmentPort>> {
        let rows: Vec<Interface> = select_where(
            &self.client,
            vec![ops::cond(
                "external_ids",
                "includes",
                ops::string_map(filter.iter().copied()),
            )],
        )
        .await
        .map_err(ovs_err("find roam-cni interfaces"))?;
        Ok(rows.into_iter().map(attachment_port).collect())
    }

    /// The interfaces named `names` (those that exist).
    pub async fn named(&self, names: &[String]) -> Result<Vec<AttachmentPort>> {
        let mut out = Vec::new();
        for n in names {
            let rows: Vec<Interface> =
                select_where(&self.client, vec![ops::cond("name", "==", json!(n))])
                    .await
                    .map_err(ovs_err(&format!("read interface {n}")))?;
            out.extend(rows.into_iter().map(attachment_port));
        }
        Ok(out)
    }

    /// Remove the ports named `names` from every bridge (their Port and Interface rows go
    /// with them); returns how many existed.
    pub async fn delete_ports(&self, names: &[String]) -> Result<usize> {
        if names.is_empty() {
            return Ok(0);
        }
        let mut uuids = Vec::new();
        for n in names {
            let rows: Vec<Port> =
                select_where(&self.client, vec![ops::cond("name", "==", json!(n))])
                    .await
                    .map_err(ovs_err(&format!("read port {n}")))?;
            uuids.extend(rows.into_iter().map(|p| p.uuid.to_json()));
        }
        if uuids.is_empty() {
            return Ok(0);
        }
        let count = uuids.len();
        self.client
            .transact(
                DATABASE,
                vec![
                    ops::mutate(
                        "Bridge",
                        vec![],
                        vec![ops::mutation("ports", "delete", ops::set(uuids))],
                    ),
                    ops::comment(&format!("roam-cni: delete ports {}", names.join(" "))),
                ],
            )
            .await
            .map_err(ovs_err(&format!("delete ports {}", names.join(", "))))?;
        Ok(count)
    }
}

fn attachment_port(i: Interface) -> AttachmentPort {
    AttachmentPort {
        port: ObservedPort {
            name: i.name.clone(),
            iface_id: i.external_ids.0.get(ids::IFACE_ID).cloned(),
            ofport: i.ofport,
        },
        external_ids: i.external_ids.0,
    }
}
