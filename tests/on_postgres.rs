//! The daemon on PostgreSQL (DESIGN.md §16): the integration suites that hold whichever
//! backend keeps the ledger, run again with each daemon's ledger in a schema of its own on
//! the machine's PostgreSQL (`support::daemon::TestLedger`, chosen by this binary's name),
//! the replicas' own tests (`on_postgres/replicas.rs`), and the COMMITs whose answers are lost
//! (`on_postgres/lost_answers.rs`).
//!
//! Left out: the suites with tests of the SQLite file itself (its locks, its modes, a
//! writer holding it, rows damaged in it), which have no PostgreSQL counterpart here.

// Each suite declares `mod support;` for itself, so this binary holds the harness once per
// suite; the copies are what lets each suite be compiled unchanged.
#![allow(clippy::duplicate_mod)]

mod support;

#[path = "on_postgres/lost_answers.rs"]
mod lost_answers;
#[path = "on_postgres/replicas.rs"]
mod replicas;

#[path = "backup.rs"]
mod backup;
#[path = "channel_plugin.rs"]
mod channel_plugin;
#[path = "crash_loop.rs"]
mod crash_loop;
#[path = "full_disk.rs"]
mod full_disk;
#[path = "handoffs.rs"]
mod handoffs;
#[path = "inbound.rs"]
mod inbound;
#[path = "intake.rs"]
mod intake;
#[path = "interruptions.rs"]
mod interruptions;
#[path = "local_api.rs"]
mod local_api;
#[path = "media_files.rs"]
mod media_files;
#[path = "media_inbound.rs"]
mod media_inbound;
#[path = "outbound_surface.rs"]
mod outbound_surface;
#[path = "permissions.rs"]
mod permissions;
#[path = "refusal_codes.rs"]
mod refusal_codes;
#[path = "replies.rs"]
mod replies;
#[path = "retention.rs"]
mod retention;
#[path = "rooms.rs"]
mod rooms;
#[path = "session_start.rs"]
mod session_start;
#[path = "tasks.rs"]
mod tasks;
#[path = "telegram_limits.rs"]
mod telegram_limits;
#[path = "webhook.rs"]
mod webhook;
