//! A native OVSDB client (RFC 7047): JSON-RPC over a unix or TCP stream socket.
//!
//! One [`Client`] is one connection. A background task owns the socket: it writes requests,
//! routes replies to their callers by `id`, and answers the server's `echo` keepalives so
//! that an idle connection is not dropped by the server's inactivity probe.

mod client;
mod framing;
pub mod ops;

pub use client::{Client, Endpoint};
pub use framing::Framer;
