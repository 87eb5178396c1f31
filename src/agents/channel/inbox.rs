//! The plugin's inbox (DESIGN.md §14): the folder on the agent's machine where downloaded
//! attachments land. A file is streamed into a temporary file, synced and renamed, so a
//! path the agent is given always holds the whole file; names are made safe; the folder
//! keeps to a size budget by removing its oldest files first.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures::{Stream, StreamExt};
use tokio::io::AsyncWriteExt;

use crate::agents::unfinished::UnfinishedFile;
use crate::ids::AgentName;

/// The default budget of an inbox (`--inbox-max-mb`).
pub const DEFAULT_INBOX_MAX_MB: u64 = 500;

/// A file name keeps at most this many bytes of the sender's name (most file systems
/// allow 255 per name; the unique prefix comes on top).
const MAX_NAME_BYTES: usize = 120;

/// The name of a file whose own name has nothing usable left.
const FALLBACK_NAME: &str = "file";

/// A download that moves no byte for this long has stalled: it is given up, and the
/// partial file removed.
const IDLE_CHUNK_TIMEOUT: Duration = Duration::from_secs(60);

/// Files being written end in this; they are never handed out, and count in the budget
/// (one left by a crash is removed like any old file).
const PARTIAL_SUFFIX: &str = ".part";

/// The default inbox of an agent: `$XDG_STATE_HOME/switchboard/inbox/<agent>`, else
/// `~/.local/state/switchboard/inbox/<agent>`; `None` when neither variable is set.
pub fn default_dir(agent: &AgentName) -> Option<PathBuf> {
    let state_home = std::env::var_os("XDG_STATE_HOME")
        .map(PathBuf::from)
        .filter(|path| path.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".local/state")))?;
    Some(state_home.join("switchboard").join("inbox").join(agent.as_str()))
}

/// Why a file did not land in the inbox.
#[derive(Debug, thiserror::Error)]
pub enum InboxError {
    #[error("the file is {size} bytes, more than the whole inbox may hold ({budget} bytes, --inbox-max-mb)")]
    OverBudget { size: u64, budget: u64 },
    #[error("the download broke off: {0}")]
    Transfer(String),
    #[error("the download stalled: no data for {}s", IDLE_CHUNK_TIMEOUT.as_secs())]
    Stalled,
    #[error("the file was {got} bytes where {expected} were announced")]
    Truncated { got: u64, expected: u64 },
    #[error("the inbox {dir} cannot be written: {error}")]
    Io { dir: String, error: std::io::Error },
}

/// A file in the inbox, as the budget sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InboxEntry {
    pub name: String,
    pub size: u64,
    pub modified: SystemTime,
}

/// The files to remove, oldest first, so that `incoming` more bytes fit in `budget`; an
/// incoming file larger than the whole budget is refused instead.
pub fn plan_cleanup(entries: &[InboxEntry], budget: u64, incoming: u64) -> Result<Vec<String>, InboxError> {
    if incoming > budget {
        return Err(InboxError::OverBudget { size: incoming, budget });
    }
    let mut oldest_first: Vec<&InboxEntry> = entries.iter().collect();
    oldest_first.sort_by(|a, b| a.modified.cmp(&b.modified).then_with(|| a.name.cmp(&b.name)));
    let mut total: u64 = entries.iter().map(|e| e.size).sum();
    let mut remove = Vec::new();
    for entry in oldest_first {
        if total.saturating_add(incoming) <= budget {
            break;
        }
        total -= entry.size;
        remove.push(entry.name.clone());
    }
    Ok(remove)
}

/// A name safe to create in the inbox and to pass to a shell: `prefix`, a dash, and what
/// is left of `name` with every character but letters, digits and `.-_+,@=` replaced (no
/// path separator, no control character, nothing a shell reads as syntax, no space that
/// would split an unquoted argument), runs of dots made one, no leading dot (no hidden
/// file, no `..`), and at most [`MAX_NAME_BYTES`] bytes, keeping the extension. The sender
/// chooses a document's name, and the model may paste the path into a command.
pub fn safe_file_name(name: &str, prefix: &str) -> String {
    let mut cleaned = String::with_capacity(name.len());
    for c in name.chars() {
        let c = if c.is_alphanumeric() || ".-_+,@=".contains(c) { c } else { '_' };
        if c == '.' && cleaned.ends_with('.') {
            continue;
        }
        cleaned.push(c);
    }
    let trimmed = cleaned.trim_start_matches(['.', '_']).trim_end_matches('_');
    let mut safe = if trimmed.is_empty() { FALLBACK_NAME.to_owned() } else { trimmed.to_owned() };
    if safe.len() > MAX_NAME_BYTES {
        safe = shorten_keeping_extension(&safe, MAX_NAME_BYTES);
    }
    format!("{prefix}-{safe}")
}

fn shorten_keeping_extension(name: &str, max: usize) -> String {
    let (stem, extension) = match name.rsplit_once('.') {
        // An extension is short; a "dot" deep in a long name is not one.
        Some((stem, extension)) if !stem.is_empty() && extension.len() <= 16 => (stem, Some(extension)),
        _ => (name, None),
    };
    let room = max - extension.map_or(0, |e| e.len() + 1);
    let mut cut = room.min(stem.len());
    while !stem.is_char_boundary(cut) {
        cut -= 1;
    }
    match extension {
        Some(extension) => format!("{}.{extension}", &stem[..cut]),
        None => stem[..cut].to_owned(),
    }
}

/// An inbox folder and its budget.
#[derive(Debug, Clone)]
pub struct Inbox {
    dir: PathBuf,
    budget: u64,
}

impl Inbox {
    /// `dir` made absolute against the working directory.
    pub fn new(dir: PathBuf, budget_bytes: u64) -> std::io::Result<Self> {
        let dir = std::path::absolute(dir)?;
        Ok(Self { dir, budget: budget_bytes })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Streams `bytes` into a new file named after `name`, and answers its absolute path.
    /// Older files make room first when `size` (announced) would not fit; a file without
    /// an announced size that outgrows the budget is given up. Only a complete file is
    /// ever at the returned path.
    pub async fn receive(
        &self,
        name: &str,
        size: Option<u64>,
        bytes: impl Stream<Item = std::io::Result<Bytes>>,
    ) -> Result<PathBuf, InboxError> {
        let io = |error| InboxError::Io { dir: self.dir.display().to_string(), error };
        create_private_dir(&self.dir).await.map_err(io)?;
        self.make_room(size.unwrap_or(0)).await.map_err(|e| match e {
            CleanupError::Budget(e) => e,
            CleanupError::Io(e) => io(e),
        })?;
        let final_name = safe_file_name(name, &unique_prefix());
        let final_path = self.dir.join(&final_name);
        let partial = self.dir.join(format!(".{final_name}{PARTIAL_SUFFIX}"));
        // Removed on every way out but the rename: an error, or a caller that gives up
        // (the eager photo fetch's timeout, the plugin asked to stop) mid-download.
        let unfinished = UnfinishedFile::new(partial.clone());
        self.write_partial(&partial, size, bytes).await?;
        tokio::fs::rename(&partial, &final_path).await.map_err(io)?;
        unfinished.keep();
        // The rename is durable once the folder is synced too.
        if let Ok(dir) = tokio::fs::File::open(&self.dir).await {
            let _ = dir.sync_all().await;
        }
        Ok(final_path)
    }

    async fn write_partial(
        &self,
        partial: &Path,
        size: Option<u64>,
        bytes: impl Stream<Item = std::io::Result<Bytes>>,
    ) -> Result<(), InboxError> {
        let io = |error| InboxError::Io { dir: self.dir.display().to_string(), error };
        // Readable by this user only, whatever the folder's mode: a folder given with
        // --inbox may be one others can list.
        let mut file = tokio::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(partial)
            .await
            .map_err(io)?;
        let mut bytes = std::pin::pin!(bytes);
        let mut written: u64 = 0;
        loop {
            let chunk = match tokio::time::timeout(IDLE_CHUNK_TIMEOUT, bytes.next()).await {
                Err(_) => return Err(InboxError::Stalled),
                Ok(None) => break,
                Ok(Some(Err(e))) => return Err(InboxError::Transfer(e.to_string())),
                Ok(Some(Ok(chunk))) => chunk,
            };
            written += chunk.len() as u64;
            if written > self.budget {
                return Err(InboxError::OverBudget { size: written, budget: self.budget });
            }
            file.write_all(&chunk).await.map_err(io)?;
        }
        if let Some(expected) = size.filter(|expected| *expected != written) {
            return Err(InboxError::Truncated { got: written, expected });
        }
        file.flush().await.map_err(io)?;
        file.sync_all().await.map_err(io)?;
        Ok(())
    }

    /// Removes the oldest files until `incoming` more bytes fit in the budget.
    async fn make_room(&self, incoming: u64) -> Result<(), CleanupError> {
        let mut entries = Vec::new();
        let mut listing = tokio::fs::read_dir(&self.dir).await.map_err(CleanupError::Io)?;
        while let Some(entry) = listing.next_entry().await.map_err(CleanupError::Io)? {
            let Ok(meta) = entry.metadata().await else { continue };
            if !meta.is_file() || !is_inbox_file(&entry.file_name().to_string_lossy()) {
                continue;
            }
            entries.push(InboxEntry {
                name: entry.file_name().to_string_lossy().into_owned(),
                size: meta.len(),
                modified: meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
            });
        }
        for name in plan_cleanup(&entries, self.budget, incoming).map_err(CleanupError::Budget)? {
            tracing::info!(file = %name, "inbox over its budget: removing its oldest file");
            if let Err(e) = tokio::fs::remove_file(self.dir.join(&name)).await {
                tracing::warn!(file = %name, error = %e, "could not remove an old inbox file");
            }
        }
        Ok(())
    }
}

enum CleanupError {
    Budget(InboxError),
    Io(std::io::Error),
}

/// A prefix that sorts by time and makes every name unique.
fn unique_prefix() -> String {
    let now = chrono::Utc::now().format("%Y%m%d-%H%M%S");
    format!("{now}-{:08x}", rand::random::<u32>())
}

/// Whether `name` is a file this inbox made: a received file (its [`unique_prefix`] and a
/// dash) or one still being written (the same, hidden, ending in [`PARTIAL_SUFFIX`]). The
/// budget counts and removes only these, so an `--inbox` pointed at a folder that holds
/// anything else never deletes it.
fn is_inbox_file(name: &str) -> bool {
    let name = match name.strip_prefix('.') {
        Some(partial) => match partial.strip_suffix(PARTIAL_SUFFIX) {
            Some(partial) => partial,
            None => return false,
        },
        None => name,
    };
    let shape = "dddddddd-dddddd-hhhhhhhh-";
    name.len() > shape.len()
        && name.bytes().zip(shape.bytes()).all(|(b, s)| match s {
            b'd' => b.is_ascii_digit(),
            b'h' => b.is_ascii_hexdigit(),
            _ => b == s,
        })
}

async fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    let mut builder = tokio::fs::DirBuilder::new();
    builder.recursive(true).mode(0o700);
    builder.create(dir).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, size: u64, age_secs: u64) -> InboxEntry {
        let modified = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000 - age_secs);
        InboxEntry { name: name.into(), size, modified }
    }

    #[test]
    fn safe_names_have_no_separators_no_dot_dot_and_no_control_characters() {
        let name = safe_file_name("../../etc/x", "p");
        assert!(name.starts_with("p-"), "{name}");
        assert!(!name.contains('/') && !name.contains(".."), "{name}");
        assert_eq!(safe_file_name("..", "p"), "p-file");
        assert_eq!(safe_file_name("a\\b\u{0}c\nd.txt", "p"), "p-a_b_c_d.txt");
        assert_eq!(safe_file_name(".hidden", "p"), "p-hidden");
        assert_eq!(safe_file_name("   ", "p"), "p-file");
        assert_eq!(safe_file_name("report.pdf", "p"), "p-report.pdf");
        assert_eq!(safe_file_name("résumé.pdf", "p"), "p-résumé.pdf");
        let shell = safe_file_name("$(curl x|sh);`id` 'a'&b.pdf", "p");
        assert!(shell.chars().all(|c| c.is_alphanumeric() || ".-_".contains(c)), "{shell}");
        assert!(shell.ends_with(".pdf"), "{shell}");
    }

    #[test]
    fn only_what_the_inbox_made_is_its_own() {
        let made = safe_file_name("report.pdf", &unique_prefix());
        assert!(is_inbox_file(&made), "{made}");
        assert!(is_inbox_file(&format!(".{made}{PARTIAL_SUFFIX}")));
        for foreign in ["report.pdf", ".bashrc", "20261207-071500-report.pdf", ".20261207-071500-0badf00d-x"]
        {
            assert!(!is_inbox_file(foreign), "{foreign}");
        }
    }

    #[test]
    fn long_names_are_bounded_and_keep_their_extension() {
        let long = format!("{}.pdf", "é".repeat(200));
        let name = safe_file_name(&long, "p");
        let kept = name.strip_prefix("p-").unwrap();
        assert!(kept.len() <= MAX_NAME_BYTES, "{} bytes", kept.len());
        assert!(kept.ends_with(".pdf"), "{kept}");
        let no_extension = safe_file_name(&"x".repeat(500), "p");
        assert_eq!(no_extension.len(), 2 + MAX_NAME_BYTES);
    }

    #[test]
    fn the_budget_removes_the_oldest_files_first_and_only_as_many_as_needed() {
        let entries = [entry("new", 100, 1), entry("old", 100, 30), entry("middle", 100, 10)];
        assert_eq!(plan_cleanup(&entries, 1000, 100).unwrap(), Vec::<String>::new());
        assert_eq!(plan_cleanup(&entries, 350, 100).unwrap(), ["old"]);
        assert_eq!(plan_cleanup(&entries, 300, 250).unwrap(), ["old", "middle", "new"]);
        assert!(matches!(
            plan_cleanup(&entries, 300, 301),
            Err(InboxError::OverBudget { size: 301, budget: 300 })
        ));
    }

    #[tokio::test]
    async fn a_received_file_is_complete_at_its_path_and_partial_ones_are_removed() {
        let dir = tempfile::tempdir().unwrap();
        let inbox = Inbox::new(dir.path().join("inbox"), 1000).unwrap();
        let chunks =
            futures::stream::iter([Ok(Bytes::from_static(b"hello ")), Ok(Bytes::from_static(b"world"))]);
        let path = inbox.receive("../greeting.txt", Some(11), chunks).await.unwrap();
        assert!(path.is_absolute() && path.starts_with(inbox.dir()), "{}", path.display());
        assert_eq!(std::fs::read(&path).unwrap(), b"hello world");

        let broken =
            futures::stream::iter([Ok(Bytes::from_static(b"half")), Err(std::io::Error::other("cut"))]);
        assert!(matches!(inbox.receive("b", None, broken).await, Err(InboxError::Transfer(_))));
        let short = futures::stream::iter([Ok(Bytes::from_static(b"abc"))]);
        assert!(matches!(inbox.receive("c", Some(5), short).await, Err(InboxError::Truncated { .. })));
        let files: Vec<_> = std::fs::read_dir(inbox.dir()).unwrap().map(|e| e.unwrap().path()).collect();
        assert_eq!(files, std::slice::from_ref(&path), "only the complete file is left");
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
    }

    /// A download whose caller gives up mid-way leaves no partial file to eat the budget.
    #[tokio::test]
    async fn a_download_given_up_mid_way_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let inbox = Inbox::new(dir.path().join("inbox"), 1000).unwrap();
        let body = futures::stream::iter([Ok(Bytes::from_static(b"half"))]).chain(futures::stream::pending());
        let given_up = tokio::time::timeout(Duration::from_millis(100), inbox.receive("p", None, body)).await;
        assert!(given_up.is_err(), "the body never ends");
        let left: Vec<_> = std::fs::read_dir(inbox.dir()).unwrap().collect();
        assert!(left.is_empty(), "{left:?}");
    }

    /// The budget makes room by removing the inbox's own oldest files, never a file of
    /// the folder it did not make (`--inbox ~/Downloads`).
    #[tokio::test]
    async fn the_budget_never_removes_a_file_the_inbox_did_not_make() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("thesis.pdf"), vec![b'x'; 600]).unwrap();
        let inbox = Inbox::new(dir.path().to_owned(), 1000).unwrap();
        let first =
            inbox.receive("a", Some(300), futures::stream::iter([Ok(Bytes::from(vec![1; 300]))])).await;
        let first = first.unwrap();
        let second =
            inbox.receive("b", Some(800), futures::stream::iter([Ok(Bytes::from(vec![2; 800]))])).await;
        second.unwrap();
        assert!(dir.path().join("thesis.pdf").exists(), "the user's own file is kept");
        assert!(!first.exists(), "the inbox's own older file made room");
    }
}
