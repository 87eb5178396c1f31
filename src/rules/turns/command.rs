//! What a human's message in a room asks for (DESIGN.md §10, §11): `/stop` (and `/cancel`,
//! which in a room means the same), or an ordinary message that starts an exchange.
//!
//! Telegram writes a command as `/name` or, in groups, `/name@botname`; a command addressed
//! to another bot in the same group is not ours to act on.

use crate::rules::commands::{CommandWord, command_for_another_bot, command_word};

/// What a room message is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoomInput<'a> {
    /// `/stop` or `/cancel`, bare or addressed to this bot: stop the running exchange.
    Stop,
    /// A command addressed to another bot (`/stop@otherbot`): nothing for this room to do.
    ForAnotherBot(&'a str),
    /// Anything else starts (or queues) an exchange.
    Message,
}

/// The commands that stop a room's exchange.
const STOP_COMMANDS: [&str; 2] = ["stop", "cancel"];

/// Reads a room message. `bot_username` is this bot's username when known (from
/// `getMe`); unknown, any `/stop@name` counts as a stop, since a stop that fails to stop
/// is the worse mistake.
///
/// ```
/// use switchboard::rules::turns::{RoomInput, room_input};
///
/// assert_eq!(room_input("/stop", Some("sb_bot")), RoomInput::Stop);
/// assert_eq!(room_input("/stop@SB_bot please", Some("sb_bot")), RoomInput::Stop);
/// assert_eq!(room_input("/stop@other_bot", Some("sb_bot")), RoomInput::ForAnotherBot("other_bot"));
/// assert_eq!(room_input("@builder stop that", Some("sb_bot")), RoomInput::Message);
/// ```
pub fn room_input<'a>(text: &'a str, bot_username: Option<&str>) -> RoomInput<'a> {
    // The command is what follows the slash at once: "/ stop" is no command.
    let Some(CommandWord { name, .. }) = command_word(text) else {
        return RoomInput::Message;
    };
    if let Some(addressee) = command_for_another_bot(text, bot_username) {
        return RoomInput::ForAnotherBot(addressee);
    }
    if STOP_COMMANDS.iter().any(|stop| name.eq_ignore_ascii_case(stop)) {
        RoomInput::Stop
    } else {
        RoomInput::Message
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOT: Option<&str> = Some("switchboard_bot");

    #[test]
    fn stop_and_cancel_stop_bare_or_addressed_to_this_bot() {
        for text in [
            "/stop",
            "  /stop  ",
            "/STOP",
            "/cancel",
            "/stop@switchboard_bot",
            "/stop@Switchboard_Bot",
            "/cancel@switchboard_bot",
            "/stop now, please",
            "/stop\nthat is enough",
        ] {
            assert_eq!(room_input(text, BOT), RoomInput::Stop, "{text:?}");
        }
    }

    #[test]
    fn a_command_for_another_bot_is_not_ours() {
        assert_eq!(room_input("/stop@other_bot", BOT), RoomInput::ForAnotherBot("other_bot"));
        assert_eq!(room_input("/help@other_bot", BOT), RoomInput::ForAnotherBot("other_bot"));
    }

    #[test]
    fn without_knowing_the_bots_name_any_addressed_stop_stops() {
        assert_eq!(room_input("/stop@other_bot", None), RoomInput::Stop);
        assert_eq!(room_input("/help@other_bot", None), RoomInput::Message);
    }

    #[test]
    fn malformed_or_lookalike_commands() {
        // A stop with an empty addressee is still a stop: better to stop once too often.
        assert_eq!(room_input("/stop@", BOT), RoomInput::Stop);
        for text in
            ["/stopper", "/ stop", "stop", "please /stop", "//stop", "/", "", "@switchboard_bot /stop"]
        {
            assert_eq!(room_input(text, BOT), RoomInput::Message, "{text:?}");
        }
        // Other commands are messages: the agents may know what to do with them.
        assert_eq!(room_input("/help", BOT), RoomInput::Message);
        assert_eq!(room_input("/status@switchboard_bot", BOT), RoomInput::Message);
    }
}
