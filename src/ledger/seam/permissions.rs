//! Permission requests relayed from an agent to its approvers (DESIGN §15).

use super::*;

#[async_trait]
pub trait Permissions: Send + Sync {
    /// Records a request as `pending` with its prompt's send `in_flight`, unless this
    /// plugin already asked it (a repeated call after a broken connection). Returns the
    /// row, and whether it is new: only a new row's prompt is to be posted.
    async fn record_permission_request(
        &self,
        new: &NewPermissionRequest<'_>,
    ) -> LedgerResult<(StoredPermission, bool)>;

    /// Records what the prompt's send came to. A prompt provably not posted expires its
    /// request at once: nobody can answer it in Telegram, and the terminal still asks.
    async fn finish_prompt_send(&self, id: &str, outcome: &AttemptOutcome) -> LedgerResult<StoredPermission>;

    /// Start-up: a prompt whose send was in flight when the daemon died may have been
    /// posted; it becomes `unknown`, and is never sent again.
    async fn recover_prompt_sends(&self) -> LedgerResult<usize>;

    async fn permission(&self, id: &str) -> LedgerResult<Option<StoredPermission>>;

    /// The pending requests named by Claude Code's `request_id` whose prompt went to this
    /// chat (a text verdict names that id).
    async fn pending_permissions_named(
        &self,
        request_id: &str,
        chat_id: i64,
    ) -> LedgerResult<Vec<StoredPermission>>;

    /// Records a verdict if the request is still pending and not past its expiry: the first
    /// verdict wins, in one transaction.
    async fn answer_permission(
        &self,
        id: &str,
        verdict: PermissionVerdict,
        by: i64,
        by_name: &str,
    ) -> LedgerResult<AnswerRecorded>;

    /// Expires every pending request whose time is up at `now`, returning them. `now` is
    /// the caller's clock, the one that set `expires_at` and times the caller's next look:
    /// on PostgreSQL the server's clock is another, and a replica whose clock is ahead of
    /// the server's would look again and again at requests the server says are not due.
    async fn expire_due_permissions(&self, now: DateTime<Utc>) -> LedgerResult<Vec<StoredPermission>>;

    /// Expires the pending requests of an agent asked by plugin processes other than
    /// `except_plugin` (`None`: by `plugin` only), because that session ended. Returns how
    /// many expired.
    async fn expire_permissions_of_ended_session(
        &self,
        agent: &str,
        ended: EndedPlugins<'_>,
    ) -> LedgerResult<usize>;

    /// When the next pending request expires, if any is pending.
    async fn next_permission_expiry(&self) -> LedgerResult<Option<DateTime<Utc>>>;

    /// Finished requests whose prompt does not show it yet (a prompt still being sent is
    /// left until its send is classified: then it has a message to edit, or none).
    async fn unsettled_prompts(&self) -> LedgerResult<Vec<StoredPermission>>;

    /// The prompt shows the request's final state (or there is nothing to show it on).
    async fn settle_prompt(&self, id: &str) -> LedgerResult<()>;

    /// A finished request's prompt may not show its final state any more (an edit made
    /// before it was finished reached Telegram after the final one): it is edited again.
    async fn unsettle_prompt(&self, id: &str) -> LedgerResult<()>;

    /// A press on a prompt whose send was `unknown` proves it was posted, and where; a
    /// finished request's prompt can now be edited to show it.
    async fn note_prompt_message(&self, id: &str, message_id: i32) -> LedgerResult<()>;

    /// Verdicts owed to `plugin`: answered, and not yet confirmed by it as handed to Claude
    /// Code, oldest first.
    async fn undelivered_verdicts(&self, plugin: &str) -> LedgerResult<Vec<StoredPermission>>;

    /// The verdict was written to the asking plugin's session stream (the first write is
    /// kept). It is still owed until the plugin confirms it ([`Self::verdict_handed`]).
    async fn verdict_sent(&self, id: &str) -> LedgerResult<()>;

    /// The asking plugin confirms it handed the verdict of request `id` to Claude Code;
    /// false when `plugin` asked no answered request with that id. Confirming again
    /// changes nothing.
    async fn verdict_handed(&self, id: &str, plugin: &str) -> LedgerResult<bool>;

    /// The newest requests first, for `switchboard ledger permissions`.
    async fn list_permissions(&self, limit: i64) -> LedgerResult<Vec<StoredPermission>>;

    /// How many requests are in each state, for `/metrics`.
    async fn count_permissions_by_state(&self) -> LedgerResult<Vec<(PermissionState, i64)>>;
}
