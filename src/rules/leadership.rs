//! Polling leadership across replicas (DESIGN.md §16, issue 24): which replica polls a bot
//! token, decided from what a candidate observed in the database, and how long a leader may
//! go on acting without a renewal.
//!
//! A leader holds a session-level advisory lock on a dedicated connection and a lease row
//! whose `term` grows at each election. A candidate that gets the lock is elected (the
//! previous holder's connection is gone). One that does not, and sees the lease expired on
//! the server's clock, deposes the holder (a paused or hung leader still holding its
//! connection): it terminates the backend that holds the lock, then tries again. Otherwise
//! it waits.
//!
//! A leader counts its tenure on its own monotonic clock from the moment it *sent* the
//! statement that elected or renewed it, never from the answer: the server set the lease's
//! end at least that late, so the leader stops believing it leads no later than the server
//! says the lease ends, however long the answer took to arrive. Its writes are fenced by the
//! term anyway; this bound is what keeps a deposed leader from polling Telegram for long.
//!
//! Pure: the caller passes the time and the observations in.

use std::fmt;
use std::time::{Duration, Instant};

/// The lease unless configured: a standby takes over within about this long after a
/// leader stops renewing (the bound), and the leader renews three times within it.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(10);

/// The shortest lease accepted: a renewal every third of it must stay well above a round
/// trip to the database and a scheduler's hiccup, or a healthy leader loses its lease.
pub const MIN_LEASE: Duration = Duration::from_millis(300);

/// The most often a replica's session streams carry a heartbeat, however short its lease.
pub const MIN_SESSION_HEARTBEAT: Duration = Duration::from_secs(1);

/// How many renewals fit in one lease: one may fail (a busy moment, a lost packet) and the
/// next still comes before the lease ends.
const RENEWALS_PER_LEASE: u32 = 3;

/// An election's number for one bot: it grows by one at each election, and every fenced
/// write names the term it was made under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Term(i64);

impl Term {
    /// The term as the database holds it.
    pub fn new(term: i64) -> Self {
        Self(term)
    }

    pub fn get(self) -> i64 {
        self.0
    }
}

impl fmt::Display for Term {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "term {}", self.0)
    }
}

/// How long a leader's lease lasts without a renewal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease(Duration);

/// A lease too short to be renewed reliably.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a polling lease of {given:?} is too short: it must be at least {MIN_LEASE:?}")]
pub struct LeaseTooShort {
    pub given: Duration,
}

impl Lease {
    pub fn new(lease: Duration) -> Result<Self, LeaseTooShort> {
        if lease < MIN_LEASE { Err(LeaseTooShort { given: lease }) } else { Ok(Self(lease)) }
    }

    pub fn duration(self) -> Duration {
        self.0
    }

    /// How often the leader renews: a third of the lease.
    pub fn renewal_interval(self) -> Duration {
        self.0 / RENEWALS_PER_LEASE
    }

    /// How often a replica's idle session streams carry a heartbeat: half the lease,
    /// between [`MIN_SESSION_HEARTBEAT`] and `single_daemon`'s interval. A plugin gives up
    /// on a stream after three missed heartbeats and tries the next replica's address, so
    /// one whose leader stopped answering without closing the connection (paused, wedged)
    /// moves on about when a standby has taken over, rather than minutes later.
    pub fn session_heartbeat(self, single_daemon: Duration) -> Duration {
        (self.0 / 2).clamp(MIN_SESSION_HEARTBEAT, single_daemon.max(MIN_SESSION_HEARTBEAT))
    }

    /// The lease in whole milliseconds, as the statements that set `expires_at` take it.
    pub fn millis(self) -> i64 {
        i64::try_from(self.0.as_millis()).unwrap_or(i64::MAX)
    }
}

impl Default for Lease {
    fn default() -> Self {
        Self(DEFAULT_LEASE)
    }
}

/// What a candidate saw when it asked for the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observation {
    /// It got the advisory lock: nobody else holds it.
    pub got_lock: bool,
    /// The lease row, if there is one.
    pub lease: Option<LeaseSeen>,
    /// The backend that holds the advisory lock, if another does (it may have let go
    /// between the two looks).
    pub lock_holder: Option<i32>,
}

/// The lease row as a candidate saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseSeen {
    pub term: Term,
    /// Whether `expires_at` has passed on the server's clock.
    pub expired: bool,
}

/// What a candidate does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Campaign {
    /// It holds the lock: take the next term.
    Elect,
    /// The leader is alive (or an election is under way): ask again later.
    StandBy,
    /// The lease expired while this backend still holds the lock: the leader is paused or
    /// hung. Terminate that backend (its lock goes with it), then ask for the lock again.
    Depose { backend: i32 },
}

/// The rule: the lock decides; without it, only an expired lease with a known holder
/// justifies deposing anyone.
pub fn campaign(observed: &Observation) -> Campaign {
    if observed.got_lock {
        return Campaign::Elect;
    }
    match (observed.lease, observed.lock_holder) {
        (Some(LeaseSeen { expired: true, .. }), Some(backend)) => Campaign::Depose { backend },
        // No row yet: the holder was just elected and is writing it. A fresh lease: the
        // leader is renewing. No holder: the lock was let go a moment ago; the next
        // attempt takes it.
        _ => Campaign::StandBy,
    }
}

/// How long a leader goes on leading: until the end of the lease it was last granted,
/// counted from when it asked (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tenure {
    pub term: Term,
    lease: Lease,
    /// When the last election or renewal that succeeded was sent.
    granted_at: Instant,
}

/// What a renewal came to, as the leader saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewal {
    /// The lease row took the new end, under this leader's term.
    Renewed,
    /// The row no longer names this term and backend: another replica was elected.
    Deposed,
    /// The statement failed (the database was busy): nothing is known.
    Failed,
    /// The leader's dedicated connection broke: its advisory lock is gone with it (or
    /// soon will be), and a standby may be elected at any moment.
    LostConnection,
}

/// What the leader does after a renewal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tenancy {
    /// Go on leading; renew next at this moment.
    Lead { renew_at: Instant },
    /// Stop acting as the leader now: stop polling, write nothing more under this term.
    StepDown,
}

impl Tenure {
    /// The tenure an election sent at `sent_at` grants.
    pub fn elected(term: Term, lease: Lease, sent_at: Instant) -> Self {
        Self { term, lease, granted_at: sent_at }
    }

    /// The moment this leader stops leading unless renewed.
    pub fn ends_at(&self) -> Instant {
        self.granted_at + self.lease.duration()
    }

    /// Whether it still leads at `now`.
    pub fn leads_at(&self, now: Instant) -> bool {
        now < self.ends_at()
    }

    /// When the next renewal is due, after the last one that succeeded.
    pub fn renew_at(&self) -> Instant {
        self.granted_at + self.lease.renewal_interval()
    }

    /// The tenure after a renewal sent at `sent_at` came to `renewal`, seen at `now`: a
    /// renewed lease runs from `sent_at`; a failed one leaves the tenure as it was and is
    /// tried again after another interval, unless the lease ends first; a deposed leader
    /// steps down at once.
    pub fn after(&mut self, renewal: Renewal, sent_at: Instant, now: Instant) -> Tenancy {
        match renewal {
            Renewal::Renewed => self.granted_at = self.granted_at.max(sent_at),
            Renewal::Deposed | Renewal::LostConnection => return Tenancy::StepDown,
            Renewal::Failed => {}
        }
        if !self.leads_at(now) {
            return Tenancy::StepDown;
        }
        let renew_at = match renewal {
            Renewal::Failed => (now + self.lease.renewal_interval()).min(self.ends_at()),
            _ => self.renew_at(),
        };
        Tenancy::Lead { renew_at }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn observed(got_lock: bool, lease: Option<(i64, bool)>, lock_holder: Option<i32>) -> Observation {
        Observation {
            got_lock,
            lease: lease.map(|(term, expired)| LeaseSeen { term: Term::new(term), expired }),
            lock_holder,
        }
    }

    #[test]
    fn the_lock_elects_whatever_the_lease_says() {
        assert_eq!(campaign(&observed(true, None, None)), Campaign::Elect);
        // The leader's connection died: its lock went with it, though its lease runs on.
        assert_eq!(campaign(&observed(true, Some((4, false)), None)), Campaign::Elect);
        assert_eq!(campaign(&observed(true, Some((4, true)), None)), Campaign::Elect);
    }

    #[test]
    fn without_the_lock_only_an_expired_lease_deposes_its_holder() {
        assert_eq!(campaign(&observed(false, Some((4, false)), Some(77))), Campaign::StandBy);
        assert_eq!(campaign(&observed(false, Some((4, true)), Some(77))), Campaign::Depose { backend: 77 });
        // An election under way (no row yet), or a lock let go meanwhile: wait.
        assert_eq!(campaign(&observed(false, None, Some(77))), Campaign::StandBy);
        assert_eq!(campaign(&observed(false, Some((4, true)), None)), Campaign::StandBy);
    }

    #[test]
    fn a_lease_is_renewed_three_times_within_itself_and_has_a_floor() {
        let lease = Lease::default();
        assert_eq!(lease.duration(), Duration::from_secs(10));
        assert!(lease.renewal_interval() * 3 <= lease.duration());
        assert!(
            lease.renewal_interval() * 2 > lease.duration() / 2,
            "one failed renewal leaves time for another"
        );
        assert_eq!(
            Lease::new(Duration::from_millis(299)),
            Err(LeaseTooShort { given: Duration::from_millis(299) })
        );
        assert_eq!(Lease::new(Duration::from_secs(2)).unwrap().millis(), 2000);
    }

    #[test]
    fn a_replicas_sessions_beat_twice_a_lease_within_bounds() {
        let single = Duration::from_secs(40);
        let beat = |secs: u64| Lease::new(Duration::from_secs(secs)).unwrap().session_heartbeat(single);
        assert_eq!(beat(10), Duration::from_secs(5));
        // Three missed beats fit in one and a half leases: a plugin leaves a paused leader
        // soon after a standby takes over.
        assert!(beat(10) * 3 <= Lease::default().duration() * 3 / 2);
        assert_eq!(beat(1), MIN_SESSION_HEARTBEAT, "never more than once a second");
        assert_eq!(beat(600), single, "never rarer than a single daemon's");
    }

    #[test]
    fn a_leader_counts_its_tenure_from_when_it_asked() {
        let lease = Lease::new(Duration::from_secs(9)).unwrap();
        let sent = Instant::now();
        let tenure = Tenure::elected(Term::new(1), lease, sent);
        assert_eq!(tenure.ends_at(), sent + Duration::from_secs(9));
        assert!(tenure.leads_at(sent + Duration::from_millis(8999)));
        assert!(!tenure.leads_at(sent + Duration::from_secs(9)));
        assert_eq!(tenure.renew_at(), sent + Duration::from_secs(3));
    }

    #[test]
    fn a_renewal_extends_from_its_sending_and_a_slow_answer_does_not_add_time() {
        let lease = Lease::new(Duration::from_secs(9)).unwrap();
        let start = Instant::now();
        let mut tenure = Tenure::elected(Term::new(2), lease, start);
        let sent = start + Duration::from_secs(3);
        // The answer took 5 s to come back: the lease still runs from when it was sent.
        let answered = sent + Duration::from_secs(5);
        assert_eq!(
            tenure.after(Renewal::Renewed, sent, answered),
            Tenancy::Lead { renew_at: sent + Duration::from_secs(3) }
        );
        assert_eq!(tenure.ends_at(), sent + Duration::from_secs(9));
    }

    #[test]
    fn a_failed_renewal_keeps_the_old_end_and_a_deposed_leader_steps_down() {
        let lease = Lease::new(Duration::from_secs(9)).unwrap();
        let start = Instant::now();
        let mut tenure = Tenure::elected(Term::new(3), lease, start);
        let first = start + Duration::from_secs(3);
        assert_eq!(
            tenure.after(Renewal::Failed, first, first),
            Tenancy::Lead { renew_at: first + Duration::from_secs(3) }
        );
        let second = start + Duration::from_secs(7);
        assert_eq!(
            tenure.after(Renewal::Failed, second, second),
            Tenancy::Lead { renew_at: start + Duration::from_secs(9) },
            "the retry comes no later than the lease's end"
        );
        let late = start + Duration::from_secs(9);
        assert_eq!(tenure.after(Renewal::Failed, late, late), Tenancy::StepDown);
        // A renewal whose answer came after the lease it would grant had ended grants
        // nothing: a standby may have taken over meanwhile.
        let mut expired = Tenure::elected(Term::new(3), lease, start);
        assert_eq!(
            expired.after(
                Renewal::Renewed,
                start + Duration::from_millis(10),
                start + Duration::from_secs(10)
            ),
            Tenancy::StepDown,
            "a renewal answered after the lease it asked for ended"
        );
        let mut deposed = Tenure::elected(Term::new(3), lease, start);
        assert_eq!(deposed.after(Renewal::Deposed, first, first), Tenancy::StepDown);
        let mut cut_off = Tenure::elected(Term::new(3), lease, start);
        assert_eq!(cut_off.after(Renewal::LostConnection, first, first), Tenancy::StepDown);
    }
}
