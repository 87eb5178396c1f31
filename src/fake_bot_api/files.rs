//! Files in the fake: files a test registers (bytes, and the size `getFile` reports),
//! `getFile`, the download route `/file/bot<token>/<file_path>`, and multipart uploads
//! for `sendPhoto`, `sendDocument` and the rest, recorded by their length and SHA-256 so
//! a test can check them byte for byte without keeping them.
//!
//! Like a local Bot API server started with `--local`
//! ([`FakeTelegram::serve_files_locally`]), the fake can instead keep the files it is given
//! on disk, under `<working directory>/<token>/documents/`, and answer `getFile` with their
//! absolute path; it serves no download of them, as that server does not.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{FromRequest, Multipart, Request};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::{Map, Value, json};
use sha2::{Digest, Sha256};
use tokio::time::Instant;

use super::server::{api_error, bot_user_json, chat_json, fault_response, ok, unix_now};
use super::state::Shared;
use super::{ChatSpec, FakeTelegram, Fault, TEST_TOKEN, UserSpec};

/// The methods that take a file as multipart, lower-cased as the fake matches them.
const UPLOAD_METHODS: [&str; 6] =
    ["sendphoto", "senddocument", "sendvideo", "sendanimation", "sendvoice", "sendaudio"];

/// Telegram's `getFile` serves files up to 20 MiB; for a bigger one it answers 400 "Bad
/// Request: file is too big". The fake's own, not the daemon's constant, so the two are
/// checked against each other.
const GET_FILE_LIMIT: u64 = 20 * 1024 * 1024;

/// A file the fake serves.
#[derive(Debug, Clone)]
pub(super) struct FakeFile {
    path: String,
    bytes: Bytes,
    /// What `getFile` says its size is (a test may claim more than it holds).
    reported_size: u64,
}

/// What the fake keeps about files.
#[derive(Debug, Default)]
pub(super) struct FilesState {
    /// file_id -> the file.
    files: HashMap<String, FakeFile>,
    /// The paths downloaded through `/file/bot<token>/…`, in order.
    downloads: Vec<String>,
    uploads: Vec<Upload>,
    /// Message ids of uploads whose answer is held back ([`Fault::RecordThenHang`]).
    held_uploads: Vec<i32>,
    /// How long each download waits before its answer starts
    /// ([`FakeTelegram::stall_file_downloads`]).
    download_stall: Option<Duration>,
    /// The working directory of a local server ([`FakeTelegram::serve_files_locally`]):
    /// files registered from then on are written under it and named by absolute path.
    local_dir: Option<tempfile::TempDir>,
}

/// A file upload the fake accepted, as Telegram would have posted it.
#[derive(Debug, Clone, PartialEq)]
pub struct Upload {
    /// `sendPhoto`, `sendDocument`, … lower-cased.
    pub method: String,
    pub message_id: i32,
    pub chat_id: i64,
    pub message_thread_id: Option<i32>,
    pub reply_to_message_id: Option<i32>,
    /// The multipart field that held the file (`photo`, `document`, …).
    pub field: String,
    pub file_name: Option<String>,
    pub len: u64,
    /// Lower-case hex.
    pub sha256: String,
}

impl FakeTelegram {
    /// Registers a file `getFile` knows by `file_id`, served with these bytes.
    pub fn add_file(&self, file_id: &str, bytes: impl Into<Bytes>) {
        let bytes = bytes.into();
        let size = bytes.len() as u64;
        self.add_file_claiming(file_id, bytes, size);
    }

    /// Registers a file whose `getFile` reports `reported_size`, whatever it holds (a
    /// file too large to download need not be made).
    /// In local mode ([`FakeTelegram::serve_files_locally`]) the bytes are written to disk.
    pub fn add_file_claiming(&self, file_id: &str, bytes: impl Into<Bytes>, reported_size: u64) {
        let bytes = bytes.into();
        let mut state = self.shared.lock();
        let seq = state.take_file_seq();
        let path = match &state.files.local_dir {
            Some(dir) => {
                let path = dir.path().join(TEST_TOKEN).join("documents").join(format!("file_{seq}"));
                write_local_file(&path, &bytes);
                path.display().to_string()
            }
            None => format!("files/{seq}"),
        };
        state.files.files.insert(file_id.to_owned(), FakeFile { path, bytes, reported_size });
    }

    /// Registers a file whose `getFile` names `file_path` as it is, whatever is there (a
    /// path the daemon must refuse, or one on another machine's disk); nothing is written
    /// and nothing is served.
    pub fn add_file_at_path(&self, file_id: &str, file_path: &str, reported_size: u64) {
        let file = FakeFile { path: file_path.to_owned(), bytes: Bytes::new(), reported_size };
        self.shared.lock().files.files.insert(file_id.to_owned(), file);
    }

    /// From now on, acts as a local Bot API server started with `--local`: each file
    /// registered is written under a working directory of the fake's own (removed when the
    /// fake is dropped), at `<dir>/<token>/documents/file_<n>` as telegram-bot-api lays
    /// them out, and `getFile` answers its absolute path. Returns that directory.
    pub fn serve_files_locally(&self) -> PathBuf {
        let mut state = self.shared.lock();
        let dir = state.files.local_dir.get_or_insert_with(|| {
            tempfile::Builder::new()
                .prefix("fake-bot-api-")
                .tempdir()
                .expect("fake Telegram: a working directory")
        });
        dir.path().to_owned()
    }

    /// The path `getFile` names for `file_id`, if the fake knows the file.
    pub fn file_path_of(&self, file_id: &str) -> Option<String> {
        self.shared.lock().files.files.get(file_id).map(|file| file.path.clone())
    }

    /// Queues a document message carrying `file_id` (one `add_file` registered); returns its
    /// update id.
    pub fn push_document_file(
        &self,
        chat: impl Borrow<ChatSpec>,
        from: impl Borrow<UserSpec>,
        file_id: &str,
        file_name: &str,
        size: u64,
    ) -> i64 {
        self.push_registered_document(chat.borrow(), from.borrow(), file_id, file_name, Some(size))
    }

    /// Queues a document message carrying `file_id` without its size, as Telegram sends
    /// some (the daemon learns it only from `getFile`, if at all); returns its update id.
    pub fn push_document_file_without_size(
        &self,
        chat: impl Borrow<ChatSpec>,
        from: impl Borrow<UserSpec>,
        file_id: &str,
        file_name: &str,
    ) -> i64 {
        self.push_registered_document(chat.borrow(), from.borrow(), file_id, file_name, None)
    }

    /// A document carrying a file registered with `add_file` (unlike `push_document`, which
    /// makes up its file id).
    fn push_registered_document(
        &self,
        chat: &ChatSpec,
        from: &UserSpec,
        file_id: &str,
        file_name: &str,
        size: Option<u64>,
    ) -> i64 {
        let mut document = json!({
            "file_id": file_id, "file_unique_id": format!("u-{file_id}"),
            "file_name": file_name, "mime_type": "application/octet-stream",
        });
        if let Some(size) = size {
            document["file_size"] = json!(size);
        }
        self.push_message("message", chat, Some(from), None, json!({ "document": document }))
    }

    /// Queues a photo message whose largest size is `file_id`; returns its update id.
    pub fn push_photo_file(
        &self,
        chat: impl Borrow<ChatSpec>,
        from: impl Borrow<UserSpec>,
        file_id: &str,
        size: u64,
    ) -> i64 {
        let content = json!({
            "photo": [
                { "file_id": format!("{file_id}-thumb"), "file_unique_id": format!("t-{file_id}"),
                  "width": 90, "height": 90, "file_size": 100 },
                { "file_id": file_id, "file_unique_id": format!("u-{file_id}"),
                  "width": 1280, "height": 960, "file_size": size },
            ],
        });
        self.push_message("message", chat.borrow(), Some(from.borrow()), None, content)
    }

    /// Makes every file download from now on wait `how_long` before its answer starts (a
    /// slow or stuck file server); cut short when the fake stops.
    pub fn stall_file_downloads(&self, how_long: Duration) {
        self.shared.lock().files.download_stall = Some(how_long);
    }

    /// The paths of every file downloaded, in order.
    pub fn file_downloads(&self) -> Vec<String> {
        self.shared.lock().files.downloads.clone()
    }

    /// Every upload the fake accepted, in order.
    pub fn uploads(&self) -> Vec<Upload> {
        self.shared.lock().files.uploads.clone()
    }

    /// Waits until `n` uploads were accepted; returns all of them, or `None` on timeout.
    pub async fn wait_for_uploads(&self, n: usize, within: Duration) -> Option<Vec<Upload>> {
        let uploads =
            |state: &super::State| (state.files.uploads.len() >= n).then(|| state.files.uploads.clone());
        self.shared.wait_for(Some(Instant::now() + within), uploads).await
    }

    /// Waits for an upload whose answer is held back ([`Fault::RecordThenHang`]).
    pub async fn wait_for_held_upload(&self, within: Duration) -> Option<Upload> {
        let held = |state: &super::State| {
            let id = *state.files.held_uploads.first()?;
            state.files.uploads.iter().find(|u| u.message_id == id).cloned()
        };
        self.shared.wait_for(Some(Instant::now() + within), held).await
    }
}

/// Writes a local-mode file where `getFile` will say it is.
fn write_local_file(path: &Path, bytes: &[u8]) {
    let dir = path.parent().expect("a file in a directory");
    std::fs::create_dir_all(dir).expect("fake Telegram: the local server's directory");
    std::fs::write(path, bytes).expect("fake Telegram: a local file");
}

/// `getFile`: the file's path and size, or Telegram's 400 for an unknown id or a file over
/// [`GET_FILE_LIMIT`].
pub(super) fn get_file(shared: &Shared, params: &Map<String, Value>) -> Response {
    let Some(file_id) = params.get("file_id").and_then(Value::as_str) else {
        return api_error(StatusCode::BAD_REQUEST, "Bad Request: file_id is empty", None);
    };
    let state = shared.lock();
    match state.files.files.get(file_id) {
        Some(file) if file.reported_size > GET_FILE_LIMIT => {
            api_error(StatusCode::BAD_REQUEST, "Bad Request: file is too big", None)
        }
        Some(file) => ok(json!({
            "file_id": file_id,
            "file_unique_id": format!("u-{file_id}"),
            "file_size": file.reported_size,
            "file_path": file.path,
        })),
        None => api_error(StatusCode::BAD_REQUEST, "Bad Request: invalid file_id", None),
    }
}

/// `GET /file/bot<token>/<file_path>` (`rest` is what follows `/file/bot`).
pub(super) async fn download(shared: &Shared, rest: &str) -> Response {
    let Some((token, path)) = rest.split_once('/') else {
        return (StatusCode::NOT_FOUND, "Not Found").into_response();
    };
    if token != TEST_TOKEN {
        shared.lock().unauthorized_requests += 1;
        return (StatusCode::UNAUTHORIZED, "Unauthorized").into_response();
    }
    let (bytes, stall) = {
        let mut state = shared.lock();
        state.files.downloads.push(path.to_owned());
        let bytes = state.files.files.values().find(|file| file.path == path).map(|file| file.bytes.clone());
        (bytes, state.files.download_stall)
    };
    shared.changed.notify_waiters();
    if let Some(stall) = stall {
        shared.hang(stall).await;
    }
    match bytes {
        Some(bytes) => {
            ([(header::CONTENT_TYPE, "application/octet-stream")], Body::from(bytes)).into_response()
        }
        None => (StatusCode::NOT_FOUND, "Not Found").into_response(),
    }
}

/// Whether a request is a multipart upload to one of [`UPLOAD_METHODS`].
pub(super) fn is_upload(method: &str, content_type: Option<&str>) -> bool {
    UPLOAD_METHODS.contains(&method)
        && content_type.is_some_and(|value| value.to_ascii_lowercase().starts_with("multipart/form-data"))
}

/// A multipart upload: the text fields are the parameters; the file field is hashed as it
/// arrives. A fault queued for the method applies as for `sendMessage`; one that answers
/// (a refusal, a 5xx) comes once the whole upload is read, as Telegram reads a file before
/// it refuses it, and the request is recorded with its parameters.
pub(super) async fn upload(shared: Arc<Shared>, method: String, request: Request) -> Response {
    let fault = {
        let mut state = shared.lock();
        state.faults.get_mut(&method).and_then(std::collections::VecDeque::pop_front)
    };
    let hang = match fault {
        None | Some(Fault::Pass) => None,
        Some(Fault::RecordThenHang(delay)) => Some(delay),
        Some(Fault::WaitThenPerform(delay)) => {
            shared.hang(delay).await;
            None
        }
        // Lost on the way: nothing of it is read.
        Some(lost @ Fault::HangWithoutRecording(_)) => {
            shared.lock().requests.push((method.clone(), Value::Null));
            shared.changed.notify_waiters();
            return fault_response(&shared, lost).await;
        }
        Some(other) => {
            let params = read_upload(request).await.map(|received| Value::Object(received.params));
            shared.lock().requests.push((method.clone(), params.unwrap_or(Value::Null)));
            shared.changed.notify_waiters();
            return fault_response(&shared, other).await;
        }
    };
    let received = match read_upload(request).await {
        Ok(received) => received,
        Err(description) => return api_error(StatusCode::BAD_REQUEST, &description, None),
    };
    let Some((field, file_name, len, sha256)) = received.file else {
        return api_error(StatusCode::BAD_REQUEST, "Bad Request: there is no file in the request", None);
    };
    let params = received.params;
    // No Telegram chat has id 0, as in `sendMessage`.
    let chat_id =
        params.get("chat_id").and_then(|v| v.as_str()?.parse::<i64>().ok()).filter(|&chat_id| chat_id != 0);
    let Some(chat_id) = chat_id else {
        return api_error(StatusCode::BAD_REQUEST, "Bad Request: chat not found", None);
    };
    let int = |name: &str| params.get(name).and_then(|v| v.as_str()?.parse::<i32>().ok());
    let reply_to = params
        .get("reply_parameters")
        .and_then(|v| serde_json::from_str::<Value>(v.as_str()?).ok())
        .and_then(|v| v.get("message_id")?.as_i64())
        .map(|id| id as i32);
    let (message_id, message) = {
        let mut state = shared.lock();
        state.requests.push((method.clone(), Value::Object(params.clone())));
        let message_id = state.take_message_id();
        let kind = state.chat_kind(chat_id);
        let mut message = json!({
            "message_id": message_id,
            "date": unix_now(),
            "chat": chat_json(chat_id, &kind),
            "from": bot_user_json(),
        });
        message[&field] = json!({ "file_id": format!("up-{message_id}"), "file_unique_id": format!("upu-{message_id}"), "file_size": len });
        state.files.uploads.push(Upload {
            method: method.clone(),
            message_id,
            chat_id,
            message_thread_id: int("message_thread_id"),
            reply_to_message_id: reply_to,
            field,
            file_name,
            len,
            sha256,
        });
        if hang.is_some() {
            state.files.held_uploads.push(message_id);
        }
        (message_id, message)
    };
    shared.changed.notify_waiters();
    if let Some(delay) = hang {
        tracing::debug!(message_id, "fake Telegram: holding the answer to an upload");
        shared.hang(delay).await;
    }
    ok(message)
}

struct ReceivedUpload {
    params: Map<String, Value>,
    /// (field, file name, length, SHA-256) of the one file part.
    file: Option<(String, Option<String>, u64, String)>,
}

async fn read_upload(request: Request) -> Result<ReceivedUpload, String> {
    let mut multipart =
        Multipart::from_request(request, &()).await.map_err(|e| format!("Bad Request: {}", e.body_text()))?;
    let mut received = ReceivedUpload { params: Map::new(), file: None };
    while let Some(mut field) = multipart.next_field().await.map_err(|e| format!("Bad Request: {e}"))? {
        let name = field.name().unwrap_or_default().to_owned();
        match field.file_name().map(str::to_owned) {
            Some(file_name) => {
                let mut hasher = Sha256::new();
                let mut len = 0u64;
                while let Some(chunk) = field.chunk().await.map_err(|e| format!("Bad Request: {e}"))? {
                    len += chunk.len() as u64;
                    hasher.update(&chunk);
                }
                received.file = Some((name, Some(file_name), len, hex::encode(hasher.finalize())));
            }
            None => {
                let text = field.text().await.map_err(|e| format!("Bad Request: {e}"))?;
                received.params.insert(name, Value::String(text));
            }
        }
    }
    Ok(received)
}
