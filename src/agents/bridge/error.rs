//! What the bridge's operations can come to when they do not succeed. These are domain
//! errors: `api::server` maps them to status codes and wire bodies. Their texts are written
//! for the model that reads them: what happened, and what to do next.

use std::sync::Arc;

use crate::ledger::{LedgerError, StoredEnvelope};
use crate::rules::resolver;
use crate::rules::{guard, revisions};
use crate::telegram::outbound::refusal_lasts;

/// The resolver's refusal of a reply, with the stored envelopes it names.
pub type ResolveError = resolver::ResolveError<StoredEnvelope>;

/// No such agent, or not its secret: deliberately one answer for both.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("unknown agent or wrong secret")]
pub struct Unauthorized;

/// A session the agent cannot have now.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SessionConflict {
    /// Another plugin process's session is connected.
    #[error(
        "agent '{agent}' already has a connected session ({existing}); only one session per agent may be \
         connected — close the other one first"
    )]
    Connected { agent: String, existing: String },
    /// The agent is kept for the plugin process whose session ended a moment ago (or held
    /// it before the daemon restarted), which is reconnecting.
    #[error(
        "agent '{agent}' is reserved for the session connected before, which is reconnecting; retry in \
         {retry_in_secs} s (it is yours if that session does not come back by then)"
    )]
    Reserved { agent: String, retry_in_secs: u64 },
}

/// A tool call that did not do what it asked.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ToolError {
    /// The call itself is malformed; nothing was done.
    #[error("{0}")]
    Invalid(String),
    /// The call does not come from the agent's live session: a second session using the
    /// same secret, a session that was replaced, or one not connected yet.
    #[error(
        "this plugin's session is not the connected session of agent '{agent}' (another session is connected, or \
         this one was replaced or has not connected yet); nothing was done"
    )]
    NotLiveSession { agent: String },
    /// The resolver would not pick an envelope; nothing was sent or changed.
    #[error(transparent)]
    Refused(#[from] ResolveError),
    #[error(
        "the reply would need {parts} Telegram messages, and at most {max} are allowed (outbound.max_reply_parts); \
         nothing was sent: shorten it, or split it into several replies"
    )]
    TooLong { parts: usize, max: usize },
    #[error("no reply with request id {0} was ever attempted: nothing was sent for it")]
    UnknownRequest(String),
    /// The delegation guard (or what it checks first) refused a handoff.
    #[error(transparent)]
    Handoff(guard::Refusal),
    #[error(
        "{trace_id} answers an unprompted handoff: it belongs to no conversation, so there is nobody to reply \
         to. Ack it instead; nothing was sent"
    )]
    NoConversation { trace_id: String },
    /// A reply to a group room's turn that is over, or already has its reply: nothing was
    /// posted. The message says why (one reply per turn).
    #[error("{0}")]
    TurnOver(String),
    /// A reply to an envelope already answered, without `again: true`: nothing was posted.
    /// The message says what the earlier reply came to.
    #[error("{0}")]
    AlreadyAnswered(String),
    /// Telegram provably did not take (the rest of) the reply.
    #[error("{}", not_sent_message(trace_id, error, sent, *parts, cut_at_file.as_deref()))]
    NotSent {
        trace_id: String,
        error: String,
        sent: Vec<(usize, i32)>,
        parts: usize,
        /// The name of the file the reply was cut off at, when it was a file.
        cut_at_file: Option<String>,
    },
    /// A part may or may not have arrived.
    #[error("{}", unknown_message(trace_id, error, sent, *parts, *stays_answered))]
    Unknown {
        trace_id: String,
        error: String,
        sent: Vec<(usize, i32)>,
        parts: usize,
        /// The envelope was answered before this (follow-up) reply, and stays `acked`.
        stays_answered: bool,
    },
    /// The task the action acts for changed (DESIGN.md §11): a correction or a new
    /// objective superseded it, it is paused, or it was cancelled. Nothing was sent.
    /// A reaction or an edit Telegram did not take: nothing changed in the chat.
    #[error("{0}")]
    ActionNotSent(String),
    /// A reaction or an edit that may or may not have taken effect; it is never retried.
    #[error("{0}")]
    ActionUnknown(String),
    #[error(transparent)]
    Task(#[from] revisions::Refusal),
    /// A child answered a handoff that a change to its delegator's task superseded: the
    /// answer is kept as a late result and goes to nobody.
    #[error(
        "superseded: the handoff this answers no longer stands ({refusal_task} changed since it was made); your \
         answer is kept as a late result for the record and goes to nobody. Ack the notice that says the handoff \
         no longer stands; nothing else of it is yours to act on.",
        refusal_task = .0.task_id()
    )]
    LateResult(revisions::Refusal),
    /// The task changed while a reply of several parts went out: the parts before the
    /// change were delivered, the rest refused and not sent.
    #[error("{refusal} Before the change landed, {} were delivered; the rest was not sent.", delivered_parts(sent, *parts))]
    TaskCutOff { refusal: revisions::Refusal, sent: Vec<(usize, i32)>, parts: usize },
    /// `revise_task` recorded nothing (the envelope is not pending, belongs to no task, or
    /// the change does not apply now).
    #[error("{0}")]
    NoRevision(String),
    /// A reply names an upload the daemon does not hold for the caller: nothing was sent.
    #[error("{0}")]
    UnknownUpload(String),
    #[error("the switchboard ledger failed ({0}); nothing was changed, try again in a moment")]
    Ledger(Arc<LedgerError>),
}

impl From<LedgerError> for ToolError {
    fn from(e: LedgerError) -> Self {
        tracing::error!(error = %e, "ledger error");
        Self::Ledger(Arc::new(e))
    }
}

/// "parts 1–2 of 3 (message ids 10, 11)"
fn delivered_parts(sent: &[(usize, i32)], parts: usize) -> String {
    let numbers: Vec<String> = sent.iter().map(|(i, _)| (i + 1).to_string()).collect();
    let ids: Vec<String> = sent.iter().map(|(_, id)| id.to_string()).collect();
    format!("part(s) {} of {parts} (Telegram message ids {})", numbers.join(", "), ids.join(", "))
}

fn not_sent_message(
    trace_id: &str,
    error: &str,
    sent: &[(usize, i32)],
    parts: usize,
    cut_at_file: Option<&str>,
) -> String {
    // A file of its own may be refused for good (no right to send photos) and the rest
    // still go: the advice for a file comes first.
    let lasting = cut_at_file.is_none() && refusal_lasts(error);
    if sent.is_empty() && lasting {
        format!(
            "Telegram did not take the reply to {trace_id}: {error}. Nothing of it was delivered. This refusal does \
             not change by itself (the bot was blocked or removed, the chat or topic is gone or closed, or the bot \
             may not post there): do not send it again, but call ack with trace_id {trace_id} to mark the message \
             handled."
        )
    } else if sent.is_empty() {
        format!(
            "Telegram did not take the reply to {trace_id}: {error}. Nothing of it was delivered; you may reply again."
        )
    } else if lasting {
        format!(
            "the reply to {trace_id} was cut off: {} were delivered, the rest was refused ({error}), which does not \
             change by itself: do not send it again, but call ack with trace_id {trace_id} to mark the message \
             handled. (Once the chat takes the bot's messages again, the same text and trace_id send only the \
             missing part(s).)",
            delivered_parts(sent, parts)
        )
    } else if let Some(file) = cut_at_file {
        format!(
            "the reply to {trace_id} was cut off at the file {file}: {} were delivered, that file and what follows \
             were not ({error}). To finish without it, call reply again with the same text and trace_id \
             {trace_id}, leaving {file} out: only what is missing is sent, parts already delivered are never \
             sent again.",
            delivered_parts(sent, parts)
        )
    } else {
        format!(
            "the reply to {trace_id} was cut off: {} were delivered, the rest was not ({error}). Call reply again \
             with the same text and trace_id {trace_id} to send only the missing part(s): parts already delivered \
             are never sent again.",
            delivered_parts(sent, parts)
        )
    }
}

fn unknown_message(
    trace_id: &str,
    error: &str,
    sent: &[(usize, i32)],
    parts: usize,
    stays_answered: bool,
) -> String {
    let delivered = if sent.is_empty() {
        String::new()
    } else {
        format!(" Before that, {} were delivered.", delivered_parts(sent, parts))
    };
    let state = if stays_answered {
        format!("{trace_id} stays answered; this follow-up is marked for an operator to reconcile")
    } else {
        format!("{trace_id} is marked unresolved until an operator reconciles it")
    };
    format!(
        "the reply to {trace_id} may or may not have reached the chat ({error}).{delivered} {state} with \
         `switchboard ledger`. Do not send it again."
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_cut_off_part_way_says_which_parts_went_out_and_how_to_finish() {
        let text = ToolError::NotSent {
            trace_id: "env_abcdefghij".into(),
            error: "Telegram refused it: Bad Request".into(),
            sent: vec![(0, 10), (1, 11)],
            parts: 3,
            cut_at_file: None,
        }
        .to_string();
        assert!(text.contains("part(s) 1, 2 of 3 (Telegram message ids 10, 11)"), "{text}");
        assert!(text.contains("same text"), "{text}");
        assert!(text.contains("never sent again"), "{text}");

        let nothing = ToolError::NotSent {
            trace_id: "env_x".into(),
            error: "no".into(),
            sent: vec![],
            parts: 1,
            cut_at_file: None,
        };
        assert!(nothing.to_string().contains("you may reply again"), "{nothing}");
    }

    /// A refusal no retry changes (the user blocked the bot, the topic is gone) does not
    /// invite a retry: the agent is told to ack the message instead.
    #[test]
    fn a_lasting_refusal_says_to_ack_rather_than_retry() {
        let refused = |sent: Vec<(usize, i32)>, cut_at_file: Option<String>| {
            ToolError::NotSent {
                trace_id: "env_x".into(),
                error: "Telegram refused it: Forbidden: bot was blocked by the user".into(),
                sent,
                parts: 2,
                cut_at_file,
            }
            .to_string()
        };
        for text in [refused(vec![], None), refused(vec![(0, 10)], None)] {
            assert!(text.contains("call ack with trace_id env_x"), "{text}");
            assert!(text.contains("do not send it again") && !text.contains("may reply again"), "{text}");
        }
        // A refused file is left out, and the rest goes.
        let file = refused(vec![(0, 10)], Some("chart.png".into()));
        assert!(file.contains("leaving chart.png out"), "{file}");
    }

    #[test]
    fn a_reply_a_task_change_cut_off_says_which_parts_went_out() {
        let refusal = revisions::Refusal::Paused { task_id: "task_aaaaaaaa".into() };
        let text = ToolError::TaskCutOff { refusal, sent: vec![(0, 10)], parts: 3 }.to_string();
        assert!(
            text.contains("paused") && text.contains("part(s) 1 of 3 (Telegram message ids 10)"),
            "{text}"
        );
    }

    #[test]
    fn an_unknown_outcome_forbids_a_retry_and_says_what_the_envelope_became() {
        let unresolved = ToolError::Unknown {
            trace_id: "env_x".into(),
            error: "timeout".into(),
            sent: vec![],
            parts: 1,
            stays_answered: false,
        }
        .to_string();
        assert!(unresolved.contains("Do not send it again"), "{unresolved}");
        assert!(unresolved.contains("marked unresolved"), "{unresolved}");
        let follow_up = ToolError::Unknown {
            trace_id: "env_x".into(),
            error: "timeout".into(),
            sent: vec![(0, 5)],
            parts: 2,
            stays_answered: true,
        }
        .to_string();
        assert!(follow_up.contains("stays answered"), "{follow_up}");
        assert!(follow_up.contains("part(s) 1 of 2"), "{follow_up}");
    }
}
