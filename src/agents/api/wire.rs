//! The JSON shapes of the daemon's local API, shared by the server (`api::server`) and the
//! client the channel plugin uses (`api::client`), so the two cannot drift apart.
//!
//! Every route lives under `/v1/agents/{agent}/` and needs `Authorization: Bearer <secret>`,
//! where the secret is the one held in that agent's `token_env` variable.
//!
//! | method | path        | body            | answer                                   |
//! |--------|-------------|-----------------|------------------------------------------|
//! | method | path                    | body              | answer                              |
//! |--------|-------------------------|-------------------|-------------------------------------|
//! | GET    | `session`               | —                 | NDJSON stream of [`SessionEvent`]    |
//! | POST   | `shown`                 | [`ShownRequest`]  | [`ShownReceipt`]                     |
//! | GET    | `pending`               | —                 | [`PendingList`]                      |
//! | POST   | `reply`                 | [`ReplyRequest`]  | [`ReplyReceipt`]                     |
//! | GET    | `replies/{request_id}`  | —                 | what a reply request came to: the same answer `reply` gave (or would give) |
//! | POST   | `ack`                   | [`AckRequest`]    | [`AckReceipt`]                       |
//! | POST   | `handoffs`              | [`HandoffRequest`] | [`HandoffReceipt`]                  |
//! | POST   | `permissions`           | [`PermissionRequest`] | [`PermissionReceipt`]            |
//! | POST   | `permissions/{id}/handed` | —               | `{}`: the plugin handed that verdict to Claude Code |
//! | POST   | `reactions`             | [`ReactRequest`]  | [`MessageActionReceipt`]             |
//! | POST   | `edits`                 | [`EditRequest`]   | [`MessageActionReceipt`]             |
//!
//! Every route but `session` also needs the [`SESSION_HEADER`] carrying the token of the
//! agent's live session (from its `Hello`): a second session using the same secret, or a
//! session that was replaced, is refused with `session_conflict` on every call. Any of
//! them may carry a [`SHOWN_HEADER`].
//!
//! Failures answer with a non-2xx status and an [`ApiError`] body.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Path prefix of every local API route.
pub const API_PREFIX: &str = "/v1/agents";

/// The header that binds a tool call to the agent's live session.
pub const SESSION_HEADER: &str = "x-switchboard-session";

/// The header in which a call names, comma-separated, envelopes the session pushed into
/// the agent's context since its last call: the daemon records them as shown before it
/// acts on the call, as `POST shown` would. The channel plugin confirms this way, with the
/// call that may depend on it, rather than with a request of its own per envelope.
pub const SHOWN_HEADER: &str = "x-switchboard-shown";

/// At most this many trace ids in a [`SHOWN_HEADER`]: a plugin whose agent makes no call
/// for a long time forgets the oldest (an unnamed reply to one of them must then name it).
pub const MAX_SHOWN_IN_HEADER: usize = 256;

/// At most this many envelopes are listed by `pending` and in a refusal's candidates; the
/// total is always given, so an agent knows when a list was cut.
pub const MAX_LISTED: usize = 20;

/// How often an idle session stream of a single daemon carries a heartbeat line. It keeps
/// idle connections from being reaped by anything in between, lets the plugin tell a daemon
/// that stopped answering from a quiet one ([`MISSED_HEARTBEATS`]), and lets the daemon
/// notice a vanished client whose socket never closed (a write fails) without waiting for
/// the next envelope. A client that goes away on this host closes its socket, which the
/// daemon notices at once, heartbeat or not. Each heartbeat wakes both processes, so it is
/// as rare as those allow: under the 45 s after which plugins before this interval gave up
/// on a quiet stream, so a plugin left running across an upgrade of the daemon stays
/// connected. Replicas beat faster ([`Lease::session_heartbeat`](crate::rules::leadership::Lease::session_heartbeat));
/// each says how often in its `Hello`.
pub const HEARTBEAT_INTERVAL_SECS: u64 = 40;

/// A plugin gives up on a session stream that carried nothing for this many heartbeats:
/// the daemon stopped answering even though the connection never closed (a suspended
/// machine, a paused or wedged process).
pub const MISSED_HEARTBEATS: u32 = 3;

fn single_daemon_heartbeat_ms() -> u64 {
    HEARTBEAT_INTERVAL_SECS * 1000
}

/// One line of the session stream.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum SessionEvent {
    /// The first line: the session is registered and owns the agent's inbox. Tool calls
    /// carry `session_token` in [`SESSION_HEADER`].
    Hello {
        agent: String,
        session_id: String,
        session_token: String,
        /// How often this stream carries a heartbeat when idle, in milliseconds; a daemon
        /// from before replicas does not say, and beats every [`HEARTBEAT_INTERVAL_SECS`].
        #[serde(default = "single_daemon_heartbeat_ms")]
        heartbeat_ms: u64,
    },
    /// An envelope handed to the session; its ledger row is now `pending`.
    Envelope(DeliveredEnvelope),
    /// A notice (DESIGN.md §8) about an envelope the session already has: not an envelope
    /// of its own, nothing to answer.
    Notice(DeliveredNotice),
    /// Nothing new; the daemon is alive.
    Heartbeat,
    /// An approver's verdict on a permission request this plugin process relayed
    /// (DESIGN.md §15): only the session of the plugin that asked is given it.
    PermissionVerdict(DeliveredVerdict),
}

/// The header in which the plugin names its process when it opens the session stream
/// (`plg_…`, chosen once per process): a permission request is answered to the plugin
/// that asked, across reconnects, and to no other session of the agent.
pub const PLUGIN_HEADER: &str = "x-switchboard-plugin";

/// `POST permissions`: Claude Code asks whether a tool call may go ahead
/// (`notifications/claude/channel/permission_request`, relayed as it came).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PermissionRequest {
    /// Claude Code's id of the request: five letters a–z without `l`.
    pub request_id: String,
    pub tool_name: String,
    pub description: String,
    /// The tool's arguments as JSON, cut by Claude Code to 200 characters.
    #[serde(default)]
    pub input_preview: String,
}

/// What became of a relayed permission request.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PermissionReceipt {
    /// The switchboard's id of the request (`prm_…`).
    pub permission_id: String,
    /// `pending`, `allowed`, `denied` or `expired`.
    pub state: String,
    /// The prompt's send: `sent`, `not_sent` or `unknown` (`in_flight` only while it runs).
    pub prompt: String,
    /// Why the prompt was not posted (or may not have been), when it was not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// A verdict for the plugin to hand to Claude Code
/// (`notifications/claude/channel/permission`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DeliveredVerdict {
    /// The switchboard's id of the request (`prm_…`): the plugin confirms with it that it
    /// handed the verdict to Claude Code (`POST permissions/{permission_id}/handed`).
    #[serde(default)]
    pub permission_id: String,
    pub request_id: String,
    /// `allow` or `deny`.
    pub behavior: String,
}

/// The kind of the notice that follows the envelopes a session found waiting for it (see
/// `bridge::session`): how many are still pending, with their trace ids.
pub const WAITING_NOTICE: &str = "waiting";

/// The kind of the notice that a user reacted to a message the bot sent answering the
/// envelope (see `bridge::reactions`): not work, nothing to answer.
pub const REACTION_NOTICE: &str = "reaction";

/// A notice about a pending envelope: `stop` (a room's exchange ends after this turn),
/// `pause` and `resume` (its task), `waiting` (the start of a session found it and others
/// waiting).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DeliveredNotice {
    /// The envelope it is about.
    pub trace_id: String,
    /// What it says: `stop`, later `pause` and `resume` (DESIGN.md §11).
    pub kind: String,
    /// What the model reads.
    pub content: String,
    /// When it was made, RFC 3339 in UTC.
    pub ts: String,
    /// Meta that belongs to the notice (`cascade_id`, `stopped_by`, …).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: BTreeMap<String, String>,
}

/// An envelope as the agent's session sees it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DeliveredEnvelope {
    pub trace_id: String,
    /// `message`, `handoff`, `handoff_answer`, … (DESIGN.md §8). The Telegram fields below
    /// are meaningful for `message` only.
    #[serde(default = "message_kind")]
    pub kind: String,
    /// Meta that belongs to the kind (`handoff_id`, `from_agent`, `depth`, …), as strings.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: BTreeMap<String, String>,
    /// What the model reads: the text, or the caption and a line per attachment.
    pub content: String,
    pub chat_id: i64,
    /// Forum topic, when the message was posted in one.
    pub thread_id: Option<i32>,
    pub chat_type: String,
    pub chat_title: Option<String>,
    pub message_id: i32,
    /// The sender's @username, else their name.
    pub user: String,
    pub user_id: i64,
    /// When Telegram says the message was sent, RFC 3339 in UTC.
    pub ts: String,
    pub route: String,
    /// True when this envelope was handed to an earlier session that never answered it.
    pub redelivered: bool,
    /// True when the envelope records an edit of an earlier message.
    pub edited: bool,
}

fn message_kind() -> String {
    "message".to_owned()
}

/// An entry of [`PendingList`], and a candidate in an ambiguity refusal.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PendingSummary {
    pub trace_id: String,
    pub chat_id: i64,
    pub thread_id: Option<i32>,
    pub chat_title: Option<String>,
    pub user: String,
    pub route: String,
    pub ts: String,
    /// The start of the text, enough to recognise the message.
    pub preview: String,
    /// A reply to it is on its way (its outcome not yet recorded): it may be in the chat
    /// already, so it is no sign that nothing was delivered.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub replying: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PendingList {
    /// The oldest [`MAX_LISTED`] pending envelopes.
    pub pending: Vec<PendingSummary>,
    /// How many are pending in all.
    pub total: usize,
}

/// The plugin pushed this envelope into the agent's context: an unnamed reply may now
/// resolve to it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ShownRequest {
    pub trace_id: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ShownReceipt {
    /// False when the envelope was no longer pending for this agent (nothing to mark).
    pub marked: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ReplyRequest {
    pub text: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
    /// Chosen by the caller, unique per request (`req_…`). A repeated request with the same
    /// id returns the first one's outcome instead of sending again; `replies/{request_id}`
    /// tells what became of it.
    pub request_id: String,
    /// `true` (a JSON boolean; anything else is refused) to post a further message to an
    /// envelope that is already answered. Without it such a reply is answered with what the
    /// earlier reply came to (`already_answered`) and nothing is posted: an agent whose
    /// call was cancelled and who retries must not reach the user twice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub again: Option<serde_json::Value>,
    /// How `text` is written: `text` (the default), `markdown` (converted to Telegram
    /// HTML) or `html` (Telegram HTML). Anything else is refused before anything is sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<String>,
    /// Files sent after the text, each as its own message, by the upload ids `POST uploads`
    /// answered (DESIGN.md §14). An id that is not a staged upload of the caller's refuses
    /// the whole reply (`unknown_upload`) before anything is sent.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<String>,
    /// The chat and the message (`reply_to`) the reply is for, as the `<channel>` tag shows
    /// them. They never reach a chat: they narrow the envelopes the reply may answer, so a
    /// reply naming one chat is refused rather than answering a message of another.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat_id: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_to: Option<i64>,
}

impl ReplyRequest {
    /// A request with a fresh request id.
    pub fn new(text: impl Into<String>, trace_id: Option<String>) -> Self {
        Self {
            text: text.into(),
            trace_id,
            request_id: crate::ids::RequestId::generate().to_string(),
            again: None,
            format: None,
            files: Vec::new(),
            chat_id: None,
            reply_to: None,
        }
    }
}

/// What a confirmed reply did.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ReplyReceipt {
    pub trace_id: String,
    pub chat_id: i64,
    pub thread_id: Option<i32>,
    pub route: String,
    /// Telegram's ids of the messages sent, one per chunk.
    pub message_ids: Vec<i32>,
    /// Set when the reply answered a handoff: it went to this agent, not to Telegram.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answered_handoff: Option<AnsweredHandoff>,
    /// Set when the reply was a turn in a group room: posted under the agent's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub room_turn: Option<RoomReply>,
}

/// A reply posted to a group room (DESIGN.md §10): it ended the speaker's turn.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RoomReply {
    pub cascade_id: String,
    pub speaker: u32,
    /// The name the room saw before the text (`Builder`).
    pub posted_as: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct AnsweredHandoff {
    pub handoff_id: String,
    /// The delegating agent, who receives the answer.
    pub to_agent: String,
}

/// `revise_task`: the agent declares that a message it received changes its task
/// (DESIGN.md §11).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RevisionRequest {
    /// The pending envelope that carries the change.
    pub trace_id: String,
    /// `correction`, `new_objective`, `pause` or `cancel`.
    pub kind: String,
    /// What changed, in a few words, for the lineage and the chat.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
    /// Chosen by the caller (`req_…`), as for `reply`: a repeated request is answered with
    /// what the first recorded, and records nothing more. Optional, for older plugins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
}

/// A change `revise_task` recorded.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RevisionReceipt {
    pub task: String,
    pub revision: u32,
    pub change: String,
    /// The envelope to act on from now on.
    pub act_on: String,
    /// What to do next, for the model.
    pub next: String,
}

/// `react`: a reaction on a message of an envelope's conversation (issue 22).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ReactRequest {
    /// One of the caller's envelopes: the conversation, and the task that admits it.
    pub trace_id: String,
    /// One of Telegram's reaction emoji (`telegram::reactions::ALLOWED_REACTIONS`).
    pub emoji: String,
    /// The message to react to: the envelope's own when absent, else a message the bot
    /// sent in that chat.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_id: Option<i64>,
    /// The chat the agent said the message is in, if it did: refused unless it is the
    /// envelope's (a check, never a way to reach a chat).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat_id: Option<i64>,
    /// As for replies: a repeated request is answered with the first one's outcome.
    pub request_id: String,
}

/// `edit_message`: new text for a message the bot sent for the caller in an envelope's
/// conversation (issue 22).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct EditRequest {
    pub trace_id: String,
    pub message_id: i64,
    pub text: String,
    /// As for [`ReplyRequest::format`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<String>,
    /// As for [`ReactRequest::chat_id`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chat_id: Option<i64>,
    pub request_id: String,
}

/// What a confirmed reaction or edit did.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct MessageActionReceipt {
    pub trace_id: String,
    pub chat_id: i64,
    /// The message reacted to or edited.
    pub message_id: i32,
    /// `reaction` or `edit`.
    pub action: String,
    /// The reaction set, for a reaction.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub emoji: Option<String>,
}

/// `send_to_agent` and `call_agent`: hand an instruction to another agent (DESIGN.md §9).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct HandoffRequest {
    /// The target agent, as the model wrote it (compared trimmed, case-insensitively).
    pub to: String,
    pub text: String,
    /// The envelope this handoff is made for (its cause); resolved like a reply's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
    /// Must be a JSON boolean; anything else is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub followup: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intent: Option<String>,
    /// As for replies: a repeated request returns the first one's handoff.
    pub request_id: String,
}

/// A handoff that was recorded.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct HandoffReceipt {
    pub handoff_id: String,
    /// The target's configured name.
    pub to: String,
    /// True when the target has a connected session (the envelope is on its way); false
    /// when it is queued until the target connects.
    pub delivered: bool,
    /// The cause envelope, when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_behalf_of: Option<String>,
    pub depth: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub followup_of: Option<String>,
    /// The target has a handoff of its own open to the caller: it may be waiting on the
    /// caller's answer, so a caller that waited on it in turn would wait on each other.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub target_awaits_caller: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct AckRequest {
    pub trace_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct AckReceipt {
    pub trace_id: String,
    pub state: String,
}

/// Machine-readable failure kinds. The `message` of an [`ApiError`] is written for the
/// model: it says what happened and what to do next.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// No such agent, or not its secret: the two are not told apart.
    Unauthorized,
    SessionConflict,
    BadRequest,
    /// Several envelopes wait; the reply must name one (`candidates` lists them).
    Ambiguous,
    NothingPending,
    /// No such envelope among the caller's (whether it does not exist or is another
    /// agent's is deliberately not told apart).
    UnknownTraceId,
    /// The named envelope is in a state that cannot be answered, or an earlier reply's
    /// outcome is unknown and awaits reconciliation.
    NotAnswerable,
    /// A reply to that envelope is being delivered right now.
    ReplyInProgress,
    /// The envelope is already answered and the reply did not say `again: true`: nothing
    /// was posted; the message says what the earlier reply came to.
    AlreadyAnswered,
    /// The reply would need more messages than `outbound.max_reply_parts`.
    ReplyTooLong,
    /// No reply request with that id was ever acted on: nothing was sent for it.
    UnknownRequest,
    /// The answer to an unprompted handoff has no conversation to reply into.
    NoConversation,
    /// Handoffs (DESIGN.md §9): the first instruction to that agent in this turn stands.
    AlreadyDelegated,
    /// An earlier handoff to that agent is still open.
    AlreadyRunning,
    /// The chain of handoffs would be deeper than `handoffs.max_depth`.
    DepthLimit,
    UnknownAgent,
    SelfHandoff,
    /// A group room's turn is over (one reply per turn): nothing was posted.
    TurnOver,
    /// Tasks (DESIGN.md §11): a correction or a new objective superseded the envelope;
    /// the message names the envelope to act on. Nothing was sent.
    Superseded,
    /// The task is paused: nothing of it is sent until it is resumed.
    Paused,
    /// The task was cancelled (stop requested or stopped): nothing of it is sent.
    Cancelled,
    /// `revise_task` recorded nothing; the message says why.
    NoRevision,
    /// Telegram refused the send: nothing was delivered (or only the chunks listed).
    NotSent,
    /// The send's outcome is unknown; the envelope is `unresolved` until an operator
    /// reconciles it. Never retry such a reply yourself.
    Unresolved,
    /// `download_attachment`: the envelope has no such attachment (or none at all).
    NoSuchAttachment,
    /// A file over Telegram's limit (20 MB down, 50 MB up) or the caller's: nothing moved.
    FileTooLarge,
    /// Telegram did not hand the file over; nothing was written. Trying again later is safe.
    FileUnavailable,
    /// A reply names an upload the daemon does not hold (never staged, or cleaned up).
    UnknownUpload,
    Internal,
}

impl ErrorCode {
    /// The wire name (`ambiguous`, `depth_limit`, …): what the model reads first in a
    /// failed tool's text, so an agent or a script can branch on it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Unauthorized => "unauthorized",
            Self::SessionConflict => "session_conflict",
            Self::BadRequest => "bad_request",
            Self::Ambiguous => "ambiguous",
            Self::NothingPending => "nothing_pending",
            Self::UnknownTraceId => "unknown_trace_id",
            Self::NotAnswerable => "not_answerable",
            Self::ReplyInProgress => "reply_in_progress",
            Self::AlreadyAnswered => "already_answered",
            Self::ReplyTooLong => "reply_too_long",
            Self::UnknownRequest => "unknown_request",
            Self::NoConversation => "no_conversation",
            Self::AlreadyDelegated => "already_delegated",
            Self::AlreadyRunning => "already_running",
            Self::DepthLimit => "depth_limit",
            Self::UnknownAgent => "unknown_agent",
            Self::SelfHandoff => "self_handoff",
            Self::TurnOver => "turn_over",
            Self::Superseded => "superseded",
            Self::Paused => "paused",
            Self::Cancelled => "cancelled",
            Self::NoRevision => "no_revision",
            Self::NotSent => "not_sent",
            Self::Unresolved => "unresolved",
            Self::NoSuchAttachment => "no_such_attachment",
            Self::FileTooLarge => "file_too_large",
            Self::FileUnavailable => "file_unavailable",
            Self::UnknownUpload => "unknown_upload",
            Self::Internal => "internal",
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ApiError {
    pub code: ErrorCode,
    pub message: String,
    /// At most [`MAX_LISTED`] candidates …
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub candidates: Vec<PendingSummary>,
    /// … of this many.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub candidates_total: usize,
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self { code, message: message.into(), candidates: Vec::new(), candidates_total: 0 }
    }
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_names_itself_as_the_wire_does() {
        use ErrorCode::*;
        for code in [
            Unauthorized,
            SessionConflict,
            BadRequest,
            Ambiguous,
            NothingPending,
            UnknownTraceId,
            NotAnswerable,
            ReplyInProgress,
            AlreadyAnswered,
            ReplyTooLong,
            UnknownRequest,
            NoConversation,
            AlreadyDelegated,
            AlreadyRunning,
            DepthLimit,
            UnknownAgent,
            SelfHandoff,
            TurnOver,
            Superseded,
            Paused,
            Cancelled,
            NoRevision,
            NotSent,
            Unresolved,
            Internal,
        ] {
            assert_eq!(serde_json::to_value(code).unwrap(), code.as_str(), "{code:?}");
        }
    }

    #[test]
    fn a_hello_without_its_heartbeat_is_a_single_daemons() {
        let from_before = r#"{"type":"hello","agent":"worker","session_id":"ses_1","session_token":"t"}"#;
        let SessionEvent::Hello { heartbeat_ms, .. } = serde_json::from_str(from_before).unwrap() else {
            panic!("a hello");
        };
        assert_eq!(heartbeat_ms, HEARTBEAT_INTERVAL_SECS * 1000);
    }
}

/// `GET attachments/{trace_id}`: which attachment of the envelope, and how large it may be.
/// The answer is the file's bytes (`application/octet-stream`, with `content-length` when
/// Telegram said the size), named in [`FILE_NAME_HEADER`] and [`ATTACHMENT_KIND_HEADER`].
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct AttachmentQuery {
    /// The attachment's `attachment_file_id`; the envelope's first attachment when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_id: Option<String>,
    /// Refuse (`file_too_large`) a file larger than this, before any download.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<u64>,
}

/// The header that names a file moving over the local API (a download's suggested name,
/// an upload's file name), percent-encoded UTF-8.
pub const FILE_NAME_HEADER: &str = "x-switchboard-file-name";

/// The header that carries an upload's size as the plugin's check saw it, for the daemon's
/// early refusal of a file over Telegram's limit and its staging budget. Not
/// `content-length`: a file that grew since its check would be cut to that length on the
/// way. The body goes chunked, the whole file as read to its end, and what is staged (and
/// told in the receipt) is what arrived.
pub const FILE_SIZE_HEADER: &str = "x-switchboard-file-size";

/// The header that names a downloaded attachment's kind (`photo`, `document`, …).
pub const ATTACHMENT_KIND_HEADER: &str = "x-switchboard-attachment-kind";

/// `POST uploads`: a file staged for a reply (the body is the file, its name in
/// [`FILE_NAME_HEADER`]). A reply names it in `files`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct UploadReceipt {
    pub upload_id: String,
    /// The name Telegram will show.
    pub name: String,
    pub size: u64,
    /// Of the bytes the daemon received, lower-case hex.
    pub sha256: String,
}
