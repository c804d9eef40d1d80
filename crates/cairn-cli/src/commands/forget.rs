//! `cairn forget`: remove snapshots named by ID or left out by a retention policy
//! (`cairn_core::commands::forget`). Only snapshot files are removed; the data they referenced stays
//! until a prune.
//!
//! Forget takes a **shared** lock, as backup does: removing a snapshot file never harms a
//! running backup (a backup reads its parent snapshot once, when it starts, and only ever adds
//! files), and prune is designed so that forget never blocks a backup and is never blocked by
//! one.

use std::process::ExitCode;

use anyhow::{bail, Result};
use cairn_core::commands::forget::{self, Count, GroupBy, Plan, Policy, Span};
use cairn_core::commands::json;
use cairn_format::id::SnapshotId;
use cairn_format::lock::LockKind;
use cairn_format::snapshot::Snapshot;
use clap::Args as ClapArgs;

use super::{open_locked, plural, snapshots, FilterArgs, Global};

#[derive(ClapArgs, Debug)]
pub struct Args {
    /// Snapshots to remove whatever the policy says (ID prefixes or `latest`)
    #[arg(value_name = "ID")]
    ids: Vec<String>,
    /// Apply the policy to each group of snapshots with the same host, paths and/or tags
    /// (comma-separated; '' for one group of all)
    #[arg(long, value_name = "GROUP", default_value = "host,paths")]
    group_by: GroupBy,
    #[command(flatten)]
    filters: FilterArgs,
    /// Show what would be removed and remove nothing
    #[arg(long, short = 'n')]
    dry_run: bool,
    /// Go ahead even when every snapshot of the repository would be removed, or the policy
    /// keeps no snapshot of a group
    #[arg(long)]
    allow_remove_all: bool,
    /// Then prune with the default options (see `cairn prune`; with --dry-run, a dry run)
    #[arg(long)]
    prune: bool,
    // Last: its help heading applies to the options after it.
    #[command(flatten)]
    policy: PolicyArgs,
}

/// The retention policy, applied to each group.
#[derive(ClapArgs, Debug)]
#[command(next_help_heading = "Policy (a snapshot any rule keeps stays; counts and durations are per group)")]
struct PolicyArgs {
    /// Keep the N newest snapshots (-1 or unlimited: all)
    #[arg(long, short = 'l', value_name = "N", allow_negative_numbers = true)]
    keep_last: Option<Count>,
    /// Keep the newest snapshot of each of the N newest hours that have one
    #[arg(long, short = 'H', value_name = "N", allow_negative_numbers = true)]
    keep_hourly: Option<Count>,
    /// Keep the newest snapshot of each of the N newest days that have one
    #[arg(long, short = 'd', value_name = "N", allow_negative_numbers = true)]
    keep_daily: Option<Count>,
    /// Keep the newest snapshot of each of the N newest weeks (ISO, Monday to Sunday) that have one
    #[arg(long, short = 'w', value_name = "N", allow_negative_numbers = true)]
    keep_weekly: Option<Count>,
    /// Keep the newest snapshot of each of the N newest months that have one
    #[arg(long, short = 'm', value_name = "N", allow_negative_numbers = true)]
    keep_monthly: Option<Count>,
    /// Keep the newest snapshot of each of the N newest years that have one
    #[arg(long, short = 'y', value_name = "N", allow_negative_numbers = true)]
    keep_yearly: Option<Count>,
    /// Keep every snapshot less than DURATION older than the group's newest (e.g. 1y2m3d4h:
    /// years, months, days, hours)
    #[arg(long, value_name = "DURATION")]
    keep_within: Option<Span>,
    /// Keep the newest snapshot of each hour within DURATION of the group's newest
    #[arg(long, value_name = "DURATION")]
    keep_within_hourly: Option<Span>,
    /// Keep the newest snapshot of each day within DURATION of the group's newest
    #[arg(long, value_name = "DURATION")]
    keep_within_daily: Option<Span>,
    /// Keep the newest snapshot of each week within DURATION of the group's newest
    #[arg(long, value_name = "DURATION")]
    keep_within_weekly: Option<Span>,
    /// Keep the newest snapshot of each month within DURATION of the group's newest
    #[arg(long, value_name = "DURATION")]
    keep_within_monthly: Option<Span>,
    /// Keep the newest snapshot of each year within DURATION of the group's newest
    #[arg(long, value_name = "DURATION")]
    keep_within_yearly: Option<Span>,
    /// Keep every snapshot with these tags (repeatable; `a,b` needs both; '' keeps untagged ones)
    #[arg(long = "keep-tag", value_name = "TAGS")]
    keep_tags: Vec<String>,
}

impl PolicyArgs {
    fn policy(&self) -> Policy {
        Policy {
            last: self.keep_last.unwrap_or_default(),
            hourly: self.keep_hourly.unwrap_or_default(),
            daily: self.keep_daily.unwrap_or_default(),
            weekly: self.keep_weekly.unwrap_or_default(),
            monthly: self.keep_monthly.unwrap_or_default(),
            yearly: self.keep_yearly.unwrap_or_default(),
            within: self.keep_within.unwrap_or_default(),
            within_hourly: self.keep_within_hourly.unwrap_or_default(),
            within_daily: self.keep_within_daily.unwrap_or_default(),
            within_weekly: self.keep_within_weekly.unwrap_or_default(),
            within_monthly: self.keep_within_monthly.unwrap_or_default(),
            within_yearly: self.keep_within_yearly.unwrap_or_default(),
            tags: self.keep_tags.clone(),
        }
    }
}

pub fn run(g: &Global, a: Args) -> Result<ExitCode> {
    let policy = a.policy.policy();
    if policy.is_empty() && a.ids.is_empty() {
        // Invalid arguments: exit code 2, as for any other.
        eprintln!(
            "cairn: no policy and no snapshot IDs given, so nothing would be removed: give --keep-last, \
             --keep-daily, --keep-within, --keep-tag, … or the IDs of the snapshots to remove"
        );
        return Ok(ExitCode::from(2));
    }
    let (repo, held) = open_locked(g, LockKind::Shared)?;
    let now = cairn_core::engine::platform::now();
    let filter = a.filters.filter(&a.ids);
    let snapshots = repo.snapshots()?;
    let plan = Plan::new(&policy, snapshots, &filter.provenance(&repo)?, &filter, a.group_by, now)?;
    if let Some(why) = plan.refusal().filter(|_| !a.allow_remove_all) {
        bail!("{why}; nothing was removed (--allow-remove-all removes them all the same)");
    }
    if !g.json {
        print_plan(&plan, &policy);
    }
    if a.prune && !a.dry_run {
        // A prune that would refuse is said before a snapshot is removed.
        cairn_core::commands::prune::refuses(&repo)?;
    }
    if !a.dry_run {
        forget::remove(&repo, &plan.removed())?;
    }
    if g.json {
        outln!("{}", json::line(&plan.groups.iter().map(json::ForgetGroup::new).collect::<Vec<_>>()));
    } else {
        outln!("{}", summary(&plan, policy.is_empty(), a.dry_run));
    }
    if a.prune {
        // The prune takes its own lock; it would otherwise wait for this one.
        drop(held);
        let lock = super::lock(&repo, LockKind::Prune)?;
        return super::prune::run_plan(
            g,
            &repo,
            &lock,
            Default::default(),
            &super::prune::RunArgs::defaults(a.dry_run),
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Each group: its key, the snapshots kept with their reasons, those removed.
fn print_plan(plan: &Plan, policy: &Policy) {
    if !policy.is_empty() {
        outln!("policy for each group: {policy}");
    }
    for group in &plan.groups {
        outln!("");
        outln!("{}:", group.key);
        if !policy.is_empty() {
            let rows = group.keep.iter().map(|k| (&k.id, &k.snapshot, reasons(&k.reasons)));
            print_table("keep", "reasons", rows);
        }
        let rows = group.remove.iter().map(|r| (&r.id, &r.snapshot, removed_by(r.named)));
        print_table("remove", "removed by", rows);
    }
    outln!("");
}

/// A table of snapshots with a column `column` (why each is kept or removed) before the paths.
fn print_table<'a>(verb: &str, column: &str, rows: impl Iterator<Item = (&'a SnapshotId, &'a Snapshot, String)>) {
    let rows: Vec<_> = rows.collect();
    outln!("{verb} {}:", plural(rows.len(), "snapshot"));
    if rows.is_empty() {
        return;
    }
    let width = rows.iter().map(|r| r.2.len()).max().unwrap_or(0).max(column.len());
    outln!("  {}", snapshots::line("ID", "time", "host", "tags", &format!("{column:<width$} "), "paths"));
    for (id, snap, why) in rows {
        outln!("  {}", snapshots::row(id, snap, &format!("{why:<width$} ")));
    }
}

fn reasons(reasons: &[forget::Reason]) -> String {
    reasons.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
}

fn removed_by(named: bool) -> String {
    if named { "ID" } else { "policy" }.to_string()
}

/// `removed 3 snapshots, kept 2` (without a policy nothing is "kept": only named snapshots were
/// looked at).
fn summary(plan: &Plan, no_policy: bool, dry_run: bool) -> String {
    let removed = plural(plan.removed().len(), "snapshot");
    match (dry_run, no_policy) {
        (false, true) => format!("removed {removed}"),
        (false, false) => format!("removed {removed}, kept {}", plan.kept()),
        (true, true) => format!("would remove {removed} (dry run: nothing was removed)"),
        (true, false) => format!("would remove {removed}, keep {} (dry run: nothing was removed)", plan.kept()),
    }
}
