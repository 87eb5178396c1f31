//! The JSON shapes of the daemon's local API, shared by the server (`api::server`) and the
//! client the channel plugin uses (`api::client`), so the two cannot drift apart.
//!
//! Every route lives under `/v1/agents/{agent}/` and needs `Authorization: Bearer <secret>`,
//! where the secret is the one held in that agent's `token_env` variable.
//!
//! | method | path        | body            | answer                                   |
//! |--------|-------------|-----------------|------------------------------------------|
//! | GET    | `session`   | —               | NDJSON stream of [`SessionEvent`]         |
//! | GET    | `pending`   | —               | [`PendingList`]                           |
//! | POST   | `reply`     | [`ReplyRequest`] | [`ReplyReceipt`]                         |
//! | POST   | `ack`       | [`AckRequest`]  | [`AckReceipt`]                            |
//!
//! Failures answer with a non-2xx status and an [`ApiError`] body.

use serde::{Deserialize, Serialize};

/// Path prefix of every local API route.
pub const API_PREFIX: &str = "/v1/agents";

/// How often an idle session stream carries a heartbeat line. It keeps idle connections
/// from being reaped by anything in between and lets the daemon notice a vanished client
/// (a write to a closed socket fails) without waiting for the next envelope.
pub const HEARTBEAT_INTERVAL_SECS: u64 = 15;

/// One line of the session stream.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum SessionEvent {
    /// The first line: the session is registered and owns the agent's inbox.
    Hello { agent: String, session_id: String },
    /// An envelope handed to the session; its ledger row is now `pending`.
    Envelope(DeliveredEnvelope),
    /// Nothing new; the daemon is alive.
    Heartbeat,
}

/// An envelope as the agent's session sees it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DeliveredEnvelope {
    pub trace_id: String,
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
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct PendingList {
    pub pending: Vec<PendingSummary>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ReplyRequest {
    pub text: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
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
    UnknownTraceId,
    NotYours,
    /// The named envelope is in a state that cannot be answered.
    NotAnswerable,
    /// Telegram refused the send: nothing was delivered (or only the chunks listed).
    NotSent,
    /// The send's outcome is unknown; the envelope is `unresolved` until an operator
    /// reconciles it. Never retry such a reply yourself.
    Unresolved,
    Internal,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ApiError {
    pub code: ErrorCode,
    pub message: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub candidates: Vec<PendingSummary>,
}
