//! The shim's runtime: one libvirt domain on this node, its plumbing, its migration jobs and
//! its lifecycle event log. The HTTP server ([`crate::server`]) is a thin layer over [`Shim`].
//!
//! - **Start**: re-attach to a running domain of the VM's name (a restarted shim: no second
//!   domain, no second tap); otherwise, in [`Mode::Boot`], boot it — once in the shim's life,
//!   recorded in the state file, so a shim restarted after its VM migrated away never boots a
//!   second copy; in [`Mode::Incoming`], wait for `prepare`.
//! - **Migration**: peer-to-peer (`virDomainMigrateToURI3` with `VIR_MIGRATE_PEER2PEER`): the
//!   source libvirtd drives all phases (prepare, perform, finish, confirm) with the target
//!   libvirtd itself. The shim only starts it, polls its stats, and can abort it. A shim that
//!   dies mid-migration does not strand a half-done migration (with a client-driven
//!   `migrate3` the client runs the phases), and the shim needs no connection of its own to
//!   the target's libvirtd — the URI comes from the target shim's `prepare`.
//! - **Shutdown** (SIGTERM): the domain keeps running. A shim restart must never cost the VM
//!   its life, and after a switchover the source shim has nothing left to stop. The tap and
//!   OVS port are removed only when no domain of the VM's name is on this node.

use std::collections::{BTreeSet, VecDeque};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, watch};
use virt::connect::Connect;
use virt::domain::{Domain, DomainState as VirtState, MigrateParameters as VirtParams};
use virt::sys;

use crate::api::{
    self, DomainState, Incoming, Job, JobState, JobStats, MigrateRequest, PortState, Prepared,
    PreparedNic, Status,
};
use crate::client::ShimClient;
use crate::config::{Migration, Mode, ShimConfig};
use crate::events::{AtDeadline, Event, Lifecycle, POST_COPY_START_GRACE, at_deadline};
use crate::proxy::{Outgoing, Sockets, wait_listening};
use crate::sys::{LifecycleSubscription, RawLifecycle};
use crate::{Error, Result, domain, net};
use roam_shim_api::tls::{ClientTls, Identity};

/// How long a prepare waits for the pod's migration proxy to listen: within the source
/// shim's request bound ([`roam_shim_api::client::REQUEST_TIMEOUT`]), and past the moment an
/// earlier runner of the VM on this node, terminating, lets go of the port.
const PROXY_WAIT: Duration = Duration::from_secs(20);

/// Where libvirt sends a migration: the target libvirtd's URI and the migration URI
/// (through the proxies: the pods' sockets; a `unix://` URI is the path the target QEMU
/// listens on in its pod and the source QEMU connects to in its own).
struct MigrationRoute {
    libvirt_uri: String,
    uri: String,
}

/// Events kept for the long poll.
const EVENT_LOG_CAP: usize = 1024;
/// How often a running job's stats are sampled.
const STATS_EVERY: Duration = Duration::from_millis(100);
/// How long `status` waits for libvirt before it answers with the domain state the last
/// lifecycle event left (libvirt holds its answers for seconds while it finishes an incoming
/// migration or tears a migrated domain down).
const STATUS_LIBVIRT_BOUND: Duration = Duration::from_millis(200);

/// Nanoseconds since the Unix epoch.
pub fn unix_ns(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// What a starting shim does with its VM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StartAction {
    /// A domain of the VM's name is on this node: take it over (a restarted shim).
    ReAttach,
    /// Boot the VM.
    Boot,
    /// Wait for an incoming migration.
    WaitForMigration,
    /// Boot mode, but this shim booted the VM before and it is not here any more (it
    /// migrated away): booting it again would run two copies with one MAC and IP.
    NoSecondBoot,
}

/// The decision at start (pure): whether a domain of the VM's name is on this node, the
/// mode, and whether the state file says this shim booted the VM before.
pub fn start_action(domain_here: bool, mode: Mode, booted_before: bool) -> StartAction {
    match (domain_here, mode, booted_before) {
        (true, _, _) => StartAction::ReAttach,
        (false, Mode::Incoming, _) => StartAction::WaitForMigration,
        (false, Mode::Boot, true) => StartAction::NoSecondBoot,
        (false, Mode::Boot, false) => StartAction::Boot,
    }
}

/// The domain's state after lifecycle event `kind`, `before` it (pure): what `status`
/// answers while libvirt is too busy to be asked.
pub fn state_after(kind: Lifecycle, before: DomainState) -> DomainState {
    match kind {
        Lifecycle::Started
        | Lifecycle::ResumedAfterMigration
        | Lifecycle::ResumedPostCopy
        | Lifecycle::Resumed => DomainState::Running,
        Lifecycle::IncomingMigration
        | Lifecycle::SuspendedForMigration
        | Lifecycle::SuspendedForPostCopy
        | Lifecycle::Suspended => DomainState::Paused,
        // the shim's domains are transient: stopped or migrated, they are gone
        Lifecycle::MigratedAway | Lifecycle::Stopped | Lifecycle::Failed => DomainState::Absent,
        Lifecycle::Crashed => DomainState::Crashed,
        // the guest boots again in the same QEMU
        Lifecycle::Reset => DomainState::Running,
        Lifecycle::Other => before,
    }
}

/// How long the shim waits at start for libvirtd to answer (the pod's own daemon starts
/// beside it; its first start probes QEMU's capabilities).
pub const LIBVIRT_START_WAIT: Duration = Duration::from_secs(120);

/// One reboot can be several reset events: the firmware (SeaBIOS) resets the machine once
/// more as it starts after a reset, and libvirt reports both, tens of ms apart. A guest cannot
/// boot and reset again this fast.
pub const RESET_COALESCE: Duration = Duration::from_secs(1);

/// Whether a reset event `at` is a new reboot, the last one having come `last` (pure).
pub fn is_new_reset(last: Option<SystemTime>, at: SystemTime) -> bool {
    match last {
        None => true,
        // a clock step backwards: count it rather than lose a reboot
        Some(l) => at.duration_since(l).map_or(true, |d| d >= RESET_COALESCE),
    }
}

/// The domain state as last seen, by a libvirt query or a lifecycle event. `generation`
/// counts the events, so that a query that started before an event cannot overwrite it.
struct Known {
    state: DomainState,
    generation: u64,
}

/// What the state file records.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct Persisted {
    /// The shim booted its VM once already.
    booted: bool,
    /// The VM was torn down (deleted): never boot, receive or migrate it again.
    #[serde(default)]
    torn_down: bool,
}

struct JobCtl {
    dom: Domain,
    aborted: Arc<AtomicBool>,
}

#[derive(Default)]
struct State {
    job: Option<Job>,
    ctl: Option<JobCtl>,
    incoming: bool,
    last_incoming: Option<Incoming>,
    persisted: Persisted,
    /// Guest resets seen since the shim started (one per reboot: see [`RESET_COALESCE`]).
    resets: u64,
    /// When the last reset event arrived.
    last_reset: Option<SystemTime>,
    /// The running outgoing migration's pause, as reported.
    pause: crate::events::Pause,
    /// Taps ovn-controller has installed here (a target's, before its VM came in). Once
    /// installed a port stays so for this launcher (only the controller's rollback unbinds
    /// it, and that deletes the launcher): the status polls OVS only for the others, so a
    /// copy's 50 ms status polls cost no OVSDB round trips once every port is in.
    installed: BTreeSet<String>,
}

struct EventLog {
    events: VecDeque<Event>,
    next_seq: u64,
}

struct Inner {
    cfg: ShimConfig,
    conn: Connect,
    state: Mutex<State>,
    log: Mutex<EventLog>,
    latest: watch::Sender<u64>,
    /// Turns true when a libvirt connection is lost.
    lost: watch::Sender<bool>,
    next_job: AtomicU64,
    known: Mutex<Known>,
    /// A libvirt state query is in flight (at most one: a busy libvirt is not piled on).
    querying: AtomicBool,
    _subscription: LifecycleSubscription,
}

/// The shim: cheap to clone, shared by the API's handlers.
#[derive(Clone)]
pub struct Shim {
    inner: Arc<Inner>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f)
        .await
        .expect("a blocking libvirt call panicked")
}

fn lookup(conn: &Connect, name: &str) -> Option<Domain> {
    conn.lookup_domain_by_name(name).ok()
}

fn domain_state(dom: Option<&Domain>) -> DomainState {
    let Some(dom) = dom else {
        return DomainState::Absent;
    };
    match dom.state().map(|(s, _)| s) {
        Ok(virt::enumutil::Enum::Known(s)) => match s {
            VirtState::Running | VirtState::Blocked => DomainState::Running,
            VirtState::Paused | VirtState::PMSuspended => DomainState::Paused,
            VirtState::Shutdown => DomainState::ShuttingDown,
            VirtState::Shutoff => DomainState::ShutOff,
            VirtState::Crashed => DomainState::Crashed,
            VirtState::NoState => DomainState::Other,
        },
        Ok(_) => DomainState::Other,
        // the domain went away between lookup and state (migrated, destroyed)
        Err(_) => DomainState::Absent,
    }
}

impl Shim {
    /// Connect to libvirt, subscribe to lifecycle events, then re-attach to or boot the VM
    /// (or wait, in [`Mode::Incoming`]).
    pub async fn start(cfg: ShimConfig) -> Result<Shim> {
        let persisted = read_state(&cfg)?;
        // libvirt prints every error on stderr by default ("domain not found" is an expected
        // answer here); the shim reports the ones that matter itself
        virt::error::clear_error_callback();
        crate::sys::start_event_loop().map_err(|e| Error::Libvirt {
            what: "start libvirt's event loop".into(),
            message: e,
        })?;
        let uri = cfg.libvirt_uri.clone();
        let (conn, events_conn) = blocking(move || -> Result<(Connect, Connect)> {
            // the pod's libvirtd starts beside the shim (its other container) and may not
            // listen yet: wait for it, within a bound
            let deadline = std::time::Instant::now() + LIBVIRT_START_WAIT;
            let mut said = false;
            let open = |what, said: &mut bool| loop {
                match Connect::open(Some(&uri)) {
                    Ok(c) => return Ok(c),
                    Err(e) if std::time::Instant::now() < deadline => {
                        if !*said {
                            tracing::info!(%uri, error = %e.message(), "waiting for libvirtd");
                            *said = true;
                        }
                        std::thread::sleep(Duration::from_millis(100));
                    }
                    Err(e) => {
                        return Err(Error::libvirt(
                            format!(
                                "connect to {uri} ({what}; libvirtd did not answer within {}s: see the pod's libvirtd container log)",
                                LIBVIRT_START_WAIT.as_secs()
                            ),
                            e,
                        ));
                    }
                }
            };
            Ok((open("commands", &mut said)?, open("events", &mut said)?))
        })
        .await?;
        // detect a dead libvirtd on the events connection (needs the event loop)
        let _ = events_conn.set_keep_alive(5, 3);
        let (tx, rx) = mpsc::unbounded_channel();
        let subscription = LifecycleSubscription::new(&events_conn, tx)
            .map_err(|e| Error::libvirt("subscribe to domain lifecycle events", e))?;
        let (latest, _) = watch::channel(0);
        let (lost, _) = watch::channel(false);
        let shim = Shim {
            inner: Arc::new(Inner {
                cfg,
                conn,
                state: Mutex::new(State {
                    persisted,
                    ..Default::default()
                }),
                log: Mutex::new(EventLog {
                    events: VecDeque::new(),
                    next_seq: 1,
                }),
                latest,
                lost,
                next_job: AtomicU64::new(1),
                known: Mutex::new(Known {
                    state: DomainState::Absent,
                    generation: 0,
                }),
                querying: AtomicBool::new(false),
                _subscription: subscription,
            }),
        };
        tokio::spawn(shim.clone().watch_connections(events_conn.clone()));
        tokio::spawn(shim.clone().event_task(rx, events_conn));
        shim.attach_or_boot().await?;
        // what the domain is now, before anyone asks
        shim.query_domain_state().await;
        Ok(shim)
    }

    /// The configuration.
    pub fn config(&self) -> &ShimConfig {
        &self.inner.cfg
    }

    fn name(&self) -> &str {
        &self.inner.cfg.vm.name
    }

    async fn domain(&self) -> Option<Domain> {
        let (conn, name) = (self.inner.conn.clone(), self.name().to_string());
        blocking(move || lookup(&conn, &name)).await
    }

    async fn attach_or_boot(&self) -> Result<()> {
        let cfg = &self.inner.cfg;
        if lock(&self.inner.state).persisted.torn_down {
            // deleted before this restart: finish the teardown (idempotent), start nothing
            let done = self.teardown().await?;
            tracing::info!(vm = %self.name(), ?done, "the VM was torn down: not starting it");
            return Ok(());
        }
        let dom = self.domain().await;
        let booted = lock(&self.inner.state).persisted.booted;
        match start_action(dom.is_some(), cfg.mode, booted) {
            StartAction::ReAttach => {
                let dom = dom.expect("a domain is here");
                let state = blocking(move || domain_state(Some(&dom))).await;
                tracing::info!(vm = %self.name(), ?state, "re-attached to the running domain");
                // the taps exist (QEMU holds them); make sure OVS still carries them
                for (tap, port) in cfg.plumbing() {
                    net::ensure_ovs_port(&cfg.ovs_db, &cfg.bridge, tap, port).await?;
                }
                Ok(())
            }
            StartAction::WaitForMigration => {
                // the taps on the integration bridge now, not at `prepare`: ovn-controller
                // binds the ports here while the controller waits (it starts the copy once
                // they are installed, see `status`)
                self.plumb().await?;
                tracing::info!(vm = %self.name(), "waiting for an incoming migration");
                Ok(())
            }
            StartAction::NoSecondBoot => {
                tracing::warn!(
                    vm = %self.name(),
                    state_file = %cfg.state_file.display(),
                    "the VM was booted by this shim before and is not on this node (migrated away?): not booting it again"
                );
                Ok(())
            }
            StartAction::Boot => self.boot().await,
        }
    }

    async fn boot(&self) -> Result<()> {
        let cfg = &self.inner.cfg;
        crate::config::check_files(&cfg.vm, cfg.image_root.as_deref())?;
        let xml = domain::domain_xml(&cfg.vm, cfg.accel)?;
        self.plumb().await?;
        let conn = self.inner.conn.clone();
        let name = self.name().to_string();
        blocking(move || conn.create_domain_xml(&xml, 0).map(|_| ()))
            .await
            .map_err(|e| Error::libvirt(format!("start domain {name}"), e))?;
        let mut st = lock(&self.inner.state);
        st.persisted.booted = true;
        write_state(cfg, &st.persisted)?;
        tracing::info!(vm = %self.name(), "booted");
        Ok(())
    }

    /// Every NIC's tap and its OVS port.
    async fn plumb(&self) -> Result<()> {
        let cfg = &self.inner.cfg;
        for (tap, port) in cfg.plumbing() {
            net::ensure_tap(tap).await?;
            net::ensure_ovs_port(&cfg.ovs_db, &cfg.bridge, tap, port).await?;
        }
        Ok(())
    }

    /// `POST /v1/announce`: on a migration's target, hand OVS each NIC's RARP as if the guest
    /// had sent it, so that OVN activates the VM's ports here at once (at the pause) rather
    /// than when QEMU, once it resumes the guest, sends its own. Only while an incoming
    /// migration is expected.
    pub async fn announce(&self) -> Result<api::Announced> {
        if !lock(&self.inner.state).incoming {
            return Err(Error::Conflict(
                "no incoming migration here: only a migration's target announces".into(),
            ));
        }
        let cfg = &self.inner.cfg;
        let mgmt = net::mgmt_socket(&cfg.ovs_db, &cfg.bridge).ok_or_else(|| {
            Error::Conflict(format!(
                "the OVS database {} is not a unix socket: its bridge's management socket is \
                 unknown",
                cfg.ovs_db
            ))
        })?;
        let mut ports = vec![];
        for nic in &cfg.vm.nics {
            let port = &nic.ovn_port;
            let what = || format!("announce {} on {}", nic.mac, nic.tap);
            let ofport = net::ofport(&cfg.ovs_db, &nic.tap)
                .await?
                .ok_or_else(|| Error::plumbing(what(), "its OVS interface has no OpenFlow port"))?;
            crate::openflow::packet_in_as_if_from(&mgmt, ofport, &crate::openflow::rarp(&nic.mac))
                .await
                .map_err(|e| Error::plumbing(what(), e))?;
            ports.push(port.clone());
        }
        tracing::info!(vm = %self.name(), ?ports, "announced on the target");
        Ok(api::Announced { ports })
    }

    /// Ask libvirt for the domain's state and remember the answer (unless a lifecycle event
    /// came in meanwhile: it is newer). One query at a time; while one is in flight, or if
    /// it takes longer than [`STATUS_LIBVIRT_BOUND`], the last known state is the answer.
    async fn query_domain_state(&self) -> DomainState {
        let known = || lock(&self.inner.known).state;
        if self.inner.querying.swap(true, Ordering::SeqCst) {
            return known();
        }
        let inner = self.inner.clone();
        let generation = lock(&inner.known).generation;
        let query = tokio::task::spawn_blocking(move || {
            let state = domain_state(lookup(&inner.conn, &inner.cfg.vm.name).as_ref());
            let mut k = lock(&inner.known);
            if k.generation == generation {
                k.state = state;
            }
            drop(k);
            inner.querying.store(false, Ordering::SeqCst);
            state
        });
        match tokio::time::timeout(STATUS_LIBVIRT_BOUND, query).await {
            Ok(Ok(state)) => state,
            Ok(Err(e)) => panic!("a blocking libvirt call panicked: {e}"),
            Err(_) => {
                let state = known();
                tracing::debug!(vm = %self.name(), ?state, "libvirt is busy: the domain state from the last event");
                state
            }
        }
    }

    /// `GET /v1/status`. Answers within about [`STATUS_LIBVIRT_BOUND`] however busy libvirt
    /// is.
    pub async fn status(&self) -> Status {
        let domain = self.query_domain_state().await;
        // a target's ports, until its VM came in (then nobody asks: no OVS queries)
        let awaiting = self.inner.cfg.mode == Mode::Incoming
            && lock(&self.inner.state).last_incoming.is_none();
        let ports = if awaiting {
            self.port_states().await
        } else {
            vec![]
        };
        let st = lock(&self.inner.state);
        Status {
            vm: self.name().to_string(),
            node: self.inner.cfg.node.clone(),
            domain,
            incoming: st.incoming,
            job: st.job.clone(),
            last_incoming: st.last_incoming.clone(),
            instance: self.inner.cfg.instance.clone(),
            resets: st.resets,
            ports,
            torn_down: st.persisted.torn_down,
        }
    }

    /// Each NIC's OVN port and whether ovn-controller installed it here (an OVS that does
    /// not answer: not installed).
    async fn port_states(&self) -> Vec<PortState> {
        let cfg = &self.inner.cfg;
        let mut out = vec![];
        for (tap, port) in cfg.plumbing() {
            let known = lock(&self.inner.state).installed.contains(tap);
            let installed = known
                || match net::ovn_installed(&cfg.ovs_db, tap).await {
                    Ok(i) => i,
                    Err(e) => {
                        tracing::debug!(vm = %self.name(), tap, error = %e, "port state");
                        false
                    }
                };
            if installed && !known {
                lock(&self.inner.state).installed.insert(tap.to_string());
            }
            out.push(PortState {
                port: port.to_string(),
                tap: tap.to_string(),
                installed,
            });
        }
        out
    }

    /// `POST /v1/prepare`: get ready to receive the VM.
    pub async fn prepare(&self) -> Result<Prepared> {
        self.refuse_if_torn_down()?;
        if let Some(job) = lock(&self.inner.state).job.as_ref()
            && !job.state.is_final()
        {
            return Err(Error::Conflict(format!(
                "migration job {} of this VM is {:?} from this node: it cannot also come in",
                job.id, job.state
            )));
        }
        if let Some(dom) = self.domain().await {
            let state = blocking(move || domain_state(Some(&dom))).await;
            if state != DomainState::Absent && state != DomainState::ShutOff {
                return Err(Error::Conflict(format!(
                    "VM {} is already on node {} ({state:?}): migrate it to another node",
                    self.name(),
                    self.inner.cfg.node
                )));
            }
        }
        self.plumb().await?;
        lock(&self.inner.state).incoming = true;
        let cfg = &self.inner.cfg;
        let (libvirt_uri, migration_uri, proxy) = match &cfg.migration {
            Migration::Plain {
                peer_libvirt_uri,
                migration_uri,
            } => (peer_libvirt_uri.clone(), migration_uri.to_string(), None),
            Migration::Proxy { listen, .. } => {
                // (a target pod is made for one migration: no earlier QEMU left a socket)
                let sockets = Sockets::new(Path::new(crate::libvirtd::RUN_DIR));
                wait_listening(&sockets, *listen, PROXY_WAIT)
                    .await
                    .map_err(|m| Error::Io {
                        what: m,
                        source: std::io::ErrorKind::TimedOut.into(),
                    })?;
                (String::new(), String::new(), Some(listen.to_string()))
            }
        };
        tracing::info!(vm = %self.name(), "prepared for an incoming migration");
        Ok(Prepared {
            node: cfg.node.clone(),
            libvirt_uri,
            migration_uri,
            proxy,
            tap: cfg.vm.nics[0].tap.clone(),
            ovn_port: cfg.vm.nics[0].ovn_port.clone(),
            nics: cfg
                .plumbing()
                .map(|(tap, port)| PreparedNic {
                    tap: tap.to_string(),
                    ovn_port: port.to_string(),
                })
                .collect(),
        })
    }

    /// Whether this node migrates through the shims' mutual-TLS proxies
    /// (`--migration-proxy`): then only so, libvirt's connection and QEMU's stream both.
    fn migrates_over_tls(&self) -> bool {
        matches!(self.inner.cfg.migration, Migration::Proxy { .. })
    }

    /// The source's side of the proxies for a migration to `prepared` (in the runtime), and
    /// the URIs and listen address libvirt is given: its sockets.
    fn outgoing(&self, prepared: &Prepared) -> Result<(Outgoing, MigrationRoute)> {
        let bad = |m: String| Error::BadRequest(m);
        let dir = self.inner.cfg.pki_dir.as_ref().ok_or_else(|| {
            bad("this shim has no node identity (--pki-dir) for the migration proxy".into())
        })?;
        let target: std::net::SocketAddr = prepared
            .proxy
            .as_deref()
            .unwrap_or_default()
            .parse()
            .map_err(|_| bad(format!("the target's migration proxy {:?}", prepared.proxy)))?;
        let config = Identity::read_dir(dir)?.client_config()?;
        let sockets = Sockets::new(Path::new(crate::libvirtd::RUN_DIR));
        let out =
            Outgoing::start(&sockets, target, &prepared.node, config).map_err(|e| Error::Io {
                what: format!(
                    "listen on {} for the migration proxy",
                    sockets.peer().display()
                ),
                source: e,
            })?;
        Ok((
            out,
            MigrationRoute {
                libvirt_uri: sockets.peer_uri(),
                uri: sockets.migration_uri(),
            },
        ))
    }

    /// The client of a migration's target shim: with this node's identity, over mutual TLS
    /// to the node the request names (its certificate must name that node), and never over
    /// plain HTTP then; without it, plain HTTP.
    fn target_client(&self, req: &MigrateRequest) -> Result<ShimClient> {
        match (&self.inner.cfg.pki_dir, req.uses_tls()) {
            (Some(dir), true) => {
                let tls = ClientTls {
                    identity: Identity::read_dir(dir)?,
                    server_name: req.target_node.clone().unwrap_or_default(),
                };
                Ok(ShimClient::with_tls(&req.target, &req.target_token, &tls)?)
            }
            (Some(_), false) => Err(Error::BadRequest(format!(
                "target {}: this shim reaches a migration's target over mutual TLS only \
                 (https://); plain HTTP is refused",
                req.target
            ))),
            (None, true) => Err(Error::BadRequest(format!(
                "target {}: this shim has no node identity (--pki-dir) to reach it over TLS",
                req.target
            ))),
            (None, false) => Ok(ShimClient::new(&req.target, &req.target_token)?),
        }
    }

    /// `POST /v1/migrate`: prepare the target shim and start the live migration.
    pub async fn migrate(&self, req: MigrateRequest) -> Result<Job> {
        self.refuse_if_torn_down()?;
        req.validate().map_err(Error::BadRequest)?;
        let job = {
            let mut st = lock(&self.inner.state);
            if let Some(job) = st.job.as_ref()
                && !job.state.is_final()
            {
                return Err(Error::Conflict(format!(
                    "migration job {} to {} is {:?}: wait for it or abort it first",
                    job.id, job.target, job.state
                )));
            }
            let job = Job {
                id: self.inner.next_job.fetch_add(1, Ordering::SeqCst),
                state: JobState::Preparing,
                target: req.target.clone(),
                target_node: None,
                request: (&req).into(),
                started_unix_ns: unix_ns(SystemTime::now()),
                finished_unix_ns: None,
                error: None,
                stats: JobStats::default(),
            };
            st.job = Some(job.clone());
            job
        };
        match self.start_migration(&req, job.id).await {
            Ok(job) => Ok(job),
            Err(e) => {
                self.finish_job(job.id, JobState::Failed, Some(e.to_string()), None);
                Err(e)
            }
        }
    }

    async fn start_migration(&self, req: &MigrateRequest, id: u64) -> Result<Job> {
        let Some(dom) = self.domain().await else {
            return Err(Error::Conflict(format!(
                "VM {} does not run on node {}: nothing to migrate",
                self.name(),
                self.inner.cfg.node
            )));
        };
        let d = dom.clone();
        let state = blocking(move || domain_state(Some(&d))).await;
        if state != DomainState::Running && state != DomainState::Paused {
            return Err(Error::Conflict(format!(
                "VM {} is {state:?} on node {}: only a running VM migrates",
                self.name(),
                self.inner.cfg.node
            )));
        }
        let target = self.target_client(req)?;
        let prepared = target.prepare().await?;
        req.check_prepared(&prepared, self.migrates_over_tls())
            .map_err(Error::BadRequest)?;
        let aborted = Arc::new(AtomicBool::new(false));
        {
            let mut st = lock(&self.inner.state);
            st.ctl = Some(JobCtl {
                dom: dom.clone(),
                aborted: aborted.clone(),
            });
            st.pause = Default::default();
            if let Some(j) = st.job.as_mut().filter(|j| j.id == id) {
                j.state = JobState::Running;
                j.target_node = Some(prepared.node.clone());
            }
        }
        let (proxy, route) = if self.migrates_over_tls() {
            let (out, route) = self.outgoing(&prepared)?;
            (Some(out), route)
        } else {
            let route = MigrationRoute {
                libvirt_uri: prepared.libvirt_uri.clone(),
                uri: prepared.migration_uri.clone(),
            };
            (None, route)
        };
        tracing::info!(vm = %self.name(), job = id, target = %req.target, node = %prepared.node, "migration starts");
        let shim = self.clone();
        let req = req.clone();
        let rt = tokio::runtime::Handle::current();
        std::thread::Builder::new()
            .name(format!("migration-{id}"))
            .spawn(move || {
                shim.run_migration(id, dom, req, prepared, route, aborted, target, rt);
                // the proxy's sockets go with the migration
                drop(proxy);
            })
            .map_err(|e| Error::Io {
                what: "start the migration thread".into(),
                source: e,
            })?;
        Ok(self.job().expect("the job was just recorded"))
    }

    #[allow(clippy::too_many_arguments)]
    fn run_migration(
        &self,
        id: u64,
        dom: Domain,
        req: MigrateRequest,
        prepared: Prepared,
        route: MigrationRoute,
        aborted: Arc<AtomicBool>,
        target: ShimClient,
        rt: tokio::runtime::Handle,
    ) {
        // no VIR_MIGRATE_TLS: through the proxies, TLS is the shims' (QEMU holds no key)
        let mut flags =
            sys::VIR_MIGRATE_LIVE | sys::VIR_MIGRATE_PEER2PEER | sys::VIR_MIGRATE_ABORT_ON_ERROR;
        if req.auto_converge {
            flags |= sys::VIR_MIGRATE_AUTO_CONVERGE;
        }
        if req.post_copy {
            flags |= sys::VIR_MIGRATE_POSTCOPY;
        }
        if let Some(ms) = req.max_downtime_ms
            && let Err(e) = dom.migrate_set_max_downtime(ms, 0)
        {
            tracing::warn!("cannot set the max downtime before the migration: {e}");
        }
        let params = VirtParams {
            uri: Some(route.uri),
            bandwidth: req.bandwidth_mib_s,
            ..Default::default()
        };
        let done = Arc::new(AtomicBool::new(false));
        let watcher = {
            let (shim, dom, done, aborted) =
                (self.clone(), dom.clone(), done.clone(), aborted.clone());
            let deadline = Instant::now() + req.timeout();
            let (post_copy, downtime) = (req.post_copy, req.max_downtime_ms);
            std::thread::spawn(move || {
                shim.watch_job(id, &dom, &done, &aborted, deadline, post_copy, downtime)
            })
        };
        let res = dom.migrate_to_uri3(Some(&route.libvirt_uri), params, flags);
        done.store(true, Ordering::SeqCst);
        let timed_out = watcher.join().unwrap_or(false);
        let timeout_s = req.timeout().as_secs();
        match res {
            Ok(()) => {
                // the final stats (with the downtime) are the target's: the source's
                // transient domain is gone
                let started = lock(&self.inner.state)
                    .job
                    .as_ref()
                    .map(|j| j.started_unix_ns)
                    .unwrap_or(0);
                let mut stats = None;
                for _ in 0..50 {
                    if let Ok(s) = rt.block_on(target.status())
                        && let Some(inc) = s.last_incoming
                        && inc.resumed_unix_ns >= started
                    {
                        stats = Some(inc.stats);
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
                if stats.is_none() {
                    tracing::warn!(
                        job = id,
                        "the target shim did not report the completed job's stats"
                    );
                }
                self.finish_job(id, JobState::Completed, None, stats);
                tracing::info!(vm = %self.name(), job = id, node = %prepared.node, "migrated");
            }
            Err(e) => {
                let state = if aborted.load(Ordering::SeqCst) {
                    JobState::Aborted
                } else {
                    JobState::Failed
                };
                let why = if timed_out {
                    format!("timed out after {timeout_s} s and aborted (libvirt: {e})")
                } else {
                    e.to_string()
                };
                tracing::warn!(vm = %self.name(), job = id, ?state, "migration ended: {why}");
                self.finish_job(id, state, Some(why), None);
            }
        }
    }

    /// Sample the job's stats until `done`; at the deadline switch to post-copy (when
    /// allowed) or abort. Returns whether the deadline passed.
    #[allow(clippy::too_many_arguments)]
    fn watch_job(
        &self,
        id: u64,
        dom: &Domain,
        done: &AtomicBool,
        aborted: &AtomicBool,
        deadline: Instant,
        post_copy: bool,
        downtime: Option<u64>,
    ) -> bool {
        let mut downtime_set = false;
        let mut timed_out = false;
        let mut copying = false;
        while !done.load(Ordering::SeqCst) {
            std::thread::sleep(STATS_EVERY);
            if done.load(Ordering::SeqCst) {
                break;
            }
            if let Ok(s) = crate::sys::job_stats(dom, 0)
                && s.r#type == sys::VIR_DOMAIN_JOB_UNBOUNDED as i32
            {
                if !downtime_set && let Some(ms) = downtime {
                    downtime_set = dom.migrate_set_max_downtime(ms, 0).is_ok();
                }
                let stats = crate::events::job_stats(&s);
                copying = stats.data_processed.unwrap_or(0) > 0;
                let mut st = lock(&self.inner.state);
                if let Some(j) = st.job.as_mut().filter(|j| j.id == id) {
                    // while running, libvirt's "downtime" is the one it aims at: report the
                    // real one only after completion
                    j.stats = JobStats {
                        downtime_ms: None,
                        ..stats
                    };
                }
            }
            let now = Instant::now();
            if timed_out || now < deadline {
                continue;
            }
            match at_deadline(post_copy, copying, now - deadline) {
                AtDeadline::Wait => {}
                AtDeadline::PostCopy => {
                    timed_out = true;
                    tracing::warn!(job = id, "timeout: switching to post-copy");
                    // before the call: QEMU's stop for the switch may be reported before it returns
                    lock(&self.inner.state).pause.post_copy_asked = true;
                    if let Err(e) = crate::sys::start_post_copy(dom) {
                        tracing::warn!(job = id, "cannot switch to post-copy: {e}; aborting");
                        aborted.store(true, Ordering::SeqCst);
                        let _ = crate::sys::abort_job(dom);
                    }
                }
                AtDeadline::Abort => {
                    timed_out = true;
                    if post_copy {
                        tracing::warn!(
                            job = id,
                            "timeout: the copy did not start within {POST_COPY_START_GRACE:?} \
                             of the deadline, nothing to switch to post-copy: aborting"
                        );
                    } else {
                        tracing::warn!(job = id, "timeout: aborting the migration");
                    }
                    aborted.store(true, Ordering::SeqCst);
                    let _ = crate::sys::abort_job(dom);
                }
            }
        }
        timed_out
    }

    fn finish_job(&self, id: u64, state: JobState, error: Option<String>, stats: Option<JobStats>) {
        let mut st = lock(&self.inner.state);
        if let Some(j) = st.job.as_mut().filter(|j| j.id == id) {
            j.state = state;
            j.error = error;
            j.finished_unix_ns = Some(unix_ns(SystemTime::now()));
            if let Some(s) = stats {
                j.stats = s;
            }
        }
        st.ctl = None;
    }

    /// The current or last job.
    pub fn job(&self) -> Option<Job> {
        lock(&self.inner.state).job.clone()
    }

    /// `POST /v1/abort`: abort the running migration; the VM keeps running here.
    pub async fn abort(&self) -> Result<Job> {
        let (dom, aborted, id) = {
            let st = lock(&self.inner.state);
            match (st.job.as_ref(), st.ctl.as_ref()) {
                (Some(j), Some(ctl)) if j.state == JobState::Running => {
                    (ctl.dom.clone(), ctl.aborted.clone(), j.id)
                }
                (Some(j), _) if !j.state.is_final() => {
                    return Err(Error::Conflict(format!(
                        "migration job {} is {:?}: try again in a moment",
                        j.id, j.state
                    )));
                }
                _ => return Err(Error::Conflict("no migration is running".into())),
            }
        };
        aborted.store(true, Ordering::SeqCst);
        blocking(move || crate::sys::abort_job(&dom))
            .await
            .map_err(|e| Error::libvirt(format!("abort migration job {id}"), e))?;
        tracing::info!(vm = %self.name(), job = id, "abort requested");
        Ok(self.job().expect("a job is recorded"))
    }

    /// Events with `seq > after`, waiting up to `wait` for one.
    pub async fn events(&self, after: u64, wait: Duration) -> api::Events {
        let mut rx = self.inner.latest.subscribe();
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            {
                let log = lock(&self.inner.log);
                let events: Vec<Event> = log
                    .events
                    .iter()
                    .filter(|e| e.seq > after)
                    .cloned()
                    .collect();
                if !events.is_empty() || tokio::time::Instant::now() >= deadline {
                    let next = events.last().map(|e| e.seq).unwrap_or(after);
                    return api::Events { events, next };
                }
            }
            if tokio::time::timeout_at(deadline, rx.changed())
                .await
                .is_err()
            {
                continue; // deadline: answer with what there is (nothing)
            }
        }
    }

    async fn event_task(self, mut rx: mpsc::UnboundedReceiver<RawLifecycle>, _conn: Connect) {
        while let Some(raw) = rx.recv().await {
            if raw.domain != self.name() {
                continue;
            }
            let reported = {
                let mut st = lock(&self.inner.state);
                let outgoing = st.ctl.is_some();
                st.pause.report(raw.event, raw.detail, outgoing, raw.at)
            };
            let kind = match reported {
                Ok(kind) => kind,
                Err(paused_at) => {
                    // how much later than the reported pause this one came
                    let after_ms = paused_at
                        .and_then(|p| raw.received.duration_since(p).ok())
                        .map(|d| d.as_millis());
                    tracing::info!(vm = %self.name(), event = raw.event, detail = raw.detail, ?after_ms, "the migration's pause, already reported");
                    continue;
                }
            };
            // how long after the event happened it reached the shim (QEMU's events carry
            // QEMU's timestamp; libvirt's are stamped on arrival: 0)
            let late_ms = raw
                .received
                .duration_since(raw.at)
                .unwrap_or_default()
                .as_millis();
            let seq = {
                let mut log = lock(&self.inner.log);
                let seq = log.next_seq;
                log.next_seq += 1;
                log.events.push_back(Event {
                    seq,
                    kind,
                    at_unix_ns: unix_ns(raw.at),
                    node: self.inner.cfg.node.clone(),
                    libvirt: (raw.event, raw.detail),
                });
                while log.events.len() > EVENT_LOG_CAP {
                    log.events.pop_front();
                }
                seq
            };
            {
                let mut k = lock(&self.inner.known);
                k.state = state_after(kind, k.state);
                k.generation += 1;
            }
            self.inner.latest.send_replace(seq);
            tracing::info!(vm = %self.name(), ?kind, seq, from_qemu = raw.event == crate::sys::QEMU_STOP_EVENT, late_ms, "lifecycle event");
            match kind {
                // post-copy: the VM runs here, memory still arriving; the job completes at
                // the resumed-after-migration event that follows
                Lifecycle::ResumedPostCopy => lock(&self.inner.state).incoming = false,
                Lifecycle::ResumedAfterMigration => {
                    lock(&self.inner.state).incoming = false;
                    // off the event path: events keep flowing while the stats are fetched
                    tokio::spawn(self.clone().record_incoming(unix_ns(raw.at)));
                }
                Lifecycle::Failed | Lifecycle::Stopped | Lifecycle::Crashed => {
                    lock(&self.inner.state).incoming = false
                }
                Lifecycle::Reset => {
                    let mut st = lock(&self.inner.state);
                    if is_new_reset(st.last_reset, raw.at) {
                        st.resets += 1;
                        tracing::warn!(vm = %self.name(), resets = st.resets, "the guest reset (a reboot, a kernel panic or a reset from outside)");
                    }
                    st.last_reset = Some(raw.at);
                }
                _ => {}
            }
        }
    }

    /// Record the completed incoming migration's stats (the target's view, with the
    /// downtime). They appear when libvirt's Finish phase is done, which can be just after the
    /// resume event.
    async fn record_incoming(self, resumed_unix_ns: u64) {
        let (conn, name) = (self.inner.conn.clone(), self.name().to_string());
        let stats = blocking(move || {
            for _ in 0..50 {
                if let Some(d) = lookup(&conn, &name)
                    && let Ok(s) = crate::sys::job_stats(
                        &d,
                        sys::VIR_DOMAIN_JOB_STATS_COMPLETED
                            | sys::VIR_DOMAIN_JOB_STATS_KEEP_COMPLETED,
                    )
                    && s.r#type == sys::VIR_DOMAIN_JOB_COMPLETED as i32
                {
                    return Some(s);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            None
        })
        .await;
        match stats {
            Some(s) => {
                let after_ms =
                    unix_ns(SystemTime::now()).saturating_sub(resumed_unix_ns) / 1_000_000;
                tracing::info!(vm = %self.name(), after_resume_ms = after_ms, "incoming migration's stats recorded");
                lock(&self.inner.state).last_incoming = Some(Incoming {
                    resumed_unix_ns,
                    stats: crate::events::job_stats(&s),
                })
            }
            None => {
                // (after a post-copy libvirt keeps none): the guest came in all the same,
                // which is what the controller waits for; the figures are unknown
                tracing::warn!(vm = %self.name(), "no completed-job stats for the incoming migration");
                lock(&self.inner.state).last_incoming = Some(Incoming {
                    resumed_unix_ns,
                    stats: JobStats::default(),
                })
            }
        }
    }

    /// Check both libvirt connections every 2 s (libvirt's event loop watches their sockets
    /// and the events connection's keepalive); flag [`Shim::lost`] when one is gone.
    async fn watch_connections(self, events_conn: Connect) {
        loop {
            tokio::time::sleep(Duration::from_secs(2)).await;
            let (c, e) = (self.inner.conn.clone(), events_conn.clone());
            let alive =
                blocking(move || c.is_alive().unwrap_or(false) && e.is_alive().unwrap_or(false))
                    .await;
            if !alive {
                tracing::error!(uri = %self.inner.cfg.libvirt_uri, "lost the connection to libvirtd");
                self.inner.lost.send_replace(true);
                return;
            }
        }
    }

    /// Resolves when a connection to libvirtd is lost: the shim then cannot see events or
    /// control its domain, and should exit so that it is restarted (and re-attaches).
    pub async fn lost(&self) {
        let mut rx = self.inner.lost.subscribe();
        let _ = rx.wait_for(|lost| *lost).await;
    }

    /// Graceful shutdown: a domain that stays running ([`DOMAIN_GOES`]) keeps its taps; a
    /// tap and its OVS port go when no domain of the VM's name is on this node (any more)
    /// and no process holds the tap ([`TAP_RELEASE`]): libvirtd may be gone already — a
    /// pod's deletion stops it with the shim — and cannot say whether QEMU still runs; the
    /// tap's carrier can.
    pub async fn shutdown(&self) {
        if let Some(job) = self.job()
            && !job.state.is_final()
        {
            tracing::warn!(
                job = job.id,
                "shutting down during a migration: the source libvirtd keeps driving it (peer-to-peer)"
            );
        }
        // a pod's deletion stops libvirtd, and QEMU with it, together with the shim: the
        // domain goes, and so must the taps. A shim stopped alone (its container restarted)
        // sees the domain stay, and leaves it running
        let deadline = tokio::time::Instant::now() + DOMAIN_GOES;
        while self.domain().await.is_some() {
            if tokio::time::Instant::now() >= deadline {
                tracing::info!(vm = %self.name(), "the domain keeps running");
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let cfg = &self.inner.cfg;
        let mut removed = Vec::new();
        for (tap, _) in cfg.plumbing() {
            match released(tap).await {
                Ok(Some(true)) => {
                    tracing::warn!(vm = %self.name(), %tap, "no domain seen here, but a process still holds the tap {TAP_RELEASE:?} on (QEMU without its libvirtd?): kept with its OVS port");
                    continue;
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!("{e}: the tap is kept");
                    continue;
                }
            }
            if let Err(e) = net::remove_ovs_port(&cfg.ovs_db, &cfg.bridge, tap).await {
                tracing::warn!("{e}");
            }
            match net::remove_tap(tap).await {
                Ok(()) => removed.push(tap.to_string()),
                Err(e) => tracing::warn!("{e}"),
            }
        }
        tracing::info!(vm = %self.name(), ?removed, "no domain here: removed the unused taps and their OVS ports");
    }

    fn refuse_if_torn_down(&self) -> Result<()> {
        if lock(&self.inner.state).persisted.torn_down {
            return Err(Error::Conflict(format!(
                "VM {} was torn down (deleted): it neither comes in nor leaves",
                self.name()
            )));
        }
        Ok(())
    }

    /// `POST /v1/teardown`: the VM is deleted. Recorded first (a restart half-way finishes
    /// the job and starts nothing), then the domain is destroyed — a running outgoing
    /// migration fails with it, an incoming one never lands — and every NIC's OVS port and
    /// tap removed. Idempotent: a second call finds nothing and says so.
    pub async fn teardown(&self) -> Result<api::TornDown> {
        {
            let mut st = lock(&self.inner.state);
            if !st.persisted.torn_down {
                st.persisted.torn_down = true;
                write_state(&self.inner.cfg, &st.persisted)?;
            }
            // no incoming migration is expected any more: announce refuses
            st.incoming = false;
        }
        let mut out = api::TornDown::default();
        if let Some(dom) = self.domain().await {
            let name = self.name().to_string();
            let destroyed = blocking(move || match dom.destroy() {
                Ok(()) => Ok(true),
                // gone meanwhile (migrated away, shut down): nothing to destroy
                Err(e)
                    if matches!(
                        e.code(),
                        virt::enumutil::Enum::Known(
                            virt::error::ErrorNumber::NoDomain
                                | virt::error::ErrorNumber::OperationInvalid
                        )
                    ) =>
                {
                    Ok(false)
                }
                Err(e) => Err(e),
            })
            .await
            .map_err(|e| Error::libvirt(format!("destroy domain {name}"), e))?;
            out.destroyed_domain = destroyed;
        }
        let cfg = &self.inner.cfg;
        for (tap, _) in cfg.plumbing() {
            let had = net::link_index(tap).await?.is_some();
            net::remove_ovs_port(&cfg.ovs_db, &cfg.bridge, tap).await?;
            net::remove_tap(tap).await?;
            if had {
                out.removed_taps.push(tap.to_string());
            }
        }
        tracing::info!(vm = %self.name(), destroyed_domain = out.destroyed_domain, removed_taps = ?out.removed_taps, "torn down");
        Ok(out)
    }

    /// Whether `token` is the VM's token (constant time).
    pub fn token_ok(&self, token: &str) -> bool {
        self.inner.cfg.token.matches(token)
    }
}

fn read_state(cfg: &ShimConfig) -> Result<Persisted> {
    match std::fs::read_to_string(&cfg.state_file) {
        Ok(text) => serde_json::from_str(&text).map_err(|e| {
            Error::Config(format!(
                "state file {} is not the shim's ({e}): remove it only if the VM runs nowhere",
                cfg.state_file.display()
            ))
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Persisted::default()),
        Err(e) => Err(Error::Io {
            what: format!("read the state file {}", cfg.state_file.display()),
            source: e,
        }),
    }
}

fn write_state(cfg: &ShimConfig, p: &Persisted) -> Result<()> {
    let tmp = cfg.state_file.with_extension("tmp");
    let io = |source| Error::Io {
        what: format!("write the state file {}", cfg.state_file.display()),
        source,
    };
    std::fs::write(&tmp, serde_json::to_vec(p).expect("plain data serializes")).map_err(io)?;
    std::fs::rename(&tmp, &cfg.state_file).map_err(io)
}

/// How long a shutting-down shim watches whether its domain (or its libvirtd) goes too.
const DOMAIN_GOES: Duration = Duration::from_secs(5);

/// How long a shutting-down shim waits for a tap to be let go: a pod's deletion stops the
/// QEMU of a VM whose libvirtd is gone (removed without its teardown) with the shim.
const TAP_RELEASE: Duration = Duration::from_secs(10);

/// [`net::tap_held`] once nothing holds tap `name`, or when [`TAP_RELEASE`] has passed.
async fn released(name: &str) -> Result<Option<bool>> {
    let deadline = tokio::time::Instant::now() + TAP_RELEASE;
    loop {
        let held = net::tap_held(name).await?;
        if held != Some(true) || tokio::time::Instant::now() >= deadline {
            return Ok(held);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shim_boots_its_vm_at_most_once_and_re_attaches_to_a_running_one() {
        use StartAction::*;
        assert_eq!(start_action(false, Mode::Boot, false), Boot);
        assert_eq!(start_action(false, Mode::Boot, true), NoSecondBoot);
        assert_eq!(start_action(true, Mode::Boot, false), ReAttach);
        assert_eq!(start_action(true, Mode::Boot, true), ReAttach);
        assert_eq!(start_action(true, Mode::Incoming, false), ReAttach);
        assert_eq!(start_action(false, Mode::Incoming, false), WaitForMigration);
        assert_eq!(start_action(false, Mode::Incoming, true), WaitForMigration);
    }

    #[test]
    fn lifecycle_events_say_what_the_domain_is_now() {
        use DomainState as D;
        use Lifecycle as L;
        // an incoming migration: created paused, then runs
        assert_eq!(state_after(L::IncomingMigration, D::Absent), D::Paused);
        assert_eq!(state_after(L::ResumedAfterMigration, D::Paused), D::Running);
        assert_eq!(state_after(L::ResumedPostCopy, D::Paused), D::Running);
        // the source: paused for the last copy, then gone
        assert_eq!(state_after(L::SuspendedForMigration, D::Running), D::Paused);
        assert_eq!(state_after(L::MigratedAway, D::Paused), D::Absent);
        // a failed migration: the source resumes, the target's domain goes
        assert_eq!(state_after(L::Resumed, D::Paused), D::Running);
        assert_eq!(state_after(L::Failed, D::Paused), D::Absent);
        assert_eq!(state_after(L::Started, D::Absent), D::Running);
        assert_eq!(state_after(L::Stopped, D::Running), D::Absent);
        assert_eq!(state_after(L::Crashed, D::Running), D::Crashed);
        // a reset guest boots again in the same QEMU
        assert_eq!(state_after(L::Reset, D::Running), D::Running);
        // an event that says nothing about the state leaves it
        assert_eq!(state_after(L::Other, D::Paused), D::Paused);
        assert_eq!(state_after(L::Other, D::Running), D::Running);
    }

    #[test]
    fn a_reboot_is_counted_once_however_many_reset_events_it_makes() {
        let t0 = UNIX_EPOCH + Duration::from_secs(1000);
        assert!(is_new_reset(None, t0));
        // the firmware's second reset, 60 ms later: the same reboot
        assert!(!is_new_reset(Some(t0), t0 + Duration::from_millis(60)));
        // a reboot later on
        assert!(is_new_reset(Some(t0), t0 + RESET_COALESCE));
        assert!(is_new_reset(Some(t0), t0 + Duration::from_secs(30)));
        // the clock stepped back: counted
        assert!(is_new_reset(Some(t0), t0 - Duration::from_secs(5)));
    }

    #[test]
    fn timestamps_are_unix_nanoseconds() {
        assert_eq!(
            unix_ns(UNIX_EPOCH + Duration::from_millis(1500)),
            1_500_000_000
        );
        assert_eq!(unix_ns(UNIX_EPOCH), 0);
    }
}
