//! Who stored each snapshot (FORMAT.md §15.4): the server's record, written when a token stores a
//! new snapshot object, before the object itself, and sent with every listing of `snapshots/`.
//!
//! A record is `.serve/stored-by/<snapshot id>` holding the token's name. No request can name a
//! `.serve/` path (§15.1), so only the server writes, changes or removes one: a client can send
//! a snapshot, never say who stored it. A record is written only for a snapshot that does not
//! exist yet (the same bytes stored again keep the first token's record) and is removed with its
//! snapshot; so once a listing shows a snapshot, its record (or its lack of one, for a snapshot
//! stored before the server kept records) does not change, and the server keeps what it read.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use cairn_core::engine::storage::Storage;

/// Where the records live, inside each repository.
const DIR: &str = ".serve/stored-by/";

/// Records read at once when a listing names snapshots not seen before.
const READERS: usize = 16;

/// Where the record of the snapshot at `snapshots/<id>` is.
fn record_path(snapshot: &str) -> String {
    format!("{DIR}{}", cairn_format::layout::file_name(snapshot))
}

/// The records this server has read or written, by repository, then snapshot path.
#[derive(Default)]
pub(crate) struct Records {
    known: Mutex<HashMap<String, HashMap<String, Option<String>>>>,
}

impl Records {
    fn known(&self) -> std::sync::MutexGuard<'_, HashMap<String, HashMap<String, Option<String>>>> {
        self.known.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records that `token` stores the new snapshot at `snapshot` of repository `repo`: called
    /// before the snapshot is written, so no snapshot stored through the server is ever without
    /// its record (an upload that then fails leaves a record no listing shows).
    pub fn write(&self, storage: &dyn Storage, repo: &str, snapshot: &str, token: &str) -> cairn_core::Result<()> {
        storage.write(&record_path(snapshot), token.as_bytes().to_vec())?;
        self.known().entry(repo.to_string()).or_default().insert(snapshot.to_string(), Some(token.to_string()));
        Ok(())
    }

    /// Removes the record of the snapshot at `snapshot` (an admin deleted it).
    pub fn remove(&self, storage: &dyn Storage, repo: &str, snapshot: &str) -> cairn_core::Result<()> {
        if let Some(known) = self.known().get_mut(repo) {
            known.remove(snapshot);
        }
        storage.delete(&record_path(snapshot))
    }

    /// Who stored each of the snapshots `listed` of repository `repo` (in their order; `None`
    /// where there is no record). Records not seen before are read, several at once; what is
    /// kept is only what the listing still shows.
    pub fn of(&self, storage: &dyn Storage, repo: &str, listed: &[String]) -> cairn_core::Result<Vec<Option<String>>> {
        let unread: Vec<&String> = {
            let known = self.known();
            let known = known.get(repo);
            listed.iter().filter(|p| known.is_none_or(|k| !k.contains_key(*p))).collect()
        };
        let chunk = unread.len().div_ceil(READERS).max(1);
        let parts: Vec<cairn_core::Result<Vec<Option<String>>>> = std::thread::scope(|s| {
            let readers: Vec<_> = unread
                .chunks(chunk)
                .map(|part| s.spawn(move || part.iter().map(|p| read(storage, p)).collect()))
                .collect();
            readers.into_iter().map(|r| r.join().expect("a record reader panicked")).collect()
        });
        let mut read_now = Vec::with_capacity(unread.len());
        for part in parts {
            read_now.extend(part?);
        }
        let mut known = self.known();
        let known = known.entry(repo.to_string()).or_default();
        for (path, record) in unread.into_iter().zip(read_now) {
            // One written meanwhile is as new as what was read.
            known.entry(path.clone()).or_insert(record);
        }
        let shown: HashSet<&String> = listed.iter().collect();
        known.retain(|path, _| shown.contains(path));
        Ok(listed.iter().map(|p| known.get(p).cloned().flatten()).collect())
    }
}

/// The record of the snapshot at `snapshot`, if there is one.
fn read(storage: &dyn Storage, snapshot: &str) -> cairn_core::Result<Option<String>> {
    match storage.read(&record_path(snapshot)) {
        Ok(name) => Ok(Some(String::from_utf8_lossy(&name).into_owned())),
        Err(cairn_core::Error::NotFound(_)) => Ok(None),
        Err(e) => Err(e),
    }
}
