//! What the pages read from a repository, through the library's read path: snapshots with the
//! CLI's filters, one page of a directory, find, diff, a file or a directory as a tar stream,
//! a restore with its progress, and the repository's health. Each call blocks (the web server
//! runs it on a blocking thread).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;

use anyhow::{Context, Result};
use cairn_core::commands::diff::{DiffOptions, Entry, Root};
use cairn_core::commands::restore::{Progress as RestoreProgress, RestoreOptions, RestoreOutcome};
use cairn_core::engine::repository::Repository;
use cairn_core::engine::select::SnapshotFilter;
use cairn_format::id::SnapshotId;
use cairn_format::snapshot::Snapshot;
use cairn_format::tree::{Node, NodeKind};

/// Entries on one page of a directory.
pub const PAGE: usize = 200;
/// The most results `find` and `diff` show.
pub const MOST: usize = 1000;
/// Memory a download or restore may use.
const MAX_MEMORY: u64 = 256 << 20;

/// The snapshots `filter` chooses, newest first.
pub fn snapshots(repo: &Repository, filter: &SnapshotFilter) -> Result<Vec<(SnapshotId, Snapshot)>> {
    let mut all = filter.select(repo)?;
    all.sort_by_key(|s| std::cmp::Reverse(s.1.time));
    Ok(all)
}

/// One page of a directory.
pub struct Listing {
    /// The snapshot's full ID.
    pub id: SnapshotId,
    /// The snapshot.
    pub snapshot: Snapshot,
    /// The directory (absolute inside the snapshot).
    pub path: PathBuf,
    /// Entries in the directory.
    pub total: usize,
    /// The page's entries.
    pub entries: Vec<Node>,
}

/// Page `page` (from 0) of directory `path` of snapshot `spec`: only that page's entries are
/// kept and sent, however many the directory holds.
pub fn list(repo: &Repository, spec: &str, path: &Path, page: usize) -> Result<Listing> {
    let (id, snapshot) = repo.find_snapshot(spec)?;
    let tree = match cairn_core::engine::trees::resolve(repo, &snapshot.tree, path, &id.short())? {
        None => snapshot.tree,
        Some(n) if n.kind == NodeKind::Dir => n.subtree.context("directory without a subtree")?,
        Some(_) => anyhow::bail!("{} is not a directory in snapshot {}", path.display(), id.short()),
    };
    // The directory's bytes, its nodes decoded only for the page: a directory of 250,000
    // entries is held as about 100 bytes an entry, not 400 (cairn_format::tree::TreeBytes).
    let tree = repo.read_tree_bytes(&tree)?;
    let total = tree.len();
    let first = page.saturating_mul(PAGE).min(total);
    let entries = (first..(first + PAGE).min(total)).filter_map(|i| tree.node(i)).collect();
    Ok(Listing { id, snapshot, path: path.to_path_buf(), total, entries })
}

/// The node at `path` of snapshot `spec` (`None`: the root).
pub fn node(repo: &Repository, spec: &str, path: &Path) -> Result<Option<Node>> {
    let (id, snapshot) = repo.find_snapshot(spec)?;
    Ok(cairn_core::engine::trees::resolve(repo, &snapshot.tree, path, &id.short())?)
}

/// Writes `path` of snapshot `spec` to `out`: a file's bytes, a directory as a tar stream.
pub fn download(repo: &Repository, spec: &str, path: &Path, out: &mut dyn Write) -> Result<()> {
    let (id, snapshot) = repo.find_snapshot(spec)?;
    cairn_core::commands::dump::dump(repo, &snapshot, &id.short(), path, out, None, MAX_MEMORY)?;
    Ok(())
}

/// Entries whose name (or path, for a pattern with `/`) matches `pattern` in snapshot `spec`,
/// at most [`MOST`].
pub fn find(repo: &Repository, spec: &str, pattern: &str) -> Result<Vec<(PathBuf, Node)>> {
    let snap = repo.find_snapshot(spec)?;
    let matcher = cairn_core::commands::find::Matcher::new(&[pattern.to_string()], true)?;
    let mut out = Vec::new();
    let threads = repo.storage().default_concurrency();
    let r = cairn_core::commands::find::find(repo, &[snap], &matcher, threads, |_, _, path, node| {
        if out.len() >= MOST {
            return Err(cairn_core::Error::Usage("enough".into()));
        }
        out.push((path.to_path_buf(), node.clone()));
        Ok(())
    });
    match r {
        Err(cairn_core::Error::Usage(m)) if m == "enough" => {}
        other => other?,
    }
    Ok(out)
}

/// What changed from snapshot `a` to snapshot `b`, at most [`MOST`] entries, and how many there were.
pub fn diff(repo: &Repository, a: &str, b: &str) -> Result<(Vec<Entry>, usize)> {
    let (_, before) = repo.find_snapshot(a)?;
    let (_, after) = repo.find_snapshot(b)?;
    let opts = DiffOptions { metadata: false, threads: repo.storage().default_concurrency() };
    let (mut entries, _) = cairn_core::commands::diff::diff(
        repo,
        Root::Tree(before.tree),
        Root::Tree(after.tree),
        Path::new("/"),
        opts,
        &cairn_core::engine::trees::Loading::default(),
    )?;
    let total = entries.len();
    entries.truncate(MOST);
    Ok((entries, total))
}

/// The repository's health as the pages show it.
pub struct Health {
    /// Pack files and their bytes.
    pub packs: usize,
    /// Bytes of the pack files.
    pub bytes: u64,
    /// Snapshots.
    pub snapshots: usize,
    /// Locks held: (path, who and since when, or why it is stale).
    pub locks: Vec<(String, String)>,
    /// What this machine's data checks read (`None`: they keep no record).
    pub verified: Option<cairn_core::commands::check::Verification>,
    /// What a prune would reclaim, if it was asked for: bytes of packs deleted whole, bytes
    /// freed by repacking, and the repository's size after.
    pub reclaimable: Option<Reclaimable>,
}

/// What `cairn prune` with its defaults would do now (a dry run of it).
pub struct Reclaimable {
    /// Bytes it would free.
    pub bytes: u64,
    /// Pack files it would delete whole.
    pub delete_packs: u64,
    /// Pack files it would repack.
    pub repack_packs: u64,
    /// Bytes of pack files after it.
    pub size_after: u64,
}

/// Reads the repository's packs, snapshots and locks; what this machine's data checks never
/// read (their record in `record_dir`); with `reclaimable`, plans a prune (a dry run, without a
/// lock, as long as marking every snapshot's blobs takes) to say what it would free.
pub fn health(repo: &Repository, record_dir: Option<&Path>, reclaimable: bool) -> Result<Health> {
    let packs = repo.list_packs()?;
    let locks = cairn_core::engine::lock::list(&**repo.storage())?
        .into_iter()
        .map(|l| {
            let what = match (&l.info, l.stale_reason()) {
                (_, Some(why)) => format!("stale: {why}"),
                (Ok(i), None) => format!(
                    "{} lock of {}@{}, process {}",
                    if i.exclusive { "exclusive" } else { "shared" },
                    i.username,
                    i.hostname,
                    i.pid
                ),
                (Err(e), None) => e.clone(),
            };
            (l.path, what)
        })
        .collect();
    let verified = record_dir.map(|d| cairn_core::commands::check::verification(repo, d)).transpose()?;
    let reclaimable = if reclaimable {
        use cairn_core::commands::prune::{self, PlanOptions, PruneOptions, RepackOptions};
        let plan = PlanOptions::default();
        let opts = PruneOptions {
            repack: RepackOptions::new(repo, &plan, None),
            plan,
            max_memory: cairn_core::engine::memory::MaxMemory::from_option(None),
            dry_run: true,
            max_wait: std::time::Duration::ZERO,
        };
        let r = prune::prune(repo, None, &opts, &|_| {}, Default::default())?;
        Some(Reclaimable {
            // Packs deleted whole, and what repacking leaves behind of the packs it rewrites.
            bytes: r.plan.delete_bytes + r.plan.repack_bytes.saturating_sub(r.plan.copy_bytes),
            delete_packs: r.plan.delete_packs,
            repack_packs: r.plan.repack_packs,
            size_after: r.plan.size_after,
        })
    } else {
        None
    };
    Ok(Health {
        packs: packs.len(),
        bytes: packs.values().sum(),
        snapshots: repo.snapshots()?.len(),
        locks,
        verified,
        reclaimable,
    })
}

/// A restore started from the web interface.
pub struct RestoreTask {
    /// Its number (the page's address).
    pub id: usize,
    /// The profile, snapshot and path restored, and where to.
    pub profile: String,
    /// The snapshot's name as given.
    pub snapshot: String,
    /// The path inside it.
    pub path: PathBuf,
    /// The target directory on this host.
    pub target: PathBuf,
    /// The library's progress counters.
    pub progress: RestoreProgress,
    /// When it started.
    pub started: Instant,
    /// Its outcome, once it ended.
    pub outcome: Mutex<Option<Result<RestoreOutcome, String>>>,
}

impl RestoreTask {
    /// A restore about to run.
    pub fn new(id: usize, profile: &str, snapshot: &str, path: &Path, target: &Path) -> RestoreTask {
        RestoreTask {
            id,
            profile: profile.to_string(),
            snapshot: snapshot.to_string(),
            path: path.to_path_buf(),
            target: target.to_path_buf(),
            progress: RestoreProgress::default(),
            started: Instant::now(),
            outcome: Mutex::new(None),
        }
    }

    /// Runs the restore to its end (the library's restore, its default options: files
    /// already in the target are kept if equal, data found in local files is reused).
    pub fn run(&self, repo: &Repository) {
        let result = (|| -> Result<RestoreOutcome> {
            if !self.target.is_absolute() {
                anyhow::bail!("the target {} is not an absolute path", self.target.display());
            }
            let (id, snapshot) = repo.find_snapshot(&self.snapshot)?;
            let opts = RestoreOptions { max_memory: MAX_MEMORY, ..RestoreOptions::default() };
            Ok(cairn_core::commands::restore::restore(
                repo,
                &snapshot,
                &id.short(),
                Some(&self.path),
                &self.target,
                &opts,
                &self.progress,
            )?)
        })();
        *self.outcome.lock().unwrap() = Some(result.map_err(|e| format!("{e:#}")));
    }
}
