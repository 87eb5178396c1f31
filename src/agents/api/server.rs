//! The local API server (axum over loopback HTTP). Thin: it authenticates, parses, and maps
//! the bridge's domain answers and errors to HTTP; every decision lives in the bridge and
//! below.
//!
//! Beside the agents' routes it serves the operator's, without credentials and without any
//! message content: `GET /healthz` (alive), `GET /readyz` (ready, or 503 with the reasons)
//! and `GET /metrics` (Prometheus text).

use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, FromRequestParts, Path, Query, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures::stream;
use metrics_exporter_prometheus::PrometheusHandle;

use super::present;
use super::wire::{
    ATTACHMENT_KIND_HEADER, AckRequest, ApiError, AttachmentQuery, ErrorCode, FILE_NAME_HEADER,
    FILE_SIZE_HEADER, HandoffRequest, MAX_LISTED, MAX_SHOWN_IN_HEADER, PLUGIN_HEADER, PermissionRequest,
    ReplyRequest, RevisionRequest, SESSION_HEADER, SHOWN_HEADER, SessionEvent, ShownRequest,
};
use crate::agents::bridge::ResolveError;
use crate::agents::bridge::{AttachmentError, Bridge, SessionConflict, ToolError, Unauthorized, UploadError};
use crate::ids::{AgentName, TraceId};
use crate::ledger::{CountedByState, Ledger, LedgerError};
use crate::operate::health::{Health, Readiness};
use crate::operate::metrics::{self, StateGauges};
use crate::rules::media::DownloadRefusal;
use crate::rules::nul::without_nul;
use crate::rules::{guard, revisions};

/// What the operator's routes read.
#[derive(Clone)]
pub struct Operations {
    pub bridge: Bridge,
    pub ledger: Ledger,
    pub health: Health,
    pub metrics: PrometheusHandle,
}

pub fn router(bridge: Bridge, operations: Operations) -> Router {
    let operator = Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(|State(operations)| readyz(operations)))
        .route("/metrics", get(|State(operations)| metrics_text(operations)))
        .with_state(operations);
    Router::new()
        .route("/v1/agents/{agent}/session", get(session).delete(end_session))
        .route("/v1/agents/{agent}/shown", post(shown))
        .route("/v1/agents/{agent}/pending", get(pending))
        .route("/v1/agents/{agent}/reply", post(reply))
        .route("/v1/agents/{agent}/replies/{request_id}", get(reply_outcome))
        .route("/v1/agents/{agent}/ack", post(ack))
        .route("/v1/agents/{agent}/handoffs", post(handoff))
        .route("/v1/agents/{agent}/revisions", post(revise_task))
        .route("/v1/agents/{agent}/permissions", post(ask_permission))
        .route("/v1/agents/{agent}/permissions/{permission_id}/handed", post(verdict_handed))
        .route("/v1/agents/{agent}/reactions", post(react))
        .route("/v1/agents/{agent}/edits", post(edit_message))
        .route("/v1/agents/{agent}/attachments/{trace_id}", get(download_attachment))
        .route("/v1/agents/{agent}/uploads", post(upload))
        .layer(DefaultBodyLimit::max(BODY_READ_BOUND))
        .with_state(bridge)
        .merge(operator)
}

/// Alive: the process answers HTTP.
pub(crate) async fn healthz() -> Response {
    Json(serde_json::json!({"alive": true})).into_response()
}

/// Ready: 200, or 503 with the reasons (`operate::health`), and the sessions held here.
pub(crate) async fn readyz(operations: Operations) -> Response {
    let mut readiness = operations.health.readiness().await;
    readiness.sessions = operations.bridge.connected_agents();
    readiness_answer(readiness)
}

/// `/readyz`'s answer for `readiness`.
pub(crate) fn readiness_answer(readiness: Readiness) -> Response {
    let status = if readiness.ready { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    (status, Json(readiness)).into_response()
}

/// Prometheus text; the state gauges are read from the ledger and the bridge now.
pub(crate) async fn metrics_text(operations: Operations) -> Response {
    let Operations { bridge, ledger, health, metrics: handle } = operations;
    let ready = health.readiness().await.ready;
    let read = async {
        Ok::<_, LedgerError>(StateGauges {
            envelopes: ledger.count_by_state().await?,
            handoffs: ledger.count_by_state_of(CountedByState::Handoffs).await?,
            cascades: ledger.count_by_state_of(CountedByState::Cascades).await?,
            unreconciled_attempts: ledger.unreconciled_attempts().await?,
            sessions_connected: bridge.connected_agents().len(),
            ready,
            permissions: ledger
                .count_permissions_by_state()
                .await?
                .into_iter()
                .map(|(state, count)| (state.as_str().to_owned(), count))
                .collect(),
        })
    };
    match read.await {
        Ok(gauges) => {
            let text = metrics::render(&handle, &gauges);
            ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text).into_response()
        }
        Err(e) => {
            tracing::warn!(error = %e, "/metrics could not read the ledger");
            let message = format!("the ledger could not be read: {e}");
            Failure(ApiError::new(ErrorCode::Internal, message)).into_response()
        }
    }
}

/// A tool's failure as HTTP, counted in `switchboard_refusals_total` when it is a refusal.
fn tool_failure(tool: &'static str) -> impl Fn(ToolError) -> Failure {
    move |error| {
        let failure = Failure::from(error);
        if let Some(reason) = refusal_reason(failure.0.code) {
            metrics::refusal(tool, reason);
        }
        failure
    }
}

/// The codes that mean "refused, nothing done" (the resolver's, the guard's and the reply
/// limit's), by their wire names; `None` for failures of another kind.
fn refusal_reason(code: ErrorCode) -> Option<&'static str> {
    Some(match code {
        ErrorCode::Ambiguous => "ambiguous",
        ErrorCode::NothingPending => "nothing_pending",
        ErrorCode::UnknownTraceId => "unknown_trace_id",
        ErrorCode::NotAnswerable => "not_answerable",
        ErrorCode::ReplyInProgress => "reply_in_progress",
        ErrorCode::AlreadyAnswered => "already_answered",
        ErrorCode::ReplyTooLong => "reply_too_long",
        ErrorCode::NoConversation => "no_conversation",
        ErrorCode::AlreadyDelegated => "already_delegated",
        ErrorCode::AlreadyRunning => "already_running",
        ErrorCode::DepthLimit => "depth_limit",
        ErrorCode::UnknownAgent => "unknown_agent",
        ErrorCode::SelfHandoff => "self_handoff",
        ErrorCode::TurnOver => "turn_over",
        ErrorCode::Superseded => "superseded",
        ErrorCode::Paused => "paused",
        ErrorCode::Cancelled => "cancelled",
        ErrorCode::NoRevision => "no_revision",
        ErrorCode::NoSuchAttachment => "no_such_attachment",
        ErrorCode::FileTooLarge => "file_too_large",
        ErrorCode::UnknownUpload => "unknown_upload",
        ErrorCode::Unauthorized
        | ErrorCode::SessionConflict
        | ErrorCode::BadRequest
        | ErrorCode::UnknownRequest
        | ErrorCode::NotSent
        | ErrorCode::Unresolved
        | ErrorCode::FileUnavailable
        | ErrorCode::Internal => return None,
    })
}

/// An [`ApiError`] with the HTTP status that matches its code.
struct Failure(ApiError);

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        let status = match self.0.code {
            ErrorCode::Unauthorized => StatusCode::UNAUTHORIZED,
            ErrorCode::SessionConflict => StatusCode::CONFLICT,
            ErrorCode::BadRequest | ErrorCode::ReplyTooLong => StatusCode::BAD_REQUEST,
            ErrorCode::UnknownRequest => StatusCode::NOT_FOUND,
            ErrorCode::Ambiguous
            | ErrorCode::NothingPending
            | ErrorCode::UnknownTraceId
            | ErrorCode::NotAnswerable
            | ErrorCode::ReplyInProgress
            | ErrorCode::AlreadyAnswered
            | ErrorCode::NoConversation
            | ErrorCode::AlreadyDelegated
            | ErrorCode::AlreadyRunning
            | ErrorCode::DepthLimit
            | ErrorCode::UnknownAgent
            | ErrorCode::SelfHandoff
            | ErrorCode::TurnOver
            | ErrorCode::NoRevision
            | ErrorCode::NoSuchAttachment
            | ErrorCode::UnknownUpload => StatusCode::UNPROCESSABLE_ENTITY,
            ErrorCode::FileTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ErrorCode::FileUnavailable => StatusCode::BAD_GATEWAY,
            ErrorCode::Superseded | ErrorCode::Paused | ErrorCode::Cancelled => {
                StatusCode::UNPROCESSABLE_ENTITY
            }
            ErrorCode::NotSent => StatusCode::BAD_GATEWAY,
            ErrorCode::Unresolved => StatusCode::GATEWAY_TIMEOUT,
            ErrorCode::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        };
        (status, Json(self.0)).into_response()
    }
}

impl From<ToolError> for Failure {
    fn from(error: ToolError) -> Self {
        let message = error.to_string();
        let code = match &error {
            ToolError::Invalid(_) => ErrorCode::BadRequest,
            ToolError::NotLiveSession { .. } => ErrorCode::SessionConflict,
            ToolError::TooLong { .. } => ErrorCode::ReplyTooLong,
            ToolError::UnknownRequest(_) => ErrorCode::UnknownRequest,
            ToolError::NotSent { .. } | ToolError::ActionNotSent(_) => ErrorCode::NotSent,
            ToolError::Unknown { .. } | ToolError::ActionUnknown(_) => ErrorCode::Unresolved,
            ToolError::Ledger(_) => ErrorCode::Internal,
            ToolError::UnknownUpload(_) => ErrorCode::UnknownUpload,
            ToolError::NoConversation { .. } => ErrorCode::NoConversation,
            ToolError::TurnOver(_) => ErrorCode::TurnOver,
            ToolError::AlreadyAnswered(_) => ErrorCode::AlreadyAnswered,
            ToolError::NoRevision(_) => ErrorCode::NoRevision,
            ToolError::Task(refusal)
            | ToolError::TaskCutOff { refusal, .. }
            | ToolError::LateResult(refusal) => match refusal {
                revisions::Refusal::Superseded { .. } => ErrorCode::Superseded,
                revisions::Refusal::Paused { .. } => ErrorCode::Paused,
                revisions::Refusal::Cancelled { .. } => ErrorCode::Cancelled,
            },
            ToolError::Handoff(refusal) => match refusal {
                guard::Refusal::Invalid(_) | guard::Refusal::EmptyText => ErrorCode::BadRequest,
                guard::Refusal::SelfHandoff { .. } => ErrorCode::SelfHandoff,
                guard::Refusal::UnknownAgent { .. } => ErrorCode::UnknownAgent,
                guard::Refusal::DepthLimit { .. } => ErrorCode::DepthLimit,
                guard::Refusal::AlreadyDelegated { .. } => ErrorCode::AlreadyDelegated,
                guard::Refusal::AlreadyRunning { .. } => ErrorCode::AlreadyRunning,
            },
            ToolError::Refused(refusal) => match refusal {
                ResolveError::Ambiguous { candidates } => {
                    return Self(ApiError {
                        code: ErrorCode::Ambiguous,
                        message,
                        candidates: candidates.iter().take(MAX_LISTED).map(present::summary).collect(),
                        candidates_total: candidates.len(),
                    });
                }
                ResolveError::NothingPending { .. } | ResolveError::NothingPendingAt { .. } => {
                    ErrorCode::NothingPending
                }
                // trace_id and chat_id/reply_to contradict each other: the request is at fault.
                ResolveError::Elsewhere { .. } => ErrorCode::BadRequest,
                ResolveError::UnknownTraceId { .. } => ErrorCode::UnknownTraceId,
                ResolveError::NotAnswerable { .. } | ResolveError::AwaitingReconciliation { .. } => {
                    ErrorCode::NotAnswerable
                }
                ResolveError::ReplyInProgress { .. } => ErrorCode::ReplyInProgress,
            },
        };
        Self(ApiError::new(code, message))
    }
}

impl From<AttachmentError> for Failure {
    fn from(error: AttachmentError) -> Self {
        let message = error.to_string();
        let code = match error {
            AttachmentError::Tool(error) => return Self::from(error),
            AttachmentError::Refused(
                DownloadRefusal::NoAttachment | DownloadRefusal::NotOfThisEnvelope { .. },
            ) => ErrorCode::NoSuchAttachment,
            AttachmentError::Refused(
                DownloadRefusal::TooLarge { .. } | DownloadRefusal::AboveAsked { .. },
            ) => ErrorCode::FileTooLarge,
            AttachmentError::Unavailable(_) | AttachmentError::Unreadable(_) => ErrorCode::FileUnavailable,
        };
        Self(ApiError::new(code, message))
    }
}

impl From<UploadError> for Failure {
    fn from(error: UploadError) -> Self {
        let message = error.to_string();
        let code = match error {
            UploadError::Tool(error) => return Self::from(error),
            UploadError::TooLarge { .. } | UploadError::StagingFull => ErrorCode::FileTooLarge,
            UploadError::Unknown(_) => ErrorCode::UnknownUpload,
            UploadError::Transfer(_) => ErrorCode::BadRequest,
            UploadError::Io(_) => ErrorCode::Internal,
        };
        Self(ApiError::new(code, message))
    }
}

impl From<SessionConflict> for Failure {
    fn from(conflict: SessionConflict) -> Self {
        Self(ApiError::new(ErrorCode::SessionConflict, conflict.to_string()))
    }
}

/// The agent a request speaks for, proven by its bearer secret, and the session token it
/// presents. As an extractor it keeps authentication out of the handlers: a handler that
/// takes it cannot run unauthenticated.
struct Caller {
    agent: AgentName,
    session_token: Option<String>,
}

impl Caller {
    fn token(&self) -> Option<&str> {
        self.session_token.as_deref()
    }
}

impl FromRequestParts<Bridge> for Caller {
    type Rejection = Failure;

    async fn from_request_parts(parts: &mut Parts, bridge: &Bridge) -> Result<Self, Self::Rejection> {
        let Path(params) = Path::<Vec<(String, String)>>::from_request_parts(parts, bridge)
            .await
            .map_err(|e| bad_request(e.to_string()))?;
        let agent =
            params.into_iter().find(|(name, _)| name == "agent").map(|(_, value)| value).unwrap_or_default();
        let header_text = |name: &str| parts.headers.get(name).and_then(|value| value.to_str().ok());
        let bearer =
            header_text(header::AUTHORIZATION.as_str()).and_then(|value| value.strip_prefix("Bearer "));
        let agent = bridge.authenticate(&agent, bearer).map_err(|Unauthorized| {
            tracing::warn!(agent, "local API request refused: bad credentials");
            Failure(ApiError::new(ErrorCode::Unauthorized, Unauthorized.to_string()))
        })?;
        let caller = Self { agent, session_token: header_text(SESSION_HEADER).map(str::to_owned) };
        // Envelopes the plugin pushed since its last call are marked shown before this call
        // is acted on (it may be the unnamed reply that depends on them). A session
        // conflict is left for the handler to report in its own words.
        if let Some(names) = header_text(SHOWN_HEADER) {
            let shown = parse_shown_header(names)?;
            let _ = bridge.mark_shown(&caller.agent, caller.token(), &shown);
        }
        Ok(caller)
    }
}

/// The trace ids of a [`SHOWN_HEADER`]: comma-separated, at most [`MAX_SHOWN_IN_HEADER`].
fn parse_shown_header(names: &str) -> Result<Vec<TraceId>, Failure> {
    let names: Vec<&str> = names.split(',').collect();
    if names.len() > MAX_SHOWN_IN_HEADER {
        return Err(bad_request(format!(
            "{SHOWN_HEADER} names {} envelopes; at most {MAX_SHOWN_IN_HEADER} are read",
            names.len()
        )));
    }
    names
        .into_iter()
        .map(TraceId::parse)
        .collect::<Result<_, _>>()
        .map_err(|e| bad_request(format!("{SHOWN_HEADER}: {e}")))
}

fn bad_request(message: String) -> Failure {
    Failure(ApiError::new(ErrorCode::BadRequest, message))
}

/// The largest JSON body a tool's request may have. No request comes near it: texts are
/// bounded by `outbound.max_reply_parts` far below it, and files travel as uploads.
const BODY_LIMIT: usize = 2 * 1024 * 1024;

/// How much of a body is read before refusing it. A body over [`BODY_LIMIT`] but within
/// this is read to its end and then refused, so a client still writing it reads the
/// refusal rather than a connection reset under its write (a broken pipe it could not tell
/// from a daemon gone mid-request). Beyond this the connection is cut.
const BODY_READ_BOUND: usize = 8 * BODY_LIMIT;

/// A request's body as it came, or why it could not be read.
type JsonBody = Result<Bytes, BytesRejection>;

/// A body that could not be read (over the size limit, cut off) or is not the JSON asked
/// for answers in our error shape, not axum's text: a client reads it as a refusal, with
/// nothing done.
fn parse_body<T: serde::de::DeserializeOwned>(body: JsonBody) -> Result<T, Failure> {
    let body = body.map_err(|rejection| {
        bad_request(format!(
            "the request body could not be read: {}; nothing was done",
            rejection.body_text()
        ))
    })?;
    if body.len() > BODY_LIMIT {
        return Err(bad_request(format!(
            "the request body is {} bytes, over the limit of {BODY_LIMIT}; nothing was done",
            body.len()
        )));
    }
    // An agent's text holding U+0000 (which PostgreSQL refuses) is stored and sent as it
    // would be from Telegram: the character replaced (`rules::nul`).
    let parsed = match std::str::from_utf8(&body) {
        Ok(text) => serde_json::from_str(&without_nul(text)),
        Err(_) => serde_json::from_slice(&body),
    };
    parsed.map_err(|e| bad_request(format!("bad request body: {e}")))
}

async fn session(
    State(bridge): State<Bridge>,
    caller: Caller,
    headers: HeaderMap,
) -> Result<Response, Failure> {
    let plugin = headers.get(PLUGIN_HEADER).and_then(|value| value.to_str().ok()).map(str::to_owned);
    let opened = bridge.open_session(&caller.agent, plugin)?;
    // One JSON document per line. When the client goes away hyper drops this body, the
    // receiver with it, and the session task notices and frees the agent's slot.
    let lines = stream::unfold(opened.events, |mut events| async move {
        let event: SessionEvent = events.recv().await?;
        let mut line = serde_json::to_vec(&event).expect("session events always serialize");
        line.push(b'\n');
        Some((Ok::<_, std::convert::Infallible>(Bytes::from(line)), events))
    });
    Ok(([(header::CONTENT_TYPE, "application/x-ndjson")], Body::from_stream(lines)).into_response())
}

/// The plugin is leaving (its agent session ended): the agent is free for the next one at
/// once, rather than kept for this plugin as after a stream that broke.
async fn end_session(State(bridge): State<Bridge>, caller: Caller) -> Result<Response, Failure> {
    bridge.end_session(&caller.agent, caller.token())?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn shown(State(bridge): State<Bridge>, caller: Caller, body: JsonBody) -> Result<Response, Failure> {
    let request: ShownRequest = parse_body(body)?;
    Ok(Json(bridge.shown(&caller.agent, caller.token(), request)?).into_response())
}

async fn pending(State(bridge): State<Bridge>, caller: Caller) -> Result<Response, Failure> {
    Ok(Json(bridge.pending(&caller.agent, caller.token()).await?).into_response())
}

async fn reply(State(bridge): State<Bridge>, caller: Caller, body: JsonBody) -> Result<Response, Failure> {
    let request: ReplyRequest = parse_body(body)?;
    let receipt =
        bridge.reply(&caller.agent, caller.token(), request).await.map_err(tool_failure("reply"))?;
    Ok(Json(receipt).into_response())
}

async fn reply_outcome(
    State(bridge): State<Bridge>,
    caller: Caller,
    Path((_, request_id)): Path<(String, String)>,
) -> Result<Response, Failure> {
    Ok(Json(bridge.reply_outcome(&caller.agent, caller.token(), &request_id).await?).into_response())
}

async fn ack(State(bridge): State<Bridge>, caller: Caller, body: JsonBody) -> Result<Response, Failure> {
    let request: AckRequest = parse_body(body)?;
    let receipt = bridge.ack(&caller.agent, caller.token(), request).await.map_err(tool_failure("ack"))?;
    Ok(Json(receipt).into_response())
}

async fn handoff(State(bridge): State<Bridge>, caller: Caller, body: JsonBody) -> Result<Response, Failure> {
    let request: HandoffRequest = parse_body(body)?;
    let receipt =
        bridge.handoff(&caller.agent, caller.token(), request).await.map_err(tool_failure("handoff"))?;
    Ok(Json(receipt).into_response())
}

async fn revise_task(
    State(bridge): State<Bridge>,
    caller: Caller,
    body: JsonBody,
) -> Result<Response, Failure> {
    let request: RevisionRequest = parse_body(body)?;
    let receipt = bridge
        .revise_task(&caller.agent, caller.token(), request)
        .await
        .map_err(tool_failure("revise_task"))?;
    Ok(Json(receipt).into_response())
}

async fn react(State(bridge): State<Bridge>, caller: Caller, body: JsonBody) -> Result<Response, Failure> {
    let request: super::wire::ReactRequest = parse_body(body)?;
    let receipt =
        bridge.react(&caller.agent, caller.token(), request).await.map_err(tool_failure("react"))?;
    Ok(Json(receipt).into_response())
}

async fn edit_message(
    State(bridge): State<Bridge>,
    caller: Caller,
    body: JsonBody,
) -> Result<Response, Failure> {
    let request: super::wire::EditRequest = parse_body(body)?;
    let receipt = bridge
        .edit_message(&caller.agent, caller.token(), request)
        .await
        .map_err(tool_failure("edit_message"))?;
    Ok(Json(receipt).into_response())
}

async fn ask_permission(
    State(bridge): State<Bridge>,
    caller: Caller,
    body: JsonBody,
) -> Result<Response, Failure> {
    let request: PermissionRequest = parse_body(body)?;
    let receipt = bridge.ask_permission(&caller.agent, caller.token(), request).await?;
    Ok(Json(receipt).into_response())
}

async fn verdict_handed(
    State(bridge): State<Bridge>,
    caller: Caller,
    Path((_, permission_id)): Path<(String, String)>,
) -> Result<Response, Failure> {
    bridge.verdict_handed(&caller.agent, caller.token(), &permission_id).await?;
    Ok(Json(serde_json::json!({})).into_response())
}

/// Streams an attachment from Telegram to the plugin as it arrives: the daemon keeps none
/// of it. A refusal comes before the first byte, as an error body.
async fn download_attachment(
    State(bridge): State<Bridge>,
    caller: Caller,
    Path((_, trace_id)): Path<(String, String)>,
    Query(query): Query<AttachmentQuery>,
) -> Result<Response, Failure> {
    let download = bridge
        .open_attachment(&caller.agent, caller.token(), &trace_id, query.file_id.as_deref(), query.max_bytes)
        .await
        .map_err(|error| {
            let failure = Failure::from(error);
            if let Some(reason) = refusal_reason(failure.0.code) {
                metrics::refusal("download_attachment", reason);
            }
            failure
        })?;
    let mut response = Body::from_stream(download.bytes).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, header::HeaderValue::from_static("application/octet-stream"));
    if let Some(size) = download.size {
        headers.insert(header::CONTENT_LENGTH, size.into());
    }
    let encoded = percent_encoding::utf8_percent_encode(&download.name, percent_encoding::NON_ALPHANUMERIC);
    if let Ok(name) = header::HeaderValue::from_str(&encoded.to_string()) {
        headers.insert(FILE_NAME_HEADER, name);
    }
    if let Ok(kind) = header::HeaderValue::from_str(&download.kind) {
        headers.insert(ATTACHMENT_KIND_HEADER, kind);
    }
    Ok(response)
}

/// Stages one file of a reply to come, streamed to disk as it arrives (the daemon holds no
/// file in memory); its name comes in [`FILE_NAME_HEADER`].
async fn upload(
    State(bridge): State<Bridge>,
    caller: Caller,
    headers: header::HeaderMap,
    body: Body,
) -> Result<Response, Failure> {
    let name = headers
        .get(FILE_NAME_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(|encoded| percent_encoding::percent_decode_str(encoded).decode_utf8_lossy().into_owned())
        .ok_or_else(|| bad_request(format!("an upload names its file in the {FILE_NAME_HEADER} header")))?;
    // The size the plugin's check saw (a plugin from before the header sent it as the
    // length): only for the early refusal and the staging budget. What is staged is the
    // body as it arrives, bounded by Telegram's limit as it is written.
    let announced =
        size_in(&headers, FILE_SIZE_HEADER).or_else(|| size_in(&headers, header::CONTENT_LENGTH.as_str()));
    let receipt = bridge
        .stage_upload(&caller.agent, caller.token(), &name, announced, body.into_data_stream())
        .await
        .map_err(Failure::from)?;
    Ok(Json(receipt).into_response())
}

/// A size a header holds, when it holds one.
fn size_in(headers: &header::HeaderMap, name: &str) -> Option<u64> {
    headers.get(name).and_then(|value| value.to_str().ok()?.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusal_reasons_are_the_wire_codes() {
        for code in [ErrorCode::Ambiguous, ErrorCode::AlreadyDelegated, ErrorCode::ReplyTooLong] {
            let wire = serde_json::to_value(code).unwrap();
            assert_eq!(refusal_reason(code), wire.as_str());
        }
        assert_eq!(refusal_reason(ErrorCode::Internal), None);
    }

    /// A body over the size limit, and one that is not the JSON asked for, are refused in
    /// the API's own shape. Driven in process: over a socket the client may still be
    /// writing when the server answers and closes, and see a broken pipe instead.
    #[tokio::test]
    async fn a_body_that_cannot_be_read_is_a_bad_request_in_the_apis_shape() {
        use tower::ServiceExt;
        let app = Router::new().route(
            "/",
            post(|body: JsonBody| async move { parse_body::<ReplyRequest>(body).map(|_| StatusCode::OK) }),
        );
        let huge = serde_json::json!({"text": "x".repeat(3 * 1024 * 1024), "request_id": "req_huge"});
        for body in [serde_json::to_vec(&huge).unwrap(), b"{".to_vec()] {
            let request = axum::http::Request::post("/").body(Body::from(body)).unwrap();
            let response = app.clone().oneshot(request).await.unwrap();
            assert_eq!(response.status(), StatusCode::BAD_REQUEST);
            let bytes = axum::body::to_bytes(response.into_body(), 64 * 1024).await.unwrap();
            let error: ApiError = serde_json::from_slice(&bytes).expect("the API's error shape");
            assert_eq!(error.code, ErrorCode::BadRequest, "{}", error.message);
        }
    }
}
