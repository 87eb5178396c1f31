//! How the domain's ids and times are stored: as text, and read back strictly (a value
//! that does not parse is an error naming it, never a default). Times are written by
//! [`super::timestamp`] (RFC 3339, milliseconds, `Z`), which compares in time order as text.

use chrono::{DateTime, Utc};
use rusqlite::types::{FromSql, FromSqlError, FromSqlResult, ToSql, ToSqlOutput, Type, ValueRef};

use crate::ids::{AttemptId, CascadeId, HandoffId, TaskId, TraceId};

macro_rules! id_columns {
    ($($id:ty),* $(,)?) => {
        $(
            impl ToSql for $id {
                fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
                    Ok(ToSqlOutput::from(self.as_str()))
                }
            }

            impl FromSql for $id {
                fn column_result(value: ValueRef<'_>) -> FromSqlResult<Self> {
                    <$id>::parse(value.as_str()?).map_err(|e| FromSqlError::Other(e.into()))
                }
            }
        )*
    };
}

id_columns!(TraceId, HandoffId, CascadeId, TaskId, AttemptId);

/// The time in `column`, which must hold one.
pub(crate) fn timestamp_column(row: &rusqlite::Row<'_>, column: &str) -> rusqlite::Result<DateTime<Utc>> {
    let text: String = row.get(column)?;
    parse_timestamp(row, column, &text)
}

/// The time in `column`, if it holds one.
pub(crate) fn optional_timestamp(
    row: &rusqlite::Row<'_>,
    column: &str,
) -> rusqlite::Result<Option<DateTime<Utc>>> {
    row.get::<_, Option<String>>(column)?.map(|text| parse_timestamp(row, column, &text)).transpose()
}

fn parse_timestamp(row: &rusqlite::Row<'_>, column: &str, text: &str) -> rusqlite::Result<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(text).map(|at| at.with_timezone(&Utc)).map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(
            row.as_ref().column_index(column).unwrap_or_default(),
            Type::Text,
            format!("{column} {text:?} is not a time: {e}").into(),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_reads_back_as_written_and_a_malformed_one_is_an_error() {
        let db = rusqlite::Connection::open_in_memory().unwrap();
        let id = HandoffId::generate();
        let read: HandoffId = db.query_row("SELECT ?1", [&id], |row| row.get(0)).unwrap();
        assert_eq!(read, id);
        let bad = db.query_row("SELECT 'hof_NOT-AN-ID'", [], |row| row.get::<_, HandoffId>(0));
        assert!(bad.is_err(), "{bad:?}");
        let other_kind = db.query_row("SELECT ?1", [TraceId::generate()], |row| row.get::<_, TaskId>(0));
        assert!(other_kind.is_err(), "a trace id is no task id: {other_kind:?}");
    }

    #[test]
    fn a_time_reads_back_as_written_and_a_malformed_one_is_an_error() {
        let db = rusqlite::Connection::open_in_memory().unwrap();
        let at = DateTime::parse_from_rfc3339("2026-12-02T08:16:31.123Z").unwrap().with_timezone(&Utc);
        let written = crate::ledger::sqlite::timestamp(at);
        let read = db.query_row("SELECT ?1", [&written], |row| timestamp_column(row, "?1")).unwrap();
        assert_eq!(read, at);
        let none = db.query_row("SELECT NULL AS t", [], |row| optional_timestamp(row, "t")).unwrap();
        assert_eq!(none, None);
        let bad = db.query_row("SELECT 'yesterday' AS t", [], |row| timestamp_column(row, "t"));
        assert!(format!("{bad:?}").contains("yesterday"), "{bad:?}");
    }
}
