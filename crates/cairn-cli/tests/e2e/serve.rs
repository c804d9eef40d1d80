//! `cairn serve` end to end: a real server process over loopback TLS, the real `cairn` binary
//! as its client, and raw HTTPS requests for what no `cairn` command sends (issue 34).

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

use crate::support::{self as common, Cairn, KDF_ARGS};

/// A `cairn serve` process on a free loopback port, its storage directory, credentials and
/// request log; killed when dropped.
struct Server {
    child: Child,
    addr: SocketAddr,
    fingerprint: String,
    dir: tempfile::TempDir,
    tls: Arc<rustls::ClientConfig>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn cairn_bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_cairn"));
    for var in ["CAIRN_REPOSITORY", "CAIRN_SERVER_TOKEN", "CAIRN_SERVER_TOKEN_FILE", "CAIRN_SERVER_FINGERPRINT"] {
        c.env_remove(var);
    }
    c
}

impl Server {
    fn start() -> Server {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("storage")).unwrap();
        let mut child = cairn_bin()
            .args(["serve", "--storage"])
            .arg(dir.path().join("storage"))
            .args(["--listen", "127.0.0.1:0", "--log"])
            .arg(dir.path().join("requests.log"))
            .arg("--credentials")
            .arg(dir.path().join("state/credentials.json"))
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = lines.next().expect("cairn serve printed nothing").unwrap();
        let addr = first.rsplit("https://").next().unwrap().parse().unwrap_or_else(|_| panic!("{first}"));
        let mut fingerprint = String::new();
        for line in lines.by_ref().take(2) {
            if let Some(fp) = line.unwrap().strip_prefix("fingerprint (SHA-256): ") {
                fingerprint = fp.to_string();
            }
        }
        assert_eq!(fingerprint.len(), 64, "no fingerprint printed");
        let options =
            cairn_core::engine::storage::ServerOptions { fingerprint: Some(fingerprint.clone()), ..Default::default() };
        let tls = Arc::new(cairn_core::engine::storage::server_tls_config("test", &options).unwrap());
        Server { child, addr, fingerprint, dir, tls }
    }

    fn storage(&self) -> PathBuf {
        self.dir.path().join("storage")
    }

    /// `cairn serve token add ARGS…`; returns the token.
    fn token(&self, args: &[&str]) -> String {
        let out = cairn_bin()
            .args(["--json", "serve", "token", "add"])
            .args(args)
            .arg("--credentials")
            .arg(self.dir.path().join("state/credentials.json"))
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v["token"].as_str().unwrap().to_string()
    }

    /// A `cairn` runner for repository `name` with `token`.
    fn cairn(&self, name: &str, token: &str) -> Cairn {
        Cairn::new(Path::new(&format!("cairn+https://{}/{name}", self.addr)), common::PASSWORD)
            .with_env("CAIRN_SERVER_TOKEN", token)
            .with_env("CAIRN_SERVER_FINGERPRINT", &self.fingerprint)
            // A remote repository gets a metadata cache: the test's own, not the user's.
            .with_env("CAIRN_CACHE_DIR", self.dir.path().join("cache").to_str().unwrap())
    }

    /// Sends one raw request (the path exactly as given) over TLS; returns the status and body.
    fn raw(&self, method: &str, path: &str, token: Option<&str>, body: &[u8]) -> (u16, String) {
        self.raw_with(method, path, token, body, "")
    }

    fn raw_with(&self, method: &str, path: &str, token: Option<&str>, body: &[u8], extra: &str) -> (u16, String) {
        let tcp = std::net::TcpStream::connect(self.addr).unwrap();
        tcp.set_read_timeout(Some(std::time::Duration::from_secs(30))).unwrap();
        let conn = rustls::ClientConnection::new(self.tls.clone(), "localhost".try_into().unwrap()).unwrap();
        let mut tls = rustls::StreamOwned::new(conn, tcp);
        let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: localhost\r\n{auth}{extra}Content-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        let mut request = head.into_bytes();
        request.extend_from_slice(body);
        let _ = tls.write_all(&request);
        let mut response = Vec::new();
        let _ = tls.read_to_end(&mut response);
        let text = String::from_utf8_lossy(&response).into_owned();
        let status = text.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
        let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
        (status, body)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("requests.log")).unwrap_or_default()
    }
}

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
    assert!(packs_after < packs_before, "{packs_before} -> {packs_after}");
    a.ok(["check", "--read-data"]);
    let mut args = vec!["init"];
    args.extend(KDF_ARGS);
    // An append token may make a new repository, never a config over one.
    let out = c.run(&args);
    assert!(!out.status.success());
}

impl Server {
    /// Sends `request` as given over TLS (then closes the sending side); returns the status and
    /// body of the first answer (status 0 when the server closed without one).
    fn raw_bytes(&self, request: &[u8]) -> (u16, String) {
        let tcp = std::net::TcpStream::connect(self.addr).unwrap();
        tcp.set_read_timeout(Some(std::time::Duration::from_secs(60))).unwrap();
        let conn = rustls::ClientConnection::new(self.tls.clone(), "localhost".try_into().unwrap()).unwrap();
        let mut tls = rustls::StreamOwned::new(conn, tcp);
        let _ = tls.write_all(request);
        tls.conn.send_close_notify();
        let _ = tls.flush();
        let mut response = Vec::new();
        let _ = tls.read_to_end(&mut response);
        let text = String::from_utf8_lossy(&response).into_owned();
        let status = text.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
        let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
        (status, body)
    }
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
    let out = Command::new("systemd-analyze").arg("verify").arg(&copy).current_dir(dir.path()).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let ours: Vec<&str> = err.lines().filter(|l| l.contains("cairn-serve")).collect();
    assert!(out.status.success() && ours.is_empty(), "{err}");
}
