//! What a batch of intake committed.

use crate::domain::{JoinedAlbum, RoutedEnvelope, StoredEnvelope, StoredReaction, TaskEffect};

/// What `Intake::record_batch_handing_over` committed.
#[derive(Debug)]
pub struct RecordedBatch<'a> {
    /// The rows that were new.
    pub inserted: Vec<&'a RoutedEnvelope>,
    /// The envelopes handed to live sessions, oldest first.
    pub claimed: Vec<StoredEnvelope>,
    /// What the batch's task changes ask of the switchboard now that they are recorded:
    /// the bot's acknowledgements, notices, wake-ups (DESIGN.md §11).
    pub task_effects: Vec<TaskEffect>,
    /// The batch's reactions now owed to agents (see `reactions`), oldest first.
    pub reactions: Vec<StoredReaction>,
    /// Items of albums recorded as not addressed to the bot, earlier or in this batch,
    /// that an item of their album recorded addressed made work for its agent
    /// (`rules::albums`), oldest first; those of `claim_for` agents are in `claimed` too.
    pub joined: Vec<JoinedAlbum>,
}
