//! What both benchmarks need beside the fake Bot API: their knobs from the environment and
//! the nearest-rank percentile they report.

use std::time::Duration;

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
#[allow(dead_code)] // not every benchmark reports percentiles
pub fn percentile(sorted: &[Duration], p: usize) -> Duration {
    let rank = (sorted.len() * p).div_ceil(100).max(1);
    sorted[rank - 1]
}
