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

use tokio::sync::Notify;

pub use driver::RoomDriver;

use super::{AgentSlot, Bridge};
use crate::agents::api::wire::DeliveredNotice;
use crate::config::RoomSettings;
use crate::ids::{AgentName, RouteName};
use crate::ledger::{LedgerResult, RoomCascadeState, StoredEnvelope};

/// The room routes, by route name.
pub type Rooms = BTreeMap<RouteName, RoomSettings>;

/// The bridge's part of the rooms.
pub(super) struct RoomHub {
    /// Swapped whole, so a reload never shows a half-changed room.
    config: RwLock<Arc<Rooms>>,
    /// Rung when a room may have something to do: a room message was stored, a speaker
    /// replied or acked, a post finished.
    wake: Notify,
}

impl RoomHub {
    pub(super) fn new(rooms: Rooms) -> Self {
        Self { config: RwLock::new(Arc::new(rooms)), wake: Notify::new() }
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

    /// The rooms as configured now.
    pub fn rooms(&self) -> Arc<Rooms> {
        Arc::clone(&self.inner.rooms.config.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// Replaces the rooms' configuration (a reload). Running exchanges continue with the
    /// new rosters; a room that is gone keeps its exchanges waiting until it comes back.
    pub fn set_rooms(&self, rooms: Rooms) {
        *self.inner.rooms.config.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(rooms);
        self.wake_rooms();
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
