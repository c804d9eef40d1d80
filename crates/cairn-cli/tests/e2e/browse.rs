//! Browsing commands end to end on real repositories (local, MinIO's S3, sshd's SFTP): `diff`
//! against changes the test makes, `find` across several snapshots, `stats` against sizes the
//! test computes, `snapshots` filters and groups, `ls --long`, and the generated completion
//! scripts and manual pages.

use crate::support;
use crate::support::servers;

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};

use serde_json::Value;
use support::{set_times, Cairn, Fixture, Rng};

/// Every line of `out` parsed as JSON.
fn json_lines(out: &str) -> Vec<Value> {
    out.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"))).collect()
}

/// A command clap refuses: exit code 2, the reason on stderr.
fn refused(cairn: &Cairn, args: &[&str], want: &str) {
    let out = cairn.run(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert!(err.contains(want), "{args:?}: stderr lacks {want:?}: {err}");
}

fn json(out: &str) -> Value {
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"))
}

/// A command that must fail with a one-line error containing `want`.
fn fails(cairn: &Cairn, args: &[&str], want: &str) {
    let out = cairn.run(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{args:?} succeeded: {}", String::from_utf8_lossy(&out.stdout));
    assert!(err.contains(want), "{args:?}: stderr lacks {want:?}: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: not one line: {err}");
}

/// The source tree and what the test knows about it.
struct Source {
    root: PathBuf,
    rng: Rng,
}

impl Source {
    fn write(&mut self, rel: &str, len: usize) {
        let p = self.root.join(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, self.rng.bytes(len)).unwrap();
    }

    fn p(&self, rel: &str) -> String {
        self.root.join(rel).to_string_lossy().into_owned()
    }
}

/// Sizes of the first version's files: a/one, a/two, b/three, c/d/deep, h1 (h2 is its hard
/// link), empty.
const FIRST: [(&str, usize); 5] = [("a/one", 100), ("a/two", 5000), ("b/three", 2500), ("c/d/deep", 40), ("h1", 3000)];

/// Builds the first version of the tree.
fn first_version(root: &Path) -> Source {
    let mut s = Source { root: root.to_path_buf(), rng: Rng(11) };
    for (rel, len) in FIRST {
        s.write(rel, len);
    }
    fs::write(root.join("empty"), b"").unwrap();
    fs::hard_link(root.join("h1"), root.join("h2")).unwrap();
    symlink("a/one", root.join("link")).unwrap();
    fs::set_permissions(root.join("a/one"), fs::Permissions::from_mode(0o644)).unwrap();
    // An old modification time for `find --newest`.
    set_times(&root.join("b/three"), (1_000_000_000, 0), (1_000_000_000, 0));
    s
}

/// The changes between the two versions: `a/two` rewritten (6000 bytes), `b/three` removed,
/// `a/new.txt` (777) and `e/f` (10) added, `link` replaced by a 50-byte file, `a/one`'s mode
/// changed (metadata only). New data: 6000 + 777 + 10 + 50 bytes; gone: 5000 + 2500.
fn second_version(s: &mut Source) {
    s.write("a/two", 6000);
    fs::remove_file(s.root.join("b/three")).unwrap();
    s.write("a/new.txt", 777);
    s.write("e/f", 10);
    fs::remove_file(s.root.join("link")).unwrap();
    s.write("link", 50);
    fs::set_permissions(s.root.join("a/one"), fs::Permissions::from_mode(0o600)).unwrap();
}

/// `(code, path)` of every change `diff --json` printed, and its statistics.
fn diff_json(cairn: &Cairn, args: &[&str]) -> (BTreeSet<(String, String)>, Value) {
    let mut all = vec!["--json", "diff"];
    all.extend(args);
    let mut lines = json_lines(&cairn.ok(&all));
    let stats = lines.pop().expect("a statistics line");
    assert_eq!(stats["message_type"], "statistics", "{stats}");
    let changes = lines
        .iter()
        .map(|c| {
            assert_eq!(c["message_type"], "change", "{c}");
            (c["modifier"].as_str().unwrap().to_string(), c["path"].as_str().unwrap().to_string())
        })
        .collect();
    (changes, stats)
}

fn set(items: &[(&str, String)]) -> BTreeSet<(String, String)> {
    items.iter().map(|(c, p)| (c.to_string(), p.clone())).collect()
}

fn browse(cairn: &Cairn, base: &Path, local: bool) {
    cairn.init(&[]);
    let mut src = first_version(&base.join("src"));
    cairn.backup(&[&src.root], &["--tag", "first"]);
    let s1 = cairn.snapshots()[0]["id"].as_str().unwrap().to_string();
    second_version(&mut src);
    cairn.backup(&[&src.root], &["--tag", "second"]);
    let s2 = cairn.snapshots()[1]["id"].as_str().unwrap().to_string();

    // diff: exactly the changes made, with the totals and the new and removed data.
    let (changes, stats) = diff_json(cairn, &[&s1, &s2]);
    let want = set(&[
        ("M", src.p("a/two")),
        ("-", src.p("b/three")),
        ("+", src.p("a/new.txt")),
        ("+", src.p("e")),
        ("+", src.p("e/f")),
        ("T", src.p("link")),
    ]);
    assert_eq!(changes, want);
    assert_eq!(stats["files"], serde_json::json!({"added": 3, "removed": 1, "changed": 1}), "{stats}");
    assert_eq!(stats["dirs"], serde_json::json!({"added": 1, "removed": 0, "changed": 0}), "{stats}");
    assert_eq!(stats["others"], serde_json::json!({"added": 0, "removed": 1, "changed": 0}), "{stats}");
    assert_eq!(stats["type_changes"], 1);
    assert_eq!(stats["bytes_added"], 6000 + 777 + 10 + 50, "{stats}");
    assert_eq!(stats["bytes_removed"], 5000 + 2500, "{stats}");
    assert_eq!((stats["blobs_added"].as_u64(), stats["blobs_removed"].as_u64()), (Some(4), Some(2)));
    // --metadata adds a/one's mode change (and the directories whose times changed), never the
    // unchanged files.
    let (with_meta, _) = diff_json(cairn, &["--metadata", &s1, &s2]);
    assert!(with_meta.contains(&("U".to_string(), src.p("a/one"))), "{with_meta:?}");
    assert!(with_meta.is_superset(&want));
    for unchanged in ["c/d/deep", "h1", "h2", "empty"] {
        assert!(!with_meta.iter().any(|(_, p)| *p == src.p(unchanged)), "{unchanged}: {with_meta:?}");
    }
    // Text: one line per change with its size, then the totals.
    let text = cairn.ok(["diff", &s1[..8], &s2[..8]]);
    assert!(
        text.lines().any(|l| l.starts_with('M') && l.contains("5.86 KiB") && l.ends_with(&src.p("a/two"))),
        "{text}"
    );
    assert!(text.lines().any(|l| l.starts_with('+') && l.ends_with(&format!("{}/", src.p("e")))), "{text}");
    assert!(text.contains("Files:") && text.contains("3 new") && text.contains("Added:"), "{text}");
    // A snapshot against itself: nothing, and no tree read.
    let (none, same) = diff_json(cairn, &[&s2, &s2]);
    assert!(none.is_empty(), "{none:?}");
    assert_eq!(same["trees_read"], 0);
    // Directories inside the snapshots: paths relative to them.
    let (sub, _) = diff_json(cairn, &[&format!("{s1}:{}", src.p("a")), &format!("{s2}:{}", src.p("a"))]);
    assert_eq!(sub, set(&[("M", "/two".into()), ("+", "/new.txt".into())]));
    // One file against another.
    let (file, fstats) = diff_json(cairn, &[&format!("{s1}:{}", src.p("a/two")), &format!("{s2}:{}", src.p("a/two"))]);
    assert_eq!(file, set(&[("M", src.p("a/two"))]));
    assert_eq!(fstats["bytes_added"], 6000);
    if local {
        // Only the trees whose IDs differ were read: the root, each directory down to src and
        // src itself on both sides, a and b on both sides, e on one; c (unchanged) not at all,
        // unless its tree changed (a backup moved an access time).
        let c_same = cairn.subtree_id(&s1, &src.root.join("c")) == cairn.subtree_id(&s2, &src.root.join("c"));
        let d_same = cairn.subtree_id(&s1, &src.root.join("c/d")) == cairn.subtree_id(&s2, &src.root.join("c/d"));
        let depth = src.root.components().count() as u64; // `/` and each name down to src
        let want = 2 * depth + 2 + 2 + 1 + if c_same { 0 } else { 2 } + if d_same { 0 } else { 2 };
        assert!(c_same, "the unchanged directory c got a new tree, so this test cannot tell");
        assert_eq!(stats["trees_read"], want, "{stats}");
    }

    // find: across both snapshots, by name, path, case, snapshot and time.
    let found = |args: &[&str]| -> Vec<(String, String, u64)> {
        let mut all = vec!["--json", "find"];
        all.extend(args);
        json_lines(&cairn.ok(&all))
            .iter()
            .map(|m| {
                (
                    m["snapshot"].as_str().unwrap().to_string(),
                    m["path"].as_str().unwrap().to_string(),
                    m["size"].as_u64().unwrap(),
                )
            })
            .collect()
    };
    assert_eq!(found(&["two"]), [(s1.clone(), src.p("a/two"), 5000), (s2.clone(), src.p("a/two"), 6000)]);
    assert_eq!(found(&["*.TXT"]), []);
    assert_eq!(found(&["-i", "*.TXT"]), [(s2.clone(), src.p("a/new.txt"), 777)]);
    assert_eq!(found(&["--snapshot", &s1[..8], "two"]), [(s1.clone(), src.p("a/two"), 5000)]);
    assert_eq!(found(&["--tag", "second", "three", "f"]), [(s2.clone(), src.p("e/f"), 10)]);
    // With a slash: the whole path (at any depth unless it starts with `/`); `*` stays in one
    // directory.
    let in_a: Vec<_> = found(&["a/*"]).into_iter().map(|(s, p, _)| (s == s2, p)).collect();
    let a = |rel: &str| src.p(rel);
    assert_eq!(
        in_a,
        [(false, a("a/one")), (false, a("a/two")), (true, a("a/new.txt")), (true, a("a/one")), (true, a("a/two"))]
    );
    assert_eq!(found(&[&format!("{}/*/deep", src.root.display())]).len(), 0, "`*` crossed a directory");
    assert_eq!(found(&[&format!("{}/**/deep", src.root.display())]).len(), 2);
    // By name: a directory unchanged in the second snapshot (c) is walked once when nothing
    // matched below it the first time, and still found in both when something did.
    assert_eq!(found(&["deep"]).len(), 2, "a match in an unchanged directory, in both snapshots");
    assert_eq!(found(&["f"]), [(s2.clone(), src.p("e/f"), 10)]);
    // b/three was last modified in 2001.
    assert_eq!(found(&["--newest", "2002-01-01", "*"]), [(s1.clone(), src.p("b/three"), 2500)]);
    assert_eq!(found(&["--oldest", "2002-01-01", "three"]), []);
    let table = cairn.ok(["find", "two"]);
    assert!(table.contains("4.88 KiB") && table.contains("2 matches in 2 snapshots"), "{table}");
    fails(cairn, &["find", "a["], "invalid pattern \"a[\"");
    refused(cairn, &["find", "--newest", "yesterday", "x"], "invalid time");

    // stats: restore sizes as the test wrote them (h1 and h2 once), and the unique data.
    let first_bytes: u64 = FIRST.iter().map(|(_, l)| *l as u64).sum();
    let second_bytes = first_bytes - 5000 - 2500 + 6000 + 777 + 10 + 50;
    let st = json(&cairn.ok(["--json", "stats", &s1]));
    assert_eq!(st["snapshots"], 1);
    let r = &st["restore_size"];
    // Files: a/one a/two b/three c/d/deep h1 h2 empty; dirs: those below `/` down to src, a b c
    // c/d; others: link.
    let depth = src.root.components().count() as u64 - 1;
    assert_eq!(r["files"], 7, "{st}");
    assert_eq!(r["hard_links"], 1, "{st}");
    assert_eq!(r["dirs"], depth + 4, "{st}");
    assert_eq!(r["others"], 1, "{st}");
    assert_eq!(r["bytes"], first_bytes, "{st}");
    assert_eq!(st["raw_data"]["data_plaintext_bytes"], first_bytes, "{st}");
    let both = json(&cairn.ok(["--json", "stats", "--mode", "raw-data"]));
    assert_eq!(both["snapshots"], 2);
    assert_eq!(both["restore_size"]["bytes"], first_bytes + second_bytes);
    let unique = first_bytes + 6000 + 777 + 10 + 50;
    let raw = &both["raw_data"];
    assert_eq!(raw["data_plaintext_bytes"], unique, "{both}");
    let ratio = raw["dedup_ratio"].as_f64().unwrap();
    assert!((ratio - (first_bytes + second_bytes) as f64 / unique as f64).abs() < 1e-9, "{both}");
    let codecs = raw["by_codec"].as_object().unwrap();
    let sum = |field: &str| -> u64 { codecs.values().map(|c| c[field].as_u64().unwrap()).sum() };
    assert_eq!(sum("blobs"), raw["data_blobs"].as_u64().unwrap() + raw["tree_blobs"].as_u64().unwrap());
    assert_eq!(sum("raw"), raw["plaintext_bytes"].as_u64().unwrap(), "{both}");
    assert_eq!(sum("stored"), raw["stored_bytes"].as_u64().unwrap(), "{both}");
    // Random file data does not compress: at least its plaintext is stored.
    assert!(sum("stored") >= unique, "{both}");
    // 5 files in the first version, 4 new in the second.
    assert_eq!(raw["data_blobs"], 9, "{both}");
    let text = cairn.ok(["stats", "--mode", "raw-data", "--tag", "first"]);
    assert!(text.contains("deduplication:") && text.contains("by codec:"), "{text}");
    let text = cairn.ok(["stats", &s2[..8]]);
    assert!(text.contains(&format!("({} bytes)", common_count(second_bytes))), "{text}");
    refused(cairn, &["stats", "--mode", "everything"], "invalid value 'everything'");
    fails(cairn, &["stats", "ffffffffff"], "no snapshot matches");

    // snapshots: filters, the newest of each group, groups.
    cairn.backup(&[&src.root.join("a")], &["--host", "other", "--tag", "third"]);
    let list = |args: &[&str]| -> Vec<String> {
        let mut all = vec!["--json", "snapshots"];
        all.extend(args);
        json(&cairn.ok(&all)).as_array().unwrap().iter().map(|s| s["tags"][0].as_str().unwrap().to_string()).collect()
    };
    assert_eq!(list(&[]), ["first", "second", "third"]);
    assert_eq!(list(&["--host", "other"]), ["third"]);
    assert_eq!(list(&["--tag", "first", "--tag", "third"]), ["first", "third"]);
    assert_eq!(list(&["--path", src.root.to_str().unwrap()]), ["first", "second"]);
    assert_eq!(list(&["--latest", "1"]), ["second", "third"]);
    assert_eq!(list(&[&s1[..8]]), ["first"]);
    let groups = json(&cairn.ok(["--json", "snapshots", "--group-by", "host", "--latest", "5"]));
    let groups = groups.as_array().unwrap();
    assert_eq!(groups.len(), 2, "{groups:?}");
    let sizes: BTreeSet<usize> = groups.iter().map(|g| g["snapshots"].as_array().unwrap().len()).collect();
    assert_eq!(sizes, BTreeSet::from([1, 2]));
    assert!(groups.iter().any(|g| g["group_key"]["host"] == "other"));
    let text = cairn.ok(["snapshots", "--group-by", "tags"]);
    assert!(text.contains("tags first:") && text.contains("tags third:"), "{text}");
    refused(cairn, &["snapshots", "--group-by", "color"], "cannot group by \"color\"");

    // ls --long: mode strings and human sizes.
    let ls = cairn.ok(["ls", "--long", &format!("{s1}:{}", src.p("a"))]);
    let two = ls.lines().find(|l| l.ends_with("/a/two")).unwrap_or_else(|| panic!("{ls}"));
    assert!(two.starts_with("-rw-r--r-- ") && two.contains(" 4.88 KiB "), "{two}");
    let bytes = cairn.ok(["ls", "--long", "--bytes", &format!("{s1}:{}", src.p("a"))]);
    assert!(bytes.lines().any(|l| l.contains(" 5000 ") && l.ends_with("/a/two")), "{bytes}");
    let entries = json_lines(&cairn.ok(["--json", "ls", &format!("{s2}:{}", src.p("a"))]));
    let one = entries.iter().find(|e| e["path"].as_str().unwrap().ends_with("/a/one")).unwrap();
    assert_eq!(one["permissions"], "-rw-------");
}

fn common_count(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[test]
fn local_browse() {
    let fx = Fixture::new();
    browse(&fx.cairn, &fx.base, true);
}

#[test]
fn s3_browse() {
    let fx = Fixture::remote(&servers::s3_repo("browse"));
    browse(&fx.cairn, &fx.base, false);
}

#[test]
fn sftp_browse() {
    let fx = Fixture::remote(&servers::sftp_repo("browse"));
    browse(&fx.cairn, &fx.base, false);
}

/// Bad snapshot names and paths are one-line errors.
#[test]
fn diff_bad_input() {
    let fx = Fixture::new().init(&[]);
    let cairn = &fx.cairn;
    let src = first_version(&fx.src);
    cairn.backup(&[&src.root], &[]);
    fails(cairn, &["diff", "latest", "deadbeef"], "no snapshot matches \"deadbeef\"");
    fails(cairn, &["diff", "latest", &format!("latest:{}", src.p("nothing"))], "nothing");
    let out = cairn.run(["diff", "latest"]);
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
}

/// Completion scripts and manual pages come from the command line definition: they know every
/// command, including the newest.
#[test]
fn completions_and_man_pages() {
    let fx = Fixture::new();
    let cairn = &fx.cairn;
    let bash = cairn.ok(["completions", "bash"]);
    assert!(bash.contains("_cairn()") && bash.contains("cairn__subcmd__diff"), "{}", &bash[..200.min(bash.len())]);
    let zsh = cairn.ok(["completions", "zsh"]);
    assert!(zsh.starts_with("#compdef cairn") && zsh.contains("find"), "{}", &zsh[..200.min(zsh.len())]);
    let fish = cairn.ok(["completions", "fish"]);
    assert!(fish.contains("__fish_cairn") && fish.contains("stats"));
    refused(cairn, &["completions", "tcsh"], "invalid value 'tcsh'");
    let man = cairn.ok(["man"]);
    assert!(man.starts_with(".ie") || man.contains(".TH cairn 1"), "{}", &man[..200.min(man.len())]);
    assert!(man.contains("diff") && man.contains("completions"));
    let dir = fx.base.join("man1");
    cairn.ok(["man".as_ref(), dir.as_os_str()]);
    for page in ["cairn.1", "cairn-diff.1", "cairn-find.1", "cairn-stats.1", "cairn-key-passwd.1"] {
        let text = fs::read_to_string(dir.join(page)).unwrap_or_else(|e| panic!("{page}: {e}"));
        assert!(text.contains(".TH"), "{page}");
    }
}
