//! What can be wrong with an object's bytes. `cairn-core` turns each into the variant of the
//! same name of its own error, so a message reads the same whichever layer found the fault.

/// Result with the format's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can be wrong with an object's bytes or with a value to be encoded.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A stored object failed its integrity or authentication check.
    #[error("{file} is damaged: {why}")]
    Corrupt {
        /// Repository-relative name of the damaged object (e.g. `data/ab/ab12…`).
        file: String,
        /// What was found to be wrong.
        why: String,
    },
    /// An object is well-formed but describes something unsafe or impossible.
    #[error("{file} is invalid: {why}")]
    Invalid {
        /// Repository-relative name of the offending object or blob.
        file: String,
        /// What is wrong.
        why: String,
    },
    /// A repository written by a newer format version.
    #[error("repository format version {found} is newer than this cairn supports ({supported}); upgrade cairn")]
    UnsupportedVersion {
        /// Version found in the config.
        found: u32,
        /// Highest version this build reads.
        supported: u32,
    },
    /// A malformed identifier.
    #[error("invalid {0}")]
    InvalidId(String),
    /// A value given to be encoded is out of range (a codec level, KDF parameters).
    #[error("{0}")]
    Usage(String),
    /// An encoder was handed something it never should be: a bug, never the input's fault.
    #[error("internal error: {0}; please report this")]
    Internal(String),
}

impl Error {
    /// Builds an [`Error::Corrupt`].
    pub fn corrupt(file: impl Into<String>, why: impl Into<String>) -> Self {
        Error::Corrupt { file: file.into(), why: why.into() }
    }

    /// Builds an [`Error::Invalid`].
    pub fn invalid(file: impl Into<String>, why: impl Into<String>) -> Self {
        Error::Invalid { file: file.into(), why: why.into() }
    }
}
