//! The edge to Telegram: updates come in through the [`poller`] and become
//! [`envelope`]s; replies go out through [`outbound`] as recorded attempts.
//! [`updates`] fetches `getUpdates` raw, so each update can be decoded on its own.

pub mod envelope;
pub mod lenient;
pub mod outbound;
pub mod poller;
pub mod updates;
