//! `cairn copy`: copy snapshots from another repository (`--from-repo`) into this one,
//! transferring only the blobs this one lacks.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use cairn_core::commands::copy::{self, CopyOptions, CopyProgress, CopyReport};
use cairn_core::commands::json;
use cairn_core::engine::open::{Held, OpenOptions};
use cairn_core::engine::repository::Repository;
use cairn_format::lock::LockKind;
use clap::Args as ClapArgs;

use super::snapshots::{line, row};
use super::{cancel_on_sigint, open_locked, options, plural, storage_at, FilterArgs, Global};
use crate::output::{bytes, count};
use crate::{password, progress};

#[derive(ClapArgs, Debug)]
pub struct Args {
    /// Source snapshots to copy (ID prefixes or `latest`; default: all, or those the filters
    /// select)
    #[arg(value_name = "ID")]
    pub ids: Vec<String>,
    #[command(flatten)]
    pub filters: FilterArgs,
    #[command(flatten)]
    pub from: FromRepoArgs,
    /// The whole copy's memory: both repositories' indexes, what it marks per source blob, trees
    /// kept for the rewrite, reads in flight, and the new packs being filled and stored; too
    /// small a budget is refused, naming the least that fits [default: 256M, or the least these
    /// repositories need]
    #[arg(long, value_name = "SIZE")]
    pub max_memory: Option<String>,
    /// Reads of the source in flight [default: the source backend's concurrency, at least 4]
    #[arg(long, value_name = "N")]
    pub fetch_concurrency: Option<usize>,
}

/// The source repository of `copy` and `init --copy-chunker-params` (restic's names).
#[derive(ClapArgs, Debug, Default)]
pub struct FromRepoArgs {
    /// Source repository: a local directory, s3:… or sftp:… as for -r
    #[arg(id = "from_repo", long = "from-repo", env = "CAIRN_FROM_REPOSITORY", value_name = "REPO")]
    pub repo: Option<String>,
    /// Read the source repository's password from the first line of FILE (CAIRN_FROM_PASSWORD
    /// takes precedence)
    #[arg(
        id = "from_password_file",
        long = "from-password-file",
        env = "CAIRN_FROM_PASSWORD_FILE",
        value_name = "FILE"
    )]
    pub password_file: Option<PathBuf>,
}

impl FromRepoArgs {
    /// Opens the source repository (its password from CAIRN_FROM_PASSWORD, the file, or a
    /// prompt), taking a lock of kind `lock` on it beside the open.
    pub fn open(&self, g: &Global, why: &str, lock: Option<LockKind>) -> Result<(Repository, Held)> {
        let Some(location) = &self.repo else {
            anyhow::bail!("{why} needs a source repository: give --from-repo or set CAIRN_FROM_REPOSITORY");
        };
        let storage = storage_at(g, location).context("source repository")?;
        let pw =
            password::get(self.password_file.as_deref(), "CAIRN_FROM_PASSWORD", "source repository password", false)?;
        let opts = OpenOptions { lock, ..options(g) };
        match cairn_core::engine::open::open(storage, &pw, opts) {
            Err(e @ cairn_core::Error::NoRepository(_)) => Err(NoSource(e).into()),
            other => other.context("source repository").map(|o| (o.repo, o.lock)),
        }
    }
}

/// No repository at `--from-repo`: said here, not by main (which names -r), with the library's
/// error kept as the cause so the exit code is 10 as for -r.
#[derive(Debug)]
struct NoSource(cairn_core::Error);

impl std::fmt::Display for NoSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "source repository: {} (the location comes from --from-repo or CAIRN_FROM_REPOSITORY)", self.0)
    }
}

impl std::error::Error for NoSource {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

pub fn run(g: &Global, a: Args) -> Result<ExitCode> {
    let max_memory = super::max_memory(a.max_memory.as_deref())?;
    // Shared on the source; on the destination the backup's kind, so a prune there waits for
    // this copy and keeps what it deduplicated against (docs/DESIGN.md, "Copy").
    let (src, _src_lock) = a.from.open(g, "copy", Some(LockKind::Shared))?;
    let (dst, _dst_lock) = open_locked(g, LockKind::Shared)?;
    std::thread::scope(|s| {
        let loading = s.spawn(|| src.load_index());
        let dst_index = dst.load_index();
        loading.join().expect("index loader panicked").context("source repository")?;
        dst_index.map_err(anyhow::Error::from)
    })?;
    let cancel = cancel_on_sigint()?;
    let opts = CopyOptions::new(&src, &dst, a.filters.filter(&a.ids), a.fetch_concurrency, max_memory);
    let p = CopyProgress::default();
    let report =
        progress::while_showing(|done| progress::copy(&p, done, g.json), || copy::copy(&src, &dst, &opts, &p, cancel));
    let report = match report {
        Err(cairn_core::Error::Interrupted) => {
            eprintln!("cairn: copy interrupted; no snapshot was written, and running it again reuses what was stored");
            return Ok(ExitCode::from(130));
        }
        other => other?,
    };
    print(&report, g.json);
    Ok(ExitCode::SUCCESS)
}

fn print(r: &CopyReport, json: bool) {
    if json {
        outln!("{}", json::line(&r.summary()));
        return;
    }
    if !r.copied.is_empty() {
        outln!("{}", line("source", "time", "host", "tags", &format!("{:<10} ", "copy"), "paths"));
        for c in &r.copied {
            outln!("{}", row(&c.source, &c.snapshot, &format!("{:<10} ", c.copy.short())));
        }
    }
    for s in &r.skipped {
        outln!("skipped {}: the destination holds it as {}", s.source.short(), s.existing.short());
    }
    outln!(
        "copied {} ({} already there): {} of {} blobs written, {} read, {} stored in {} packs, {:.1}s",
        plural(r.copied.len(), "snapshot"),
        r.skipped.len(),
        count(r.blobs_written),
        count(r.blobs_needed),
        bytes(r.bytes_read),
        bytes(r.bytes_written),
        r.packs_written,
        r.seconds
    );
    if !r.copied.is_empty() && !r.same_ids {
        outln!(
            "note: the two repositories name blobs differently, so copied data does not deduplicate against \
             this repository's own backups (make a destination with `init --copy-chunker-params --from-repo`)"
        );
    }
}
