//! How the domain's ids are stored: as their text, and read back strictly (a value that
//! does not parse is an error naming it, never a default).

use rusqlite::types::{FromSql, FromSqlError, FromSqlResult, ToSql, ToSqlOutput, ValueRef};

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
}
