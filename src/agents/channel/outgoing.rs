//! The files of a reply, on the plugin's side (DESIGN.md §14): every file is checked before
//! anything is sent, then streamed to the daemon, which stages it; the reply names the
//! staged uploads. A file that fails a check refuses the whole reply.

use std::path::{Path, PathBuf};

use crate::agents::api::client::{ClientError, DaemonClient};
use crate::rules::media::{MAX_REPLY_FILES, TELEGRAM_UPLOAD_LIMIT};

/// A file that passed the checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutgoingFile {
    pub path: PathBuf,
    /// Its name, as Telegram will show it.
    pub name: String,
    /// Its size when checked. The file goes as it is when sent, whatever it holds by then.
    pub len: u64,
}

/// What is known about a path when it is checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathFacts {
    Missing,
    NotAFile,
    Unreadable(String),
    File { len: u64 },
}

/// Why one file cannot go, or `None` when it can.
pub fn file_problem(path: &str, facts: &PathFacts) -> Option<String> {
    if !Path::new(path).is_absolute() {
        return Some("is not an absolute path".into());
    }
    match facts {
        PathFacts::Missing => Some("does not exist".into()),
        PathFacts::NotAFile => Some("is not a regular file".into()),
        PathFacts::Unreadable(error) => Some(format!("cannot be read ({error})")),
        PathFacts::File { len } if *len > TELEGRAM_UPLOAD_LIMIT => Some(format!(
            "is {len} bytes; Telegram takes files of at most {TELEGRAM_UPLOAD_LIMIT} bytes (50 MB)"
        )),
        PathFacts::File { .. } => None,
    }
}

/// The facts of a path, from the file system (symbolic links followed).
fn facts_of(path: &str) -> PathFacts {
    match std::fs::metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => PathFacts::Missing,
        Err(e) => PathFacts::Unreadable(e.to_string()),
        Ok(meta) if !meta.is_file() => PathFacts::NotAFile,
        Ok(meta) => match std::fs::File::open(path) {
            Ok(_) => PathFacts::File { len: meta.len() },
            Err(e) => PathFacts::Unreadable(e.to_string()),
        },
    }
}

/// Files a reply never sends, whatever the agent is asked to send: switchboard's own
/// configuration and its SQLite ledger (with the `-wal`, `-shm` and lock files beside it),
/// which holds every chat of every agent. A model talked into "send me the ledger" gets a
/// refusal. Compared once symbolic links are followed, so a link elsewhere does not
/// reach them either. Anything else the plugin's user can read may go: see
/// docs/claude-code.md on pre-allowing `reply`.
#[derive(Debug, Clone, Default)]
pub struct KeptBack {
    configuration: Option<PathBuf>,
    /// The ledger's folder and its file name: every file of that folder whose name starts
    /// with it is the ledger's.
    ledger: Option<(PathBuf, std::ffi::OsString)>,
}

impl KeptBack {
    pub fn of(settings: &crate::config::Settings) -> Self {
        let real = |path: &Path| std::fs::canonicalize(path).or_else(|_| std::path::absolute(path)).ok();
        let ledger = match &settings.storage.database {
            crate::config::Database::Sqlite(path) => real(path).and_then(|path| {
                let name = path.file_name()?.to_owned();
                Some((path.parent()?.to_owned(), name))
            }),
            crate::config::Database::Postgres(_) => None,
        };
        Self { configuration: real(&settings.source), ledger }
    }

    fn keeps(&self, path: &Path) -> bool {
        let Ok(real) = std::fs::canonicalize(path) else { return false };
        let of_the_ledger = self.ledger.as_ref().is_some_and(|(folder, name)| {
            real.parent() == Some(folder.as_path())
                && real
                    .file_name()
                    .is_some_and(|file| file.as_encoded_bytes().starts_with(name.as_encoded_bytes()))
        });
        self.configuration.as_deref() == Some(real.as_path()) || of_the_ledger
    }
}

/// Checks every file; any problem refuses them all, naming each file and why.
pub fn check_files(paths: &[String], kept_back: &KeptBack) -> Result<Vec<OutgoingFile>, String> {
    if paths.len() > MAX_REPLY_FILES {
        return Err(format!(
            "files: a reply takes at most {MAX_REPLY_FILES} files, not {}. Nothing was sent.",
            paths.len()
        ));
    }
    let mut problems = Vec::new();
    let mut files = Vec::new();
    for path in paths {
        if kept_back.keeps(Path::new(path)) {
            problems.push(format!(
                "{path} is switchboard's own configuration or ledger, which a reply never sends"
            ));
            continue;
        }
        let facts = facts_of(path);
        match (file_problem(path, &facts), facts) {
            (Some(problem), _) => problems.push(format!("{path} {problem}")),
            (None, PathFacts::File { len }) => {
                let name =
                    Path::new(path).file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                files.push(OutgoingFile { path: PathBuf::from(path), name, len });
            }
            (None, _) => unreachable!("only a readable file has no problem"),
        }
    }
    if problems.is_empty() {
        Ok(files)
    } else {
        Err(format!(
            "files refused, nothing was sent: {}. Fix or leave out these files and reply again.",
            problems.join("; ")
        ))
    }
}

/// Streams each file to the daemon; answers their upload ids, in order.
pub async fn upload_all(daemon: &DaemonClient, files: &[OutgoingFile]) -> Result<Vec<String>, ClientError> {
    let mut ids = Vec::with_capacity(files.len());
    for file in files {
        ids.push(daemon.upload_file(&file.path, &file.name, file.len).await?.upload_id);
    }
    Ok(ids)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_reason_a_file_cannot_go_is_named() {
        assert!(file_problem("relative.txt", &PathFacts::File { len: 1 }).unwrap().contains("absolute"));
        assert!(file_problem("/x", &PathFacts::Missing).unwrap().contains("does not exist"));
        assert!(file_problem("/x", &PathFacts::NotAFile).unwrap().contains("not a regular file"));
        assert!(file_problem("/x", &PathFacts::Unreadable("denied".into())).unwrap().contains("denied"));
        let big = file_problem("/x", &PathFacts::File { len: TELEGRAM_UPLOAD_LIMIT + 1 }).unwrap();
        assert!(big.contains("50 MB"), "{big}");
        assert_eq!(file_problem("/x", &PathFacts::File { len: TELEGRAM_UPLOAD_LIMIT }), None);
    }

    #[test]
    fn one_bad_file_refuses_them_all_and_every_bad_one_is_listed() {
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("good.png");
        std::fs::write(&good, b"png").unwrap();
        let good = good.display().to_string();
        let checked = check_files(std::slice::from_ref(&good), &KeptBack::default()).unwrap();
        assert_eq!(checked[0].name, "good.png");
        assert_eq!(checked[0].len, 3);

        let missing = dir.path().join("missing.txt").display().to_string();
        let folder = dir.path().display().to_string();
        let refused =
            check_files(&[good, missing.clone(), folder.clone()], &KeptBack::default()).unwrap_err();
        assert!(refused.contains(&missing) && refused.contains(&folder), "{refused}");
        assert!(refused.contains("nothing was sent"), "{refused}");
        let eleven: Vec<String> = (0..11).map(|i| format!("/f{i}")).collect();
        assert!(check_files(&eleven, &KeptBack::default()).unwrap_err().contains("at most 10"));
    }

    /// "Send me the ledger": the configuration and the ledger's files are refused, also
    /// through a symbolic link; a file beside them is not.
    #[test]
    fn switchboard_s_own_configuration_and_ledger_are_never_sent() {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("switchboard.toml");
        let ledger = dir.path().join("switchboard.db");
        for file in [&config, &ledger, &dir.path().join("switchboard.db-wal"), &dir.path().join("notes.txt")]
        {
            std::fs::write(file, b"x").unwrap();
        }
        let link = dir.path().join("innocent.png");
        std::os::unix::fs::symlink(&ledger, &link).unwrap();
        let kept_back = KeptBack {
            configuration: Some(std::fs::canonicalize(&config).unwrap()),
            ledger: Some((std::fs::canonicalize(dir.path()).unwrap(), "switchboard.db".into())),
        };
        for refused in [&config, &ledger, &dir.path().join("switchboard.db-wal"), &link] {
            let path = refused.display().to_string();
            let problem = check_files(std::slice::from_ref(&path), &kept_back).unwrap_err();
            assert!(problem.contains("own configuration or ledger"), "{path}: {problem}");
        }
        let notes = dir.path().join("notes.txt").display().to_string();
        assert_eq!(check_files(&[notes], &kept_back).unwrap().len(), 1);
    }
}
