//! Standard input as the source (`--stdin --stdin-filename NAME`): one stream becomes one
//! file named NAME at the top of the snapshot, e.g. `pg_dump db | cairn backup --stdin`.

use std::io::Read;
use std::sync::atomic::Ordering;

use super::chunk::chunk_stream;
use super::pending::PendingDir;
use super::progress::Counters;
use super::{run, BackupOptions, BackupOutcome, Progress};
use crate::engine::platform::{self, NameCache};
use crate::engine::repository::Repository;
use crate::error::{Error, Result};
use cairn_format::tree::{check_name, Node, NodeKind};

/// Backs up everything `input` yields as the file `/NAME` and writes a snapshot.
pub fn backup_stdin(
    repo: &Repository,
    input: impl Read,
    name: &str,
    opts: &BackupOptions,
    progress: &Progress,
) -> Result<BackupOutcome> {
    backup_stream(repo, input, "standard input", name, opts, progress, || Ok(()))
}

/// Backs up everything `input` (called `what` in errors) yields as the file `/NAME`; `finished`
/// runs once the stream has ended, before the snapshot is written, and an error from it saves
/// no snapshot.
pub(super) fn backup_stream(
    repo: &Repository,
    input: impl Read,
    what: &str,
    name: &str,
    opts: &BackupOptions,
    progress: &Progress,
    finished: impl FnOnce() -> Result<()>,
) -> Result<BackupOutcome> {
    check_name(name.as_bytes())
        .map_err(|why| Error::Usage(format!("the name for standard input must be a plain file name: {why}")))?;
    run(repo, opts, progress, vec![format!("/{name}")], None, |sh| {
        let (content, len) = chunk_stream(input, what, &sh.chunker, sh.store)?;
        finished()?;
        sh.counters.bytes_read.fetch_add(len, Ordering::Relaxed);
        Counters::bump(&sh.counters.files_new);
        progress.file_done(len);
        let now = platform::now();
        let (uid, gid) = (uzers::get_current_uid(), uzers::get_current_gid());
        let mut names = NameCache::default();
        let mut node = Node::new(name.as_bytes().to_vec(), NodeKind::File);
        node.mode = 0o600 & !platform::umask();
        (node.uid, node.gid, node.user, node.group) = (uid, gid, names.user(uid), names.group(gid));
        (node.atime, node.mtime, node.ctime) = (now, now, now);
        node.size = len;
        node.content = content;
        let root = PendingDir::new(None, None);
        root.push_done(node);
        root.listed(sh)
    })
}
