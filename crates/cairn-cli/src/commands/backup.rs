//! `cairn backup`: back up files and directories into a new snapshot.

use std::path::PathBuf;
use std::process::ExitCode;

use std::io::IsTerminal;

use anyhow::{bail, Context, Result};
use cairn_core::commands::backup::{self, BackupOptions};
use cairn_core::engine::select::split_tags;
use cairn_format::lock::LockKind;
use clap::Args as ClapArgs;

use super::{open_locked, parse_codec, parse_size, Global};

#[derive(ClapArgs, Debug)]
#[command(group(clap::ArgGroup::new("stream").args(["stdin", "stdin_from_command"])))]
pub struct Args {
    /// Files and directories to back up (recorded as absolute paths); a block device given
    /// here is backed up by content
    #[arg(value_name = "PATH", required_unless_present_any = ["stdin", "files_from", "stdin_from_command"])]
    pub paths: Vec<PathBuf>,
    /// Add tags to the snapshot (repeatable; `a,b` adds both; `a\,b` adds the one tag "a,b")
    #[arg(long = "tag", value_name = "TAG")]
    pub tags: Vec<String>,
    /// Compression for this backup: auto (the repository default), none, lz4, zstd or zstd:LEVEL
    #[arg(long, value_name = "CODEC")]
    pub compression: Option<String>,
    /// Host name to record instead of this machine's
    #[arg(long, value_name = "NAME")]
    pub host: Option<String>,
    /// Time to record instead of now (local time, "YYYY-MM-DD HH:MM:SS")
    #[arg(long, value_name = "TIME", value_parser = cairn_core::engine::platform::parse_local)]
    pub time: Option<cairn_format::tree::Timestamp>,
    /// Chunking: cdc (content-defined, the repository's parameters) or fixed:SIZE (bytes, with
    /// an optional K or M suffix; for disk images)
    #[arg(long, default_value = "cdc", value_name = "CHUNKER")]
    pub chunker: String,
    /// Snapshot to take unchanged files from [default: the newest with the same host and paths]
    #[arg(long, value_name = "SNAPSHOT", conflicts_with = "force")]
    pub parent: Option<String>,
    /// Read every file, even those unchanged since the parent snapshot
    #[arg(long)]
    pub force: bool,
    /// Leave out entries whose absolute path or name matches GLOB (repeatable)
    #[arg(long = "exclude", short = 'e', value_name = "GLOB")]
    pub exclude: Vec<String>,
    /// Like --exclude, ignoring case (repeatable)
    #[arg(long = "iexclude", value_name = "GLOB")]
    pub iexclude: Vec<String>,
    /// Read --exclude globs from FILE, one per line; `#` starts a comment (repeatable)
    #[arg(long = "exclude-file", value_name = "FILE")]
    pub exclude_file: Vec<PathBuf>,
    /// Leave out directories holding a valid CACHEDIR.TAG
    #[arg(long)]
    pub exclude_caches: bool,
    /// Leave out directories holding an entry named NAME (repeatable)
    #[arg(long = "exclude-if-present", value_name = "NAME")]
    pub exclude_if_present: Vec<String>,
    /// Stay on the file system of each path: other file systems' mount points are kept empty
    #[arg(long, short = 'x')]
    pub one_file_system: bool,
    /// Also back up the paths listed in FILE, one per line (`-` reads standard input)
    #[arg(long, value_name = "FILE")]
    pub files_from: Option<PathBuf>,
    /// Read and chunk everything and report what would be added, but store nothing
    #[arg(long, short = 'n')]
    pub dry_run: bool,
    /// Back up standard input as one file (see --stdin-filename)
    #[arg(long, conflicts_with_all = ["paths", "files_from"])]
    pub stdin: bool,
    /// Back up the standard output of the command given after `--` as one file (see
    /// --stdin-filename), e.g. `--stdin-from-command -- pg_dump mydb`; the snapshot is saved
    /// only if the command exits 0
    #[arg(long, conflicts_with_all = ["paths", "files_from", "stdin"], requires = "command")]
    pub stdin_from_command: bool,
    /// The command for --stdin-from-command and its arguments (run without a shell)
    #[arg(last = true, value_name = "COMMAND", requires = "stdin_from_command")]
    pub command: Vec<std::ffi::OsString>,
    /// File name for --stdin and --stdin-from-command
    #[arg(long, default_value = "stdin", value_name = "NAME", requires = "stream")]
    pub stdin_filename: String,
    /// Files read at once
    #[arg(long, default_value_t = backup::DEFAULT_READ_CONCURRENCY, value_name = "N")]
    pub read_concurrency: usize,
    /// Threads that compress and encrypt [default: number of cores]
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
    /// Packs uploaded at once
    #[arg(long, default_value_t = backup::DEFAULT_UPLOAD_CONCURRENCY, value_name = "N")]
    pub upload_concurrency: usize,
    /// Bound the backup's memory: half of what the index leaves goes to the packs being filled
    /// and stored (fewer packers run if it holds fewer than two packs each), the rest to the
    /// directories and files being read [default: no bound but the threads' and uploads' counts]
    #[arg(long, value_name = "SIZE")]
    pub max_memory: Option<String>,
}

pub fn run(g: &Global, a: Args) -> Result<ExitCode> {
    if a.stdin || a.stdin_from_command {
        cairn_format::tree::check_name(a.stdin_filename.as_bytes())
            .map_err(|why| anyhow::anyhow!("--stdin-filename wants a plain file name: {why}"))?;
    }
    let max_memory = a.max_memory.as_deref().map(parse_size).transpose()?;
    let (repo, _lock) = open_locked(g, LockKind::Shared)?;
    repo.load_index_within(max_memory)?;
    let defaults = BackupOptions::default();
    let show_progress = g.json || std::io::stderr().is_terminal();
    let opts = BackupOptions {
        tags: a.tags.iter().flat_map(|t| split_tags(t)).collect(),
        compression: a.compression.as_deref().map(parse_codec).transpose()?,
        hostname: a.host,
        time: a.time,
        fixed_chunk_size: parse_chunker(&a.chunker)?,
        read_concurrency: a.read_concurrency.max(1),
        threads: a.threads.unwrap_or(defaults.threads).max(1),
        upload_concurrency: a.upload_concurrency.max(1),
        parent: match (a.force, a.parent) {
            (true, _) => backup::ParentChoice::Force,
            (false, Some(p)) => backup::ParentChoice::Given(p),
            (false, None) => backup::ParentChoice::Auto,
        },
        select: backup::SelectOptions {
            exclude: a.exclude,
            iexclude: a.iexclude,
            exclude_files: a.exclude_file,
            exclude_caches: a.exclude_caches,
            exclude_if_present: a.exclude_if_present,
            one_file_system: a.one_file_system,
        },
        dry_run: a.dry_run,
        prescan: show_progress,
        max_memory,
        ..defaults
    };
    let mut paths = a.paths;
    if let Some(list) = &a.files_from {
        paths.extend(backup::read_files_from(list)?);
    }
    let progress = backup::Progress::default();
    let done = cairn_core::engine::signal::Signal::default();
    let out = std::thread::scope(|s| {
        if show_progress {
            s.spawn(|| crate::progress::backup(&progress, &done, g.json));
        }
        let _stop = cairn_core::engine::signal::RaiseOnDrop(&done);
        if a.stdin {
            backup::backup_stdin(&repo, std::io::stdin().lock(), &a.stdin_filename, &opts, &progress)
        } else if a.stdin_from_command {
            backup::backup_command(&repo, &a.command, &a.stdin_filename, &opts, &progress)
        } else {
            backup::backup(&repo, &paths, &opts, &progress)
        }
    })?;
    for w in &out.warnings {
        eprintln!("warning: {}: {}", w.path.display(), w.message);
    }
    crate::progress::print_backup_summary(&out, g.json);
    crate::hooks::report_snapshot(out.id.map(|id| id.to_hex()), out.snapshot.summary.bytes_added);
    let errors = out.warnings.iter().filter(|w| w.error).count();
    if errors > 0 {
        eprintln!("warning: {errors} entries could not be read completely (listed above)");
        return Ok(ExitCode::from(3));
    }
    Ok(ExitCode::SUCCESS)
}

/// Parses `--chunker`: `cdc` or `fixed:SIZE`.
fn parse_chunker(s: &str) -> Result<Option<u32>> {
    if s == "cdc" {
        return Ok(None);
    }
    let size = s.strip_prefix("fixed:").with_context(|| format!("unknown --chunker {s:?}: use cdc or fixed:SIZE"))?;
    let n = parse_size(size)?;
    if !(4096..=16 << 20).contains(&n) {
        bail!("--chunker fixed:SIZE wants a size from 4K to 16M");
    }
    Ok(Some(n as u32))
}
