use std::num::NonZeroU32;

use chrono::{DateTime, Utc};

use crate::ids::{AgentName, RouteName, TraceId};
use crate::ledger::conformance::Backend;
use crate::ledger::*;
use crate::rules::routes::Channel;
use crate::rules::turns::{Cascade, HumanMessage, Next, RoomMember, RoomRoster, TurnEnd};
use crate::telegram::envelope::{ChatType, Envelope, EnvelopeKind, Sender};

pub(crate) const ROOM_CHAT: i64 = -100_777;

pub(crate) fn agent(name: &str) -> AgentName {
    AgentName::parse(name).unwrap()
}

pub(crate) fn roster() -> RoomRoster {
    RoomRoster::new(vec![
        RoomMember::new(agent("builder")).with_display_name("Builder"),
        RoomMember::new(agent("reviewer")),
    ])
    .unwrap()
}

/// A human message in the room, as the poller stores it: the room's, no agent's.
pub(crate) async fn room_message(ledger: &dyn Storage, update_id: i64, text: &str) -> StoredEnvelope {
    let routed = RoutedEnvelope {
        envelope: Envelope {
            trace_id: TraceId::generate(),
            update_id,
            kind: EnvelopeKind::Message,
            channel: Channel { chat_id: ROOM_CHAT, thread_id: Some(7) },
            chat_type: ChatType::Supergroup,
            chat_title: Some("Dev".into()),
            message_id: 40 + update_id as i32,
            sender: Sender { id: Some(9), username: Some("olga".into()), name: "Olga".into() },
            text: Some(text.into()),
            attachments: vec![],
            described: None,
            context: Default::default(),
            sent_at: Utc::now(),
        },
        state: EnvelopeState::Queued,
        route: Some(RouteName::parse("dev-room").unwrap()),
        agent: None,
        update_digest: format!("digest {update_id}"),
        note: None,
        raw_update: None,
    };
    ledger.record_batch(1, update_id + 1, &[routed]).await.unwrap();
    let inbox = ledger.room_inbox().await.unwrap();
    inbox.into_iter().find(|e| e.message_id == 40 + update_id).expect("in the room inbox")
}

pub(crate) fn cascade_for(message: &StoredEnvelope, limit: u32) -> Cascade {
    let human = HumanMessage {
        author: message.user(),
        text: message.content.clone(),
        trace_id: TraceId::parse(&message.trace_id).unwrap(),
    };
    Cascade::start(&roster(), human, NonZeroU32::new(limit).unwrap())
}

pub(crate) async fn recorded(ledger: &dyn Storage, message: &StoredEnvelope) -> StoredCascade {
    let cascade = cascade_for(message, 10);
    let new = NewCascade { message, cascade: &cascade, max_iters: 50, speaker_timeout_secs: 600 };
    let id = ledger.record_cascade(&new, "room message: exchange {cascade}").await.unwrap().unwrap();
    ledger.cascade(&id).await.unwrap().unwrap()
}

/// Gives the floor to the cascade's next speaker; returns the stored cascade after.
pub(crate) async fn open_next(
    ledger: &dyn Storage,
    stored: &StoredCascade,
    message: &StoredEnvelope,
) -> StoredCascade {
    open_next_at(ledger, stored, message, Utc::now()).await
}

/// [`open_next`] on the caller's clock reading `now`.
async fn open_next_at(
    ledger: &dyn Storage,
    stored: &StoredCascade,
    message: &StoredEnvelope,
    now: DateTime<Utc>,
) -> StoredCascade {
    let mut cascade = stored.cascade().unwrap();
    let Next::Speak(turn) = cascade.next_speaker() else { panic!("nobody to speak") };
    let content = cascade.transcript_text(&roster());
    let step = RoomStep {
        cascade: Some(CascadeUpdate {
            id: stored.id,
            decided_on: stored.version,
            cascade: &cascade,
            stop_by: None,
            outcome: None,
        }),
        open: Some(TurnOpen {
            speaker: turn.speaker,
            agent: &turn.agent,
            summoned_by: turn.summoned_by.name(),
            message,
            content: &content,
        }),
        ..RoomStep::default()
    };
    ledger.apply_room_step(&step, now).await.unwrap().expect("the step applies");
    ledger.cascade(&stored.cascade_id).await.unwrap().unwrap()
}

/// A step's times are the caller's clock, the one a speaker's time is judged on, whatever
/// the database's own clock says: a turn opened and ended on a clock a day behind and then
/// a day ahead of the real one reads back those times, not the server's.
pub(crate) async fn a_steps_times_are_the_callers_clock<B: Backend>() {
    let (_keep, ledger) = B::fresh().await;
    let message = room_message(&*ledger, 1, "@builder hi").await;
    let waiting = recorded(&*ledger, &message).await;
    let whole_second = |at: DateTime<Utc>| DateTime::from_timestamp(at.timestamp(), 0).unwrap();
    let behind = whole_second(Utc::now() - chrono::Duration::days(1));
    let running = open_next_at(&*ledger, &waiting, &message, behind).await;
    assert_eq!(running.started_at, Some(behind), "the exchange starts on the caller's clock");
    let turn = ledger.turns_of(running.id).await.unwrap().remove(0);
    assert_eq!(turn.started_at, behind, "the turn starts on the caller's clock");

    let ahead = whole_second(Utc::now() + chrono::Duration::days(1));
    let timeout = RoomStep {
        close: Some(TurnClose { turn: &turn, ending: TurnEnding::TimedOut, timed_out: Some("late") }),
        ..RoomStep::default()
    };
    ledger.apply_room_step(&timeout, ahead).await.unwrap().expect("the step applies");
    let turn = ledger.turns_of(running.id).await.unwrap().remove(0);
    assert_eq!(turn.ended_at, Some(ahead), "the turn ends on the caller's clock");
}

pub(crate) async fn a_room_message_becomes_a_waiting_cascade_once_and_leaves_the_inbox_acked<B: Backend>() {
    let (_keep, ledger) = B::fresh().await;
    let message = room_message(&*ledger, 1, "@builder hi").await;
    assert_eq!((message.state, message.agent.as_deref()), (EnvelopeState::Queued, None));
    let stored = recorded(&*ledger, &message).await;
    assert_eq!(stored.state, RoomCascadeState::Waiting);
    assert_eq!((stored.chat_id, stored.thread_id, stored.message_id), (ROOM_CHAT, Some(7), 41));
    let message = ledger.find(&message.trace_id).await.unwrap().unwrap();
    assert_eq!(message.state, EnvelopeState::Acked);
    assert_eq!(message.note, Some(format!("room message: exchange {}", stored.cascade_id)));
    assert!(ledger.room_inbox().await.unwrap().is_empty());
    assert_eq!(ledger.pending(&agent("builder")).await.unwrap(), vec![], "no agent's work");

    // Taken twice (a pass that raced a restart): the second changes nothing.
    let cascade = cascade_for(&message, 10);
    let again = NewCascade { message: &message, cascade: &cascade, max_iters: 50, speaker_timeout_secs: 600 };
    assert_eq!(ledger.record_cascade(&again, "again").await.unwrap(), None);
    assert_eq!(ledger.list_cascades(Some("dev-room"), 10).await.unwrap().len(), 1);
    assert_eq!(ledger.busy_rooms().await.unwrap(), ["dev-room"]);
}

pub(crate) async fn giving_the_floor_queues_a_room_turn_in_the_rooms_chat_and_a_stale_step_changes_nothing<
    B: Backend,
>() {
    let (_keep, ledger) = B::fresh().await;
    let message = room_message(&*ledger, 1, "@builder hi").await;
    let waiting = recorded(&*ledger, &message).await;
    let running = open_next(&*ledger, &waiting, &message).await;
    assert_eq!(running.state, RoomCascadeState::Running);
    assert!(running.started_at.is_some());
    assert_eq!(ledger.active_cascade("dev-room").await.unwrap().unwrap().id, running.id);

    let turns = ledger.turns_of(running.id).await.unwrap();
    assert_eq!(turns.len(), 1);
    let turn = &turns[0];
    assert_eq!((turn.speaker, turn.agent.as_str(), turn.summoned_by.as_str()), (1, "builder", "@olga"));
    assert_eq!(turn.envelope_state, EnvelopeState::Queued);
    let envelope = ledger.find(&turn.envelope_trace_id).await.unwrap().unwrap();
    assert_eq!(envelope.kind, EnvelopeKind::RoomTurn);
    assert_eq!(envelope.agent.as_deref(), Some("builder"));
    assert_eq!((envelope.chat_id, envelope.thread_id, envelope.message_id), (ROOM_CHAT, Some(7), 41));
    assert_eq!(envelope.content, "@olga: @builder hi");
    assert_eq!(envelope.update_id, None);
    let (found, of) = ledger.turn_of_envelope(envelope.id).await.unwrap().unwrap();
    assert_eq!((found.id, of.id), (turn.id, running.id));

    // A step decided on the waiting state is stale now: refused, nothing written.
    let cascade = waiting.cascade().unwrap();
    let stale = RoomStep {
        cascade: Some(CascadeUpdate {
            id: waiting.id,
            decided_on: waiting.version,
            cascade: &cascade,
            stop_by: Some("someone"),
            outcome: None,
        }),
        ..RoomStep::default()
    };
    assert!(ledger.apply_room_step(&stale, Utc::now()).await.unwrap().is_none());
    assert_eq!(ledger.cascade(&running.cascade_id).await.unwrap().unwrap(), running);
}

pub(crate) async fn one_reply_per_turn_is_claimed_only_while_the_turn_envelope_is_pending<B: Backend>() {
    let (_keep, ledger) = B::fresh().await;
    let message = room_message(&*ledger, 1, "@builder hi").await;
    let waiting = recorded(&*ledger, &message).await;
    let running = open_next(&*ledger, &waiting, &message).await;
    let turn = ledger.turns_of(running.id).await.unwrap().remove(0);

    // Not handed to a session yet.
    let refused = ledger.claim_room_reply(turn.envelope_id, "hi", "req_aaaaaaaa").await.unwrap();
    assert_eq!(refused.unwrap_err(), ClaimRefused::NotPending(EnvelopeState::Queued));
    ledger.claim_next_queued(&agent("builder")).await.unwrap().unwrap();

    let claimed = ledger.claim_room_reply(turn.envelope_id, "hi", "req_aaaaaaaa").await.unwrap().unwrap();
    assert_eq!(claimed.reply_text.as_deref(), Some("hi"));
    let second = ledger.claim_room_reply(turn.envelope_id, "more", "req_bbbbbbbb").await.unwrap();
    assert_eq!(second.unwrap_err(), ClaimRefused::AlreadyReplied { request_id: Some("req_aaaaaaaa".into()) });

    // A pass or a timeout cannot end a turn that has its reply.
    let pass = RoomStep {
        close: Some(TurnClose { turn: &turn, ending: TurnEnding::TimedOut, timed_out: Some("late") }),
        ..RoomStep::default()
    };
    assert!(ledger.apply_room_step(&pass, Utc::now()).await.unwrap().is_none());
    assert_eq!(ledger.find(&turn.envelope_trace_id).await.unwrap().unwrap().state, EnvelopeState::Pending);

    // A post that was refused gives the turn back.
    assert!(ledger.release_room_reply(turn.id).await.unwrap());
    assert!(!ledger.release_room_reply(turn.id).await.unwrap(), "once");
    ledger.claim_room_reply(turn.envelope_id, "again", "req_cccccccc").await.unwrap().unwrap();
    assert!(ledger.release_room_reply(turn.id).await.unwrap());

    // Now the timeout goes through: the turn ends and its envelope is acked by the daemon.
    assert!(ledger.apply_room_step(&pass, Utc::now()).await.unwrap().is_some());
    let envelope = ledger.find(&turn.envelope_trace_id).await.unwrap().unwrap();
    assert_eq!((envelope.state, envelope.note.as_deref()), (EnvelopeState::Acked, Some("late")));
    let ended = ledger.claim_room_reply(turn.envelope_id, "too late", "req_dddddddd").await.unwrap();
    assert_eq!(ended.unwrap_err(), ClaimRefused::Ended(TurnEnding::TimedOut));
    assert!(ledger.apply_room_step(&pass, Utc::now()).await.unwrap().is_none(), "a turn ends once");
}

/// A reply cut off after its first part was posted keeps the turn: the same words resume
/// it, other words are refused, and the claim is not given back.
pub(crate) async fn a_reply_cut_off_part_way_keeps_its_turn_for_the_same_words<B: Backend>() {
    let (_keep, ledger) = B::fresh().await;
    let message = room_message(&*ledger, 1, "@builder hi").await;
    let waiting = recorded(&*ledger, &message).await;
    let running = open_next(&*ledger, &waiting, &message).await;
    let turn = ledger.turns_of(running.id).await.unwrap().remove(0);
    ledger.claim_next_queued(&agent("builder")).await.unwrap().unwrap();
    ledger.claim_room_reply(turn.envelope_id, "long", "req_eeeeeeee").await.unwrap().unwrap();
    let first_part = NewAttempt {
        chunk_count: 2,
        ..crate::ledger::conformance::fixtures::one_part_reply(turn.envelope_id)
    };
    let op_id = ledger.begin_attempt(&first_part).await.unwrap().unwrap();
    ledger.finish_attempt(&op_id, &AttemptOutcome::Sent { message_id: 5 }, "daemon").await.unwrap();
    assert!(!ledger.release_room_reply(turn.id).await.unwrap(), "part of it is in the room");
    let resumed = ledger.claim_room_reply(turn.envelope_id, "long", "req_ffffffff").await.unwrap().unwrap();
    assert_eq!(resumed.reply_request_id.as_deref(), Some("req_eeeeeeee"), "the claim that stands");
    let other = ledger.claim_room_reply(turn.envelope_id, "other words", "req_gggggggg").await.unwrap();
    assert_eq!(other.unwrap_err(), ClaimRefused::AlreadyReplied { request_id: Some("req_eeeeeeee".into()) });
}

pub(crate) async fn a_timeout_decided_before_an_ack_changes_nothing<B: Backend>() {
    let (_keep, ledger) = B::fresh().await;
    let message = room_message(&*ledger, 1, "hi").await;
    let waiting = recorded(&*ledger, &message).await;
    let running = open_next(&*ledger, &waiting, &message).await;
    let turn = ledger.turns_of(running.id).await.unwrap().remove(0);
    ledger.claim_next_queued(&agent("builder")).await.unwrap().unwrap();
    // The speaker acks between the driver's look and its write.
    ledger
        .transition(turn.envelope_id, &[EnvelopeState::Pending], EnvelopeState::Acked, "agent:builder", None)
        .await
        .unwrap();
    let mut cascade = running.cascade().unwrap();
    cascade.end_turn(&roster(), 1, TurnEnd::TimedOut).unwrap();
    let timeout = RoomStep {
        cascade: Some(CascadeUpdate {
            id: running.id,
            decided_on: running.version,
            cascade: &cascade,
            stop_by: None,
            outcome: None,
        }),
        close: Some(TurnClose { turn: &turn, ending: TurnEnding::TimedOut, timed_out: Some("late") }),
        ..RoomStep::default()
    };
    assert!(ledger.apply_room_step(&timeout, Utc::now()).await.unwrap().is_none());
    assert_eq!(ledger.turns_of(running.id).await.unwrap()[0].ending, None);
    assert_eq!(ledger.cascade(&running.cascade_id).await.unwrap().unwrap(), running);
}

pub(crate) async fn a_post_is_owed_with_its_step_and_made_once<B: Backend>() {
    let (_keep, ledger) = B::fresh().await;
    let stop = room_message(&*ledger, 1, "/stop").await;
    let step = RoomStep {
        posts: vec![NewPost {
            key: format!("{}/stop", stop.trace_id),
            answers: &stop,
            text: "Nothing.".into(),
        }],
        settle: Some((&stop, "/stop: nothing was running".into())),
        ..RoomStep::default()
    };
    ledger.apply_room_step(&step, Utc::now()).await.unwrap().unwrap();
    assert!(ledger.apply_room_step(&step, Utc::now()).await.unwrap().is_none(), "the /stop was taken once");
    let owed = ledger.owed_room_posts().await.unwrap();
    assert_eq!(owed.len(), 1);
    let post = &owed[0];
    assert_eq!((post.chat_id, post.thread_id, post.reply_to_message_id), (ROOM_CHAT, Some(7), Some(41)));
    assert!(!ledger.room_post_attempted("switchboard", &post.key).await.unwrap());
    let attempt = crate::ledger::NewAttempt {
        envelope_id: post.envelope_id,
        agent: "switchboard",
        request_id: Some(&post.key),
        purpose: crate::ledger::AttemptPurpose::Audit,
        method: crate::ledger::AttemptMethod::SendMessage,
        target_message_id: None,
        chat_id: post.chat_id,
        thread_id: Some(7),
        reply_to_message_id: Some(41),
        chunk_index: 0,
        chunk_count: 1,
        text: &post.text,
    };
    // Telegram out of reach: the post provably went nowhere, and is still owed.
    let refused = ledger.begin_attempt(&attempt).await.unwrap().unwrap();
    let not_sent = crate::ledger::AttemptOutcome::NotSent { error: "connection refused".into() };
    ledger.finish_attempt(&refused, &not_sent, "switchboard").await.unwrap();
    assert!(
        !ledger.room_post_attempted("switchboard", &post.key).await.unwrap(),
        "a post that provably went nowhere is tried again"
    );
    ledger.begin_attempt(&attempt).await.unwrap().unwrap();
    assert!(
        ledger.room_post_attempted("switchboard", &post.key).await.unwrap(),
        "attempted: never posted again"
    );
    ledger.mark_room_post_made(post.id).await.unwrap();
    assert!(ledger.owed_room_posts().await.unwrap().is_empty());
}
