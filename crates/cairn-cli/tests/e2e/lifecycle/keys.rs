//! Key rotation end to end, on a local repository and on MinIO's S3: `key add` makes a second
//! password work, `key passwd` replaces the key in use (the old password is then refused),
//! `key remove` refuses the key in use and the last key, and `key list` marks the key in use.

use crate::support;
use crate::support::library;
use crate::support::servers;

use serde_json::Value;
use support::{Cairn, Fixture};

/// `key list --json` as (short ID, in use).
fn keys(cairn: &Cairn) -> Vec<(String, bool)> {
    let list: Value = serde_json::from_str(cairn.ok(["--json", "key", "list"]).trim()).unwrap();
    list.as_array()
        .unwrap()
        .iter()
        .map(|k| (k["short_id"].as_str().unwrap().to_string(), k["current"].as_bool().unwrap()))
        .collect()
}

/// The one key in use, as `key list` says.
fn in_use(cairn: &Cairn) -> String {
    let used: Vec<_> = keys(cairn).into_iter().filter(|(_, c)| *c).map(|(id, _)| id).collect();
    assert_eq!(used.len(), 1, "{used:?}");
    used[0].clone()
}

/// A command that must fail with a one-line error containing `want`.
fn fails(cairn: &Cairn, args: &[&str], want: &str) {
    let out = cairn.run(args);
    let err = String::from_utf8_lossy(&out.stderr);
    // Exit code 12 for a wrong password (restic's), 1 for the rest.
    let code = if want == "wrong password" { 12 } else { 1 };
    assert_eq!(out.status.code(), Some(code), "{args:?}: {err}");
    assert!(err.contains(want), "{args:?}: stderr lacks {want:?}: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: not one line: {err}");
}

fn rotation(first: &Cairn, dir: &std::path::Path) {
    first.init(&[]);
    let src = dir.join("src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("file"), b"keys").unwrap();
    first.backup(&[&src], &[]);
    let k1 = in_use(first);

    // add: a second password opens the same repository.
    let out = first.run_env(&[("CAIRN_NEW_PASSWORD", "second password")], ["key", "add"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let second = first.with_password("second password");
    assert_eq!(second.snapshots().len(), 1);
    assert_eq!(keys(first).len(), 2);
    let k2 = in_use(&second);
    assert_ne!(k1, k2);
    assert_eq!(in_use(first), k1);
    let text = first.ok(["key", "list"]);
    assert!(text.lines().any(|l| l.starts_with(&format!("*{k1}"))), "{text}");
    assert!(text.lines().any(|l| l.starts_with(&format!(" {k2}"))), "{text}");

    // passwd from a file: the key in use (k2) is replaced; its password is refused after.
    let pwfile = dir.join("new-password");
    std::fs::write(&pwfile, "third password\n").unwrap();
    let out = second.run(["key".as_ref(), "passwd".as_ref(), "--new-password-file".as_ref(), pwfile.as_os_str()]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(said.contains(&format!("removed key {k2}")), "{said}");
    fails(&second, &["snapshots"], "wrong password");
    let third = first.with_password("third password");
    assert_eq!(third.snapshots().len(), 1);
    let k3 = in_use(&third);
    let ids: Vec<String> = keys(first).into_iter().map(|(id, _)| id).collect();
    assert!(ids.contains(&k1) && ids.contains(&k3) && !ids.contains(&k2), "{ids:?}");

    // remove: not the key in use, not an unknown one; then the first password is refused.
    fails(first, &["key", "remove", &k1], "in use");
    fails(first, &["key", "remove", "0000000000"], "no key file matches");
    let said = third.ok(["key", "remove", &k1[..6]]);
    assert!(said.contains(&format!("removed key {k1}")), "{said}");
    fails(first, &["snapshots"], "wrong password");
    // The last key stays, whoever asks.
    fails(&third, &["key", "remove", &k3], "last key");
    assert_eq!(keys(&third), [(k3.clone(), true)]);
    // The data is still there, under the new password.
    let target = dir.join("restored");
    third.restore("latest", &target);
}

#[test]
fn local_key_rotation() {
    let fx = Fixture::new();
    rotation(&fx.cairn, &fx.base);
}

#[test]
fn s3_key_rotation() {
    let fx = Fixture::remote(&servers::s3_repo("keys"));
    rotation(&fx.cairn, &fx.base);
}

/// The key file that opened a repository is remembered in the cache directory
/// (`key-hints/`) and tried first by the next open; a hint to a key file that refuses the
/// password, one that was removed, or a hint file that is garbage only sends the open back to
/// the listing of `keys/`, and the errors stay what they were.
#[test]
fn the_key_that_opened_last_is_tried_first_and_a_wrong_hint_costs_only_time() {
    let fx = Fixture::new();
    let cache = fx.path("cache");
    let first = fx.cairn.clone().with_env("XDG_CACHE_HOME", cache.to_str().unwrap());
    first.init(&[]);
    let hints = cache.join("cairn").join("key-hints");
    let hint = || -> String {
        let files: Vec<_> = std::fs::read_dir(&hints).unwrap().map(|e| e.unwrap().path()).collect();
        assert_eq!(files.len(), 1, "one repository, one hint: {files:?}");
        std::fs::read_to_string(&files[0]).unwrap()
    };
    assert!(first.snapshots().is_empty());
    let k1 = in_use(&first);
    assert!(hint().starts_with(&k1), "{} names {k1}", hint());

    // A second key: its password opens past the hint (which names the first key) and becomes
    // the hint; the first password then opens past that one.
    let out = first.run_env(&[("CAIRN_NEW_PASSWORD", "second password")], ["key", "add"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let second = first.with_password("second password");
    let k2 = in_use(&second);
    assert!(hint().starts_with(&k2), "{} names {k2}", hint());
    assert_eq!(in_use(&first), k1);
    assert!(hint().starts_with(&k1));

    // A wrong password is still called one, with the hinted key refusing it counted once.
    fails(&first.with_password("no such password"), &["snapshots"], "wrong password");

    // The hinted key file removed: the open lists the keys and finds the other.
    let second_hint = hint();
    assert!(second.snapshots().is_empty());
    assert!(hint().starts_with(&k2));
    first.ok(["key", "remove", &k2]);
    assert!(first.snapshots().is_empty());
    assert!(hint().starts_with(&k1));
    fails(&second, &["snapshots"], "wrong password");
    // A hint naming a key file that is gone, and a hint that is not an ID at all.
    let file = std::fs::read_dir(&hints).unwrap().next().unwrap().unwrap().path();
    std::fs::write(&file, &second_hint).unwrap();
    assert!(first.snapshots().is_empty());
    assert!(hint().starts_with(&k1));
    std::fs::write(&file, "not a key ID").unwrap();
    assert!(first.snapshots().is_empty());
    assert!(hint().starts_with(&k1));
    // Without a cache nothing is read or written.
    std::fs::remove_dir_all(&hints).unwrap();
    first.ok(["--no-cache", "snapshots"]);
    assert!(!hints.exists());
}

/// The start hint (FORMAT.md §14) carries a copy of the key file that wrote it, tried without
/// reading `keys/`: it opens the repository only while `keys/` still lists that key file, so a
/// removed key stops opening it at once, whatever the hint holds. A hint whose key refuses the
/// password sends the open on to the other key files.
#[test]
fn a_key_file_the_start_hint_carries_opens_only_while_it_is_listed() {
    let fx = Fixture::new().with_password("first password");
    let first = fx.cairn.clone();
    first.init(&[]);
    let out = first.run_env(&[("CAIRN_NEW_PASSWORD", "second password")], ["key", "add"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let second = first.with_password("second password");
    let src = fx.path("src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("file"), b"hint").unwrap();
    // Backed up with the second key: the hint carries it.
    second.backup(&[&src], &[]);
    let hint = std::fs::read(fx.path("repo/hint")).unwrap();
    let k2 = in_use(&second);
    let carried = library::hint::split(&hint).unwrap().key_id().to_hex();
    assert!(carried.starts_with(&k2), "the hint carries {carried}, not the key in use {k2}");

    // The first password opens past the hint's key (which refuses it).
    assert_eq!(first.snapshots().len(), 1);
    first.ok(["key", "remove", &k2]);
    assert_eq!(std::fs::read(fx.path("repo/hint")).unwrap(), hint, "the hint is unchanged");
    fails(&second, &["--no-cache", "snapshots"], "wrong password");
    assert_eq!(first.snapshots().len(), 1);
}
