//! A fresh PostgreSQL schema for a daemon's ledger, on the machine's server
//! (`postgres://postgres@127.0.0.1:5432/test`, or `SWITCHBOARD_TEST_POSTGRES`), made when a
//! test configures its daemon and dropped when the test's daemon is dropped.
//!
//! Schemas are named after the test process (`sb_test_<pid>_<n>`, as the library's own
//! PostgreSQL tests name theirs), so a run drops those that killed runs left behind.
//!
//! The harness is synchronous and runs inside the tests' runtimes, so each statement runs
//! on a thread of its own with a runtime of its own.

#![allow(dead_code)]

use std::sync::Once;
use std::sync::atomic::{AtomicU32, Ordering};

use sqlx::{Connection, PgConnection};

const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";
const PREFIX: &str = "sb_test_";

static LEFTOVERS_DROPPED: Once = Once::new();
static NEXT: AtomicU32 = AtomicU32::new(0);

/// The server's URL for the tests.
pub fn server_url() -> String {
    std::env::var("SWITCHBOARD_TEST_POSTGRES").unwrap_or_else(|_| DEFAULT_URL.to_owned())
}

/// A schema of the test's own; dropped with this value.
#[derive(Debug)]
pub struct TestSchema {
    pub name: String,
    /// The server's URL with `search_path` set to the schema: `[storage] database`.
    pub url: String,
}

impl TestSchema {
    pub fn create() -> Self {
        LEFTOVERS_DROPPED.call_once(drop_leftovers);
        // A random part besides the counter: a binary that compiles this module more than once
        // (`on_postgres.rs`) has a counter per copy.
        let random = std::hash::BuildHasher::hash_one(&std::collections::hash_map::RandomState::new(), 0u8);
        let name = format!(
            "{PREFIX}{}_i{}_{:08x}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed),
            random as u32
        );
        run(vec![format!("CREATE SCHEMA {name}")]);
        let base = server_url();
        let separator = if base.contains('?') { '&' } else { '?' };
        // Commits that do not wait for the server's fsync: the daemon's own crashes (what
        // these tests inflict) lose nothing by it; only the server's would.
        let url =
            format!("{base}{separator}options=-c%20search_path%3D{name}%20-c%20synchronous_commit%3Doff");
        Self { name, url }
    }

    /// Runs one statement in the schema, as the tests' administrator: to watch what the
    /// daemon wrote, or to do what an operator would.
    pub fn execute(&self, statement: &str) {
        run(vec![format!("SET search_path = {}", self.name), statement.to_owned()]);
    }

    /// The first column of the first row of `query`, as text.
    pub fn scalar(&self, query: &str) -> Option<String> {
        let (name, query) = (self.name.clone(), query.to_owned());
        on_own_runtime(move || async move {
            let mut admin = admin().await;
            sqlx::query(sqlx::AssertSqlSafe(format!("SET search_path = {name}")))
                .execute(&mut admin)
                .await
                .unwrap();
            sqlx::query_scalar::<_, Option<String>>(sqlx::AssertSqlSafe(query))
                .fetch_optional(&mut admin)
                .await
                .unwrap()
                .flatten()
        })
    }
}

impl Drop for TestSchema {
    fn drop(&mut self) {
        // A killed daemon's sessions may still hold locks for a moment: give up rather
        // than hang, and let the next run drop it with the other leftovers.
        run(vec!["SET lock_timeout = '10s'".into(), format!("DROP SCHEMA IF EXISTS {} CASCADE", self.name)]);
    }
}

async fn admin() -> PgConnection {
    PgConnection::connect(&server_url())
        .await
        .unwrap_or_else(|error| panic!("the tests need PostgreSQL at {}: {error}", server_url()))
}

/// Runs `statements` in order on one connection.
fn run(statements: Vec<String>) {
    on_own_runtime(move || async move {
        let mut admin = admin().await;
        for statement in statements {
            if let Err(error) = sqlx::query(sqlx::AssertSqlSafe(statement.clone())).execute(&mut admin).await
            {
                panic!("{statement}: {error}");
            }
        }
    })
}

fn on_own_runtime<T, F>(work: impl FnOnce() -> F + Send + 'static) -> T
where
    T: Send + 'static,
    F: std::future::Future<Output = T>,
{
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(work())
    })
    .join()
    .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
}

/// Drops the test schemas of processes that are gone.
fn drop_leftovers() {
    on_own_runtime(|| async {
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
                let _ = sqlx::query(sqlx::AssertSqlSafe(format!("DROP SCHEMA IF EXISTS {schema} CASCADE")))
                    .execute(&mut admin)
                    .await;
            }
        }
    })
}

/// A session of the test's that holds the schema's intake tables locked against writes
/// (`LOCK TABLE … IN EXCLUSIVE MODE`: reads go on), as an operator's `psql` left in a
/// transaction would, until [`WriteLock::release`] or drop.
pub struct WriteLock {
    release: Option<std::sync::mpsc::Sender<()>>,
    holder: Option<std::thread::JoinHandle<()>>,
}

impl TestSchema {
    pub fn lock_against_writes(&self) -> WriteLock {
        let name = self.name.clone();
        let (locked_tx, locked) = std::sync::mpsc::channel();
        let (release, released) = std::sync::mpsc::channel::<()>();
        let holder = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(async {
                let mut admin = admin().await;
                for statement in [
                    format!("SET search_path = {name}"),
                    "BEGIN".to_owned(),
                    "LOCK TABLE envelopes, poller_offsets IN EXCLUSIVE MODE".to_owned(),
                ] {
                    sqlx::query(sqlx::AssertSqlSafe(statement)).execute(&mut admin).await.unwrap();
                }
                locked_tx.send(()).unwrap();
                // Released, or the test is gone.
                let _ = tokio::task::spawn_blocking(move || released.recv()).await;
                sqlx::query("ROLLBACK").execute(&mut admin).await.unwrap();
            });
        });
        locked.recv().expect("the lock is taken");
        WriteLock { release: Some(release), holder: Some(holder) }
    }
}

impl WriteLock {
    pub fn release(mut self) {
        self.let_go();
    }

    fn let_go(&mut self) {
        drop(self.release.take());
        if let Some(holder) = self.holder.take() {
            holder.join().expect("the lock's session ended");
        }
    }
}

impl Drop for WriteLock {
    fn drop(&mut self) {
        self.let_go();
    }
}
