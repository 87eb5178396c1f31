//! What both backends decide alike about albums when they record a batch
//! (`rules::albums`): which albums the batch's rows are items of, and which of an album's
//! rows, recorded as not addressed to the bot (in this batch or an earlier one, before a
//! restart too), an addressed item takes along to its agent, with its task.
//!
//! Intake already joins the items of one batch; the ledger joins an album's items across
//! batches, in the transaction that records the later one, so an album said to the bot
//! reaches its agent whole whichever of its items came first. On PostgreSQL the
//! transactions that record items of one album are serialised by a lock on the album.

use std::collections::BTreeSet;

use crate::domain::{AlbumKey, EnvelopeState, RoutedEnvelope, StoredEnvelope};
use crate::rules::albums::{AlbumItem, addressed_by};

/// The albums the new rows of a batch are items of, each once (in a stable order, the
/// order PostgreSQL's album locks are taken in).
pub(crate) fn albums_of(batch: &[RoutedEnvelope], new_rows: &[bool]) -> Vec<AlbumKey> {
    let albums: BTreeSet<AlbumKey> = batch
        .iter()
        .zip(new_rows)
        .filter(|(_, new)| **new)
        .filter_map(|(routed, _)| routed.album())
        .collect();
    albums.into_iter().collect()
}

/// A row of an album recorded as not addressed to the bot that joins it, going with
/// `with`: its agent, and its task and revision.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Join<'a> {
    pub row: &'a StoredEnvelope,
    pub with: &'a StoredEnvelope,
}

impl Join<'_> {
    /// The agent it is queued for.
    pub fn agent(&self) -> &str {
        self.with.agent.as_deref().unwrap_or_default()
    }
}

/// Of an album's rows (its messages recorded under one route, oldest first), those
/// recorded as not addressed to the bot that an item addressed to it takes along.
pub(crate) fn joins(rows: &[StoredEnvelope]) -> Vec<Join<'_>> {
    // Rows that are neither (rejected, or an item already joined and since answered) are
    // no item of the album for the rule: they address nothing and join nothing.
    let items: Vec<&StoredEnvelope> = rows.iter().filter(|row| is_work(row) || unaddressed(row)).collect();
    let rule: Vec<AlbumItem> =
        items.iter().map(|row| AlbumItem { addressed: is_work(row), sent_at: row.sent_at }).collect();
    items
        .iter()
        .zip(addressed_by(&rule))
        .filter(|(row, _)| unaddressed(row))
        .filter_map(|(row, by)| Some(Join { row, with: items[by?] }))
        .collect()
}

/// Why a joined row is work after all: its note, and its event's reason.
pub(crate) fn joined_note(album: &AlbumKey) -> String {
    format!(
        "an item of its album (media_group_id {}) is addressed to the bot (route {} is mention_only)",
        album.media_group_id, album.route
    )
}

/// Recorded as work for an agent: the row addressed the bot.
fn is_work(row: &StoredEnvelope) -> bool {
    row.agent.is_some()
        && matches!(
            row.state,
            EnvelopeState::Queued
                | EnvelopeState::Pending
                | EnvelopeState::Acked
                | EnvelopeState::Unresolved
                | EnvelopeState::Superseded
        )
}

/// Kept by its `mention_only` route as not addressed to the bot (see
/// `RoutedEnvelope::unaddressed`), and never handed to anyone.
fn unaddressed(row: &StoredEnvelope) -> bool {
    row.state == EnvelopeState::Ignored && row.route.is_some() && row.deliveries == 0
}
