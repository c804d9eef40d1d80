//! A fault in a configuration file: one line naming the file, the line, the key, what is wrong
//! and, for a misspelt key, the closest valid one.

use std::fmt;
use std::path::PathBuf;

/// A configuration file that cannot be used, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    /// The file.
    pub file: PathBuf,
    /// The line (1-based), where one can be named.
    pub line: Option<usize>,
    /// The key, dotted from the top of the file (e.g. `profile.laptop.backup.exclude`).
    pub key: Option<String>,
    /// What is wrong and what is expected.
    pub message: String,
    /// The valid key (or profile name) closest to a misspelt one.
    pub suggestion: Option<String>,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if let Some(line) = self.line {
            write!(f, ":{line}")?;
        }
        write!(f, ": ")?;
        if let Some(key) = &self.key {
            write!(f, "{key}: ")?;
        }
        // Messages from the TOML parser span several lines (a caret under the fault): the
        // first says what is wrong, the file and line are already named.
        let first = self.message.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or("invalid");
        write!(f, "{first}")?;
        if let Some(s) = &self.suggestion {
            write!(f, " (did you mean `{s}`?)")?;
        }
        Ok(())
    }
}

impl std::error::Error for Error {}
