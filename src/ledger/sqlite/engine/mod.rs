//! The SQLite engine: the connections the ledger owns and what keeps them healthy, apart
//! from the tables that use them. The writer's connection and its turn (`in_place`), the
//! readers (`readers`), checkpoints off the path of commits (`checkpoint`), the readiness
//! probe (`probe`), migrations (`migrations`), the lock file (`lock`), file modes (`files`),
//! copies taken while the daemon runs (`backup`), how the domain's values are encoded in
//! columns (`columns`) and SQLite's result codes read as the ledger's errors (`error`).

pub(super) mod backup;
pub(super) mod checkpoint;
pub(super) mod columns;
mod error;
pub mod files;
pub(super) mod in_place;
pub(super) mod lock;
pub(super) mod migrations;
pub(super) mod probe;
pub(super) mod readers;
