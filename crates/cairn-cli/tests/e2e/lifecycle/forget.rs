//! `cairn forget` and `cairn tag` end to end: real repositories made by the real binary, with
//! snapshot times set by `backup --time`, so what each policy keeps is known in advance. What
//! the tests expect is written down from the calendar (which day, which ISO week), never read
//! back from `forget`; and every removal is checked against the repository's `snapshots/`
//! directory and `cairn snapshots`, and followed by a clean `cairn check`.

use crate::support;
use crate::support::library;

use std::collections::{BTreeMap, BTreeSet};
use std::fs;

use crate::support::library::platform::parse_local;
use serde_json::Value;
use support::{last_json, stderr, Fixture, Tree, PASSWORD};

impl Fixture {
    /// A repository (a cache of its own) and a source of two small files.
    fn for_forget() -> Fixture {
        let fx = Fixture::new().isolated_cache().init(&[]);
        Tree::new(&fx.src, 0).file("a.txt", b"first file\n").file("sub/b.bin", vec![7u8; 100_000]);
        fx
    }

    /// Backs up the source as of local `time` with `extra` options; returns the snapshot ID.
    fn backup_at(&self, time: &str, extra: &[&str]) -> String {
        let mut args = vec!["--time", time];
        args.extend(extra);
        let summary = self.cairn.backup(&[&self.src], &args);
        summary["snapshot_id"].as_str().unwrap().to_string()
    }

    /// The snapshots by full ID, as `cairn snapshots --json` lists them.
    fn snapshots_by_id(&self) -> BTreeMap<String, Value> {
        self.cairn.snapshots().into_iter().map(|s| (s["id"].as_str().unwrap().to_string(), s)).collect()
    }

    /// The files in the repository's `snapshots/` directory.
    fn snapshot_files(&self) -> BTreeSet<String> {
        fs::read_dir(self.cairn.repo.join("snapshots"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect()
    }

    /// `cairn --json forget ARGS`, which must succeed; the groups it printed.
    fn forget_json(&self, args: &[&str]) -> Vec<Value> {
        let mut full = vec!["--json", "forget"];
        full.extend(args);
        match last_json(&self.cairn.ok(full)) {
            Value::Array(groups) => groups,
            other => panic!("forget --json printed {other}"),
        }
    }

    /// `cairn check` must find nothing wrong.
    fn assert_check_clean(&self) {
        let out = self.cairn.run(["--json", "check"]);
        let summary = last_json(&String::from_utf8_lossy(&out.stdout));
        assert!(out.status.success(), "check failed: {summary}\n{}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(summary["findings"].as_array().map(Vec::len), Some(0), "{summary}");
    }
}

/// Unix seconds of a local time.
fn secs(local: &str) -> i64 {
    parse_local(local).unwrap().secs
}

/// Per group (by host): the local times of the kept snapshots with their reasons, and the
/// times of the removed ones.
type Decided = BTreeMap<String, (Vec<(i64, Vec<String>)>, Vec<i64>)>;

fn by_host(groups: &[Value]) -> Decided {
    groups
        .iter()
        .map(|g| {
            let host = g["group"]["host"].as_str().unwrap().to_string();
            let keep = g["keep"]
                .as_array()
                .unwrap()
                .iter()
                .map(|k| {
                    let why = k["reasons"].as_array().unwrap().iter().map(|r| r.as_str().unwrap().to_string());
                    (k["time"].as_i64().unwrap(), why.collect())
                })
                .collect();
            let remove = g["remove"].as_array().unwrap().iter().map(|r| r["time"].as_i64().unwrap()).collect();
            (host, (keep, remove))
        })
        .collect()
}

/// `(local time, reasons)` pairs as [`by_host`] gives them.
fn kept(list: &[(&str, &str)]) -> Vec<(i64, Vec<String>)> {
    list.iter().map(|(t, why)| (secs(t), why.split("; ").map(String::from).collect())).collect()
}

fn times(list: &[&str]) -> Vec<i64> {
    list.iter().map(|t| secs(t)).collect()
}

/// Host `a`: twice on Friday 1 March 2024, Saturday 2 March, Monday 4 March (ISO week 10),
/// Monday 11 March (week 11). Host `b`: Saturday 2 and Sunday 3 March (both week 9).
fn two_hosts() -> (Fixture, BTreeMap<&'static str, String>) {
    let fx = Fixture::for_forget();
    let mut ids = BTreeMap::new();
    for (host, time) in [
        ("a", "2024-03-01 08:00:00"),
        ("a", "2024-03-01 20:00:00"),
        ("a", "2024-03-02 09:00:00"),
        ("a", "2024-03-04 10:00:00"),
        ("a", "2024-03-11 10:00:00"),
        ("b", "2024-03-02 12:00:00"),
        ("b", "2024-03-03 12:00:00"),
    ] {
        ids.insert(time, fx.backup_at(time, &["--host", host]));
    }
    (fx, ids)
}

#[test]
fn policies_apply_to_each_host_group() {
    let (fx, _) = two_hosts();
    let before = fx.snapshot_files();
    assert_eq!(before.len(), 7);

    let got = by_host(&fx.forget_json(&["--keep-last", "2", "--dry-run"]));
    assert_eq!(got["a"].0, kept(&[("2024-03-04 10:00:00", "last 2"), ("2024-03-11 10:00:00", "last 1")]));
    assert_eq!(got["a"].1, times(&["2024-03-01 08:00:00", "2024-03-01 20:00:00", "2024-03-02 09:00:00"]));
    assert_eq!(got["b"].0, kept(&[("2024-03-02 12:00:00", "last 2"), ("2024-03-03 12:00:00", "last 1")]));
    assert!(got["b"].1.is_empty());

    // Two days with snapshots per host: a's newest two days are 11 and 4 March.
    let got = by_host(&fx.forget_json(&["--keep-daily", "2", "--dry-run"]));
    assert_eq!(got["a"].0, kept(&[("2024-03-04 10:00:00", "daily 2"), ("2024-03-11 10:00:00", "daily 1")]));
    assert_eq!(got["b"].0, kept(&[("2024-03-02 12:00:00", "daily 2"), ("2024-03-03 12:00:00", "daily 1")]));

    // Three days asked of a: 11, 4 and 2 March; 1 March (two snapshots) goes.
    let got = by_host(&fx.forget_json(&["--keep-daily", "3", "--dry-run"]));
    assert_eq!(got["a"].1, times(&["2024-03-01 08:00:00", "2024-03-01 20:00:00"]));

    // Weeks: a has weeks 11, 10 and 9; b only week 9, so with a week left over b also keeps
    // its oldest snapshot (restic's "oldest" rule).
    let got = by_host(&fx.forget_json(&["--keep-weekly", "2", "--dry-run"]));
    assert_eq!(got["a"].0, kept(&[("2024-03-04 10:00:00", "weekly 2"), ("2024-03-11 10:00:00", "weekly 1")]));
    assert_eq!(got["b"].0, kept(&[("2024-03-02 12:00:00", "oldest weekly"), ("2024-03-03 12:00:00", "weekly 1")]));

    // Within 2 days of each group's newest (not of now): a keeps only 11 March, b both.
    let got = by_host(&fx.forget_json(&["--keep-within", "2d", "--dry-run"]));
    assert_eq!(got["a"].0, kept(&[("2024-03-11 10:00:00", "within 2d")]));
    assert_eq!(got["b"].0, kept(&[("2024-03-02 12:00:00", "within 2d"), ("2024-03-03 12:00:00", "within 2d")]));
    // 10d reaches back to 1 March 10:00 from a's newest: the 08:00 snapshot is out.
    let got = by_host(&fx.forget_json(&["--keep-within", "10d", "--dry-run"]));
    assert_eq!(got["a"].1, times(&["2024-03-01 08:00:00"]));

    // Rules add up, and a snapshot kept by several says so.
    let got = by_host(&fx.forget_json(&["--keep-last", "1", "--keep-weekly", "2", "--dry-run"]));
    assert_eq!(got["a"].0, kept(&[("2024-03-04 10:00:00", "weekly 2"), ("2024-03-11 10:00:00", "last 1; weekly 1")]));
    assert_eq!(fx.snapshot_files(), before, "a dry run removed something");

    // For real: the removed snapshot files are gone, the kept ones untouched.
    let got = by_host(&fx.forget_json(&["--keep-daily", "2"]));
    let kept_times: BTreeSet<i64> = got.values().flat_map(|(k, _)| k.iter().map(|(t, _)| *t)).collect();
    let left = fx.snapshots_by_id();
    let left_times: BTreeSet<i64> = left.values().map(|s| s["time"].as_i64().unwrap()).collect();
    assert_eq!(left_times, kept_times);
    assert_eq!(fx.snapshot_files(), left.keys().cloned().collect());
    assert_eq!(left.len(), 4);
    fx.assert_check_clean();
}

#[test]
fn group_by_chooses_the_groups() {
    let (fx, _) = two_hosts();
    // One group of all: the newest overall is a's.
    let groups = fx.forget_json(&["--keep-last", "1", "--group-by", "", "--dry-run"]);
    assert_eq!(groups.len(), 1);
    assert_eq!(groups[0]["group"], serde_json::json!({"host": null, "paths": null, "tags": null}));
    assert_eq!(groups[0]["keep"][0]["time"].as_i64(), Some(secs("2024-03-11 10:00:00")));
    assert_eq!(groups[0]["remove"].as_array().unwrap().len(), 6);
    // By paths only: one group too (every backup is of the same directory).
    let groups = fx.forget_json(&["--keep-last", "1", "--group-by", "paths", "--dry-run"]);
    let src = fx.src.to_str().unwrap();
    assert_eq!(groups[0]["group"], serde_json::json!({"host": null, "paths": [src], "tags": null}));
    assert_eq!(groups.len(), 1);
}

#[test]
fn json_lists_groups_with_kept_and_removed_snapshots() {
    let (fx, ids) = two_hosts();
    let groups = fx.forget_json(&["--keep-last", "1", "--dry-run"]);
    assert_eq!(groups.len(), 2);
    let src = fx.src.to_str().unwrap();
    for (g, host) in groups.iter().zip(["a", "b"]) {
        let keys: BTreeSet<&str> = g.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(keys, BTreeSet::from(["group", "keep", "remove"]), "{g}");
        assert_eq!(g["group"], serde_json::json!({"host": host, "paths": [src], "tags": null}));
        for (list, fields) in
            [("keep", vec!["id", "reasons", "short_id", "time"]), ("remove", vec!["id", "short_id", "time"])]
        {
            for s in g[list].as_array().unwrap() {
                let keys: BTreeSet<&str> = s.as_object().unwrap().keys().map(String::as_str).collect();
                assert_eq!(keys, fields.iter().copied().collect(), "{s}");
                let id = s["id"].as_str().unwrap();
                assert!(id.len() == 64 && id.starts_with(s["short_id"].as_str().unwrap()), "{s}");
                assert!(ids.values().any(|i| i == id), "{id} is not a snapshot");
            }
        }
    }
    assert_eq!(groups[0]["keep"][0]["id"].as_str(), Some(ids["2024-03-11 10:00:00"].as_str()));
    assert_eq!(groups[0]["keep"][0]["reasons"], serde_json::json!(["last 1"]));
    assert_eq!(groups[1]["keep"][0]["id"].as_str(), Some(ids["2024-03-03 12:00:00"].as_str()));
}

#[test]
fn text_output_shows_groups_reasons_and_a_summary() {
    let (fx, ids) = two_hosts();
    let text = fx.cairn.ok(["forget", "--keep-last", "1", "--dry-run"]);
    let src = fx.src.to_str().unwrap();
    assert!(text.contains(&format!("host a, paths {src}:")), "{text}");
    assert!(text.contains(&format!("host b, paths {src}:")), "{text}");
    assert!(text.contains("keep 1 snapshot:") && text.contains("remove 4 snapshots:"), "{text}");
    let newest = text.lines().find(|l| l.contains(&ids["2024-03-11 10:00:00"][..8])).unwrap();
    assert!(newest.contains("2024-03-11 10:00:00") && newest.contains("last 1"), "{newest}");
    assert_eq!(text.lines().last(), Some("would remove 5 snapshots, keep 2 (dry run: nothing was removed)"));
    assert_eq!(fx.snapshot_files().len(), 7);

    let text = fx.cairn.ok(["forget", "--keep-last", "1"]);
    assert_eq!(text.lines().last(), Some("removed 5 snapshots, kept 2"));
    assert_eq!(fx.snapshot_files().len(), 2);
}

#[test]
fn named_snapshots_are_removed_whatever_the_policy() {
    let (fx, ids) = two_hosts();
    // By ID prefix alone: that snapshot goes, nothing else.
    let gone = &ids["2024-03-02 09:00:00"];
    let text = fx.cairn.ok(["forget", &gone[..10]]);
    assert_eq!(text.lines().last(), Some("removed 1 snapshot"));
    assert!(!fx.snapshots_by_id().contains_key(gone));
    assert_eq!(fx.snapshot_files().len(), 6);

    // A named snapshot goes even though the policy would keep it; the policy judges the rest.
    let newest = &ids["2024-03-11 10:00:00"];
    let got = by_host(&fx.forget_json(&[newest, "--keep-last", "1", "--host", "a"]));
    assert_eq!(got.keys().collect::<Vec<_>>(), ["a"], "--host a leaves b out");
    assert_eq!(got["a"].0, kept(&[("2024-03-04 10:00:00", "last 1")]));
    assert_eq!(got["a"].1, times(&["2024-03-01 08:00:00", "2024-03-01 20:00:00", "2024-03-11 10:00:00"]));
    let left: BTreeSet<i64> = fx.snapshots_by_id().values().map(|s| s["time"].as_i64().unwrap()).collect();
    assert_eq!(
        left,
        times(&["2024-03-02 12:00:00", "2024-03-03 12:00:00", "2024-03-04 10:00:00"]).into_iter().collect()
    );

    // An ID that matches nothing is an error and removes nothing.
    let before = fx.snapshot_files();
    let out = fx.cairn.run(["forget", "0000000000", "--keep-last", "1"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("no snapshot matches \"0000000000\""), "{}", stderr(&out));
    assert_eq!(fx.snapshot_files(), before);
    fx.assert_check_clean();
}

#[test]
fn filters_narrow_what_the_policy_sees() {
    let fx = Fixture::for_forget();
    let old_x = fx.backup_at("2024-05-01 10:00:00", &["--tag", "x"]);
    let new_x = fx.backup_at("2024-05-02 10:00:00", &["--tag", "x"]);
    let old_y = fx.backup_at("2024-05-03 10:00:00", &["--tag", "y"]);
    let new_y = fx.backup_at("2024-05-04 10:00:00", &["--tag", "y"]);
    let old_b = fx.backup_at("2024-05-05 10:00:00", &["--host", "b"]);
    let new_b = fx.backup_at("2024-05-06 10:00:00", &["--host", "b"]);
    // The x and y snapshots share host and paths, so one group; --tag x judges only x.
    let groups = fx.forget_json(&["--tag", "x", "--keep-last", "1"]);
    assert_eq!(groups.len(), 1);
    let left: BTreeSet<String> = fx.snapshots_by_id().into_keys().collect();
    assert_eq!(left, BTreeSet::from([new_x.clone(), old_y.clone(), new_y.clone(), old_b.clone(), new_b.clone()]));
    assert!(!left.contains(&old_x));
    // --host b judges only b.
    fx.forget_json(&["--host", "b", "--keep-last", "1"]);
    let left: BTreeSet<String> = fx.snapshots_by_id().into_keys().collect();
    assert_eq!(left, BTreeSet::from([new_x.clone(), old_y.clone(), new_y.clone(), new_b.clone()]));
    // --path with a path no snapshot has: nothing to judge, nothing removed.
    let groups = fx.forget_json(&["--path", "/nowhere", "--keep-last", "1"]);
    assert!(groups.is_empty());
    assert_eq!(fx.snapshot_files().len(), 4);
    // Grouped by tags: --keep-tag y keeps both y snapshots, --keep-last 1 the newest of each
    // group (b's untagged one, new_x, new_y).
    let groups = fx.forget_json(&["--keep-tag", "y", "--keep-last", "1", "--group-by", "tags", "--dry-run"]);
    let reasons = |g: &Value| -> Vec<(String, Value)> {
        g["keep"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| (k["id"].as_str().unwrap().to_string(), k["reasons"].clone()))
            .collect()
    };
    let tags: Vec<&Value> = groups.iter().map(|g| &g["group"]["tags"]).collect();
    assert_eq!(tags, [&serde_json::json!([]), &serde_json::json!(["x"]), &serde_json::json!(["y"])]);
    assert_eq!(reasons(&groups[0]), [(new_b, serde_json::json!(["last 1"]))]);
    assert_eq!(reasons(&groups[1]), [(new_x, serde_json::json!(["last 1"]))]);
    assert_eq!(
        reasons(&groups[2]),
        [(old_y, serde_json::json!(["tag y"])), (new_y, serde_json::json!(["tag y", "last 1"]))]
    );
    assert_eq!(fx.snapshot_files().len(), 4);
    fx.assert_check_clean();
}

#[test]
fn removing_everything_is_refused_unless_allowed() {
    let (fx, ids) = two_hosts();
    let before = fx.snapshot_files();
    let forget_all = |extra: &[&str]| {
        let mut args = vec!["forget"];
        args.extend(ids.values().map(String::as_str));
        args.extend(extra);
        fx.cairn.run(&args)
    };
    let out = forget_all(&[]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let err = stderr(&out);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("every snapshot of the repository (7)") && err.contains("--allow-remove-all"), "{err}");
    assert_eq!(fx.snapshot_files(), before);
    let out = forget_all(&["--allow-remove-all", "--dry-run"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(fx.snapshot_files(), before);

    // A tag rule that no snapshot matches would empty every group: refused too.
    let out = fx.cairn.run(["forget", "--keep-tag", "nothing-has-this"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("--allow-remove-all"), "{}", stderr(&out));
    assert_eq!(fx.snapshot_files(), before);

    // Emptying one group (host b) while a keeps snapshots is refused as well.
    fx.cairn.ok(["tag", "--add", "keep", "--host", "a"]);
    let out = fx.cairn.run(["forget", "--keep-tag", "keep"]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(err.contains("keeps no snapshot of the group (host b,") && err.lines().count() == 1, "{err}");
    assert_eq!(fx.snapshot_files().len(), 7);

    let now: Vec<String> = fx.snapshots_by_id().into_keys().collect();
    let mut args = vec!["forget", "--allow-remove-all"];
    args.extend(now.iter().map(String::as_str));
    let text = fx.cairn.ok(&args);
    assert_eq!(text.lines().last(), Some("removed 7 snapshots"));
    assert!(fx.snapshot_files().is_empty());
    fx.assert_check_clean();
}

#[test]
fn invalid_arguments_exit_2_with_one_line() {
    let (fx, _) = two_hosts();
    let before = fx.snapshot_files();
    for (args, says) in [
        (vec!["forget"], "no policy and no snapshot IDs given"),
        (vec!["forget", "--keep-within", "2w"], "unknown unit 'w'"),
        (vec!["forget", "--keep-within", "3"], "3 has no unit"),
        (vec!["forget", "--keep-within-daily", "1d1d"], "d is given twice"),
        (vec!["forget", "--keep-daily", "x"], "invalid count \"x\""),
        (vec!["forget", "--keep-last", "-2"], "invalid count \"-2\""),
        (vec!["forget", "--keep-last", "1", "--group-by", "color"], "cannot group by \"color\""),
        (vec!["tag"], "required"),
        (vec!["tag", "--set", "a", "--add", "b"], "cannot be used with"),
        (vec!["backup", "--time", "yesterday", "."], "use YYYY-MM-DD HH:MM:SS"),
    ] {
        let out = fx.cairn.run(&args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.lines().next().is_some_and(|l| l.contains(says)), "{args:?}: {err}");
    }
    // Zero counts and spans are no policy at all.
    let out = fx.cairn.run(["forget", "--keep-last", "0", "--keep-within", "0d"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    // A tag both added and removed.
    let out = fx.cairn.run(["tag", "--add", "a", "--remove", "a"]);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(stderr(&out).lines().count(), 1, "{}", stderr(&out));
    assert_eq!(fx.snapshot_files(), before);
}

#[test]
fn unlimited_counts_keep_every_period() {
    let (fx, _) = two_hosts();
    for count in ["-1", "unlimited"] {
        let got = by_host(&fx.forget_json(&["--keep-daily", count, "--dry-run"]));
        // a: 1 March has two snapshots, the earlier one is the oldest of the group.
        assert_eq!(
            got["a"].0,
            kept(&[
                ("2024-03-01 08:00:00", "oldest daily"),
                ("2024-03-01 20:00:00", "daily 4"),
                ("2024-03-02 09:00:00", "daily 3"),
                ("2024-03-04 10:00:00", "daily 2"),
                ("2024-03-11 10:00:00", "daily 1"),
            ])
        );
    }
}

#[test]
fn tags_are_added_removed_and_set_and_snapshots_stay_whole() {
    let fx = Fixture::for_forget();
    let first = fx.backup_at("2024-06-01 10:00:00", &["--tag", "daily"]);
    fs::write(fx.src.join("a.txt"), b"second version\n").unwrap();
    let second = fx.backup_at("2024-06-02 10:00:00", &["--tag", "daily"]);
    let before = fx.snapshots_by_id();

    // --add on one snapshot: a new snapshot file replaces the old one.
    let out = last_json(&fx.cairn.ok(["--json", "tag", &second[..8], "--add", "keep,prod"]));
    assert_eq!(out["modified"], 1, "{out}");
    let new_id = out["snapshots"][0]["new"].as_str().unwrap().to_string();
    assert_eq!(out["snapshots"][0]["old"].as_str(), Some(second.as_str()));
    assert_eq!(out["snapshots"][0]["tags"], serde_json::json!(["daily", "keep", "prod"]));
    let after = fx.snapshots_by_id();
    assert_eq!(after.keys().cloned().collect::<BTreeSet<_>>(), BTreeSet::from([first.clone(), new_id.clone()]));
    assert_eq!(fx.snapshot_files(), after.keys().cloned().collect());
    // Everything but the tags is as it was.
    let (old, new) = (&before[&second], &after[&new_id]);
    for field in ["time", "time_nanos", "hostname", "username", "paths", "tree"] {
        assert_eq!(old[field], new[field], "{field} changed");
    }
    assert_eq!(after[&first], before[&first]);

    // The retagged snapshot restores what was backed up.
    let target = fx.base.join("restored");
    fx.cairn.restore(&new_id[..12], &target);
    let restored = support::restored_path(&target, &fx.src);
    assert_eq!(fs::read(restored.join("a.txt")).unwrap(), b"second version\n");
    assert_eq!(fs::read(restored.join("sub/b.bin")).unwrap(), vec![7u8; 100_000]);

    // --remove on all snapshots: only those that had the tag change.
    let text = fx.cairn.ok(["tag", "--remove", "prod"]);
    assert_eq!(text.lines().last(), Some("modified 1 snapshot"));
    let tags: BTreeSet<Vec<String>> = fx.snapshots_by_id().values().map(tag_list).collect();
    assert_eq!(tags, BTreeSet::from([v(&["daily"]), v(&["daily", "keep"])]));

    // A change that changes nothing rewrites nothing.
    let files = fx.snapshot_files();
    let text = fx.cairn.ok(["tag", "--add", "daily"]);
    assert_eq!(text.lines().last(), Some("modified 0 snapshots"));
    assert_eq!(fx.snapshot_files(), files);

    // --set replaces, on the snapshots the filters choose; '' removes every tag.
    let out = last_json(&fx.cairn.ok(["--json", "tag", "--tag", "keep", "--set", "weekly"]));
    assert_eq!(out["modified"], 1);
    let out = last_json(&fx.cairn.ok(["--json", "tag", "--tag", "weekly", "--set", ""]));
    assert_eq!(out["modified"], 1);
    let tags: BTreeSet<Vec<String>> = fx.snapshots_by_id().values().map(tag_list).collect();
    assert_eq!(tags, BTreeSet::from([v(&["daily"]), v(&[])]));
    assert_eq!(fx.snapshots_by_id().len(), 2);
    assert!(fx.cairn.ok(["ls", "latest"]).contains("a.txt"));
    fx.assert_check_clean();
}

fn tag_list(s: &Value) -> Vec<String> {
    s["tags"].as_array().unwrap().iter().map(|t| t.as_str().unwrap().to_string()).collect()
}

fn v(tags: &[&str]) -> Vec<String> {
    tags.iter().map(|t| t.to_string()).collect()
}

#[test]
fn backup_time_is_recorded_and_restores_as_usual() {
    let fx = Fixture::for_forget();
    let id = fx.backup_at("2001-02-03 04:05:06", &[]);
    let snaps = fx.snapshots_by_id();
    assert_eq!(snaps[&id]["time"].as_i64(), Some(secs("2001-02-03 04:05:06")));
    assert_eq!(snaps[&id]["time_nanos"].as_i64(), Some(0));
    let text = fx.cairn.ok(["snapshots"]);
    assert!(text.contains("2001-02-03 04:05:06"), "{text}");
    let target = fx.base.join("r");
    fx.cairn.restore(&id[..8], &target);
    assert_eq!(fs::read(support::restored_path(&target, &fx.src).join("a.txt")).unwrap(), b"first file\n");
    // Without --time the snapshot is dated now, after the 2001 one: it is `latest`.
    let now = fx.cairn.backup(&[&fx.src], &[])["snapshot_id"].as_str().unwrap().to_string();
    assert_eq!(fx.cairn.snapshots().last().unwrap()["id"].as_str(), Some(now.as_str()));
}

/// A local storage that lists one snapshot more than it holds, as a listing taken just before
/// `forget` or `tag` removed that snapshot would.
struct ListsARemovedSnapshot(library::storage::OpendalStorage);

impl library::storage::Storage for ListsARemovedSnapshot {
    fn location(&self) -> &str {
        self.0.location()
    }
    fn read(&self, path: &str) -> library::Result<Vec<u8>> {
        self.0.read(path)
    }
    fn read_range_into(&self, path: &str, offset: u64, len: u64, buf: &mut Vec<u8>) -> library::Result<()> {
        self.0.read_range_into(path, offset, len, buf)
    }
    fn write(&self, path: &str, data: Vec<u8>) -> library::Result<()> {
        self.0.write(path, data)
    }
    fn list(&self, dir: &str) -> library::Result<Vec<library::storage::ObjectInfo>> {
        let mut listed = self.0.list(dir)?;
        if dir == "snapshots" {
            listed.push(library::storage::ObjectInfo { path: format!("snapshots/{}", "ab".repeat(32)), size: 200 });
        }
        Ok(listed)
    }
    fn delete(&self, path: &str) -> library::Result<()> {
        self.0.delete(path)
    }
    fn exists(&self, path: &str) -> library::Result<bool> {
        self.0.exists(path)
    }
    fn create(&self) -> library::Result<()> {
        self.0.create()
    }
    fn default_concurrency(&self) -> usize {
        self.0.default_concurrency()
    }
    fn is_remote(&self) -> bool {
        false
    }
    fn remove_stale_temporaries(&self, age: std::time::Duration) -> library::Result<usize> {
        self.0.remove_stale_temporaries(age)
    }
}

#[test]
fn a_snapshot_removed_while_others_list_them_is_not_damage() {
    // A backup choosing its parent, a check or another forget lists the snapshots and then
    // reads them: one that forget or tag removed in between is gone, not damaged.
    let fx = Fixture::for_forget();
    let kept = fx.backup_at("2024-07-01 10:00:00", &[]);
    let local = library::storage::OpendalStorage::local(fx.cairn.repo.to_str().unwrap()).unwrap();
    let storage = std::sync::Arc::new(ListsARemovedSnapshot(local));
    let repo = library::repository::Repository::open(storage, PASSWORD.as_bytes()).unwrap();
    let (snaps, damaged) = repo.read_snapshots().unwrap();
    assert!(damaged.is_empty(), "{damaged:?}");
    assert_eq!(snaps.iter().map(|(id, _)| id.to_hex()).collect::<Vec<_>>(), [kept]);
    assert_eq!(repo.snapshots().unwrap().len(), 1);
}
