//! `cairn tag`: add, remove or replace the tags of snapshots (`cairn_core::commands::tag`).
//!
//! Tag takes a **shared** lock: each changed snapshot is written as a new file before the old
//! one is deleted, so a backup choosing its parent or a restore finding its snapshot meanwhile
//! always finds one of the two.

use std::process::ExitCode;

use anyhow::Result;
use cairn_core::commands::json;
use cairn_core::commands::tag::{self, TagChange};
use cairn_core::engine::select::split_tags;
use cairn_format::lock::LockKind;
use clap::{ArgGroup, Args as ClapArgs};

use super::{open_locked, plural, FilterArgs, Global};

#[derive(ClapArgs, Debug)]
#[command(group(ArgGroup::new("change").required(true).multiple(true).args(["add", "remove", "set"])))]
pub struct Args {
    /// Snapshots to change (ID prefixes or `latest`) [default: every snapshot the filters select]
    #[arg(value_name = "ID")]
    ids: Vec<String>,
    #[command(flatten)]
    filters: FilterArgs,
    /// Add these tags (repeatable; `a,b` adds both; `a\,b` adds the one tag "a,b")
    #[arg(long = "add", value_name = "TAGS")]
    add: Vec<String>,
    /// Remove these tags (repeatable; `a,b` removes both)
    #[arg(long = "remove", value_name = "TAGS")]
    remove: Vec<String>,
    /// Replace every tag with these (repeatable; '' removes all tags)
    #[arg(long = "set", value_name = "TAGS", conflicts_with_all = ["add", "remove"])]
    set: Vec<String>,
}

pub fn run(g: &Global, a: Args) -> Result<ExitCode> {
    let change = if a.set.is_empty() {
        match TagChange::edit(split(&a.add), split(&a.remove)) {
            Ok(c) => c,
            Err(e) => {
                // Invalid arguments: exit code 2, as for any other.
                eprintln!("cairn: {e}");
                return Ok(ExitCode::from(2));
            }
        }
    } else {
        TagChange::Set(split(&a.set))
    };
    let (repo, _lock) = open_locked(g, LockKind::Shared)?;
    let snaps = a.filters.filter(&a.ids).select(&repo)?;
    let done = tag::retag(&repo, &snaps, &change)?;
    if g.json {
        outln!("{}", json::line(&json::TagReport::new(&done)));
        return Ok(ExitCode::SUCCESS);
    }
    for r in &done {
        outln!("{} -> {}: tags {}", r.old.short(), r.new.short(), r.tags.join(","));
    }
    outln!("modified {}", plural(done.len(), "snapshot"));
    Ok(ExitCode::SUCCESS)
}

/// The tags of `a,b` arguments, one each.
fn split(args: &[String]) -> Vec<String> {
    args.iter().flat_map(|a| split_tags(a)).collect()
}
