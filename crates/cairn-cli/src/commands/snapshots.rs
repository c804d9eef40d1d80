//! `cairn snapshots`: list snapshots.

use std::process::ExitCode;

use anyhow::Result;
use cairn_core::commands::forget::{self, GroupBy, GroupKey};
use cairn_core::commands::json;
use cairn_core::engine::storage::Provenance;
use cairn_format::id::SnapshotId;
use cairn_format::snapshot::Snapshot;
use clap::Args as ClapArgs;

use super::{open, FilterArgs, Global};

#[derive(ClapArgs, Debug)]
pub struct Args {
    /// Only these snapshots (ID prefixes or `latest`)
    #[arg(value_name = "ID")]
    ids: Vec<String>,
    #[command(flatten)]
    filters: FilterArgs,
    /// Only the N newest snapshots of each group (of each host and paths without --group-by)
    #[arg(long, value_name = "N")]
    latest: Option<usize>,
    /// List the snapshots in groups with the same host, paths and/or tags (comma-separated)
    #[arg(long, value_name = "GROUP")]
    group_by: Option<GroupBy>,
}

pub fn run(g: &Global, a: Args) -> Result<ExitCode> {
    let repo = open(g)?;
    let snaps = a.filters.filter(&a.ids).select(&repo)?;
    let provenance = repo.storage().provenance();
    // --latest counts per group: the groups asked for, or restic's host and paths.
    let by = a.group_by.unwrap_or_default();
    let mut groups: Vec<(GroupKey, Vec<&(SnapshotId, Snapshot)>)> = forget::group(&snaps, by)
        .into_iter()
        .map(|(key, mut members)| {
            if let Some(n) = a.latest {
                members.drain(..members.len().saturating_sub(n));
            }
            (key, members)
        })
        .collect();
    if a.group_by.is_none() {
        // One list, oldest first, as the snapshots were before grouping.
        let mut all: Vec<_> = groups.drain(..).flat_map(|(_, m)| m).collect();
        all.sort_by(|x, y| x.1.time.cmp(&y.1.time).then(x.0.cmp(&y.0)));
        if g.json {
            let list: Vec<_> = all.iter().map(|(id, s)| json::SnapshotEntry::new(id, s, &provenance)).collect();
            outln!("{}", json::line(&list));
        } else {
            print_table(&all, &provenance);
        }
        return Ok(ExitCode::SUCCESS);
    }
    if g.json {
        let list: Vec<_> =
            groups.iter().map(|(key, members)| json::SnapshotGroup::new(key, members, &provenance)).collect();
        outln!("{}", json::line(&list));
        return Ok(ExitCode::SUCCESS);
    }
    for (i, (key, members)) in groups.iter().enumerate() {
        if i > 0 {
            outln!("");
        }
        outln!("{key}:");
        print_table(members, &provenance);
    }
    Ok(ExitCode::SUCCESS)
}

/// The snapshots in a table; through a server that records who stored each, with a `stored by`
/// column (FORMAT.md §15.4).
fn print_table(snaps: &[&(SnapshotId, Snapshot)], provenance: &Provenance) {
    let recorded = matches!(provenance, Provenance::Recorded(_));
    let column = |v: &str| if recorded { format!("{v:<16} ") } else { String::new() };
    outln!("{}", line("ID", "time", "host", "tags", &column("stored by"), "paths"));
    for (id, s) in snaps {
        outln!("{}", row(id, s, &column(provenance.stored_by(id).unwrap_or("-"))));
    }
    outln!("{}", super::plural(snaps.len(), "snapshot"));
}

/// One line of a snapshot table: ID, time, host and tags in columns, then `extra` (more
/// columns, each padded by the caller) and the paths.
pub(crate) fn line(id: &str, time: &str, host: &str, tags: &str, extra: &str, paths: &str) -> String {
    format!("{id:<10} {time:<19}  {host:<16} {tags:<16} {extra}{paths}")
}

/// [`line`] for snapshot `s`.
pub(crate) fn row(id: &SnapshotId, s: &Snapshot, extra: &str) -> String {
    let time = cairn_core::engine::platform::format_local(s.time);
    line(&id.short(), &time, &s.hostname, &s.tags.join(","), extra, &s.paths.join(" "))
}
