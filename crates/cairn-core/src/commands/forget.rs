//! Forgetting snapshots: which to keep by a retention policy, and removing the others' snapshot
//! files (restic's `forget` semantics). The data they referenced stays until a prune.
//!
//! Snapshots are split into groups (by host and paths unless told otherwise, [`GroupBy`]) and
//! the [`Policy`] is applied to each group on its own, newest snapshot first. A snapshot is kept
//! when any rule keeps it — the rules are a union — and carries every [`Reason`] that kept it:
//!
//! - `last N`: the N newest snapshots.
//! - `hourly|daily|weekly|monthly|yearly N`: for each of the N newest hours (days, ISO weeks,
//!   months, years; local time) that hold a snapshot, the newest snapshot in it. A period counts
//!   once however many snapshots it holds. A rule that runs out of snapshots before it has kept N
//!   periods also keeps the group's oldest snapshot ("oldest daily"), so as much history as the
//!   policy allows is kept.
//! - `within SPAN`: every snapshot less than SPAN older than the group's newest snapshot —
//!   relative to the newest, not to now, so a group whose backups stopped keeps its last ones.
//!   Snapshots dated in the future (a wrong clock) are kept and are not taken as the newest.
//! - `hourly…yearly within SPAN`: the newest snapshot of every period inside that SPAN.
//! - `tag a,b`: every snapshot that has all these tags (an empty list: that has no tags).
//!
//! A count of [`Count::All`] keeps every period. [`apply`] is the pure policy function; [`Plan`]
//! adds the snapshots named by ID (removed whatever the policy says) and the filters; [`remove`]
//! deletes snapshot files.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::str::FromStr;

use chrono::{Datelike, LocalResult, NaiveDateTime, TimeZone, Timelike};

use crate::engine::parallel::map_parallel;
use crate::engine::repository::Repository;
use crate::engine::select::{has_tags, SnapshotFilter};
use crate::engine::storage::Provenance;
use crate::error::{Error, Result};
use cairn_format::id::SnapshotId;
use cairn_format::layout::snapshot_path;
use cairn_format::snapshot::Snapshot;
use cairn_format::tree::Timestamp;

/// How many snapshots (or periods) a counting rule keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Count {
    /// At most this many; 0 turns the rule off.
    Of(u32),
    /// Every one (`-1` or `unlimited` on the command line).
    All,
}

impl Default for Count {
    fn default() -> Self {
        Count::Of(0)
    }
}

impl Count {
    fn is_on(self) -> bool {
        self != Count::Of(0)
    }

    /// Whether a rule that has kept `kept` may keep one more.
    fn allows(self, kept: u32) -> bool {
        match self {
            Count::Of(n) => kept < n,
            Count::All => true,
        }
    }
}

impl FromStr for Count {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        match s.trim() {
            "-1" | "unlimited" => Ok(Count::All),
            t => t
                .parse()
                .map(Count::Of)
                .map_err(|_| Error::Usage(format!("invalid count {s:?}: use a number, or -1 or unlimited for all"))),
        }
    }
}

impl fmt::Display for Count {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Count::Of(n) => write!(f, "{n}"),
            Count::All => f.write_str("all"),
        }
    }
}

/// A calendar duration in years, months, days and hours, written `1y2m3d4h` (any of the parts,
/// in any order; `m` is months).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Span {
    /// Years.
    pub years: u32,
    /// Months.
    pub months: u32,
    /// Days.
    pub days: u32,
    /// Hours.
    pub hours: u32,
}

impl Span {
    /// Whether every part is zero (a rule with such a span is off).
    pub fn is_zero(self) -> bool {
        self == Span::default()
    }

    /// The time `self` before `t`, counted on the local calendar: years and months move the date
    /// to the same day of the month (its last day where the month is shorter), then days and
    /// hours are taken off. `None` when that lies outside the times the calendar can represent.
    pub fn before(self, t: Timestamp) -> Option<Timestamp> {
        let local = chrono::Local.timestamp_opt(t.secs, t.nanos).single()?;
        let months = u32::try_from(u64::from(self.years) * 12 + u64::from(self.months)).ok()?;
        let date = local
            .naive_local()
            .checked_sub_months(chrono::Months::new(months))?
            .checked_sub_days(chrono::Days::new(u64::from(self.days)))?;
        let secs = local_secs(date, local.offset().local_minus_utc())?.checked_sub(i64::from(self.hours) * 3600)?;
        Some(Timestamp { secs, nanos: t.nanos })
    }
}

/// The Unix time of a local date and time: the earlier one where clocks go back; inside a gap
/// where they go forward, the time read with `offset` (seconds east of UTC).
fn local_secs(local: NaiveDateTime, offset: i32) -> Option<i64> {
    match chrono::Local.from_local_datetime(&local) {
        LocalResult::Single(t) | LocalResult::Ambiguous(t, _) => Some(t.timestamp()),
        LocalResult::None => local.and_utc().timestamp().checked_sub(i64::from(offset)),
    }
}

impl FromStr for Span {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let bad = |why: String| {
            Error::Usage(format!("invalid duration {s:?}: {why}; use e.g. 1y2m3d4h (years, months, days, hours)"))
        };
        let mut span = Span::default();
        let mut seen = Vec::new();
        let mut rest = s.trim();
        if rest.is_empty() {
            return Err(bad("it is empty".into()));
        }
        while !rest.is_empty() {
            let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
            let (number, tail) = rest.split_at(digits);
            let Some(unit) = tail.chars().next() else {
                return Err(bad(format!("{number} has no unit")));
            };
            if number.is_empty() {
                return Err(bad(format!("{unit:?} has no number before it")));
            }
            let n: u32 = number.parse().map_err(|_| bad(format!("{number} is too large")))?;
            let part = match unit {
                'y' => &mut span.years,
                'm' => &mut span.months,
                'd' => &mut span.days,
                'h' => &mut span.hours,
                other => return Err(bad(format!("unknown unit {other:?}"))),
            };
            if seen.contains(&unit) {
                return Err(bad(format!("{unit} is given twice")));
            }
            seen.push(unit);
            *part = n;
            rest = &tail[unit.len_utf8()..];
        }
        Ok(span)
    }
}

impl fmt::Display for Span {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_zero() {
            return f.write_str("0h");
        }
        for (n, unit) in [(self.years, 'y'), (self.months, 'm'), (self.days, 'd'), (self.hours, 'h')] {
            if n > 0 {
                write!(f, "{n}{unit}")?;
            }
        }
        Ok(())
    }
}

/// The calendar periods the counting and `within` rules keep one snapshot of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Calendar {
    /// An hour of a day.
    Hourly,
    /// A day.
    Daily,
    /// An ISO week (Monday to Sunday).
    Weekly,
    /// A month.
    Monthly,
    /// A year.
    Yearly,
}

impl Calendar {
    /// Every period, shortest first.
    pub const ALL: [Calendar; 5] =
        [Calendar::Hourly, Calendar::Daily, Calendar::Weekly, Calendar::Monthly, Calendar::Yearly];

    /// `hourly`, `daily`, …
    pub fn name(self) -> &'static str {
        match self {
            Calendar::Hourly => "hourly",
            Calendar::Daily => "daily",
            Calendar::Weekly => "weekly",
            Calendar::Monthly => "monthly",
            Calendar::Yearly => "yearly",
        }
    }

    /// The period `t` falls in (local time), as a number that is the same for every time in the
    /// period and grows from one period to the next: e.g. 2024010523 for 23:00–23:59 on
    /// 5 January 2024, 202401 for ISO week 1 of 2024.
    pub fn period(self, t: Timestamp) -> i64 {
        let Some(d) = chrono::Local.timestamp_opt(t.secs, t.nanos).single() else {
            // Outside the calendar's range (a damaged time): a period of its own.
            return t.secs;
        };
        let (year, month, day) = (i64::from(d.year()), i64::from(d.month()), i64::from(d.day()));
        match self {
            Calendar::Hourly => ((year * 100 + month) * 100 + day) * 100 + i64::from(d.hour()),
            Calendar::Daily => (year * 100 + month) * 100 + day,
            Calendar::Weekly => i64::from(d.iso_week().year()) * 100 + i64::from(d.iso_week().week()),
            Calendar::Monthly => year * 100 + month,
            Calendar::Yearly => year,
        }
    }
}

/// Which snapshots of each group to keep; every other snapshot of the group is removed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Policy {
    /// The newest snapshots.
    pub last: Count,
    /// The newest snapshot of each of the newest hours that have one.
    pub hourly: Count,
    /// … of days.
    pub daily: Count,
    /// … of ISO weeks.
    pub weekly: Count,
    /// … of months.
    pub monthly: Count,
    /// … of years.
    pub yearly: Count,
    /// Every snapshot within this span of the group's newest.
    pub within: Span,
    /// The newest snapshot of each hour within this span of the group's newest.
    pub within_hourly: Span,
    /// … of each day.
    pub within_daily: Span,
    /// … of each ISO week.
    pub within_weekly: Span,
    /// … of each month.
    pub within_monthly: Span,
    /// … of each year.
    pub within_yearly: Span,
    /// Every snapshot that has all the tags of any of these lists (`a,b`; `""`: no tags).
    pub tags: Vec<String>,
}

impl Policy {
    /// Whether no rule is on (such a policy keeps everything; `forget` refuses it).
    pub fn is_empty(&self) -> bool {
        !self.last.is_on()
            && self.counts().iter().all(|(_, c)| !c.is_on())
            && self.within.is_zero()
            && self.withins().iter().all(|(_, s)| s.is_zero())
            && self.tags.is_empty()
    }

    fn counts(&self) -> [(Calendar, Count); 5] {
        let c = [self.hourly, self.daily, self.weekly, self.monthly, self.yearly];
        std::array::from_fn(|i| (Calendar::ALL[i], c[i]))
    }

    fn withins(&self) -> [(Calendar, Span); 5] {
        let s = [self.within_hourly, self.within_daily, self.within_weekly, self.within_monthly, self.within_yearly];
        std::array::from_fn(|i| (Calendar::ALL[i], s[i]))
    }
}

impl fmt::Display for Policy {
    /// The rules that are on, in the words of [`Reason`]: `last 3, daily 7, within 2d, tag a`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut rules = Vec::new();
        if self.last.is_on() {
            rules.push(format!("last {}", self.last));
        }
        rules.extend(self.counts().iter().filter(|(_, c)| c.is_on()).map(|(cal, c)| format!("{} {c}", cal.name())));
        if !self.within.is_zero() {
            rules.push(format!("within {}", self.within));
        }
        rules.extend(
            self.withins().iter().filter(|(_, s)| !s.is_zero()).map(|(cal, s)| format!("{} within {s}", cal.name())),
        );
        rules.extend(self.tags.iter().map(|t| format!("tag {t}")));
        f.write_str(&rules.join(", "))
    }
}

/// What snapshots are grouped by before the policy is applied to each group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GroupBy {
    /// The host name.
    pub host: bool,
    /// The set of backed-up paths.
    pub paths: bool,
    /// The set of tags.
    pub tags: bool,
}

impl Default for GroupBy {
    /// By host and paths.
    fn default() -> Self {
        GroupBy { host: true, paths: true, tags: false }
    }
}

impl GroupBy {
    /// The group `snap` belongs to.
    pub fn key(&self, snap: &Snapshot) -> GroupKey {
        let sorted = |v: &[String]| {
            let mut v = v.to_vec();
            v.sort_unstable();
            v
        };
        GroupKey {
            host: self.host.then(|| snap.hostname.clone()),
            paths: self.paths.then(|| sorted(&snap.paths)),
            tags: self.tags.then(|| sorted(&snap.tags)),
        }
    }
}

impl FromStr for GroupBy {
    type Err = Error;

    /// `host,paths,tags` or any part of it; `""` puts every snapshot in one group.
    fn from_str(s: &str) -> Result<Self> {
        let mut by = GroupBy { host: false, paths: false, tags: false };
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            match part {
                "host" | "hosts" => by.host = true,
                "path" | "paths" => by.paths = true,
                "tag" | "tags" => by.tags = true,
                other => {
                    return Err(Error::Usage(format!(
                        "cannot group by {other:?}: use host, paths and tags, comma-separated (empty: one group)"
                    )))
                }
            }
        }
        Ok(by)
    }
}

/// A group's shared values: those of the fields grouped by.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GroupKey {
    /// The host name, when grouped by host.
    pub host: Option<String>,
    /// The paths (sorted), when grouped by paths.
    pub paths: Option<Vec<String>>,
    /// The tags (sorted), when grouped by tags.
    pub tags: Option<Vec<String>>,
}

impl fmt::Display for GroupKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        if let Some(h) = &self.host {
            parts.push(format!("host {h}"));
        }
        if let Some(p) = &self.paths {
            parts.push(format!("paths {}", p.join(" ")));
        }
        match &self.tags {
            Some(t) if t.is_empty() => parts.push("no tags".into()),
            Some(t) => parts.push(format!("tags {}", t.join(","))),
            None => {}
        }
        if parts.is_empty() {
            return f.write_str("all snapshots");
        }
        f.write_str(&parts.join(", "))
    }
}

/// Why a snapshot is kept.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reason {
    /// The n-th newest snapshot (`last n`).
    Last(u32),
    /// The newest snapshot of the n-th newest period that has one (`daily n`).
    Period(Calendar, u32),
    /// The group's oldest snapshot, kept because the rule for these periods ran out of snapshots
    /// before it ran out of count (`oldest daily`).
    Oldest(Calendar),
    /// Within this span of the newest snapshot (`within 2d`).
    Within(Span),
    /// The newest snapshot of its period, within this span of the newest (`daily within 1m`).
    PeriodWithin(Calendar, Span),
    /// Has all the tags of this list (`tag a,b`).
    Tag(String),
    /// The policy has no rule, so everything is kept.
    NoPolicy,
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::Last(n) => write!(f, "last {n}"),
            Reason::Period(cal, n) => write!(f, "{} {n}", cal.name()),
            Reason::Oldest(cal) => write!(f, "oldest {}", cal.name()),
            Reason::Within(span) => write!(f, "within {span}"),
            Reason::PeriodWithin(cal, span) => write!(f, "{} within {span}", cal.name()),
            Reason::Tag(list) if list.is_empty() => f.write_str("tag ''"),
            Reason::Tag(list) => write!(f, "tag {list}"),
            Reason::NoPolicy => f.write_str("no policy"),
        }
    }
}

/// A snapshot that stays, and why.
#[derive(Clone, Debug)]
pub struct Kept {
    /// Its ID.
    pub id: SnapshotId,
    /// The snapshot.
    pub snapshot: Snapshot,
    /// Every rule that keeps it, in the policy's order.
    pub reasons: Vec<Reason>,
}

/// A snapshot to remove.
#[derive(Clone, Debug)]
pub struct Removed {
    /// Its ID.
    pub id: SnapshotId,
    /// The snapshot.
    pub snapshot: Snapshot,
    /// Whether it was named by ID (rather than left out by the policy).
    pub named: bool,
}

/// What happens to one group's snapshots; both lists oldest first.
#[derive(Clone, Debug, Default)]
pub struct GroupDecision {
    /// The group.
    pub key: GroupKey,
    /// The snapshots kept by the policy.
    pub keep: Vec<Kept>,
    /// The snapshots removed.
    pub remove: Vec<Removed>,
}

/// Applies `policy` to `snaps` (any order) grouped by `group_by`; groups in key order. `now` is
/// the current time: snapshots after it are not taken as a group's newest for the `within`
/// rules. An empty policy keeps everything ([`Reason::NoPolicy`]).
pub fn apply(
    policy: &Policy,
    snaps: &[(SnapshotId, Snapshot)],
    group_by: GroupBy,
    now: Timestamp,
) -> Vec<GroupDecision> {
    group(snaps, group_by).into_iter().map(|(key, members)| decide(policy, key, members, now)).collect()
}

/// `snaps` split into groups by `group_by`, in key order, each group's snapshots in the order
/// of `snaps` (`forget` applies its policy to each; `snapshots --group-by` lists them).
pub fn group(snaps: &[(SnapshotId, Snapshot)], group_by: GroupBy) -> BTreeMap<GroupKey, Vec<&(SnapshotId, Snapshot)>> {
    let mut groups: BTreeMap<GroupKey, Vec<&(SnapshotId, Snapshot)>> = BTreeMap::new();
    for s in snaps {
        groups.entry(group_by.key(&s.1)).or_default().push(s);
    }
    groups
}

/// Applies `policy` to one group.
fn decide(policy: &Policy, key: GroupKey, mut members: Vec<&(SnapshotId, Snapshot)>, now: Timestamp) -> GroupDecision {
    members.sort_by(|a, b| b.1.time.cmp(&a.1.time).then(b.0.cmp(&a.0)));
    let newest_first: Vec<&Snapshot> = members.iter().map(|(_, s)| s).collect();
    let reasons = reasons(policy, &newest_first, now);
    let mut decision = GroupDecision { key, ..GroupDecision::default() };
    for ((id, snapshot), reasons) in members.into_iter().zip(reasons).rev() {
        let (id, snapshot) = (*id, snapshot.clone());
        if reasons.is_empty() {
            decision.remove.push(Removed { id, snapshot, named: false });
        } else {
            decision.keep.push(Kept { id, snapshot, reasons });
        }
    }
    decision
}

/// Why each snapshot of a group (newest first) is kept, in the policy's order; an empty list
/// means it is not.
fn reasons(policy: &Policy, newest_first: &[&Snapshot], now: Timestamp) -> Vec<Vec<Reason>> {
    let mut out = vec![Vec::new(); newest_first.len()];
    if policy.is_empty() {
        out.iter_mut().for_each(|r| r.push(Reason::NoPolicy));
        return out;
    }
    for list in &policy.tags {
        for (snap, why) in newest_first.iter().zip(out.iter_mut()) {
            if has_tags(snap, list) {
                why.push(Reason::Tag(list.clone()));
            }
        }
    }
    let times: Vec<Timestamp> = newest_first.iter().map(|s| s.time).collect();
    // The group's newest snapshot that is not dated in the future.
    let newest = times.iter().copied().find(|t| *t <= now);
    if !policy.within.is_zero() {
        let inside = count_within(&times, newest, policy.within);
        out[..inside].iter_mut().for_each(|r| r.push(Reason::Within(policy.within)));
    }
    let each: Vec<i64> = (0..times.len() as i64).collect();
    keep_periods(&each, policy.last, Reason::Last, None, &mut out);
    for (cal, count) in policy.counts() {
        let periods: Vec<i64> = times.iter().map(|t| cal.period(*t)).collect();
        keep_periods(&periods, count, |n| Reason::Period(cal, n), Some(Reason::Oldest(cal)), &mut out);
    }
    for (cal, span) in policy.withins().into_iter().filter(|(_, s)| !s.is_zero()) {
        let inside = count_within(&times, newest, span);
        let periods: Vec<i64> = times[..inside].iter().map(|t| cal.period(*t)).collect();
        keep_periods(&periods, Count::All, |_| Reason::PeriodWithin(cal, span), None, &mut out[..inside]);
    }
    out
}

/// How many of `times` (newest first) lie less than `span` before `newest`: all of them when
/// there is no newest (every snapshot is in the future) or the span reaches past the calendar.
fn count_within(times: &[Timestamp], newest: Option<Timestamp>, span: Span) -> usize {
    match newest.and_then(|t| span.before(t)) {
        Some(cutoff) => times.iter().take_while(|t| **t > cutoff).count(),
        None => times.len(),
    }
}

/// The counting rule: walking `periods` (each snapshot's, newest first), the first snapshot of
/// each new period is kept with `reason(n)` for the n-th period, until `count` periods are kept.
/// If the count is not used up when the oldest snapshot is reached, that one is kept too
/// (with `oldest`, when it is not the first of its period).
fn keep_periods(
    periods: &[i64],
    count: Count,
    reason: impl Fn(u32) -> Reason,
    oldest: Option<Reason>,
    out: &mut [Vec<Reason>],
) {
    let mut kept = 0;
    let mut previous = None;
    for (i, period) in periods.iter().enumerate() {
        if !count.allows(kept) {
            return;
        }
        if previous != Some(period) {
            previous = Some(period);
            kept += 1;
            out[i].push(reason(kept));
        } else if i + 1 == periods.len() {
            out[i].extend(oldest.clone());
        }
    }
}

/// Why `forget` will not go ahead without being told that it may empty the repository or a
/// group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Every snapshot of the repository would be removed.
    Everything {
        /// How many there are.
        snapshots: usize,
    },
    /// The policy keeps none of a group's snapshots (a tag rule that none of them matches).
    Group(GroupKey),
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Everything { snapshots } => {
                write!(f, "this would remove every snapshot of the repository ({snapshots})")
            }
            Refusal::Group(key) => write!(f, "the policy keeps no snapshot of the group ({key})"),
        }
    }
}

/// What `forget` will do.
#[derive(Clone, Debug)]
pub struct Plan {
    /// Per group (in key order), what is kept and removed. Without a policy only the groups of
    /// snapshots named by ID appear, and nothing is listed as kept.
    pub groups: Vec<GroupDecision>,
    /// Snapshots in the repository.
    pub total: usize,
}

impl Plan {
    /// Decides for a repository's snapshots `all` (any order; `provenance` says who stored
    /// each). The snapshots `filter.ids` names (narrowed by its other filters) are removed
    /// whatever the policy says; the policy is applied, by group, to the other snapshots that
    /// pass the host, tag, path and token filters.
    pub fn new(
        policy: &Policy,
        all: Vec<(SnapshotId, Snapshot)>,
        provenance: &Provenance,
        filter: &SnapshotFilter,
        group_by: GroupBy,
        now: Timestamp,
    ) -> Result<Plan> {
        let total = all.len();
        let named = if filter.ids.is_empty() { Vec::new() } else { filter.choose(all.clone(), provenance)? };
        let named_ids: HashSet<SnapshotId> = named.iter().map(|(id, _)| *id).collect();
        let mut groups = if policy.is_empty() {
            Vec::new()
        } else {
            let others = SnapshotFilter { ids: Vec::new(), ..filter.clone() }.choose(all, provenance)?;
            let others: Vec<_> = others.into_iter().filter(|(id, _)| !named_ids.contains(id)).collect();
            apply(policy, &others, group_by, now)
        };
        for (id, snapshot) in named {
            let key = group_by.key(&snapshot);
            let removed = Removed { id, snapshot, named: true };
            match groups.iter_mut().find(|g| g.key == key) {
                Some(g) => g.remove.push(removed),
                None => groups.push(GroupDecision { key, keep: Vec::new(), remove: vec![removed] }),
            }
        }
        groups.sort_by(|a, b| a.key.cmp(&b.key));
        for g in &mut groups {
            g.remove.sort_by(|a, b| a.snapshot.time.cmp(&b.snapshot.time).then(a.id.cmp(&b.id)));
        }
        Ok(Plan { groups, total })
    }

    /// The snapshots to remove, group by group.
    pub fn removed(&self) -> Vec<SnapshotId> {
        self.groups.iter().flat_map(|g| g.remove.iter().map(|r| r.id)).collect()
    }

    /// How many snapshots the policy keeps.
    pub fn kept(&self) -> usize {
        self.groups.iter().map(|g| g.keep.len()).sum()
    }

    /// Why the plan should not be carried out unless the user insists: it removes every
    /// snapshot of the repository, or the policy keeps nothing of a group it judged.
    pub fn refusal(&self) -> Option<Refusal> {
        let removed: usize = self.groups.iter().map(|g| g.remove.len()).sum();
        if self.total > 0 && removed == self.total {
            return Some(Refusal::Everything { snapshots: self.total });
        }
        self.groups
            .iter()
            .find(|g| g.keep.is_empty() && g.remove.iter().any(|r| !r.named))
            .map(|g| Refusal::Group(g.key.clone()))
    }
}

/// Deletes the snapshot files of `ids`, several at once. A snapshot already gone is not an
/// error; the first failure is.
pub fn remove(repo: &Repository, ids: &[SnapshotId]) -> Result<()> {
    let threads = repo.storage().default_concurrency().max(1);
    map_parallel(ids, threads, |id| repo.storage().delete(&snapshot_path(id))).into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::platform::parse_local;
    use cairn_format::id::BlobId;
    use proptest::prelude::*;

    fn snap(time: Timestamp, host: &str, tags: &[&str]) -> Snapshot {
        Snapshot {
            time,
            tree: BlobId([0; 32]),
            paths: vec!["/home/user/work".into()],
            hostname: host.into(),
            username: "user".into(),
            uid: 1000,
            gid: 1000,
            tags: tags.iter().map(|t| t.to_string()).collect(),
            parent: None,
            program_version: "test".into(),
            summary: Default::default(),
            original: None,
        }
    }

    /// Snapshots of host `mopped` at these local times, with IDs 1, 2, 3, …
    fn at_times(times: &[&str]) -> Vec<(SnapshotId, Snapshot)> {
        times.iter().enumerate().map(|(i, t)| (id(i), snap(parse_local(t).unwrap(), "mopped", &[]))).collect()
    }

    fn id(i: usize) -> SnapshotId {
        let mut b = [0; 32];
        b[..8].copy_from_slice(&(i as u64 + 1).to_be_bytes());
        SnapshotId(b)
    }

    fn far_future() -> Timestamp {
        Timestamp { secs: 10_000_000_000, nanos: 0 }
    }

    /// The one group's kept snapshots' times (oldest first) with their reasons.
    fn kept(policy: &Policy, snaps: &[(SnapshotId, Snapshot)]) -> Vec<(String, String)> {
        let groups = apply(policy, snaps, GroupBy::default(), far_future());
        assert_eq!(groups.len(), 1, "{groups:?}");
        groups[0]
            .keep
            .iter()
            .map(|k| {
                let why: Vec<String> = k.reasons.iter().map(ToString::to_string).collect();
                (crate::engine::platform::format_local(k.snapshot.time), why.join(", "))
            })
            .collect()
    }

    fn assert_kept(policy: &Policy, snaps: &[(SnapshotId, Snapshot)], want: &[(&str, &str)]) {
        let want: Vec<(String, String)> = want.iter().map(|(t, why)| (t.to_string(), why.to_string())).collect();
        assert_eq!(kept(policy, snaps), want);
    }

    fn sundays() -> Vec<(SnapshotId, Snapshot)> {
        // restic's documentation: a backup every Sunday for 12 weeks.
        at_times(&[
            "2019-09-01 11:00:00",
            "2019-09-08 11:00:00",
            "2019-09-15 11:00:00",
            "2019-09-22 11:00:00",
            "2019-09-29 11:00:00",
            "2019-10-06 11:00:00",
            "2019-10-13 11:00:00",
            "2019-10-20 11:00:00",
            "2019-10-27 11:00:00",
            "2019-11-03 11:00:00",
            "2019-11-10 11:00:00",
            "2019-11-17 11:00:00",
        ])
    }

    #[test]
    fn keep_daily_4_of_12_sundays_keeps_the_last_four() {
        let policy = Policy { daily: Count::Of(4), ..Policy::default() };
        assert_kept(
            &policy,
            &sundays(),
            &[
                ("2019-10-27 11:00:00", "daily 4"),
                ("2019-11-03 11:00:00", "daily 3"),
                ("2019-11-10 11:00:00", "daily 2"),
                ("2019-11-17 11:00:00", "daily 1"),
            ],
        );
        let groups = apply(&policy, &sundays(), GroupBy::default(), far_future());
        assert_eq!(groups[0].remove.len(), 8);
        assert_eq!(groups[0].remove[0].snapshot.time, parse_local("2019-09-01 11:00:00").unwrap());
    }

    #[test]
    fn a_rule_with_count_left_keeps_the_oldest_snapshot_too() {
        // Two backups a day for three days; 5 daily periods asked for, 3 exist.
        let snaps = at_times(&[
            "2024-03-01 08:00:00",
            "2024-03-01 20:00:00",
            "2024-03-02 08:00:00",
            "2024-03-02 20:00:00",
            "2024-03-03 08:00:00",
            "2024-03-03 20:00:00",
        ]);
        assert_kept(
            &Policy { daily: Count::Of(5), ..Policy::default() },
            &snaps,
            &[
                ("2024-03-01 08:00:00", "oldest daily"),
                ("2024-03-01 20:00:00", "daily 3"),
                ("2024-03-02 20:00:00", "daily 2"),
                ("2024-03-03 20:00:00", "daily 1"),
            ],
        );
        // With the count used up, the oldest goes.
        let k = kept(&Policy { daily: Count::Of(3), ..Policy::default() }, &snaps);
        assert_eq!(k.len(), 3);
        // Unlimited never runs out.
        let k = kept(&Policy { daily: Count::All, ..Policy::default() }, &snaps);
        assert_eq!(k.len(), 4);
        assert_eq!(k[0].1, "oldest daily");
    }

    #[test]
    fn hourly_weekly_monthly_yearly_periods() {
        let snaps = at_times(&[
            "2023-12-31 23:30:00", // ISO week 52 of 2023, December, 2023
            "2024-01-01 00:10:00", // ISO week 1 of 2024 (a Monday)
            "2024-01-01 00:50:00",
            "2024-01-07 10:00:00", // Sunday: still week 1
            "2024-01-08 10:00:00", // week 2
            "2024-02-01 10:00:00",
        ]);
        let times = |p: Policy| kept(&p, &snaps).into_iter().map(|(t, _)| t).collect::<Vec<_>>();
        assert_eq!(
            times(Policy { hourly: Count::Of(3), ..Policy::default() }),
            ["2024-01-07 10:00:00", "2024-01-08 10:00:00", "2024-02-01 10:00:00"]
        );
        assert_eq!(
            times(Policy { weekly: Count::Of(3), ..Policy::default() }),
            ["2024-01-07 10:00:00", "2024-01-08 10:00:00", "2024-02-01 10:00:00"]
        );
        assert_eq!(
            times(Policy { weekly: Count::Of(4), ..Policy::default() }),
            ["2023-12-31 23:30:00", "2024-01-07 10:00:00", "2024-01-08 10:00:00", "2024-02-01 10:00:00"]
        );
        assert_eq!(
            times(Policy { monthly: Count::All, ..Policy::default() }),
            ["2023-12-31 23:30:00", "2024-01-08 10:00:00", "2024-02-01 10:00:00"]
        );
        assert_eq!(
            times(Policy { yearly: Count::Of(2), ..Policy::default() }),
            ["2023-12-31 23:30:00", "2024-02-01 10:00:00"]
        );
        assert_eq!(
            times(Policy { hourly: Count::All, ..Policy::default() }),
            [
                "2023-12-31 23:30:00",
                "2024-01-01 00:50:00",
                "2024-01-07 10:00:00",
                "2024-01-08 10:00:00",
                "2024-02-01 10:00:00"
            ]
        );
    }

    #[test]
    fn a_daily_backup_for_a_century() {
        // restic's documentation: daily backups for 100 years, then
        // --keep-daily 7 --keep-weekly 5 --keep-monthly 12 --keep-yearly 75.
        let start = parse_local("1925-01-01 12:00:00").unwrap().secs;
        let snaps: Vec<_> = (0..36_525)
            .map(|d| (id(d), snap(Timestamp { secs: start + d as i64 * 86_400, nanos: 0 }, "h", &[])))
            .collect();
        let policy = Policy {
            daily: Count::Of(7),
            weekly: Count::Of(5),
            monthly: Count::Of(12),
            yearly: Count::Of(75),
            ..Policy::default()
        };
        let groups = apply(&policy, &snaps, GroupBy::default(), far_future());
        let keep = &groups[0].keep;
        let rule =
            |name: &str| keep.iter().filter(|k| k.reasons.iter().any(|r| r.to_string().starts_with(name))).count();
        assert_eq!((rule("daily"), rule("weekly"), rule("monthly"), rule("yearly")), (7, 5, 12, 75));
        // The last day is Tuesday 2024-12-31. The 7 dailies (25–31 December) hold the newest of
        // two ISO weeks (Sunday the 29th; the 31st, in 2025-W01), the newest of December and of
        // 2024: 3 more weeklies, 11 more monthlies, 74 more yearlies (restic's documentation
        // says "11 or 12", "74 or 75" for this reason).
        assert_eq!(keep.len(), 7 + 3 + 11 + 74);
        assert_eq!(keep.len() + groups[0].remove.len(), snaps.len());
    }

    #[test]
    fn keep_within_counts_back_from_the_newest_snapshot() {
        // restic's documentation: 2y5m7d3h keeps what was made in the two years, five months,
        // seven days and three hours before the newest snapshot.
        let snaps = at_times(&[
            "2017-01-01 00:00:00",
            "2018-01-08 09:00:00", // exactly 2y5m7d3h before the newest: out
            "2018-01-08 09:00:01",
            "2020-06-15 12:00:00",
        ]);
        let policy = Policy { within: "2y5m7d3h".parse().unwrap(), ..Policy::default() };
        assert_kept(
            &policy,
            &snaps,
            &[("2018-01-08 09:00:01", "within 2y5m7d3h"), ("2020-06-15 12:00:00", "within 2y5m7d3h")],
        );
    }

    #[test]
    fn keep_within_ignores_snapshots_dated_in_the_future() {
        let snaps =
            at_times(&["2010-05-01 10:00:00", "2010-05-03 09:00:00", "2010-05-04 10:00:00", "2030-01-01 00:00:00"]);
        let policy = Policy { within: "2d".parse().unwrap(), ..Policy::default() };
        let now = parse_local("2026-01-01 00:00:00").unwrap();
        let groups = apply(&policy, &snaps, GroupBy::default(), now);
        let kept: Vec<String> =
            groups[0].keep.iter().map(|k| crate::engine::platform::format_local(k.snapshot.time)).collect();
        // The reference is 2010-05-04 10:00, not the 2030 snapshot, and not now.
        assert_eq!(kept, ["2010-05-03 09:00:00", "2010-05-04 10:00:00", "2030-01-01 00:00:00"]);
    }

    #[test]
    fn keep_within_periods_keeps_the_newest_of_each_period_in_the_span() {
        let snaps = at_times(&[
            "2024-03-01 08:00:00",
            "2024-03-04 08:00:00",
            "2024-03-04 20:00:00",
            "2024-03-05 08:00:00",
            "2024-03-05 20:00:00",
        ]);
        let policy = Policy { within_daily: "2d".parse().unwrap(), ..Policy::default() };
        assert_kept(
            &policy,
            &snaps,
            &[("2024-03-04 20:00:00", "daily within 2d"), ("2024-03-05 20:00:00", "daily within 2d")],
        );
    }

    #[test]
    fn month_spans_end_on_the_last_day_of_shorter_months() {
        let t = parse_local("2024-03-31 12:00:00").unwrap();
        let before = |s: &str| crate::engine::platform::format_local(s.parse::<Span>().unwrap().before(t).unwrap());
        assert_eq!(before("1m"), "2024-02-29 12:00:00");
        assert_eq!(before("1y1m"), "2023-02-28 12:00:00");
        assert_eq!(before("1d2h"), "2024-03-30 10:00:00");
        assert_eq!(before("0h"), "2024-03-31 12:00:00");
        assert_eq!("4294967295y".parse::<Span>().unwrap().before(t), None);
    }

    #[test]
    fn tag_rules_need_every_tag_of_a_list() {
        let t = |s: &str| parse_local(s).unwrap();
        let snaps = vec![
            (id(0), snap(t("2024-01-01 00:00:00"), "h", &["a"])),
            (id(1), snap(t("2024-01-02 00:00:00"), "h", &["a", "b"])),
            (id(2), snap(t("2024-01-03 00:00:00"), "h", &[])),
            (id(3), snap(t("2024-01-04 00:00:00"), "h", &["b"])),
        ];
        let ids = |tags: &[&str]| {
            let p = Policy { tags: tags.iter().map(|t| t.to_string()).collect(), ..Policy::default() };
            let g = apply(&p, &snaps, GroupBy::default(), far_future());
            g[0].keep.iter().map(|k| k.id).collect::<Vec<_>>()
        };
        assert_eq!(ids(&["a,b"]), [id(1)]);
        assert_eq!(ids(&["a", "b"]), [id(0), id(1), id(3)]);
        assert_eq!(ids(&[""]), [id(2)]);
        assert_eq!(ids(&["c"]), []);
    }

    #[test]
    fn groups_are_by_host_and_paths_unless_told_otherwise() {
        let t = |s: &str| parse_local(s).unwrap();
        let mut snaps = vec![
            (id(0), snap(t("2024-01-01 00:00:00"), "a", &["x"])),
            (id(1), snap(t("2024-01-02 00:00:00"), "a", &[])),
            (id(2), snap(t("2024-01-03 00:00:00"), "b", &["x"])),
            (id(3), snap(t("2024-01-04 00:00:00"), "b", &[])),
        ];
        snaps[3].1.paths = vec!["/other".into()];
        let last = Policy { last: Count::Of(1), ..Policy::default() };
        let kept_ids = |by: &str| {
            let groups = apply(&last, &snaps, by.parse().unwrap(), far_future());
            groups.iter().flat_map(|g| g.keep.iter().map(|k| k.id)).collect::<Vec<_>>()
        };
        assert_eq!(kept_ids("host,paths"), [id(1), id(2), id(3)]);
        assert_eq!(kept_ids("host"), [id(1), id(3)]);
        assert_eq!(kept_ids(""), [id(3)]);
        assert_eq!(kept_ids("tags"), [id(3), id(2)]);
        let groups = apply(&last, &snaps, "host,tags".parse().unwrap(), far_future());
        let keys: Vec<String> = groups.iter().map(|g| g.key.to_string()).collect();
        assert_eq!(keys, ["host a, no tags", "host a, tags x", "host b, no tags", "host b, tags x"]);
        let one = apply(&last, &snaps, "".parse().unwrap(), far_future());
        assert_eq!(one[0].key.to_string(), "all snapshots");
    }

    #[test]
    fn an_empty_policy_keeps_everything() {
        let groups = apply(&Policy::default(), &sundays(), GroupBy::default(), far_future());
        assert!(Policy::default().is_empty());
        assert_eq!(groups[0].keep.len(), 12);
        assert!(groups[0].keep.iter().all(|k| k.reasons == [Reason::NoPolicy]));
    }

    #[test]
    fn durations_counts_and_groupings_parse() {
        let span = |s: &str| s.parse::<Span>();
        assert_eq!(span("1y2m3d4h").unwrap(), Span { years: 1, months: 2, days: 3, hours: 4 });
        assert_eq!(span("4h1y").unwrap(), Span { years: 1, hours: 4, ..Span::default() });
        assert_eq!(span("2d").unwrap().to_string(), "2d");
        assert_eq!(span("1y2m3d4h").unwrap().to_string(), "1y2m3d4h");
        assert!(span("0d").unwrap().is_zero());
        for (bad, why) in [
            ("", "empty"),
            ("3", "3 has no unit"),
            ("d", "no number"),
            ("2w", "unknown unit 'w'"),
            ("1d2d", "d is given twice"),
            ("-1d", "no number"),
            ("99999999999d", "too large"),
            ("1.5d", "unknown unit '.'"),
        ] {
            let e = span(bad).unwrap_err().to_string();
            assert!(e.contains(why) && e.contains("1y2m3d4h") && !e.contains('\n'), "{bad}: {e}");
        }
        assert_eq!("-1".parse::<Count>().unwrap(), Count::All);
        assert_eq!("unlimited".parse::<Count>().unwrap(), Count::All);
        assert_eq!("7".parse::<Count>().unwrap(), Count::Of(7));
        assert!("-2".parse::<Count>().is_err() && "x".parse::<Count>().is_err());
        assert_eq!("host,paths".parse::<GroupBy>().unwrap(), GroupBy::default());
        assert_eq!("tags".parse::<GroupBy>().unwrap(), GroupBy { host: false, paths: false, tags: true });
        assert!("host,color".parse::<GroupBy>().unwrap_err().to_string().contains("\"color\""));
        let p = Policy {
            last: Count::Of(3),
            daily: Count::All,
            within: "2d".parse().unwrap(),
            within_weekly: "1m".parse().unwrap(),
            tags: vec!["a,b".into()],
            ..Policy::default()
        };
        assert_eq!(p.to_string(), "last 3, daily all, within 2d, weekly within 1m, tag a,b");
    }

    #[test]
    fn named_snapshots_go_whatever_the_policy() {
        let snaps = sundays();
        let named = SnapshotFilter { ids: vec![snaps[11].0.to_hex()], ..SnapshotFilter::default() };
        let policy = Policy { last: Count::Of(2), ..Policy::default() };
        let plan = Plan::new(&policy, snaps.clone(), &Provenance::NotServed, &named, GroupBy::default(), far_future())
            .unwrap();
        // The newest is named; the policy keeps the two newest of the rest.
        let kept: Vec<SnapshotId> = plan.groups[0].keep.iter().map(|k| k.id).collect();
        assert_eq!(kept, [snaps[9].0, snaps[10].0]);
        assert_eq!(plan.removed().len(), 10);
        assert!(plan.groups[0].remove.iter().filter(|r| r.named).map(|r| r.id).eq([snaps[11].0]));
        assert_eq!(plan.refusal(), None);
        // Without a policy only the named snapshot is decided.
        let plan = Plan::new(
            &Policy::default(),
            snaps.clone(),
            &Provenance::NotServed,
            &named,
            GroupBy::default(),
            far_future(),
        )
        .unwrap();
        assert_eq!(plan.removed(), [snaps[11].0]);
        assert_eq!(plan.kept(), 0);
        // An ID that matches nothing is an error.
        let none = SnapshotFilter { ids: vec!["ffff".into()], ..SnapshotFilter::default() };
        assert!(Plan::new(&policy, snaps, &Provenance::NotServed, &none, GroupBy::default(), far_future()).is_err());
    }

    #[test]
    fn removing_everything_or_a_whole_group_is_refused() {
        let snaps = sundays();
        let all =
            SnapshotFilter { ids: snaps.iter().map(|(id, _)| id.to_hex()).collect(), ..SnapshotFilter::default() };
        let plan = Plan::new(
            &Policy::default(),
            snaps.clone(),
            &Provenance::NotServed,
            &all,
            GroupBy::default(),
            far_future(),
        )
        .unwrap();
        assert_eq!(plan.refusal(), Some(Refusal::Everything { snapshots: 12 }));
        let tag = Policy { tags: vec!["prod".into()], ..Policy::default() };
        let plan = Plan::new(
            &tag,
            snaps.clone(),
            &Provenance::NotServed,
            &SnapshotFilter::default(),
            GroupBy::default(),
            far_future(),
        )
        .unwrap();
        assert_eq!(plan.refusal(), Some(Refusal::Everything { snapshots: 12 }));
        // A group emptied by the policy while other snapshots remain.
        let mut more = snaps;
        more.push((id(99), snap(parse_local("2019-01-01 00:00:00").unwrap(), "other", &["prod"])));
        let plan =
            Plan::new(&tag, more, &Provenance::NotServed, &SnapshotFilter::default(), GroupBy::default(), far_future())
                .unwrap();
        let refusal = plan.refusal().unwrap();
        assert!(matches!(&refusal, Refusal::Group(k) if k.host.as_deref() == Some("mopped")), "{refusal:?}");
        assert_eq!(
            refusal.to_string(),
            "the policy keeps no snapshot of the group (host mopped, paths /home/user/work)"
        );
    }

    // ---- properties --------------------------------------------------------------------------

    /// Up to 40 snapshots over three days, two months or three years (so that periods hold
    /// several snapshots, or one, or none), of two hosts, tagged with a subset of x and y.
    fn snapshots() -> impl Strategy<Value = Vec<(SnapshotId, Snapshot)>> {
        let range = prop_oneof![Just(3 * 86_400i64), Just(60 * 86_400), Just(3 * 365 * 86_400)];
        range
            .prop_flat_map(|range| {
                let one = (0..range, prop::bool::ANY, prop::bool::ANY, prop::bool::ANY);
                proptest::collection::vec(one, 0..40)
            })
            .prop_map(|v| {
                v.into_iter()
                    .enumerate()
                    .map(|(i, (offset, b, x, y))| {
                        let tags: Vec<&str> = [(x, "x"), (y, "y")].iter().filter(|t| t.0).map(|t| t.1).collect();
                        let time = Timestamp { secs: 1_500_000_000 + offset, nanos: 0 };
                        (id(i), snap(time, if b { "b" } else { "a" }, &tags))
                    })
                    .collect()
            })
    }

    fn count() -> impl Strategy<Value = Count> {
        prop_oneof![4 => (0u32..6).prop_map(Count::Of), 1 => Just(Count::All)]
    }

    fn span() -> impl Strategy<Value = Span> {
        prop_oneof![
            2 => Just(Span::default()),
            1 => (0u32..2, 0u32..4, 0u32..20, 0u32..30).prop_map(|(years, months, days, hours)| Span { years, months, days, hours }),
        ]
    }

    fn policy() -> impl Strategy<Value = Policy> {
        (
            proptest::array::uniform6(count()),
            proptest::array::uniform6(span()),
            proptest::collection::vec(prop_oneof![Just("x"), Just("y"), Just("x,y"), Just("")], 0..2),
        )
            .prop_map(|(c, s, tags)| Policy {
                last: c[0],
                hourly: c[1],
                daily: c[2],
                weekly: c[3],
                monthly: c[4],
                yearly: c[5],
                within: s[0],
                within_hourly: s[1],
                within_daily: s[2],
                within_weekly: s[3],
                within_monthly: s[4],
                within_yearly: s[5],
                tags: tags.into_iter().map(String::from).collect(),
            })
    }

    fn group_by() -> impl Strategy<Value = GroupBy> {
        (prop::bool::ANY, prop::bool::ANY, prop::bool::ANY).prop_map(|(host, paths, tags)| GroupBy {
            host,
            paths,
            tags,
        })
    }

    fn kept_ids(groups: &[GroupDecision]) -> HashSet<SnapshotId> {
        groups.iter().flat_map(|g| g.keep.iter().map(|k| k.id)).collect()
    }

    /// Whether the rule `reason` stands for is on in `p`.
    fn rule_is_on(p: &Policy, reason: &Reason) -> bool {
        let count = |cal: &Calendar| p.counts().iter().find(|(c, _)| c == cal).unwrap().1;
        match reason {
            Reason::Last(n) => p.last.allows(n - 1),
            Reason::Period(cal, n) => count(cal).allows(n - 1),
            Reason::Oldest(cal) => count(cal).is_on(),
            Reason::Within(s) => *s == p.within && !s.is_zero(),
            Reason::PeriodWithin(cal, s) => p.withins().iter().any(|(c, w)| c == cal && w == s && !s.is_zero()),
            Reason::Tag(t) => p.tags.contains(t),
            Reason::NoPolicy => p.is_empty(),
        }
    }

    proptest! {
        #[test]
        fn every_snapshot_is_kept_with_a_reason_of_the_policy_or_removed(
            snaps in snapshots(), p in policy(), by in group_by()
        ) {
            let groups = apply(&p, &snaps, by, far_future());
            let mut seen: Vec<SnapshotId> = Vec::new();
            for g in &groups {
                for k in &g.keep {
                    prop_assert!(!k.reasons.is_empty());
                    for r in &k.reasons {
                        prop_assert!(rule_is_on(&p, r), "{r} is not a rule of {p}");
                    }
                    prop_assert_eq!(&by.key(&k.snapshot), &g.key);
                }
                for r in &g.remove {
                    prop_assert_eq!(&by.key(&r.snapshot), &g.key);
                }
                seen.extend(g.keep.iter().map(|k| k.id).chain(g.remove.iter().map(|r| r.id)));
            }
            seen.sort();
            let mut all: Vec<SnapshotId> = snaps.iter().map(|(id, _)| *id).collect();
            all.sort();
            prop_assert_eq!(seen, all);
        }

        #[test]
        fn keep_daily_keeps_the_newest_of_each_of_the_last_n_days(snaps in snapshots(), n in 1u32..8) {
            let p = Policy { daily: Count::Of(n), ..Policy::default() };
            let groups = apply(&p, &snaps, GroupBy::default(), far_future());
            let kept = kept_ids(&groups);
            for g in &groups {
                // Independently: each day's newest snapshot, by day, newest day first.
                let mut newest_of_day: BTreeMap<chrono::NaiveDate, (Timestamp, SnapshotId)> = BTreeMap::new();
                let members = snaps.iter().filter(|(_, s)| GroupBy::default().key(s) == g.key);
                for (id, s) in members {
                    let day = chrono::Local.timestamp_opt(s.time.secs, 0).unwrap().date_naive();
                    let e = newest_of_day.entry(day).or_insert((s.time, *id));
                    *e = (*e).max((s.time, *id));
                }
                let days = newest_of_day.len();
                for (_, (_, id)) in newest_of_day.iter().rev().take(n as usize) {
                    prop_assert!(kept.contains(id));
                }
                // With fewer than N days, the group's oldest snapshot is kept too.
                let oldest_day = *newest_of_day.keys().next().unwrap();
                let oldest = snaps.iter().filter(|(_, s)| GroupBy::default().key(s) == g.key)
                    .map(|(id, s)| (s.time, *id)).min().unwrap();
                let extra = days < n as usize && newest_of_day[&oldest_day] != oldest;
                prop_assert_eq!(g.keep.len(), days.min(n as usize) + usize::from(extra));
                if days < n as usize {
                    prop_assert!(kept.contains(&oldest.1));
                }
            }
        }

        #[test]
        fn keep_last_keeps_exactly_the_n_newest(snaps in snapshots(), n in 1u32..10, by in group_by()) {
            let p = Policy { last: Count::Of(n), ..Policy::default() };
            for g in apply(&p, &snaps, by, far_future()) {
                let mut members: Vec<(Timestamp, SnapshotId)> = g.keep.iter().map(|k| (k.snapshot.time, k.id))
                    .chain(g.remove.iter().map(|r| (r.snapshot.time, r.id))).collect();
                members.sort();
                let newest: Vec<SnapshotId> = members.iter().rev().take(n as usize).rev().map(|m| m.1).collect();
                let kept: Vec<SnapshotId> = g.keep.iter().map(|k| k.id).collect();
                prop_assert_eq!(kept, newest);
            }
        }

        #[test]
        fn the_newest_snapshot_of_each_group_is_kept(snaps in snapshots(), p in policy(), by in group_by()) {
            prop_assume!(!p.is_empty() && p.tags.is_empty());
            for g in apply(&p, &snaps, by, far_future()) {
                let newest = g.keep.iter().map(|k| (k.snapshot.time, k.id))
                    .chain(g.remove.iter().map(|r| (r.snapshot.time, r.id))).max().unwrap();
                prop_assert!(g.keep.iter().any(|k| k.id == newest.1));
            }
        }

        #[test]
        fn several_rules_keep_the_union_of_what_each_keeps(
            snaps in snapshots(), p in policy(), split in proptest::array::uniform13(prop::bool::ANY), by in group_by()
        ) {
            // Each rule of `p` goes to `a` or `b`.
            let mut ab = [Policy::default(), Policy::default()];
            let at = |i: usize| usize::from(split[i]);
            ab[at(0)].last = p.last;
            ab[at(1)].hourly = p.hourly;
            ab[at(2)].daily = p.daily;
            ab[at(3)].weekly = p.weekly;
            ab[at(4)].monthly = p.monthly;
            ab[at(5)].yearly = p.yearly;
            ab[at(6)].within = p.within;
            ab[at(7)].within_hourly = p.within_hourly;
            ab[at(8)].within_daily = p.within_daily;
            ab[at(9)].within_weekly = p.within_weekly;
            ab[at(10)].within_monthly = p.within_monthly;
            ab[at(11)].within_yearly = p.within_yearly;
            ab[at(12)].tags = p.tags.clone();
            let [a, b] = ab;
            prop_assume!(!a.is_empty() && !b.is_empty());
            let both = kept_ids(&apply(&p, &snaps, by, far_future()));
            let union: HashSet<SnapshotId> = kept_ids(&apply(&a, &snaps, by, far_future()))
                .union(&kept_ids(&apply(&b, &snaps, by, far_future()))).copied().collect();
            prop_assert_eq!(both, union);
        }

        #[test]
        fn named_snapshots_are_removed_and_the_rest_judged_by_the_policy(
            snaps in snapshots(), p in policy(), pick in proptest::collection::vec(any::<prop::sample::Index>(), 1..4)
        ) {
            prop_assume!(!snaps.is_empty());
            let named: HashSet<SnapshotId> = pick.iter().map(|i| snaps[i.index(snaps.len())].0).collect();
            let filter = SnapshotFilter { ids: named.iter().map(|id| id.to_hex()).collect(), ..SnapshotFilter::default() };
            let plan = Plan::new(&p, snaps.clone(), &Provenance::NotServed, &filter, GroupBy::default(), far_future()).unwrap();
            let removed: HashSet<SnapshotId> = plan.removed().into_iter().collect();
            prop_assert!(named.is_subset(&removed));
            prop_assert!(kept_ids(&plan.groups).is_disjoint(&named));
            if !p.is_empty() {
                let others: Vec<_> = snaps.iter().filter(|(id, _)| !named.contains(id)).cloned().collect();
                prop_assert_eq!(kept_ids(&plan.groups), kept_ids(&apply(&p, &others, GroupBy::default(), far_future())));
                prop_assert_eq!(removed.len() + plan.kept(), snaps.len());
            } else {
                prop_assert_eq!(removed, named);
            }
        }
    }
}
