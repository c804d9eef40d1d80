//! Choosing the snapshot a command works on (issue 59): `latest` narrowed by `--host`, `--tag`
//! and `--path` on every command that takes one snapshot, tag lists split at commas, and a path
//! missing from `latest` named with the snapshot that holds it. (`--stored-by` needs a server:
//! `serve::a_planted_snapshot_is_named_by_its_token_and_never_chosen_by_stored_by_or_as_a_parent`.)

use std::fs;
use std::path::{Path, PathBuf};

use crate::support::{self as common, stderr, Cairn, Fixture};

/// A repository shared by two hosts, as the README's `db` and `vmhost` profiles share one: `db`
/// backs up `db/shop.sql` twice (the second tagged `postgres`), then `vmhost` backs up
/// `vm/disk.img`, which makes its snapshot `latest`.
struct Shared {
    fx: Fixture,
    db: PathBuf,
    vm: PathBuf,
    /// The IDs of db's two snapshots and vmhost's.
    ids: [String; 3],
}

fn shared() -> Shared {
    let fx = Fixture::new().init(&[]);
    let (db, vm) = (fx.path("db"), fx.path("vm"));
    fs::create_dir_all(&db).unwrap();
    fs::create_dir_all(&vm).unwrap();
    fs::write(db.join("shop.sql"), "v1").unwrap();
    let first = common::snapshot_id(&fx.cairn.backup(&[&db], &["--host", "db"]));
    fs::write(db.join("shop.sql"), "v2 of the dump").unwrap();
    let second = common::snapshot_id(&fx.cairn.backup(&[&db], &["--host", "db", "--tag", "postgres"]));
    fs::write(vm.join("disk.img"), vec![7u8; 70_000]).unwrap();
    let third = common::snapshot_id(&fx.cairn.backup(&[&vm], &["--host", "vmhost"]));
    Shared { fx, db, vm, ids: [first, second, third] }
}

impl Shared {
    fn shop(&self) -> String {
        self.db.join("shop.sql").display().to_string()
    }

    fn run(&self, args: &[&str]) -> std::process::Output {
        self.fx.cairn.run(args)
    }
}

#[test]
fn latest_is_narrowed_by_host_tag_and_path_on_every_command_that_takes_one_snapshot() {
    let s = shared();
    let shop = format!("latest:{}", s.shop());
    let db = s.db.to_str().unwrap();
    // dump: each filter picks db's newest snapshot, not vmhost's `latest`.
    for filter in [&["--tag", "postgres"][..], &["--host", "db"], &["--path", db], &["--tag", "postgres,"]] {
        let mut args = vec!["dump", shop.as_str()];
        args.extend(filter);
        let out = s.run(&args);
        assert!(out.status.success(), "{filter:?}: {}", stderr(&out));
        assert_eq!(out.stdout, b"v2 of the dump", "{filter:?}");
    }
    // restore
    let target = s.fx.path("restored");
    let restored = s.fx.cairn.restore_with("latest", &target, &["--host", "db"]);
    assert_eq!(restored["snapshot_id"], s.ids[1].as_str());
    assert_eq!(fs::read(common::restored_path(&target, &s.db.join("shop.sql"))).unwrap(), b"v2 of the dump");
    // ls
    let listed = s.fx.cairn.ok(["ls", "latest", "--tag", "postgres"]);
    assert!(listed.contains("shop.sql") && !listed.contains("disk.img"), "{listed}");
    // diff: the first db snapshot against db's `latest` is one changed file.
    let diffed = s.fx.cairn.ok(["diff", &s.ids[0][..8], "latest", "--host", "db"]);
    assert!(diffed.contains("M ") && diffed.contains("shop.sql") && !diffed.contains("disk.img"), "{diffed}");
    // nbd (writing the export to a file)
    let image = s.fx.path("shop.img");
    let out = s.fx.cairn.run(["nbd", &shop, "--tag", "postgres", "--commit-to", image.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(fs::read(&image).unwrap(), b"v2 of the dump");
    // find, which takes several snapshots: `--snapshot latest` is the newest that passes.
    let found = s.fx.cairn.ok(["find", "--snapshot", "latest", "--host", "db", "shop.sql"]);
    assert!(found.contains(&s.ids[1][..8]) && found.contains("shop.sql"), "{found}");
    // A snapshot named by ID must pass the filters too.
    let out = s.run(&["dump", &format!("{}:{}", &s.ids[2][..8], s.vm.join("disk.img").display()), "--host", "db"]);
    let err = stderr(&out);
    assert!(!out.status.success() && err.contains("is not one of host \"db\": its host is \"vmhost\""), "{err}");
    // No snapshot passes: one line naming the filters.
    let out = s.run(&["dump", &shop, "--tag", "nothing"]);
    let err = stderr(&out);
    assert!(err.contains("no snapshot with tags \"nothing\" for \"latest\" (3 snapshots"), "{err}");
}

#[test]
fn a_path_not_in_latest_names_latest_and_the_newest_snapshot_that_holds_it() {
    let s = shared();
    let shop = format!("latest:{}", s.shop());
    let holder = format!("the newest snapshot that holds it is {} (host db, tags postgres", &s.ids[1][..8]);
    let chose = format!("not found in snapshot {}, which \"latest\" chose (host vmhost", &s.ids[2][..8]);
    let target = s.fx.path("t");
    for args in [
        vec!["dump", shop.as_str()],
        vec!["restore", shop.as_str(), "--target", target.to_str().unwrap()],
        vec!["ls", shop.as_str()],
        vec!["diff", &s.ids[1][..8], shop.as_str()],
    ] {
        let out = s.run(&args);
        let err = stderr(&out);
        assert!(!out.status.success(), "{args:?}");
        assert!(err.contains(&chose) && err.contains(&holder), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
    }
    // The README's recipe: with pipefail the pipeline fails, and psql's stand-in gets nothing.
    let script = format!(
        "set -o pipefail; {} -r {} dump {shop} | cat > {}",
        env!("CARGO_BIN_EXE_cairn"),
        s.fx.repo().display(),
        s.fx.path("restored.sql").display()
    );
    let out = std::process::Command::new("bash")
        .args(["-c", &script])
        .env("CAIRN_PASSWORD", &s.fx.cairn.password)
        .output()
        .unwrap();
    assert!(!out.status.success(), "the pipeline hid the failure");
    let narrowed = script.replace(" dump ", " dump --tag postgres ");
    let out = std::process::Command::new("bash")
        .args(["-c", &narrowed])
        .env("CAIRN_PASSWORD", &s.fx.cairn.password)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(fs::read(s.fx.path("restored.sql")).unwrap(), b"v2 of the dump");
}

/// The tags of each snapshot, oldest first.
fn tags(c: &Cairn, filter: &[&str]) -> Vec<Vec<String>> {
    let mut args = vec!["--json", "snapshots"];
    args.extend(filter);
    let listed: serde_json::Value = serde_json::from_str(&c.ok(args)).unwrap();
    listed
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["tags"].as_array().unwrap().iter().map(|t| t.as_str().unwrap().to_string()).collect())
        .collect()
}

#[test]
fn tag_lists_split_at_commas_and_an_escaped_comma_stays_in_its_tag() {
    let fx = Fixture::new().init(&[]);
    fs::create_dir_all(&fx.src).unwrap();
    fs::write(fx.src.join("f"), "x").unwrap();
    let c = &fx.cairn;
    c.backup(&[&fx.src], &["--tag", "a,b"]);
    c.backup(&[&fx.src], &["--tag", r"x\,y", "--tag", "z"]);
    c.backup(&[&fx.src], &[]);
    let ab = vec!["a".to_string(), "b".to_string()];
    let xyz = vec!["x,y".to_string(), "z".to_string()];
    assert_eq!(tags(c, &[]), [ab.clone(), xyz.clone(), vec![]]);
    // A filter's list needs all its tags; repeated, any of the lists.
    assert_eq!(tags(c, &["--tag", "a,b"]), std::slice::from_ref(&ab));
    assert_eq!(tags(c, &["--tag", "b"]), std::slice::from_ref(&ab));
    assert!(tags(c, &["--tag", "a,z"]).is_empty());
    assert_eq!(tags(c, &["--tag", "a", "--tag", "z"]), [ab.clone(), xyz.clone()]);
    assert_eq!(tags(c, &["--tag", r"x\,y"]), std::slice::from_ref(&xyz));
    assert!(tags(c, &["--tag", "x"]).is_empty());
    assert_eq!(tags(c, &["--tag", ""]), [Vec::<String>::new()]);
    // `tag` reads its lists the same way.
    c.ok(["tag", "latest", "--add", r"p\,q,r"]);
    assert_eq!(tags(c, &[]).last().unwrap(), &["p,q".to_string(), "r".to_string()]);
}

/// `latest` of a repository with no snapshot of a host is refused before anything is written
/// (restore's target is not made).
#[test]
fn a_filter_no_snapshot_passes_refuses_before_restoring() {
    let s = shared();
    let target = s.fx.path("never");
    let out = s.run(&["restore", "latest", "--host", "nowhere", "--target", target.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("no snapshot of host \"nowhere\""), "{}", stderr(&out));
    assert!(!Path::new(&target).join(s.vm.strip_prefix("/").unwrap()).exists());
}
