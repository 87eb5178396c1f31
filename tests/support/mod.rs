//! Shared test infrastructure: a fake Telegram Bot API, the real daemon binary, and a real MCP client.

pub mod agents;
pub mod daemon;
pub mod fake_telegram;
pub mod mcp;
