//! Telegram's sending limits as this fake enforces them, when a test asks it to
//! ([`super::FakeTelegram::enforce_limits`]): a send beyond them is answered `429 Too Many
//! Requests` with the `retry_after` that would let it through, and nothing is posted.
//!
//! Telegram publishes its limits as guidance, not as an algorithm: "avoid sending more
//! than one message per second" to one chat, "not more than 20 messages per minute" to
//! one group, and "not more than about 30 messages per second" in all. The fake reads them
//! strictly where they are numbers: overall, at most `overall_per_sec` sends in any
//! window of one second; per group, at most `group_per_minute` in any window of a minute;
//! per chat, a bucket that tolerates a burst of `chat_burst` and refills at the chat's rate
//! (Telegram answers a short burst to one chat; a sustained rate above one a second it
//! does not).

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

/// The limits the fake enforces.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TelegramLimits {
    /// Sends in any window of one second, across all chats.
    pub overall_per_sec: u32,
    /// Sends a private chat takes at once, and then one per `private_interval`.
    pub chat_burst: u32,
    pub private_interval: Duration,
    /// The same for a group or channel.
    pub group_interval: Duration,
    /// Sends in any window of one minute to one group or channel.
    pub group_per_minute: u32,
}

impl Default for TelegramLimits {
    fn default() -> Self {
        Self {
            overall_per_sec: 30,
            chat_burst: 4,
            private_interval: Duration::from_secs(1),
            group_interval: Duration::from_secs(3),
            group_per_minute: 20,
        }
    }
}

/// What the fake has seen of the sends it enforced limits on.
#[derive(Debug)]
pub(super) struct LimitsState {
    limits: TelegramLimits,
    /// The accepted sends of the last second, oldest first.
    recent: VecDeque<Instant>,
    /// Per chat: tokens, and when they were counted.
    chats: HashMap<i64, (f64, Instant)>,
    /// Per group: its accepted sends of the last minute, oldest first.
    group_minutes: HashMap<i64, VecDeque<Instant>>,
}

impl LimitsState {
    pub(super) fn new(limits: TelegramLimits) -> Self {
        Self { limits, recent: VecDeque::new(), chats: HashMap::new(), group_minutes: HashMap::new() }
    }

    /// Takes a send to `chat_id` at `now`, or says how long until it would be taken (a
    /// 429's `retry_after`, which Telegram gives in whole seconds).
    pub(super) fn admit(&mut self, chat_id: i64, now: Instant) -> Result<(), Duration> {
        const SECOND: Duration = Duration::from_secs(1);
        const MINUTE: Duration = Duration::from_secs(60);
        let overall = window_full(&mut self.recent, SECOND, self.limits.overall_per_sec, now);
        let group_minute = if chat_id < 0 {
            let minute = self.group_minutes.entry(chat_id).or_default();
            window_full(minute, MINUTE, self.limits.group_per_minute, now)
        } else {
            None
        };
        let interval = if chat_id > 0 { self.limits.private_interval } else { self.limits.group_interval };
        let burst = f64::from(self.limits.chat_burst);
        let (tokens, at) = self.chats.entry(chat_id).or_insert((burst, now));
        let refilled = (*tokens + now.duration_since(*at).as_secs_f64() / interval.as_secs_f64()).min(burst);
        let in_chat = (refilled < 1.0).then(|| interval.mul_f64(1.0 - refilled));
        if let Some(wait) = overall.max(in_chat).max(group_minute) {
            return Err(wait);
        }
        *tokens = refilled - 1.0;
        *at = now;
        self.recent.push_back(now);
        if chat_id < 0 {
            self.group_minutes.entry(chat_id).or_default().push_back(now);
        }
        Ok(())
    }
}

/// How long until `sent` (accepted sends, oldest first) holds fewer than `cap` within
/// `window` of now; none when it already does. Forgets sends out of the window.
fn window_full(sent: &mut VecDeque<Instant>, window: Duration, cap: u32, now: Instant) -> Option<Duration> {
    while sent.front().is_some_and(|oldest| now.duration_since(*oldest) >= window) {
        sent.pop_front();
    }
    let first_to_leave = sent.len().checked_sub(cap as usize)?;
    Some(window - now.duration_since(sent[first_to_leave]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn more_than_the_overall_budget_in_one_second_is_refused_until_the_oldest_leaves_it() {
        let mut limits = LimitsState::new(TelegramLimits { overall_per_sec: 3, ..TelegramLimits::default() });
        let t0 = Instant::now();
        for chat in 1..=3 {
            assert_eq!(limits.admit(chat, t0), Ok(()));
        }
        assert_eq!(limits.admit(4, t0 + Duration::from_millis(400)), Err(Duration::from_millis(600)));
        assert_eq!(limits.admit(4, t0 + Duration::from_secs(1)), Ok(()));
    }

    #[test]
    fn a_chat_takes_a_short_burst_then_one_per_interval() {
        let mut limits = LimitsState::new(TelegramLimits::default());
        let t0 = Instant::now();
        for _ in 0..4 {
            assert_eq!(limits.admit(7, t0), Ok(()));
        }
        assert_eq!(limits.admit(7, t0), Err(Duration::from_secs(1)));
        assert_eq!(limits.admit(7, t0 + Duration::from_secs(1)), Ok(()));
        for _ in 0..4 {
            assert_eq!(limits.admit(-7, t0), Ok(()));
        }
        let wait = limits.admit(-7, t0 + Duration::from_secs(1)).unwrap_err();
        assert!(wait.abs_diff(Duration::from_secs(2)) < Duration::from_millis(1), "{wait:?}");
    }

    #[test]
    fn a_group_takes_no_more_than_its_minutes_worth_in_any_minute() {
        let mut limits =
            LimitsState::new(TelegramLimits { overall_per_sec: 1000, ..TelegramLimits::default() });
        let t0 = Instant::now();
        // The burst, then one every three seconds: the 21st within the minute is refused
        // until the first leaves it, though the bucket has a token.
        let mut at = vec![t0; 4];
        for i in 1..=16 {
            at.push(t0 + Duration::from_secs(3 * i));
        }
        for sent in &at {
            assert_eq!(limits.admit(-7, *sent), Ok(()));
        }
        let wait = limits.admit(-7, t0 + Duration::from_secs(55)).unwrap_err();
        assert_eq!(wait, Duration::from_secs(5));
        assert_eq!(limits.admit(-7, t0 + Duration::from_secs(60)), Ok(()));
    }
}
