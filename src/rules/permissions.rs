//! The pure parts of the permission relay (DESIGN.md §15): the ids a prompt's buttons
//! carry, an approver's text answer, what a press means, and every text of a prompt.
//!
//! A prompt's `callback_data` is the switchboard's own opaque id of the request and a
//! one-letter action, never anything of the request itself: Telegram hands the data back
//! as the presser's client sent it, so it is read as untrusted input and only ever looked
//! up in the ledger.

use chrono::{DateTime, Utc};

use crate::clock::for_people;

/// Telegram's limit on `callback_data`, in bytes.
pub const CALLBACK_DATA_LIMIT: usize = 64;

/// What every switchboard `callback_data` begins with, so data of other bots' buttons (or
/// of a later kind of ours) is told apart.
const CALLBACK_PREFIX: &str = "sbp";

/// The prefix of a permission request's id (`prm_…`).
pub const PERMISSION_ID_PREFIX: &str = "prm_";

/// Random characters after [`PERMISSION_ID_PREFIX`]: too many to guess a live one.
pub const PERMISSION_ID_SUFFIX_LEN: usize = 16;

/// At most this much of the description is shown before More is pressed.
const SHORT_DESCRIPTION_CHARS: usize = 300;

/// At most this much of the description and of the preview after More: a Telegram
/// message holds 4096 characters, and the rest of the prompt needs some.
const FULL_FIELD_CHARS: usize = 1500;

/// A verdict, as the buttons and the text answers give it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Allow,
    Deny,
}

impl Verdict {
    /// The `behavior` Claude Code reads.
    pub fn behavior(self) -> &'static str {
        match self {
            Self::Allow => "allow",
            Self::Deny => "deny",
        }
    }
}

/// What a button does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PressAction {
    Answer(Verdict),
    /// Shows the full description and the pretty-printed preview.
    More,
}

impl PressAction {
    fn letter(self) -> char {
        match self {
            Self::Answer(Verdict::Allow) => 'a',
            Self::Answer(Verdict::Deny) => 'd',
            Self::More => 'm',
        }
    }

    fn from_letter(letter: &str) -> Option<Self> {
        Some(match letter {
            "a" => Self::Answer(Verdict::Allow),
            "d" => Self::Answer(Verdict::Deny),
            "m" => Self::More,
            _ => return None,
        })
    }
}

/// A button's data: which request, which action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Press {
    pub permission_id: String,
    pub action: PressAction,
}

/// Whether `id` has the shape of a permission id this switchboard makes.
pub fn is_permission_id(id: &str) -> bool {
    id.strip_prefix(PERMISSION_ID_PREFIX).is_some_and(|suffix| {
        suffix.len() == PERMISSION_ID_SUFFIX_LEN && suffix.chars().all(|c| c.is_ascii_alphanumeric())
    })
}

/// The `callback_data` of a button: `sbp:<id>:<action>`.
pub fn callback_data(permission_id: &str, action: PressAction) -> String {
    let data = format!("{CALLBACK_PREFIX}:{permission_id}:{}", action.letter());
    debug_assert!(data.len() <= CALLBACK_DATA_LIMIT, "callback data over Telegram's limit: {data}");
    data
}

/// Reads a button's data; `None` for anything this switchboard did not make.
pub fn parse_callback(data: &str) -> Option<Press> {
    if data.len() > CALLBACK_DATA_LIMIT {
        return None;
    }
    let mut parts = data.split(':');
    let (Some(CALLBACK_PREFIX), Some(id), Some(letter), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return None;
    };
    if !is_permission_id(id) {
        return None;
    }
    Some(Press { permission_id: id.to_owned(), action: PressAction::from_letter(letter)? })
}

/// Whether `id` is a request id as Claude Code makes them: five letters a–z without `l`
/// (so that it cannot be read as a `1` or an `I`).
pub fn is_claude_request_id(id: &str) -> bool {
    id.len() == 5 && id.bytes().all(|b| b.is_ascii_lowercase() && b != b'l')
}

/// An approver's text answer: `yes <id>` or `no <id>` (or `y`, `n`), case-insensitive,
/// with the request id the prompt shows: what Claude Code's own channels accept. Anything
/// else is not an answer (and goes where text goes).
pub fn parse_text_verdict(text: &str) -> Option<(Verdict, String)> {
    let mut words = text.split_whitespace();
    let (Some(word), Some(id), None) = (words.next(), words.next(), words.next()) else {
        return None;
    };
    let verdict = match word.to_ascii_lowercase().as_str() {
        "yes" | "y" => Verdict::Allow,
        "no" | "n" => Verdict::Deny,
        _ => return None,
    };
    let id = id.to_ascii_lowercase();
    is_claude_request_id(&id).then_some((verdict, id))
}

/// What the ledger says of the request a press names, and who pressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PressFacts<'a> {
    /// `None`: no request has the id the data names.
    pub request: Option<RequestFacts>,
    pub presser: i64,
    pub approvers: &'a [i64],
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestFacts {
    pub pending: bool,
    /// Its expiry has passed (the timer may not have marked it yet).
    pub past_expiry: bool,
}

/// What to do about a press (or a text answer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PressDecision {
    /// Record this verdict (the ledger still decides who was first).
    Record(Verdict),
    /// Show the full request.
    ShowMore,
    /// Change nothing; tell the presser why.
    Refuse(Refusal),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    NotAnApprover,
    /// An operator's question pressed by someone who is not an operator.
    NotAnOperator,
    /// The data names no request of this switchboard's.
    NoSuchRequest,
    /// Answered, or expired.
    NoLongerPending,
}

impl Refusal {
    /// The short explanation the presser sees (`answerCallbackQuery`'s text).
    pub fn explanation(self) -> &'static str {
        match self {
            Self::NotAnApprover => "Only an approver of this agent can answer; nothing changed.",
            Self::NotAnOperator => "Only an operator can answer; nothing changed.",
            Self::NoSuchRequest => "This button names no permission request; nothing changed.",
            Self::NoLongerPending => "This request was already answered or has expired; nothing changed.",
        }
    }
}

/// Decides a press: only an approver, only while the request is pending. More is shown to
/// approvers only too, since it reveals the whole request.
pub fn decide_press(action: PressAction, facts: PressFacts<'_>) -> PressDecision {
    let Some(request) = facts.request else { return PressDecision::Refuse(Refusal::NoSuchRequest) };
    if !facts.approvers.contains(&facts.presser) {
        return PressDecision::Refuse(Refusal::NotAnApprover);
    }
    if !request.pending || request.past_expiry {
        return PressDecision::Refuse(Refusal::NoLongerPending);
    }
    match action {
        PressAction::Answer(verdict) => PressDecision::Record(verdict),
        PressAction::More => PressDecision::ShowMore,
    }
}

/// What a prompt shows of its request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PromptFacts<'a> {
    pub agent: &'a str,
    pub request_id: &'a str,
    pub tool_name: &'a str,
    pub description: &'a str,
    pub input_preview: &'a str,
}

/// How a prompt ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PromptEnd<'a> {
    Answered { verdict: Verdict, by: &'a str, at: DateTime<Utc> },
    Expired,
}

/// Escapes text for Telegram's HTML parse mode: `&`, `<` and `>` are all it needs.
pub fn escape_html(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            c => out.push(c),
        }
    }
    out
}

fn cut(text: &str, chars: usize) -> String {
    match text.char_indices().nth(chars) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_owned(),
    }
}

/// The preview pretty-printed when it is whole JSON (Claude Code cuts it at 200
/// characters, which often leaves it unparseable: then it is shown as it came).
pub fn pretty_preview(preview: &str) -> String {
    serde_json::from_str::<serde_json::Value>(preview)
        .ok()
        .and_then(|value| serde_json::to_string_pretty(&value).ok())
        .unwrap_or_else(|| preview.to_owned())
}

fn heading(facts: &PromptFacts<'_>) -> String {
    format!("🔐 <b>{}</b> asks to use <b>{}</b>", escape_html(facts.agent), escape_html(facts.tool_name))
}

/// The prompt as first posted, with the Allow / Deny / More buttons under it.
pub fn prompt_text(facts: &PromptFacts<'_>) -> String {
    format!(
        "{}\n{}\n<pre>{}</pre>\nOr reply <code>yes {id}</code> / <code>no {id}</code>.",
        heading(facts),
        escape_html(&cut(facts.description, SHORT_DESCRIPTION_CHARS)),
        escape_html(&cut(facts.input_preview, FULL_FIELD_CHARS)),
        id = escape_html(facts.request_id),
    )
}

/// The prompt after More: the whole description and the preview pretty-printed.
pub fn full_prompt_text(facts: &PromptFacts<'_>) -> String {
    format!(
        "{}\n{}\n<pre>{}</pre>\nOr reply <code>yes {id}</code> / <code>no {id}</code>.",
        heading(facts),
        escape_html(&cut(facts.description, FULL_FIELD_CHARS)),
        escape_html(&cut(&pretty_preview(facts.input_preview), FULL_FIELD_CHARS)),
        id = escape_html(facts.request_id),
    )
}

/// The prompt once its request is over: what it was and what came of it, no buttons.
pub fn final_prompt_text(facts: &PromptFacts<'_>, end: PromptEnd<'_>) -> String {
    let outcome = match end {
        PromptEnd::Answered { verdict: Verdict::Allow, by, at } => {
            format!("✅ <b>Allowed</b> by {} at {}", escape_html(by), escape_html(&for_people(at)))
        }
        PromptEnd::Answered { verdict: Verdict::Deny, by, at } => {
            format!("❌ <b>Denied</b> by {} at {}", escape_html(by), escape_html(&for_people(at)))
        }
        PromptEnd::Expired => "⌛ <b>Expired</b> — answer at the terminal".to_owned(),
    };
    format!(
        "{}\n{}\n<pre>{}</pre>\n{outcome}",
        heading(facts),
        escape_html(&cut(facts.description, SHORT_DESCRIPTION_CHARS)),
        escape_html(&cut(facts.input_preview, FULL_FIELD_CHARS)),
    )
}

/// `2026-12-02T03:04:05.678Z` as `2026-12-02 03:04:05 UTC`; anything else as it is.
/// What every `callback_data` of an operator's question begins with.
const QUESTION_PREFIX: &str = "sbq";

/// The prefix of an operator's question's id (`opq_…`).
pub const QUESTION_ID_PREFIX: &str = "opq_";

/// What an operator says of an unresolved send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finding {
    Delivered,
    NotDelivered,
}

/// A press on an operator's question: which question, what it says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuestionPress {
    pub question_id: String,
    pub finding: Finding,
}

fn is_question_id(id: &str) -> bool {
    id.strip_prefix(QUESTION_ID_PREFIX).is_some_and(|suffix| {
        suffix.len() == PERMISSION_ID_SUFFIX_LEN && suffix.chars().all(|c| c.is_ascii_alphanumeric())
    })
}

/// The `callback_data` of a question's button: `sbq:<id>:y` (delivered) or `:n`.
pub fn question_callback_data(question_id: &str, finding: Finding) -> String {
    let letter = match finding {
        Finding::Delivered => 'y',
        Finding::NotDelivered => 'n',
    };
    format!("{QUESTION_PREFIX}:{question_id}:{letter}")
}

/// Reads a question button's data; `None` for anything else.
pub fn parse_question_callback(data: &str) -> Option<QuestionPress> {
    let mut parts = data.split(':');
    let (Some(QUESTION_PREFIX), Some(id), Some(letter), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return None;
    };
    let finding = match letter {
        "y" => Finding::Delivered,
        "n" => Finding::NotDelivered,
        _ => return None,
    };
    (data.len() <= CALLBACK_DATA_LIMIT && is_question_id(id))
        .then(|| QuestionPress { question_id: id.to_owned(), finding })
}

/// Whether `presser` may answer a question: an operator, while it is open.
pub fn decide_question(presser: i64, operators: &[i64], open: Option<bool>) -> Result<(), Refusal> {
    match open {
        None => Err(Refusal::NoSuchRequest),
        Some(_) if !operators.contains(&presser) => Err(Refusal::NotAnOperator),
        Some(false) => Err(Refusal::NoLongerPending),
        Some(true) => Ok(()),
    }
}

/// What a question shows of the send it asks about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuestionFacts<'a> {
    pub trace_id: &'a str,
    pub chat_id: i64,
    pub sent_at: DateTime<Utc>,
    pub text: &'a str,
}

/// How much of the send's text a question shows.
const QUESTION_TEXT_CHARS: usize = 200;

fn question_body(facts: &QuestionFacts<'_>) -> String {
    format!(
        "❓ <b>Did this reply arrive?</b> The daemon could not tell (<code>{}</code>).\nTo chat {} at {}:\n<pre>{}</pre>",
        escape_html(facts.trace_id),
        facts.chat_id,
        escape_html(&for_people(facts.sent_at)),
        escape_html(&cut(facts.text, QUESTION_TEXT_CHARS)),
    )
}

/// An operator's question, with Delivered / Not delivered buttons under it.
pub fn question_text(facts: &QuestionFacts<'_>) -> String {
    format!("{}\nLook in that chat, then answer.", question_body(facts))
}

/// A question once answered: what was found, by whom and when, no buttons.
pub fn final_question_text(
    facts: &QuestionFacts<'_>,
    found: Option<(Finding, &str, DateTime<Utc>)>,
) -> String {
    let outcome = match found {
        Some((Finding::Delivered, by, at)) => {
            format!("✅ <b>Delivered</b>, says {} at {}", escape_html(by), escape_html(&for_people(at)))
        }
        Some((Finding::NotDelivered, by, at)) => format!(
            "↩️ <b>Not delivered</b>, says {} at {}: the agent may answer again",
            escape_html(by),
            escape_html(&for_people(at))
        ),
        None => "Settled with <code>switchboard ledger reconcile</code>".to_owned(),
    };
    format!("{}\n{outcome}", question_body(facts))
}

/// The inline keyboard of an open question.
pub fn question_keyboard(question_id: &str) -> serde_json::Value {
    serde_json::json!({
        "inline_keyboard": [[
            { "text": "Delivered", "callback_data": question_callback_data(question_id, Finding::Delivered) },
            { "text": "Not delivered", "callback_data": question_callback_data(question_id, Finding::NotDelivered) },
        ]]
    })
}

/// The inline keyboard of a pending prompt.
pub fn keyboard(permission_id: &str) -> serde_json::Value {
    let button = |text: &str, action| serde_json::json!({ "text": text, "callback_data": callback_data(permission_id, action) });
    serde_json::json!({
        "inline_keyboard": [[
            button("Allow", PressAction::Answer(Verdict::Allow)),
            button("Deny", PressAction::Answer(Verdict::Deny)),
            button("More", PressAction::More),
        ]]
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "prm_abcdefgh12345678";

    #[test]
    fn callback_data_round_trips_and_fits_telegrams_limit() {
        for action in
            [PressAction::Answer(Verdict::Allow), PressAction::Answer(Verdict::Deny), PressAction::More]
        {
            let data = callback_data(ID, action);
            assert!(data.len() <= CALLBACK_DATA_LIMIT, "{data}");
            assert_eq!(parse_callback(&data), Some(Press { permission_id: ID.to_owned(), action }));
        }
    }

    #[test]
    fn forged_callback_data_is_not_read() {
        for data in [
            "",
            "sbp",
            "sbp:prm_abcdefgh12345678",
            "sbp:prm_abcdefgh12345678:x",
            "sbp:prm_abcdefgh12345678:a:extra",
            "xyz:prm_abcdefgh12345678:a",
            "sbp:prm_short:a",
            "sbp:prm_abcdefgh1234567!:a",
            "sbp:env_abcdefgh12345678:a",
            &format!("sbp:{ID}:a{}", " ".repeat(60)),
        ] {
            assert_eq!(parse_callback(data), None, "{data:?}");
        }
    }

    #[test]
    fn text_verdicts_are_yes_or_no_and_a_request_id_in_any_case() {
        assert_eq!(parse_text_verdict("yes abcde"), Some((Verdict::Allow, "abcde".into())));
        assert_eq!(parse_text_verdict("  No   ABCDE "), Some((Verdict::Deny, "abcde".into())));
        assert_eq!(parse_text_verdict("YES qwert"), Some((Verdict::Allow, "qwert".into())));
        assert_eq!(parse_text_verdict("y abcde"), Some((Verdict::Allow, "abcde".into())));
        assert_eq!(parse_text_verdict("N abcde"), Some((Verdict::Deny, "abcde".into())));
        for text in [
            "yes",
            "yes abcde please",
            "ok abcde",
            "yes abcd",
            "yes abcdef",
            "yes abcle",
            "yes abc1e",
            "ye abcde",
            "nope abcde",
        ] {
            assert_eq!(parse_text_verdict(text), None, "{text:?}");
        }
    }

    #[test]
    fn claude_request_ids_are_five_letters_without_l() {
        assert!(is_claude_request_id("abcde"));
        assert!(!is_claude_request_id("abcdl"));
        assert!(!is_claude_request_id("ABCDE"));
        assert!(!is_claude_request_id("abcd"));
    }

    fn facts(request: Option<RequestFacts>, presser: i64) -> PressFacts<'static> {
        PressFacts { request, presser, approvers: &[7, 8] }
    }

    const PENDING: RequestFacts = RequestFacts { pending: true, past_expiry: false };

    #[test]
    fn only_an_approver_answers_only_a_pending_request_in_time() {
        let allow = PressAction::Answer(Verdict::Allow);
        assert_eq!(decide_press(allow, facts(Some(PENDING), 7)), PressDecision::Record(Verdict::Allow));
        assert_eq!(decide_press(PressAction::More, facts(Some(PENDING), 8)), PressDecision::ShowMore);
        assert_eq!(
            decide_press(allow, facts(Some(PENDING), 9)),
            PressDecision::Refuse(Refusal::NotAnApprover)
        );
        assert_eq!(decide_press(allow, facts(None, 7)), PressDecision::Refuse(Refusal::NoSuchRequest));
        let answered = RequestFacts { pending: false, past_expiry: false };
        assert_eq!(
            decide_press(allow, facts(Some(answered), 7)),
            PressDecision::Refuse(Refusal::NoLongerPending)
        );
        let late = RequestFacts { pending: true, past_expiry: true };
        assert_eq!(
            decide_press(PressAction::More, facts(Some(late), 7)),
            PressDecision::Refuse(Refusal::NoLongerPending)
        );
    }

    fn prompt() -> PromptFacts<'static> {
        PromptFacts {
            agent: "orchestrator",
            request_id: "abcde",
            tool_name: "Bash",
            description: "Run <script> & friends",
            input_preview: "{\"command\":\"echo '<b>hi</b>'\"}",
        }
    }

    #[test]
    fn prompt_texts_escape_what_the_request_says() {
        for text in [
            prompt_text(&prompt()),
            full_prompt_text(&prompt()),
            final_prompt_text(&prompt(), PromptEnd::Expired),
        ] {
            assert!(text.contains("Run &lt;script&gt; &amp; friends"), "{text}");
            assert!(!text.contains("<script>") && !text.contains("<b>hi</b>"), "{text}");
        }
        assert!(prompt_text(&prompt()).contains("yes abcde"));
    }

    #[test]
    fn more_pretty_prints_a_whole_preview_and_keeps_a_cut_one() {
        let full = full_prompt_text(&prompt());
        assert!(full.contains("{\n  \"command\""), "{full}");
        assert_eq!(pretty_preview("{\"command\":\"ec"), "{\"command\":\"ec");
        let long = "x".repeat(SHORT_DESCRIPTION_CHARS + 50);
        let facts = PromptFacts { description: &long, ..prompt() };
        assert!(prompt_text(&facts).contains('…'));
        assert!(full_prompt_text(&facts).contains(&long));
    }

    /// Claude Code cuts a preview at 200 characters, but the daemon keeps up to 8192: a
    /// longer one made the prompt longer than a Telegram message, refused, and the request
    /// expired at once.
    #[test]
    fn every_prompt_fits_one_telegram_message_whatever_the_preview() {
        let long = "<".repeat(8_192);
        let facts = PromptFacts { input_preview: &long, description: &long, ..prompt() };
        for text in
            [prompt_text(&facts), full_prompt_text(&facts), final_prompt_text(&facts, PromptEnd::Expired)]
        {
            // Telegram counts what is shown: each escaped `&lt;` is one character.
            let shown = text.replace("&lt;", "<").chars().count();
            assert!(shown < 4_096, "{shown} characters");
        }
    }

    #[test]
    fn a_final_prompt_says_who_answered_and_when() {
        let at = DateTime::parse_from_rfc3339("2026-12-02T03:04:05.678Z").unwrap().with_timezone(&Utc);
        let allowed =
            final_prompt_text(&prompt(), PromptEnd::Answered { verdict: Verdict::Allow, by: "@ann", at });
        assert!(allowed.contains("Allowed") && allowed.contains("@ann") && allowed.contains("03:04:05 UTC"));
        let denied =
            final_prompt_text(&prompt(), PromptEnd::Answered { verdict: Verdict::Deny, by: "Bo", at });
        assert!(denied.contains("Denied") && denied.contains("Bo"));
        assert!(final_prompt_text(&prompt(), PromptEnd::Expired).contains("answer at the terminal"));
    }

    #[test]
    fn question_data_round_trips_and_only_operators_answer_open_questions() {
        let id = "opq_abcdefgh12345678";
        for finding in [Finding::Delivered, Finding::NotDelivered] {
            let data = question_callback_data(id, finding);
            assert!(data.len() <= CALLBACK_DATA_LIMIT);
            assert_eq!(
                parse_question_callback(&data),
                Some(QuestionPress { question_id: id.into(), finding })
            );
            assert_eq!(parse_callback(&data), None, "not a permission button");
        }
        for data in ["sbq:opq_short:y", "sbq:prm_abcdefgh12345678:y", "sbq:opq_abcdefgh12345678:a"] {
            assert_eq!(parse_question_callback(data), None, "{data}");
        }
        assert_eq!(decide_question(9, &[9], Some(true)), Ok(()));
        assert_eq!(decide_question(8, &[9], Some(true)), Err(Refusal::NotAnOperator));
        assert_eq!(decide_question(9, &[9], Some(false)), Err(Refusal::NoLongerPending));
        assert_eq!(decide_question(9, &[9], None), Err(Refusal::NoSuchRequest));
    }

    #[test]
    fn a_question_escapes_the_send_and_says_what_was_found() {
        let facts = QuestionFacts {
            trace_id: "env_abc",
            chat_id: 42,
            sent_at: DateTime::parse_from_rfc3339("2026-12-02T03:04:05.678Z").unwrap().with_timezone(&Utc),
            text: "<b>done</b>",
        };
        assert!(question_text(&facts).contains("&lt;b&gt;done"));
        let found = final_question_text(&facts, Some((Finding::NotDelivered, "@olga", facts.sent_at)));
        assert!(found.contains("Not delivered") && found.contains("@olga"));
        assert!(final_question_text(&facts, None).contains("reconcile"));
    }

    #[test]
    fn the_keyboard_carries_only_opaque_ids() {
        let keyboard = keyboard(ID).to_string();
        assert!(keyboard.contains("Allow") && keyboard.contains("Deny") && keyboard.contains("More"));
        assert!(keyboard.contains(&callback_data(ID, PressAction::More)));
    }
}
