//! The usual cast of the end-to-end tests: the owner, agent sessions driven by a real MCP
//! client, and the opening in which one message waits for the orchestrator's answer.

#![allow(dead_code)]

use std::time::Duration;

use switchboard::agents::api::client::{DaemonClient, SessionStream};
use switchboard::agents::api::wire::{DeliveredEnvelope, SessionEvent};
use switchboard::ids::{AgentName, Secret, TraceId};
use switchboard::ledger::{EnvelopeState, StoredAttempt};

use super::daemon::{ORCHESTRATOR_SECRET, OWNER_CHAT, OWNER_ID, TestDaemon, WORKER_SECRET, default_routes};
use super::mcp::{ChannelClient, ChannelClientBuilder, ChannelNotification};
use switchboard::fake_bot_api::{ChatSpec, FakeTelegram, UserSpec};

pub const WAIT: Duration = Duration::from_secs(20);

pub fn owner() -> UserSpec {
    UserSpec::new(OWNER_ID, "Olga").with_username("olga")
}

fn secret_of(agent: &str) -> (&'static str, &'static str) {
    if agent == "worker" {
        ("SB_TEST_WORKER_SECRET", WORKER_SECRET)
    } else {
        ("SB_TEST_ORCHESTRATOR_SECRET", ORCHESTRATOR_SECRET)
    }
}

/// A `switchboard channel` plugin for `agent`, driven by a real MCP client, once the daemon
/// has accepted its session. The plugin answers MCP before its session is connected, so a
/// test that relies on the daemon knowing the agent is there (a handoff delivered, not
/// queued; a first session that a second one must find in place) waits for it.
pub async fn session(daemon: &TestDaemon, agent: &str) -> ChannelClient {
    let (var, secret) = secret_of(agent);
    let (address_var, address) = daemon.address_env();
    ChannelClient::start_connected(
        daemon.config_path(),
        agent,
        &[(var, secret), (address_var, &address)],
        WAIT,
    )
    .await
    .expect("the channel plugin starts and its session connects")
}

/// A `switchboard channel` plugin for `agent` that may never connect: a second session the
/// daemon refuses.
pub async fn plugin(daemon: &TestDaemon, agent: &str) -> ChannelClient {
    let (var, secret) = secret_of(agent);
    let (address_var, address) = daemon.address_env();
    ChannelClient::start(daemon.config_path(), agent, &[(var, secret), (address_var, &address)])
        .await
        .expect("channel plugin starts")
}

/// A `switchboard channel` plugin for `agent`, to be started as the test configures it.
pub fn plugin_builder(daemon: &TestDaemon, agent: &str) -> ChannelClientBuilder {
    let (var, secret) = secret_of(agent);
    let (address_var, address) = daemon.address_env();
    ChannelClient::builder(daemon.config_path(), agent).env(var, secret).env(address_var, address)
}

/// A raw local API client for `agent`, for what an MCP client cannot show (request ids,
/// envelopes handed over but not yet shown).
pub fn api_client(daemon: &TestDaemon, agent: &str) -> DaemonClient {
    let (_, secret) = secret_of(agent);
    DaemonClient::new(daemon.api_addr(), AgentName::parse(agent).unwrap(), Secret::new(secret.into()))
        .unwrap()
}

/// The next envelope on a raw session stream (heartbeats skipped).
pub async fn next_envelope(stream: &mut SessionStream) -> DeliveredEnvelope {
    loop {
        match tokio::time::timeout(WAIT, stream.next_event()).await.expect("an envelope in time").unwrap() {
            Some(SessionEvent::Envelope(envelope)) => return envelope,
            Some(_) => {}
            None => panic!("the session stream ended"),
        }
    }
}

pub async fn state_of(daemon: &TestDaemon, trace_id: &str) -> EnvelopeState {
    let ledger = daemon.ledger().await;
    let state =
        ledger.find(&TraceId::parse(trace_id).unwrap()).await.unwrap().expect("envelope exists").state;
    ledger.close().await;
    state
}

pub async fn attempts_of(daemon: &TestDaemon, trace_id: &str) -> Vec<StoredAttempt> {
    let ledger = daemon.ledger().await;
    let envelope = ledger.find(&TraceId::parse(trace_id).unwrap()).await.unwrap().expect("envelope exists");
    let attempts = ledger.attempts_for(envelope.id).await.unwrap();
    ledger.close().await;
    attempts
}

/// The `n`th notification of a client (1-based), once it arrived.
pub async fn nth(client: &ChannelClient, n: usize) -> ChannelNotification {
    client.wait_for_notifications(n, WAIT).await.unwrap().swap_remove(n - 1)
}

/// A meta key the notification must have.
pub fn meta<'a>(notification: &'a ChannelNotification, key: &str) -> &'a str {
    notification.meta_str(key).unwrap_or_else(|| panic!("meta.{key} missing: {:?}", notification.meta))
}

/// The texts of the first `n` messages the bot posted, once they are there.
pub async fn posted(fake: &FakeTelegram, n: usize) -> Vec<String> {
    fake.wait_for_sent(n, WAIT).await.into_iter().map(|m| m.text).collect()
}

pub fn trace_id(notification: &ChannelNotification) -> String {
    notification.meta_str("trace_id").expect("meta.trace_id").to_owned()
}

/// The usual opening: a daemon, the orchestrator's session, and one message from the
/// owner's DM delivered to it and waiting for an answer.
pub struct OwnerWaiting {
    pub fake: FakeTelegram,
    pub daemon: TestDaemon,
    pub orchestrator: ChannelClient,
    pub trace: String,
}

pub async fn owner_waiting(text: &str) -> OwnerWaiting {
    let fake = FakeTelegram::start().await;
    let daemon = TestDaemon::start(&fake.api_url(), "", &default_routes());
    let orchestrator = session(&daemon, "orchestrator").await;
    fake.push_text(ChatSpec::private(OWNER_CHAT), owner(), text);
    let delivered = orchestrator.wait_for_notifications(1, WAIT).await.unwrap();
    assert_eq!(delivered[0].content, text);
    let trace = trace_id(&delivered[0]);
    OwnerWaiting { fake, daemon, orchestrator, trace }
}

/// [`owner_waiting`] through the raw local API client, for what an MCP client cannot show
/// (request ids, envelopes handed over but not yet shown): the stream keeps the session
/// open.
pub struct RawOwnerWaiting {
    pub fake: FakeTelegram,
    pub daemon: TestDaemon,
    pub client: DaemonClient,
    pub stream: SessionStream,
    pub envelope: DeliveredEnvelope,
}

pub async fn raw_owner_waiting(text: &str) -> RawOwnerWaiting {
    let fake = FakeTelegram::start().await;
    let daemon = TestDaemon::start(&fake.api_url(), "", &default_routes());
    let client = api_client(&daemon, "orchestrator");
    let mut stream = client.open_session().await.unwrap();
    fake.push_text(ChatSpec::private(OWNER_CHAT), owner(), text);
    let envelope = next_envelope(&mut stream).await;
    RawOwnerWaiting { fake, daemon, client, stream, envelope }
}
