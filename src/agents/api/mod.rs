//! The daemon's local API for channel plugins (HTTP on loopback, or TLS with `[api] tls`).

pub mod client;
pub mod listener;
pub mod present;
pub mod server;
pub mod tls;
pub mod wire;
