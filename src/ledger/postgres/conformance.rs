//! The conformance suite (`crate::ledger::conformance`) on PostgreSQL: each rule on a
//! fresh schema of the machine's server, dropped when the rule ends. The concerns run here
//! are those this backend implements (see `unbuilt.rs` for the rest).

use std::sync::Arc;

use async_trait::async_trait;

use super::PgLedger;
use super::test_support::TestSchema;
use crate::ledger::Ledger;
use crate::ledger::conformance::Backend;

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
        (SchemaKept(Some(schema)), Arc::new(ledger))
    }
}

crate::ledger::conformance::suite!(Postgres; permissions);
