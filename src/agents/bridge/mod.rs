//! The bridge between the ledger and agent sessions: each agent's inbox, its one live
//! session, and the tools the local API exposes (`pending`, `reply`, `ack`).
//!
//! Delivery to sessions is driven by the ledger: a session claims the agent's oldest
//! `queued` envelope, marks it `pending` and writes it to the session stream, and whoever
//! queued something rings a bell (`Notify`). Intake takes a shorter way to a session that
//! is connected: the transaction that records a batch also marks the agent's queued
//! envelopes `pending`, and once it committed they are handed to the session from memory
//! (see `AgentSlot::inbox`). Either way an envelope is never in memory only, and a crash
//! at any point leaves it `queued` or `pending`.
//!
//! Replies are decided and delivered in two steps. The decision (which envelope, which
//! parts) is serialised per agent and takes no Telegram I/O; the delivery then runs as a
//! task of its own that the request only awaits, so a caller that goes away (a cancelled
//! tool call, a dead plugin) cannot interrupt a send between its attempt and its outcome.

mod actions;
mod attachments;
mod error;
mod handoff;
mod permissions;
mod reactions;
mod reply;
mod room;
mod session;
mod tasks;
mod uploads;
mod waiting;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use futures::future::{BoxFuture, Shared};
use tokio::sync::{Notify, mpsc};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use attachments::{AttachmentDownload, AttachmentError};
pub use error::{ResolveError, SessionConflict, ToolError, Unauthorized};
pub use handoff::{AuditChat, HandoffRules};
pub use room::{RoomDriver, Rooms};
pub use session::OpenedSession;
pub use uploads::{Staging, UploadError};
pub use waiting::ShownWaiting;

use crate::agents::api::wire::{MessageActionReceipt, ReplyReceipt};
use crate::ids::{AgentName, Secret};
use crate::ledger::{Ledger, StoredEnvelope};
use crate::telegram::outbound::Outbound;

/// What the bridge takes from the configuration.
pub struct BridgeSettings {
    pub limits: ReplyLimits,
    pub handoff_rules: HandoffRules,
    /// How often an idle session stream carries a heartbeat (see
    /// [`HEARTBEAT_INTERVAL_SECS`](crate::agents::api::wire::HEARTBEAT_INTERVAL_SECS)).
    pub session_heartbeat: std::time::Duration,
}

/// Limits a reply must respect, from the configuration.
#[derive(Debug, Clone, Copy)]
pub struct ReplyLimits {
    /// `outbound.max_reply_parts`.
    pub max_reply_parts: usize,
    /// `outbound.ack_reaction`: set on each user message as it is handed to a session.
    pub ack_reaction: Option<&'static str>,
}

#[derive(Clone)]
pub struct Bridge {
    inner: Arc<Inner>,
}

struct Inner {
    ledger: Ledger,
    outbound: Outbound,
    agents: HashMap<AgentName, AgentSlot>,
    /// Replaced by a configuration reload (SIGHUP); read through `limits()`.
    limits: RwLock<ReplyLimits>,
    /// Replaced by a configuration reload; read through `handoff_rules()`.
    handoff_rules: RwLock<HandoffRules>,
    /// How often an idle session stream carries a heartbeat.
    session_heartbeat: std::time::Duration,
    /// Group rooms: their configuration and the bell of the room driver.
    rooms: room::RoomHub,
    /// Stops session streams when the daemon stops.
    shutdown: CancellationToken,
    /// Session tasks and reply deliveries, so the daemon can wait for them to finish.
    tasks: TaskTracker,
    /// This bot's username, once Telegram told it (`getMe`): `/pause@thisbot` is ours,
    /// `/pause@otherbot` is not.
    bot_username: std::sync::OnceLock<String>,
    /// The permission relay (DESIGN.md §15), once the daemon set it up.
    permissions: std::sync::OnceLock<crate::agents::permissions::PermissionRelay>,
    /// Rung when a session was handed envelopes or confirmed showing them
    /// ([`Bridge::shown_changed`]).
    shown_bell: Notify,
    /// The Bot API's file methods (`attachments`), set once at start-up.
    files: std::sync::OnceLock<Arc<crate::telegram::files::TelegramFiles>>,
    /// The staging folder of replies' files (`uploads`), set once at start-up.
    staging: std::sync::OnceLock<Arc<uploads::Staging>>,
}

/// A reply being delivered; every request with its id awaits the same outcome.
type RunningReply = Shared<BoxFuture<'static, Result<ReplyReceipt, ToolError>>>;

/// A reaction or an edit being made; every request with its id awaits the same outcome.
type RunningAction = Shared<BoxFuture<'static, Result<MessageActionReceipt, ToolError>>>;

struct AgentSlot {
    secret: Secret,
    /// Rung when something was queued for this agent.
    wake: Notify,
    /// The connected session, if any: at most one per agent.
    session: Mutex<Option<session::LiveSession>>,
    /// Whom the agent is kept for while no session is live: the plugin process whose
    /// session just ended. Locked after `session`, never before.
    reserved: Mutex<Option<session::Reservation>>,
    /// The live session's direct inbox, once it has taken over the envelopes a previous
    /// session left pending: intake passes it the envelopes it marked `pending` in the
    /// transaction that recorded them. The lock is held around every claim of this
    /// agent's envelopes (the session's, and intake's from before its transaction until
    /// after the hand-over), so the session gets them oldest first from either path.
    inbox: tokio::sync::Mutex<Option<mpsc::UnboundedSender<StoredEnvelope>>>,
    /// Serialises this agent's decisions (resolving a reply's envelope and claiming it, an
    /// ack), so two concurrent calls cannot both resolve to the same pending envelope.
    /// Never held across Telegram I/O: a rate-limit wait must not block `ack`.
    decisions: tokio::sync::Mutex<()>,
    /// Replies being delivered, and reactions and edits being made, right now.
    running: Mutex<Running>,
    /// Notices (DESIGN.md §8) for the live session, about envelopes it already has.
    notices: Mutex<std::collections::VecDeque<crate::agents::api::wire::DeliveredNotice>>,
    /// Rung when a permission verdict for this agent was recorded: the live session hands
    /// it over if its plugin asked (DESIGN.md §15).
    verdicts: Notify,
}

#[derive(Default)]
struct Running {
    by_request: HashMap<String, RunningReply>,
    /// The envelopes those replies answer: nothing else may be sent for them meanwhile.
    envelopes: HashSet<i64>,
    /// Reactions and edits, by request id.
    actions: HashMap<String, RunningAction>,
}

impl AgentSlot {
    fn running(&self) -> MutexGuard<'_, Running> {
        self.running.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Bridge {
    pub fn new(
        ledger: Ledger,
        outbound: Outbound,
        secrets: BTreeMap<AgentName, Secret>,
        settings: BridgeSettings,
        shutdown: CancellationToken,
        tasks: TaskTracker,
    ) -> Self {
        let agents = secrets
            .into_iter()
            .map(|(name, secret)| {
                let slot = AgentSlot {
                    secret,
                    wake: Notify::new(),
                    session: Mutex::new(None),
                    reserved: Mutex::new(None),
                    inbox: tokio::sync::Mutex::new(None),
                    decisions: tokio::sync::Mutex::new(()),
                    running: Mutex::default(),
                    notices: Mutex::default(),
                    verdicts: Notify::new(),
                };
                (name, slot)
            })
            .collect();
        let BridgeSettings { limits, handoff_rules, session_heartbeat } = settings;
        let (limits, handoff_rules) = (RwLock::new(limits), RwLock::new(handoff_rules));
        // No rooms until `set_rooms`: a bridge without them is a bridge of single-agent routes.
        let rooms = room::RoomHub::new(Rooms::new());
        Self {
            inner: Arc::new(Inner {
                ledger,
                outbound,
                agents,
                limits,
                handoff_rules,
                session_heartbeat,
                rooms,
                shutdown,
                tasks,
                bot_username: std::sync::OnceLock::new(),
                permissions: std::sync::OnceLock::new(),
                shown_bell: Notify::new(),
                files: std::sync::OnceLock::new(),
                staging: std::sync::OnceLock::new(),
            }),
        }
    }

    /// Sends to Telegram, and knows which chats Telegram holds with a `429`.
    pub fn outbound(&self) -> &Outbound {
        &self.inner.outbound
    }

    /// This bot's username, if Telegram has told it.
    pub fn bot_username(&self) -> Option<String> {
        self.inner.bot_username.get().cloned()
    }

    /// Records this bot's username, from `getMe`.
    pub fn set_bot_username(&self, username: String) {
        let _ = self.inner.bot_username.set(username);
    }

    /// The reply limits in effect.
    fn limits(&self) -> ReplyLimits {
        *self.inner.limits.read().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The handoff rules in effect.
    fn handoff_rules(&self) -> HandoffRules {
        self.inner.handoff_rules.read().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    /// A configuration reload: later decisions use these limits and rules.
    pub fn reload_rules(&self, limits: ReplyLimits, handoff_rules: HandoffRules) {
        *self.inner.limits.write().unwrap_or_else(|poisoned| poisoned.into_inner()) = limits;
        *self.inner.handoff_rules.write().unwrap_or_else(|poisoned| poisoned.into_inner()) = handoff_rules;
    }

    /// Tells an agent's session that something was queued for it.
    pub fn wake(&self, agent: &AgentName) {
        if let Some(slot) = self.inner.agents.get(agent) {
            // notify_one keeps a permit when nobody waits, so a wake-up between the
            // session's ledger check and its wait is not lost.
            slot.wake.notify_one();
        }
    }

    /// Locks the inboxes of those `agents` whose live session takes envelopes from intake
    /// (see `AgentSlot::inbox`); the others get theirs through the ledger and a wake-up.
    pub async fn open_inboxes<'a>(&'a self, agents: impl IntoIterator<Item = &'a AgentName>) -> Inboxes<'a> {
        // In name order, as any two lockers of several inboxes must take them.
        let agents: std::collections::BTreeSet<&AgentName> = agents.into_iter().collect();
        let mut open = Vec::new();
        for agent in agents {
            let Some(slot) = self.inner.agents.get(agent) else { continue };
            let inbox = slot.inbox.lock().await;
            // A session that ended leaves a closed inbox until the next one registers.
            if inbox.as_ref().is_some_and(|sender| !sender.is_closed()) {
                open.push((agent, inbox));
            }
        }
        Inboxes { open }
    }

    /// Checks an agent's credentials. Unknown agents and wrong secrets get the same answer.
    pub fn authenticate(&self, agent: &str, bearer: Option<&str>) -> Result<AgentName, Unauthorized> {
        let name = AgentName::parse(agent).map_err(|_| Unauthorized)?;
        let slot = self.inner.agents.get(&name).ok_or(Unauthorized)?;
        match bearer {
            Some(token) if slot.secret.matches(token) => Ok(name),
            _ => Err(Unauthorized),
        }
    }

    fn slot(&self, agent: &AgentName) -> &AgentSlot {
        // Only authenticated names reach here, and they come from this map.
        &self.inner.agents[agent]
    }
}

/// Locked inboxes of live sessions, between intake's claim and its hand-over.
pub struct Inboxes<'a> {
    open: Vec<(&'a AgentName, tokio::sync::MutexGuard<'a, Option<mpsc::UnboundedSender<StoredEnvelope>>>)>,
}

impl Inboxes<'_> {
    /// The agents whose queued envelopes intake may claim for their sessions.
    pub fn agents(&self) -> Vec<&AgentName> {
        self.open.iter().map(|(agent, _)| *agent).collect()
    }

    /// Hands the claimed envelopes (oldest first) to their sessions, then unlocks. A
    /// session that ended meanwhile leaves its envelopes `pending`: the next one gets them
    /// as redelivered.
    pub fn hand_over(self, envelopes: Vec<StoredEnvelope>) {
        for envelope in envelopes {
            let inbox = self.open.iter().find(|(agent, _)| envelope.agent.as_deref() == Some(agent.as_str()));
            if let Some(sender) = inbox.and_then(|(_, inbox)| inbox.as_ref()) {
                let _ = sender.send(envelope);
            }
        }
    }
}
