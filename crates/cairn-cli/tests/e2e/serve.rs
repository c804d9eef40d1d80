//! `cairn serve` end to end: a real server process over loopback TLS, the real `cairn` binary
//! as its client, and raw HTTPS requests for what no `cairn` command sends (issue 34).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::support::serve::Server;
use crate::support::{self as common, Cairn, KDF_ARGS};

/// Every file below `dir` with its bytes, except the server's own records and locks.
fn objects(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(dir).unwrap().to_string_lossy().into_owned();
            if rel.starts_with(".serve") || rel.starts_with("locks") || rel.starts_with(".tmp") {
                continue;
            }
            if p.is_dir() {
                stack.push(p);
            } else {
                out.insert(rel, std::fs::read(&p).unwrap());
            }
        }
    }
    out
}

/// A small source tree.
fn source(root: &Path) -> PathBuf {
    let src = root.join("src");
    std::fs::create_dir_all(src.join("sub")).unwrap();
    for i in 0..20u32 {
        let body: Vec<u8> = (0..(i * 7919 % 300_000)).map(|b| (b * 31 + i) as u8).collect();
        std::fs::write(src.join(format!("f{i}")), body).unwrap();
    }
    std::fs::write(src.join("sub/small"), b"hello").unwrap();
    src
}

/// A repository `name` made and backed up through the server with an append token.
fn backed_up(server: &Server, name: &str, work: &Path) -> (Cairn, String) {
    let append = server.token(&["--repo", name, "--role", "append", "--name", &format!("{name}-append")]);
    let c = server.cairn(name, &append);
    c.init(&[]);
    c.backup(&[&source(work)], &[]);
    (c, append)
}

#[test]
fn init_backup_restore_check_round_trip_through_the_server() {
    let server = Server::start();
    let work = tempfile::tempdir().unwrap();
    let (c, _) = backed_up(&server, "laptop", work.path());
    let src = work.path().join("src");
    let scanned = common::scan_source(&src);
    // Moved away, so that the restore fetches everything from the server.
    let moved = work.path().join("moved");
    std::fs::rename(&src, &moved).unwrap();
    let target = work.path().join("target");
    c.restore("latest", &target);
    common::assert_same(&scanned, &common::scan(&target.join(src.strip_prefix("/").unwrap())), true);
    c.ok(["check", "--read-data"]);
    assert_eq!(c.snapshots().len(), 1);
    // The repository is an ordinary one in the server's storage.
    let direct = Cairn::new(&server.storage().join("laptop"), common::PASSWORD);
    assert_eq!(direct.snapshots().len(), 1);
    let log = server.log();
    assert!(log.lines().all(|l| serde_json::from_str::<serde_json::Value>(l).is_ok()), "{log}");
    assert!(log.contains(r#""token":"laptop-append""#) && log.contains(r#""op":"write""#), "{log}");
}

#[test]
fn an_append_token_cannot_destroy_history() {
    let server = Server::start();
    let work = tempfile::tempdir().unwrap();
    let (c, append) = backed_up(&server, "laptop", work.path());
    std::fs::write(work.path().join("src/f0"), b"changed").unwrap();
    c.backup(&[&work.path().join("src")], &[]);
    let repo = server.storage().join("laptop");
    let before = objects(&repo);

    // Through cairn commands.
    for args in [&["forget", "latest"][..], &["forget", "--keep-last", "1", "--prune"], &["key", "list"]] {
        let out = c.run(args);
        if args[0] == "key" {
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            continue;
        }
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains("403"), "{args:?}: {err}");
    }
    assert_eq!(objects(&repo), before, "an append token's commands changed stored objects");

    // As raw requests: delete or overwrite every object that carries history.
    let object = |dir: &str| before.keys().find(|k| k.starts_with(dir)).unwrap().clone();
    let url = |o: &str| format!("/v1/repos/laptop/objects/{o}");
    for o in [object("data/"), object("index/"), object("snapshots/"), object("keys/"), "config".to_string()] {
        let (status, body) = server.raw("DELETE", &url(&o), Some(&append), b"");
        assert_eq!(status, 403, "DELETE {o}: {body}");
        // Other bytes under a content-addressed name are refused before anything is written.
        let (status, body) = server.raw("PUT", &url(&o), Some(&append), b"garbage");
        assert!(status == 400 || status == 403, "PUT garbage {o}: {status} {body}");
        // The same bytes are "already stored"; the config is never replaced.
        let (status, body) = server.raw("PUT", &url(&o), Some(&append), &before[&o]);
        assert_eq!(status, if o == "config" { 403 } else { 200 }, "PUT same {o}: {body}");
    }
    // A deletion manifest would let the next prune delete packs.
    let manifest = b"not really a manifest";
    let name = format!("deletions/{}", blake3::hash(manifest).to_hex());
    let (status, body) = server.raw("PUT", &url(&name), Some(&append), manifest);
    assert_eq!(status, 403, "{body}");
    assert_eq!(objects(&repo), before, "raw requests changed stored objects");
    let refused = server.log().lines().filter(|l| l.contains(r#""status":403"#)).count();
    assert!(refused >= 10, "refusals are logged:\n{}", server.log());

    // The start hint carries no history: an append token replaces it, as every backup does.
    assert_eq!(server.raw("DELETE", &url("hint"), Some(&append), b"").0, 204);
    c.ok(["check", "--read-data"]);
}

#[test]
fn read_tokens_read_and_other_repositories_and_bad_tokens_are_refused() {
    let server = Server::start();
    let work = tempfile::tempdir().unwrap();
    let (_, append) = backed_up(&server, "laptop", work.path());
    backed_up(&server, "desktop", work.path());
    let read = server.token(&["--repo", "laptop", "--role", "read"]);
    let reader = server.cairn("laptop", &read);
    assert_eq!(reader.snapshots().len(), 1);
    reader.restore("latest", &work.path().join("target"));
    let out = reader.run(["backup", work.path().join("src").to_str().unwrap()]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("403"));
    let blob = b"a new object";
    let path = format!("/v1/repos/laptop/objects/snapshots/{}", blake3::hash(blob).to_hex());
    assert_eq!(server.raw("PUT", &path, Some(&read), blob).0, 403);

    // A token of laptop on desktop.
    assert_eq!(server.raw("GET", "/v1/repos/desktop/list/snapshots", Some(&append), b"").0, 403);
    let out = server.cairn("desktop", &append).run(["snapshots"]);
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("403"));

    // No token, a wrong one, an expired one.
    let expired = server.token(&["--repo", "laptop", "--role", "admin", "--expires", "1s"]);
    std::thread::sleep(std::time::Duration::from_millis(2100));
    for token in [None, Some("cairn_0000"), Some(expired.as_str())] {
        let (status, body) = server.raw("GET", "/v1/repos/laptop/list/snapshots", token, b"");
        assert_eq!(status, 401, "{token:?}: {body}");
        let (status, _) = server.raw("DELETE", "/v1/repos/laptop/objects/config", token, b"");
        assert_eq!(status, 401);
    }
    assert!(server.log().contains("has expired"));
    let out = server.cairn("laptop", "cairn_0000").run(["snapshots"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("401"));
    assert!(server.storage().join("laptop/config").exists());

    // Locks: a read token removes its own, not another token's.
    let other = server.token(&["--repo", "laptop", "--role", "read"]);
    let lock = format!("/v1/repos/laptop/objects/locks/{}", "ab".repeat(16));
    assert_eq!(server.raw("PUT", &lock, Some(&read), b"{}").0, 201);
    assert_eq!(server.raw("PUT", &lock, Some(&other), b"{}").0, 403);
    assert_eq!(server.raw("DELETE", &lock, Some(&other), b"").0, 403);
    assert_eq!(server.raw("DELETE", &lock, Some(&read), b"").0, 204);
}

#[test]
fn path_tricks_are_refused_and_nothing_outside_the_storage_is_touched() {
    let server = Server::start();
    let work = tempfile::tempdir().unwrap();
    backed_up(&server, "laptop", work.path());
    let admin = server.token(&["--all", "--role", "admin"]);
    let canary = server.dir.path().join("canary");
    std::fs::write(&canary, b"canary").unwrap();
    let outside = || {
        let mut names: Vec<_> = std::fs::read_dir(server.dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        names.sort();
        names
    };
    let before = outside();
    let long = "a".repeat(5000);
    let tricks = [
        "/v1/repos/laptop/objects/../canary".to_string(),
        "/v1/repos/laptop/objects/../../canary".to_string(),
        "/v1/repos/laptop/objects/%2e%2e/canary".to_string(),
        "/v1/repos/laptop/objects/%2E%2E%2Fcanary".to_string(),
        "/v1/repos/%2e%2e/objects/canary".to_string(),
        "/v1/repos/../objects/canary".to_string(),
        "/v1/repos/laptop/objects//canary".to_string(),
        "/v1/repos/laptop/objects/data//canary".to_string(),
        "/v1/repos/laptop/objects/keys/".to_string(),
        format!("/v1/repos/laptop/objects/{}", server.dir.path().join("canary").display()),
        "/v1/repos/laptop/objects/.tmp/x".to_string(),
        "/v1/repos/laptop/objects/.serve/lock-owners/x".to_string(),
        format!("/v1/repos/laptop/objects/.serve/stored-by/{}", "ab".repeat(32)),
        "/v1/repos/laptop/list/.serve".to_string(),
        format!("/v1/repos/laptop/objects/{long}"),
        format!("/v1/repos/{long}/objects/config"),
        "/v1/repos/laptop/list/..".to_string(),
        "/v1/repos/laptop/list/data/..%2f..".to_string(),
        "/v1/repos/laptop/objects/config?x=1".to_string(),
        "//v1/repos/laptop/objects/config".to_string(),
    ];
    for path in &tricks {
        for method in ["GET", "PUT", "DELETE"] {
            let (status, body) = server.raw(method, path, Some(&admin), b"pwned");
            assert!((400..500).contains(&status), "{method} {path}: {status} {body}");
        }
    }
    // Huge or malformed heads: refused, and the server answers the next client.
    let (status, _) = server.raw_with("GET", "/v1", None, b"", &format!("X-Big: {}\r\n", "b".repeat(200_000)));
    assert!(status == 431 || status == 400 || status == 0, "{status}");
    let (status, _) =
        server.raw_with("PUT", "/v1/repos/laptop/objects/hint", Some(&admin), b"", "Content-Length: x\r\n");
    assert!((400..500).contains(&status) || status == 0, "{status}");
    assert_eq!(server.raw("GET", "/v1", None, b"").0, 200);
    assert_eq!(std::fs::read(&canary).unwrap(), b"canary");
    assert_eq!(outside(), before, "something was made beside the storage");
    assert_eq!(
        std::fs::read_dir(server.storage()).unwrap().map(|e| e.unwrap().file_name()).collect::<Vec<_>>(),
        vec![std::ffi::OsString::from("laptop")]
    );
    let pwned = objects(&server.storage()).values().any(|v| v == b"pwned");
    assert!(!pwned, "a trick stored its body");
}

#[test]
fn an_admin_token_can_forget_and_prune() {
    let server = Server::start();
    let work = tempfile::tempdir().unwrap();
    let (c, _) = backed_up(&server, "laptop", work.path());
    for i in 0..20 {
        std::fs::write(work.path().join(format!("src/f{i}")), format!("new {i}")).unwrap();
    }
    c.backup(&[&work.path().join("src")], &[]);
    let admin = server.token(&["--repo", "laptop", "--role", "admin"]);
    let a = server.cairn("laptop", &admin);
    let packs_before = objects(&server.storage().join("laptop")).keys().filter(|k| k.starts_with("data/")).count();
    let out = a.run(["forget", "--keep-last", "1", "--prune"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let packs_after = objects(&server.storage().join("laptop")).keys().filter(|k| k.starts_with("data/")).count();
    assert_eq!(a.snapshots().len(), 1);
    // The server's record of who stored each snapshot goes with the snapshot.
    let records = std::fs::read_dir(server.storage().join("laptop/.serve/stored-by")).unwrap().count();
    assert_eq!(records, 1, "one record for the one snapshot left");
    assert!(packs_after < packs_before, "{packs_before} -> {packs_after}");
    a.ok(["check", "--read-data"]);
    let mut args = vec!["init"];
    args.extend(KDF_ARGS);
    // An append token may make a new repository, never a config over one.
    let out = c.run(&args);
    assert!(!out.status.success());
}

#[test]
fn bodies_that_lie_slow_clients_and_a_thousand_connections_do_not_stop_the_server() {
    let server = Server::start();
    let admin = server.token(&["--all", "--role", "admin"]);
    let repo = server.storage().join("laptop");
    assert_eq!(server.raw("POST", "/v1/repos/laptop", Some(&admin), b"").0, 200);

    // A body shorter than its Content-Length: nothing is stored.
    let body = b"a snapshot that never arrives whole";
    let name = format!("snapshots/{}", blake3::hash(body).to_hex());
    let head = format!(
        "PUT /v1/repos/laptop/objects/{name} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {admin}\r\nContent-Length: 1000\r\n\r\n"
    );
    let (status, text) = server.raw_bytes(&[head.as_bytes(), &body[..]].concat());
    assert!(status == 400 || status == 0, "{status} {text}");
    assert!(!repo.join(&name).exists());
    // A body longer than announced: only the announced bytes are the object, which then does
    // not hash to its name; the rest is no request.
    let head = head.replace("Content-Length: 1000", "Content-Length: 10");
    let (status, text) = server.raw_bytes(&[head.as_bytes(), &body[..]].concat());
    assert_eq!(status, 400, "{text}");
    assert!(!repo.join(&name).exists());
    // A NUL byte in the request line, a request line of junk, a header without a colon.
    for junk in [
        &b"GET /v1/repos/laptop/objects/config\0 HTTP/1.1\r\nHost: x\r\n\r\n"[..],
        b"\x00\x01\x02 nonsense\r\n\r\n",
        b"GET /v1 HTTP/1.1\r\nNo colon here\r\n\r\n",
    ] {
        let (status, _) = server.raw_bytes(junk);
        assert!(status == 400 || status == 0, "{status}");
    }

    // A client sending one byte a second while others are served.
    let addr = server.addr;
    let slow = std::thread::spawn(move || {
        let mut tcp = std::net::TcpStream::connect(addr).unwrap();
        for b in b"\x16\x03\x01\x00" {
            if tcp.write_all(&[*b]).is_err() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_secs(1));
        }
    });
    // 1,000 connections at once, none saying anything.
    let idle: Vec<_> = (0..1000).map(|_| std::net::TcpStream::connect(server.addr).unwrap()).collect();
    let start = std::time::Instant::now();
    for _ in 0..3 {
        assert_eq!(server.raw("GET", "/v1", None, b"").0, 200);
        assert_eq!(server.raw("GET", "/v1/repos/laptop/list/snapshots", Some(&admin), b"").0, 200);
    }
    assert!(start.elapsed() < std::time::Duration::from_secs(10), "{:?}", start.elapsed());
    drop(idle);
    slow.join().unwrap();
    assert_eq!(server.raw("GET", "/v1", None, b"").0, 200);
    let stored: Vec<_> = objects(&repo).into_keys().collect();
    assert!(stored.iter().all(|k| !k.starts_with("snapshots")), "{stored:?}");
}

#[test]
fn the_systemd_unit_runs_unprivileged_and_verifies() {
    let unit = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../contrib/systemd/cairn-serve.service");
    let text = std::fs::read_to_string(&unit).unwrap();
    for line in ["User=cairn", "NoNewPrivileges=yes", "ProtectSystem=strict", "CapabilityBoundingSet=\n"] {
        assert!(text.contains(line), "{line:?} missing");
    }
    assert!(!text.contains("User=root"));
    // systemd-analyze wants the program to exist: the binary under test.
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("cairn-serve.service");
    std::fs::write(&copy, text.replace("/usr/local/bin/cairn", env!("CARGO_BIN_EXE_cairn"))).unwrap();
    let out = std::process::Command::new("systemd-analyze")
        .arg("verify")
        .arg(&copy)
        .current_dir(dir.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let ours: Vec<&str> = err.lines().filter(|l| l.contains("cairn-serve")).collect();
    assert!(out.status.success() && ours.is_empty(), "{err}");
}

#[test]
fn uploads_are_streamed_and_only_whole_verified_objects_appear() {
    let server = Server::start();
    let admin = server.token(&["--all", "--role", "admin"]);
    let append = server.token(&["--repo", "laptop", "--role", "append"]);
    let repo = server.storage().join("laptop");
    assert_eq!(server.raw("POST", "/v1/repos/laptop", Some(&admin), b"").0, 200);
    // 24 MiB: many of hyper's frames, written to a temporary file as they come.
    let pack: Vec<u8> = (0..24u32 << 20).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let hex = blake3::hash(&pack).to_hex();
    let name = format!("data/{}/{hex}", &hex[..2]);
    let url = format!("/v1/repos/laptop/objects/{name}");
    // One byte changed at the very end: the hash is only known when all has come, and the
    // temporary file is removed.
    let mut wrong = pack.clone();
    *wrong.last_mut().unwrap() ^= 1;
    let (status, body) = server.raw("PUT", &url, Some(&append), &wrong);
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("does not match its name"), "{body}");
    assert!(!repo.join(&name).exists());
    let temporaries = |r: &Path| std::fs::read_dir(r.join(".tmp")).map(|d| d.count()).unwrap_or(0);
    assert_eq!(temporaries(&repo), 0, "a refused upload left its temporary file");
    let (status, body) = server.raw("PUT", &url, Some(&append), &pack);
    assert_eq!(status, 201, "{body}");
    assert_eq!(std::fs::read(repo.join(&name)).unwrap(), pack);
    assert_eq!(temporaries(&repo), 0);
    // The same again is already stored, its body read and dropped.
    assert_eq!(server.raw("PUT", &url, Some(&append), &pack).0, 200);
    let log = server.log();
    assert!(log.contains(&format!(r#""bytes":{}"#, pack.len())), "{log}");
}

#[test]
fn a_repository_over_its_quota_refuses_new_objects_with_one_line() {
    let server = Server::start_with(&["--quota", "1G", "--quota", "small=200K"]);
    let work = tempfile::tempdir().unwrap();
    let append = server.token(&["--repo", "small", "--role", "append"]);
    let c = server.cairn("small", &append);
    c.init(&[]);
    // A source of incompressible bytes well over the quota.
    let src = work.path().join("big");
    std::fs::create_dir(&src).unwrap();
    let mut rng = common::Rng(34);
    std::fs::write(src.join("noise"), rng.bytes(600 << 10)).unwrap();
    let out = c.run(["backup", src.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    let location = format!("cairn+https://{}/small", server.addr);
    assert!(err.contains(&format!("cairn: {location}: repository small is over its quota of 200.0 KiB (")), "{err}");
    assert!(err.contains("ask the server's admin for a larger quota, or forget and prune"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(server.log().contains(r#""status":507"#));
    // A body that does not say its length (curl sends it chunked) is held to what is left of
    // the quota as it arrives.
    let pack = rng.bytes(300 << 10);
    let hex = blake3::hash(&pack).to_hex();
    let name = format!("data/{}/{hex}", &hex[..2]);
    std::fs::write(work.path().join("pack"), &pack).unwrap();
    let out = std::process::Command::new("curl")
        .args(["-sS", "-k", "--max-time", "20", "-X", "PUT", "-w", "\n%{http_code}"])
        .args(["-H", &format!("Authorization: Bearer {append}"), "-H", "Transfer-Encoding: chunked"])
        .arg("--data-binary")
        .arg(format!("@{}", work.path().join("pack").display()))
        .arg(format!("https://{}/v1/repos/small/objects/{name}", server.addr))
        .output()
        .unwrap();
    let answer = String::from_utf8_lossy(&out.stdout);
    assert!(answer.ends_with("\n507"), "{answer}{}", String::from_utf8_lossy(&out.stderr));
    assert!(answer.contains("repository small is over its quota of 200.0 KiB"), "{answer}");
    assert!(!server.storage().join("small").join(&name).exists());
    // Nothing half-written: the repository is whole, with no snapshot.
    c.ok(["check", "--read-data"]);
    assert!(c.snapshots().is_empty());
    // A small backup fits; the other repositories have the default quota.
    std::fs::write(src.join("noise"), b"small").unwrap();
    c.backup(&[&src], &[]);
    let (other, _) = backed_up(&server, "other", work.path());
    assert_eq!(other.snapshots().len(), 1);
}

/// Every object of a content-addressed directory of `repo` whose bytes do not hash to its name.
fn damaged_objects(repo: &Path) -> Vec<String> {
    objects(repo)
        .into_iter()
        .filter(|(k, _)| ["data/", "index/", "snapshots/", "keys/"].iter().any(|d| k.starts_with(d)))
        .filter(|(k, v)| !k.ends_with(blake3::hash(v).to_hex().as_str()))
        .map(|(k, _)| k)
        .collect()
}

/// A backup of `src` through `c` with uploads slowed to `limit` a second, so that a fault
/// can land while packs are still being sent; waits until `uploading` says they are.
fn slow_backup(c: &Cairn, src: &Path, limit: &str, uploading: impl FnMut() -> bool) -> std::process::Child {
    let mut backup = c.command();
    backup.args(["--limit-upload", limit, "backup"]).arg(src).stdout(std::process::Stdio::null());
    backup.stderr(std::process::Stdio::piped());
    let running = backup.spawn().unwrap();
    common::wait_until(std::time::Duration::from_secs(60), "the first upload", uploading);
    running
}

/// Waits for the backup of `src` a fault hit: it completes, or fails with one clear line and
/// the next backup finishes the work; either way the repository then holds one snapshot.
fn backup_completes_or_the_next_does(c: &Cairn, running: std::process::Child, src: &Path) {
    let out = running.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        assert_eq!(err.lines().count(), 1, "{err}");
        c.backup(&[src], &[]);
    }
    assert_eq!(c.snapshots().len(), 1, "{err}");
}

#[test]
fn a_server_killed_during_uploads_leaves_no_partial_object_and_the_backup_completes() {
    let mut server = Server::start();
    let work = tempfile::tempdir().unwrap();
    let append = server.token(&["--repo", "laptop", "--role", "append"]);
    let c = server.cairn("laptop", &append);
    c.init(&[]);
    let src = work.path().join("big");
    std::fs::create_dir(&src).unwrap();
    let mut rng = common::Rng(9);
    for i in 0..12 {
        std::fs::write(src.join(format!("f{i}")), rng.bytes(4 << 20)).unwrap();
    }
    let repo = server.storage().join("laptop");
    // Killed as soon as the first pack is arriving or stored, with the rest still to come.
    let running = slow_backup(&c, &src, "8M", || {
        let temporaries = std::fs::read_dir(repo.join(".tmp")).map(|d| d.count()).unwrap_or(0);
        temporaries > 0 || objects(&repo).keys().any(|k| k.starts_with("data/"))
    });
    server.kill();
    // Nothing partial is under an object's name; the temporary files are not objects.
    assert_eq!(damaged_objects(&repo), Vec::<String>::new());
    server.restart();
    backup_completes_or_the_next_does(&c, running, &src);
    assert_eq!(damaged_objects(&repo), Vec::<String>::new());
    c.ok(["check", "--read-data"]);
}

#[test]
fn two_servers_in_front_of_one_bucket_serve_different_clients_at_once() {
    let bucket = common::servers::s3_repo("serve");
    let first = Server::start_in(tempfile::tempdir().unwrap(), &bucket, &[]);
    // The second shares the first's credentials file, as servers of one site do.
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("state")).unwrap();
    let admin = first.token(&["--all", "--role", "admin", "--name", "site"]);
    std::fs::copy(first.dir.path().join("state/credentials.json"), dir.path().join("state/credentials.json")).unwrap();
    let second = Server::start_in(dir, &bucket, &[]);
    let work = tempfile::tempdir().unwrap();
    let src = source(work.path());
    // One repository through each server, and a shared one through both, all at once.
    let a = first.cairn("a", &admin);
    let b = second.cairn("b", &admin);
    let shared = [first.cairn("shared", &admin), second.cairn("shared", &admin)];
    a.init(&[]);
    b.init(&[]);
    shared[0].init(&[]);
    std::thread::scope(|s| {
        for c in [&a, &b, &shared[0], &shared[1]] {
            let src = &src;
            s.spawn(move || c.backup(&[src], &[]));
        }
    });
    assert_eq!(a.snapshots().len(), 1);
    assert_eq!(second.cairn("a", &admin).snapshots().len(), 1, "the second server sees the first's repository");
    assert_eq!(shared[1].snapshots().len(), 2);
    for c in [&a, &b, &shared[0]] {
        c.ok(["check", "--read-data"]);
    }
}

/// A CA and a certificate it signed for `localhost` and 127.0.0.1, made with openssl in `dir`;
/// returns (CA, certificate, key).
fn certificates_signed_by_a_ca(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let run = |args: &[&str]| {
        let out = std::process::Command::new("openssl").current_dir(dir).args(args).output().unwrap();
        assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    let p256 = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"];
    run(&[&["req", "-x509"][..], &p256, &["-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", "/CN=CA"]]
        .concat());
    run(&[&["req"][..], &p256, &["-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost"]].concat());
    std::fs::write(dir.join("san.ext"), "subjectAltName=DNS:localhost,IP:127.0.0.1\n").unwrap();
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.pem",
        "-days",
        "2",
        "-extfile",
        "san.ext",
    ]);
    (dir.join("ca.pem"), dir.join("server.pem"), dir.join("server.key"))
}

#[test]
fn copy_between_a_plain_http_server_and_one_with_a_ca_signed_certificate() {
    let work = tempfile::tempdir().unwrap();
    // A plain HTTP server on loopback: a whole backup and check through cairn+http://.
    let plain = Server::start_with(&["--plain-http"]);
    let admin = plain.token(&["--all", "--role", "admin", "--name", "site"]);
    let (from, _) = backed_up(&plain, "src", work.path());
    assert!(from.repo.to_string_lossy().starts_with("cairn+http://"));
    from.ok(["check", "--read-data"]);
    // A server with a certificate a CA signed, sharing the credentials (so one token serves
    // both); the client checks the chain against --server-ca, with no fingerprint.
    let pki = tempfile::tempdir().unwrap();
    let (ca, cert, key) = certificates_signed_by_a_ca(pki.path());
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("state")).unwrap();
    std::fs::copy(plain.dir.path().join("state/credentials.json"), dir.path().join("state/credentials.json")).unwrap();
    std::fs::create_dir(dir.path().join("storage")).unwrap();
    let storage = dir.path().join("storage").to_string_lossy().into_owned();
    let (cert, key) = (cert.to_str().unwrap(), key.to_str().unwrap());
    let signed = Server::start_in(dir, &storage, &["--tls-cert", cert, "--tls-key", key]);
    let to = Cairn::new(Path::new(&format!("cairn+https://127.0.0.1:{}/dst", signed.addr.port())), common::PASSWORD)
        .with_env("CAIRN_SERVER_TOKEN", &admin)
        .with_env("CAIRN_SERVER_CA", ca.to_str().unwrap())
        .with_env("CAIRN_CACHE_DIR", work.path().join("cache").to_str().unwrap());
    to.init(&[]);
    let out = to.clone().with_env("CAIRN_FROM_PASSWORD", common::PASSWORD).ok([
        "copy",
        "--from-repo",
        from.repo.to_str().unwrap(),
    ]);
    assert_eq!(to.snapshots().len(), 1, "{out}");
    to.ok(["check", "--read-data"]);
    let target = work.path().join("target");
    to.restore("latest", &target);
    let src = work.path().join("src");
    common::assert_same(&common::scan_source(&src), &common::scan(&target.join(src.strip_prefix("/").unwrap())), true);
    // Against another CA, the certificate is refused in one line.
    let other = tempfile::tempdir().unwrap();
    let (other_ca, _, _) = certificates_signed_by_a_ca(other.path());
    let out = to.clone().with_env("CAIRN_SERVER_CA", other_ca.to_str().unwrap()).run(["snapshots"]);
    assert!(!out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stderr).lines().count(), 1, "{}", String::from_utf8_lossy(&out.stderr));
}

/// Restores the latest snapshot of `c` into a fresh directory under `work` and checks that it
/// equals `src` as scanned before the backup (`want`).
fn restores_exactly(c: &Cairn, src: &Path, want: &common::Scan, work: &Path) {
    let target = tempfile::tempdir_in(work).unwrap();
    c.restore("latest", target.path());
    common::assert_same(want, &common::scan(&target.path().join(src.strip_prefix("/").unwrap())), true);
}

#[test]
fn a_full_disk_under_the_server_is_one_clear_line_and_loses_nothing() {
    // The server's storage on a 6 MiB file system; dropped in reverse: the server, then the
    // mount, then the directories.
    let disk = tempfile::tempdir().unwrap();
    let _fs = common::Tmpfs::mount(disk.path(), "size=6m");
    let server = Server::start_in(tempfile::tempdir().unwrap(), disk.path().to_str().unwrap(), &[]);
    let work = tempfile::tempdir().unwrap();
    let (c, _) = backed_up(&server, "laptop", work.path());
    let small = work.path().join("src");
    let small_scan = common::scan_source(&small);
    // 12 MiB of incompressible bytes cannot fit.
    let big = work.path().join("big");
    std::fs::create_dir(&big).unwrap();
    std::fs::write(big.join("noise"), common::Rng(35).bytes(12 << 20)).unwrap();
    let out = c.run(["backup", big.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("the server's storage is full: nothing was stored; ask the server's admin to free space"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(server.log().contains(r#""status":507"#));
    // Nothing is lost: the first backup is whole, and nothing partial is under a name.
    assert_eq!(damaged_objects(disk.path().join("laptop").as_path()), Vec::<String>::new());
    assert_eq!(c.snapshots().len(), 1);
    restores_exactly(&c, &small, &small_scan, work.path());
    // Once the admin makes room, the same backup completes.
    let grown = std::process::Command::new("mount").args(["-o", "remount,size=64m"]).arg(disk.path()).status();
    assert!(grown.unwrap().success());
    let big_scan = common::scan_source(&big);
    c.backup(&[&big], &[]);
    assert_eq!(c.snapshots().len(), 2);
    c.ok(["check", "--read-data"]);
    restores_exactly(&c, &big, &big_scan, work.path());
}

#[test]
fn the_s3_storage_stopping_under_the_server_loses_nothing_and_failed_uploads_are_aborted() {
    let dir = tempfile::tempdir().unwrap();
    let mut minio = common::servers::OwnMinio::start(dir.path());
    let bucket = format!("s3:{}/{}/site", minio.endpoint, common::servers::BUCKET);
    let server = Server::start_in(tempfile::tempdir().unwrap(), &bucket, &[]);
    let admin = server.token(&["--all", "--role", "admin"]);
    let append = server.token(&["--repo", "laptop", "--role", "append"]);
    assert_eq!(server.raw("POST", "/v1/repos/laptop", Some(&admin), b"").0, 200);
    // A 20 MiB upload (three parts of a multipart upload) whose content does not match its
    // name is refused at its end, and the upload is aborted, not left holding space.
    let pack = common::Rng(36).bytes(20 << 20);
    let name = format!("data/00/{}", "0".repeat(64));
    let (status, body) = server.raw("PUT", &format!("/v1/repos/laptop/objects/{name}"), Some(&append), &pack);
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("does not match its name"), "{body}");
    assert_eq!(minio.incomplete_uploads(), 0, "the refused upload was not aborted");

    // A backup running, slowed by a bandwidth limit, when the storage goes away for a while.
    let c = server.cairn("laptop", &append);
    c.init(&[]);
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("data");
    std::fs::create_dir(&src).unwrap();
    let mut rng = common::Rng(37);
    for i in 0..8 {
        std::fs::write(src.join(format!("f{i}")), rng.bytes(3 << 20)).unwrap();
    }
    let want = common::scan_source(&src);
    let packs = minio.data.join(common::servers::BUCKET).join("site/laptop/data");
    let running = slow_backup(&c, &src, "6M", || std::fs::read_dir(&packs).map_or(0, |d| d.count()) > 0);
    minio.stop();
    std::thread::sleep(std::time::Duration::from_secs(3));
    minio.resume();
    backup_completes_or_the_next_does(&c, running, &src);
    c.ok(["check", "--read-data"]);
    restores_exactly(&c, &src, &want, work.path());
}

/// What a host holding an append token (and so the repository's password) can do by storing a
/// snapshot of another host's name and paths that becomes the newest (FORMAT.md §15.4): it
/// appears in listings named by its token, and `--stored-by` and a backup's choice of parent
/// never take it.
#[test]
fn a_planted_snapshot_is_named_by_its_token_and_never_chosen_by_stored_by_or_as_a_parent() {
    let server = Server::start();
    let work = tempfile::tempdir().unwrap();
    let laptop_token = server.token(&["--repo", "shared", "--role", "append", "--name", "laptop-append"]);
    let intruder_token = server.token(&["--repo", "shared", "--role", "append", "--name", "intruder-append"]);
    let laptop = server.cairn("shared", &laptop_token);
    let intruder = server.cairn("shared", &intruder_token);
    laptop.init(&[]);
    let src = source(work.path());
    let mine = common::snapshot_id(&laptop.backup(&[&src], &["--host", "laptop"]));
    // The intruder backs up the same paths under the laptop's name, with content of its choice.
    let planted_file = src.join("sub/small");
    std::fs::write(&planted_file, b"planted").unwrap();
    let planted = common::snapshot_id(&intruder.backup(&[&src], &["--host", "laptop"]));
    std::fs::write(&planted_file, b"hello").unwrap();

    // Listed, and named by the token that stored it (the server's record, not the client's word).
    let listed = laptop.snapshots();
    let by: Vec<(&str, &str)> =
        listed.iter().map(|s| (s["id"].as_str().unwrap(), s["stored_by"].as_str().unwrap())).collect();
    assert_eq!(by, [(mine.as_str(), "laptop-append"), (planted.as_str(), "intruder-append")]);
    let table = laptop.ok(["snapshots"]);
    assert!(table.contains("stored by") && table.contains("intruder-append"), "{table}");
    let record = |id: &str| std::fs::read(server.storage().join("shared/.serve/stored-by").join(id)).unwrap();
    assert_eq!(record(&planted), b"intruder-append");

    // `latest --host laptop` alone is the planted snapshot; with --stored-by, the laptop's own.
    let file = format!("latest:{}", planted_file.display());
    let dumped = |args: &[&str]| {
        let mut all = vec!["dump", file.as_str()];
        all.extend(args);
        laptop.run(&all).stdout
    };
    assert_eq!(dumped(&["--host", "laptop"]), b"planted");
    assert_eq!(dumped(&["--host", "laptop", "--stored-by", "laptop-append"]), b"hello");
    let target = work.path().join("restored");
    let restored = laptop.restore_with("latest", &target, &["--host", "laptop", "--stored-by", "laptop-append"]);
    assert_eq!(restored["snapshot_id"], mine.as_str(), "{restored}");
    assert_eq!(std::fs::read(common::restored_path(&target, &planted_file)).unwrap(), b"hello");
    // Named by ID, a snapshot of another token is refused with why.
    let out =
        laptop.run(["dump", &format!("{}:{}", &planted[..8], planted_file.display()), "--stored-by", "laptop-append"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("token \"intruder-append\" stored it"), "{err}");

    // The parent of the laptop's next backup is its own snapshot, never the planted one.
    let next = laptop.backup(&[&src], &["--host", "laptop"]);
    assert_eq!(next["parent"], mine.as_str(), "{next}");

    // The record cannot be forged: no request names it, and storing the laptop's snapshot again
    // (the same bytes) changes neither the snapshot nor who stored it.
    let path = format!("/v1/repos/shared/objects/.serve/stored-by/{mine}");
    assert_eq!(server.raw("PUT", &path, Some(&intruder_token), b"intruder-append").0, 400);
    let object = format!("snapshots/{mine}");
    let bytes = std::fs::read(server.storage().join("shared").join(&object)).unwrap();
    let (status, body) =
        server.raw("PUT", &format!("/v1/repos/shared/objects/{object}"), Some(&intruder_token), &bytes);
    assert_eq!(status, 200, "{body}");
    assert_eq!(record(&mine), b"laptop-append");

    // Without the server there is no record to filter by: one line says so.
    let direct = Cairn::new(&server.storage().join("shared"), common::PASSWORD);
    let out =
        direct.run(["restore", "latest", "--target", work.path().join("t2").to_str().unwrap(), "--stored-by", "x"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("is not behind `cairn serve`"), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(direct.snapshots().iter().all(|s| s.get("stored_by").is_none()));
}
