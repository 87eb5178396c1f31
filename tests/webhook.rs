//! Webhook intake (`telegram.webhook`): the real daemon tells the fake Bot API where its
//! webhook is, and the fake delivers updates to it as Telegram does (one POST per update,
//! the secret in a header, again until it gets a 2xx). Messages reach agent sessions and
//! replies go out; nobody polls; a request without the secret stores nothing; an update
//! delivered again, an answer lost before a `kill -9` and a busy ledger all end with the
//! update stored once.

mod support;

use std::time::Duration;

use serde_json::json;
use support::agents::{WAIT, owner, session};
use support::daemon::*;
use switchboard::fake_bot_api::{ChatSpec, Delivery, FakeTelegram, Fault, TEST_TOKEN};

const PUBLIC_URL: &str = "https://bot.example.test/telegram/hook";
const WEBHOOK_SECRET: &str = "webhook-secret_0123456789";
const SECRET_ENV: &str = "SB_TEST_WEBHOOK_SECRET";

fn webhook_config() -> String {
    format!(
        r#"webhook = {{ public_url = "{PUBLIC_URL}", listen = "127.0.0.1:0", secret_env = "{SECRET_ENV}" }}"#
    )
}

/// A daemon in webhook mode, once the fake knows its webhook and routes it to the daemon.
async fn webhook_daemon(fake: &FakeTelegram) -> TestDaemon {
    let daemon = TestDaemon::start_with_env(
        &fake.api_url(),
        &webhook_config(),
        &default_routes(),
        &[(SECRET_ENV, WEBHOOK_SECRET)],
    );
    fake.wait_for_webhook(WAIT).await;
    fake.route_webhook_to(daemon.webhook_addr());
    daemon
}

/// How many envelopes the ledger holds for `update_id`.
async fn stored(daemon: &TestDaemon, update_id: i64) -> usize {
    daemon.envelopes().await.iter().filter(|e| e.update_id == Some(update_id)).count()
}

/// A POST to the daemon's webhook as someone other than Telegram might make it.
async fn post_update(daemon: &TestDaemon, secret: Option<&str>, body: &str) -> u16 {
    let client = reqwest::Client::builder().no_proxy().timeout(WAIT).build().unwrap();
    let mut request = client
        .post(format!("http://{}/telegram/hook", daemon.webhook_addr()))
        .header("content-type", "application/json")
        .body(body.to_owned());
    if let Some(secret) = secret {
        request = request.header("X-Telegram-Bot-Api-Secret-Token", secret);
    }
    request.send().await.expect("the webhook answers").status().as_u16()
}

#[tokio::test]
async fn a_message_through_the_webhook_reaches_the_agent_and_its_reply_goes_out() {
    let fake = FakeTelegram::start().await;
    let daemon = webhook_daemon(&fake).await;
    let webhook = fake.webhook().expect("set at start-up");
    assert_eq!(webhook.url, PUBLIC_URL);
    assert_eq!(webhook.secret_token.as_deref(), Some(WEBHOOK_SECRET));
    let asked = fake.requests_for("setWebhook");
    assert_eq!(asked[0]["drop_pending_updates"], json!(false), "{asked:?}");
    assert!(
        asked[0]["allowed_updates"]
            .as_array()
            .is_some_and(|kinds| kinds.contains(&json!("message_reaction"))),
        "the kinds the poller asks for: {asked:?}"
    );

    let orchestrator = session(&daemon, "orchestrator").await;
    let dm = ChatSpec::private(OWNER_CHAT);
    let update_id = fake.push_text(&dm, owner(), "hello through the webhook");
    let delivered = orchestrator.wait_for_notifications(1, WAIT).await.unwrap();
    assert_eq!(delivered[0].content, "hello through the webhook");
    fake.wait_until_delivered(update_id, 1, WAIT).await;
    assert_eq!(fake.deliveries_of(update_id), [Delivery::Answered(200)]);

    let (is_error, text) = orchestrator.call_tool("reply", json!({"text": "hello back"})).await.unwrap();
    assert!(!is_error, "{text}");
    let sent = fake.wait_for_sent(1, WAIT).await;
    assert_eq!((sent[0].chat_id, sent[0].text.as_str()), (OWNER_CHAT, "hello back"));

    let (status, readiness) = readiness(&daemon).await;
    assert_eq!(status, 200, "{readiness}");
    assert_eq!(readiness["intake"], "webhook");
    // A poller starts with the daemon and asks at once; by the time a message went in and
    // its answer out, it would have.
    assert_eq!(fake.get_updates_calls(), 0, "nobody polls in webhook mode:\n{}", daemon.logs());
    let (_, metrics) = get(&daemon, "/metrics").await;
    assert!(
        metrics.lines().any(|l| l.starts_with("switchboard_webhook_requests_total{")
            && l.contains("answer=\"stored\"")
            && l.ends_with("} 1")),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_request_without_the_right_secret_is_refused_and_stores_nothing() {
    let fake = FakeTelegram::start().await;
    let daemon = webhook_daemon(&fake).await;
    let forged = json!({
        "update_id": 777,
        "message": {
            "message_id": 1, "date": 1,
            "chat": {"id": OWNER_CHAT, "type": "private", "first_name": "Olga"},
            "from": {"id": OWNER_ID, "is_bot": false, "first_name": "Olga"},
            "text": "forged"
        }
    })
    .to_string();
    assert_eq!(post_update(&daemon, Some("not-the-secret"), &forged).await, 401);
    assert_eq!(post_update(&daemon, None, &forged).await, 401);
    // The same update with the secret is taken: only the secret was wrong.
    let marker = fake.push_text(ChatSpec::private(OWNER_CHAT), owner(), "marker");
    fake.wait_until_delivered(marker, 1, WAIT).await;
    let rows = daemon.envelopes().await;
    assert_eq!(rows.iter().map(|e| e.update_id).collect::<Vec<_>>(), [Some(marker)], "{rows:?}");
    assert_eq!(post_update(&daemon, Some(WEBHOOK_SECRET), &forged).await, 200);
    assert_eq!(stored(&daemon, 777).await, 1);
}

/// A request whose body stalls, as anyone who reaches the listener can make it: without
/// the secret it is answered at once, its body never read; with it, its body gets a few
/// seconds (Telegram sends an update at once) and then a 408, and Telegram would deliver
/// it again. Either way it holds none of the listener's connections for long.
#[tokio::test]
async fn a_stalled_body_is_answered_without_reading_it_or_after_a_few_seconds() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let fake = FakeTelegram::start().await;
    let daemon = webhook_daemon(&fake).await;
    let stalled = |secret: &str| {
        format!(
            "POST /telegram/hook HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
             X-Telegram-Bot-Api-Secret-Token: {secret}\r\nContent-Length: 1000\r\n\r\n{{\"update_id\": 5"
        )
    };
    for (secret, status, within) in
        [("not-the-secret", "401", Duration::from_secs(2)), (WEBHOOK_SECRET, "408", Duration::from_secs(15))]
    {
        let mut connection = tokio::net::TcpStream::connect(daemon.webhook_addr()).await.unwrap();
        connection.write_all(stalled(secret).as_bytes()).await.unwrap();
        let mut answer = [0u8; 12];
        let read = tokio::time::timeout(within, connection.read_exact(&mut answer)).await;
        let answer = String::from_utf8_lossy(&answer).into_owned();
        assert!(read.is_ok() && answer.ends_with(status), "{secret}: {answer:?} within {within:?}");
    }
    assert_eq!(stored(&daemon, 5).await, 0);
}

#[tokio::test]
async fn an_update_delivered_twice_is_one_envelope() {
    let fake = FakeTelegram::start().await;
    let daemon = webhook_daemon(&fake).await;
    let orchestrator = session(&daemon, "orchestrator").await;
    let dm = ChatSpec::private(OWNER_CHAT);
    let update_id = fake.push_text(&dm, owner(), "said once");
    fake.wait_until_delivered(update_id, 1, WAIT).await;
    fake.deliver_again(update_id);
    fake.wait_until_delivered(update_id, 2, WAIT).await;
    assert_eq!(stored(&daemon, update_id).await, 1);
    // The session sees it once: a marker delivered after the redelivery comes second.
    fake.push_text(&dm, owner(), "marker");
    let notes = orchestrator.wait_for_notifications(2, WAIT).await.unwrap();
    assert_eq!(notes.iter().map(|n| n.content.as_str()).collect::<Vec<_>>(), ["said once", "marker"]);
}

#[tokio::test]
async fn an_answer_lost_after_the_commit_and_a_kill_9_still_leave_one_envelope() {
    let fake = FakeTelegram::start().await;
    let mut daemon = webhook_daemon(&fake).await;
    // The daemon commits and answers, but Telegram never sees the answer (the connection
    // broke): for Telegram the update is not delivered, exactly as after a crash between
    // the commit and the 200. Then the daemon dies for real.
    fake.lose_next_webhook_answer();
    let update_id = fake.push_text(ChatSpec::private(OWNER_CHAT), owner(), "committed, never confirmed");
    assert_eq!(fake.wait_for_deliveries(update_id, 1, WAIT).await, [Delivery::NoAnswer]);
    assert_eq!(stored(&daemon, update_id).await, 1, "committed before the answer");
    daemon.kill9();

    daemon.restart();
    fake.route_webhook_to(daemon.webhook_addr());
    fake.wait_until_delivered(update_id, 1, WAIT).await;
    assert_eq!(stored(&daemon, update_id).await, 1, "Telegram's retry is recognised");
    let orchestrator = session(&daemon, "orchestrator").await;
    let notes = orchestrator.wait_for_notifications(1, WAIT).await.unwrap();
    assert_eq!(notes[0].content, "committed, never confirmed");
}

#[tokio::test]
async fn a_busy_ledger_is_answered_with_an_error_and_telegrams_retry_stores_the_update() {
    let fake = FakeTelegram::start().await;
    let daemon = webhook_daemon(&fake).await;
    // Another process holds the write lock past the daemon's 10 s busy timeout.
    let holder = daemon.hold_write_lock();
    let update_id = fake.push_text(ChatSpec::private(OWNER_CHAT), owner(), "while the ledger is locked");
    let first = fake.wait_for_deliveries(update_id, 1, Duration::from_secs(40)).await[0];
    assert!(matches!(first, Delivery::Answered(500..=599)), "never 200 for an update not stored: {first:?}");
    assert_eq!(holder.envelopes_of_update(update_id), 0, "nothing stored while the lock is held");
    assert!(daemon.logs().contains("answered 503"), "{}", daemon.logs());

    holder.release();
    fake.wait_until_delivered(update_id, 1, Duration::from_secs(40)).await;
    assert_eq!(stored(&daemon, update_id).await, 1);
}

#[tokio::test]
async fn a_webhook_secret_telegram_would_refuse_stops_start_up_naming_the_key() {
    let fake = FakeTelegram::start().await;
    let daemon = TestDaemon::configure(
        &fake.api_url(),
        &webhook_config(),
        &default_routes(),
        &[(SECRET_ENV, "has spaces!")],
    );
    let output = daemon.subcommand("check").output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains("telegram.webhook.secret_env"), "{stderr}");
    assert!(!stderr.contains("has spaces!"), "the value is never shown: {stderr}");
    assert!(fake.requests_for("setWebhook").is_empty());
}

#[tokio::test]
async fn a_polling_daemon_reports_a_webhook_left_set_and_polls_once_it_is_removed() {
    let fake = FakeTelegram::start().await;
    // A webhook left from an earlier webhook-mode run (or another tool).
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let set = client
        .post(format!("{}/bot{}/setWebhook", fake.api_url(), switchboard::fake_bot_api::TEST_TOKEN))
        .json(&json!({"url": PUBLIC_URL}))
        .send()
        .await
        .unwrap();
    assert!(set.status().is_success());
    let daemon = TestDaemon::start(&fake.api_url(), "", &default_routes());
    daemon.wait_for_log("a webhook is set for this bot", WAIT).await;
    assert!(fake.webhook().is_some(), "switchboard does not remove a webhook it was not told to");
    let (_, readiness) = readiness(&daemon).await;
    assert_eq!(readiness["intake"], "polling");

    client
        .post(format!("{}/bot{}/deleteWebhook", fake.api_url(), switchboard::fake_bot_api::TEST_TOKEN))
        .send()
        .await
        .unwrap();
    let update_id = fake.push_text(ChatSpec::private(OWNER_CHAT), owner(), "polled again");
    fake.wait_until_confirmed(update_id, WAIT).await;
    assert_eq!(stored(&daemon, update_id).await, 1);
}

/// Another program with the bot's token removes the webhook (a poller does, before it
/// polls): the daemon notices and sets it again. The token revoked later: `/readyz` says
/// so, where it stayed ready for good when only the first `setWebhook` was checked.
#[tokio::test]
async fn a_removed_webhook_is_set_again_and_a_refused_token_is_not_ready() {
    let fake = FakeTelegram::start().await;
    let config = webhook_config().replace(" }", ", check_secs = 1 }");
    let daemon = TestDaemon::start_with_env(
        &fake.api_url(),
        &config,
        &default_routes(),
        &[(SECRET_ENV, WEBHOOK_SECRET)],
    );
    fake.wait_for_webhook(WAIT).await;
    let http = reqwest::Client::builder().no_proxy().timeout(WAIT).build().unwrap();
    let removed =
        http.post(format!("{}/bot{TEST_TOKEN}/deleteWebhook", fake.api_url())).send().await.unwrap();
    assert!(removed.status().is_success());
    assert!(fake.webhook().is_none());
    daemon.wait_for_log("the webhook is no longer", WAIT).await;
    let again = fake.wait_for_webhook(WAIT).await;
    assert_eq!(again.url, PUBLIC_URL);

    let unauthorized = r#"{"ok":false,"error_code":401,"description":"Unauthorized"}"#;
    for _ in 0..60 {
        fake.fail_method("getWebhookInfo", Fault::Raw { status: 401, body: unauthorized.into() });
    }
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let answer = http.get(format!("http://{}/readyz", daemon.api_addr())).send().await.unwrap();
        let status = answer.status().as_u16();
        let body: serde_json::Value = answer.json().await.unwrap();
        if status == 503 && body.to_string().contains("telegram_unauthorized") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "still {status} {body}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
