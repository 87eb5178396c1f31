//! Pacing of outbound messages to Telegram's limits: about one message a second to one
//! private chat, about twenty a minute to one group, and about thirty a second across all
//! chats (the bot's overall budget; a bot with paid broadcasts has a higher one). Telegram
//! answers a send beyond them with `429 Too Many Requests` and a wait the user sees.
//! Pacing sends to those rates instead of bursting into rate limits keeps long replies
//! flowing, uses the whole budget, and keeps `retry_after` waits for real overload.
//!
//! Two limits apply to each send, and it goes at the first moment both allow:
//! - **per chat**, a token bucket: a short burst goes out at once (a reply of a few parts is
//!   not slowed down), then sends are spaced at the chat's rate. Telegram counts a group's
//!   limit by the minute, so a group also takes no more than a minute's worth of its rate
//!   in any minute: the burst is borrowed from later in that minute, not added to it, and
//!   sends to one group are never reordered;
//! - **overall**, a schedule of send times across all chats, none closer to another than
//!   a little more than `1 / budget` seconds. A send takes the earliest free time from
//!   the moment its chat allows, so a chat that must wait leaves the time before it to
//!   others, and concurrent replies to many chats take turns: each reply reserves one part
//!   at a time, so a reply holds at most one reserved time, and a chat's first part waits
//!   for at most one send of each reply already under way (its fair share); replies that
//!   start together have every first part scheduled before any second.
//!
//! A send paced for a moment may still go out later (a busy machine wakes its timer late,
//! a `429` or a reload lowered the budget after it was paced) and so come closer to the
//! next than the schedule said. The last check before a request leaves
//! ([`Pacer::clear_to_send`]) therefore counts the requests actually made: in the last
//! second across all chats, and in the last minute to its group. It holds one that would
//! make more than either allows. Telegram counts what arrives, so these are the
//! guarantees, and the schedule only plans for them.
//!
//! The check comes before the attempt is recorded, never after: a request held there has
//! no `in_flight` attempt yet (a crash leaves nothing to reconcile, a stop does not wait
//! for it), and once recorded it leaves at once. How long it may be held has no bound of
//! its own: after a `429` the sends already scheduled at the full budget go out at half
//! of it. Re-spacing the schedule on a `429` or a reload would shorten such holds but not
//! end them (it cannot move sends already asleep until their moment, and timers still
//! wake late); holding before recording takes them off the recorded attempt's path
//! whatever their length, with nothing to re-plan. The caller counts the hold against
//! its reply's wait.
//!
//! Which moment is a request's? Telegram counts its arrival, which this side never sees:
//! it lies after the request left and before its answer came. So a cleared request counts
//! as arriving at every moment until it is answered, and from its answer after
//! ([`Pacer::made`]): the latest its arrival can have been. Then the next request, which
//! leaves after its clearance, arrives no sooner than a whole window after it, however
//! the ledger's write before a request (a busy PostgreSQL, a slow disk) and the way to
//! Telegram (a loaded machine, a slow network) vary; no margin could cover both. The cost
//! is the way there and back: a request's window ends that much later, so at a round trip
//! of `r` the budget is used to `1 / (1 + r)` of it, 0.95 at 50 ms. A request that never
//! leaves (its attempt could not be recorded, its caller went away first) gives its place
//! back ([`Pacer::abandoned`]).
//!
//! A `429` that happens all the same (another process sending with the same token, or a
//! limit Telegram does not publish) holds the chat for the `retry_after` Telegram asked and
//! halves the overall budget for [`THROTTLE_FOR`].
//!
//! Pure: the caller passes the time in and sleeps for the answer itself.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::time::{Duration, Instant};

/// Messages a chat may receive at once before pacing starts.
pub const BURST: f64 = 3.0;

/// Telegram's guidance: "avoid sending more than one message per second" to one chat.
pub const PRIVATE_INTERVAL: Duration = Duration::from_secs(1);

/// Telegram's guidance: "not more than 20 messages per minute" to one group.
pub const GROUP_INTERVAL: Duration = Duration::from_secs(3);

/// The span Telegram counts a group's messages in.
const GROUP_WINDOW: Duration = Duration::from_secs(60);

/// The span a group's sends are planned in: Telegram's minute and a second more, for the
/// way to Telegram and back. The last check counts a request from its answer (see the
/// module's docs), so a plan of exactly a minute would have a group's twenty-first send
/// held there whenever its first took a moment to be answered. A group's sustained rate
/// is a sixty-first lower for it.
const GROUP_SPAN: Duration = Duration::from_secs(61);

/// Telegram's guidance: "not more than about 30 messages per second" in all, for bulk
/// notifications.
pub const OVERALL_PER_SEC: u32 = 30;

/// How much more than `1 / budget` apart overall sends are scheduled: a second then holds
/// at most `budget` sends even when the network brings two of them up to this much closer
/// together (2.5%: 0.8 ms at 30 a second). The budget is still used to 0.975 of it.
const OVERALL_MARGIN: f64 = 1.025;

/// The window [`Pacer::clear_to_send`] counts requests in: Telegram's second, with no
/// margin for the way to Telegram, since each request counts from its answer.
const MADE_WINDOW: Duration = Duration::from_secs(1);

/// How long a `429` lowers the overall budget.
pub const THROTTLE_FOR: Duration = Duration::from_secs(60);

/// The limits sends are paced to; a zero interval or budget turns that pacing off.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PaceLimits {
    /// The spacing of sends to one private chat, after the burst.
    pub private: Duration,
    /// The spacing of sends to one group or channel, after the burst.
    pub group: Duration,
    /// Sends a second across all chats.
    pub overall_per_sec: u32,
}

impl PaceLimits {
    /// Private chats have positive ids (the user's id); groups and channels negative ones.
    fn interval_for(&self, chat_id: i64) -> Duration {
        if chat_id > 0 { self.private } else { self.group }
    }

    /// How many sends one group takes in any [`GROUP_WINDOW`]: a minute's worth of its
    /// interval (twenty at three seconds); none for a private chat, or when group pacing is
    /// off.
    fn group_window_cap(&self, chat_id: i64) -> Option<usize> {
        if chat_id > 0 || self.group.is_zero() {
            return None;
        }
        Some(((GROUP_WINDOW.as_secs_f64() / self.group.as_secs_f64()).floor() as usize).max(1))
    }
}

impl Default for PaceLimits {
    fn default() -> Self {
        Self { private: PRIVATE_INTERVAL, group: GROUP_INTERVAL, overall_per_sec: OVERALL_PER_SEC }
    }
}

/// A request [`Pacer::clear_to_send`] let go, under way until it is answered
/// ([`Pacer::made`]) or given up before it left ([`Pacer::abandoned`]).
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a cleared request counts as arriving until it is made or abandoned"]
pub struct Cleared {
    ticket: u64,
}

/// A cleared request not answered yet.
#[derive(Debug, Clone, Copy)]
struct UnderWay {
    ticket: u64,
    /// Its group, when it counts in one's minute.
    group: Option<i64>,
}

/// A send not reserved, because it would wait longer than its caller allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deferred {
    /// Telegram holds the chat (a `429`) this much longer.
    Held(Duration),
    /// The sends reserved before it (to its chat, or overall) would make it wait this long.
    Queued(Duration),
}

/// How the chats' buckets and the overall schedule stand.
#[derive(Debug, Default)]
pub struct Pacer {
    limits: PaceLimits,
    buckets: HashMap<i64, Bucket>,
    /// Per group: the sends reserved within the last [`GROUP_SPAN`], in order.
    group_windows: HashMap<i64, VecDeque<Instant>>,
    overall: Schedule,
    /// When the requests of the last [`MADE_WINDOW`] were made, oldest first.
    made: VecDeque<Instant>,
    /// Per group: when its requests of the last [`GROUP_WINDOW`] were made, oldest first.
    group_made: HashMap<i64, VecDeque<Instant>>,
    /// Requests cleared and not yet answered: each counts as arriving now, in every window.
    under_way: Vec<UnderWay>,
    next_ticket: u64,
    /// Until when a `429` halves the overall budget.
    throttled_until: Option<Instant>,
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    /// Sends available at `at`; negative when sends are already reserved past it.
    tokens: f64,
    at: Instant,
    /// Telegram asked for quiet in this chat until then (a `429`'s `retry_after`).
    held_until: Option<Instant>,
}

impl Bucket {
    /// Its tokens at `at`, refilled at one per `interval` seconds since it was counted,
    /// before any cap.
    fn tokens_at(&self, at: Instant, interval: f64) -> f64 {
        self.tokens + at.saturating_duration_since(self.at).as_secs_f64() / interval
    }
}

impl Pacer {
    pub fn new(limits: PaceLimits) -> Self {
        Self { limits, ..Self::default() }
    }

    /// New limits (a configuration reload); the chats' buckets and the schedule carry over.
    pub fn set_limits(&mut self, limits: PaceLimits) {
        self.limits = limits;
    }

    /// Reserves one send to `chat_id` and returns how long to wait before making it.
    /// Reservations queue: three sends to one chat reserved at once past the burst wait
    /// one, two and three intervals, and sends to different chats are spread across the
    /// overall budget.
    pub fn reserve(&mut self, chat_id: i64, now: Instant) -> Duration {
        let mut chat_allows = now + self.reserve_in_chat(chat_id, now);
        let window_cap = self.limits.group_window_cap(chat_id);
        if let Some(cap) = window_cap {
            let window = self.group_windows.entry(chat_id).or_default();
            chat_allows = chat_allows.max(window_allows(window, cap, now));
        }
        let at = match self.overall_spacing(now) {
            Some(spacing) => self.overall.reserve(chat_allows, spacing, now),
            None => chat_allows,
        };
        self.spent_at(chat_id, at);
        if window_cap.is_some() {
            self.group_windows.entry(chat_id).or_default().push_back(at);
        }
        at.saturating_duration_since(now)
    }

    /// Reserves one send to `chat_id` if it can go within `limit`; otherwise reserves
    /// nothing (the chat's place and the overall time stay free for sends that can wait
    /// that long) and says why it could not.
    pub fn reserve_within(
        &mut self,
        chat_id: i64,
        now: Instant,
        limit: Duration,
    ) -> Result<Duration, Deferred> {
        let held = self.held_for(chat_id, now);
        if held > limit {
            return Err(Deferred::Held(held));
        }
        let bucket = self.buckets.get(&chat_id).copied();
        let wait = self.reserve(chat_id, now);
        if wait <= limit {
            return Ok(wait);
        }
        match bucket {
            Some(bucket) => self.buckets.insert(chat_id, bucket),
            None => self.buckets.remove(&chat_id),
        };
        if let Some(window) = self.group_windows.get_mut(&chat_id) {
            window.pop_back();
        }
        self.overall.times.remove(&(now + wait));
        Err(Deferred::Queued(wait))
    }

    /// How much longer Telegram holds `chat_id` (a `429`'s `retry_after`); zero when it
    /// does not.
    pub fn held_for(&self, chat_id: i64, now: Instant) -> Duration {
        self.buckets
            .get(&chat_id)
            .and_then(|bucket| bucket.held_until)
            .map_or(Duration::ZERO, |until| until.saturating_duration_since(now))
    }

    /// The last check before a request to `chat_id` is recorded and made, after its
    /// reserved moment came: cleared, and counted as arriving from now on, when no window
    /// of a second would hold more requests made or under way than the overall budget,
    /// and no minute more than its group's; otherwise how long to hold it
    /// before asking again.
    pub fn clear_to_send(&mut self, chat_id: i64, now: Instant) -> Result<Cleared, Duration> {
        let group = self.limits.group_window_cap(chat_id).map(|cap| (chat_id, cap));
        self.clear(group, now)
    }

    /// The same for a request outside its chat's pacing (an acknowledging reaction): the
    /// overall budget only.
    pub fn clear_overall(&mut self, now: Instant) -> Result<Cleared, Duration> {
        self.clear(None, now)
    }

    fn clear(&mut self, group: Option<(i64, usize)>, now: Instant) -> Result<Cleared, Duration> {
        let per_sec = self.overall_per_sec(now);
        let under_way = self.under_way.len();
        let overall = per_sec.and_then(|per_sec| {
            let cap = per_sec.floor().max(1.0) as usize;
            full_until(&mut self.made, MADE_WINDOW, cap, under_way, now)
        });
        let in_group = group.and_then(|(chat_id, cap)| {
            let under_way = self.under_way.iter().filter(|request| request.group == Some(chat_id)).count();
            full_until(self.group_made.entry(chat_id).or_default(), GROUP_WINDOW, cap, under_way, now)
        });
        if let Some(until) = overall.max(in_group) {
            return Err(until.saturating_duration_since(now).max(Duration::from_millis(1)));
        }
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        self.under_way.push(UnderWay { ticket, group: group.map(|(chat_id, _)| chat_id) });
        Ok(Cleared { ticket })
    }

    /// The request `cleared` is over by `now`: answered, or its caller went away while it
    /// was out. Telegram had it by then if at all, so it counts as made at `now`.
    pub fn made(&mut self, cleared: Cleared, now: Instant) {
        let Some(request) = self.take_under_way(&cleared) else { return };
        if self.overall_per_sec(now).is_some() {
            insert_in_order(&mut self.made, now);
        }
        if let Some(chat_id) = request.group {
            insert_in_order(self.group_made.entry(chat_id).or_default(), now);
        }
    }

    /// The request `cleared` will not be made (its attempt could not be recorded, its
    /// caller went away): its place in the windows is free again.
    pub fn abandoned(&mut self, cleared: Cleared) {
        self.take_under_way(&cleared);
    }

    fn take_under_way(&mut self, cleared: &Cleared) -> Option<UnderWay> {
        let at = self.under_way.iter().position(|request| request.ticket == cleared.ticket)?;
        Some(self.under_way.swap_remove(at))
    }

    /// Telegram answered a send to `chat_id` with `429` and `retry_after`: nothing more
    /// goes to that chat before then, and the overall budget is halved for a while.
    pub fn rate_limited(&mut self, chat_id: i64, retry_after: Duration, now: Instant) {
        let bucket =
            self.buckets.entry(chat_id).or_insert(Bucket { tokens: BURST, at: now, held_until: None });
        let until = now + retry_after;
        bucket.held_until = Some(bucket.held_until.map_or(until, |held| held.max(until)));
        self.throttled_until = Some(now + THROTTLE_FOR);
    }

    /// When `chat_id`'s bucket allows the next send, from `now`.
    fn reserve_in_chat(&mut self, chat_id: i64, now: Instant) -> Duration {
        if self.buckets.len().max(self.group_windows.len()) > PRUNE_ABOVE {
            self.prune(now);
        }
        let interval = self.limits.interval_for(chat_id).as_secs_f64();
        let bucket =
            self.buckets.entry(chat_id).or_insert(Bucket { tokens: BURST, at: now, held_until: None });
        let held = match bucket.held_until {
            Some(until) if until > now => until - now,
            _ => {
                bucket.held_until = None;
                Duration::ZERO
            }
        };
        if interval == 0.0 {
            return held;
        }
        // A bucket counted from a send still to come (see `spent_at`) takes the next send
        // no earlier than that one.
        let from = bucket.at.max(now);
        bucket.tokens = bucket.tokens_at(from, interval).min(BURST) - 1.0;
        bucket.at = from;
        let refill = if bucket.tokens >= 0.0 { 0.0 } else { -bucket.tokens * interval };
        ((from - now) + Duration::from_secs_f64(refill)).max(held)
    }

    /// `chat_id`'s send was reserved for `at`, later than its bucket alone allowed (it
    /// waits its turn in the overall budget): the bucket is counted from then, holding at
    /// most the burst less this send. Counted from the reservation instead, it would
    /// refill while the send waits, and a chat's sends that waited together would go as
    /// one burst bigger than [`BURST`].
    fn spent_at(&mut self, chat_id: i64, at: Instant) {
        let interval = self.limits.interval_for(chat_id).as_secs_f64();
        if interval == 0.0 {
            return;
        }
        if let Some(bucket) = self.buckets.get_mut(&chat_id)
            && at > bucket.at
        {
            bucket.tokens = bucket.tokens_at(at, interval).min(BURST - 1.0);
            bucket.at = at;
        }
    }

    /// The least time between two sends across all chats, or none when that pacing is off.
    fn overall_spacing(&self, now: Instant) -> Option<Duration> {
        self.overall_per_sec(now).map(|per_sec| Duration::from_secs_f64(OVERALL_MARGIN / per_sec))
    }

    /// The overall budget now (halved while a `429` throttles it), or none when off.
    fn overall_per_sec(&self, now: Instant) -> Option<f64> {
        if self.limits.overall_per_sec == 0 {
            return None;
        }
        let per_sec = f64::from(self.limits.overall_per_sec);
        let throttled = self.throttled_until.is_some_and(|until| until > now);
        Some(if throttled { per_sec / 2.0 } else { per_sec })
    }

    /// Forgets chats whose bucket has refilled and that Telegram does not hold: they would
    /// start from a full burst anyway, so memory stays bounded by the chats active within
    /// the last few seconds.
    fn prune(&mut self, now: Instant) {
        let limits = self.limits;
        self.buckets.retain(|&chat_id, bucket| {
            let interval = limits.interval_for(chat_id);
            let full_after = interval.mul_f64((BURST - bucket.tokens).max(0.0));
            now.saturating_duration_since(bucket.at) < full_after
                || bucket.held_until.is_some_and(|held| held > now)
        });
        let recent = |window: &mut VecDeque<Instant>| {
            window.back().is_some_and(|last| now.saturating_duration_since(*last) < GROUP_SPAN)
        };
        self.group_windows.retain(|_, window| recent(window));
        self.group_made.retain(|_, made| recent(made));
    }

    pub fn tracked_chats(&self) -> usize {
        self.buckets.len()
    }

    /// Overall send times reserved and not yet past.
    #[cfg(test)]
    fn scheduled_sends(&self) -> usize {
        self.overall.times.len()
    }
}

/// The earliest moment a group whose reserved sends are `window` may take one more: no
/// earlier than its last (sends to one group keep their order), and late enough that the
/// [`GROUP_SPAN`] up to it holds fewer than `cap`. Sends out of every window from `now`
/// on are forgotten.
fn window_allows(window: &mut VecDeque<Instant>, cap: usize, now: Instant) -> Instant {
    let after_last = window.back().copied().unwrap_or(now);
    full_until(window, GROUP_SPAN, cap, 0, now).map_or(after_last, |until| after_last.max(until))
}

/// When `times` (oldest first), with `under_way` more made at any moment from `now` on,
/// stops holding `cap` within a `span` up to then, from `now`; none when it holds fewer
/// already. Forgets times out of the span from `now` on. When the requests under way fill
/// the span alone, a moment from now: one of them leaves or is abandoned soon.
fn full_until(
    times: &mut VecDeque<Instant>,
    span: Duration,
    cap: usize,
    under_way: usize,
    now: Instant,
) -> Option<Instant> {
    while times.front().is_some_and(|time| now.saturating_duration_since(*time) >= span) {
        times.pop_front();
    }
    let first_to_leave = (times.len() + under_way).checked_sub(cap)?;
    Some(times.get(first_to_leave).map_or(now + UNDER_WAY_RECHECK, |time| *time + span))
}

/// How soon a request held only by requests under way asks again.
const UNDER_WAY_RECHECK: Duration = Duration::from_millis(5);

/// Adds `time` to `times` (oldest first) in its place: requests answered at nearly the same
/// moment on different threads may tell it out of order.
fn insert_in_order(times: &mut VecDeque<Instant>, time: Instant) {
    let at = times.iter().rposition(|earlier| *earlier <= time).map_or(0, |i| i + 1);
    times.insert(at, time);
}

/// Pruning scans every bucket; below this many it is not worth doing.
const PRUNE_ABOVE: usize = 64;

/// The send times reserved across all chats.
#[derive(Debug, Default)]
struct Schedule {
    times: BTreeSet<Instant>,
}

impl Schedule {
    /// The earliest time from `earliest` at least `spacing` away from every reserved time,
    /// reserved. Times more than `spacing` in the past are forgotten: nothing new can come
    /// close to them.
    fn reserve(&mut self, earliest: Instant, spacing: Duration, now: Instant) -> Instant {
        if let Some(horizon) = now.checked_sub(spacing) {
            self.times = self.times.split_off(&horizon);
        }
        let mut at = earliest;
        loop {
            // The reserved time just before `at` and the one at or after it: `at` is free
            // when both are far enough away; else it moves past the one too close.
            if let Some(&before) = self.times.range(..at).next_back()
                && at - before < spacing
            {
                at = before + spacing;
                continue;
            }
            match self.times.range(at..).next() {
                Some(&after) if after - at < spacing => at = after + spacing,
                _ => break,
            }
        }
        self.times.insert(at);
        at
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DM: i64 = 42;
    const GROUP: i64 = -100;

    /// Per-chat pacing alone: the overall budget off.
    fn per_chat() -> Pacer {
        Pacer::new(PaceLimits { overall_per_sec: 0, ..PaceLimits::default() })
    }

    fn millis(wait: Duration) -> u64 {
        wait.as_millis() as u64
    }

    #[test]
    fn a_short_burst_goes_at_once_then_sends_are_spaced() {
        let mut pacer = per_chat();
        let t0 = Instant::now();
        let waits: Vec<u64> = (0..6).map(|_| millis(pacer.reserve(DM, t0))).collect();
        assert_eq!(waits, [0, 0, 0, 1000, 2000, 3000]);
    }

    #[test]
    fn groups_are_paced_at_twenty_a_minute() {
        let mut pacer = per_chat();
        let t0 = Instant::now();
        let waits: Vec<u64> = (0..5).map(|_| millis(pacer.reserve(GROUP, t0))).collect();
        assert_eq!(waits, [0, 0, 0, 3000, 6000]);
    }

    #[test]
    fn a_group_never_takes_more_than_twenty_in_any_minute_and_keeps_its_order() {
        let mut pacer = per_chat();
        let t0 = Instant::now();
        let sends: Vec<Instant> = (0..70).map(|_| t0 + pacer.reserve(GROUP, t0)).collect();
        assert!(sends.windows(2).all(|pair| pair[0] <= pair[1]), "in order");
        for (i, start) in sends.iter().enumerate() {
            let in_minute = sends[i..].iter().take_while(|sent| **sent < *start + GROUP_WINDOW).count();
            assert!(in_minute <= 20, "{in_minute} sends in the minute from send {i}");
        }
        // The burst is borrowed from the minute: the 21st send waits for the first to
        // leave it (with the margin for the way to Telegram), and the whole budget is
        // used, twenty a minute.
        assert_eq!(sends[20] - t0, GROUP_SPAN);
        assert!(sends[60] - t0 <= 3 * GROUP_SPAN, "{:?}", sends[60] - t0);
        // A private chat has no such window.
        let dm: Vec<u64> = (0..25).map(|_| millis(pacer.reserve(DM, t0))).collect();
        assert_eq!(dm[24], 22_000);
    }

    #[test]
    fn the_bucket_refills_with_time_up_to_the_burst() {
        let mut pacer = per_chat();
        let t0 = Instant::now();
        for _ in 0..3 {
            assert_eq!(pacer.reserve(DM, t0), Duration::ZERO);
        }
        // Two seconds later two sends are free again, the third waits.
        let t2 = t0 + Duration::from_secs(2);
        assert_eq!(pacer.reserve(DM, t2), Duration::ZERO);
        assert_eq!(pacer.reserve(DM, t2), Duration::ZERO);
        assert_eq!(pacer.reserve(DM, t2), Duration::from_secs(1));
        // Long idle never saves up more than the burst.
        let later = t2 + Duration::from_secs(3600);
        let waits: Vec<u64> = (0..4).map(|_| millis(pacer.reserve(DM, later))).collect();
        assert_eq!(waits, [0, 0, 0, 1000]);
    }

    #[test]
    fn chats_are_paced_independently() {
        let mut pacer = per_chat();
        let t0 = Instant::now();
        for _ in 0..3 {
            pacer.reserve(DM, t0);
        }
        assert_eq!(pacer.reserve(DM + 1, t0), Duration::ZERO);
        assert_eq!(pacer.reserve(GROUP, t0), Duration::ZERO);
        assert_eq!(pacer.reserve(DM, t0), Duration::from_secs(1));
    }

    #[test]
    fn a_chat_whose_sends_wait_for_the_overall_budget_gets_no_bigger_burst() {
        let mut pacer = Pacer::default();
        let t0 = Instant::now();
        // Six seconds of other chats' sends ahead in the overall schedule.
        for chat in 0..200 {
            pacer.reserve(1_000 + chat, t0);
        }
        // A private chat's burst, then one more a second later: all four wait behind the
        // schedule and would go within a fraction of a second of each other.
        let mut sends: Vec<Instant> = (0..3).map(|_| t0 + pacer.reserve(DM, t0)).collect();
        let t1 = t0 + Duration::from_secs(1);
        sends.push(t1 + pacer.reserve(DM, t1));
        // However late they go, no span holds more than the burst and what the chat's
        // rate adds over it.
        for (i, first) in sends.iter().enumerate() {
            for (j, last) in sends.iter().enumerate().skip(i) {
                let allowed = BURST + (*last - *first).as_secs_f64() / PRIVATE_INTERVAL.as_secs_f64();
                assert!((j - i + 1) as f64 <= allowed + 1e-9, "sends {i}..={j}: {sends:?}");
            }
        }
    }

    #[test]
    fn zero_limits_turn_pacing_off() {
        let mut pacer =
            Pacer::new(PaceLimits { private: Duration::ZERO, group: Duration::ZERO, overall_per_sec: 0 });
        let t0 = Instant::now();
        assert!(
            (0..100)
                .all(|chat| pacer.reserve(GROUP - chat, t0).is_zero() && pacer.reserve(GROUP, t0).is_zero())
        );
        assert_eq!(pacer.scheduled_sends(), 0);
    }

    #[test]
    fn idle_chats_are_forgotten() {
        let mut pacer = per_chat();
        let t0 = Instant::now();
        for chat in 1..=200 {
            pacer.reserve(chat, t0);
        }
        assert!(pacer.tracked_chats() >= 200);
        pacer.reserve(1_000, t0 + Duration::from_secs(60));
        assert_eq!(pacer.tracked_chats(), 1);
    }

    /// The reserved send times of `sends` (chat, reserved at) in order of reservation.
    fn schedule(pacer: &mut Pacer, sends: &[(i64, Instant)]) -> Vec<Instant> {
        sends.iter().map(|&(chat, now)| now + pacer.reserve(chat, now)).collect()
    }

    #[test]
    fn sends_to_many_chats_never_exceed_the_overall_budget_in_any_second_and_use_nearly_all_of_it() {
        let mut pacer = Pacer::default();
        let t0 = Instant::now();
        // 1,000 sends to 200 chats, reserved at once: five to each, chat after chat.
        let sends: Vec<(i64, Instant)> =
            (0..1000).map(|i| (if i % 2 == 0 { 1 + i / 5 } else { -(1 + i / 5) }, t0)).collect();
        let mut times = schedule(&mut pacer, &sends);
        times.sort_unstable();
        for (i, start) in times.iter().enumerate() {
            let within =
                times[i..].iter().take_while(|t| t.duration_since(*start) < Duration::from_secs(1)).count();
            assert!(within <= 30, "{within} sends in the second from send {i}");
        }
        let span = times.last().unwrap().duration_since(times[0]).as_secs_f64();
        let rate = (times.len() - 1) as f64 / span;
        assert!(rate >= 0.95 * 30.0, "{rate:.2} a second");
    }

    #[test]
    fn a_chat_that_must_wait_leaves_the_time_before_it_to_others() {
        let mut pacer = Pacer::default();
        let t0 = Instant::now();
        for _ in 0..3 {
            pacer.reserve(DM, t0);
        }
        // The fourth send to DM waits a second; sends to other chats fill the time before.
        assert_eq!(pacer.reserve(DM, t0), Duration::from_secs(1));
        let others: Vec<Duration> = (0..20).map(|chat| pacer.reserve(1_000 + chat, t0)).collect();
        assert!(others.iter().all(|wait| *wait < Duration::from_secs(1)), "{others:?}");
    }

    #[test]
    fn concurrent_replies_take_turns_so_every_chats_first_part_goes_before_any_second() {
        let mut pacer = Pacer::default();
        let t0 = Instant::now();
        // Each of 60 replies reserves its first part at once, the next part only after the
        // first went out: the way `Outbound::deliver` sends.
        let firsts: Vec<Instant> = (1..=60).map(|chat| t0 + pacer.reserve(chat, t0)).collect();
        let last_first = *firsts.iter().max().unwrap();
        let seconds: Vec<Instant> =
            (1..=60).zip(&firsts).map(|(chat, &sent)| sent + pacer.reserve(chat, sent)).collect();
        assert!(seconds.iter().all(|second| *second > last_first));
        // The last chat's first part waited its fair share of the budget: 60 sends at 30 a
        // second, with the margin.
        let fair = Duration::from_secs_f64(60.0 / 30.0 * OVERALL_MARGIN);
        assert!(last_first.duration_since(t0) <= fair, "{:?}", last_first.duration_since(t0));
    }

    #[test]
    fn a_lone_send_is_not_delayed_by_the_overall_budget() {
        let mut pacer = Pacer::default();
        let t0 = Instant::now();
        assert_eq!(pacer.reserve(DM, t0), Duration::ZERO);
        // Another chat a moment later waits only what the spacing asks, once the first is
        // far enough in the past, nothing at all.
        assert!(pacer.reserve(DM + 1, t0 + Duration::from_millis(1)) <= Duration::from_millis(34));
        assert_eq!(pacer.reserve(DM + 2, t0 + Duration::from_millis(200)), Duration::ZERO);
        assert!(pacer.scheduled_sends() <= 3);
    }

    #[test]
    fn a_request_that_went_out_late_does_not_bunch_the_second_it_lands_in() {
        let mut pacer = Pacer::new(PaceLimits { overall_per_sec: 3, ..PaceLimits::default() });
        let t0 = Instant::now();
        // Three requests made within the second (one of them late for its moment).
        for at in [0, 400, 900] {
            let now = t0 + Duration::from_millis(at);
            let cleared = pacer.clear_to_send(DM, now).unwrap();
            pacer.made(cleared, now);
        }
        // A fourth at 950 ms is held until the first has left the window.
        let held = pacer.clear_to_send(DM + 1, t0 + Duration::from_millis(950));
        assert_eq!(held, Err(MADE_WINDOW - Duration::from_millis(950)));
        assert!(pacer.clear_to_send(DM + 1, t0 + MADE_WINDOW).is_ok());
    }

    #[test]
    fn a_request_under_way_counts_as_arriving_until_its_answer_and_from_its_answer_after() {
        let mut pacer = Pacer::new(PaceLimits { overall_per_sec: 1, ..PaceLimits::default() });
        let t0 = Instant::now();
        // Cleared at once; its attempt's write, or its way to Telegram, is slow.
        let slow = pacer.clear_to_send(DM, t0).unwrap();
        // Still unanswered well past a second: it may arrive at any moment.
        let at = t0 + Duration::from_millis(1_500);
        assert_eq!(pacer.clear_to_send(DM + 1, at), Err(UNDER_WAY_RECHECK));
        // Answered at 1.5 s: counted from then, not from its clearance.
        pacer.made(slow, at);
        let held = pacer.clear_to_send(DM + 1, at + Duration::from_millis(100));
        assert_eq!(held, Err(MADE_WINDOW - Duration::from_millis(100)));
        // One abandoned gives its place back.
        let later = at + MADE_WINDOW;
        let given_up = pacer.clear_to_send(DM + 2, later).unwrap();
        assert!(pacer.clear_to_send(DM + 3, later).is_err());
        pacer.abandoned(given_up);
        let next = pacer.clear_to_send(DM + 3, later).unwrap();
        pacer.made(next, later);
    }

    #[test]
    fn a_429_holds_the_chat_and_halves_the_overall_budget_for_a_while() {
        let mut pacer = Pacer::default();
        let t0 = Instant::now();
        pacer.rate_limited(DM, Duration::from_secs(5), t0);
        assert_eq!(pacer.reserve(DM, t0), Duration::from_secs(5));
        // Other chats are spaced twice as far apart while throttled.
        let waits: Vec<Duration> = (0..4).map(|chat| pacer.reserve(1_000 + chat, t0)).collect();
        let gap = waits[3] - waits[2];
        assert!(gap >= Duration::from_millis(66), "{gap:?}");
        // After the throttle, the full budget again.
        let later = t0 + THROTTLE_FOR + Duration::from_secs(1);
        let waits: Vec<Duration> = (0..4).map(|chat| pacer.reserve(2_000 + chat, later)).collect();
        let gap = waits[3] - waits[2];
        assert!(gap < Duration::from_millis(40), "{gap:?}");
    }

    #[test]
    fn a_send_that_would_wait_too_long_takes_no_place_in_the_queue() {
        let mut pacer = Pacer::default();
        let t0 = Instant::now();
        let limit = Duration::from_secs(5);
        let waits: Vec<u64> = (0..9)
            .map(|_| match pacer.reserve_within(GROUP, t0, limit) {
                Ok(wait) => millis(wait),
                Err(Deferred::Queued(wait)) => 100_000 + millis(wait),
                Err(held) => panic!("{held:?}"),
            })
            .collect();
        // The burst (spaced by the overall budget), one 3 s later; the rest would wait past
        // 5 s and are deferred...
        assert_eq!(&waits[..4], [0, 34, 68, 3000]);
        assert!(waits[4..].iter().all(|wait| *wait == 106_000), "{waits:?}");
        // ...without pushing the queue back: the next send still goes 6 s out, and the
        // overall schedule holds only the four sends reserved.
        assert_eq!(pacer.reserve(GROUP, t0), Duration::from_secs(6));
        assert_eq!(pacer.scheduled_sends(), 5);
    }

    #[test]
    fn a_chat_held_longer_than_a_send_may_wait_is_deferred_untouched() {
        let mut pacer = per_chat();
        let t0 = Instant::now();
        pacer.rate_limited(DM, Duration::from_secs(30), t0);
        assert_eq!(pacer.held_for(DM, t0 + Duration::from_secs(10)), Duration::from_secs(20));
        assert_eq!(
            pacer.reserve_within(DM, t0, Duration::from_secs(10)),
            Err(Deferred::Held(Duration::from_secs(30)))
        );
        // Its burst is whole when the hold ends.
        let after = t0 + Duration::from_secs(30);
        assert_eq!(pacer.held_for(DM, after), Duration::ZERO);
        for _ in 0..3 {
            assert_eq!(pacer.reserve_within(DM, after, Duration::from_secs(10)), Ok(Duration::ZERO));
        }
    }

    /// A send as `Outbound` makes it: reserved for `chat` at `now`, then woken `late`
    /// after its reserved moment (a busy machine, a timer).
    struct Drive {
        chat: i64,
        reserved: Instant,
        late: Duration,
    }

    /// How long the ledger takes to record an attempt, between a request's clearance and
    /// its leaving: usually a moment; one in thirty-seven (a busy database, a checkpoint)
    /// long enough to bring the thirtieth request after it within its second, were it
    /// counted from its clearance.
    fn ledger_write(nth: usize) -> Duration {
        if nth % 37 == 1 { Duration::from_millis(70) } else { Duration::from_millis(2) }
    }

    /// How long a request takes to reach Telegram: usually a moment; one in eleven (a
    /// loaded machine, a resent packet) long enough to do the same, were it counted from
    /// its leaving. Its answer takes a moment back.
    fn way_to_telegram(nth: usize) -> Duration {
        if nth % 11 == 5 { Duration::from_millis(60) } else { Duration::from_millis(1) }
    }

    const WAY_BACK: Duration = Duration::from_millis(1);

    /// What happens next in [`drive`].
    enum Event {
        /// A send's moment came (or came again after a hold): ask for clearance.
        Due(i64),
        /// A cleared send's attempt is recorded: it leaves.
        Recorded(Cleared),
        /// Its answer came.
        Answered(Cleared),
    }

    /// Drives `pacer` the way `Outbound` drives it, every step in the order of its
    /// moment: a send cleared (or held and asked again), its attempt recorded (some
    /// writes slow, see [`ledger_write`]) while other sends go on, then its request made
    /// (some slow on their way, see [`way_to_telegram`]) and answered. Returns when each
    /// request reached Telegram.
    fn drive(pacer: &mut Pacer, sends: Vec<Drive>) -> Vec<Instant> {
        let mut events: Vec<(Instant, Event)> =
            sends.iter().map(|send| (send.reserved + send.late, Event::Due(send.chat))).collect();
        let mut arrived = Vec::new();
        let mut writes = 0;
        while !events.is_empty() {
            let next = (0..events.len()).min_by_key(|&i| events[i].0).unwrap();
            let (now, event) = events.swap_remove(next);
            match event {
                Event::Due(chat) => match pacer.clear_to_send(chat, now) {
                    Ok(cleared) => {
                        writes += 1;
                        events.push((now + ledger_write(writes), Event::Recorded(cleared)));
                    }
                    Err(hold) => events.push((now + hold, Event::Due(chat))),
                },
                Event::Recorded(cleared) => {
                    let arrives = now + way_to_telegram(arrived.len());
                    arrived.push(arrives);
                    events.push((arrives + WAY_BACK, Event::Answered(cleared)));
                }
                Event::Answered(cleared) => pacer.made(cleared, now),
            }
        }
        arrived
    }

    #[test]
    fn a_group_takes_no_more_than_twenty_in_any_minute_of_sends_actually_made() {
        let mut pacer = Pacer::default();
        let t0 = Instant::now();
        // Twenty-one sends to one group reserved at once; the first goes out late (held
        // behind other chats' sends, or after a 429 lowered the budget), the others on time.
        let sends: Vec<Drive> = (0..21)
            .map(|i| Drive {
                chat: GROUP,
                reserved: t0 + pacer.reserve(GROUP, t0),
                late: if i == 0 { Duration::from_secs(2) } else { Duration::ZERO },
            })
            .collect();
        let mut arrived = drive(&mut pacer, sends);
        arrived.sort_unstable();
        for (i, start) in arrived.iter().enumerate() {
            let in_minute = arrived[i..].iter().take_while(|sent| **sent < *start + GROUP_WINDOW).count();
            assert!(in_minute <= 20, "{in_minute} sends made in the minute from send {i}");
        }
    }

    /// 600 parts to 200 chats reserved at once (a morning report), driven with `change`
    /// coming in a second later: when each request reached Telegram.
    fn morning_report(change: impl FnOnce(&mut Pacer, Instant)) -> Vec<Instant> {
        let mut pacer = Pacer::default();
        let t0 = Instant::now();
        let sends: Vec<Drive> = (0..600)
            .map(|i| {
                let chat = 1 + i % 200;
                Drive { chat, reserved: t0 + pacer.reserve(chat, t0), late: Duration::ZERO }
            })
            .collect();
        // The sends of the first second go as reserved; then the change.
        let (first, rest): (Vec<Drive>, Vec<Drive>) =
            sends.into_iter().partition(|send| send.reserved < t0 + Duration::from_secs(1));
        let mut arrived = drive(&mut pacer, first);
        change(&mut pacer, arrived.iter().max().copied().unwrap());
        arrived.extend(drive(&mut pacer, rest));
        arrived
    }

    /// At most `per_sec` requests made in any second.
    fn within_budget(mut arrived: Vec<Instant>, per_sec: usize) {
        arrived.sort_unstable();
        for (i, start) in arrived.iter().enumerate() {
            let within =
                arrived[i..].iter().take_while(|t| t.duration_since(*start) < Duration::from_secs(1)).count();
            assert!(within <= per_sec, "{within} requests in the second from request {i}");
        }
    }

    #[test]
    fn requests_slow_to_record_or_to_reach_telegram_stay_within_the_budget_and_use_it() {
        let arrived = morning_report(|_, _| {});
        assert_eq!(arrived.len(), 600);
        let span = *arrived.iter().max().unwrap() - *arrived.iter().min().unwrap();
        let per_sec = 599.0 / span.as_secs_f64();
        assert!(per_sec >= 0.9 * 30.0, "{per_sec:.1} a second");
        within_budget(arrived, 30);
    }

    #[test]
    fn after_a_429_the_requests_made_stay_within_the_budget() {
        within_budget(morning_report(|pacer, now| pacer.rate_limited(DM, Duration::from_secs(1), now)), 30);
    }

    #[test]
    fn after_a_reload_that_lowers_the_budget_the_requests_made_stay_within_it() {
        let arrived = morning_report(|pacer, _| {
            pacer.set_limits(PaceLimits { overall_per_sec: 5, ..PaceLimits::default() })
        });
        within_budget(arrived, 30);
    }
}
