//! Albums on a `mention_only` route, as a decision on plain data. Telegram sends each
//! photo or file of an album as a message of its own, sharing the album's
//! `media_group_id`, and the caption (where a mention of the bot is) rides on one of them,
//! usually the first but not always. Said to the bot is said of the whole album: an item
//! without the mention is addressed when another item of its album is.
//!
//! The items of an album come within about a second, but not always in one batch (a long
//! poll answers at the first update, a webhook delivers them one at a time, in any order),
//! so intake applies this rule to each batch, and the ledger again, in the transaction
//! that records a batch, to the album's items recorded before (`ledger::album_rows`):
//! what a restart of the daemon between two items would make memory forget, the ledger
//! keeps.

use chrono::{DateTime, TimeDelta, Utc};

/// Items of one `media_group_id` sent further apart than this are not taken for one
/// album. Telegram dates every item of an album with the moment it was sent, within a
/// second of each other; the margin is for nothing else, and keeps an item from being
/// handed over because of one recorded long before (an id reused, a date wrong).
pub const ALBUM_SPAN: TimeDelta = TimeDelta::minutes(2);

/// An item of an album, as far as the rule needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AlbumItem {
    /// Addressed to the bot by itself (its caption mentions the bot, it replies to the
    /// bot, …), and so recorded as work for the route's agent.
    pub addressed: bool,
    /// When Telegram says it was sent.
    pub sent_at: DateTime<Utc>,
}

/// For each item of one album (the same chat, `media_group_id` and route), the item it
/// reaches the agent with: itself when it is addressed, else the first addressed item sent
/// within [`ALBUM_SPAN`] of it; `None` when none is, and it is said to nobody.
///
/// ```
/// use chrono::{TimeZone, Utc};
/// use switchboard::rules::albums::{AlbumItem, addressed_by};
///
/// let at = Utc.timestamp_opt(1_700_000_000, 0).unwrap();
/// let photo = |addressed| AlbumItem { addressed, sent_at: at };
/// // The caption on the second photo speaks for the first and the third too.
/// assert_eq!(addressed_by(&[photo(false), photo(true), photo(false)]), [Some(1), Some(1), Some(1)]);
/// assert_eq!(addressed_by(&[photo(false), photo(false)]), [None, None]);
/// ```
pub fn addressed_by(items: &[AlbumItem]) -> Vec<Option<usize>> {
    items
        .iter()
        .enumerate()
        .map(|(index, item)| {
            if item.addressed {
                return Some(index);
            }
            items
                .iter()
                .position(|other| other.addressed && (other.sent_at - item.sent_at).abs() <= ALBUM_SPAN)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone;

    use super::*;

    fn at(seconds: i64) -> DateTime<Utc> {
        Utc.timestamp_opt(1_700_000_000 + seconds, 0).unwrap()
    }

    fn item(addressed: bool, seconds: i64) -> AlbumItem {
        AlbumItem { addressed, sent_at: at(seconds) }
    }

    #[test]
    fn an_album_is_addressed_by_any_of_its_items_in_either_order() {
        // The caption first, as usual.
        assert_eq!(addressed_by(&[item(true, 0), item(false, 0), item(false, 1)]), [Some(0); 3]);
        // The caption last: the items before it are addressed as well.
        assert_eq!(addressed_by(&[item(false, 0), item(false, 0), item(true, 1)]), [Some(2); 3]);
        // Two captions that mention the bot: each its own, the others with the first.
        assert_eq!(
            addressed_by(&[item(false, 0), item(true, 0), item(true, 0)]),
            [Some(1), Some(1), Some(2)]
        );
    }

    #[test]
    fn an_album_said_to_nobody_stays_said_to_nobody() {
        assert_eq!(addressed_by(&[item(false, 0), item(false, 0), item(false, 0)]), [None; 3]);
        assert_eq!(addressed_by(&[]), []);
    }

    #[test]
    fn an_item_sent_beyond_the_span_of_every_addressed_one_is_not_of_its_album() {
        let span = ALBUM_SPAN.num_seconds();
        assert_eq!(addressed_by(&[item(true, 0), item(false, span)]), [Some(0), Some(0)], "at the span");
        assert_eq!(addressed_by(&[item(true, 0), item(false, span + 1)]), [Some(0), None]);
        assert_eq!(addressed_by(&[item(false, -span - 1), item(true, 0)]), [None, Some(1)], "before it too");
        // Each item is measured against every addressed one, not only the first.
        assert_eq!(
            addressed_by(&[item(true, 0), item(true, span + 10), item(false, span + 20)]),
            [Some(0), Some(1), Some(1)]
        );
    }
}
