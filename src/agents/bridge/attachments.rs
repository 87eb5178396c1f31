//! `download_attachment` on the daemon's side (DESIGN.md §14): an attachment of one of the
//! calling agent's envelopes, fetched from Telegram and streamed through to the plugin,
//! which writes it on the agent's machine. The daemon holds the bot token, so it fetches;
//! it keeps none of the bytes.

use std::sync::Arc;

use bytes::Bytes;
use futures::stream::BoxStream;

use super::{Bridge, ResolveError, ToolError};
use crate::ids::{AgentName, TraceId};
use crate::ledger::StoredEnvelope;
use crate::rules::media::{self, AttachmentRef, DownloadRefusal};
use crate::telegram::files::{FetchError, TelegramFiles};

/// An attachment on its way: what the plugin needs to name the file, and its bytes.
pub struct AttachmentDownload {
    pub kind: String,
    pub file_id: String,
    /// A name for the file: the sender's, else the last part of Telegram's path.
    pub name: String,
    /// Its size, when Telegram said (the body then has exactly this many bytes).
    pub size: Option<u64>,
    pub bytes: BoxStream<'static, std::io::Result<Bytes>>,
}

/// Why an attachment was not handed over.
#[derive(Debug, thiserror::Error)]
pub enum AttachmentError {
    /// Not the live session, not the caller's envelope, a bad trace id, the ledger.
    #[error(transparent)]
    Tool(#[from] ToolError),
    /// Nothing was fetched: the attachment is not there, or too large.
    #[error("{0}; nothing was downloaded")]
    Refused(DownloadRefusal),
    /// Telegram did not hand the file over.
    #[error("{0}; nothing was downloaded, try again later")]
    Unavailable(FetchError),
    /// The server named a file the daemon cannot or will not read (a local Bot API
    /// server's disk this machine does not share): asking again reads the same path, so
    /// only the operator can help.
    #[error("{0}; nothing was downloaded")]
    Unreadable(FetchError),
}

impl Bridge {
    /// The Bot API's file methods, once the daemon has built them (`app`).
    pub fn set_files(&self, files: TelegramFiles) {
        let _ = self.inner.files.set(Arc::new(files));
    }

    pub(super) fn files(&self) -> Result<&TelegramFiles, ToolError> {
        self.inner
            .files
            .get()
            .map(Arc::as_ref)
            .ok_or_else(|| ToolError::Invalid("this daemon does not handle files".into()))
    }

    /// Fetches an attachment of one of `agent`'s envelopes: the one with `file_id`, or
    /// the first. A file larger than Telegram serves, or than `max_bytes`, is refused
    /// before any byte is fetched.
    pub async fn open_attachment(
        &self,
        agent: &AgentName,
        token: Option<&str>,
        trace_id: &str,
        file_id: Option<&str>,
        max_bytes: Option<u64>,
    ) -> Result<AttachmentDownload, AttachmentError> {
        self.live_session(agent, token)?;
        let trace_id = TraceId::parse(trace_id).map_err(ToolError::Invalid)?;
        let unknown = || ToolError::Refused(ResolveError::UnknownTraceId { trace_id: trace_id.to_string() });
        let envelope = self.inner.ledger.find(&trace_id).await.map_err(ToolError::from)?;
        // Another agent's envelope is refused exactly like one that does not exist.
        let envelope = envelope.filter(|e| e.agent.as_deref() == Some(agent.as_str())).ok_or_else(unknown)?;
        let attachments = stored_attachments(&envelope);
        let chosen = media::pick_attachment(&attachments, file_id).map_err(AttachmentError::Refused)?;
        media::check_download_size(chosen.size, max_bytes).map_err(AttachmentError::Refused)?;
        let files = self.files()?;
        let info = files.get_file(&chosen.file_id).await.map_err(|error| match error {
            // Not there yet, never: the same refusal as a file Telegram said the size of.
            FetchError::TooBig => AttachmentError::Refused(DownloadRefusal::TooLarge { size: None }),
            other => AttachmentError::Unavailable(other),
        })?;
        media::check_download_size(info.file_size, max_bytes).map_err(AttachmentError::Refused)?;
        let path = info.file_path.ok_or_else(|| {
            AttachmentError::Unavailable(FetchError::Refused("getFile named no file_path".into()))
        })?;
        let download = files.download(&path).await.map_err(|error| {
            if error.is_lasting() {
                tracing::warn!(trace_id = %trace_id, kind = %chosen.kind, "attachment not downloaded: {error}");
                AttachmentError::Unreadable(error)
            } else {
                AttachmentError::Unavailable(error)
            }
        })?;
        // A file read from a local server's disk has the size it has there: the same limits
        // apply to it.
        media::check_download_size(download.size, max_bytes).map_err(AttachmentError::Refused)?;
        let name = chosen
            .name
            .clone()
            .or_else(|| path.rsplit('/').next().filter(|n| !n.is_empty()).map(str::to_owned))
            .unwrap_or_else(|| chosen.kind.clone());
        tracing::info!(trace_id = %trace_id, kind = %chosen.kind, size = ?info.file_size, "attachment download started");
        Ok(AttachmentDownload {
            kind: chosen.kind.clone(),
            file_id: chosen.file_id.clone(),
            name,
            size: download.size.or(info.file_size).or(chosen.size),
            bytes: download.bytes,
        })
    }
}

/// The downloadable attachments of an envelope, as intake stored them (with the sizes
/// Telegram gave, so a file over its limit is refused before `getFile`).
fn stored_attachments(envelope: &StoredEnvelope) -> Vec<AttachmentRef> {
    envelope
        .attachment_list()
        .into_iter()
        .map(|a| AttachmentRef {
            kind: a.kind.as_str().to_owned(),
            file_id: a.file_id,
            size: a.size,
            name: a.name,
        })
        .collect()
}
