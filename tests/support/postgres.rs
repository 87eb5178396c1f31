//! A fresh PostgreSQL schema for a daemon's ledger, on the machine's server
//! (`postgres://postgres@127.0.0.1:5432/test`, or `SWITCHBOARD_TEST_POSTGRES`), made when a
//! test configures its daemon and dropped when the test's daemon is dropped.
//!
//! The schemas themselves are the library's own PostgreSQL tests' (`shared`, the same file:
//! named after the test process, so a run drops those that killed runs left behind). This
//! wraps them for the harness, which is synchronous and runs inside the tests' runtimes:
//! each call runs on a thread of its own with a runtime of its own.

#![allow(dead_code)]

#[path = "../../src/ledger/postgres/test_support.rs"]
mod shared;

use shared::admin;

/// A schema of the test's own; dropped with this value.
#[derive(Debug)]
pub struct TestSchema {
    pub name: String,
    /// The server's URL with `search_path` set to the schema: `[storage] database`.
    pub url: String,
}

impl TestSchema {
    pub fn create() -> Self {
        let shared::TestSchema { name, url } = on_own_runtime(shared::TestSchema::create);
        Self { name, url }
    }

    /// The first column of the first row of `query`, as text.
    pub fn scalar(&self, query: &str) -> Option<String> {
        let (name, query) = (self.name.clone(), query.to_owned());
        on_own_runtime(move || async move {
            sqlx::query_scalar::<_, Option<String>>(sqlx::AssertSqlSafe(query))
                .fetch_optional(&mut in_schema(&name).await)
                .await
                .unwrap()
                .flatten()
        })
    }

    /// Runs `statements` in the schema, one after the other, as the server's superuser.
    pub fn execute(&self, statements: &[&str]) {
        let name = self.name.clone();
        let statements: Vec<String> = statements.iter().map(|statement| (*statement).to_owned()).collect();
        on_own_runtime(move || async move {
            let mut admin = in_schema(&name).await;
            for statement in statements {
                sqlx::query(sqlx::AssertSqlSafe(statement)).execute(&mut admin).await.unwrap();
            }
        });
    }
}

/// A superuser's connection whose unqualified names are the schema `name`'s.
async fn in_schema(name: &str) -> sqlx::PgConnection {
    let mut admin = admin().await;
    sqlx::query(sqlx::AssertSqlSafe(format!("SET search_path = {name}"))).execute(&mut admin).await.unwrap();
    admin
}

impl Drop for TestSchema {
    fn drop(&mut self) {
        let schema = shared::TestSchema { name: self.name.clone(), url: self.url.clone() };
        on_own_runtime(move || schema.drop());
    }
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

/// A session of the test's that holds the schema's intake tables locked against writes
/// (`LOCK TABLE … IN EXCLUSIVE MODE`: reads go on), as an operator's `psql` left in a
/// transaction would, until [`WriteLock::release`] or drop.
pub struct WriteLock {
    release: Option<std::sync::mpsc::Sender<()>>,
    holder: Option<std::thread::JoinHandle<()>>,
}

impl TestSchema {
    pub fn lock_against_writes(&self) -> WriteLock {
        self.lock_tables_against_writes("envelopes, poller_offsets, relayed_updates")
    }

    /// Like [`TestSchema::lock_against_writes`], for `tables` (a comma-separated list).
    pub fn lock_tables_against_writes(&self, tables: &str) -> WriteLock {
        let name = self.name.clone();
        let lock = format!("LOCK TABLE {tables} IN EXCLUSIVE MODE");
        let (locked_tx, locked) = std::sync::mpsc::channel();
        let (release, released) = std::sync::mpsc::channel::<()>();
        let holder = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            runtime.block_on(async {
                let mut admin = in_schema(&name).await;
                sqlx::query("BEGIN").execute(&mut admin).await.unwrap();
                sqlx::query(sqlx::AssertSqlSafe(lock)).execute(&mut admin).await.unwrap();
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
