//! The shim's migration API: HTTP/1.1 with JSON bodies, the request and response types shared
//! by the server (`roam_vm_shim::server`) and the client ([`crate::client::ShimClient`]).
//!
//! # Authentication
//!
//! Every endpoint except `health` needs `Authorization: Bearer <token>`, the VM's token (a
//! file named on the shim's command line; in a cluster a mounted Secret shared by the VM's
//! source and target shims). The shim compares it in constant time. A missing or wrong token
//! gets `401` with an [`ApiError`] body, and nothing happens.
//!
//! # Endpoints
//!
//! | method, path | body → answer | what |
//! |---|---|---|
//! | `GET /v1/health` | → [`Health`] | the shim serves (no token needed: a liveness probe; it names no VM and no node) |
//! | `GET /v1/status` | → [`Status`] | the VM, the node, the domain's state on it, the current or last job, the last incoming migration |
//! | `POST /v1/prepare` | → [`Prepared`] | **target**: create the tap and its OVS port (`iface-id` = the OVN port) and get ready to receive; answers what the source needs: the target libvirt URI and migration URI. `409` when the VM already runs here or a job runs |
//! | `POST /v1/migrate` | [`MigrateRequest`] → `202` [`Job`] | **source**: prepare the target shim, then live-migrate to it. `409` while a job runs or when the VM does not run here; `502` when the target shim is unreachable or refuses (nothing started) |
//! | `GET /v1/progress` | → [`Job`] | the current or last job with libvirt's job stats; after completion the final downtime |
//! | `POST /v1/abort` | → `202` [`Job`] | abort the running migration; the VM keeps running here. `409` when none runs |
//! | `GET /v1/events?after=N&wait_ms=M` | → [`Events`] | lifecycle events with `seq > N`; waits up to `M` ms (≤ 30 000) for one to arrive (long poll) |
//! | `POST /v1/teardown` | → [`TornDown`] | the VM is deleted: destroy its domain on this node (a running migration with it), remove its taps and their OVS ports; from then on the shim boots, receives and migrates nothing, also after a restart. Idempotent |
//!
//! Errors are JSON [`ApiError`]s: `400` bad request, `401` bad token, `404` unknown path,
//! `409` conflict, `502` target shim, `500` libvirt/OVS trouble; and from the server itself
//! ([`crate::serve`]), `413` a body over 64 KiB, `408` a body not received within 10 s, `431`
//! a request head over 16 KiB (hyper's, without a body).

use serde::{Deserialize, Serialize};

use crate::events::Event;

/// API paths.
pub mod path {
    /// `GET`: liveness.
    pub const HEALTH: &str = "/v1/health";
    /// `GET`: state.
    pub const STATUS: &str = "/v1/status";
    /// `POST`: target side preparation.
    pub const PREPARE: &str = "/v1/prepare";
    /// `POST`: start a migration (source).
    pub const MIGRATE: &str = "/v1/migrate";
    /// `GET`: job progress.
    pub const PROGRESS: &str = "/v1/progress";
    /// `POST`: abort the running migration.
    pub const ABORT: &str = "/v1/abort";
    /// `GET`: lifecycle events (long poll).
    pub const EVENTS: &str = "/v1/events";
    /// `POST`: a migration's target announces the VM's NICs now (the pause), so that OVN
    /// carries their traffic here before QEMU resumes the guest.
    pub const ANNOUNCE: &str = "/v1/announce";
    /// `POST`: the VM is deleted: destroy its domain here and remove its plumbing.
    pub const TEARDOWN: &str = "/v1/teardown";
}

/// Longest long-poll wait the server grants.
pub const MAX_EVENT_WAIT_MS: u64 = 30_000;

/// An error answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiError {
    /// Short machine-readable kind: `bad-request`, `unauthorized`, `not-found`, `conflict`,
    /// `target`, `internal`; `too-large` and `timeout` (the body: [`crate::serve`]).
    pub code: String,
    /// What was wrong and what to do.
    pub error: String,
}

/// `GET /v1/health`: unauthenticated, so it says nothing about the tenant (which VM, which
/// node: ask `GET /v1/status`, with the token). Older shims also sent `vm` and `node`;
/// unknown fields are ignored, so this type decodes their answer too.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Health {
    /// Always true when answered.
    pub ok: bool,
    /// The shim's version.
    pub version: String,
}

/// The domain as libvirt on this node sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DomainState {
    /// No domain of the VM's name on this node (not booted yet, migrated away, or waiting
    /// for an incoming migration).
    Absent,
    /// Running.
    Running,
    /// Paused (e.g. an incoming migration before it completes, or the final copy).
    Paused,
    /// Shutting down.
    ShuttingDown,
    /// Shut off.
    ShutOff,
    /// Crashed.
    Crashed,
    /// Anything else.
    Other,
}

/// `GET /v1/status`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Status {
    /// The VM (domain name).
    pub vm: String,
    /// This shim's node.
    pub node: String,
    /// The domain on this node.
    pub domain: DomainState,
    /// Whether this shim waits for an incoming migration (after `prepare`).
    pub incoming: bool,
    /// The current or last outgoing migration.
    pub job: Option<Job>,
    /// The last incoming migration that completed here (libvirt's completed-job stats, as
    /// the target sees them).
    pub last_incoming: Option<Incoming>,
    /// Who runs this shim (`--instance`, a launcher pod's name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
    /// Guest reboots this shim has seen since it started: [`crate::events::Lifecycle::Reset`]
    /// events, those less than a second apart counted once (the firmware resets the machine
    /// again as it starts). A count that grows while the domain stays Running means the guest
    /// rebooted.
    #[serde(default)]
    pub resets: u64,
    /// A shim started to receive its VM (a migration's target), until the VM came in: each
    /// NIC's OVN port and whether this node's ovn-controller has bound it and installed its
    /// flows here (empty for any other shim). A migration starts its copy only once every
    /// port is installed: at the pause the target then has the ports ready to activate,
    /// however long OVN took to get there.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<PortState>,
    /// The VM was torn down here (`POST /v1/teardown`): no domain, no taps, no OVS ports;
    /// the shim boots, receives and migrates nothing any more.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub torn_down: bool,
}

/// `POST /v1/teardown`: what was removed on this node (empty lists: nothing was left).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TornDown {
    /// A domain of the VM ran (or was paused) here and was destroyed.
    pub destroyed_domain: bool,
    /// The taps removed, each with its OVS port.
    pub removed_taps: Vec<String>,
}

impl Status {
    /// The OVN ports ([`Status::ports`]) not installed on this node yet.
    pub fn uninstalled_ports(&self) -> Vec<String> {
        self.ports
            .iter()
            .filter(|p| !p.installed)
            .map(|p| p.port.clone())
            .collect()
    }
}

/// A NIC's OVN port on this node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PortState {
    /// The OVN logical port (`external_ids:iface-id` of the tap's OVS interface).
    pub port: String,
    /// The NIC's tap.
    pub tap: String,
    /// ovn-controller has claimed the port on this chassis and its flows are in OVS (it set
    /// `external_ids:ovn-installed=true` on the interface).
    pub installed: bool,
}

/// The last incoming migration, as its target saw it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Incoming {
    /// When the `resumed-after-migration` event arrived, ns since the Unix epoch.
    pub resumed_unix_ns: u64,
    /// libvirt's completed-job stats on the target (with the downtime).
    pub stats: JobStats,
}

/// `POST /v1/prepare` answer: what the source needs to migrate here.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Prepared {
    /// The target node.
    pub node: String,
    /// The URI under which the source's libvirtd reaches this node's libvirtd
    /// (peer-to-peer migration over plain TCP; empty with [`Prepared::proxy`]).
    pub libvirt_uri: String,
    /// Where the migration stream goes (`tcp://HOST`; empty with [`Prepared::proxy`]).
    pub migration_uri: String,
    /// The target shim's migration proxy (`IP:PORT`, mutual TLS with the nodes'
    /// identities): the source's shim carries libvirt's connection and QEMU's stream there,
    /// and libvirt and QEMU reach no network themselves.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy: Option<String>,
    /// The tap created for the VM's first NIC.
    pub tap: String,
    /// The OVN logical port that tap is bound to.
    pub ovn_port: String,
    /// Every NIC's tap and OVN port, in the guest's order (the first is `tap`/`ovn_port`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nics: Vec<PreparedNic>,
}

/// `POST /v1/announce` answer: the OVN ports a RARP was handed to OVS for, as if the guest
/// had sent it from each NIC.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Announced {
    /// The OVN logical ports announced.
    pub ports: Vec<String>,
}

/// One NIC's plumbing on a migration's target.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreparedNic {
    /// The tap.
    pub tap: String,
    /// The OVN logical port it is bound to.
    pub ovn_port: String,
}

/// `POST /v1/migrate`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigrateRequest {
    /// The target shim, `https://HOST:PORT` (over mutual TLS, when the shims have their
    /// nodes' identities) or `http://HOST:PORT`.
    pub target: String,
    /// The target shim's token.
    pub target_token: String,
    /// Bandwidth limit in MiB/s (none: unlimited).
    #[serde(default)]
    pub bandwidth_mib_s: Option<u64>,
    /// Longest pause the final copy may take, in ms (none: libvirt's default, 300 ms).
    #[serde(default)]
    pub max_downtime_ms: Option<u64>,
    /// Throttle the guest's vCPUs when memory does not converge.
    #[serde(default)]
    pub auto_converge: bool,
    /// Allow switching to post-copy: at the timeout the shim switches instead of aborting.
    #[serde(default)]
    pub post_copy: bool,
    /// Give up (abort, or switch to post-copy when allowed) after this many seconds
    /// (default [`DEFAULT_TIMEOUT_S`]).
    #[serde(default)]
    pub timeout_s: Option<u64>,
    /// The node the controller chose: the target shim must say it is that node
    /// ([`MigrateRequest::check_prepared`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_node: Option<String>,
    /// That node's address (its Node object's InternalIP, which its roam certificate names):
    /// the target's libvirt and migration URIs must lead there, and over TLS libvirt and QEMU
    /// check the certificate against it, so the memory goes to the chosen node only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_address: Option<String>,
}

/// Default migration timeout.
pub const DEFAULT_TIMEOUT_S: u64 = 600;
/// Bandwidth accepted (MiB/s).
pub const MAX_BANDWIDTH_MIB_S: u64 = 1 << 20;
/// Downtime accepted (ms).
pub const MAX_DOWNTIME_MS: u64 = 60_000;
/// Timeout accepted (s).
pub const MAX_TIMEOUT_S: u64 = 86_400;

impl MigrateRequest {
    /// Check the request; the error says what is wrong and what is allowed.
    pub fn validate(&self) -> Result<(), String> {
        let use_form = || {
            format!(
                "target {:?}: use https://HOST:PORT or http://HOST:PORT",
                self.target
            )
        };
        let hostport = self
            .target
            .strip_prefix("https://")
            .or_else(|| self.target.strip_prefix("http://"))
            .ok_or_else(use_form)?;
        let hostport = hostport.strip_suffix('/').unwrap_or(hostport);
        match hostport.rsplit_once(':') {
            Some((h, p))
                if !h.is_empty() && !h.contains('/') && p.parse::<u16>().is_ok_and(|p| p != 0) => {}
            _ => return Err(use_form()),
        }
        if self.uses_tls() && self.target_node.as_deref().is_none_or(str::is_empty) {
            return Err(format!(
                "target {:?}: over TLS the request names the target node (target_node), whose \
                 certificate the target must present",
                self.target
            ));
        }
        if self.target_token.trim().is_empty() {
            return Err("target_token is empty: give the target shim's token".into());
        }
        if let Some(b) = self.bandwidth_mib_s
            && !(1..=MAX_BANDWIDTH_MIB_S).contains(&b)
        {
            return Err(format!(
                "bandwidth_mib_s {b}: use 1 to {MAX_BANDWIDTH_MIB_S}, or leave it out for no limit"
            ));
        }
        if let Some(d) = self.max_downtime_ms
            && !(1..=MAX_DOWNTIME_MS).contains(&d)
        {
            return Err(format!(
                "max_downtime_ms {d}: use 1 to {MAX_DOWNTIME_MS}, or leave it out for libvirt's default"
            ));
        }
        if let Some(t) = self.timeout_s
            && !(1..=MAX_TIMEOUT_S).contains(&t)
        {
            return Err(format!("timeout_s {t}: use 1 to {MAX_TIMEOUT_S}"));
        }
        Ok(())
    }

    /// Whether the target's answer to `prepare` is the node this request names and offers
    /// what this source accepts (pure): the node the controller chose (`target_node`), an
    /// address that is its address (`target_address`), and — when this source migrates
    /// through the shims' mutual-TLS proxies (`tls`) — a proxy (no downgrade to plain TCP);
    /// a source without one takes plain URIs only. The error says what the target offered.
    pub fn check_prepared(&self, prepared: &Prepared, tls: bool) -> Result<(), String> {
        if let Some(n) = &self.target_node
            && prepared.node != *n
        {
            return Err(format!(
                "the target shim says it runs on node {:?}, not on {n}, the node the controller chose",
                prepared.node
            ));
        }
        let leads_to = |what: &str, shown: &str, host: Option<String>| match &self.target_address {
            Some(addr) if host.as_deref() != Some(addr.as_str()) => Err(format!(
                "the target's {what} {shown:?} does not lead to {addr}, the address of the node the controller chose"
            )),
            _ => Ok(()),
        };
        match (&prepared.proxy, tls) {
            (Some(proxy), true) => {
                let addr: std::net::SocketAddr = proxy.parse().map_err(|_| {
                    format!("the target's migration proxy {proxy:?} is not an IP:PORT")
                })?;
                leads_to("migration proxy", proxy, Some(addr.ip().to_string()))
            }
            (None, true) => Err(format!(
                "the target offers the plain libvirt connection {:?} and no migration proxy; \
                 this node migrates through the shims' mutual-TLS proxies only",
                prepared.libvirt_uri
            )),
            (Some(proxy), false) => Err(format!(
                "the target takes migrations through its mutual-TLS proxy {proxy} only, and this \
                 source shim has no node identity (--pki-dir)"
            )),
            (None, false) => {
                for (what, uri) in [
                    ("libvirt URI", &prepared.libvirt_uri),
                    ("migration URI", &prepared.migration_uri),
                ] {
                    leads_to(what, uri, uri_host(uri).map(String::from))?;
                }
                Ok(())
            }
        }
    }

    /// Whether the target is reached over TLS (`https://`).
    pub fn uses_tls(&self) -> bool {
        self.target.starts_with("https://")
    }

    /// The timeout in effect.
    pub fn timeout(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.timeout_s.unwrap_or(DEFAULT_TIMEOUT_S))
    }
}

/// The host of `scheme://[user@]HOST[:PORT][/path][?query]` (an IPv6 address without its
/// brackets), if there is one.
pub fn uri_host(uri: &str) -> Option<&str> {
    let rest = uri.split_once("://")?.1;
    let authority = rest.split(['/', '?']).next()?;
    let authority = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let host = match authority.strip_prefix('[') {
        Some(v6) => v6.split_once(']')?.0,
        None => authority.split(':').next()?,
    };
    (!host.is_empty()).then_some(host)
}

/// Where a job is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum JobState {
    /// Preparing the target.
    Preparing,
    /// Memory is moving.
    Running,
    /// The VM runs on the target.
    Completed,
    /// Aborted on request (or at the timeout); the VM runs here.
    Aborted,
    /// Failed; the VM runs here (libvirt resumes the source on failure).
    Failed,
}

impl JobState {
    /// Whether the job is over.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            JobState::Completed | JobState::Aborted | JobState::Failed
        )
    }
}

/// libvirt's job statistics, in the units the API uses.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct JobStats {
    /// Bytes to transfer in total (memory + disks).
    pub data_total: Option<u64>,
    /// Bytes transferred.
    pub data_processed: Option<u64>,
    /// Bytes left.
    pub data_remaining: Option<u64>,
    /// Memory pass (1 = the first full copy).
    pub iteration: Option<u64>,
    /// Guest pages dirtied per second.
    pub dirty_rate_pages_s: Option<u64>,
    /// Transfer rate in bytes/s.
    pub bandwidth_bytes_s: Option<u64>,
    /// Time since the job started, in ms.
    pub elapsed_ms: Option<u64>,
    /// The guest's pause for the final copy, in ms (after completion).
    pub downtime_ms: Option<u64>,
    /// Setup time, in ms.
    pub setup_ms: Option<u64>,
}

/// A migration job of this shim (outgoing).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Job {
    /// Job number in this shim's life (1, 2, ...).
    pub id: u64,
    /// Where it is.
    pub state: JobState,
    /// The target shim.
    pub target: String,
    /// The target node (once prepared).
    pub target_node: Option<String>,
    /// The request's parameters.
    pub request: MigrateParameters,
    /// When it started, ns since the Unix epoch.
    pub started_unix_ns: u64,
    /// When it ended.
    pub finished_unix_ns: Option<u64>,
    /// Why it failed or was aborted.
    pub error: Option<String>,
    /// The latest stats while running; the final ones (with the downtime, as the target's
    /// libvirt reports them) after completion.
    pub stats: JobStats,
}

/// The parameters of a migration, without the token.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigrateParameters {
    /// MiB/s.
    pub bandwidth_mib_s: Option<u64>,
    /// ms.
    pub max_downtime_ms: Option<u64>,
    /// Auto-converge.
    pub auto_converge: bool,
    /// Post-copy allowed.
    pub post_copy: bool,
    /// s.
    pub timeout_s: u64,
}

impl From<&MigrateRequest> for MigrateParameters {
    fn from(r: &MigrateRequest) -> Self {
        MigrateParameters {
            bandwidth_mib_s: r.bandwidth_mib_s,
            max_downtime_ms: r.max_downtime_ms,
            auto_converge: r.auto_converge,
            post_copy: r.post_copy,
            timeout_s: r.timeout().as_secs(),
        }
    }
}

/// `GET /v1/events` answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Events {
    /// Events with `seq` greater than the request's `after`, oldest first.
    pub events: Vec<Event>,
    /// The `after` to use next.
    pub next: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req() -> MigrateRequest {
        MigrateRequest {
            target: "http://10.213.0.12:17001".into(),
            target_token: "s3cret".into(),
            bandwidth_mib_s: Some(100),
            max_downtime_ms: Some(300),
            auto_converge: true,
            post_copy: false,
            timeout_s: Some(60),
            target_node: None,
            target_address: None,
        }
    }

    fn prepared(node: &str, libvirt: &str, migration: &str) -> Prepared {
        Prepared {
            node: node.into(),
            libvirt_uri: libvirt.into(),
            migration_uri: migration.into(),
            proxy: None,
            tap: "t".into(),
            ovn_port: "p".into(),
            nics: vec![],
        }
    }

    fn proxied(node: &str, proxy: &str) -> Prepared {
        Prepared {
            proxy: Some(proxy.into()),
            ..prepared(node, "", "")
        }
    }

    #[test]
    fn the_source_migrates_only_to_the_node_the_controller_chose() {
        let r = MigrateRequest {
            target_node: Some("node-b".into()),
            target_address: Some("10.213.0.2".into()),
            ..req()
        };
        r.check_prepared(&proxied("node-b", "10.213.0.2:17200"), true)
            .unwrap();
        let plain = prepared(
            "node-b",
            "qemu+tcp://10.213.0.2:17200/system",
            "tcp://10.213.0.2",
        );
        for (p, tls, says) in [
            (proxied("node-c", "10.213.0.2:17200"), true, "not on node-b"),
            (
                proxied("node-b", "10.213.0.3:17200"),
                true,
                "migration proxy",
            ),
            (proxied("node-b", "10.213.0.2"), true, "IP:PORT"),
            // no downgrade to a plain connection
            (plain.clone(), true, "proxies only"),
            // a source without a node identity cannot use the proxy
            (
                proxied("node-b", "10.213.0.2:17200"),
                false,
                "no node identity",
            ),
            (
                prepared(
                    "node-b",
                    "qemu+tcp://10.213.0.3:17200/system",
                    "tcp://10.213.0.2",
                ),
                false,
                "libvirt URI",
            ),
            (
                prepared(
                    "node-b",
                    "qemu+tcp://10.213.0.2:17200/system",
                    "tcp://10.213.0.66:49152",
                ),
                false,
                "migration URI",
            ),
        ] {
            let e = r.check_prepared(&p, tls).unwrap_err();
            assert!(e.contains(says), "{p:?}: {e}");
        }
        // plain TCP is the source's to allow (a lab without roam-node, the tests' libvirtds)
        r.check_prepared(&plain, false).unwrap();
        // an older controller names no node: nothing to hold the target to
        req()
            .check_prepared(&prepared("x", "qemu+tcp://h/system", "tcp://h"), false)
            .unwrap();
    }

    #[test]
    fn uri_hosts() {
        for (uri, host) in [
            (
                "qemu+tls://10.0.0.1:17200/system?pkipath=/x",
                Some("10.0.0.1"),
            ),
            ("qemu+tcp://node-b/system", Some("node-b")),
            ("tcp://10.0.0.1", Some("10.0.0.1")),
            ("tcp://[fd00::1]:49152", Some("fd00::1")),
            ("qemu+ssh://root@node-b/system", Some("node-b")),
            ("qemu:///system", None),
            ("10.0.0.1", None),
        ] {
            assert_eq!(uri_host(uri), host, "{uri}");
        }
    }

    #[test]
    fn a_good_request_passes() {
        req().validate().unwrap();
        let minimal: MigrateRequest =
            serde_json::from_str(r#"{"target":"http://h:1","target_token":"t"}"#).unwrap();
        minimal.validate().unwrap();
        assert!(!minimal.uses_tls());
        assert_eq!(minimal.timeout().as_secs(), DEFAULT_TIMEOUT_S);
        let tls: MigrateRequest = serde_json::from_str(
            r#"{"target":"https://10.0.0.2:1","target_token":"t","target_node":"node-b"}"#,
        )
        .unwrap();
        tls.validate().unwrap();
        assert!(tls.uses_tls());
    }

    #[test]
    fn bad_requests_say_what_is_allowed() {
        type Mutation = Box<dyn Fn(&mut MigrateRequest)>;
        let cases: Vec<(Mutation, &str)> = vec![
            (
                Box::new(|r| r.target = "10.0.0.1:1".into()),
                "http://HOST:PORT",
            ),
            (
                Box::new(|r| r.target = "ftp://h:1".into()),
                "https://HOST:PORT or http://HOST:PORT",
            ),
            (
                Box::new(|r| {
                    r.target = "https://h:1".into();
                    r.target_node = None;
                }),
                "names the target node",
            ),
            (
                Box::new(|r| r.target = "http://h".into()),
                "http://HOST:PORT",
            ),
            (
                Box::new(|r| r.target = "http://h:0".into()),
                "http://HOST:PORT",
            ),
            (
                Box::new(|r| r.target = "http://:80".into()),
                "http://HOST:PORT",
            ),
            (
                Box::new(|r| r.target = "http://h/x:80".into()),
                "http://HOST:PORT",
            ),
            (Box::new(|r| r.target_token = " ".into()), "target_token"),
            (
                Box::new(|r| r.bandwidth_mib_s = Some(0)),
                "bandwidth_mib_s 0",
            ),
            (Box::new(|r| r.max_downtime_ms = Some(0)), "max_downtime_ms"),
            (
                Box::new(|r| r.max_downtime_ms = Some(MAX_DOWNTIME_MS + 1)),
                "max_downtime_ms",
            ),
            (Box::new(|r| r.timeout_s = Some(0)), "timeout_s"),
        ];
        for (mutate, expect) in cases {
            let mut r = req();
            mutate(&mut r);
            let err = r.validate().unwrap_err();
            assert!(err.contains(expect), "{err:?} should mention {expect:?}");
        }
    }

    #[test]
    fn health_is_ok_and_version_only_and_reads_an_older_shims_answer() {
        let h = Health {
            ok: true,
            version: "0.1.0".into(),
        };
        assert_eq!(
            serde_json::to_value(&h).unwrap(),
            serde_json::json!({"ok": true, "version": "0.1.0"})
        );
        let older = r#"{"ok":true,"version":"0.1.0","vm":"vm1","node":"node-a"}"#;
        assert_eq!(serde_json::from_str::<Health>(older).unwrap(), h);
    }

    #[test]
    fn final_states() {
        assert!(JobState::Completed.is_final());
        assert!(JobState::Aborted.is_final());
        assert!(!JobState::Running.is_final());
        assert!(!JobState::Preparing.is_final());
    }
}
