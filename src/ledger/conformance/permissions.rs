//! Permission requests relayed to approvers (DESIGN §15): recorded once, the first verdict
//! wins, expiry is final, and a prompt's send is classified as an attempt's is.

use chrono::Utc;

use crate::domain::AttemptState;
use crate::ledger::conformance::Backend;
use crate::ledger::conformance::fixtures::permission_request;
use crate::ledger::*;

const LATER: &str = "2999-01-01T00:00:00.000Z";
const PAST: &str = "2000-01-01T00:00:00.000Z";

pub(crate) async fn a_request_is_recorded_once_per_plugin_and_the_first_verdict_wins<B: Backend>() {
    let (_keep, ledger) = B::fresh().await;
    let (row, new) =
        ledger.record_permission_request(&permission_request("prm_1", "plg_a", LATER)).await.unwrap();
    assert!(new);
    assert_eq!((row.state, row.prompt_send), (PermissionState::Pending, AttemptState::InFlight));
    let (again, new) =
        ledger.record_permission_request(&permission_request("prm_2", "plg_a", LATER)).await.unwrap();
    assert!(!new, "the same plugin asking the same request again records nothing");
    assert_eq!(again.id, "prm_1");
    assert_eq!(ledger.permission("prm_2").await.unwrap(), None);
    // Another plugin process asking under the same request id is a request of its own.
    let (other, new) =
        ledger.record_permission_request(&permission_request("prm_3", "plg_b", LATER)).await.unwrap();
    assert!(new);
    assert_eq!(other.id, "prm_3");
    assert_eq!(ledger.list_permissions(10).await.unwrap().len(), 2);

    let first = ledger.answer_permission("prm_1", PermissionVerdict::Allow, 7, "ann").await.unwrap();
    assert!(matches!(&first, AnswerRecorded::Recorded(row) if row.state == PermissionState::Allowed));
    let second = ledger.answer_permission("prm_1", PermissionVerdict::Deny, 8, "bob").await.unwrap();
    assert!(matches!(&second, AnswerRecorded::TooLate(row) if row.state == PermissionState::Allowed));
    let stored = ledger.permission("prm_1").await.unwrap().unwrap();
    assert_eq!((stored.state, stored.answered_by), (PermissionState::Allowed, Some(7)), "the first stands");
    assert_eq!(
        ledger.answer_permission("prm_x", PermissionVerdict::Deny, 7, "ann").await.unwrap(),
        AnswerRecorded::Unknown
    );

    // The verdict is owed to the asking plugin alone, until it confirms it handed it to
    // Claude Code: written to its session stream, it is still owed (the stream may never
    // have brought it).
    let undelivered = ledger.undelivered_verdicts("plg_a").await.unwrap();
    assert_eq!(undelivered.iter().map(|row| row.id.as_str()).collect::<Vec<_>>(), ["prm_1"]);
    assert!(ledger.undelivered_verdicts("plg_b").await.unwrap().is_empty(), "prm_3 is unanswered");
    ledger.verdict_sent("prm_1").await.unwrap();
    let written = ledger.permission("prm_1").await.unwrap().unwrap().verdict_sent_at;
    assert!(written.is_some());
    assert_eq!(ledger.undelivered_verdicts("plg_a").await.unwrap().len(), 1, "written is not handed");
    ledger.verdict_sent("prm_1").await.unwrap();
    assert_eq!(
        ledger.permission("prm_1").await.unwrap().unwrap().verdict_sent_at,
        written,
        "the first write is kept"
    );
    assert!(!ledger.verdict_handed("prm_1", "plg_b").await.unwrap(), "another plugin cannot confirm it");
    assert!(!ledger.verdict_handed("prm_3", "plg_b").await.unwrap(), "an unanswered request has no verdict");
    assert!(ledger.verdict_handed("prm_1", "plg_a").await.unwrap());
    assert!(ledger.undelivered_verdicts("plg_a").await.unwrap().is_empty());
    assert!(ledger.verdict_handed("prm_1", "plg_a").await.unwrap(), "confirming again changes nothing");
    assert!(ledger.permission("prm_1").await.unwrap().unwrap().verdict_handed_at.is_some());
}

/// Whether a request is due is the caller's clock's answer, the clock that set its expiry
/// and times the caller's next look, whatever the database's own clock says: a request an
/// hour away is due when the caller says the hour has passed, and not before.
pub(crate) async fn expiry_is_decided_on_the_callers_clock<B: Backend>() {
    let (_keep, ledger) = B::fresh().await;
    let in_an_hour = Utc::now() + chrono::Duration::hours(1);
    let expires_at = crate::clock::text(in_an_hour);
    ledger.record_permission_request(&permission_request("prm_1", "plg_a", &expires_at)).await.unwrap();
    let before = in_an_hour - chrono::Duration::seconds(1);
    assert!(ledger.expire_due_permissions(before).await.unwrap().is_empty(), "not due a second before");
    let expired = ledger.expire_due_permissions(in_an_hour).await.unwrap();
    assert_eq!(expired.iter().map(|row| row.id.as_str()).collect::<Vec<_>>(), ["prm_1"], "due at its time");
}

pub(crate) async fn expiry_comes_with_time_or_with_the_session_and_is_final<B: Backend>() {
    let (_keep, ledger) = B::fresh().await;
    ledger.record_permission_request(&permission_request("prm_old", "plg_a", PAST)).await.unwrap();
    ledger.record_permission_request(&permission_request("prm_new", "plg_b", LATER)).await.unwrap();
    for (id, message_id) in [("prm_old", 1), ("prm_new", 2)] {
        ledger.finish_prompt_send(id, &AttemptOutcome::Sent { message_id }).await.unwrap();
    }
    assert_eq!(
        ledger.next_permission_expiry().await.unwrap().map(crate::clock::text).as_deref(),
        Some(PAST),
        "the keeper wakes for the earliest pending expiry"
    );
    // Past its expiry, a verdict is too late even before the timer ran.
    let late = ledger.answer_permission("prm_old", PermissionVerdict::Allow, 7, "ann").await.unwrap();
    assert!(matches!(late, AnswerRecorded::TooLate(row) if row.state == PermissionState::Pending));
    let expired = ledger.expire_due_permissions(Utc::now()).await.unwrap();
    assert_eq!(expired.iter().map(|row| row.id.as_str()).collect::<Vec<_>>(), ["prm_old"]);
    assert!(ledger.expire_due_permissions(Utc::now()).await.unwrap().is_empty(), "expired once");
    assert_eq!(
        ledger.next_permission_expiry().await.unwrap().map(crate::clock::text).as_deref(),
        Some(LATER)
    );

    let ended = EndedPlugins::AllBut("plg_b");
    assert_eq!(ledger.expire_permissions_of_ended_session("orchestrator", ended).await.unwrap(), 0);
    let ended = EndedPlugins::This("plg_b");
    assert_eq!(ledger.expire_permissions_of_ended_session("someone_else", ended).await.unwrap(), 0);
    assert_eq!(ledger.expire_permissions_of_ended_session("orchestrator", ended).await.unwrap(), 1);
    assert_eq!(ledger.next_permission_expiry().await.unwrap(), None);
    let after = ledger.answer_permission("prm_new", PermissionVerdict::Allow, 7, "ann").await.unwrap();
    assert!(matches!(after, AnswerRecorded::TooLate(row) if row.state == PermissionState::Expired));

    let mut unsettled: Vec<String> =
        ledger.unsettled_prompts().await.unwrap().into_iter().map(|row| row.id).collect();
    unsettled.sort();
    assert_eq!(unsettled, ["prm_new", "prm_old"], "both prompts still show a pending request");
    ledger.settle_prompt("prm_old").await.unwrap();
    let unsettled: Vec<String> =
        ledger.unsettled_prompts().await.unwrap().into_iter().map(|row| row.id).collect();
    assert_eq!(unsettled, ["prm_new"]);
    ledger.unsettle_prompt("prm_old").await.unwrap();
    let mut unsettled: Vec<String> =
        ledger.unsettled_prompts().await.unwrap().into_iter().map(|row| row.id).collect();
    unsettled.sort();
    assert_eq!(unsettled, ["prm_new", "prm_old"], "prm_old's prompt is to be edited again");
    assert_eq!(ledger.count_permissions_by_state().await.unwrap(), [(PermissionState::Expired, 2)]);
}

/// A session's end expires the requests of that plugin process (or, when a new one
/// connects for the agent, of every other one), and nobody else's.
pub(crate) async fn a_sessions_end_expires_only_its_agents_requests_from_the_ended_plugins<B: Backend>() {
    let (_keep, ledger) = B::fresh().await;
    ledger.record_permission_request(&permission_request("prm_a", "plg_a", LATER)).await.unwrap();
    ledger.record_permission_request(&permission_request("prm_b", "plg_b", LATER)).await.unwrap();
    let mut elsewhere = permission_request("prm_c", "plg_c", LATER);
    elsewhere.agent = "worker";
    ledger.record_permission_request(&elsewhere).await.unwrap();

    let ended = EndedPlugins::AllBut("plg_b");
    assert_eq!(ledger.expire_permissions_of_ended_session("orchestrator", ended).await.unwrap(), 1);
    let state = |id: &'static str| {
        let ledger = ledger.clone();
        async move { ledger.permission(id).await.unwrap().unwrap() }
    };
    let ended_row = state("prm_a").await;
    assert_eq!(ended_row.state, PermissionState::Expired);
    assert_eq!(ended_row.expired_because.as_deref(), Some("session_ended"));
    assert_eq!(state("prm_b").await.state, PermissionState::Pending, "the new session's own");
    assert_eq!(state("prm_c").await.state, PermissionState::Pending, "another agent's");
    // An answered request stays answered when its session ends.
    ledger.answer_permission("prm_b", PermissionVerdict::Deny, 7, "ann").await.unwrap();
    let ended = EndedPlugins::This("plg_b");
    assert_eq!(ledger.expire_permissions_of_ended_session("orchestrator", ended).await.unwrap(), 0);
    assert_eq!(state("prm_b").await.state, PermissionState::Denied);
}

pub(crate) async fn a_prompt_not_sent_expires_its_request_and_an_unknown_one_stays_answerable<B: Backend>() {
    let (_keep, ledger) = B::fresh().await;
    ledger.record_permission_request(&permission_request("prm_1", "plg_a", LATER)).await.unwrap();
    let error = AttemptOutcome::NotSent { error: "Telegram refused it".into() };
    let row = ledger.finish_prompt_send("prm_1", &error).await.unwrap();
    assert_eq!((row.state, row.prompt_send), (PermissionState::Expired, AttemptState::NotSent));
    assert_eq!(row.expired_because.as_deref(), Some("prompt_not_sent"));
    assert!(row.prompt_settled, "there is no prompt to edit");

    let mut other = permission_request("prm_2", "plg_a", LATER);
    other.request_id = "fghij";
    ledger.record_permission_request(&other).await.unwrap();
    assert!(ledger.unsettled_prompts().await.unwrap().is_empty(), "prm_2's send is in flight");
    assert_eq!(ledger.recover_prompt_sends().await.unwrap(), 1);
    assert_eq!(ledger.recover_prompt_sends().await.unwrap(), 0, "recovered once");
    let row = ledger.permission("prm_2").await.unwrap().unwrap();
    assert_eq!((row.state, row.prompt_send), (PermissionState::Pending, AttemptState::Unknown));
    assert_eq!(row.prompt_message_id, None);

    // A text verdict finds it by Claude Code's id, in the chat its prompt went to.
    let named = ledger.pending_permissions_named("fghij", 42).await.unwrap();
    assert_eq!(named.iter().map(|row| row.id.as_str()).collect::<Vec<_>>(), ["prm_2"]);
    assert!(ledger.pending_permissions_named("fghij", 43).await.unwrap().is_empty(), "another chat");
    assert!(ledger.pending_permissions_named("abcde", 42).await.unwrap().is_empty(), "prm_1 expired");

    // A press proves where the unknown prompt was posted; once answered, it is to be edited.
    ledger.note_prompt_message("prm_2", 55).await.unwrap();
    ledger.note_prompt_message("prm_2", 66).await.unwrap();
    assert_eq!(
        ledger.permission("prm_2").await.unwrap().unwrap().prompt_message_id,
        Some(55),
        "the first proof"
    );
    let answered = ledger.answer_permission("prm_2", PermissionVerdict::Allow, 7, "ann").await.unwrap();
    assert!(matches!(answered, AnswerRecorded::Recorded(_)));
    let unsettled = ledger.unsettled_prompts().await.unwrap();
    assert_eq!(
        unsettled.iter().map(|row| (row.id.as_str(), row.prompt_message_id)).collect::<Vec<_>>(),
        [("prm_2", Some(55))]
    );
}
