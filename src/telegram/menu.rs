//! The bot's command menu (issue 22): the chat commands switchboard handles itself
//! (DESIGN.md §7, §11), registered with `setMyCommands` at start-up so Telegram offers
//! them. Best effort: a bot without the menu works the same.

use serde_json::json;

use super::bot_api::{BotApi, Exchange};

/// The commands and what Telegram's menu says of them.
pub const BOT_COMMANDS: &[(&str, &str)] = &[
    ("status", "What the current task is doing"),
    ("stop", "Stop the running exchange"),
    ("cancel", "Cancel the current task"),
    ("pause", "Pause the current task"),
    ("resume", "Resume a paused task"),
    ("new", "Start a new task: /new <what to do>"),
];

/// Registers [`BOT_COMMANDS`]; a failure is a warning, never fatal.
pub async fn register_commands(api: &BotApi) {
    let commands: Vec<_> = BOT_COMMANDS
        .iter()
        .map(|(command, description)| json!({ "command": command, "description": description }))
        .collect();
    match api.call("setMyCommands", &json!({ "commands": commands })).await {
        Exchange::Answered { status: 200, .. } => tracing::debug!("bot commands registered with Telegram"),
        other => {
            tracing::warn!(answer = ?other, "could not register the bot's commands with Telegram (setMyCommands); the menu may be out of date")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_valid_for_telegram() {
        // Telegram: 1–32 characters, lowercase letters, digits and underscores; a
        // description of 1–256 characters.
        for (command, description) in BOT_COMMANDS {
            assert!(!command.is_empty() && command.len() <= 32, "{command}");
            assert!(
                command.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'),
                "{command}"
            );
            assert!(!description.is_empty() && description.chars().count() <= 256, "{description}");
        }
    }
}
