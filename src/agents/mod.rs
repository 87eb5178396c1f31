//! The edge to agent sessions: the [`bridge`] hands envelopes to sessions and carries
//! their replies back, the local [`api`] exposes it over loopback HTTP, and the
//! [`channel`] plugin is the MCP server an agent session starts.

pub mod api;
pub mod bridge;
pub mod channel;
pub mod permissions;
mod recent;
pub mod unfinished;
