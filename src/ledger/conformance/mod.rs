//! The conformance suite: the rules of DESIGN §2-§4, §9-§11, §15 and §17 as a ledger sees them, written
//! against the seam alone, so every backend is held to the same behaviour. A backend runs
//! the whole suite with one line in its own tests:
//!
//! ```ignore
//! crate::ledger::conformance::suite!(MyBackend);
//! ```
//!
//! where `MyBackend` implements [`Backend`]. A rule that can only be checked by looking at
//! one backend's storage (SQLite's pragmas, its migrations) stays in that backend's tests.

use async_trait::async_trait;

use super::Ledger;

pub(crate) mod envelopes;
pub(crate) mod fixtures;
pub(crate) mod handoffs;
pub(crate) mod permissions;
pub(crate) mod questions;
pub(crate) mod replies;
pub(crate) mod retention;
pub(crate) mod rooms;
pub(crate) mod sessions;
pub(crate) mod tasks;

/// A backend under test.
#[async_trait]
pub(crate) trait Backend {
    /// What keeps a fresh ledger's storage (a directory, a schema) alive until the test ends.
    type Keep: Send;

    /// A new, empty, migrated ledger that no other test sees.
    async fn fresh() -> (Self::Keep, Ledger);
}

/// One `#[tokio::test]` per rule of the suite, for the backend `$backend`, plus the model
/// property of §11, in one module per concern (`envelopes::…`, `replies::…`).
/// `suite!(Backend; envelopes, replies)` runs only the concerns named: a backend being
/// built runs those it implements.
///
/// The concerns: `envelopes` (DESIGN §1-§2: intake, claims, redelivery, transitions),
/// `replies` (§3-§4 and §14: attempts, settlement, unknown outcomes, reconciliation,
/// reactions), `handoffs` (§9), `rooms` (§10), `tasks` (§11: tasks and admission),
/// `permissions` and `questions` (§15: the permission relay, operator questions),
/// `retention` and `sessions` (§17: retention, and the sessions it prunes).
macro_rules! suite {
    ($backend:ty) => {
        $crate::ledger::conformance::suite!($backend; envelopes, replies, handoffs, rooms, tasks, permissions, questions, retention, sessions);
    };
    ($backend:ty; $($group:ident),+ $(,)?) => {
        $( $crate::ledger::conformance::suite!(@group $group $backend); )+
    };
    (@group envelopes $backend:ty) => {
        mod envelopes {
            use super::*;
            $crate::ledger::conformance::suite!(@tests $backend;
            envelopes::a_batch_handed_over_is_pending_when_committed_with_the_older_queued_envelopes_first,
            envelopes::a_batch_and_its_offset_commit_together_and_replays_are_skipped,
            envelopes::a_pushed_batch_leaves_the_offset_alone_and_a_redelivery_is_skipped,
            envelopes::claims_go_oldest_first_and_redelivery_counts,
            envelopes::transitions_only_from_allowed_states_and_are_audited,
            envelopes::a_reused_update_id_with_new_content_is_stored_and_a_re_poll_is_not,
            envelopes::quotes_find_the_user_message_or_the_answered_envelope_in_the_transaction_that_records_them,
            envelopes::album_items_said_to_nobody_join_their_album_once_an_item_is_addressed,
            );
        }
    };
    (@group replies $backend:ty) => {
        mod replies {
            use super::*;
            $crate::ledger::conformance::suite!(@tests $backend;
            replies::finishing_an_attempt_settles_its_envelope_in_the_same_step,
            replies::in_flight_attempts_become_unknown_at_start_up_and_can_be_reconciled,
            replies::an_outcome_learned_after_recovery_settled_the_attempt_changes_nothing,
            replies::an_outcome_recorded_again_is_the_record_already_made,
            replies::a_reply_cut_off_at_an_unknown_part_found_delivered_goes_back_to_finish,
            replies::an_answered_envelope_stays_answered_when_a_follow_up_is_unknown_and_reconciles_alone,
            replies::an_unknown_attempt_beside_the_answer_is_found_and_settled_in_any_state,
            replies::a_reply_request_is_summed_up_from_its_attempts,
            replies::a_resumed_request_counts_the_parts_it_carried,
            replies::reactions_and_edits_settle_nothing_and_are_no_part_of_a_reply,
            replies::the_bots_messages_are_known_by_their_confirmed_sends,
            replies::reactions_are_owed_to_the_agent_whose_reply_they_are_on_and_stored_once,
            replies::a_batch_of_reactions_is_stored_in_order_and_each_owed_for_itself,
            );
        }
    };
    (@group handoffs $backend:ty) => {
        mod handoffs {
            use super::*;
            $crate::ledger::conformance::suite!(@tests $backend;
            handoffs::a_handoff_ends_once_and_a_second_end_changes_nothing,
            handoffs::answering_a_handoff_settles_the_answers_made_on_its_behalf,
            );
        }
    };
    (@group rooms $backend:ty) => {
        mod rooms {
            use super::*;
            $crate::ledger::conformance::suite!(@tests $backend;
            rooms::a_room_message_becomes_a_waiting_cascade_once_and_leaves_the_inbox_acked,
            rooms::giving_the_floor_queues_a_room_turn_in_the_rooms_chat_and_a_stale_step_changes_nothing,
            rooms::a_steps_times_are_the_callers_clock,
            rooms::one_reply_per_turn_is_claimed_only_while_the_turn_envelope_is_pending,
            rooms::a_reply_cut_off_part_way_keeps_its_turn_for_the_same_words,
            rooms::a_timeout_decided_before_an_ack_changes_nothing,
            rooms::a_post_is_owed_with_its_step_and_made_once,
            );
        }
    };
    (@group tasks $backend:ty) => {
        mod tasks {
            use super::*;
            $crate::ledger::conformance::suite!(@tests $backend;
            tasks::a_correction_recorded_between_resolving_and_sending_refuses_the_attempt,
            tasks::pause_resume_and_cancel_are_revisions_that_close_and_open_admission,
            tasks::a_batch_starts_one_task_per_conversation_at_the_message_that_started_it,
            tasks::a_batch_over_several_conversations_joins_or_starts_each_ones_task,
            tasks::a_paused_task_refuses_a_reaction,
            tasks::a_declaration_repeated_with_its_request_id_is_recorded_once,
            );
            #[test]
            fn no_superseded_reply_is_ever_recorded() {
                $crate::ledger::conformance::tasks::no_superseded_reply_is_ever_recorded::<$backend>();
            }
        }
    };
    (@group permissions $backend:ty) => {
        mod permissions {
            use super::*;
            $crate::ledger::conformance::suite!(@tests $backend;
            permissions::a_request_is_recorded_once_per_plugin_and_the_first_verdict_wins,
            permissions::expiry_comes_with_time_or_with_the_session_and_is_final,
            permissions::expiry_is_decided_on_the_callers_clock,
            permissions::a_sessions_end_expires_only_its_agents_requests_from_the_ended_plugins,
            permissions::a_prompt_not_sent_expires_its_request_and_an_unknown_one_stays_answerable,
            );
        }
    };
    (@group questions $backend:ty) => {
        mod questions {
            use super::*;
            $crate::ledger::conformance::suite!(@tests $backend;
            questions::a_question_is_asked_once_per_unresolved_send_and_answered_once,
            questions::a_question_reconciled_elsewhere_is_settled_and_one_not_posted_is_taken_to_ask_again,
            );
        }
    };
    (@group retention $backend:ty) => {
        mod retention {
            use super::*;
            $crate::ledger::conformance::suite!(@tests $backend;
            retention::a_prune_removes_only_what_finished_before_the_cut_off_and_a_dry_run_deletes_nothing,
            retention::an_unreconciled_follow_up_keeps_its_answered_envelope_until_reconciled,
            retention::a_conversations_last_task_goes_once_answered_before_the_cut_off,
            retention::a_finished_permission_request_or_question_goes_and_one_still_owing_anything_stays,
            retention::a_reaction_on_an_old_answered_message_keeps_it_for_a_full_period,
            retention::a_verdict_written_but_not_handed_stays_until_its_plugin_confirms_it,
            retention::done_reactions_go_but_the_newest_and_their_search_is_a_batch,
            );
        }
    };
    (@group sessions $backend:ty) => {
        mod sessions {
            use super::*;
            $crate::ledger::conformance::suite!(@tests $backend;
            sessions::only_a_closed_session_that_is_not_the_newest_is_pruned,
            sessions::the_newest_session_of_each_agent_names_its_plugin,
            );
        }
    };
    (@tests $backend:ty; $($module:ident :: $rule:ident,)*) => {
        $(
            #[tokio::test]
            async fn $rule() {
                $crate::ledger::conformance::$module::$rule::<$backend>().await;
            }
        )*
    };
}
pub(crate) use suite;
