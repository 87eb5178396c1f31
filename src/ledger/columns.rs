//! SQL text both backends read rows with, written once: the columns each stored type is
//! read from and the joins that give them. The dialects agree on all of it; what differs
//! (placeholders, locking, upserts) stays in each backend's statements.

/// The columns of a [`StoredEnvelope`](crate::domain::StoredEnvelope). Each list is a macro
/// so that queries stay `&'static str` literals, each prepared once and kept.
macro_rules! envelope_columns {
    () => {
        "id, trace_id, update_id, kind, chat_id, thread_id, chat_type, chat_title, message_id, \
         sender_id, sender_username, sender_name, text, attachments, content, sent_at, received_at, route, agent, \
         state, deliveries, state_changed_at, note, task_id, revision, meta"
    };
}
pub(crate) use envelope_columns;

/// The attempts that are parts of a reply, in SQL (prefix a table alias as `a.`):
/// [`AttemptMethod::is_reply_part`](crate::domain::AttemptMethod::is_reply_part). Reactions and edits are left out of what settles an
/// envelope, what a repeated reply builds on and what waits for reconciliation.
/// `tests::reply_part_method_agrees_with_is_reply_part` keeps the two in step.
macro_rules! reply_part_method {
    () => {
        "method NOT IN ('set_reaction', 'edit_message')"
    };
}
pub(crate) use reply_part_method;

/// A room turn's claimed reply that may be given back (`release_room_reply`): the turn
/// still open, its envelope still pending, and no part of the reply posted. A reply cut off
/// after its first part keeps its claim: the room saw part of it, so the speaker may resume
/// those words but not say others in the same turn.
macro_rules! room_reply_releasable {
    () => {
        concat!(
            "ended_at IS NULL AND reply_text IS NOT NULL \
             AND (SELECT state FROM envelopes WHERE id = cascade_turns.envelope_id) = 'pending' \
             AND NOT EXISTS (SELECT 1 FROM attempts a WHERE a.envelope_id = cascade_turns.envelope_id \
                 AND a.outcome = 'sent' AND a.purpose = 'reply' AND a.",
            $crate::ledger::columns::reply_part_method!(),
            ")"
        )
    };
}
pub(crate) use room_reply_releasable;

/// A [`FoundForReply`](crate::domain::FoundForReply): the envelope's columns, whether a
/// reply to it waits for reconciliation, and whether one was made before. Follow it with
/// ` FROM envelopes WHERE …`.
macro_rules! found_for_reply_columns {
    () => {
        concat!(
            $crate::ledger::columns::envelope_columns!(),
            ", EXISTS (SELECT 1 FROM attempts a WHERE a.envelope_id = envelopes.id \
                 AND a.outcome IN ('unknown', 'in_flight') AND a.reconciled_outcome IS NULL \
                 AND a.purpose = 'reply' AND a.",
            $crate::ledger::columns::reply_part_method!(),
            ") AS awaiting_reconciliation, \
             EXISTS (SELECT 1 FROM attempts a WHERE a.envelope_id = envelopes.id \
                 AND a.request_id IS NOT NULL AND a.",
            $crate::ledger::columns::reply_part_method!(),
            ") AS replied_before"
        )
    };
}
pub(crate) use found_for_reply_columns;

/// The columns of a [`StoredPermission`](crate::domain::StoredPermission).
macro_rules! permission_columns {
    () => {
        "id, agent, session_id, plugin_id, request_id, tool_name, description, input_preview, asked_at, \
         expires_at, state, route, chat_id, thread_id, prompt_send, prompt_message_id, prompt_error, \
         prompt_settled, answered_by, answered_by_name, answered_at, expired_because, verdict_sent_at, verdict_handed_at"
    };
}
pub(crate) use permission_columns;

/// The columns of a [`StoredQuestion`](crate::domain::StoredQuestion).
macro_rules! question_columns {
    () => {
        "id, op_id, envelope_id, trace_id, sent_chat_id, sent_at, sent_text, state, chat_id, thread_id, \
         prompt_send, prompt_message_id, prompt_settled, answered_by_name, answered_at"
    };
}
pub(crate) use question_columns;

/// The columns of a [`StoredHandoff`](crate::domain::StoredHandoff), joined with the envelopes it
/// names.
macro_rules! handoff_select {
    () => {
        "SELECT h.id, h.handoff_id, h.from_agent, h.to_agent, h.instruction, h.cause_envelope_id, \
         c.trace_id AS cause_trace_id, h.depth, h.followup_of, h.intent, h.request_id, h.envelope_id, \
         t.trace_id AS envelope_trace_id, h.answer_envelope_id, a.trace_id AS answer_trace_id, \
         h.answer_request_id, h.state, h.opened_at, h.closed_at, h.note, h.task_id, h.late_result \
         FROM handoffs h JOIN envelopes t ON t.id = h.envelope_id \
         LEFT JOIN envelopes c ON c.id = h.cause_envelope_id \
         LEFT JOIN envelopes a ON a.id = h.answer_envelope_id "
    };
}
pub(crate) use handoff_select;

/// A room's cascade with its message's trace id and message id.
macro_rules! cascade_select {
    () => {
        "SELECT c.id, c.cascade_id, c.route, c.chat_id, c.thread_id, c.message_envelope_id, \
         m.trace_id AS message_trace_id, m.message_id, c.state, c.cascade, c.max_iters, c.speaker_timeout_secs, \
         c.stop_by, c.stop_requested_at, c.outcome, c.outcome_text, c.created_at, c.started_at, c.ended_at, \
         c.updated_at, c.version FROM cascades c JOIN envelopes m ON m.id = c.message_envelope_id "
    };
}
pub(crate) use cascade_select;

/// A cascade's turn with its envelope's trace id and state.
macro_rules! turn_select {
    () => {
        "SELECT t.id, t.cascade_id AS cascade_row, t.speaker, t.agent, t.summoned_by, t.envelope_id, \
         e.trace_id AS envelope_trace_id, e.state AS envelope_state, t.started_at, t.reply_text, \
         t.reply_request_id, t.ended_at, t.ending FROM cascade_turns t JOIN envelopes e ON e.id = t.envelope_id "
    };
}
pub(crate) use turn_select;

/// A room post with its envelope's trace id.
macro_rules! post_select {
    () => {
        "SELECT p.id, p.key, p.envelope_id, e.trace_id AS envelope_trace_id, p.route, p.chat_id, p.thread_id, \
         p.reply_to_message_id, p.text, p.state = 'made' AS made, p.created_at, p.made_at \
         FROM room_posts p JOIN envelopes e ON e.id = p.envelope_id "
    };
}
pub(crate) use post_select;

/// The columns of a [`Task`](crate::rules::revisions::Task) (`t` the task, `a` the envelope
/// to act on), from [`task_from!`].
macro_rules! task_columns {
    () => {
        "t.task_id, t.chat_id, t.thread_id, t.agent, t.route, t.state, t.revision, t.objective, \
         t.predecessor, t.successor, t.instruction_revision, t.instruction_kind, a.trace_id AS act_on, \
         t.stop_requested_by, t.stop_requested_at, t.stopped_at, t.stop_reason, t.opened_at, t.updated_at, \
         t.closed_at"
    };
}
pub(crate) use task_columns;

/// The tasks, `t`, with the envelope each is to act on, `a`.
macro_rules! task_from {
    () => {
        " FROM tasks t LEFT JOIN envelopes a ON a.id = t.act_on_envelope_id "
    };
}
pub(crate) use task_from;

/// Whether anything of the task whose id is the SQL expression `$task` still runs: an
/// envelope queued, pending or unresolved, or an open handoff.
macro_rules! busy_of {
    ($task:literal) => {
        concat!(
            "(EXISTS (SELECT 1 FROM envelopes WHERE task_id = ",
            $task,
            " AND state IN ('queued', 'pending', 'unresolved')) \
             OR EXISTS (SELECT 1 FROM handoffs WHERE task_id = ",
            $task,
            " AND state = 'open'))"
        )
    };
}
pub(crate) use busy_of;

/// Of an attempt an operator settles: a reply's part with parts after it, never attempted
/// (a reply stops at its first part whose outcome is unknown), so not the reply's last.
macro_rules! part_cut_short {
    () => {
        "purpose = 'reply' AND chunk_index + 1 < chunk_count"
    };
}
pub(crate) use part_cut_short;

/// Whether the task row `tasks` was closed before the cutoff, the SQL parameter `$cutoff`
/// (retention, DESIGN §17): done, stopped or replaced before it; or `open` with nothing of
/// it still running ([`busy_of!`]) and nothing of it changed since. Such a task is done
/// (DESIGN §11), and is marked so only when its conversation's next message comes, which
/// for a one-off conversation is never.
macro_rules! closed_before {
    ($cutoff:literal) => {
        concat!(
            "((tasks.state IN ('done', 'stopped', 'replaced') AND tasks.closed_at IS NOT NULL \
               AND tasks.closed_at < ",
            $cutoff,
            ") OR (tasks.state = 'open' AND tasks.updated_at < ",
            $cutoff,
            " AND NOT ",
            $crate::ledger::columns::busy_of!("tasks.task_id"),
            " AND NOT EXISTS (SELECT 1 FROM envelopes WHERE task_id = tasks.task_id AND state_changed_at >= ",
            $cutoff,
            ")))"
        )
    };
}
pub(crate) use closed_before;

/// An envelope's facts as retention reads them (`rules::retention::EnvelopeFacts`), `e` the
/// envelope, the SQL parameter `$cutoff` the cutoff: its id, state, whether it settled
/// before the cutoff (it reached its state before it, and none of its attempts, a reaction
/// or an edit on an old answered message say, started, finished or was reconciled since),
/// its task, and whether an attempt of it is in flight or unknown and not reconciled.
macro_rules! envelope_facts_columns {
    ($cutoff:literal) => {
        concat!(
            "e.id, e.state, (e.state_changed_at < ",
            $cutoff,
            " AND NOT EXISTS (SELECT 1 FROM attempts a WHERE a.envelope_id = e.id AND (a.started_at >= ",
            $cutoff,
            " OR a.finished_at >= ",
            $cutoff,
            " OR a.reconciled_at >= ",
            $cutoff,
            "))) AS settled_before_cutoff, e.task_id, \
             EXISTS (SELECT 1 FROM attempts a WHERE a.envelope_id = e.id AND (a.outcome = 'in_flight' \
               OR (a.outcome = 'unknown' AND a.reconciled_outcome IS NULL))) AS unreconciled_attempt"
        )
    };
}
pub(crate) use envelope_facts_columns;

/// Whether a row of `permission_requests` is finished before the cutoff, the SQL parameter
/// `$cutoff` (retention, DESIGN §17): answered or expired, its prompt showing so (settled),
/// its verdict handed by the asking plugin to Claude Code (an expired request has none to
/// hand), and asked and answered before the cutoff. A pending request, a prompt still to be
/// edited and a verdict still owed stay. A verdict written to the plugin's stream
/// (`verdict_sent_at`) is still owed until the plugin confirms it (`verdict_handed_at`):
/// the stream may have been dead, and the verdict is written again when that plugin comes
/// back ([`Permissions::undelivered_verdicts`](crate::ledger::Permissions::undelivered_verdicts)),
/// however long it stays away.
macro_rules! permission_finished_before {
    ($cutoff:literal) => {
        concat!(
            "state IN ('allowed', 'denied', 'expired') AND prompt_settled \
             AND (state = 'expired' OR verdict_handed_at IS NOT NULL) AND asked_at < ",
            $cutoff,
            " AND COALESCE(answered_at, asked_at) < ",
            $cutoff
        )
    };
}
pub(crate) use permission_finished_before;

/// Whether a row of `reactions` is done before the cutoff, the SQL parameter `$cutoff`
/// (retention, DESIGN §17): given to a session, or kept for audit only, before it; one still
/// owed to an agent stays, and so does the newest row (SQLite hands out one past the
/// largest id again, DESIGN §17 "the newest row of each table stays"). The condition is the
/// one the partial index `reactions_done_at` serves (SQLite migration 0019, PostgreSQL
/// 0008), written the same, so a prune searches the old rows, not the whole table.
macro_rules! reaction_done_before {
    ($cutoff:literal) => {
        concat!(
            "state <> 'owed' AND COALESCE(delivered_at, received_at) < ",
            $cutoff,
            " AND id <> (SELECT MAX(id) FROM reactions)"
        )
    };
}
pub(crate) use reaction_done_before;

/// Whether a row of `operator_questions` is finished before the cutoff, the SQL parameter
/// `$cutoff`: answered (or its envelope settled otherwise), its prompt showing so, and asked
/// and answered before the cutoff. An open question and a prompt still to be edited stay.
macro_rules! question_finished_before {
    ($cutoff:literal) => {
        concat!(
            "state <> 'open' AND prompt_settled AND asked_at < ",
            $cutoff,
            " AND COALESCE(answered_at, asked_at) < ",
            $cutoff
        )
    };
}
pub(crate) use question_finished_before;
