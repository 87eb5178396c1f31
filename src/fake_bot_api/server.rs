//! The fake's HTTP side: the Bot API's requests parsed, performed on the state, and
//! answered in Telegram's shapes.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::body::Bytes;
use axum::extract::Request;
use axum::extract::State as AxumState;
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};
use tokio::time::Instant;

use super::state::Shared;
use super::{
    BOT_FIRST_NAME, BOT_USER_ID, BOT_USERNAME, CONFLICT_DESCRIPTION, ChatKind, Fault, MAX_MESSAGE_UTF16_LEN,
    SentMessage, TEST_TOKEN,
};

// ---------------------------------------------------------------------------
// HTTP handling
// ---------------------------------------------------------------------------

/// The largest body of a request that is not an upload, as before uploads existed.
const MAX_PLAIN_BODY_BYTES: usize = 2 * 1024 * 1024;

/// What every request reaches first: file downloads (`/file/bot<token>/…`) and multipart
/// uploads go to `files`; the rest to [`handle_request`].
pub(super) async fn route_request(AxumState(shared): AxumState<Arc<Shared>>, request: Request) -> Response {
    if let Some(rest) = request.uri().path().strip_prefix("/file/bot") {
        return super::files::download(&shared, rest).await;
    }
    let content_type = request.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok());
    if let Some((token, method)) = split_path(request.uri().path()) {
        let method = method.to_ascii_lowercase();
        // A wrong token is refused by `handle_request`, as for any method.
        if token == TEST_TOKEN && super::files::is_upload(&method, content_type) {
            return super::files::upload(shared, method, request).await;
        }
    }
    let (parts, body) = request.into_parts();
    let body = match axum::body::to_bytes(body, MAX_PLAIN_BODY_BYTES).await {
        Ok(body) => body,
        Err(_) => return api_error(StatusCode::PAYLOAD_TOO_LARGE, "Request Entity Too Large", None),
    };
    handle_request(AxumState(shared), parts.uri, parts.headers, body).await
}

/// Single entry point: the Bot API's URL scheme (`/bot<token>/<method>`, any
/// HTTP verb, case-insensitive method) is easier to parse by hand than to
/// express as axum routes, and this way every rejection is Telegram-shaped.
pub(super) async fn handle_request(
    AxumState(shared): AxumState<Arc<Shared>>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let Some((token, method)) = split_path(uri.path()) else {
        return api_error(StatusCode::NOT_FOUND, "Not Found", None);
    };
    if token != TEST_TOKEN {
        shared.lock().unauthorized_requests += 1;
        return api_error(StatusCode::UNAUTHORIZED, "Unauthorized", None);
    }
    let method = method.to_ascii_lowercase();

    let params = match parse_params(&uri, &headers, &body) {
        Ok(params) => params,
        Err(description) => return api_error(StatusCode::BAD_REQUEST, &description, None),
    };

    let fault = {
        let mut state = shared.lock();
        state.requests.push((method.clone(), Value::Object(params.clone())));
        if method == "getupdates" {
            state.get_updates_calls += 1;
        }
        state.faults.get_mut(&method).and_then(VecDeque::pop_front)
    };
    shared.changed.notify_waiters();

    match fault {
        None | Some(Fault::Pass) => dispatch(&shared, &method, &params).await.response,
        Some(Fault::RecordThenHang(delay)) => {
            let performed = dispatch(&shared, &method, &params).await;
            if let Some(message_id) = performed.sent_message_id {
                shared.lock().held_sends.push(message_id);
                shared.changed.notify_waiters();
            }
            shared.hang(delay).await;
            performed.response
        }
        Some(Fault::WaitThenPerform(delay)) => {
            shared.hang(delay).await;
            dispatch(&shared, &method, &params).await.response
        }
        Some(Fault::RecordThenServerError) => {
            let _performed = dispatch(&shared, &method, &params).await;
            api_error(StatusCode::INTERNAL_SERVER_ERROR, "Internal Server Error", None)
        }
        Some(fault) => {
            // A faulted getUpdates still reached Telegram, so it terminates
            // any long poll that is waiting, as a real one would.
            if method == "getupdates" {
                shared.lock().poll_generation += 1;
                shared.changed.notify_waiters();
            }
            fault_response(&shared, fault).await
        }
    }
}

/// Telegram's `429`: wait `retry_after` seconds before trying again.
fn too_many_requests(retry_after: u64) -> Response {
    api_error(
        StatusCode::TOO_MANY_REQUESTS,
        &format!("Too Many Requests: retry after {retry_after}"),
        Some(json!({ "retry_after": retry_after })),
    )
}

/// A request performed: the answer, and the id of the message it recorded as sent.
struct Performed {
    response: Response,
    sent_message_id: Option<i32>,
}

async fn dispatch(shared: &Shared, method: &str, params: &Map<String, Value>) -> Performed {
    if method == "sendmessage" {
        return send_message(shared, params);
    }
    if let Some(response) = super::actions::answer(method, params) {
        return Performed { response, sent_message_id: None };
    }
    let response = answer(shared, method, params).await;
    Performed { response, sent_message_id: None }
}

/// Any method but `sendMessage` and those of [`super::actions`].
async fn answer(shared: &Shared, method: &str, params: &Map<String, Value>) -> Response {
    if let Some(response) = super::buttons::answer(shared, method, params) {
        return response;
    }
    if let Some(response) = super::webhook::answer(shared, method, params) {
        return response;
    }
    match method {
        "getupdates" => get_updates(shared, params).await,
        "getme" => ok(bot_me_json(shared.lock().privacy_mode)),
        "getfile" => super::files::get_file(shared, params),
        "getmycommands" => ok(json!([])),
        "close" | "logout" | "deletemycommands" => ok(json!(true)),
        _ => api_error(
            StatusCode::NOT_FOUND,
            &format!("Not Found: method {method:?} is not implemented by the fake Telegram server"),
            None,
        ),
    }
}

pub(super) async fn fault_response(shared: &Shared, fault: Fault) -> Response {
    match fault {
        Fault::TooManyRequests { retry_after } => too_many_requests(u64::from(retry_after)),
        Fault::ServerError => api_error(StatusCode::INTERNAL_SERVER_ERROR, "Internal Server Error", None),
        Fault::BadRequest(description) => api_error(StatusCode::BAD_REQUEST, &description, None),
        Fault::Forbidden(description) => api_error(StatusCode::FORBIDDEN, &description, None),
        Fault::Conflict => api_error(StatusCode::CONFLICT, CONFLICT_DESCRIPTION, None),
        Fault::MigrateTo(chat_id) => migrate_error(chat_id),
        Fault::HangWithoutRecording(delay) => {
            shared.hang(delay).await;
            api_error(StatusCode::GATEWAY_TIMEOUT, "Gateway Timeout", None)
        }
        Fault::MalformedBody => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "text/html")],
            "<html><body>this is not the Bot API</body></html>",
        )
            .into_response(),
        Fault::Raw { status, body } => {
            let status = StatusCode::from_u16(status).expect("validated by fail_method");
            let content_type =
                if serde_json::from_str::<Value>(&body).is_ok() { "application/json" } else { "text/plain" };
            (status, [(header::CONTENT_TYPE, content_type)], body).into_response()
        }
        // Handled by the caller, which has to perform the request first.
        Fault::RecordThenHang(_) | Fault::Pass | Fault::RecordThenServerError | Fault::WaitThenPerform(_) => {
            unreachable!("faults that perform the request are handled by handle_request")
        }
    }
}

struct GetUpdatesParams {
    offset: i64,
    limit: usize,
    timeout: Duration,
    /// `None` when the call gives no list: the last one given still holds.
    allowed_updates: Option<Vec<String>>,
}

impl GetUpdatesParams {
    fn parse(params: &Map<String, Value>) -> Result<Self, String> {
        Ok(Self {
            offset: int_param(params, "offset")?.unwrap_or(0),
            // Telegram clamps rather than rejects out-of-range limits.
            limit: int_param(params, "limit")?.unwrap_or(100).clamp(1, 100) as usize,
            timeout: Duration::from_secs(int_param(params, "timeout")?.unwrap_or(0).max(0).unsigned_abs()),
            allowed_updates: allowed_updates_param(params)?,
        })
    }
}

/// `allowed_updates`: a JSON array of kind names, or (from a form or a query string) its
/// JSON text.
pub(super) fn allowed_updates_param(params: &Map<String, Value>) -> Result<Option<Vec<String>>, String> {
    let invalid = || "Bad Request: can't parse allowed updates".to_owned();
    let list = match params.get("allowed_updates") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::String(text)) => serde_json::from_str(text).map_err(|_| invalid())?,
        Some(other) => other.clone(),
    };
    serde_json::from_value(list).map(Some).map_err(|_| invalid())
}

async fn get_updates(shared: &Shared, params: &Map<String, Value>) -> Response {
    if shared.lock().webhook.set.is_some() {
        return api_error(StatusCode::CONFLICT, super::webhook::WEBHOOK_ACTIVE_DESCRIPTION, None);
    }
    let GetUpdatesParams { offset, limit, timeout, allowed_updates } = match GetUpdatesParams::parse(params) {
        Ok(parsed) => parsed,
        Err(description) => return bad_request(&description),
    };

    let (generation, call) = {
        let mut state = shared.lock();
        state.apply_offset(offset);
        if allowed_updates.is_some() {
            state.allowed_updates = allowed_updates;
        }
        state.poll_generation += 1;
        state.long_polls_waiting += 1;
        (state.poll_generation, state.get_updates_calls)
    };
    let waiting = WaitingLongPoll(shared);
    // Wakes confirmation waiters and any long poll this one supersedes.
    shared.changed.notify_waiters();

    enum Outcome {
        Updates(Vec<(i64, String)>),
        Superseded,
        Empty,
    }
    let deadline = Instant::now() + timeout;
    let outcome = shared
        .wait_for(Some(deadline), |state| {
            if state.shut_down {
                return Some(Outcome::Empty);
            }
            if state.poll_generation != generation {
                return Some(Outcome::Superseded);
            }
            let batch: Vec<(i64, String)> = state
                .updates
                .iter()
                // Only matters if the client jumped ahead of existing ids.
                .filter(|update| update.is_served_from(offset))
                .filter(|update| update.is_allowed(state.allowed_updates.as_deref()))
                .take(limit)
                .map(|update| (update.id, update.text.clone()))
                .collect();
            (!batch.is_empty()).then_some(Outcome::Updates(batch))
        })
        .await
        .unwrap_or(Outcome::Empty);
    drop(waiting);

    match outcome {
        Outcome::Updates(batch) => {
            let mut state = shared.lock();
            // A set: a benchmark keeps tens of thousands of updates pending.
            let served: HashSet<i64> = batch.iter().map(|(id, _)| *id).collect();
            for update in state.updates.iter_mut().filter(|update| served.contains(&update.id)) {
                update.served = true;
            }
            state.served_by_call.extend(served.iter().map(|&id| (id, call)));
            drop(state);
            // Waiters for an update being served (`wait_until_served`) look again.
            shared.changed.notify_waiters();
            let texts: Vec<String> = batch.into_iter().map(|(_, text)| text).collect();
            ok_raw(&texts.join(","))
        }
        Outcome::Empty => ok(json!([])),
        Outcome::Superseded => api_error(StatusCode::CONFLICT, CONFLICT_DESCRIPTION, None),
    }
}

/// Counts a long poll as waiting for as long as it lives, also when the client goes
/// away and the request's future is dropped mid-wait.
struct WaitingLongPoll<'a>(&'a Shared);

impl Drop for WaitingLongPoll<'_> {
    fn drop(&mut self) {
        self.0.lock().long_polls_waiting -= 1;
    }
}

struct SendMessageParams {
    chat_id: i64,
    text: String,
    message_thread_id: Option<i32>,
    reply_to_message_id: Option<i32>,
    parse_mode: Option<String>,
}

impl SendMessageParams {
    fn parse(params: &Map<String, Value>) -> Result<Self, String> {
        let chat_id = match int_param(params, "chat_id") {
            // No Telegram chat has id 0 (an agent's envelope does): Telegram refuses it, so
            // a reply planned for an agent's envelope cannot pass as delivered.
            Ok(Some(0)) => return Err("Bad Request: chat not found".to_owned()),
            Ok(Some(chat_id)) => chat_id,
            Ok(None) => return Err("Bad Request: chat_id is empty".to_owned()),
            // "@channelusername" recipients: the fake knows no usernames.
            Err(_) => return Err("Bad Request: chat not found".to_owned()),
        };
        let text = str_param(params, "text").unwrap_or_default();
        if text.is_empty() {
            return Err("Bad Request: message text is empty".to_owned());
        }
        if text.encode_utf16().count() > MAX_MESSAGE_UTF16_LEN {
            return Err("Bad Request: message is too long".to_owned());
        }
        let parse_mode = str_param(params, "parse_mode");
        if super::actions::is_html(parse_mode.as_deref()) {
            super::actions::check_html(&text)?;
        }
        Ok(Self {
            chat_id,
            text,
            message_thread_id: int_param(params, "message_thread_id")?.map(|id| id as i32),
            reply_to_message_id: reply_target(params)?,
            parse_mode,
        })
    }
}

/// Records the message as sent, or refuses it.
fn send_message(shared: &Shared, params: &Map<String, Value>) -> Performed {
    let refused = |response| Performed { response, sent_message_id: None };
    let SendMessageParams { chat_id, text, message_thread_id, reply_to_message_id, parse_mode } =
        match SendMessageParams::parse(params) {
            Ok(parsed) => parsed,
            Err(description) => return refused(bad_request(&description)),
        };

    let (message_id, message) = {
        let mut state = shared.lock();
        if let Some(&new_chat_id) = state.migrated.get(&chat_id) {
            return refused(migrate_error(new_chat_id));
        }
        let refused_for =
            state.limits.as_mut().and_then(|limits| limits.admit(chat_id, std::time::Instant::now()).err());
        if let Some(wait) = refused_for {
            state.too_many_requests += 1;
            return refused(too_many_requests(wait.as_secs_f64().ceil().max(1.0) as u64));
        }
        let message_id = state.take_message_id();
        let kind = state.chat_kind(chat_id);
        let mut message = json!({
            "message_id": message_id,
            "date": unix_now(),
            "chat": chat_json(chat_id, &kind),
            "from": bot_user_json(),
            "text": text,
        });
        if let Some(thread_id) = message_thread_id {
            message["message_thread_id"] = json!(thread_id);
            if matches!(kind, ChatKind::Supergroup { is_forum: true, .. }) {
                message["is_topic_message"] = json!(true);
            }
        }
        state.sent.push(SentMessage {
            message_id,
            chat_id,
            text,
            message_thread_id,
            reply_to_message_id,
            parse_mode,
            raw: Value::Object(params.clone()),
            received_at: std::time::Instant::now(),
        });
        (message_id, message)
    };
    shared.changed.notify_waiters();
    Performed { response: ok(message), sent_message_id: Some(message_id) }
}

/// The replied-to message id, from `reply_parameters` (current API, what
/// teloxide 0.17 sends) or `reply_to_message_id` (deprecated but accepted).
fn reply_target(params: &Map<String, Value>) -> Result<Option<i32>, String> {
    if let Some(reply) = obj_param(params, "reply_parameters")? {
        return match int_param(&reply, "message_id")? {
            Some(id) => Ok(Some(id as i32)),
            None => Err("Bad Request: can't parse reply parameters JSON object".to_owned()),
        };
    }
    Ok(int_param(params, "reply_to_message_id")?.map(|id| id as i32))
}

// ---------------------------------------------------------------------------
// Request parsing
// ---------------------------------------------------------------------------

/// Splits `/bot<token>/<method>` into its parts, percent-decoding the token
/// (clients may escape the `:` in it).
fn split_path(path: &str) -> Option<(String, &str)> {
    let mut segments = path.strip_prefix('/')?.split('/');
    let token = segments.next()?.strip_prefix("bot")?;
    let method = segments.next()?;
    if method.is_empty() || segments.next().is_some() {
        return None;
    }
    Some((percent_decode(token)?, method))
}

fn percent_decode(input: &str) -> Option<String> {
    let bytes = input.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = input.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Merges query-string and body parameters, as Telegram does. Form and query
/// values stay strings; the typed accessors below coerce them.
fn parse_params(uri: &Uri, headers: &HeaderMap, body: &Bytes) -> Result<Map<String, Value>, String> {
    let mut params = Map::new();
    if let Some(query) = uri.query() {
        params.extend(parse_urlencoded(query));
    }
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(params);
    }
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value: &HeaderValue| value.to_str().ok())
        .and_then(|value| value.split(';').next())
        .map(|value| value.trim().to_ascii_lowercase())
        .unwrap_or_default();
    match content_type.as_str() {
        "application/x-www-form-urlencoded" => {
            let body =
                std::str::from_utf8(body).map_err(|_| "Bad Request: form body is not UTF-8".to_owned())?;
            params.extend(parse_urlencoded(body));
        }
        "multipart/form-data" => {
            return Err("Bad Request: multipart/form-data (file uploads) is not supported \
                        by the fake Telegram server"
                .to_owned());
        }
        // JSON, or a client that did not say: try JSON.
        _ => match serde_json::from_slice::<Value>(body) {
            Ok(Value::Object(object)) => params.extend(object),
            _ => return Err("Bad Request: request body is not a JSON object".to_owned()),
        },
    }
    Ok(params)
}

fn parse_urlencoded(input: &str) -> Vec<(String, Value)> {
    // reqwest re-exports `url`, whose query parser implements
    // application/x-www-form-urlencoded decoding ('+', percent escapes).
    let mut url = reqwest::Url::parse("http://fake.invalid/").expect("static URL");
    url.set_query(Some(input));
    url.query_pairs().map(|(key, value)| (key.into_owned(), Value::String(value.into_owned()))).collect()
}

// Parameter accessors fail with the description of the 400 to answer.

/// An integer parameter given as a JSON number or a numeric string.
pub(super) fn int_param(params: &Map<String, Value>, name: &str) -> Result<Option<i64>, String> {
    let invalid = || format!("Bad Request: invalid {name} specified");
    match params.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(number)) => number.as_i64().map(Some).ok_or_else(invalid),
        Some(Value::String(text)) => text.trim().parse().map(Some).map_err(|_| invalid()),
        Some(_) => Err(invalid()),
    }
}

/// A string parameter; scalars are stringified as Telegram would.
pub(super) fn str_param(params: &Map<String, Value>, name: &str) -> Option<String> {
    match params.get(name)? {
        Value::String(text) => Some(text.clone()),
        Value::Number(number) => Some(number.to_string()),
        Value::Bool(flag) => Some(flag.to_string()),
        _ => None,
    }
}

/// An object parameter, given inline (JSON body) or JSON-encoded in a string
/// (form or query).
fn obj_param(params: &Map<String, Value>, name: &str) -> Result<Option<Map<String, Value>>, String> {
    let invalid = || format!("Bad Request: can't parse {name} JSON object");
    match params.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(object)) => Ok(Some(object.clone())),
        Some(Value::String(text)) => match serde_json::from_str(text) {
            Ok(Value::Object(object)) => Ok(Some(object)),
            _ => Err(invalid()),
        },
        Some(_) => Err(invalid()),
    }
}

// ---------------------------------------------------------------------------
// Responses and JSON shapes
// ---------------------------------------------------------------------------

pub(super) fn ok(result: Value) -> Response {
    Json(json!({ "ok": true, "result": result })).into_response()
}

/// A successful response whose `result` is the JSON text `result`, verbatim.
fn ok_raw(result: &str) -> Response {
    let body = format!("{{\"ok\":true,\"result\":[{result}]}}");
    (StatusCode::OK, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// A Telegram-shaped error. teloxide ignores the status and `error_code` and
/// decides by `parameters` first, then by matching `description` text.
pub(super) fn api_error(status: StatusCode, description: &str, parameters: Option<Value>) -> Response {
    let mut body = json!({
        "ok": false,
        "error_code": status.as_u16(),
        "description": description,
    });
    if let Some(parameters) = parameters {
        body["parameters"] = parameters;
    }
    (status, Json(body)).into_response()
}

pub(super) fn bad_request(description: &str) -> Response {
    api_error(StatusCode::BAD_REQUEST, description, None)
}

fn migrate_error(new_chat_id: i64) -> Response {
    api_error(
        StatusCode::BAD_REQUEST,
        "Bad Request: group chat was upgraded to a supergroup chat",
        Some(json!({ "migrate_to_chat_id": new_chat_id })),
    )
}

pub(super) fn chat_json(id: i64, kind: &ChatKind) -> Value {
    match kind {
        ChatKind::Private { first_name } => {
            json!({ "id": id, "type": "private", "first_name": first_name })
        }
        ChatKind::Group { title } => json!({ "id": id, "type": "group", "title": title }),
        ChatKind::Supergroup { title, is_forum } => {
            let mut chat = json!({ "id": id, "type": "supergroup", "title": title });
            if *is_forum {
                chat["is_forum"] = json!(true);
            }
            chat
        }
    }
}

pub(super) fn bot_user_json() -> Value {
    json!({
        "id": BOT_USER_ID,
        "is_bot": true,
        "first_name": BOT_FIRST_NAME,
        "username": BOT_USERNAME,
    })
}

fn bot_me_json(privacy_mode: bool) -> Value {
    let mut me = bot_user_json();
    merge_into(
        &mut me,
        json!({
            "can_join_groups": true,
            "can_read_all_group_messages": !privacy_mode,
            "supports_inline_queries": false,
            "can_connect_to_business": false,
            // Not optional for teloxide's `Me`: without it getMe fails to parse.
            "has_main_web_app": false,
        }),
    );
    me
}

/// Copies `extra`'s fields into `target`, overwriting; both must be objects.
pub(super) fn merge_into(target: &mut Value, extra: Value) {
    if let (Value::Object(target), Value::Object(extra)) = (target, extra) {
        target.extend(extra);
    }
}

pub(super) fn unix_now() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |elapsed| elapsed.as_secs() as i64)
}
