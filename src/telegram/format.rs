//! How a reply's text is formatted for Telegram (issue 22): plain text, Markdown converted
//! to Telegram's HTML, or HTML as the agent wrote it. Pure functions: the conversion, the
//! split of long HTML into messages that each parse on their own, and the plain text a
//! part falls back to when Telegram cannot parse its HTML.
//!
//! Telegram's HTML is a small subset (<https://core.telegram.org/bots/api#html-style>):
//! `b`, `i`, `u`, `s`, `code`, `pre`, `a`, `blockquote`, `tg-spoiler` and the entities
//! `&lt;` `&gt;` `&amp;` `&quot;`. Markdown is rendered into those tags only; every other
//! character that HTML gives a meaning to is escaped, raw HTML in the Markdown included.
//! Lists and headings have no tag of their own and become plain lines.

use pulldown_cmark::{CodeBlockKind, Event, Options, Parser, Tag, TagEnd};

use super::outbound::split_text;

/// How the text of a `reply` or an `edit_message` is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReplyFormat {
    /// Sent as it is, without a parse mode.
    #[default]
    Text,
    /// CommonMark (with ~~strikethrough~~), converted to Telegram HTML.
    Markdown,
    /// Telegram HTML, as the agent wrote it.
    Html,
}

impl ReplyFormat {
    /// The `format` argument as a tool receives it: absent means `text`. The three names
    /// are read whatever their case (an agent that knows Telegram writes `HTML` or
    /// `Markdown`, its `parse_mode` spellings). `MarkdownV2`, Telegram's own dialect, is
    /// refused rather than read as Markdown: the two read `*x*`, `__x__` and `||x||`
    /// differently (bold or italic, underline or bold, a spoiler or text), so the reply
    /// would not look as its agent meant. Anything else is refused, naming the three.
    pub fn parse(raw: Option<&str>) -> Result<Self, String> {
        let Some(raw) = raw.map(str::trim) else { return Ok(Self::Text) };
        match raw.to_ascii_lowercase().as_str() {
            "text" => Ok(Self::Text),
            "markdown" => Ok(Self::Markdown),
            "html" => Ok(Self::Html),
            "markdownv2" => Err(format!(
                "format {raw:?} (Telegram's MarkdownV2) is not taken: write CommonMark and say \"markdown\" \
                 (**bold**, _italic_, ~~strike~~, `code`, [text](url)), or \"html\"; nothing was sent"
            )),
            _ => Err(format!(
                "format must be \"text\", \"markdown\" or \"html\", not {raw:?}; nothing was sent"
            )),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Text => "text",
            Self::Markdown => "markdown",
            Self::Html => "html",
        }
    }

    /// The text split into the messages that carry it, each within `limit` UTF-16 units
    /// (Telegram's count), and whether they are HTML (sent with `parse_mode = "HTML"`).
    /// An HTML part never ends inside a tag or an entity, and closes the tags it leaves
    /// open (the next part opens them again), so each part parses on its own.
    pub fn parts(self, text: &str, limit: usize) -> (Vec<String>, bool) {
        self.parts_after("", text, limit)
    }

    /// [`parts`](Self::parts) of `text` behind a `prefix` written as plain text (a room
    /// post's `Builder: `), escaped when the rest is HTML.
    pub fn parts_after(self, prefix: &str, text: &str, limit: usize) -> (Vec<String>, bool) {
        let mut html = String::new();
        escape_into(&mut html, prefix);
        match self {
            Self::Text => (split_text(&format!("{prefix}{text}"), limit), false),
            Self::Markdown => {
                html.push_str(&markdown_to_html(text));
                (split_html(&html, limit), true)
            }
            Self::Html => {
                html.push_str(text);
                (split_html(&html, limit), true)
            }
        }
    }
}

/// What Telegram answers (400) when a message's HTML does not parse.
const UNPARSABLE: &str = "can't parse entities";

/// Whether Telegram refused a message because it could not parse its entities: then the
/// part is sent once more as plain text ([`html_to_plain`]).
pub fn is_unparsable_entities(error: &str) -> bool {
    error.to_ascii_lowercase().contains(UNPARSABLE)
}

/// Markdown as Telegram HTML (see the module documentation).
///
/// ```
/// use switchboard::telegram::format::markdown_to_html;
///
/// assert_eq!(markdown_to_html("**bold** and `x < y`"), "<b>bold</b> and <code>x &lt; y</code>");
/// ```
pub fn markdown_to_html(markdown: &str) -> String {
    let mut out = Renderer::default();
    for event in Parser::new_ext(markdown, Options::ENABLE_STRIKETHROUGH | Options::ENABLE_TASKLISTS) {
        out.event(event);
    }
    out.html.trim_end().to_owned()
}

/// Builds Telegram HTML from Markdown events.
#[derive(Default)]
struct Renderer {
    html: String,
    /// Open lists, innermost last: the next number of an ordered one, `None` for bullets.
    lists: Vec<Option<u64>>,
    /// A block ended: the next block starts after a blank line (a line in a list).
    block_ended: bool,
}

impl Renderer {
    fn event(&mut self, event: Event<'_>) {
        match event {
            Event::Start(tag) => self.start(tag),
            Event::End(tag) => self.end(tag),
            Event::Text(text) => self.text(&text),
            Event::Code(code) => {
                self.text_start();
                self.html.push_str("<code>");
                escape_into(&mut self.html, &code);
                self.html.push_str("</code>");
            }
            // Raw HTML in Markdown is shown as written, never passed to Telegram as tags.
            Event::Html(raw) | Event::InlineHtml(raw) => self.text(&raw),
            Event::InlineMath(math) | Event::DisplayMath(math) => self.text(&math),
            Event::FootnoteReference(name) => self.text(&format!("[^{name}]")),
            Event::SoftBreak | Event::HardBreak => self.html.push('\n'),
            Event::Rule => {
                self.block_start();
                self.html.push_str("———");
                self.block_ended = true;
            }
            Event::TaskListMarker(done) => self.html.push_str(if done { "[x] " } else { "[ ] " }),
        }
    }

    fn start(&mut self, tag: Tag<'_>) {
        match tag {
            Tag::Paragraph | Tag::HtmlBlock | Tag::MetadataBlock(_) => self.block_start(),
            Tag::Heading { .. } => {
                self.block_start();
                self.html.push_str("<b>");
            }
            Tag::BlockQuote(_) => {
                self.block_start();
                self.html.push_str("<blockquote>");
                // The quote's first paragraph starts right inside it.
                self.block_ended = false;
            }
            Tag::CodeBlock(kind) => {
                self.block_start();
                match kind {
                    CodeBlockKind::Fenced(language) if !language.trim().is_empty() => {
                        self.html.push_str("<pre><code class=\"language-");
                        escape_attribute_into(
                            &mut self.html,
                            language.split_whitespace().next().unwrap_or_default(),
                        );
                        self.html.push_str("\">");
                    }
                    _ => self.html.push_str("<pre><code>"),
                }
            }
            Tag::List(first) => {
                if self.lists.is_empty() {
                    self.block_start();
                }
                self.lists.push(first);
            }
            Tag::Item => {
                if !self.html.is_empty() && !self.html.ends_with('\n') {
                    self.html.push('\n');
                }
                let depth = self.lists.len().saturating_sub(1);
                self.html.push_str(&"  ".repeat(depth));
                match self.lists.last_mut() {
                    Some(Some(number)) => {
                        self.html.push_str(&format!("{number}. "));
                        *number += 1;
                    }
                    _ => self.html.push_str("• "),
                }
                self.block_ended = false;
            }
            Tag::Emphasis => self.inline("<i>"),
            Tag::Strong => self.inline("<b>"),
            Tag::Strikethrough => self.inline("<s>"),
            Tag::Link { dest_url, .. } | Tag::Image { dest_url, .. } => {
                self.text_start();
                self.html.push_str("<a href=\"");
                escape_attribute_into(&mut self.html, &dest_url);
                self.html.push_str("\">");
            }
            Tag::FootnoteDefinition(_)
            | Tag::DefinitionList
            | Tag::DefinitionListTitle
            | Tag::DefinitionListDefinition
            | Tag::Table(_)
            | Tag::TableHead
            | Tag::TableRow
            | Tag::TableCell
            | Tag::Superscript
            | Tag::Subscript => self.block_start(),
        }
    }

    fn end(&mut self, tag: TagEnd) {
        match tag {
            TagEnd::Paragraph | TagEnd::HtmlBlock | TagEnd::MetadataBlock(_) => self.block_ended = true,
            TagEnd::Heading(_) => {
                self.html.push_str("</b>");
                self.block_ended = true;
            }
            TagEnd::BlockQuote(_) => {
                trim_end_in_place(&mut self.html);
                self.html.push_str("</blockquote>");
                self.block_ended = true;
            }
            TagEnd::CodeBlock => {
                trim_end_in_place(&mut self.html);
                self.html.push_str("</code></pre>");
                self.block_ended = true;
            }
            TagEnd::List(_) => {
                self.lists.pop();
                self.block_ended = self.lists.is_empty();
            }
            TagEnd::Item => {}
            TagEnd::Emphasis => self.html.push_str("</i>"),
            TagEnd::Strong => self.html.push_str("</b>"),
            TagEnd::Strikethrough => self.html.push_str("</s>"),
            TagEnd::Link | TagEnd::Image => self.html.push_str("</a>"),
            _ => self.block_ended = true,
        }
    }

    fn text(&mut self, text: &str) {
        self.text_start();
        escape_into(&mut self.html, text);
    }

    fn inline(&mut self, open: &str) {
        self.text_start();
        self.html.push_str(open);
    }

    /// Inline content after a finished block starts a new one.
    fn text_start(&mut self) {
        if self.block_ended {
            self.block_start();
        }
    }

    /// A new block: after a blank line, or a line break inside a list item.
    fn block_start(&mut self) {
        if self.block_ended && !self.html.is_empty() {
            trim_end_in_place(&mut self.html);
            self.html.push_str(if self.lists.is_empty() { "\n\n" } else { "\n" });
            if !self.lists.is_empty() {
                self.html.push_str(&"  ".repeat(self.lists.len()));
            }
        }
        self.block_ended = false;
    }
}

fn trim_end_in_place(text: &mut String) {
    let kept = text.trim_end().len();
    text.truncate(kept);
}

/// Escapes what Telegram's HTML gives a meaning to in text. A `"` means nothing there and
/// stays one character: as `&quot;` it would count six towards a message's length as the
/// splitter measures it, and a JSON snippet would need twice the messages.
fn escape_into(out: &mut String, text: &str) {
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            c => out.push(c),
        }
    }
}

/// Escapes a value inside a `"…"` attribute (a link's address, a code block's language).
fn escape_attribute_into(out: &mut String, value: &str) {
    for c in value.chars() {
        match c {
            '"' => out.push_str("&quot;"),
            c => escape_into(out, c.encode_utf8(&mut [0; 4])),
        }
    }
}

/// One indivisible piece of HTML: a tag, an entity, or a character.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Atom<'a> {
    /// `<b>`, `<a href="…">`: the tag's name and its whole text.
    Open {
        name: &'a str,
        text: &'a str,
    },
    Close {
        name: &'a str,
        text: &'a str,
    },
    /// An entity (`&amp;`) or one character.
    Text(&'a str),
    /// `<br>`: no tag of Telegram's (it refuses the part), but plainly a line break, which
    /// is what the part's plain text fallback makes of it. Opens nothing.
    LineBreak(&'a str),
}

impl<'a> Atom<'a> {
    fn text(self) -> &'a str {
        match self {
            Self::Open { text, .. } | Self::Close { text, .. } | Self::Text(text) | Self::LineBreak(text) => {
                text
            }
        }
    }
}

/// The tags Telegram's HTML knows (<https://core.telegram.org/bots/api#html-style>). Only
/// these are markup: `<url>`, `<T>` or `<name>` in an agent's HTML is text that only looks
/// like a tag, kept as it is written, never dropped as markup.
const TELEGRAM_TAGS: [&str; 16] = [
    "b",
    "strong",
    "i",
    "em",
    "u",
    "ins",
    "s",
    "strike",
    "del",
    "code",
    "pre",
    "a",
    "blockquote",
    "tg-spoiler",
    "span",
    "tg-emoji",
];

/// The atoms of `html`. A `<` that starts none of Telegram's tags and a `&` that starts no
/// entity are characters like any other (Telegram will refuse them, and the part falls
/// back to plain text, where they are kept).
fn atoms(html: &str) -> Vec<Atom<'_>> {
    let mut atoms = Vec::new();
    let mut rest = html;
    while let Some(c) = rest.chars().next() {
        let atom = match c {
            '<' => tag_at(rest),
            '&' => find_within(rest, b';', MAX_ENTITY_LEN)
                .filter(|&end| is_entity(&rest[..=end]))
                .map(|end| Atom::Text(&rest[..=end])),
            _ => None,
        }
        .unwrap_or_else(|| Atom::Text(&rest[..c.len_utf8()]));
        rest = &rest[atom.text().len()..];
        atoms.push(atom);
    }
    atoms
}

/// The longest entity looked for (`&#x10FFFF;`), and the longest tag (an `<a href>` with
/// a long URL): bounds on how far one `&` or `<` is looked past, so that text full of
/// them is read in linear time. A longer one is read as characters.
const MAX_ENTITY_LEN: usize = 12;
const MAX_TAG_LEN: usize = 2048;

/// The byte offset of the first `byte` (ASCII) within the first `within` bytes of `text`.
fn find_within(text: &str, byte: u8, within: usize) -> Option<usize> {
    text.as_bytes().iter().take(within).position(|&b| b == byte)
}

/// `&name;`, `&#123;` or `&#x1F600;`, no longer than any of Telegram's.
fn is_entity(text: &str) -> bool {
    let body = &text[1..text.len() - 1];
    let named = !body.is_empty() && body.len() <= 8 && body.chars().all(|c| c.is_ascii_alphanumeric());
    let numeric = body.strip_prefix('#').is_some_and(|n| {
        let digits = n.strip_prefix(['x', 'X']).map_or((n, 10), |hex| (hex, 16));
        !digits.0.is_empty() && digits.0.len() <= 8 && u32::from_str_radix(digits.0, digits.1).is_ok()
    });
    named || numeric
}

/// The tag `rest` starts with, if it starts with one of Telegram's: `<name …>` or
/// `</name>`; or a `<br>`.
fn tag_at(rest: &str) -> Option<Atom<'_>> {
    let end = find_within(rest, b'>', MAX_TAG_LEN)?;
    let text = &rest[..=end];
    let inner = &text[1..text.len() - 1];
    let (closing, inner) = match inner.strip_prefix('/') {
        Some(inner) => (true, inner),
        None => (false, inner),
    };
    let name_end = inner.find(|c: char| c.is_whitespace()).unwrap_or(inner.len());
    let name = &inner[..name_end];
    if inner.contains('<') {
        return None;
    }
    if !closing && inner.trim_end_matches(['/', ' ']).eq_ignore_ascii_case("br") {
        return Some(Atom::LineBreak(text));
    }
    if !TELEGRAM_TAGS.iter().any(|tag| tag.eq_ignore_ascii_case(name)) {
        return None;
    }
    Some(if closing { Atom::Close { name, text } } else { Atom::Open { name, text } })
}

fn utf16_len(s: &str) -> usize {
    s.encode_utf16().count()
}

/// Splits HTML into parts of at most `limit` UTF-16 units, preferring the ends of
/// paragraphs, then lines, then words, in the second half of a part. A part never ends
/// inside a tag or an entity; the tags open where it ends are closed at its end and
/// opened again at the start of the next part, so each part is well formed on its own.
/// Whitespace at a break is dropped, but not the indentation of the line a part starts
/// with; nothing else is.
pub fn split_html(html: &str, limit: usize) -> Vec<String> {
    assert!(limit > 0, "a part limit of zero cannot hold any text");
    let atoms = atoms(html);
    let mut parts = Vec::new();
    // Open tags at the start of the part being built, outermost first.
    let mut carried: Vec<Atom<'_>> = Vec::new();
    let mut start = 0;
    while start < atoms.len() {
        let (end, open_at_end) = part_end(&atoms, start, &carried, limit);
        let mut part: String = carried.iter().map(|atom| atom.text()).collect();
        part.extend(atoms[start..end].iter().map(|atom| atom.text()));
        let mut part = part.trim_end().to_owned();
        for open in open_at_end.iter().rev() {
            if let Atom::Open { name, .. } = open {
                part.push_str(&format!("</{name}>"));
            }
        }
        if !is_blank_html(&part) {
            parts.push(part);
        }
        carried = open_at_end;
        start = next_part_start(&atoms, end);
    }
    if parts.is_empty() {
        parts.push(html.to_owned());
    }
    parts
}

/// Where the part after a break at `end` starts: past the whitespace of the break, but
/// not past the indentation of the line that continues it (code keeps its shape).
fn next_part_start(atoms: &[Atom<'_>], end: usize) -> usize {
    let is_blank = |atom: &Atom<'_>| atom.text().chars().all(char::is_whitespace);
    let mut line_start = (end > 0 && atoms[end - 1].text().contains('\n')).then_some(end);
    let mut next = end;
    while let Some(atom) = atoms.get(next).filter(|atom| is_blank(atom)) {
        next += 1;
        if atom.text().contains('\n') {
            line_start = Some(next);
        }
    }
    match line_start {
        // Nothing follows but whitespace: the text is over.
        Some(_) if next == atoms.len() => next,
        Some(line_start) => line_start,
        None => next,
    }
}

/// Where the part that starts at `start` ends (an atom index) and the tags open there.
fn part_end<'a>(
    atoms: &[Atom<'a>],
    start: usize,
    carried: &[Atom<'a>],
    limit: usize,
) -> (usize, Vec<Atom<'a>>) {
    let mut open: Vec<Atom<'a>> = carried.to_vec();
    let mut used: usize = carried.iter().map(|atom| utf16_len(atom.text())).sum();
    // The latest break of each kind so far (end, open tags there): word, line, paragraph.
    let mut breaks: [Option<(usize, Vec<Atom<'a>>)>; 3] = [None, None, None];
    let closing = |open: &[Atom<'_>]| -> usize {
        open.iter().map(|atom| if let Atom::Open { name, .. } = atom { name.len() + 3 } else { 0 }).sum()
    };
    for (index, atom) in atoms.iter().enumerate().skip(start) {
        let mut after = open.clone();
        match atom {
            Atom::Open { .. } => after.push(*atom),
            Atom::Close { name, .. } => {
                if let Some(at) =
                    after.iter().rposition(|o| matches!(o, Atom::Open { name: n, .. } if n == name))
                {
                    after.truncate(at);
                }
            }
            Atom::Text(_) | Atom::LineBreak(_) => {}
        }
        let cost = utf16_len(atom.text());
        if used + cost + closing(&after) > limit && index > start {
            // A break this far into the part is good enough; an earlier one would make
            // many small messages, so a hard cut is better there.
            let half = start + (index - start) / 2;
            let best = breaks.iter().rev().flatten().find(|(end, _)| *end > half);
            return match best {
                Some((end, open)) => (*end, open.clone()),
                None => (index, open),
            };
        }
        used += cost;
        open = after;
        let kind = match atom.text() {
            "\n" if atoms.get(index + 1).is_some_and(|next| next.text() == "\n") => Some(2),
            "\n" => Some(1),
            " " | "\t" => Some(0),
            _ => None,
        };
        if let Some(kind) = kind {
            breaks[kind] = Some((index + 1, open.clone()));
        }
    }
    (atoms.len(), open)
}

/// A part with nothing to show: only whitespace and tags.
pub fn is_blank_html(part: &str) -> bool {
    html_to_plain(part).trim().is_empty()
}

/// What a part reads as without its markup: tags dropped, entities turned back into their
/// characters, a link's address written after its text, a `<br>` a line break. What is sent
/// when Telegram cannot parse the part's HTML.
///
/// ```
/// use switchboard::telegram::format::html_to_plain;
///
/// assert_eq!(html_to_plain("<b>x &lt; y</b> &amp; <i>z"), "x < y & z");
/// assert_eq!(html_to_plain("see <a href=\"https://ci/81\">the run</a><br>done"), "see the run (https://ci/81)\ndone");
/// ```
pub fn html_to_plain(html: &str) -> String {
    let mut plain = String::with_capacity(html.len());
    // The links open here, innermost last: their address, and where their text starts.
    let mut links: Vec<(Option<String>, usize)> = Vec::new();
    for atom in atoms(html) {
        match atom {
            Atom::Open { name, text } if name.eq_ignore_ascii_case("a") => {
                links.push((href(text), plain.len()))
            }
            Atom::LineBreak(_) => plain.push('\n'),
            Atom::Close { name, .. } if name.eq_ignore_ascii_case("a") => {
                let Some((Some(address), from)) = links.pop() else { continue };
                // Written out after a text that is not the address already; a link with
                // no text here (a split's empty end) adds nothing.
                let shown = plain[from..].trim();
                if !shown.is_empty() && shown != address {
                    plain.push_str(&format!(" ({address})"));
                }
            }
            Atom::Open { .. } | Atom::Close { .. } => {}
            Atom::Text(text) if text.starts_with('&') && text.len() > 1 => plain.push_str(&unescape(text)),
            Atom::Text(text) => plain.push_str(text),
        }
    }
    plain
}

/// The address an `<a href="…">` tag names, its entities read.
fn href(tag: &str) -> Option<String> {
    let at = tag.find("href=")? + "href=".len();
    let quote = tag[at..].chars().next().filter(|c| *c == '"' || *c == '\'')?;
    let value = &tag[at + 1..];
    let value = &value[..value.find(quote)?];
    Some(html_to_plain(value)).filter(|address| !address.is_empty())
}

/// One entity as its character; an entity Telegram does not know stays as written.
fn unescape(entity: &str) -> String {
    let body = &entity[1..entity.len() - 1];
    let named = match body {
        "lt" => Some('<'),
        "gt" => Some('>'),
        "amp" => Some('&'),
        "quot" => Some('"'),
        "apos" => Some('\''),
        "nbsp" => Some('\u{a0}'),
        _ => None,
    };
    let numeric = || {
        let n = body.strip_prefix('#')?;
        let code = match n.strip_prefix(['x', 'X']) {
            Some(hex) => u32::from_str_radix(hex, 16).ok()?,
            None => n.parse().ok()?,
        };
        char::from_u32(code)
    };
    named.or_else(numeric).map_or_else(|| entity.to_owned(), String::from)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn formats_are_read_by_name_and_anything_else_is_refused() {
        assert_eq!(ReplyFormat::parse(None), Ok(ReplyFormat::Text));
        assert_eq!(ReplyFormat::parse(Some("markdown")), Ok(ReplyFormat::Markdown));
        assert_eq!(ReplyFormat::parse(Some("html")), Ok(ReplyFormat::Html));
        let refused = ReplyFormat::parse(Some("MarkdownV2")).unwrap_err();
        assert!(refused.contains("MarkdownV2") && refused.contains("markdown"), "{refused}");
        let refused = ReplyFormat::parse(Some("rtf")).unwrap_err();
        assert!(refused.contains("\"html\"") && refused.contains("nothing was sent"), "{refused}");
    }

    /// Telegram's `parse_mode` spellings name the same formats.
    #[test]
    fn format_names_are_read_whatever_their_case() {
        assert_eq!(ReplyFormat::parse(Some("HTML")), Ok(ReplyFormat::Html));
        assert_eq!(ReplyFormat::parse(Some("Markdown")), Ok(ReplyFormat::Markdown));
        assert_eq!(ReplyFormat::parse(Some(" Text ")), Ok(ReplyFormat::Text));
        // MarkdownV2 reads `*x*` as bold, CommonMark as italic: not the same format.
        assert!(ReplyFormat::parse(Some("markdownv2")).is_err());
        assert_ne!(markdown_to_html("*x*"), "<b>x</b>");
    }

    #[test]
    fn markdown_becomes_telegram_tags_and_everything_else_is_escaped() {
        let cases = [
            ("*it* **bold** ~~gone~~", "<i>it</i> <b>bold</b> <s>gone</s>"),
            ("a `x<y>&z` b", "a <code>x&lt;y&gt;&amp;z</code> b"),
            (
                "[docs](https://e.com/?a=1&b=\"2\")",
                "<a href=\"https://e.com/?a=1&amp;b=&quot;2&quot;\">docs</a>",
            ),
            ("<script>alert(1)</script> & 5 > 3", "&lt;script&gt;alert(1)&lt;/script&gt; &amp; 5 &gt; 3"),
            ("# Title\n\ntext", "<b>Title</b>\n\ntext"),
            ("- one\n- two", "• one\n• two"),
            ("1. one\n2. two\n\nafter", "1. one\n2. two\n\nafter"),
            ("> quoted\n\nnot", "<blockquote>quoted</blockquote>\n\nnot"),
            ("```rust\nfn main() {}\n```", "<pre><code class=\"language-rust\">fn main() {}</code></pre>"),
            ("first\nsecond", "first\nsecond"),
            ("say \"hi\" and `{\"a\": 1}`", "say \"hi\" and <code>{\"a\": 1}</code>"),
        ];
        for (markdown, html) in cases {
            assert_eq!(markdown_to_html(markdown), html, "{markdown:?}");
        }
        // A room post's name stays text, escaped, in front of the rendered reply.
        let (parts, html) = ReplyFormat::Markdown.parts_after("R&D <bot>: ", "**ok**", 4096);
        assert_eq!((parts, html), (vec!["R&amp;D &lt;bot&gt;: <b>ok</b>".to_owned()], true));
        assert_eq!(ReplyFormat::Text.parts_after("Bob: ", "**ok**", 4096).0, ["Bob: **ok**"]);
        // A quote in text is one character, not `&quot;`: a reply full of JSON is not
        // split into twice the messages.
        let (parts, _) = ReplyFormat::Markdown.parts(&"\"".repeat(1000), 4096);
        assert_eq!(parts.len(), 1);
    }

    /// Text in angle brackets that is none of Telegram's tags (a placeholder, a generic
    /// type) is text: the plain fallback keeps it, and the splitter neither carries nor
    /// closes it.
    #[test]
    fn only_telegrams_tags_are_markup_and_anything_else_in_brackets_is_text() {
        let html = "Run <code>git clone <url></code> then <b>Vec<T></b>";
        assert_eq!(html_to_plain(html), "Run git clone <url> then Vec<T>");
        assert_eq!(
            html_to_plain("<tg-spoiler>s</tg-spoiler> <STRONG>x</STRONG> <name> </x>"),
            "s x <name> </x>"
        );
        assert!(!is_blank_html("<placeholder>"), "shows its text");
        let parts = split_html(&format!("<i>{} <item> {}</i>", "a".repeat(30), "b".repeat(30)), 40);
        for part in &parts {
            assert!(part.starts_with("<i>") && part.ends_with("</i>"), "{parts:?}");
            assert!(!part.contains("</item>"), "not closed as a tag: {parts:?}");
        }
        assert!(parts.concat().contains("<item>"), "{parts:?}");
    }

    #[test]
    fn nested_lists_are_indented_lines() {
        assert_eq!(markdown_to_html("- a\n  - b\n- c"), "• a\n  • b\n• c");
    }

    #[test]
    fn plain_text_is_the_html_without_tags_and_with_entities_unescaped() {
        assert_eq!(
            html_to_plain("<a href=\"u\">l</a> &quot;q&quot; &#65;&#x42; &bogus;"),
            "l (u) \"q\" AB &bogus;"
        );
        assert_eq!(
            html_to_plain("<a href=\"https://x.y/?a=1&amp;b=2\">https://x.y/?a=1&amp;b=2</a>"),
            "https://x.y/?a=1&b=2"
        );
        assert_eq!(html_to_plain("line<br>next<br >last"), "line\nnext\nlast");
        assert_eq!(html_to_plain("1 < 2 && 3 > 2"), "1 < 2 && 3 > 2");
        assert!(is_unparsable_entities("Telegram refused it: Bad Request: can't parse entities: Unclosed"));
        assert!(!is_unparsable_entities("Telegram refused it: Bad Request: chat not found"));
    }

    #[test]
    fn a_split_closes_and_reopens_the_tags_it_cuts_through() {
        let html = "<b>aaaa bbbb cccc</b> dddd";
        let parts = split_html(html, 14);
        for part in &parts {
            assert!(utf16_len(part) <= 14, "{part:?}");
            assert_balanced(part);
        }
        assert_eq!(
            parts.iter().map(|p| html_to_plain(p)).collect::<Vec<_>>().join(" "),
            "aaaa bbbb cccc dddd"
        );
        assert!(parts[0].starts_with("<b>") && parts[1].starts_with("<b>"), "{parts:?}");
    }

    #[test]
    fn a_split_never_cuts_an_entity_or_a_tag() {
        let parts = split_html("&amp;&amp;&amp;<a href=\"xyz\">k</a>", 9);
        assert_eq!(parts[0], "&amp;");
        assert!(parts.iter().all(|p| !p.ends_with('&') && p.matches('<').count() == p.matches('>').count()));
        assert_eq!(parts.iter().map(|p| html_to_plain(p)).collect::<String>(), "&&&k (xyz)");
    }

    #[test]
    fn text_full_of_ampersands_and_brackets_is_read_as_characters() {
        let text = format!("{}{};", "& <".repeat(20_000), "x".repeat(10));
        let parts = split_html(&text, 4096);
        assert!(parts.iter().all(|p| utf16_len(p) <= 4096));
        let squash = |s: &str| s.chars().filter(|c| !c.is_whitespace()).collect::<String>();
        assert_eq!(squash(&parts.iter().map(|p| html_to_plain(p)).collect::<String>()), squash(&text));
    }

    #[test]
    fn a_code_block_split_at_a_line_keeps_the_next_lines_indentation() {
        let code = "def f():\n    x = 1\n    return 14\n\n    # done";
        let html = format!("<pre><code>{code}</code></pre>");
        let parts = split_html(&html, 40);
        assert!(parts.len() > 1, "{parts:?}");
        for part in &parts[1..] {
            let text = html_to_plain(part);
            assert!(text.starts_with("    "), "the indentation stays: {parts:?}");
            assert!(part.starts_with("<pre><code>"), "{parts:?}");
        }
        let lines: Vec<String> = parts.iter().map(|p| html_to_plain(p)).collect();
        assert_eq!(lines.join("\n").replace("\n\n", "\n"), code.replace("\n\n", "\n"));
        // Between words, the space at the break goes.
        assert_eq!(split_html("aaaa bbbb cccc", 10), ["aaaa bbbb", "cccc"]);
    }

    #[test]
    fn short_html_is_one_part_and_prefers_paragraph_breaks() {
        assert_eq!(split_html("<b>hi</b>", 4096), ["<b>hi</b>"]);
        assert_eq!(split_html("aaaa bbbb\n\ncccc", 12), ["aaaa bbbb", "cccc"]);
    }

    /// Every open tag is closed, in order.
    fn assert_balanced(part: &str) {
        let mut open = Vec::new();
        for atom in atoms(part) {
            match atom {
                Atom::Open { name, .. } => open.push(name),
                Atom::Close { name, .. } => assert_eq!(open.pop(), Some(name), "{part:?}"),
                Atom::Text(_) | Atom::LineBreak(_) => {}
            }
        }
        assert!(open.is_empty(), "{part:?}");
    }

    proptest! {
        /// Markdown of any shape renders to parts that fit, are balanced, and lose nothing
        /// but whitespace.
        #[test]
        fn markdown_parts_fit_balance_and_keep_the_text(
            words in proptest::collection::vec("[a-z]{1,12}|\\*\\*[a-z]{1,8}\\*\\*|`[a-z<&]{1,6}`|\n\n|- |&|<", 1..200),
            limit in 40usize..300,
        ) {
            let markdown = words.join(" ");
            let html = markdown_to_html(&markdown);
            let parts = split_html(&html, limit);
            for part in &parts {
                prop_assert!(utf16_len(part) <= limit, "{} > {limit}: {part:?}", utf16_len(part));
                assert_balanced(part);
            }
            let squash = |s: &str| s.chars().filter(|c| !c.is_whitespace()).collect::<String>();
            let joined: String = parts.iter().map(|p| html_to_plain(p)).collect();
            prop_assert_eq!(squash(&joined), squash(&html_to_plain(&html)));
        }
    }
}
