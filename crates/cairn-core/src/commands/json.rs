//! What every command prints with `--json`: one `Serialize` type per message, built from the
//! commands' own reports. `docs/JSON.md` is the schema of these types (version
//! [`SCHEMA_VERSION`]), and the end-to-end test `json_schema` validates real output against it,
//! so a field added here without a line in JSON.md fails a test.
//!
//! Every object is printed by [`line`]: compact, on one line, keys in name order.

use std::path::Path;
use std::time::Duration;

use cairn_format::id::{KeyId, SnapshotId};
use cairn_format::keyfile::KeyFile;
use cairn_format::snapshot::Snapshot;
use cairn_format::tree::{Node, NodeKind};
use serde::Serialize;

use super::backup::BackupOutcome;
use super::diff::{Counts, DiffStats, Entry, Side};
use super::forget::{GroupDecision, GroupKey};
use super::repair::{IndexRepair, PackRepair, SnapshotRepair};
use super::restore::{DryRun, RestoreOutcome, STAGE_NAMES};
use super::stats::{RawData, RestoreSize, Stats};
use super::tag::Retagged;
use crate::engine::open::Held;
use crate::engine::storage::{CriticalPath, Provenance};

/// The version of the schema in docs/JSON.md. Adding a field or a message type keeps it;
/// removing or renaming one, or changing a field's type or meaning, raises it.
pub const SCHEMA_VERSION: u32 = 1;

/// `value` as one line of JSON with its keys in name order (through `serde_json::Value`, whose
/// maps are sorted): the one way every `--json` object is printed.
pub fn line(value: &impl Serialize) -> String {
    serde_json::to_value(value).map(|v| v.to_string()).unwrap_or_else(|e| {
        // Only a map with non-string keys fails, and no type here has one.
        format!(r#"{{"code":1,"message":"cannot print JSON: {e}","message_type":"error"}}"#)
    })
}

/// A node's kind as JSON names it: `file`, `dir`, `symlink`, `chardevice`, `blockdevice`,
/// `fifo`.
pub fn kind_name(k: NodeKind) -> &'static str {
    match k {
        NodeKind::File => "file",
        NodeKind::Dir => "dir",
        NodeKind::Symlink => "symlink",
        NodeKind::CharDevice => "chardevice",
        NodeKind::BlockDevice => "blockdevice",
        NodeKind::Fifo => "fifo",
    }
}

/// A mode as `ls -l` writes it: the kind letter, then read, write and execute for owner, group
/// and others, with setuid, setgid and sticky as `s`/`S` and `t`/`T` (`drwxr-xr-x`,
/// `-rwsr-x---`).
pub fn mode_string(k: NodeKind, mode: u32) -> String {
    let mut s = String::with_capacity(10);
    s.push(match k {
        NodeKind::Dir => 'd',
        NodeKind::Symlink => 'l',
        NodeKind::CharDevice => 'c',
        NodeKind::BlockDevice => 'b',
        NodeKind::Fifo => 'p',
        NodeKind::File => '-',
    });
    // (shift of the rwx bits, the special bit of that class, its letter when executable)
    for (shift, special, letter) in [(6, 0o4000, 's'), (3, 0o2000, 's'), (0, 0o1000, 't')] {
        let bits = (mode >> shift) & 7;
        s.push(if bits & 4 != 0 { 'r' } else { '-' });
        s.push(if bits & 2 != 0 { 'w' } else { '-' });
        s.push(match (bits & 1 != 0, mode & special != 0) {
            (true, true) => letter,
            (false, true) => letter.to_ascii_uppercase(),
            (true, false) => 'x',
            (false, false) => '-',
        });
    }
    s
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

// ---------------------------------------------------------------------------------------------
// Snapshots and nodes (snapshots, forget, find, ls, key list, tag)

/// A snapshot in `snapshots --json` (and in `forget`'s groups, with `reasons`).
#[derive(Debug, Serialize)]
pub struct SnapshotEntry<'a> {
    id: String,
    short_id: String,
    time: i64,
    time_nanos: u32,
    hostname: &'a str,
    username: &'a str,
    paths: &'a [String],
    tags: &'a [String],
    tree: String,
    /// The token that stored it, where a `cairn serve` server recorded one (FORMAT.md §15.4).
    #[serde(skip_serializing_if = "Option::is_none")]
    stored_by: Option<String>,
}

impl<'a> SnapshotEntry<'a> {
    /// Snapshot `s` with ID `id`; `provenance` says who stored it.
    pub fn new(id: &SnapshotId, s: &'a Snapshot, provenance: &Provenance) -> Self {
        SnapshotEntry {
            id: id.to_hex(),
            short_id: id.short(),
            time: s.time.secs,
            time_nanos: s.time.nanos,
            hostname: &s.hostname,
            username: &s.username,
            paths: &s.paths,
            tags: &s.tags,
            tree: s.tree.to_hex(),
            stored_by: provenance.stored_by(id).map(str::to_string),
        }
    }
}

/// What a group of snapshots shares (`snapshots --group-by`, `forget`).
#[derive(Debug, Serialize)]
pub struct GroupKeyEntry<'a> {
    host: &'a Option<String>,
    paths: &'a Option<Vec<String>>,
    tags: &'a Option<Vec<String>>,
}

impl<'a> GroupKeyEntry<'a> {
    /// The key `k`.
    pub fn new(k: &'a GroupKey) -> Self {
        GroupKeyEntry { host: &k.host, paths: &k.paths, tags: &k.tags }
    }
}

/// One group of `snapshots --json --group-by …`.
#[derive(Debug, Serialize)]
pub struct SnapshotGroup<'a> {
    group_key: GroupKeyEntry<'a>,
    snapshots: Vec<SnapshotEntry<'a>>,
}

impl<'a> SnapshotGroup<'a> {
    /// The group `key` and its members (`provenance`: who stored each).
    pub fn new(key: &'a GroupKey, members: &[&'a (SnapshotId, Snapshot)], provenance: &Provenance) -> Self {
        SnapshotGroup {
            group_key: GroupKeyEntry::new(key),
            snapshots: members.iter().map(|(id, s)| SnapshotEntry::new(id, s, provenance)).collect(),
        }
    }
}

/// A snapshot `forget` keeps or removes.
#[derive(Debug, Serialize)]
pub struct ForgetSnapshot {
    id: String,
    short_id: String,
    time: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    reasons: Option<Vec<String>>,
}

/// One group of `forget --json`: what it keeps (and why) and what it removes.
#[derive(Debug, Serialize)]
pub struct ForgetGroup<'a> {
    group: GroupKeyEntry<'a>,
    keep: Vec<ForgetSnapshot>,
    remove: Vec<ForgetSnapshot>,
}

impl<'a> ForgetGroup<'a> {
    /// The decision `g`.
    pub fn new(g: &'a GroupDecision) -> Self {
        let entry = |id: &SnapshotId, s: &Snapshot, reasons| ForgetSnapshot {
            id: id.to_hex(),
            short_id: id.short(),
            time: s.time.secs,
            reasons,
        };
        ForgetGroup {
            group: GroupKeyEntry::new(&g.key),
            keep: g
                .keep
                .iter()
                .map(|k| entry(&k.id, &k.snapshot, Some(k.reasons.iter().map(ToString::to_string).collect())))
                .collect(),
            remove: g.remove.iter().map(|r| entry(&r.id, &r.snapshot, None)).collect(),
        }
    }
}

/// One node of `ls --json`.
#[derive(Debug, Serialize)]
pub struct NodeEntry<'a> {
    path: String,
    #[serde(rename = "type")]
    kind: &'static str,
    mode: u32,
    permissions: String,
    uid: u32,
    gid: u32,
    user: &'a str,
    group: &'a str,
    size: u64,
    mtime: i64,
    mtime_nanos: u32,
}

impl<'a> NodeEntry<'a> {
    /// Node `n` at `path`.
    pub fn new(path: &Path, n: &'a Node) -> Self {
        NodeEntry {
            path: path.to_string_lossy().into_owned(),
            kind: kind_name(n.kind),
            mode: n.mode,
            permissions: mode_string(n.kind, n.mode),
            uid: n.uid,
            gid: n.gid,
            user: &n.user,
            group: &n.group,
            size: n.size,
            mtime: n.mtime.secs,
            mtime_nanos: n.mtime.nanos,
        }
    }
}

/// One match of `find --json`.
#[derive(Debug, Serialize)]
pub struct FindMatch<'a> {
    snapshot: String,
    short_id: String,
    snapshot_time: i64,
    hostname: &'a str,
    path: String,
    #[serde(rename = "type")]
    kind: &'static str,
    size: u64,
    mode: u32,
    permissions: String,
    mtime: i64,
    mtime_nanos: u32,
}

impl<'a> FindMatch<'a> {
    /// Node `n` at `path` in snapshot `id`.
    pub fn new(id: &SnapshotId, snap: &'a Snapshot, path: &Path, n: &Node) -> Self {
        FindMatch {
            snapshot: id.to_hex(),
            short_id: id.short(),
            snapshot_time: snap.time.secs,
            hostname: &snap.hostname,
            path: path.to_string_lossy().into_owned(),
            kind: kind_name(n.kind),
            size: n.size,
            mode: n.mode,
            permissions: mode_string(n.kind, n.mode),
            mtime: n.mtime.secs,
            mtime_nanos: n.mtime.nanos,
        }
    }
}

/// One key of `key list --json`.
#[derive(Debug, Serialize)]
pub struct KeyEntry<'a> {
    id: String,
    short_id: String,
    current: bool,
    created: &'a str,
    hostname: &'a str,
    username: &'a str,
}

impl<'a> KeyEntry<'a> {
    /// Key file `kf` with ID `id`; `current` when it opened the repository.
    pub fn new(id: &KeyId, kf: &'a KeyFile, current: bool) -> Self {
        KeyEntry {
            id: id.to_hex(),
            short_id: id.short(),
            current,
            created: &kf.created,
            hostname: &kf.hostname,
            username: &kf.username,
        }
    }
}

/// `init --json`.
#[derive(Debug, Serialize)]
pub struct Initialized<'a> {
    message_type: &'static str,
    id: &'a str,
    repository: &'a str,
}

impl<'a> Initialized<'a> {
    /// The repository `id` made at `location`.
    pub fn new(id: &'a str, location: &'a str) -> Self {
        Initialized { message_type: "initialized", id, repository: location }
    }
}

/// A fatal error with `--json`: the one line on standard error instead of `cairn: LINE`.
#[derive(Debug, Serialize)]
pub struct ErrorLine<'a> {
    message_type: &'static str,
    code: u8,
    message: &'a str,
}

impl<'a> ErrorLine<'a> {
    /// The error `message` (its one plain line) of a command that exits with `code`.
    pub fn new(code: u8, message: &'a str) -> Self {
        ErrorLine { message_type: "error", code, message }
    }
}

/// `serve token add --json`: the new token, whose text is shown only this once.
#[derive(Debug, Serialize)]
pub struct TokenAdded<'a> {
    name: &'a str,
    token: &'a str,
    repo: Option<&'a str>,
    role: &'a str,
    expires: Option<u64>,
}

impl<'a> TokenAdded<'a> {
    /// The token `name` with its `text`, for `repo` (`None`: every repository) in `role`,
    /// expiring at Unix second `expires` if it does.
    pub fn new(name: &'a str, text: &'a str, repo: Option<&'a str>, role: &'a str, expires: Option<u64>) -> Self {
        TokenAdded { name, token: text, repo, role, expires }
    }
}

/// One token of `serve token list --json` (never its text: the server keeps only its hash).
#[derive(Debug, Serialize)]
pub struct TokenListed<'a> {
    name: &'a str,
    repo: Option<&'a str>,
    role: &'a str,
    created: u64,
    expires: Option<u64>,
}

impl<'a> TokenListed<'a> {
    /// The token `name` for `repo` in `role`, made at Unix second `created`.
    pub fn new(name: &'a str, repo: Option<&'a str>, role: &'a str, created: u64, expires: Option<u64>) -> Self {
        TokenListed { name, repo, role, created, expires }
    }
}

/// `tag --json`.
#[derive(Debug, Serialize)]
pub struct TagReport<'a> {
    modified: usize,
    snapshots: Vec<TagChange<'a>>,
}

/// One snapshot `tag` rewrote.
#[derive(Debug, Serialize)]
pub struct TagChange<'a> {
    old: String,
    new: String,
    tags: &'a [String],
}

impl<'a> TagReport<'a> {
    /// The snapshots `done` rewrote.
    pub fn new(done: &'a [Retagged]) -> Self {
        TagReport {
            modified: done.len(),
            snapshots: done
                .iter()
                .map(|r| TagChange { old: r.old.to_hex(), new: r.new.to_hex(), tags: &r.tags })
                .collect(),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// diff, stats

/// One side of a change in `diff --json`.
#[derive(Debug, Serialize)]
pub struct DiffSide {
    #[serde(rename = "type")]
    kind: &'static str,
    size: u64,
}

impl DiffSide {
    fn new(s: Option<Side>) -> Option<Self> {
        s.map(|s| DiffSide { kind: kind_name(s.kind), size: s.size })
    }
}

/// One change of `diff --json`.
#[derive(Debug, Serialize)]
pub struct DiffChange {
    message_type: &'static str,
    path: String,
    modifier: String,
    change: &'static str,
    before: Option<DiffSide>,
    after: Option<DiffSide>,
}

impl DiffChange {
    /// The change `e`.
    pub fn new(e: &Entry) -> Self {
        DiffChange {
            message_type: "change",
            path: e.path.to_string_lossy().into_owned(),
            modifier: e.change.code().to_string(),
            change: e.change.name(),
            before: DiffSide::new(e.before),
            after: DiffSide::new(e.after),
        }
    }
}

/// The last line of `diff --json`.
#[derive(Debug, Serialize)]
pub struct DiffStatistics<'a> {
    message_type: &'static str,
    source_snapshot: &'a str,
    target_snapshot: &'a str,
    files: Counts,
    dirs: Counts,
    others: Counts,
    type_changes: u64,
    metadata_changes: u64,
    blobs_added: u64,
    blobs_removed: u64,
    bytes_added: u64,
    bytes_removed: u64,
    trees_read: u64,
}

impl<'a> DiffStatistics<'a> {
    /// The statistics `s` of the diff from `before` to `after`.
    pub fn new(s: &DiffStats, before: &'a str, after: &'a str) -> Self {
        DiffStatistics {
            message_type: "statistics",
            source_snapshot: before,
            target_snapshot: after,
            files: s.files,
            dirs: s.dirs,
            others: s.others,
            type_changes: s.type_changes,
            metadata_changes: s.metadata_changes,
            blobs_added: s.blobs_added,
            blobs_removed: s.blobs_removed,
            bytes_added: s.bytes_added,
            bytes_removed: s.bytes_removed,
            trees_read: s.trees_read,
        }
    }
}

/// `stats --json`.
#[derive(Debug, Serialize)]
pub struct StatsReport<'a> {
    mode: &'static str,
    snapshots: u64,
    restore_size: &'a RestoreSize,
    raw_data: RawDataEntry<'a>,
}

/// The stored side of `stats --json`.
#[derive(Debug, Serialize)]
pub struct RawDataEntry<'a> {
    data_blobs: u64,
    tree_blobs: u64,
    plaintext_bytes: u64,
    data_plaintext_bytes: u64,
    stored_bytes: u64,
    zero_bytes: u64,
    dedup_ratio: f64,
    compression_ratio: f64,
    by_codec: &'a std::collections::BTreeMap<String, cairn_format::pack::CodecUse>,
}

impl<'a> StatsReport<'a> {
    /// The statistics `s`, counted in `mode` (`restore-size` or `raw-data`).
    pub fn new(s: &'a Stats, mode: &'static str) -> Self {
        let raw: &RawData = &s.raw;
        StatsReport {
            mode,
            snapshots: s.snapshots,
            restore_size: &s.restore,
            raw_data: RawDataEntry {
                data_blobs: raw.data_blobs,
                tree_blobs: raw.tree_blobs,
                plaintext_bytes: raw.plain,
                data_plaintext_bytes: raw.data_plain,
                stored_bytes: raw.stored,
                zero_bytes: raw.zero_bytes,
                dedup_ratio: s.dedup_ratio(),
                compression_ratio: raw.compression_ratio(),
                by_codec: &raw.by_codec,
            },
        }
    }
}

// ---------------------------------------------------------------------------------------------
// repair

/// `repair index --json`.
#[derive(Debug, Serialize)]
pub struct IndexRepairSummary {
    message_type: &'static str,
    kept: u64,
    read: u64,
    missing: u64,
    bad_blobs: u64,
    failed: usize,
    written: u64,
    removed: u64,
}

impl IndexRepairSummary {
    /// What `repair index` did.
    pub fn new(r: &IndexRepair) -> Self {
        IndexRepairSummary {
            message_type: "summary",
            kept: r.kept,
            read: r.read,
            missing: r.missing,
            bad_blobs: r.bad_blobs,
            failed: r.failed.len(),
            written: r.written,
            removed: r.removed,
        }
    }
}

/// One snapshot of `repair snapshots --json`.
#[derive(Debug, Serialize)]
pub struct SnapshotRepaired<'a> {
    message_type: &'static str,
    old: String,
    new: Option<String>,
    cut: Vec<FileCut<'a>>,
    emptied: &'a [String],
    forgotten: bool,
}

/// A file `repair snapshots` cut short: its size before and after.
#[derive(Debug, Serialize)]
pub struct FileCut<'a> {
    path: &'a str,
    size: u64,
    new_size: u64,
}

impl<'a> SnapshotRepaired<'a> {
    /// What `repair snapshots` did to one snapshot.
    pub fn new(r: &'a SnapshotRepair) -> Self {
        SnapshotRepaired {
            message_type: "repaired",
            old: r.old.to_hex(),
            new: r.new.map(|i| i.to_hex()),
            cut: r
                .cut
                .iter()
                .map(|(path, size, new_size)| FileCut { path, size: *size, new_size: *new_size })
                .collect(),
            emptied: &r.emptied,
            forgotten: r.forgotten,
        }
    }
}

/// `repair packs --json`.
#[derive(Debug, Serialize)]
pub struct PackRepairSummary {
    message_type: &'static str,
    salvaged: u64,
    elsewhere: u64,
    lost: usize,
    reindexed: u64,
}

impl PackRepairSummary {
    /// What `repair packs` did.
    pub fn new(r: &PackRepair) -> Self {
        PackRepairSummary {
            message_type: "summary",
            salvaged: r.salvaged,
            elsewhere: r.elsewhere,
            lost: r.lost.len(),
            reindexed: r.reindexed,
        }
    }
}

/// `repair unreadable --json`: one line per object that cannot be read.
#[derive(Debug, Serialize)]
pub struct UnreadableRemoved {
    message_type: &'static str,
    path: String,
    why: String,
    removed: bool,
}

impl UnreadableRemoved {
    /// An object `repair unreadable` found (and removed, unless a dry run).
    pub fn new(path: &str, why: &str, removed: bool) -> Self {
        UnreadableRemoved { message_type: "unreadable", path: path.into(), why: why.into(), removed }
    }
}

// ---------------------------------------------------------------------------------------------
// backup

/// A status line of `backup --json`, once a second.
#[derive(Debug, Serialize)]
pub struct BackupStatus {
    message_type: &'static str,
    seconds_elapsed: f64,
    seconds_remaining: Option<f64>,
    files_done: u64,
    total_files: u64,
    bytes_done: u64,
    total_bytes: u64,
    scan_finished: bool,
    current_files: Vec<String>,
}

impl BackupStatus {
    /// The backup's progress `p`, `elapsed` after it started.
    pub fn new(p: &super::backup::Progress, elapsed: Duration) -> Self {
        use std::sync::atomic::Ordering::Relaxed;
        let secs = secs(elapsed);
        let (files_done, bytes_done) = (p.files_done.load(Relaxed), p.bytes_done.load(Relaxed));
        let (total_files, total_bytes) = (p.total_files.load(Relaxed), p.total_bytes.load(Relaxed));
        let scan_finished = p.scan_finished.load(Relaxed);
        BackupStatus {
            message_type: "status",
            seconds_elapsed: secs,
            seconds_remaining: (scan_finished && bytes_done > 0)
                .then(|| secs * total_bytes.saturating_sub(bytes_done) as f64 / bytes_done as f64),
            files_done,
            total_files,
            bytes_done,
            total_bytes,
            scan_finished,
            current_files: p.reading().iter().map(|f| f.to_string_lossy().into_owned()).collect(),
        }
    }
}

/// The last line of `backup --json`.
#[derive(Debug, Serialize)]
pub struct BackupSummary {
    message_type: &'static str,
    snapshot_id: Option<String>,
    dry_run: bool,
    parent: Option<String>,
    files_new: u64,
    files_changed: u64,
    files_unmodified: u64,
    dirs_new: u64,
    dirs_changed: u64,
    dirs_unmodified: u64,
    dirs: u64,
    bytes_read: u64,
    bytes_added: u64,
    bytes_stored: u64,
    errors: u64,
    duration_ms: u64,
}

impl BackupSummary {
    /// What the backup `out` did.
    pub fn new(out: &BackupOutcome) -> Self {
        let s = &out.snapshot.summary;
        BackupSummary {
            message_type: "summary",
            snapshot_id: out.id.map(|id| id.to_hex()),
            dry_run: out.id.is_none(),
            parent: out.snapshot.parent.map(|p| p.to_hex()),
            files_new: s.files_new,
            files_changed: s.files_changed,
            files_unmodified: s.files_unmodified,
            dirs_new: out.dirs.new,
            dirs_changed: out.dirs.changed,
            dirs_unmodified: out.dirs.unmodified,
            dirs: s.dirs,
            bytes_read: s.bytes_read,
            bytes_added: s.bytes_added,
            bytes_stored: s.bytes_stored,
            errors: s.errors,
            duration_ms: s.duration_ms,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// restore (and dump's and check's traces)

/// A status line of `restore --json`, once a second.
#[derive(Debug, Serialize)]
pub struct RestoreStatus {
    message_type: &'static str,
    seconds_elapsed: f64,
    bytes_done: u64,
    total_bytes: u64,
    files_done: u64,
    total_files: u64,
    fetched_bytes: u64,
    stall: Option<String>,
}

impl RestoreStatus {
    /// The restore's progress `p`, `elapsed` after it started.
    pub fn new(p: &super::restore::Progress, elapsed: Duration) -> Self {
        use std::sync::atomic::Ordering::Relaxed;
        RestoreStatus {
            message_type: "status",
            seconds_elapsed: secs(elapsed),
            bytes_done: p.done_bytes.load(Relaxed),
            total_bytes: p.total_bytes.load(Relaxed),
            files_done: p.done_files.load(Relaxed),
            total_files: p.total_files.load(Relaxed),
            fetched_bytes: p.fetched_bytes.load(Relaxed),
            stall: p.stall.lock().map(|s| s.clone()).unwrap_or(None),
        }
    }
}

/// A status line of `restore --live --json`, once a second until the background restore ends.
#[derive(Debug, Serialize)]
pub struct LiveStatus {
    message_type: &'static str,
    seconds_elapsed: f64,
    present_bytes: u64,
    total_bytes: u64,
    restored_bytes: u64,
    fetched_bytes: u64,
    stall: Option<String>,
}

impl LiveStatus {
    /// The background restore's progress `p`, `present` bytes of the `total` in the target
    /// (restored, or written or read by a client), `elapsed` after it started.
    pub fn new(p: &super::restore::Progress, present: u64, total: u64, elapsed: Duration) -> Self {
        use std::sync::atomic::Ordering::Relaxed;
        LiveStatus {
            message_type: "live_status",
            seconds_elapsed: secs(elapsed),
            present_bytes: present,
            total_bytes: total,
            restored_bytes: p.done_bytes.load(Relaxed),
            fetched_bytes: p.fetched_bytes.load(Relaxed),
            stall: p.stall.lock().map(|s| s.clone()).unwrap_or(None),
        }
    }
}

/// The last line of `restore --json`.
#[derive(Debug, Serialize)]
pub struct RestoreSummary<'a> {
    message_type: &'static str,
    snapshot_id: &'a str,
    files: u64,
    dirs: u64,
    others: u64,
    bytes_total: u64,
    bytes_written: u64,
    bytes_fetched: u64,
    bytes_in_place: u64,
    bytes_zero: u64,
    bytes_reused_source: u64,
    bytes_reused_target: u64,
    deleted: u64,
    verified: u64,
    failed: usize,
    warnings: usize,
    stalls: &'a [String],
    seconds: f64,
    profile: Vec<StageEntry>,
    batches: u64,
    fetch_tuning: Vec<FetchTuneEntry>,
    fetch_threads: usize,
    fetch_in_flight_peak: usize,
    write_tuning: Vec<WriteTuneEntry>,
    read_gaps: Vec<u64>,
    phases: Vec<PhaseEntry>,
}

/// A stage's times in [`RestoreSummary::profile`].
#[derive(Debug, Serialize)]
pub struct StageEntry {
    stage: &'static str,
    busy_s: f64,
    idle_s: f64,
    blocked_s: f64,
}

/// A choice of the fetch concurrency's controller.
#[derive(Debug, Serialize)]
pub struct FetchTuneEntry {
    at_s: f64,
    limit: usize,
    reason: &'static str,
    bytes_per_s: f64,
    latency_ms: f64,
    cpu_busy: Option<f64>,
}

/// A choice of the writers' controller.
#[derive(Debug, Serialize)]
pub struct WriteTuneEntry {
    at_s: f64,
    limit: usize,
    reason: &'static str,
    bytes_per_s: f64,
    cpu_share: f64,
}

/// A timed phase.
#[derive(Debug, Serialize)]
pub struct PhaseEntry {
    phase: String,
    seconds: f64,
}

impl<'a> RestoreSummary<'a> {
    /// What the restore `out` of `snapshot` did.
    pub fn new(snapshot: &'a str, out: &'a RestoreOutcome) -> Self {
        RestoreSummary {
            message_type: "summary",
            snapshot_id: snapshot,
            files: out.files,
            dirs: out.dirs,
            others: out.others,
            bytes_total: out.bytes_total,
            bytes_written: out.bytes_written,
            bytes_fetched: out.bytes_fetched,
            bytes_in_place: out.bytes_in_place,
            bytes_zero: out.bytes_zero,
            bytes_reused_source: out.bytes_reused_source,
            bytes_reused_target: out.bytes_reused_target,
            deleted: out.deleted,
            verified: out.verified,
            failed: out.failed.len(),
            warnings: out.warnings.len(),
            stalls: &out.stalls,
            seconds: secs(out.duration),
            profile: STAGE_NAMES
                .iter()
                .zip(&out.profile)
                .map(|(stage, t)| StageEntry {
                    stage,
                    busy_s: secs(t.busy),
                    idle_s: secs(t.idle),
                    blocked_s: secs(t.blocked),
                })
                .collect(),
            batches: out.batches,
            fetch_tuning: out
                .fetch_tuning
                .iter()
                .map(|s| FetchTuneEntry {
                    at_s: secs(s.at),
                    limit: s.limit,
                    reason: s.reason,
                    bytes_per_s: s.throughput,
                    latency_ms: secs(s.latency) * 1000.0,
                    cpu_busy: s.cpu_busy,
                })
                .collect(),
            fetch_threads: out.fetch_threads,
            fetch_in_flight_peak: out.fetch_in_flight_peak,
            write_tuning: out
                .write_tuning
                .iter()
                .map(|s| WriteTuneEntry {
                    at_s: secs(s.at),
                    limit: s.limit,
                    reason: s.reason,
                    bytes_per_s: s.rate,
                    cpu_share: s.cpu,
                })
                .collect(),
            read_gaps: out.read_gaps.iter().map(|g| g.gap).collect(),
            phases: out.phases.iter().map(|(n, d)| PhaseEntry { phase: n.to_string(), seconds: secs(*d) }).collect(),
        }
    }
}

/// `restore --dry-run --json`.
#[derive(Debug, Serialize)]
pub struct RestoreDryRun<'a> {
    message_type: &'static str,
    create: &'a [std::path::PathBuf],
    update: &'a [std::path::PathBuf],
    unchanged: u64,
    delete: &'a [std::path::PathBuf],
    bytes_to_fetch: u64,
    bytes_reused_source: u64,
    bytes_reused_target: u64,
}

impl<'a> RestoreDryRun<'a> {
    /// What the dry run `dry` found; `out` holds its byte counts.
    pub fn new(dry: &'a DryRun, out: &RestoreOutcome) -> Self {
        RestoreDryRun {
            message_type: "dry_run",
            create: &dry.create,
            update: &dry.update,
            unchanged: dry.unchanged,
            delete: &dry.delete,
            bytes_to_fetch: out.bytes_fetched,
            bytes_reused_source: out.bytes_reused_source,
            bytes_reused_target: out.bytes_reused_target,
        }
    }
}

/// `--profile --json` with a tracing storage: the requests waited for one after another before
/// the first data fetch (milliseconds to a tenth).
#[derive(Debug, Serialize)]
pub struct RoundTrips<'a> {
    message_type: &'static str,
    serial_before_data: usize,
    chain: Vec<&'a str>,
    chain_ms: Vec<[f64; 2]>,
    first_data_ms: Option<f64>,
}

impl<'a> RoundTrips<'a> {
    /// The critical path `path`.
    pub fn new(path: &'a CriticalPath) -> Self {
        let ms = |d: Duration| (d.as_secs_f64() * 1e4).round() / 10.0;
        RoundTrips {
            message_type: "round_trips",
            serial_before_data: path.chain.len(),
            chain: path.chain.iter().map(|s| s.what.as_str()).collect(),
            chain_ms: path.chain.iter().map(|s| [ms(s.start), ms(s.end)]).collect(),
            first_data_ms: path.first_data.map(ms),
        }
    }
}

/// `restore --profile --json`: when the lock was let go.
#[derive(Debug, Serialize)]
pub struct LockLetGo {
    message_type: &'static str,
    let_go_before_end_seconds: Option<f64>,
}

impl LockLetGo {
    /// How the restore held its lock.
    pub fn new(held: &Held) -> Self {
        let let_go_before_end_seconds = match held {
            Held::LetGo(d) => Some(secs(*d)),
            _ => None,
        };
        LockLetGo { message_type: "lock", let_go_before_end_seconds }
    }

    /// Seconds before the end the lock was let go, if it was.
    pub fn before_end(&self) -> Option<f64> {
        self.let_go_before_end_seconds
    }
}

// ---------------------------------------------------------------------------------------------
// check, prune, copy

/// A status line of `check --json`, once a second.
#[derive(Debug, Serialize)]
pub struct CheckStatus {
    message_type: &'static str,
    seconds_elapsed: f64,
    phase: &'static str,
    done: u64,
    total: u64,
    bytes_read: u64,
    bytes_to_read: u64,
}

impl CheckStatus {
    /// The check's progress `p`, `elapsed` after it started.
    pub fn new(p: &super::check::Progress, elapsed: Duration) -> Self {
        use std::sync::atomic::Ordering::Relaxed;
        CheckStatus {
            message_type: "status",
            seconds_elapsed: secs(elapsed),
            phase: p.phase.lock().map(|p| *p).unwrap_or(""),
            done: p.done.load(Relaxed),
            total: p.total.load(Relaxed),
            bytes_read: p.bytes_read.load(Relaxed),
            bytes_to_read: p.bytes_to_read.load(Relaxed),
        }
    }
}

/// The last line of `check --json`: the report, with its counts.
#[derive(Debug, Serialize)]
pub struct CheckSummary<'a> {
    message_type: &'static str,
    #[serde(flatten)]
    report: &'a super::check::CheckReport,
    seconds: f64,
    errors: usize,
    notices: usize,
}

impl<'a> CheckSummary<'a> {
    /// The check's report `r`.
    pub fn new(r: &'a super::check::CheckReport) -> Self {
        CheckSummary {
            message_type: "summary",
            report: r,
            seconds: secs(r.duration),
            errors: r.errors(),
            notices: r.notices(),
        }
    }
}

/// The last line of `prune --json`: the report, and the bytes it freed.
#[derive(Debug, Serialize)]
pub struct PruneSummary<'a> {
    message_type: &'static str,
    #[serde(flatten)]
    report: &'a super::prune::PruneReport,
    dry_run: bool,
    freed_bytes: u64,
}

impl<'a> PruneSummary<'a> {
    /// The prune's report `r` (`dry_run`: nothing was deleted).
    pub fn new(r: &'a super::prune::PruneReport, dry_run: bool) -> Self {
        PruneSummary {
            message_type: "summary",
            report: r,
            dry_run,
            freed_bytes: r.size_before.saturating_sub(r.size_after),
        }
    }
}

/// A status line of `copy --json`, once a second.
#[derive(Debug, Serialize)]
pub struct CopyStatus {
    message_type: &'static str,
    seconds_elapsed: f64,
    phase: &'static str,
    bytes_read: u64,
    total_bytes: u64,
    bytes_written: u64,
}

impl CopyStatus {
    /// The copy's progress `p`, `elapsed` after it started.
    pub fn new(p: &super::copy::CopyProgress, elapsed: Duration) -> Self {
        use std::sync::atomic::Ordering::Relaxed;
        CopyStatus {
            message_type: "status",
            seconds_elapsed: secs(elapsed),
            phase: p.phase.lock().map(|p| *p).unwrap_or(""),
            bytes_read: p.read_bytes.load(Relaxed),
            total_bytes: p.total_bytes.load(Relaxed),
            bytes_written: p.written.bytes(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_read_as_ls_writes_them() {
        assert_eq!(mode_string(NodeKind::File, 0o644), "-rw-r--r--");
        assert_eq!(mode_string(NodeKind::Dir, 0o755), "drwxr-xr-x");
        assert_eq!(mode_string(NodeKind::File, 0o4750), "-rwsr-x---");
        assert_eq!(mode_string(NodeKind::File, 0o2640), "-rw-r-S---");
        assert_eq!(mode_string(NodeKind::Dir, 0o1777), "drwxrwxrwt");
        assert_eq!(mode_string(NodeKind::Dir, 0o1776), "drwxrwxrwT");
        assert_eq!(mode_string(NodeKind::Symlink, 0o777), "lrwxrwxrwx");
    }

    #[test]
    fn lines_sort_their_keys() {
        #[derive(Serialize)]
        struct Two {
            b: u8,
            a: u8,
        }
        assert_eq!(line(&Two { b: 2, a: 1 }), r#"{"a":1,"b":2}"#);
    }
}
