//! Group rooms (DESIGN.md §10) in the bridge: a room's agents take the floor one at a time,
//! each with a `room_turn` envelope, and their replies are posted under their names.
//!
//! * [`driver`]: the room driver, one task that owns every cascade. It is level-triggered:
//!   each pass reads the facts from the ledger (new room messages, the state of the current
//!   speaker's envelope, the clock) and applies the step they call for, so the same code
//!   that runs a live exchange also resumes one after `kill -9`.
//! * [`reply`]: a speaker's `reply` to its turn, claimed (one per turn) and posted as
//!   `<display name>: <text>` through the ordinary reply path.
//! * here: the rooms' configuration, the driver's bell, notices to sessions, and the meta
//!   a `room_turn` envelope carries.
//!
//! Who writes what: only the driver writes a cascade; a reply writes its turn's claim, an
//! ack its envelope's state. Every write is guarded by the facts it was decided on, so the
//! three never overwrite each other.

mod driver;
mod reply;

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

pub use driver::RoomDriver;

use super::{AgentSlot, Bridge};
use crate::agents::api::wire::DeliveredNotice;
use crate::config::RoomSettings;
use crate::ids::{AgentName, RouteName};
use crate::ledger::{LedgerResult, RoomCascadeState, StoredEnvelope};

/// The room routes, by route name.
pub type Rooms = BTreeMap<RouteName, RoomSettings>;

/// A room a reload took away (renamed, made a plain route, removed) is kept this long at
/// least: a batch routed just before the reload may still bring it a message.
const RETIRED_ROOM_GRACE: Duration = Duration::from_secs(60);

/// The bridge's part of the rooms.
pub(super) struct RoomHub {
    /// The rooms exchanges run in; swapped whole, so a reload never shows a half-changed room.
    config: RwLock<RoomsNow>,
    /// Rung when a room may have something to do: a room message was stored, a speaker
    /// replied or acked, a post finished.
    wake: Notify,
}

impl RoomHub {
    pub(super) fn new(rooms: Rooms) -> Self {
        let config = RoomsNow { rooms: Arc::new(rooms), retired: BTreeMap::new() };
        Self { config: RwLock::new(config), wake: Notify::new() }
    }
}

/// The rooms configured, and the rooms a reload took away while their exchanges run.
#[derive(Debug, Clone, Default)]
struct RoomsNow {
    rooms: Arc<Rooms>,
    /// Routes among `rooms` that the configuration no longer makes rooms, and since when:
    /// kept with their last settings so the exchanges a room accepted (and messages routed
    /// to it before the reload) run to their end rather than wait forever.
    retired: BTreeMap<RouteName, Instant>,
}

impl RoomsNow {
    /// After a reload: the configured rooms, and each room the reload takes away, kept as
    /// retired with its last settings.
    fn reloaded(&self, configured: Rooms, now: Instant) -> Self {
        let mut retired = self.retired.clone();
        retired.retain(|route, _| !configured.contains_key(route));
        let mut rooms = configured;
        for (route, settings) in self.rooms.iter() {
            if !rooms.contains_key(route) {
                retired.entry(route.clone()).or_insert(now);
                rooms.insert(route.clone(), settings.clone());
            }
        }
        Self { rooms: Arc::new(rooms), retired }
    }

    /// The retired rooms to forget: kept for the grace, and with no exchange left (`busy`:
    /// the routes with an exchange waiting or running).
    fn done_with(&self, busy: &[String], now: Instant) -> Vec<RouteName> {
        self.retired
            .iter()
            .filter(|(route, since)| {
                now.duration_since(**since) >= RETIRED_ROOM_GRACE && !busy.iter().any(|b| b == route.as_str())
            })
            .map(|(route, _)| route.clone())
            .collect()
    }
}

impl AgentSlot {
    /// The next notice for the live session, if any.
    pub(super) fn take_notice(&self) -> Option<DeliveredNotice> {
        self.notices.lock().unwrap_or_else(|p| p.into_inner()).pop_front()
    }
}

impl Bridge {
    /// Tells the room driver that a room may have something to do.
    pub fn wake_rooms(&self) {
        self.inner.rooms.wake.notify_one();
    }

    /// The rooms exchanges run in: those configured now, and those a reload took away
    /// while they had exchanges to finish.
    pub fn rooms(&self) -> Arc<Rooms> {
        Arc::clone(&self.inner.rooms.config.read().unwrap_or_else(|p| p.into_inner()).rooms)
    }

    /// Replaces the rooms' configuration (a reload). Running exchanges continue with the
    /// new rosters. A room the reload takes away (renamed, made a plain route, removed)
    /// keeps its last settings while it has exchanges: the messages it accepted, and those
    /// routed to it just before the reload, are answered as the room would have answered
    /// them, not left waiting or settled unanswered.
    pub fn set_rooms(&self, configured: Rooms) {
        {
            let mut now = self.inner.rooms.config.write().unwrap_or_else(|p| p.into_inner());
            let reloaded = now.reloaded(configured, Instant::now());
            for route in reloaded.retired.keys().filter(|route| !now.retired.contains_key(*route)) {
                tracing::info!(%route, "route '{route}' is no room in the new configuration: its exchanges run to their end with its last settings");
            }
            *now = reloaded;
        }
        self.wake_rooms();
    }

    /// Forgets the rooms a reload took away once their last exchange ended (`busy`: the
    /// routes with an exchange waiting or running).
    pub(super) fn forget_finished_retired_rooms(&self, busy: &[String]) {
        let mut now = self.inner.rooms.config.write().unwrap_or_else(|p| p.into_inner());
        let done = now.done_with(busy, Instant::now());
        if done.is_empty() {
            return;
        }
        let mut rooms = (*now.rooms).clone();
        for route in done {
            tracing::info!(%route, "the exchanges of route '{route}', no room any more, have ended");
            rooms.remove(&route);
            now.retired.remove(&route);
        }
        now.rooms = Arc::new(rooms);
    }

    /// Pushes a notice into the agent's live session. Without one it is dropped: the
    /// envelope it is about is redelivered with the same news in its meta.
    pub(super) fn notify(&self, agent: &AgentName, notice: DeliveredNotice) {
        let Some(slot) = self.inner.agents.get(agent) else { return };
        let connected = slot.session.lock().unwrap_or_else(|p| p.into_inner()).is_some();
        if !connected {
            tracing::debug!(%agent, trace_id = %notice.trace_id, kind = %notice.kind, "no live session for a notice: its envelope's meta carries it");
            return;
        }
        slot.notices.lock().unwrap_or_else(|p| p.into_inner()).push_back(notice);
        slot.wake.notify_one();
    }

    /// The meta a `room_turn` envelope carries beside the common keys (DESIGN.md §10):
    /// `cascade_id`, `speaker`, `cascade_limit`, `max_iters`, `summoned_by`, and where the
    /// room is; `stop_requested_by` once a `/stop` came during this turn.
    pub(super) async fn room_meta(
        &self,
        envelope: &StoredEnvelope,
    ) -> LedgerResult<BTreeMap<String, String>> {
        let mut meta = BTreeMap::new();
        let Some((turn, stored)) = self.inner.ledger.turn_of_envelope(envelope.id).await? else {
            return Ok(meta);
        };
        let cascade_limit = stored.cascade().map(|c| c.cascade_limit().get().to_string()).unwrap_or_default();
        meta.insert("cascade_id".to_owned(), stored.cascade_id.to_string());
        meta.insert("speaker".to_owned(), turn.speaker.to_string());
        meta.insert("cascade_limit".to_owned(), cascade_limit);
        meta.insert("max_iters".to_owned(), stored.max_iters.to_string());
        meta.insert("summoned_by".to_owned(), turn.summoned_by.clone());
        meta.insert("route".to_owned(), stored.route.clone());
        meta.insert("chat_id".to_owned(), stored.chat_id.to_string());
        if let Some(thread_id) = stored.thread_id {
            meta.insert("thread_id".to_owned(), thread_id.to_string());
        }
        if let Some(title) = envelope.chat_title.as_ref().filter(|title| !title.is_empty()) {
            meta.insert("chat_title".to_owned(), title.clone());
        }
        meta.insert("user".to_owned(), envelope.user());
        if let Some(room) =
            RouteName::parse(&stored.route).ok().and_then(|route| self.rooms().get(&route).cloned())
        {
            let agents: Vec<String> = room.roster.members().iter().map(|m| format!("@{}", m.name)).collect();
            meta.insert("room_agents".to_owned(), agents.join(" "));
        }
        if stored.state == RoomCascadeState::StopRequested && turn.ending.is_none() {
            meta.insert("stop_requested_by".to_owned(), stored.stop_by.clone().unwrap_or_default());
        }
        Ok(meta)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RoomLimits;
    use crate::rules::turns::{RoomMember, RoomRoster};

    fn room(route: &str, agent: &str) -> (RouteName, RoomSettings) {
        let member =
            RoomMember { name: AgentName::parse(agent).unwrap(), display_name: None, aliases: vec![] };
        let route = RouteName::parse(route).unwrap();
        let settings = RoomSettings {
            route: route.clone(),
            chat_id: -100,
            thread_id: None,
            roster: RoomRoster::new(vec![member]).unwrap(),
            limits: RoomLimits::default(),
        };
        (route, settings)
    }

    fn names(now: &RoomsNow) -> (Vec<&str>, Vec<&str>) {
        (
            now.rooms.keys().map(RouteName::as_str).collect(),
            now.retired.keys().map(RouteName::as_str).collect(),
        )
    }

    #[test]
    fn a_room_a_reload_takes_away_is_kept_until_its_exchanges_end_after_the_grace() {
        let start = Instant::now();
        let now =
            RoomsNow::default().reloaded(Rooms::from([room("dev", "builder"), room("ops", "critic")]), start);
        assert_eq!(names(&now), (vec!["dev", "ops"], vec![]));

        // `dev` renamed `dev-2`: `dev` stays, retired, with its last settings.
        let renamed = now.reloaded(Rooms::from([room("dev-2", "reviewer"), room("ops", "critic")]), start);
        assert_eq!(names(&renamed), (vec!["dev", "dev-2", "ops"], vec!["dev"]));
        assert_eq!(
            renamed.rooms[&RouteName::parse("dev").unwrap()].roster.members()[0].name.as_str(),
            "builder"
        );

        // Not within the grace, nor while it has an exchange.
        let later = start + RETIRED_ROOM_GRACE;
        assert!(renamed.done_with(&[], start).is_empty());
        assert!(renamed.done_with(&["dev".to_owned()], later).is_empty());
        assert_eq!(renamed.done_with(&["ops".to_owned()], later), [RouteName::parse("dev").unwrap()]);

        // A second reload keeps it retired since the first; a room again, it is configured.
        let again = renamed.reloaded(Rooms::from([room("ops", "critic")]), later);
        assert_eq!(again.retired[&RouteName::parse("dev").unwrap()], start);
        assert_eq!(names(&again), (vec!["dev", "dev-2", "ops"], vec!["dev", "dev-2"]));
        let back = again.reloaded(Rooms::from([room("dev", "reviewer")]), later);
        assert_eq!(names(&back), (vec!["dev", "dev-2", "ops"], vec!["dev-2", "ops"]));
        assert_eq!(
            back.rooms[&RouteName::parse("dev").unwrap()].roster.members()[0].name.as_str(),
            "reviewer"
        );
    }
}
