//! A fresh schema per test on the machine's PostgreSQL (`postgres://postgres@127.0.0.1:5432/test`,
//! or `SWITCHBOARD_TEST_POSTGRES`), created by the test and dropped at its end. Tests run in
//! parallel, each in a schema of its own in one database.
//!
//! A schema is named after the process that made it (`sb_test_<pid>_<n>_<random>`), so a
//! run drops the schemas that crashed runs left behind: those whose process is gone. The
//! integration tests' harness uses this file too (`tests/support/postgres.rs`), in a
//! binary that compiles it once per suite, each copy with a counter of its own: the random
//! part keeps their names apart.

use std::sync::atomic::{AtomicU32, Ordering};

use sqlx::{Connection, PgConnection};
use tokio::sync::OnceCell;

/// The server the tests use unless `SWITCHBOARD_TEST_POSTGRES` names another.
const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// The prefix of every test schema.
const PREFIX: &str = "sb_test_";

/// The server's URL for the tests.
pub fn server_url() -> String {
    std::env::var("SWITCHBOARD_TEST_POSTGRES").unwrap_or_else(|_| DEFAULT_URL.to_owned())
}

/// A schema of one's own, and a URL whose connections use it.
pub struct TestSchema {
    pub name: String,
    /// The server's URL with `search_path` set to the schema.
    pub url: String,
}

static LEFTOVERS_DROPPED: OnceCell<()> = OnceCell::const_new();
static NEXT: AtomicU32 = AtomicU32::new(0);

/// A connection to the server as the tests' administrator: the role that creates and drops
/// schemas and kills sessions to simulate a crash.
pub async fn admin() -> PgConnection {
    PgConnection::connect(&server_url())
        .await
        .unwrap_or_else(|error| panic!("the tests need PostgreSQL at {}: {error}", server_url()))
}

impl TestSchema {
    pub async fn create() -> Self {
        LEFTOVERS_DROPPED.get_or_init(drop_leftovers).await;
        let random = std::hash::BuildHasher::hash_one(&std::collections::hash_map::RandomState::new(), 0u8);
        let name = format!(
            "{PREFIX}{}_{}_{:08x}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed),
            random as u32
        );
        let mut admin = admin().await;
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA {name}"))).execute(&mut admin).await.unwrap();
        let base = server_url();
        let separator = if base.contains('?') { '&' } else { '?' };
        // Commits not waiting for the server's fsync: durability is not what these tests
        // check, and their syncs would compete with the SQLite tests' that run beside them
        // (the checkpointer's WAL bound is timed).
        let url =
            format!("{base}{separator}options=-c%20search_path%3D{name}%20-c%20synchronous_commit%3Doff");
        Self { name, url }
    }

    /// Drops the schema and everything in it.
    pub async fn drop(self) {
        let mut admin = admin().await;
        // A test that failed may leave a connection in a transaction holding locks in the
        // schema: the drop gives up rather than hang the run, and the next run drops the
        // schema with the leftovers of dead processes.
        sqlx::query("SET lock_timeout = '10s'").execute(&mut admin).await.unwrap();
        sqlx::query(sqlx::AssertSqlSafe(format!("DROP SCHEMA {} CASCADE", self.name)))
            .execute(&mut admin)
            .await
            .unwrap();
    }
}

/// Drops the test schemas of processes that are gone (runs that crashed or were killed).
async fn drop_leftovers() {
    let mut admin = admin().await;
    let schemas: Vec<String> =
        sqlx::query_scalar("SELECT nspname::text FROM pg_namespace WHERE starts_with(nspname, $1)")
            .bind(PREFIX)
            .fetch_all(&mut admin)
            .await
            .unwrap();
    for schema in schemas {
        let pid = schema
            .strip_prefix(PREFIX)
            .and_then(|rest| rest.split('_').next())
            .and_then(|pid| pid.parse::<u32>().ok());
        let alive = pid.is_some_and(|pid| std::path::Path::new(&format!("/proc/{pid}")).exists());
        if !alive {
            // Another run may be dropping it too.
            let _ = sqlx::query(sqlx::AssertSqlSafe(format!("DROP SCHEMA IF EXISTS {schema} CASCADE")))
                .execute(&mut admin)
                .await;
        }
    }
}
