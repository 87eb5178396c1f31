//! Shared test infrastructure: the real daemon binary, a real MCP client, and the usual
//! cast. The fake Telegram Bot API is `switchboard::fake_bot_api`, shared with the
//! benchmarks and `switchboard demo`.

pub mod agents;
pub mod daemon;
pub mod disk;
pub mod mcp;
pub mod postgres;
pub mod postgres_proxy;
pub mod proxy;
