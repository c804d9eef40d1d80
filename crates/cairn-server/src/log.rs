//! The request log: one JSON line per request (time, token name, repository, operation,
//! object, bytes, HTTP status, result), to a file (appended) or to stderr.

use std::io::Write;
use std::path::Path;
use std::sync::Mutex;

use anyhow::{Context, Result};
use serde::Serialize;

/// One request, as logged.
#[derive(Debug, Default, Serialize)]
pub struct Entry {
    /// RFC 3339 UTC, milliseconds.
    pub time: String,
    /// The client's address.
    pub peer: String,
    /// The token's name, once it is known.
    pub token: Option<String>,
    /// The repository named, if any.
    pub repo: Option<String>,
    /// `read`, `list`, `write`, `delete`, `create`, or the HTTP method of a request that named
    /// no operation.
    pub op: String,
    /// The object or directory named (at most 128 bytes of it), if any.
    pub object: Option<String>,
    /// Bytes received (write) or sent (read, list).
    pub bytes: u64,
    /// The HTTP status answered.
    pub status: u16,
    /// `ok`, or why the request was refused or failed, in one line.
    pub result: String,
    /// Milliseconds from the request's head to its answer.
    pub ms: u64,
}

/// Where log lines go.
pub struct Log {
    out: Mutex<Box<dyn Write + Send>>,
}

impl Log {
    /// Logs to the file at `path` (appended to), or to stderr for `-`.
    pub fn open(path: &Path) -> Result<Log> {
        let out: Box<dyn Write + Send> = if path.as_os_str() == "-" {
            Box::new(std::io::stderr())
        } else {
            Box::new(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .with_context(|| format!("cannot open the request log {}", path.display()))?,
            )
        };
        Ok(Log { out: Mutex::new(out) })
    }

    /// Writes one line (a failure to log is reported on stderr, not to the client).
    pub fn write(&self, entry: &Entry) {
        let mut line = serde_json::to_vec(entry).expect("log entries serialize");
        line.push(b'\n');
        let mut out = self.out.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = out.write_all(&line).and_then(|()| out.flush()) {
            eprintln!("cairn serve: cannot write the request log: {e}");
        }
    }
}
