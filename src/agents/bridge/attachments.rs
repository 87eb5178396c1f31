//! `download_attachment` on the daemon's side (DESIGN.md §14): an attachment of one of the
//! calling agent's envelopes, fetched from Telegram and streamed through to the plugin,
//! which writes it on the agent's machine. The daemon holds the bot token, so it fetches;
//! it keeps none of the bytes.

use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;

use super::{Bridge, ResolveError, ToolError};
use crate::ids::{AgentName, TraceId};
use crate::ledger::StoredEnvelope;
use crate::rules::media::{self, AttachmentRef, DownloadRefusal};
use crate::telegram::envelope::Attachment;
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
        let envelope = self.inner.ledger.find(trace_id.as_str()).await.map_err(ToolError::from)?;
        // Another agent's envelope is refused exactly like one that does not exist.
        let envelope = envelope.filter(|e| e.agent.as_deref() == Some(agent.as_str())).ok_or_else(unknown)?;
        let attachments = stored_attachments(&envelope);
        let chosen = media::pick_attachment(&attachments, file_id).map_err(AttachmentError::Refused)?;
        media::check_download_size(chosen.size, max_bytes).map_err(AttachmentError::Refused)?;
        let files = self.files()?;
        let info = files.get_file(&chosen.file_id).await.map_err(AttachmentError::Unavailable)?;
        media::check_download_size(info.file_size, max_bytes).map_err(AttachmentError::Refused)?;
        let path = info.file_path.ok_or_else(|| {
            AttachmentError::Unavailable(FetchError::Refused("getFile named no file_path".into()))
        })?;
        let bytes = files.download(&path).await.map_err(AttachmentError::Unavailable)?;
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
            size: info.file_size.or(chosen.size),
            bytes: bytes.boxed(),
        })
    }
}

/// The meta an envelope's attachments give its agent: the first one's `attachment_kind`
/// and `attachment_file_id`, and `attachment_count` when there are several.
///
/// TODO(inbound): inbound's `telegram::parts::attachment_meta` (with size, mime and name)
/// replaces this at the merge, in `present::delivered`.
pub fn attachment_meta(envelope: &StoredEnvelope) -> std::collections::BTreeMap<String, String> {
    let attachments = stored_attachments(envelope);
    let mut meta = std::collections::BTreeMap::new();
    if let Some(first) = attachments.first() {
        meta.insert("attachment_kind".to_owned(), first.kind.clone());
        meta.insert("attachment_file_id".to_owned(), first.file_id.clone());
    }
    if attachments.len() > 1 {
        meta.insert("attachment_count".to_owned(), attachments.len().to_string());
    }
    meta
}

/// The downloadable attachments of an envelope, from the JSON its row keeps: those with
/// a file id (a location or a dice throw has none).
///
/// TODO(inbound): at the merge this body becomes `envelope.attachment_list()` mapped to
/// `AttachmentRef { kind, file_id, size, name }` (inbound's typed read, with sizes, so a
/// file over 20 MB is refused before `getFile` too), and `document_name` goes.
fn stored_attachments(envelope: &StoredEnvelope) -> Vec<AttachmentRef> {
    let stored: Vec<Attachment> = serde_json::from_str(&envelope.attachments).unwrap_or_else(|e| {
        tracing::warn!(trace_id = %envelope.trace_id, error = %e, "an envelope's attachments do not parse");
        Vec::new()
    });
    stored
        .into_iter()
        .filter_map(|a| {
            let name = document_name(&a);
            Some(AttachmentRef { kind: a.kind, file_id: a.file_id?, size: None, name })
        })
        .collect()
}

/// A document's file name, from the description intake wrote (`name` or `name, mime`).
fn document_name(attachment: &Attachment) -> Option<String> {
    if attachment.kind != "document" {
        return None;
    }
    let name = match attachment.detail.rsplit_once(", ") {
        Some((name, mime)) if mime.contains('/') => name,
        _ => attachment.detail.as_str(),
    };
    (!name.is_empty() && name != "unnamed").then(|| name.to_owned())
}
