//! The daemon's local API for channel plugins (loopback HTTP).

pub mod client;
pub mod present;
pub mod server;
pub mod wire;
