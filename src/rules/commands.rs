//! How Telegram writes a command: `/name` at the start of a message, or in a group
//! `/name@botname`, addressed to one bot of several. Reading it is shared; what a command
//! means, and whether one addressed elsewhere counts, each caller decides.

/// Telegram's longest command name.
const MAX_COMMAND_NAME: usize = 32;

/// A command at the start of a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommandWord<'a> {
    /// What follows the slash, up to `@` or whitespace (`stop` in `/stop@sb_bot now`).
    pub name: &'a str,
    /// The bot after `@`, when one is named (possibly empty: `/stop@`).
    pub addressee: Option<&'a str>,
    /// The rest of the message after the command, trimmed.
    pub argument: &'a str,
}

/// The command `text` starts with, if it starts with one: a slash and at once a name of
/// Telegram's command letters (`a`–`z`, digits, `_`; at most 32). `/ stop` and a path such
/// as `/var/log is full` are no command, as Telegram does not mark them one.
///
/// ```
/// use switchboard::rules::commands::{CommandWord, command_word};
///
/// assert_eq!(
///     command_word("  /new@sb_bot write the report "),
///     Some(CommandWord { name: "new", addressee: Some("sb_bot"), argument: "write the report" })
/// );
/// assert_eq!(command_word("hello /stop"), None);
/// assert_eq!(command_word("/var/log is full"), None);
/// assert_eq!(command_word("/ stop"), None);
/// ```
pub fn command_word(text: &str) -> Option<CommandWord<'_>> {
    let rest = text.trim_start().strip_prefix('/')?;
    let (word, argument) = match rest.find(char::is_whitespace) {
        Some(end) => (&rest[..end], rest[end..].trim()),
        None => (rest, ""),
    };
    let (name, addressee) = match word.split_once('@') {
        Some((name, addressee)) => (name, Some(addressee)),
        None => (word, None),
    };
    let command_letters = |c: char| c.is_ascii_alphanumeric() || c == '_';
    (!name.is_empty() && name.len() <= MAX_COMMAND_NAME && name.chars().all(command_letters))
        .then_some(CommandWord { name, addressee, argument })
}

/// The bot a command is addressed to, when it is another bot than this one (`/stop@other`):
/// in a group with several bots, that command is theirs. `None` for a command to this bot
/// or to none, for no command, and while this bot's username is not known.
pub fn command_for_another_bot<'a>(text: &'a str, bot_username: Option<&str>) -> Option<&'a str> {
    let addressee = command_word(text)?.addressee.filter(|addressee| !addressee.is_empty())?;
    let bot = bot_username?.trim_start_matches('@');
    (!addressee.eq_ignore_ascii_case(bot)).then_some(addressee)
}
