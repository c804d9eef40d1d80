"""The scenarios, run for every tool and baseline in rounds that interleave the tools (the order
rotates each round). Each timed step writes into a fresh directory; each restore is checked."""
import json, os, random, shutil, statistics, subprocess
from . import checks, data
from .measure import CommandFailed, timed, settle as _settle

# Scenario names, in table order.
INITIAL, REBACKUP, FULL, NOOP, PARTIAL, META, SERIAL = (
    "initial backup", "re-backup, nothing changed", "full restore", "no-op restore", "partial restore",
    "metadata restore", "restore, 1 fetch / 1 decode / 1 write")
IMG_BACKUP, IMG_RESTORE = "image backup", "image restore"
# Check scenarios (issue 13), on a tree's repositories; the latency ones are Cairn's alone.
CHECK, CHECK_DATA, CHECK_SUBSET, CHECK_LAT, CHECK_DATA_LAT = (
    "check", "check --read-data", "check --read-data-subset 10%", "check, 50 ms latency",
    "check --read-data, 50 ms latency")
CHECKS = (CHECK, CHECK_DATA, CHECK_SUBSET, CHECK_LAT, CHECK_DATA_LAT)
LATENCY = "latency=50ms"  # CAIRN_INJECT_FAULTS: 50 ms added to every storage request
SWEEP_FETCH, SWEEP_DECODE = (1, 2, 4, 8, 16), (1, 2)


class Result:
    """Every round of one (data set, scenario, tool): runs, the first check failure, notes."""

    def __init__(self, dataset, scenario, tool, baseline):
        self.dataset, self.scenario, self.tool, self.baseline = dataset, scenario, tool, baseline
        self.runs, self.fetched, self.error, self.extra = [], [], None, {}

    def fail(self, reason):
        self.error = self.error or reason

    def min(self):
        return min(r.wall for r in self.runs) if self.runs else None

    def median(self):
        return statistics.median(r.wall for r in self.runs) if self.runs else None


class Runner:
    def __init__(self, tools, scratch, rounds, backup_rounds, log, pause, checkpoint=lambda: None):
        self.tools, self.scratch, self.rounds, self.log, self.pause = tools, scratch, rounds, log, pause
        self.backup_rounds = backup_rounds
        self.checkpoint = checkpoint  # called after each scenario: a stopped run keeps what it measured
        self.results, self.sweep = {}, []

    def settle(self):
        _settle(self.pause)

    # -- bookkeeping ---------------------------------------------------------------------------
    def result(self, ds, scenario, tool, baseline=False):
        key = (ds.name, scenario, tool)
        if key not in self.results:
            self.results[key] = Result(ds.name, scenario, tool, baseline)
        return self.results[key]

    def fresh(self, name):
        return os.path.join(self.scratch, f"{name}-{random.randrange(1 << 32):08x}")

    def order(self, rnd):
        k = rnd % len(self.tools)
        return self.tools[k:] + self.tools[:k]

    def step(self, res, cmd, env=None, cwd=None, fetched=None):
        """Times one command into res; returns the run, or None after recording the failure."""
        if res.error and not res.error.startswith("wrong"):
            return None  # the tool failed; a wrong result is still timed in later rounds
        try:
            run = timed(cmd, env=env, cwd=cwd)
        except CommandFailed as e:
            res.fail(f"error: {e}")
            self.log(f"  {res.dataset} / {res.scenario} / {res.tool}: {res.error}")
            return None
        res.runs.append(run)
        if fetched:
            res.fetched.append(fetched(run))
        self.log(f"  {res.dataset:<10} {res.scenario:<40} {res.tool:<24} {run.wall:8.2f} s  cpu {run.cpu:7.2f} s"
                 f"  rss {run.rss_kib / 1024:6.0f} MiB  read {run.read_bytes / 2**20:8.1f} MiB")
        return run

    def check(self, res, reason):
        if reason:
            res.fail(f"wrong: {reason}")
            self.log(f"  {res.dataset} / {res.scenario} / {res.tool}: CHECK FAILED: {reason}")

    def baseline(self, ds, scenario, name, cmd):
        self.step(self.result(ds, scenario, name, baseline=True), ["sh", "-c", cmd])

    def find_baseline(self, ds, scenario):
        self.baseline(ds, scenario, "find -printf", f"find '{ds.path}' -printf '%p %s %m %T@\\n' | wc -l")

    def tar_read_baseline(self, ds, scenario):
        self.baseline(ds, scenario, "tar -cf - | wc -c",
                      f"tar -cf - -C '{os.path.dirname(ds.path)}' '{os.path.basename(ds.path)}' | wc -c")

    # -- backups -------------------------------------------------------------------------------
    def backups(self, ds, scenario):
        """Initial backups into fresh repositories, round by round; returns each tool's last repo."""
        repos = {}
        for rnd in range(self.backup_rounds):
            self.tar_read_baseline(ds, scenario)
            for t in self.order(rnd):
                res = self.result(ds, scenario, t.name)
                repo = self.fresh(f"repo-{t.name}-{ds.name}")
                try:
                    t.init(repo)
                except Exception as e:  # a tool that cannot even create a repository
                    res.fail(f"error: init failed: {getattr(e, 'stderr', '') or e}")
                    continue
                if self.step(res, t.backup_cmd(repo, ds.path), env=t.env):
                    shutil.rmtree(repos.pop(t.name, ""), ignore_errors=True)
                    repos[t.name] = repo
                self.settle()
        self.checkpoint()
        return repos

    def rebackups(self, ds, repos):
        for rnd in range(self.rounds):
            self.find_baseline(ds, REBACKUP)
            for t in self.order(rnd):
                if t.name in repos:
                    self.step(self.result(ds, REBACKUP, t.name), t.backup_cmd(repos[t.name], ds.path), env=t.env)
        self.checkpoint()

    def restore(self, ds, scenario, t, repo, target, options=()):
        res = self.result(ds, scenario, t.name)
        run = self.step(res, t.restore_cmd(repo, target, options), env=t.env, cwd=t.restore_cwd(target),
                        fetched=t.fetched)
        if run:
            out = t.restored(target, ds.path)
            self.check(res, checks.image(ds.path, out) if ds.kind == "image" else checks.tree(ds.path, out))
        return run

    # -- tree scenarios ------------------------------------------------------------------------
    def tree(self, ds):
        repos = self.backups(ds, INITIAL)
        self.rebackups(ds, repos)
        targets, tars = {}, []
        for rnd in range(self.rounds):
            d = self.fresh("tar")
            os.mkdir(d)
            self.step(self.result(ds, FULL, "tar -x", baseline=True), ["tar", "-xf", ds.tar, "-C", d])
            tars.append(d)
            for t in self.order(rnd):
                if t.name not in repos:
                    continue
                d = self.fresh(f"restore-{t.name}")
                self.restore(ds, FULL, t, repos[t.name], d)
                # Keep the last restore for the in-place scenarios; remove older ones (then settle).
                shutil.rmtree(targets.pop(t.name, ""), ignore_errors=True)
                targets[t.name] = d
                self.settle()
            for old in tars[:-1]:
                shutil.rmtree(old, ignore_errors=True)
            del tars[:-1]
        shutil.rmtree(tars[-1], ignore_errors=True)
        self.settle()
        self.checkpoint()
        self.in_place(ds, NOOP, repos, targets, lambda root: None)
        self.changed_chunks(ds, repos, targets)
        self.in_place(ds, PARTIAL, repos, targets, data.damage)
        self.in_place(ds, META, repos, targets, data.age)
        for d in targets.values():
            shutil.rmtree(d, ignore_errors=True)
        self.serial(ds, repos)
        return repos

    def in_place(self, ds, scenario, repos, targets, change):
        for rnd in range(self.rounds):
            self.find_baseline(ds, scenario)
            for t in self.order(rnd):
                full_error = self.result(ds, FULL, t.name).error or ""
                # A full restore that ran but came out wrong still leaves a tree to restore into.
                if t.name in targets and (not full_error or full_error.startswith("wrong")):
                    change(t.restored(targets[t.name], ds.path))
                    self.restore(ds, scenario, t, repos[t.name], targets[t.name])
        self.checkpoint()

    def changed_chunks(self, ds, repos, targets):
        """The stored size of the chunks a partial restore must fetch: back the damaged tree up into
        a fresh Cairn repository, then the original; the second backup stores exactly the chunks
        (and trees) the damaged tree lacks."""
        cairn = next((t for t in self.tools if t.name == "cairn"), None)
        if not cairn or "cairn" not in targets:
            return
        scratch = self.fresh("changed")
        shutil.copytree(cairn.restored(targets["cairn"], ds.path), scratch, symlinks=True)
        data.damage(scratch)
        repo = self.fresh("repo-changed")
        cairn.init(repo)
        try:
            timed(cairn.backup_cmd(repo, scratch), env=cairn.env)
            run = timed(cairn.backup_cmd(repo, ds.path), env=cairn.env)
            summary = [l for l in run.stdout.splitlines() if '"summary"' in l][-1]
            self.result(ds, PARTIAL, "cairn").extra["changed_stored"] = json.loads(summary)["bytes_stored"]
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
            shutil.rmtree(repo, ignore_errors=True)
            self.settle()

    def serial(self, ds, repos):
        cairn = next((t for t in self.tools if t.name == "cairn"), None)
        if not cairn or "cairn" not in repos:
            return
        for _ in range(self.rounds):
            d = self.fresh("serial")
            self.restore(ds, SERIAL, cairn, repos["cairn"], d,
                         ["--fetch-concurrency", "1", "--decode-threads", "1", "--write-threads", "1"])
            shutil.rmtree(d, ignore_errors=True)
            self.settle()
        self.checkpoint()

    # -- check ---------------------------------------------------------------------------------
    def checks(self, ds, repos):
        """Checks of the tree's repositories by every tool that has a check, with a warm page cache:
        structure, --read-data, --read-data-subset 10%; Cairn's structure and --read-data again with
        50 ms injected per request. The floor for --read-data: `cat` of every pack file (timed here,
        a baseline) plus the decoding spread over every core (see report.floor_s)."""
        checkers = [t for t in self.tools if t.check_cmd and t.name in repos]
        if not checkers:
            return
        cairn = next((t for t in checkers if t.name == "cairn"), None)
        for t in checkers:  # warm: every repository file read once, untimed
            subprocess.run(f"find '{repos[t.name]}' -type f -print0 | xargs -0 -r cat > /dev/null", shell=True)
        # Cairn with 50 ms per request runs as one more "tool" in the rounds of its 0 ms scenario.
        slow = dict(cairn.env, CAIRN_INJECT_FAULTS=LATENCY) if cairn else None
        cat = f"find '{os.path.join(repos['cairn'], 'data')}' -type f -print0 | xargs -0 -r cat > /dev/null" if cairn else None
        for scenario, opts, latency in ((CHECK, (), CHECK_LAT), (CHECK_DATA, ("--read-data",), CHECK_DATA_LAT),
                                        (CHECK_SUBSET, ("--read-data-subset", "10%"), None)):
            for rnd in range(self.rounds):
                if scenario == CHECK_DATA and cat:
                    self.baseline(ds, scenario, "cat packs", cat)
                jobs = [(t, scenario, t.env) for t in checkers]
                if cairn and latency:
                    jobs.append((cairn, latency, slow))
                k = rnd % len(jobs)
                for t, sc, env in jobs[k:] + jobs[:k]:
                    self.step(self.result(ds, sc, t.name), t.check_cmd(repos[t.name], opts), env=env, fetched=t.fetched)
            self.checkpoint()

    # -- disk image ----------------------------------------------------------------------------
    def image(self, ds):
        repos = self.backups(ds, IMG_BACKUP)
        for rnd in range(self.rounds):
            d = self.fresh("cp")
            self.step(self.result(ds, IMG_RESTORE, "cp --sparse=always", baseline=True),
                      ["cp", "--sparse=always", "--preserve=timestamps", ds.path, d])
            os.unlink(d)
            self.settle()
            for t in self.order(rnd):
                if t.name in repos:
                    d = self.fresh(f"restore-{t.name}")
                    self.restore(ds, IMG_RESTORE, t, repos[t.name], d)
                    shutil.rmtree(d, ignore_errors=True)  # images are large: one on disk at a time
                    self.settle()
        self.checkpoint()
        self.serial(ds, repos)
        return repos

    # -- concurrency sweep ---------------------------------------------------------------------
    def concurrency_sweep(self, ds, repo, cairn):
        size = data.apparent_size(ds.path)
        for fc in SWEEP_FETCH:
            for dt in SWEEP_DECODE:
                d = self.fresh("sweep")
                res = Result(ds.name, "sweep", "cairn", False)
                opts = ["--fetch-concurrency", str(fc), "--decode-threads", str(dt)]
                run = self.step(res, cairn.restore_cmd(repo, d, opts), env=cairn.env)
                if run:
                    out = cairn.restored(d, ds.path)
                    self.check(res, checks.image(ds.path, out) if ds.kind == "image" else checks.tree(ds.path, out))
                self.sweep.append({"dataset": ds.name, "fetch_concurrency": fc, "decode_threads": dt,
                                   "wall_s": run.wall if run else None, "cpu_s": run.cpu if run else None,
                                   "mb_per_s": size / run.wall / 1e6 if run else None,
                                   "cpu_use": run.cpu / run.wall if run else None,
                                   "peak_rss_mib": run.rss_kib / 1024 if run else None,
                                   "check": res.error or "ok"})
                shutil.rmtree(d, ignore_errors=True)
                self.settle()
                self.checkpoint()
