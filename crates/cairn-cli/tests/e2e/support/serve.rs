//! The one `cairn serve` starter the end-to-end tests share: a real server process over
//! loopback TLS with its own storage directory, credentials and request log.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

use super::Cairn;

/// A `cairn serve` process on a free loopback port, its storage directory, credentials and
/// request log; killed when dropped.
pub struct Server {
    pub child: Child,
    pub addr: SocketAddr,
    pub fingerprint: String,
    pub dir: tempfile::TempDir,
    /// How raw requests reach it over TLS (none for plain HTTP).
    tls: Option<Arc<rustls::ClientConfig>>,
    /// The `--storage` location and the arguments it was started with, for a restart.
    storage: String,
    args: Vec<String>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `cairn` binary without the environment that would point it at another server.
pub fn cairn_bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_cairn"));
    for var in ["CAIRN_REPOSITORY", "CAIRN_SERVER_TOKEN", "CAIRN_SERVER_TOKEN_FILE", "CAIRN_SERVER_FINGERPRINT"] {
        c.env_remove(var);
    }
    c
}

impl Server {
    /// A server with a fresh storage directory.
    pub fn start() -> Server {
        Server::start_with(&[])
    }

    /// A server with `args` added to `cairn serve` (`--quota`, …).
    pub fn start_with(args: &[&str]) -> Server {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("storage")).unwrap();
        let storage = dir.path().join("storage").to_string_lossy().into_owned();
        Server::start_in(dir, &storage, args)
    }

    /// A server in front of `storage` (any location; the test S3 server's credentials are
    /// given to it), with its credentials and log in `dir`.
    pub fn start_in(dir: tempfile::TempDir, storage: &str, args: &[&str]) -> Server {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let (child, addr, fingerprint) = spawn(dir.path(), storage, "127.0.0.1:0", &args);
        let tls = (!fingerprint.is_empty()).then(|| {
            let options = cairn_core::engine::storage::ServerOptions {
                fingerprint: Some(fingerprint.clone()),
                ..Default::default()
            };
            Arc::new(cairn_core::engine::storage::server_tls_config("test", &options).unwrap())
        });
        Server { child, addr, fingerprint, dir, tls, storage: storage.to_string(), args }
    }

    /// Kills the server with SIGKILL (nothing of it runs on) and waits for it to be gone.
    pub fn kill(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// Starts the server again on the same address, storage, credentials and certificate.
    pub fn restart(&mut self) {
        let (child, addr, fingerprint) = spawn(self.dir.path(), &self.storage, &self.addr.to_string(), &self.args);
        assert_eq!((addr, &fingerprint), (self.addr, &self.fingerprint));
        self.child = child;
    }

    pub fn storage(&self) -> PathBuf {
        self.dir.path().join("storage")
    }

    /// `cairn serve token add ARGS…`; returns the token.
    pub fn token(&self, args: &[&str]) -> String {
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
    pub fn cairn(&self, name: &str, token: &str) -> Cairn {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let c = Cairn::new(Path::new(&format!("cairn+{scheme}://{}/{name}", self.addr)), super::PASSWORD)
            .with_env("CAIRN_SERVER_TOKEN", token)
            // A remote repository gets a metadata cache: the test's own, not the user's.
            .with_env("CAIRN_CACHE_DIR", self.dir.path().join("cache").to_str().unwrap());
        match self.tls {
            Some(_) => c.with_env("CAIRN_SERVER_FINGERPRINT", &self.fingerprint),
            None => c,
        }
    }

    /// Sends one raw request (the path exactly as given) over TLS; returns the status and body.
    pub fn raw(&self, method: &str, path: &str, token: Option<&str>, body: &[u8]) -> (u16, String) {
        self.raw_with(method, path, token, body, "")
    }

    pub fn raw_with(&self, method: &str, path: &str, token: Option<&str>, body: &[u8], extra: &str) -> (u16, String) {
        let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: localhost\r\n{auth}{extra}Content-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        let mut request = head.into_bytes();
        request.extend_from_slice(body);
        self.exchange(&request, std::time::Duration::from_secs(30), false)
    }

    /// Sends `request` as given over TLS (then closes the sending side); returns the status and
    /// body of the first answer (status 0 when the server closed without one).
    pub fn raw_bytes(&self, request: &[u8]) -> (u16, String) {
        self.exchange(request, std::time::Duration::from_secs(60), true)
    }

    /// Sends `request` over a new TLS connection (with `close`, then closes the sending side)
    /// and reads until the server closes, for at most `timeout` a read; returns the status and
    /// body of the first answer (status 0 when there was none).
    fn exchange(&self, request: &[u8], timeout: std::time::Duration, close: bool) -> (u16, String) {
        let tcp = std::net::TcpStream::connect(self.addr).unwrap();
        tcp.set_read_timeout(Some(timeout)).unwrap();
        let conn = rustls::ClientConnection::new(
            self.tls.clone().expect("a server over TLS"),
            "localhost".try_into().unwrap(),
        )
        .unwrap();
        let mut tls = rustls::StreamOwned::new(conn, tcp);
        let _ = tls.write_all(request);
        if close {
            tls.conn.send_close_notify();
            let _ = tls.flush();
        }
        let mut response = Vec::new();
        let _ = tls.read_to_end(&mut response);
        let text = String::from_utf8_lossy(&response).into_owned();
        let status = text.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
        let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
        (status, body)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("requests.log")).unwrap_or_default()
    }
}

/// Starts `cairn serve` in front of `storage` on `listen`, its credentials and log in `dir`; returns it, its address and
/// its certificate's fingerprint (empty over plain HTTP).
fn spawn(dir: &Path, storage: &str, listen: &str, args: &[String]) -> (Child, SocketAddr, String) {
    let mut child = cairn_bin()
        .env("AWS_ACCESS_KEY_ID", super::servers::S3_USER)
        .env("AWS_SECRET_ACCESS_KEY", super::servers::S3_SECRET)
        .env("AWS_DEFAULT_REGION", "us-east-1")
        .args(["serve", "--storage", storage])
        .args(["--listen", listen, "--log"])
        .arg(dir.join("requests.log"))
        .arg("--credentials")
        .arg(dir.join("state/credentials.json"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let first = lines.next().expect("cairn serve printed nothing").unwrap();
    let addr = first.rsplit("://").next().unwrap().parse().unwrap_or_else(|_| panic!("{first}"));
    // Over HTTPS, the certificate and its fingerprint follow.
    let mut fingerprint = String::new();
    if first.contains("https://") {
        for line in lines.by_ref().take(2) {
            if let Some(fp) = line.unwrap().strip_prefix("fingerprint (SHA-256): ") {
                fingerprint = fp.to_string();
            }
        }
        assert_eq!(fingerprint.len(), 64, "no fingerprint printed");
    }
    (child, addr, fingerprint)
}
