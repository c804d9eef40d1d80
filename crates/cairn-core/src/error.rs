//! The library's error type: every message names the object it is about and, where it can,
//! what the user should do.

use std::path::PathBuf;

/// Result with the library's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in Cairn.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No key file could be opened with the given password.
    #[error("wrong password: no key in {repo}/keys opens with it")]
    WrongPassword {
        /// The repository location.
        repo: String,
    },
    /// No key file opened: those intact refused the password, and at least one is damaged
    /// (it may be the one the password was for).
    #[error("wrong password for {repo} (no intact key file opens with it), and {detail}")]
    WrongPasswordOrDamagedKey {
        /// The repository location.
        repo: String,
        /// Which key file is damaged, and how.
        detail: String,
    },
    /// A stored file failed its integrity or authentication check.
    #[error("{file} is damaged: {why}")]
    Corrupt {
        /// Repository-relative name of the damaged file (e.g. `data/ab/ab12…`).
        file: String,
        /// What was found to be wrong.
        why: String,
    },
    /// A repository file is well-formed but describes something unsafe or impossible.
    #[error("{file} is invalid: {why}")]
    Invalid {
        /// Repository-relative name of the offending file or blob.
        file: String,
        /// What is wrong.
        why: String,
    },
    /// The storage backend failed.
    #[error("storage: {op} {path}: {source}")]
    Storage {
        /// The operation (read, write, list, delete).
        op: &'static str,
        /// The object path.
        path: String,
        /// The backend's error.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The location itself cannot be used: its host cannot be reached, its bucket does not
    /// exist, the credentials or the SSH key were refused (engine::storage's `explain`). The
    /// message is one line saying what to do; the backend's full context is the source.
    #[error("{location}: {why}")]
    Unreachable {
        /// The repository location.
        location: String,
        /// What is wrong and what to do.
        why: String,
        /// The backend's error, with all its context.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A stored object does not exist.
    #[error("{0} does not exist in the repository")]
    NotFound(String),
    /// No repository exists at the location.
    #[error("no repository at {0}: check the location, or create a repository there with `cairn init`")]
    NoRepository(String),
    /// A prune stored this deletion manifest while a command was opening the repository (the
    /// index it read ahead may name packs being deleted).
    #[error(
        "a prune stored {0} while this command was opening the repository, so what it read may be out of date: run \
         it again"
    )]
    ChangedWhileOpening(String),
    /// `init` was asked to create a repository where one already exists.
    #[error("a repository already exists at {0}")]
    AlreadyInitialized(String),
    /// `init` was asked to create a repository where the objects of one remain (its config
    /// was lost): a new config and key beside them would leave a repository nothing opens.
    #[error(
        "{repo} already holds repository objects ({found}) but no config; not initializing over them: \
         restore its config from a copy of the repository (nothing was written)"
    )]
    HoldsObjects {
        /// The repository location.
        repo: String,
        /// What was found, e.g. "1 key file, 3 snapshots".
        found: String,
    },
    /// The repository was written by a newer format version.
    #[error("repository format version {found} is newer than this cairn supports ({supported}); upgrade cairn")]
    UnsupportedVersion {
        /// Version found in the config.
        found: u32,
        /// Highest version this build reads.
        supported: u32,
    },
    /// A local file system operation failed.
    #[error("{path}: {what}: {source}")]
    Io {
        /// The path involved.
        path: PathBuf,
        /// What was being done.
        what: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A snapshot name matched no or several snapshots.
    #[error("{0}")]
    SnapshotSelect(String),
    /// A path inside a snapshot does not exist.
    #[error("path {path:?} not found in snapshot {snapshot}{note}")]
    PathNotFound {
        /// The path asked for.
        path: String,
        /// The snapshot's short ID.
        snapshot: String,
        /// More about it (empty, or `, which "latest" chose …`: engine::select).
        note: String,
    },
    /// A malformed identifier.
    #[error("invalid {0}")]
    InvalidId(String),
    /// Bad user input (options, patterns, arguments).
    #[error("{0}")]
    Usage(String),
    /// Cairn itself went wrong (a stage stopped without saying why, a worker disappeared): a
    /// bug, never the user's input or the repository's state.
    #[error("internal error: {0}; please report this")]
    Internal(String),
    /// The repository is in a state the operation will not work on (it says what to run
    /// first), e.g. a prune when a snapshot's tree cannot be read.
    #[error("{0}")]
    Refused(String),
    /// The operation was cancelled (for example by SIGINT).
    #[error("interrupted")]
    Interrupted,
    /// The command whose output was being backed up failed: no snapshot was saved.
    #[error("the command `{command}` {status}: no snapshot saved{stderr}")]
    SourceCommand {
        /// The command line, as given.
        command: String,
        /// How it ended (`exited with status 2`, `was killed by signal 9`) or why it failed.
        status: String,
        /// The end of its standard error (`; its standard error ended with: …`), or nothing.
        stderr: String,
    },
    /// A hook of the profile failed (engine::hooks); a `before` hook's failure stops the command.
    #[error("the {stage} hook `{command}` {how}")]
    Hook {
        /// When it ran: `before`, `after`, `failure` or `finally`.
        stage: &'static str,
        /// Its command line.
        command: String,
        /// How it ended (`exited with status 3`, `was stopped after its timeout of 30s`).
        how: String,
    },
    /// Another process holds a conflicting lock on the repository.
    #[error("repository {repo} is locked: {holder}; if that process is gone, run `cairn unlock`")]
    Locked {
        /// The repository location.
        repo: String,
        /// Which lock conflicts, and who holds it.
        holder: String,
    },
}

impl Error {
    /// Builds an [`Error::Io`].
    pub fn io(path: impl Into<PathBuf>, what: &'static str, source: std::io::Error) -> Self {
        Error::Io { path: path.into(), what, source }
    }

    /// Builds an [`Error::Corrupt`].
    pub fn corrupt(file: impl Into<String>, why: impl Into<String>) -> Self {
        Error::Corrupt { file: file.into(), why: why.into() }
    }

    /// Builds an [`Error::Invalid`].
    pub fn invalid(file: impl Into<String>, why: impl Into<String>) -> Self {
        Error::Invalid { file: file.into(), why: why.into() }
    }

    /// Whether the error is about an object's bytes (damaged, foreign, of an unknown version),
    /// which reading again would not change: a reader that can do without the object skips it
    /// ([`crate::engine::unreadable`]). A storage or network failure is not: it may pass.
    pub fn is_damage(&self) -> bool {
        matches!(self, Error::Corrupt { .. } | Error::Invalid { .. } | Error::UnsupportedVersion { .. })
    }
}

impl From<cairn_format::Error> for Error {
    /// Each fault in an object's bytes becomes the variant of the same name, so a caller
    /// matches one error type whichever floor found it.
    fn from(e: cairn_format::Error) -> Self {
        use cairn_format::Error as F;
        match e {
            F::Corrupt { file, why } => Error::Corrupt { file, why },
            F::Invalid { file, why } => Error::Invalid { file, why },
            F::UnsupportedVersion { found, supported } => Error::UnsupportedVersion { found, supported },
            F::InvalidId(what) => Error::InvalidId(what),
            F::Usage(what) => Error::Usage(what),
            F::Internal(what) => Error::Internal(what),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn library_messages_name_no_cli_flags() {
        let messages = [
            "x".parse::<crate::commands::restore::Overwrite>().unwrap_err().to_string(),
            "x".parse::<crate::commands::restore::SparseMode>().unwrap_err().to_string(),
            Error::NoRepository("/r".into()).to_string(),
            Error::HoldsObjects { repo: "/r".into(), found: "1 key file".into() }.to_string(),
        ];
        for m in messages {
            assert!(!m.contains("--") && !m.contains("-r ") && !m.contains("CAIRN_"), "{m}");
        }
    }

    #[test]
    fn internal_failures_are_their_own_kind() {
        let e = Error::Internal("the backup's upload stage stopped early".into());
        assert_eq!(e.to_string(), "internal error: the backup's upload stage stopped early; please report this");
        assert!(!matches!(e, Error::Usage(_)));
    }
}
