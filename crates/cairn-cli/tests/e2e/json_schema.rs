//! docs/JSON.md is the schema of every command's `--json` output: these tests run each command
//! against a real repository and validate every line it prints against the document's blocks
//! (strict: a key the document does not list, or a listed key the output lacks, fails).

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use serde_json::Value;

use crate::support::tree::Tree;
use crate::support::{stdout, Cairn, Fixture, KDF_ARGS, PASSWORD};

/// The schemas of docs/JSON.md by name (`backup/summary`, …), each with the shared `$defs`.
fn schemas() -> &'static BTreeMap<String, (Value, jsonschema::Validator)> {
    static SCHEMAS: OnceLock<BTreeMap<String, (Value, jsonschema::Validator)>> = OnceLock::new();
    SCHEMAS.get_or_init(|| {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/JSON.md");
        let doc = fs::read_to_string(&path).expect("docs/JSON.md");
        let mut blocks = BTreeMap::new();
        let mut rest = doc.as_str();
        while let Some(at) = rest.find("```json schema:") {
            let after = &rest[at + "```json schema:".len()..];
            let (name, body) = after.split_once('\n').expect("a schema block has a body");
            let end = body.find("\n```").expect("a schema block ends");
            let value: Value = serde_json::from_str(&body[..end])
                .unwrap_or_else(|e| panic!("docs/JSON.md: block {name} is not JSON: {e}"));
            assert!(blocks.insert(name.trim().to_string(), value).is_none(), "two blocks named {name}");
            rest = &body[end..];
        }
        let defs = blocks.remove("$defs").expect("docs/JSON.md has a $defs block");
        blocks
            .into_iter()
            .map(|(name, mut schema)| {
                schema["$defs"] = defs.clone();
                let validator = jsonschema::validator_for(&schema)
                    .unwrap_or_else(|e| panic!("docs/JSON.md: schema {name} does not compile: {e}"));
                (name, (schema, validator))
            })
            .collect()
    })
}

/// Validates every line of `out` (a command's standard output) against the schemas of
/// `command` (`backup/…`): each must match one. Returns the name of the schema each matched.
fn validate(command: &str, out: &str) -> Vec<String> {
    let prefix = format!("{command}/");
    let candidates: Vec<(&String, &(Value, jsonschema::Validator))> =
        schemas().iter().filter(|(n, _)| n.starts_with(&prefix) || *n == command).collect();
    assert!(!candidates.is_empty(), "docs/JSON.md has no schema for {command}");
    let mut matched = Vec::new();
    for line in out.lines().filter(|l| !l.trim().is_empty()) {
        let value: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{command}: not JSON ({e}): {line}"));
        match candidates.iter().find(|(_, (_, v))| v.is_valid(&value)) {
            Some((name, _)) => matched.push(name.to_string()),
            None => {
                let why: Vec<String> = candidates
                    .iter()
                    .map(|(name, (_, v))| {
                        let errors: Vec<String> = v.iter_errors(&value).take(4).map(|e| e.to_string()).collect();
                        format!("  {name}: {}", errors.join("; "))
                    })
                    .collect();
                panic!("{command}: a line docs/JSON.md does not describe:\n{line}\n{}", why.join("\n"));
            }
        }
    }
    matched
}

/// Runs `cairn --json ARGS` (which must exit 0) and validates its output as `command`'s.
fn run(cairn: &Cairn, env: &[(&str, &str)], command: &str, args: &[&str]) -> Vec<String> {
    let mut full = vec!["--json"];
    full.extend_from_slice(args);
    let out = cairn.run_env(env, &full);
    assert!(out.status.success(), "cairn {full:?}: {}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    validate(command, &stdout(&out))
}

fn has(matched: &[String], name: &str) -> bool {
    matched.iter().any(|m| m == name)
}

/// A source of a few kinds of entries: files, a directory, a symlink, an executable.
fn source(root: &Path) {
    let mut t = Tree::new(root, 7);
    t.dir("docs").file("docs/readme.txt", "hello\n").random("docs/big.bin", 3 << 20);
    t.random("data/a.bin", 200_000).random("data/b.bin", 70_000).symlink("docs/readme.txt", "link");
    t.file("run.sh", "#!/bin/sh\n");
    fs::set_permissions(root.join("run.sh"), std::os::unix::fs::PermissionsExt::from_mode(0o4755)).unwrap();
}

/// Requests slow enough that the long commands print status lines (one a second).
const SLOW: (&str, &str) = ("CAIRN_INJECT_FAULTS", "latency=400ms");

#[test]
fn json_schema_backup_and_restore() {
    let fx = Fixture::new();
    source(&fx.src);
    let mut args = vec!["init"];
    args.extend(KDF_ARGS);
    let init = run(&fx.cairn, &[], "init", &args);
    assert_eq!(init, ["init/initialized"]);
    let src = fx.src.to_str().unwrap();
    let backup = run(&fx.cairn, &[SLOW], "backup", &["backup", src]);
    assert!(has(&backup, "backup/status"), "a slow backup printed no status line: {backup:?}");
    assert_eq!(backup.last().map(String::as_str), Some("backup/summary"));
    fs::write(fx.src.join("docs/readme.txt"), "changed\n").unwrap();
    assert_eq!(run(&fx.cairn, &[], "backup", &["backup", "--dry-run", src]), ["backup/summary"]);

    let target = fx.path("target");
    let restore =
        run(&fx.cairn, &[SLOW], "restore", &["restore", "latest", "--target", target.to_str().unwrap(), "--profile"]);
    assert!(has(&restore, "restore/status"), "{restore:?}");
    assert!(has(&restore, "restore/summary") && has(&restore, "restore/lock"), "{restore:?}");
    assert!(
        has(&restore, "restore/round_trips"),
        "a traced restore with --profile prints its round trips: {restore:?}"
    );
    let dry = run(
        &fx.cairn,
        &[],
        "restore",
        &["restore", "latest", "--target", fx.path("t2").to_str().unwrap(), "--dry-run"],
    );
    assert_eq!(dry, ["restore/dry_run"]);
}

#[test]
fn json_schema_listings() {
    let mut fx = Fixture::backed_up(source, &[], &["--tag", "one"]);
    let first = fx.snapshot.clone();
    fs::write(fx.src.join("docs/readme.txt"), "changed\n").unwrap();
    fs::remove_file(fx.src.join("data/b.bin")).unwrap();
    Tree::new(&fx.src, 9).random("data/c.bin", 1000);
    fx.backup(&[]);
    let second = fx.snapshot.clone();
    let c = &fx.cairn;

    assert_eq!(run(c, &[], "snapshots", &["snapshots"]), ["snapshots/list"]);
    assert_eq!(run(c, &[], "snapshots", &["snapshots", "--group-by", "host,tags"]), ["snapshots/groups"]);
    let ls = run(c, &[], "ls", &["ls", &first]);
    assert!(ls.len() >= 8 && ls.iter().all(|m| m == "ls/node"), "{ls:?}");
    let find = run(c, &[], "find", &["find", "*.bin", "run.sh", "link"]);
    assert!(find.len() >= 5 && find.iter().all(|m| m == "find/match"), "{find:?}");
    let diff = run(c, &[], "diff", &["diff", &first, &second, "--metadata"]);
    assert!(diff.iter().filter(|m| *m == "diff/change").count() >= 3, "{diff:?}");
    assert_eq!(diff.last().map(String::as_str), Some("diff/statistics"));
    assert_eq!(run(c, &[], "stats", &["stats"]), ["stats/report"]);
    assert_eq!(run(c, &[], "stats", &["stats", "--mode", "raw-data"]), ["stats/report"]);
    assert_eq!(run(c, &[], "key", &["key", "list"]), ["key/list"]);
    assert_eq!(run(c, &[], "tag", &["tag", "--add", "two", &second]), ["tag/report"]);
    assert_eq!(run(c, &[], "forget", &["forget", "--keep-last", "1", "--dry-run"]), ["forget/groups"]);
    assert_eq!(run(c, &[], "forget", &["forget", "--keep-last", "1"]), ["forget/groups"]);
}

#[test]
fn json_schema_maintenance() {
    let fx = Fixture::backed_up(source, &[], &[]);
    let c = &fx.cairn;
    let check = run(c, &[SLOW], "check", &["check", "--read-data"]);
    assert!(has(&check, "check/status"), "{check:?}");
    assert_eq!(check.last().map(String::as_str), Some("check/summary"));

    let other = fx.other_repo("copy");
    other.init(&[]);
    let copy = run(
        &other,
        &[SLOW, ("CAIRN_FROM_PASSWORD", PASSWORD)],
        "copy",
        &["copy", "--from-repo", c.repo.to_str().unwrap()],
    );
    assert_eq!(copy.last().map(String::as_str), Some("copy/summary"), "{copy:?}");

    // An object that cannot be read (bytes under their own hash, as a host may plant them).
    let junk = b"not a snapshot".to_vec();
    fs::write(fx.repo().join("snapshots").join(blake3::hash(&junk).to_hex().as_str()), &junk).unwrap();
    assert_eq!(run(c, &[], "repair", &["repair", "unreadable", "--dry-run"]), ["repair/unreadable"]);
    assert_eq!(run(c, &[], "repair", &["repair", "unreadable"]), ["repair/unreadable"]);
    assert_eq!(run(c, &[], "repair", &["repair", "index"]), ["repair/index"]);
    assert_eq!(run(c, &[], "repair", &["repair", "packs", &largest_pack(&fx.repo().join("data"))]), ["repair/packs"]);
    assert_eq!(run(c, &[], "prune", &["prune", "--dry-run"]), ["prune/summary"]);
    assert_eq!(run(c, &[], "prune", &["prune"]), ["prune/summary"]);

    // A pack gone: its files are cut in a repaired snapshot, and check names what is missing.
    fs::remove_file(fx.repo().join("data").join(largest_pack_path(&fx.repo().join("data")))).unwrap();
    let out = c.run(["--json", "check"]);
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    let check = validate("check", &stdout(&out));
    assert_eq!(check, ["check/summary"]);
    let summary: Value = serde_json::from_str(stdout(&out).lines().last().unwrap()).unwrap();
    assert!(summary["findings"].as_array().is_some_and(|f| !f.is_empty()), "{summary}");
    // The documented order: the index without the lost pack, then the snapshots that needed it.
    assert_eq!(run(c, &[], "repair", &["repair", "index"]), ["repair/index"]);
    let repaired = run(c, &[], "repair", &["repair", "snapshots"]);
    assert!(!repaired.is_empty() && repaired.iter().all(|m| m == "repair/snapshots"), "{repaired:?}");
}

/// The largest pack file below `data` (a data pack): its ID.
fn largest_pack(data: &Path) -> String {
    largest_pack_path(data).file_name().unwrap().to_string_lossy().into_owned()
}

/// The largest pack file below `data`, relative to it.
fn largest_pack_path(data: &Path) -> PathBuf {
    let mut best = (0, PathBuf::new());
    for dir in fs::read_dir(data).unwrap() {
        let dir = dir.unwrap().path();
        for f in fs::read_dir(&dir).unwrap() {
            let f = f.unwrap();
            let len = f.metadata().unwrap().len();
            if len > best.0 {
                best = (len, f.path().strip_prefix(data).unwrap().to_path_buf());
            }
        }
    }
    best.1
}

/// Runs `cairn --json ARGS`, which must fail with `code`; validates its one stderr line as
/// docs/JSON.md's `error`.
fn fails(cairn: &Cairn, args: &[&str], code: i32) -> Value {
    let mut full = vec!["--json"];
    full.extend_from_slice(args);
    let out = cairn.run(&full);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(code), "cairn {full:?}: {err}");
    assert_eq!(err.lines().count(), 1, "cairn {full:?}: more than the one error line: {err}");
    assert_eq!(validate("error", &err), ["error"]);
    serde_json::from_str(err.trim()).unwrap()
}

#[test]
fn json_schema_errors_and_tokens() {
    let fx = Fixture::backed_up(source, &[], &[]);
    let missing = Cairn::new(&fx.path("no-repository-here"), PASSWORD);
    let v = fails(&missing, &["snapshots"], 10);
    assert!(v["message"].as_str().unwrap().contains("no-repository-here"), "{v}");
    fails(&Cairn::new(fx.repo(), "not the password"), &["snapshots"], 12);

    let credentials = fx.path("credentials.json");
    let credentials = credentials.to_str().unwrap();
    let add = ["serve", "token", "add", "--credentials", credentials];
    assert_eq!(
        run(&fx.cairn, &[], "serve", &[&add[..], &["--repo", "host1", "--role", "append"]].concat()),
        ["serve/token_add"]
    );
    assert_eq!(
        run(&fx.cairn, &[], "serve", &[&add[..], &["--all", "--role", "read", "--expires", "90d"]].concat()),
        ["serve/token_add"]
    );
    let list = run(&fx.cairn, &[], "serve", &["serve", "token", "list", "--credentials", credentials]);
    assert_eq!(list, ["serve/token_list"]);
    // The runner passes the client's `-r REPO`, which shares `--repo`'s name: `--all` still means
    // every repository of the server.
    let out = fx.cairn.run(["--json", "serve", "token", "list", "--credentials", credentials]);
    let tokens: Value = serde_json::from_slice(&out.stdout).unwrap();
    let repos: Vec<&Value> = tokens.as_array().unwrap().iter().map(|t| &t["repo"]).collect();
    assert_eq!(repos, [&Value::from("host1"), &Value::Null], "{tokens}");
}

#[test]
fn json_schema_live_restore() {
    let fx = crate::nbd::disk_fixture();
    let (_, spec, target) = crate::live_restore::image_spec_target(&fx);
    // 50 ms before each of the background restore's 64 KiB writes: about 5 s of status lines.
    let export = crate::live_restore::live(
        &fx,
        &spec,
        &target,
        &fx.path("live.sock"),
        "50ms",
        &["--json", "--write-threads", "1"],
    );
    crate::live_restore::wait_complete(&target);
    let out = stdout(&export.stop());
    let matched = validate("restore", &out);
    assert!(has(&matched, "restore/live_status"), "{matched:?}");
    assert_eq!(matched.last().map(String::as_str), Some("restore/summary"), "{matched:?}");
    // What is present only grows, up to the image's size.
    let present: Vec<u64> = out
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|v| v["message_type"] == "live_status")
        .inspect(|v| assert_eq!(v["total_bytes"], crate::nbd::SIZE, "{v}"))
        .map(|v| v["present_bytes"].as_u64().unwrap())
        .collect();
    assert!(present.windows(2).all(|w| w[0] <= w[1]), "{present:?}");
    assert!(present.len() >= 2 && present[0] < crate::nbd::SIZE, "{present:?}");
}

/// Through `cairn serve`, each snapshot says which token stored it (`stored_by`).
#[test]
fn json_schema_snapshots_through_a_server() {
    let server = crate::support::serve::Server::start();
    let token = server.token(&["--repo", "laptop", "--role", "append", "--name", "laptop-append"]);
    let c = server.cairn("laptop", &token);
    c.init(&[]);
    let src = tempfile::tempdir().unwrap();
    source(src.path());
    c.backup(&[src.path()], &[]);
    assert_eq!(run(&c, &[], "snapshots", &["snapshots"]), ["snapshots/list"]);
    assert_eq!(run(&c, &[], "snapshots", &["snapshots", "--group-by", "host"]), ["snapshots/groups"]);
    let listed: Value = serde_json::from_str(&c.ok(["--json", "snapshots"])).unwrap();
    assert_eq!(listed[0]["stored_by"], "laptop-append", "{listed}");
}
