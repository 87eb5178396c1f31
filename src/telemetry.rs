//! Logging through `tracing`: human-readable by default, JSON on request, always to
//! stderr (the channel plugin's stdout belongs to MCP). Every line passes through a
//! scrubber that replaces known secrets, so a bot token inside a URL in some library's
//! error message still never reaches a log.

use std::io::{self, IsTerminal, Write};
use std::sync::Arc;

use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;

use crate::config::LogFormat;

const REDACTED: &str = "[redacted]";

/// Libraries whose chatter is noise for an operator: HTTP internals (which may quote
/// URLs), SQL statements, and rmcp's handshake and per-notification info lines.
const QUIET_LIBRARIES: &[&str] =
    &["hyper=warn", "hyper_util=warn", "reqwest=warn", "sqlx=warn", "h2=warn", "rustls=warn", "rmcp=warn"];

/// Installs the global subscriber. `RUST_LOG` overrides `filter`.
pub fn init(format: LogFormat, filter: &str, secrets: Vec<String>) -> anyhow::Result<()> {
    let base = std::env::var("RUST_LOG").unwrap_or_else(|_| filter.to_owned());
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
    secrets: Arc<Vec<String>>,
}

impl ScrubbingStderr {
    pub fn new(secrets: Vec<String>) -> Self {
        // Very short values would scrub innocent text; real secrets are long.
        let secrets = secrets.into_iter().filter(|s| s.len() >= 8).collect();
        Self { secrets: Arc::new(secrets) }
    }
}

impl<'a> MakeWriter<'a> for ScrubbingStderr {
    type Writer = ScrubbedLine;
    fn make_writer(&'a self) -> Self::Writer {
        ScrubbedLine { secrets: Arc::clone(&self.secrets), buffer: Vec::with_capacity(256) }
    }
}

pub struct ScrubbedLine {
    secrets: Arc<Vec<String>>,
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
        let text = scrub(&String::from_utf8_lossy(&self.buffer), &self.secrets);
        // Nothing sensible to do if stderr is gone.
        let _ = io::stderr().lock().write_all(text.as_bytes());
    }
}

pub fn scrub(text: &str, secrets: &[String]) -> String {
    secrets.iter().fold(text.to_owned(), |text, secret| text.replace(secret.as_str(), REDACTED))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scrub_replaces_every_occurrence_of_every_secret() {
        let secrets = vec!["123456:AAAA-token".to_owned(), "agent-secret-1".to_owned()];
        let line =
            "GET http://x/bot123456:AAAA-token/GetUpdates failed; agent-secret-1 and 123456:AAAA-token";
        assert_eq!(
            scrub(line, &secrets),
            "GET http://x/bot[redacted]/GetUpdates failed; [redacted] and [redacted]"
        );
    }

    #[test]
    fn short_values_are_not_treated_as_secrets() {
        let writer = ScrubbingStderr::new(vec!["a".into(), "long-enough-secret".into()]);
        assert_eq!(writer.secrets.as_slice(), ["long-enough-secret"]);
    }
}
