//! The delegation guard (DESIGN.md §9): whether one agent may hand an instruction to
//! another. Pure: the caller gathers the facts (the agents, the turn's earlier
//! instructions, the caller's open handoffs, the cause's depth) and records what this
//! admits in the same serialised step, so two calls in one turn cannot both pass.
//!
//! The rule in one sentence: **the first instruction stands; if the plan changed, say so
//! with `followup`.** In order:
//! 1. the call itself must be well-formed (`followup` a JSON boolean, `intent` with it);
//! 2. refused before the guard: a handoff to oneself, to an unknown agent, with empty
//!    text, or deeper than `handoffs.max_depth`;
//! 3. the guard: within one turn (the cause envelope), a second instruction to the same
//!    target is `already_delegated`;
//! 4. in flight: while an earlier handoff to that target is open, from any turn, a new one
//!    is `already_running`.
//!
//! `followup: true` with an `intent` passes 3 and 4 and is marked as a follow-up of the
//! earlier handoff.

use std::fmt::Write as _;
use std::time::Duration;

use serde_json::Value;

use crate::ids::{AgentName, HandoffId};

/// How much of the earlier instruction a refusal quotes.
pub const QUOTE_CHARS: usize = 400;

/// How much of an open handoff's instruction `already_running` shows.
const START_CHARS: usize = 120;

/// What a follow-up does to the instruction it follows. Stored as its snake_case name,
/// read strictly (an unknown name in a row is an error, not a default).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Intent {
    /// Adds to the earlier instruction, which still stands.
    Extends,
    /// Supersedes the earlier instruction.
    Replaces,
}

impl Intent {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Extends => "extends",
            Self::Replaces => "replaces",
        }
    }

    pub fn parse(raw: &str) -> Option<Self> {
        match raw {
            "extends" => Some(Self::Extends),
            "replaces" => Some(Self::Replaces),
            _ => None,
        }
    }
}

impl std::fmt::Display for Intent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

/// An earlier handoff the new one is weighed against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PriorHandoff {
    pub handoff_id: HandoffId,
    pub to: AgentName,
    pub instruction: String,
    /// How long it has been open (for `already_running`).
    pub age: Duration,
}

/// A handoff as asked for by the calling agent.
#[derive(Debug, Clone, Copy)]
pub struct HandoffAsk<'a> {
    pub from: &'a AgentName,
    /// The target as written: any case, any surrounding spaces.
    pub to: &'a str,
    pub text: &'a str,
    pub followup: Option<Intent>,
}

/// What the guard needs to know, gathered by the caller.
#[derive(Debug, Clone, Copy)]
pub struct Situation<'a> {
    /// Every configured agent.
    pub agents: &'a [AgentName],
    pub max_depth: u32,
    /// The depth of the cause envelope (a Telegram message is 0, a handoff envelope its
    /// handoff's depth); `None` for an unprompted handoff.
    pub cause_depth: Option<u32>,
    /// Handoffs already made on behalf of the same cause: the turn. Empty when unprompted.
    pub this_turn: &'a [PriorHandoff],
    /// The caller's handoffs that are still open, from any turn.
    pub open: &'a [PriorHandoff],
}

/// A handoff the guard lets through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admitted {
    /// The target's configured name.
    pub target: AgentName,
    pub depth: u32,
    /// The earlier handoff a follow-up follows.
    pub followup_of: Option<HandoffId>,
    pub intent: Option<Intent>,
}

/// Why a handoff was refused. Every message says what happened and what to do next, and
/// every refusal means nothing was sent and nothing recorded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("{0}; nothing was sent")]
    Invalid(String),
    #[error("'{target}' is you: an agent cannot hand work to itself; nothing was sent")]
    SelfHandoff { target: AgentName },
    #[error("there is no agent '{name}' (the agents are: {}); nothing was sent", list(known))]
    UnknownAgent { name: String, known: Vec<AgentName> },
    #[error("the instruction is empty; nothing was sent")]
    EmptyText,
    #[error(
        "this handoff would be {depth} levels deep, beyond handoffs.max_depth ({max}): do the work yourself or \
         answer whoever handed it to you with `reply`; nothing was sent"
    )]
    DepthLimit { depth: u32, max: u32 },
    #[error("{}", already_delegated(target, first))]
    AlreadyDelegated { target: AgentName, first: PriorHandoff },
    #[error("{}", already_running(target, open))]
    AlreadyRunning { target: AgentName, open: PriorHandoff },
}

impl Refusal {
    /// The machine-readable code the tools and logs name.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Invalid(_) => "invalid_handoff",
            Self::SelfHandoff { .. } => "self_handoff",
            Self::UnknownAgent { .. } => "unknown_agent",
            Self::EmptyText => "empty_text",
            Self::DepthLimit { .. } => "depth_limit",
            Self::AlreadyDelegated { .. } => "already_delegated",
            Self::AlreadyRunning { .. } => "already_running",
        }
    }
}

fn list(agents: &[AgentName]) -> String {
    agents.iter().map(AgentName::as_str).collect::<Vec<_>>().join(", ")
}

fn quote(text: &str, chars: usize) -> String {
    let mut quoted: String = text.chars().take(chars).collect();
    if text.chars().count() > chars {
        quoted.push('…');
    }
    quoted
}

fn how_to_follow_up() -> &'static str {
    "If the plan changed, call again with followup: true and intent: \"extends\" (adds to the first \
     instruction) or \"replaces\" (supersedes it); the target sees it marked as a follow-up."
}

fn already_delegated(target: &AgentName, first: &PriorHandoff) -> String {
    format!(
        "already_delegated: in this turn you already instructed '{target}' as handoff {}, which is recorded and \
         stands (if your call that made it was cancelled or timed out, it went through all the same; its answer \
         arrives as a handoff_answer envelope): \"{}\". Nothing was sent now. {}",
        first.handoff_id,
        quote(&first.instruction, QUOTE_CHARS),
        how_to_follow_up()
    )
}

fn already_running(target: &AgentName, open: &PriorHandoff) -> String {
    let mut age = String::new();
    let secs = open.age.as_secs();
    if secs >= 60 {
        let _ = write!(age, "{}m", secs / 60);
    }
    let _ = write!(age, "{}s", secs % 60);
    format!(
        "already_running: your handoff {} to '{target}' is recorded and still open (for {age}): \"{}\". Its \
         answer will arrive as an envelope; nothing was sent. {}",
        open.handoff_id,
        quote(&open.instruction, START_CHARS),
        how_to_follow_up()
    )
}

/// Reads `followup` and `intent` as the tools receive them: `followup` must be a JSON
/// boolean, and `intent` goes with `followup: true` and only with it.
pub fn parse_followup(followup: Option<&Value>, intent: Option<&str>) -> Result<Option<Intent>, Refusal> {
    let followup = match followup {
        None | Some(Value::Null) | Some(Value::Bool(false)) => false,
        Some(Value::Bool(true)) => true,
        Some(other) => {
            return Err(Refusal::Invalid(format!(
                "followup must be the JSON boolean true or false, not {other}"
            )));
        }
    };
    match (followup, intent.map(str::trim)) {
        (false, None) => Ok(None),
        (false, Some(_)) => Err(Refusal::Invalid("intent only goes with followup: true".into())),
        (true, None) => Err(Refusal::Invalid(
            "followup: true needs intent: \"extends\" (adds to the earlier instruction) or \"replaces\" (supersedes it)"
                .into(),
        )),
        (true, Some(raw)) => Intent::parse(raw).map(Some).ok_or_else(|| {
            Refusal::Invalid(format!("intent must be \"extends\" or \"replaces\", not \"{raw}\""))
        }),
    }
}

/// Names compare trimmed and case-insensitively.
fn same_name(a: &str, b: &str) -> bool {
    a.trim().eq_ignore_ascii_case(b.trim())
}

/// Decides a handoff.
pub fn admit(ask: HandoffAsk<'_>, situation: Situation<'_>) -> Result<Admitted, Refusal> {
    // Refused before the guard: these record nothing, so a corrected call goes through.
    if same_name(ask.to, ask.from.as_str()) {
        return Err(Refusal::SelfHandoff { target: ask.from.clone() });
    }
    let target = situation
        .agents
        .iter()
        .find(|agent| same_name(agent.as_str(), ask.to))
        .ok_or_else(|| Refusal::UnknownAgent {
            name: ask.to.trim().to_owned(),
            known: situation.agents.to_vec(),
        })?
        .clone();
    if ask.text.trim().is_empty() {
        return Err(Refusal::EmptyText);
    }
    let depth = situation.cause_depth.map_or(1, |cause| cause + 1);
    if depth > situation.max_depth {
        return Err(Refusal::DepthLimit { depth, max: situation.max_depth });
    }

    let earlier_this_turn = situation.this_turn.iter().find(|prior| prior.to == target);
    // The most recent open one, should there be several.
    let still_open = situation.open.iter().rev().find(|prior| prior.to == target);
    match ask.followup {
        Some(intent) => Ok(Admitted {
            followup_of: earlier_this_turn.or(still_open).map(|prior| prior.handoff_id.clone()),
            intent: Some(intent),
            target,
            depth,
        }),
        None => {
            if let Some(first) = earlier_this_turn {
                return Err(Refusal::AlreadyDelegated { target, first: first.clone() });
            }
            if let Some(open) = still_open {
                return Err(Refusal::AlreadyRunning { target, open: open.clone() });
            }
            Ok(Admitted { target, depth, followup_of: None, intent: None })
        }
    }
}

/// What one envelope of a chain of handoffs is, as far as its depth goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Link {
    /// Made outside any handoff (a Telegram message, a room's turn): depth 0.
    Outside,
    /// A handoff's instruction, or a child's word that such a handoff no longer stands:
    /// that handoff's depth.
    Handoff { depth: u32 },
    /// The answer to a handoff, which sits where the handoff's cause sat: the next link is
    /// that cause, and an answer with no next link (to an unprompted handoff) is depth 0.
    Answer,
}

/// How deep the first envelope of `chain` sits, the chain being that envelope followed by
/// the causes its answers lead to: an answer is as deep as the turn it answers, however
/// many answers lead there, so a chain cannot start over by going through answers.
pub fn depth_of_chain(chain: &[Link]) -> u32 {
    chain
        .iter()
        .find_map(|link| match link {
            Link::Outside => Some(0),
            Link::Handoff { depth } => Some(*depth),
            Link::Answer => None,
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn name(raw: &str) -> AgentName {
        AgentName::parse(raw).unwrap()
    }

    fn agents() -> Vec<AgentName> {
        ["orchestrator", "editor", "writer"].map(name).to_vec()
    }

    fn prior(id: &str, to: &str, instruction: &str) -> PriorHandoff {
        PriorHandoff {
            handoff_id: id.into(),
            to: name(to),
            instruction: instruction.into(),
            age: Duration::from_secs(75),
        }
    }

    struct Turn {
        agents: Vec<AgentName>,
        this_turn: Vec<PriorHandoff>,
        open: Vec<PriorHandoff>,
        cause_depth: Option<u32>,
    }

    impl Turn {
        fn new() -> Self {
            Self { agents: agents(), this_turn: vec![], open: vec![], cause_depth: Some(0) }
        }

        fn ask(&self, to: &str, text: &str, followup: Option<Intent>) -> Result<Admitted, Refusal> {
            let from = name("orchestrator");
            admit(
                HandoffAsk { from: &from, to, text, followup },
                Situation {
                    agents: &self.agents,
                    max_depth: 3,
                    cause_depth: self.cause_depth,
                    this_turn: &self.this_turn,
                    open: &self.open,
                },
            )
        }

        /// What the ledger does with an admitted handoff: it joins the turn and is open.
        fn record(&mut self, id: &str, admitted: &Admitted, text: &str) {
            let recorded = prior(id, admitted.target.as_str(), text);
            self.this_turn.push(recorded.clone());
            self.open.push(recorded);
        }

        fn next_turn(&mut self) {
            self.this_turn.clear();
        }
    }

    #[test]
    fn the_first_instruction_stands_whatever_tool_or_case_the_second_uses() {
        let mut turn = Turn::new();
        let first = turn.ask("editor", "schedule it, do NOT publish", None).unwrap();
        assert_eq!(first.target, name("editor"));
        turn.record("hof_firstxxxxx", &first, "schedule it, do NOT publish");

        // send_to_agent and call_agent share the guard: the pure rule knows no tool.
        let refusal = turn.ask("Editor", "publish it NOW", None).unwrap_err();
        assert_eq!(refusal.code(), "already_delegated");
        let text = refusal.to_string();
        assert!(text.contains("do NOT publish") && text.contains("hof_firstxxxxx"), "{text}");
        assert!(text.contains("followup: true"), "{text}");
    }

    #[test]
    fn a_follow_up_passes_and_is_marked_as_one() {
        let mut turn = Turn::new();
        let first = turn.ask("editor", "schedule it, do NOT publish", None).unwrap();
        turn.record("hof_firstxxxxx", &first, "schedule it, do NOT publish");
        let follow_up = turn.ask("editor", "publish it NOW", Some(Intent::Replaces)).unwrap();
        assert_eq!(follow_up.followup_of.as_deref(), Some("hof_firstxxxxx"));
        assert_eq!(follow_up.intent, Some(Intent::Replaces));
    }

    #[test]
    fn a_different_target_passes() {
        let mut turn = Turn::new();
        let first = turn.ask("editor", "schedule it", None).unwrap();
        turn.record("hof_firstxxxxx", &first, "schedule it");
        assert_eq!(turn.ask("writer", "draft it", None).unwrap().target, name("writer"));
    }

    #[test]
    fn names_compare_trimmed_and_case_insensitively_and_errors_use_the_configured_name() {
        let mut turn = Turn::new();
        let first = turn.ask(" Editor ", "one", None).unwrap();
        assert_eq!(first.target, name("editor"));
        turn.record("hof_firstxxxxx", &first, "one");
        let refusal = turn.ask("editor", "two", None).unwrap_err();
        assert!(refusal.to_string().contains("instructed 'editor'"), "{refusal}");
    }

    #[test]
    fn refusals_before_the_guard_record_nothing_so_a_corrected_call_passes() {
        let mut turn = Turn::new();
        let unknown = turn.ask("editr", "do it", None).unwrap_err();
        assert_eq!(unknown.code(), "unknown_agent");
        assert!(unknown.to_string().contains("orchestrator, editor, writer"), "{unknown}");
        turn.cause_depth = Some(3);
        assert_eq!(turn.ask("editor", "do it", None).unwrap_err().code(), "depth_limit");
        turn.cause_depth = Some(0);
        // Nothing was recorded by the refusals: the corrected call is the turn's first.
        let admitted = turn.ask("editor", "do it", None).unwrap();
        assert_eq!((admitted.depth, admitted.followup_of), (1, None));
    }

    #[test]
    fn the_next_turn_starts_fresh_but_an_open_handoff_is_still_running() {
        let mut turn = Turn::new();
        let first = turn.ask("editor", "schedule it", None).unwrap();
        turn.record("hof_firstxxxxx", &first, "schedule it");
        turn.next_turn();
        let refusal = turn.ask("editor", "and this too", None).unwrap_err();
        assert_eq!(refusal.code(), "already_running");
        let text = refusal.to_string();
        assert!(
            text.contains("hof_firstxxxxx") && text.contains("1m15s") && text.contains("schedule it"),
            "{text}"
        );
        assert!(text.contains("will arrive as an envelope"), "{text}");
        // Closed (or answered) handoffs are not open: the next instruction goes through.
        turn.open.clear();
        assert!(turn.ask("editor", "and this too", None).is_ok());
    }

    #[test]
    fn another_senders_open_handoff_does_not_block() {
        // The caller's open list holds only its own handoffs; another agent's are not in it.
        let turn = Turn::new();
        assert!(turn.ask("editor", "go", None).is_ok());
    }

    #[test]
    fn a_self_handoff_is_refused_in_any_case() {
        let turn = Turn::new();
        for to in ["orchestrator", "Orchestrator", " ORCHESTRATOR "] {
            assert_eq!(turn.ask(to, "do it", None).unwrap_err().code(), "self_handoff", "{to}");
        }
    }

    #[test]
    fn empty_text_is_refused() {
        assert_eq!(Turn::new().ask("editor", "  \n", None).unwrap_err(), Refusal::EmptyText);
    }

    #[test]
    fn depth_counts_from_the_cause() {
        let mut turn = Turn::new();
        turn.cause_depth = None;
        assert_eq!(turn.ask("editor", "unprompted", None).unwrap().depth, 1);
        turn.cause_depth = Some(2);
        assert_eq!(turn.ask("editor", "deeper", None).unwrap().depth, 3);
        turn.cause_depth = Some(3);
        assert_eq!(
            turn.ask("editor", "too deep", None).unwrap_err(),
            Refusal::DepthLimit { depth: 4, max: 3 }
        );
    }

    #[test]
    fn the_quote_is_the_first_400_characters() {
        let long = "x".repeat(1000);
        let refusal = Refusal::AlreadyDelegated {
            target: name("editor"),
            first: prior("hof_axxxxxxxxx", "editor", &long),
        };
        let text = refusal.to_string();
        assert!(text.contains(&format!("\"{}…\"", "x".repeat(QUOTE_CHARS))), "{text}");
    }

    #[test]
    fn followup_must_be_a_boolean_with_an_intent() {
        assert_eq!(parse_followup(None, None), Ok(None));
        assert_eq!(parse_followup(Some(&json!(false)), None), Ok(None));
        assert_eq!(parse_followup(Some(&json!(true)), Some("extends")), Ok(Some(Intent::Extends)));
        assert_eq!(parse_followup(Some(&json!(true)), Some("replaces")), Ok(Some(Intent::Replaces)));
        for (followup, intent, needle) in [
            (json!("true"), Some("extends"), "JSON boolean"),
            (json!(1), Some("extends"), "JSON boolean"),
            (json!(true), None, "needs intent"),
            (json!(true), Some("amends"), "\"extends\" or \"replaces\""),
            (json!(false), Some("extends"), "only goes with followup"),
        ] {
            let refusal = parse_followup(Some(&followup), intent).unwrap_err();
            assert_eq!(refusal.code(), "invalid_handoff");
            assert!(refusal.to_string().contains(needle), "{followup} {intent:?}: {refusal}");
        }
    }

    #[test]
    fn an_answer_sits_as_deep_as_the_turn_it_answers_however_many_answers_lead_there() {
        use super::Link::*;
        assert_eq!(depth_of_chain(&[Outside]), 0);
        assert_eq!(depth_of_chain(&[Handoff { depth: 2 }]), 2);
        // An answer to a handoff made for a Telegram message, and for a handoff envelope.
        assert_eq!(depth_of_chain(&[Answer, Outside]), 0);
        assert_eq!(depth_of_chain(&[Answer, Handoff { depth: 1 }]), 1);
        // Answers in a row: the depth is the first non-answer's, not 0.
        assert_eq!(depth_of_chain(&[Answer, Answer, Handoff { depth: 1 }]), 1);
        assert_eq!(depth_of_chain(&[Answer, Answer, Answer, Handoff { depth: 2 }]), 2);
        // The answer to an unprompted handoff has no turn: 0.
        assert_eq!(depth_of_chain(&[Answer]), 0);
        assert_eq!(depth_of_chain(&[Answer, Answer]), 0);
    }
}
