//! Files over the Bot API (DESIGN.md §14): `getFile` and the download of what it names,
//! streamed through without holding a file in memory, and multipart uploads streamed
//! from a file on disk.

use std::time::Duration;

use bytes::Bytes;
use futures::{Stream, StreamExt, TryStreamExt};
use serde::Deserialize;

use super::bot_api::{Answer, Exchange, root_cause};

/// A download that has moved no byte for this long is dead (a stalled connection); a slow
/// one that keeps moving may take as long as it needs.
const IDLE_TRANSFER_TIMEOUT: Duration = Duration::from_secs(60);

/// An upload may take this long in all: 50 MB at well under a megabit a second. (Its
/// client has no idle timeout: while the bytes go out, nothing comes back to read.)
const MAX_UPLOAD_TIME: Duration = Duration::from_secs(15 * 60);

/// Telegram stores a file (and makes a video's preview) before it answers its upload, so a
/// larger file is answered later: its answer is awaited this much longer per started MiB.
const ANSWER_TIME_PER_MIB: Duration = Duration::from_secs(1);

const MIB: u64 = 1024 * 1024;

/// How long Telegram's answer to an upload of `len` bytes is awaited once its last byte has
/// gone: `call` (`telegram.send_timeout_secs`) and [`ANSWER_TIME_PER_MIB`] per started MiB,
/// within [`MAX_UPLOAD_TIME`], which bounds the whole request anyway. A silence longer than
/// that leaves the upload's outcome unknown.
pub fn upload_answer_timeout(call: Duration, len: u64) -> Duration {
    let started_mib = u32::try_from(len.div_ceil(MIB)).unwrap_or(u32::MAX);
    call.saturating_add(ANSWER_TIME_PER_MIB.saturating_mul(started_mib)).min(MAX_UPLOAD_TIME)
}

/// What `getFile` said about a file.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct FileInfo {
    /// Where the file can be fetched from, under `{api_url}/file/bot{token}/`.
    pub file_path: Option<String>,
    pub file_size: Option<u64>,
}

/// Why a file could not be fetched.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FetchError {
    #[error("Telegram refused getFile: {0}")]
    Refused(String),
    /// The file is over what the Bot API serves (20 MB): Telegram says so when asked for
    /// one whose size the message did not carry.
    #[error("Telegram will not serve the file: it is too big for the Bot API")]
    TooBig,
    #[error("Telegram could not be reached for the file: {0}")]
    Transport(String),
}

/// The Bot API's file methods for one bot.
#[derive(Debug, Clone)]
pub struct TelegramFiles {
    /// For `getFile` and downloads, with an idle timeout.
    client: reqwest::Client,
    /// For uploads: the whole request is bounded by [`MAX_UPLOAD_TIME`] instead.
    uploads: reqwest::Client,
    /// `{api_url}/bot{token}/`: holds the token, so it is never logged or shown.
    methods: reqwest::Url,
    /// `{api_url}/file/bot{token}/`.
    files: reqwest::Url,
    /// How long `getFile` may take, and the least an upload waits for its answer once its
    /// bytes are sent (`telegram.send_timeout_secs`; see [`upload_answer_timeout`]).
    call_timeout: Duration,
}

impl TelegramFiles {
    pub fn new(
        token: &str,
        api_url: &reqwest::Url,
        connect_timeout: Duration,
        call_timeout: Duration,
    ) -> reqwest::Result<Self> {
        let client = reqwest::Client::builder()
            .connect_timeout(connect_timeout)
            .read_timeout(IDLE_TRANSFER_TIMEOUT)
            .build()?;
        let uploads = reqwest::Client::builder().connect_timeout(connect_timeout).build()?;
        let prefix = api_url.path().trim_end_matches('/').to_owned();
        let mut methods = api_url.clone();
        methods.set_path(&format!("{prefix}/bot{token}/"));
        let mut files = api_url.clone();
        files.set_path(&format!("{prefix}/file/bot{token}/"));
        Ok(Self { client, uploads, methods, files, call_timeout })
    }

    /// `getFile`: where a file is and how big.
    pub async fn get_file(&self, file_id: &str) -> Result<FileInfo, FetchError> {
        let url = self.methods.join("getFile").map_err(|e| FetchError::Transport(e.to_string()))?;
        let request = self.client.post(url).json(&serde_json::json!({ "file_id": file_id }));
        let response = request.timeout(self.call_timeout).send().await.map_err(transport)?;
        let status = response.status().as_u16();
        let body = response.bytes().await.map_err(transport)?;
        let answer: Answer<FileInfo> = serde_json::from_slice(&body)
            .map_err(|e| FetchError::Transport(format!("getFile answered something unreadable: {e}")))?;
        match answer.result {
            Some(info) if answer.ok => Ok(info),
            _ => Err(get_file_refusal(answer.error_code.unwrap_or(status), answer.description)),
        }
    }

    /// The file's bytes as they arrive; nothing is buffered beyond one chunk.
    pub async fn download(
        &self,
        file_path: &str,
    ) -> Result<impl Stream<Item = std::io::Result<Bytes>> + Send + use<>, FetchError> {
        let url = self.files.join(file_path).map_err(|e| FetchError::Transport(e.to_string()))?;
        let response = self.client.get(url).send().await.map_err(transport)?;
        let status = response.status();
        if !status.is_success() {
            return Err(FetchError::Refused(format!("the file download answered HTTP {status}")));
        }
        Ok(response.bytes_stream().map_err(|e| std::io::Error::other(root_cause(&e.without_url()))))
    }

    /// Sends a file with `method` as multipart: `params` as text fields, then the file as
    /// `field`, streamed from `file` (`len` bytes). The exchange is classified like any
    /// other send (`outbound::classify`).
    pub async fn upload(
        &self,
        method: &str,
        params: &[(&'static str, String)],
        field: &'static str,
        file_name: String,
        file: tokio::fs::File,
        len: u64,
    ) -> Exchange {
        let url = match self.methods.join(method) {
            Ok(url) => url,
            Err(e) => return Exchange::NotConnected(format!("bad method name {method}: {e}")),
        };
        // Telegram's answer is awaited for `upload_answer_timeout` once the last byte has
        // gone: however long the bytes take, a silence longer than that leaves the outcome
        // unknown.
        let answer_timeout = upload_answer_timeout(self.call_timeout, len);
        let (sent_all, all_sent) = tokio::sync::oneshot::channel::<()>();
        let mut sent_all = Some(sent_all);
        let end_of_file = futures::stream::poll_fn(move |_| {
            if let Some(sent_all) = sent_all.take() {
                let _ = sent_all.send(());
            }
            std::task::Poll::Ready(None::<std::io::Result<Bytes>>)
        });
        let bytes = tokio_util::io::ReaderStream::new(file).chain(end_of_file);
        let part = reqwest::multipart::Part::stream_with_length(reqwest::Body::wrap_stream(bytes), len)
            .file_name(file_name);
        let mut form = reqwest::multipart::Form::new();
        for (name, value) in params {
            form = form.text(*name, value.clone());
        }
        let form = form.part(field, part);
        let exchange = async {
            let request = self.uploads.post(url).multipart(form).timeout(MAX_UPLOAD_TIME);
            let response = match request.send().await {
                Ok(response) => response,
                Err(e) => return upload_failure(e),
            };
            let status = response.status().as_u16();
            match response.bytes().await {
                Ok(body) => Exchange::Answered { status, body },
                Err(e) => upload_failure(e),
            }
        };
        let silence = async {
            let _ = all_sent.await;
            tokio::time::sleep(answer_timeout).await;
        };
        tokio::select! {
            exchange = exchange => exchange,
            () = silence => Exchange::NoAnswer(format!(
                "Telegram did not answer the upload within {}s of its last byte \
                 (telegram.send_timeout_secs and a second per MiB)",
                answer_timeout.as_secs()
            )),
        }
    }
}

/// What Telegram's refusal of `getFile` means: a file too big for the Bot API (a 400
/// "Bad Request: file is too big"), which no retry will fetch, or any other refusal.
fn get_file_refusal(error_code: u16, description: Option<String>) -> FetchError {
    let description = description.unwrap_or_else(|| "no description".into());
    if error_code == 400 && description.to_ascii_lowercase().contains("file is too big") {
        FetchError::TooBig
    } else {
        FetchError::Refused(description)
    }
}

fn transport(error: reqwest::Error) -> FetchError {
    FetchError::Transport(root_cause(&error.without_url()))
}

/// A failed upload, with the URL (which holds the token) left out.
fn upload_failure(error: reqwest::Error) -> Exchange {
    let connect = error.is_connect();
    let detail = root_cause(&error.without_url());
    if connect {
        Exchange::NotConnected(detail)
    } else {
        Exchange::NoAnswer(format!("the connection to Telegram failed while uploading: {detail}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_larger_upload_waits_longer_for_its_answer_within_the_upload_cap() {
        let call = Duration::from_secs(15);
        assert_eq!(upload_answer_timeout(call, 0), call);
        assert_eq!(upload_answer_timeout(call, 1), call + Duration::from_secs(1), "a started MiB counts");
        assert_eq!(upload_answer_timeout(call, MIB), call + Duration::from_secs(1));
        assert_eq!(upload_answer_timeout(call, MIB + 1), call + Duration::from_secs(2));
        let largest = crate::rules::media::TELEGRAM_UPLOAD_LIMIT;
        assert_eq!(upload_answer_timeout(call, largest), call + Duration::from_secs(50), "50 MB: 50 s more");
        assert_eq!(upload_answer_timeout(Duration::from_secs(3600), largest), MAX_UPLOAD_TIME);
        assert_eq!(upload_answer_timeout(call, u64::MAX), MAX_UPLOAD_TIME);
    }

    #[test]
    fn only_telegrams_too_big_refusal_of_get_file_is_told_apart() {
        let description = |text: &str| Some(text.to_owned());
        assert_eq!(get_file_refusal(400, description("Bad Request: file is too big")), FetchError::TooBig);
        assert_eq!(get_file_refusal(400, description("Bad Request: File is Too Big")), FetchError::TooBig);
        assert_eq!(
            get_file_refusal(400, description("Bad Request: invalid file_id")),
            FetchError::Refused("Bad Request: invalid file_id".into())
        );
        assert!(matches!(get_file_refusal(500, description("file is too big")), FetchError::Refused(_)));
        assert_eq!(get_file_refusal(400, None), FetchError::Refused("no description".into()));
    }

    #[test]
    fn file_urls_hold_the_token_and_keep_a_path_prefix() {
        let api = "http://127.0.0.1:8081/prefix".parse().unwrap();
        let files =
            TelegramFiles::new("123:abc", &api, Duration::from_secs(1), Duration::from_secs(1)).unwrap();
        assert_eq!(
            files.methods.join("getFile").unwrap().as_str(),
            "http://127.0.0.1:8081/prefix/bot123:abc/getFile"
        );
        assert_eq!(
            files.files.join("photos/file_1.jpg").unwrap().as_str(),
            "http://127.0.0.1:8081/prefix/file/bot123:abc/photos/file_1.jpg"
        );
    }
}
