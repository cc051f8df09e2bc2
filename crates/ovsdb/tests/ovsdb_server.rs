//! The OVSDB client against a real `ovsdb-server` that each test starts for itself (a
//! private temp dir, database, unix socket and TCP port), so tests run in parallel.
//!
//! Needs `ovsdb-server`, `ovsdb-tool`, `ovs-appctl` and the OVN NB / Open_vSwitch schemas
//! (`/usr/share/ovn/ovn-nb.ovsschema`, `/usr/share/openvswitch/vswitch.ovsschema`).

use std::fs;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use roam_ovsdb::Error;
use roam_ovsdb::nb::{self, *};
use roam_ovsdb::vswitch::{self, Bridge, Interface, Port};
use roam_ovsdb::{
    Client, ClientOptions, Monitor, MonitorEvent, MonitorMethod, MonitorRequest, ReconnectOptions,
    ReconnectingClient, TableRow, TlsFiles, TlsSettings, Uuid, insert_op, ops, select_all,
    select_where,
};
use serde_json::{Value, json};

const NB_SCHEMA: &str = "/usr/share/ovn/ovn-nb.ovsschema";
const VSWITCH_SCHEMA: &str = "/usr/share/openvswitch/vswitch.ovsschema";
/// Upper bound for anything the tests wait for; normally reached in milliseconds.
const PATIENCE: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------------------
// fixture

/// A directory removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        static N: AtomicU32 = AtomicU32::new(0);
        let p = std::env::temp_dir().join(format!(
            "roam-ovsdb-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&p);
        fs::create_dir_all(&p).expect("create temp dir");
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// An `ovsdb-server` child process serving one database file over a unix socket and an
/// ephemeral TCP port (an SSL one with [`OvsdbServer::start_ssl`]); killed (and resumed
/// first, if stopped) on drop.
struct OvsdbServer {
    child: Option<Child>,
    tcp_port: u16,
    stopped: bool,
    /// `pssl:` instead of `ptcp:`, with the key, certificate and CA in this directory.
    ssl: Option<PathBuf>,
    dir: TempDir,
}

impl OvsdbServer {
    fn start(schema: &str) -> Self {
        Self::start_with(schema, None)
    }

    /// Listening on `pssl:` (no `ptcp:`) with `pki`'s server key and certificate, trusting
    /// its CA.
    fn start_ssl(schema: &str, pki: &Pki) -> Self {
        Self::start_with(schema, Some(pki.dir.0.clone()))
    }

    fn start_with(schema: &str, ssl: Option<PathBuf>) -> Self {
        let dir = TempDir::new(Path::new(schema).file_stem().unwrap().to_str().unwrap());
        let out = Command::new("ovsdb-tool")
            .arg("create")
            .arg(dir.0.join("db"))
            .arg(schema)
            .output()
            .expect("run ovsdb-tool (is openvswitch installed?)");
        assert!(
            out.status.success(),
            "ovsdb-tool create failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut s = OvsdbServer {
            child: None,
            tcp_port: 0,
            stopped: false,
            ssl,
            dir,
        };
        s.spawn();
        s
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.0.join(name)
    }

    /// Start the server process and wait (bounded) until it accepts connections.
    fn spawn(&mut self) {
        assert!(self.child.is_none(), "server already running");
        let log = self.path("log");
        let log_start = fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
        let stderr = fs::File::create(self.path("stderr")).unwrap();
        let mut cmd = Command::new("ovsdb-server");
        cmd.arg(format!("--remote=punix:{}", self.path("db.sock").display()));
        match &self.ssl {
            // the log names no remote with its port: one TCP listener only
            None => cmd.arg("--remote=ptcp:0:127.0.0.1"),
            Some(pki) => cmd
                .arg("--remote=pssl:0:127.0.0.1")
                .arg(format!(
                    "--private-key={}",
                    pki.join("server.key").display()
                ))
                .arg(format!(
                    "--certificate={}",
                    pki.join("server.pem").display()
                ))
                .arg(format!("--ca-cert={}", pki.join("ca.pem").display())),
        };
        let child = cmd
            .arg(format!("--pidfile={}", self.path("pid").display()))
            .arg(format!("--unixctl={}", self.path("ctl").display()))
            .arg(format!("--log-file={}", log.display()))
            .arg("--no-chdir")
            .arg(self.path("db"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .expect("spawn ovsdb-server (is openvswitch installed?)");
        self.child = Some(child);
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                self.child = None;
                panic!(
                    "ovsdb-server exited at startup ({status})\n--- log tail ---\n{}\n--- stderr ---\n{}",
                    self.log_tail(),
                    fs::read_to_string(self.path("stderr")).unwrap_or_default()
                );
            }
            let port = listening_port(&log, log_start);
            if let Some(port) = port
                && std::os::unix::net::UnixStream::connect(self.path("db.sock")).is_ok()
            {
                self.tcp_port = port;
                return;
            }
            if Instant::now() > deadline {
                panic!(
                    "ovsdb-server did not start listening within {PATIENCE:?}\n--- log tail ---\n{}",
                    self.log_tail()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn unix(&self) -> String {
        format!("unix:{}", self.path("db.sock").display())
    }

    fn tcp(&self) -> String {
        format!("tcp:127.0.0.1:{}", self.tcp_port)
    }

    fn ssl(&self) -> String {
        format!("ssl:127.0.0.1:{}", self.tcp_port)
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().expect("server running").id()
    }

    fn signal(&self, sig: &str) {
        let st = Command::new("kill")
            .arg(format!("-{sig}"))
            .arg(self.pid().to_string())
            .status()
            .expect("run kill");
        assert!(st.success(), "kill -{sig} failed");
    }

    /// SIGSTOP: the server keeps its sockets but answers nothing.
    fn stop(&mut self) {
        self.signal("STOP");
        self.stopped = true;
    }

    /// SIGCONT.
    fn cont(&mut self) {
        self.signal("CONT");
        self.stopped = false;
    }

    /// SIGKILL, and reap it.
    fn kill9(&mut self) {
        let mut child = self.child.take().expect("server running");
        child.kill().expect("kill -9 ovsdb-server");
        child.wait().unwrap();
        self.stopped = false;
    }

    /// A unixctl command, e.g. `memory/show`.
    fn appctl(&self, cmd: &str) -> String {
        let out = Command::new("ovs-appctl")
            .arg("-t")
            .arg(self.path("ctl"))
            .arg(cmd)
            .output()
            .expect("run ovs-appctl");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Run a transaction on the database file with `ovsdb-tool` (server not running).
    fn offline_transact(&self, txn: Value) {
        let out = Command::new("ovsdb-tool")
            .arg("transact")
            .arg(self.path("db"))
            .arg(txn.to_string())
            .output()
            .unwrap();
        assert!(
            out.status.success() && !String::from_utf8_lossy(&out.stdout).contains("error"),
            "ovsdb-tool transact: {} {}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn log_tail(&self) -> String {
        let log = fs::read_to_string(self.path("log")).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

impl Drop for OvsdbServer {
    fn drop(&mut self) {
        if self.stopped {
            let _ = Command::new("kill")
                .arg("-CONT")
                .arg(self.pid().to_string())
                .status();
        }
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A CA and certificates made with `openssl` for one test: `server` (subjectAltName
/// IP:127.0.0.1), `client`, and `other-client` from another CA (`other-ca`).
struct Pki {
    dir: TempDir,
}

impl Pki {
    fn new() -> Self {
        let dir = TempDir::new("pki");
        let pki = Pki { dir };
        pki.ca("ca");
        pki.ca("other-ca");
        pki.issue(
            "server",
            "ca",
            "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth",
        );
        pki.issue("client", "ca", "extendedKeyUsage=clientAuth");
        pki.issue("other-client", "other-ca", "extendedKeyUsage=clientAuth");
        pki
    }

    fn openssl(&self, args: &[&str]) {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(&self.dir.0)
            .output()
            .expect("run openssl (is it installed?)");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// `openssl req` making a new P-256 key, with `args` (output files, subject, ...).
    fn new_key(&self, args: &[&str]) {
        let ec = [
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        self.openssl(&[&ec[..], args].concat());
    }

    fn ca(&self, name: &str) {
        let (key, pem, subj) = (
            format!("{name}.key"),
            format!("{name}.pem"),
            format!("/CN=roam-test-{name}"),
        );
        self.new_key(&[
            "-x509", "-keyout", &key, "-out", &pem, "-days", "2", "-subj", &subj,
        ]);
    }

    fn issue(&self, name: &str, ca: &str, ext: &str) {
        let [key, csr, pem, extf, ca_pem, ca_key] = [
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.pem"),
            format!("{name}.ext"),
            format!("{ca}.pem"),
            format!("{ca}.key"),
        ];
        fs::write(self.dir.0.join(&extf), format!("{ext}\n")).unwrap();
        self.new_key(&[
            "-keyout",
            &key,
            "-out",
            &csr,
            "-subj",
            &format!("/CN={name}"),
        ]);
        self.openssl(&[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            &ca_pem,
            "-CAkey",
            &ca_key,
            "-CAcreateserial",
            "-out",
            &pem,
            "-days",
            "2",
            "-extfile",
            &extf,
        ]);
    }

    /// Client options trusting `ca` and presenting `who`'s certificate.
    fn client(&self, ca: &str, who: &str) -> ClientOptions {
        let f = |n: String| self.dir.0.join(n);
        let files = TlsFiles {
            ca: f(format!("{ca}.pem")),
            cert: f(format!("{who}.pem")),
            key: f(format!("{who}.key")),
        };
        ClientOptions {
            tls: Some(TlsSettings::from_pem_files(&files).expect("usable PEM files")),
            ..ClientOptions::default()
        }
    }
}

/// The port of the `ptcp:0` (or `pssl:0`) remote, from the log lines written after `from`.
fn listening_port(log: &Path, from: u64) -> Option<u16> {
    let mut f = fs::File::open(log).ok()?;
    f.seek(SeekFrom::Start(from)).ok()?;
    let mut s = String::new();
    f.read_to_string(&mut s).ok()?;
    s.lines()
        .find_map(|l| l.split("listening on port ").nth(1))
        .and_then(|p| p.trim().parse().ok())
}

/// Poll `cond` until it holds, failing after [`PATIENCE`].
async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + PATIENCE;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn next_event(m: &mut Monitor) -> MonitorEvent {
    tokio::time::timeout(PATIENCE, m.next())
        .await
        .expect("a monitor event within the deadline")
        .expect("a monitor event")
}

fn names<T: TableRow>(rows: &[T], name: impl Fn(&T) -> &str) -> Vec<String> {
    let mut v: Vec<String> = rows.iter().map(|r| name(r).to_string()).collect();
    v.sort();
    v
}

fn ids() -> StringMap {
    [("roam.dev/owner".to_string(), "test".to_string())].into()
}

/// The uuid returned by insert number `i` of a transaction.
fn inserted(res: &[Value], i: usize) -> Uuid {
    res[i]["uuid"][1]
        .as_str()
        .unwrap_or_else(|| panic!("insert {i} returned no uuid: {res:?}"))
        .parse()
        .unwrap()
}

/// `op` with `row[column] = value` (to put named-uuid references into a typed insert).
fn with(mut op: Value, column: &str, value: Value) -> Value {
    op["row"][column] = value;
    op
}

fn named(name: &str) -> Value {
    ops::named_uuid(name)
}

fn named_set(names: &[&str]) -> Value {
    ops::set(names.iter().map(|n| ops::named_uuid(n)).collect())
}

fn insert_ls(name: &str) -> Value {
    ops::insert("Logical_Switch", json!({"name": name}), None)
}

// ---------------------------------------------------------------------------------------
// typed rows

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typed_round_trip_of_every_nb_row_type() {
    let server = OvsdbServer::start(NB_SCHEMA);
    // over TCP, to cover that transport too
    let c = Client::connect(&server.tcp()).await.unwrap();
    assert_eq!(c.echo(json!(["hi"])).await.unwrap(), json!(["hi"]));
    assert!(
        c.list_dbs()
            .await
            .unwrap()
            .contains(&nb::DATABASE.to_string())
    );

    let mut dhcp = DhcpOptions {
        cidr: "10.0.0.5/32".into(),
        options: [
            ("lease_time", "3600"),
            ("router", "10.0.0.1"),
            ("server_id", "10.0.0.1"),
            ("server_mac", "0a:00:00:00:00:01"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .into(),
        external_ids: ids(),
        ..Default::default()
    };
    let mut qos = Qos {
        priority: 100,
        direction: QosDirection::ToLport,
        match_: "outport == \"vm1\"".into(),
        action: [("dscp".to_string(), 10)].into(),
        bandwidth: [("rate".to_string(), 10_000), ("burst".to_string(), 1_000)].into(),
        external_ids: ids(),
        ..Default::default()
    };
    let mut lsp = LogicalSwitchPort {
        name: "vm1".into(),
        kind: "".into(),
        addresses: ["0a:00:00:00:00:05 10.0.0.5".to_string()].into(),
        port_security: ["0a:00:00:00:00:05 10.0.0.5".to_string()].into(),
        options: [("requested-chassis".to_string(), "node-a".to_string())].into(),
        dhcpv4_options: None,
        tag: Some(100),
        tag_request: Some(0),
        up: Some(false),
        enabled: Some(true),
        external_ids: ids(),
        ..Default::default()
    };
    let mut ls = LogicalSwitch {
        name: "ls1".into(),
        other_config: [("subnet".to_string(), "10.0.0.0/24".to_string())].into(),
        external_ids: ids(),
        ..Default::default()
    };
    let mut lrp = LogicalRouterPort {
        name: "lrp1".into(),
        mac: "0a:00:00:00:00:01".into(),
        networks: ["10.0.0.1/24".to_string(), "fd00::1/64".to_string()].into(),
        options: [("gateway_mtu".to_string(), "1400".to_string())].into(),
        external_ids: ids(),
        ..Default::default()
    };
    let mut route = LogicalRouterStaticRoute {
        ip_prefix: "10.0.0.5/32".into(),
        nexthop: "10.0.0.5".into(),
        output_port: Some("lrp1".into()),
        policy: Some(RoutePolicy::DstIp),
        route_table: "".into(),
        external_ids: ids(),
        ..Default::default()
    };
    let mut nat = Nat {
        kind: NatType::Snat,
        external_ip: "192.0.2.10".into(),
        logical_ip: "10.0.0.0/24".into(),
        external_ids: ids(),
        ..Default::default()
    };
    let mut lr = LogicalRouter {
        name: "lr1".into(),
        options: [("chassis".to_string(), "node-a".to_string())].into(),
        external_ids: ids(),
        ..Default::default()
    };

    // one transaction, checked against the schema first; non-root rows are referenced by
    // named-uuid so they are not garbage-collected
    let res = c
        .transact_checked(
            nb::DATABASE,
            vec![
                insert_op(&dhcp, Some("dhcp")),
                insert_op(&qos, Some("qos")),
                with(
                    insert_op(&lsp, Some("lsp")),
                    "dhcpv4_options",
                    named("dhcp"),
                ),
                with(
                    with(insert_op(&ls, None), "ports", named_set(&["lsp"])),
                    "qos_rules",
                    named_set(&["qos"]),
                ),
                insert_op(&lrp, Some("lrp")),
                insert_op(&route, Some("route")),
                insert_op(&nat, Some("nat")),
                with(
                    with(
                        with(insert_op(&lr, None), "ports", named_set(&["lrp"])),
                        "static_routes",
                        named_set(&["route"]),
                    ),
                    "nat",
                    named_set(&["nat"]),
                ),
                ops::comment("roam-ovsdb test: typed round trip"),
            ],
        )
        .await
        .expect("insert the typed rows");
    dhcp.uuid = inserted(&res, 0);
    qos.uuid = inserted(&res, 1);
    lsp.uuid = inserted(&res, 2);
    lsp.dhcpv4_options = Some(dhcp.uuid);
    ls.uuid = inserted(&res, 3);
    ls.ports = [lsp.uuid].into();
    ls.qos_rules = [qos.uuid].into();
    lrp.uuid = inserted(&res, 4);
    route.uuid = inserted(&res, 5);
    nat.uuid = inserted(&res, 6);
    lr.uuid = inserted(&res, 7);
    lr.ports = [lrp.uuid].into();
    lr.static_routes = [route.uuid].into();
    lr.nat = [nat.uuid].into();

    assert_eq!(select_all::<DhcpOptions>(&c).await.unwrap(), vec![dhcp]);
    assert_eq!(select_all::<Qos>(&c).await.unwrap(), vec![qos]);
    assert_eq!(
        select_all::<LogicalSwitchPort>(&c).await.unwrap(),
        vec![lsp.clone()]
    );
    assert_eq!(select_all::<LogicalSwitch>(&c).await.unwrap(), vec![ls]);
    assert_eq!(
        select_all::<LogicalRouterPort>(&c).await.unwrap(),
        vec![lrp]
    );
    assert_eq!(
        select_all::<LogicalRouterStaticRoute>(&c).await.unwrap(),
        vec![route]
    );
    assert_eq!(select_all::<Nat>(&c).await.unwrap(), vec![nat]);
    assert_eq!(select_all::<LogicalRouter>(&c).await.unwrap(), vec![lr]);

    // unset optional columns come back as None
    c.transact(
        nb::DATABASE,
        vec![ops::update(
            "Logical_Switch_Port",
            vec![ops::cond("name", "==", json!("vm1"))],
            json!({"tag": ops::set(vec![]), "up": ops::set(vec![])}),
        )],
    )
    .await
    .unwrap();
    let got = select_where::<LogicalSwitchPort>(&c, vec![ops::cond("name", "==", json!("vm1"))])
        .await
        .unwrap();
    assert_eq!((got[0].tag, got[0].up), (None, None));
    assert_eq!(got[0].uuid, lsp.uuid);
    assert!(
        select_where::<LogicalSwitchPort>(&c, vec![ops::cond("name", "==", json!("nope"))])
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typed_round_trip_of_open_vswitch_rows() {
    let server = OvsdbServer::start(VSWITCH_SCHEMA);
    let c = Client::connect(&server.unix()).await.unwrap();
    let mut iface = Interface {
        name: "vm1".into(),
        kind: "internal".into(),
        external_ids: [("iface-id".to_string(), "vm1".to_string())].into(),
        ofport: Some(5),
        options: [("key".to_string(), "value".to_string())].into(),
        ..Default::default()
    };
    let mut port = Port {
        name: "vm1".into(),
        ..Default::default()
    };
    let mut br = Bridge {
        name: "br-int".into(),
        ..Default::default()
    };
    let res = c
        .transact_checked(
            vswitch::DATABASE,
            vec![
                insert_op(&iface, Some("iface")),
                with(
                    insert_op(&port, Some("port")),
                    "interfaces",
                    named_set(&["iface"]),
                ),
                with(insert_op(&br, Some("br")), "ports", named_set(&["port"])),
                ops::insert("Open_vSwitch", json!({"bridges": named_set(&["br"])}), None),
            ],
        )
        .await
        .expect("insert the typed rows");
    iface.uuid = inserted(&res, 0);
    port.uuid = inserted(&res, 1);
    port.interfaces = [iface.uuid].into();
    br.uuid = inserted(&res, 2);
    br.ports = [port.uuid].into();
    assert_eq!(select_all::<Interface>(&c).await.unwrap(), vec![iface]);
    assert_eq!(select_all::<Port>(&c).await.unwrap(), vec![port]);
    assert_eq!(select_all::<Bridge>(&c).await.unwrap(), vec![br]);
}

// ---------------------------------------------------------------------------------------
// monitors

async fn monitor_sees_initial_insert_modify_delete(method: MonitorMethod) {
    let server = OvsdbServer::start(NB_SCHEMA);
    let c = Client::connect(&server.unix()).await.unwrap();
    c.transact(nb::DATABASE, vec![insert_ls("a")])
        .await
        .unwrap();

    let mut m = c
        .monitor_with(
            nb::DATABASE,
            vec![MonitorRequest::for_row::<LogicalSwitch>()],
            method,
        )
        .await
        .unwrap();
    assert_eq!(m.method(), method);

    let ev = next_event(&mut m).await;
    let MonitorEvent::Initial(init) = &ev else {
        panic!("first event must be the initial state: {ev:?}")
    };
    assert_eq!(init["Logical_Switch"].len(), 1);
    let (a_uuid, a) = init["Logical_Switch"].iter().next().unwrap();
    let a: LogicalSwitch = a.new_as("Logical_Switch", a_uuid).unwrap().unwrap();
    assert_eq!(a.name, "a");
    assert_eq!(a.uuid, *a_uuid);

    // insert
    let res = c
        .transact(nb::DATABASE, vec![insert_ls("b")])
        .await
        .unwrap();
    let b_uuid = inserted(&res, 0);
    let ev = next_event(&mut m).await;
    let MonitorEvent::Update(up) = &ev else {
        panic!("{ev:?}")
    };
    let ru = &up["Logical_Switch"][&b_uuid];
    assert!(ru.is_insert(), "{ru:?}");
    let b: LogicalSwitch = ru.new_as("Logical_Switch", &b_uuid).unwrap().unwrap();
    assert_eq!(b.name, "b");
    // a default-valued column omitted by update2 is filled in
    assert!(ru.new.as_ref().unwrap().contains_key("external_ids"));

    // modify: a scalar and a map
    c.transact(
        nb::DATABASE,
        vec![ops::update(
            "Logical_Switch",
            vec![ops::cond("name", "==", json!("b"))],
            json!({"name": "b2", "external_ids": ops::string_map([("k", "v")])}),
        )],
    )
    .await
    .unwrap();
    let ev = next_event(&mut m).await;
    let ru = &ev.updates()["Logical_Switch"][&b_uuid];
    assert!(ru.is_modify(), "{ru:?}");
    assert_eq!(ru.changed_columns(), vec!["external_ids", "name"]);
    let old: LogicalSwitch = ru.old_as("Logical_Switch", &b_uuid).unwrap().unwrap();
    let new: LogicalSwitch = ru.new_as("Logical_Switch", &b_uuid).unwrap().unwrap();
    assert_eq!((old.name.as_str(), new.name.as_str()), ("b", "b2"));
    assert!(old.external_ids.is_empty());
    assert_eq!(new.external_ids["k"], "v");

    // a second map change exercises update2's map difference
    c.transact(
        nb::DATABASE,
        vec![ops::mutate(
            "Logical_Switch",
            vec![ops::cond("name", "==", json!("b2"))],
            vec![ops::mutation(
                "external_ids",
                "insert",
                ops::string_map([("k2", "v2")]),
            )],
        )],
    )
    .await
    .unwrap();
    let ev = next_event(&mut m).await;
    let new: LogicalSwitch = ev.updates()["Logical_Switch"][&b_uuid]
        .new_as("Logical_Switch", &b_uuid)
        .unwrap()
        .unwrap();
    assert_eq!(new.external_ids.len(), 2);

    // delete
    c.transact(
        nb::DATABASE,
        vec![ops::delete(
            "Logical_Switch",
            vec![ops::cond("name", "==", json!("a"))],
        )],
    )
    .await
    .unwrap();
    let ev = next_event(&mut m).await;
    let ru = &ev.updates()["Logical_Switch"][a_uuid];
    assert!(ru.is_delete(), "{ru:?}");
    assert_eq!(ru.old.as_ref().unwrap()["name"], json!("a"));

    // the replica matches the database
    let replica = m.typed::<LogicalSwitch>().unwrap();
    assert_eq!(replica, select_all::<LogicalSwitch>(&c).await.unwrap());
    assert!(m.try_next().is_none(), "no unexpected events");

    // the server knows the monitor until we cancel it
    assert!(server.appctl("memory/show").contains("monitors:1"));
    m.cancel().await.unwrap();
    wait_until("the server to drop the monitor", || {
        server.appctl("memory/show").contains("monitors:0")
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn monitor_cond_sees_initial_then_insert_modify_delete() {
    monitor_sees_initial_insert_modify_delete(MonitorMethod::MonitorCond).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rfc7047_monitor_sees_initial_then_insert_modify_delete() {
    monitor_sees_initial_insert_modify_delete(MonitorMethod::Monitor).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn monitor_cond_filters_rows_and_dropping_a_monitor_cancels_it() {
    let server = OvsdbServer::start(NB_SCHEMA);
    let c = Client::connect(&server.unix()).await.unwrap();
    // Auto picks monitor_cond on this server
    let mut m = c
        .monitor(
            nb::DATABASE,
            vec![
                MonitorRequest::for_row::<LogicalSwitch>().conditions(vec![ops::cond(
                    "name",
                    "==",
                    json!("wanted"),
                )]),
            ],
        )
        .await
        .unwrap();
    assert_eq!(m.method(), MonitorMethod::MonitorCond);
    assert!(next_event(&mut m).await.updates()["Logical_Switch"].is_empty());
    // the transaction's reply comes after the update it caused, so once transact returned
    // the event is queued, or was never sent
    c.transact(nb::DATABASE, vec![insert_ls("other"), insert_ls("wanted")])
        .await
        .unwrap();
    let ev = next_event(&mut m).await;
    let rows = &ev.updates()["Logical_Switch"];
    assert_eq!(rows.len(), 1, "{ev:?}");
    assert_eq!(
        rows.values().next().unwrap().new.as_ref().unwrap()["name"],
        json!("wanted")
    );
    assert!(m.try_next().is_none());

    assert!(server.appctl("memory/show").contains("monitors:1"));
    drop(m);
    wait_until("monitor_cancel after drop", || {
        server.appctl("memory/show").contains("monitors:0")
    })
    .await;
    // the connection is still fine
    assert_eq!(c.echo(json!([1])).await.unwrap(), json!([1]));
}

// ---------------------------------------------------------------------------------------
// schema

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schema_validation_rejects_bad_names_without_a_round_trip() {
    let mut server = OvsdbServer::start(NB_SCHEMA);
    let c = Client::connect_with(
        &server.unix(),
        ClientOptions {
            request_timeout: Duration::from_secs(2),
            inactivity_probe: None,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let schema = c.get_schema(nb::DATABASE).await.unwrap();
    assert_eq!(schema.name, nb::DATABASE);
    let name = schema.column("Logical_Switch", "name").unwrap();
    assert!(name.ty.is_scalar());
    let tag = &schema.column("Logical_Switch_Port", "tag").unwrap().ty;
    assert_eq!(
        (tag.min, tag.max, tag.key.max_integer),
        (0, Some(1), Some(4095))
    );
    // every column our typed rows read exists in the installed schema
    fn check<T: TableRow>(s: &roam_ovsdb::DatabaseSchema) {
        for col in T::COLUMNS {
            s.column(T::TABLE, col)
                .unwrap_or_else(|e| panic!("{}: {e}", T::TABLE));
        }
    }
    check::<LogicalSwitch>(&schema);
    check::<LogicalSwitchPort>(&schema);
    check::<LogicalRouter>(&schema);
    check::<LogicalRouterPort>(&schema);
    check::<LogicalRouterStaticRoute>(&schema);
    check::<Nat>(&schema);
    check::<DhcpOptions>(&schema);
    check::<Qos>(&schema);
    let vs: roam_ovsdb::DatabaseSchema = roam_ovsdb::DatabaseSchema::from_json(
        &serde_json::from_str(&fs::read_to_string(VSWITCH_SCHEMA).unwrap()).unwrap(),
    )
    .unwrap();
    check::<Bridge>(&vs);
    check::<Port>(&vs);
    check::<Interface>(&vs);

    assert!(matches!(
        c.get_schema("No_Such_DB").await,
        Err(Error::Rpc { .. })
    ));

    // cache the schema, then freeze the server: the checks must answer without it
    c.schema(nb::DATABASE).await.unwrap();
    server.stop();
    let err = c
        .transact_checked(
            nb::DATABASE,
            vec![ops::insert(
                "Logical_Switch_Port",
                json!({"name": "x", "no_such_column": 1}),
                None,
            )],
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::UnknownColumn { table, column, .. } if table == "Logical_Switch_Port" && column == "no_such_column"),
        "{err}"
    );
    assert!(err.to_string().contains("no_such_column"), "{err}");
    let err = c
        .transact_checked(nb::DATABASE, vec![ops::delete("Logical_switch", vec![])])
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::UnknownTable { table, .. } if table == "Logical_switch"),
        "{err}"
    );
    let err = c
        .transact_checked(
            nb::DATABASE,
            vec![ops::insert("NAT", json!({"type": "masquerade"}), None)],
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::InvalidValue { column, reason, .. } if column == "type" && reason.contains("snat")),
        "{err}"
    );
    let err = c
        .monitor(
            nb::DATABASE,
            vec![MonitorRequest::table("Logical_Switch").columns(&["nmae"])],
        )
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::UnknownColumn { column, .. } if column == "nmae"),
        "{err}"
    );
    server.cont();

    // without the check the server rejects the same transaction itself
    let err = c
        .transact(
            nb::DATABASE,
            vec![ops::insert(
                "Logical_Switch",
                json!({"no_such_column": 1}),
                None,
            )],
        )
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Transaction { index: 0, .. }), "{err}");
    // the server's tag is one that refuses the request, not a server failure
    assert!(err.is_bad_input(), "{err}");
}

// ---------------------------------------------------------------------------------------
// failures

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnecting_client_recovers_from_kill_9() {
    let mut server = OvsdbServer::start(NB_SCHEMA);
    let rc = ReconnectingClient::connect(
        &server.unix(),
        ReconnectOptions {
            min_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_millis(500),
            client: ClientOptions {
                request_timeout: PATIENCE,
                ..Default::default()
            },
        },
    )
    .await
    .expect("first connection");
    rc.transact(nb::DATABASE, vec![insert_ls("before")])
        .await
        .unwrap();
    let mut m = rc
        .monitor(
            nb::DATABASE,
            vec![MonitorRequest::for_row::<LogicalSwitch>()],
        )
        .await
        .unwrap();
    assert!(next_event(&mut m).await.is_initial());
    assert_eq!(
        names(&m.typed::<LogicalSwitch>().unwrap(), |r| &r.name),
        ["before"]
    );
    let first = rc.client().unwrap();

    // a transaction in flight when the server dies
    server.stop();
    let mut in_flight = tokio::spawn({
        let c = rc.client().unwrap();
        async move { c.transact(nb::DATABASE, vec![insert_ls("in-flight")]).await }
    });
    assert!(
        tokio::time::timeout(Duration::from_millis(300), &mut in_flight)
            .await
            .is_err(),
        "a stopped server cannot have answered"
    );
    server.kill9();
    let err = tokio::time::timeout(PATIENCE, in_flight)
        .await
        .expect("the in-flight request fails promptly")
        .unwrap()
        .unwrap_err();
    assert!(
        matches!(err, Error::Disconnected(ref m) if m == "transact"),
        "{err}"
    );
    assert!(err.to_string().contains("unknown"), "{err}");

    // while the server is down, requests fail at once
    wait_until("the client to notice", || !rc.is_connected()).await;
    assert!(first.is_closed());
    let err = rc.echo(json!([])).await.unwrap_err();
    assert!(matches!(err, Error::NotConnected { .. }), "{err}");

    // the database changes while we are away, then the server comes back on the same socket
    server.offline_transact(json!([nb::DATABASE, {"op": "insert", "table": "Logical_Switch", "row": {"name": "while-down"}}]));
    server.spawn();

    // the monitor is re-established and delivers a fresh initial state
    let ev = next_event(&mut m).await;
    assert!(ev.is_initial(), "{ev:?}");
    assert_eq!(
        names(&m.typed::<LogicalSwitch>().unwrap(), |r| &r.name),
        ["before", "while-down"],
        "the in-flight transaction never reached the server, and the resync shows it"
    );
    rc.wait_connected(PATIENCE).await.unwrap();
    assert_eq!(rc.echo(json!(["back"])).await.unwrap(), json!(["back"]));
    assert!(!rc.client().unwrap().is_closed());

    // and keeps following changes
    rc.transact(nb::DATABASE, vec![insert_ls("after")])
        .await
        .unwrap();
    let ev = next_event(&mut m).await;
    assert!(!ev.is_initial());
    assert_eq!(
        names(&m.typed::<LogicalSwitch>().unwrap(), |r| &r.name),
        ["after", "before", "while-down"]
    );

    // cancelling works on the new connection
    m.cancel().await.unwrap();
    wait_until("monitor_cancel on the new connection", || {
        server.appctl("memory/show").contains("monitors:0")
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnecting_client_waits_for_a_server_that_is_not_up_yet() {
    let mut server = OvsdbServer::start(NB_SCHEMA);
    server.kill9();
    let rc = ReconnectingClient::start(
        &server.unix(),
        ReconnectOptions {
            min_backoff: Duration::from_millis(20),
            max_backoff: Duration::from_millis(200),
            ..Default::default()
        },
    )
    .unwrap();
    let err = rc
        .wait_connected(Duration::from_millis(100))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::NotConnected { .. }), "{err}");
    server.spawn();
    rc.wait_connected(PATIENCE).await.unwrap();
    assert!(
        rc.list_dbs()
            .await
            .unwrap()
            .contains(&nb::DATABASE.to_string())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inactivity_probe_detects_a_server_that_stops_answering() {
    let mut server = OvsdbServer::start(NB_SCHEMA);
    let c = Client::connect_with(
        &server.unix(),
        ClientOptions {
            request_timeout: Duration::from_secs(120),
            inactivity_probe: Some(Duration::from_millis(200)),
            probe_timeout: Duration::from_millis(300),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let mut m = c
        .monitor(nb::DATABASE, vec![MonitorRequest::table("Logical_Switch")])
        .await
        .unwrap();
    assert!(next_event(&mut m).await.is_initial());

    // a healthy idle server answers the probes: after several probe periods of silence
    // from our side the connection is still up
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!c.is_closed(), "closed: {:?}", c.close_reason());
    assert_eq!(c.echo(json!(["alive"])).await.unwrap(), json!(["alive"]));

    server.stop();
    let started = Instant::now();
    let pending = tokio::spawn({
        let c = c.clone();
        async move { c.echo(json!(["unanswered"])).await }
    });
    tokio::time::timeout(PATIENCE, c.closed())
        .await
        .expect("the probe declares the stopped server dead");
    assert!(
        started.elapsed() < Duration::from_secs(120),
        "long before the request timeout"
    );
    let reason = c.close_reason().unwrap();
    assert!(reason.contains("inactivity probe"), "{reason}");
    let err = pending.await.unwrap().unwrap_err();
    assert!(matches!(err, Error::Disconnected(_)), "{err}");
    assert!(matches!(m.next().await, Err(Error::Disconnected(_))));
    assert!(matches!(
        c.echo(json!([])).await,
        Err(Error::Disconnected(_))
    ));
    server.cont();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_times_out_and_the_late_reply_is_ignored() {
    let mut server = OvsdbServer::start(NB_SCHEMA);
    let c = Client::connect_with(
        &server.unix(),
        ClientOptions {
            request_timeout: Duration::from_millis(500),
            inactivity_probe: None,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    server.stop();
    let started = Instant::now();
    let err = c.echo(json!(["late"])).await.unwrap_err();
    assert!(
        matches!(&err, Error::Timeout { method, .. } if method == "echo"),
        "{err}"
    );
    assert!(started.elapsed() < PATIENCE);
    server.cont();
    // the late reply to the timed-out request does not confuse the connection
    let c = c.with_timeout(PATIENCE);
    assert_eq!(c.echo(json!(["again"])).await.unwrap(), json!(["again"]));
    assert!(!c.is_closed());
}

// ---------------------------------------------------------------------------------------
// ssl:

/// `ssl:` against ovsdb-server's `pssl:`: a client with a certificate of the server's CA
/// reads and writes; one whose certificate another CA signed, one without TLS settings, one
/// that trusts another CA and one that expects another server name are refused, each with
/// an error that says so, and nothing they sent reached the database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ssl_needs_a_certificate_the_server_trusts_and_a_server_it_trusts() {
    let pki = Pki::new();
    let server = OvsdbServer::start_ssl(NB_SCHEMA, &pki);
    let c = Client::connect_with(&server.ssl(), pki.client("ca", "client"))
        .await
        .expect("a client of the server's CA connects");
    c.transact_checked("OVN_Northbound", vec![insert_ls("over-tls")])
        .await
        .expect("a transaction over TLS");
    let rows: Vec<LogicalSwitch> = select_all(&c).await.unwrap();
    assert_eq!(names(&rows, |r| &r.name), ["over-tls"]);

    // the server refuses a certificate another CA signed: the handshake or the first
    // request fails, and the write never lands
    let stranger = async {
        let c = Client::connect_with(&server.ssl(), pki.client("ca", "other-client")).await?;
        c.transact_checked("OVN_Northbound", vec![insert_ls("stranger")])
            .await
            .map(|_| ())
    };
    let e = tokio::time::timeout(PATIENCE, stranger)
        .await
        .expect("refused in time")
        .expect_err("a certificate of another CA is refused");
    assert!(
        matches!(e, Error::Tls(_) | Error::Disconnected(_) | Error::Io(_)),
        "{e}"
    );

    // no TLS settings: refused before connecting
    let e = Client::connect(&server.ssl()).await.unwrap_err();
    assert!(
        e.to_string().contains("needs a CA, a client certificate"),
        "{e}"
    );
    assert!(e.is_bad_input());

    // this client does not trust the server's CA
    let e = Client::connect_with(&server.ssl(), pki.client("other-ca", "other-client"))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, Error::Tls(m) if m.contains("TLS handshake") && m.contains("other-ca.pem")),
        "{e}"
    );

    // the server's certificate names 127.0.0.1, not the name this client expects
    let mut named = pki.client("ca", "client");
    named.tls = named.tls.map(|t| t.server_name("ovnnb.example").unwrap());
    let e = Client::connect_with(&server.ssl(), named)
        .await
        .unwrap_err();
    assert!(
        matches!(&e, Error::Tls(m) if m.contains("TLS handshake")),
        "{e}"
    );

    // plain TCP to the TLS port gets no answer the client accepts
    let plain = Client::connect_with(
        &server.tcp(),
        ClientOptions {
            request_timeout: Duration::from_secs(5),
            ..ClientOptions::default()
        },
    )
    .await
    .expect("TCP connects");
    assert!(plain.echo(json!(["x"])).await.is_err());

    let rows: Vec<LogicalSwitch> = select_all(&c).await.unwrap();
    assert_eq!(
        names(&rows, |r| &r.name),
        ["over-tls"],
        "nothing else landed"
    );
}

/// One client configuration connects again and again (the controller's readiness check
/// every 10 s, a reconnect after the NB restarts): ovsdb-server's OpenSSL refuses a resumed
/// session ("session id context uninitialized"), so every connection must be a full
/// handshake. With rustls' default session cache two in three connections failed. And each
/// ends with a TLS close_notify (ovsdb-server logged every one as a truncated session).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ssl_connects_again_and_again_with_one_configuration() {
    let pki = Pki::new();
    let server = OvsdbServer::start_ssl(NB_SCHEMA, &pki);
    let options = pki.client("ca", "client");
    for i in 0..5 {
        let c = Client::connect_with(&server.ssl(), options.clone())
            .await
            .unwrap_or_else(|e| panic!("connection {i}: {e}\n{}", server.log_tail()));
        let dbs = c
            .list_dbs()
            .await
            .unwrap_or_else(|e| panic!("connection {i}: {e}\n{}", server.log_tail()));
        assert!(dbs.iter().any(|d| d == "OVN_Northbound"), "{dbs:?}");
    }
    // every client handle dropped: each connection ends with a TLS close_notify, so the
    // server logs no truncated session. Once the server has closed its side of every
    // connection (none established or waiting for its close), it has read how each ended.
    wait_until("the server closed every connection", || {
        server_connections(server.tcp_port) == 0
    })
    .await;
    let log = fs::read_to_string(server.path("log")).unwrap_or_default();
    assert!(
        !log.contains("unexpected eof") && !log.contains("connection dropped"),
        "every connection closed cleanly:\n{}",
        server.log_tail()
    );
}

/// The server's TCP connections on `port` that are established or that the peer closed
/// and the server has not (from /proc/net/tcp: local port `port`, state 01 or 08).
fn server_connections(port: u16) -> usize {
    let table = fs::read_to_string("/proc/net/tcp").expect("read /proc/net/tcp");
    table
        .lines()
        .skip(1)
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let local_port = f
                .get(1)
                .and_then(|a| a.rsplit_once(':'))
                .and_then(|(_, p)| u16::from_str_radix(p, 16).ok());
            local_port == Some(port) && matches!(f.get(3), Some(&"01") | Some(&"08"))
        })
        .count()
}

/// Unusable PEM files are refused up front, naming the file.
#[test]
fn tls_files_that_cannot_be_used_are_named() {
    let pki = Pki::new();
    let f = |n: &str| pki.dir.0.join(n);
    let files = |ca: &str, cert: &str, key: &str| TlsFiles {
        ca: f(ca),
        cert: f(cert),
        key: f(key),
    };
    for (fs, needle) in [
        (
            files("missing.pem", "client.pem", "client.key"),
            "missing.pem",
        ),
        (files("client.key", "client.pem", "client.key"), "CA file"),
        (
            files("ca.pem", "client.key", "client.key"),
            "certificate file",
        ),
        (
            files("ca.pem", "client.pem", "client.pem"),
            "private key file",
        ),
        (
            files("ca.pem", "client.pem", "server.key"),
            "do not go together",
        ),
    ] {
        let e = TlsSettings::from_pem_files(&fs).unwrap_err();
        assert!(e.to_string().contains(needle), "{needle}: {e}");
    }
}
