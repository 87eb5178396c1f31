//! How the domain's values are stored on PostgreSQL and read back: ids as text, read
//! strictly (a value that does not parse is an error naming it, never a default), closed
//! sets (states, kinds) by the snake_case name serde gives them, as on SQLite
//! (`sqlite/engine/columns.rs`). Times need nothing here: they are `TIMESTAMPTZ`, which
//! sqlx maps to `DateTime<Utc>`.

use sqlx::encode::IsNull;
use sqlx::error::BoxDynError;
use sqlx::postgres::{PgArgumentBuffer, PgRow, PgTypeInfo, PgValueRef};
use sqlx::{Decode, Encode, FromRow, Postgres, Row, Type};

use crate::domain::StoredEnvelope;
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

fn parse_text_enum<T: serde::de::DeserializeOwned>(column: &str, text: &str) -> sqlx::Result<T> {
    T::deserialize(serde::de::value::StrDeserializer::<serde::de::value::Error>::new(text))
        .map_err(|error| sqlx::Error::ColumnDecode { index: column.to_owned(), source: Box::new(error) })
}

/// The columns of a [`StoredEnvelope`], in the order of SQLite's `envelope_columns!`.
macro_rules! envelope_columns {
    () => {
        "id, trace_id, update_id, kind, chat_id, thread_id, chat_type, chat_title, message_id, \
         sender_id, sender_username, sender_name, text, attachments, content, sent_at, received_at, route, agent, \
         state, deliveries, state_changed_at, note, task_id, revision, meta"
    };
}
pub(super) use envelope_columns;

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

/// The SQL test that an attempt's `method` sends a part of a reply (not a reaction or an
/// edit), as SQLite's `reply_part_method!` writes it: `domain::AttemptMethod::is_reply_part`.
macro_rules! reply_part_method {
    () => {
        "method NOT IN ('set_reaction', 'edit_message')"
    };
}
pub(super) use reply_part_method;
