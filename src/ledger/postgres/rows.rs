//! How the domain's values are stored on PostgreSQL and read back: ids as text, read
//! strictly (a value that does not parse is an error naming it, never a default), closed
//! sets (states, kinds) by the snake_case name serde gives them, as on SQLite
//! (`sqlite/engine/columns.rs`). Times need nothing here: they are `TIMESTAMPTZ`, which
//! sqlx maps to `DateTime<Utc>`.

use sqlx::encode::IsNull;
use sqlx::error::BoxDynError;
use sqlx::postgres::{PgArgumentBuffer, PgRow, PgTypeInfo, PgValueRef};
use sqlx::{Decode, Encode, FromRow, Postgres, Row, Type};

use crate::domain::{
    ReactionAudit, StoredAttempt, StoredEnvelope, StoredEvent, StoredPermission, StoredQuestion,
    StoredReaction,
};
use crate::ids::{AttemptId, CascadeId, HandoffId, TaskId, TraceId};

macro_rules! id_columns {
    ($($id:ty),* $(,)?) => {
        $(
            impl Type<Postgres> for $id {
                fn type_info() -> PgTypeInfo {
                    <&str as Type<Postgres>>::type_info()
                }

                fn compatible(ty: &PgTypeInfo) -> bool {
                    <&str as Type<Postgres>>::compatible(ty)
                }
            }

            impl Encode<'_, Postgres> for $id {
                fn encode_by_ref(&self, buf: &mut PgArgumentBuffer) -> Result<IsNull, BoxDynError> {
                    <&str as Encode<Postgres>>::encode(self.as_str(), buf)
                }
            }

            impl<'r> Decode<'r, Postgres> for $id {
                fn decode(value: PgValueRef<'r>) -> Result<Self, BoxDynError> {
                    Ok(<$id>::parse(<&str as Decode<Postgres>>::decode(value)?)?)
                }
            }
        )*
    };
}

id_columns!(TraceId, HandoffId, CascadeId, TaskId, AttemptId);

/// A text column holding one of the ledger's closed sets (a state, a kind).
pub(super) fn text_enum<T: serde::de::DeserializeOwned>(row: &PgRow, column: &str) -> sqlx::Result<T> {
    parse_text_enum(column, row.try_get(column)?)
}

/// [`text_enum`] of a column that may be NULL.
pub(super) fn optional_text_enum<T: serde::de::DeserializeOwned>(
    row: &PgRow,
    column: &str,
) -> sqlx::Result<Option<T>> {
    row.try_get::<Option<&str>, _>(column)?.map(|text| parse_text_enum(column, text)).transpose()
}

/// A column that holds JSON or NULL, read strictly into `T`: JSON this switchboard cannot
/// read (a row written by a newer version, say) is an error naming the column, never a
/// default.
pub(super) fn optional_json<T: serde::de::DeserializeOwned>(
    row: &PgRow,
    column: &str,
) -> sqlx::Result<Option<T>> {
    let Some(text) = row.try_get::<Option<&str>, _>(column)? else { return Ok(None) };
    serde_json::from_str(text).map(Some).map_err(|error| sqlx::Error::ColumnDecode {
        index: column.to_owned(),
        source: format!("{text:?}: {error}").into(),
    })
}

/// A `BIGINT` column the domain holds as `i32` (a Telegram message or thread id), read
/// strictly: a value out of `i32`'s range is an error naming the column, never truncated.
pub(super) fn optional_i32(row: &PgRow, column: &str) -> sqlx::Result<Option<i32>> {
    row.try_get::<Option<i64>, _>(column)?
        .map(|value| {
            i32::try_from(value).map_err(|error| sqlx::Error::ColumnDecode {
                index: column.to_owned(),
                source: format!("{value}: {error}").into(),
            })
        })
        .transpose()
}

fn parse_text_enum<T: serde::de::DeserializeOwned>(column: &str, text: &str) -> sqlx::Result<T> {
    T::deserialize(serde::de::value::StrDeserializer::<serde::de::value::Error>::new(text))
        .map_err(|error| sqlx::Error::ColumnDecode { index: column.to_owned(), source: Box::new(error) })
}

impl FromRow<'_, PgRow> for StoredEnvelope {
    fn from_row(row: &PgRow) -> sqlx::Result<Self> {
        Ok(Self {
            id: row.try_get("id")?,
            trace_id: row.try_get("trace_id")?,
            update_id: row.try_get("update_id")?,
            kind: text_enum(row, "kind")?,
            chat_id: row.try_get("chat_id")?,
            thread_id: row.try_get("thread_id")?,
            chat_type: text_enum(row, "chat_type")?,
            chat_title: row.try_get("chat_title")?,
            message_id: row.try_get("message_id")?,
            sender_id: row.try_get("sender_id")?,
            sender_username: row.try_get("sender_username")?,
            sender_name: row.try_get("sender_name")?,
            text: row.try_get("text")?,
            attachments: row.try_get("attachments")?,
            content: row.try_get("content")?,
            sent_at: row.try_get("sent_at")?,
            received_at: row.try_get("received_at")?,
            route: row.try_get("route")?,
            agent: row.try_get("agent")?,
            state: text_enum(row, "state")?,
            deliveries: row.try_get("deliveries")?,
            state_changed_at: row.try_get("state_changed_at")?,
            note: row.try_get("note")?,
            task_id: row.try_get("task_id")?,
            revision: row.try_get("revision")?,
            meta: row.try_get("meta")?,
        })
    }
}

/// The columns of a [`StoredAttempt`], of the attempts aliased `a` (the statements that
/// read them join envelopes, whose column names overlap), in the order of SQLite's
/// `attempt_columns!`.
macro_rules! attempt_columns {
    () => {
        "a.op_id, a.request_id, a.method, a.target_message_id, a.chat_id, a.thread_id, a.reply_to_message_id, \
         a.chunk_index, a.chunk_count, a.text, a.outcome, a.telegram_message_id, a.error, a.started_at, \
         a.finished_at, a.reconciled_outcome, a.reconciled_reason"
    };
}
pub(super) use attempt_columns;

impl FromRow<'_, PgRow> for StoredAttempt {
    fn from_row(row: &PgRow) -> sqlx::Result<Self> {
        Ok(Self {
            op_id: row.try_get("op_id")?,
            request_id: row.try_get("request_id")?,
            method: text_enum(row, "method")?,
            target_message_id: row.try_get("target_message_id")?,
            chat_id: row.try_get("chat_id")?,
            thread_id: row.try_get("thread_id")?,
            reply_to_message_id: row.try_get("reply_to_message_id")?,
            chunk_index: row.try_get("chunk_index")?,
            chunk_count: row.try_get("chunk_count")?,
            text: row.try_get("text")?,
            outcome: text_enum(row, "outcome")?,
            telegram_message_id: row.try_get("telegram_message_id")?,
            error: row.try_get("error")?,
            started_at: row.try_get("started_at")?,
            finished_at: row.try_get("finished_at")?,
            reconciled_outcome: optional_text_enum(row, "reconciled_outcome")?,
            reconciled_reason: row.try_get("reconciled_reason")?,
        })
    }
}

/// An envelope's event. Its time is text in the domain (what `switchboard ledger events`
/// prints), written as SQLite stores it (`clock::text`).
impl FromRow<'_, PgRow> for StoredEvent {
    fn from_row(row: &PgRow) -> sqlx::Result<Self> {
        Ok(Self {
            at: crate::clock::text(row.try_get("at")?),
            from_state: row.try_get("from_state")?,
            to_state: row.try_get("to_state")?,
            actor: row.try_get("actor")?,
            reason: row.try_get("reason")?,
        })
    }
}

/// The columns of a [`StoredReaction`]; `user` is a reserved word here, hence quoted.
macro_rules! reaction_columns {
    () => {
        "id, agent, trace_id, chat_id, message_id, user_id, \"user\", emoji, reacted_at"
    };
}
pub(super) use reaction_columns;

impl FromRow<'_, PgRow> for StoredReaction {
    fn from_row(row: &PgRow) -> sqlx::Result<Self> {
        Ok(Self {
            id: row.try_get("id")?,
            agent: row.try_get("agent")?,
            trace_id: row.try_get("trace_id")?,
            chat_id: row.try_get("chat_id")?,
            message_id: row.try_get("message_id")?,
            user_id: row.try_get("user_id")?,
            user: row.try_get("user")?,
            emoji: row.try_get("emoji")?,
            reacted_at: row.try_get("reacted_at")?,
        })
    }
}

impl FromRow<'_, PgRow> for ReactionAudit {
    fn from_row(row: &PgRow) -> sqlx::Result<Self> {
        Ok(Self {
            state: row.try_get("state")?,
            agent: row.try_get("agent")?,
            trace_id: row.try_get("trace_id")?,
            emoji: row.try_get("emoji")?,
            note: row.try_get("note")?,
        })
    }
}

impl FromRow<'_, PgRow> for StoredQuestion {
    fn from_row(row: &PgRow) -> sqlx::Result<Self> {
        Ok(Self {
            id: row.try_get("id")?,
            op_id: row.try_get("op_id")?,
            envelope_id: row.try_get("envelope_id")?,
            trace_id: row.try_get("trace_id")?,
            sent_chat_id: row.try_get("sent_chat_id")?,
            sent_at: row.try_get("sent_at")?,
            sent_text: row.try_get("sent_text")?,
            state: text_enum(row, "state")?,
            chat_id: row.try_get("chat_id")?,
            thread_id: optional_i32(row, "thread_id")?,
            prompt_send: text_enum(row, "prompt_send")?,
            prompt_message_id: optional_i32(row, "prompt_message_id")?,
            prompt_settled: row.try_get("prompt_settled")?,
            answered_by_name: row.try_get("answered_by_name")?,
            answered_at: row.try_get("answered_at")?,
        })
    }
}

impl FromRow<'_, PgRow> for StoredPermission {
    fn from_row(row: &PgRow) -> sqlx::Result<Self> {
        Ok(Self {
            id: row.try_get("id")?,
            agent: row.try_get("agent")?,
            session_id: row.try_get("session_id")?,
            plugin_id: row.try_get("plugin_id")?,
            request_id: row.try_get("request_id")?,
            tool_name: row.try_get("tool_name")?,
            description: row.try_get("description")?,
            input_preview: row.try_get("input_preview")?,
            asked_at: row.try_get("asked_at")?,
            expires_at: row.try_get("expires_at")?,
            state: text_enum(row, "state")?,
            route: row.try_get("route")?,
            chat_id: row.try_get("chat_id")?,
            thread_id: optional_i32(row, "thread_id")?,
            prompt_send: text_enum(row, "prompt_send")?,
            prompt_message_id: optional_i32(row, "prompt_message_id")?,
            prompt_error: row.try_get("prompt_error")?,
            prompt_settled: row.try_get("prompt_settled")?,
            answered_by: row.try_get("answered_by")?,
            answered_by_name: row.try_get("answered_by_name")?,
            answered_at: row.try_get("answered_at")?,
            expired_because: row.try_get("expired_because")?,
            verdict_sent_at: row.try_get("verdict_sent_at")?,
            verdict_handed_at: row.try_get("verdict_handed_at")?,
        })
    }
}
