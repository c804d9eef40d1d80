// cairn agent: refreshes the live parts of the pages from the JSON API; the pages work without it.
"use strict";

function fmtBytes(n) {
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return i === 0 ? n + " B" : n.toFixed(1) + " " + u[i];
}

function fmtSeconds(s) {
  if (s === null || s === undefined) return "-";
  s = Math.max(0, Math.round(s));
  if (s >= 3600) return Math.floor(s / 3600) + "h" + String(Math.floor(s % 3600 / 60)).padStart(2, "0") + "m";
  if (s >= 60) return Math.floor(s / 60) + "m" + String(s % 60).padStart(2, "0") + "s";
  return s + "s";
}

function set(id, text) {
  const el = document.getElementById(id);
  if (el && el.textContent !== text) el.textContent = text;
}

function showProfile(p) {
  const section = document.getElementById("profile-" + p.name);
  if (!section) return;
  let state = "idle", pct = 0, detail = "";
  if (p.running) {
    const r = p.running;
    state = "running " + r.job;
    pct = r.percent;
    detail = r.files_done + "/" + r.total_files + " files · " + fmtBytes(r.bytes_done) + " of " + fmtBytes(r.total_bytes) +
      " · " + (r.bytes_per_second / 1e6).toFixed(1) + " MB/s · ETA " + fmtSeconds(r.seconds_remaining);
  } else if (p.state === "queued") {
    state = "queued";
  } else if (p.last) {
    state = "idle — last " + p.last.job + " " + p.last.outcome;
    pct = (p.last.outcome === "success" || p.last.outcome === "warning") ? 100 : 0;
  }
  set("state-" + p.name, state);
  set("pct-" + p.name, Math.floor(pct) + "%");
  set("detail-" + p.name, detail);
  const fill = document.getElementById("fill-" + p.name);
  if (fill) fill.style.width = pct + "%";
  const last = p.last ? String(p.last.id) : "0";
  if (section.dataset.lastRun !== last) {
    section.dataset.lastRun = last;
    if (p.last) {
      const el = document.getElementById("last-" + p.name);
      if (el) {
        el.textContent = "";
        const a = document.createElement("a");
        a.href = "/runs/" + p.last.id + "/log";
        a.className = "outcome " + p.last.outcome;
        a.textContent = p.last.job + " " + p.last.outcome;
        el.appendChild(a);
        el.appendChild(document.createTextNode(" — " + p.last.message));
      }
    }
  }
}

async function pollStatus() {
  try {
    const r = await fetch("/api/status", { credentials: "same-origin" });
    if (r.ok) (await r.json()).profiles.forEach(showProfile);
  } catch (e) { /* the agent restarting: try again */ }
  setTimeout(pollStatus, 1000);
}

async function pollRestore(n) {
  try {
    const r = await fetch("/api/restores/" + n, { credentials: "same-origin" });
    if (r.ok) {
      const v = await r.json();
      const pct = v.percent || 0;
      set("restore-pct", Math.floor(pct) + "%");
      const fill = document.getElementById("restore-fill");
      if (fill) fill.style.width = pct + "%";
      if (v.done) {
        set("restore-state", v.error ? "failed" : "done");
        set("restore-summary", v.summary || v.error || "");
        return;
      }
      set("restore-state", "running: " + v.done_files + "/" + v.total_files + " files, " + fmtBytes(v.done_bytes));
    }
  } catch (e) { /* try again */ }
  setTimeout(() => pollRestore(n), 500);
}

document.addEventListener("DOMContentLoaded", () => {
  if (document.querySelector("section.profile")) pollStatus();
  const restore = document.getElementById("restore-state");
  if (restore && restore.textContent === "running") pollRestore(restore.dataset.restore);
});
