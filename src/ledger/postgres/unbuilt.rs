//! The concerns of the storage seam this backend does not implement yet: each method
//! fails with [`unbuilt`], naming itself, and changes nothing. A concern leaves this file
//! for one of its own (`intake.rs`, `attempts.rs`, …) when it is built and the
//! conformance suite's rules for it pass on PostgreSQL (`tests.rs`). Until this file is
//! gone, `[storage] database` does not accept a PostgreSQL URL (`config/validate.rs`).

use async_trait::async_trait;
use chrono::{DateTime, Utc};

use super::PgLedger;
use crate::ids::{AgentName, CascadeId, HandoffId, TraceId};
use crate::ledger::seam::*;
use crate::ledger::*;
use crate::rules::revisions::Refusal;

/// The error of a seam method this backend does not implement yet.
fn unbuilt(method: &str) -> LedgerError {
    LedgerError::other(format!("`{method}` is not built on PostgreSQL yet"))
}

#[async_trait]
impl Handoffs for PgLedger {
    async fn record_handoff(&self, _new: &NewHandoff<'_>) -> LedgerResult<Result<StoredHandoff, Refusal>> {
        Err(unbuilt("Handoffs::record_handoff"))
    }

    async fn end_handoff(
        &self,
        _handoff: &StoredHandoff,
        _end: HandoffEnd<'_>,
        _actor: &str,
    ) -> LedgerResult<Result<Option<StoredHandoff>, Refusal>> {
        Err(unbuilt("Handoffs::end_handoff"))
    }

    async fn keep_late_result(
        &self,
        _agent: &AgentName,
        _trace_id: &TraceId,
        _text: &str,
    ) -> LedgerResult<bool> {
        Err(unbuilt("Handoffs::keep_late_result"))
    }

    async fn handoff(&self, _handoff_id: &HandoffId) -> LedgerResult<Option<StoredHandoff>> {
        Err(unbuilt("Handoffs::handoff"))
    }

    async fn handoff_of_envelope(&self, _envelope_id: i64) -> LedgerResult<Option<StoredHandoff>> {
        Err(unbuilt("Handoffs::handoff_of_envelope"))
    }

    async fn handoff_by_request(
        &self,
        _from: &AgentName,
        _request_id: &str,
    ) -> LedgerResult<Option<StoredHandoff>> {
        Err(unbuilt("Handoffs::handoff_by_request"))
    }

    async fn handoff_by_answer_request(
        &self,
        _agent: &AgentName,
        _request_id: &str,
    ) -> LedgerResult<Option<StoredHandoff>> {
        Err(unbuilt("Handoffs::handoff_by_answer_request"))
    }

    async fn handoffs_for_cause(&self, _cause_envelope_id: i64) -> LedgerResult<Vec<StoredHandoff>> {
        Err(unbuilt("Handoffs::handoffs_for_cause"))
    }

    async fn open_handoffs_from(&self, _from: &AgentName) -> LedgerResult<Vec<StoredHandoff>> {
        Err(unbuilt("Handoffs::open_handoffs_from"))
    }

    async fn list_handoffs(
        &self,
        _open_only: bool,
        _agent: Option<&str>,
        _limit: i64,
    ) -> LedgerResult<Vec<StoredHandoff>> {
        Err(unbuilt("Handoffs::list_handoffs"))
    }
}

#[async_trait]
impl Retention for PgLedger {
    async fn prune(&self, _finished_before: DateTime<Utc>, _dry_run: bool) -> LedgerResult<PruneReport> {
        Err(unbuilt("Retention::prune"))
    }

    async fn pages(&self) -> LedgerResult<Pages> {
        Err(unbuilt("Retention::pages"))
    }
}

#[async_trait]
impl Rooms for PgLedger {
    async fn room_inbox(&self) -> LedgerResult<Vec<StoredEnvelope>> {
        Err(unbuilt("Rooms::room_inbox"))
    }

    async fn record_cascade(&self, _new: &NewCascade<'_>, _note: &str) -> LedgerResult<Option<CascadeId>> {
        Err(unbuilt("Rooms::record_cascade"))
    }

    async fn apply_room_step(&self, _step: &RoomStep<'_>) -> LedgerResult<Option<AppliedStep>> {
        Err(unbuilt("Rooms::apply_room_step"))
    }

    async fn active_cascade(&self, _route: &str) -> LedgerResult<Option<StoredCascade>> {
        Err(unbuilt("Rooms::active_cascade"))
    }

    async fn next_waiting_cascade(&self, _route: &str) -> LedgerResult<Option<StoredCascade>> {
        Err(unbuilt("Rooms::next_waiting_cascade"))
    }

    async fn waiting_cascades(&self, _route: &str) -> LedgerResult<i64> {
        Err(unbuilt("Rooms::waiting_cascades"))
    }

    async fn busy_rooms(&self) -> LedgerResult<Vec<String>> {
        Err(unbuilt("Rooms::busy_rooms"))
    }

    async fn cascade(&self, _cascade_id: &CascadeId) -> LedgerResult<Option<StoredCascade>> {
        Err(unbuilt("Rooms::cascade"))
    }

    async fn cascade_of_message(&self, _envelope_id: i64) -> LedgerResult<Option<StoredCascade>> {
        Err(unbuilt("Rooms::cascade_of_message"))
    }

    async fn list_cascades(&self, _route: Option<&str>, _limit: i64) -> LedgerResult<Vec<StoredCascade>> {
        Err(unbuilt("Rooms::list_cascades"))
    }

    async fn turns_of(&self, _cascade_row: i64) -> LedgerResult<Vec<StoredTurn>> {
        Err(unbuilt("Rooms::turns_of"))
    }

    async fn turn_of_envelope(&self, _envelope_id: i64) -> LedgerResult<Option<(StoredTurn, StoredCascade)>> {
        Err(unbuilt("Rooms::turn_of_envelope"))
    }

    async fn claim_room_reply(
        &self,
        _envelope_id: i64,
        _text: &str,
        _request_id: &str,
    ) -> LedgerResult<Result<StoredTurn, ClaimRefused>> {
        Err(unbuilt("Rooms::claim_room_reply"))
    }

    async fn release_room_reply(&self, _turn_id: i64) -> LedgerResult<bool> {
        Err(unbuilt("Rooms::release_room_reply"))
    }

    async fn owed_room_posts(&self) -> LedgerResult<Vec<StoredPost>> {
        Err(unbuilt("Rooms::owed_room_posts"))
    }

    async fn posts_of(&self, _cascade_row: i64) -> LedgerResult<Vec<StoredPost>> {
        Err(unbuilt("Rooms::posts_of"))
    }

    async fn room_post_attempted(&self, _poster: &str, _key: &str) -> LedgerResult<bool> {
        Err(unbuilt("Rooms::room_post_attempted"))
    }

    async fn mark_room_post_made(&self, _post_id: i64) -> LedgerResult<()> {
        Err(unbuilt("Rooms::mark_room_post_made"))
    }
}
