//! The PostgreSQL ledger against the machine's server, each test in a fresh schema
//! (`test_support`): migrations, elections and terms, takeovers, fencing, deduplication
//! under concurrency, and the error mapping.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use sqlx::{Connection, PgConnection, Row};
use tokio_util::sync::CancellationToken;

use super::test_support::{TestSchema, admin, server_url};
use super::*;
use crate::ids::{AgentName, RouteName, TraceId};
use crate::ledger::prelude::*;
use crate::ledger::{EnvelopeState, RoutedEnvelope};
use crate::rules::leadership::{Lease, Renewal, Tenure};
use crate::rules::routes::Channel;
use crate::telegram::envelope::{ChatType, Envelope, EnvelopeKind, Sender};

const BOT: i64 = 4242;

fn routed(update_id: i64) -> RoutedEnvelope {
    RoutedEnvelope {
        envelope: Envelope {
            trace_id: TraceId::generate(),
            update_id,
            kind: EnvelopeKind::Message,
            channel: Channel { chat_id: 42, thread_id: Some(7) },
            chat_type: ChatType::Supergroup,
            chat_title: Some("Ops".into()),
            message_id: update_id as i32,
            sender: Sender { id: Some(42), username: Some("ann".into()), name: "Ann".into() },
            text: Some(format!("message {update_id}")),
            attachments: vec![],
            described: None,
            context: Default::default(),
            sent_at: Utc::now(),
        },
        state: EnvelopeState::Queued,
        route: Some(RouteName::parse("ops").unwrap()),
        agent: Some(AgentName::parse("worker").unwrap()),
        update_digest: format!("digest of update {update_id}"),
        note: None,
        raw_update: None,
    }
}

fn lease(millis: u64) -> Lease {
    Lease::new(Duration::from_millis(millis)).unwrap()
}

async fn envelope_count(ledger: &PgLedger) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM envelopes").fetch_one(&ledger.pool).await.unwrap()
}

/// Asks every lease/3, as a standby does, until elected; panics after `within`.
async fn campaign_until_elected(candidate: &mut PollerCandidate, within: Duration) -> Tenure {
    let deadline = Instant::now() + within;
    loop {
        if let Elected::Leader(tenure) = candidate.campaign_once().await.unwrap() {
            return tenure;
        }
        assert!(Instant::now() < deadline, "no election within {within:?}");
        tokio::time::sleep(candidate.lease().renewal_interval()).await;
    }
}

async fn elected(candidate: &mut PollerCandidate) -> Tenure {
    match candidate.campaign_once().await.unwrap() {
        Elected::Leader(tenure) => tenure,
        Elected::StandBy => panic!("expected to be elected"),
    }
}

/// Ends a session as a crash would (the process died, the network went), from outside.
async fn kill_session(backend: i32) {
    let killed: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1, 5000)")
        .bind(backend)
        .fetch_one(&mut admin().await)
        .await
        .unwrap();
    assert!(killed, "backend {backend} terminated");
}

async fn session_exists(backend: i32) -> bool {
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)")
        .bind(backend)
        .fetch_one(&mut admin().await)
        .await
        .unwrap()
}

/// A URL whose search_path names a schema that does not exist: refused in one message that
/// names the search_path and what to do, by the daemon and by the ledger commands alike.
#[tokio::test]
async fn a_search_path_without_a_schema_is_refused_naming_it() {
    let schema = TestSchema::create().await;
    let missing = format!("{}_never_made", schema.name);
    let url = schema.url.replace(&schema.name, &missing);
    for opened in [PgLedger::connect(&url).await, PgLedger::connect_existing(&url).await] {
        let Err(error) = opened else { panic!("a ledger opened in a schema that does not exist") };
        assert!(matches!(error, PgOpenError::NoSchema { .. }), "{error:?}");
        let message = error.to_string();
        assert!(message.contains(&missing) && message.contains("CREATE SCHEMA"), "{message}");
    }
    schema.drop().await;
}

/// A database in an encoding other than UTF8 (which refuses an emoji, 22P05, on every
/// try) is refused as the ledger opens, in a message that says what to do.
#[tokio::test]
async fn a_database_not_in_utf8_is_refused_naming_its_encoding() {
    let database = format!("sb_test_latin1_{}", std::process::id());
    let mut admin = admin().await;
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP DATABASE IF EXISTS {database}")))
        .execute(&mut admin)
        .await
        .unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "CREATE DATABASE {database} ENCODING 'LATIN1' TEMPLATE template0 LC_COLLATE 'C' LC_CTYPE 'C'"
    )))
    .execute(&mut admin)
    .await
    .unwrap();
    let mut url = reqwest::Url::parse(&server_url()).unwrap();
    url.set_path(&database);
    let opened = PgLedger::connect(url.as_str()).await;
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP DATABASE {database} WITH (FORCE)")))
        .execute(&mut admin)
        .await
        .unwrap();
    let Err(error) = opened else { panic!("a ledger opened in a LATIN1 database") };
    assert!(matches!(error, PgOpenError::NotUtf8 { .. }), "{error:?}");
    let message = error.to_string();
    assert!(message.contains("LATIN1") && message.contains("ENCODING 'UTF8'"), "{message}");
}

#[tokio::test]
async fn migrations_apply_twice_and_change_nothing_the_second_time() {
    let schema = TestSchema::create().await;
    let first = PgLedger::connect(&schema.url).await.unwrap();
    let objects = "SELECT count(*) FROM pg_class WHERE relnamespace = current_schema()::regnamespace";
    let applied = "SELECT count(*) FROM _sqlx_migrations WHERE success";
    let before: (i64, i64) = (
        sqlx::query_scalar(objects).fetch_one(&first.pool).await.unwrap(),
        sqlx::query_scalar(applied).fetch_one(&first.pool).await.unwrap(),
    );
    assert_eq!(before.1, MIGRATOR.iter().count() as i64, "every migration recorded once");
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT tablename::text FROM pg_tables WHERE schemaname = current_schema() ORDER BY tablename",
    )
    .fetch_all(&first.pool)
    .await
    .unwrap();
    for table in [
        "envelopes",
        "attempts",
        "poller_offsets",
        "poller_leases",
        "handoffs",
        "tasks",
        "permission_requests",
    ] {
        assert!(tables.iter().any(|t| t == table), "{table} in {tables:?}");
    }
    first.close().await;

    let second = PgLedger::connect(&schema.url).await.unwrap();
    let after: (i64, i64) = (
        sqlx::query_scalar(objects).fetch_one(&second.pool).await.unwrap(),
        sqlx::query_scalar(applied).fetch_one(&second.pool).await.unwrap(),
    );
    assert_eq!(after, before, "the second connect applied nothing");
    second.close().await;
    schema.drop().await;
}

#[tokio::test]
async fn the_schema_keeps_sqlites_rules() {
    let schema = TestSchema::create().await;
    let ledger = PgLedger::connect(&schema.url).await.unwrap();
    // The trigger of SQLite's migration 0006: acking a cancel envelope stops its task.
    let envelope: i64 = sqlx::query_scalar(
        "INSERT INTO envelopes (trace_id, kind, chat_id, chat_type, message_id, sender_name, content, sent_at, \
         received_at, state, state_changed_at) \
         VALUES ('env_cancel', 'revision', 42, 'private', 0, 'Ann', 'cancel', now(), now(), 'pending', now()) RETURNING id",
    )
    .fetch_one(&ledger.pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO tasks (task_id, chat_id, agent, route, state, revision, objective, first_envelope_id, \
         started_by, started_source, cancel_envelope_id, opened_at, updated_at) \
         VALUES ('task_1', 42, 'worker', 'ops', 'stop_requested', 2, 'x', $1, 'Ann', 'message', $1, now(), now())",
    )
    .bind(envelope)
    .execute(&ledger.pool)
    .await
    .unwrap();
    sqlx::query("UPDATE envelopes SET state = 'acked' WHERE id = $1")
        .bind(envelope)
        .execute(&ledger.pool)
        .await
        .unwrap();
    let state: String = sqlx::query_scalar("SELECT state FROM tasks WHERE task_id = 'task_1'")
        .fetch_one(&ledger.pool)
        .await
        .unwrap();
    assert_eq!(state, "stopped");
    ledger.close().await;
    schema.drop().await;
}

#[tokio::test]
async fn terms_increase_at_each_election() {
    let schema = TestSchema::create().await;
    let ledger = PgLedger::connect(&schema.url).await.unwrap();
    let mut a = PollerCandidate::connect(&ledger, BOT, "a", lease(2000)).await.unwrap();
    let mut b = PollerCandidate::connect(&ledger, BOT, "b", lease(2000)).await.unwrap();
    let first = elected(&mut a).await;
    a.resign(first.term).await;
    let second = elected(&mut b).await;
    b.resign(second.term).await;
    let third = elected(&mut a).await;
    assert!(first.term < second.term && second.term < third.term, "{first:?} {second:?} {third:?}");
    // Another bot has terms of its own.
    let mut other = PollerCandidate::connect(&ledger, BOT + 1, "b", lease(2000)).await.unwrap();
    assert_eq!(elected(&mut other).await.term, Term::new(1));
    ledger.close().await;
    schema.drop().await;
}

#[tokio::test]
async fn a_second_replica_cannot_lead_while_the_first_holds() {
    let schema = TestSchema::create().await;
    let ledger = PgLedger::connect(&schema.url).await.unwrap();
    let mut a = PollerCandidate::connect(&ledger, BOT, "a", lease(10_000)).await.unwrap();
    let mut b = PollerCandidate::connect(&ledger, BOT, "b", lease(10_000)).await.unwrap();
    let tenure = elected(&mut a).await;
    for _ in 0..3 {
        assert_eq!(b.campaign_once().await.unwrap(), Elected::StandBy);
    }
    // The leader's writes pass; nothing a standby could do moved the term.
    ledger.commit_offset(tenure.term, BOT, 5).await.unwrap();
    assert_eq!(ledger.next_offset(BOT).await.unwrap(), Some(5));
    // The same bot in another schema of the same database is another ledger, with a lock
    // of its own.
    let elsewhere = TestSchema::create().await;
    let other_ledger = PgLedger::connect(&elsewhere.url).await.unwrap();
    let mut c = PollerCandidate::connect(&other_ledger, BOT, "c", lease(10_000)).await.unwrap();
    assert_eq!(elected(&mut c).await.term, Term::new(1));
    other_ledger.close().await;
    elsewhere.drop().await;
    ledger.close().await;
    schema.drop().await;
}

#[tokio::test]
async fn a_standby_leads_within_the_lease_when_the_leaders_connection_dies() {
    let schema = TestSchema::create().await;
    let ledger = PgLedger::connect(&schema.url).await.unwrap();
    let lease = lease(3000);
    let mut a = PollerCandidate::connect(&ledger, BOT, "a", lease).await.unwrap();
    let mut b = PollerCandidate::connect(&ledger, BOT, "b", lease).await.unwrap();
    let first = elected(&mut a).await;
    assert_eq!(b.campaign_once().await.unwrap(), Elected::StandBy);

    let killed_at = Instant::now();
    kill_session(a.backend_pid().await.unwrap()).await;
    let second = campaign_until_elected(&mut b, lease.duration()).await;
    let takeover = killed_at.elapsed();
    assert!(takeover < lease.duration(), "took over in {takeover:?}, within the lease");
    assert!(second.term > first.term);
    // The old leader learns it at its next renewal.
    assert_eq!(a.renew_once(first.term).await, Renewal::LostConnection);
    ledger.close().await;
    schema.drop().await;
}

#[tokio::test]
async fn a_standby_waiting_for_the_lock_has_it_the_moment_the_leaders_session_ends() {
    let schema = TestSchema::create().await;
    let ledger = PgLedger::connect(&schema.url).await.unwrap();
    // A long lease, so that asking again after a pause could not take over this soon.
    let lease = lease(30_000);
    let mut a = PollerCandidate::connect(&ledger, BOT, "a", lease).await.unwrap();
    let mut b = PollerCandidate::connect(&ledger, BOT, "b", lease).await.unwrap();
    let first = elected(&mut a).await;
    assert_eq!(b.campaign_once().await.unwrap(), Elected::StandBy);

    // While the leader lives, the wait ends after its time, and the standby stands by.
    let waited_from = Instant::now();
    b.wait_for_lock(Duration::from_millis(300)).await;
    assert!(waited_from.elapsed() >= Duration::from_millis(300), "waited {:?}", waited_from.elapsed());
    assert_eq!(b.campaign_once().await.unwrap(), Elected::StandBy);

    let leader_backend = a.backend_pid().await.unwrap();
    let killed_at = Instant::now();
    let (_, ()) = tokio::join!(b.wait_for_lock(lease.renewal_interval()), async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        kill_session(leader_backend).await;
    });
    let second = elected(&mut b).await;
    let takeover = killed_at.elapsed();
    assert!(
        takeover < Duration::from_secs(3),
        "took over in {takeover:?}, not after the wait of {:?}",
        lease.renewal_interval()
    );
    assert!(second.term > first.term);
    ledger.close().await;
    schema.drop().await;
}

#[tokio::test]
async fn a_leader_that_stops_renewing_is_terminated_and_replaced_after_its_lease() {
    let schema = TestSchema::create().await;
    let ledger = PgLedger::connect(&schema.url).await.unwrap();
    let lease = lease(1000);
    let mut a = PollerCandidate::connect(&ledger, BOT, "a", lease).await.unwrap();
    let mut b = PollerCandidate::connect(&ledger, BOT, "b", lease).await.unwrap();
    let before_election = Instant::now();
    let first = elected(&mut a).await;
    let paused = a.backend_pid().await.unwrap();
    // `a` is paused from here on: it keeps its session (and its lock) and renews nothing.
    assert_eq!(b.campaign_once().await.unwrap(), Elected::StandBy, "the lease is fresh");
    let second = campaign_until_elected(&mut b, lease.duration() * 4).await;
    assert!(before_election.elapsed() >= lease.duration(), "not before the lease expired");
    assert!(second.term > first.term);
    assert!(!session_exists(paused).await, "the paused leader's session was terminated");
    // Resumed, the old leader finds out, and its writes are fenced.
    assert_eq!(a.renew_once(first.term).await, Renewal::LostConnection);
    assert!(matches!(ledger.commit_offset(first.term, BOT, 9).await, Err(FencedError::Deposed { .. })));
    ledger.close().await;
    schema.drop().await;
}

/// A leader paused in the middle of a fenced write (SIGSTOP, a frozen VM) holds the lease
/// row the election must take: the server ends that quiet transaction, and the standby
/// leads soon after the lease, not when the paused leader comes back.
#[tokio::test]
async fn a_leader_paused_inside_a_fenced_write_is_replaced_all_the_same() {
    let schema = TestSchema::create().await;
    let ledger = PgLedger::connect(&schema.url).await.unwrap();
    let lease = lease(1000);
    let mut a = PollerCandidate::connect(&ledger, BOT, "a", lease).await.unwrap();
    let mut b = PollerCandidate::connect(&ledger, BOT, "b", lease).await.unwrap();
    let old = elected(&mut a).await;
    let started = Instant::now();
    let mut paused = ledger.begin().await.unwrap();
    fence_intake(&mut paused, old.term, BOT, Some(7), &[]).await.unwrap();
    // `a` is paused from here on: its session, its lock and its open write stay.
    let within = lease.duration() + IDLE_IN_TRANSACTION_TIMEOUT + LOCK_TIMEOUT;
    let new = campaign_until_elected(&mut b, within).await;
    assert!(new.term > old.term);
    assert!(started.elapsed() >= lease.duration(), "not before the lease expired");
    // Resumed, the paused write finds its session gone, and nothing of it stands.
    assert!(paused.commit().await.is_err(), "the paused write was ended");
    assert_eq!(ledger.next_offset(BOT).await.unwrap(), None);
    ledger.close().await;
    schema.drop().await;
}

#[tokio::test]
async fn a_renewing_leader_keeps_its_lease_past_its_length_and_resigning_hands_it_over() {
    let schema = TestSchema::create().await;
    let ledger = PgLedger::connect(&schema.url).await.unwrap();
    let lease = lease(900);
    let mut a = PollerCandidate::connect(&ledger, BOT, "a", lease).await.unwrap();
    let mut b = PollerCandidate::connect(&ledger, BOT, "b", lease).await.unwrap();
    let tenure = elected(&mut a).await;
    let shutdown = CancellationToken::new();
    let holding = tokio::spawn({
        let shutdown = shutdown.clone();
        async move { a.hold(tenure, &shutdown, &tokio::sync::watch::Sender::new(Instant::now())).await }
    });
    // A real duration: three leases' worth of the standby asking, as it would.
    let until = Instant::now() + lease.duration() * 3;
    while Instant::now() < until {
        assert_eq!(b.campaign_once().await.unwrap(), Elected::StandBy, "the leader renews");
        tokio::time::sleep(lease.renewal_interval()).await;
    }
    shutdown.cancel();
    assert_eq!(holding.await.unwrap(), StepDown::Resigned);
    let next = elected(&mut b).await;
    assert!(next.term > tenure.term, "a resignation hands over at the standby's next try");
    ledger.close().await;
    schema.drop().await;
}

/// The database does not answer the renewals (here: another transaction holds the lease
/// row, so the renewal waits): the leader stops leading when its lease ends, not when the
/// renewal returns.
#[tokio::test]
async fn a_leader_whose_renewals_hang_steps_down_when_its_lease_ends() {
    let schema = TestSchema::create().await;
    let ledger = PgLedger::connect(&schema.url).await.unwrap();
    let lease = lease(1000);
    let mut a = PollerCandidate::connect(&ledger, BOT, "a", lease).await.unwrap();
    let mut b = PollerCandidate::connect(&ledger, BOT, "b", lease).await.unwrap();
    let tenure = elected(&mut a).await;
    let mut blocker = PgConnection::connect(&schema.url).await.unwrap();
    let mut blocking = blocker.begin().await.unwrap();
    sqlx::query("SELECT * FROM poller_leases FOR UPDATE").execute(&mut *blocking).await.unwrap();
    let holding = tokio::spawn(async move {
        a.hold(tenure, &CancellationToken::new(), &tokio::sync::watch::Sender::new(Instant::now())).await
    });
    let step_down =
        tokio::time::timeout(lease.duration() * 2, holding).await.expect("stepped down by itself");
    assert_eq!(step_down.unwrap(), StepDown::Expired);
    assert!(!tenure.leads_at(Instant::now()), "not before its lease ended");
    blocking.rollback().await.unwrap();
    let next = campaign_until_elected(&mut b, lease.duration() * 4).await;
    assert!(next.term > tenure.term);
    ledger.close().await;
    schema.drop().await;
}

#[tokio::test]
async fn a_leader_whose_connection_dies_steps_down_by_itself() {
    let schema = TestSchema::create().await;
    let ledger = PgLedger::connect(&schema.url).await.unwrap();
    let lease = lease(1500);
    let mut a = PollerCandidate::connect(&ledger, BOT, "a", lease).await.unwrap();
    let tenure = elected(&mut a).await;
    let backend = a.backend_pid().await.unwrap();
    let holding = tokio::spawn(async move {
        a.hold(tenure, &CancellationToken::new(), &tokio::sync::watch::Sender::new(Instant::now())).await
    });
    kill_session(backend).await;
    let step_down =
        tokio::time::timeout(lease.duration(), holding).await.expect("stepped down within the lease");
    assert_eq!(step_down.unwrap(), StepDown::LostConnection);
    ledger.close().await;
    schema.drop().await;
}

#[tokio::test]
async fn a_deposed_leaders_writes_fail_and_change_nothing() {
    let schema = TestSchema::create().await;
    let ledger = PgLedger::connect(&schema.url).await.unwrap();
    let mut a = PollerCandidate::connect(&ledger, BOT, "a", lease(5000)).await.unwrap();
    let mut b = PollerCandidate::connect(&ledger, BOT, "b", lease(5000)).await.unwrap();
    // Nobody elected yet: no term passes.
    assert!(matches!(
        ledger.commit_offset(Term::new(1), BOT, 1).await,
        Err(FencedError::Deposed { current: CurrentTerm::None, .. })
    ));
    let old = elected(&mut a).await;
    let stored = ledger.record_updates(old.term, BOT, 3, &[routed(1), routed(2)]).await.unwrap();
    assert_eq!(stored, [true, true]);

    kill_session(a.backend_pid().await.unwrap()).await;
    let new = campaign_until_elected(&mut b, Duration::from_secs(5)).await;

    let late_offset = ledger.commit_offset(old.term, BOT, 10).await;
    assert!(
        matches!(late_offset, Err(FencedError::Deposed { term, current: CurrentTerm::Term(current) }) if term == old.term && current == new.term),
        "{late_offset:?}"
    );
    let late_batch = ledger.record_updates(old.term, BOT, 4, &[routed(3)]).await;
    assert!(matches!(late_batch, Err(FencedError::Deposed { .. })), "{late_batch:?}");
    assert_eq!(ledger.next_offset(BOT).await.unwrap(), Some(3), "the offset did not move");
    assert_eq!(envelope_count(&ledger).await, 2, "no envelope was recorded");

    // The new leader's writes pass, and a re-polled update is stored once.
    let stored = ledger.record_updates(new.term, BOT, 4, &[routed(2), routed(3)]).await.unwrap();
    assert_eq!(stored, [false, true]);
    assert_eq!(ledger.next_offset(BOT).await.unwrap(), Some(4));
    ledger.close().await;
    schema.drop().await;
}

async fn attempt_count(ledger: &PgLedger) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM attempts").fetch_one(&ledger.pool).await.unwrap()
}

/// Only the leader sends, takes webhook deliveries in and hands envelopes to sessions
/// (DESIGN.md §16): a replica that led records no send attempt, no delivery and no claim
/// once a newer term began, even before it has learned so (paused past its lease, say),
/// and none once it has. A ledger that never led (the command line) is not fenced.
#[tokio::test]
async fn a_replica_that_no_longer_leads_sends_takes_in_and_hands_over_nothing() {
    use crate::ledger::ListFilter;
    use crate::ledger::conformance::fixtures::one_part_reply;
    let schema = TestSchema::create().await;
    let first = PgLedger::connect(&schema.url).await.unwrap();
    let second = PgLedger::connect(&schema.url).await.unwrap();
    let mut a = PollerCandidate::connect(&first, BOT, "a", lease(5000)).await.unwrap();
    let mut b = PollerCandidate::connect(&second, BOT, "b", lease(5000)).await.unwrap();
    let old = elected(&mut a).await;
    first.lead_polling(BOT, old.term);
    first.record_updates(old.term, BOT, 3, &[routed(1), routed(2)]).await.unwrap();
    let rows = first.list(&ListFilter { limit: 10, ..Default::default() }).await.unwrap();
    first.begin_attempt(&one_part_reply(rows[0].id)).await.unwrap().unwrap();
    let delivered = [routed(3)];
    first.record_pushed_batch(&delivered, &[], &[], None).await.unwrap();
    assert_eq!(envelope_count(&first).await, 3);

    kill_session(a.backend_pid().await.unwrap()).await;
    let new = campaign_until_elected(&mut b, Duration::from_secs(5)).await;
    second.lead_polling(BOT, new.term);
    // The first replica still believes it leads: the fence in the statement refuses it.
    let late = first.begin_attempt(&one_part_reply(rows[1].id)).await;
    assert!(late.as_ref().is_err_and(|e| e.to_string().contains("no longer leads")), "{late:?}");
    assert_eq!(attempt_count(&first).await, 1, "nothing recorded, so nothing sent");
    // Refused by the fence, it knows now.
    assert_eq!(*first.leader_fence(), LeaderFence::Over { bot_id: BOT, term: old.term });
    // The same for a webhook delivery, as if it had not learned from the attempt.
    first.lead_polling(BOT, old.term);
    let late_delivery = [routed(4)];
    let refused = first.record_pushed_batch(&late_delivery, &[], &[], None).await;
    assert!(refused.is_err(), "Telegram is answered with an error, and retries elsewhere");
    assert_eq!(envelope_count(&first).await, 3);
    assert_eq!(*first.leader_fence(), LeaderFence::Over { bot_id: BOT, term: old.term });
    // Nor does it hand a queued envelope to a session of its own, nor one the new leader
    // handed to its session (a session opening here would count it delivered again).
    first.lead_polling(BOT, old.term);
    let worker = AgentName::parse("worker").unwrap();
    assert_eq!(first.claim_next_queued(&worker).await.unwrap(), None);
    let claimed = second.claim_next_queued(&worker).await.unwrap().expect("the leader claims");
    assert_eq!(claimed.update_id, Some(1), "the oldest queued, which the deposed replica left queued");
    assert!(first.take_pending_for_redelivery(&worker).await.unwrap().is_empty());
    // Knowing, it does not even ask.
    first.stop_leading_polling(BOT, old.term);
    assert_eq!(first.claim_next_queued(&worker).await.unwrap(), None);
    assert!(first.take_pending_for_redelivery(&worker).await.unwrap().is_empty());
    assert!(first.begin_attempt(&one_part_reply(rows[1].id)).await.is_err());
    assert!(first.record_pushed_batch(&late_delivery, &[], &[], None).await.is_err());
    second.record_pushed_batch(&late_delivery, &[], &[], None).await.unwrap();
    assert_eq!(envelope_count(&first).await, 4);

    second.begin_attempt(&one_part_reply(rows[1].id)).await.unwrap().unwrap();
    let again = second.take_pending_for_redelivery(&worker).await.unwrap();
    assert_eq!(again.iter().map(|envelope| envelope.update_id).collect::<Vec<_>>(), [Some(1)]);
    assert_eq!(again[0].deliveries, claimed.deliveries + 1, "counted again by the leader alone");
    let command_line = PgLedger::connect(&schema.url).await.unwrap();
    command_line.begin_attempt(&one_part_reply(rows[1].id)).await.unwrap().unwrap();
    assert_eq!(attempt_count(&first).await, 3);
    for ledger in [first, second, command_line] {
        ledger.close().await;
    }
    schema.drop().await;
}

/// An election waits for the fenced writes in flight: nothing of the old term commits
/// after the new one begins.
#[tokio::test]
async fn an_election_waits_for_the_fenced_writes_in_flight() {
    let schema = TestSchema::create().await;
    let ledger = PgLedger::connect(&schema.url).await.unwrap();
    let mut a = PollerCandidate::connect(&ledger, BOT, "a", lease(5000)).await.unwrap();
    let mut b = PollerCandidate::connect(&ledger, BOT, "b", lease(5000)).await.unwrap();
    let old = elected(&mut a).await;
    // A fenced write of the old leader, in flight: it passed its fence and has not committed.
    let mut in_flight = ledger.begin().await.unwrap();
    fence_intake(&mut in_flight, old.term, BOT, Some(7), &[]).await.unwrap();
    kill_session(a.backend_pid().await.unwrap()).await;
    let b_backend = b.backend_pid().await.unwrap();
    let election = tokio::spawn(async move { campaign_until_elected(&mut b, Duration::from_secs(5)).await });
    // The election is under way and waits on the row the write holds.
    let mut watcher = admin().await;
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let waiting: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock')",
        )
        .bind(b_backend)
        .fetch_one(&mut watcher)
        .await
        .unwrap();
        if waiting {
            break;
        }
        assert!(Instant::now() < deadline, "the election never waited for the write in flight");
        assert!(!election.is_finished(), "the election went past a fenced write in flight");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    in_flight.commit().await.unwrap();
    let new = election.await.unwrap();
    assert!(new.term > old.term);
    assert_eq!(
        ledger.next_offset(BOT).await.unwrap(),
        Some(7),
        "the write in flight committed under its term"
    );
    ledger.close().await;
    schema.drop().await;
}

/// A fenced write that reaches the lease row while an election holds it waits, then reads
/// the term the election committed: refused, with nothing of its batch written and its
/// offset not moved (the fence and the offset's move are one statement).
#[tokio::test]
async fn a_fenced_write_waiting_behind_an_election_is_refused() {
    let schema = TestSchema::create().await;
    let ledger = PgLedger::connect(&schema.url).await.unwrap();
    let mut a = PollerCandidate::connect(&ledger, BOT, "a", lease(5000)).await.unwrap();
    let term = elected(&mut a).await.term;
    ledger.commit_offset(term, BOT, 2).await.unwrap();
    // An election under way, as `leadership` makes one: the row locked, the term moved on.
    let mut election = PgConnection::connect(&schema.url).await.unwrap();
    let election_backend: i32 =
        sqlx::query_scalar("SELECT pg_backend_pid()").fetch_one(&mut election).await.unwrap();
    let mut electing = election.begin().await.unwrap();
    sqlx::query("SELECT term FROM poller_leases WHERE bot_id = $1 FOR UPDATE")
        .bind(BOT)
        .execute(&mut *electing)
        .await
        .unwrap();
    sqlx::query("UPDATE poller_leases SET term = term + 1 WHERE bot_id = $1")
        .bind(BOT)
        .execute(&mut *electing)
        .await
        .unwrap();
    let writer = ledger.clone();
    let write =
        tokio::spawn(async move { writer.record_updates(term, BOT, 9, &[routed(1), routed(2)]).await });
    let mut watcher = admin().await;
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let blocked: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE $1 = ANY (pg_blocking_pids(pid)))",
        )
        .bind(election_backend)
        .fetch_one(&mut watcher)
        .await
        .unwrap();
        if blocked {
            break;
        }
        assert!(Instant::now() < deadline, "the fenced write never waited for the election");
        assert!(!write.is_finished(), "the fenced write went past an election under way");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    electing.commit().await.unwrap();
    let refused = write.await.unwrap().unwrap_err();
    assert!(
        matches!(refused, FencedError::Deposed { current: CurrentTerm::Term(current), .. } if current > term),
        "{refused}"
    );
    assert_eq!(envelope_count(&ledger).await, 0, "nothing of the batch was written");
    assert_eq!(ledger.next_offset(BOT).await.unwrap(), Some(2), "the offset did not move");
    ledger.close().await;
    schema.drop().await;
}

/// The leader's renewal never waits for its own fenced writes: a batch stuck behind another
/// session's lock for the whole lock timeout must not hold the lease past its end (with
/// the fence `FOR SHARE`, this renewal waited, and the leader deposed itself).
#[tokio::test]
async fn a_renewal_does_not_wait_for_a_fenced_write_in_flight() {
    let schema = TestSchema::create().await;
    let ledger = PgLedger::connect(&schema.url).await.unwrap();
    let mut leader = PollerCandidate::connect(&ledger, BOT, "a", lease(3000)).await.unwrap();
    let tenure = elected(&mut leader).await;
    let mut in_flight = ledger.begin().await.unwrap();
    fence_intake(&mut in_flight, tenure.term, BOT, Some(3), &[]).await.unwrap();
    let renewal = tokio::time::timeout(Duration::from_secs(2), leader.renew_once(tenure.term)).await;
    assert_eq!(renewal, Ok(Renewal::Renewed), "renewed beside the fenced write");
    in_flight.commit().await.unwrap();
    assert_eq!(ledger.next_offset(BOT).await.unwrap(), Some(3));
    ledger.close().await;
    schema.drop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_recording_the_same_update_at_once_record_it_once() {
    let schema = TestSchema::create().await;
    let one = PgLedger::connect(&schema.url).await.unwrap();
    let two = PgLedger::connect(&schema.url).await.unwrap();
    let mut a = PollerCandidate::connect(&one, BOT, "a", lease(5000)).await.unwrap();
    let term = elected(&mut a).await.term;
    for update_id in 1..=20 {
        // Each replica made its own envelope (its own trace id) of the same update.
        let (first, second) = (vec![routed(update_id)], vec![routed(update_id)]);
        let (x, y) = tokio::join!(
            one.record_updates(term, BOT, update_id + 1, &first),
            two.record_updates(term, BOT, update_id + 1, &second)
        );
        let (x, y) = (x.unwrap(), y.unwrap());
        assert_eq!(u8::from(x[0]) + u8::from(y[0]), 1, "update {update_id}: exactly one replica stored it");
    }
    assert_eq!(envelope_count(&one).await, 20);
    let distinct: i64 = sqlx::query_scalar("SELECT count(DISTINCT update_id) FROM envelopes")
        .fetch_one(&one.pool)
        .await
        .unwrap();
    assert_eq!(distinct, 20);
    one.close().await;
    two.close().await;
    schema.drop().await;
}

/// Two replicas taking in webhook deliveries that each span the same conversations, in
/// opposite orders, at once. Each conversation is held for the batch's transaction (its task
/// decisions); held one by one in each batch's order, the two would wait for each other
/// crosswise, and PostgreSQL would end one with a deadlock error after a second. Both go
/// through, and each conversation has one task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_spanning_the_same_conversations_in_opposite_orders_both_go_through() {
    const CONVERSATIONS: i64 = 10;
    let schema = TestSchema::create().await;
    let one = PgLedger::connect(&schema.url).await.unwrap();
    let two = PgLedger::connect(&schema.url).await.unwrap();
    let in_chat = |update_id: i64, chat_id: i64| {
        let mut row = routed(update_id);
        row.envelope.channel.chat_id = chat_id;
        row
    };
    let mut update_id = 0;
    for round in 0..10 {
        let mut next = || {
            update_id += 1;
            update_id
        };
        let forward: Vec<_> = (0..CONVERSATIONS).map(|chat| in_chat(next(), 100 + chat)).collect();
        let backward: Vec<_> = (0..CONVERSATIONS).rev().map(|chat| in_chat(next(), 100 + chat)).collect();
        let (x, y) = tokio::join!(
            one.record_pushed_batch(&forward, &[], &[], None),
            two.record_pushed_batch(&backward, &[], &[], None)
        );
        x.unwrap_or_else(|e| panic!("round {round}: {e}"));
        y.unwrap_or_else(|e| panic!("round {round}: {e}"));
    }
    let tasks: Vec<(i64, i64)> =
        sqlx::query_as("SELECT chat_id, count(*) FROM tasks GROUP BY chat_id ORDER BY chat_id")
            .fetch_all(&one.pool)
            .await
            .unwrap();
    assert_eq!(tasks, (0..CONVERSATIONS).map(|chat| (100 + chat, 1)).collect::<Vec<_>>());
    one.close().await;
    two.close().await;
    schema.drop().await;
}

/// A polled batch holds its conversations in its fence's statement: it waits while another
/// transaction holds one of them (an agent's declaration, a delivery on another replica),
/// and goes on once that one ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_polled_batch_waits_for_a_conversation_held_elsewhere() {
    let schema = TestSchema::create().await;
    let ledger = PgLedger::connect(&schema.url).await.unwrap();
    let mut a = PollerCandidate::connect(&ledger, BOT, "a", lease(5000)).await.unwrap();
    let term = elected(&mut a).await.term;
    let first = routed(1);
    let conversation = (
        first.envelope.channel.chat_id,
        first.envelope.channel.thread_id.map(i64::from),
        "worker".to_owned(),
    );
    let mut holder = ledger.pool.begin().await.unwrap();
    tasks::hold_conversations(&mut holder, &[conversation]).await.unwrap();
    let batch = [first];
    let polled = ledger.record_updates(term, BOT, 2, &batch);
    tokio::pin!(polled);
    assert!(
        tokio::time::timeout(Duration::from_millis(300), &mut polled).await.is_err(),
        "the polled batch went on while its conversation was held elsewhere"
    );
    holder.commit().await.unwrap();
    assert_eq!(polled.await.unwrap(), [true]);
    ledger.close().await;
    schema.drop().await;
}

#[tokio::test]
async fn record_updates_stores_what_sqlite_intake_stores() {
    let schema = TestSchema::create().await;
    let ledger = PgLedger::connect(&schema.url).await.unwrap();
    let mut a = PollerCandidate::connect(&ledger, BOT, "a", lease(5000)).await.unwrap();
    let term = elected(&mut a).await.term;
    let batch = [routed(11), routed(12)];
    ledger.record_updates(term, BOT, 13, &batch).await.unwrap();
    let rows = sqlx::query("SELECT * FROM envelopes ORDER BY id").fetch_all(&ledger.pool).await.unwrap();
    assert_eq!(rows.len(), 2);
    for (row, routed) in rows.iter().zip(&batch) {
        let e = &routed.envelope;
        let get_i64 = |name: &str| row.try_get::<Option<i64>, _>(name).unwrap();
        let get_text = |name: &str| row.try_get::<Option<String>, _>(name).unwrap();
        assert_eq!(get_i64("update_id"), Some(e.update_id), "stored in arrival order");
        assert_eq!(get_text("trace_id").as_deref(), Some(e.trace_id.as_str()));
        assert_eq!(get_text("update_digest"), Some(routed.update_digest.clone()));
        assert_eq!(
            (get_i64("chat_id"), get_i64("thread_id"), get_i64("message_id")),
            (Some(42), Some(7), Some(e.update_id))
        );
        assert_eq!(get_text("chat_type").as_deref(), Some("supergroup"));
        assert_eq!(get_text("kind").as_deref(), Some("message"));
        assert_eq!(get_text("state").as_deref(), Some("queued"));
        assert_eq!(get_text("content"), Some(e.content()));
        assert_eq!(get_text("text"), e.text.clone());
        assert_eq!(get_text("attachments").as_deref(), Some("[]"));
        assert_eq!(
            (get_text("route").as_deref(), get_text("agent").as_deref()),
            (Some("ops"), Some("worker"))
        );
        assert_eq!(
            (get_text("sender_username").as_deref(), get_text("sender_name").as_deref()),
            (Some("ann"), Some("Ann"))
        );
        assert_eq!(get_i64("deliveries"), Some(0));
        assert!(
            get_text("task_id").is_some_and(|task| task.starts_with("task_")),
            "a message is work of a task"
        );
        let sent_at: DateTime<Utc> = row.try_get("sent_at").unwrap();
        assert_eq!(sent_at.timestamp(), e.sent_at.timestamp());
        assert_eq!(sent_at.timestamp_subsec_nanos(), 0, "Telegram's times are whole seconds");
        let received_at: DateTime<Utc> = row.try_get("received_at").unwrap();
        assert!((Utc::now() - received_at).num_seconds().abs() < 60, "received now, on the server's clock");
    }
    let task_of = |row: &sqlx::postgres::PgRow| row.try_get::<String, _>("task_id").unwrap();
    assert_eq!(task_of(&rows[0]), task_of(&rows[1]), "one conversation, one task");
    assert_eq!(ledger.next_offset(BOT).await.unwrap(), Some(13));
    ledger.close().await;
    schema.drop().await;
}

/// A claim while `other` holds rows with `hold` in a transaction it commits 300 ms later:
/// whether the claim was still waiting then, and the update id of what it claimed.
async fn claim_while_held(
    ledger: &PgLedger,
    agent: &AgentName,
    other: &mut PgConnection,
    hold: &str,
) -> (bool, Option<i64>) {
    sqlx::query("BEGIN").execute(&mut *other).await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(hold)).execute(&mut *other).await.unwrap();
    let claim = tokio::spawn({
        let (ledger, agent) = (ledger.clone(), agent.clone());
        async move { ledger.claim_next_queued(&agent).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let waited = !claim.is_finished();
    sqlx::query("COMMIT").execute(&mut *other).await.unwrap();
    let claimed = tokio::time::timeout(Duration::from_secs(10), claim).await.unwrap().unwrap().unwrap();
    (waited, claimed.and_then(|e| e.update_id))
}

/// A session claims its next envelope only when woken, so a claim that passes over a
/// queued envelope leaves it waiting until the next message rings: a held row must be
/// waited for, never skipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_claims_a_queued_envelope_that_another_transaction_holds() {
    let schema = TestSchema::create().await;
    let ledger = PgLedger::connect(&schema.url).await.unwrap();
    let mut a = PollerCandidate::connect(&ledger, BOT, "a", lease(5000)).await.unwrap();
    let term = elected(&mut a).await.term;
    let worker = AgentName::parse("worker").unwrap();
    let mut other = PgConnection::connect(&schema.url).await.unwrap();

    // Held KEY SHARE, as by a transaction inserting a row that refers to the envelope (its
    // foreign key check): claimed at once.
    ledger.record_updates(term, BOT, 2, &[routed(1)]).await.unwrap();
    sqlx::query("BEGIN").execute(&mut other).await.unwrap();
    sqlx::query("SELECT id FROM envelopes WHERE state = 'queued' FOR KEY SHARE")
        .execute(&mut other)
        .await
        .unwrap();
    let claimed = tokio::time::timeout(Duration::from_secs(10), ledger.claim_next_queued(&worker))
        .await
        .expect("a claim does not wait for a foreign key check")
        .unwrap();
    assert_eq!(
        claimed.and_then(|e| e.update_id),
        Some(1),
        "the envelope a foreign key check holds is claimed"
    );
    sqlx::query("COMMIT").execute(&mut other).await.unwrap();

    // Held by an update that leaves it queued: claimed once it is let go.
    ledger.record_updates(term, BOT, 3, &[routed(2)]).await.unwrap();
    let hold = "UPDATE envelopes SET deliveries = deliveries WHERE state = 'queued'";
    let (waited, claimed) = claim_while_held(&ledger, &worker, &mut other, hold).await;
    assert!(waited, "the claim waits for the transaction that holds the envelope");
    assert_eq!(claimed, Some(2), "claimed once the other transaction let it go");

    // Claimed meanwhile by the other transaction: the claim takes the next queued one.
    ledger.record_updates(term, BOT, 5, &[routed(3), routed(4)]).await.unwrap();
    let hold = "UPDATE envelopes SET state = 'pending' WHERE update_id = 3";
    let (_, claimed) = claim_while_held(&ledger, &worker, &mut other, hold).await;
    assert_eq!(claimed, Some(4), "the next queued envelope, not none");

    other.close().await.unwrap();
    ledger.close().await;
    schema.drop().await;
}

/// A pooled connection the server ended while it sat idle (a restart, `idle_session_timeout`,
/// a proxy) is pinged and replaced before it is handed out: the next statement succeeds.
#[tokio::test]
async fn a_pooled_connection_the_server_ended_while_it_was_idle_is_replaced_unseen() {
    let schema = TestSchema::create().await;
    let application = format!("idle_{}", schema.name);
    let ledger = PgLedger::connect(&format!("{}&application_name={application}", schema.url)).await.unwrap();
    sqlx::query("SELECT 1").execute(&ledger.pool).await.unwrap();
    tokio::time::sleep(PING_AFTER_IDLE + Duration::from_millis(500)).await;
    let ended: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity WHERE application_name = $1",
    )
    .bind(&application)
    .fetch_all(&mut admin().await)
    .await
    .unwrap();
    assert!(!ended.is_empty() && ended.iter().all(|&ended| ended), "the pool's connections ended: {ended:?}");
    let answer: i32 = sqlx::query_scalar("SELECT 1")
        .fetch_one(&ledger.pool)
        .await
        .expect("a connection the server ended is not handed out");
    assert_eq!(answer, 1);
    ledger.close().await;
    schema.drop().await;
}

#[tokio::test]
async fn a_replica_that_leads_no_term_records_no_polled_batch_and_a_deposed_one_stops() {
    let schema = TestSchema::create().await;
    let ledger = PgLedger::connect(&schema.url).await.unwrap();
    let refused = ledger.record_batch(BOT, 2, &[routed(1)]).await.unwrap_err();
    assert!(refused.to_string().contains("does not lead"), "{refused}");
    let mut a = PollerCandidate::connect(&ledger, BOT, "a", lease(500)).await.unwrap();
    let first = elected(&mut a).await.term;
    ledger.lead_polling(BOT, first);
    assert_eq!(ledger.record_batch(BOT, 2, &[routed(1)]).await.unwrap().len(), 1);
    // Another replica is elected: this one's next batch fails, and so does every one after.
    a.resign(first).await;
    let other = PgLedger::connect(&schema.url).await.unwrap();
    let mut b = PollerCandidate::connect(&other, BOT, "b", lease(500)).await.unwrap();
    let second = campaign_until_elected(&mut b, Duration::from_secs(10)).await.term;
    assert!(second > first);
    let deposed = ledger.record_batch(BOT, 3, &[routed(2)]).await.unwrap_err();
    assert!(deposed.to_string().contains("deposed"), "{deposed}");
    let after = ledger.record_batch(BOT, 3, &[routed(2)]).await.unwrap_err();
    assert!(after.to_string().contains("does not lead"), "{after}");
    assert_eq!(envelope_count(&ledger).await, 1, "nothing of the deposed batches was written");
    assert_eq!(ledger.next_offset(BOT).await.unwrap(), Some(2), "the offset did not move");
    other.close().await;
    ledger.close().await;
    schema.drop().await;
}

#[tokio::test]
async fn postgres_errors_map_to_what_callers_decide_on() {
    let schema = TestSchema::create().await;
    let ledger = PgLedger::connect(&schema.url).await.unwrap();
    // A CHECK: an envelope state the ledger does not know.
    let check = sqlx::query(
        "INSERT INTO envelopes (trace_id, kind, chat_id, chat_type, message_id, sender_name, content, sent_at, \
         received_at, state, state_changed_at) \
         VALUES ('env_x', 'message', 1, 'private', 1, 'Ann', 'x', now(), now(), 'lost', now())",
    )
    .execute(&ledger.pool)
    .await
    .unwrap_err();
    assert!(matches!(LedgerError::from(check), LedgerError::Constraint { .. }));
    // A foreign key: an event of no envelope.
    let foreign = sqlx::query(
        "INSERT INTO envelope_events (envelope_id, at, from_state, to_state, actor) VALUES (999, now(), 'a', 'b', 'c')",
    )
    .execute(&ledger.pool)
    .await
    .unwrap_err();
    assert!(matches!(LedgerError::from(foreign), LedgerError::Constraint { .. }));
    // A lock held past the wait allowed (lock_not_available) is Busy.
    let mut holder = PgConnection::connect(&schema.url).await.unwrap();
    let mut holding = holder.begin().await.unwrap();
    sqlx::query("LOCK TABLE poller_offsets IN ACCESS EXCLUSIVE MODE").execute(&mut *holding).await.unwrap();
    let mut waiting = ledger.pool.begin().await.unwrap();
    sqlx::query("SET LOCAL lock_timeout = '50ms'").execute(&mut *waiting).await.unwrap();
    let busy = sqlx::query("SELECT * FROM poller_offsets").execute(&mut *waiting).await.unwrap_err();
    assert!(matches!(LedgerError::from(busy), LedgerError::Busy { .. }));
    drop(waiting);
    holding.rollback().await.unwrap();
    ledger.close().await;
    schema.drop().await;
}

/// Figures, not a check: intake's fenced write against a raw batched insert of the same
/// rows on the same server, alternating; a batch of reactions and a batch of one message;
/// and the takeover time after a leader's session dies: `cargo test --lib ledger::postgres::tests::figures -- --ignored --nocapture`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement; run it by name"]
async fn figures() {
    let schema = TestSchema::create().await;
    let ledger = PgLedger::connect(&schema.url).await.unwrap();
    let mut a = PollerCandidate::connect(&ledger, BOT, "a", lease(3000)).await.unwrap();
    let term = elected(&mut a).await.term;
    // One conversation, as the figure; then a batch spread over 25 conversations,
    // as a burst to many chats is; then every message a conversation's first, as in a
    // backlog from many chats, where each message starts a task.
    // And a batch in 25 group topics where every message quotes the bot, as where the bot
    // sees only what answers it.
    ingest_figures(&ledger, term, "1 conversation", |_| {}).await;
    ingest_figures(&ledger, term, "25 conversations", |row| {
        row.envelope.channel.chat_id += row.envelope.update_id % 25
    })
    .await;
    ingest_figures(&ledger, term, "a new conversation a message", |row| {
        row.envelope.channel.chat_id += row.envelope.update_id;
    })
    .await;
    ingest_figures(&ledger, term, "25 conversations, each message quoting", |row| {
        row.envelope.channel.chat_id += row.envelope.update_id % 25;
        row.envelope.context.quoted = Some(crate::telegram::parts::Quoted {
            message_id: 7,
            text: Some("the bot's question".into()),
            sender_id: None,
        });
    })
    .await;
    reaction_figures(&ledger, term).await;
    one_message_figures(&ledger, term).await;

    let lease = lease(3000);
    let mut takeovers = Vec::new();
    let mut standby = PollerCandidate::connect(&ledger, BOT, "b", lease).await.unwrap();
    for _ in 0..10 {
        let leader = a.backend_pid().await.unwrap();
        // The standby waits for the lock, as `app::hold` has it, while the leader dies.
        let (_, killed_at) = tokio::join!(standby.wait_for_lock(lease.renewal_interval()), async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let killed_at = Instant::now();
            kill_session(leader).await;
            killed_at
        });
        elected(&mut standby).await;
        takeovers.push(killed_at.elapsed());
        std::mem::swap(&mut a, &mut standby);
        // The old leader's session is gone: its first try fails and opens a new one.
        assert!(standby.campaign_once().await.is_err());
    }
    takeovers.sort();
    eprintln!(
        "takeover after the leader's session died (lease {:?}, standby waiting for the lock {:?} at a time): p50 {:?}, max {:?}",
        lease.duration(),
        lease.renewal_interval(),
        takeovers[takeovers.len() / 2],
        takeovers[takeovers.len() - 1]
    );
    ledger.close().await;
    schema.drop().await;
}

/// Prints intake's fenced write against a raw batched insert of the same rows, alternating
/// batch by batch, each message in chat 42 and then changed by `shape` (`spread` says how).
async fn ingest_figures(ledger: &PgLedger, term: Term, spread: &str, shape: fn(&mut RoutedEnvelope)) {
    const BATCHES: i64 = 40;
    const BATCH: i64 = 100;
    // Rounds of BATCHES batches, each round from an empty table: 360 batches a side
    // counted, as the machine's two cores are shared and one round's figure swings by a
    // tenth.
    const ROUNDS: i64 = 10;
    let in_conversation = |update_id: i64| {
        let mut row = routed(update_id);
        shape(&mut row);
        row
    };
    let (mut fenced, mut raw) = (Vec::new(), Vec::new());
    let raw_task = crate::ids::TaskId::generate();
    for round in 0..ROUNDS {
        // The first round warms up and is not counted; then the tables are analyzed, as
        // autovacuum has them on a running server. Before any statistics, intake's check
        // whether a task is finished is planned as a bitmap scan of all the task's
        // envelopes, not a probe of one (docs/deploy-postgres.md gives both figures).
        if round == 1 {
            sqlx::query("ANALYZE").execute(&ledger.pool).await.unwrap();
            fenced.clear();
            raw.clear();
        }
        sqlx::query("TRUNCATE envelopes CASCADE").execute(&ledger.pool).await.unwrap();
        for batch in 0..BATCHES {
            let first = (round * BATCHES + batch) * BATCH;
            let rows: Vec<RoutedEnvelope> = (first..first + BATCH).map(in_conversation).collect();
            let started = Instant::now();
            ledger.record_updates(term, BOT, first + BATCH, &rows).await.unwrap();
            fenced.push(started.elapsed());
            // The same rows again, under other update ids, as one plain INSERT in a
            // transaction: no fence, no deduplication, no offset. The same columns as
            // intake's, each row under a task as intake stores a conversation's plain
            // messages, so both touch the same indexes (`envelopes_by_task` is partial on
            // a task).
            let again: Vec<RoutedEnvelope> =
                (first..first + BATCH).map(|id| in_conversation(id + 1_000_000_000)).collect();
            let tagged = vec![Some((raw_task.clone(), 1)); again.len()];
            let columns = intake::EnvelopeColumns::of(&again, &tagged, &vec![None; again.len()]);
            let started = Instant::now();
            let mut tx = ledger.pool.begin().await.unwrap();
            sqlx::query(
                "INSERT INTO envelopes (trace_id, update_id, update_digest, kind, chat_id, thread_id, chat_type, \
                 chat_title, message_id, sender_id, sender_username, sender_name, text, attachments, content, \
                 sent_at, received_at, route, agent, state, state_changed_at, note, raw_update, task_id, revision, \
                 meta, media_group_id) \
                 SELECT trace_id, update_id, update_digest, kind, chat_id, thread_id, chat_type, chat_title, \
                 message_id, sender_id, sender_username, sender_name, text, attachments, content, sent_at, now(), \
                 route, agent, state, now(), note, raw_update, task_id, revision, meta, media_group_id \
                 FROM UNNEST($1::text[], $2::bigint[], $3::text[], $4::text[], $5::bigint[], $6::bigint[], \
                 $7::text[], $8::text[], $9::bigint[], $10::bigint[], $11::text[], $12::text[], $13::text[], \
                 $14::text[], $15::text[], $16::timestamptz[], $17::text[], $18::text[], $19::text[], $20::text[], \
                 $21::text[], $22::text[], $23::bigint[], $24::text[], $25::text[]) \
                 AS batch (trace_id, update_id, update_digest, kind, chat_id, thread_id, chat_type, chat_title, \
                 message_id, sender_id, sender_username, sender_name, text, attachments, content, sent_at, route, \
                 agent, state, note, raw_update, task_id, revision, meta, media_group_id)",
            )
            .bind(columns.trace_id)
            .bind(columns.update_id)
            .bind(columns.update_digest)
            .bind(columns.kind)
            .bind(columns.chat_id)
            .bind(columns.thread_id)
            .bind(columns.chat_type)
            .bind(columns.chat_title)
            .bind(columns.message_id)
            .bind(columns.sender_id)
            .bind(columns.sender_username)
            .bind(columns.sender_name)
            .bind(columns.text)
            .bind(columns.attachments)
            .bind(columns.content)
            .bind(columns.sent_at)
            .bind(columns.route)
            .bind(columns.agent)
            .bind(columns.state)
            .bind(columns.note)
            .bind(columns.raw_update)
            .bind(columns.task_id)
            .bind(columns.revision)
            .bind(columns.meta)
            .bind(columns.media_group_id)
            .execute(&mut *tx)
            .await
            .unwrap();
            tx.commit().await.unwrap();
            raw.push(started.elapsed());
        }
    }
    // Each side's median batch: another process's burst on the shared cores lands on
    // one side's batch, and moves a sum by far more than a median.
    let median = |times: &mut Vec<Duration>| {
        times.sort();
        times[times.len() / 2]
    };
    let (fenced_batch, raw_batch) = (median(&mut fenced), median(&mut raw));
    let (fenced_rate, raw_rate) =
        (BATCH as f64 / fenced_batch.as_secs_f64(), BATCH as f64 / raw_batch.as_secs_f64());
    eprintln!(
        "ingest, batches of {BATCH}, {spread} (median batch): record_updates {fenced_rate:.0} envelopes/s ({fenced_batch:?}), \
         raw batched insert {raw_rate:.0}/s ({raw_batch:?}), ratio {:.2}",
        fenced_rate / raw_rate
    );
}

/// Prints what a polled batch of one message costs when it joins its conversation's task
/// and when it starts one (its conversation's first message): medians of 400 batches each,
/// alternating.
async fn one_message_figures(ledger: &PgLedger, term: Term) {
    const FIRST_UPDATE: i64 = 3_000_000_000;
    sqlx::query("TRUNCATE envelopes CASCADE").execute(&ledger.pool).await.unwrap();
    let (mut joining, mut starting) = (Vec::new(), Vec::new());
    for n in 0..800 {
        let update_id = FIRST_UPDATE + n;
        let mut row = routed(update_id);
        let starts = n % 2 == 1;
        if starts {
            row.envelope.channel.chat_id += update_id;
        }
        let started = Instant::now();
        ledger.record_updates(term, BOT, update_id + 1, &[row]).await.unwrap();
        if n >= 2 {
            if starts { &mut starting } else { &mut joining }.push(started.elapsed());
        }
    }
    let median = |times: &mut Vec<Duration>| {
        times.sort();
        times[times.len() / 2]
    };
    eprintln!(
        "a polled batch of one message (median): joining its conversation's task {:?}, starting one {:?}",
        median(&mut joining),
        median(&mut starting)
    );
}

/// Prints what a polled batch of 100 reactions costs, each on another of the bot's answers:
/// the median of 200 batches.
async fn reaction_figures(ledger: &PgLedger, term: Term) {
    use crate::ledger::conformance::fixtures::{one_part_reply, reaction_on};
    use crate::ledger::{AttemptOutcome, ListFilter};
    const BATCH: i64 = 100;
    const FIRST_UPDATE: i64 = 2_000_000_000;
    sqlx::query("TRUNCATE envelopes CASCADE").execute(&ledger.pool).await.unwrap();
    let answered: Vec<RoutedEnvelope> = (FIRST_UPDATE..FIRST_UPDATE + BATCH).map(routed).collect();
    ledger.record_updates(term, BOT, FIRST_UPDATE + BATCH, &answered).await.unwrap();
    let stored = ledger.list(&ListFilter { limit: BATCH as _, ..Default::default() }).await.unwrap();
    for (n, envelope) in stored.iter().enumerate() {
        let sent = ledger.begin_attempt(&one_part_reply(envelope.id)).await.unwrap().unwrap();
        let outcome = AttemptOutcome::Sent { message_id: 10_000 + n as i32 };
        ledger.finish_attempt(&sent, &outcome, "agent:orch").await.unwrap();
    }
    ledger.lead_polling(BOT, term);
    let mut times = Vec::new();
    for batch in 0..200 {
        let first = FIRST_UPDATE + BATCH * (batch + 1);
        let reactions: Vec<_> =
            (0..BATCH).map(|n| reaction_on(first + n, 10_000 + n as i32, &["👍"])).collect();
        let started = Instant::now();
        let recorded =
            ledger.record_batch_with_reactions(BOT, first + BATCH, &[], &reactions, &[], None).await.unwrap();
        times.push(started.elapsed());
        assert_eq!(recorded.reactions.len(), BATCH as usize, "each reaction is owed");
    }
    times.sort();
    eprintln!(
        "a polled batch of {BATCH} reactions on the bot's answers: median {:?}",
        times[times.len() / 2]
    );
}

#[tokio::test]
async fn the_ledger_never_prints_the_databases_password() {
    let options =
        PgConnectOptions::from_str("postgres://switchboard:s3cret-password@127.0.0.1:1/ledger").unwrap();
    let ledger = PgLedger {
        pool: PgPoolOptions::new().connect_lazy_with(options.clone()),
        options,
        writes: Default::default(),
        polling_terms: Default::default(),
        leading: Default::default(),
    };
    let printed = format!("{ledger:?}");
    assert!(printed.starts_with("PgLedger"), "{printed}");
    assert!(!printed.contains("s3cret"), "{printed}");
}

/// `switchboard ledger` of a newer release while a replica of an earlier one leads: it must
/// not migrate the ledger under that replica. Nobody leading, it migrates as a replica
/// would (here, the lease expired).
#[tokio::test]
async fn the_ledger_command_does_not_migrate_a_ledger_a_replica_leads_on() {
    let schema = TestSchema::create().await;
    let ledger = PgLedger::connect(&schema.url).await.unwrap();
    let latest = MIGRATOR.iter().map(|migration| migration.version).max().unwrap();
    // As an earlier release left it: without the latest migration's record.
    sqlx::query("DELETE FROM _sqlx_migrations WHERE version = $1")
        .bind(latest)
        .execute(&ledger.pool)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO poller_leases (bot_id, term, holder, holder_pid, elected_at, renewed_at, expires_at) \
         VALUES (1, 1, 'old', 0, now(), now(), now() + interval '1 minute')",
    )
    .execute(&ledger.pool)
    .await
    .unwrap();

    let Err(refused) = PgLedger::connect_existing(&schema.url).await else {
        panic!("migrated under a leader")
    };
    assert!(matches!(refused, PgOpenError::Behind { version, .. } if version == latest), "{refused:?}");
    let recorded: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM _sqlx_migrations WHERE version = $1)")
            .bind(latest)
            .fetch_one(&ledger.pool)
            .await
            .unwrap();
    assert!(!recorded, "nothing was migrated");

    sqlx::query("UPDATE poller_leases SET expires_at = now() - interval '1 second'")
        .execute(&ledger.pool)
        .await
        .unwrap();
    let lacking = ledger.migration_lacking_under_a_leader().await;
    assert!(matches!(lacking, Ok(None)), "nobody leads: the ledger command may migrate");
    ledger.close().await;
    schema.drop().await;
}
