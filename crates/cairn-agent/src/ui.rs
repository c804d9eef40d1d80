//! The pages, rendered on the server as HTML; `assets/app.js` only refreshes the live parts
//! (a running job's progress, a restore's) from the JSON API. Pages that read a repository
//! run on a blocking thread and go through [`crate::browse`].

use std::fmt::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use anyhow::{bail, Result};
use cairn_core::engine::select::SnapshotFilter;
use cairn_format::tree::{Node, NodeKind, Timestamp};
use chrono::{Local, TimeZone};
use serde_json::json;

use crate::history::Run;
use crate::http::{encode, Req};
use crate::profiles::JobKind;
use crate::Agent;

/// `&`, `<`, `>`, `"`, `'` escaped.
pub fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;").replace('\'', "&#39;")
}

/// Bytes in binary units ("1.5 GiB").
pub use cairn_core::engine::platform::format_size as bytes;

fn time(secs: i64) -> String {
    Local.timestamp_opt(secs, 0).single().map_or("-".into(), |t| t.format("%Y-%m-%d %H:%M:%S").to_string())
}

fn ts(t: Timestamp) -> String {
    time(t.secs)
}

fn seconds(s: f64) -> String {
    let s = s.max(0.0) as u64;
    match s {
        s if s >= 3600 => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
        s if s >= 60 => format!("{}m{:02}s", s / 60, s % 60),
        s => format!("{s}s"),
    }
}

fn page(title: &str, body: &str) -> String {
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><meta name=\"viewport\" content=\"width=device-width\">\
<title>{t} · cairn agent</title><link rel=\"stylesheet\" href=\"/assets/style.css\"><script src=\"/assets/app.js\" defer></script></head>\
<body><header><a class=\"home\" href=\"/\">cairn agent</a><span class=\"host\">{h}</span></header><main><h1>{t}</h1>{body}</main></body></html>",
        t = esc(title),
        h = esc(&crate::notify::host()),
    )
}

/// The login page (`wrong`: after a wrong password).
pub fn login(wrong: bool) -> String {
    let msg = if wrong { "<p class=\"error\" id=\"login-error\">Wrong password.</p>" } else { "" };
    page(
        "Log in",
        &format!(
            "{msg}<form method=\"post\" action=\"/login\" class=\"login\"><label>Password \
<input type=\"password\" name=\"password\" id=\"password\" autofocus></label> <button id=\"login\">Log in</button></form>\
<p class=\"hint\">The password is in the agent's state directory (<code>token</code>) unless it was given with --password-file.</p>"
        ),
    )
}

/// A page saying what went wrong.
pub fn error_page(msg: &str) -> String {
    page("Error", &format!("<p class=\"error\">{}</p><p><a href=\"/\">Back to the dashboard</a></p>", esc(msg)))
}

/// The state of every profile, for the dashboard's script and `cairn agent status`.
pub fn status(agent: &Agent) -> serde_json::Value {
    let st = agent.state.lock().unwrap();
    let profiles: Vec<_> = agent
        .profiles
        .iter()
        .zip(&st.profiles)
        .enumerate()
        .map(|(i, (jobs, p))| {
            let last = st.history.last(&jobs.profile, None);
            let queued: Vec<_> = st.queue.iter().filter(|q| q.profile == i).map(|q| json!({"job": q.job.name(), "reason": q.reason, "not_before": q.not_before.timestamp()})).collect();
            let running = p.running.as_ref().map(|l| {
                let g = &l.progress;
                let rate = if g.seconds_elapsed > 0.0 { g.bytes_done as f64 / g.seconds_elapsed } else { 0.0 };
                json!({"job": l.run.job.name(), "run": l.run.id, "pid": l.pid, "started": l.run.started, "percent": g.percent(),
                    "files_done": g.files_done, "total_files": g.total_files, "bytes_done": g.bytes_done, "total_bytes": g.total_bytes,
                    "bytes_per_second": rate, "seconds_remaining": g.seconds_remaining, "current_files": g.current_files})
            });
            let state = if p.running.is_some() { "running" } else if !queued.is_empty() { "queued" } else { "idle" };
            json!({
                "name": jobs.profile, "state": state, "running": running, "queued": queued,
                "last": last, "last_success": st.history.last_ok(&jobs.profile, JobKind::Backup).map(|r| r.ended),
                "next": p.next.iter().map(|(j, at)| json!({"job": j.name(), "at": at.timestamp()})).collect::<Vec<_>>(),
                "repository_size": p.repo_size,
            })
        })
        .collect();
    let running = st.profiles.iter().filter(|p| p.running.is_some()).count();
    json!({"host": agent.host, "jobs_running": running, "jobs_queued": st.queue.len(), "profiles": profiles})
}

/// The dashboard: each profile's state, progress, last result, next runs, recent runs.
pub fn dashboard(agent: &Agent) -> String {
    let s = status(agent);
    let st = agent.state.lock().unwrap();
    let mut b = String::new();
    for (jobs, p) in agent.profiles.iter().zip(s["profiles"].as_array().into_iter().flatten()) {
        let name = esc(&jobs.profile);
        let (state, pct, detail) = live_text(p);
        let last = match p["last"].as_object() {
            Some(l) => format!(
                "<a href=\"/runs/{id}/log\" class=\"outcome {o}\">{job} {o}</a> at {end} ({dur}) — {msg}",
                id = l["id"],
                o = l["outcome"].as_str().unwrap_or(""),
                job = l["job"].as_str().unwrap_or(""),
                end = time(l["ended"].as_i64().unwrap_or(0)),
                dur = seconds((l["ended"].as_i64().unwrap_or(0) - l["started"].as_i64().unwrap_or(0)) as f64),
                msg = esc(l["message"].as_str().unwrap_or("")),
            ),
            None => "never run".into(),
        };
        let next: Vec<String> = jobs
            .schedules
            .iter()
            .zip(p["next"].as_array().into_iter().flatten())
            .map(|((k, sched), n)| {
                format!(
                    "{} {} <small>({})</small>",
                    k.name(),
                    time(n["at"].as_i64().unwrap_or(0)),
                    esc(&sched.to_string())
                )
            })
            .collect();
        let runs: Vec<&Run> =
            st.history.runs().iter().filter(|r| r.profile == jobs.profile && r.job == JobKind::Backup).collect();
        let _ = write!(
            b,
            "<section class=\"profile\" id=\"profile-{name}\" data-profile=\"{name}\" data-last-run=\"{lr}\">\
<h2>{name}</h2><p class=\"state\"><span id=\"state-{name}\">{state}</span></p>\
<div class=\"bar\"><div class=\"fill\" id=\"fill-{name}\" style=\"width:{pct:.0}%\"></div></div>\
<p class=\"live\"><span id=\"pct-{name}\">{pct:.0}%</span> <span id=\"detail-{name}\">{detail}</span></p>\
<p>Last: <span id=\"last-{name}\">{last}</span></p><p>Next: {next}</p>{chart}\
<form method=\"post\" action=\"/run/{name}\" class=\"inline\"><input type=\"hidden\" name=\"job\" value=\"backup\"><button id=\"run-{name}\">Run backup now</button></form> \
<form method=\"post\" action=\"/run/{name}\" class=\"inline\"><input type=\"hidden\" name=\"job\" value=\"check\"><button>Check now</button></form> \
<a href=\"/p/{name}/snapshots\" id=\"snapshots-{name}\">Snapshots</a> · <a href=\"/p/{name}/health\">Health</a> · <a href=\"/p/{name}/runs\">Runs</a></section>",
            lr = p["last"]["id"].as_u64().unwrap_or(0),
            next = if next.is_empty() { "only when asked".into() } else { next.join(", ") },
            chart = chart(&runs),
        );
    }
    if agent.profiles.is_empty() {
        b.push_str("<p>No profile has a <code>[profile.NAME.schedule]</code> section in the configuration file.</p>");
    }
    page("Dashboard", &b)
}

/// The state line, percent and detail of a profile in [`status`]'s form (the script computes
/// the same from the API).
fn live_text(p: &serde_json::Value) -> (String, f64, String) {
    if let Some(r) = p["running"].as_object() {
        let rate = r["bytes_per_second"].as_f64().unwrap_or(0.0);
        let eta = r["seconds_remaining"].as_f64().map_or("-".into(), seconds);
        let detail = format!(
            "{}/{} files · {} of {} · {:.1} MB/s · ETA {eta}",
            r["files_done"],
            r["total_files"],
            bytes(r["bytes_done"].as_u64().unwrap_or(0)),
            bytes(r["total_bytes"].as_u64().unwrap_or(0)),
            rate / 1e6
        );
        return (format!("running {}", r["job"].as_str().unwrap_or("")), r["percent"].as_f64().unwrap_or(0.0), detail);
    }
    if p["state"] == "queued" {
        return ("queued".into(), 0.0, String::new());
    }
    match p["last"]["outcome"].as_str() {
        Some(o @ ("success" | "warning")) => {
            (format!("idle — last {} {o}", p["last"]["job"].as_str().unwrap_or("")), 100.0, String::new())
        }
        Some(o) => (format!("idle — last {} {o}", p["last"]["job"].as_str().unwrap_or("")), 0.0, String::new()),
        None => ("idle".into(), 0.0, String::new()),
    }
}

/// The last 30 backups as bars: height the duration, a dot the data added.
fn chart(runs: &[&Run]) -> String {
    let runs = &runs[runs.len().saturating_sub(30)..];
    if runs.is_empty() {
        return String::new();
    }
    let (w, h) = (300.0, 60.0);
    let max_s = runs.iter().map(|r| r.seconds()).max().unwrap_or(1).max(1) as f64;
    let max_b = runs.iter().map(|r| r.bytes_added).max().unwrap_or(1).max(1) as f64;
    let step = w / 30.0;
    let mut svg = format!("<svg class=\"chart\" width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" role=\"img\"><title>recent backups: bars duration, dots data added</title>");
    for (i, r) in runs.iter().enumerate() {
        let x = i as f64 * step;
        let bh = (r.seconds() as f64 / max_s * (h - 4.0)).max(1.0);
        let class = if r.outcome.ok() { "ok" } else { "bad" };
        let _ = write!(
            svg,
            "<rect class=\"{class}\" x=\"{x:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{bh:.1}\"><title>{} {}: {}s, {} added</title></rect>\
<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"2\"/>",
            h - bh,
            step - 2.0,
            time(r.started),
            r.outcome.name(),
            r.seconds(),
            bytes(r.bytes_added),
            x + step / 2.0 - 1.0,
            h - 2.0 - r.bytes_added as f64 / max_b * (h - 6.0),
        );
    }
    svg.push_str("</svg>");
    svg
}

/// A run's log.
pub fn log(agent: &Agent, id: u64) -> String {
    let (run, path) = {
        let st = agent.state.lock().unwrap();
        let running =
            st.profiles.iter().filter_map(|p| p.running.as_ref()).find(|l| l.run.id == id).map(|l| l.run.clone());
        (st.history.get(id).cloned().or(running), st.history.log_path(id))
    };
    let Some(run) = run else { return error_page(&format!("no run {id}")) };
    let text = std::fs::read(&path).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default();
    page(
        &format!("Run {id}: {} of {}", run.job.name(), run.profile),
        &format!(
            "<p>{} · started {} · ended {} · {} · exit {}</p><p>{}</p><pre id=\"log\">{}</pre>",
            run.outcome.name(),
            time(run.started),
            time(run.ended),
            esc(&run.reason),
            run.exit_code.map_or("-".into(), |c| c.to_string()),
            esc(&run.message),
            esc(&text)
        ),
    )
}

/// The pages below `/p/PROFILE/`.
pub fn profile_page(agent: &Agent, r: &Req) -> Result<String> {
    let p: Vec<&str> = r.parts.iter().map(String::as_str).collect();
    let profile = p[1];
    match &p[2..] {
        ["runs"] => Ok(runs_page(agent, profile)),
        ["snapshots"] => snapshots_page(agent, profile, r),
        ["diff"] => diff_page(agent, profile, r),
        ["health"] => health_page(agent, profile, r),
        ["s", snap, "tree"] => tree_page(agent, profile, snap, r),
        ["s", snap, "find"] => find_page(agent, profile, snap, r),
        _ => bail!("no such page"),
    }
}

fn runs_page(agent: &Agent, profile: &str) -> String {
    let st = agent.state.lock().unwrap();
    let mut b = String::from("<table><tr><th>Run</th><th>Job</th><th>Why</th><th>Started</th><th>Took</th><th>Outcome</th><th>Files</th><th>Read</th><th>Added</th><th>Message</th></tr>");
    for r in st.history.runs().iter().rev().filter(|r| r.profile == profile).take(200) {
        let _ = write!(
            b,
            "<tr><td><a href=\"/runs/{id}/log\">{id}</a></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"outcome {o}\">{o}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            r.job.name(), esc(&r.reason), time(r.started), seconds(r.seconds() as f64), r.files, bytes(r.bytes_read), bytes(r.bytes_added), esc(&r.message),
            id = r.id, o = r.outcome.name()
        );
    }
    b.push_str("</table>");
    page(&format!("Runs of {profile}"), &b)
}

fn snapshots_page(agent: &Agent, profile: &str, r: &Req) -> Result<String> {
    let repo = agent.repository(profile)?;
    let list = |k: &str| -> Vec<String> { r.get(k).split_whitespace().map(String::from).collect() };
    let filter =
        SnapshotFilter { hosts: list("host"), tags: list("tag"), paths: list("path"), ..SnapshotFilter::default() };
    let snaps = crate::browse::snapshots(&repo, &filter)?;
    let pe = esc(profile);
    let mut b = format!(
        "<form method=\"get\" class=\"filters\">Host <input name=\"host\" value=\"{}\"> Tag <input name=\"tag\" value=\"{}\"> Path <input name=\"path\" value=\"{}\"> <button>Filter</button></form>\
<form method=\"get\" action=\"/p/{pe}/diff\"><table id=\"snapshots\"><tr><th>A</th><th>B</th><th>ID</th><th>Time</th><th>Host</th><th>Tags</th><th>Paths</th><th>Files</th><th>Added</th></tr>",
        esc(r.get("host")), esc(r.get("tag")), esc(r.get("path"))
    );
    for (i, (id, s)) in snaps.iter().enumerate() {
        let short = id.short();
        let _ = write!(
            b,
            "<tr><td><input type=\"radio\" name=\"a\" value=\"{short}\"{}></td><td><input type=\"radio\" name=\"b\" value=\"{short}\"{}></td>\
<td><a class=\"snapshot\" href=\"/p/{pe}/s/{short}/tree?path=/\">{short}</a></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            if i == 1 { " checked" } else { "" },
            if i == 0 { " checked" } else { "" },
            ts(s.time), esc(&s.hostname), esc(&s.tags.join(", ")), esc(&s.paths.join(", ")),
            s.summary.files_new + s.summary.files_changed + s.summary.files_unmodified, bytes(s.summary.bytes_added)
        );
    }
    b.push_str("</table><button>Diff A → B</button></form>");
    if snaps.is_empty() {
        b.push_str("<p>No snapshot matches.</p>");
    }
    Ok(page(&format!("Snapshots of {profile}"), &b))
}

fn diff_page(agent: &Agent, profile: &str, r: &Req) -> Result<String> {
    let repo = agent.repository(profile)?;
    let (entries, total) = crate::browse::diff(&repo, r.get("a"), r.get("b"))?;
    let mut b = format!(
        "<p>{total} changes from {} to {}{}</p><table><tr><th></th><th>Path</th></tr>",
        esc(r.get("a")),
        esc(r.get("b")),
        if total > entries.len() { format!(" (the first {} shown)", entries.len()) } else { String::new() }
    );
    for e in &entries {
        let _ = write!(
            b,
            "<tr><td title=\"{}\">{}</td><td>{}</td></tr>",
            e.change.name(),
            e.change.code(),
            esc(&e.path.to_string_lossy())
        );
    }
    b.push_str("</table>");
    Ok(page(&format!("Diff of {profile}"), &b))
}

fn health_page(agent: &Agent, profile: &str, r: &Req) -> Result<String> {
    let repo = agent.repository(profile)?;
    let reclaimable = r.get("reclaimable") == "1";
    let h = crate::browse::health(&repo, agent.check_record_dir.as_deref(), reclaimable)?;
    let last_check = {
        let st = agent.state.lock().unwrap();
        st.history.last(profile, Some(JobKind::Check)).map(|r| {
            format!(
                "<a href=\"/runs/{}/log\">{}</a> at {} — {}",
                r.id,
                r.outcome.name(),
                time(r.ended),
                esc(&r.message)
            )
        })
    };
    let verified = match &h.verified {
        None => "no record (the jobs keep none without a cache directory)".to_string(),
        Some(v) => {
            let oldest =
                v.oldest_secs.map_or(String::new(), |s| format!("; the others read within {}", seconds(s as f64)));
            format!("{} of {} packs{oldest}", v.never, v.packs)
        }
    };
    let reclaim = match &h.reclaimable {
        None => format!("<a id=\"compute-reclaimable\" href=\"/p/{}/health?reclaimable=1\">work it out</a> (a prune's dry run: marks what every snapshot needs)", encode(profile)),
        Some(c) => format!(
            "{} ({} packs deleted whole, {} repacked; {} after <code>cairn prune</code>)",
            bytes(c.bytes),
            c.delete_packs,
            c.repack_packs,
            bytes(c.size_after)
        ),
    };
    let mut b = format!(
        "<dl><dt>Last check</dt><dd id=\"last-check\">{}</dd><dt>Never verified</dt><dd id=\"never-verified\">{verified}</dd>\
<dt>Space used</dt><dd id=\"space-used\">{} in {} packs</dd><dt>Reclaimable</dt><dd id=\"reclaimable\">{reclaim}</dd>\
<dt>Snapshots</dt><dd>{}</dd><dt>Locks</dt><dd id=\"locks\">{}</dd></dl><ul>",
        last_check.unwrap_or_else(|| "never (by this agent)".into()),
        bytes(h.bytes), h.packs, h.snapshots, h.locks.len()
    );
    for (path, what) in &h.locks {
        let _ = write!(b, "<li><code>{}</code>: {}</li>", esc(path), esc(what));
    }
    b.push_str("</ul>");
    Ok(page(&format!("Health of {profile}"), &b))
}

fn mode_string(n: &Node) -> String {
    let t = match n.kind {
        NodeKind::Dir => 'd',
        NodeKind::Symlink => 'l',
        NodeKind::File => '-',
        _ => '?',
    };
    let mut s = String::from(t);
    for (i, c) in "rwxrwxrwx".chars().enumerate() {
        s.push(if n.mode & (1 << (8 - i)) != 0 { c } else { '-' });
    }
    s
}

fn tree_page(agent: &Agent, profile: &str, snap: &str, r: &Req) -> Result<String> {
    let repo = agent.repository(profile)?;
    let path = PathBuf::from(if r.get("path").is_empty() { "/" } else { r.get("path") });
    let page_no: usize = r.get("page").parse().unwrap_or(0);
    let l = crate::browse::list(&repo, snap, &path, page_no)?;
    let (pe, se) = (esc(profile), esc(snap));
    let base = format!("/p/{pe}/s/{se}");
    let mut b = format!(
        "<p class=\"crumbs\"><a href=\"/p/{pe}/snapshots\">snapshots</a> / <a href=\"{base}/tree?path=/\">{}</a>",
        l.id.short()
    );
    let mut acc = PathBuf::from("/");
    for c in path.components().skip(1) {
        acc.push(c);
        let _ = write!(
            b,
            " / <a href=\"{base}/tree?path={}\">{}</a>",
            encode(&acc.to_string_lossy()),
            esc(&c.as_os_str().to_string_lossy())
        );
    }
    let here = encode(&path.to_string_lossy());
    let _ = write!(
        b,
        "</p><p>{} of {} · {} entries · <a id=\"download-dir\" href=\"{base}/download?path={here}\">download this directory as tar</a></p>\
<form method=\"get\" action=\"{base}/find\" class=\"inline\"><input name=\"pattern\" placeholder=\"name, e.g. *.conf\" id=\"find-pattern\"> <button>Find</button></form>\
<table id=\"entries\"><tr><th>Name</th><th>Size</th><th>Modified</th><th>Mode</th><th>Owner</th></tr>",
        esc(&l.snapshot.hostname), ts(l.snapshot.time), l.total
    );
    for n in &l.entries {
        let child = path.join(Path::new(std::ffi::OsStr::new(&n.name_lossy())));
        let ce = encode(&child.to_string_lossy());
        let name = esc(&n.name_lossy());
        let link = match n.kind {
            NodeKind::Dir => format!("<a class=\"dir\" href=\"{base}/tree?path={ce}\">{name}/</a>"),
            NodeKind::File => format!("<a class=\"file\" href=\"{base}/download?path={ce}\">{name}</a>"),
            NodeKind::Symlink => format!("{name} → {}", esc(&String::from_utf8_lossy(&n.target))),
            _ => name,
        };
        let _ = write!(
            b,
            "<tr><td>{link}</td><td>{}</td><td>{}</td><td><code>{}</code></td><td>{}</td></tr>",
            if n.kind == NodeKind::File { bytes(n.size) } else { String::new() },
            ts(n.mtime),
            mode_string(n),
            esc(&if n.user.is_empty() { n.uid.to_string() } else { n.user.clone() })
        );
    }
    b.push_str("</table><p class=\"pages\">");
    let pages = l.total.div_ceil(crate::browse::PAGE).max(1);
    if page_no > 0 {
        let _ = write!(b, "<a href=\"{base}/tree?path={here}&page={}\" id=\"prev-page\">previous</a> ", page_no - 1);
    }
    let _ = write!(b, "page {} of {pages}", page_no + 1);
    if page_no + 1 < pages {
        let _ = write!(b, " <a href=\"{base}/tree?path={here}&page={}\" id=\"next-page\">next</a>", page_no + 1);
    }
    let _ = write!(
        b,
        "</p><h2>Restore</h2><form method=\"post\" action=\"{base}/restore\" id=\"restore-form\"><input type=\"hidden\" name=\"path\" value=\"{}\">\
<label>Restore {} to the directory <input name=\"target\" id=\"restore-target\" size=\"40\" placeholder=\"/tmp/restore\"></label> <button id=\"restore\">Restore</button></form>",
        esc(&path.to_string_lossy()), esc(&path.to_string_lossy())
    );
    Ok(page(&format!("{profile}: {}", path.display()), &b))
}

fn find_page(agent: &Agent, profile: &str, snap: &str, r: &Req) -> Result<String> {
    let repo = agent.repository(profile)?;
    let found = crate::browse::find(&repo, snap, r.get("pattern"))?;
    let base = format!("/p/{}/s/{}", esc(profile), esc(snap));
    let mut b = format!(
        "<p>{} entries match {}{}</p><ul id=\"found\">",
        found.len(),
        esc(r.get("pattern")),
        if found.len() >= crate::browse::MOST { " (the first shown)" } else { "" }
    );
    for (path, n) in &found {
        let pe = encode(&path.to_string_lossy());
        let (href, parent) = match n.kind {
            NodeKind::Dir => (format!("{base}/tree?path={pe}"), String::new()),
            _ => (
                format!("{base}/download?path={pe}"),
                format!(
                    " <a href=\"{base}/tree?path={}\">(in folder)</a>",
                    encode(&path.parent().unwrap_or(Path::new("/")).to_string_lossy())
                ),
            ),
        };
        let _ = write!(b, "<li><a href=\"{href}\">{}</a>{parent}</li>", esc(&path.to_string_lossy()));
    }
    b.push_str("</ul>");
    Ok(page(&format!("Find in {profile}"), &b))
}

/// A restore's state, for its page's script.
pub fn restore_status(agent: &Agent, n: usize) -> serde_json::Value {
    let Some(t) = agent.restores.lock().unwrap().iter().find(|t| t.id == n).cloned() else {
        return json!({"error": format!("no restore {n}")});
    };
    let p = &t.progress;
    let (total, done) = (p.total_bytes.load(Ordering::Relaxed), p.done_bytes.load(Ordering::Relaxed));
    let outcome = t.outcome.lock().unwrap();
    let mut v = json!({
        "id": n, "profile": t.profile, "snapshot": t.snapshot, "path": t.path, "target": t.target,
        "total_bytes": total, "done_bytes": done, "total_files": p.total_files.load(Ordering::Relaxed),
        "done_files": p.done_files.load(Ordering::Relaxed), "seconds": t.started.elapsed().as_secs_f64(),
        "percent": if total > 0 { 100.0 * done as f64 / total as f64 } else { 0.0 }, "done": outcome.is_some(),
    });
    match &*outcome {
        Some(Ok(o)) => {
            v["percent"] = json!(100.0);
            v["summary"] = json!(format!(
                "restored {} files, {} directories: {} written, {} fetched from the repository, {} reused from local files{}",
                o.files, o.dirs, bytes(o.bytes_written), bytes(o.bytes_fetched), bytes(o.bytes_reused_source + o.bytes_reused_target),
                if o.failed.is_empty() { String::new() } else { format!("; {} failed", o.failed.len()) }
            ));
        }
        Some(Err(e)) => v["error"] = json!(e),
        None => {}
    }
    v
}

/// A restore's page: a progress bar the script fills, then the summary.
pub fn restore_page(agent: &Agent, n: usize) -> String {
    let v = restore_status(agent, n);
    if let Some(e) = v["error"].as_str().filter(|_| v.get("id").is_none()) {
        return error_page(e);
    }
    let summary = v["summary"].as_str().or(v["error"].as_str()).unwrap_or("");
    page(
        &format!("Restore {n}"),
        &format!(
            "<p>{} of snapshot {} ({}) to <code>{}</code></p><div class=\"bar\"><div class=\"fill\" id=\"restore-fill\" style=\"width:{:.0}%\"></div></div>\
<p><span id=\"restore-pct\">{:.0}%</span> <span id=\"restore-state\" data-restore=\"{n}\">{}</span></p><p id=\"restore-summary\">{}</p>",
            esc(v["path"].as_str().unwrap_or("")), esc(v["snapshot"].as_str().unwrap_or("")), esc(v["profile"].as_str().unwrap_or("")),
            esc(v["target"].as_str().unwrap_or("")), v["percent"].as_f64().unwrap_or(0.0), v["percent"].as_f64().unwrap_or(0.0),
            if v["done"] == true { if v["error"].is_string() { "failed" } else { "done" } } else { "running" },
            esc(summary)
        ),
    )
}

/// [`status`]'s body as lines for a terminal: one per profile, then its running job.
pub fn status_lines(s: &serde_json::Value) -> Vec<String> {
    let mut out = vec![format!(
        "agent on {}: {} jobs running, {} queued",
        s["host"].as_str().unwrap_or(""),
        s["jobs_running"],
        s["jobs_queued"]
    )];
    for p in s["profiles"].as_array().into_iter().flatten() {
        let (state, pct, detail) = live_text(p);
        let last = match p["last"].as_object() {
            Some(l) => format!(
                "last {} {} at {}",
                l["job"].as_str().unwrap_or(""),
                l["outcome"].as_str().unwrap_or(""),
                time(l["ended"].as_i64().unwrap_or(0))
            ),
            None => "never run".into(),
        };
        let next: Vec<String> = p["next"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|n| format!("{} {}", n["job"].as_str().unwrap_or(""), time(n["at"].as_i64().unwrap_or(0))))
            .collect();
        out.push(format!(
            "{}: {state}; {last}; next {}",
            p["name"].as_str().unwrap_or(""),
            if next.is_empty() { "only when asked".into() } else { next.join(", ") }
        ));
        if p["running"].is_object() {
            out.push(format!("  {pct:.0}% {detail}"));
        }
    }
    out
}
