//! Telegram's dates, within the years every ledger holds, before anything is stored.
//!
//! A `date` is any integer on the wire, and teloxide reads every one chrono can hold (some
//! 262,000 years either way). PostgreSQL refuses a time before 4714 BC (SQLSTATE 22008),
//! and SQLite's text times cannot be read back outside the years 0000–9999 (RFC 3339 has
//! four digits for the year): an update dated so failed its batch on every try on either
//! backend, stopping the polling leader, then each standby elected after it. No clock
//! Telegram keeps writes such a date, so it is clamped to the nearest end of those years,
//! where a reader still sees it is no real time; every date in them is kept as it came.

use chrono::{DateTime, Utc};

/// 0000-01-01T00:00:00Z, the earliest time both ledgers store and read back.
const EARLIEST_SECS: i64 = -62_167_219_200;
/// 9999-12-31T23:59:59Z, the latest.
const LATEST_SECS: i64 = 253_402_300_799;

/// `at`, or the nearest end of the years both ledgers hold when it is outside them.
pub fn within_ledger(at: DateTime<Utc>) -> DateTime<Utc> {
    match at.timestamp() {
        secs if secs < EARLIEST_SECS => from_unix(EARLIEST_SECS),
        secs if secs > LATEST_SECS => from_unix(LATEST_SECS),
        _ => at,
    }
}

/// The Unix time `secs` (a `date` read leniently), clamped as [`within_ledger`] clamps.
pub fn from_unix(secs: i64) -> DateTime<Utc> {
    DateTime::from_timestamp(secs.clamp(EARLIEST_SECS, LATEST_SECS), 0)
        .expect("the years 0000 to 9999 are within chrono's range")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_dated_outside_the_years_0000_to_9999_are_clamped_and_every_other_is_kept() {
        let text = |at: DateTime<Utc>| at.to_rfc3339();
        assert_eq!(text(from_unix(-210_866_803_201)), "0000-01-01T00:00:00+00:00");
        assert_eq!(text(from_unix(i64::MIN)), "0000-01-01T00:00:00+00:00");
        assert_eq!(text(from_unix(253_402_300_800)), "9999-12-31T23:59:59+00:00");
        assert_eq!(text(from_unix(i64::MAX)), "9999-12-31T23:59:59+00:00");
        assert_eq!(from_unix(1_700_000_000).timestamp(), 1_700_000_000);
        let far = DateTime::from_timestamp(-1_000_000_000_000, 0).unwrap();
        assert_eq!(within_ledger(far), from_unix(EARLIEST_SECS));
        let late = DateTime::from_timestamp(300_000_000_000, 0).unwrap();
        assert_eq!(within_ledger(late), from_unix(LATEST_SECS));
        let now = DateTime::from_timestamp(1_700_000_000, 123).unwrap();
        assert_eq!(within_ledger(now), now);
        // Both ends read back from the text SQLite stores.
        for end in [EARLIEST_SECS, LATEST_SECS] {
            let stored = from_unix(end).to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
            assert_eq!(DateTime::parse_from_rfc3339(&stored).unwrap().timestamp(), end, "{stored}");
        }
    }
}
