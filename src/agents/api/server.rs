//! The local API server (axum over loopback HTTP). Thin: it authenticates, parses and maps
//! the bridge's answers to HTTP; every decision lives in the bridge and below.

use axum::body::{Body, Bytes};
use axum::extract::{FromRequestParts, Path, State};
use axum::http::request::Parts;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures::stream;

use super::wire::{AckRequest, ApiError, ErrorCode, ReplyRequest, SessionEvent};
use crate::agents::bridge::Bridge;
use crate::ids::AgentName;

pub fn router(bridge: Bridge) -> Router {
    Router::new()
        .route("/v1/agents/{agent}/session", get(session))
        .route("/v1/agents/{agent}/pending", get(pending))
        .route("/v1/agents/{agent}/reply", post(reply))
        .route("/v1/agents/{agent}/ack", post(ack))
        .with_state(bridge)
}

/// An [`ApiError`] with the HTTP status that matches its code.
struct Failure(ApiError);

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        let status = match self.0.code {
            ErrorCode::Unauthorized => StatusCode::UNAUTHORIZED,
            ErrorCode::SessionConflict => StatusCode::CONFLICT,
            ErrorCode::BadRequest => StatusCode::BAD_REQUEST,
            ErrorCode::Ambiguous
            | ErrorCode::NothingPending
            | ErrorCode::UnknownTraceId
            | ErrorCode::NotYours
            | ErrorCode::NotAnswerable => StatusCode::UNPROCESSABLE_ENTITY,
            ErrorCode::NotSent => StatusCode::BAD_GATEWAY,
            ErrorCode::Unresolved => StatusCode::GATEWAY_TIMEOUT,
            ErrorCode::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        };
        (status, Json(self.0)).into_response()
    }
}

impl From<ApiError> for Failure {
    fn from(e: ApiError) -> Self {
        Self(e)
    }
}

/// The agent a request speaks for, proven by its bearer secret. As an extractor it keeps
/// authentication out of the handlers: a handler that takes it cannot run unauthenticated.
struct Authenticated(AgentName);

impl FromRequestParts<Bridge> for Authenticated {
    type Rejection = Failure;

    async fn from_request_parts(parts: &mut Parts, bridge: &Bridge) -> Result<Self, Self::Rejection> {
        let Path(agent) = Path::<String>::from_request_parts(parts, bridge).await.map_err(|e| {
            Failure(ApiError { code: ErrorCode::BadRequest, message: e.to_string(), candidates: vec![] })
        })?;
        let bearer = parts
            .headers
            .get(header::AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.strip_prefix("Bearer "));
        bridge.authenticate(&agent, bearer).map(Authenticated).map_err(|e| {
            tracing::warn!(agent, "local API request refused: bad credentials");
            Failure(e)
        })
    }
}

/// A body the JSON extractor could not read answers in our error shape, not axum's text.
fn parse_body<T: serde::de::DeserializeOwned>(body: &Bytes) -> Result<T, Failure> {
    serde_json::from_slice(body).map_err(|e| {
        Failure(ApiError {
            code: ErrorCode::BadRequest,
            message: format!("bad request body: {e}"),
            candidates: vec![],
        })
    })
}

async fn session(
    State(bridge): State<Bridge>,
    Authenticated(agent): Authenticated,
) -> Result<Response, Failure> {
    let events = bridge.open_session(&agent)?;
    // One JSON document per line. When the client goes away hyper drops this body, the
    // receiver with it, and the session task notices and frees the agent's slot.
    let lines = stream::unfold(events, |mut events| async move {
        let event: SessionEvent = events.recv().await?;
        let mut line = serde_json::to_vec(&event).expect("session events always serialize");
        line.push(b'\n');
        Some((Ok::<_, std::convert::Infallible>(Bytes::from(line)), events))
    });
    Ok(([(header::CONTENT_TYPE, "application/x-ndjson")], Body::from_stream(lines)).into_response())
}

async fn pending(
    State(bridge): State<Bridge>,
    Authenticated(agent): Authenticated,
) -> Result<Response, Failure> {
    Ok(Json(bridge.pending(&agent).await?).into_response())
}

async fn reply(
    State(bridge): State<Bridge>,
    Authenticated(agent): Authenticated,
    body: Bytes,
) -> Result<Response, Failure> {
    let request: ReplyRequest = parse_body(&body)?;
    Ok(Json(bridge.reply(&agent, request).await?).into_response())
}

async fn ack(
    State(bridge): State<Bridge>,
    Authenticated(agent): Authenticated,
    body: Bytes,
) -> Result<Response, Failure> {
    let request: AckRequest = parse_body(&body)?;
    Ok(Json(bridge.ack(&agent, request).await?).into_response())
}
