//! The edge to Telegram: updates come in through the [`poller`] and become
//! [`envelope`]s; replies go out through [`outbound`] as recorded attempts.

pub mod bot_api;
pub mod envelope;
pub mod outbound;
pub mod poller;
