"""The lifecycle scenario (issue 14): a repository that lives through ten backups of a changing
tree, forgets all but the last five snapshots and prunes; a backup started while a prune repacks;
and Cairn's `recompress --to lz4` with the full restore it speeds up.

Each round works on a private copy of the tree in the scratch directory and gives every tool
the same states of it: state 1 is the tree as it is, each later state changes a different 10%
of the files (data.mutate: damage()'s 4 KiB overwrite, mtime moved on), and every tool backs up
each state before the next change (tools interleaved, order rotating each round). Then, per tool:

1. forget all but the last 5 snapshots, copy the repository (and the tool's cache) as it is
   now, prune the original: forget + prune timed together (wall, peak RSS of either), then
   `du -sb` of the repository;
2. state 11 (a further 10% changed) backed up alone, into the pruned repository;
3. the same state backed up into the copy while a prune of the copy runs: the prune starts,
   the backup starts as soon as the prune reports that its repacking began (borg, whose compact
   reports nothing: as soon as it holds the repository's exclusive lock; others: a second after
   the prune starts). A backup that fails while the prune runs is
   recorded as "cannot start" (restic's and borg's prunes lock the repository exclusively);
   Cairn's must finish, and after the prune the snapshot it wrote is restored and checked;
4. Cairn only: the pruned repository copied and recompressed to lz4 (timed), then full restores
   of the zstd and the lz4 repository (order alternating by round), each checked.
"""
import json, os, re, shutil, statistics, subprocess, threading, time
from . import checks, data
from .measure import CommandFailed, Run, timed

STATES, KEEP, EVERY = 10, 5, 10  # snapshots made, snapshots kept, 1/EVERY of the files changed per state
FORGET_PRUNE = "forget + prune"
BACKUP_ALONE = "backup, 10% changed, alone"
BACKUP_DURING = "backup, 10% changed, during prune"
RECOMPRESS = "recompress --to lz4"
RESTORE_ZSTD = "full restore, zstd repository"
RESTORE_LZ4 = "full restore, lz4 repository"
SCENARIOS = (FORGET_PRUNE, BACKUP_ALONE, BACKUP_DURING, RECOMPRESS, RESTORE_ZSTD, RESTORE_LZ4)
LOCKED = re.compile(r"lock", re.I)  # how restic and borg say the repository is locked
NO_MARKER_DELAY = 1.0  # seconds after a prune that reports no progress starts before the backup
MIB = 2**20


def du_bytes(path):
    return int(subprocess.run(["du", "-sb", path], capture_output=True, text=True, check=True).stdout.split()[0])


def last_json(text):
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                pass
    return {}


def phases_of_line(text):
    """Cairn prune's phases from its last line, "freed X of Y in Ns (list 0.1s, mark 2.0s, …)"."""
    m = re.search(r"freed .* in [\d.]+s \((.*)\)\s*$", text.strip())
    if not m:
        return []
    return [(n, float(s)) for n, s in re.findall(r"([a-z][a-z ]*?) ([\d.]+)s", m.group(1))]


class Lifecycle:
    def __init__(self, runner, quick=False):
        self.r = runner
        self.quick = quick
        # With the tiny --quick tree a prune ends before a backup can start; there the prune of
        # the backup-during-prune step runs with 50 ms added to each storage request, so that
        # the step (not its timing) is exercised. Never in a full run.
        self.slow_prune = "latency=50ms" if quick else None

    def log(self, msg):
        self.r.log(msg)

    def record(self, ds, scenario, t, run, **extra):
        res = self.r.result(ds, scenario, t.name)
        res.runs.append(run)
        for k, v in extra.items():
            res.extra.setdefault(k, []).append(v)
        self.log(f"  {ds.name:<10} {scenario:<40} {t.name:<24} {run.wall:8.2f} s  cpu {run.cpu:7.2f} s"
                 f"  rss {run.rss_kib / 1024:6.0f} MiB" + "".join(f"  {k} {v}" for k, v in extra.items()
                                                                  if isinstance(v, (int, float, str))))
        return res

    def fail(self, ds, scenario, t, why):
        res = self.r.result(ds, scenario, t.name)
        res.fail(why)
        self.log(f"  {ds.name} / {scenario} / {t.name}: {why}")

    def run(self, ds):
        tools = [t for t in self.r.tools if t.forget_cmd and t.prune_cmd]
        if not tools:
            return
        for rnd in range(self.r.rounds):
            self.round(ds, rnd, [t for t in self.r.order(rnd) if t in tools])
            self.r.checkpoint()

    def round(self, ds, rnd, order):
        home = self.r.fresh("lifecycle")
        try:
            src = data.private_copy(home, ds.path)
            files = data.regular_files(src)
            repos, alive = {}, []
            for t in order:
                repo = os.path.join(home, f"repo-{t.name}")
                try:
                    t.init(repo)
                except Exception as e:
                    self.fail(ds, FORGET_PRUNE, t, f"error: init failed: {getattr(e, 'stderr', '') or e}")
                    continue
                repos[t.name] = repo
                alive.append(t)
            # 1. ten states, each backed up by every tool before the next change
            for state in range(STATES):
                changed = data.mutate(files, state - 1, EVERY) if state else 0
                took = []
                for t in list(alive):
                    try:
                        took.append(f"{t.name} {timed(t.backup_cmd(repos[t.name], src), env=t.env).wall:.1f} s")
                    except CommandFailed as e:
                        self.fail(ds, FORGET_PRUNE, t, f"error: backup of state {state + 1}: {e}")
                        alive.remove(t)
                self.log(f"  {ds.name:<10} lifecycle round {rnd + 1}, state {state + 1} ({changed} files changed): "
                         f"backups {', '.join(took)}")
            self.r.settle()
            # 2. forget + prune (and a copy of each forgotten repository for step 4)
            forks = {}
            for t in list(alive):
                repo = repos[t.name]
                try:
                    f = timed(t.forget_cmd(repo, KEEP), env=t.env)
                    fork = os.path.join(home, f"during-{t.name}")
                    forks[t.name] = (fork, t.fork(repo, fork, f"during-{rnd}"))
                    self.r.settle()
                    p = timed(t.prune_cmd(repo), env=t.env)
                except CommandFailed as e:
                    self.fail(ds, FORGET_PRUNE, t, f"error: {e}")
                    alive.remove(t)
                    continue
                run = Run(f.wall + p.wall, f.cpu + p.cpu, max(f.rss_kib, p.rss_kib), f.read_bytes + p.read_bytes,
                          p.stdout)
                extra = {"forget_s": round(f.wall, 3), "prune_s": round(p.wall, 3), "repo_bytes": du_bytes(repo)}
                if t.name == "cairn":
                    s = last_json(p.stdout)
                    extra["phases"] = s.get("phases", [])
                    extra["plan"] = s.get("plan", {})
                    extra["size_before"], extra["size_after"] = s.get("size_before"), s.get("size_after")
                self.record(ds, FORGET_PRUNE, t, run, **extra)
                self.r.settle()
            # 3. state 11: backed up alone, then into each copy while a prune of it runs
            data.mutate(files, STATES - 1, EVERY)
            for t in alive:
                try:
                    self.record(ds, BACKUP_ALONE, t, timed(t.backup_cmd(repos[t.name], src), env=t.env))
                except CommandFailed as e:
                    self.fail(ds, BACKUP_ALONE, t, f"error: {e}")
                self.r.settle()
            for t in alive:
                self.during(ds, t, *forks[t.name], src, home)
                shutil.rmtree(forks[t.name][0], ignore_errors=True)
                self.r.settle()
            # 4. Cairn: recompress to lz4, restores of both
            cairn = next((t for t in alive if t.name == "cairn"), None)
            if cairn and not self.r.result(ds, BACKUP_ALONE, "cairn").error:
                self.recompress(ds, rnd, cairn, repos["cairn"], src, home)
        finally:
            shutil.rmtree(home, ignore_errors=True)
            self.r.settle()

    def during(self, ds, t, repo, env, src, home):
        """A prune of repo started, then a backup of src into it once the prune repacks."""
        tfile = os.path.join(home, f"time-{t.name}")
        penv = dict(env, CAIRN_INJECT_FAULTS=self.slow_prune) if self.slow_prune and t.name == "cairn" else env
        start = time.monotonic()
        prune = subprocess.Popen(["/usr/bin/time", "-o", tfile, "-f", "%e %U %S %M", *t.prune_cmd(repo, watch=True)],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=penv)
        seen, lines = threading.Event(), []

        def read():
            for line in prune.stdout:
                lines.append(line)
                if t.repack_marker and t.repack_marker.search(line):
                    seen.set()
            seen.set()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        if t.repack_marker:
            seen.wait()
            trigger = "once it printed that it repacks" if prune.poll() is None else "after it ended"
        elif t.prune_lock:  # the prune holds the repository's exclusive lock: start once it has it
            while prune.poll() is None and not os.path.exists(os.path.join(repo, t.prune_lock)):
                time.sleep(0.01)
            trigger = "once it held its lock" if prune.poll() is None else "after it ended"
        else:
            seen.wait(NO_MARKER_DELAY)
            trigger = f"{NO_MARKER_DELAY:.0f} s after it started"
        offset = time.monotonic() - start
        running = prune.poll() is None
        try:
            run, err = timed(t.backup_cmd(repo, src), env=env), None
        except CommandFailed as e:
            run, err = None, str(e)
        still = prune.poll() is None
        rc = prune.wait()
        reader.join()
        out = "".join(lines)
        wall = time.monotonic() - start
        try:
            e, u, s_, m = open(tfile).read().split()[-4:]
            prune_run = Run(float(e), float(u) + float(s_), int(m), 0, out)
        except (OSError, ValueError):
            prune_run = Run(wall, 0.0, 0, 0, out)
        extra = {"started_s": round(offset, 2), "trigger": trigger, "prune_s": round(prune_run.wall, 2), "prune_rc": rc,
                 "overlap": ("prune ran throughout the backup" if running and still else
                             "prune ended while the backup ran" if running else
                             "prune had ended before the backup started: no overlap")}
        if t.name == "cairn":
            extra["prune_phases"] = phases_of_line(out)
        if rc != 0:
            tail = [l for l in out.splitlines() if l.strip()][-1:] or ["(no output)"]
            self.fail(ds, BACKUP_DURING, t, f"error: the prune exited {rc}: {tail[0]}")
        if run:
            res = self.record(ds, BACKUP_DURING, t, run, **extra)
            if not running:
                self.log(f"  {ds.name} / {BACKUP_DURING} / {t.name}: the prune had ended before the backup started")
            if t.name == "cairn" and rc == 0:
                self.verify_during(ds, t, repo, env, src, home, res)
        elif running and LOCKED.search(err):
            res = self.r.result(ds, BACKUP_DURING, t.name)
            res.extra.setdefault("cannot_start", []).append(err)
            for k, v in extra.items():
                res.extra.setdefault(k, []).append(v)
            self.log(f"  {ds.name:<10} {BACKUP_DURING:<40} {t.name:<24} cannot start ({trigger}): {err[:200]}")
        else:
            self.fail(ds, BACKUP_DURING, t, f"error: {err}")
        if self.slow_prune and t.name == "cairn":
            self.r.result(ds, BACKUP_DURING, t.name).extra["note"] = (
                f"--quick: the prune ran with CAIRN_INJECT_FAULTS={self.slow_prune} so that it was still "
                "running; the prune's times mean nothing")

    def verify_during(self, ds, t, repo, env, src, home, res):
        """The snapshot written during the prune, after it: `check` clean, restore identical."""
        target = os.path.join(home, "restore-during")
        try:
            timed(t.check_cmd(repo), env=env)
            timed(t.restore_cmd(repo, target), env=env)
        except CommandFailed as e:
            res.fail(f"wrong: after the prune, the repository the backup wrote into: {e}")
        else:
            reason = checks.tree(src, t.restored(target, src))
            if reason:
                res.fail(f"wrong: the snapshot written during the prune restores wrongly: {reason}")
        if res.error:
            self.log(f"  {ds.name} / {BACKUP_DURING} / {t.name}: CHECK FAILED: {res.error}")
        shutil.rmtree(target, ignore_errors=True)

    def recompress(self, ds, rnd, cairn, repo, src, home):
        lz4 = os.path.join(home, "repo-cairn-lz4")
        cairn.fork(repo, lz4, "lz4")
        self.r.settle()
        try:
            run = timed(cairn.recompress_cmd(lz4, "lz4"), env=cairn.env)
        except CommandFailed as e:
            self.fail(ds, RECOMPRESS, cairn, f"error: {e}")
            return
        s = last_json(run.stdout)
        self.record(ds, RECOMPRESS, cairn, run, zstd_bytes=du_bytes(repo), lz4_bytes=du_bytes(lz4),
                    phases=s.get("phases", []), plan=s.get("plan", {}))
        self.r.settle()
        pairs = [(RESTORE_ZSTD, repo), (RESTORE_LZ4, lz4)]
        for scenario, r in (pairs if rnd % 2 == 0 else pairs[::-1]):
            target = os.path.join(home, "restore")
            res = self.r.result(ds, scenario, cairn.name)
            if self.r.step(res, cairn.restore_cmd(r, target), env=cairn.env):
                self.r.check(res, checks.tree(src, cairn.restored(target, src)))
            shutil.rmtree(target, ignore_errors=True)
            self.r.settle()


# -- report --------------------------------------------------------------------------------------
def _get(results, ds, scenario, tool):
    r = results.get((ds, scenario, tool))
    return r if r and (r.runs or r.error or r.extra) else None


def _ok(r):
    return r and r.runs and not r.error


def _rss(r):
    return max(x.rss_kib for x in r.runs) / 1024


def _repo(r):
    return min(r.extra["repo_bytes"]) if r.extra.get("repo_bytes") else None


def _med(values):
    return statistics.median(values) if values else None


def datasets(results):
    return list(dict.fromkeys(ds for (ds, sc, _) in results if sc in SCENARIOS))


def targets(results):
    """Issue 14's targets, judged on Cairn's results: (data set, scenario, text, met)."""
    out = []
    for ds in datasets(results):
        cairn, restic, borg = (_get(results, ds, FORGET_PRUNE, n) for n in ("cairn", "restic", "borg"))
        if _ok(cairn) and _ok(restic):
            r = cairn.min() / restic.min()
            out.append((ds, FORGET_PRUNE, f"forget + prune ≤ 0.5× restic's time: {r:.2f}×", r <= 0.5))
            mine, theirs = _rss(cairn), _rss(restic)
            out.append((ds, FORGET_PRUNE, f"peak RSS ≤ restic's: {mine:.0f} vs {theirs:.0f} MiB", mine <= theirs))
            # "Within 5% of restic's": no more than 5% larger (smaller passes).
            r = _repo(cairn) / _repo(restic)
            out.append((ds, FORGET_PRUNE, f"repository after prune ≤ 1.05× restic's: {r:.3f}×", r <= 1.05))
        if _ok(cairn) and _ok(borg):
            r = cairn.min() / borg.min()
            out.append((ds, FORGET_PRUNE, f"forget + prune < borg prune + compact: {r:.2f}×", r < 1))
        alone, during = _get(results, ds, BACKUP_ALONE, "cairn"), _get(results, ds, BACKUP_DURING, "cairn")
        if _ok(alone) and during and during.runs:
            r = during.min() / alone.min()
            missed = sum(1 for o in during.extra.get("overlap", []) if o.endswith("no overlap"))
            why = f" (in {missed} round(s) the prune had ended before the backup started)" if missed else ""
            out.append((ds, BACKUP_DURING, f"backup during prune ≤ 1.3× alone: {r:.2f}×{why}",
                        r <= 1.3 and not during.error and not missed))
        elif during and during.error:
            out.append((ds, BACKUP_DURING, f"backup during prune ≤ 1.3× alone: {during.error[:120]}", False))
    return out


def rows(results):
    """CSV rows of the lifecycle results (one per data set, scenario, tool)."""
    for (ds, scenario, tool), r in results.items():
        if scenario not in SCENARIOS:
            continue
        restic = _get(results, ds, scenario, "restic")
        ex = r.extra
        yield {
            "dataset": ds, "scenario": scenario, "tool": tool, "baseline": False, "rounds": len(r.runs),
            "min_s": r.min(), "median_s": r.median(),
            "cpu_s": min(x.cpu for x in r.runs) if r.runs else None,
            "cpu_use": min(x.cpu for x in r.runs) / r.min() if r.runs and r.min() else None,
            "peak_rss_mib": _rss(r) if r.runs else None,
            "read_mib": None, "fetched_mib": None, "changed_stored_mib": None,
            "vs": "restic" if restic and tool != "restic" else "",
            "ratio_baseline": r.min() / restic.min() if _ok(restic) and r.runs and tool != "restic" else None,
            "best_peer": "", "ratio_best_peer": None,
            "check": r.error or ("cannot start: " + ex["cannot_start"][0] if ex.get("cannot_start") else
                                 "ok" if r.runs else ""),
            "target": "", "target_pass": "",
            "repo_mib": _repo(r) / MIB if _repo(r) else None,
            "detail": json.dumps({k: v for k, v in ex.items() if k not in ("target", "target_pass")}, default=str),
        }


def _f(v, spec=".2f"):
    return "" if v is None else f"{v:{spec}}"


def _cell(text):
    return str(text).replace("|", "\\|").replace("\n", " ")[:200]


def markdown(results):
    parts = []
    for ds in datasets(results):
        tools = list(dict.fromkeys(t for (d, sc, t) in results if d == ds and sc in SCENARIOS))
        restic = _get(results, ds, FORGET_PRUNE, "restic")
        lines = [f"### Forget and prune ({ds}): {STATES} backups, each state {100 // EVERY}% of the files changed, "
                 f"then forget all but the last {KEEP} and prune",
                 "", "| tool | forget + prune min s | median s | forget s (median) | prune s (median) | × restic "
                 "| peak RSS MiB | × restic | repo after MiB | × restic | check |",
                 "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
        for t in tools:
            r = _get(results, ds, FORGET_PRUNE, t)
            if not r:
                continue
            if not r.runs:
                lines.append(f"| {t} | | | | | | | | | | {_cell(r.error)} |")
                continue
            vs = _ok(restic) and t != "restic"
            lines.append(
                f"| {t} | {_f(r.min())} | {_f(r.median())} | {_f(_med(r.extra['forget_s']))} | {_f(_med(r.extra['prune_s']))} "
                f"| {_f(r.min() / restic.min()) + '×' if vs else ''} | {_rss(r):.0f} "
                f"| {_f(_rss(r) / _rss(restic)) + '×' if vs else ''} | {_repo(r) / MIB:.1f} "
                f"| {_f(_repo(r) / _repo(restic), '.3f') + '×' if vs else ''} | {_cell(r.error or 'ok')} |")
        what = {"borg": "borg prune + compact", "cairn": "cairn forget + prune", "restic": "restic forget + prune"}
        lines.append("\n(" + "; ".join(f"{t}: {what.get(t, t + ' forget + prune')}" for t in tools)
                     + "; repository size by `du -sb`, smallest of the rounds; each tool's default compression.)\n")
        cairn = _get(results, ds, FORGET_PRUNE, "cairn")
        if cairn and cairn.extra.get("phases"):
            names = list(dict.fromkeys(n for ph in cairn.extra["phases"] for n, _ in ph))
            lines += ["Cairn's prune by phase (`cairn prune --json`, seconds), and its plan:", "",
                      "| round | " + " | ".join(names) + " | total | packs before | repacked packs (MiB, copied MiB) "
                      "| deleted packs (MiB) | MiB before → after |",
                      "| ---: | " + " | ".join("---:" for _ in names) + " | ---: | ---: | ---: | ---: | --- |"]
            for i, (ph, plan) in enumerate(zip(cairn.extra["phases"], cairn.extra["plan"])):
                d = dict(ph)
                before, after = cairn.extra["size_before"][i], cairn.extra["size_after"][i]
                lines.append(
                    f"| {i + 1} | " + " | ".join(_f(d.get(n)) for n in names) + f" | {_f(sum(d.values()))} "
                    f"| {plan.get('packs', '')} | {plan.get('repack_packs', '')} ({_f(plan.get('repack_bytes', 0) / MIB, '.1f')}, "
                    f"{_f(plan.get('copy_bytes', 0) / MIB, '.1f')}) | {plan.get('delete_packs', '')} "
                    f"({_f(plan.get('delete_bytes', 0) / MIB, '.1f')}) "
                    f"| {_f((before or 0) / MIB, '.1f')} → {_f((after or 0) / MIB, '.1f')} |")
            lines.append("")
        parts.append("\n".join(lines))

        lines = [f"### Backup during prune ({ds})", "",
                 "The backup of a further 10% changed, alone (into the pruned repository) and started while a prune "
                 "of a copy of the forgotten repository runs.", "",
                 "| tool | alone min s | median s | during prune min s | median s | × alone | started | prune s (with the backup) | overlap | check |",
                 "| --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | --- | --- |"]
        for t in tools:
            a, d = _get(results, ds, BACKUP_ALONE, t), _get(results, ds, BACKUP_DURING, t)
            if not a and not d:
                continue
            ex = d.extra if d else {}
            started = ", ".join(f"{s:.1f} s" for s in ex.get("started_s", []))
            started += " into the prune, " + "; ".join(dict.fromkeys(ex.get("trigger", []))) if started else ""
            if d and d.runs:
                dur = f"{_f(d.min())} | {_f(d.median())} | {_f(d.min() / a.min()) + '×' if _ok(a) else ''}"
            elif ex.get("cannot_start"):
                dur = "cannot start | | "
            else:
                dur = " | | "
            ran, refused = len(d.runs) if d else 0, len(ex.get("cannot_start", []))
            check = d.error if d and d.error else "ok" if ran else ""
            if refused:
                check = (f"{check}; " if check else "") + (
                    f"cannot start in {refused} of {ran + refused} rounds: {ex['cannot_start'][0]}")
            if ex.get("note"):
                check += f" ({ex['note']})"
            lines.append(f"| {t} | {_f(a.min()) if a and a.runs else ''} | {_f(a.median()) if a and a.runs else ''} "
                         f"| {dur} | {started} | {', '.join(_f(x) for x in ex.get('prune_s', []))} "
                         f"| {_cell('; '.join(dict.fromkeys(ex.get('overlap', []))))} | {_cell(check)} |")
        d = _get(results, ds, BACKUP_DURING, "cairn")
        if d and d.extra.get("prune_phases"):
            lines.append("\nCairn's prune with the backup, by phase (seconds; `wait` is the wait for the backup's lock): "
                         + "; ".join("round " + str(i + 1) + ": " + ", ".join(f"{n} {s:.1f}" for n, s in ph)
                                     for i, ph in enumerate(d.extra["prune_phases"])))
        parts.append("\n".join(lines) + "\n")

        rc, rz, rl = (_get(results, ds, sc, "cairn") for sc in (RECOMPRESS, RESTORE_ZSTD, RESTORE_LZ4))
        if rc:
            lines = [f"### Recompress ({ds})", "",
                     "`cairn recompress --to lz4` of a copy of the pruned repository (6 snapshots), then a full restore "
                     "of the latest snapshot from each (order alternating by round; each restore checked).", "",
                     "| recompress min s | median s | peak RSS MiB | repo zstd MiB | repo lz4 MiB | restore zstd min s (median) "
                     "| restore lz4 min s (median) | restore speed-up (zstd ÷ lz4, min) | check |",
                     "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
            if rc.runs:
                speed = _f(rz.min() / rl.min()) + "×" if _ok(rz) and _ok(rl) else ""
                errs = "; ".join(x.error for x in (rc, rz, rl) if x and x.error) or "ok"
                lines.append(
                    f"| {_f(rc.min())} | {_f(rc.median())} | {_rss(rc):.0f} | {min(rc.extra['zstd_bytes']) / MIB:.1f} "
                    f"| {min(rc.extra['lz4_bytes']) / MIB:.1f} "
                    f"| {_f(rz.min()) if rz and rz.runs else ''} ({_f(rz.median()) if rz and rz.runs else ''}) "
                    f"| {_f(rl.min()) if rl and rl.runs else ''} ({_f(rl.median()) if rl and rl.runs else ''}) "
                    f"| {speed} | {_cell(errs)} |")
                if rc.extra.get("phases"):
                    lines.append("\nRecompress by phase (seconds): " + "; ".join(
                        "round " + str(i + 1) + ": " + ", ".join(f"{n} {s:.1f}" for n, s in ph)
                        for i, ph in enumerate(rc.extra["phases"])))
            else:
                lines.append(f"| | | | | | | | | {_cell(rc.error)} |")
            parts.append("\n".join(lines) + "\n")
    return "\n".join(parts)
