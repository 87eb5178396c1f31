//! switchboard: connects Telegram conversations to AI agent sessions, durably and
//! explicitly. The modules follow the path of a message (DESIGN.md §1 and §13):
//!
//! - [`telegram`]: the edge to Telegram — the poller turns updates into envelopes, and
//!   outbound delivers replies as recorded attempts.
//! - [`ledger`]: the SQLite ack ledger every hop writes through.
//! - [`agents`]: the edge to agent sessions — the bridge, the local API and the MCP
//!   channel plugin.
//! - [`rules`]: the pure decisions (routes, the reply resolver): no I/O, no clock.
//!
//! Around them: [`config`], [`telemetry`], [`ids`], [`app`] (build and supervise the
//! daemon), [`operate`] (readiness, metrics, reload) and [`cli`]. [`fake_bot_api`] is a
//! test double of Telegram's Bot API, for the tests, the benchmarks and `switchboard demo`;
//! the daemon never uses it.

#![forbid(unsafe_code)]

pub mod agents;
pub mod app;
pub mod backoff;
pub mod cli;
pub mod clock;
pub mod config;
pub mod demo;
pub mod domain;
pub mod fake_bot_api;
pub mod ids;
pub mod ledger;
pub mod operate;
pub mod rules;
pub mod serve;
pub mod telegram;
pub mod telemetry;
