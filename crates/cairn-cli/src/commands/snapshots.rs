//! `cairn snapshots`: list snapshots.

use std::process::ExitCode;

use anyhow::Result;
use cairn_core::id::SnapshotId;
use cairn_core::snapshot::Snapshot;

use super::{open, Global};

pub fn run(g: &Global) -> Result<ExitCode> {
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
    outln!("{}", line("ID", "time", "host", "tags", "", "paths"));
    for (id, s) in &snaps {
        outln!("{}", row(id, s, ""));
    }
    outln!("{} snapshots", snaps.len());
    Ok(ExitCode::SUCCESS)
}

/// One line of a snapshot table: ID, time, host and tags in columns, then `extra` (more
/// columns, each padded by the caller) and the paths.
pub(crate) fn line(id: &str, time: &str, host: &str, tags: &str, extra: &str, paths: &str) -> String {
    format!("{id:<10} {time:<19}  {host:<16} {tags:<16} {extra}{paths}")
}

/// [`line`] for snapshot `s`.
pub(crate) fn row(id: &SnapshotId, s: &Snapshot, extra: &str) -> String {
    let time = cairn_core::platform::format_local(s.time);
    line(&id.short(), &time, &s.hostname, &s.tags.join(","), extra, &s.paths.join(" "))
}
