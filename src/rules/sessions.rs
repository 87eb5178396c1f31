//! Who may open an agent's session: one session per agent is live, and the agent stays
//! with the plugin process that held it across a connection that died.
//!
//! A plugin process names itself (`plg_…`, the same across its reconnects). Its stream can
//! die without the daemon noticing for a while (a laptop that slept, a NAT that forgot the
//! connection): the plugin gives up on it after three missed heartbeats and opens another.
//! That newcomer is the same plugin, so it replaces the session the daemon still holds.
//! Another plugin (a second window in the same project) is refused while the agent's
//! session is live, and for a grace after it ended, so that the plugin that held it gets
//! it back rather than whoever reconnects first.

use std::time::{Duration, Instant};

/// The agent's live session, as far as admission cares.
#[derive(Debug, Clone, Copy)]
pub struct Live<'a> {
    /// The plugin process behind it, if it named itself.
    pub plugin: Option<&'a str>,
}

/// The agent is kept for `plugin` until `until`: its session ended a moment ago (or the
/// daemon just started, and it held the agent before).
#[derive(Debug, Clone, Copy)]
pub struct Reserved<'a> {
    pub plugin: &'a str,
    pub until: Instant,
}

/// What becomes of a newcomer that asks for the agent's session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// Nobody holds the agent: the newcomer's session opens.
    Open,
    /// The live session is the newcomer's own plugin's, whose stream died unnoticed: the
    /// newcomer replaces it.
    Replace,
    /// Another plugin's session is live.
    Connected,
    /// The agent is kept a little longer for the plugin that held it.
    Reserved { retry_in: Duration },
}

/// Decides on a newcomer (`plugin` as it named itself) from the agent's live session and
/// its reservation, `now`.
pub fn admit(
    live: Option<Live<'_>>,
    reserved: Option<Reserved<'_>>,
    plugin: Option<&str>,
    now: Instant,
) -> Admission {
    if let Some(live) = live {
        // A plugin that did not name itself can never prove it is the one connected.
        return match (live.plugin, plugin) {
            (Some(held), Some(newcomer)) if held == newcomer => Admission::Replace,
            _ => Admission::Connected,
        };
    }
    match reserved {
        Some(reserved) if reserved.until > now && Some(reserved.plugin) != plugin => {
            Admission::Reserved { retry_in: reserved.until - now }
        }
        _ => Admission::Open,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRACE: Duration = Duration::from_secs(10);

    #[test]
    fn a_free_agent_opens_for_anyone() {
        let now = Instant::now();
        assert_eq!(admit(None, None, Some("plg_a"), now), Admission::Open);
        assert_eq!(admit(None, None, None, now), Admission::Open);
    }

    #[test]
    fn the_same_plugin_replaces_its_own_session_and_nobody_else_does() {
        let now = Instant::now();
        let held = Live { plugin: Some("plg_a") };
        assert_eq!(admit(Some(held), None, Some("plg_a"), now), Admission::Replace);
        assert_eq!(admit(Some(held), None, Some("plg_b"), now), Admission::Connected);
        assert_eq!(admit(Some(held), None, None, now), Admission::Connected);
        let unnamed = Live { plugin: None };
        assert_eq!(admit(Some(unnamed), None, None, now), Admission::Connected, "no name, no proof");
    }

    #[test]
    fn a_reservation_keeps_others_out_until_it_ends() {
        let now = Instant::now();
        let reserved = Reserved { plugin: "plg_a", until: now + GRACE };
        assert_eq!(admit(None, Some(reserved), Some("plg_a"), now), Admission::Open);
        assert_eq!(admit(None, Some(reserved), Some("plg_b"), now), Admission::Reserved { retry_in: GRACE });
        assert_eq!(admit(None, Some(reserved), None, now), Admission::Reserved { retry_in: GRACE });
        assert_eq!(admit(None, Some(reserved), Some("plg_b"), now + GRACE), Admission::Open, "over");
    }
}
