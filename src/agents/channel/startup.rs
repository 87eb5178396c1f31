//! When the agent session can take channel notifications, and so when the plugin opens its
//! session stream with the daemon.
//!
//! An MCP client installs its handlers as it likes. Claude Code registers its handler for
//! `notifications/claude/channel` only after the handshake and after it listed the tools
//! (some milliseconds later, more on a loaded machine), and drops what arrives before
//! without a trace. A push made then is lost to the model while the daemon counts the
//! envelope as handed over. So the plugin opens the daemon's session stream only once the
//! client is ready: it sent `notifications/initialized` and listed the tools, and a short
//! settle has passed. Until then the daemon hands this session nothing; a client that
//! connects and leaves before (the health check of `claude mcp list`) takes nothing and
//! marks nothing redelivered.
//!
//! A tool call is a client that is ready by definition (it knows the tools, and the call
//! is bound to the session): it opens the stream at once. A client that never lists the
//! tools (a script, a harness that only takes notifications) gets its stream
//! [`NO_TOOL_LIST_WAIT`] after the handshake; Claude Code lists them within milliseconds,
//! and its health check leaves long before.
//!
//! [`Startup`] is the decision alone; `ChannelPlugin` feeds it what the client does.

use std::time::Duration;

/// Between the client's first `tools/list` and the first push. Claude Code 2.1 registered
/// its channel handler within about 80 ms of the handshake in every run of the real-client
/// harness (`../shared/realclient`, steps G and H); the settle is several times that, and
/// short next to the time a session takes to start.
pub(super) const SETTLE: Duration = Duration::from_millis(500);

/// How long after the handshake a client that has not listed the tools is taken to be
/// ready all the same.
pub(super) const NO_TOOL_LIST_WAIT: Duration = Duration::from_secs(2);

/// What the client did that tells the plugin about its readiness.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ClientEvent {
    /// `notifications/initialized`: the handshake is over.
    Initialized,
    /// `tools/list`: the client is registering the server's tools and, with them, its
    /// notification handlers.
    ListedTools,
    /// `tools/call`: the client uses the tools, so it is past its start-up.
    CalledTool,
    /// [`NO_TOOL_LIST_WAIT`] has passed since `Initialized`.
    WaitedForToolList,
}

/// Whether the client is ready yet, and whether the session stream was started.
#[derive(Debug, Default)]
pub(super) struct Startup {
    initialized: bool,
    listed_tools: bool,
    stream_started: bool,
}

impl Startup {
    /// Notes what the client did. `Some(delay)` exactly once: the stream is to be opened
    /// after `delay`.
    pub(super) fn on(&mut self, event: ClientEvent) -> Option<Duration> {
        if self.stream_started {
            return None;
        }
        let delay = match event {
            ClientEvent::Initialized => {
                self.initialized = true;
                self.listed_tools.then_some(SETTLE)
            }
            ClientEvent::ListedTools => {
                self.listed_tools = true;
                self.initialized.then_some(SETTLE)
            }
            ClientEvent::CalledTool => Some(Duration::ZERO),
            ClientEvent::WaitedForToolList => self.initialized.then_some(Duration::ZERO),
        };
        self.stream_started = delay.is_some();
        delay
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stream_waits_for_the_handshake_and_the_tool_list_then_a_settle() {
        let mut startup = Startup::default();
        assert_eq!(startup.on(ClientEvent::Initialized), None, "initialized alone is not ready");
        assert_eq!(startup.on(ClientEvent::ListedTools), Some(SETTLE));
        // Once started, nothing starts it again.
        assert_eq!(startup.on(ClientEvent::ListedTools), None);
        assert_eq!(startup.on(ClientEvent::CalledTool), None);
        assert_eq!(startup.on(ClientEvent::Initialized), None);
    }

    #[test]
    fn the_order_of_the_handshake_and_the_tool_list_does_not_matter() {
        let mut startup = Startup::default();
        assert_eq!(startup.on(ClientEvent::ListedTools), None, "a tool list before initialized is not ready");
        assert_eq!(startup.on(ClientEvent::Initialized), Some(SETTLE));
    }

    #[test]
    fn a_tool_call_opens_the_stream_at_once() {
        let mut startup = Startup::default();
        assert_eq!(startup.on(ClientEvent::Initialized), None);
        assert_eq!(startup.on(ClientEvent::CalledTool), Some(Duration::ZERO));
        assert_eq!(startup.on(ClientEvent::ListedTools), None);
    }

    #[test]
    fn a_client_that_never_lists_the_tools_gets_its_stream_after_a_wait() {
        let mut startup = Startup::default();
        assert_eq!(startup.on(ClientEvent::Initialized), None);
        assert_eq!(startup.on(ClientEvent::Initialized), None);
        assert_eq!(startup.on(ClientEvent::WaitedForToolList), Some(Duration::ZERO));
        assert_eq!(startup.on(ClientEvent::ListedTools), None);
    }

    #[test]
    fn the_wait_for_a_tool_list_changes_nothing_once_the_list_came() {
        let mut startup = Startup::default();
        assert_eq!(startup.on(ClientEvent::Initialized), None);
        assert_eq!(startup.on(ClientEvent::ListedTools), Some(SETTLE));
        assert_eq!(startup.on(ClientEvent::WaitedForToolList), None);
    }
}
