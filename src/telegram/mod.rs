//! The edge to Telegram: the [`poller`] fetches updates raw through [`updates`], or the
//! [`webhook`] takes them as Telegram pushes them; either way [`intake`] makes each an
//! [`envelope`] (or an audit row, when it is no work or cannot be decoded) and commits the
//! batch. Replies go out through [`outbound`] as recorded attempts.

pub mod bot_api;
pub mod envelope;
pub mod files;
pub mod format;
pub mod intake;
pub mod lenient;
pub mod menu;
pub mod outbound;
pub mod parts;
pub mod poller;
pub mod reactions;
pub mod relay;
pub mod typing;
pub mod updates;
pub mod webhook;
