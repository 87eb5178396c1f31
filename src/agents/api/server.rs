//! The local API server (axum over loopback HTTP). Thin: it authenticates, parses, and maps
//! the bridge's domain answers and errors to HTTP; every decision lives in the bridge and
//! below.

use axum::body::{Body, Bytes};
use axum::extract::{FromRequestParts, Path, State};
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures::stream;

use super::wire::{
    AckRequest, ApiError, ErrorCode, HandoffRequest, MAX_LISTED, ReplyRequest, SESSION_HEADER, SessionEvent,
    ShownRequest,
};
use crate::agents::bridge::{Bridge, SessionConflict, ToolError, Unauthorized};
use crate::ids::AgentName;
use crate::ledger::StoredEnvelope;
use crate::rules::guard;
use crate::rules::resolver::ResolveError;

pub fn router(bridge: Bridge) -> Router {
    Router::new()
        .route("/v1/agents/{agent}/session", get(session))
        .route("/v1/agents/{agent}/shown", post(shown))
        .route("/v1/agents/{agent}/pending", get(pending))
        .route("/v1/agents/{agent}/reply", post(reply))
        .route("/v1/agents/{agent}/replies/{request_id}", get(reply_outcome))
        .route("/v1/agents/{agent}/ack", post(ack))
        .route("/v1/agents/{agent}/handoffs", post(handoff))
        .with_state(bridge)
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
            | ErrorCode::NoConversation
            | ErrorCode::AlreadyDelegated
            | ErrorCode::AlreadyRunning
            | ErrorCode::DepthLimit
            | ErrorCode::UnknownAgent
            | ErrorCode::SelfHandoff
            | ErrorCode::TurnOver => StatusCode::UNPROCESSABLE_ENTITY,
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
            ToolError::NotSent { .. } => ErrorCode::NotSent,
            ToolError::Unknown { .. } => ErrorCode::Unresolved,
            ToolError::Ledger(_) => ErrorCode::Internal,
            ToolError::NoConversation { .. } => ErrorCode::NoConversation,
            ToolError::TurnOver(_) => ErrorCode::TurnOver,
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
                        candidates: candidates.iter().take(MAX_LISTED).map(StoredEnvelope::summary).collect(),
                        candidates_total: candidates.len(),
                    });
                }
                ResolveError::NothingPending { .. } => ErrorCode::NothingPending,
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
        Ok(Self { agent, session_token: header_text(SESSION_HEADER).map(str::to_owned) })
    }
}

fn bad_request(message: String) -> Failure {
    Failure(ApiError::new(ErrorCode::BadRequest, message))
}

/// A body the JSON extractor could not read answers in our error shape, not axum's text.
fn parse_body<T: serde::de::DeserializeOwned>(body: &Bytes) -> Result<T, Failure> {
    serde_json::from_slice(body).map_err(|e| bad_request(format!("bad request body: {e}")))
}

async fn session(State(bridge): State<Bridge>, caller: Caller) -> Result<Response, Failure> {
    let opened = bridge.open_session(&caller.agent)?;
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

async fn shown(State(bridge): State<Bridge>, caller: Caller, body: Bytes) -> Result<Response, Failure> {
    let request: ShownRequest = parse_body(&body)?;
    Ok(Json(bridge.shown(&caller.agent, caller.token(), request).await?).into_response())
}

async fn pending(State(bridge): State<Bridge>, caller: Caller) -> Result<Response, Failure> {
    Ok(Json(bridge.pending(&caller.agent, caller.token()).await?).into_response())
}

async fn reply(State(bridge): State<Bridge>, caller: Caller, body: Bytes) -> Result<Response, Failure> {
    let request: ReplyRequest = parse_body(&body)?;
    Ok(Json(bridge.reply(&caller.agent, caller.token(), request).await?).into_response())
}

async fn reply_outcome(
    State(bridge): State<Bridge>,
    caller: Caller,
    Path((_, request_id)): Path<(String, String)>,
) -> Result<Response, Failure> {
    Ok(Json(bridge.reply_outcome(&caller.agent, caller.token(), &request_id).await?).into_response())
}

async fn ack(State(bridge): State<Bridge>, caller: Caller, body: Bytes) -> Result<Response, Failure> {
    let request: AckRequest = parse_body(&body)?;
    Ok(Json(bridge.ack(&caller.agent, caller.token(), request).await?).into_response())
}

async fn handoff(State(bridge): State<Bridge>, caller: Caller, body: Bytes) -> Result<Response, Failure> {
    let request: HandoffRequest = parse_body(&body)?;
    Ok(Json(bridge.handoff(&caller.agent, caller.token(), request).await?).into_response())
}
