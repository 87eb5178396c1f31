//! Prometheus metrics (DESIGN.md §12) through the `metrics` facade and its Prometheus
//! recorder. The recorder has no listener of its own: `GET /metrics` on the local API
//! renders it ([`render`]).
//!
//! Two kinds of figures:
//! - **events**, counted where they happen (envelopes recorded, send attempts, Bot API
//!   errors, rate-limit waits, refusals) and the two hop latencies. Counters start at zero
//!   with the process, as Prometheus expects; `rate()` and `increase()` handle restarts.
//! - **states**, read at scrape time from their source of truth (envelopes and handoffs by
//!   state from the ledger, connected sessions from the bridge, readiness), so they can
//!   never drift from what `switchboard ledger stats` says.
//!
//! Nothing here carries message content: labels are closed sets (states, outcomes, error
//! kinds, refusal codes, tool names).

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use chrono::{DateTime, Utc};
use metrics::{Unit, counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::ledger::{
    AttemptState, EnvelopeKind, EnvelopeState, HandoffState, PermissionState, RoomCascadeState,
};

pub const ENVELOPES: &str = "switchboard_envelopes";
pub const ENVELOPES_RECORDED: &str = "switchboard_envelopes_recorded_total";
pub const ATTEMPTS: &str = "switchboard_attempts_total";
pub const UNRECONCILED_ATTEMPTS: &str = "switchboard_unreconciled_attempts";
pub const INBOUND_HOP: &str = "switchboard_inbound_hop_seconds";
pub const OUTBOUND_HOP: &str = "switchboard_outbound_hop_seconds";
pub const BOT_API_ERRORS: &str = "switchboard_bot_api_errors_total";
pub const RATE_LIMIT_WAITS: &str = "switchboard_rate_limit_waits_total";
pub const RATE_LIMIT_WAIT_SECONDS: &str = "switchboard_rate_limit_wait_seconds_total";
pub const SESSIONS_CONNECTED: &str = "switchboard_sessions_connected";
pub const REFUSALS: &str = "switchboard_refusals_total";
pub const HANDOFFS: &str = "switchboard_handoffs";
pub const CASCADES: &str = "switchboard_cascades";
pub const READY: &str = "switchboard_ready";
pub const CONFIG_RELOADS: &str = "switchboard_config_reloads_total";
pub const CERTIFICATE_READS: &str = "switchboard_api_certificate_reads_total";
pub const CERTIFICATE_EXPIRY: &str = "switchboard_api_certificate_expires_at_seconds";
pub const TASK_REVISIONS: &str = "switchboard_task_revisions_total";
pub const LEDGER_WRITE_FAILURES: &str = "switchboard_ledger_write_failures_total";
pub const PERMISSION_REQUESTS: &str = "switchboard_permission_requests";
pub const WEBHOOK_REQUESTS: &str = "switchboard_webhook_requests_total";
pub const LEADER_TERM: &str = "switchboard_leader_term";
pub const STANDING_BY: &str = "switchboard_standing_by";

/// Bucket bounds of both hop histograms, in seconds: a local hop takes milliseconds, a
/// send to Telegram tens to hundreds of them, and an envelope that waited for its agent's
/// session to connect minutes. Beyond five minutes only the count matters.
const HOP_BUCKETS: &[f64] =
    &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0];

/// How soon after a histogram sample the recorder is tidied when nobody scrapes: its
/// histograms buffer samples until then (or until a scrape, which drains them itself).
/// The exporter's own default interval.
pub const UPKEEP_INTERVAL: Duration = Duration::from_secs(5);

/// Rung by the first histogram sample since the last upkeep. Only samples leave the
/// recorder anything to tidy, so the upkeep waits for this bell rather than waking an
/// idle daemon on a timer.
#[derive(Default)]
struct SampleBell {
    /// A sample is buffered that no upkeep has tidied yet; later samples ring no more.
    untidied: AtomicBool,
    bell: Notify,
}

impl SampleBell {
    fn global() -> &'static SampleBell {
        static BELL: OnceLock<SampleBell> = OnceLock::new();
        BELL.get_or_init(SampleBell::default)
    }

    fn ring(&self) {
        if !self.untidied.load(Ordering::Relaxed) && !self.untidied.swap(true, Ordering::Relaxed) {
            self.bell.notify_one();
        }
    }
}

/// Tidies the recorder's histogram buffers [`UPKEEP_INTERVAL`] after a sample, until
/// `shutdown`: without an exporter thread of its own, the recorder relies on its owner
/// for that. A steady load gets one upkeep per interval, as with a timer; an idle daemon
/// none. A scrape drains the buffers itself, so what it shows never waits for an upkeep.
pub async fn upkeep(handle: PrometheusHandle, shutdown: CancellationToken) {
    tidy_after_samples(SampleBell::global(), UPKEEP_INTERVAL, || handle.run_upkeep(), shutdown).await;
}

/// [`upkeep`]'s loop: `tidy` once `interval` after `samples` rings.
async fn tidy_after_samples(
    samples: &SampleBell,
    interval: Duration,
    mut tidy: impl FnMut(),
    shutdown: CancellationToken,
) {
    loop {
        tokio::select! {
            () = samples.bell.notified() => {}
            () = shutdown.cancelled() => return,
        }
        tokio::select! {
            () = tokio::time::sleep(interval) => {}
            () = shutdown.cancelled() => return,
        }
        // Before the tidy, so that a sample it might miss rings for the next one.
        samples.untidied.store(false, Ordering::Relaxed);
        tidy();
    }
}

/// The tools whose refusals are counted, and the reasons they can give (the wire codes).
pub const REFUSAL_TOOLS: &[&str] = &["reply", "ack", "handoff"];

/// On PostgreSQL: the term this replica was elected for, and that it no longer stands by.
pub fn set_leader_term(term: i64) {
    metrics::gauge!(LEADER_TERM).set(term as f64);
    metrics::gauge!(STANDING_BY).set(0.0);
}

/// Installs the Prometheus recorder as the process's global recorder, once; later calls
/// return the same handle. A replica on PostgreSQL labels every series with its name
/// (`replica`). A process that already has another recorder (a test harness,
/// say) still gets a handle, which then renders only what was described here.
pub fn install(replica: Option<&str>) -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let mut builder = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_hop_seconds".into()), HOP_BUCKETS)
                .expect("the hop buckets are not empty");
            // Replicas scraped side by side: every series says which one it came from.
            if let Some(replica) = replica {
                builder = builder.add_global_label("replica", replica);
            }
            let recorder = builder.build_recorder();
            let handle = recorder.handle();
            if metrics::set_global_recorder(recorder).is_err() {
                tracing::warn!(
                    "a metrics recorder was already installed: /metrics will miss switchboard's events"
                );
            }
            describe();
            handle
        })
        .clone()
}

fn describe() {
    describe_gauge!(ENVELOPES, "Envelopes in the ledger, by state (read from the ledger at scrape time).");
    describe_counter!(ENVELOPES_RECORDED, "Envelopes recorded by intake since start, by initial state.");
    describe_counter!(
        WEBHOOK_REQUESTS,
        "Requests to the webhook listener since start, by answer (stored, unauthorized, not_an_update, \
         incomplete, ledger_congested, ledger_failed)."
    );
    describe_counter!(
        ATTEMPTS,
        "Attempts recorded since start, by outcome (sent, not_sent, unknown): every Bot API call the ledger \
         records, a reply's parts and files, reactions, edits and audit copies alike."
    );
    describe_gauge!(
        UNRECONCILED_ATTEMPTS,
        "Attempts whose outcome is unknown and that no operator has reconciled (from the ledger)."
    );
    describe_histogram!(
        INBOUND_HOP,
        Unit::Seconds,
        "From an envelope's recording in the ledger to its hand-over to the agent's session (includes time queued \
         while the agent had no session)."
    );
    describe_histogram!(
        OUTBOUND_HOP,
        Unit::Seconds,
        "One recorded exchange with Telegram (a reply's part or file, a reaction, an edit, an audit copy): \
         from the request to its answer (or failure)."
    );
    describe_counter!(BOT_API_ERRORS, "Bot API calls that failed, by method and kind.");
    describe_counter!(RATE_LIMIT_WAITS, "429 retry_after waits, by method.");
    describe_counter!(
        RATE_LIMIT_WAIT_SECONDS,
        Unit::Seconds,
        "Seconds spent in 429 retry_after waits, by method."
    );
    describe_gauge!(SESSIONS_CONNECTED, "Agent sessions connected now.");
    describe_counter!(
        REFUSALS,
        "Tool calls refused by the reply resolver or the delegation guard, by tool and reason (the error code)."
    );
    describe_gauge!(HANDOFFS, "Handoffs in the ledger, by state (read from the ledger at scrape time).");
    describe_gauge!(
        CASCADES,
        "Group-room exchanges in the ledger, by state: waiting, running, or how each ended (read from the ledger at scrape time)."
    );
    describe_gauge!(READY, "1 when /readyz answers 200, else 0.");
    describe_gauge!(
        LEADER_TERM,
        "On PostgreSQL: the term this replica leads the bot under (only a leader serves /metrics)."
    );
    describe_gauge!(
        STANDING_BY,
        "On PostgreSQL: 1 while this replica stands by (at api.health_listen), 0 once it leads."
    );
    describe_gauge!(
        PERMISSION_REQUESTS,
        "Relayed permission requests in the ledger, by outcome (pending, allowed, denied, expired)."
    );
    describe_counter!(CONFIG_RELOADS, "SIGHUP reloads, by result (applied, refused).");
    describe_counter!(
        CERTIFICATE_READS,
        "The local API's certificate read again at a SIGHUP, by result (renewed, unchanged, refused)."
    );
    describe_gauge!(
        CERTIFICATE_EXPIRY,
        "When the certificate the local API serves (api.tls) expires, in Unix seconds."
    );
    describe_counter!(
        TASK_REVISIONS,
        "Changes recorded to tasks (DESIGN.md §11), by change (correction, new_objective, pause, resume, cancel)."
    );
    describe_counter!(
        LEDGER_WRITE_FAILURES,
        "Ledger writes that failed, by write (intake, attempt, checkpoint) and reason (disk_full, busy, other)."
    );

    // The series alerts look at exist from the start, at zero, so `rate()` and `> 0`
    // rules see them before the first event.
    for outcome in [AttemptState::Sent, AttemptState::NotSent, AttemptState::Unknown] {
        counter!(ATTEMPTS, "outcome" => outcome.as_str()).increment(0);
    }
    for tool in REFUSAL_TOOLS {
        counter!(REFUSALS, "tool" => *tool, "reason" => "ambiguous").increment(0);
    }
    for write in ["intake", "attempt", "checkpoint"] {
        counter!(LEDGER_WRITE_FAILURES, "write" => write, "reason" => "disk_full").increment(0);
    }
}

/// A ledger write failed (`ledger::WriteWatch`).
pub fn ledger_write_failed(write: &'static str, reason: &'static str) {
    counter!(LEDGER_WRITE_FAILURES, "write" => write, "reason" => reason).increment(1);
}

/// The webhook listener answered a request with `answer` (a closed set, see
/// `telegram::webhook`).
pub fn webhook_request(answer: &'static str) {
    counter!(WEBHOOK_REQUESTS, "answer" => answer).increment(1);
}

/// Intake recorded a new envelope in `state`.
pub fn envelope_recorded(state: EnvelopeState) {
    counter!(ENVELOPES_RECORDED, "state" => state.as_str()).increment(1);
}

/// A send attempt ended with `outcome` after `elapsed` on the wire.
pub fn attempt_finished(outcome: AttemptState, elapsed: Duration) {
    counter!(ATTEMPTS, "outcome" => outcome.as_str()).increment(1);
    histogram!(OUTBOUND_HOP).record(elapsed.as_secs_f64());
    SampleBell::global().ring();
}

/// An envelope of `kind`, recorded at `received_at` (the ledger's RFC 3339 time), was
/// handed to its agent's session for the first time.
pub fn envelope_handed_over(kind: EnvelopeKind, received_at: DateTime<Utc>) {
    let waited = (Utc::now() - received_at).to_std().unwrap_or(Duration::ZERO);
    histogram!(INBOUND_HOP, "kind" => kind.as_str()).record(waited.as_secs_f64());
    SampleBell::global().ring();
}

/// A Bot API call failed; `kind` is a closed set per method (see the callers).
pub fn bot_api_error(method: &'static str, kind: &'static str) {
    counter!(BOT_API_ERRORS, "method" => method, "kind" => kind).increment(1);
}

/// Telegram asked to wait (429 `retry_after`), and the daemon does.
pub fn rate_limit_wait(method: &'static str, wait: Duration) {
    counter!(RATE_LIMIT_WAITS, "method" => method).increment(1);
    counter!(RATE_LIMIT_WAIT_SECONDS, "method" => method).increment(wait.as_secs());
}

/// A tool call was refused with `reason` (its wire code).
pub fn refusal(tool: &'static str, reason: &'static str) {
    counter!(REFUSALS, "tool" => tool, "reason" => reason).increment(1);
}

/// A change to a task was recorded.
pub fn task_revision(change: &'static str) {
    counter!(TASK_REVISIONS, "change" => change).increment(1);
}

/// A SIGHUP reload was applied or refused.
pub fn config_reload(applied: bool) {
    counter!(CONFIG_RELOADS, "result" => if applied { "applied" } else { "refused" }).increment(1);
}

/// `api.tls`'s files read again at a SIGHUP: `renewed`, `unchanged` or `refused`.
pub fn certificate_read(result: &'static str) {
    counter!(CERTIFICATE_READS, "result" => result).increment(1);
}

/// When the certificate the local API serves expires.
pub fn certificate_expires_at(at: chrono::DateTime<chrono::Utc>) {
    gauge!(CERTIFICATE_EXPIRY).set(at.timestamp() as f64);
}

/// What the scrape reads from its sources of truth.
#[derive(Debug, Clone, Default)]
pub struct StateGauges {
    pub envelopes: Vec<(String, i64)>,
    pub handoffs: Vec<(String, i64)>,
    /// Room exchanges by state (DESIGN.md §10).
    pub cascades: Vec<(String, i64)>,
    pub unreconciled_attempts: i64,
    pub sessions_connected: usize,
    pub ready: bool,
    /// Permission requests by state (DESIGN.md §15).
    pub permissions: Vec<(String, i64)>,
}

/// Sets the state gauges (every known state, zero when absent, so an alert on
/// `switchboard_envelopes{state="unresolved"} > 0` always has a series) and renders.
pub fn render(handle: &PrometheusHandle, gauges: &StateGauges) -> String {
    let envelope_states = EnvelopeState::ALL.map(EnvelopeState::as_str);
    set_by_state(ENVELOPES, &envelope_states, &gauges.envelopes);
    let handoff_states =
        [HandoffState::Open, HandoffState::Answered, HandoffState::Closed, HandoffState::Superseded]
            .map(HandoffState::as_str);
    set_by_state(HANDOFFS, &handoff_states, &gauges.handoffs);
    set_by_state(CASCADES, &RoomCascadeState::ALL.map(RoomCascadeState::as_str), &gauges.cascades);
    let permission_states = PermissionState::ALL.map(PermissionState::as_str);
    set_by_state(PERMISSION_REQUESTS, &permission_states, &gauges.permissions);
    gauge!(UNRECONCILED_ATTEMPTS).set(gauges.unreconciled_attempts as f64);
    gauge!(SESSIONS_CONNECTED).set(gauges.sessions_connected as f64);
    gauge!(READY).set(if gauges.ready { 1.0 } else { 0.0 });
    handle.render()
}

/// Every known state at its count (zero when the ledger has none), and any state the
/// ledger knows that this list does not.
fn set_by_state(name: &'static str, known: &[&'static str], counts: &[(String, i64)]) {
    for state in known {
        let count = counts.iter().find(|(s, _)| s == state).map_or(0, |(_, n)| *n);
        gauge!(name, "state" => *state).set(count as f64);
    }
    for (state, count) in counts.iter().filter(|(s, _)| !known.contains(&s.as_str())) {
        gauge!(name, "state" => state.clone()).set(*count as f64);
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    /// An idle daemon has no samples, so nothing to tidy: the upkeep must not wake it. The
    /// waits are real durations (ten intervals each) over which nothing may happen.
    #[tokio::test]
    async fn the_upkeep_tidies_once_after_samples_and_never_while_idle() {
        const INTERVAL: Duration = Duration::from_millis(20);
        let samples = SampleBell::default();
        let tidied = Cell::new(0);
        let shutdown = CancellationToken::new();
        let tidying =
            tidy_after_samples(&samples, INTERVAL, || tidied.set(tidied.get() + 1), shutdown.clone());
        let watch = async {
            tokio::time::sleep(INTERVAL * 10).await;
            assert_eq!(tidied.get(), 0, "no samples, no upkeep");
            // A burst of samples within one interval gets one upkeep.
            for _ in 0..3 {
                samples.ring();
            }
            while tidied.get() == 0 {
                tokio::time::sleep(INTERVAL / 4).await;
            }
            tokio::time::sleep(INTERVAL * 10).await;
            assert_eq!(tidied.get(), 1, "the burst was tidied once, and nothing since");
            shutdown.cancel();
        };
        tokio::join!(tidying, watch);
    }

    /// Without any upkeep, a scrape still shows every sample: rendering drains the
    /// histograms' buffers itself.
    #[test]
    fn a_scrape_shows_every_hop_sample_without_an_upkeep() {
        let handle = install(None);
        let count = |rendered: &str| -> f64 {
            rendered
                .lines()
                .find(|line| line.starts_with(&format!("{OUTBOUND_HOP}_count")))
                .and_then(|line| line.rsplit(' ').next())
                .map_or(0.0, |n| n.parse().unwrap())
        };
        let before = count(&render(&handle, &StateGauges::default()));
        for _ in 0..7 {
            attempt_finished(AttemptState::Sent, Duration::from_millis(3));
        }
        let after = count(&render(&handle, &StateGauges::default()));
        assert_eq!(after - before, 7.0);
    }
}
