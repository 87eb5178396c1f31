//! What the demo shows, in order. Each step acts like a user or an agent would, narrates
//! what the daemon did with trace ids and ledger states, and checks every claim against
//! the ledger and the fake Telegram.

use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::cast::{
    DEV_ROOM_ID, DEV_ROOM_TITLE, OLGA_USERNAME, OPS_GROUP_ID, OWNER_DM_ID, dev_room, olga, ops_group,
    owner_dm, priya,
};
use super::narrate::{self, Broken, check, gist, more, said};
use super::{BUILDER, Demo, REVIEWER, ROOM_CASCADE_LIMIT, ROOM_ROUTE, WAIT, WORKER, must};
use crate::agents::api::client::{ClientError, DaemonClient, SessionStream};
use crate::agents::api::wire::{AckRequest, ErrorCode, HandoffRequest, ReplyRequest, SessionEvent};
use crate::fake_bot_api::{Fault, PushedMessage, SentMessage};
use crate::ids::{CascadeId, RequestId, TraceId};
use crate::ledger::{
    AttemptState, EnvelopeState, HandoffState, LedgerError, ListFilter, RoomCascadeState, StoredAttempt,
    StoredEnvelope, TurnEnding,
};

/// Messages of the crash step: enough that some are answered, one is on the wire, some
/// wait in the ledger and some in Telegram when the daemon dies.
const STREAM: usize = 8;
/// Of which this many are pushed before the kill is prepared, the rest right before it.
const STREAM_FIRST: usize = 5;
/// Replies Telegram answers in the crash step before it holds one on the wire.
const ANSWERED_BEFORE_THE_KILL: usize = 2;
/// The demo's ledger holds a few dozen envelopes: a listing this long holds them all.
const LIST_LIMIT: i64 = 10_000;
/// What Olga asks in the room.
const ROOM_ASK: &str = "@builder add input validation to the signup form";
/// The room's replies, turn by turn: the builder speaks first (Olga mentioned it), then
/// each reply mentions the other agent, so the exchange would ping-pong for ever; the
/// room's ceiling ends it with the builder still asked for.
const ROOM_REPLIES: [&str; ROOM_CASCADE_LIMIT as usize] = [
    "Validation is in: email and name are checked. @reviewer check the edge cases",
    "An empty email still passes, and so does a 300-character name. @builder fix them",
    "Fixed: empty emails are refused, names stop at 100 characters. @reviewer check the edge cases",
    "Names with accents are refused now (José fails). @builder fix them",
];

pub(super) async fn all(demo: &mut Demo) -> anyhow::Result<()> {
    ready(demo).await?;
    message_in_reply_out(demo).await?;
    two_chats_waiting(demo).await?;
    delegation(demo).await?;
    room_exchange(demo).await?;
    correction(demo).await?;
    crash_and_restart(demo).await?;
    ledger_stats(demo).await?;
    Ok(())
}

impl Demo {
    async fn envelope(&self, trace_id: &str) -> Result<StoredEnvelope, Broken> {
        let trace_id = TraceId::parse(trace_id).map_err(Broken)?;
        self.ledger
            .find(&trace_id)
            .await
            .map_err(|e| Broken(format!("reading the ledger: {e}")))?
            .ok_or_else(|| Broken(format!("the ledger has no envelope {trace_id}")))
    }

    async fn attempts(&self, envelope: &StoredEnvelope) -> Result<Vec<StoredAttempt>, Broken> {
        self.ledger.attempts_for(envelope.id).await.map_err(|e| Broken(format!("reading the ledger: {e}")))
    }

    /// Every envelope recorded for one of `updates`, by update id.
    async fn envelopes_of(
        &self,
        updates: &[PushedMessage],
    ) -> Result<BTreeMap<i64, Vec<StoredEnvelope>>, Broken> {
        let ids: BTreeSet<i64> = updates.iter().map(|pushed| pushed.update_id).collect();
        let all = self
            .ledger
            .list(&ListFilter { limit: LIST_LIMIT, ..ListFilter::default() })
            .await
            .map_err(|e| Broken(format!("reading the ledger: {e}")))?;
        let mut by_update: BTreeMap<i64, Vec<StoredEnvelope>> = BTreeMap::new();
        for envelope in all {
            if let Some(update_id) = envelope.update_id.filter(|id| ids.contains(id)) {
                by_update.entry(update_id).or_default().push(envelope);
            }
        }
        Ok(by_update)
    }

    /// The orchestrator answers `trace_id` with `text` (narrated), and what reached the chat.
    async fn orchestrator_replies(&self, text: &str, trace_id: &str) -> Result<Vec<SentMessage>, Broken> {
        said("orchestrator", format!("reply \"{text}\" (trace_id {trace_id})"));
        let request = ReplyRequest::new(text, Some(trace_id.to_owned()));
        let receipt = must("reply", self.orchestrator.client.reply(&request).await)?;
        let sent = sent_as(&self.fake.sent_messages(), &receipt.message_ids);
        for message in &sent {
            said("Telegram", describe_sent(message));
        }
        Ok(sent)
    }

    fn http(&self) -> Result<reqwest::Client, Broken> {
        reqwest::Client::builder().no_proxy().timeout(WAIT).build().map_err(|e| Broken(e.to_string()))
    }

    async fn get(&self, path: &str) -> Result<(u16, String), Broken> {
        let response = self
            .http()?
            .get(format!("http://{}{path}", self.api))
            .send()
            .await
            .map_err(|e| Broken(format!("GET {path}: {e}")))?;
        let status = response.status().as_u16();
        Ok((status, response.text().await.map_err(|e| Broken(format!("GET {path}: {e}")))?))
    }

    /// `switchboard ledger --config FILE ARGS…`, the operator's command, on the demo's ledger.
    fn ledger_command(&self, args: &[&str]) -> Result<String, Broken> {
        let exe = std::env::current_exe().map_err(|e| Broken(e.to_string()))?;
        let mut command = std::process::Command::new(exe);
        for name in crate::config::environment_overrides() {
            command.env_remove(name);
        }
        let output = command
            .arg("ledger")
            .arg("--config")
            .arg(&self.config)
            .args(args)
            .output()
            .map_err(|e| Broken(format!("running switchboard ledger: {e}")))?;
        let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
        if !output.status.success() {
            let stderr = String::from_utf8_lossy(&output.stderr);
            return Err(Broken(format!("`switchboard ledger {}` failed: {stderr}", args.join(" "))));
        }
        Ok(stdout)
    }
}

async fn ready(demo: &Demo) -> Result<(), Broken> {
    let (status, body) = demo.get("/readyz").await?;
    said("health", format!("GET /readyz → {status}"));
    check(status == 200, "the daemon is ready (ledger writable, Telegram polled)", || body)
}

async fn message_in_reply_out(demo: &mut Demo) -> Result<(), Broken> {
    narrate::step("1", "A message in, a reply out");
    demo.orchestrator.connect().await?;
    said("orchestrator", "connects its session, as `switchboard channel --agent orchestrator` does");
    let text = "Is the staging deploy healthy?";
    let pushed = demo.fake.push_text_message(owner_dm(), olga(), text);
    said("Telegram", format!("@olga in her chat with the bot: \"{text}\" (update {})", pushed.update_id));
    let delivered = demo.orchestrator.next().await?;
    let trace = delivered.trace_id.clone();
    let envelope = demo.envelope(&trace).await?;
    said(
        "ledger",
        format!(
            "{trace} {} on route {}, handed to the orchestrator's session",
            envelope.state, delivered.route
        ),
    );
    check(
        envelope.update_id == Some(pushed.update_id)
            && envelope.state == EnvelopeState::Pending
            && delivered.content == text,
        "the update is one envelope, pending with the orchestrator, its text intact",
        || format!("{envelope:?}"),
    )?;
    let answer = "Yes: all 12 checks are green.";
    let sent = demo.orchestrator_replies(answer, &trace).await?;
    let envelope = demo.envelope(&trace).await?;
    let attempts = demo.attempts(&envelope).await?;
    for attempt in &attempts {
        said("ledger", format!("{trace} {}; attempt {} {}", envelope.state, attempt.op_id, attempt.outcome));
    }
    check(
        envelope.state == EnvelopeState::Acked
            && attempts.len() == 1
            && attempts[0].outcome == AttemptState::Sent
            && sent.len() == 1
            && sent[0].chat_id == OWNER_DM_ID
            && sent[0].reply_to_message_id == Some(pushed.message_id)
            && sent[0].text == answer,
        "acked on proof: one attempt, sent, and the chat has the answer threaded to the question",
        || format!("{envelope:?} {attempts:?} {sent:?}"),
    )
}

async fn two_chats_waiting(demo: &mut Demo) -> Result<(), Broken> {
    narrate::step("2", "Two chats waiting: an unnamed reply is refused, then each is answered by name");
    let olga_text = "Can you send me the incident summary?";
    let priya_text = "Who is on call tonight?";
    let from_olga = demo.fake.push_text_message(owner_dm(), olga(), olga_text);
    said("Telegram", format!("@olga in her chat: \"{olga_text}\""));
    let from_priya = demo.fake.push_text_message(ops_group(), priya(), priya_text);
    said("Telegram", format!("@priya in \"Ops team\": \"{priya_text}\""));
    let first = demo.orchestrator.next().await?;
    let second = demo.orchestrator.next().await?;
    let (olga, priya) = if first.content == olga_text { (first, second) } else { (second, first) };
    for envelope in [&olga, &priya] {
        let stored = demo.envelope(&envelope.trace_id).await?;
        said(
            "ledger",
            format!("{} {} ({} on route {})", envelope.trace_id, stored.state, envelope.user, envelope.route),
        );
    }
    let sent_before = demo.fake.sent_messages().len();
    said("orchestrator", "reply \"On it.\" without naming an envelope");
    let refusal = match demo.orchestrator.client.reply(&ReplyRequest::new("On it.", None)).await {
        Err(ClientError::Refused { error, .. }) => error,
        other => return Err(Broken(format!("an unnamed reply with two waiting was not refused: {other:?}"))),
    };
    said("switchboard", format!("refused, {}: {}", code_name(refusal.code), gist(&refusal.message, 90)));
    for candidate in &refusal.candidates {
        more(format!(
            "candidate {} in chat {} from {}: \"{}\"",
            candidate.trace_id, candidate.chat_id, candidate.user, candidate.preview
        ));
    }
    let named: BTreeSet<&str> = refusal.candidates.iter().map(|c| c.trace_id.as_str()).collect();
    let states = [demo.envelope(&olga.trace_id).await?.state, demo.envelope(&priya.trace_id).await?.state];
    check(
        refusal.code == ErrorCode::Ambiguous
            && named == BTreeSet::from([olga.trace_id.as_str(), priya.trace_id.as_str()])
            && refusal.candidates_total == 2,
        "refused as ambiguous, listing exactly the two waiting envelopes",
        || format!("{refusal:?}"),
    )?;
    check(
        demo.fake.sent_messages().len() == sent_before && states == [EnvelopeState::Pending; 2],
        "nothing was sent and both stay pending",
        || format!("{} new message(s), states {states:?}", demo.fake.sent_messages().len() - sent_before),
    )?;
    let answers = [
        (&olga, from_olga, OWNER_DM_ID, "The incident summary: a bad cache key; fixed at 14:05."),
        (&priya, from_priya, OPS_GROUP_ID, "Sam is on call tonight."),
    ];
    for (envelope, pushed, chat, text) in answers {
        let sent = demo.orchestrator_replies(text, &envelope.trace_id).await?;
        let stored = demo.envelope(&envelope.trace_id).await?;
        said("ledger", format!("{} {}", envelope.trace_id, stored.state));
        check(
            stored.state == EnvelopeState::Acked
                && sent.len() == 1
                && sent[0].chat_id == chat
                && sent[0].reply_to_message_id == Some(pushed.message_id),
            "answered in its own chat, threaded to its own message, and acked",
            || format!("{stored:?} {sent:?}"),
        )?;
    }
    Ok(())
}

async fn delegation(demo: &mut Demo) -> Result<(), Broken> {
    narrate::step("3", "A delegation refused by the guard, and a follow-up accepted");
    demo.worker.connect().await?;
    said("worker", "connects its session");
    let ask = "Please ship the login fix to staging.";
    let pushed = demo.fake.push_text_message(owner_dm(), olga(), ask);
    said("Telegram", format!("@olga: \"{ask}\""));
    let cause = demo.orchestrator.next().await?;
    said("ledger", format!("{} pending with the orchestrator: its turn", cause.trace_id));
    let cause_row = demo.envelope(&cause.trace_id).await?;
    let handoff = |text: &str, followup: bool| HandoffRequest {
        to: WORKER.to_owned(),
        text: text.to_owned(),
        trace_id: Some(cause.trace_id.clone()),
        followup: followup.then_some(json!(true)),
        intent: followup.then(|| "replaces".to_owned()),
        request_id: RequestId::generate().to_string(),
    };
    let first_text = "Deploy build 512 (the login fix) to staging.";
    said("orchestrator", format!("send_to_agent worker: \"{first_text}\""));
    let first = must("handoff", demo.orchestrator.client.handoff(&handoff(first_text, false)).await)?;
    said(
        "ledger",
        format!("handoff {} open, depth {}, on behalf of {}", first.handoff_id, first.depth, cause.trace_id),
    );

    let second_text = "Deploy build 513 to staging instead: 512 has a bad migration.";
    said("orchestrator", format!("send_to_agent worker again, unmarked: \"{second_text}\""));
    let refusal = match demo.orchestrator.client.handoff(&handoff(second_text, false)).await {
        Err(ClientError::Refused { error, .. }) => error,
        other => return Err(Broken(format!("a second unmarked instruction was not refused: {other:?}"))),
    };
    said("switchboard", format!("refused: {}", gist(&refusal.message, 110)));
    let recorded = demo.ledger.handoffs_for_cause(cause_row.id).await.map_err(|e| Broken(e.to_string()))?;
    check(
        refusal.code == ErrorCode::AlreadyDelegated && recorded.len() == 1,
        "refused with already_delegated, and nothing recorded: the first instruction stands",
        || format!("{refusal:?}; {} handoff(s) recorded", recorded.len()),
    )?;

    said("orchestrator", "sends it again with followup: true, intent: \"replaces\"");
    let second = must("follow-up", demo.orchestrator.client.handoff(&handoff(second_text, true)).await)?;
    said(
        "ledger",
        format!(
            "handoff {} open, a follow-up of {}",
            second.handoff_id,
            second.followup_of.as_deref().unwrap_or("-")
        ),
    );
    check(
        second.followup_of.as_deref() == Some(first.handoff_id.as_str()),
        "the follow-up is accepted and marked as following the first",
        || format!("{second:?}"),
    )?;

    let mut instructions = BTreeMap::new();
    for _ in 0..2 {
        let envelope = demo.worker.next().await?;
        let handoff_id = envelope.extra.get("handoff_id").cloned().unwrap_or_default();
        let marks = match (envelope.extra.get("followup_of"), envelope.extra.get("intent")) {
            (Some(of), Some(intent)) => format!(", followup_of {of}, intent {intent}"),
            _ => String::new(),
        };
        said(
            "worker",
            format!(
                "receives {} (kind {}, {handoff_id}{marks}): \"{}\"",
                envelope.trace_id, envelope.kind, envelope.content
            ),
        );
        instructions.insert(handoff_id, envelope);
    }
    let (Some(replaced), Some(current)) =
        (instructions.get(&first.handoff_id), instructions.get(&second.handoff_id))
    else {
        return Err(Broken(format!("the worker did not receive both handoffs: {:?}", instructions.keys())));
    };
    check(
        current.extra.get("followup_of") == Some(&first.handoff_id)
            && current.extra.get("intent").map(String::as_str) == Some("replaces"),
        "the worker sees the follow-up marked as one",
        || format!("{:?}", current.extra),
    )?;
    said("worker", format!("acks {} (\"replaced by the follow-up\")", replaced.trace_id));
    must(
        "ack",
        demo.worker
            .client
            .ack(&AckRequest {
                trace_id: replaced.trace_id.clone(),
                note: Some("replaced by the follow-up".into()),
            })
            .await,
    )?;
    let answer = "Build 513 is live on staging.";
    said("worker", format!("reply \"{answer}\" (trace_id {})", current.trace_id));
    let receipt = must(
        "reply",
        demo.worker.client.reply(&ReplyRequest::new(answer, Some(current.trace_id.clone()))).await,
    )?;
    check(
        receipt.answered_handoff.as_ref().is_some_and(|h| h.handoff_id == second.handoff_id)
            && receipt.message_ids.is_empty(),
        "the answer goes to the orchestrator, not to Telegram",
        || format!("{receipt:?}"),
    )?;
    for _ in 0..2 {
        let envelope = demo.orchestrator.next().await?;
        let closed = envelope.extra.get("closed").is_some_and(|c| c == "true");
        said(
            "orchestrator",
            format!(
                "receives {} (kind {}, {}{}): \"{}\"",
                envelope.trace_id,
                envelope.kind,
                envelope.extra.get("handoff_id").map_or("-", String::as_str),
                if closed { ", closed" } else { "" },
                gist(&envelope.content, 70)
            ),
        );
    }
    let text = "The login fix (build 513) is live on staging.";
    let sent = demo.orchestrator_replies(text, &cause.trace_id).await?;
    let handoffs = demo.ledger.handoffs_for_cause(cause_row.id).await.map_err(|e| Broken(e.to_string()))?;
    for handoff in &handoffs {
        said("ledger", format!("handoff {} {}", handoff.handoff_id, handoff.state));
    }
    let cause_now = demo.envelope(&cause.trace_id).await?;
    let answer_ids: Vec<i64> = handoffs.iter().filter_map(|handoff| handoff.answer_envelope_id).collect();
    let answers: Vec<EnvelopeState> = demo
        .ledger
        .list(&ListFilter { limit: LIST_LIMIT, ..ListFilter::default() })
        .await
        .map_err(|e| Broken(e.to_string()))?
        .into_iter()
        .filter(|envelope| answer_ids.contains(&envelope.id))
        .map(|envelope| envelope.state)
        .collect();
    let answer_states: Vec<&str> = answers.iter().map(|state| state.as_str()).collect();
    said(
        "ledger",
        format!(
            "{} {}; the answers made for it: {}",
            cause.trace_id,
            cause_now.state,
            answer_states.join(", ")
        ),
    );
    let states: Vec<HandoffState> = handoffs.iter().map(|h| h.state).collect();
    check(
        states == [HandoffState::Closed, HandoffState::Answered]
            && cause_now.state == EnvelopeState::Acked
            && answers.len() == 2
            && answers.iter().all(|state| *state == EnvelopeState::Acked)
            && sent.len() == 1
            && sent[0].reply_to_message_id == Some(pushed.message_id),
        "the first handoff is closed, the follow-up answered, and one reply to Olga settles her message and both answers",
        || format!("{states:?}, {cause_now:?}, {answers:?}, {sent:?}"),
    )
}

/// DESIGN.md §10: Olga asks the builder in a room; builder and reviewer pull each other in
/// by @mention until the room's `cascade_limit` is used, and the room is told so.
async fn room_exchange(demo: &mut Demo) -> Result<(), Broken> {
    narrate::step("4", "A room exchange that runs out of budget");
    let room_title = DEV_ROOM_TITLE;
    said(
        "room",
        format!(
            "\"{room_title}\" is route {ROOM_ROUTE}: {} (\"{}\") and {} (\"{}\"), cascade_limit {ROOM_CASCADE_LIMIT}",
            BUILDER.0, BUILDER.1, REVIEWER.0, REVIEWER.1
        ),
    );
    demo.builder.connect().await?;
    demo.reviewer.connect().await?;
    said("agents", "builder and reviewer connect their sessions");
    let owner = format!("@{}", OLGA_USERNAME);
    let pushed = demo.fake.push_text_message(dev_room(), olga(), ROOM_ASK);
    said("Telegram", format!("{owner} in \"{room_title}\": \"{ROOM_ASK}\" (message {})", pushed.message_id));

    // Each turn as it comes: the speaker the mentions call, answering its room_turn.
    let mut cascade_id = String::new();
    let mut given = Vec::new();
    for (n, text) in ROOM_REPLIES.into_iter().enumerate() {
        let speaker = n + 1;
        let ((agent, display), summoned_by) = match n {
            0 => ((&mut demo.builder, BUILDER.1), owner.as_str()),
            _ if n % 2 == 0 => ((&mut demo.builder, BUILDER.1), REVIEWER.0),
            _ => ((&mut demo.reviewer, REVIEWER.1), BUILDER.0),
        };
        let turn = agent.next().await?;
        let meta = |key: &str| turn.extra.get(key).cloned().unwrap_or_default();
        if n == 0 {
            cascade_id = meta("cascade_id");
            let Ok(id) = CascadeId::parse(&cascade_id) else {
                return Err(Broken(format!("the turn names no exchange: {cascade_id:?}")));
            };
            let state = match demo.ledger.cascade(&id).await {
                Ok(Some(stored)) => stored.state.to_string(),
                Ok(None) => "missing".to_owned(),
                Err(e) => return Err(Broken(format!("reading the ledger: {e}"))),
            };
            said("ledger", format!("the message starts exchange {cascade_id}, {state}"));
        }
        said(
            agent.name,
            format!(
                "speaker {} of {}: receives {} {}, summoned by {}",
                meta("speaker"),
                meta("cascade_limit"),
                turn.kind,
                turn.trace_id,
                meta("summoned_by")
            ),
        );
        said(agent.name, format!("reply \"{text}\" (trace_id {})", turn.trace_id));
        let receipt =
            must("reply", agent.client.reply(&ReplyRequest::new(text, Some(turn.trace_id.clone()))).await)?;
        let sent = sent_as(&demo.fake.sent_messages(), &receipt.message_ids);
        for message in &sent {
            said("Telegram", describe_sent(message));
            more(format!("the room reads \"{}\"", message.text));
        }
        let posted = format!("{display}: {text}");
        check(
            turn.kind == "room_turn"
                && meta("speaker") == speaker.to_string()
                && meta("cascade_limit") == ROOM_CASCADE_LIMIT.to_string()
                && meta("cascade_id") == cascade_id
                && meta("summoned_by") == summoned_by
                && receipt.room_turn.as_ref().is_some_and(|room| room.posted_as == display)
                && sent.len() == 1
                && sent[0].chat_id == DEV_ROOM_ID
                && sent[0].reply_to_message_id == Some(pushed.message_id)
                && sent[0].text == posted,
            &format!(
                "turn {speaker}: the floor as the mentions said, the reply posted as {display}, threaded to {owner}'s message"
            ),
            || format!("{turn:?} {receipt:?} {sent:?}"),
        )?;
        given.push((agent.name, turn.trace_id, posted));
    }

    // The last reply asked for the builder: no turn is left, so the exchange ends and says so.
    let report = demo
        .fake
        .wait_for_sent_matching(WAIT, |m| m.chat_id == DEV_ROOM_ID && m.text.starts_with("Budget exhausted"))
        .await
        .ok_or_else(|| Broken(format!("the room got no \"Budget exhausted\" post within {WAIT:?}")))?;
    let reply_to =
        report.reply_to_message_id.map(|id| format!(", replying to message {id}")).unwrap_or_default();
    said("Telegram", format!("the bot posts in the room{reply_to} → message {}:", report.message_id));
    for line in report.text.lines() {
        more(line);
    }
    let read = |e: LedgerError| Broken(format!("reading the ledger: {e}"));
    let stored = demo
        .ledger
        .cascade(&CascadeId::parse(&cascade_id).map_err(Broken)?)
        .await
        .map_err(read)?
        .ok_or_else(|| Broken(format!("the ledger has no exchange {cascade_id}")))?;
    let turns = demo.ledger.turns_of(stored.id).await.map_err(read)?;
    let speakers: Vec<&str> = turns.iter().map(|turn| turn.agent.as_str()).collect();
    said(
        "ledger",
        format!("{cascade_id} {}: {} turns given, [{}]", stored.state, turns.len(), speakers.join(" → ")),
    );
    let expected: Vec<(&str, &str)> =
        given.iter().map(|(agent, trace, _)| (*agent, trace.as_str())).collect();
    let recorded: Vec<(&str, &str)> =
        turns.iter().map(|turn| (turn.agent.as_str(), turn.envelope_trace_id.as_str())).collect();
    check(
        stored.state == RoomCascadeState::BudgetExhausted
            && recorded == expected
            && turns.iter().all(|turn| turn.ending == Some(TurnEnding::Replied)),
        &format!(
            "exactly {ROOM_CASCADE_LIMIT} turns were given, each ended by its reply, and the exchange is budget_exhausted"
        ),
        || format!("{} {recorded:?} {turns:?}", stored.state),
    )?;
    let in_room: Vec<SentMessage> =
        demo.fake.sent_messages().into_iter().filter(|m| m.chat_id == DEV_ROOM_ID).collect();
    let twice: Vec<&str> = given
        .iter()
        .map(|(_, _, posted)| posted.as_str())
        .filter(|posted| in_room.iter().filter(|m| m.text == *posted).count() != 1)
        .collect();
    check(
        twice.is_empty() && in_room.len() == ROOM_REPLIES.len() + 1,
        "the room shows each reply once and the ceiling's post once, nothing else",
        || format!("not exactly once: {twice:?}; in the room: {in_room:?}"),
    )?;
    check(
        report.reply_to_message_id == Some(pushed.message_id)
            && report.text.starts_with(&format!(
                "Budget exhausted: {ROOM_CASCADE_LIMIT} of {ROOM_CASCADE_LIMIT} agent turns used"
            ))
            && given.iter().all(|(_, trace, _)| report.text.contains(trace.as_str()))
            && report.text.ends_with(&format!("Over to you, {owner}."))
            && stored.outcome_text.as_deref() == Some(report.text.as_str()),
        &format!(
            "the room is told the budget is exhausted, with each reply's trace id, and {owner} is the next owner; the ledger records the same text"
        ),
        || format!("{report:?}; the ledger's outcome: {:?}", stored.outcome_text),
    )?;
    said("operator", format!("switchboard ledger cascades --room {ROOM_ROUTE}"));
    for line in demo.ledger_command(&["cascades", "--room", ROOM_ROUTE])?.lines() {
        more(line);
    }
    Ok(())
}

/// DESIGN.md §11: Olga corrects her instruction while the agent's reply is being written;
/// the reply made for the old instruction is refused, the one for the revision goes out.
async fn correction(demo: &mut Demo) -> Result<(), Broken> {
    narrate::step("5", "A correction that refuses a superseded reply");
    let ask = "Book the meeting room for Monday.";
    let pushed = demo.fake.push_text_message(owner_dm(), olga(), ask);
    said("Telegram", format!("@olga: \"{ask}\""));
    let first = demo.orchestrator.next().await?;
    let task = first.extra.get("task").cloned().unwrap_or_default();
    said("ledger", format!("{} pending with the orchestrator: {task} revision 1", first.trace_id));

    let fixed = "Book the meeting room for Friday.";
    demo.fake.push_edited_text(owner_dm(), olga(), pushed.message_id, fixed);
    said("Telegram", format!("@olga edits her message: \"{fixed}\""));
    let revision = demo.orchestrator.next().await?;
    said(
        "orchestrator",
        format!(
            "← kind={} {} change={} revision={}",
            revision.kind,
            revision.trace_id,
            revision.extra.get("change").map_or("-", String::as_str),
            revision.extra.get("revision").map_or("-", String::as_str)
        ),
    );
    let acknowledged =
        demo.fake.wait_for_sent_matching(WAIT, |sent| sent.text.contains("correction accepted")).await;
    if let Some(sent) = &acknowledged {
        said("Telegram", describe_sent(sent));
    }
    let original = demo.envelope(&first.trace_id).await?;
    check(
        revision.kind == "revision"
            && revision.extra.get("old_text").map(String::as_str) == Some(ask)
            && revision.extra.get("text").map(String::as_str) == Some(fixed)
            && original.state == EnvelopeState::Superseded
            && acknowledged.is_some(),
        "the edit is revision 2: the agent gets the new and the old text, the old envelope is superseded, and the bot says so",
        || format!("{revision:?}; {original:?}; {acknowledged:?}"),
    )?;

    let late = "Booked for Monday.";
    said(
        "orchestrator",
        format!("reply \"{late}\" (trace_id {}), written before it saw the edit", first.trace_id),
    );
    let refusal =
        match demo.orchestrator.client.reply(&ReplyRequest::new(late, Some(first.trace_id.clone()))).await {
            Err(ClientError::Refused { error, .. }) => error,
            other => return Err(Broken(format!("the superseded reply was not refused: {other:?}"))),
        };
    said("switchboard", format!("refused: {}", gist(&refusal.message, 110)));
    let attempts = demo.attempts(&original).await?;
    check(
        refusal.code == ErrorCode::Superseded
            && refusal.message.contains(&revision.trace_id)
            && attempts.is_empty()
            && !demo.fake.sent_messages().iter().any(|sent| sent.text == late),
        "refused with superseded, naming the envelope to act on; nothing attempted, nothing sent",
        || format!("{refusal:?}; {attempts:?}"),
    )?;

    let answer = "Booked for Friday, 10:00 in room 2.";
    let sent = demo.orchestrator_replies(answer, &revision.trace_id).await?;
    check(sent.len() == 1 && sent[0].text == answer, "the reply to the revision goes out", || {
        format!("{sent:?}")
    })?;
    said("operator", format!("switchboard ledger task {task}"));
    for line in demo.ledger_command(&["task", &task])?.lines() {
        more(line);
    }
    Ok(())
}

async fn crash_and_restart(demo: &mut Demo) -> Result<(), Broken> {
    narrate::step("6", "kill -9 mid-stream, and a restart that loses and duplicates nothing");
    said("demo", format!("the orchestrator answers each of {STREAM} messages as it comes;"));
    more(format!(
        "Telegram takes reply {} but never answers it: it is on the wire when the daemon dies",
        ANSWERED_BEFORE_THE_KILL + 1
    ));
    let sent_before = demo.fake.sent_messages().len();
    for _ in 0..ANSWERED_BEFORE_THE_KILL {
        demo.fake.fail_send_message(Fault::Pass);
    }
    // Recorded as sent (it reaches the chat) and never answered: the daemon cannot know it arrived.
    demo.fake.fail_send_message(Fault::RecordThenHang(Duration::MAX));
    let stream =
        demo.orchestrator.stream.take().ok_or_else(|| Broken("the orchestrator has no session".into()))?;
    let answering = tokio::spawn(answer_as_they_come(demo.orchestrator.client.clone(), stream, None));
    let mut pushed = Vec::new();
    for n in 1..=STREAM_FIRST {
        pushed.push(demo.fake.push_text_message(owner_dm(), olga(), &format!("Status check {n}/{STREAM}")));
    }
    said("Telegram", format!("@olga sends \"Status check 1/{STREAM}\" … \"{STREAM_FIRST}/{STREAM}\""));
    let held = demo
        .fake
        .wait_for_held_send(WAIT)
        .await
        .ok_or_else(|| Broken("no reply reached Telegram's hold".into()))?
        .message_id;
    for n in STREAM_FIRST + 1..=STREAM {
        pushed.push(demo.fake.push_text_message(owner_dm(), olga(), &format!("Status check {n}/{STREAM}")));
    }
    let pid = demo.daemon.kill9().map_err(|e| Broken(e.to_string()))?;
    said(
        "demo",
        format!(
            "kill -9 {pid}: reply message {held} is on the wire, \"{}/{STREAM}\" … \"{STREAM}/{STREAM}\" just sent",
            STREAM_FIRST + 1
        ),
    );
    // The session and the reply in flight both end with the daemon.
    let _ = tokio::time::timeout(WAIT, answering).await;

    let held_for = demo
        .fake
        .sent_messages()
        .into_iter()
        .find(|m| m.message_id == held)
        .and_then(|m| m.reply_to_message_id);
    let by_update = demo.envelopes_of(&pushed).await?;
    let mut on_the_wire = None;
    said("ledger", "as the kill left it:");
    for message in &pushed {
        match by_update.get(&message.update_id).and_then(|rows| rows.first()) {
            Some(envelope) => {
                let attempts = demo.attempts(envelope).await?;
                let outcomes: Vec<String> = attempts.iter().map(|a| a.outcome.to_string()).collect();
                let note = if Some(message.message_id) == held_for {
                    on_the_wire = Some(envelope.trace_id.clone());
                    "  ← its reply is on the wire"
                } else {
                    ""
                };
                more(format!(
                    "{} \"{}\" {}{}{note}",
                    envelope.trace_id,
                    envelope.content,
                    envelope.state,
                    attempts_text(&outcomes)
                ));
            }
            None => more(format!(
                "update {}: not recorded yet (its offset was not confirmed: Telegram keeps it)",
                message.update_id
            )),
        }
    }
    let on_the_wire =
        on_the_wire.ok_or_else(|| Broken("the reply on the wire answers no recorded envelope".into()))?;

    let pid = demo.daemon.start().await.map_err(|e| Broken(e.to_string()))?;
    said("daemon", format!("restarted as pid {pid}"));
    let envelope = demo.envelope(&on_the_wire).await?;
    let attempts = demo.attempts(&envelope).await?;
    said(
        "ledger",
        format!(
            "{on_the_wire} {}: the send in flight at the kill is now {}",
            envelope.state,
            attempts.last().map_or("-".into(), |a| a.outcome.to_string())
        ),
    );
    check(
        envelope.state == EnvelopeState::Unresolved
            && attempts.iter().any(|a| a.outcome == AttemptState::Unknown),
        "an interrupted send is unknown, never retried blindly: its envelope waits for an operator",
        || format!("{envelope:?} {attempts:?}"),
    )?;
    said("Telegram", format!("the chat shows message {held}: that reply did arrive"));
    let reason = "the reply is in the chat (the demo's Telegram recorded it)";
    said("operator", format!("switchboard ledger reconcile {on_the_wire} --delivered --reason \"{reason}\""));
    let output = demo.ledger_command(&["reconcile", &on_the_wire, "--delivered", "--reason", reason])?;
    more(output.trim());
    let envelope = demo.envelope(&on_the_wire).await?;
    check(envelope.state == EnvelopeState::Acked, "reconciled as delivered: acked", || {
        format!("{envelope:?}")
    })?;

    demo.orchestrator.connect().await?;
    said(
        "orchestrator",
        "reconnects; what it had not answered comes again (pending ones marked redelivered)",
    );
    let stream =
        demo.orchestrator.stream.take().ok_or_else(|| Broken("the orchestrator has no session".into()))?;
    let acked_now = demo
        .envelopes_of(&pushed)
        .await?
        .values()
        .flatten()
        .filter(|e| e.state == EnvelopeState::Acked)
        .count();
    let remaining = STREAM - acked_now;
    let answering =
        tokio::spawn(answer_as_they_come(demo.orchestrator.client.clone(), stream, Some(remaining)));
    let stream = tokio::time::timeout(WAIT, answering)
        .await
        .map_err(|_| Broken(format!("the orchestrator did not get {remaining} envelope(s) within {WAIT:?}")))?
        .map_err(|e| Broken(e.to_string()))?;
    demo.orchestrator.stream = stream;

    let by_update = demo.envelopes_of(&pushed).await?;
    let sent: Vec<SentMessage> = demo.fake.sent_messages().into_iter().skip(sent_before).collect();
    let mut problems = Vec::new();
    for message in &pushed {
        let rows = by_update.get(&message.update_id).map_or(0, Vec::len);
        let acked = by_update
            .get(&message.update_id)
            .is_some_and(|rows| rows.iter().all(|e| e.state == EnvelopeState::Acked));
        let replies = sent.iter().filter(|m| m.reply_to_message_id == Some(message.message_id)).count();
        if rows != 1 || !acked || replies != 1 {
            problems.push(format!(
                "update {}: {rows} envelope(s), acked {acked}, {replies} reply(ies)",
                message.update_id
            ));
        }
    }
    said(
        "ledger",
        format!(
            "{STREAM} updates → {} envelopes, {} acked",
            by_update.values().map(Vec::len).sum::<usize>(),
            by_update.values().flatten().filter(|e| e.state == EnvelopeState::Acked).count()
        ),
    );
    said(
        "Telegram",
        format!(
            "{} replies in the chat, each to its own message; every update confirmed: {}",
            sent.len(),
            (demo.fake.pending_update_count() == 0)
        ),
    );
    check(
        problems.is_empty() && sent.len() == STREAM && (demo.fake.pending_update_count() == 0),
        "nothing lost, nothing duplicated: each message is one envelope, acked, with exactly one reply",
        || problems.join("; "),
    )
}

/// A scripted agent's loop: each envelope as it comes, answered by name. Stops after
/// `count` envelopes, or when the session or a reply fails (the daemon died); gives the
/// stream back when it stopped by count.
async fn answer_as_they_come(
    client: DaemonClient,
    mut stream: SessionStream,
    count: Option<usize>,
) -> Option<SessionStream> {
    let mut answered = 0;
    while count.is_none_or(|count| answered < count) {
        let envelope = match stream.next_event().await {
            Ok(Some(SessionEvent::Envelope(envelope))) => envelope,
            Ok(Some(_)) => continue,
            Ok(None) | Err(_) => {
                said("orchestrator", "its session ended with the daemon");
                return None;
            }
        };
        if client.shown(&envelope.trace_id).await.is_err() {
            return None;
        }
        let redelivered = if envelope.redelivered { " (redelivered)" } else { "" };
        let text = format!("Noted: {}", envelope.content.to_lowercase());
        match client.reply(&ReplyRequest::new(text, Some(envelope.trace_id.clone()))).await {
            Ok(receipt) => {
                let ids = ids(&receipt.message_ids);
                let (trace, content) = (&envelope.trace_id, &envelope.content);
                said("orchestrator", format!("answers {trace} \"{content}\"{redelivered} → message {ids}"));
            }
            Err(e) => {
                // The daemon died under the call: what became of it is the ledger's to say.
                let (trace, content) = (&envelope.trace_id, &envelope.content);
                said(
                    "orchestrator",
                    format!("answers {trace} \"{content}\"{redelivered} → {}", gist(&e.to_string(), 60)),
                );
                return None;
            }
        }
        answered += 1;
    }
    Some(stream)
}

async fn ledger_stats(demo: &Demo) -> Result<(), Broken> {
    narrate::step("7", "The ledger, as an operator sees it");
    said("operator", format!("switchboard ledger --config {} stats", demo.config.display()));
    let stats = demo.ledger_command(&["stats"])?;
    for line in stats.lines() {
        more(line);
    }
    let counts = demo.ledger.count_by_state().await.map_err(|e| Broken(e.to_string()))?;
    let open: i64 = counts
        .iter()
        .filter(|(state, _)| ["queued", "pending", "unresolved"].contains(&state.as_str()))
        .map(|(_, n)| n)
        .sum();
    check(
        open == 0 && stats.contains("unreconciled attempts: 0"),
        "nothing waits: no envelope queued, pending or unresolved, no attempt to reconcile",
        || format!("{counts:?}"),
    )?;
    let (status, metrics) = demo.get("/metrics").await?;
    said("health", format!("GET /metrics → {status}; the envelope gauges:"));
    let acked = counts.iter().find(|(state, _)| state == "acked").map_or(0, |(_, n)| *n);
    let acked_line = format!("switchboard_envelopes{{state=\"acked\"}} {acked}");
    for line in
        metrics.lines().filter(|line| line.starts_with("switchboard_envelopes{") && !line.ends_with(" 0"))
    {
        more(line);
    }
    check(
        status == 200 && metrics.lines().any(|line| line == acked_line),
        "/metrics agrees with the ledger",
        || format!("no line {acked_line}"),
    )
}

/// The fake's records of the messages a receipt names.
fn sent_as(sent: &[SentMessage], message_ids: &[i32]) -> Vec<SentMessage> {
    sent.iter().filter(|message| message_ids.contains(&message.message_id)).cloned().collect()
}

fn describe_sent(message: &SentMessage) -> String {
    let reply =
        message.reply_to_message_id.map(|id| format!(", replying to message {id}")).unwrap_or_default();
    format!("sendMessage to chat {}{reply} → message {}", message.chat_id, message.message_id)
}

fn attempts_text(outcomes: &[String]) -> String {
    if outcomes.is_empty() { String::new() } else { format!(", attempt(s): {}", outcomes.join(", ")) }
}

/// The wire name of an error code (`ambiguous`, `already_delegated`, …).
fn code_name(code: ErrorCode) -> String {
    serde_json::to_value(code).ok().and_then(|value| value.as_str().map(str::to_owned)).unwrap_or_default()
}

fn ids(message_ids: &[i32]) -> String {
    message_ids.iter().map(i32::to_string).collect::<Vec<_>>().join(", ")
}
