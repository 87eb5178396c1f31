//! Files between Telegram and the agents (DESIGN.md §14), as decisions on plain data:
//! which attachment a download names, whether Telegram will serve or take a file of a
//! size, and how a file is sent by its name.

/// Telegram's `getFile` serves files up to this size; a bigger one cannot be downloaded
/// through the Bot API at all, so it is refused before anything is fetched.
pub const TELEGRAM_DOWNLOAD_LIMIT: u64 = 20 * 1024 * 1024;

/// Telegram takes uploads (`sendDocument` and the rest) up to this size.
pub const TELEGRAM_UPLOAD_LIMIT: u64 = 50 * 1024 * 1024;

/// At most this many files go with one reply: as many as Telegram puts in one album, and
/// enough for any answer a person reads.
pub const MAX_REPLY_FILES: usize = 10;

/// An attachment of an envelope, as much of it as a download needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttachmentRef {
    /// `photo`, `document`, `voice`, …
    pub kind: String,
    pub file_id: String,
    /// Its size, when Telegram said.
    pub size: Option<u64>,
    /// The sender's file name, when Telegram has one (documents, audio, video).
    pub name: Option<String>,
}

/// Why a download was refused before anything was fetched.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DownloadRefusal {
    #[error("the envelope has no attachment that can be downloaded")]
    NoAttachment,
    #[error("the file_id {file_id} is not an attachment of this envelope (its attachments: {known})")]
    NotOfThisEnvelope { file_id: String, known: String },
    #[error(
        "the file is {size} bytes; Telegram's Bot API serves files of at most {limit} bytes (20 MB), so it cannot \
         be downloaded: ask the sender for a smaller file or a link",
        limit = TELEGRAM_DOWNLOAD_LIMIT
    )]
    TooLarge { size: u64 },
    #[error("the file is {size} bytes, above the {limit} bytes this download allows")]
    AboveAsked { size: u64, limit: u64 },
}

/// The attachment a download names: the one with `file_id`, or the first that has a file.
pub fn pick_attachment<'a>(
    attachments: &'a [AttachmentRef],
    file_id: Option<&str>,
) -> Result<&'a AttachmentRef, DownloadRefusal> {
    match file_id {
        None => attachments.first().ok_or(DownloadRefusal::NoAttachment),
        Some(wanted) => attachments.iter().find(|a| a.file_id == wanted).ok_or_else(|| {
            if attachments.is_empty() {
                return DownloadRefusal::NoAttachment;
            }
            let known = attachments.iter().map(|a| format!("{} {}", a.kind, a.file_id)).collect::<Vec<_>>();
            DownloadRefusal::NotOfThisEnvelope { file_id: wanted.to_owned(), known: known.join(", ") }
        }),
    }
}

/// Whether a file of `size` (when known) may be downloaded, within Telegram's limit and
/// the caller's own (`max_bytes`, for an eager photo).
pub fn check_download_size(size: Option<u64>, max_bytes: Option<u64>) -> Result<(), DownloadRefusal> {
    let Some(size) = size else { return Ok(()) };
    if size > TELEGRAM_DOWNLOAD_LIMIT {
        return Err(DownloadRefusal::TooLarge { size });
    }
    match max_bytes {
        Some(limit) if size > limit => Err(DownloadRefusal::AboveAsked { size, limit }),
        _ => Ok(()),
    }
}

/// How a file goes to Telegram: the Bot API method and the name of its file field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UploadKind {
    Photo,
    Animation,
    Video,
    Voice,
    Audio,
    Document,
}

impl UploadKind {
    /// The Bot API method that sends it.
    pub fn method(self) -> &'static str {
        match self {
            Self::Photo => "sendPhoto",
            Self::Animation => "sendAnimation",
            Self::Video => "sendVideo",
            Self::Voice => "sendVoice",
            Self::Audio => "sendAudio",
            Self::Document => "sendDocument",
        }
    }

    /// The multipart field that carries the file.
    pub fn field(self) -> &'static str {
        match self {
            Self::Photo => "photo",
            Self::Animation => "animation",
            Self::Video => "video",
            Self::Voice => "voice",
            Self::Audio => "audio",
            Self::Document => "document",
        }
    }
}

/// The largest photo `sendPhoto` takes; a larger image goes as a document, which keeps it
/// whole where a photo would be refused.
pub const TELEGRAM_PHOTO_LIMIT: u64 = 10 * 1024 * 1024;

/// The kind a file of `size` bytes is sent as, by its extension (case-insensitive); anything
/// unknown is a document, which Telegram takes whatever it holds, and so is an image too
/// large to be a photo.
pub fn upload_kind(file_name: &str, size: u64) -> UploadKind {
    let extension = match file_name.rsplit_once('.') {
        Some((stem, extension)) if !stem.is_empty() => extension.to_ascii_lowercase(),
        _ => return UploadKind::Document,
    };
    match extension.as_str() {
        "jpg" | "jpeg" | "png" | "webp" if size > TELEGRAM_PHOTO_LIMIT => UploadKind::Document,
        "jpg" | "jpeg" | "png" | "webp" => UploadKind::Photo,
        "gif" => UploadKind::Animation,
        "mp4" | "mov" => UploadKind::Video,
        "ogg" | "oga" | "opus" => UploadKind::Voice,
        "mp3" | "m4a" | "flac" | "wav" => UploadKind::Audio,
        _ => UploadKind::Document,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attachment(kind: &str, file_id: &str) -> AttachmentRef {
        AttachmentRef { kind: kind.into(), file_id: file_id.into(), size: None, name: None }
    }

    #[test]
    fn a_download_takes_the_named_attachment_or_the_first() {
        let both = [attachment("photo", "p1"), attachment("document", "d1")];
        assert_eq!(pick_attachment(&both, None).unwrap().file_id, "p1");
        assert_eq!(pick_attachment(&both, Some("d1")).unwrap().file_id, "d1");
        let foreign = pick_attachment(&both, Some("other")).unwrap_err();
        assert!(matches!(&foreign, DownloadRefusal::NotOfThisEnvelope { file_id, .. } if file_id == "other"));
        assert!(foreign.to_string().contains("photo p1"), "{foreign}");
        assert_eq!(pick_attachment(&[], None), Err(DownloadRefusal::NoAttachment));
        assert_eq!(pick_attachment(&[], Some("p1")), Err(DownloadRefusal::NoAttachment));
    }

    #[test]
    fn telegrams_download_limit_and_the_callers_are_both_kept() {
        assert_eq!(check_download_size(None, None), Ok(()));
        assert_eq!(check_download_size(Some(TELEGRAM_DOWNLOAD_LIMIT), None), Ok(()));
        let over = check_download_size(Some(TELEGRAM_DOWNLOAD_LIMIT + 1), None).unwrap_err();
        assert_eq!(over, DownloadRefusal::TooLarge { size: TELEGRAM_DOWNLOAD_LIMIT + 1 });
        assert!(over.to_string().contains("20 MB"), "{over}");
        assert_eq!(
            check_download_size(Some(11), Some(10)),
            Err(DownloadRefusal::AboveAsked { size: 11, limit: 10 })
        );
        assert_eq!(check_download_size(Some(10), Some(10)), Ok(()));
        // Telegram's limit wins over a larger one asked for.
        assert!(matches!(
            check_download_size(Some(TELEGRAM_DOWNLOAD_LIMIT + 1), Some(u64::MAX)),
            Err(DownloadRefusal::TooLarge { .. })
        ));
    }

    #[test]
    fn files_are_sent_by_their_extension() {
        for (name, kind) in [
            ("shot.jpg", UploadKind::Photo),
            ("shot.JPEG", UploadKind::Photo),
            ("a.png", UploadKind::Photo),
            ("a.webp", UploadKind::Photo),
            ("loop.gif", UploadKind::Animation),
            ("clip.mp4", UploadKind::Video),
            ("clip.MOV", UploadKind::Video),
            ("note.ogg", UploadKind::Voice),
            ("note.oga", UploadKind::Voice),
            ("note.opus", UploadKind::Voice),
            ("song.mp3", UploadKind::Audio),
            ("song.m4a", UploadKind::Audio),
            ("song.flac", UploadKind::Audio),
            ("song.wav", UploadKind::Audio),
            ("report.pdf", UploadKind::Document),
            ("archive.tar.gz", UploadKind::Document),
            ("Makefile", UploadKind::Document),
            (".png", UploadKind::Document),
            ("photo.png.exe", UploadKind::Document),
        ] {
            assert_eq!(upload_kind(name, 1024), kind, "{name}");
        }
        assert_eq!(upload_kind("scan.png", TELEGRAM_PHOTO_LIMIT), UploadKind::Photo);
        assert_eq!(
            upload_kind("scan.png", TELEGRAM_PHOTO_LIMIT + 1),
            UploadKind::Document,
            "too large a photo"
        );
        assert_eq!(UploadKind::Photo.method(), "sendPhoto");
        assert_eq!(UploadKind::Voice.field(), "voice");
    }
}
