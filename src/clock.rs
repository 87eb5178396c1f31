//! How switchboard writes a moment as text: RFC 3339 in UTC, milliseconds, `Z`. Text in
//! this form compares in time order, which the ledger's columns rely on; the agents'
//! `ts`, the operator's listings and the bot's notices read the same way.

use chrono::{DateTime, SecondsFormat, Utc};

/// `at` as text.
pub fn text(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// Now, as text.
pub fn now_text() -> String {
    text(Utc::now())
}

/// `at` for a person reading a chat: to the second, in UTC.
pub fn for_people(at: DateTime<Utc>) -> String {
    at.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_sorts_in_time_order_and_reads_back() {
        let earlier = DateTime::parse_from_rfc3339("2026-12-02T03:04:05.678Z").unwrap().with_timezone(&Utc);
        let later = earlier + chrono::Duration::milliseconds(400);
        assert_eq!(text(earlier), "2026-12-02T03:04:05.678Z");
        assert!(text(earlier) < text(later));
        assert_eq!(for_people(earlier), "2026-12-02 03:04:05 UTC");
    }
}
