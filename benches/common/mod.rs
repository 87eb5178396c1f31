//! What the benchmarks need beside the fake Bot API: their knobs from the environment, the
//! nearest-rank percentile they report, how long a step may take, and the daemon's
//! configuration (`config`).

// Each benchmark uses its own part of what is here.
#![allow(dead_code)]

pub mod config;

use std::time::Duration;

/// Far beyond what a healthy step takes: a stuck run fails with a log instead of hanging.
pub const STEP_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a daemon may take to listen, or a plugin to finish its handshake.
pub const START_TIMEOUT: Duration = Duration::from_secs(30);

/// How often a wait looks again at a process's log or whether it exited.
pub const PROCESS_POLL_INTERVAL: Duration = Duration::from_millis(2);

/// `SWITCHBOARD_BENCH_QUICK=1`: a smoke run of a few seconds.
pub fn quick() -> bool {
    std::env::var("SWITCHBOARD_BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0")
}

/// A positive count from `var`, or `default` when it is unset.
pub fn env_count(var: &str, default: usize) -> usize {
    match std::env::var(var) {
        Ok(value) => match value.trim().parse() {
            Ok(count) if count > 0 => count,
            _ => panic!("{var}={value:?}: expected a positive whole number"),
        },
        Err(_) => default,
    }
}

/// The nearest-rank percentile of sorted samples: the smallest sample that at least `p`
/// percent of all samples do not exceed.
pub fn percentile(sorted: &[Duration], p: usize) -> Duration {
    let rank = (sorted.len() * p).div_ceil(100).max(1);
    sorted[rank - 1]
}
