//! Files end to end (DESIGN.md §14): fake Telegram → real daemon → real `switchboard
//! channel` → the agent's inbox, and back for the files of a reply. Bytes are compared by
//! SHA-256, so a file that arrives at all arrives whole and unchanged.

mod support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::json;
use sha2::{Digest, Sha256};
use support::agents::*;
use support::daemon::*;
use support::mcp::ChannelClient;
use switchboard::fake_bot_api::{ChatSpec, FakeTelegram, TEST_TOKEN};

/// Bytes that differ at every offset, so a chunk dropped or repeated changes the digest.
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u32).wrapping_mul(2_654_435_761).rotate_left(u32::from(seed)) as u8).collect()
}

fn sha256(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

fn sha256_file(path: &Path) -> String {
    sha256(&std::fs::read(path).expect("the saved file can be read"))
}

/// A connected plugin whose inbox is the default one under `state_home`.
async fn media_session(daemon: &TestDaemon, agent: &str, state_home: &Path) -> ChannelClient {
    let plugin = plugin_builder(daemon, agent)
        .env("XDG_STATE_HOME", state_home.display().to_string())
        .start()
        .await
        .expect("the channel plugin starts");
    plugin
        .wait_for_stderr("channel::forwarder: connected to the switchboard daemon", WAIT)
        .await
        .expect("its session connects");
    plugin
}

fn inbox_of(state_home: &Path, agent: &str) -> PathBuf {
    state_home.join("switchboard").join("inbox").join(agent)
}

/// The path a successful `download_attachment` names (its answer's last word).
fn saved_path(answer: &str) -> PathBuf {
    PathBuf::from(answer.rsplit(' ').next().expect("the answer names a path"))
}

struct Waiting {
    fake: FakeTelegram,
    daemon: TestDaemon,
    orchestrator: ChannelClient,
    state_home: tempfile::TempDir,
}

async fn orchestrator_with_inbox() -> Waiting {
    let fake = FakeTelegram::start().await;
    let daemon = TestDaemon::start(&fake.api_url(), "", &default_routes());
    let state_home = tempfile::tempdir().unwrap();
    let orchestrator = media_session(&daemon, "orchestrator", state_home.path()).await;
    Waiting { fake, daemon, orchestrator, state_home }
}

#[tokio::test]
async fn download_attachment_saves_exactly_the_bytes_at_an_absolute_path_in_the_inbox() {
    let Waiting { fake, daemon: _daemon, orchestrator, state_home } = orchestrator_with_inbox().await;
    let bytes = pattern(3 * 1024 * 1024 + 17, 3);
    fake.add_file("doc-1", bytes.clone());
    fake.push_document_file(
        ChatSpec::private(OWNER_CHAT),
        owner(),
        "doc-1",
        "report.pdf",
        bytes.len() as u64,
    );
    let pushed = orchestrator.wait_for_notifications(1, WAIT).await.unwrap();
    assert_eq!(pushed[0].meta_str("attachment_kind"), Some("document"));
    assert_eq!(pushed[0].meta_str("attachment_file_id"), Some("doc-1"));
    assert!(pushed[0].meta_str("image_path").is_none(), "only a photo is fetched ahead");

    let trace = trace_id(&pushed[0]);
    let (is_error, answer) =
        orchestrator.call_tool("download_attachment", json!({"trace_id": trace})).await.unwrap();
    assert!(!is_error, "{answer}");
    let path = saved_path(&answer);
    assert!(path.is_absolute(), "{answer}");
    let inbox = inbox_of(state_home.path(), "orchestrator");
    assert_eq!(path.parent(), Some(inbox.as_path()), "{answer}");
    assert!(path.file_name().unwrap().to_string_lossy().ends_with("report.pdf"), "{answer}");
    assert_eq!(sha256_file(&path), sha256(&bytes));
    assert_eq!(fake.file_downloads().len(), 1);

    // The same file again is a second, separate copy: nothing is overwritten.
    let (is_error, again) = orchestrator
        .call_tool("download_attachment", json!({"trace_id": trace, "file_id": "doc-1"}))
        .await
        .unwrap();
    assert!(!is_error, "{again}");
    assert_ne!(saved_path(&again), path);
    assert_eq!(sha256_file(&saved_path(&again)), sha256(&bytes));

    // The official plugin's download_attachment names the file only: the message this
    // session was shown with it is found; a file it was not shown is refused.
    let (is_error, by_file) =
        orchestrator.call_tool("download_attachment", json!({"file_id": "doc-1"})).await.unwrap();
    assert!(!is_error, "{by_file}");
    assert_eq!(sha256_file(&saved_path(&by_file)), sha256(&bytes));
    let (is_error, unknown) =
        orchestrator.call_tool("download_attachment", json!({"file_id": "doc-nonesuch"})).await.unwrap();
    assert!(is_error && unknown.starts_with("bad_request") && unknown.contains("trace_id"), "{unknown}");
}

#[tokio::test]
async fn a_file_id_of_another_message_and_another_agents_envelope_are_refused_without_a_download() {
    let Waiting { fake, daemon, orchestrator, state_home } = orchestrator_with_inbox().await;
    fake.add_file("doc-mine", pattern(1000, 1));
    fake.add_file("doc-elsewhere", pattern(1000, 2));
    fake.push_document_file(ChatSpec::private(OWNER_CHAT), owner(), "doc-mine", "mine.txt", 1000);
    let pushed = orchestrator.wait_for_notifications(1, WAIT).await.unwrap();
    let trace = trace_id(&pushed[0]);

    let (is_error, text) = orchestrator
        .call_tool("download_attachment", json!({"trace_id": trace, "file_id": "doc-elsewhere"}))
        .await
        .unwrap();
    assert!(is_error, "{text}");
    assert!(text.starts_with("no_such_attachment"), "{text}");
    assert!(text.contains("doc-mine"), "the refusal names the envelope's attachments: {text}");

    let worker = media_session(&daemon, "worker", state_home.path()).await;
    let (is_error, text) = worker.call_tool("download_attachment", json!({"trace_id": trace})).await.unwrap();
    assert!(is_error, "{text}");
    assert!(text.starts_with("unknown_trace_id"), "another agent's envelope is not told apart: {text}");

    assert!(fake.file_downloads().is_empty(), "nothing was downloaded");
    assert!(fake.requests_for("getFile").is_empty(), "Telegram was not even asked");
    assert!(
        !inbox_of(state_home.path(), "worker").exists()
            || dir_is_empty(&inbox_of(state_home.path(), "worker"))
    );
}

fn dir_is_empty(dir: &Path) -> bool {
    std::fs::read_dir(dir).map(|mut entries| entries.next().is_none()).unwrap_or(true)
}

#[tokio::test]
async fn a_file_over_telegrams_20_mb_is_refused_before_any_download() {
    let Waiting { fake, daemon: _daemon, orchestrator, state_home } = orchestrator_with_inbox().await;
    let size = 21 * 1024 * 1024;
    // getFile says 21 MB; the fake need not hold them.
    fake.add_file_claiming("huge", pattern(10, 1), size);
    fake.push_document_file(ChatSpec::private(OWNER_CHAT), owner(), "huge", "huge.iso", size);
    let pushed = orchestrator.wait_for_notifications(1, WAIT).await.unwrap();
    let (is_error, text) = orchestrator
        .call_tool("download_attachment", json!({"trace_id": trace_id(&pushed[0])}))
        .await
        .unwrap();
    assert!(is_error, "{text}");
    assert!(text.starts_with("file_too_large"), "{text}");
    assert!(text.contains("20 MB"), "the refusal names the limit: {text}");
    assert!(fake.file_downloads().is_empty(), "refused before any download");
    assert!(dir_is_empty(&inbox_of(state_home.path(), "orchestrator")));
}

/// Telegram does not always say a document's size. One over 20 MB is then refused by
/// `getFile` itself: the agent hears the same refusal as for a size it knew (ask for a
/// smaller file or a link), not "try again later", which would never succeed.
#[tokio::test]
async fn a_file_over_20_mb_whose_size_telegram_did_not_say_is_refused_as_too_large() {
    let Waiting { fake, daemon: _daemon, orchestrator, state_home } = orchestrator_with_inbox().await;
    fake.add_file_claiming("huge-unsized", pattern(10, 1), 25 * 1024 * 1024);
    fake.push_document_file_without_size(ChatSpec::private(OWNER_CHAT), owner(), "huge-unsized", "huge.mkv");
    let pushed = orchestrator.wait_for_notifications(1, WAIT).await.unwrap();
    assert!(pushed[0].meta_str("attachment_size").is_none(), "the size was not said");
    let (is_error, text) = orchestrator
        .call_tool("download_attachment", json!({"trace_id": trace_id(&pushed[0])}))
        .await
        .unwrap();
    assert!(is_error, "{text}");
    assert!(text.starts_with("file_too_large"), "{text}");
    assert!(text.contains("20 MB") && text.contains("link"), "names the limit and what to ask for: {text}");
    assert!(!text.contains("try again"), "a retry would never fetch it: {text}");
    assert_eq!(fake.requests_for("getFile").len(), 1, "Telegram was asked");
    assert!(fake.file_downloads().is_empty(), "nothing was downloaded");
    assert!(dir_is_empty(&inbox_of(state_home.path(), "orchestrator")));
}

#[tokio::test]
async fn an_unsafe_file_name_lands_inside_the_inbox() {
    let Waiting { fake, daemon: _daemon, orchestrator, state_home } = orchestrator_with_inbox().await;
    let bytes = pattern(4096, 5);
    fake.add_file("evil", bytes.clone());
    fake.push_document_file(
        ChatSpec::private(OWNER_CHAT),
        owner(),
        "evil",
        "../../etc/x",
        bytes.len() as u64,
    );
    let pushed = orchestrator.wait_for_notifications(1, WAIT).await.unwrap();
    let (is_error, answer) = orchestrator
        .call_tool("download_attachment", json!({"trace_id": trace_id(&pushed[0])}))
        .await
        .unwrap();
    assert!(!is_error, "{answer}");
    let path = saved_path(&answer);
    let inbox = inbox_of(state_home.path(), "orchestrator");
    assert_eq!(path.parent(), Some(inbox.as_path()), "{answer}");
    let name = path.file_name().unwrap().to_string_lossy().into_owned();
    assert!(!name.contains("..") && name.ends_with("etc_x"), "{name}");
    assert_eq!(sha256_file(&path), sha256(&bytes));
    assert!(!state_home.path().join("etc").exists());
}

#[tokio::test]
async fn a_photo_arrives_already_saved_with_its_image_path() {
    let Waiting { fake, daemon: _daemon, orchestrator, state_home } = orchestrator_with_inbox().await;
    let bytes = pattern(300_000, 7);
    fake.add_file("photo-1", bytes.clone());
    fake.push_photo_file(ChatSpec::private(OWNER_CHAT), owner(), "photo-1", bytes.len() as u64);
    let pushed = orchestrator.wait_for_notifications(1, WAIT).await.unwrap();
    assert_eq!(pushed[0].meta_str("attachment_kind"), Some("photo"));
    let image = PathBuf::from(pushed[0].meta_str("image_path").expect("meta.image_path"));
    assert!(
        image.is_absolute() && image.starts_with(inbox_of(state_home.path(), "orchestrator")),
        "{image:?}"
    );
    assert_eq!(sha256_file(&image), sha256(&bytes));
}

#[tokio::test]
async fn a_photo_that_cannot_be_fetched_is_pushed_anyway_without_an_image_path() {
    let Waiting { fake, daemon, orchestrator, .. } = orchestrator_with_inbox().await;
    // Telegram does not know the file: getFile is refused.
    fake.push_photo_file(ChatSpec::private(OWNER_CHAT), owner(), "photo-gone", 1234);
    let pushed = orchestrator.wait_for_notifications(1, WAIT).await.unwrap();
    assert_eq!(pushed[0].meta_str("attachment_kind"), Some("photo"));
    assert!(pushed[0].meta_str("image_path").is_none());
    assert_eq!(fake.requests_for("getFile").len(), 1, "the photo was asked for");
    assert_eq!(
        state_of(&daemon, &trace_id(&pushed[0])).await,
        switchboard::ledger::EnvelopeState::Pending,
        "the envelope waits for its answer as any other"
    );
}

/// A local Bot API server (`telegram-bot-api --local`, at `telegram.api_url`) answers
/// `getFile` with the file's absolute path on its own disk, and serves no download of it:
/// the daemon reads the file there (a disk or volume it shares with the server).
#[tokio::test]
async fn a_document_through_a_local_bot_api_server_is_read_from_its_disk_byte_for_byte() {
    let Waiting { fake, daemon: _daemon, orchestrator, state_home } = orchestrator_with_inbox().await;
    let working_dir = fake.serve_files_locally();
    let bytes = pattern(2 * 1024 * 1024 + 5, 4);
    fake.add_file("local-doc", bytes.clone());
    let path = fake.file_path_of("local-doc").unwrap();
    assert!(
        path.starts_with(&working_dir.display().to_string()),
        "an absolute path on the server's disk: {path}"
    );
    fake.push_document_file(
        ChatSpec::private(OWNER_CHAT),
        owner(),
        "local-doc",
        "scan.pdf",
        bytes.len() as u64,
    );
    let pushed = orchestrator.wait_for_notifications(1, WAIT).await.unwrap();
    let (is_error, answer) = orchestrator
        .call_tool("download_attachment", json!({"trace_id": trace_id(&pushed[0])}))
        .await
        .unwrap();
    assert!(!is_error, "{answer}");
    let saved = saved_path(&answer);
    assert_eq!(saved.parent(), Some(inbox_of(state_home.path(), "orchestrator").as_path()), "{answer}");
    assert!(saved.file_name().unwrap().to_string_lossy().ends_with("scan.pdf"), "{answer}");
    assert_eq!(sha256_file(&saved), sha256(&bytes));
    assert!(fake.file_downloads().is_empty(), "read from the disk, not over HTTP");
}

#[tokio::test]
async fn a_photo_through_a_local_bot_api_server_arrives_already_saved_with_its_image_path() {
    let Waiting { fake, daemon: _daemon, orchestrator, state_home } = orchestrator_with_inbox().await;
    fake.serve_files_locally();
    let bytes = pattern(300_000, 8);
    fake.add_file("local-photo", bytes.clone());
    fake.push_photo_file(ChatSpec::private(OWNER_CHAT), owner(), "local-photo", bytes.len() as u64);
    let pushed = orchestrator.wait_for_notifications(1, WAIT).await.unwrap();
    let image = PathBuf::from(pushed[0].meta_str("image_path").expect("meta.image_path"));
    assert!(image.starts_with(inbox_of(state_home.path(), "orchestrator")), "{image:?}");
    assert_eq!(sha256_file(&image), sha256(&bytes));
}

/// A local server on another machine names a path this one does not have: the agent and
/// the daemon's log are told which path, and what to do (mount the server's working
/// directory at the same path), without the bot token that path holds.
#[tokio::test]
async fn a_file_a_local_bot_api_server_keeps_where_this_machine_cannot_read_is_refused_with_what_to_do() {
    let Waiting { fake, daemon, orchestrator, state_home } = orchestrator_with_inbox().await;
    let working_dir = fake.serve_files_locally();
    fake.add_file("elsewhere", pattern(1000, 5));
    let path = fake.file_path_of("elsewhere").unwrap();
    std::fs::remove_dir_all(working_dir.join(TEST_TOKEN)).unwrap();
    fake.push_document_file(ChatSpec::private(OWNER_CHAT), owner(), "elsewhere", "notes.txt", 1000);
    let pushed = orchestrator.wait_for_notifications(1, WAIT).await.unwrap();
    let (is_error, text) = orchestrator
        .call_tool("download_attachment", json!({"trace_id": trace_id(&pushed[0])}))
        .await
        .unwrap();
    assert!(is_error, "{text}");
    assert!(text.starts_with("file_unavailable"), "{text}");
    let shown = path.replace(TEST_TOKEN, "<token>");
    assert!(text.contains(&shown), "names the path: {text}");
    assert!(
        text.contains(&format!("mount the server's working directory ({})", working_dir.display())),
        "{text}"
    );
    assert!(!text.contains("try again"), "a retry reads the same missing path: {text}");
    assert!(!text.contains(TEST_TOKEN), "the token stays out of the answer: {text}");
    daemon.wait_for_log(&shown, WAIT).await;
    assert!(!daemon.logs().contains(TEST_TOKEN), "the token stays out of the log");
    assert!(dir_is_empty(&inbox_of(state_home.path(), "orchestrator")));
}

/// The daemon reads only what a local server keeps for this bot: a path outside the
/// directory named by the bot's token, one that climbs out of it, or a link in it to
/// somewhere else is refused, and nothing is read.
#[tokio::test]
async fn a_local_path_outside_the_bots_own_directory_is_refused() {
    let Waiting { fake, daemon: _daemon, orchestrator, state_home } = orchestrator_with_inbox().await;
    let working_dir = fake.serve_files_locally();
    let bot_dir = working_dir.join(TEST_TOKEN).join("documents");
    std::fs::create_dir_all(&bot_dir).unwrap();
    let outside = working_dir.join("secret.txt");
    std::fs::write(&outside, b"not the bot's").unwrap();
    std::os::unix::fs::symlink(&outside, bot_dir.join("link")).unwrap();
    let named = [
        ("outside", outside.display().to_string()),
        ("climbs", format!("{}/../secret.txt", bot_dir.display())),
        ("link", bot_dir.join("link").display().to_string()),
    ];
    for (file_id, path) in &named {
        fake.add_file_at_path(file_id, path, 13);
        fake.push_document_file(ChatSpec::private(OWNER_CHAT), owner(), file_id, "secret.txt", 13);
    }
    let pushed = orchestrator.wait_for_notifications(named.len(), WAIT).await.unwrap();
    for (pushed, (file_id, _)) in pushed.iter().zip(&named) {
        let (is_error, text) = orchestrator
            .call_tool("download_attachment", json!({"trace_id": trace_id(pushed)}))
            .await
            .unwrap();
        assert!(is_error, "{file_id}: {text}");
        assert!(text.contains("outside the bot's own directory"), "{file_id}: {text}");
    }
    assert!(dir_is_empty(&inbox_of(state_home.path(), "orchestrator")));
}

/// A photo whose download is stuck holds the session for its own short wait only: a text
/// that comes while it is stuck reaches the agent within seconds, right after the photo
/// (pushed without `image_path`), not once a long download gives up.
#[tokio::test]
async fn a_photo_stuck_downloading_holds_back_the_next_message_for_seconds_only() {
    let Waiting { fake, daemon: _daemon, orchestrator, .. } = orchestrator_with_inbox().await;
    fake.add_file("photo-stuck", pattern(300_000, 9));
    fake.stall_file_downloads(Duration::from_secs(40));
    fake.push_photo_file(ChatSpec::private(OWNER_CHAT), owner(), "photo-stuck", 300_000);
    eventually(WAIT, "the photo's download started", || !fake.file_downloads().is_empty()).await;
    fake.push_text(ChatSpec::private(OWNER_CHAT), owner(), "did you see the photo?");

    let pushed = orchestrator
        .wait_for_notifications(2, Duration::from_secs(12))
        .await
        .expect("the photo and the text reach the agent within seconds");
    assert_eq!(pushed[0].meta_str("attachment_kind"), Some("photo"), "in the order they came");
    assert!(pushed[0].meta_str("image_path").is_none(), "the stuck photo was given up on");
    assert_eq!(pushed[1].content, "did you see the photo?");
}

// ---- the files of a reply ----

/// A file of `len` patterned bytes named `name` in `dir`, with its digest.
fn file_in(dir: &Path, name: &str, len: usize, seed: u8) -> (String, String) {
    let path = dir.join(name);
    let bytes = pattern(len, seed);
    std::fs::write(&path, &bytes).unwrap();
    (path.display().to_string(), sha256(&bytes))
}

fn staged_files(daemon: &TestDaemon) -> Vec<PathBuf> {
    // The daemon makes the folder as it starts: a missing one means the test looks in the
    // wrong place, and its emptiness would prove nothing.
    let dir = daemon.uploads_dir();
    std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect()
}

/// The message ids a reply's answer names, in order.
fn message_ids_in(text: &str) -> Vec<i32> {
    let digits: Vec<i32> = text
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .filter_map(|s| s.parse().ok())
        .collect();
    digits
}

#[tokio::test]
async fn a_reply_with_two_files_sends_the_text_then_each_file_by_its_kind_byte_for_byte() {
    let OwnerWaiting { fake, daemon, orchestrator, trace } =
        owner_waiting("send me the chart and the report").await;
    let files = tempfile::tempdir().unwrap();
    let (chart, chart_sha) = file_in(files.path(), "chart.png", 200_003, 1);
    let (report, report_sha) = file_in(files.path(), "report.pdf", 1_500_000, 2);

    let (is_error, text) = orchestrator
        .call_tool("reply", json!({"text": "here you are", "trace_id": trace, "files": [chart, report]}))
        .await
        .unwrap();
    assert!(!is_error, "{text}");

    let sent = fake.sent_messages();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].text, "here you are");
    let uploads = fake.uploads();
    assert_eq!(uploads.len(), 2);
    assert_eq!((uploads[0].method.as_str(), uploads[0].field.as_str()), ("sendphoto", "photo"));
    assert_eq!((uploads[1].method.as_str(), uploads[1].field.as_str()), ("senddocument", "document"));
    assert_eq!((uploads[0].len, uploads[0].sha256.as_str()), (200_003, chart_sha.as_str()));
    assert_eq!((uploads[1].len, uploads[1].sha256.as_str()), (1_500_000, report_sha.as_str()));
    assert_eq!(uploads[1].file_name.as_deref(), Some("report.pdf"));
    for upload in &uploads {
        assert_eq!(upload.chat_id, OWNER_CHAT);
        assert_eq!(upload.reply_to_message_id, sent[0].reply_to_message_id, "threaded like the text");
    }
    // The answer names every message the reply made.
    let named = message_ids_in(&text);
    for id in [sent[0].message_id, uploads[0].message_id, uploads[1].message_id] {
        assert!(named.contains(&id), "message {id} is named: {text}");
    }
    let attempts = attempts_of(&daemon, &trace).await;
    let methods: Vec<_> = attempts.iter().map(|a| a.method).collect();
    use switchboard::ledger::{AttemptMethod, AttemptState, EnvelopeState};
    assert_eq!(methods, [AttemptMethod::SendMessage, AttemptMethod::SendPhoto, AttemptMethod::SendDocument]);
    assert!(attempts.iter().all(|a| a.outcome == AttemptState::Sent), "{attempts:?}");
    assert_eq!(state_of(&daemon, &trace).await, EnvelopeState::Acked);
    assert!(staged_files(&daemon).is_empty(), "the staged copies are gone once the reply is done");
}

/// A reply cut off at a file Telegram refused is finished by the same text without that
/// file: nothing more is posted (the text went out already), and the envelope is answered.
#[tokio::test]
async fn a_reply_cut_off_at_a_refused_file_is_finished_by_leaving_the_file_out() {
    use switchboard::fake_bot_api::Fault;
    use switchboard::ledger::EnvelopeState;
    let OwnerWaiting { fake, daemon, orchestrator, trace } = owner_waiting("send me the chart").await;
    let files = tempfile::tempdir().unwrap();
    let (chart, _) = file_in(files.path(), "chart.png", 1_000, 1);
    fake.fail_method(
        "sendPhoto",
        Fault::BadRequest("Bad Request: not enough rights to send photos to the chat".into()),
    );

    let text = "here is the chart";
    let (is_error, answer) = orchestrator
        .call_tool("reply", json!({"text": text, "trace_id": trace, "files": [chart]}))
        .await
        .unwrap();
    assert!(is_error, "{answer}");
    assert!(answer.contains("chart.png"), "names the file that failed: {answer}");
    assert!(answer.contains("leaving chart.png out"), "says how to finish: {answer}");
    assert_eq!(fake.sent_messages().len(), 1, "the text went out");
    assert_eq!(state_of(&daemon, &trace).await, EnvelopeState::Pending);

    let (is_error, answer) =
        orchestrator.call_tool("reply", json!({"text": text, "trace_id": trace})).await.unwrap();
    assert!(!is_error, "{answer}");
    let sent = fake.sent_messages();
    assert_eq!(sent.len(), 1, "the text is not posted twice: {sent:?}");
    assert!(message_ids_in(&answer).contains(&sent[0].message_id), "{answer}");
    assert_eq!(state_of(&daemon, &trace).await, EnvelopeState::Acked);
    assert!(staged_files(&daemon).is_empty());
}

#[tokio::test]
async fn a_missing_file_or_one_over_50_mb_refuses_the_whole_reply_and_sends_nothing() {
    let OwnerWaiting { fake, daemon, orchestrator, trace } = owner_waiting("files please").await;
    let files = tempfile::tempdir().unwrap();
    let (fine, _) = file_in(files.path(), "fine.txt", 100, 1);
    let missing = files.path().join("missing.pdf").display().to_string();
    let huge = files.path().join("huge.mp4");
    // Sparse: 51 MB on paper, nothing on disk or in memory.
    std::fs::File::create(&huge).unwrap().set_len(51 * 1024 * 1024).unwrap();
    let huge = huge.display().to_string();

    for (bad, why) in [(&missing, "does not exist"), (&huge, "50 MB")] {
        let (is_error, text) = orchestrator
            .call_tool("reply", json!({"text": "here", "trace_id": trace, "files": [fine, bad]}))
            .await
            .unwrap();
        assert!(is_error, "{text}");
        assert!(text.contains(bad.as_str()) && text.contains(why), "names the file and why: {text}");
        assert!(text.contains("nothing was sent"), "{text}");
    }
    assert!(fake.sent_messages().is_empty() && fake.uploads().is_empty(), "nothing was sent");
    assert!(attempts_of(&daemon, &trace).await.is_empty(), "nothing was attempted");
    assert!(staged_files(&daemon).is_empty(), "nothing was staged");
    assert_eq!(state_of(&daemon, &trace).await, switchboard::ledger::EnvelopeState::Pending);
}

#[tokio::test]
async fn a_daemon_killed_during_a_multi_file_reply_sends_nothing_again_and_reports_the_unknown_part() {
    use switchboard::fake_bot_api::Fault;
    use switchboard::ledger::{AttemptState, EnvelopeState};
    let OwnerWaiting { fake, mut daemon, orchestrator, trace } = owner_waiting("both files please").await;
    let files = tempfile::tempdir().unwrap();
    let (first, _) = file_in(files.path(), "first.pdf", 300_000, 1);
    let (second, _) = file_in(files.path(), "second.pdf", 300_000, 2);
    // The first upload goes through; Telegram takes the second and never answers.
    fake.fail_method("sendDocument", Fault::Pass);
    fake.fail_method("sendDocument", Fault::RecordThenHang(Duration::MAX));

    let reply = orchestrator
        .call_tool("reply", json!({"text": "two files", "trace_id": trace, "files": [first, second]}));
    let crash = async {
        fake.wait_for_held_upload(WAIT).await.expect("the second upload reaches Telegram");
        daemon.kill9();
        daemon.restart();
    };
    let ((is_error, text), ()) = tokio::join!(async { reply.await.unwrap() }, crash);
    assert!(is_error, "{text}");
    assert!(text.contains("unresolved"), "the unknown part is reported: {text}");
    assert!(text.contains("Do NOT send") || text.contains("do NOT send"), "{text}");

    assert_eq!(fake.sent_messages().len(), 1, "the text went once");
    assert_eq!(fake.uploads().len(), 2, "each file went at most once");
    let outcomes: Vec<_> = attempts_of(&daemon, &trace).await.iter().map(|a| a.outcome).collect();
    assert_eq!(outcomes, [AttemptState::Sent, AttemptState::Sent, AttemptState::Unknown]);
    assert_eq!(state_of(&daemon, &trace).await, EnvelopeState::Unresolved);
    assert!(staged_files(&daemon).is_empty(), "a restart removes what the killed daemon staged");

    // Asking again sends nothing: the envelope waits for an operator.
    let (is_error, text) = orchestrator
        .call_tool("reply", json!({"text": "two files", "trace_id": trace, "files": []}))
        .await
        .unwrap();
    assert!(is_error, "{text}");
    assert_eq!((fake.sent_messages().len(), fake.uploads().len()), (1, 2));
}

#[tokio::test]
async fn an_upload_telegram_never_answers_is_unknown_once_its_bytes_are_sent_and_is_not_retried() {
    use switchboard::fake_bot_api::Fault;
    use switchboard::ledger::{AttemptMethod, AttemptState, EnvelopeState};
    let OwnerWaiting { fake, daemon, orchestrator, trace } = owner_waiting("the clip please").await;
    let files = tempfile::tempdir().unwrap();
    let (clip, clip_sha) = file_in(files.path(), "clip.mp4", 400_000, 4);
    // Telegram takes the video and never answers; send_timeout_secs is 2 in the tests.
    fake.fail_method("sendVideo", Fault::RecordThenHang(Duration::from_secs(30)));

    let (is_error, text) = orchestrator
        .call_tool("reply", json!({"text": "the clip", "trace_id": trace, "files": [clip]}))
        .await
        .unwrap();
    assert!(is_error, "{text}");
    assert!(text.contains("unresolved"), "{text}");
    let uploads = fake.uploads();
    assert_eq!(uploads.len(), 1, "asked once, not again");
    assert_eq!((uploads[0].method.as_str(), uploads[0].sha256.as_str()), ("sendvideo", clip_sha.as_str()));
    let attempts = attempts_of(&daemon, &trace).await;
    let seen: Vec<_> = attempts.iter().map(|a| (a.method, a.outcome)).collect();
    assert_eq!(
        seen,
        [(AttemptMethod::SendMessage, AttemptState::Sent), (AttemptMethod::SendVideo, AttemptState::Unknown)]
    );
    assert_eq!(state_of(&daemon, &trace).await, EnvelopeState::Unresolved);
    assert!(staged_files(&daemon).is_empty());
}

/// Telegram stores a large file before it answers its upload: the answer is awaited a
/// second longer per MiB than `send_timeout_secs` (2 s in the tests), so a 4 MiB video
/// answered 4 s after its last byte is delivered, not left unknown.
#[tokio::test]
async fn a_large_upload_answered_later_than_the_send_timeout_is_delivered() {
    use switchboard::fake_bot_api::Fault;
    use switchboard::ledger::{AttemptMethod, AttemptState, EnvelopeState};
    let OwnerWaiting { fake, daemon, orchestrator, trace } = owner_waiting("the recording please").await;
    let files = tempfile::tempdir().unwrap();
    let (clip, clip_sha) = file_in(files.path(), "recording.mp4", 3 * 1024 * 1024 + 1000, 8);
    fake.fail_method("sendVideo", Fault::RecordThenHang(Duration::from_secs(4)));

    let (is_error, text) = orchestrator
        .call_tool("reply", json!({"text": "the recording", "trace_id": trace, "files": [clip]}))
        .await
        .unwrap();
    assert!(!is_error, "{text}");
    let uploads = fake.uploads();
    assert_eq!(uploads.len(), 1, "asked once");
    assert_eq!((uploads[0].method.as_str(), uploads[0].sha256.as_str()), ("sendvideo", clip_sha.as_str()));
    assert!(message_ids_in(&text).contains(&uploads[0].message_id), "the answer names the video: {text}");
    let attempts = attempts_of(&daemon, &trace).await;
    let seen: Vec<_> = attempts.iter().map(|a| (a.method, a.outcome)).collect();
    assert_eq!(
        seen,
        [(AttemptMethod::SendMessage, AttemptState::Sent), (AttemptMethod::SendVideo, AttemptState::Sent)]
    );
    assert_eq!(state_of(&daemon, &trace).await, EnvelopeState::Acked);
}

/// Telegram refuses some files as the kind their name makes them (a photo too long or too
/// narrow, a voice note to someone who forbids them) with a 400, a confirmed "not sent":
/// the same staged file goes once more as a document, a new attempt, threaded the same,
/// and the reply is delivered.
#[tokio::test]
async fn a_photo_telegram_refuses_goes_once_more_as_a_document_with_the_same_bytes() {
    use switchboard::fake_bot_api::Fault;
    use switchboard::ledger::{AttemptMethod, AttemptState, EnvelopeState};
    let OwnerWaiting { fake, daemon, orchestrator, trace } = owner_waiting("the panorama please").await;
    let files = tempfile::tempdir().unwrap();
    let (panorama, panorama_sha) = file_in(files.path(), "panorama.png", 200_003, 5);
    fake.fail_method("sendPhoto", Fault::BadRequest("Bad Request: PHOTO_INVALID_DIMENSIONS".into()));

    let (is_error, text) = orchestrator
        .call_tool("reply", json!({"text": "here it is", "trace_id": trace, "files": [panorama]}))
        .await
        .unwrap();
    assert!(!is_error, "{text}");
    assert!(text.contains("Reply delivered"), "{text}");

    let sent = fake.sent_messages();
    assert_eq!(sent.len(), 1);
    let refused = fake.requests_for("sendPhoto");
    assert_eq!(refused.len(), 1, "the photo was asked for once, and refused");
    let uploads = fake.uploads();
    assert_eq!(uploads.len(), 1, "one file reached the chat: {uploads:?}");
    let document = &uploads[0];
    assert_eq!((document.method.as_str(), document.field.as_str()), ("senddocument", "document"));
    assert_eq!((document.len, document.sha256.as_str()), (200_003, panorama_sha.as_str()), "byte for byte");
    assert_eq!(document.file_name.as_deref(), Some("panorama.png"));
    assert_eq!(document.chat_id, OWNER_CHAT);
    assert_eq!(document.reply_to_message_id, sent[0].reply_to_message_id, "threaded like the text");
    assert_eq!(
        refused[0]["reply_parameters"],
        fake.requests_for("sendDocument")[0]["reply_parameters"],
        "the document goes with the photo's parameters"
    );
    assert!(message_ids_in(&text).contains(&document.message_id), "the answer names the document: {text}");

    let attempts = attempts_of(&daemon, &trace).await;
    let seen: Vec<_> = attempts.iter().map(|a| (a.method, a.chunk_index, a.outcome)).collect();
    assert_eq!(
        seen,
        [
            (AttemptMethod::SendMessage, 0, AttemptState::Sent),
            (AttemptMethod::SendPhoto, 1, AttemptState::NotSent),
            (AttemptMethod::SendDocument, 1, AttemptState::Sent),
        ]
    );
    let photo_error = attempts[1].error.as_deref().unwrap_or_default();
    assert!(photo_error.contains("PHOTO_INVALID_DIMENSIONS"), "the refusal is kept: {photo_error}");
    assert_eq!(attempts[1].text, attempts[2].text, "the same file, by name, size and digest");
    assert_eq!(attempts[2].telegram_message_id, Some(i64::from(document.message_id)));
    assert_eq!(state_of(&daemon, &trace).await, EnvelopeState::Acked);
    assert!(staged_files(&daemon).is_empty());
}

/// A photo upload whose outcome is unknown (a 5xx: Telegram may have posted it) is never
/// sent again, as a document or otherwise: it may be in the chat already.
#[tokio::test]
async fn a_photo_upload_answered_with_a_5xx_is_unknown_and_does_not_go_again_as_a_document() {
    use switchboard::fake_bot_api::Fault;
    use switchboard::ledger::{AttemptMethod, AttemptState, EnvelopeState};
    let OwnerWaiting { fake, daemon, orchestrator, trace } = owner_waiting("the chart please").await;
    let files = tempfile::tempdir().unwrap();
    let (chart, _) = file_in(files.path(), "chart.png", 100_000, 6);
    fake.fail_method("sendPhoto", Fault::ServerError);

    let (is_error, text) = orchestrator
        .call_tool("reply", json!({"text": "the chart", "trace_id": trace, "files": [chart]}))
        .await
        .unwrap();
    assert!(is_error, "{text}");
    assert!(text.contains("unresolved"), "{text}");
    assert_eq!(fake.requests_for("sendPhoto").len(), 1);
    assert!(fake.requests_for("sendDocument").is_empty(), "no document after an unknown outcome");
    assert!(fake.uploads().is_empty());
    let attempts = attempts_of(&daemon, &trace).await;
    let seen: Vec<_> = attempts.iter().map(|a| (a.method, a.outcome)).collect();
    assert_eq!(
        seen,
        [(AttemptMethod::SendMessage, AttemptState::Sent), (AttemptMethod::SendPhoto, AttemptState::Unknown)]
    );
    assert_eq!(state_of(&daemon, &trace).await, EnvelopeState::Unresolved);
}

#[tokio::test]
async fn a_full_inbox_removes_its_oldest_files_to_make_room() {
    let fake = FakeTelegram::start().await;
    let daemon = TestDaemon::start(&fake.api_url(), "", &default_routes());
    let inbox = tempfile::tempdir().unwrap();
    let orchestrator = plugin_builder(&daemon, "orchestrator")
        .arg("--inbox")
        .arg(inbox.path().display().to_string())
        .arg("--inbox-max-mb")
        .arg("1")
        .start()
        .await
        .unwrap();
    orchestrator
        .wait_for_stderr("channel::forwarder: connected to the switchboard daemon", WAIT)
        .await
        .unwrap();

    let mut saved = Vec::new();
    for (n, seed) in [(1, 1u8), (2, 2)] {
        let id = format!("doc-{n}");
        let bytes = pattern(600 * 1024, seed);
        fake.add_file(&id, bytes.clone());
        fake.push_document_file(
            ChatSpec::private(OWNER_CHAT),
            owner(),
            &id,
            &format!("part{n}.bin"),
            bytes.len() as u64,
        );
        let pushed = orchestrator.wait_for_notifications(n, WAIT).await.unwrap();
        let (is_error, answer) = orchestrator
            .call_tool("download_attachment", json!({"trace_id": trace_id(&pushed[n - 1])}))
            .await
            .unwrap();
        assert!(!is_error, "{answer}");
        let path = saved_path(&answer);
        assert!(path.starts_with(inbox.path()), "--inbox is where files land: {answer}");
        assert_eq!(sha256_file(&path), sha256(&bytes));
        saved.push(path);
    }
    // Two 600 KiB files do not fit in 1 MiB: the older one made room for the newer.
    assert!(!saved[0].exists(), "the oldest file was removed");
    assert!(saved[1].exists());
    let left: Vec<_> = std::fs::read_dir(inbox.path()).unwrap().map(|e| e.unwrap().path()).collect();
    assert_eq!(left, [saved[1].clone()]);
}

/// `[storage] uploads_dir` names where replies' files are staged, for a daemon that cannot
/// write beside its configuration (the Docker image and the systemd unit on PostgreSQL): a
/// file waits there while it is sent, nothing is staged anywhere else, and nothing stays.
#[tokio::test]
async fn replies_files_are_staged_in_the_folder_storage_uploads_dir_names() {
    use switchboard::fake_bot_api::Fault;
    let elsewhere = tempfile::tempdir().unwrap();
    let named = elsewhere.path().join("staged");
    let fake = FakeTelegram::start().await;
    let daemon = TestDaemon::start_with_env(
        &fake.api_url(),
        "",
        &default_routes(),
        &[
            ("SWITCHBOARD__STORAGE__UPLOADS_DIR", named.to_str().unwrap()),
            ("SWITCHBOARD__TELEGRAM__SEND_TIMEOUT_SECS", "30"),
        ],
    );
    let orchestrator = session(&daemon, "orchestrator").await;
    fake.push_text(ChatSpec::private(OWNER_CHAT), owner(), "the notes, please");
    let trace = trace_id(&orchestrator.wait_for_notifications(1, WAIT).await.unwrap()[0]);
    let files = tempfile::tempdir().unwrap();
    let (notes, _) = file_in(files.path(), "notes.pdf", 100_000, 3);
    fake.fail_method("sendDocument", Fault::RecordThenHang(Duration::from_secs(3)));

    let reply = orchestrator.call_tool("reply", json!({"text": "here", "trace_id": trace, "files": [notes]}));
    let staged_while_sent = async {
        fake.wait_for_held_upload(WAIT).await.expect("the upload reaches Telegram");
        std::fs::read_dir(&named).unwrap().count()
    };
    let ((is_error, text), staged_while_sent) =
        tokio::join!(async { reply.await.unwrap() }, staged_while_sent);
    assert!(!is_error, "{text}");
    assert_eq!(staged_while_sent, 1, "the file waited in the folder named");
    assert_eq!(std::fs::read_dir(&named).unwrap().count(), 0, "and is gone once sent");
    assert!(!daemon.uploads_dir().exists(), "nothing was made where the daemon stages by default");
}

/// A reply with files asked for again with the same request id (a client whose connection
/// broke asks again) is told what the first came to, while the first is on its way and
/// after: the first took the uploads, and nothing is sent twice.
#[tokio::test]
async fn a_reply_with_files_asked_again_is_told_what_the_first_came_to() {
    use switchboard::agents::api::wire::ReplyRequest;
    use switchboard::fake_bot_api::Fault;
    let RawOwnerWaiting { fake, daemon: _daemon, client, stream: _stream, envelope } =
        raw_owner_waiting("the notes, please").await;
    let files = tempfile::tempdir().unwrap();
    let (notes, _) = file_in(files.path(), "notes.pdf", 50_000, 4);
    let upload = client.upload_file(Path::new(&notes), "notes.pdf", 50_000).await.unwrap();
    let request = ReplyRequest {
        files: vec![upload.upload_id.clone()],
        ..ReplyRequest::new("here", Some(envelope.trace_id.clone()))
    };
    fake.fail_method("sendDocument", Fault::RecordThenHang(Duration::from_secs(1)));

    let again = async {
        fake.wait_for_held_upload(WAIT).await.expect("the upload reaches Telegram");
        client.reply(&request).await
    };
    let (first, again) = tokio::join!(client.reply(&request), again);
    let first = first.expect("the reply was sent");
    assert_eq!(again.expect("told what the first came to"), first);
    assert_eq!(client.reply(&request).await.expect("the ledger tells it once it is over"), first);
    assert_eq!((fake.sent_messages().len(), fake.uploads().len()), (1, 1), "sent once");
}

/// A file still being written when the plugin checked it (a log, a render finishing) goes
/// whole, as read to its end when it is sent: the receipt and the chat get every byte,
/// not the length the check saw.
#[tokio::test]
async fn a_file_that_grew_after_its_check_goes_whole() {
    use switchboard::agents::api::wire::ReplyRequest;
    let RawOwnerWaiting { fake, daemon, client, stream: _stream, envelope } =
        raw_owner_waiting("the log, please").await;
    let files = tempfile::tempdir().unwrap();
    let (log, log_sha) = file_in(files.path(), "build.log", 50_000, 7);

    // The check saw 30 000 bytes; 20 000 more were written before the upload.
    let upload = client.upload_file(Path::new(&log), "build.log", 30_000).await.unwrap();
    assert_eq!((upload.size, upload.sha256.as_str()), (50_000, log_sha.as_str()), "staged whole");
    let request = ReplyRequest {
        files: vec![upload.upload_id.clone()],
        ..ReplyRequest::new("here", Some(envelope.trace_id.clone()))
    };
    client.reply(&request).await.expect("the reply was sent");
    let uploads = fake.uploads();
    assert_eq!(uploads.len(), 1);
    assert_eq!((uploads[0].len, uploads[0].sha256.as_str()), (50_000, log_sha.as_str()), "sent whole");
    assert!(staged_files(&daemon).is_empty());
}

/// A file that grew past Telegram's 50 MB after its check is refused while the daemon
/// stages it, as one known too large is before: nothing stays staged, nothing is sent.
#[tokio::test]
async fn a_file_that_grew_past_50_mb_after_its_check_is_refused_and_nothing_stays() {
    use switchboard::agents::api::wire::ErrorCode;
    let RawOwnerWaiting { fake, daemon, client, stream: _stream, envelope: _ } =
        raw_owner_waiting("the dump, please").await;
    let files = tempfile::tempdir().unwrap();
    let dump = files.path().join("dump.bin");
    // Sparse: 51 MB on paper, nothing on disk or in memory.
    std::fs::File::create(&dump).unwrap().set_len(51 * 1024 * 1024).unwrap();

    // The check saw 100 bytes.
    let refused = client.upload_file(&dump, "dump.bin", 100).await.expect_err("refused");
    assert_eq!(refused.code(), Some(ErrorCode::FileTooLarge), "{refused}");
    assert!(refused.to_string().contains("50 MB"), "the refusal names the limit: {refused}");
    assert!(staged_files(&daemon).is_empty(), "nothing was staged");
    assert!(fake.uploads().is_empty() && fake.sent_messages().is_empty(), "nothing was sent");
}
