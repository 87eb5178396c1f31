//! Who gets an agent's session when a connection dies: the plugin process that held it.
//! A stream that died unnoticed (a laptop that slept, a NAT that forgot the connection) is
//! replaced by the same plugin's next one, and another plugin (a second window in the same
//! project) waits while the one that held the agent reconnects.

mod support;

use serde_json::json;
use support::agents::{WAIT, owner, plugin, plugin_builder, trace_id};
use support::daemon::{OWNER_CHAT, TestDaemon, default_routes};
use support::mcp::ChannelClient;
use support::proxy::CuttableProxy;
use switchboard::fake_bot_api::{ChatSpec, FakeTelegram};

/// A heartbeat a second apart: a plugin gives up on a silent stream after three.
const SHORT_HEARTBEAT: (&str, &str) = ("SWITCHBOARD__API__SESSION_HEARTBEAT_SECS", "1");

/// The orchestrator's plugin, reaching the daemon through `proxy`, once connected.
async fn behind(proxy: &CuttableProxy, daemon: &TestDaemon) -> ChannelClient {
    let (address_var, _) = daemon.address_env();
    let plugin = plugin_builder(daemon, "orchestrator")
        .env(address_var, proxy.addr.to_string())
        .start()
        .await
        .unwrap();
    plugin.wait_for_stderr("channel::forwarder: connected to the switchboard daemon", WAIT).await.unwrap();
    plugin
}

fn connected(plugin: &ChannelClient) -> bool {
    plugin.stderr().contains("channel::forwarder: connected to the switchboard daemon")
}

/// The plugin's stream goes silent without closing; the daemon still holds its session
/// (its heartbeats go into the socket). The plugin gives up on it and opens another, which
/// replaces the silent one: tool calls work, and a message that came meanwhile reaches the
/// agent once. Before, the newcomer was refused as a second session until TCP gave up on
/// the dead connection, about 15 minutes later.
#[tokio::test]
async fn a_plugin_whose_stream_went_silent_takes_its_session_back() {
    let fake = FakeTelegram::start().await;
    let daemon = TestDaemon::start_with_env(&fake.api_url(), "", &default_routes(), &[SHORT_HEARTBEAT]);
    let proxy = CuttableProxy::to(daemon.api_addr()).await;
    let orchestrator = behind(&proxy, &daemon).await;

    proxy.stall();
    fake.push_text(ChatSpec::private(OWNER_CHAT), owner(), "sent while the stream was silent");
    orchestrator.wait_for_stderr("connected to the switchboard daemon again", WAIT).await.unwrap();

    let pushed = orchestrator.wait_for_notifications(1, WAIT).await.unwrap();
    assert_eq!(pushed[0].content, "sent while the stream was silent");
    let trace = trace_id(&pushed[0]);
    let (is_error, text) = orchestrator.call_tool("pending", json!({})).await.unwrap();
    assert!(!is_error && text.contains(&trace), "the new session answers tool calls: {text}");
    let (is_error, text) =
        orchestrator.call_tool("reply", json!({"text": "got it", "trace_id": trace})).await.unwrap();
    assert!(!is_error, "{text}");
    fake.wait_for_sent(1, WAIT).await;
    let copies = orchestrator.notifications().iter().filter(|n| trace_id(n) == trace).count();
    assert_eq!(copies, 1, "the message reached the agent once");
}

/// A second plugin is refused while the first is connected, and still while the first
/// reconnects after its stream broke: the first gets the agent back. Only once the first
/// has stayed away past the grace does the second get it. Before, whichever asked first
/// after the break took the agent and its pending messages.
#[tokio::test]
async fn another_plugin_waits_while_the_one_that_held_the_agent_reconnects() {
    let fake = FakeTelegram::start().await;
    let daemon = TestDaemon::start(&fake.api_url(), "", &default_routes());
    let proxy = CuttableProxy::to(daemon.api_addr()).await;
    let first = behind(&proxy, &daemon).await;
    let second = plugin(&daemon, "orchestrator").await;
    second.wait_for_stderr("already connected", WAIT).await.unwrap();

    // The first's connection breaks, and it cannot reconnect yet; the second asks first.
    proxy.refuse();
    proxy.cut();
    daemon.wait_for_log("agent session disconnected", WAIT).await;
    second.wait_for_stderr("reserved for the session connected before", WAIT).await.unwrap();
    assert!(!connected(&second), "{}", second.stderr());

    the_first_gets_its_agent_back(&proxy, &fake, &first, &second).await;

    // The first goes away for good: after the grace, the second gets the agent.
    proxy.refuse();
    proxy.cut();
    second.wait_for_stderr("channel::forwarder: connected to the switchboard daemon", WAIT).await.unwrap();
    let again = second.wait_for_notifications(1, WAIT).await.unwrap();
    assert_eq!(again[0].content, "for the first", "what waited is the second's now");
}

/// A plugin that leaves (its agent session ended) frees the agent at once: the next
/// window connects without waiting out the grace kept for a broken stream, also after the
/// daemon restarted.
#[tokio::test]
async fn a_plugin_that_leaves_frees_the_agent_at_once() {
    let fake = FakeTelegram::start().await;
    let mut daemon = TestDaemon::start(&fake.api_url(), "", &default_routes());
    let first = support::agents::session(&daemon, "orchestrator").await;
    assert!(first.close().await.unwrap().success());
    let second = connects_at_once(&daemon).await;
    assert!(second.close().await.unwrap().success());
    daemon.stop();
    daemon.restart();
    connects_at_once(&daemon).await;
}

/// Claude Code ends its MCP server with SIGTERM, right after closing its stdin: the plugin
/// tells the daemon it leaves, so the next session (a restarted Claude Code) connects at
/// once. Before, SIGTERM ended the plugin before it said so, and the real Claude Code's next
/// session waited out the grace kept for a plugin that was gone.
#[tokio::test]
async fn a_plugin_ended_by_sigterm_frees_the_agent_at_once() {
    let fake = FakeTelegram::start().await;
    let daemon = TestDaemon::start(&fake.api_url(), "", &default_routes());
    let first = support::agents::session(&daemon, "orchestrator").await;
    let status = first.terminate().await.unwrap();
    assert!(status.success(), "SIGTERM is a leave, not a crash: {status:?}");
    connects_at_once(&daemon).await;
}

/// A new plugin for the orchestrator, which must connect without waiting out a grace.
async fn connects_at_once(daemon: &TestDaemon) -> ChannelClient {
    let started = std::time::Instant::now();
    let next = support::agents::session(daemon, "orchestrator").await;
    let waited = started.elapsed();
    assert!(
        waited < std::time::Duration::from_secs(5),
        "connected without waiting for the grace: {waited:?}"
    );
    next
}

/// After a daemon restart, the agent waits a moment for the plugin that held it before: a
/// second plugin that asks first is refused, and the first gets its agent back. Before,
/// whichever reconnected first after the restart took the agent.
#[tokio::test]
async fn after_a_restart_the_agent_waits_for_the_plugin_that_held_it() {
    let fake = FakeTelegram::start().await;
    let mut daemon = TestDaemon::start(&fake.api_url(), "", &default_routes());
    let proxy = CuttableProxy::to(daemon.api_addr()).await;
    let first = behind(&proxy, &daemon).await;
    let second = plugin(&daemon, "orchestrator").await;
    second.wait_for_stderr("already connected", WAIT).await.unwrap();

    // The first cannot reconnect yet; the second asks the restarted daemon first.
    proxy.refuse();
    daemon.kill9();
    daemon.restart();
    second.wait_for_stderr("reserved for the session connected before", WAIT).await.unwrap();
    assert!(!connected(&second), "{}", second.stderr());

    the_first_gets_its_agent_back(&proxy, &fake, &first, &second).await;
}

/// The first plugin, let through again, gets the agent back (a tool call has it reconnect
/// at once): a message reaches it, and the second is still not connected.
async fn the_first_gets_its_agent_back(
    proxy: &CuttableProxy,
    fake: &FakeTelegram,
    first: &ChannelClient,
    second: &ChannelClient,
) {
    proxy.admit();
    let (is_error, text) = first.call_tool("pending", json!({})).await.unwrap();
    assert!(!is_error, "the first plugin has its session back: {text}");
    fake.push_text(ChatSpec::private(OWNER_CHAT), owner(), "for the first");
    assert_eq!(first.wait_for_notifications(1, WAIT).await.unwrap()[0].content, "for the first");
    assert!(!connected(second), "{}", second.stderr());
}
