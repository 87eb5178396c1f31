//! The domain: what the daemon keeps track of — envelopes, send attempts, handoffs, room
//! cascades, task revisions, permission requests, questions, reactions — and the closed set
//! of states each can be in. The storage seam (`ledger::seam`) speaks these types; each
//! backend encodes them in its own columns (`ledger::sqlite::columns`, `ledger::postgres`),
//! and nothing here names a database library. What a change *means* is decided by the pure
//! code in `rules`; the task itself (`Task`, `TaskState`) lives with its rules in
//! `rules::revisions`, the ids in `ids`.

pub mod attempts;
pub mod envelopes;
pub mod handoffs;
pub mod intake;
pub mod permissions;
pub mod questions;
pub mod reactions;
pub mod rooms;
pub mod tasks;

pub use attempts::{
    AttemptMethod, AttemptOutcome, AttemptPurpose, AttemptState, FinishedAttempt, NewAttempt, ReconcileError,
    ReconciledOutcome, Reconciliation, RecordedReply, ReplyTally, ReplyVerdict, StoredAttempt,
    standing_attempts,
};
pub use envelopes::{
    AlbumKey, EnvelopeKind, EnvelopeState, FoundForReply, JoinedAlbum, RoutedEnvelope, StoredEnvelope,
    StoredEvent,
};
pub use handoffs::{HandoffEnd, HandoffEnding, HandoffState, NewHandoff, StoredHandoff};
pub use intake::RecordedBatch;
pub use permissions::{
    AnswerRecorded, EndedPlugins, ExpiredBecause, NewPermissionRequest, PermissionState, PermissionVerdict,
    StoredPermission,
};
pub use questions::{QuestionAnswered, QuestionState, StoredQuestion};
pub use reactions::{ReactionAudit, RoutedReaction, StoredReaction};
pub use rooms::{
    AppliedStep, CascadeUpdate, ClaimRefused, NewCascade, NewPost, RoomCascadeState, RoomStep, StoredCascade,
    StoredPost, StoredTurn, TurnClose, TurnEnding, TurnOpen,
};
pub use tasks::{BotPost, DeclareError, DeclareTaskError, DeclaredRevision, StoredRevision, TaskEffect};
