//! What the switchboard says about tasks: the bot's answers in the conversation (the
//! acknowledgement of a change, `/status`, why nothing changed), the `revision` envelopes
//! an agent acts on, and what `revise_task` tells the agent to do next. Every text of a
//! task is written here, once; the planner picks them and the ledger stores them.

use chrono::{DateTime, Utc};

use super::task::{Task, TaskEffects};
use super::{ChangeKind, TaskState};

/// The stop reason the `task_stopped_on_cancel_ack` trigger (migration 0006) records when
/// the agent acks the cancel envelope; an operator's stop carries the operator's reason.
pub const AGENT_CONFIRMED_STOP: &str = "the agent acknowledged the cancel";

/// The bot's acknowledgement of a recorded change.
pub fn acknowledgement(task_id: &str, revision: u32, kind: ChangeKind, successor: &str) -> String {
    match kind {
        ChangeKind::Correction => format!("{task_id} revision {revision}: correction accepted"),
        ChangeKind::NewObjective => {
            format!("{task_id} revision {revision}: new objective accepted; it continues as {successor}")
        }
        ChangeKind::Pause => {
            format!("{task_id} revision {revision}: paused; nothing of it is sent until /resume")
        }
        ChangeKind::Resume => format!("{task_id} revision {revision}: resumed"),
        ChangeKind::Cancel => format!(
            "{task_id} revision {revision}: cancel accepted; stop requested (it is stopped once the agent confirms)"
        ),
    }
}

/// The `revision` envelope a human's command or edit becomes: what changed, which
/// handoffs no longer stand, and what the agent does now.
pub fn revision_envelope(
    task_id: &str,
    revision: u32,
    change: &RevisionChange<'_>,
    retired_handoffs: &[String],
) -> String {
    let (what, then) = match *change {
        RevisionChange::Correction { new, old } => (
            format!("correction. The instruction is now:\n{new}\n\nIt was:\n{}", old.unwrap_or("(unknown)")),
            "Act on this envelope: replies to the task's older envelopes are refused (superseded)."
                .to_owned(),
        ),
        RevisionChange::NewObjective { objective, replacing } => (
            format!("new objective, replacing {replacing}:\n{objective}"),
            format!("Work on this now; everything of {replacing} is refused (superseded)."),
        ),
        RevisionChange::Cancel { by } => (
            format!("cancelled by {by}."),
            "Stop working on it, then ack this envelope: the task counts as stopped only once you do. \
             Nothing more of it is sent."
                .to_owned(),
        ),
    };
    let mut content = format!("{task_id} revision {revision}: {what}");
    if !retired_handoffs.is_empty() {
        content.push_str(&format!(
            "\n\nHandoffs made for the old instruction no longer stand (their answers are refused): {}. \
             Send a follow-up (followup: true, intent: \"replaces\") if the new instruction still needs them.",
            retired_handoffs.join(", ")
        ));
    }
    content.push_str("\n\n");
    content.push_str(&then);
    content
}

/// What a change that becomes a `revision` envelope says changed.
#[derive(Debug, Clone, Copy)]
pub enum RevisionChange<'a> {
    Correction { new: &'a str, old: Option<&'a str> },
    NewObjective { objective: &'a str, replacing: &'a str },
    Cancel { by: &'a str },
}

/// Why an envelope or handoff of the task was superseded (its note in the ledger).
pub fn superseded_by(task_id: &str, revision: u32, kind: ChangeKind) -> String {
    format!("{task_id} revision {revision} ({kind}) superseded it")
}

/// The `revision` envelope the agent working on a retired handoff is sent.
pub fn handoff_retired(
    handoff_id: &str,
    from_agent: &str,
    task_id: &str,
    revision: u32,
    kind: ChangeKind,
) -> String {
    format!(
        "{handoff_id} from '{from_agent}' no longer stands: {task_id} changed ({kind}, revision {revision}). \
         Stop working on it; an answer to it would be refused and kept only as a late result. \
         Ack this envelope; it has no reply."
    )
}

/// The note on a pause's or resume's command, which the switchboard settles.
pub fn settled_change(task_id: &str, revision: u32, kind: ChangeKind) -> String {
    format!("switchboard: {task_id} revision {revision} ({kind})")
}

/// The note on an answered `/status`.
pub const STATUS_ANSWERED: &str = "switchboard: /status answered";

/// The bot's answer when a message changes nothing, and the note it is settled with.
pub fn nothing_changed(why: &str) -> (String, String) {
    (format!("Nothing changed: {why}."), format!("switchboard: nothing changed ({why})"))
}

/// `/status` in a conversation with no open task: the most recent one, if any.
pub fn status_without_open_task(latest: Option<(&Task, &TaskEffects)>) -> String {
    match latest {
        Some((task, effects)) => {
            format!("No task is open here. The most recent one:\n{}", describe(task, effects))
        }
        None => {
            "No task here yet: nothing has been asked in this conversation; a message starts one.".to_owned()
        }
    }
}

/// What `revise_task` tells the agent to do after a change it declared about `trace_id`
/// (`task_id`: the task the envelope belongs to now).
pub fn after_declaration(kind: ChangeKind, trace_id: &str, task_id: &str) -> String {
    match kind {
        ChangeKind::Correction => format!("act on {trace_id}: it carries the corrected instruction"),
        ChangeKind::NewObjective => format!("act on {trace_id}: it starts {task_id}"),
        ChangeKind::Pause => "the task is paused: nothing of it is sent until the user resumes it".to_owned(),
        ChangeKind::Resume => "the task runs again".to_owned(),
        ChangeKind::Cancel => {
            format!("stop working on the task, then ack {trace_id}: it is stopped once you do")
        }
    }
}

/// A task in a few lines: where it stands and what it has done (`/status`, and
/// `switchboard ledger task`).
pub fn describe(task: &Task, effects: &TaskEffects) -> String {
    let unknown = |value: &Option<String>| value.clone().unwrap_or_else(|| "?".to_owned());
    let unknown_time = |at: &Option<DateTime<Utc>>| at.map_or_else(|| "?".to_owned(), crate::clock::text);
    let mut lines = vec![format!("{} (revision {}): {}", task.task_id, task.revision, task.state)];
    lines.push(format!("objective: {}", one_line(&task.objective)));
    match task.state() {
        TaskState::StopRequested => lines.push(format!(
            "stop requested by {} at {}: not stopped yet (the agent has not confirmed)",
            unknown(&task.stop_requested_by),
            unknown_time(&task.stop_requested_at),
        )),
        TaskState::Stopped => {
            let reason = task.stop_reason.as_deref().unwrap_or_default();
            let by = if reason == AGENT_CONFIRMED_STOP {
                format!("agent '{}', which acknowledged the cancel", task.agent)
            } else {
                format!("an operator (switchboard ledger task --stopped): {reason}")
            };
            lines.push(format!(
                "stop requested by {} at {}; stopped at {}, confirmed by {by}",
                unknown(&task.stop_requested_by),
                unknown_time(&task.stop_requested_at),
                unknown_time(&task.stopped_at),
            ));
        }
        TaskState::Done => lines.push(format!(
            "done at {}: every message of it was answered or handled, and no handoff of it is open",
            unknown_time(&task.closed_at)
        )),
        TaskState::Replaced => {
            lines.push(format!("replaced at {} by a new objective", unknown_time(&task.closed_at)))
        }
        TaskState::Open | TaskState::Paused => {}
    }
    let confirmed: Vec<String> =
        effects.confirmed.iter().map(|(op, m)| format!("{op} (message {m})")).collect();
    lines.push(format!("confirmed sends: {}", list_or_none(&confirmed)));
    lines.push(format!("unresolved attempts (never retried): {}", list_or_none(&effects.unresolved)));
    let handoffs: Vec<String> =
        effects.open_handoffs.iter().map(|(id, to)| format!("{id} to {to}")).collect();
    lines.push(format!("open handoffs: {}", list_or_none(&handoffs)));
    if let Some(predecessor) = &task.predecessor {
        lines.push(format!("replaces: {predecessor}"));
    }
    if let Some(successor) = &task.successor {
        lines.push(format!("replaced by: {successor}"));
    }
    lines.join("\n")
}

fn list_or_none(items: &[String]) -> String {
    if items.is_empty() { "none".to_owned() } else { items.join(", ") }
}

/// The start of a text on one line, for a status that stays short.
fn one_line(text: &str) -> String {
    let line: String = text.chars().take(120).collect::<String>().replace('\n', " ");
    if text.chars().count() > 120 { format!("{line}…") } else { line }
}
