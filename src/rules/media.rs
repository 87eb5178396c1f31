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
    /// Over [`TELEGRAM_DOWNLOAD_LIMIT`]: by the size Telegram gave, or (`size: None`) by
    /// Telegram's own refusal of a file whose size the message did not say.
    #[error(
        "the file is {}; Telegram's Bot API serves files of at most {limit} bytes (20 MB), so it cannot \
         be downloaded: ask the sender for a smaller file or a link",
        size_words(*.size),
        limit = TELEGRAM_DOWNLOAD_LIMIT
    )]
    TooLarge { size: Option<u64> },
    #[error("the file is {size} bytes, above the {limit} bytes this download allows")]
    AboveAsked { size: u64, limit: u64 },
}

/// A file's size as a refusal says it.
fn size_words(size: Option<u64>) -> String {
    match size {
        Some(size) => format!("{size} bytes"),
        None => "too large, Telegram says (the message did not say its size)".to_owned(),
    }
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
        return Err(DownloadRefusal::TooLarge { size: Some(size) });
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

/// Telegram's refusals (HTTP 400, `Bad Request: …`) of a file as the kind it was sent as,
/// about the media itself, which the same file sent as a document does not meet: a document
/// is taken whatever it holds. Each is listed with the kind it concerns:
///
/// - `sendPhoto`: `PHOTO_INVALID_DIMENSIONS` (width and height above 10000 together, or one
///   more than 20 times the other), `PHOTO_SAVE_FILE_INVALID` (a photo Telegram cannot store
///   as one) and `IMAGE_PROCESS_FAILED` (an image it cannot decode or scale);
/// - `sendVoice`: `VOICE_MESSAGES_FORBIDDEN` (the person accepts no voice messages; the
///   same audio as a document reaches them).
///
/// None for `sendVideo`, `sendAnimation` and `sendAudio`: Telegram posts a file it cannot
/// read as one of those as a document instead of refusing it, and their only limit is the
/// size, which a document has too. Refusals that are not about the media are left out on
/// purpose, since a document would meet them as well or must not go around them: the chat
/// (not found, the bot blocked or kicked), rights ("not enough rights to send photos": the
/// group's admins chose what may be posted), the size, an empty file.
const REFUSED_AS_MEDIA: [(&str, UploadKind); 4] = [
    ("PHOTO_INVALID_DIMENSIONS", UploadKind::Photo),
    ("PHOTO_SAVE_FILE_INVALID", UploadKind::Photo),
    ("IMAGE_PROCESS_FAILED", UploadKind::Photo),
    ("VOICE_MESSAGES_FORBIDDEN", UploadKind::Voice),
];

/// Whether Telegram's refusal of a file sent as `kind` (its description, with whatever the
/// caller put before it) warrants sending the same file once more as a document: a 400
/// that is about the media itself (`REFUSED_AS_MEDIA`). A refusal is a confirmed "not
/// sent", so that one more attempt cannot make a duplicate; a document refused is not
/// tried again, and nothing else (a rate limit, a 5xx, a request with no answer) counts.
///
/// ```
/// use switchboard::rules::media::{UploadKind, warrants_document};
///
/// assert!(warrants_document(UploadKind::Photo, "Telegram refused it: Bad Request: PHOTO_INVALID_DIMENSIONS"));
/// assert!(!warrants_document(UploadKind::Photo, "Telegram refused it: Bad Request: chat not found"));
/// ```
pub fn warrants_document(kind: UploadKind, refusal: &str) -> bool {
    const BAD_REQUEST: &str = "bad request: ";
    let refusal = refusal.to_ascii_lowercase();
    let Some(at) = refusal.find(BAD_REQUEST) else { return false };
    let reason = refusal[at + BAD_REQUEST.len()..].trim_start();
    REFUSED_AS_MEDIA.iter().any(|&(code, refused)| {
        refused == kind
            && reason.strip_prefix(&code.to_ascii_lowercase()).is_some_and(|rest| {
                // The whole code, not the start of a longer one.
                !rest.starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
            })
    })
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
        assert_eq!(over, DownloadRefusal::TooLarge { size: Some(TELEGRAM_DOWNLOAD_LIMIT + 1) });
        assert!(over.to_string().contains("20 MB"), "{over}");
        let unsized_refusal = DownloadRefusal::TooLarge { size: None }.to_string();
        assert!(unsized_refusal.contains("20 MB") && unsized_refusal.contains("a link"), "{unsized_refusal}");
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

    #[test]
    fn refusals_of_the_media_itself_warrant_a_document_and_nothing_else_does() {
        let refused = |description: &str| format!("Telegram refused it: Bad Request: {description}");
        for (kind, code) in [
            (UploadKind::Photo, "PHOTO_INVALID_DIMENSIONS"),
            (UploadKind::Photo, "IMAGE_PROCESS_FAILED"),
            (UploadKind::Photo, "PHOTO_SAVE_FILE_INVALID"),
            (UploadKind::Voice, "VOICE_MESSAGES_FORBIDDEN"),
        ] {
            assert!(warrants_document(kind, &refused(code)), "{kind:?} {code}");
            // However Telegram cases it.
            assert!(warrants_document(kind, &refused(&code.to_ascii_lowercase())), "{kind:?} {code}");
        }
        // A refusal about another kind of media says nothing about this one.
        assert!(!warrants_document(UploadKind::Video, &refused("PHOTO_INVALID_DIMENSIONS")));
        assert!(!warrants_document(UploadKind::Audio, &refused("VOICE_MESSAGES_FORBIDDEN")));
        assert!(!warrants_document(UploadKind::Photo, &refused("VOICE_MESSAGES_FORBIDDEN")));
        // A document is never sent as a document again.
        for code in ["PHOTO_INVALID_DIMENSIONS", "VOICE_MESSAGES_FORBIDDEN", "IMAGE_PROCESS_FAILED"] {
            assert!(!warrants_document(UploadKind::Document, &refused(code)), "{code}");
        }
        // Refusals a document would meet too, or that should not be gone around.
        for other in [
            "chat not found",
            "not enough rights to send photos to the chat",
            "file must be non-empty",
            "message thread not found",
            "PHOTO_INVALID_DIMENSIONS_SOMETHING_NEW",
        ] {
            assert!(!warrants_document(UploadKind::Photo, &refused(other)), "{other}");
        }
        // Only Telegram's 400: not a 403, nor a failure that merely names a code.
        assert!(!warrants_document(
            UploadKind::Voice,
            "Telegram refused it: Forbidden: VOICE_MESSAGES_FORBIDDEN"
        ));
        assert!(!warrants_document(UploadKind::Photo, "could not reach Telegram: PHOTO_INVALID_DIMENSIONS"));
        assert!(!warrants_document(UploadKind::Photo, "rate limited by Telegram for 5s"));
    }
}
