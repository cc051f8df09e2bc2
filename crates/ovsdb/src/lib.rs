//! A native OVSDB client (RFC 7047): JSON-RPC over a unix, TCP or TLS stream socket, for OVN's
//! northbound database and a node's local `Open_vSwitch` database.
//!
//! - [`Client`] is one connection. A background task owns the socket: it writes requests,
//!   routes replies to their callers by `id` and notifications to monitors by monitor id,
//!   answers the server's `echo` keepalives, and probes an idle server with its own `echo`
//!   ([`ClientOptions::inactivity_probe`]), closing a connection that stopped answering.
//! - [`ReconnectingClient`] reconnects with bounded exponential backoff and re-establishes
//!   its monitors; requests are never retried (an interrupted `transact` has an unknown
//!   outcome, see [`Error::Disconnected`](Error::Disconnected)).
//! - [`Monitor`]: `monitor` / `monitor_cond` with a local replica, yielding
//!   [`MonitorEvent`]s of complete old/new rows.
//! - [`schema`]: the database schema from `get_schema`, to check transactions before sending
//!   them ([`Client::transact_checked`]) and to decode values.
//! - [`atom`]: [`Uuid`], [`OvsSet`], [`OvsMap`] and the untyped [`Atom`]/[`Datum`] in their
//!   RFC 7047 JSON forms.
//! - [`nb`], [`vswitch`]: typed rows ([`TableRow`]) for the tables roam uses, read with
//!   [`select_all`].
//! - [`ops`]: builders for transaction operations.

//!
//! Without its default feature `client` the crate is the data model alone (atoms, rows,
//! schema, operation builders, framing): no tokio, no socket, for the pure planners
//! (`roam-network`'s topology, `roam-core`) that build transactions without sending them.
#![warn(missing_docs)]

pub mod atom;
#[cfg(feature = "client")]
mod client;
#[cfg(feature = "client")]
mod connection;
mod error;
mod framing;
#[cfg(feature = "client")]
mod monitor;
pub mod nb;
pub mod ops;
#[cfg(feature = "client")]
mod reconnect;
mod row;
pub mod schema;
#[cfg(feature = "client")]
mod tls;
pub mod vswitch;

pub use atom::{Atom, Datum, NamedUuid, OvsMap, OvsSet, Uuid};
#[cfg(feature = "client")]
pub use client::{Client, ClientOptions, Endpoint};
pub use error::{Error, Result};
pub use framing::Framer;
#[cfg(feature = "client")]
pub use monitor::{
    Monitor, MonitorEvent, MonitorMethod, MonitorRequest, MonitorSelect, Row, RowUpdate,
    RowUpdate2, TableUpdates, TableUpdates2, parse_table_updates, parse_table_updates2,
};
#[cfg(feature = "client")]
pub use reconnect::{ReconnectOptions, ReconnectingClient};
pub use row::{TableRow, decode_row, decode_select, insert_op, row_json};
#[cfg(feature = "client")]
pub use row::{select_all, select_where};
pub use schema::DatabaseSchema;
#[cfg(feature = "client")]
pub use tls::{TlsFiles, TlsSettings};
