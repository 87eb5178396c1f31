//! What both backends write about tasks (DESIGN.md §11) and decide alike, apart from the
//! statements that write it: which human messages belong to a task, how a change's carrier
//! and a revision's snapshot are written, who the lineage names, and whether and how an
//! agent's declaration (`revise_task`) changes its task.

use serde_json::json;

use crate::domain::{DeclareError, DeclaredRevision, EnvelopeKind, EnvelopeState, RoutedEnvelope};
use crate::ids::TraceId;
use crate::rules::revisions::plan::{Change, ChangePlan, Source};
use crate::rules::revisions::task::to_u32;
use crate::rules::revisions::{self, ChangeKind, Refusal, Task, TaskEffects, TaskState, texts};
use crate::telegram::envelope::ChatType;

/// A task's effects as a revision's snapshot stores them.
pub(crate) fn snapshot_json(effects: &TaskEffects) -> String {
    json!({
        "confirmed": effects.confirmed.iter().map(|(op, message)| json!({"op_id": op, "message_id": message})).collect::<Vec<_>>(),
        "unresolved": effects.unresolved,
        "open_handoffs": effects.open_handoffs.iter().map(|(id, to)| json!({"handoff_id": id, "to": to})).collect::<Vec<_>>(),
    })
    .to_string()
}

/// The envelope a change came with: turned into the task's `revision` envelope (a human
/// message or edit), or kept as it is and re-tagged (an agent's declaration about it).
#[derive(Debug, Clone)]
pub(crate) struct Carrier {
    pub(crate) id: i64,
    pub(crate) trace_id: TraceId,
    pub(crate) message_id: Option<i64>,
    pub(crate) chat_id: i64,
    pub(crate) thread_id: Option<i64>,
    pub(crate) route: String,
    pub(crate) agent: String,
    /// Whether the carrier becomes a `revision` envelope (a human's command or edit).
    pub(crate) rewrite: bool,
}

/// Whether a newly stored row is a human message of a single-agent conversation, which
/// belongs to a task.
pub(crate) fn belongs_to_a_task(routed: &RoutedEnvelope) -> bool {
    routed.state == EnvelopeState::Queued
        && routed.agent.is_some()
        && matches!(routed.envelope.kind, EnvelopeKind::Message | EnvelopeKind::EditedMessage)
}

/// A conversation: chat, topic, agent.
pub(crate) type Conversation = (i64, Option<i64>, String);

/// Whether a human message is plainly work: not an edit and not a command. Work joins the
/// conversation's open task or starts one, whatever that task's state.
pub(crate) fn plain_work(routed: &RoutedEnvelope, bot_username: Option<&str>) -> bool {
    let e = &routed.envelope;
    let text = e.text.as_deref().unwrap_or_default();
    e.kind == EnvelopeKind::Message
        && revisions::parse_command(text, bot_username.unwrap_or_default()).is_none()
}

/// Whether the bot says in the chat that a human update changed nothing. Not for an edit
/// in a group: people there fix typos and tick checklists in messages the task never
/// took, and a reply to each would be noise. The update is settled with its reason all
/// the same.
pub(crate) fn nothing_changed_is_said(routed: &RoutedEnvelope) -> bool {
    let e = &routed.envelope;
    !(e.kind == EnvelopeKind::EditedMessage && matches!(e.chat_type, ChatType::Group | ChatType::Supergroup))
}

/// The sender as the lineage names them: @username, else their name.
pub(crate) fn sender_of(routed: &RoutedEnvelope) -> String {
    let sender = &routed.envelope.sender;
    sender.username.as_ref().map_or_else(|| sender.name.clone(), |u| format!("@{u}"))
}

pub(crate) fn carrier_of(routed: &RoutedEnvelope, id: i64) -> Carrier {
    let e = &routed.envelope;
    Carrier {
        id,
        trace_id: e.trace_id.clone(),
        message_id: Some(i64::from(e.message_id)),
        chat_id: e.channel.chat_id,
        thread_id: e.channel.thread_id.map(i64::from),
        route: routed.route.as_ref().map(ToString::to_string).unwrap_or_default(),
        agent: routed.agent.as_ref().map(ToString::to_string).unwrap_or_default(),
        rewrite: true,
    }
}

/// The key of the bot's answer to a message (a `/status`, or why nothing changed).
pub(crate) fn answer_key(carrier: &Carrier) -> String {
    format!("{}/answer", carrier.trace_id)
}

// ---- an agent's declaration (`revise_task`) ----

/// The envelope an agent declares a change about: what the ledger holds of it.
pub(crate) struct DeclaredAbout<'a> {
    pub trace_id: &'a TraceId,
    /// Its kind, as stored (`message`, `handoff`, …).
    pub kind: &'a str,
    /// The agent that declares.
    pub agent: &'a str,
    /// Its revision of `task`.
    pub revision: i64,
}

/// Whether an agent may declare `kind` about an envelope of `task`. Only a message a person
/// sent the agent that owns the task can change it (DESIGN.md §11): a handoff, a child's
/// answer or notice, or a room turn carries the delegator's task, and a change declared
/// on it would supersede the person's own message under the delegator's feet. The
/// declaration is itself an action for that envelope, so a superseded or cancelled one
/// cannot change the task (a paused task may still be cancelled), and only an open task
/// can be paused.
pub(crate) fn admit_declaration(
    kind: ChangeKind,
    about: &DeclaredAbout<'_>,
    task: &Task,
) -> Result<(), DeclareError> {
    let a_persons_message = matches!(about.kind, "message" | "edited_message");
    if !a_persons_message || task.agent != about.agent {
        return Err(DeclareError::NotAMessage(about.trace_id.to_string()));
    }
    let revision = about.revision;
    match (kind, revisions::admit(to_u32(revision), &task.now())) {
        (_, Ok(())) | (ChangeKind::Cancel, Err(Refusal::Paused { .. })) => {}
        (_, Err(refusal)) => return Err(DeclareError::Refused(refusal)),
    }
    if kind == ChangeKind::Pause && task.state() != TaskState::Open {
        return Err(DeclareError::NotNow(format!("{} is {}", task.task_id, task.state)));
    }
    Ok(())
}

/// The change an agent declares, with the envelope's text as the new instruction or
/// objective, and its summary (or, if it gave none, one that says who declared what).
pub(crate) fn declared_change<'a>(
    kind: ChangeKind,
    text: Option<&'a str>,
    actor: &'a str,
    summary: &str,
) -> Change<'a> {
    let summary =
        if summary.trim().is_empty() { format!("{actor} declared a {kind}") } else { summary.to_owned() };
    Change { kind, text, source: Source::Agent, actor, summary }
}

/// What `revise_task` answers once the change is recorded: the task the envelope belongs
/// to now (a new objective's successor), its revision and what to do next.
pub(crate) fn declared_revision(
    kind: ChangeKind,
    trace_id: &TraceId,
    now_task: String,
    task: &Task,
) -> DeclaredRevision {
    let next = texts::after_declaration(kind, trace_id, &now_task);
    // A new objective starts the successor at revision 1; any other change is the task's
    // next revision.
    let revision = if kind == ChangeKind::NewObjective { 1 } else { task.revision() + 1 };
    DeclaredRevision { task_id: now_task, revision, kind, act_on: trace_id.to_string(), next }
}

/// What a declaration came to in its transaction: recorded now, with what it asks for, or
/// recorded before under the same request id.
pub(crate) enum Declared {
    Now(DeclaredRevision, Vec<crate::domain::TaskEffect>),
    Before(DeclaredRevision),
}

/// What a declaration repeated with the same request id is answered with: the first one's
/// answer, from what its revision row kept.
pub(crate) fn repeated_revision(
    kind: &str,
    trace_id: &TraceId,
    declared_task: String,
    declared_revision: i64,
) -> DeclaredRevision {
    // Only a revision an agent declared carries a request id: its kind is one revise_task takes.
    let kind = ChangeKind::parse_declared(kind).unwrap_or(ChangeKind::Correction);
    let next = texts::after_declaration(kind, trace_id, &declared_task);
    let revision = u32::try_from(declared_revision).unwrap_or_default();
    DeclaredRevision { task_id: declared_task, revision, kind, act_on: trace_id.to_string(), next }
}

/// Each agent's latest pending envelope of a task (`$1`) but the carrier (`$2`), oldest
/// agent first: whom a pause or resume is told to, and about what.
pub(crate) const PENDING_BY_AGENT: &str = "SELECT agent, trace_id FROM envelopes WHERE id IN (\
     SELECT max(id) FROM envelopes WHERE task_id = $1 AND state = 'pending' AND id <> $2 \
     AND agent IS NOT NULL GROUP BY agent) ORDER BY id";

/// The notices a change's plan sends (a pause's or resume's, to each agent working on the
/// task), as effects to carry out once it is committed.
pub(crate) fn notices<'a>(
    plan: &'a ChangePlan,
    task: &'a Task,
    kind: ChangeKind,
) -> impl Iterator<Item = crate::domain::TaskEffect> + 'a {
    plan.notices.iter().map(move |(agent, about)| crate::domain::TaskEffect::Notice {
        agent: agent.clone(),
        trace_id: about.clone(),
        kind,
        task_id: task.task_id.clone(),
        revision: plan.revision,
    })
}

/// Finds the revision an agent (`agent:NAME`) declared with `request_id`: its kind, and the
/// task and revision its answer named.
pub(crate) const REVISION_BY_REQUEST: &str = "SELECT kind, declared_task, declared_revision FROM task_revisions \
     WHERE actor = $1 AND request_id = $2";

/// Keeps the request id and the answer on the revision just declared: the actor's newest.
pub(crate) const KEEP_REVISION_REQUEST: &str = "UPDATE task_revisions SET request_id = $1, declared_task = $2, \
     declared_revision = $3 WHERE id = (SELECT max(id) FROM task_revisions WHERE actor = $4)";

#[cfg(test)]
mod tests {
    use super::*;

    fn task(state: TaskState, instruction_revision: Option<i64>) -> Task {
        let instruction_kind = instruction_revision.map(|_| "correction".into());
        Task { instruction_revision, instruction_kind, ..Task::sample(state) }
    }

    fn message<'a>(trace_id: &'a TraceId, agent: &'a str, revision: i64) -> DeclaredAbout<'a> {
        DeclaredAbout { trace_id, kind: "message", agent, revision }
    }

    #[test]
    fn a_declaration_stands_on_its_envelope_as_a_reply_would_and_pauses_only_an_open_task() {
        let trace_id = TraceId::generate();
        let owner = Task::sample(TaskState::Open).agent;
        let about = |revision| DeclaredAbout { agent: owner.as_str(), ..message(&trace_id, "", revision) };
        let open = task(TaskState::Open, None);
        assert_eq!(admit_declaration(ChangeKind::Pause, &about(2), &open), Ok(()));
        // A correction since the envelope: it is stale, whatever it declares.
        let corrected = task(TaskState::Open, Some(2));
        let stale = admit_declaration(ChangeKind::NewObjective, &about(1), &corrected);
        assert!(matches!(stale, Err(DeclareError::Refused(Refusal::Superseded { .. }))), "{stale:?}");
        // A paused task refuses everything but a cancel.
        let paused = task(TaskState::Paused, None);
        assert_eq!(admit_declaration(ChangeKind::Cancel, &about(2), &paused), Ok(()));
        let again = admit_declaration(ChangeKind::Pause, &about(2), &paused);
        assert!(matches!(again, Err(DeclareError::Refused(Refusal::Paused { .. }))), "{again:?}");
        // A done task admits its envelopes, but there is nothing left to pause.
        let done = admit_declaration(ChangeKind::Pause, &about(2), &task(TaskState::Done, None));
        assert!(matches!(&done, Err(DeclareError::NotNow(why)) if why.contains("task_aaaaaaaa")), "{done:?}");
        let stopped = admit_declaration(ChangeKind::Correction, &about(2), &task(TaskState::Stopped, None));
        assert!(matches!(stopped, Err(DeclareError::Refused(Refusal::Cancelled { .. }))), "{stopped:?}");
    }

    #[test]
    fn only_a_persons_message_to_the_tasks_own_agent_can_change_it() {
        let trace_id = TraceId::generate();
        let open = task(TaskState::Open, None);
        let owner = open.agent.clone();
        let edited =
            DeclaredAbout { kind: "edited_message", agent: owner.as_str(), ..message(&trace_id, "", 2) };
        assert_eq!(admit_declaration(ChangeKind::Correction, &edited, &open), Ok(()));
        // A worker's handoff carries the delegator's task: the worker cannot change it.
        for kind in ["handoff", "handoff_answer", "revision", "room_turn"] {
            let about = DeclaredAbout { kind, agent: owner.as_str(), ..message(&trace_id, "", 2) };
            let refused = admit_declaration(ChangeKind::Correction, &about, &open);
            assert!(matches!(refused, Err(DeclareError::NotAMessage(_))), "{kind}: {refused:?}");
        }
        let someone_else = message(&trace_id, "worker-of-another", 2);
        let refused = admit_declaration(ChangeKind::Cancel, &someone_else, &open);
        assert!(matches!(refused, Err(DeclareError::NotAMessage(_))), "{refused:?}");
    }

    #[test]
    fn a_declared_change_says_who_declared_it_when_the_agent_gave_no_summary() {
        let quiet = declared_change(ChangeKind::Correction, Some("use May"), "agent:orchestrator", "  ");
        assert_eq!(quiet.source, Source::Agent);
        assert!(quiet.summary.contains("agent:orchestrator"), "{}", quiet.summary);
        let said = declared_change(ChangeKind::Correction, None, "agent:orchestrator", "dates moved");
        assert_eq!(said.summary, "dates moved");
        let trace_id = TraceId::generate();
        let next = declared_revision(
            ChangeKind::NewObjective,
            &trace_id,
            "task_bbbbbbbb".into(),
            &task(TaskState::Open, None),
        );
        assert_eq!((next.revision, next.act_on), (1, trace_id.to_string()), "a successor starts at 1");
        let next = declared_revision(
            ChangeKind::Correction,
            &trace_id,
            "task_aaaaaaaa".into(),
            &task(TaskState::Open, None),
        );
        assert_eq!(next.revision, 3);
    }
}
