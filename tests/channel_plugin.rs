//! The channel plugin as an agent session meets it: the real `switchboard channel` binary
//! driven by a real MCP client, against a small fake of the daemon's local API that
//! speaks `api::wire`. The daemon-backed end-to-end tests live elsewhere.

mod support;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures::StreamExt as _;
use rmcp::model::ProtocolVersion;
use serde_json::json;
use support::mcp::ChannelClient;
use switchboard::agents::api::wire::{
    AckReceipt, AckRequest, ApiError, DeliveredEnvelope, ErrorCode, PendingList, PendingSummary,
    ReplyReceipt, ReplyRequest, SESSION_HEADER, SessionEvent, ShownReceipt, ShownRequest,
};
use tokio::sync::watch;

const AGENT: &str = "worker";
const SECRET: &str = "worker-channel-secret-42";
const SECRET_ENV: &str = "SB_CHANNEL_TEST_WORKER_SECRET";
const WAIT: Duration = Duration::from_secs(15);

/// How often the fake's session stream sends a heartbeat: often, so a client that went
/// away is noticed (the write fails) within a test's patience.
const FAKE_HEARTBEAT: Duration = Duration::from_millis(50);

const TOPIC_TRACE: &str = "env_topic00001";
const GROUP_TRACE: &str = "env_group00002";

fn topic_envelope() -> DeliveredEnvelope {
    DeliveredEnvelope {
        kind: "message".into(),
        extra: Default::default(),
        trace_id: TOPIC_TRACE.into(),
        content: "deploy status?".into(),
        chat_id: -1_001_234_567_890,
        thread_id: Some(42),
        chat_type: "supergroup".into(),
        chat_title: Some("Ops forum".into()),
        message_id: 310,
        user: "@ann".into(),
        user_id: 4242,
        ts: "2025-03-04T05:06:07Z".into(),
        route: "ops-topic".into(),
        redelivered: false,
        edited: false,
    }
}

fn group_envelope() -> DeliveredEnvelope {
    DeliveredEnvelope {
        kind: "message".into(),
        extra: Default::default(),
        trace_id: GROUP_TRACE.into(),
        content: "is the build green?".into(),
        chat_id: -4_000_111,
        thread_id: None,
        chat_type: "group".into(),
        chat_title: Some("Team".into()),
        message_id: 77,
        user: "Bob Builder".into(),
        user_id: 5151,
        ts: "2025-03-04T05:07:00Z".into(),
        route: "team-group".into(),
        redelivered: true,
        edited: false,
    }
}

const PHOTO_TRACE: &str = "env_photo00003";

/// How long the fake takes to refuse a download: longer than the plugin takes to notice
/// that the stream ended, shorter than a tool call waits for a session.
const LATE_DOWNLOAD: Duration = Duration::from_millis(1500);

fn photo_envelope() -> DeliveredEnvelope {
    let extra = [("attachment_kind", "photo"), ("attachment_file_id", "ph_1"), ("attachment_size", "1000")];
    DeliveredEnvelope {
        trace_id: PHOTO_TRACE.into(),
        content: "look".into(),
        extra: extra.into_iter().map(|(key, value)| (key.to_owned(), value.to_owned())).collect(),
        ..topic_envelope()
    }
}

/// Refuses a download, late (see [`LATE_DOWNLOAD`]).
async fn download_late(State(state): State<Arc<FakeState>>) -> Response {
    state.downloads.send_modify(|asked| *asked += 1);
    tokio::time::sleep(LATE_DOWNLOAD).await;
    refusal(
        StatusCode::BAD_GATEWAY,
        ErrorCode::FileUnavailable,
        "Telegram did not hand the file over",
        vec![],
    )
}

fn summary(envelope: &DeliveredEnvelope) -> PendingSummary {
    PendingSummary {
        trace_id: envelope.trace_id.clone(),
        chat_id: envelope.chat_id,
        thread_id: envelope.thread_id,
        chat_title: envelope.chat_title.clone(),
        user: envelope.user.clone(),
        route: envelope.route.clone(),
        ts: envelope.ts.clone(),
        preview: envelope.content.clone(),
        replying: false,
    }
}

/// What the fake daemon does with a session request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SessionMode {
    /// Hello, both envelopes, then heartbeats until the client goes away.
    Stream,
    /// 409: another session of the agent is connected.
    Conflict,
    /// The first session hands over a photo and ends at once, its token forgotten (as a
    /// daemon that restarted forgets it), while the plugin still fetches the photo (the
    /// fake answers that download late); later sessions are [`SessionMode::Stream`]'s.
    EndsWhileAPhotoIsFetched,
}

struct FakeState {
    mode: Mutex<SessionMode>,
    /// Session requests that passed authentication, whatever their answer.
    session_attempts: Mutex<usize>,
    /// Session streams currently open.
    open_sessions: watch::Sender<usize>,
    replies: Mutex<Vec<ReplyRequest>>,
    acks: Mutex<Vec<AckRequest>>,
    /// Trace ids the plugin confirmed it pushed into the agent session.
    shown: Mutex<Vec<String>>,
    /// Attachment downloads asked for.
    downloads: watch::Sender<usize>,
}

/// A fake of the daemon's local API for the `worker` agent.
struct FakeDaemon {
    addr: SocketAddr,
    state: Arc<FakeState>,
    server: tokio::task::JoinHandle<()>,
}

impl FakeDaemon {
    async fn start(mode: SessionMode) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind the fake daemon");
        Self::start_on(listener, mode).await
    }

    async fn start_on(listener: tokio::net::TcpListener, mode: SessionMode) -> Self {
        let state = Arc::new(FakeState {
            mode: Mutex::new(mode),
            session_attempts: Mutex::new(0),
            open_sessions: watch::channel(0).0,
            replies: Mutex::default(),
            acks: Mutex::default(),
            shown: Mutex::default(),
            downloads: watch::channel(0).0,
        });
        let app = axum::Router::new()
            .route("/v1/agents/{agent}/session", get(session))
            .route("/v1/agents/{agent}/pending", get(pending))
            .route("/v1/agents/{agent}/shown", post(shown))
            .route("/v1/agents/{agent}/reply", post(reply))
            .route("/v1/agents/{agent}/ack", post(ack))
            .route("/v1/agents/{agent}/attachments/{trace_id}", get(download_late))
            .with_state(Arc::clone(&state));
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Self { addr, state, server }
    }

    fn session_attempts(&self) -> usize {
        *self.state.session_attempts.lock().unwrap()
    }

    async fn wait_for_downloads(&self, n: usize) {
        let mut downloads = self.state.downloads.subscribe();
        let reached = tokio::time::timeout(WAIT, downloads.wait_for(|&asked| asked >= n)).await.is_ok();
        assert!(reached, "expected {n} downloads, have {}", *self.state.downloads.borrow());
    }

    async fn wait_for_open_sessions(&self, n: usize) {
        let mut open = self.state.open_sessions.subscribe();
        let reached = tokio::time::timeout(WAIT, open.wait_for(|&open| open == n)).await.is_ok();
        assert!(reached, "expected {n} open sessions, have {}", *self.state.open_sessions.borrow());
    }
}

impl Drop for FakeDaemon {
    fn drop(&mut self) {
        self.server.abort();
    }
}

fn refusal(status: StatusCode, code: ErrorCode, message: &str, candidates: Vec<PendingSummary>) -> Response {
    (status, Json(ApiError { code, message: message.into(), candidates_total: candidates.len(), candidates }))
        .into_response()
}

/// The fake's authentication: the refusal for anything but the right agent with its
/// bearer secret.
fn refuse_credentials(agent: &str, headers: &HeaderMap) -> Option<Response> {
    let expected = format!("Bearer {SECRET}");
    if headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()) != Some(expected.as_str()) {
        return Some(refusal(
            StatusCode::UNAUTHORIZED,
            ErrorCode::Unauthorized,
            "invalid credentials",
            vec![],
        ));
    }
    if agent != AGENT {
        return Some(refusal(
            StatusCode::UNAUTHORIZED,
            ErrorCode::Unauthorized,
            "invalid credentials",
            vec![],
        ));
    }
    None
}

/// The token the fake's sessions hand out in their hello.
const SESSION_TOKEN: &str = "tok_fake_session";

/// The fake's session binding: tool calls must carry the live session's token.
fn refuse_session(headers: &HeaderMap) -> Option<Response> {
    if headers.get(SESSION_HEADER).and_then(|v| v.to_str().ok()) == Some(SESSION_TOKEN) {
        return None;
    }
    Some(refusal(
        StatusCode::CONFLICT,
        ErrorCode::SessionConflict,
        "this plugin's session is not the connected session of agent 'worker'",
        vec![],
    ))
}

/// Counts an open session stream for as long as its body lives.
struct OpenSession(Arc<FakeState>);

impl OpenSession {
    fn new(state: Arc<FakeState>) -> Self {
        state.open_sessions.send_modify(|open| *open += 1);
        Self(state)
    }
}

impl Drop for OpenSession {
    fn drop(&mut self) {
        self.0.open_sessions.send_modify(|open| *open -= 1);
    }
}

fn ndjson(event: &SessionEvent) -> String {
    let mut line = serde_json::to_string(event).unwrap();
    line.push('\n');
    line
}

async fn session(
    State(state): State<Arc<FakeState>>,
    Path(agent): Path<String>,
    headers: HeaderMap,
) -> Response {
    if let Some(refused) = refuse_credentials(&agent, &headers) {
        return refused;
    }
    let attempt = {
        let mut attempts = state.session_attempts.lock().unwrap();
        *attempts += 1;
        *attempts
    };
    let mode = *state.mode.lock().unwrap();
    if mode == SessionMode::EndsWhileAPhotoIsFetched && attempt == 1 {
        let opening = [
            SessionEvent::Hello {
                agent,
                session_id: "ses_ending".into(),
                session_token: "tok_forgotten_session".into(),
                heartbeat_ms: switchboard::agents::api::wire::HEARTBEAT_INTERVAL_SECS * 1000,
            },
            SessionEvent::Envelope(photo_envelope()),
        ]
        .map(|event| Ok::<_, Infallible>(ndjson(&event)));
        let body = Body::from_stream(futures::stream::iter(opening));
        return ([(header::CONTENT_TYPE, "application/x-ndjson")], body).into_response();
    }
    if mode == SessionMode::Conflict {
        return refusal(
            StatusCode::CONFLICT,
            ErrorCode::SessionConflict,
            "agent 'worker' already has a connected session",
            vec![],
        );
    }
    let opening = [
        SessionEvent::Hello {
            agent: agent.clone(),
            session_id: "ses_fake".into(),
            session_token: SESSION_TOKEN.into(),
            heartbeat_ms: switchboard::agents::api::wire::HEARTBEAT_INTERVAL_SECS * 1000,
        },
        SessionEvent::Envelope(topic_envelope()),
        SessionEvent::Envelope(group_envelope()),
    ]
    .map(|event| Ok::<_, Infallible>(ndjson(&event)));
    let guard = OpenSession::new(state);
    let heartbeats = futures::stream::unfold(guard, |guard| async move {
        tokio::time::sleep(FAKE_HEARTBEAT).await;
        Some((Ok(ndjson(&SessionEvent::Heartbeat)), guard))
    });
    let body = Body::from_stream(futures::stream::iter(opening).chain(heartbeats));
    ([(header::CONTENT_TYPE, "application/x-ndjson")], body).into_response()
}

async fn pending(
    State(state): State<Arc<FakeState>>,
    Path(agent): Path<String>,
    headers: HeaderMap,
) -> Response {
    if let Some(refused) = refuse_credentials(&agent, &headers) {
        return refused;
    }
    if let Some(refused) = refuse_session(&headers) {
        return refused;
    }
    // What the plugin confirms as shown rides on its calls (see `DaemonClient::note_shown`).
    if let Some(shown) = headers.get("x-switchboard-shown").and_then(|value| value.to_str().ok()) {
        state.shown.lock().unwrap().extend(shown.split(',').map(str::to_owned));
    }
    Json(PendingList { pending: vec![summary(&topic_envelope()), summary(&group_envelope())], total: 2 })
        .into_response()
}

async fn reply(
    State(state): State<Arc<FakeState>>,
    Path(agent): Path<String>,
    headers: HeaderMap,
    Json(request): Json<ReplyRequest>,
) -> Response {
    if let Some(refused) = refuse_credentials(&agent, &headers).or_else(|| refuse_session(&headers)) {
        return refused;
    }
    state.replies.lock().unwrap().push(request.clone());
    let envelopes = [topic_envelope(), group_envelope()];
    let Some(trace_id) = request.trace_id else {
        return refusal(
            StatusCode::CONFLICT,
            ErrorCode::Ambiguous,
            "2 conversations are waiting for an answer; name one with trace_id",
            envelopes.iter().map(summary).collect(),
        );
    };
    match envelopes.iter().find(|envelope| envelope.trace_id == trace_id) {
        Some(envelope) => Json(ReplyReceipt {
            trace_id,
            chat_id: envelope.chat_id,
            thread_id: envelope.thread_id,
            route: envelope.route.clone(),
            message_ids: vec![9001, 9002],
            answered_handoff: None,
            room_turn: None,
        })
        .into_response(),
        None => refusal(
            StatusCode::NOT_FOUND,
            ErrorCode::UnknownTraceId,
            "no envelope with that trace id",
            vec![],
        ),
    }
}

async fn ack(
    State(state): State<Arc<FakeState>>,
    Path(agent): Path<String>,
    headers: HeaderMap,
    Json(request): Json<AckRequest>,
) -> Response {
    if let Some(refused) = refuse_credentials(&agent, &headers).or_else(|| refuse_session(&headers)) {
        return refused;
    }
    state.acks.lock().unwrap().push(request.clone());
    Json(AckReceipt { trace_id: request.trace_id, state: "acked".into() }).into_response()
}

async fn shown(
    State(state): State<Arc<FakeState>>,
    Path(agent): Path<String>,
    headers: HeaderMap,
    Json(request): Json<ShownRequest>,
) -> Response {
    if let Some(refused) = refuse_credentials(&agent, &headers).or_else(|| refuse_session(&headers)) {
        return refused;
    }
    state.shown.lock().unwrap().push(request.trace_id);
    Json(ShownReceipt { marked: true }).into_response()
}

/// A configuration for the plugin that points at `daemon`.
fn write_config(dir: &tempfile::TempDir, daemon: SocketAddr) -> PathBuf {
    let path = dir.path().join("switchboard.toml");
    let config = format!(
        r#"
[telegram]
token_env = "SB_CHANNEL_TEST_BOT_TOKEN"

[api]
listen = "{daemon}"

[agents.worker]
token_env = "{SECRET_ENV}"

[agents.orchestrator]
token_env = "SB_CHANNEL_TEST_ORCHESTRATOR_SECRET"
"#
    );
    std::fs::write(&path, config).unwrap();
    path
}

async fn start_plugin(config: &std::path::Path, secret: &str) -> ChannelClient {
    ChannelClient::start(config, AGENT, &[(SECRET_ENV, secret)]).await.expect("start the channel plugin")
}

/// A loopback port nothing listens on, held for as long as this lives: bound but not
/// listening, so connections to it are refused and no other process can take it.
struct ReservedPort {
    socket: tokio::net::TcpSocket,
    addr: SocketAddr,
}

impl ReservedPort {
    fn new() -> Self {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = socket.local_addr().unwrap();
        Self { socket, addr }
    }

    /// Starts listening on the held port: a daemon comes up where the plugin looks.
    fn listen(self) -> tokio::net::TcpListener {
        self.socket.listen(1024).unwrap()
    }
}

#[tokio::test]
async fn plugin_declares_a_channel_and_pushes_every_envelope() {
    let daemon = FakeDaemon::start(SessionMode::Stream).await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(&dir, daemon.addr);
    // Ask for a revision newer than Claude Code registers channels on; the plugin must
    // answer with 2025-11-25 at the latest.
    let plugin = ChannelClient::builder(&config, AGENT)
        .env(SECRET_ENV, SECRET)
        .protocol_version(ProtocolVersion::V_2026_07_28)
        .start()
        .await
        .unwrap();

    assert_eq!(plugin.channel_capability(), Some(serde_json::Map::new()), "{:?}", plugin.capabilities());
    assert!(plugin.capabilities().tools.is_some(), "{:?}", plugin.capabilities());
    assert_eq!(plugin.protocol_version(), ProtocolVersion::V_2025_11_25);
    let instructions = plugin.instructions();
    for needle in ["<channel>", "trace_id", "reply", "pending", "ack", "unresolved"] {
        assert!(instructions.contains(needle), "instructions lack {needle}: {instructions}");
    }
    let tools = plugin.list_tools().await.unwrap();
    let mut names: Vec<_> = tools.iter().map(|tool| tool.name.to_string()).collect();
    names.sort();
    assert_eq!(
        names,
        [
            "ack",
            "call_agent",
            "download_attachment",
            "edit_message",
            "pending",
            "react",
            "reply",
            "revise_task",
            "send_to_agent"
        ]
    );
    for tool in &tools {
        assert_eq!(tool.input_schema.get("type"), Some(&json!("object")), "{tool:?}");
    }
    let reply_schema = &tools.iter().find(|tool| tool.name == "reply").unwrap().input_schema;
    assert_eq!(reply_schema.get("required"), Some(&json!(["text"])), "{reply_schema:?}");
    for handoff_tool in ["send_to_agent", "call_agent"] {
        let schema = &tools.iter().find(|tool| tool.name == handoff_tool).unwrap().input_schema;
        let required = schema.get("required").and_then(|r| r.as_array()).cloned().unwrap_or_default();
        assert!(required.contains(&json!("agent")) && required.contains(&json!("text")), "{schema:?}");
        assert_eq!(schema["properties"]["followup"]["type"], json!(["boolean", "null"]), "{schema:?}");
    }

    let received = plugin.wait_for_notifications(2, WAIT).await.unwrap();
    assert_eq!(received.len(), 2, "{received:#?}");
    let (topic, group) = (&received[0], &received[1]);
    assert_eq!(topic.content, "deploy status?");
    assert_eq!(group.content, "is the build green?");
    for notification in &received {
        assert!(notification.meta.values().all(serde_json::Value::is_string), "{notification:#?}");
        for key in ["trace_id", "chat_id", "message_id", "user", "user_id", "ts", "route", "chat_type"] {
            assert!(notification.meta_str(key).is_some(), "{key} missing: {notification:#?}");
        }
    }
    assert_eq!(topic.meta_str("trace_id"), Some(TOPIC_TRACE));
    assert_eq!(topic.meta_str("chat_id"), Some("-1001234567890"));
    assert_eq!(topic.meta_str("thread_id"), Some("42"));
    assert_eq!(topic.meta_str("message_id"), Some("310"));
    assert_eq!(topic.meta_str("user"), Some("@ann"));
    assert_eq!(topic.meta_str("user_id"), Some("4242"));
    assert_eq!(topic.meta_str("ts"), Some("2025-03-04T05:06:07Z"));
    assert_eq!(topic.meta_str("route"), Some("ops-topic"));
    assert_eq!(topic.meta_str("chat_title"), Some("Ops forum"));
    assert_eq!(topic.meta_str("redelivered"), None);
    assert_eq!(group.meta_str("trace_id"), Some(GROUP_TRACE));
    assert_eq!(group.meta_str("thread_id"), None);
    assert_eq!(group.meta_str("redelivered"), Some("true"));

    assert!(plugin.other_notifications().is_empty(), "{:?}", plugin.other_notifications());
    // Each pushed envelope is confirmed as shown with the agent's next call, so an unnamed
    // reply may resolve to it; and only once.
    assert!(daemon.state.shown.lock().unwrap().is_empty(), "no call yet, no confirmation");
    for _ in 0..2 {
        let (is_error, text) = plugin.call_tool("pending", json!({})).await.unwrap();
        assert!(!is_error, "{text}");
    }
    assert_eq!(daemon.state.shown.lock().unwrap().clone(), [TOPIC_TRACE, GROUP_TRACE]);
    assert_eq!(plugin.stdout_violations(), Vec::<String>::new());
    daemon.wait_for_open_sessions(1).await;

    // Closing stdin ends the agent session: the plugin exits cleanly and lets the daemon
    // free the agent's slot.
    let status = plugin.close().await.unwrap();
    assert!(status.success(), "{status:?}");
    daemon.wait_for_open_sessions(0).await;
}

#[tokio::test]
async fn older_protocol_revisions_are_honoured() {
    let daemon = FakeDaemon::start(SessionMode::Stream).await;
    let dir = tempfile::tempdir().unwrap();
    let plugin = ChannelClient::builder(write_config(&dir, daemon.addr), AGENT)
        .env(SECRET_ENV, SECRET)
        .protocol_version(ProtocolVersion::V_2025_06_18)
        .start()
        .await
        .unwrap();
    assert_eq!(plugin.protocol_version(), ProtocolVersion::V_2025_06_18);
    plugin.close().await.unwrap();
}

#[tokio::test]
async fn a_client_that_probes_with_discover_falls_back_to_initialize() {
    let daemon = FakeDaemon::start(SessionMode::Stream).await;
    let dir = tempfile::tempdir().unwrap();
    let plugin = ChannelClient::builder(write_config(&dir, daemon.addr), AGENT)
        .env(SECRET_ENV, SECRET)
        .discover_first()
        .start()
        .await
        .unwrap();
    // Only the `initialize` lifecycle ends with `initialized`, which starts the stream.
    assert_eq!(plugin.protocol_version(), ProtocolVersion::V_2025_11_25);
    plugin.wait_for_notifications(2, WAIT).await.unwrap();
    plugin.close().await.unwrap();
}

#[tokio::test]
async fn closing_stdin_before_the_handshake_exits_cleanly() {
    let nobody = ReservedPort::new();
    let dir = tempfile::tempdir().unwrap();
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_switchboard"))
        .args(["channel", "--agent", AGENT, "--config"])
        .arg(write_config(&dir, nobody.addr))
        .env(SECRET_ENV, SECRET)
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(output.stdout.is_empty(), "{}", String::from_utf8_lossy(&output.stdout));
}

/// `switchboard channel` becomes `switchboard-channel`, installed beside it (as cargo
/// builds them); alone, it says what is missing and where, and runs nothing.
#[tokio::test]
async fn the_plugin_runs_from_its_own_executable_and_without_it_says_what_to_install() {
    let nobody = ReservedPort::new();
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(&dir, nobody.addr);
    let plugin = |bin: PathBuf| {
        tokio::process::Command::new(bin)
            .args(["channel", "--agent", AGENT, "--config"])
            .arg(&config)
            .env(SECRET_ENV, SECRET)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap()
    };

    let beside = plugin(PathBuf::from(env!("CARGO_BIN_EXE_switchboard")));
    let exe = PathBuf::from(format!("/proc/{}/exe", beside.id().unwrap()));
    support::daemon::eventually(WAIT, "the plugin's own executable", || {
        std::fs::read_link(&exe).is_ok_and(|target| target.ends_with("switchboard-channel"))
    })
    .await;
    let ended = finish_without_handshake(beside).await;
    assert!(ended.status.success(), "{}", String::from_utf8_lossy(&ended.stderr));

    let alone = tempfile::tempdir().unwrap();
    let copy = alone.path().join("switchboard");
    std::fs::copy(env!("CARGO_BIN_EXE_switchboard"), &copy).unwrap();
    let ended = finish_without_handshake(plugin(copy.clone())).await;
    let stderr = String::from_utf8_lossy(&ended.stderr);
    assert!(!ended.status.success(), "{stderr}");
    assert!(ended.stdout.is_empty(), "nothing on the MCP stream: {}", String::from_utf8_lossy(&ended.stdout));
    let says = format!("switchboard-channel, which is not installed beside {}", copy.display());
    assert!(stderr.contains(&says) && stderr.contains("install both"), "{stderr}");
}

/// A tool call whose text holds half of a surrogate pair (a model's text cut inside an
/// emoji, which JavaScript writes as a lone `\ud83d` escape) is answered, not dropped
/// unanswered by the MCP SDK's JSON reader until the agent's call times out.
#[tokio::test]
async fn a_tool_call_with_a_lone_surrogate_is_answered() {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let daemon = FakeDaemon::start(SessionMode::Stream).await;
    let dir = tempfile::tempdir().unwrap();
    let mut plugin = tokio::process::Command::new(env!("CARGO_BIN_EXE_switchboard"))
        .args(["channel", "--agent", AGENT, "--config"])
        .arg(write_config(&dir, daemon.addr))
        .env(SECRET_ENV, SECRET)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdin = plugin.stdin.take().unwrap();
    let mut lines = tokio::io::BufReader::new(plugin.stdout.take().unwrap()).lines();
    let mut answer_to = async |id: u64| loop {
        let line =
            tokio::time::timeout(WAIT, lines.next_line()).await.expect("an answer in time").unwrap().unwrap();
        let message: serde_json::Value = serde_json::from_str(&line).unwrap();
        if message["id"] == id {
            return message;
        }
    };
    let initialize = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"raw","version":"0"}}}"#;
    stdin.write_all(format!("{initialize}\n").as_bytes()).await.unwrap();
    answer_to(1).await;
    stdin.write_all(b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}\n").await.unwrap();
    let call = format!(
        r#"{{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{{"name":"reply","arguments":{{"text":"cut \ud83d","trace_id":"{TOPIC_TRACE}"}}}}}}"#
    );
    stdin.write_all(format!("{call}\n").as_bytes()).await.unwrap();
    let answer = answer_to(7).await;
    assert!(answer["result"].is_object(), "{answer}");
    let replies = daemon.state.replies.lock().unwrap().clone();
    assert_eq!(replies.len(), 1);
    assert_eq!(replies[0].text, "cut \u{FFFD}");
}

/// Closes the plugin's stdin before any MCP handshake: it exits on its own.
async fn finish_without_handshake(mut plugin: tokio::process::Child) -> std::process::Output {
    drop(plugin.stdin.take());
    tokio::time::timeout(WAIT, plugin.wait_with_output()).await.expect("the plugin exits").unwrap()
}

#[tokio::test]
async fn reply_without_trace_id_is_refused_with_every_candidate_when_ambiguous() {
    let daemon = FakeDaemon::start(SessionMode::Stream).await;
    let dir = tempfile::tempdir().unwrap();
    let plugin = start_plugin(&write_config(&dir, daemon.addr), SECRET).await;

    let (is_error, text) = plugin.call_tool("reply", json!({ "text": "on it" })).await.unwrap();
    assert!(is_error, "{text}");
    assert!(text.contains("2 conversations are waiting"), "{text}");
    assert!(
        text.contains(TOPIC_TRACE) && text.contains("\"Ops forum\", topic 42") && text.contains("@ann"),
        "{text}"
    );
    assert!(text.contains("deploy status?"), "{text}");
    assert!(
        text.contains(GROUP_TRACE) && text.contains("Bob Builder") && text.contains("is the build green?"),
        "{text}"
    );
    assert!(text.contains("call reply again with trace_id set to one of these"), "{text}");

    let (is_error, text) = plugin
        .call_tool("reply", json!({ "text": "deploy is done", "trace_id": TOPIC_TRACE }))
        .await
        .unwrap();
    assert!(!is_error, "{text}");
    assert!(text.contains(TOPIC_TRACE) && text.contains("chat -1001234567890, topic 42"), "{text}");
    assert!(text.contains("9001, 9002"), "{text}");

    let replies = daemon.state.replies.lock().unwrap().clone();
    let sent: Vec<(&str, Option<&str>)> =
        replies.iter().map(|r| (r.text.as_str(), r.trace_id.as_deref())).collect();
    assert_eq!(sent, [("on it", None), ("deploy is done", Some(TOPIC_TRACE))]);
    // Every request carries its own id, so the daemon can tell a repeat from a new reply.
    assert!(replies.iter().all(|r| r.request_id.starts_with("req_")), "{replies:?}");
    assert_ne!(replies[0].request_id, replies[1].request_id);

    // A malformed trace id never reaches the daemon.
    let (is_error, text) =
        plugin.call_tool("reply", json!({ "text": "x", "trace_id": "the latest" })).await.unwrap();
    assert!(is_error && text.contains("not a trace id"), "{text}");
    assert_eq!(daemon.state.replies.lock().unwrap().len(), 2);
    plugin.close().await.unwrap();
}

#[tokio::test]
async fn pending_lists_and_ack_marks_handled() {
    let daemon = FakeDaemon::start(SessionMode::Stream).await;
    let dir = tempfile::tempdir().unwrap();
    let plugin = start_plugin(&write_config(&dir, daemon.addr), SECRET).await;

    let (is_error, text) = plugin.call_tool("pending", json!({})).await.unwrap();
    assert!(!is_error, "{text}");
    assert!(text.starts_with("2 conversations are waiting"), "{text}");
    assert!(text.contains(TOPIC_TRACE) && text.contains(GROUP_TRACE), "{text}");

    let (is_error, text) = plugin
        .call_tool("ack", json!({ "trace_id": GROUP_TRACE, "note": "answered in person" }))
        .await
        .unwrap();
    assert!(!is_error, "{text}");
    assert!(text.contains(GROUP_TRACE) && text.contains("acked"), "{text}");
    assert_eq!(
        daemon.state.acks.lock().unwrap().clone(),
        [AckRequest { trace_id: GROUP_TRACE.into(), note: Some("answered in person".into()) }]
    );
    plugin.close().await.unwrap();
}

#[tokio::test]
async fn unreachable_daemon_is_reported_and_the_stream_is_retried_until_it_is_back() {
    let port = ReservedPort::new();
    let addr = port.addr;
    let dir = tempfile::tempdir().unwrap();
    let plugin = start_plugin(&write_config(&dir, addr), SECRET).await;

    let expected = format!("switchboard daemon at http://{addr} is not reachable");
    let (is_error, text) = plugin.call_tool("pending", json!({})).await.unwrap();
    assert!(is_error, "{text}");
    assert!(text.contains(&expected) && text.contains("is `switchboard run` running?"), "{text}");
    let (is_error, text) =
        plugin.call_tool("reply", json!({ "text": "hi", "trace_id": TOPIC_TRACE })).await.unwrap();
    assert!(is_error && text.contains(&expected) && text.contains("Nothing was sent"), "{text}");
    let warning = plugin.wait_for_stderr(&expected, WAIT).await.unwrap();
    assert!(warning.contains("WARN"), "{warning}");

    // The daemon comes up on that address: the plugin finds it without being restarted.
    let daemon = FakeDaemon::start_on(port.listen(), SessionMode::Stream).await;
    plugin.wait_for_notifications(2, WAIT).await.unwrap();
    daemon.wait_for_open_sessions(1).await;
    assert_eq!(plugin.stdout_violations(), Vec::<String>::new());
    plugin.close().await.unwrap();
}

/// A daemon down for a while (a restart, an upgrade) leaves the plugin retrying seconds
/// apart. A tool call made as it comes back must not be refused for want of a session
/// (which reads as if another session had taken over): the call cuts the wait short.
#[tokio::test]
async fn a_tool_call_as_the_daemon_comes_back_finds_the_session_without_waiting_out_the_backoff() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let plugin = start_plugin(&write_config(&dir, listener.local_addr().unwrap()), SECRET).await;
    // Each attempt to open the stream is turned away (the connection dropped) until they
    // come seconds apart: the next one is further off than a call waits for a session.
    let mut last = std::time::Instant::now();
    loop {
        let (attempt, _) = tokio::time::timeout(WAIT, listener.accept()).await.unwrap().unwrap();
        drop(attempt);
        let gap = last.elapsed();
        last = std::time::Instant::now();
        if gap >= Duration::from_secs(4) {
            break;
        }
    }

    let daemon = FakeDaemon::start_on(listener, SessionMode::Stream).await;
    let (is_error, text) = plugin.call_tool("pending", json!({})).await.unwrap();
    assert!(!is_error, "{text}");
    daemon.wait_for_open_sessions(1).await;
    plugin.close().await.unwrap();
}

#[tokio::test]
async fn a_second_session_is_refused_and_does_not_fight() {
    let daemon = FakeDaemon::start(SessionMode::Conflict).await;
    let dir = tempfile::tempdir().unwrap();
    let plugin = start_plugin(&write_config(&dir, daemon.addr), SECRET).await;

    let line = plugin
        .wait_for_stderr("another session for agent 'worker' is already connected", WAIT)
        .await
        .unwrap();
    assert!(line.contains("ERROR"), "{line}");
    // It checks again slowly (every 5s), not in a tight loop: a real wait, since what this
    // checks is that no second attempt comes within it.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(daemon.session_attempts(), 1);
    assert!(plugin.notifications().is_empty());
    // Its tools answer, but act on nothing: every call is refused as not the live session.
    for (tool, arguments) in [
        ("pending", json!({})),
        ("reply", json!({ "text": "hi", "trace_id": TOPIC_TRACE })),
        ("ack", json!({ "trace_id": TOPIC_TRACE })),
    ] {
        let (is_error, text) = plugin.call_tool(tool, arguments).await.unwrap();
        assert!(is_error, "{tool}: {text}");
        assert!(text.contains("not the connected session"), "{tool}: {text}");
    }
    assert!(daemon.state.replies.lock().unwrap().is_empty());
    assert!(daemon.state.acks.lock().unwrap().is_empty());
    plugin.close().await.unwrap();
}

#[tokio::test]
async fn a_wrong_secret_is_named_in_tool_errors_and_on_stderr() {
    let daemon = FakeDaemon::start(SessionMode::Stream).await;
    let dir = tempfile::tempdir().unwrap();
    let plugin = start_plugin(&write_config(&dir, daemon.addr), "not-the-secret").await;

    let (is_error, text) = plugin.call_tool("pending", json!({})).await.unwrap();
    assert!(is_error, "{text}");
    assert!(text.contains("invalid credentials") && text.contains(SECRET_ENV), "{text}");
    plugin.wait_for_stderr("refused the secret of agent 'worker'", WAIT).await.unwrap();
    assert!(plugin.notifications().is_empty());
    assert!(!plugin.stderr().contains("not-the-secret"), "the secret leaked into the logs");
    plugin.close().await.unwrap();
}

#[tokio::test]
async fn a_missing_secret_stops_the_plugin_with_a_clear_message() {
    let daemon = FakeDaemon::start(SessionMode::Stream).await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(&dir, daemon.addr);
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_switchboard"))
        .args(["channel", "--agent", AGENT, "--config"])
        .arg(&config)
        .env_remove(SECRET_ENV)
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .unwrap();
    assert!(!output.status.success());
    assert!(output.stdout.is_empty(), "{}", String::from_utf8_lossy(&output.stdout));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains(SECRET_ENV), "{stderr}");
}

/// The stream ends while the plugin still fetches a photo it brought, and the daemon has
/// forgotten that session (it restarted). A tool call made meanwhile waits for the next
/// session and goes through. Before, the stream's session stayed in use until the photo
/// was given up, and the call was refused as not from the connected session.
#[tokio::test]
async fn a_call_made_as_the_stream_ends_waits_for_the_next_session() {
    let daemon = FakeDaemon::start(SessionMode::EndsWhileAPhotoIsFetched).await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(&dir, daemon.addr);
    let plugin = start_plugin(&config, SECRET).await;
    // The first stream has ended; its photo is being fetched.
    daemon.wait_for_downloads(1).await;

    let (is_error, text) = plugin.call_tool("pending", json!({})).await.unwrap();
    assert!(!is_error, "the call went through under the next session: {text}");
    assert!(text.contains(TOPIC_TRACE), "{text}");
    assert_eq!(daemon.session_attempts(), 2);
    // The photo's envelope was pushed all the same, without its photo.
    let pushed = plugin.wait_for_notifications(1, WAIT).await.unwrap();
    assert_eq!(pushed[0].meta_str("trace_id"), Some(PHOTO_TRACE));
}
