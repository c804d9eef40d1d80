//! Errors a person can read (issue 35): each failure of a remote location itself — a missing
//! bucket, an invalid bucket name, refused S3 credentials, a host that refuses connections or
//! does not exist, an unknown SSH host key, a refused SSH key, a missing directory, and a
//! `cairn serve` server that cannot be reached, refuses the token or shows another certificate —
//! is ONE line naming the location, what is wrong and what to do. Each test checks the exact
//! line; `--verbose` adds the backend's full context.

use std::path::Path;
use std::process::Command;

use crate::support::serve::Server;
use crate::support::{self, servers, Cairn};

/// A port on loopback nothing listens on.
fn closed_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Runs `cairn ARGS` for `cairn`'s location; asserts it fails with exit code `code` and exactly
/// the line `cairn: LINE`.
fn fails_with(cairn: &Cairn, args: &[&str], code: i32, line: &str) {
    let out = cairn.run(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr, format!("cairn: {line}\n"), "{}: {args:?}", cairn.repo.display());
    assert_eq!(out.status.code(), Some(code), "{stderr}");
}

fn init_args() -> Vec<&'static str> {
    let mut args = vec!["init"];
    args.extend(support::KDF_ARGS);
    args
}

fn cache() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

#[test]
fn s3_missing_bucket() {
    let s = servers::servers();
    let dir = cache();
    let location = format!("s3:{}/no-such-bucket/r", s.s3_endpoint);
    let cairn = servers::cairn(&location, dir.path());
    let line = format!(
        "{location}: no bucket `no-such-bucket` at {}: create it first, or correct the bucket's name",
        s.s3_endpoint
    );
    fails_with(&cairn, &init_args(), 1, &line);
    // With --verbose, the same line and then S3's own answer.
    let out = cairn.run(["--verbose", "init"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.starts_with(&format!("cairn: {line}: ")), "{stderr}");
    assert!(stderr.contains("NoSuchBucket") && stderr.len() > line.len() + 200, "{stderr}");
}

#[test]
fn s3_invalid_bucket_name() {
    let s = servers::servers();
    let dir = cache();
    let location = format!("s3:{}/Bad_Bucket/r", s.s3_endpoint);
    let line = format!("{location}: `Bad_Bucket` is not a valid bucket name: bucket names have no uppercase letters");
    fails_with(&servers::cairn(&location, dir.path()), &init_args(), 1, &line);
}

#[test]
fn s3_wrong_credentials() {
    let s = servers::servers();
    let dir = cache();
    let location = servers::s3_repo("badsecret");
    let cairn = servers::cairn(&location, dir.path()).with_env("AWS_SECRET_ACCESS_KEY", "wrong-secret");
    let line = format!(
        "{location}: S3 at {} refused the credentials (403, SignatureDoesNotMatch): check AWS_ACCESS_KEY_ID and \
         AWS_SECRET_ACCESS_KEY, and that they may use bucket `{}`",
        s.s3_endpoint,
        servers::BUCKET
    );
    fails_with(&cairn, &init_args(), 1, &line);
    fails_with(&cairn, &["snapshots"], 1, &line);
}

#[test]
fn s3_connection_refused() {
    let dir = cache();
    let port = closed_port();
    let location = format!("s3:http://127.0.0.1:{port}/{}/r", servers::BUCKET);
    let line = format!(
        "{location}: cannot connect to 127.0.0.1:{port}: connection refused: check that the S3 server runs there and \
         the port is right"
    );
    fails_with(&servers::cairn(&location, dir.path()), &["snapshots"], 1, &line);
}

#[test]
fn s3_no_such_host() {
    let dir = cache();
    let location = format!("s3:http://no-such-host.invalid:9000/{}/r", servers::BUCKET);
    let line = format!("{location}: no such host `no-such-host.invalid`: check the name in the location");
    fails_with(&servers::cairn(&location, dir.path()), &["snapshots"], 1, &line);
}

/// The servers' SFTP location as `host` names it, with `policy` for host keys.
fn sftp_at(host: &str, port: u16, path: &str, policy: &str, dir: &Path) -> (String, Cairn) {
    let s = servers::servers();
    let location = format!("sftp:{}@{host}:{port}:{path}", s.ssh_user);
    let cairn = servers::cairn(&location, dir).with_env("CAIRN_SFTP_KNOWN_HOSTS", policy);
    (location, cairn)
}

#[test]
fn sftp_unknown_host_key() {
    let s = servers::servers();
    let dir = cache();
    // As `localhost`: the other tests reach sshd as 127.0.0.1 with the policy `accept`, which
    // records its key for that name in known_hosts.
    let (location, cairn) = sftp_at("localhost", s.ssh_port, "/tmp/cairn-hostkey", "strict", dir.path());
    let line = format!(
        "{location}: the host key of localhost is not one known_hosts trusts: check its fingerprint and add it to \
         ~/.ssh/known_hosts (ssh-keyscan), or trust it on first use with --sftp-known-hosts add"
    );
    fails_with(&cairn, &["snapshots"], 1, &line);
}

#[test]
fn sftp_refused_key() {
    let s = servers::servers();
    let dir = cache();
    let key = dir.path().join("stranger");
    let made = Command::new("ssh-keygen").args(["-q", "-t", "ed25519", "-N", ""]).arg("-f").arg(&key).output().unwrap();
    assert!(made.status.success(), "ssh-keygen: {}", String::from_utf8_lossy(&made.stderr));
    let (location, cairn) = sftp_at("127.0.0.1", s.ssh_port, "/tmp/cairn-key", "accept", dir.path());
    let mut c = cairn.with_env("CAIRN_SFTP_KEY", key.to_str().unwrap()).command();
    c.env_remove("SSH_AUTH_SOCK").arg("snapshots");
    let out = support::output_within_timeout(&mut c);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let line = format!(
        "cairn: {location}: {}@127.0.0.1 refused the SSH key: check --sftp-key (or the SSH agent's keys) and the \
         server's authorized_keys\n",
        s.ssh_user
    );
    assert_eq!(stderr, line);
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn sftp_connection_refused_and_no_such_host() {
    let dir = cache();
    let port = closed_port();
    let (location, cairn) = sftp_at("127.0.0.1", port, "/tmp/r", "accept", dir.path());
    let line = format!(
        "{location}: cannot connect to 127.0.0.1:{port}: connection refused: check that sshd runs there and the port \
         is right"
    );
    fails_with(&cairn, &["snapshots"], 1, &line);
    let (location, cairn) = sftp_at("no-such-host.invalid", 22, "/tmp/r", "accept", dir.path());
    let line = format!("{location}: no such host `no-such-host.invalid`: check the name in the location");
    fails_with(&cairn, &["snapshots"], 1, &line);
}

#[test]
fn sftp_missing_directory() {
    let dir = cache();
    let location = servers::sftp_repo("missing");
    let line = format!(
        "no repository at {location}: check the location, or create a repository there with `cairn init` (the \
         location comes from -r/--repo or CAIRN_REPOSITORY)"
    );
    fails_with(&servers::cairn(&location, dir.path()), &["snapshots"], 10, &line);
}

/// A server with an admin token for repository `r`, and a runner for it with `token` and
/// `fingerprint` as given (right or wrong).
fn serve() -> (Server, String) {
    let server = Server::start();
    let token = server.token(&["--repo", "r", "--role", "admin"]);
    (server, token)
}

fn served(server: &Server, token: &str, fingerprint: &str) -> (String, Cairn) {
    let location = format!("cairn+https://{}/r", server.addr);
    (location, server.cairn("r", token).with_env("CAIRN_SERVER_FINGERPRINT", fingerprint))
}

#[test]
fn server_bad_token_and_wrong_fingerprint() {
    let (server, token) = serve();
    let (location, cairn) = served(&server, "not-a-token", &server.fingerprint);
    let line = format!(
        "{location}: the server refused the token (401 Unauthorized): check --server-token-file or CAIRN_SERVER_TOKEN \
         (a token `cairn serve` made for this repository)"
    );
    fails_with(&cairn, &init_args(), 1, &line);
    let other = "ab".repeat(32);
    let (location, cairn) = served(&server, &token, &other);
    let line = format!(
        "{location}: the server's certificate has fingerprint {}, not the one given: check --server-fingerprint \
         against what `cairn serve` printed",
        server.fingerprint
    );
    // Refused at once: the client's five tries with back-off would take over 6 s.
    let started = std::time::Instant::now();
    fails_with(&cairn, &init_args(), 1, &line);
    assert!(started.elapsed() < std::time::Duration::from_secs(5), "a wrong fingerprint was tried again");
    // The right token and fingerprint: the server works.
    let (_, cairn) = served(&server, &token, &server.fingerprint);
    cairn.init(&[]);
}

#[test]
fn server_unreachable() {
    let dir = cache();
    let port = closed_port();
    let location = format!("cairn+https://127.0.0.1:{port}/r");
    let cairn = Cairn::new(Path::new(&location), support::PASSWORD)
        .with_env("CAIRN_SERVER_TOKEN", "t")
        .with_env("CAIRN_SERVER_FINGERPRINT", &"ab".repeat(32))
        .with_env("CAIRN_CACHE_DIR", dir.path().to_str().unwrap());
    let line = format!(
        "{location}: cannot connect to 127.0.0.1:{port}: connection refused: check that `cairn serve` runs there and \
         the port is right"
    );
    fails_with(&cairn, &["snapshots"], 1, &line);
}
