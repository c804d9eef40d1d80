//! Key rotation end to end, on a local repository and on MinIO's S3: `key add` makes a second
//! password work, `key passwd` replaces the key in use (the old password is then refused),
//! `key remove` refuses the key in use and the last key, and `key list` marks the key in use.

mod common;
mod servers;

use common::{Cairn, PASSWORD};
use serde_json::Value;

fn with_password(cairn: &Cairn, pw: &str) -> Cairn {
    let mut c = cairn.clone();
    c.password = pw.to_string();
    c
}

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
    assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
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
    let second = with_password(first, "second password");
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
    let third = with_password(first, "third password");
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
    let dir = tempfile::tempdir().unwrap();
    rotation(&Cairn::new(&dir.path().join("repo"), PASSWORD), dir.path());
}

#[test]
fn s3_key_rotation() {
    let dir = tempfile::tempdir().unwrap();
    let cairn = servers::cairn(&servers::s3_repo("keys"), &dir.path().join("cache"));
    rotation(&cairn, dir.path());
}
