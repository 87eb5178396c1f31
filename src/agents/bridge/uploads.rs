//! The files of a reply, staged (DESIGN.md §14). The plugin streams each file to the daemon
//! (`POST uploads`), which writes it into a folder of its own beside the ledger and names
//! it by an upload id; a reply then names its uploads. The daemon never opens a path an
//! agent names.
//!
//! Staged files live in memory's index only: what a daemon that stopped left in the folder
//! is removed at start-up, an upload no reply named is removed after [`STALE_UPLOAD_AGE`],
//! and a reply's files are removed once it is done (delivered, refused or given up).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::{Stream, StreamExt};
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

use super::{Bridge, ToolError};
use crate::agents::api::wire::UploadReceipt;
use crate::agents::unfinished::UnfinishedFile;
use crate::ids::AgentName;
use crate::rules::media::{self, MAX_REPLY_FILES, TELEGRAM_UPLOAD_LIMIT};
use crate::telegram::outbound::PlannedFile;

/// All staged files together may hold this much: the files of a few replies at
/// Telegram's largest.
pub const MAX_STAGED_BYTES: u64 = 4 * MAX_REPLY_FILES as u64 * TELEGRAM_UPLOAD_LIMIT;

/// An upload no reply named within this long was left behind (its plugin went away).
pub const STALE_UPLOAD_AGE: Duration = Duration::from_secs(3600);

/// A file name as Telegram shows it keeps at most this many bytes.
const MAX_UPLOAD_NAME_BYTES: usize = 200;

/// Why an upload was not staged, or a reply's uploads cannot be sent.
#[derive(Debug, thiserror::Error)]
pub enum UploadError {
    #[error(transparent)]
    Tool(#[from] ToolError),
    #[error(
        "{name} is {size} bytes or more; Telegram takes files of at most {limit} bytes (50 MB): nothing was sent",
        limit = TELEGRAM_UPLOAD_LIMIT
    )]
    TooLarge { name: String, size: u64 },
    #[error(
        "the daemon holds {MAX_STAGED_BYTES} bytes of staged files already; try again once a reply is done"
    )]
    StagingFull,
    #[error(
        "no staged upload {0} of yours (never uploaded, or already used or cleaned up): nothing was sent"
    )]
    Unknown(String),
    #[error("the upload broke off: {0}; nothing was staged")]
    Transfer(String),
    #[error("the daemon could not stage the file: {0}")]
    Io(String),
}

/// An upload id is this prefix and this many random bytes in hex; it is also the staged
/// file's name, which is how start-up knows the files that are its own to remove.
const UPLOAD_ID_PREFIX: &str = "up_";
const UPLOAD_ID_BYTES: usize = 12;

/// Whether `name` is an upload id as [`Staging::stage`] makes them.
fn is_upload_id(name: &str) -> bool {
    name.strip_prefix(UPLOAD_ID_PREFIX).is_some_and(|hex| {
        hex.len() == 2 * UPLOAD_ID_BYTES
            && hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// A file staged for a reply.
#[derive(Debug, Clone)]
struct Staged {
    agent: AgentName,
    name: String,
    size: u64,
    sha256: String,
    path: PathBuf,
    at: Instant,
}

/// The staging folder and what it holds.
#[derive(Debug)]
pub struct Staging {
    dir: PathBuf,
    staged: Mutex<HashMap<String, Staged>>,
}

impl Staging {
    /// Opens (creating it, private) the staging folder and removes the uploads in it: they
    /// were left by a daemon that stopped, and no reply of this one can name them. Only
    /// files named as this daemon names an upload go: `uploads_dir` set to a folder that
    /// holds anything else (the ledger's own, say) loses nothing.
    pub fn open(dir: PathBuf) -> std::io::Result<Self> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&dir)?;
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            let path = entry.path();
            if path.is_file() && is_upload_id(&entry.file_name().to_string_lossy()) {
                tracing::info!(file = %path.display(), "removing a staged upload left by an earlier run");
                std::fs::remove_file(&path)?;
            }
        }
        Ok(Self { dir, staged: Mutex::default() })
    }

    /// Where this daemon stages: `[storage] uploads_dir` when set; else beside a SQLite
    /// ledger, or beside the configuration file on PostgreSQL (`switchboard.toml` stages
    /// into `switchboard.uploads/`). Only the leader opens it, so replicas on one machine
    /// share it: the one elected after a leader died removes what that leader left, as a
    /// restart does.
    pub fn dir_for(settings: &crate::config::Settings) -> PathBuf {
        if let Some(dir) = &settings.storage.uploads_dir {
            return dir.clone();
        }
        match &settings.storage.database {
            crate::config::Database::Sqlite(path) => Self::dir_beside(path),
            crate::config::Database::Postgres(_) => settings.source.with_extension("uploads"),
        }
    }

    /// The folder beside a ledger file: `ledger.db` stages into `ledger.db.uploads/`.
    pub fn dir_beside(database: &Path) -> PathBuf {
        let mut name = database.file_name().map(|n| n.to_os_string()).unwrap_or_default();
        name.push(".uploads");
        database.with_file_name(name)
    }

    fn index(&self) -> std::sync::MutexGuard<'_, HashMap<String, Staged>> {
        self.staged.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Streams a file into the folder, hashing it as it comes; refused past Telegram's
    /// upload limit or the folder's cap, and then nothing stays. `announced` is the size
    /// the plugin's check saw: it refuses a file known too large before any byte and counts
    /// against the cap, but what is staged is the body, whatever its length turns out.
    async fn stage<E: std::fmt::Display>(
        &self,
        agent: &AgentName,
        name: &str,
        announced: Option<u64>,
        body: impl Stream<Item = Result<Bytes, E>>,
    ) -> Result<UploadReceipt, UploadError> {
        self.remove_stale();
        let name = upload_name(name);
        if let Some(size) = announced.filter(|size| *size > TELEGRAM_UPLOAD_LIMIT) {
            return Err(UploadError::TooLarge { name, size });
        }
        let held: u64 = self.index().values().map(|s| s.size).sum();
        if held + announced.unwrap_or(0) > MAX_STAGED_BYTES {
            return Err(UploadError::StagingFull);
        }
        let upload_id = format!("{UPLOAD_ID_PREFIX}{}", hex::encode(rand::random::<[u8; UPLOAD_ID_BYTES]>()));
        let path = self.dir.join(&upload_id);
        // Until the file is in the index, nothing else would ever remove it: a refused
        // body, or a caller gone while it is written, leaves nothing behind.
        let unfinished = UnfinishedFile::new(path.clone());
        let (size, sha256) = write_hashed(&path, &name, body).await?;
        let staged = Staged {
            agent: agent.clone(),
            name: name.clone(),
            size,
            sha256: sha256.clone(),
            path,
            at: Instant::now(),
        };
        self.index().insert(upload_id.clone(), staged);
        unfinished.keep();
        tracing::info!(%agent, upload_id, size, "upload staged");
        Ok(UploadReceipt { upload_id, name, size, sha256 })
    }

    /// The staged files `ids` name, all of them `agent`'s, as the parts of a reply; taken
    /// out of the index (the reply owns them now). Refused whole when one is not there.
    fn take(&self, agent: &AgentName, ids: &[String]) -> Result<StagedFiles, UploadError> {
        self.remove_stale();
        let mut index = self.index();
        if let Some(missing) = ids.iter().find(|id| index.get(*id).is_none_or(|s| &s.agent != agent)) {
            return Err(UploadError::Unknown(missing.clone()));
        }
        let files = ids
            .iter()
            .filter_map(|id| index.remove(id))
            .map(|s| PlannedFile {
                descriptor: PlannedFile::describe(&s.name, s.size, &s.sha256),
                kind: media::upload_kind(&s.name, s.size),
                path: s.path,
                name: s.name,
                size: s.size,
            })
            .collect();
        Ok(StagedFiles { files, armed: true })
    }

    fn remove_stale(&self) {
        let stale: Vec<Staged> = {
            let mut index = self.index();
            let ids: Vec<String> = index
                .iter()
                .filter(|(_, s)| s.at.elapsed() > STALE_UPLOAD_AGE)
                .map(|(id, _)| id.clone())
                .collect();
            ids.iter().filter_map(|id| index.remove(id)).collect()
        };
        for staged in stale {
            tracing::info!(file = %staged.path.display(), "removing an upload no reply named");
            let _ = std::fs::remove_file(&staged.path);
        }
    }
}

/// The staged files of one reply. Until a delivery takes them over (`disarm`), dropping
/// this removes them: a refused reply, or a request that went away, leaves nothing.
#[derive(Debug)]
pub struct StagedFiles {
    pub files: Vec<PlannedFile>,
    armed: bool,
}

impl StagedFiles {
    pub fn none() -> Self {
        Self { files: Vec::new(), armed: false }
    }

    /// Hands the files over to a delivery, which removes them once it is done.
    pub fn disarm(mut self) {
        self.armed = false;
    }
}

impl Drop for StagedFiles {
    fn drop(&mut self) {
        if self.armed {
            remove_files(&self.files);
        }
    }
}

/// Removes the staged copies of a reply's files.
pub fn remove_files(files: &[PlannedFile]) {
    for file in files {
        if let Err(e) = std::fs::remove_file(&file.path) {
            tracing::warn!(file = %file.path.display(), error = %e, "could not remove a staged upload");
        }
    }
}

/// A name Telegram can show: the last path component of what the plugin sent, bounded.
fn upload_name(name: &str) -> String {
    let last = name.rsplit(['/', '\\']).next().unwrap_or_default();
    let cleaned: String = last.chars().map(|c| if c.is_control() { '_' } else { c }).collect();
    let cleaned = within_name_limit(cleaned.trim());
    if cleaned.is_empty() || cleaned == "." || cleaned == ".." { "file".to_owned() } else { cleaned }
}

/// An extension longer than this is no extension (a name with a dot in a sentence).
const MAX_EXTENSION_BYTES: usize = 16;

/// `name` within [`MAX_UPLOAD_NAME_BYTES`]: a long name loses the end of its stem, never its
/// extension, which is what Telegram and the user's device open the file by (and what makes
/// a reply's `.png` a photo).
fn within_name_limit(name: &str) -> String {
    if name.len() <= MAX_UPLOAD_NAME_BYTES {
        return name.to_owned();
    }
    let extension = name
        .rsplit_once('.')
        .map(|(_, extension)| extension)
        .filter(|extension| !extension.is_empty() && extension.len() <= MAX_EXTENSION_BYTES)
        .filter(|extension| extension.chars().all(|c| c.is_alphanumeric()))
        .map_or(String::new(), |extension| format!(".{extension}"));
    let mut stem = name[..name.len() - extension.len()].to_owned();
    while stem.len() + extension.len() > MAX_UPLOAD_NAME_BYTES {
        stem.pop();
    }
    stem.truncate(stem.trim_end().len());
    stem + &extension
}

async fn write_hashed<E: std::fmt::Display>(
    path: &Path,
    name: &str,
    body: impl Stream<Item = Result<Bytes, E>>,
) -> Result<(u64, String), UploadError> {
    let io = |e: std::io::Error| UploadError::Io(e.to_string());
    let mut file = tokio::fs::OpenOptions::new().write(true).create_new(true).open(path).await.map_err(io)?;
    let mut hasher = Sha256::new();
    let mut size: u64 = 0;
    let mut body = std::pin::pin!(body);
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| UploadError::Transfer(e.to_string()))?;
        size += chunk.len() as u64;
        if size > TELEGRAM_UPLOAD_LIMIT {
            return Err(UploadError::TooLarge { name: name.to_owned(), size });
        }
        hasher.update(&chunk);
        file.write_all(&chunk).await.map_err(io)?;
    }
    file.flush().await.map_err(io)?;
    Ok((size, hex::encode(hasher.finalize())))
}

impl Bridge {
    /// The staging folder, once the daemon has opened it (`app`).
    pub fn set_staging(&self, staging: Staging) {
        let _ = self.inner.staging.set(Arc::new(staging));
    }

    fn staging(&self) -> Result<&Staging, ToolError> {
        self.inner
            .staging
            .get()
            .map(Arc::as_ref)
            .ok_or_else(|| ToolError::Invalid("this daemon does not take files".into()))
    }

    /// `POST uploads`: stages one file of a reply to come.
    pub async fn stage_upload<E: std::fmt::Display>(
        &self,
        agent: &AgentName,
        token: Option<&str>,
        name: &str,
        announced: Option<u64>,
        body: impl Stream<Item = Result<Bytes, E>>,
    ) -> Result<UploadReceipt, UploadError> {
        self.live_session(agent, token)?;
        self.staging()?.stage(agent, name, announced, body).await
    }

    /// The staged files a reply names (at most [`MAX_REPLY_FILES`]), all the caller's.
    pub(super) fn take_uploads(&self, agent: &AgentName, ids: &[String]) -> Result<StagedFiles, ToolError> {
        if ids.is_empty() {
            return Ok(StagedFiles::none());
        }
        if ids.len() > MAX_REPLY_FILES {
            return Err(ToolError::Invalid(format!(
                "a reply takes at most {MAX_REPLY_FILES} files, not {}; nothing was sent",
                ids.len()
            )));
        }
        self.staging()?.take(agent, ids).map_err(|error| match error {
            UploadError::Tool(error) => error,
            UploadError::Unknown(_) => ToolError::UnknownUpload(error.to_string()),
            other => ToolError::Invalid(other.to_string()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_upload_is_named_by_its_last_component_only() {
        assert_eq!(upload_name("/home/a/shot.png"), "shot.png");
        assert_eq!(upload_name("..\\..\\x.txt"), "x.txt");
        assert_eq!(upload_name(".."), "file");
        assert_eq!(upload_name("a\u{7}b"), "a_b");
        assert!(upload_name(&"n".repeat(500)).len() <= MAX_UPLOAD_NAME_BYTES);
    }

    #[test]
    fn a_long_name_loses_the_end_of_its_stem_and_keeps_its_extension() {
        let long = format!("{}.png", "é".repeat(150));
        let name = upload_name(&long);
        assert!(name.len() <= MAX_UPLOAD_NAME_BYTES, "{} bytes", name.len());
        assert!(name.ends_with(".png") && name.starts_with("éé"), "{name}");
        assert_eq!(upload_name("report.final.pdf"), "report.final.pdf", "a short name stays whole");
        // No extension to keep: the end goes.
        let plain = upload_name(&format!("{}.{}", "a".repeat(150), "b".repeat(100)));
        assert_eq!(plain.len(), MAX_UPLOAD_NAME_BYTES);
    }

    /// The caller goes away while its file is being written (the request's future is
    /// dropped at an await): the half-written file does not stay in the folder.
    #[tokio::test]
    async fn an_upload_whose_caller_goes_away_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let staging = Staging::open(dir.path().join("s")).unwrap();
        let agent = AgentName::parse("worker").unwrap();
        let first = futures::stream::iter([Ok::<_, std::io::Error>(Bytes::from_static(b"abc"))]);
        let body = first.chain(futures::stream::pending());
        let staged =
            tokio::time::timeout(Duration::from_millis(200), staging.stage(&agent, "a.bin", None, body));
        assert!(staged.await.is_err(), "the body never ends: the caller gives up");
        let left: Vec<_> = std::fs::read_dir(dir.path().join("s")).unwrap().collect();
        assert!(left.is_empty(), "{left:?}");
    }

    #[tokio::test]
    async fn staging_keeps_to_the_limit_and_a_reply_takes_only_its_agents_uploads() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("s")).unwrap();
        let orphan = dir.path().join("s/up_0123456789abcdef01234567");
        std::fs::write(&orphan, b"x").unwrap();
        std::fs::write(dir.path().join("s/switchboard.db"), b"not ours").unwrap();
        let staging = Staging::open(dir.path().join("s")).unwrap();
        assert!(!orphan.exists(), "orphans are removed at start-up");
        assert!(dir.path().join("s/switchboard.db").exists(), "a file that is not an upload is left alone");

        let agent = AgentName::parse("worker").unwrap();
        let other = AgentName::parse("orchestrator").unwrap();
        let body = futures::stream::iter([Ok::<_, std::io::Error>(Bytes::from_static(b"abc"))]);
        let receipt = staging.stage(&agent, "a.png", Some(3), body).await.unwrap();
        assert_eq!(receipt.size, 3);
        assert_eq!(receipt.sha256, hex::encode(Sha256::digest(b"abc")));

        let too_large = futures::stream::iter([Ok::<_, std::io::Error>(Bytes::new())]);
        let refused = staging.stage(&agent, "big.bin", Some(TELEGRAM_UPLOAD_LIMIT + 1), too_large).await;
        assert!(matches!(refused, Err(UploadError::TooLarge { .. })));

        assert!(matches!(
            staging.take(&other, std::slice::from_ref(&receipt.upload_id)),
            Err(UploadError::Unknown(_))
        ));
        let taken = staging.take(&agent, std::slice::from_ref(&receipt.upload_id)).unwrap();
        assert_eq!(taken.files[0].kind, media::UploadKind::Photo);
        let path = taken.files[0].path.clone();
        assert!(path.exists());
        drop(taken);
        assert!(!path.exists(), "a reply that never took its files over removes them");
        assert!(matches!(staging.take(&agent, &[receipt.upload_id]), Err(UploadError::Unknown(_))));
    }
}
