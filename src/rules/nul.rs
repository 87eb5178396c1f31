//! U+0000 out of JSON text, before anything is read from it.
//!
//! PostgreSQL refuses U+0000 in text (SQLSTATE 22021), where SQLite stores it. Every JSON
//! text that comes in from outside passes here first: each Telegram update as it arrives
//! (`telegram::updates::RawUpdate::new`: polled, delivered to a webhook, relayed by a
//! standby) and each agent's request body (`agents::api::server`). So every text, caption,
//! name, title, file name, callback datum, reaction, reply and tool argument read from them
//! is stored the same on either backend, and none can fail a write on every try: an update
//! that did stopped the polling leader, then each standby elected after it, until Telegram
//! dropped it. No chat shows the character, so nothing a reader could see is lost.

/// `text` with U+0000 replaced by U+FFFD (the replacement character): the escape `\u0000`
/// by the escape `\ufffd`, a raw NUL (invalid JSON) by the character itself; an escaped
/// backslash followed by `u0000` is left alone.
pub fn without_nul(text: &str) -> std::borrow::Cow<'_, str> {
    const NUL_ESCAPE: &[u8] = b"\\u0000";
    if !text.contains('\0') && !text.contains("\\u0000") {
        return std::borrow::Cow::Borrowed(text);
    }
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    // The start of the run of bytes not yet copied; every index it takes is at an ASCII
    // byte, so at a character boundary.
    let (mut copied, mut at) = (0, 0);
    while at < bytes.len() {
        match bytes[at] {
            b'\\' if bytes[at..].starts_with(NUL_ESCAPE) => {
                out.push_str(&text[copied..at]);
                out.push_str("\\ufffd");
                at += NUL_ESCAPE.len();
                copied = at;
            }
            // An escaped backslash: what follows it is not an escape.
            b'\\' if bytes.get(at + 1) == Some(&b'\\') => at += 2,
            0 => {
                out.push_str(&text[copied..at]);
                out.push('\u{FFFD}');
                at += 1;
                copied = at;
            }
            _ => at += 1,
        }
    }
    out.push_str(&text[copied..]);
    std::borrow::Cow::Owned(out)
}
