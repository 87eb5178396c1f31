//! A file being written that is removed unless it is finished: the daemon's staged
//! uploads and the plugin's inbox downloads both stream into a file whose caller may go
//! away at any await (a timeout, a closed connection, the process asked to stop), and
//! neither may leave half a file behind for nothing to ever remove.

use std::path::PathBuf;

/// Removes its path when dropped, unless [`kept`](Self::keep).
#[derive(Debug)]
pub struct UnfinishedFile(Option<PathBuf>);

impl UnfinishedFile {
    pub fn new(path: PathBuf) -> Self {
        Self(Some(path))
    }

    /// The file is finished (indexed, or renamed to its final name): it stays.
    pub fn keep(mut self) {
        self.0 = None;
    }
}

impl Drop for UnfinishedFile {
    fn drop(&mut self) {
        if let Some(path) = self.0.take() {
            // Absent when it was never created (create_new refused, the folder gone) or
            // already renamed away.
            let _ = std::fs::remove_file(path);
        }
    }
}
