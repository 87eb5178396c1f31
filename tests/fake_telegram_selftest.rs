//! Tests of the fake Telegram server itself (`switchboard::fake_bot_api`). The daemon's
//! tests trust the fake to speak the Bot API the way teloxide expects, so most checks go
//! through a real `teloxide::Bot`; raw reqwest covers what teloxide cannot express.

use std::time::{Duration, Instant};

use futures::FutureExt as _;

use reqwest::StatusCode;
use serde_json::{Value, json};
use switchboard::fake_bot_api::{
    BOT_USER_ID, ChatSpec, FIRST_UPDATE_ID, FakeTelegram, Fault, TEST_TOKEN, UserSpec,
};
use teloxide::payloads::{GetUpdatesSetters, SendMessageSetters};
use teloxide::requests::Requester;
use teloxide::types::{ChatId, MessageId, ReplyParameters, Seconds, ThreadId, Update, UpdateKind};
use teloxide::{ApiError, Bot, RequestError};

const WITHIN: Duration = Duration::from_secs(5);

fn bot_for(fake: &FakeTelegram) -> Bot {
    Bot::new(TEST_TOKEN).set_api_url(fake.api_url().parse().expect("api_url is a URL"))
}

fn ann() -> UserSpec {
    UserSpec::new(42, "Ann").with_username("ann")
}

/// POSTs a JSON body to `method` and returns the status and parsed body.
async fn call(fake: &FakeTelegram, method: &str, body: Value) -> (StatusCode, Value) {
    let url = format!("{}/bot{TEST_TOKEN}/{method}", fake.api_url());
    let response = reqwest::Client::new().post(url).json(&body).send().await.expect("request to the fake");
    let status = response.status();
    let body = response.json().await.expect("JSON response");
    (status, body)
}

fn message_of(update: &Update) -> &teloxide::types::Message {
    match &update.kind {
        UpdateKind::Message(message) | UpdateKind::EditedMessage(message) => message,
        other => panic!("expected a message update, got {other:?}"),
    }
}

#[tokio::test]
async fn teloxide_parses_every_kind_of_pushed_update() {
    let fake = FakeTelegram::start().await;
    let bot = bot_for(&fake);

    let me = bot.get_me().await.expect("getMe");
    assert_eq!(me.id.0 as i64, BOT_USER_ID);
    assert_eq!(me.username(), "switchboard_test_bot");

    let private = ChatSpec::private_with(&ann());
    let forum = ChatSpec::forum(-100_200, "Forum");
    let group = ChatSpec::group(-300, "Group");
    let ids = [
        fake.push_text(&private, ann(), "hello"),
        fake.push_topic_text(&forum, 7, ann(), "in a topic"),
        fake.push_photo_with_caption(&group, ann(), Some("a caption")),
        fake.push_photo_with_caption(&group, ann(), None),
        fake.push_edited_text(&private, ann(), 1, "hello, edited"),
        fake.push_migration(&group, -100_300),
    ];
    assert_eq!(ids[0], FIRST_UPDATE_ID);
    assert!(ids.windows(2).all(|pair| pair[1] == pair[0] + 1));

    let updates = bot.get_updates().await.expect("getUpdates");
    let got: Vec<i64> = updates.iter().map(|update| i64::from(update.id.0)).collect();
    assert_eq!(got, ids);

    let text = message_of(&updates[0]);
    assert!(matches!(updates[0].kind, UpdateKind::Message(_)));
    assert_eq!(text.text(), Some("hello"));
    assert!(text.chat.is_private());
    assert_eq!(text.chat.first_name(), Some("Ann"));
    let from = text.from.as_ref().expect("from");
    assert_eq!((from.id.0, from.username.as_deref()), (42, Some("ann")));

    let topic = message_of(&updates[1]);
    assert_eq!(topic.text(), Some("in a topic"));
    assert_eq!(topic.thread_id, Some(ThreadId(MessageId(7))));
    assert!(topic.is_topic_message);
    assert!(topic.chat.is_supergroup());
    assert_eq!(topic.chat.title(), Some("Forum"));

    let photo = message_of(&updates[2]);
    assert!(photo.chat.is_group());
    assert_eq!(photo.photo().map(<[_]>::len), Some(2));
    assert_eq!(photo.caption(), Some("a caption"));
    let uncaptioned = message_of(&updates[3]);
    assert!(uncaptioned.photo().is_some());
    assert_eq!(uncaptioned.caption(), None);
    let (first_photo, second_photo) = (photo.photo().unwrap(), uncaptioned.photo().unwrap());
    assert_ne!(first_photo[0].file.id, second_photo[0].file.id);

    assert!(matches!(updates[4].kind, UpdateKind::EditedMessage(_)));
    let edited = message_of(&updates[4]);
    assert_eq!(edited.id, MessageId(1));
    assert_eq!(edited.text(), Some("hello, edited"));
    assert!(edited.edit_date().is_some());

    let migration = message_of(&updates[5]);
    assert_eq!(migration.chat.id, ChatId(-300));
    assert_eq!(migration.migrate_to_chat_id(), Some(&ChatId(-100_300)));
}

#[tokio::test]
async fn teloxide_parses_send_message_results_and_sends_are_recorded() {
    let fake = FakeTelegram::start().await;
    let bot = bot_for(&fake);
    let forum = ChatSpec::forum(-100_200, "Forum");
    fake.push_topic_text(&forum, 7, ann(), "question");

    let reply = bot
        .send_message(ChatId(-100_200), "answer")
        .message_thread_id(ThreadId(MessageId(7)))
        .reply_parameters(ReplyParameters::new(MessageId(1)))
        .await
        .expect("sendMessage");
    assert_eq!(reply.text(), Some("answer"));
    assert_eq!(reply.chat.id, ChatId(-100_200));
    assert_eq!(reply.chat.title(), Some("Forum"));
    assert_eq!(reply.thread_id, Some(ThreadId(MessageId(7))));
    assert!(reply.is_topic_message);
    assert_eq!(reply.from.as_ref().map(|from| from.is_bot), Some(true));

    // Chats the fake never saw default by the sign of their id.
    let private = bot.send_message(ChatId(77), "hi").await.expect("private");
    assert!(private.chat.is_private());
    let group = bot.send_message(ChatId(-500), "hi").await.expect("group");
    assert!(group.chat.is_supergroup());
    assert!(private.id.0 > reply.id.0 && group.id.0 > private.id.0);

    let sent = fake.wait_for_sent(3, WITHIN).await;
    assert_eq!(sent.len(), 3);
    assert_eq!(sent[0].message_id, reply.id.0);
    assert_eq!(sent[0].chat_id, -100_200);
    assert_eq!(sent[0].text, "answer");
    assert_eq!(sent[0].message_thread_id, Some(7));
    assert_eq!(sent[0].reply_to_message_id, Some(1));
    assert_eq!(sent[0].raw["reply_parameters"]["message_id"], json!(1));
    assert_eq!(sent[1].reply_to_message_id, None);
    assert_eq!(fake.requests_for("SendMessage").len(), 3);
}

#[tokio::test]
async fn offsets_confirm_updates_and_limit_caps_batches() {
    let fake = FakeTelegram::start().await;
    let bot = bot_for(&fake);
    let chat = ChatSpec::private(42);
    let ids: Vec<i64> = (0..3).map(|i| fake.push_text(&chat, ann(), &format!("m{i}"))).collect();

    let first = bot.get_updates().limit(2).await.expect("getUpdates");
    assert_eq!(first.len(), 2);
    // Receiving is not confirming.
    assert_eq!(fake.pending_update_count(), 3);
    assert_eq!(fake.last_confirmed_offset(), None);

    let rest = bot.get_updates().offset(first[1].id.as_offset()).await.expect("getUpdates");
    assert_eq!(rest.len(), 1);
    assert_eq!(i64::from(rest[0].id.0), ids[2]);
    assert_eq!(fake.pending_update_count(), 1);
    assert_eq!(fake.last_confirmed_offset(), Some(ids[1] + 1));
    fake.wait_until_confirmed(ids[1], WITHIN).await;

    bot.get_updates().offset(rest[0].id.as_offset()).await.expect("getUpdates");
    fake.wait_until_confirmed(ids[2], WITHIN).await;
    assert_eq!(fake.pending_update_count(), 0);

    // A lower offset later does not resurrect confirmed updates.
    let again = bot.get_updates().offset(1).await.expect("getUpdates");
    assert!(again.is_empty());
    assert_eq!(fake.last_confirmed_offset(), Some(ids[2] + 1));
    assert_eq!(fake.get_updates_calls(), 4);
}

#[tokio::test]
async fn negative_offset_keeps_only_the_newest_updates() {
    let fake = FakeTelegram::start().await;
    let chat = ChatSpec::private(42);
    let ids: Vec<i64> = (0..4).map(|i| fake.push_text(&chat, ann(), &format!("m{i}"))).collect();

    let (status, body) = call(&fake, "getUpdates", json!({ "offset": -2 })).await;
    assert_eq!(status, StatusCode::OK);
    let got: Vec<i64> = body["result"]
        .as_array()
        .unwrap()
        .iter()
        .map(|update| update["update_id"].as_i64().unwrap())
        .collect();
    assert_eq!(got, ids[2..]);
    assert_eq!(fake.pending_update_count(), 2);
}

#[tokio::test]
async fn long_poll_wakes_as_soon_as_an_update_is_pushed() {
    let fake = FakeTelegram::start().await;
    let bot = bot_for(&fake);
    let poll = tokio::spawn({
        let bot = bot.clone();
        async move { bot.get_updates().timeout(10).await }
    });
    fake.wait_for_waiting_long_poll(WITHIN).await;

    let pushed_at = Instant::now();
    let id = fake.push_text(ChatSpec::private(42), ann(), "wake up");
    let updates = tokio::time::timeout(WITHIN, poll)
        .await
        .expect("long poll did not wake")
        .expect("poll task")
        .expect("getUpdates");
    assert!(pushed_at.elapsed() < Duration::from_secs(1));
    assert_eq!(updates.len(), 1);
    assert_eq!(i64::from(updates[0].id.0), id);
}

#[tokio::test]
async fn long_poll_returns_nothing_when_its_timeout_expires() {
    let fake = FakeTelegram::start().await;
    let started = Instant::now();
    let (status, body) = call(&fake, "getUpdates", json!({ "timeout": 1 })).await;
    assert_eq!((status, body), (StatusCode::OK, json!({ "ok": true, "result": [] })));
    assert!(started.elapsed() >= Duration::from_millis(900));
}

#[tokio::test]
async fn a_newer_poll_terminates_a_waiting_one_with_conflict() {
    let fake = FakeTelegram::start().await;
    let bot = bot_for(&fake);
    let older = tokio::spawn({
        let bot = bot.clone();
        async move { bot.get_updates().timeout(10).await }
    });
    fake.wait_for_get_updates_calls(1, WITHIN).await;

    let newer = bot.get_updates().await.expect("newer poll");
    assert!(newer.is_empty());
    let older =
        tokio::time::timeout(WITHIN, older).await.expect("older poll was not terminated").expect("poll task");
    assert!(matches!(older, Err(RequestError::Api(ApiError::TerminatedByOtherGetUpdates))), "{older:?}");
}

#[tokio::test]
async fn faults_surface_as_the_matching_teloxide_errors() {
    let fake = FakeTelegram::start().await;
    let bot = bot_for(&fake);

    fake.fail_send_message(Fault::TooManyRequests { retry_after: 3 });
    fake.fail_send_message(Fault::MigrateTo(-100_999));
    fake.fail_send_message(Fault::BadRequest("Bad Request: message is too long".to_owned()));
    fake.fail_send_message(Fault::Forbidden("Forbidden: bot was blocked by the user".to_owned()));
    fake.fail_send_message(Fault::MalformedBody);
    fake.fail_get_updates(Fault::Conflict);
    assert_eq!(fake.pending_fault_count("sendMessage"), 5);

    let send = || bot.send_message(ChatId(42), "hi");
    assert!(matches!(
        send().await,
        Err(RequestError::RetryAfter(seconds)) if seconds == Seconds::from_seconds(3)
    ));
    assert!(matches!(send().await, Err(RequestError::MigrateToChatId(ChatId(-100_999)))));
    assert!(matches!(send().await, Err(RequestError::Api(ApiError::MessageIsTooLong))));
    assert!(matches!(send().await, Err(RequestError::Api(ApiError::BotBlocked))));
    assert!(matches!(send().await, Err(RequestError::InvalidJson { .. })));
    assert!(matches!(bot.get_updates().await, Err(RequestError::Api(ApiError::TerminatedByOtherGetUpdates))));
    // None of the failed sends reached the "user".
    assert!(fake.sent_messages().is_empty());
    assert_eq!(fake.pending_fault_count("sendMessage"), 0);

    send().await.expect("faults are used up");
    assert_eq!(fake.sent_messages().len(), 1);
    assert_eq!(fake.requests_for("sendmessage").len(), 6);
}

#[tokio::test]
async fn server_error_and_raw_faults_have_the_right_status_and_body() {
    // Through reqwest: teloxide sleeps 10 s on any 5xx before returning.
    let fake = FakeTelegram::start().await;
    fake.fail_send_message(Fault::ServerError);
    fake.fail_send_message(Fault::Raw { status: 502, body: "<html>Bad Gateway</html>".to_owned() });

    let params = json!({ "chat_id": 42, "text": "hi" });
    let (status, body) = call(&fake, "sendMessage", params.clone()).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(body, json!({ "ok": false, "error_code": 500, "description": "Internal Server Error" }));

    let url = format!("{}/bot{TEST_TOKEN}/sendMessage", fake.api_url());
    let response = reqwest::Client::new().post(url).json(&params).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::BAD_GATEWAY);
    assert_eq!(response.text().await.unwrap(), "<html>Bad Gateway</html>");
    assert!(fake.sent_messages().is_empty());
}

#[tokio::test]
async fn record_then_hang_records_what_the_client_never_hears_about() {
    let fake = FakeTelegram::start().await;
    let impatient = reqwest::Client::builder().timeout(Duration::from_millis(300)).build().unwrap();
    let url = format!("{}/bot{TEST_TOKEN}/sendMessage", fake.api_url());
    let send = |text: &str| impatient.post(&url).json(&json!({ "chat_id": 42, "text": text })).send();

    fake.fail_send_message(Fault::RecordThenHang(Duration::from_secs(30)));
    let outcome = send("delivered, unacknowledged").await;
    assert!(outcome.is_err_and(|error| error.is_timeout()));
    let sent = fake.sent_messages();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].text, "delivered, unacknowledged");

    fake.fail_send_message(Fault::HangWithoutRecording(Duration::from_secs(30)));
    let outcome = send("lost").await;
    assert!(outcome.is_err_and(|error| error.is_timeout()));
    assert_eq!(fake.sent_messages().len(), 1);
}

#[tokio::test]
async fn hung_requests_are_released_by_shutdown() {
    let fake = FakeTelegram::start().await;
    fake.fail_send_message(Fault::HangWithoutRecording(Duration::from_secs(60)));
    let url = format!("{}/bot{TEST_TOKEN}/sendMessage", fake.api_url());
    let hung =
        tokio::spawn(reqwest::Client::new().post(url).json(&json!({ "chat_id": 42, "text": "hi" })).send());
    fake.wait_for_requests("sendMessage", 1, WITHIN).await;
    tokio::time::timeout(WITHIN, fake.shutdown()).await.expect("shutdown waited for a hung request");
    // Whatever the answer, the client is not left hanging for a minute.
    tokio::time::timeout(WITHIN, hung)
        .await
        .expect("hung request outlived the fake")
        .expect("request task")
        .ok();
}

#[tokio::test]
async fn migrated_groups_reject_sends_with_the_new_chat_id() {
    let fake = FakeTelegram::start().await;
    let bot = bot_for(&fake);
    let group = ChatSpec::group(-300, "Team");
    fake.push_migration(&group, -100_300);

    let result = bot.send_message(ChatId(-300), "hi").await;
    assert!(matches!(result, Err(RequestError::MigrateToChatId(ChatId(-100_300)))), "{result:?}");
    let moved = bot.send_message(ChatId(-100_300), "hi").await.expect("send to the supergroup");
    assert!(moved.chat.is_supergroup());
    assert_eq!(moved.chat.title(), Some("Team"));
    assert_eq!(fake.sent_messages().len(), 1);
}

#[tokio::test]
async fn malformed_updates_reach_teloxide_as_update_kind_error() {
    let fake = FakeTelegram::start().await;
    let bot = bot_for(&fake);
    let bad = fake.push_raw_update(json!({ "message": { "not": "a message" } }));
    let good = fake.push_text(ChatSpec::private(42), ann(), "fine");

    let updates = bot.get_updates().await.expect("getUpdates");
    assert_eq!(i64::from(updates[0].id.0), bad);
    assert!(matches!(updates[0].kind, UpdateKind::Error(_)));
    assert_eq!(i64::from(updates[1].id.0), good);
    assert_eq!(message_of(&updates[1]).text(), Some("fine"));
}

/// The raw text of a `getUpdates` answer with `offset`.
async fn get_updates_text(fake: &FakeTelegram, offset: i64) -> String {
    let url = format!("{}/bot{TEST_TOKEN}/getUpdates", fake.api_url());
    let response = reqwest::Client::new().post(url).json(&json!({ "offset": offset })).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    response.text().await.unwrap()
}

#[tokio::test]
async fn raw_update_text_is_served_verbatim_beside_ordinary_updates() {
    let fake = FakeTelegram::start().await;
    let good = fake.push_text(ChatSpec::private(42), ann(), "fine");
    let surrogate = fake.push_raw_update_text(r#"{"message": {"text": "\ud800"}}"#);
    let body = get_updates_text(&fake, 0).await;
    assert!(
        body.contains(&format!(r#"{{"update_id":{surrogate},"message": {{"text": "\ud800"}}}}"#)),
        "{body}"
    );
    assert!(body.contains(&format!(r#""update_id":{good}"#)), "{body}");
    // Not JSON that serde_json accepts, as with the real thing.
    assert!(serde_json::from_str::<Value>(&body).is_err());
}

#[tokio::test]
async fn a_reused_update_id_is_served_again_until_confirmed() {
    let fake = FakeTelegram::start().await;
    let first = fake.push_raw_update_text(r#"{"message": {"text": "one"}}"#);
    let later = fake.push_text(ChatSpec::private(42), ann(), "two");
    assert!(get_updates_text(&fake, 0).await.contains(r#""text": "one""#));
    assert!(!get_updates_text(&fake, later + 1).await.contains("update_id"), "all confirmed");

    fake.reuse_update_id(first, r#"{"message": {"text": "three"}}"#);
    let body = get_updates_text(&fake, later + 1).await;
    assert!(body.contains(&format!(r#"{{"update_id":{first},"message": {{"text": "three"}}}}"#)), "{body}");
    assert_eq!(fake.pending_update_count(), 1);
    get_updates_text(&fake, first + 1).await;
    assert_eq!(fake.pending_update_count(), 0, "confirmed by an offset above it, sent after serving it");
}

#[tokio::test]
async fn send_message_validates_text_like_telegram() {
    let fake = FakeTelegram::start().await;
    let at_limit = "a".repeat(4096);
    let (status, _) = call(&fake, "sendMessage", json!({ "chat_id": 1, "text": at_limit })).await;
    assert_eq!(status, StatusCode::OK);

    // The limit is in UTF-16 code units: each of these emoji counts twice.
    let over_limit = "😀".repeat(2049);
    let (status, body) = call(&fake, "sendMessage", json!({ "chat_id": 1, "text": over_limit })).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["description"], "Bad Request: message is too long");

    let (status, body) = call(&fake, "sendMessage", json!({ "chat_id": 1, "text": "" })).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["description"], "Bad Request: message text is empty");

    let (status, _) = call(&fake, "sendMessage", json!({ "chat_id": "@x", "text": "t" })).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(fake.sent_messages().len(), 1);
}

#[tokio::test]
async fn speaks_the_bot_api_url_and_parameter_conventions() {
    let fake = FakeTelegram::start().await;
    let client = reqwest::Client::new();
    let base = fake.api_url();

    // Wrong token.
    let response =
        client.post(format!("{base}/bot123456:wrong/getMe")).json(&json!({})).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body, json!({ "ok": false, "error_code": 401, "description": "Unauthorized" }));
    assert_eq!(fake.unauthorized_requests(), 1);

    // Not a Bot API path at all.
    let response = client.get(format!("{base}/nope")).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::NOT_FOUND);

    // Unknown methods are named in the error.
    let (status, body) = call(&fake, "sendSticker", json!({})).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(body["description"].as_str().unwrap().contains("sendsticker"));

    // Method names are case-insensitive; GET with a query string works; the
    // token's ':' may be percent-encoded.
    let escaped = TEST_TOKEN.replace(':', "%3A");
    let response = client.get(format!("{base}/bot{escaped}/getme")).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let id = fake.push_text(ChatSpec::private(42), ann(), "queued");
    let body: Value = client
        .get(format!("{base}/bot{TEST_TOKEN}/GETUPDATES?offset={}", id + 1))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(body, json!({ "ok": true, "result": [] }));
    assert_eq!(fake.last_confirmed_offset(), Some(id + 1));

    // Form bodies: numbers and objects arrive as strings.
    let response = client
        .post(format!("{base}/bot{TEST_TOKEN}/sendMessage"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body("chat_id=-100123&text=hello+world&message_thread_id=9&reply_parameters=%7B%22message_id%22%3A5%7D")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let sent = &fake.sent_messages()[0];
    assert_eq!(
        (sent.chat_id, sent.text.as_str(), sent.message_thread_id, sent.reply_to_message_id),
        (-100_123, "hello world", Some(9), Some(5))
    );

    // Harmless housekeeping methods teloxide may call.
    for method in ["deleteWebhook", "close", "logOut"] {
        let (status, body) = call(&fake, method, json!({})).await;
        assert_eq!((status, &body["result"]), (StatusCode::OK, &json!(true)), "{method}");
    }
    // Chat actions and the command menu are checked as Telegram checks them.
    let (status, body) = call(&fake, "sendChatAction", json!({"chat_id": 1, "action": "typing"})).await;
    assert_eq!((status, &body["result"]), (StatusCode::OK, &json!(true)));
    let (status, _) = call(&fake, "sendChatAction", json!({})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let commands = json!({"commands": [{"command": "status", "description": "What runs"}]});
    let (status, body) = call(&fake, "setMyCommands", commands).await;
    assert_eq!((status, &body["result"]), (StatusCode::OK, &json!(true)));
    let (_, body) = call(&fake, "getWebhookInfo", json!({})).await;
    assert_eq!(body["result"]["url"], "");

    let methods: Vec<String> = fake.requests_seen().into_iter().map(|(m, _)| m).collect();
    assert_eq!(methods[..3], ["sendsticker", "getme", "getupdates"]);
}

#[tokio::test]
async fn webhook_info_deserializes_in_teloxide() {
    let fake = FakeTelegram::start().await;
    let bot = bot_for(&fake);
    fake.push_text(ChatSpec::private(42), ann(), "pending");
    let info = bot.get_webhook_info().await.expect("getWebhookInfo");
    assert_eq!(info.url, None);
    assert_eq!(info.pending_update_count, 1);
    bot.delete_webhook().await.expect("deleteWebhook");
}

#[tokio::test]
async fn dropping_the_fake_stops_serving_even_pooled_connections() {
    let fake = FakeTelegram::start().await;
    let bot = bot_for(&fake);
    bot.get_me().await.expect("getMe while running");
    let poll = tokio::spawn({
        let bot = bot.clone();
        async move { bot.get_updates().timeout(30).await }
    });
    fake.wait_for_get_updates_calls(1, WITHIN).await;

    drop(fake);
    // The waiting long poll is released rather than left for 30 s.
    tokio::time::timeout(WITHIN, poll).await.expect("long poll outlived the fake").expect("poll task").ok();
    // `bot` pools its keep-alive connection; the fake's graceful shutdown closes it, so it
    // stops being served (how soon depends on the connection's task, not on a clock).
    let deadline = Instant::now() + WITHIN;
    while bot.get_me().await.is_ok() {
        assert!(Instant::now() < deadline, "a pooled connection was still served {WITHIN:?} after the drop");
        tokio::task::yield_now().await;
    }
}

#[tokio::test]
#[should_panic(expected = "waiting for 1 sent message")]
async fn wait_for_sent_panics_with_a_diagnosis() {
    let fake = FakeTelegram::start().await;
    fake.wait_for_sent(1, Duration::from_millis(50)).await;
}

#[tokio::test]
async fn the_poll_after_the_one_that_served_an_update_is_its_settle_point() {
    let fake = FakeTelegram::start().await;
    let bot = bot_for(&fake);
    let id = fake.push_text(ChatSpec::private(42), ann(), "settle on me");
    let not_yet = || fake.wait_for_poll_after(id, WITHIN).now_or_never().is_none();
    assert!(not_yet(), "never served yet");

    let served = bot.get_updates().await.expect("getUpdates");
    assert_eq!(served.len(), 1);
    assert!(not_yet(), "served, but the client has not come back for more");
    bot.get_updates().offset(id as i32 + 1).await.expect("getUpdates");
    fake.wait_for_poll_after(id, WITHIN).await;

    // A reused id counts from its reuse.
    fake.reuse_update_id(
        id,
        r#"{"message":{"message_id":9,"date":0,"chat":{"id":42,"type":"private"},"text":"again"}}"#,
    );
    assert!(not_yet(), "pushed again, not served again yet");
    bot.get_updates().offset(id as i32 + 1).await.expect("getUpdates");
    bot.get_updates().offset(id as i32 + 1).await.expect("getUpdates");
    fake.wait_for_poll_after(id, WITHIN).await;
}

#[tokio::test]
async fn a_held_send_is_in_the_chat_and_its_answer_never_comes() {
    let fake = FakeTelegram::start().await;
    fake.fail_send_message(Fault::Pass);
    fake.fail_send_message(Fault::RecordThenHang(Duration::MAX));
    let (status, _) = call(&fake, "sendMessage", json!({ "chat_id": 42, "text": "answered" })).await;
    assert_eq!(status, StatusCode::OK);
    let url = format!("{}/bot{TEST_TOKEN}/sendMessage", fake.api_url());
    let held =
        tokio::spawn(reqwest::Client::new().post(url).json(&json!({ "chat_id": 42, "text": "held" })).send());

    let message = fake.wait_for_held_send(WITHIN).await.expect("a held send");
    assert_eq!(message.text, "held");
    assert_eq!(fake.sent_messages().len(), 2, "it is in the chat");
    assert!(!held.is_finished(), "and its answer has not come");
    let matching = fake.wait_for_sent_matching(WITHIN, |sent| sent.text == "held").await;
    assert_eq!(matching.map(|sent| sent.message_id), Some(message.message_id));
    tokio::time::timeout(WITHIN, fake.shutdown()).await.expect("shutdown releases the held send");
}

#[tokio::test]
async fn a_pushed_message_reports_the_message_id_the_bot_sees() {
    let fake = FakeTelegram::start().await;
    let bot = bot_for(&fake);
    let pushed = fake.push_text_message(ChatSpec::private(42), ann(), "which id?");
    let updates = bot.get_updates().await.expect("getUpdates");
    assert_eq!(updates[0].id.0 as i64, pushed.update_id);
    assert_eq!(message_of(&updates[0]).id, MessageId(pushed.message_id));
}

#[tokio::test]
async fn privacy_mode_is_on_until_it_is_turned_off() {
    let fake = FakeTelegram::start().await;
    let bot = bot_for(&fake);
    assert!(!bot.get_me().await.expect("getMe").can_read_all_group_messages, "a new bot's default");
    fake.set_privacy_mode(false);
    assert!(bot.get_me().await.expect("getMe").can_read_all_group_messages);
}

#[tokio::test]
async fn reactions_are_served_only_to_a_client_that_asks_for_them_and_the_list_is_remembered() {
    let fake = FakeTelegram::start().await;
    let chat = ChatSpec::private(42);
    let reaction = fake.push_reaction(&chat, ann(), 7, &["👍"]);
    let text = fake.push_text(&chat, ann(), "hello");
    let served_ids = |body: &Value| -> Vec<i64> {
        body["result"].as_array().unwrap().iter().map(|u| u["update_id"].as_i64().unwrap()).collect()
    };
    // Telegram's default leaves reactions out.
    let (_, body) = call(&fake, "getUpdates", json!({})).await;
    assert_eq!(served_ids(&body), [text]);
    let (_, body) =
        call(&fake, "getUpdates", json!({ "allowed_updates": ["message", "message_reaction"] })).await;
    assert_eq!(served_ids(&body), [reaction, text]);
    // A call without a list keeps the last one; teloxide parses the reaction.
    let updates = bot_for(&fake).get_updates().await.expect("getUpdates");
    assert!(matches!(updates[0].kind, UpdateKind::MessageReaction(_)), "{:?}", updates[0].kind);
    assert_eq!(
        fake.allowed_updates_requested(),
        [None, Some(vec!["message".to_owned(), "message_reaction".to_owned()]), None]
    );
    let (status, _) = call(&fake, "getUpdates", json!({ "allowed_updates": "not a list" })).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
}

/// As Telegram: `getFile` names a file up to 20 MiB and refuses a bigger one with a 400.
#[tokio::test]
async fn get_file_refuses_a_file_over_20_mib_as_too_big() {
    let fake = FakeTelegram::start().await;
    fake.add_file_claiming("at-limit", vec![0u8; 10], 20 * 1024 * 1024);
    fake.add_file_claiming("over", vec![0u8; 10], 20 * 1024 * 1024 + 1);
    let (status, body) = call(&fake, "getFile", json!({"file_id": "at-limit"})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(body["result"]["file_path"].is_string(), "{body}");
    let (status, body) = call(&fake, "getFile", json!({"file_id": "over"})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!((body["ok"].as_bool(), body["error_code"].as_u64()), (Some(false), Some(400)));
    assert_eq!(body["description"], "Bad Request: file is too big");
}
