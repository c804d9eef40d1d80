//! Command-line definitions (restic's conventions) and the code that runs each command.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use std::io::{IsTerminal, Write};

use anyhow::{bail, Context, Result};
use cairn_core::backup::{self, BackupOptions};
use cairn_core::cache::Cache;
use cairn_core::compress::Codec;
use cairn_core::keyfile::KdfParams;
use cairn_core::lock::{self, Lock, LockKind};
use cairn_core::repository::{InitOptions, Repository};
use cairn_core::restore::{self, Progress, RestoreOptions};
use cairn_core::storage::{Faults, FaultyStorage, Location, OpendalStorage, RemoteOptions, Storage};
use cairn_core::tree::{Node, NodeKind};
use clap::{Args, Parser, Subcommand};

use crate::password;

const AFTER_HELP: &str = "\
Environment:
  CAIRN_REPOSITORY      repository location (instead of -r)
  AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_DEFAULT_REGION   S3 credentials and region
  CAIRN_SFTP_KEY, CAIRN_SFTP_KNOWN_HOSTS, CAIRN_CACHE_DIR   instead of the options of those names
  CAIRN_PASSWORD        repository password
  CAIRN_PASSWORD_FILE   file whose first line is the password (instead of --password-file)
  CAIRN_NEW_PASSWORD    new password for `key add`
  CAIRN_INJECT_FAULTS   fault injection for tests, e.g. latency=50ms (see docs/DESIGN.md)
Without a password from the environment or a file, cairn asks for it on the terminal.

Exit codes: 0 success; 1 fatal error, or some entries could not be restored (each named);
3 a backup completed but some files could not be read (each named); 130 interrupted.";

/// Cairn: deduplicating, compressed, encrypted backups whose restores run at the speed of the
/// hardware.
#[derive(Parser, Debug)]
#[command(name = "cairn", version, max_term_width = 100, after_help = AFTER_HELP)]
pub struct Cli {
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    command: Command,
}

#[derive(Args, Debug)]
struct Global {
    /// Repository location: a local directory, s3:http[s]://HOST[:PORT]/BUCKET[/PREFIX] or
    /// sftp:[USER@]HOST[:PORT]:/PATH
    #[arg(short = 'r', long = "repo", env = "CAIRN_REPOSITORY", global = true, value_name = "REPO")]
    repo: Option<String>,
    /// SSH private key for sftp: repositories (default: the agent and ssh's default keys)
    #[arg(long, env = "CAIRN_SFTP_KEY", global = true, value_name = "FILE")]
    sftp_key: Option<PathBuf>,
    /// SSH host key check for sftp: repositories: strict (the host must be in known_hosts),
    /// add (trust a new host on first use), accept (trust any host key)
    #[arg(long, env = "CAIRN_SFTP_KNOWN_HOSTS", global = true, value_name = "POLICY", default_value = "strict")]
    sftp_known_hosts: String,
    /// Metadata cache directory (default for remote repositories: $XDG_CACHE_HOME/cairn or
    /// ~/.cache/cairn; local repositories are cached only when this is given)
    #[arg(long, env = "CAIRN_CACHE_DIR", global = true, value_name = "DIR")]
    cache_dir: Option<PathBuf>,
    /// Do not use a metadata cache (even if --cache-dir or CAIRN_CACHE_DIR is set)
    #[arg(long, global = true)]
    no_cache: bool,
    /// Read the repository password from the first line of FILE (CAIRN_PASSWORD takes precedence)
    #[arg(long, env = "CAIRN_PASSWORD_FILE", global = true, value_name = "FILE")]
    password_file: Option<PathBuf>,
    /// Print machine-readable JSON instead of text
    #[arg(long, global = true)]
    json: bool,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Create a new repository
    Init(InitArgs),
    /// Back up files and directories into a new snapshot
    Backup(BackupArgs),
    /// List snapshots
    Snapshots,
    /// List the entries of a snapshot: SNAPSHOT[:PATH]
    Ls(LsArgs),
    /// Restore a snapshot (or a path inside it) into a directory
    Restore(RestoreArgs),
    /// Write a file (raw) or a directory (as a tar stream) from a snapshot to stdout
    Dump(DumpArgs),
    /// Manage the key files that unlock the repository
    #[command(subcommand)]
    Key(KeyCommand),
    /// Remove stale locks (of processes that are gone), or with --remove-all every lock
    Unlock(UnlockArgs),
}

#[derive(Args, Debug)]
struct UnlockArgs {
    /// Also remove locks of processes that may still be running
    #[arg(long)]
    remove_all: bool,
}

#[derive(Args, Debug)]
struct InitArgs {
    /// Default compression for new data: auto, none, lz4, zstd or zstd:LEVEL
    #[arg(long, default_value = "auto", value_name = "CODEC")]
    compression: String,
    /// Target pack size in MiB
    #[arg(long, default_value_t = 16, value_name = "MIB")]
    pack_size: u32,
    /// Content-defined chunk sizes in bytes: MIN,AVG,MAX
    #[arg(long, default_value = "524288,1048576,8388608", value_name = "MIN,AVG,MAX")]
    chunk_sizes: String,
    /// Argon2id memory cost of the key file, in KiB
    #[arg(long, default_value_t = KdfParams::default().memory_kib, value_name = "KIB")]
    kdf_memory: u32,
    /// Argon2id passes of the key file
    #[arg(long, default_value_t = KdfParams::default().iterations, value_name = "N")]
    kdf_iterations: u32,
    /// Argon2id lanes of the key file (computed on all cores at once)
    #[arg(long, default_value_t = KdfParams::default().parallelism, value_name = "N")]
    kdf_parallelism: u32,
}

#[derive(Args, Debug)]
struct BackupArgs {
    /// Files and directories to back up (recorded as absolute paths); a block device given
    /// here is backed up by content
    #[arg(value_name = "PATH", required_unless_present_any = ["stdin", "files_from"])]
    paths: Vec<PathBuf>,
    /// Add a tag to the snapshot (repeatable)
    #[arg(long = "tag", value_name = "TAG")]
    tags: Vec<String>,
    /// Compression for this backup: auto (the repository default), none, lz4, zstd or zstd:LEVEL
    #[arg(long, value_name = "CODEC")]
    compression: Option<String>,
    /// Host name to record instead of this machine's
    #[arg(long, value_name = "NAME")]
    host: Option<String>,
    /// Chunking: cdc (content-defined, the repository's parameters) or fixed:SIZE (bytes, with
    /// an optional K or M suffix; for disk images)
    #[arg(long, default_value = "cdc", value_name = "CHUNKER")]
    chunker: String,
    /// Snapshot to take unchanged files from [default: the newest with the same host and paths]
    #[arg(long, value_name = "SNAPSHOT", conflicts_with = "force")]
    parent: Option<String>,
    /// Read every file, even those unchanged since the parent snapshot
    #[arg(long)]
    force: bool,
    /// Leave out entries whose absolute path or name matches GLOB (repeatable)
    #[arg(long = "exclude", short = 'e', value_name = "GLOB")]
    exclude: Vec<String>,
    /// Like --exclude, ignoring case (repeatable)
    #[arg(long = "iexclude", value_name = "GLOB")]
    iexclude: Vec<String>,
    /// Read --exclude globs from FILE, one per line; `#` starts a comment (repeatable)
    #[arg(long = "exclude-file", value_name = "FILE")]
    exclude_file: Vec<PathBuf>,
    /// Leave out directories holding a valid CACHEDIR.TAG
    #[arg(long)]
    exclude_caches: bool,
    /// Leave out directories holding an entry named NAME (repeatable)
    #[arg(long = "exclude-if-present", value_name = "NAME")]
    exclude_if_present: Vec<String>,
    /// Stay on the file system of each path: other file systems' mount points are kept empty
    #[arg(long, short = 'x')]
    one_file_system: bool,
    /// Also back up the paths listed in FILE, one per line (`-` reads standard input)
    #[arg(long, value_name = "FILE")]
    files_from: Option<PathBuf>,
    /// Read and chunk everything and report what would be added, but store nothing
    #[arg(long, short = 'n')]
    dry_run: bool,
    /// Back up standard input as one file (see --stdin-filename)
    #[arg(long, conflicts_with_all = ["paths", "files_from"])]
    stdin: bool,
    /// File name for --stdin
    #[arg(long, default_value = "stdin", value_name = "NAME", requires = "stdin")]
    stdin_filename: String,
    /// Files read at once
    #[arg(long, default_value_t = backup::DEFAULT_READ_CONCURRENCY, value_name = "N")]
    read_concurrency: usize,
    /// Threads that compress and encrypt [default: number of cores]
    #[arg(long, value_name = "N")]
    threads: Option<usize>,
    /// Packs uploaded at once
    #[arg(long, default_value_t = backup::DEFAULT_UPLOAD_CONCURRENCY, value_name = "N")]
    upload_concurrency: usize,
}

#[derive(Args, Debug)]
struct LsArgs {
    /// Snapshot (`latest` or an ID prefix), optionally with :PATH inside it
    #[arg(value_name = "SNAPSHOT[:PATH]")]
    snapshot: String,
    /// Long listing: mode, owner, size, modification time
    #[arg(short, long)]
    long: bool,
}

#[derive(Args, Debug)]
struct RestoreArgs {
    /// Snapshot (`latest` or an ID prefix), optionally with :PATH to restore only that path's contents
    #[arg(value_name = "SNAPSHOT[:PATH]")]
    snapshot: String,
    /// Directory to restore into (created if missing)
    #[arg(short, long, value_name = "DIR")]
    target: PathBuf,
    /// Restore only paths matching GLOB (absolute path in the snapshot, or file name); repeatable
    #[arg(long = "include", value_name = "GLOB")]
    include: Vec<String>,
    /// Skip paths matching GLOB (and everything below them); repeatable
    #[arg(long = "exclude", value_name = "GLOB")]
    exclude: Vec<String>,
    /// Existing files: always (check content chunk by chunk, rewrite what differs), if-changed
    /// (trust matching size and mtime), if-newer (only if the snapshot's copy is newer), never
    #[arg(long, default_value = "always", value_name = "MODE")]
    overwrite: String,
    /// Remove files and directories the snapshot lacks from restored directories
    #[arg(long)]
    delete: bool,
    /// Show what would change without changing anything
    #[arg(long)]
    dry_run: bool,
    /// Re-read every restored file afterwards and check it against the snapshot
    #[arg(long)]
    verify: bool,
    /// Zero ranges: auto (zero chunks and holes become holes), always (also 4 KiB zero blocks
    /// inside data), never (allocate every byte)
    #[arg(long, default_value = "auto", value_name = "MODE")]
    sparse: String,
    /// Reserve every file's data ranges on disk before writing (by default only files of 1 MiB
    /// or more, on ext4 and XFS)
    #[arg(long)]
    preallocate: bool,
    /// Ranged pack reads in flight [default: 4 for a local repository, 32 for S3, 8 for SFTP]
    #[arg(long, value_name = "N")]
    fetch_concurrency: Option<usize>,
    /// Threads that decrypt, decompress and verify [default: number of cores]
    #[arg(long, value_name = "N")]
    decode_threads: Option<usize>,
    /// Threads that write files [default: number of cores, at least 2]
    #[arg(long, value_name = "N")]
    write_threads: Option<usize>,
    /// Cap on data in flight between fetch and write, e.g. 256M or 1G
    #[arg(long, default_value = "256M", value_name = "SIZE")]
    max_memory: String,
    /// Print per-stage busy / idle / blocked time at the end
    #[arg(long)]
    profile: bool,
    /// Report a stall after this many seconds without progress
    #[arg(long, default_value_t = 60, value_name = "SECS")]
    stall_timeout: u64,
}

#[derive(Args, Debug)]
struct DumpArgs {
    /// Snapshot (`latest` or an ID prefix) and the absolute PATH inside it (`/` for everything)
    #[arg(value_name = "SNAPSHOT:PATH")]
    snapshot: String,
    /// Blobs fetched and decoded at once [default: as for restore]
    #[arg(long, value_name = "N")]
    fetch_concurrency: Option<usize>,
}

#[derive(Subcommand, Debug)]
enum KeyCommand {
    /// Add a key file for a new password (from CAIRN_NEW_PASSWORD, --new-password-file or a prompt)
    Add {
        /// Read the new password from the first line of FILE
        #[arg(long, env = "CAIRN_NEW_PASSWORD_FILE", value_name = "FILE")]
        new_password_file: Option<PathBuf>,
    },
    /// List key files
    List,
}

fn storage(global: &Global) -> Result<Arc<dyn Storage>> {
    let Some(repo) = &global.repo else {
        bail!("no repository given: use -r/--repo or set CAIRN_REPOSITORY");
    };
    let remote = RemoteOptions {
        sftp_key: global.sftp_key.as_ref().map(|p| p.to_string_lossy().into_owned()),
        sftp_known_hosts: Some(global.sftp_known_hosts.clone()),
    };
    let real = OpendalStorage::open(&Location::parse(repo)?, &remote)?;
    // Fault injection for tests and benchmarks (docs/DESIGN.md): wraps the real backend.
    match std::env::var("CAIRN_INJECT_FAULTS") {
        Ok(spec) if !spec.is_empty() => Ok(Arc::new(FaultyStorage::new(real, Faults::parse(&spec)?))),
        _ => Ok(Arc::new(real)),
    }
}

fn open(global: &Global) -> Result<Repository> {
    let storage = storage(global)?;
    let pw = password::get(global.password_file.as_deref(), "CAIRN_PASSWORD", "repository password", false)?;
    let mut repo = Repository::open(storage, &pw)?;
    let base = match (&global.cache_dir, global.no_cache) {
        (_, true) => None,
        (Some(dir), false) => Some(dir.clone()),
        (None, false) if repo.storage().is_remote() => Cache::default_base(),
        (None, false) => None,
    };
    if let Some(base) = base {
        repo.set_cache(Cache::open(&base, &repo.config().id)?);
    }
    Ok(repo)
}

/// Takes a lock for the rest of the command, reporting stale locks it ignores.
fn lock(repo: &Repository, kind: LockKind) -> Result<Lock> {
    let held = Lock::acquire(repo.storage().clone(), kind)?;
    for l in held.stale() {
        let why = l.stale_reason().unwrap_or_default();
        eprintln!("warning: ignoring stale lock {} ({why}); `cairn unlock` removes it", l.path);
    }
    Ok(held)
}

/// Splits `SNAPSHOT[:PATH]`.
fn split_spec(spec: &str) -> (&str, Option<&str>) {
    match spec.split_once(':') {
        Some((s, p)) => (s, Some(p)),
        None => (spec, None),
    }
}

/// Runs the command; returns the exit code.
pub fn run(cli: Cli) -> Result<ExitCode> {
    let g = &cli.global;
    match cli.command {
        Command::Init(a) => init(g, a),
        Command::Backup(a) => run_backup(g, a),
        Command::Snapshots => snapshots(g),
        Command::Ls(a) => ls(g, a),
        Command::Restore(a) => run_restore(g, a),
        Command::Dump(a) => run_dump(g, a),
        Command::Key(k) => key(g, k),
        Command::Unlock(a) => unlock(g, a),
    }
}

fn parse_codec(s: &str) -> Result<Codec> {
    Ok(s.parse::<Codec>()?)
}

fn init(g: &Global, a: InitArgs) -> Result<ExitCode> {
    let sizes: Vec<u32> = a
        .chunk_sizes
        .split(',')
        .map(|s| s.trim().parse::<u32>())
        .collect::<Result<_, _>>()
        .context("--chunk-sizes wants three byte counts MIN,AVG,MAX")?;
    let [min, avg, max] = sizes[..] else { bail!("--chunk-sizes wants three byte counts MIN,AVG,MAX") };
    let opts = InitOptions {
        kdf: KdfParams { memory_kib: a.kdf_memory, iterations: a.kdf_iterations, parallelism: a.kdf_parallelism },
        chunk_sizes: (min, avg, max),
        pack_size: a.pack_size.checked_mul(1024 * 1024).context("--pack-size is too large")?,
        compression: parse_codec(&a.compression)?,
    };
    let storage = storage(g)?;
    let pw = password::get(g.password_file.as_deref(), "CAIRN_PASSWORD", "new repository password", true)?;
    let repo = Repository::init(storage.clone(), &pw, &opts)?;
    if g.json {
        outln!(
            "{}",
            serde_json::json!({"message_type": "initialized", "id": repo.config().id, "repository": storage.location()})
        );
    } else {
        outln!("created cairn repository {} at {}", &repo.config().id[..8], storage.location());
        outln!("Keep the password safe: without it the data cannot be read.");
    }
    Ok(ExitCode::SUCCESS)
}

fn run_backup(g: &Global, a: BackupArgs) -> Result<ExitCode> {
    if a.stdin {
        cairn_core::tree::check_name(a.stdin_filename.as_bytes())
            .map_err(|why| anyhow::anyhow!("--stdin-filename wants a plain file name: {why}"))?;
    }
    let repo = open(g)?;
    let _lock = lock(&repo, LockKind::Shared)?;
    repo.load_index()?;
    let defaults = BackupOptions::default();
    let show_progress = g.json || std::io::stderr().is_terminal();
    let opts = BackupOptions {
        tags: a.tags,
        compression: a.compression.as_deref().map(parse_codec).transpose()?,
        hostname: a.host,
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
        ..defaults
    };
    let mut paths = a.paths;
    if let Some(list) = &a.files_from {
        paths.extend(backup::read_files_from(list)?);
    }
    let progress = backup::Progress::default();
    let done = AtomicBool::new(false);
    let out = std::thread::scope(|s| {
        if show_progress {
            s.spawn(|| crate::progress::backup(&progress, &done, g.json));
        }
        let _stop = crate::progress::StopOnDrop(&done);
        if a.stdin {
            backup::backup_stdin(&repo, std::io::stdin().lock(), &a.stdin_filename, &opts, &progress)
        } else {
            backup::backup(&repo, &paths, &opts, &progress)
        }
    })?;
    for w in &out.warnings {
        eprintln!("warning: {}: {}", w.path.display(), w.message);
    }
    crate::progress::print_backup_summary(&out, g.json);
    let errors = out.warnings.iter().filter(|w| w.error).count();
    if errors > 0 {
        eprintln!("warning: {errors} entries could not be read completely (listed above)");
        return Ok(ExitCode::from(3));
    }
    Ok(ExitCode::SUCCESS)
}

fn snapshots(g: &Global) -> Result<ExitCode> {
    let repo = open(g)?;
    let snaps = repo.snapshots()?;
    if g.json {
        let list: Vec<_> = snaps
            .iter()
            .map(|(id, s)| {
                serde_json::json!({
                    "id": id.to_hex(), "short_id": id.short(), "time": s.time.secs, "time_nanos": s.time.nanos,
                    "hostname": s.hostname, "username": s.username, "paths": s.paths, "tags": s.tags, "tree": s.tree.to_hex(),
                })
            })
            .collect();
        outln!("{}", serde_json::Value::Array(list));
        return Ok(ExitCode::SUCCESS);
    }
    outln!("{:<10} {:<19}  {:<16} {:<16} paths", "ID", "time", "host", "tags");
    for (id, s) in &snaps {
        outln!(
            "{:<10} {:<19}  {:<16} {:<16} {}",
            id.short(),
            cairn_core::platform::format_local(s.time),
            s.hostname,
            s.tags.join(","),
            s.paths.join(" ")
        );
    }
    outln!("{} snapshots", snaps.len());
    Ok(ExitCode::SUCCESS)
}

fn ls(g: &Global, a: LsArgs) -> Result<ExitCode> {
    let repo = open(g)?;
    repo.load_index()?;
    let (spec, path) = split_spec(&a.snapshot);
    let (id, snap) = repo.find_snapshot(spec)?;
    let base = path.unwrap_or("/").trim_end_matches('/');
    let start = match cairn_core::restore::resolve_path(&repo, &snap, base, &id.short())? {
        None => snap.tree,
        Some(node) if node.kind == NodeKind::Dir => node.subtree.context("directory without a subtree")?,
        Some(node) => {
            print_node(g, &a, &PathBuf::from(base), &node);
            return Ok(ExitCode::SUCCESS);
        }
    };
    let mut stack = vec![(PathBuf::from(if base.is_empty() { "/" } else { base }), start)];
    while let Some((dir, tree_id)) = stack.pop() {
        let tree = repo.read_tree(&tree_id)?;
        let mut subdirs = Vec::new();
        for node in &tree.nodes {
            let p = dir.join(std::ffi::OsStr::new(&*node.name_lossy()));
            print_node(g, &a, &p, node);
            if let Some(sub) = node.subtree {
                subdirs.push((p, sub));
            }
        }
        stack.extend(subdirs.into_iter().rev());
    }
    Ok(ExitCode::SUCCESS)
}

fn print_node(g: &Global, a: &LsArgs, path: &Path, n: &Node) {
    if g.json {
        outln!(
            "{}",
            serde_json::json!({
                "path": path.to_string_lossy(), "type": format!("{:?}", n.kind).to_lowercase(), "mode": n.mode,
                "uid": n.uid, "gid": n.gid, "user": n.user, "group": n.group, "size": n.size,
                "mtime": n.mtime.secs, "mtime_nanos": n.mtime.nanos,
            })
        );
    } else if a.long {
        let t = match n.kind {
            NodeKind::Dir => 'd',
            NodeKind::Symlink => 'l',
            NodeKind::CharDevice => 'c',
            NodeKind::BlockDevice => 'b',
            NodeKind::Fifo => 'p',
            NodeKind::File => '-',
        };
        let owner = if n.user.is_empty() { n.uid.to_string() } else { n.user.clone() };
        let group = if n.group.is_empty() { n.gid.to_string() } else { n.group.clone() };
        let mut line = format!(
            "{t}{:04o} {owner:>8} {group:>8} {:>12} {} {}",
            n.mode,
            n.size,
            cairn_core::platform::format_local(n.mtime),
            path.display()
        );
        if n.kind == NodeKind::Symlink {
            line.push_str(&format!(" -> {}", String::from_utf8_lossy(&n.target)));
        }
        outln!("{line}");
    } else {
        outln!("{}", path.display());
    }
}

fn run_restore(g: &Global, a: RestoreArgs) -> Result<ExitCode> {
    let repo = open(g)?;
    let _lock = lock(&repo, LockKind::Shared)?;
    repo.load_index()?;
    let (spec, path) = split_spec(&a.snapshot);
    let (id, snap) = repo.find_snapshot(spec)?;
    let defaults = RestoreOptions::default();
    let cancel = Arc::new(AtomicBool::new(false));
    let on_signal = cancel.clone();
    ctrlc::set_handler(move || on_signal.store(true, Ordering::Relaxed))
        .context("cannot install the SIGINT handler")?;
    let opts = RestoreOptions {
        fetch_concurrency: a.fetch_concurrency.unwrap_or(repo.storage().default_concurrency()),
        decode_threads: a.decode_threads.unwrap_or(defaults.decode_threads),
        write_threads: a.write_threads.unwrap_or(defaults.write_threads),
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
        cancel: Some(cancel),
    };
    let progress = Progress::default();
    let done = AtomicBool::new(false);
    let result = std::thread::scope(|s| {
        let reporter = s.spawn(|| crate::progress::restore(&progress, &done, g.json));
        let r = {
            let _stop = crate::progress::StopOnDrop(&done);
            restore::restore(&repo, &snap, &id.short(), path, &a.target, &opts, &progress)
        };
        reporter.join().expect("progress thread");
        r
    });
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
    crate::progress::print_restore_summary(&id.to_hex(), &out, g.json, a.profile);
    if !out.failed.is_empty() {
        eprintln!("cairn: {} entries could not be restored (listed above)", out.failed.len());
        return Ok(ExitCode::from(1));
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

/// Parses a byte size: a number with an optional K, M, G or T suffix (binary units).
fn parse_size(s: &str) -> Result<u64> {
    let t = s.trim().to_ascii_uppercase();
    let t = t.strip_suffix("IB").or_else(|| t.strip_suffix('B')).unwrap_or(&t);
    let (num, mult) = match t.chars().last() {
        Some('K') => (&t[..t.len() - 1], 1u64 << 10),
        Some('M') => (&t[..t.len() - 1], 1 << 20),
        Some('G') => (&t[..t.len() - 1], 1 << 30),
        Some('T') => (&t[..t.len() - 1], 1 << 40),
        _ => (t, 1),
    };
    let n: u64 = num.trim().parse().with_context(|| format!("invalid size {s:?}: use a number with K, M, G or T"))?;
    n.checked_mul(mult).with_context(|| format!("size {s:?} is too large"))
}

fn run_dump(g: &Global, a: DumpArgs) -> Result<ExitCode> {
    let repo = open(g)?;
    let _lock = lock(&repo, LockKind::Shared)?;
    repo.load_index()?;
    let (spec, path) = split_spec(&a.snapshot);
    let (id, snap) = repo.find_snapshot(spec)?;
    let stdout = std::io::stdout();
    if stdout.is_terminal() {
        bail!("refusing to write a dump to a terminal: redirect stdout to a file or a pipe");
    }
    let mut out = std::io::BufWriter::with_capacity(1 << 20, stdout.lock());
    let concurrency = a.fetch_concurrency.unwrap_or(repo.storage().default_concurrency());
    let written = restore::dump(&repo, &snap, &id.short(), path.unwrap_or("/"), &mut out, concurrency)
        .map_err(anyhow::Error::from)
        .and_then(|_| out.flush().context("cannot write to stdout"));
    match written {
        // `cairn dump … | tar -t` whose reader stopped: end as a filter would.
        Err(e) if crate::output::is_broken_pipe(&e) => crate::output::end_by_sigpipe(),
        Err(e) => Err(e),
        Ok(()) => Ok(ExitCode::SUCCESS),
    }
}

fn key(g: &Global, k: KeyCommand) -> Result<ExitCode> {
    let repo = open(g)?;
    match k {
        KeyCommand::Add { new_password_file } => {
            let pw = password::get(new_password_file.as_deref(), "CAIRN_NEW_PASSWORD", "new password", true)?;
            let id = repo.add_key(&pw, KdfParams::default())?;
            outln!("added key {}", id.short());
        }
        KeyCommand::List => {
            for obj in repo.storage().list("keys")? {
                let raw = repo.storage().read(&obj.path)?;
                let kf = cairn_core::keyfile::KeyFile::parse(&obj.path, &raw)?;
                let name = obj.path.rsplit('/').next().unwrap_or_default();
                outln!("{}  {}  {}@{}", &name[..8.min(name.len())], kf.created, kf.username, kf.hostname);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn unlock(g: &Global, a: UnlockArgs) -> Result<ExitCode> {
    let repo = open(g)?;
    let removed = lock::remove(&**repo.storage(), a.remove_all)?;
    for (path, why) in &removed {
        outln!("removed {path}: {why}");
    }
    outln!("{} locks removed", removed.len());
    Ok(ExitCode::SUCCESS)
}
