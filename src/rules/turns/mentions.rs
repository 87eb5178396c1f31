//! Who a room message summons (DESIGN.md §10, "Mentions").
//!
//! A mention is `@` and a run of letters, digits, `_` or `-`, where the `@` starts the text
//! or follows a character that is none of those nor `.` (so `me@naty.com` is an address,
//! not a mention). Tokens and aliases compare after [`normalise`]: lowercased, decomposed
//! (NFD) and stripped of combining marks, so `@Natália`, `@natalia` and `@Natali` + `a` +
//! U+0301 are one name. A token that no agent answers to (a human, the bot, a typo)
//! summons nobody.

use std::collections::HashMap;

use unicode_normalization::UnicodeNormalization;
use unicode_normalization::char::is_combining_mark;

use crate::ids::AgentName;

/// The form names are compared in: lowercase, decomposed, without combining marks.
/// Lowercasing comes first because it can itself produce marks (`İ` becomes `i` + U+0307).
///
/// ```
/// use switchboard::rules::turns::normalise;
///
/// assert_eq!(normalise("Natália"), "natalia");
/// assert_eq!(normalise("Natali\u{301}a"), "natalia");
/// ```
pub fn normalise(text: &str) -> String {
    text.chars().flat_map(char::to_lowercase).nfd().filter(|c| !is_combining_mark(*c)).collect()
}

/// A character that may be part of a mention token.
fn is_token_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_' || c == '-'
}

/// The tokens a text mentions, normalised and without the `@`, in order (repeats kept).
/// The text is normalised first, so a combining accent never splits a token and an
/// accented letter before an `@` still makes it an address.
pub fn mention_tokens(text: &str) -> Vec<String> {
    let text = normalise(text);
    let mut tokens = Vec::new();
    let mut prev: Option<char> = None;
    let mut chars = text.char_indices().peekable();
    while let Some((at, c)) = chars.next() {
        let starts_mention = c == '@' && !prev.is_some_and(|p| is_token_char(p) || p == '.');
        prev = Some(c);
        if !starts_mention {
            continue;
        }
        let start = at + c.len_utf8();
        let mut end = start;
        while let Some(&(i, t)) = chars.peek().filter(|(_, t)| is_token_char(*t)) {
            end = i + t.len_utf8();
            prev = Some(t);
            chars.next();
        }
        if end > start {
            tokens.push(text[start..end].to_owned());
        }
    }
    tokens
}

/// One agent of a room, as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoomMember {
    pub name: AgentName,
    /// What the room sees before the agent's replies (`Builder: …`); `None` is the name.
    pub display_name: Option<String>,
    /// Extra `@` names from the agent's `aliases` key.
    pub aliases: Vec<String>,
}

impl RoomMember {
    /// A member known by its name only.
    pub fn new(name: AgentName) -> Self {
        Self { name, display_name: None, aliases: Vec::new() }
    }

    pub fn with_display_name(mut self, display_name: impl Into<String>) -> Self {
        self.display_name = Some(display_name.into());
        self
    }

    pub fn with_aliases<S: Into<String>>(mut self, aliases: impl IntoIterator<Item = S>) -> Self {
        self.aliases = aliases.into_iter().map(Into::into).collect();
        self
    }

    /// The display name, or the name when none is configured.
    pub fn display_name(&self) -> &str {
        self.display_name.as_deref().unwrap_or(self.name.as_str())
    }

    /// Every name the agent answers to, as written (not normalised), in the order of
    /// §10: its name, its display name, the display name without spaces, each word of
    /// the display name, its configured aliases. Empty ones are left out.
    pub fn alias_forms(&self) -> Vec<String> {
        let display = self.display_name();
        let mut forms = vec![self.name.as_str().to_owned(), display.to_owned()];
        forms.push(display.split_whitespace().collect());
        forms.extend(display.split_whitespace().map(str::to_owned));
        forms.extend(self.aliases.iter().cloned());
        forms.retain(|form| !normalise(form).trim().is_empty());
        forms
    }
}

/// Why a room's members cannot make a roster. The config layer turns each into a
/// configuration error naming the route's `agents` key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RosterError {
    #[error("a room needs at least one agent")]
    NoMembers,
    #[error("agent '{0}' is listed twice in the room")]
    DuplicateMember(AgentName),
    /// Would let one agent answer to another's name (or steal it, if listed first).
    #[error(
        "agent '{agent}' answers to '{alias}', which is the name of agent '{other}' in the same room: remove \
         the alias or change its display name"
    )]
    AliasIsAgentName { agent: AgentName, alias: String, other: AgentName },
}

/// A room's members in room order, with the lookup from a normalised alias to the member
/// who owns it. Built once per room from the configuration; it cannot be empty.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoomRoster {
    members: Vec<RoomMember>,
    /// Normalised alias → index into `members`; an alias two agents share belongs to the
    /// first in room order.
    owners: HashMap<String, usize>,
}

impl RoomRoster {
    pub fn new(members: Vec<RoomMember>) -> Result<Self, RosterError> {
        if members.is_empty() {
            return Err(RosterError::NoMembers);
        }
        for (ix, member) in members.iter().enumerate() {
            if members[..ix].iter().any(|earlier| earlier.name == member.name) {
                return Err(RosterError::DuplicateMember(member.name.clone()));
            }
        }
        let names: Vec<String> = members.iter().map(|m| normalise(m.name.as_str())).collect();
        for (ix, member) in members.iter().enumerate() {
            for alias in member.alias_forms() {
                let key = normalise(&alias);
                let taken = names.iter().enumerate().find(|&(other, name)| other != ix && *name == key);
                if let Some((other, _)) = taken {
                    return Err(RosterError::AliasIsAgentName {
                        agent: member.name.clone(),
                        alias,
                        other: members[other].name.clone(),
                    });
                }
            }
        }
        let mut owners = HashMap::new();
        for (ix, member) in members.iter().enumerate() {
            for alias in member.alias_forms() {
                owners.entry(normalise(&alias)).or_insert(ix);
            }
        }
        Ok(Self { members, owners })
    }

    /// In room order; never empty.
    pub fn members(&self) -> &[RoomMember] {
        &self.members
    }

    /// The agent that answers a message with no mention.
    pub fn first(&self) -> &RoomMember {
        &self.members[0]
    }

    /// The index of the member a token (with or without its `@`, in any case or accent)
    /// names, if any.
    pub fn lookup(&self, token: &str) -> Option<usize> {
        self.owners.get(&normalise(token.strip_prefix('@').unwrap_or(token))).copied()
    }

    /// The member with this configured name.
    pub fn get(&self, name: &AgentName) -> Option<&RoomMember> {
        self.members.iter().find(|m| m.name == *name)
    }

    /// How the room labels an agent: its display name, or the bare name of one that has
    /// left the room since (a configuration reload).
    pub fn label<'a>(&'a self, name: &'a AgentName) -> &'a str {
        self.get(name).map_or(name.as_str(), RoomMember::display_name)
    }

    /// The members a text mentions, in mention order, each once.
    pub fn mentions(&self, text: &str) -> Vec<&RoomMember> {
        let mut found: Vec<usize> = Vec::new();
        for ix in mention_tokens(text).iter().filter_map(|token| self.owners.get(token)) {
            if !found.contains(ix) {
                found.push(*ix);
            }
        }
        found.into_iter().map(|ix| &self.members[ix]).collect()
    }
}

/// The members a text mentions, in mention order, each once: [`RoomRoster::mentions`].
pub fn mentions<'r>(roster: &'r RoomRoster, text: &str) -> Vec<&'r RoomMember> {
    roster.mentions(text)
}

#[cfg(test)]
pub(crate) mod tests {
    use proptest::prelude::*;

    use super::*;

    pub(crate) fn agent(name: &str) -> AgentName {
        AgentName::parse(name).unwrap()
    }

    /// The room of the ported cases: agents `candela` "Candela" and `naty` "Natalia"
    /// (the owner is the human).
    pub(crate) fn room() -> RoomRoster {
        RoomRoster::new(vec![
            RoomMember::new(agent("candela")).with_display_name("Candela"),
            RoomMember::new(agent("naty")).with_display_name("Natalia"),
        ])
        .unwrap()
    }

    fn names(roster: &RoomRoster, text: &str) -> Vec<String> {
        mentions(roster, text).iter().map(|m| m.name.to_string()).collect()
    }

    // The ported cases.

    #[test]
    fn a_mention_by_name() {
        assert_eq!(names(&room(), "hola @naty"), ["naty"]);
    }

    #[test]
    fn a_mention_by_display_name() {
        assert_eq!(names(&room(), "che @Natalia"), ["naty"]);
    }

    #[test]
    fn mentions_in_order_and_any_case() {
        assert_eq!(names(&room(), "@CANDELA y @naty"), ["candela", "naty"]);
    }

    #[test]
    fn unknown_tokens_summon_nobody() {
        assert!(names(&room(), "@nadie @roby").is_empty());
    }

    #[test]
    fn an_email_address_is_no_mention() {
        assert!(names(&room(), "mail me@example.com").is_empty());
    }

    #[test]
    fn a_bare_name_is_no_mention() {
        assert!(names(&room(), "naty, candela, Natalia: hola").is_empty());
    }

    // What the runtime these cases come from got wrong or left open.

    #[test]
    fn an_address_at_an_agents_name_is_no_mention() {
        let roster = room();
        assert!(names(&roster, "write to me@naty.com").is_empty());
        assert!(names(&roster, "x.@naty y_@naty z-@naty 9@naty").is_empty());
        assert!(names(&roster, "é@naty").is_empty(), "an accented letter is still a letter");
    }

    #[test]
    fn a_mention_may_follow_punctuation_or_start_the_text() {
        assert_eq!(names(&room(), "@naty"), ["naty"]);
        assert_eq!(names(&room(), "(@naty) \"@candela\""), ["naty", "candela"]);
        assert_eq!(names(&room(), "ok,@naty"), ["naty"]);
    }

    #[test]
    fn whole_tokens_only() {
        let roster = room();
        assert!(names(&roster, "@natyx @nat @naty_2 @naty-bot").is_empty());
        assert_eq!(names(&roster, "@naty, @candela. @naty!"), ["naty", "candela"]);
    }

    #[test]
    fn precomposed_and_decomposed_accents_match() {
        let roster = room();
        assert_eq!(names(&roster, "@Natália"), ["naty"]);
        assert_eq!(names(&roster, "@Natali\u{301}a"), ["naty"]);
        assert_eq!(names(&roster, "@NATALIA"), ["naty"]);
        let accented =
            RoomRoster::new(vec![RoomMember::new(agent("nat")).with_display_name("Natália")]).unwrap();
        for text in ["@natalia", "@Natália", "@Natali\u{301}a", "@NATÁLIA"] {
            assert_eq!(names(&accented, text), ["nat"], "{text}");
        }
    }

    #[test]
    fn each_agent_once_in_first_mention_order() {
        assert_eq!(names(&room(), "@naty @Natalia @candela @NATY"), ["naty", "candela"]);
    }

    #[test]
    fn the_human_or_the_bot_summon_nobody() {
        assert!(names(&room(), "@owner @switchboard_bot").is_empty());
    }

    #[test]
    fn every_alias_form_answers() {
        let roster = RoomRoster::new(vec![
            RoomMember::new(agent("rev")).with_display_name("Code Reviewer").with_aliases(["bob"]),
        ])
        .unwrap();
        for text in ["@rev", "@CodeReviewer", "@code", "@reviewer", "@Bob"] {
            assert_eq!(names(&roster, text), ["rev"], "{text}");
        }
        assert!(names(&roster, "@code-reviewer").is_empty());
    }

    #[test]
    fn a_shared_name_word_belongs_to_the_first_in_room_order() {
        let roster = RoomRoster::new(vec![
            RoomMember::new(agent("builder")).with_display_name("Code Builder"),
            RoomMember::new(agent("reviewer")).with_display_name("Code Reviewer"),
        ])
        .unwrap();
        assert_eq!(names(&roster, "@code"), ["builder"]);
        assert_eq!(names(&roster, "@reviewer @code"), ["reviewer", "builder"]);
        assert_eq!(roster.lookup("@Code"), Some(0));
        assert_eq!(roster.lookup("CODE"), Some(0));
    }

    #[test]
    fn lookup_finds_the_member_index() {
        let roster = room();
        assert_eq!(roster.lookup("natalia"), Some(1));
        assert_eq!(roster.lookup("@Candela"), Some(0));
        assert_eq!(roster.lookup("owner"), None);
    }

    #[test]
    fn an_alias_that_is_another_agents_name_is_refused_naming_both() {
        let err = RoomRoster::new(vec![
            RoomMember::new(agent("candela")).with_aliases(["Naty"]),
            RoomMember::new(agent("naty")),
        ])
        .unwrap_err();
        assert_eq!(
            err,
            RosterError::AliasIsAgentName {
                agent: agent("candela"),
                alias: "Naty".into(),
                other: agent("naty")
            }
        );
        let message = err.to_string();
        assert!(message.contains("'candela'") && message.contains("'naty'"), "{message}");

        // A display name word counts too, and so does a later agent stealing an earlier name.
        let err = RoomRoster::new(vec![
            RoomMember::new(agent("builder")),
            RoomMember::new(agent("reviewer")).with_display_name("Builder's Reviewer Builder"),
        ])
        .unwrap_err();
        assert!(
            matches!(err, RosterError::AliasIsAgentName { ref alias, .. } if alias == "Builder"),
            "{err:?}"
        );
    }

    #[test]
    fn other_rosters_are_refused() {
        assert_eq!(RoomRoster::new(vec![]), Err(RosterError::NoMembers));
        assert_eq!(
            RoomRoster::new(vec![RoomMember::new(agent("a")), RoomMember::new(agent("a"))]),
            Err(RosterError::DuplicateMember(agent("a")))
        );
        // An agent's own name among its aliases is no collision.
        assert!(RoomRoster::new(vec![RoomMember::new(agent("a")).with_aliases(["A"])]).is_ok());
    }

    #[test]
    fn labels_use_the_display_name() {
        let roster = room();
        assert_eq!(roster.label(&agent("naty")), "Natalia");
        assert_eq!(roster.label(&agent("gone")), "gone");
        assert_eq!(RoomMember::new(agent("solo")).display_name(), "solo");
    }

    /// A way to write an alias that must still resolve.
    fn spelling() -> impl Strategy<Value = fn(&str) -> String> {
        prop_oneof![
            Just((|s: &str| s.to_owned()) as fn(&str) -> String),
            Just((|s: &str| s.to_uppercase()) as fn(&str) -> String),
            Just((|s: &str| s.nfd().collect()) as fn(&str) -> String),
            Just((|s: &str| s.nfc().collect()) as fn(&str) -> String),
        ]
    }

    proptest! {
        #[test]
        fn normalising_is_idempotent(text in any::<String>()) {
            let once = normalise(&text);
            prop_assert_eq!(normalise(&once), once);
        }

        #[test]
        fn mentions_never_panic(text in any::<String>()) {
            let _ = mentions(&room(), &text);
        }

        /// Texts made of plain words and mentions of known and unknown names, separated by
        /// characters that end a token: the mentioned agents are found, in order, once.
        #[test]
        fn mentions_match_a_model(
            pieces in prop::collection::vec(
                (0usize..6, spelling(), prop::sample::select(vec![" ", ", ", "\n", " (", "! ", ": "])),
                0..12,
            )
        ) {
            let roster = RoomRoster::new(vec![
                RoomMember::new(agent("candela")).with_display_name("Candela Ñúñez"),
                RoomMember::new(agent("naty")).with_display_name("Natália"),
            ]).unwrap();
            // 0..=3 mention an agent, 4 a stranger, 5 is a plain word.
            let words = ["candela", "Ñúñez", "naty", "Natália", "roby", "hola"];
            let owners = [Some("candela"), Some("candela"), Some("naty"), Some("naty"), None, None];
            let mut text = String::new();
            let mut expected: Vec<&str> = Vec::new();
            for (word, spell, sep) in &pieces {
                if *word < 5 {
                    text.push('@');
                }
                text.push_str(&spell(words[*word]));
                text.push_str(sep);
                if let Some(owner) = owners[*word].filter(|o| !expected.contains(o)) {
                    expected.push(owner);
                }
            }
            prop_assert_eq!(names(&roster, &text), expected);
        }
    }
}
