//! The plugin's end of the MCP transport: its stdin and stdout.
//!
//! tokio's own stdin and stdout hand every read and every write to a blocking thread and
//! wait for it, because a terminal or a file cannot be polled. An agent session starts its
//! plugins with pipes, which can: those are read and written on the runtime's thread,
//! without a hand-over to another thread for each notification pushed, each tool call
//! read and each result written. Anything else falls back to tokio's stdio.

use std::io;
use std::os::fd::AsFd;
use std::pin::Pin;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::unix::pipe;

use super::surrogates::LoneSurrogatesReplaced;

pub(super) type Reader = Pin<Box<dyn AsyncRead + Send>>;
pub(super) type Writer = Pin<Box<dyn AsyncWrite + Send>>;

/// stdin and stdout as an MCP transport. Must be called inside the runtime.
pub(super) fn transport() -> (Reader, Writer) {
    let reader: Reader = match stdin_pipe() {
        Ok(pipe) => Box::pin(LoneSurrogatesReplaced::new(pipe)),
        Err(e) => {
            tracing::debug!(error = %e, "stdin is not a pipe; reading it through a blocking thread");
            Box::pin(LoneSurrogatesReplaced::new(tokio::io::stdin()))
        }
    };
    let writer: Writer = match stdout_pipe() {
        Ok(pipe) => Box::pin(pipe),
        Err(e) => {
            tracing::debug!(error = %e, "stdout is not a pipe; writing it through a blocking thread");
            Box::pin(tokio::io::stdout())
        }
    };
    (reader, writer)
}

/// A duplicate of fd 0, so that dropping it leaves stdin open. (`from_owned_fd` checks
/// that it is a pipe and makes it nonblocking.)
fn stdin_pipe() -> io::Result<pipe::Receiver> {
    pipe::Receiver::from_owned_fd(io::stdin().as_fd().try_clone_to_owned()?)
}

/// Nothing else in the plugin writes to stdout (its logs go to stderr), so making the
/// pipe nonblocking surprises no other writer.
fn stdout_pipe() -> io::Result<pipe::Sender> {
    pipe::Sender::from_owned_fd(io::stdout().as_fd().try_clone_to_owned()?)
}
