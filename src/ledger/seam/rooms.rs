//! Group rooms: cascades, turns and posts (DESIGN §10).

use super::*;

#[async_trait]
pub trait Rooms: Send + Sync {
    /// Room messages and commands not yet taken by the room driver, oldest first.
    async fn room_inbox(&self) -> LedgerResult<Vec<StoredEnvelope>>;

    /// Records a human message's cascade (`waiting`) and moves the message from `queued`
    /// to `acked`, together. Returns the cascade id; `None` if the message was already
    /// taken (nothing changed).
    async fn record_cascade(&self, new: &NewCascade<'_>, note: &str) -> LedgerResult<Option<CascadeId>>;

    /// Applies a decided step of a room if every fact it was decided on still holds.
    /// `None`: a guard failed, nothing changed; decide again. The times it writes (a turn's
    /// start and end, the exchange's) are `now`, the caller's clock: the one a speaker's
    /// time is judged on. On PostgreSQL the server's clock is another, and a replica whose
    /// clock is apart from the server's by more than a speaker's time would time out every
    /// speaker at once, or let one keep the floor far too long.
    async fn apply_room_step(
        &self,
        step: &RoomStep<'_>,
        now: DateTime<Utc>,
    ) -> LedgerResult<Option<AppliedStep>>;

    /// The room's exchange that has (or is about to give) the floor, if any.
    async fn active_cascade(&self, route: &str) -> LedgerResult<Option<StoredCascade>>;

    /// The room's oldest exchange waiting for the room to be free.
    async fn next_waiting_cascade(&self, route: &str) -> LedgerResult<Option<StoredCascade>>;

    /// How many exchanges wait in the room.
    async fn waiting_cascades(&self, route: &str) -> LedgerResult<i64>;

    /// Rooms with an exchange waiting or running.
    async fn busy_rooms(&self) -> LedgerResult<Vec<String>>;

    async fn cascade(&self, cascade_id: &CascadeId) -> LedgerResult<Option<StoredCascade>>;

    /// The cascade a human message made, if it made one.
    async fn cascade_of_message(&self, envelope_id: i64) -> LedgerResult<Option<StoredCascade>>;

    /// For `switchboard ledger cascades`: newest last.
    async fn list_cascades(&self, route: Option<&str>, limit: i64) -> LedgerResult<Vec<StoredCascade>>;

    /// Every turn of a cascade, in order.
    async fn turns_of(&self, cascade_row: i64) -> LedgerResult<Vec<StoredTurn>>;

    /// The turn a room_turn envelope gives, with its cascade.
    async fn turn_of_envelope(&self, envelope_id: i64) -> LedgerResult<Option<(StoredTurn, StoredCascade)>>;

    /// Claims the one reply of the turn `envelope_id` gives, before it is posted. Refused
    /// when the turn ended, already has its reply, or its envelope is no longer pending.
    async fn claim_room_reply(
        &self,
        envelope_id: i64,
        text: &str,
        request_id: &str,
    ) -> LedgerResult<Result<StoredTurn, ClaimRefused>>;

    /// Gives a turn's claimed reply back when it was not posted and is not being posted
    /// (its envelope is still pending): the speaker may reply again, or time out.
    async fn release_room_reply(&self, turn_id: i64) -> LedgerResult<bool>;

    /// Posts not yet made, oldest first.
    async fn owed_room_posts(&self) -> LedgerResult<Vec<StoredPost>>;

    /// The posts of a cascade, in order.
    async fn posts_of(&self, cascade_row: i64) -> LedgerResult<Vec<StoredPost>>;

    /// Whether a post was already attempted in a way that may have reached the chat: an
    /// attempt `poster` made carries its key and is not `not_sent` (a post every attempt of
    /// which provably went nowhere is still owed, and is tried again).
    /// (Looked up by the poster and the key, which `attempts_by_request` indexes: by the
    /// key alone, every attempt ever made would be read.)
    async fn room_post_attempted(&self, poster: &str, key: &str) -> LedgerResult<bool>;

    async fn mark_room_post_made(&self, post_id: i64) -> LedgerResult<()>;
}
