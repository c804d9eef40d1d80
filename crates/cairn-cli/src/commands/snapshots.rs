//! `cairn snapshots`: list snapshots.

use std::process::ExitCode;

use anyhow::Result;

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
