//! The web interface in a real headless Chromium, driven through chromedriver (WebDriver):
//! log in (a wrong password refused), the dashboard, "run now" and its progress reaching
//! 100 %, the new snapshot, browsing to a file and downloading it (bytes compared), a
//! directory as tar, find, paging a large directory, a restore compared with `diff -r`.
//! Screenshots are kept in target/agent-screenshots/.

use std::fs;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::elements::Element;
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{json, Value};

use super::{home, AgentFx};

/// chromedriver on a free loopback port, killed when dropped.
struct Driver {
    child: Child,
    url: String,
    _profile: tempfile::TempDir,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn start_driver() -> Driver {
    let port = free_port();
    let child = Command::new("chromedriver")
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("chromedriver (Debian's chromium-driver; .ci/run installs it)");
    let url = format!("http://127.0.0.1:{port}");
    crate::support::wait_until(Duration::from_secs(30), "chromedriver to listen", || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    Driver { child, url, _profile: tempfile::tempdir().unwrap() }
}

async fn browser(d: &Driver) -> Client {
    let binary =
        ["/usr/lib/chromium/chromium", "/usr/bin/chromium"].into_iter().find(|p| Path::new(p).exists()).unwrap();
    let caps = json!({
        "browserName": "chrome",
        "goog:chromeOptions": {
            "binary": binary,
            "args": [
                "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-dev-shm-usage", "--window-size=1200,900",
                format!("--user-data-dir={}", d._profile.path().display()),
            ]
        }
    });
    let Value::Object(caps) = caps else { unreachable!() };
    let connector = hyper_util::client::legacy::connect::HttpConnector::new();
    ClientBuilder::new(connector).capabilities(caps).connect(&d.url).await.expect("a Chromium session")
}

fn screenshots() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/agent-screenshots");
    fs::create_dir_all(&dir).unwrap();
    dir
}

/// The element `loc` finds, waited for: after a click that loads a page, a loaded machine may
/// not have the new page yet.
async fn el(c: &Client, loc: Locator<'_>) -> Element {
    let shown = format!("{loc:?}");
    c.wait().at_most(Duration::from_secs(30)).for_element(loc).await.unwrap_or_else(|e| panic!("{shown}: {e}"))
}

async fn text_of(c: &Client, id: &str) -> String {
    el(c, Locator::Id(id)).await.text().await.unwrap()
}

/// Clicks `loc` and waits until the page's address has changed.
async fn follow(c: &Client, loc: Locator<'_>) {
    let before = c.current_url().await.unwrap();
    el(c, loc).await.click().await.unwrap();
    let end = Instant::now() + Duration::from_secs(30);
    while c.current_url().await.unwrap() == before {
        assert!(Instant::now() < end, "the click on {loc:?} never left {before}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The rows of the entries table, once there are `n` (a page follows a click).
async fn rows(c: &Client, n: usize) -> usize {
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        let got = c.find_all(Locator::Css("#entries tr")).await.unwrap().len();
        if got == n || Instant::now() > end {
            return got;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until element `id`'s text satisfies `cond`; returns it.
async fn wait_text(c: &Client, id: &str, secs: u64, cond: impl Fn(&str) -> bool) -> String {
    let end = Instant::now() + Duration::from_secs(secs);
    let mut last = String::new();
    while Instant::now() < end {
        if let Ok(e) = c.find(Locator::Id(id)).await {
            last = e.text().await.unwrap_or_default();
            if cond(&last) {
                return last;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("#{id} never matched within {secs} s; last text {last:?}");
}

/// Fetches `href` in the page (with its session) and returns the bytes.
async fn fetch_bytes(c: &Client, href: &str) -> Vec<u8> {
    let script = "const [href, done] = arguments; fetch(href, {credentials: 'same-origin'}).then(r => r.arrayBuffer())\
        .then(b => { let s = ''; const u = new Uint8Array(b); for (let i = 0; i < u.length; i++) s += String.fromCharCode(u[i]); done(btoa(s)); })\
        .catch(e => done('ERROR ' + e));";
    let v = c.execute_async(script, vec![json!(href)]).await.unwrap();
    let s = v.as_str().unwrap();
    assert!(!s.starts_with("ERROR"), "{s}");
    base64_decode(s)
}

/// Percent-encoding as the pages write paths in links.
fn enc(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn base64_decode(s: &str) -> Vec<u8> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        _ => 63,
    };
    let b: Vec<u8> = s.bytes().filter(|c| *c != b'=').collect();
    let mut out = Vec::new();
    for chunk in b.chunks(4) {
        let n = chunk.iter().enumerate().fold(0u32, |n, (i, c)| n | (val(*c) as u32) << (18 - 6 * i));
        out.extend_from_slice(&n.to_be_bytes()[1..chunk.len()]);
    }
    out
}

#[test]
fn web_interface_in_chromium() {
    // A directory of 450 entries pages (200 each).
    let mut fx = AgentFx::new(450, 2_000, &home(""));
    fx.init("home");
    // The backup holds 12 s before it writes its snapshot, so the page shows it running (a
    // loaded machine's browser may take seconds to poll and draw it).
    fx.env.push(("CAIRN_INJECT_FAULTS".into(), "stall-write=snapshots/,stall-for=12s".into()));
    fx.start();
    let driver = start_driver();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let c = browser(&driver).await;
        let shots = screenshots();
        // Not logged in: the login page; a wrong password is refused.
        c.goto(&format!("{}/", fx.url)).await.unwrap();
        assert!(c.current_url().await.unwrap().path().ends_with("/login"));
        el(&c, Locator::Id("password")).await.send_keys("not the password").await.unwrap();
        el(&c, Locator::Id("login")).await.click().await.unwrap();
        // The refusal is a new page: waited for, as a loaded machine may not have it yet.
        assert_eq!(wait_text(&c, "login-error", 20, |t| t == "Wrong password.").await, "Wrong password.");
        assert!(c.find(Locator::Css("section.profile")).await.is_err());
        fs::write(shots.join("login-refused.png"), c.screenshot().await.unwrap()).unwrap();
        el(&c, Locator::Id("password")).await.send_keys(&fx.token()).await.unwrap();
        el(&c, Locator::Id("login")).await.click().await.unwrap();
        // The dashboard: never run; run now; the progress reaches 100 %.
        assert_eq!(text_of(&c, "state-home").await, "idle");
        el(&c, Locator::Id("run-home")).await.click().await.unwrap();
        // Live, without a reload: the state, files, rate and ETA as the terminal shows them.
        wait_text(&c, "state-home", 60, |t| t.contains("running backup")).await;
        let detail = wait_text(&c, "detail-home", 30, |t| t.contains("/451 files")).await;
        assert!(detail.contains("MB/s") && detail.contains("ETA"), "{detail}");
        let pct = text_of(&c, "pct-home").await;
        assert!(pct.ends_with('%') && pct.trim_end_matches('%').parse::<f64>().is_ok(), "{pct}");
        fs::write(shots.join("running.png"), c.screenshot().await.unwrap()).unwrap();
        wait_text(&c, "state-home", 120, |t| t.contains("last backup success")).await;
        assert_eq!(text_of(&c, "pct-home").await, "100%");
        let last = text_of(&c, "last-home").await;
        assert!(last.contains("snapshot") && last.contains("451 files"), "{last}");
        c.refresh().await.unwrap();
        assert!(c.find(Locator::Css("svg.chart rect.ok")).await.is_ok(), "the chart shows the run");
        fs::write(shots.join("dashboard.png"), c.screenshot().await.unwrap()).unwrap();
        // The new snapshot, its tree, paged.
        el(&c, Locator::Id("snapshots-home")).await.click().await.unwrap();
        el(&c, Locator::Css("a.snapshot")).await;
        let snaps = c.find_all(Locator::Css("a.snapshot")).await.unwrap();
        assert_eq!(snaps.len(), 1);
        snaps[0].click().await.unwrap();
        let src = fx.dir.join("src");
        for part in src.components().skip(1) {
            let name = format!("{}/", part.as_os_str().to_string_lossy());
            el(&c, Locator::LinkText(&name)).await.click().await.unwrap();
        }
        assert_eq!(rows(&c, 201).await, 201, "a header and a page of 200 entries");
        follow(&c, Locator::Id("next-page")).await;
        follow(&c, Locator::Id("next-page")).await;
        assert_eq!(rows(&c, 1 + 51).await, 1 + 51, "the third page: 451 - 400 entries");
        assert!(c.find(Locator::Id("next-page")).await.is_err());
        // Into sub/ and download a file: the same bytes as the source.
        el(&c, Locator::LinkText("sub/")).await.click().await.unwrap();
        fs::write(shots.join("browse.png"), c.screenshot().await.unwrap()).unwrap();
        let href = el(&c, Locator::LinkText("deep.txt")).await.attr("href").await.unwrap().unwrap();
        assert_eq!(fetch_bytes(&c, &href).await, fs::read(src.join("sub/deep.txt")).unwrap());
        // The directory as tar: the file inside it.
        let tar_href = el(&c, Locator::Id("download-dir")).await.attr("href").await.unwrap().unwrap();
        let tar = fetch_bytes(&c, &tar_href).await;
        let mut entries = tar::Archive::new(&tar[..]);
        let names: Vec<String> =
            entries.entries().unwrap().map(|e| e.unwrap().path().unwrap().to_string_lossy().into_owned()).collect();
        assert!(names.iter().any(|n| n.ends_with("deep.txt")), "{names:?}");
        // A big file downloaded whole.
        let base = tar_href.split("/download").next().unwrap().to_string();
        let big = src.join("file123.bin");
        let big_href = format!("{base}/download?path={}", enc(&big.to_string_lossy()));
        assert_eq!(fetch_bytes(&c, &big_href).await, fs::read(&big).unwrap());
        // Find by name.
        el(&c, Locator::Id("find-pattern")).await.send_keys("deep*").await.unwrap();
        el(&c, Locator::Css("form.inline button")).await.click().await.unwrap();
        let found = wait_text(&c, "found", 30, |t| t.contains("sub/deep.txt")).await;
        assert!(found.contains("sub/deep.txt"), "{found}");
        // Restore src/ to a directory, then diff -r.
        c.goto(&format!("{}{base}/tree?path={}", fx.url, enc(&src.to_string_lossy()))).await.unwrap();
        let target = fx.dir.join("restored");
        el(&c, Locator::Id("restore-target")).await.send_keys(&target.to_string_lossy()).await.unwrap();
        el(&c, Locator::Id("restore")).await.click().await.unwrap();
        wait_text(&c, "restore-state", 120, |t| t == "done" || t == "failed").await;
        assert_eq!(text_of(&c, "restore-state").await, "done", "{}", text_of(&c, "restore-summary").await);
        assert_eq!(text_of(&c, "restore-pct").await, "100%");
        let summary = text_of(&c, "restore-summary").await;
        assert!(summary.contains("restored 451 files") && summary.contains("reused from local files"), "{summary}");
        fs::write(shots.join("restore.png"), c.screenshot().await.unwrap()).unwrap();
        let diff = Command::new("diff").arg("-r").arg(&src).arg(&target).output().unwrap();
        assert!(diff.status.success(), "diff -r: {}", String::from_utf8_lossy(&diff.stdout));
        c.close().await.unwrap();
    });
}
