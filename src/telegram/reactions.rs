//! The reactions Telegram lets a bot set (`ReactionTypeEmoji`,
//! <https://core.telegram.org/bots/api#reactiontypeemoji>). Pure: a reaction outside the
//! list is refused before anything is sent (Telegram would answer `REACTION_INVALID`).

/// Every emoji Telegram accepts as a reaction, as the Bot API lists them.
pub const ALLOWED_REACTIONS: &[&str] = &[
    "👍",
    "👎",
    "❤",
    "🔥",
    "🥰",
    "👏",
    "😁",
    "🤔",
    "🤯",
    "😱",
    "🤬",
    "😢",
    "🎉",
    "🤩",
    "🤮",
    "💩",
    "🙏",
    "👌",
    "🕊",
    "🤡",
    "🥱",
    "🥴",
    "😍",
    "🐳",
    "❤\u{200d}🔥",
    "🌚",
    "🌭",
    "💯",
    "🤣",
    "⚡",
    "🍌",
    "🏆",
    "💔",
    "🤨",
    "😐",
    "🍓",
    "🍾",
    "💋",
    "🖕",
    "😈",
    "😴",
    "😭",
    "🤓",
    "👻",
    "👨\u{200d}💻",
    "👀",
    "🎃",
    "🙈",
    "😇",
    "😨",
    "🤝",
    "✍",
    "🤗",
    "🫡",
    "🎅",
    "🎄",
    "☃",
    "💅",
    "🤪",
    "🗿",
    "🆒",
    "💘",
    "🙉",
    "🦄",
    "😘",
    "💊",
    "🙊",
    "😎",
    "👾",
    "🤷\u{200d}♂",
    "🤷",
    "🤷\u{200d}♀",
    "😡",
];

/// The reaction `raw` names, as Telegram spells it. An emoji typed with its presentation
/// selector (`❤️`, U+FE0F) is the same reaction as the listed one without it.
pub fn allowed_reaction(raw: &str) -> Result<&'static str, String> {
    let bare: String = raw.trim().chars().filter(|&c| c != '\u{fe0f}').collect();
    ALLOWED_REACTIONS.iter().copied().find(|&allowed| allowed == bare).ok_or_else(|| {
        format!(
            "{raw:?} is not a reaction Telegram allows; use one of {}. Nothing was sent",
            ALLOWED_REACTIONS.join(" ")
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listed_emoji_are_allowed_with_or_without_their_selector() {
        assert_eq!(allowed_reaction("👍"), Ok("👍"));
        assert_eq!(allowed_reaction("❤️"), Ok("❤"));
        assert_eq!(allowed_reaction(" 👀 "), Ok("👀"));
        assert_eq!(allowed_reaction("❤️\u{200d}🔥"), Ok("❤\u{200d}🔥"));
    }

    #[test]
    fn anything_else_is_refused_naming_the_allowed_ones() {
        for bad in ["🦀", "", "thumbs up", "👍👍", "+1"] {
            let refused = allowed_reaction(bad).unwrap_err();
            assert!(refused.contains("👍") && refused.contains("Nothing was sent"), "{bad}: {refused}");
        }
    }

    #[test]
    fn the_list_has_no_duplicates_and_no_selectors() {
        let mut seen = std::collections::HashSet::new();
        for emoji in ALLOWED_REACTIONS {
            assert!(seen.insert(emoji), "{emoji} twice");
            assert!(!emoji.contains('\u{fe0f}'), "{emoji}");
        }
        assert_eq!(ALLOWED_REACTIONS.len(), 73);
    }
}
