//! Files over the Bot API (DESIGN.md §14): `getFile` and the download of what it names,
//! streamed through without holding a file in memory, and multipart uploads streamed
//! from a file on disk.
//!
//! A local Bot API server started with `--local` answers `getFile` with the file's absolute
//! path on its own disk instead of a path to download: the file is then read there, on a
//! disk or volume the daemon shares with the server ([`local_path`] says which paths).

use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{StreamExt, TryStreamExt};
use serde::Deserialize;
use tokio::io::AsyncReadExt;

use super::bot_api::{Answer, Exchange, root_cause};
use crate::ids::Secret;

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
    /// Where the file can be fetched from, under `{api_url}/file/bot{token}/`; from a local
    /// server with `--local`, its absolute path on that server's disk.
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
    /// A local Bot API server (`--local`) keeps the file on a disk this machine does not
    /// see, or not readable by the daemon. `path` and `working_dir` have the token hidden.
    #[error(
        "the local Bot API server keeps the file at {path}, which this machine cannot read: {detail}. \
         That server runs with --local, so switchboard reads its files from its disk: mount the server's \
         working directory ({working_dir}) at the same path on this machine, readable by switchboard's user"
    )]
    LocalUnreadable { path: String, working_dir: String, detail: String },
    /// `getFile` named a file the daemon will not read or fetch ([`local_path`],
    /// [`TelegramFiles::file_url`]); the text has the token hidden.
    #[error("the Bot API server named a file switchboard will not read: {0}")]
    UnsafePath(String),
}

impl FetchError {
    /// Whether asking again could fetch the file: not while the server names a path the
    /// daemon cannot or will not read, which only its operator can change.
    pub fn is_lasting(&self) -> bool {
        matches!(self, Self::LocalUnreadable { .. } | Self::UnsafePath(_))
    }
}

/// A file on its way: its bytes as they arrive, nothing buffered beyond one chunk.
pub struct Download {
    /// Its length, when the daemon knows it better than `getFile` did: a file read from a
    /// local server's disk has exactly this many bytes, whatever `getFile` said.
    pub size: Option<u64>,
    pub bytes: BoxStream<'static, std::io::Result<Bytes>>,
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
    /// To recognise the bot's own directory on a local server's disk, and to hide it
    /// from the messages that name a path in it.
    token: Secret,
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
        Ok(Self { client, uploads, methods, files, token: Secret::new(token.to_owned()), call_timeout })
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

    /// The file `getFile` named by `file_path`: downloaded from under
    /// `{api_url}/file/bot{token}/`, or read from the local server's disk when the path is
    /// absolute.
    pub async fn download(&self, file_path: &str) -> Result<Download, FetchError> {
        if file_path.starts_with('/') {
            return self.read_local(file_path).await;
        }
        let url = self.file_url(file_path)?;
        let response = self.client.get(url).send().await.map_err(transport)?;
        let status = response.status();
        if !status.is_success() {
            return Err(FetchError::Refused(format!("the file download answered HTTP {status}")));
        }
        let bytes = response.bytes_stream().map_err(|e| std::io::Error::other(root_cause(&e.without_url())));
        Ok(Download { size: None, bytes: bytes.boxed() })
    }

    /// The URL of a file `getFile` named by a relative path: under the file route of the
    /// configured server, and nowhere else. A path that would leave it (`..`, `//host`, a
    /// scheme, a query) is not one Telegram gives, so it is refused rather than followed.
    fn file_url(&self, file_path: &str) -> Result<reqwest::Url, FetchError> {
        let refused = || {
            FetchError::UnsafePath(format!(
                "{}, which is not a path under its file route",
                hide_token(file_path, self.token.expose())
            ))
        };
        if has_dot_segment(file_path) || file_path.contains(['\\', '?', '#']) {
            return Err(refused());
        }
        let url = self.files.join(file_path).map_err(|_| refused())?;
        if !url.as_str().starts_with(self.files.as_str()) || url.query().is_some() || url.fragment().is_some()
        {
            return Err(refused());
        }
        Ok(url)
    }

    /// A file a local server (`--local`) keeps on its disk, read where it is: exactly the
    /// length it has when it is opened.
    async fn read_local(&self, file_path: &str) -> Result<Download, FetchError> {
        let token = self.token.expose();
        let local = local_path(token, file_path)?;
        let unreadable = |error: std::io::Error| FetchError::LocalUnreadable {
            path: local.shown.clone(),
            working_dir: local.working_dir.clone(),
            detail: error.to_string(),
        };
        // With every link resolved, what is read must still be in the bot's own directory:
        // a link there to anywhere else is refused like a path that names it.
        let real = tokio::fs::canonicalize(&local.path).await.map_err(unreadable)?;
        let real_text = real.to_str().unwrap_or_default();
        if local_path(token, real_text).is_err() {
            return Err(FetchError::UnsafePath(format!(
                "{}, which leads to {}, outside the bot's own directory",
                local.shown,
                hide_token(real_text, token)
            )));
        }
        let file = tokio::fs::File::open(&real).await.map_err(unreadable)?;
        let metadata = file.metadata().await.map_err(unreadable)?;
        if !metadata.is_file() {
            return Err(FetchError::UnsafePath(format!("{}, which is not a regular file", local.shown)));
        }
        let len = metadata.len();
        let bytes = tokio_util::io::ReaderStream::new(file.take(len));
        Ok(Download { size: Some(len), bytes: bytes.boxed() })
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

/// A path a local Bot API server named, checked.
#[derive(Debug, PartialEq, Eq)]
struct LocalPath {
    path: PathBuf,
    /// The server's working directory (what precedes the bot's own directory), to say what
    /// to mount.
    working_dir: String,
    /// The path with the token hidden, for messages.
    shown: String,
}

/// Checks an absolute `file_path` a local Bot API server (`--local`) named.
///
/// A `file_path` is trusted only as much as the configured server, which holds the bot's
/// token anyway: it may name any file of the bot's. But reading it here opens a path on
/// this machine with the daemon's rights, and hands its bytes to an agent; the daemon can
/// read its own secrets (its environment in `/proc/self/environ`, its configuration, its
/// ledger), so a server that is wrong, compromised or reached over plain HTTP must not be
/// able to name them. telegram-bot-api keeps each bot's files in a directory named by its
/// token (`<dir>/<token>/documents/file_0.pdf`; `<token>:T` on the test servers), so a
/// path is read only from below such a directory, and without `.` or `..`, which it never
/// writes. ([`TelegramFiles::read_local`] checks the same again with links resolved, so a
/// link in that directory leads nowhere else.)
fn local_path(token: &str, file_path: &str) -> Result<LocalPath, FetchError> {
    let shown = hide_token(file_path, token);
    let outside = || FetchError::UnsafePath(format!("{shown}, outside the bot's own directory"));
    if !file_path.starts_with('/') || file_path.contains('\0') {
        return Err(outside());
    }
    if has_dot_segment(file_path) {
        return Err(FetchError::UnsafePath(format!(
            "{shown}, which leads outside the bot's own directory with . or .."
        )));
    }
    let segments: Vec<&str> = file_path.split('/').collect();
    let test_dc = format!("{token}:T");
    let bot_dir = segments[..segments.len() - 1]
        .iter()
        .rposition(|segment| *segment == token || *segment == test_dc)
        .ok_or_else(outside)?;
    let working_dir = match segments[..bot_dir].join("/") {
        root if root.is_empty() => "/".to_owned(),
        dir => dir,
    };
    Ok(LocalPath { path: PathBuf::from(file_path), working_dir, shown })
}

/// Whether `path` has a `.` or `..` segment, which no path a Bot API server gives has, and
/// which could lead out of where it should be.
fn has_dot_segment(path: &str) -> bool {
    path.split('/').any(|segment| segment == "." || segment == "..")
}

/// `text` with the bot token replaced by `<token>`: a local server's paths hold it.
fn hide_token(text: &str, token: &str) -> String {
    if token.is_empty() { text.to_owned() } else { text.replace(token, "<token>") }
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

    const TOKEN: &str = "123:abc";

    fn files() -> TelegramFiles {
        let api = "http://127.0.0.1:8081/prefix".parse().unwrap();
        TelegramFiles::new(TOKEN, &api, Duration::from_secs(1), Duration::from_secs(1)).unwrap()
    }

    #[test]
    fn a_relative_file_path_stays_under_the_servers_file_route() {
        let files = files();
        assert_eq!(
            files.file_url("documents/file_0.pdf").unwrap().as_str(),
            "http://127.0.0.1:8081/prefix/file/bot123:abc/documents/file_0.pdf"
        );
        for escaping in [
            "../../bot123:abc/getMe",
            "documents/../../x",
            "./documents/file_0.pdf",
            "%2e%2e/%2e%2e/x",
            "//elsewhere.example/file",
            "http://elsewhere.example/file",
            "documents/file_0.pdf?x=1",
            "documents/file_0.pdf#x",
            "documents\\..\\x",
        ] {
            let refused = files.file_url(escaping).unwrap_err();
            assert!(matches!(refused, FetchError::UnsafePath(_)), "{escaping}: {refused:?}");
            assert!(refused.is_lasting(), "{escaping}");
        }
    }

    #[test]
    fn a_local_path_is_read_only_below_the_directory_named_by_the_token() {
        let local = local_path(TOKEN, "/var/lib/telegram-bot-api/123:abc/documents/file_0.pdf").unwrap();
        assert_eq!(local.working_dir, "/var/lib/telegram-bot-api");
        assert_eq!(local.shown, "/var/lib/telegram-bot-api/<token>/documents/file_0.pdf");
        assert_eq!(local.path, PathBuf::from("/var/lib/telegram-bot-api/123:abc/documents/file_0.pdf"));
        let test_servers = local_path(TOKEN, "/data/123:abc:T/photos/file_1.jpg").unwrap();
        assert_eq!(test_servers.working_dir, "/data");
        assert_eq!(local_path(TOKEN, "/123:abc/voice/file_2.oga").unwrap().working_dir, "/");

        for refused in [
            "/etc/passwd",
            "/proc/self/environ",
            "/var/lib/telegram-bot-api/123:abc",
            "/var/lib/telegram-bot-api/123:abcd/documents/file_0.pdf",
            "/var/lib/telegram-bot-api/999:xyz/documents/file_0.pdf",
            "/var/lib/telegram-bot-api/123:abc/../../../etc/passwd",
            "/var/lib/telegram-bot-api/123:abc/./documents/file_0.pdf",
            "/var/lib/telegram-bot-api/123:abc/documents/file\0.pdf",
            "var/lib/telegram-bot-api/123:abc/documents/file_0.pdf",
        ] {
            let error = local_path(TOKEN, refused).unwrap_err();
            assert!(matches!(error, FetchError::UnsafePath(_)), "{refused}: {error:?}");
            assert!(!error.to_string().contains(TOKEN), "the token stays hidden: {error}");
        }
    }

    async fn read_all(download: Download) -> Vec<u8> {
        let chunks: Vec<Bytes> = download.bytes.try_collect().await.unwrap();
        chunks.concat()
    }

    #[tokio::test]
    async fn a_local_file_is_read_whole_and_a_link_out_of_the_bots_directory_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let documents = dir.path().join(TOKEN).join("documents");
        std::fs::create_dir_all(&documents).unwrap();
        std::fs::write(documents.join("file_0.pdf"), b"the bot's file").unwrap();
        std::fs::write(dir.path().join("secret"), b"not the bot's").unwrap();
        std::os::unix::fs::symlink(dir.path().join("secret"), documents.join("out")).unwrap();
        std::os::unix::fs::symlink(documents.join("file_0.pdf"), documents.join("in")).unwrap();
        let files = files();
        let path = |name: &str| documents.join(name).display().to_string();

        let download = files.download(&path("file_0.pdf")).await.unwrap();
        assert_eq!(download.size, Some(14));
        assert_eq!(read_all(download).await, b"the bot's file");
        let within = files.download(&path("in")).await.unwrap();
        assert_eq!(
            read_all(within).await,
            b"the bot's file",
            "a link within the bot's directory is followed"
        );

        let Err(FetchError::UnsafePath(out)) = files.download(&path("out")).await else {
            panic!("followed out")
        };
        assert!(out.contains("outside the bot's own directory") && !out.contains(TOKEN), "{out}");
        let Err(FetchError::UnsafePath(folder)) = files.download(&documents.display().to_string()).await
        else {
            panic!("a folder was read")
        };
        assert!(folder.contains("not a regular file"), "{folder}");

        let missing = files.download(&path("file_9.pdf")).await.err().unwrap();
        let FetchError::LocalUnreadable { path: shown, working_dir, .. } = &missing else {
            panic!("{missing:?}")
        };
        assert_eq!(working_dir, &dir.path().display().to_string());
        assert!(shown.ends_with("/<token>/documents/file_9.pdf"), "{shown}");
        assert!(missing.to_string().contains("mount the server's working directory"), "{missing}");
        assert!(missing.is_lasting());
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
