//! switchboard: connects Telegram conversations to AI agent sessions, durably and
//! explicitly. Modules follow the path of a message (see DESIGN.md §1):
//!
//! poller → envelope → routes → ledger → bridge → api (local API) → channel (MCP plugin)
//! and back: channel → api → resolver → outbound → Telegram.

pub mod api;
pub mod app;
pub mod backoff;
pub mod bridge;
pub mod channel;
pub mod cli;
pub mod config;
pub mod envelope;
pub mod ids;
pub mod ledger;
pub mod outbound;
pub mod poller;
pub mod resolver;
pub mod routes;
pub mod telemetry;
