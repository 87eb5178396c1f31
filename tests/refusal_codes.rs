//! Every refusal the model reads starts with its code (issue 25, item 1): the resolver's
//! (DESIGN.md §3), the delegation guard's (§9) and admission's (§11), each provoked end to
//! end through the real `switchboard channel` plugin and read as the model reads it.

mod support;

use serde_json::{Value, json};
use support::agents::*;
use support::daemon::*;
use support::mcp::ChannelClient;
use switchboard::fake_bot_api::{ChatSpec, FakeTelegram, Fault};
use switchboard::ledger::EnvelopeState;

/// Calls a tool that must be refused with `code`, and returns the text the model read.
async fn refused(client: &ChannelClient, tool: &str, arguments: Value, code: &str) -> String {
    let (is_error, text) = client.call_tool(tool, arguments.clone()).await.unwrap();
    assert!(is_error, "{tool} {arguments} was not refused: {text}");
    assert!(
        text.starts_with(&format!("{code}: ")),
        "{tool} {arguments}: expected the code {code} first: {text}"
    );
    text
}

async fn accepted(client: &ChannelClient, tool: &str, arguments: Value) -> String {
    let (is_error, text) = client.call_tool(tool, arguments.clone()).await.unwrap();
    assert!(!is_error, "{tool} {arguments}: {text}");
    text
}

/// §3: the resolver's refusals, and the refusals of what a reply may do next.
#[tokio::test]
async fn the_resolvers_refusals_start_with_their_codes() {
    let OwnerWaiting { fake, daemon, orchestrator, trace } = owner_waiting("first question").await;

    refused(&orchestrator, "reply", json!({"text": "hi", "trace_id": "env_zzzzzzzzzz"}), "unknown_trace_id")
        .await;

    fake.push_text(ChatSpec::forum(FORUM_CHAT, "Forum"), owner(), "second question");
    let second = trace_id(&nth(&orchestrator, 2).await);
    let text = refused(&orchestrator, "reply", json!({"text": "which one?"}), "ambiguous").await;
    assert!(text.contains(&trace) && text.contains(&second), "the candidates are listed: {text}");

    accepted(&orchestrator, "reply", json!({"text": "first answer", "trace_id": trace})).await;
    accepted(&orchestrator, "reply", json!({"text": "second answer", "trace_id": second})).await;
    refused(&orchestrator, "reply", json!({"text": "anyone?"}), "nothing_pending").await;
    refused(&orchestrator, "reply", json!({"text": "more", "trace_id": trace}), "already_answered").await;
    refused(
        &orchestrator,
        "reply",
        json!({"text": "more", "trace_id": trace, "again": "yes"}),
        "bad_request",
    )
    .await;
    assert_eq!(posted(&fake, 2).await, ["first answer", "second answer"]);

    // A send Telegram posts but answers with a 500: unknown, then not answerable.
    fake.push_text(ChatSpec::private(OWNER_CHAT), owner(), "third question");
    let third = trace_id(&nth(&orchestrator, 3).await);
    fake.fail_send_message(Fault::RecordThenServerError);
    refused(&orchestrator, "reply", json!({"text": "third answer", "trace_id": third}), "unresolved").await;
    assert_eq!(state_of(&daemon, &third).await, EnvelopeState::Unresolved);
    let text =
        refused(&orchestrator, "reply", json!({"text": "third again", "trace_id": third}), "not_answerable")
            .await;
    assert!(text.contains("reconcile"), "{text}");
    assert_eq!(fake.sent_messages().len(), 3, "nothing refused was sent");
}

/// §9: the guard's refusals and those made before it, `depth_limit` among them.
#[tokio::test]
async fn the_delegation_refusals_start_with_their_codes() {
    let fake = FakeTelegram::start().await;
    let env = [("SWITCHBOARD__HANDOFFS__MAX_DEPTH", "1")];
    let daemon = TestDaemon::start_with_env(&fake.api_url(), "", &default_routes(), &env);
    let orchestrator = session(&daemon, "orchestrator").await;
    let worker = session(&daemon, "worker").await;
    fake.push_text(ChatSpec::private(OWNER_CHAT), owner(), "Is staging healthy?");
    let question = trace_id(&nth(&orchestrator, 1).await);

    refused(&orchestrator, "send_to_agent", json!({"agent": "Orchestrator", "text": "me"}), "self_handoff")
        .await;
    let text =
        refused(&orchestrator, "send_to_agent", json!({"agent": "ghost", "text": "boo"}), "unknown_agent")
            .await;
    assert!(text.contains("orchestrator, worker"), "the agents are listed: {text}");

    accepted(&orchestrator, "send_to_agent", json!({"agent": "worker", "text": "check staging"})).await;
    let handoff = nth(&worker, 1).await;
    let handoff_id = meta(&handoff, "handoff_id").to_owned();
    let text = refused(
        &orchestrator,
        "call_agent",
        json!({"agent": "worker", "text": "check prod too", "timeout_secs": 1}),
        "already_delegated",
    )
    .await;
    assert!(text.contains(&handoff_id) && text.contains("check staging"), "{text}");

    fake.push_text(ChatSpec::private(OWNER_CHAT), owner(), "And production?");
    let next_turn = trace_id(&nth(&orchestrator, 2).await);
    let text = refused(
        &orchestrator,
        "send_to_agent",
        json!({"agent": "worker", "text": "check prod", "trace_id": next_turn}),
        "already_running",
    )
    .await;
    assert!(text.contains(&handoff_id), "{text}");

    // The worker, acting for the handoff (depth 1), may not hand work on (depth 2 > 1).
    let text = refused(
        &worker,
        "send_to_agent",
        json!({"agent": "orchestrator", "text": "you do it", "trace_id": trace_id(&handoff)}),
        "depth_limit",
    )
    .await;
    assert!(text.contains("handoffs.max_depth (1)"), "{text}");

    let (ok, out, err) = daemon.ledger_cli(&["handoffs"]);
    assert!(ok && out.matches("hof_").count() == 1, "only the first handoff is recorded: {out}{err}");
    assert_ne!(question, next_turn);
}

/// §11: admission's refusals, and `revise_task`'s.
#[tokio::test]
async fn the_task_refusals_start_with_their_codes() {
    let OwnerWaiting { fake, daemon: _daemon, orchestrator, trace } = owner_waiting("Plan the offsite").await;
    let first = nth(&orchestrator, 1).await;
    let message_id: i32 = meta(&first, "message_id").parse().unwrap();
    let owner_chat = ChatSpec::private(OWNER_CHAT);

    fake.push_edited_text(&owner_chat, owner(), message_id, "Plan the offsite for May");
    let revision = trace_id(&nth(&orchestrator, 2).await);
    let text =
        refused(&orchestrator, "reply", json!({"text": "Planned", "trace_id": trace}), "superseded").await;
    assert!(text.contains(&revision), "names the envelope to act on: {text}");

    fake.push_text(&owner_chat, owner(), "/pause");
    assert_eq!(meta(&nth(&orchestrator, 3).await, "kind"), "pause");
    refused(&orchestrator, "reply", json!({"text": "Planned for May", "trace_id": revision}), "paused").await;

    fake.push_text(&owner_chat, owner(), "/cancel");
    let cancel = trace_id(&nth(&orchestrator, 4).await);
    refused(&orchestrator, "reply", json!({"text": "Stopping", "trace_id": cancel}), "cancelled").await;
    refused(&orchestrator, "revise_task", json!({"trace_id": trace, "kind": "correction"}), "no_revision")
        .await;
    assert!(
        fake.sent_messages().iter().all(|m| m.text.contains("task_")),
        "only the switchboard's acknowledgements were posted: {:?}",
        fake.sent_messages()
    );
}

/// The arguments the plugin refuses itself, before it asks the daemon, read as the daemon's
/// refusals do: `bad_request` first. Nothing reaches Telegram.
#[tokio::test]
async fn the_plugins_own_refusals_start_with_bad_request() {
    let OwnerWaiting { fake, daemon: _daemon, orchestrator, trace } =
        owner_waiting("check my arguments").await;
    let cases = [
        ("reply", json!({"text": "  "})),
        ("reply", json!({"text": "hi", "trace_id": "nope"})),
        ("reply", json!({"text": "hi", "trace_id": " "})),
        ("reply", json!({"text": "hi", "trace_id": trace, "format": "rtf"})),
        ("reply", json!({"text": "hi", "trace_id": trace, "files": ["relative/path.pdf"]})),
        ("react", json!({"trace_id": trace, "emoji": "🦖"})),
        ("react", json!({"trace_id": "nope", "emoji": "👍"})),
        ("edit_message", json!({"trace_id": trace, "message_id": 1, "text": " "})),
        ("edit_message", json!({"trace_id": trace, "message_id": 1, "text": "x", "format": "rtf"})),
        ("ack", json!({"trace_id": "nope"})),
        ("download_attachment", json!({"trace_id": "nope"})),
        ("send_to_agent", json!({"agent": "worker", "text": "go", "trace_id": "nope"})),
        ("call_agent", json!({"agent": "worker", "text": "go", "timeout_secs": 0})),
    ];
    for (tool, arguments) in cases {
        refused(&orchestrator, tool, arguments, "bad_request").await;
    }
    assert!(fake.sent_messages().is_empty(), "nothing was sent");
}
