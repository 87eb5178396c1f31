//! Logging through `tracing`: human-readable by default, JSON on request, always to
//! stderr (the channel plugin's stdout belongs to MCP). Every line passes through a
//! scrubber that replaces known secrets, so a bot token inside a URL in some library's
//! error message still never reaches a log.

use std::borrow::Cow;
use std::cell::RefCell;
use std::io::{self, IsTerminal, Write};
use std::sync::Arc;

use memchr::memmem;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;

use crate::config::LogFormat;

const REDACTED: &str = "[redacted]";

/// Libraries whose chatter is noise for an operator: HTTP internals (which may quote
/// URLs), and rmcp's handshake and per-notification info lines.
const QUIET_LIBRARIES: &[&str] =
    &["hyper=warn", "hyper_util=warn", "reqwest=warn", "h2=warn", "rustls=warn", "rmcp=warn"];

/// Installs the global subscriber. `RUST_LOG` overrides `filter`, unless it is empty (a
/// deployment that passes an unset variable through), which would silence every line.
pub fn init(format: LogFormat, filter: &str, secrets: Vec<String>) -> anyhow::Result<()> {
    let base = std::env::var("RUST_LOG")
        .ok()
        .filter(|set| !set.trim().is_empty())
        .unwrap_or_else(|| filter.to_owned());
    // Defaults first: a later directive for the same target replaces an earlier one, so an
    // operator who names a library (`RUST_LOG=hyper=debug`) gets what they asked for.
    let directives =
        QUIET_LIBRARIES.iter().copied().chain(std::iter::once(base.as_str())).collect::<Vec<_>>().join(",");
    let filter =
        EnvFilter::try_new(&directives).map_err(|e| anyhow::anyhow!("bad log filter '{base}': {e}"))?;
    let writer = ScrubbingStderr::new(secrets);
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .with_target(true)
        // Colours only for a person at a terminal; files and journald get plain text.
        .with_ansi(io::stderr().is_terminal());
    let result = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).with_current_span(true).try_init(),
    };
    result.map_err(|e| anyhow::anyhow!("could not install the log subscriber: {e}"))
}

/// Makes one buffered writer per log event; the writer scrubs and writes on drop, so a
/// secret is replaced even when it would straddle two `write` calls.
#[derive(Clone)]
pub struct ScrubbingStderr {
    secrets: Arc<Secrets>,
}

impl ScrubbingStderr {
    pub fn new(secrets: Vec<String>) -> Self {
        Self { secrets: Arc::new(Secrets::new(secrets)) }
    }
}

impl<'a> MakeWriter<'a> for ScrubbingStderr {
    type Writer = ScrubbedLine;
    fn make_writer(&'a self) -> Self::Writer {
        ScrubbedLine { secrets: Arc::clone(&self.secrets), buffer: Vec::with_capacity(256) }
    }
}

pub struct ScrubbedLine {
    secrets: Arc<Secrets>,
    buffer: Vec<u8>,
}

impl Write for ScrubbedLine {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        self.buffer.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for ScrubbedLine {
    fn drop(&mut self) {
        let line = self.secrets.scrub(&self.buffer);
        if !gather(&line) {
            // Nothing sensible to do if stderr is gone.
            let _ = io::stderr().lock().write_all(&line);
        }
    }
}

/// How much [`in_one_write`] gathers before it writes anyway.
const GATHER_LIMIT: usize = 64 * 1024;

thread_local! {
    /// The lines this thread's [`in_one_write`] has gathered so far, while one runs.
    static GATHERED: RefCell<Option<Vec<u8>>> = const { RefCell::new(None) };
}

/// Runs `emit`, and writes the log lines it makes on this thread in one `write` when it
/// ends (or every [`GATHER_LIMIT`] bytes) instead of one each: for a burst of lines made
/// at once, such as one per envelope of a committed batch. `emit` must not wait: the
/// lines reach stderr only when it returns (or unwinds).
pub fn in_one_write<T>(emit: impl FnOnce() -> T) -> T {
    in_one_write_to(io::stderr, emit)
}

fn in_one_write_to<T, W: Write>(sink: impl Fn() -> W, emit: impl FnOnce() -> T) -> T {
    /// Writes what was gathered, when `emit` returns or unwinds.
    struct Flush<W: Write, S: Fn() -> W>(S);
    impl<W: Write, S: Fn() -> W> Drop for Flush<W, S> {
        fn drop(&mut self) {
            if let Some(lines) = GATHERED.with(|gathered| gathered.borrow_mut().take()) {
                let _ = (self.0)().write_all(&lines);
            }
        }
    }
    let already = GATHERED.with(|gathered| {
        let mut gathered = gathered.borrow_mut();
        let already = gathered.is_some();
        gathered.get_or_insert_with(Vec::new);
        already
    });
    if already {
        // An outer call writes them.
        return emit();
    }
    let _flush = Flush(sink);
    emit()
}

/// Adds `line` to what this thread's [`in_one_write`] gathers; false when none runs (or
/// the gathered lines had to be written first, and this one with them, being too many).
fn gather(line: &[u8]) -> bool {
    GATHERED
        .try_with(|gathered| {
            let mut gathered = gathered.borrow_mut();
            let Some(lines) = gathered.as_mut() else { return false };
            lines.extend_from_slice(line);
            if lines.len() >= GATHER_LIMIT {
                let _ = io::stderr().lock().write_all(lines);
                lines.clear();
            }
            true
        })
        .unwrap_or(false)
}

/// The values no log line may carry, each with its searcher built once: every line is
/// searched for each of them, and nearly every line holds none.
struct Secrets(Vec<memmem::Finder<'static>>);

impl Secrets {
    fn new(secrets: Vec<String>) -> Self {
        // Very short values would scrub innocent text; real secrets are long.
        let finders = secrets
            .iter()
            .filter(|secret| secret.len() >= 8)
            .map(|secret| memmem::Finder::new(secret.as_bytes()).into_owned())
            .collect();
        Self(finders)
    }

    /// `line` with every occurrence of every secret replaced by [`REDACTED`]; the line
    /// itself when it holds none.
    fn scrub<'a>(&self, line: &'a [u8]) -> Cow<'a, [u8]> {
        let mut line = Cow::Borrowed(line);
        for secret in &self.0 {
            if secret.find(&line).is_none() {
                continue;
            }
            let mut scrubbed = Vec::with_capacity(line.len());
            let mut kept_to = 0;
            for at in secret.find_iter(&line) {
                scrubbed.extend_from_slice(&line[kept_to..at]);
                scrubbed.extend_from_slice(REDACTED.as_bytes());
                kept_to = at + secret.needle().len();
            }
            scrubbed.extend_from_slice(&line[kept_to..]);
            line = Cow::Owned(scrubbed);
        }
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scrub(line: &str, secrets: &[&str]) -> String {
        let secrets = Secrets::new(secrets.iter().map(|s| s.to_string()).collect());
        String::from_utf8(secrets.scrub(line.as_bytes()).into_owned()).expect("scrubbing keeps UTF-8")
    }

    #[test]
    fn scrub_replaces_every_occurrence_of_every_secret() {
        let line =
            "GET http://x/bot123456:AAAA-token/GetUpdates failed; agent-secret-1 and 123456:AAAA-token";
        assert_eq!(
            scrub(line, &["123456:AAAA-token", "agent-secret-1"]),
            "GET http://x/bot[redacted]/GetUpdates failed; [redacted] and [redacted]"
        );
        // Back to back, at both ends, and a line that is nothing else.
        assert_eq!(scrub("agent-secret-1agent-secret-1", &["agent-secret-1"]), "[redacted][redacted]");
        assert_eq!(scrub("agent-secret-1", &["agent-secret-1"]), "[redacted]");
        assert_eq!(scrub("a line with nothing secret", &["agent-secret-1"]), "a line with nothing secret");
    }

    /// A line as the subscriber writes one.
    fn log_line(writer: &ScrubbingStderr, text: &str) {
        let mut line = writer.make_writer();
        line.write_all(text.as_bytes()).unwrap();
    }

    #[test]
    fn lines_made_in_one_write_reach_the_sink_together_scrubbed_and_in_order() {
        let writer = ScrubbingStderr::new(vec!["agent-secret-1".into()]);
        let sink = std::rc::Rc::new(RefCell::new(Vec::new()));
        let handle = std::rc::Rc::clone(&sink);
        let seen_inside = in_one_write_to(
            move || SharedSink(std::rc::Rc::clone(&handle)),
            || {
                log_line(&writer, "first\n");
                log_line(&writer, "second agent-secret-1\n");
                sink.borrow().len()
            },
        );
        assert_eq!(seen_inside, 0, "nothing is written before the burst ends");
        assert_eq!(String::from_utf8(sink.borrow().clone()).unwrap(), "first\nsecond [redacted]\n");
        // Afterwards, nothing is gathered any more.
        assert!(!gather(b"later\n"));
    }

    #[test]
    fn nested_bursts_are_written_once_by_the_outer_one() {
        let sink = std::rc::Rc::new(RefCell::new(Vec::new()));
        let handle = std::rc::Rc::clone(&sink);
        in_one_write_to(
            move || SharedSink(std::rc::Rc::clone(&handle)),
            || {
                assert!(gather(b"outer\n"));
                in_one_write_to(
                    || -> SharedSink { unreachable!("the inner burst writes nothing") },
                    || {
                        assert!(gather(b"inner\n"));
                    },
                );
                assert!(sink.borrow().is_empty());
            },
        );
        assert_eq!(sink.borrow().as_slice(), b"outer\ninner\n");
    }

    /// A sink the test can read afterwards.
    struct SharedSink(std::rc::Rc<RefCell<Vec<u8>>>);

    impl Write for SharedSink {
        fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
            self.0.borrow_mut().extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn short_values_are_not_treated_as_secrets() {
        assert_eq!(scrub("a long-enough-secret", &["a", "long-enough-secret"]), "a [redacted]");
    }
}
