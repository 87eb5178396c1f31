//! Per-chat pacing of outbound messages: Telegram allows about one message per second in
//! a private chat and about twenty per minute in a group, and answers a burst beyond that
//! with `429 Too Many Requests`. Pacing sends to those rates instead of bursting into
//! rate limits keeps long replies flowing and keeps `retry_after` waits for real overload.
//!
//! A token bucket per chat: a short burst goes out at once (a reply of a few parts is not
//! slowed down), then sends are spaced at the chat's rate. Pure: the caller passes the
//! time in and sleeps for the answer itself.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Messages a chat may receive at once before pacing starts.
pub const BURST: f64 = 3.0;

/// Telegram's guidance: "avoid sending more than one message per second" to one chat.
pub const PRIVATE_INTERVAL: Duration = Duration::from_secs(1);

/// Telegram's guidance: "not more than 20 messages per minute" to one group.
pub const GROUP_INTERVAL: Duration = Duration::from_secs(3);

/// How the chats' buckets stand.
#[derive(Debug)]
pub struct ChatPacer {
    /// The spacing of sends to a private chat and to a group; zero turns pacing off.
    private: Duration,
    group: Duration,
    buckets: HashMap<i64, Bucket>,
}

impl Default for ChatPacer {
    fn default() -> Self {
        Self::new(PRIVATE_INTERVAL, GROUP_INTERVAL)
    }
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    /// Sends available now; negative when sends are already reserved into the future.
    tokens: f64,
    at: Instant,
}

impl ChatPacer {
    pub fn new(private: Duration, group: Duration) -> Self {
        Self { private, group, buckets: HashMap::new() }
    }

    /// New spacings (a configuration reload); the chats' buckets carry over.
    pub fn set_intervals(&mut self, private: Duration, group: Duration) {
        self.private = private;
        self.group = group;
    }

    /// Private chats have positive ids (the user's id); groups and channels negative ones.
    fn interval_for(&self, chat_id: i64) -> Duration {
        if chat_id > 0 { self.private } else { self.group }
    }

    /// Reserves one send to `chat_id` and returns how long to wait before making it.
    /// Reservations queue: three sends reserved at once past the burst wait one, two and
    /// three intervals.
    pub fn reserve(&mut self, chat_id: i64, now: Instant) -> Duration {
        if self.buckets.len() > PRUNE_ABOVE {
            self.prune(now);
        }
        let interval = self.interval_for(chat_id).as_secs_f64();
        if interval == 0.0 {
            return Duration::ZERO;
        }
        let bucket = self.buckets.entry(chat_id).or_insert(Bucket { tokens: BURST, at: now });
        let elapsed = now.saturating_duration_since(bucket.at).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed / interval).min(BURST) - 1.0;
        bucket.at = now;
        if bucket.tokens >= 0.0 { Duration::ZERO } else { Duration::from_secs_f64(-bucket.tokens * interval) }
    }

    /// Forgets chats whose bucket has refilled: they would start from a full burst anyway,
    /// so memory stays bounded by the chats active within the last few seconds.
    fn prune(&mut self, now: Instant) {
        let (private, group) = (self.private, self.group);
        self.buckets.retain(|&chat_id, bucket| {
            let interval = if chat_id > 0 { private } else { group };
            let full_after = interval.mul_f64((BURST - bucket.tokens).max(0.0));
            now.saturating_duration_since(bucket.at) < full_after
        });
    }

    pub fn tracked_chats(&self) -> usize {
        self.buckets.len()
    }
}

/// Pruning scans every bucket; below this many it is not worth doing.
const PRUNE_ABOVE: usize = 64;

#[cfg(test)]
mod tests {
    use super::*;

    const DM: i64 = 42;
    const GROUP: i64 = -100;

    #[test]
    fn a_short_burst_goes_at_once_then_sends_are_spaced() {
        let mut pacer = ChatPacer::default();
        let t0 = Instant::now();
        let waits: Vec<u64> = (0..6).map(|_| pacer.reserve(DM, t0).as_millis() as u64).collect();
        assert_eq!(waits, [0, 0, 0, 1000, 2000, 3000]);
    }

    #[test]
    fn groups_are_paced_at_twenty_a_minute() {
        let mut pacer = ChatPacer::default();
        let t0 = Instant::now();
        let waits: Vec<u64> = (0..5).map(|_| pacer.reserve(GROUP, t0).as_millis() as u64).collect();
        assert_eq!(waits, [0, 0, 0, 3000, 6000]);
    }

    #[test]
    fn the_bucket_refills_with_time_up_to_the_burst() {
        let mut pacer = ChatPacer::default();
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
        let waits: Vec<u64> = (0..4).map(|_| pacer.reserve(DM, later).as_millis() as u64).collect();
        assert_eq!(waits, [0, 0, 0, 1000]);
    }

    #[test]
    fn chats_are_paced_independently() {
        let mut pacer = ChatPacer::default();
        let t0 = Instant::now();
        for _ in 0..3 {
            pacer.reserve(DM, t0);
        }
        assert_eq!(pacer.reserve(DM + 1, t0), Duration::ZERO);
        assert_eq!(pacer.reserve(GROUP, t0), Duration::ZERO);
        assert_eq!(pacer.reserve(DM, t0), Duration::from_secs(1));
    }

    #[test]
    fn a_zero_interval_turns_pacing_off() {
        let mut pacer = ChatPacer::new(Duration::ZERO, Duration::ZERO);
        let t0 = Instant::now();
        assert!((0..100).all(|_| pacer.reserve(GROUP, t0).is_zero()));
        assert_eq!(pacer.tracked_chats(), 0);
    }

    #[test]
    fn idle_chats_are_forgotten() {
        let mut pacer = ChatPacer::default();
        let t0 = Instant::now();
        for chat in 1..=200 {
            pacer.reserve(chat, t0);
        }
        assert!(pacer.tracked_chats() >= 200);
        pacer.reserve(1_000, t0 + Duration::from_secs(60));
        assert_eq!(pacer.tracked_chats(), 1);
    }
}
