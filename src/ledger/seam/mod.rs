//! The storage seam: everything the poller, the bridge, the room and task drivers, the
//! local API and the CLI ask of a ledger, in the domain's terms (ids, states, envelopes,
//! attempts), one trait per concern. A backend implements every trait; [`Storage`] is all
//! of them, and [`super::Ledger`] is the handle the daemon passes around. The behaviour
//! behind each method (DESIGN §2-§4, §9-§11) is pinned by the conformance suite
//! (`super::conformance`), which every backend must pass.

use std::fmt::Debug;
use std::sync::Arc;

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::*;
use crate::ids::{AgentName, AttemptId, CascadeId, HandoffId, TaskId, TraceId};
use crate::rules::revisions::{ChangeKind, Refusal, Task, TaskEffects, TaskState};
use crate::telegram::parts::Attachment;

mod attempts;
mod envelopes;
mod handoffs;
mod inspect;
mod intake;
mod permissions;
mod prune;
mod questions;
mod reactions;
mod rooms;
mod sessions;
mod tasks;

pub use attempts::Attempts;
pub use envelopes::Envelopes;
pub use handoffs::Handoffs;
pub use inspect::{CountedByState, Inspection, ListFilter};
pub use intake::Intake;
pub use permissions::Permissions;
pub use prune::{Pages, PruneReport, Pruned, Retention};
pub use questions::Questions;
pub use reactions::Reactions;
pub use rooms::Rooms;
pub use sessions::Sessions;
pub use tasks::Tasks;

/// The ledger's own upkeep, seen from the daemon that runs it.
#[async_trait]
pub trait Lifecycle: Send + Sync {
    /// What intake, attempts and checkpoints came to lately, for readiness.
    fn write_watch(&self) -> Arc<WriteWatch>;

    /// Commits one small write of its own, for readiness: whether the ledger takes writes
    /// right now, or why not. Bounded in time: a hung disk or server fails it.
    async fn probe_write(&self) -> Result<(), String>;

    /// Stops the backend's own tasks and closes its connections; the ledger is not used after.
    async fn close(&self);
}

/// A whole ledger: every concern of the seam.
pub trait Storage:
    Intake
    + Envelopes
    + Attempts
    + Handoffs
    + Rooms
    + Tasks
    + Permissions
    + Questions
    + Reactions
    + Sessions
    + Inspection
    + Retention
    + Lifecycle
    + Debug
{
}

impl<T> Storage for T where
    T: Intake
        + Envelopes
        + Attempts
        + Handoffs
        + Rooms
        + Tasks
        + Permissions
        + Questions
        + Reactions
        + Sessions
        + Inspection
        + Retention
        + Lifecycle
        + Debug
{
}
