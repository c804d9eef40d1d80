//! `cairn agent` (issue 36): the scheduler, `agent status` / `run-now` / `once`, history across
//! restarts, `/metrics` and the metrics file, alerts to a real HTTP receiver and a command, a
//! profile with an unreachable repository, SIGTERM and kill -9 in the middle of a backup, the
//! clock jumping; the web interface in a real Chromium ([`browser`]); the systemd units
//! ([`systemd`]).

mod browser;
mod systemd;

use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::{ok, output_within_timeout, wait_until, KDF_ARGS, PASSWORD};

/// A directory with a source tree, repositories, a configuration file and the agent's state.
pub struct AgentFx {
    _tmp: tempfile::TempDir,
    pub dir: PathBuf,
    pub config: PathBuf,
    pub state: PathBuf,
    pub agent: Option<Child>,
    pub url: String,
    pub env: Vec<(String, String)>,
    /// More arguments of `cairn agent` (after `--state-dir`).
    pub agent_args: Vec<String>,
}

/// `cairn ARGS` with no CAIRN_* variables of the machine and private XDG directories.
pub fn cairn_cmd(dir: &Path, env: &[(String, String)]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_cairn"));
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("CAIRN_") {
            c.env_remove(k);
        }
    }
    c.current_dir(dir)
        .env("XDG_CONFIG_HOME", dir.join("xdg"))
        .env("XDG_CACHE_HOME", dir.join("cache"))
        .env("HOME", dir.join("home"));
    c.envs(env.iter().map(|(k, v)| (k, v)));
    c
}

impl AgentFx {
    /// Source files in `src/` (`files` of `size` bytes each, plus `sub/deep.txt`), and a
    /// configuration file with `profiles` (TOML after a `[profile.base]` with the password).
    pub fn new(files: usize, size: usize, profiles: &str) -> AgentFx {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().canonicalize().unwrap();
        fs::create_dir_all(dir.join("src/sub")).unwrap();
        for i in 0..files {
            let data: Vec<u8> = (0..size).map(|j| ((i * 7919 + j * 31) % 251) as u8).collect();
            fs::write(dir.join(format!("src/file{i:03}.bin")), data).unwrap();
        }
        fs::write(dir.join("src/sub/deep.txt"), "found by browsing\n").unwrap();
        let config = dir.join("cairn.toml");
        let text = format!(
            "[profile.base]\npassword = \"{PASSWORD}\"\n\n{}",
            profiles.replace("{DIR}", &dir.to_string_lossy())
        );
        fs::write(&config, text).unwrap();
        let mut perm = fs::metadata(&config).unwrap().permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut perm, 0o600);
        fs::set_permissions(&config, perm).unwrap();
        AgentFx {
            _tmp: tmp,
            state: dir.join("state"),
            config,
            dir,
            agent: None,
            url: String::new(),
            env: Vec::new(),
            agent_args: Vec::new(),
        }
    }

    /// `cairn --config FILE ARGS`.
    pub fn cairn(&self, args: &[&str]) -> Output {
        let mut c = cairn_cmd(&self.dir, &self.env);
        c.arg("--config").arg(&self.config).args(args);
        output_within_timeout(&mut c)
    }

    /// Makes the repository of `profile`.
    pub fn init(&self, profile: &str) {
        let mut args = vec!["-p", profile, "init"];
        args.extend(KDF_ARGS);
        ok(&self.cairn(&args));
    }

    /// Starts the agent on a free port; returns once it listens.
    pub fn start(&mut self) {
        let mut c = cairn_cmd(&self.dir, &self.env);
        c.arg("--config")
            .arg(&self.config)
            .args(["agent", "--listen", "127.0.0.1:0", "--state-dir"])
            .arg(&self.state)
            .args(&self.agent_args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut child = c.spawn().expect("starting the agent");
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut first = String::new();
        out.read_line(&mut first).unwrap();
        // Read on, so the agent never writes into a closed pipe.
        std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
        let url = first.split("web interface at ").nth(1).expect("the agent says where it listens").trim();
        self.url = url.to_string();
        self.agent = Some(child);
    }

    /// Stops the agent with SIGTERM and waits for it; returns how long that took.
    pub fn stop(&mut self) -> Duration {
        let Some(mut child) = self.agent.take() else { return Duration::ZERO };
        let t = Instant::now();
        // SAFETY: a signal to our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let end = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                assert!(status.success(), "the agent ended with {status} on SIGTERM");
                return t.elapsed();
            }
            assert!(Instant::now() < end, "the agent did not stop within 60 s of SIGTERM");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The agent's password.
    pub fn token(&self) -> String {
        fs::read_to_string(self.state.join("token")).unwrap().trim().to_string()
    }

    /// `cairn agent status --json`.
    pub fn status(&self) -> Value {
        let out = self.cairn(&["--json", "agent", "--state-dir", &self.state.to_string_lossy(), "status"]);
        serde_json::from_str(&ok(&out)).unwrap()
    }

    /// A profile's entry in the status.
    pub fn profile(&self, name: &str) -> Value {
        let s = self.status();
        s["profiles"].as_array().unwrap().iter().find(|p| p["name"] == name).cloned().expect("profile in status")
    }

    /// `cairn agent run-now PROFILE --job JOB`.
    pub fn run_now(&self, profile: &str, job: &str) -> String {
        ok(&self.cairn(&["agent", "--state-dir", &self.state.to_string_lossy(), "run-now", profile, "--job", job]))
    }

    /// Waits until `profile`'s last run is newer than `after` and returns it.
    pub fn wait_run(&self, profile: &str, after: u64, secs: u64) -> Value {
        let mut last = Value::Null;
        wait_until(Duration::from_secs(secs), &format!("a run of {profile} after run {after}"), || {
            let p = self.profile(profile);
            last = p["last"].clone();
            p["running"].is_null() && last["id"].as_u64().unwrap_or(0) > after
        });
        last
    }

    /// An HTTP GET of the agent with the password as a bearer token: (status, body).
    pub fn get(&self, path: &str, token: Option<&str>) -> (u16, String) {
        http(&self.url, "GET", path, token, "")
    }
}

impl Drop for AgentFx {
    fn drop(&mut self) {
        if let Some(mut c) = self.agent.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// One plain HTTP/1.1 request to `base` (`http://HOST:PORT`): (status, body).
pub fn http(base: &str, method: &str, path: &str, token: Option<&str>, body: &str) -> (u16, String) {
    let addr = base.trim_start_matches("http://");
    let mut s = TcpStream::connect(addr).unwrap();
    let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut resp = Vec::new();
    s.read_to_end(&mut resp).unwrap();
    let text = String::from_utf8_lossy(&resp).into_owned();
    let status = text.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    (status, dechunk(&body))
}

/// The body of a chunked response, joined.
fn dechunk(body: &str) -> String {
    let mut out = String::new();
    let mut rest = body;
    loop {
        let Some((len, after)) = rest.split_once("\r\n") else { return body.to_string() };
        let Ok(n) = usize::from_str_radix(len.trim(), 16) else { return body.to_string() };
        if n == 0 || after.len() < n {
            return if n == 0 { out } else { body.to_string() };
        }
        out.push_str(&after[..n]);
        rest = after[n..].trim_start_matches("\r\n");
    }
}

/// A real HTTP server on loopback that records each POSTed body.
pub struct Receiver {
    pub url: String,
    pub bodies: Arc<Mutex<Vec<Value>>>,
}

impl Receiver {
    pub fn start() -> Receiver {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/hook", l.local_addr().unwrap());
        let bodies = Arc::new(Mutex::new(Vec::new()));
        let got = bodies.clone();
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(mut s) = s else { continue };
                let mut r = BufReader::new(s.try_clone().unwrap());
                let mut len = 0;
                let mut line = String::new();
                while r.read_line(&mut line).unwrap_or(0) > 0 {
                    if line == "\r\n" {
                        break;
                    }
                    if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                        len = v.trim().parse().unwrap_or(0);
                    }
                    line.clear();
                }
                let mut body = vec![0; len];
                let _ = r.read_exact(&mut body);
                if let Ok(v) = serde_json::from_slice(&body) {
                    got.lock().unwrap().push(v);
                }
                let _ = s.write_all(b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n");
            }
        });
        Receiver { url, bodies }
    }
}

fn home(extra: &str) -> String {
    format!("[profile.home]\ninherit = \"base\"\nrepo = \"{{DIR}}/repo\"\n[profile.home.backup]\npaths = [\"{{DIR}}/src\"]\n[profile.home.schedule]\nbackup = \"daily 03:00\"\n{extra}\n")
}

#[test]
fn run_now_status_metrics_history_and_restart() {
    let mut fx = AgentFx::new(20, 10_000, &home("check = \"sun 04:00\""));
    fx.init("home");
    fx.start();
    let p = fx.profile("home");
    assert_eq!(p["state"], "idle");
    assert!(p["last"].is_null());
    let next: Vec<_> = p["next"].as_array().unwrap().iter().map(|n| n["job"].as_str().unwrap().to_string()).collect();
    assert_eq!(next, ["backup", "check"]);
    assert!(fx.run_now("home", "backup").contains("backup of profile home queued"));
    let last = fx.wait_run("home", 0, 120);
    assert_eq!(last["outcome"], "success", "{last}");
    assert_eq!(last["reason"], "run-now");
    assert_eq!(last["files"], 21);
    assert!(last["snapshot"].as_str().unwrap().len() == 64);
    // The snapshot is in the repository.
    let snaps = ok(&fx.cairn(&["-p", "home", "--json", "snapshots"]));
    assert!(snaps.contains(last["snapshot"].as_str().unwrap()));
    // Metrics: refused without the password, served with it.
    assert_eq!(fx.get("/metrics", None).0, 401);
    assert_eq!(fx.get("/metrics", Some("wrong")).0, 401);
    let (code, m) = fx.get("/metrics", Some(&fx.token()));
    assert_eq!(code, 200);
    for want in [
        "cairn_last_success_timestamp_seconds{profile=\"home\",job=\"backup\"}",
        "cairn_backup_files{profile=\"home\"} 21",
        "cairn_last_run_success{profile=\"home\",job=\"backup\"} 1",
        "cairn_next_run_timestamp_seconds{profile=\"home\",job=\"check\"}",
        "cairn_repository_size_bytes{profile=\"home\"}",
        "cairn_agent_jobs_running 0",
        "cairn_agent_jobs_queued 0",
    ] {
        assert!(m.contains(want), "{want} missing in\n{m}");
    }
    // The run's log is kept.
    let log = fs::read_to_string(fx.state.join("logs").join(format!("{}.log", last["id"]))).unwrap();
    assert!(log.contains("\"message_type\":\"summary\""), "{log}");
    // The history survives a restart.
    fx.stop();
    fx.start();
    let again = fx.profile("home");
    assert_eq!(again["last"]["id"], last["id"]);
    assert_eq!(again["last"]["outcome"], "success");
    let text = ok(&fx.cairn(&["agent", "--state-dir", &fx.state.to_string_lossy(), "status"]));
    assert!(text.contains("home: idle") && text.contains("last backup success"), "{text}");
    // A check, and `run-now` of a profile the agent does not have.
    fx.run_now("home", "check");
    let check = fx.wait_run("home", last["id"].as_u64().unwrap(), 120);
    assert_eq!((check["job"].as_str(), check["outcome"].as_str()), (Some("check"), Some("success")), "{check}");
    let out = fx.cairn(&["agent", "--state-dir", &fx.state.to_string_lossy(), "run-now", "nobody"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no profile \"nobody\""), "{out:?}");
    fx.stop();
    // `agent once` (a timer's run): same history, and the node exporter's file.
    let prom = fx.dir.join("home.prom");
    let out = fx.cairn(&[
        "agent",
        "--state-dir",
        &fx.state.to_string_lossy(),
        "--metrics-file",
        &prom.to_string_lossy(),
        "once",
        "home",
    ]);
    assert!(ok(&out).contains("backup of profile home: success"));
    let m = fs::read_to_string(&prom).unwrap();
    assert!(m.contains("# TYPE cairn_last_success_timestamp_seconds gauge"), "{m}");
    assert!(m.contains("cairn_backup_files{profile=\"home\"} 21"), "{m}");
    let history = fs::read_to_string(fx.state.join("history.jsonl")).unwrap();
    assert_eq!(history.lines().count(), 3, "{history}");
}

#[test]
fn an_unreachable_repository_fails_alerts_and_others_still_run() {
    let hook = Receiver::start();
    let profiles = format!(
        "{}[profile.away]\ninherit = \"base\"\nrepo = \"{{DIR}}/no-such-repo\"\n[profile.away.backup]\npaths = [\"{{DIR}}/src\"]\n\
[profile.away.schedule]\nbackup = \"daily 03:00\"\nretries = \"1\"\nretry-delay = \"1s\"\nwebhook = \"{}\"\nnotify-command = \"cat > {{DIR}}/alert.json\"\n",
        home(""),
        hook.url
    );
    let mut fx = AgentFx::new(5, 1000, &profiles);
    fx.init("home");
    fx.start();
    fx.run_now("away", "backup");
    fx.run_now("home", "backup");
    let home = fx.wait_run("home", 0, 120);
    assert_eq!(home["outcome"], "success");
    let away = fx.wait_run("away", 0, 120);
    assert_eq!(away["outcome"], "failed", "{away}");
    assert!(away["message"].as_str().unwrap().contains("no-such-repo"), "{away}");
    wait_until(Duration::from_secs(30), "the webhook", || !hook.bodies.lock().unwrap().is_empty());
    let alert = hook.bodies.lock().unwrap()[0].clone();
    assert_eq!(alert["event"], "failure");
    assert_eq!(alert["profile"], "away");
    assert_eq!(alert["job"], "backup");
    let host = gethostname();
    assert_eq!(alert["host"], host.as_str());
    let msg = alert["message"].as_str().unwrap();
    assert!(msg.contains("backup of profile away on") && msg.contains(&host) && msg.contains("no-such-repo"), "{msg}");
    wait_until(Duration::from_secs(30), "the notify command", || {
        fs::read_to_string(fx.dir.join("alert.json")).is_ok_and(|t| t.contains("failure"))
    });
    // A missing repository is not transient: no retry.
    assert_eq!(fx.profile("away")["state"], "idle");
    let h = fs::read_to_string(fx.state.join("history.jsonl")).unwrap();
    assert_eq!(h.lines().filter(|l| l.contains("\"profile\":\"away\"")).count(), 1, "{h}");
    // The repository appears: the next run recovers, and says so.
    let mut args = vec!["-p", "away", "init"];
    args.extend(KDF_ARGS);
    ok(&fx.cairn(&args));
    fx.run_now("away", "backup");
    let again = fx.wait_run("away", away["id"].as_u64().unwrap(), 120);
    assert_eq!(again["outcome"], "success");
    wait_until(Duration::from_secs(30), "the recovery webhook", || hook.bodies.lock().unwrap().len() >= 2);
    assert_eq!(hook.bodies.lock().unwrap()[1]["event"], "recovery");
}

/// The text of the element with `id` in `html` (the first one; tags inside it dropped).
fn element_text(html: &str, id: &str) -> String {
    let at = html.find(&format!("id=\"{id}\"")).unwrap_or_else(|| panic!("no #{id} in\n{html}"));
    let body = &html[at..];
    let body = &body[body.find('>').unwrap() + 1..];
    let mut depth = 0usize;
    let (mut text, mut in_tag) = (String::new(), false);
    for (i, ch) in body.char_indices() {
        match ch {
            '<' if body[i..].starts_with("</") && !in_tag => {
                if depth == 0 {
                    break;
                }
                depth -= 1;
                in_tag = true;
            }
            '<' => {
                depth += 1;
                in_tag = true;
            }
            '>' => in_tag = false,
            c if !in_tag => text.push(c),
            _ => {}
        }
    }
    text
}

#[test]
fn health_shows_packs_never_verified_and_what_a_prune_would_reclaim() {
    let config = format!("{}[profile.home.check]\nread-data = true\n", home(""));
    let mut fx = AgentFx::new(20, 10_000, &config);
    // Incompressible files, so a snapshot's data fills packs of its own.
    let noise = |seed: u64| {
        let mut x = seed | 1;
        (0..200_000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect::<Vec<u8>>()
    };
    for i in 0..20 {
        fs::write(fx.dir.join(format!("src/file{i:03}.bin")), noise(i + 1)).unwrap();
    }
    fx.init("home");
    fx.start();
    fx.run_now("home", "backup");
    let first = fx.wait_run("home", 0, 120);
    assert_eq!(first["outcome"], "success", "{first}");
    let token = fx.token();
    let page = |q: &str| {
        let (code, html) = fx.get(&format!("/p/home/health{q}"), Some(&token));
        assert_eq!(code, 200, "{html}");
        html
    };
    let packs =
        fs::read_dir(fx.dir.join("repo/data")).unwrap().flat_map(|d| fs::read_dir(d.unwrap().path()).unwrap()).count();
    assert!(packs >= 1);
    let html = page("");
    assert_eq!(
        element_text(&html, "never-verified"),
        format!("{packs} of {packs} packs"),
        "no check has read a pack yet"
    );
    assert!(element_text(&html, "reclaimable").starts_with("work it out"), "{html}");
    assert_eq!(element_text(&html, "locks"), "0");
    // A data check reads every pack: none is left unverified.
    fx.run_now("home", "check");
    let check = fx.wait_run("home", first["id"].as_u64().unwrap(), 120);
    assert_eq!(check["outcome"], "success", "{check}");
    let never = element_text(&page(""), "never-verified");
    assert!(never.starts_with(&format!("0 of {packs} packs; the others read within")), "{never}");
    // Every file changed, the first snapshot forgotten: its packs are reclaimable, whole.
    let none = element_text(&page("?reclaimable=1"), "reclaimable");
    // (Small packs may be merged: that frees their headers, not whole packs.)
    assert!(none.contains("(0 packs deleted whole, "), "no pack is unused yet: {none}");
    for i in 0..20 {
        fs::write(fx.dir.join(format!("src/file{i:03}.bin")), noise(i + 1000)).unwrap();
    }
    fx.run_now("home", "backup");
    let second = fx.wait_run("home", check["id"].as_u64().unwrap(), 120);
    assert_eq!(second["outcome"], "success", "{second}");
    ok(&fx.cairn(&["-p", "home", "forget", "--keep-last", "1"]));
    let reclaim = element_text(&page("?reclaimable=1"), "reclaimable");
    assert!(!reclaim.starts_with("0 B"), "{reclaim}");
    let count = |after: &str| -> u64 {
        let head = reclaim.split(after).next().unwrap();
        head.rsplit(['(', ' ']).next().unwrap().parse().unwrap_or_else(|_| panic!("{reclaim}"))
    };
    let (deleted, repacked) = (count(" packs deleted whole"), count(" repacked"));
    assert!(deleted + repacked >= 1, "{reclaim}");
    // What the page said is what a prune does.
    let out = ok(&fx.cairn(&["-p", "home", "--json", "prune"]));
    let summary: Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    let plan = &summary["plan"];
    assert_eq!(
        (plan["delete_packs"].as_u64(), plan["repack_packs"].as_u64()),
        (Some(deleted), Some(repacked)),
        "{summary}"
    );
    assert!(summary["freed_bytes"].as_u64().unwrap() > 0, "{summary}");
}

#[test]
fn a_directory_of_250000_entries_pages() {
    const N: usize = 250_000;
    let mut fx = AgentFx::new(0, 0, &home(""));
    let big = fx.dir.join("src/big");
    fs::create_dir_all(&big).unwrap();
    for i in 0..N {
        fs::File::create(big.join(format!("f{i:06}"))).unwrap();
    }
    fx.init("home");
    fx.start();
    fx.run_now("home", "backup");
    let run = fx.wait_run("home", 0, 300);
    assert_eq!(run["outcome"], "success", "{run}");
    let snap = run["snapshot"].as_str().unwrap()[..8].to_string();
    let token = fx.token();
    let page = |n: usize| {
        let started = Instant::now();
        let (code, html) = fx.get(&format!("/p/home/s/{snap}/tree?path={}&page={n}", big.display()), Some(&token));
        assert_eq!(code, 200, "{html}");
        eprintln!("page {n} of a directory of {N} entries: {:?}", started.elapsed());
        let table = &html[html.find("id=\"entries\"").unwrap()..];
        let rows = table[..table.find("</table>").unwrap()].matches("<tr>").count();
        (html, rows)
    };
    let (first, rows) = page(0);
    assert!(first.contains(&format!("{N} entries")), "the total is shown");
    assert_eq!(rows, 1 + 200, "a header and one page");
    assert!(first.contains(">f000000<") && first.contains(">f000199<") && !first.contains(">f000200<"));
    assert!(first.contains("id=\"next-page\""));
    let (last, rows) = page(N / 200 - 1);
    assert_eq!(rows, 1 + 200);
    assert!(last.contains(">f249999<") && !last.contains("id=\"next-page\""), "the last page");
    let (_, rows) = page(N / 200);
    assert_eq!(rows, 1, "past the end: no entries");
}

#[test]
fn https_with_a_certificate_and_secure_cookies() {
    let mut fx = AgentFx::new(2, 1_000, &home(""));
    fx.init("home");
    let (cert, key) = (fx.dir.join("agent.crt"), fx.dir.join("agent.key"));
    let made = Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2"])
        .args(["-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .unwrap();
    assert!(made.status.success(), "openssl: {}", String::from_utf8_lossy(&made.stderr));
    fx.agent_args =
        vec!["--tls-cert".into(), cert.to_string_lossy().into(), "--tls-key".into(), key.to_string_lossy().into()];
    fx.start();
    assert!(fx.url.starts_with("https://127.0.0.1:"), "{}", fx.url);
    let curl = |args: &[&str]| {
        let out =
            Command::new("curl").args(["-sS", "--max-time", "20", "--cacert"]).arg(&cert).args(args).output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    // The certificate given is the one served: curl trusts it and nothing else.
    let metrics = format!("{}/metrics", fx.url);
    let (code, body, err) = curl(&["-H", &format!("Authorization: Bearer {}", fx.token()), &metrics]);
    assert_eq!(code, Some(0), "{err}");
    assert!(body.contains("cairn_agent_jobs_running 0"), "{body}");
    let (_, body, _) = curl(&[&metrics]);
    assert!(body.contains("log in first"), "no password, no metrics: {body}");
    let untrusted = Command::new("curl").args(["-sS", "--max-time", "20", &metrics]).output().unwrap();
    assert!(!untrusted.status.success(), "a client without the certificate must refuse the server");
    // Plain HTTP on the HTTPS port is not served.
    let plain = Command::new("curl")
        .args(["-sS", "--max-time", "20", &metrics.replace("https://", "http://")])
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&plain.stdout).contains("cairn_agent"), "served over plain HTTP");
    // Logging in over HTTPS sets a Secure, HttpOnly cookie.
    let login = format!("{}/login", fx.url);
    let (code, headers, err) = curl(&["-i", "--data-urlencode", &format!("password={}", fx.token()), &login]);
    assert_eq!(code, Some(0), "{err}");
    let cookie = headers
        .lines()
        .find(|l| l.to_ascii_lowercase().starts_with("set-cookie:"))
        .unwrap_or_else(|| panic!("{headers}"));
    assert!(cookie.contains("; Secure") && cookie.contains("HttpOnly"), "{cookie}");
}

fn gethostname() -> String {
    fs::read_to_string("/proc/sys/kernel/hostname").unwrap().trim().to_string()
}

/// A backup that holds for 8 s before it writes its snapshot (every file read), so a test can
/// act while it runs.
fn slow_backup_fixture(extra: &str) -> AgentFx {
    let mut fx = AgentFx::new(200, 20_000, &home(extra));
    fx.init("home");
    fx.env.push(("CAIRN_INJECT_FAULTS".into(), "stall-write=snapshots/,stall-for=8s".into()));
    fx
}

fn running_pid(fx: &AgentFx) -> u32 {
    let mut pid = 0;
    wait_until(Duration::from_secs(60), "a running backup with progress", || {
        let p = fx.profile("home");
        pid = p["running"]["pid"].as_u64().unwrap_or(0) as u32;
        pid > 0 && p["running"]["files_done"].as_u64().unwrap_or(0) > 0
    });
    pid
}

#[test]
fn kill_9_of_a_backup_is_retried_and_completes() {
    // The failed run is seen between the kill and the retry: 5 s, for a loaded machine's polls.
    let mut fx = slow_backup_fixture("retries = \"2\"\nretry-delay = \"5s\"");
    fx.start();
    fx.run_now("home", "backup");
    let pid = running_pid(&fx);
    // SAFETY: the backup process the agent started for this test.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    fx.env.clear();
    let first = fx.wait_run("home", 0, 60);
    assert_eq!(first["outcome"], "failed", "{first}");
    assert!(first["message"].as_str().unwrap().contains("retry in 5s"), "{first}");
    let second = fx.wait_run("home", first["id"].as_u64().unwrap(), 300);
    assert_eq!((second["outcome"].as_str(), second["reason"].as_str()), (Some("success"), Some("retry 1")), "{second}");
    assert_eq!(second["files"], 201);
    let check = fx.cairn(&["-p", "home", "check"]);
    ok(&check);
}

/// Whether process `pid` has ended (gone, or a zombie no one reaped yet).
fn ended(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}

#[test]
fn kill_9_of_the_agent_mid_backup_is_recorded_and_the_next_run_completes() {
    let mut fx = slow_backup_fixture("");
    fx.start();
    fx.run_now("home", "backup");
    let job = running_pid(&fx);
    let mut agent = fx.agent.take().unwrap();
    agent.kill().unwrap();
    agent.wait().unwrap();
    // The job is told its agent died (SIGINT, as Ctrl-C) and stops without a snapshot.
    wait_until(Duration::from_secs(60), "the job of the killed agent to end", || ended(job));
    fx.env.clear();
    fx.start();
    let killed = fx.profile("home")["last"].clone();
    assert_eq!((killed["job"].as_str(), killed["outcome"].as_str()), (Some("backup"), Some("interrupted")), "{killed}");
    fx.run_now("home", "backup");
    let next = fx.wait_run("home", killed["id"].as_u64().unwrap(), 300);
    assert_eq!(next["outcome"], "success", "{next}");
    assert_eq!(next["files"], 201);
    let snaps: Value = serde_json::from_str(&ok(&fx.cairn(&["-p", "home", "--json", "snapshots"]))).unwrap();
    assert_eq!(snaps.as_array().unwrap().len(), 1, "the killed run saved no snapshot: {snaps}");
    ok(&fx.cairn(&["-p", "home", "check", "--read-data"]));
}

#[test]
fn sigterm_interrupts_a_running_backup_and_the_next_run_completes() {
    let mut fx = slow_backup_fixture("");
    fx.start();
    fx.run_now("home", "backup");
    running_pid(&fx);
    let took = fx.stop();
    assert!(took < Duration::from_secs(30), "stopping took {took:?}");
    let h = fs::read_to_string(fx.state.join("history.jsonl")).unwrap();
    let run: Value = serde_json::from_str(h.lines().last().unwrap()).unwrap();
    assert_eq!(run["outcome"], "interrupted", "{run}");
    fx.env.clear();
    fx.start();
    fx.run_now("home", "backup");
    let next = fx.wait_run("home", run["id"].as_u64().unwrap(), 300);
    assert_eq!(next["outcome"], "success", "{next}");
    assert_eq!(next["files"], 201);
}

#[test]
fn the_clock_jumping_runs_what_is_due_and_a_missed_run_is_caught_up() {
    let mut fx = AgentFx::new(3, 100, &home("alert-after = \"2d\""));
    fx.init("home");
    let clock = fx.dir.join("clock");
    fs::write(&clock, "0").unwrap();
    fx.env.push(("CAIRN_AGENT_TEST_CLOCK".into(), clock.to_string_lossy().into_owned()));
    fx.start();
    let next = fx.profile("home")["next"][0]["at"].as_i64().unwrap();
    let now = chrono_now();
    assert!(next > now && next <= now + 86400, "next {next}, now {now}");
    // The clock jumps past 03:00 (a laptop waking up): the backup runs within a recheck.
    fs::write(&clock, (next - now + 5).to_string()).unwrap();
    let first = fx.wait_run("home", 0, 60);
    assert_eq!((first["outcome"].as_str(), first["reason"].as_str()), (Some("success"), Some("schedule")), "{first}");
    let next2 = fx.profile("home")["next"][0]["at"].as_i64().unwrap();
    assert!(next2 > next + 86000, "the next run is a day later: {next2} vs {next}");
    // The machine is off over the next 03:00: on start, the missed run is caught up.
    fx.stop();
    fs::write(&clock, (next - now + 86400 + 3600).to_string()).unwrap();
    fx.start();
    let caught = fx.wait_run("home", first["id"].as_u64().unwrap(), 60);
    assert_eq!(
        (caught["outcome"].as_str(), caught["reason"].as_str()),
        (Some("success"), Some("catch-up")),
        "{caught}"
    );
}

#[test]
fn no_backup_for_too_long_alerts_once() {
    let hook = Receiver::start();
    let mut fx = AgentFx::new(3, 100, &home(&format!("alert-after = \"1h\"\nwebhook = \"{}\"", hook.url)));
    fx.init("home");
    let clock = fx.dir.join("clock");
    fs::write(&clock, "0").unwrap();
    fx.env.push(("CAIRN_AGENT_TEST_CLOCK".into(), clock.to_string_lossy().into_owned()));
    fx.start();
    std::thread::sleep(Duration::from_millis(600));
    assert!(hook.bodies.lock().unwrap().is_empty());
    fs::write(&clock, "3700").unwrap();
    wait_until(Duration::from_secs(30), "the overdue alert", || !hook.bodies.lock().unwrap().is_empty());
    std::thread::sleep(Duration::from_millis(600));
    let got = hook.bodies.lock().unwrap().clone();
    assert_eq!(got.len(), 1, "one alert, not one per recheck: {got:?}");
    assert_eq!(got[0]["event"], "overdue");
    assert!(got[0]["message"].as_str().unwrap().contains("no successful backup of profile home"), "{got:?}");
}

#[test]
fn bad_schedules_are_refused_with_file_line_and_key() {
    let fx = AgentFx::new(1, 10, &home("forget = \"mon..fry 22:00\""));
    let out = fx.cairn(&["agent", "--state-dir", &fx.state.to_string_lossy(), "--listen", "127.0.0.1:0"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cairn.toml:")
            && err.contains("profile.home.schedule.forget")
            && err.contains("\"fry\" is not a day"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    let fx = AgentFx::new(1, 10, &home("backp = \"daily\""));
    let out = fx.cairn(&["agent", "--state-dir", &fx.state.to_string_lossy()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("backup"), "{out:?}");
}

fn chrono_now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64
}
