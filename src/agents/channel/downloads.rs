//! Attachments into the agent's inbox (DESIGN.md §14): `download_attachment`, and the
//! photo fetched before its envelope is pushed (`meta.image_path`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::agents::api::client::{ClientError, DaemonClient};
use crate::agents::api::wire::{AttachmentQuery, DeliveredEnvelope};

use super::inbox::{Inbox, InboxError};

/// An envelope waits at most this long after its arrival for its photo; then the download
/// is given up and the envelope pushed without `image_path` (`download_attachment` fetches
/// the photo later). What the stream brought after the envelope waits behind it, to keep
/// their order, so this is also the most a photo delays the next message: long enough for
/// a photo Telegram serves promptly, short enough not to hold back what the person says
/// next.
pub const EAGER_DOWNLOAD_TIMEOUT: Duration = Duration::from_secs(5);

/// The meta key that names the file of an envelope's photo.
pub const IMAGE_PATH_KEY: &str = "image_path";

/// A file saved in the inbox.
#[derive(Debug)]
pub struct Saved {
    pub path: PathBuf,
    pub kind: String,
    pub bytes: u64,
}

/// Why a download did not end in the inbox.
#[derive(Debug, thiserror::Error)]
pub enum DownloadFailure {
    /// The daemon refused or could not be asked; its text is for the model.
    #[error(transparent)]
    Daemon(ClientError),
    #[error("{0}; nothing was saved")]
    Inbox(InboxError),
}

/// Fetches an attachment from the daemon and streams it into the inbox.
pub async fn download_into(
    daemon: &DaemonClient,
    inbox: &Inbox,
    trace_id: &str,
    query: &AttachmentQuery,
) -> Result<Saved, DownloadFailure> {
    let download = daemon.download_attachment(trace_id, query).await.map_err(DownloadFailure::Daemon)?;
    let name = if download.name.is_empty() { download.kind.clone() } else { download.name.clone() };
    let path = inbox.receive(&name, download.size, download.bytes).await.map_err(DownloadFailure::Inbox)?;
    let bytes = tokio::fs::metadata(&path).await.map(|m| m.len()).unwrap_or_default();
    Ok(Saved { path, kind: download.kind, bytes })
}

/// The photo of an envelope that should be fetched before it is pushed: its file id, when
/// its meta says it carries a photo no larger than `max_bytes` (a size it does not say
/// is checked by the daemon against the same limit). `None` when eager downloads are off.
pub fn eager_photo(extra: &BTreeMap<String, String>, max_bytes: u64) -> Option<String> {
    if max_bytes == 0 || extra.get("attachment_kind").map(String::as_str) != Some("photo") {
        return None;
    }
    let size = extra.get("attachment_size").and_then(|size| size.parse::<u64>().ok());
    if size.is_some_and(|size| size > max_bytes) {
        return None;
    }
    extra.get("attachment_file_id").cloned()
}

/// Fetches the envelope's photo into the inbox and names it in `meta.image_path`, giving
/// up at `give_up_at`. Any failure (refused, too large, timed out) leaves the envelope as
/// it was: it is pushed anyway, a little later at most.
pub async fn attach_image_path(
    daemon: &DaemonClient,
    inbox: &Inbox,
    envelope: &mut DeliveredEnvelope,
    max_bytes: u64,
    give_up_at: tokio::time::Instant,
) {
    let Some(file_id) = eager_photo(&envelope.extra, max_bytes) else { return };
    let query = AttachmentQuery { file_id: Some(file_id), max_bytes: Some(max_bytes) };
    let fetched =
        tokio::time::timeout_at(give_up_at, download_into(daemon, inbox, &envelope.trace_id, &query));
    match fetched.await {
        Ok(Ok(saved)) => {
            envelope.extra.insert(IMAGE_PATH_KEY.to_owned(), saved.path.display().to_string());
        }
        Ok(Err(error)) => {
            tracing::warn!(trace_id = %envelope.trace_id, "the photo was not fetched ahead ({error}); pushing the message without image_path");
        }
        Err(_) => {
            tracing::warn!(trace_id = %envelope.trace_id, "the photo was not fetched within {}s of the message's arrival; pushing the message without image_path", EAGER_DOWNLOAD_TIMEOUT.as_secs());
        }
    }
}

/// What `download_attachment` answers.
pub fn describe_saved(saved: &Saved) -> String {
    format!(
        "Saved the {} ({} bytes) to {}",
        if saved.kind.is_empty() { "file" } else { &saved.kind },
        saved.bytes,
        saved.path.display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    #[test]
    fn only_a_photo_within_the_limit_is_fetched_ahead() {
        let photo =
            meta(&[("attachment_kind", "photo"), ("attachment_file_id", "p1"), ("attachment_size", "500")]);
        assert_eq!(eager_photo(&photo, 500).as_deref(), Some("p1"));
        assert_eq!(eager_photo(&photo, 499), None, "too large");
        assert_eq!(eager_photo(&photo, 0), None, "eager downloads off");
        let without_size = meta(&[("attachment_kind", "photo"), ("attachment_file_id", "p1")]);
        assert_eq!(eager_photo(&without_size, 10).as_deref(), Some("p1"), "the daemon checks the size");
        let document = meta(&[("attachment_kind", "document"), ("attachment_file_id", "d1")]);
        assert_eq!(eager_photo(&document, 500), None);
        assert_eq!(eager_photo(&BTreeMap::new(), 500), None);
    }
}
