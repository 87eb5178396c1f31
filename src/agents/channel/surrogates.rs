//! Lone UTF-16 surrogates in what the agent session writes. JavaScript strings may hold
//! half of a surrogate pair (a model's text cut inside an emoji), and `JSON.stringify`
//! writes it as an escape (`"\ud83d"`), which is valid JSON text but names no character:
//! serde_json refuses the whole line, and the MCP SDK drops a line it cannot parse without
//! an answer, so the agent's tool call would wait for its timeout. Each such escape is
//! read as U+FFFD (�) instead, as a browser decoding the text would show it.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, ReadBuf};

/// `line` with every `\uD800`–`\uDFFF` escape that is not half of a well-formed pair
/// replaced by `\uFFFD`; unchanged (and not copied) when it holds none.
pub(super) fn replace_lone_surrogates(line: &[u8]) -> Option<Vec<u8>> {
    let mut out: Option<Vec<u8>> = None;
    let mut copied = 0;
    let mut i = 0;
    while i < line.len() {
        if line[i] != b'\\' {
            i += 1;
            continue;
        }
        let Some(unit) = escaped_unit(line, i) else {
            // Any other escape (`\\`, `\"`, `\n`, …) is two bytes: skipping both keeps an
            // escaped backslash from being read as the start of a `\u`.
            i += 2;
            continue;
        };
        let paired = (0xD800..=0xDBFF).contains(&unit)
            && escaped_unit(line, i + 6).is_some_and(|low| (0xDC00..=0xDFFF).contains(&low));
        if paired {
            i += 12;
        } else if (0xD800..=0xDFFF).contains(&unit) {
            let out = out.get_or_insert_with(|| Vec::with_capacity(line.len()));
            out.extend_from_slice(&line[copied..i]);
            out.extend_from_slice(b"\\uFFFD");
            i += 6;
            copied = i;
        } else {
            i += 6;
        }
    }
    out.map(|mut out| {
        out.extend_from_slice(&line[copied..]);
        out
    })
}

/// The code unit of a `\uXXXX` escape starting at `at`.
fn escaped_unit(line: &[u8], at: usize) -> Option<u16> {
    let escape = line.get(at..at + 6)?;
    if escape[0] != b'\\' || escape[1] != b'u' {
        return None;
    }
    let hex = std::str::from_utf8(&escape[2..]).ok()?;
    u16::from_str_radix(hex, 16).ok()
}

/// A reader of newline-delimited JSON that passes each complete line through
/// [`replace_lone_surrogates`]; a last line without its newline is passed at the end.
pub(super) struct LoneSurrogatesReplaced<R> {
    inner: R,
    /// Read, not yet up to a newline.
    partial: Vec<u8>,
    /// Lines ready to hand out, from `handed`.
    ready: Vec<u8>,
    handed: usize,
    ended: bool,
}

impl<R> LoneSurrogatesReplaced<R> {
    pub(super) fn new(inner: R) -> Self {
        Self { inner, partial: Vec::new(), ready: Vec::new(), handed: 0, ended: false }
    }

    fn take_lines(&mut self, upto: usize) {
        let rest = self.partial.split_off(upto);
        let lines = std::mem::replace(&mut self.partial, rest);
        self.ready = replace_lone_surrogates(&lines).unwrap_or(lines);
        self.handed = 0;
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for LoneSurrogatesReplaced<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            if this.handed < this.ready.len() {
                let n = buf.remaining().min(this.ready.len() - this.handed);
                buf.put_slice(&this.ready[this.handed..this.handed + n]);
                this.handed += n;
                return Poll::Ready(Ok(()));
            }
            if this.ended {
                if this.partial.is_empty() {
                    return Poll::Ready(Ok(()));
                }
                let all = this.partial.len();
                this.take_lines(all);
                continue;
            }
            let mut chunk = [0u8; 8192];
            let mut read = ReadBuf::new(&mut chunk);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut read))?;
            if read.filled().is_empty() {
                this.ended = true;
                continue;
            }
            let searched_from = this.partial.len();
            this.partial.extend_from_slice(read.filled());
            if let Some(newline) = this.partial[searched_from..].iter().rposition(|&b| b == b'\n') {
                this.take_lines(searched_from + newline + 1);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    fn replaced(line: &str) -> String {
        String::from_utf8(
            replace_lone_surrogates(line.as_bytes()).unwrap_or_else(|| line.as_bytes().to_vec()),
        )
        .unwrap()
    }

    #[test]
    fn only_a_lone_surrogate_escape_is_replaced() {
        assert_eq!(replaced(r#"{"text":"a\ud83d"}"#), r#"{"text":"a\uFFFD"}"#);
        assert_eq!(replaced(r#"{"text":"\udc00b"}"#), r#"{"text":"\uFFFDb"}"#);
        assert_eq!(replaced(r#"{"text":"\ud83d\ud83d\ude00"}"#), r#"{"text":"\uFFFD\ud83d\ude00"}"#);
        for kept in [
            r#"{"text":"\ud83d\ude00 ok"}"#,
            r#"{"text":"\\ud83d is text"}"#,
            r#"{"text":"\u00e9\n"}"#,
            "plain",
        ] {
            assert!(replace_lone_surrogates(kept.as_bytes()).is_none(), "{kept}");
        }
        let parsed: serde_json::Value = serde_json::from_str(&replaced(r#"{"text":"cut \ud83d"}"#)).unwrap();
        assert_eq!(parsed["text"], "cut \u{FFFD}");
    }

    /// Lines cut anywhere across reads, an escape included, come out whole and mended.
    #[tokio::test]
    async fn lines_cut_across_reads_are_mended_whole() {
        let input = "{\"a\":\"\\ud83d\"}\n{\"b\":\"\\ud83d\\ude00\"}\n{\"c\":\"\\udfff\"}";
        let chunks: Vec<io::Result<bytes::Bytes>> =
            input.as_bytes().chunks(3).map(|c| Ok(bytes::Bytes::copy_from_slice(c))).collect();
        let reader = tokio_util::io::StreamReader::new(futures::stream::iter(chunks));
        let mut mended = String::new();
        LoneSurrogatesReplaced::new(reader).read_to_string(&mut mended).await.unwrap();
        assert_eq!(mended, "{\"a\":\"\\uFFFD\"}\n{\"b\":\"\\ud83d\\ude00\"}\n{\"c\":\"\\uFFFD\"}");
    }
}
