//! `cairn restore`: restore a snapshot (or a path inside it) into a directory.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use cairn_core::commands::restore::{self, LocalCost, LocalData, Progress, RestoreOptions};
use cairn_core::engine::open::Opened;
use clap::Args as ClapArgs;

use super::{options, parse_size, repository, set_on_sigint, split_spec, FilterArgs, Global};

#[derive(ClapArgs, Debug)]
pub struct Args {
    /// Snapshot (`latest` or an ID prefix), optionally with :PATH to restore only that path's contents
    #[arg(value_name = "SNAPSHOT[:PATH]")]
    pub snapshot: std::ffi::OsString,
    /// Directory to restore into (created if missing)
    #[arg(short, long, value_name = "DIR")]
    pub target: PathBuf,
    /// Restore only paths matching GLOB (absolute path in the snapshot, or file name); repeatable
    #[arg(long = "include", value_name = "GLOB")]
    pub include: Vec<String>,
    /// Skip paths matching GLOB (and everything below them); repeatable
    #[arg(long = "exclude", value_name = "GLOB")]
    pub exclude: Vec<String>,
    /// Existing files: always (check content chunk by chunk, rewrite what differs), if-changed
    /// (trust matching size and mtime), if-newer (only if the snapshot's copy is newer), never
    #[arg(long, default_value = "always", value_name = "MODE")]
    pub overwrite: String,
    /// Remove files and directories the snapshot lacks from restored directories
    #[arg(long)]
    pub delete: bool,
    /// Show what would change without changing anything
    #[arg(long)]
    pub dry_run: bool,
    /// Re-read every restored file afterwards and check it against the snapshot
    #[arg(long)]
    pub verify: bool,
    /// Zero ranges: auto (zero chunks and holes become holes), always (also 4 KiB zero blocks
    /// inside data), never (allocate every byte)
    #[arg(long, default_value = "auto", value_name = "MODE")]
    pub sparse: String,
    /// Reserve every file's data ranges on disk before writing (by default only files of 1 MiB
    /// or more, on ext4 and XFS)
    #[arg(long)]
    pub preallocate: bool,
    /// Ranged pack reads in flight, fixed [default: tuned while restoring, starting from 4 for a
    /// local repository, 32 for S3, 8 for SFTP]
    #[arg(long, value_name = "N")]
    pub fetch_concurrency: Option<usize>,
    /// Threads that decrypt, decompress and verify [default: number of cores]
    #[arg(long, value_name = "N")]
    pub decode_threads: Option<usize>,
    /// Files written at once, fixed [default: tuned while restoring, starting from the number
    /// of cores, at least 2: more while writes wait and the cores idle]
    #[arg(long, value_name = "N")]
    pub write_threads: Option<usize>,
    /// Cap on data in flight between fetch and write, e.g. 256M or 1G
    #[arg(long, default_value = "256M", value_name = "SIZE")]
    pub max_memory: String,
    /// Print per-stage busy / idle / blocked time at the end
    #[arg(long)]
    pub profile: bool,
    /// Copy chunks that are still on this machine instead of fetching them: from the files the
    /// snapshot was taken from (at their original paths, or at PATH, which stands for the
    /// restored path, e.g. the old disk mounted elsewhere) and from files in the target the
    /// snapshot does not name (renamed, moved). Each chunk is verified against its ID before it
    /// is written. On by default; the original paths are not read when they are the target
    #[arg(long, value_name = "PATH", num_args = 0..=1, require_equals = true, conflicts_with = "no_local_data")]
    pub use_source: Option<Option<PathBuf>>,
    /// Read no local files: fetch everything the target does not already hold at its place
    #[arg(long)]
    pub no_local_data: bool,
    /// Report a stall after this many seconds without progress
    #[arg(long, default_value_t = 60, value_name = "SECS")]
    pub stall_timeout: u64,
    /// Serve the target FILE (one file of the snapshot, a disk image) as a writable NBD export
    /// while it is restored in the background: reads of what is not restored yet are fetched at
    /// once, writes are kept; killed, the same command resumes (state in FILE.cairn-live)
    #[arg(long, conflicts_with_all = ["delete", "dry_run", "verify", "include", "exclude"])]
    pub live: bool,
    /// With --live: TCP address to listen on [default: 127.0.0.1:10809 unless --socket]
    #[arg(long, value_name = "ADDR", requires = "live", conflicts_with = "socket")]
    pub listen: Option<String>,
    /// With --live: Unix socket to listen on instead of TCP
    #[arg(long, value_name = "PATH", requires = "live")]
    pub socket: Option<PathBuf>,
    #[command(flatten)]
    pub filters: FilterArgs,
}

pub fn run(g: &Global, a: Args) -> Result<ExitCode> {
    let (name, path) = split_spec(&a.snapshot)?;
    let cancel = Arc::new(AtomicBool::new(false));
    let opts = RestoreOptions {
        max_memory: parse_size(&a.max_memory)?,
        overwrite: a.overwrite.parse()?,
        delete: a.delete,
        dry_run: a.dry_run,
        verify: a.verify,
        sparse: a.sparse.parse()?,
        preallocate: a.preallocate,
        include: a.include,
        exclude: a.exclude,
        stall_timeout: Duration::from_secs(a.stall_timeout.max(1)),
        cancel: Some(cancel.clone()),
        local_data: match (a.no_local_data, a.use_source) {
            (true, _) => LocalData::Off,
            (false, Some(Some(path))) => LocalData::SourceAt(std::path::absolute(path)?),
            (false, _) => LocalData::SnapshotPaths,
        },
        local_scanned_hook: std::env::var("CAIRN_TEST_LOCAL_SCANNED_HOOK").ok().filter(|c| !c.is_empty()),
        local_cost: match std::env::var("CAIRN_LOCAL_COST") {
            Ok(v) if !v.is_empty() => Some(LocalCost::parse(&v).ok_or_else(|| {
                anyhow::anyhow!(
                    "CAIRN_LOCAL_COST: {v:?} is neither `local` nor `repository`: use one of them or unset it"
                )
            })?),
            _ => None,
        },
        write_latency: match std::env::var("CAIRN_INJECT_WRITE_LATENCY") {
            Ok(v) if !v.is_empty() => cairn_core::engine::storage::parse_fault_duration(&v)
                .ok_or_else(|| anyhow::anyhow!("CAIRN_INJECT_WRITE_LATENCY: bad duration {v:?}: use e.g. 20ms"))?,
            _ => Duration::ZERO,
        },
        ..RestoreOptions::default()
    }
    .with_threads(a.fetch_concurrency, a.decode_threads, a.write_threads);
    let progress = Progress::default();
    let filter = a.filters.filter(&[]);
    if a.live {
        return run_live(g, name, &filter, path, &a.target, a.listen, a.socket, &opts, &progress);
    }
    let (storage, pw) = repository(g)?;
    set_on_sigint(&cancel)?;
    let (Opened { repo, lock: held }, id, result) = crate::progress::while_showing(
        |done| crate::progress::restore(&progress, done, g.json),
        || restore::open_and_restore(storage, &pw, name, &filter, path, &a.target, &opts, options(g), &progress),
    )?;
    let out = match result {
        Err(cairn_core::Error::Interrupted) => {
            eprintln!("cairn: restore interrupted; run the same command again to finish it");
            return Ok(ExitCode::from(130));
        }
        other => other?,
    };
    if let Some(dry) = &out.dry_run {
        crate::progress::print_dry_run(dry, &out, g.json);
        return Ok(ExitCode::SUCCESS);
    }
    for (p, why) in &out.failed {
        eprintln!("error: {}: {why}", p.display());
    }
    for (p, why) in &out.warnings {
        eprintln!("warning: {}: {why}", p.display());
    }
    for s in &out.stalls {
        eprintln!("warning: restore stalled: {s}");
    }
    if a.profile {
        crate::progress::print_round_trips(&**repo.storage(), g.json);
        crate::progress::print_lock_let_go(&held, g.json);
    }
    crate::progress::print_restore_summary(&id.to_hex(), &out, g.json, a.profile);
    if !out.failed.is_empty() {
        eprintln!("cairn: {} entries could not be restored (listed above)", out.failed.len());
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

/// `--live`: serves the target while restoring it, until Ctrl-C or SIGTERM.
#[allow(clippy::too_many_arguments)]
fn run_live(
    g: &Global,
    name: &str,
    filter: &cairn_core::engine::select::SnapshotFilter,
    path: Option<&std::path::Path>,
    target: &std::path::Path,
    listen: Option<String>,
    socket: Option<PathBuf>,
    opts: &RestoreOptions,
    progress: &Progress,
) -> Result<ExitCode> {
    use cairn_core::engine::open::{self, OpenedSnapshot};
    use cairn_core::engine::signal::{RaiseOnDrop, Signal};
    use cairn_mount::LiveEvent;

    let Some(path) = path else {
        anyhow::bail!("--live restores one file (a disk image): give it as SNAPSHOT:PATH, e.g. latest:/vm/disk.img")
    };
    let (storage, pw) = repository(g)?;
    let OpenedSnapshot { opened: Opened { repo, lock: _lock }, id, snapshot } =
        open::open_snapshot(storage, &pw, name, filter, options(g))?;
    let disk = cairn_mount::DiskOptions {
        max_memory: opts.max_memory,
        fetch_concurrency: repo.storage().default_concurrency().max(1),
        decode_threads: cairn_core::engine::platform::cores(),
    };
    let live = cairn_mount::LiveRestore::open(Arc::new(repo), &id, &snapshot, path, target, &disk)?;
    let nbd = super::NbdServer::bind(socket, listen)?;
    let server = &nbd.server;
    eprintln!(
        "cairn: restoring {} of snapshot {} into {} ({} of {} bytes there) and serving it at {}; Ctrl-C stops",
        path.display(),
        id.short(),
        target.display(),
        live.present_bytes(),
        live.export().size(),
        server.uri()
    );
    let config = cairn_nbd::Config { name: path.to_string_lossy().into_owned(), workers: 32 };
    let failed = AtomicBool::new(false);
    // The progress display runs while the background restore does; the restore's end stops it
    // before the lines saying how it ended.
    let restoring = Signal::default();
    let on_event = |event: LiveEvent| {
        restoring.raise();
        match event {
            LiveEvent::Restored(out) if out.failed.is_empty() => {
                eprintln!(
                    "cairn: restore complete: {} holds the snapshot with every write applied ({} bytes fetched); still serving",
                    target.display(),
                    out.bytes_fetched
                );
                if g.json {
                    crate::progress::print_restore_summary(&id.to_hex(), &out, true, false);
                }
            }
            LiveEvent::Restored(out) => {
                failed.store(true, std::sync::atomic::Ordering::Relaxed);
                for (p, why) in &out.failed {
                    eprintln!("error: {}: {why}", p.display());
                }
                eprintln!("cairn: the restore is not complete; still serving (reads of what is missing fetch it)");
            }
            LiveEvent::Stopped(cairn_core::Error::Interrupted) => eprintln!(
                "cairn: restore interrupted; run the same command again to resume it ({} keeps its state)",
                live.state_path().display()
            ),
            LiveEvent::Stopped(e) => {
                failed.store(true, std::sync::atomic::Ordering::Relaxed);
                eprintln!("error: the background restore stopped: {e}");
            }
        }
    };
    let size = live.export().size();
    let served = std::thread::scope(|s| {
        s.spawn(|| crate::progress::live(progress, &|| live.present_bytes(), size, &restoring, g.json));
        let _stop = RaiseOnDrop(&restoring);
        live.serve(server, &config, opts, progress, &on_event, &|e| {
            eprintln!("cairn: a client's connection ended: {e}")
        })
    });
    nbd.close();
    served?;
    eprintln!("cairn: stopped serving {}", target.display());
    Ok(if failed.into_inner() { ExitCode::from(1) } else { ExitCode::SUCCESS })
}
