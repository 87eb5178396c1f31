//! The conformance suite (`crate::ledger::conformance`) on PostgreSQL: each rule on a
//! fresh schema of the machine's server, dropped when the rule ends.

use std::sync::Arc;

use async_trait::async_trait;

use super::PgLedger;
use super::test_support::TestSchema;
use crate::ledger::Ledger;
use crate::ledger::conformance::Backend;
use crate::rules::leadership::Term;

pub(super) struct Postgres;

/// A test's schema, dropped when the test ends, whether it passed or panicked.
pub(super) struct SchemaKept(Option<TestSchema>);

impl Drop for SchemaKept {
    fn drop(&mut self) {
        let Some(schema) = self.0.take() else { return };
        // Drop runs inside the test's runtime, which must not be blocked on: the schema is
        // dropped from a thread with a runtime of its own.
        let dropping = std::thread::spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime to drop the test schema")
                .block_on(schema.drop());
        });
        let _ = dropping.join();
    }
}

#[async_trait]
impl Backend for Postgres {
    type Keep = SchemaKept;

    async fn fresh() -> (SchemaKept, Ledger) {
        let schema = TestSchema::create().await;
        let ledger = PgLedger::connect(&schema.url).await.expect("a fresh PostgreSQL ledger");
        lead_the_rules_bots(&ledger).await;
        (SchemaKept(Some(schema)), Arc::new(ledger))
    }
}

/// The bots whose polled batches the rules record (`record_batch(BOT, …)`).
const RULES_BOTS: std::ops::RangeInclusive<i64> = 1..=9;

/// Makes the ledger the polling leader of [`RULES_BOTS`] in term 1, as an election would
/// (`leadership`), so the rules' polled batches pass the fence: the rules are about what a
/// leader's intake records, and elections have tests of their own (`tests.rs`).
pub(super) async fn lead_the_rules_bots(ledger: &PgLedger) {
    for bot_id in RULES_BOTS {
        sqlx::query(
            "INSERT INTO poller_leases (bot_id, term, holder, holder_pid, elected_at, renewed_at, expires_at) \
             VALUES ($1, 1, 'conformance', pg_backend_pid(), now(), now(), now() + interval '1 hour')",
        )
        .bind(bot_id)
        .execute(&ledger.pool)
        .await
        .expect("a lease for the rules' bot");
        ledger.lead_polling(bot_id, Term::new(1));
    }
}

crate::ledger::conformance::suite!(Postgres);
