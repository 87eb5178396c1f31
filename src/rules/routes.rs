//! The routes table: which agent (or group room) a channel belongs to. Pure code over
//! plain data.
//!
//! The most specific route wins: a chat and forum topic over a whole chat over the default
//! route. Two routes with the same target would make that choice a guess, so building the
//! table refuses them.

use std::collections::HashMap;
use std::fmt;

use crate::ids::{AgentName, RouteName};
use crate::rules::commands::command_word;

/// Where a message was posted: a chat and, in a forum, a topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Channel {
    pub chat_id: i64,
    pub thread_id: Option<i32>,
}

/// What a route matches, from most to least specific.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RouteTarget {
    Topic { chat_id: i64, thread_id: i32 },
    Chat { chat_id: i64 },
    Default,
}

impl fmt::Display for RouteTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RouteTarget::Topic { chat_id, thread_id } => write!(f, "chat {chat_id} topic {thread_id}"),
            RouteTarget::Chat { chat_id } => write!(f, "chat {chat_id}"),
            RouteTarget::Default => f.write_str("default (any chat)"),
        }
    }
}

/// Who a route's messages are for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Audience {
    /// One agent answers every message (`agent = "…"`).
    Agent(AgentName),
    /// A group room (DESIGN.md §10, `agents = […]`): these agents, in room order, take the
    /// floor one at a time. Never empty.
    Room(Vec<AgentName>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub name: RouteName,
    pub target: RouteTarget,
    pub audience: Audience,
    /// The route's own `allowed_users`, in place of `telegram.allowed_users` for its
    /// messages (empty: every sender there); `None` keeps the global list.
    pub senders: Option<Vec<i64>>,
    /// `mention_only`: only messages addressed to the bot ([`is_addressed`]) reach the
    /// agent; the others are kept as `ignored`.
    pub mention_only: bool,
}

impl Route {
    /// The one agent of a single-agent route; `None` for a room, whose messages belong to
    /// the room rather than to any of its agents.
    pub fn agent(&self) -> Option<&AgentName> {
        match &self.audience {
            Audience::Agent(agent) => Some(agent),
            Audience::Room(_) => None,
        }
    }

    pub fn is_room(&self) -> bool {
        matches!(self.audience, Audience::Room(_))
    }

    /// The list that decides who may speak in this route: its own `allowed_users` when it
    /// has one, else `telegram.allowed_users`. Named when a sender is rejected, so the
    /// operator edits the list that refused them.
    pub fn speakers_list(&self) -> SpeakersList<'_> {
        match self.senders {
            Some(_) => SpeakersList::Route(&self.name),
            None => SpeakersList::Global,
        }
    }

    /// The agents it names: its agent, or the room's members in room order.
    pub fn agents(&self) -> &[AgentName] {
        match &self.audience {
            Audience::Agent(agent) => std::slice::from_ref(agent),
            Audience::Room(agents) => agents,
        }
    }
}

/// Which `allowed_users` decides who may speak in a route ([`Route::speakers_list`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpeakersList<'a> {
    /// The route's own `allowed_users`.
    Route(&'a RouteName),
    /// `telegram.allowed_users`.
    Global,
}

impl fmt::Display for SpeakersList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Route(name) => write!(f, "the allowed_users of route '{name}'"),
            Self::Global => f.write_str("telegram.allowed_users"),
        }
    }
}

/// Why a set of routes cannot form a table. Indexes point into the list given to
/// [`RoutesTable::new`], so configuration errors can name the offending `[[routes]]` entry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RoutesError {
    #[error("routes[{second}] '{name}' repeats the name of routes[{first}]")]
    DuplicateName { name: RouteName, first: usize, second: usize },
    #[error(
        "routes[{second}] '{second_name}' matches the same channel ({target}) as routes[{first}] '{first_name}'; one of them must go"
    )]
    SameTarget {
        target: RouteTarget,
        first: usize,
        first_name: RouteName,
        second: usize,
        second_name: RouteName,
    },
}

#[derive(Debug, Clone, Default)]
pub struct RoutesTable {
    /// In configuration order, for display.
    routes: Vec<Route>,
    /// Target → index into `routes`.
    by_target: HashMap<RouteTarget, usize>,
}

impl RoutesTable {
    pub fn new(routes: Vec<Route>) -> Result<Self, RoutesError> {
        let mut by_target = HashMap::with_capacity(routes.len());
        let mut by_name: HashMap<&RouteName, usize> = HashMap::with_capacity(routes.len());
        for (index, route) in routes.iter().enumerate() {
            if let Some(&first) = by_name.get(&route.name) {
                return Err(RoutesError::DuplicateName { name: route.name.clone(), first, second: index });
            }
            by_name.insert(&route.name, index);
            if let Some(&first) = by_target.get(&route.target) {
                let first_route: &Route = &routes[first];
                return Err(RoutesError::SameTarget {
                    target: route.target,
                    first,
                    first_name: first_route.name.clone(),
                    second: index,
                    second_name: route.name.clone(),
                });
            }
            by_target.insert(route.target, index);
        }
        Ok(Self { routes, by_target })
    }

    /// The route for a channel, most specific first; `None` when nothing matches.
    pub fn route_for(&self, channel: Channel) -> Option<&Route> {
        let topic =
            channel.thread_id.map(|thread_id| RouteTarget::Topic { chat_id: channel.chat_id, thread_id });
        topic
            .into_iter()
            .chain([RouteTarget::Chat { chat_id: channel.chat_id }, RouteTarget::Default])
            .find_map(|target| self.by_target.get(&target))
            .map(|&index| &self.routes[index])
    }

    pub fn routes(&self) -> &[Route] {
        &self.routes
    }

    /// Routes that name this chat, for telling an operator what to change when a group
    /// migrates to a supergroup.
    pub fn routes_for_chat(&self, chat_id: i64) -> impl Iterator<Item = &Route> {
        self.routes.iter().filter(move |route| match route.target {
            RouteTarget::Topic { chat_id: c, .. } | RouteTarget::Chat { chat_id: c } => c == chat_id,
            RouteTarget::Default => false,
        })
    }
}

/// What becomes of a message, decided from its channel and sender.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Disposition<'a> {
    /// Queue it for the route's agent, or its room.
    Deliver(&'a Route),
    /// No route matches its channel.
    Unrouted,
    /// A route matches but the sender is not on the allowlist.
    Rejected(&'a Route),
}

/// Routes a message. Who may speak is the route's own `allowed_users` when it has one, else
/// `allowed_users` (`telegram.allowed_users`). An empty list means every sender in the
/// route's chat; otherwise a sender must be on it (a message without a known sender never
/// is).
pub fn dispose<'a>(
    table: &'a RoutesTable,
    allowed_users: &[i64],
    channel: Channel,
    sender_id: Option<i64>,
) -> Disposition<'a> {
    let Some(route) = table.route_for(channel) else {
        return Disposition::Unrouted;
    };
    if may_speak(route, allowed_users, sender_id) {
        Disposition::Deliver(route)
    } else {
        Disposition::Rejected(route)
    }
}

fn may_speak(route: &Route, allowed_users: &[i64], sender_id: Option<i64>) -> bool {
    let allowed_users = route.senders.as_deref().unwrap_or(allowed_users);
    allowed_users.is_empty() || sender_id.is_some_and(|id| allowed_users.contains(&id))
}

/// Whether a reaction in `chat_id` by `sender_id` may reach an agent. A reaction carries no
/// topic, so its sender must be one who may speak on some route of its chat (on the
/// fallback route when no route names the chat): who may not write to an agent cannot
/// reach it by reacting either.
pub fn may_react(table: &RoutesTable, allowed_users: &[i64], chat_id: i64, sender_id: Option<i64>) -> bool {
    let mut named = table.routes_for_chat(chat_id).peekable();
    if named.peek().is_none() {
        let fallback = table.route_for(Channel { chat_id, thread_id: None });
        return fallback.is_some_and(|route| may_speak(route, allowed_users, sender_id));
    }
    named.any(|route| may_speak(route, allowed_users, sender_id))
}

/// Who the bot is, as far as the daemon has learnt (`getMe`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BotIdentity {
    pub id: i64,
    /// Unknown until `getMe` answers.
    pub username: Option<String>,
}

/// What of a message tells whether it is addressed to the bot.
#[derive(Debug, Clone, Copy)]
pub struct Addressing<'a> {
    pub private_chat: bool,
    /// Its text or caption.
    pub text: Option<&'a str>,
    /// The sender of the message it replies to.
    pub replies_to: Option<i64>,
}

/// Whether a message speaks to the bot, for a `mention_only` route: any message of a
/// private chat, a reply to one of the bot's messages, a text that mentions `@its_name`
/// (any case), and a command that is not addressed to another bot (`/cmd`, `/cmd@its_name`).
/// While the bot's name is not known every message counts, so that a mention is never
/// dropped for want of the name: at worst the agent reads one message too many.
pub fn is_addressed(message: &Addressing<'_>, bot: &BotIdentity) -> bool {
    if message.private_chat || message.replies_to == Some(bot.id) {
        return true;
    }
    let Some(name) = bot.username.as_deref() else { return true };
    let Some(text) = message.text else { return false };
    match command_word(text).map(|command| command.addressee) {
        Some(None) => true,
        Some(Some(to)) if to.eq_ignore_ascii_case(name) => true,
        _ => mentions(text, name),
    }
}

/// Whether `text` holds `@name` as a whole mention: not the start of a longer name, and
/// not the end of a word (`ops@name.io` is an address, as Telegram reads it).
fn mentions(text: &str, name: &str) -> bool {
    let is_name_char = |c: char| c.is_ascii_alphanumeric() || c == '_';
    text.match_indices('@').any(|(at, _)| {
        if text[..at].ends_with(is_name_char) {
            return false;
        }
        let after = &text[at + 1..];
        after.get(..name.len()).is_some_and(|found| found.eq_ignore_ascii_case(name))
            && !after[name.len()..].starts_with(is_name_char)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const DM: i64 = 123_456_789;
    const FORUM: i64 = -1_001_234_567_890;

    fn route(name: &str, target: RouteTarget, agent: &str) -> Route {
        Route {
            name: RouteName::parse(name).unwrap(),
            target,
            audience: Audience::Agent(AgentName::parse(agent).unwrap()),
            senders: None,
            mention_only: false,
        }
    }

    fn channel(chat_id: i64, thread_id: Option<i32>) -> Channel {
        Channel { chat_id, thread_id }
    }

    fn full_table() -> RoutesTable {
        RoutesTable::new(vec![
            route("owner-dm", RouteTarget::Chat { chat_id: DM }, "orchestrator"),
            route("ops-topic", RouteTarget::Topic { chat_id: FORUM, thread_id: 42 }, "worker"),
            route("forum", RouteTarget::Chat { chat_id: FORUM }, "triage"),
            route("fallback", RouteTarget::Default, "orchestrator"),
        ])
        .unwrap()
    }

    fn matched(table: &RoutesTable, channel: Channel) -> Option<&str> {
        table.route_for(channel).map(|r| r.name.as_str())
    }

    #[test]
    fn topic_route_beats_chat_route_beats_default() {
        let table = full_table();
        assert_eq!(matched(&table, channel(FORUM, Some(42))), Some("ops-topic"));
        assert_eq!(matched(&table, channel(FORUM, Some(7))), Some("forum"));
        assert_eq!(matched(&table, channel(FORUM, None)), Some("forum"));
        assert_eq!(matched(&table, channel(DM, None)), Some("owner-dm"));
        assert_eq!(matched(&table, channel(555, None)), Some("fallback"));
        assert_eq!(matched(&table, channel(555, Some(42))), Some("fallback"));
    }

    #[test]
    fn a_topic_id_never_matches_another_chats_topic_route() {
        let table = RoutesTable::new(vec![route(
            "ops-topic",
            RouteTarget::Topic { chat_id: FORUM, thread_id: 42 },
            "worker",
        )])
        .unwrap();
        assert_eq!(matched(&table, channel(FORUM - 1, Some(42))), None);
        assert_eq!(matched(&table, channel(FORUM, None)), None);
        assert_eq!(matched(&table, channel(FORUM, Some(42))), Some("ops-topic"));
    }

    #[test]
    fn without_a_default_unmatched_channels_are_unrouted() {
        let table =
            RoutesTable::new(vec![route("owner-dm", RouteTarget::Chat { chat_id: DM }, "a")]).unwrap();
        assert_eq!(matched(&table, channel(DM + 1, None)), None);
        assert_eq!(matched(&RoutesTable::default(), channel(DM, None)), None);
    }

    #[test]
    fn every_combination_of_route_kinds_picks_the_most_specific_present() {
        // For each subset of {topic, chat, default} routes, a message in the topic must go
        // to the most specific route present, and a message elsewhere in the chat must
        // skip the topic route.
        for mask in 0..8u8 {
            let mut routes = Vec::new();
            if mask & 1 != 0 {
                routes.push(route("t", RouteTarget::Topic { chat_id: FORUM, thread_id: 1 }, "a"));
            }
            if mask & 2 != 0 {
                routes.push(route("c", RouteTarget::Chat { chat_id: FORUM }, "a"));
            }
            if mask & 4 != 0 {
                routes.push(route("d", RouteTarget::Default, "a"));
            }
            let table = RoutesTable::new(routes).unwrap();
            let in_topic =
                ["t", "c", "d"].into_iter().enumerate().find(|(i, _)| mask & (1 << i) != 0).map(|(_, n)| n);
            let in_other_topic =
                ["c", "d"].into_iter().enumerate().find(|(i, _)| mask & (2 << i) != 0).map(|(_, n)| n);
            assert_eq!(matched(&table, channel(FORUM, Some(1))), in_topic, "mask {mask:03b}");
            assert_eq!(matched(&table, channel(FORUM, Some(2))), in_other_topic, "mask {mask:03b}");
        }
    }

    #[test]
    fn same_target_twice_is_refused_naming_both_routes() {
        let targets = [
            RouteTarget::Topic { chat_id: FORUM, thread_id: 42 },
            RouteTarget::Chat { chat_id: DM },
            RouteTarget::Default,
        ];
        for target in targets {
            let err = RoutesTable::new(vec![
                route("first", target, "a"),
                route("other", RouteTarget::Chat { chat_id: 1 }, "a"),
                route("second", target, "b"),
            ])
            .unwrap_err();
            assert!(matches!(err, RoutesError::SameTarget { first: 0, second: 2, .. }), "{err:?}");
            let message = err.to_string();
            assert!(message.contains("'first'") && message.contains("'second'"), "{message}");
        }
    }

    #[test]
    fn same_name_twice_is_refused() {
        let err = RoutesTable::new(vec![
            route("dup", RouteTarget::Chat { chat_id: 1 }, "a"),
            route("dup", RouteTarget::Chat { chat_id: 2 }, "a"),
        ])
        .unwrap_err();
        assert_eq!(
            err,
            RoutesError::DuplicateName { name: RouteName::parse("dup").unwrap(), first: 0, second: 1 }
        );
    }

    #[test]
    fn a_room_route_names_its_agents_and_no_single_agent() {
        let agents = vec![AgentName::parse("builder").unwrap(), AgentName::parse("reviewer").unwrap()];
        let room = Route {
            name: RouteName::parse("dev-room").unwrap(),
            target: RouteTarget::Chat { chat_id: FORUM },
            audience: Audience::Room(agents.clone()),
            senders: None,
            mention_only: false,
        };
        assert!(room.is_room());
        assert_eq!(room.agent(), None);
        assert_eq!(room.agents(), agents);
        let single = route("dm", RouteTarget::Chat { chat_id: DM }, "orchestrator");
        assert!(!single.is_room());
        assert_eq!(single.agent().map(AgentName::as_str), Some("orchestrator"));
        assert_eq!(single.agents().len(), 1);
    }

    #[test]
    fn routes_for_chat_lists_chat_and_topic_routes_only() {
        let table = full_table();
        let names: Vec<_> = table.routes_for_chat(FORUM).map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["ops-topic", "forum"]);
    }

    #[test]
    fn dispose_routes_then_applies_the_allowlist() {
        let table = full_table();
        let dm = channel(DM, None);
        assert!(
            matches!(dispose(&table, &[], dm, Some(1)), Disposition::Deliver(r) if r.name.as_str() == "owner-dm")
        );
        assert!(matches!(dispose(&table, &[], dm, None), Disposition::Deliver(_)));
        assert!(matches!(dispose(&table, &[1, 2], dm, Some(2)), Disposition::Deliver(_)));
        assert!(
            matches!(dispose(&table, &[1, 2], dm, Some(3)), Disposition::Rejected(r) if r.name.as_str() == "owner-dm")
        );
        assert!(matches!(dispose(&table, &[1, 2], dm, None), Disposition::Rejected(_)));
        let nowhere = RoutesTable::default();
        assert_eq!(dispose(&nowhere, &[1], dm, Some(3)), Disposition::Unrouted);
        assert_eq!(dispose(&nowhere, &[], dm, Some(1)), Disposition::Unrouted);
    }

    /// Who may not write to an agent cannot reach it by reacting to the bot's reply.
    #[test]
    fn a_reaction_counts_only_from_a_sender_who_may_speak_in_its_chat() {
        let group = -100_555;
        let pair =
            Route { senders: Some(vec![7, 8]), ..route("pair", RouteTarget::Chat { chat_id: group }, "w") };
        let table =
            RoutesTable::new(vec![route("dm", RouteTarget::Chat { chat_id: DM }, "o"), pair]).unwrap();
        assert!(may_react(&table, &[1], group, Some(7)));
        assert!(!may_react(&table, &[1], group, Some(9)), "not on the route's list");
        assert!(!may_react(&table, &[1], group, None), "no known sender");
        assert!(may_react(&table, &[1], DM, Some(1)));
        assert!(!may_react(&table, &[1], DM, Some(7)), "on another route's list only");
        assert!(!may_react(&table, &[], -100_999, Some(1)), "an unrouted chat");
        // A topic route's list counts for the chat: a reaction carries no topic.
        let forum = full_table();
        assert!(may_react(&forum, &[], FORUM, Some(3)));
    }

    #[test]
    fn a_routes_own_allowlist_stands_in_for_the_global_one() {
        let owner = 1;
        let group = -100_555;
        let open_group =
            Route { senders: Some(vec![]), ..route("team", RouteTarget::Chat { chat_id: group }, "w") };
        let two = Route {
            senders: Some(vec![7, 8]),
            ..route("pair", RouteTarget::Chat { chat_id: -100_666 }, "w")
        };
        let table =
            RoutesTable::new(vec![route("dm", RouteTarget::Chat { chat_id: DM }, "o"), open_group, two])
                .unwrap();
        let global = [owner];
        // "Only me in my DMs, anyone in the team's group, those two in theirs."
        assert!(matches!(dispose(&table, &global, channel(DM, None), Some(owner)), Disposition::Deliver(_)));
        assert!(matches!(dispose(&table, &global, channel(DM, None), Some(9)), Disposition::Rejected(_)));
        assert!(matches!(dispose(&table, &global, channel(group, None), Some(9)), Disposition::Deliver(_)));
        assert!(matches!(
            dispose(&table, &global, channel(-100_666, None), Some(8)),
            Disposition::Deliver(_)
        ));
        assert!(
            matches!(
                dispose(&table, &global, channel(-100_666, None), Some(owner)),
                Disposition::Rejected(_)
            ),
            "the route's list replaces the global one, it does not add to it"
        );
        // A rejection names the list that decided.
        let decided = |chat_id| match dispose(&table, &global, channel(chat_id, None), Some(9)) {
            Disposition::Rejected(route) => route.speakers_list().to_string(),
            _ => panic!("sender 9 is on no list"),
        };
        assert_eq!(decided(DM), "telegram.allowed_users");
        assert_eq!(decided(-100_666), "the allowed_users of route 'pair'");
    }

    #[test]
    fn a_message_is_addressed_to_the_bot_by_a_mention_a_reply_or_a_command() {
        let bot = BotIdentity { id: 99, username: Some("helper_bot".into()) };
        let group =
            |text: &'static str| Addressing { private_chat: false, text: Some(text), replies_to: None };
        for text in [
            "@helper_bot what now?",
            "what now, @Helper_Bot?",
            "ping @helper_bot",
            "/status",
            "/status@helper_bot please",
            "/STATUS@HELPER_BOT",
        ] {
            assert!(is_addressed(&group(text), &bot), "{text:?}");
        }
        for text in [
            "what now?",
            "@helper_botty hi",
            "/status@other_bot",
            "mail helper_bot",
            "@",
            "mail ops@helper_bot.io",
            "/var/log is full",
            "/ status",
        ] {
            assert!(!is_addressed(&group(text), &bot), "{text:?}");
        }
        let reply = Addressing { private_chat: false, text: Some("yes"), replies_to: Some(99) };
        assert!(is_addressed(&reply, &bot), "a reply to the bot's message");
        let other = Addressing { replies_to: Some(7), ..reply };
        assert!(!is_addressed(&other, &bot), "a reply to someone else");
        let photo = Addressing { private_chat: false, text: None, replies_to: None };
        assert!(!is_addressed(&photo, &bot), "a photo without a caption mentions nobody");
        let private = Addressing { private_chat: true, ..photo };
        assert!(is_addressed(&private, &bot), "a private chat speaks to the bot");
        let unknown = BotIdentity { id: 99, username: None };
        assert!(is_addressed(&group("what now?"), &unknown), "not knowing its name, nothing is dropped");
        assert!(is_addressed(&group("ü @helper_bot ü"), &bot), "not only ASCII around it");
    }
}
