//! Intake's side: each batch of updates, with the poller's offset when it polled them
//! (committed together, DESIGN §1-§2), or without one when Telegram pushed them.

use super::*;

#[async_trait]
pub trait Intake: Send + Sync {
    async fn next_offset(&self, bot_id: i64) -> LedgerResult<Option<i64>>;

    /// Stores a batch of rows and advances the offset in one transaction: either both
    /// happen or neither does, so a crash can neither lose nor duplicate an update.
    /// Returns the rows that were new: an update already stored with the same id and the
    /// same digest (a re-poll) is skipped; the same id with other content (Telegram reuses
    /// ids after a week of silence) is a new row.
    async fn record_batch<'a>(
        &self,
        bot_id: i64,
        next_offset: i64,
        batch: &'a [RoutedEnvelope],
    ) -> LedgerResult<Vec<&'a RoutedEnvelope>> {
        Ok(self.record_batch_with_reactions(bot_id, next_offset, batch, &[], &[], None).await?.inserted)
    }

    /// [`Self::record_batch`], and in the same transaction every `queued` envelope of the
    /// agents in `claim_for` (the batch's and any older ones) moves to `pending`, handed
    /// to their live sessions: those rows are returned, oldest first, for the caller to
    /// pass on. The ledger says `pending` before any session sees them, and a crash
    /// leaves them `pending`, so they are redelivered.
    async fn record_batch_handing_over<'a>(
        &self,
        bot_id: i64,
        next_offset: i64,
        batch: &'a [RoutedEnvelope],
        claim_for: &[&AgentName],
        bot_username: Option<&str>,
    ) -> LedgerResult<RecordedBatch<'a>> {
        self.record_batch_with_reactions(bot_id, next_offset, batch, &[], claim_for, bot_username).await
    }

    /// [`Self::record_batch_handing_over`], with the batch's reactions stored in the same
    /// transaction (see `reactions`): those owed to an agent are returned for the caller
    /// to ring its bell.
    async fn record_batch_with_reactions<'a>(
        &self,
        bot_id: i64,
        next_offset: i64,
        batch: &'a [RoutedEnvelope],
        reactions: &[RoutedReaction],
        claim_for: &[&AgentName],
        bot_username: Option<&str>,
    ) -> LedgerResult<RecordedBatch<'a>>;

    /// [`Self::record_batch_with_reactions`] for updates Telegram pushed (a webhook
    /// delivery): no offset confirms them, so none is moved. An update already stored with
    /// the same id and digest (Telegram delivering it again because our answer never
    /// reached it) is skipped, as a re-poll is.
    async fn record_pushed_batch<'a>(
        &self,
        batch: &'a [RoutedEnvelope],
        reactions: &[RoutedReaction],
        claim_for: &[&AgentName],
        bot_username: Option<&str>,
    ) -> LedgerResult<RecordedBatch<'a>>;

    /// The raw text of an undecodable update, by its envelope's trace id.
    async fn raw_update(&self, trace_id: &TraceId) -> LedgerResult<Option<String>>;
}
