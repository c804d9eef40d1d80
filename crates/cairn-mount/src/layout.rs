//! The mount's own directories, as restic's: `snapshots/TIME` (and `latest`), `ids/SHORT-ID`,
//! `hosts/HOST/TIME`, `tags/TAG/TIME`. Every place a snapshot appears is a directory holding
//! its tree, with inodes of its own (the kernel allows a directory one name only).

use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};

use cairn_format::id::SnapshotId;
use cairn_format::snapshot::Snapshot;
use cairn_format::tree::{Node, NodeKind, Timestamp};

use crate::inodes::{Child, Ino, Inodes, What, ROOT};

/// Builds the layout for `snapshots` (oldest first) in an empty table; the root is [`ROOT`].
pub fn build(inodes: &Inodes, snapshots: &[(SnapshotId, Snapshot)], mounted_at: Timestamp) -> Ino {
    let newest = snapshots.last().map_or(mounted_at, |(_, s)| s.time);
    let dir = |inodes: &Inodes| inodes.add(|_| What::Dir { children: OnceLock::new(), time: newest });
    let root = dir(inodes);
    debug_assert_eq!(root, ROOT);
    let all: Vec<&(SnapshotId, Snapshot)> = snapshots.iter().collect();
    let by_time = timeline(inodes, &all, newest);
    let ids_dir = dir(inodes);
    let mut ids: Vec<Child> =
        snapshots.iter().map(|(id, s)| (id.short().into_bytes(), snapshot_root(inodes, s))).collect();
    ids.sort(); // looked up by binary search
    inodes.set_children(ids_dir, ids);
    let mut hosts: BTreeMap<&str, Vec<&(SnapshotId, Snapshot)>> = BTreeMap::new();
    let mut tags: BTreeMap<&str, Vec<&(SnapshotId, Snapshot)>> = BTreeMap::new();
    for s in snapshots {
        hosts.entry(s.1.hostname.as_str()).or_default().push(s);
        for t in &s.1.tags {
            tags.entry(t.as_str()).or_default().push(s);
        }
    }
    let group = |groups: BTreeMap<&str, Vec<&(SnapshotId, Snapshot)>>| {
        let d = dir(inodes);
        let entries = groups
            .into_iter()
            .filter(|(name, _)| usable_name(name))
            .map(|(name, snaps)| (name.as_bytes().to_vec(), timeline(inodes, &snaps, newest)))
            .collect();
        inodes.set_children(d, entries);
        d
    };
    let hosts_dir = group(hosts);
    let tags_dir = group(tags);
    let top = vec![
        (b"hosts".to_vec(), hosts_dir),
        (b"ids".to_vec(), ids_dir),
        (b"snapshots".to_vec(), by_time),
        (b"tags".to_vec(), tags_dir),
    ];
    debug_assert!(top.windows(2).all(|w| w[0].0 < w[1].0));
    inodes.set_children(root, top);
    root
}

/// A host or tag that can be a file name.
fn usable_name(name: &str) -> bool {
    cairn_format::tree::check_name(name.as_bytes()).is_ok()
}

/// A directory of `snaps` (oldest first) named by their times, and `latest`.
fn timeline(inodes: &Inodes, snaps: &[&(SnapshotId, Snapshot)], time: Timestamp) -> Ino {
    let d = inodes.add(|_| What::Dir { children: OnceLock::new(), time });
    let mut entries: Vec<Child> = Vec::with_capacity(snaps.len() + 1);
    let mut last_name = None;
    for (_, s) in snaps {
        let base = time_name(s.time);
        let mut name = base.clone();
        let mut n = 1;
        while entries.iter().any(|(e, _)| *e == name.as_bytes()) {
            name = format!("{base}-{n}");
            n += 1;
        }
        entries.push((name.clone().into_bytes(), snapshot_root(inodes, s)));
        last_name = Some(name);
    }
    if let Some(target) = last_name {
        let link = inodes.add(|_| What::Link { target: target.into_bytes(), time });
        entries.push((b"latest".to_vec(), link));
    }
    entries.sort();
    inodes.set_children(d, entries);
    d
}

/// A snapshot's time as a directory name: local time, e.g. `2024-05-01T12:30:45+02:00`.
pub fn time_name(t: Timestamp) -> String {
    use chrono::TimeZone;
    match chrono::Local.timestamp_opt(t.secs, t.nanos) {
        chrono::LocalResult::Single(dt) => dt.format("%Y-%m-%dT%H:%M:%S%:z").to_string(),
        _ => format!("{}", t.secs),
    }
}

/// A new root directory of snapshot `s`: its tree, owned by the snapshot's user, dated by it.
fn snapshot_root(inodes: &Inodes, s: &Snapshot) -> Ino {
    let mut node = Node::new(b"/".to_vec(), NodeKind::Dir);
    node.mode = 0o755;
    node.uid = s.uid;
    node.gid = s.gid;
    (node.atime, node.mtime, node.ctime) = (s.time, s.time, s.time);
    node.links = 2;
    node.subtree = Some(s.tree);
    inodes.add(|ino| What::Node {
        node: std::sync::Arc::new(node),
        snapshot: ino,
        parent: ino,
        children: Mutex::new(None),
    })
}
