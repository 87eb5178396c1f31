//! The outbound message surface (issue 22) end to end: fake Telegram → real daemon → real
//! `switchboard channel` driven by an MCP client → `reply` with a format, `react`,
//! `edit_message` → fake Telegram; and what the daemon does around a waiting message
//! (typing, the command menu).

mod support;

use serde_json::json;
use support::agents::*;
use switchboard::ledger::{AttemptMethod, AttemptState, EnvelopeState};

#[tokio::test]
async fn a_markdown_reply_arrives_as_telegram_html_and_the_receipt_names_its_message() {
    let OwnerWaiting { fake, daemon, orchestrator, trace } = owner_waiting("status?").await;

    let (is_error, text) = orchestrator
        .call_tool(
            "reply",
            json!({"trace_id": trace, "format": "markdown", "text": "**done**: `x < y` & [log](https://e.com/l)"}),
        )
        .await
        .unwrap();
    assert!(!is_error, "{text}");
    let sent = fake.wait_for_sent(1, WAIT).await;
    assert_eq!(sent[0].parse_mode.as_deref(), Some("HTML"));
    assert_eq!(sent[0].text, "<b>done</b>: <code>x &lt; y</code> &amp; <a href=\"https://e.com/l\">log</a>");
    assert!(text.contains(&sent[0].message_id.to_string()), "the receipt names the message: {text}");
    assert_eq!(state_of(&daemon, &trace).await, EnvelopeState::Acked);
}

#[tokio::test]
async fn html_telegram_cannot_parse_is_sent_once_more_as_plain_text() {
    let OwnerWaiting { fake, daemon, orchestrator, trace } = owner_waiting("status?").await;

    let (is_error, text) = orchestrator
        .call_tool(
            "reply",
            json!({"trace_id": trace, "format": "html", "text": "<b>bold</b> &amp; <blink>this</blink>"}),
        )
        .await
        .unwrap();
    assert!(!is_error, "{text}");
    let sent = fake.wait_for_sent(1, WAIT).await;
    assert_eq!(sent.len(), 1, "one message reached the chat");
    assert_eq!((sent[0].text.as_str(), sent[0].parse_mode.as_deref()), ("bold & this", None));
    let tries = fake.requests_for("sendMessage");
    assert_eq!(tries.len(), 2, "the HTML once, the plain text once: {tries:?}");
    assert_eq!(tries[0]["parse_mode"], "HTML");
    let attempts = attempts_of(&daemon, &trace).await;
    let outcomes: Vec<_> = attempts.iter().map(|a| (a.chunk_index, a.outcome)).collect();
    assert_eq!(outcomes, [(0, AttemptState::NotSent), (0, AttemptState::Sent)]);
    assert!(attempts.iter().all(|a| a.method == AttemptMethod::SendMessage));
    assert_eq!(state_of(&daemon, &trace).await, EnvelopeState::Acked);
}

#[tokio::test]
async fn an_unknown_format_is_refused_and_nothing_is_sent() {
    let OwnerWaiting { fake, daemon, orchestrator, trace } = owner_waiting("status?").await;

    let (is_error, text) = orchestrator
        .call_tool("reply", json!({"trace_id": trace, "format": "MarkdownV2", "text": "*hi*"}))
        .await
        .unwrap();
    assert!(is_error && text.contains("MarkdownV2"), "{text}");
    assert!(fake.requests_for("sendMessage").is_empty());
    assert_eq!(state_of(&daemon, &trace).await, EnvelopeState::Pending);
}
