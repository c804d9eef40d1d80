"""The mount scenario (issue 15; `bench/run --only-mount`): reading out of `cairn mount` against
Cairn's own streaming commands and against `restic mount`, side by side in one run.

One Cairn and one restic repository each hold two snapshots: the Linux tree and a directory with
one large file of random bytes (1 GiB; the tiny tree and a 64 MiB file with --quick). Each
measurement mounts afresh (so the kernel's page cache of an earlier mount cannot serve it),
waits for the mount, times one command, and unmounts with SIGTERM:

- `cat BIG > /dev/null` from the mounted snapshot, against `cairn dump latest:BIG > /dev/null`
  (target: the mount at least half the dump's speed);
- `tar -cf - . | wc -c` inside the mounted Linux snapshot, against a full `cairn restore` of it
  into an empty directory (target: at most 3x the restore's time);
- the same `cat` and `tar` from `restic mount` of the restic repository (reported as a ratio).

Rounds interleave the commands; the tables show the minimum and median wall seconds, and the
bytes each command produced are compared with the source (the size of BIG; the tar stream of the
source tree), so a mount that serves wrong data fails the run."""
import os, shlex, shutil, signal, subprocess, time

from . import measure, tools


def _mounted(point):
    with open("/proc/mounts") as f:
        return any(line.split(" ")[1] == point for line in f)


class Mounted:
    """`TOOL mount` of a repository on a fresh directory until the `with` block ends."""

    def __init__(self, cmd, env, point):
        self.cmd, self.env, self.point = cmd, env, point

    def __enter__(self):
        os.makedirs(self.point, exist_ok=True)
        self.proc = subprocess.Popen(self.cmd + [self.point], env=self.env, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True)
        start = time.monotonic()
        while not _mounted(self.point):
            if self.proc.poll() is not None:
                raise measure.CommandFailed(f"{shlex.join(self.cmd)} did not mount: {self.proc.stderr.read()[-500:]}")
            if time.monotonic() - start > 120:
                raise measure.CommandFailed(f"{shlex.join(self.cmd)} did not mount within 120 s")
            time.sleep(0.05)
        # restic shows its snapshots a moment after the mount appears.
        start = time.monotonic()
        while not os.path.exists(os.path.join(self.point, "snapshots", "latest")):
            if time.monotonic() - start > 60:
                raise measure.CommandFailed(f"{shlex.join(self.cmd)}: no snapshots/latest after 60 s")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if _mounted(self.point):
            subprocess.run(["fusermount3", "-u", "-z", self.point], capture_output=True)
        return False


def _sh(script):
    return ["sh", "-c", script]


class MountBench:
    def __init__(self, selected, scratch, rounds, log, quick=False):
        self.cairn = next(t for t in selected if isinstance(t, tools.Cairn))
        self.restic = next((t for t in selected if isinstance(t, tools.Restic)), None)
        self.scratch, self.rounds, self.log, self.quick = scratch, rounds, log, quick
        self.times = {}  # (scenario, tool) -> [seconds]
        self.errors = []

    def big_file(self):
        d = os.path.join(self.scratch, "big")
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, "big.bin")
        size = (64 if self.quick else 1024) << 20
        with open(path, "wb") as f:
            for _ in range(size >> 24):
                f.write(os.urandom(1 << 24))
        return path

    def time(self, scenario, tool, cmd, expect_bytes=None, cwd=None, env=None):
        try:
            run = measure.timed(cmd, env=env or self.cairn.env, cwd=cwd)
        except measure.CommandFailed as e:
            self.errors.append(f"{tool} / {scenario}: {e}")
            self.log(f"bench: mount: {tool} / {scenario} FAILED: {e}")
            return
        if expect_bytes is not None and run.stdout.strip() != str(expect_bytes):
            self.errors.append(f"{tool} / {scenario}: produced {run.stdout.strip()} bytes, expected {expect_bytes}")
        self.times.setdefault((scenario, tool), []).append(run.wall)
        self.log(f"bench: mount: {tool} / {scenario}: {run.wall:.2f} s")

    def run(self, tree):
        big = self.big_file()
        big_size = os.path.getsize(big)
        tar_bytes = int(subprocess.run(_sh(f"cd {shlex.quote(tree)} && tar -cf - . | wc -c"), capture_output=True,
                                       text=True, check=True).stdout)
        repos = {}
        for t in [self.cairn] + ([self.restic] if self.restic else []):
            repo = os.path.join(self.scratch, f"mount-repo-{t.name}")
            t.init(repo)
            for src in (tree, os.path.dirname(big)):
                subprocess.run(t.backup_cmd(repo, src), env=t.env, check=True, capture_output=True)
            repos[t.name] = repo
            self.log(f"bench: mount: {t.name} repository ready")
        c, crepo = self.cairn, repos["cairn"]
        point = os.path.join(self.scratch, "mnt")
        in_snap = lambda p: os.path.join(point, "snapshots", "latest", p.lstrip("/"))
        tree_snap = None
        for rnd in range(self.rounds):
            self.time("cat big file", "cairn dump", _sh(f"{shlex.quote(c.path)} -r {shlex.quote(crepo)} dump "
                      f"latest:{shlex.quote(big)} | wc -c"), big_size)
            with Mounted([c.path, "-r", crepo, "mount"], c.env, point):
                self.time("cat big file", "cairn mount", _sh(f"cat {shlex.quote(in_snap(big))} | wc -c"), big_size)
            target = os.path.join(self.scratch, "restore")
            shutil.rmtree(target, ignore_errors=True)
            # The Linux tree is the older snapshot: restore it by ID.
            tree_snap = tree_snap or self.snapshot_of(crepo, tree)
            self.time("linux tree out", "cairn restore", [c.path, "-r", crepo, "restore", tree_snap, "--target", target, "--no-local-data"])
            shutil.rmtree(target, ignore_errors=True)
            measure.settle(0 if self.quick else 2)
            with Mounted([c.path, "-r", crepo, "mount"], c.env, point):
                d = os.path.join(point, "ids", tree_snap, tree.lstrip("/"))
                self.time("linux tree out", "cairn mount", _sh(f"cd {shlex.quote(d)} && tar -cf - . | wc -c"), tar_bytes)
            if self.restic and rnd == 0:  # restic's mount is slow: one round
                r, rrepo = self.restic, repos["restic"]
                with Mounted([r.path, "-r", rrepo, "mount"], r.env, point):
                    self.time("cat big file", "restic mount", _sh(f"cat {shlex.quote(in_snap(big))} | wc -c"),
                              big_size, env=r.env)
                with Mounted([r.path, "-r", rrepo, "mount"], r.env, point):
                    d = os.path.join(point, "hosts")
                    host = os.listdir(d)[0]
                    snaps = sorted(s for s in os.listdir(os.path.join(d, host)) if s != "latest")
                    d = os.path.join(d, host, snaps[0], tree.lstrip("/"))
                    self.time("linux tree out", "restic mount", _sh(f"cd {shlex.quote(d)} && tar -cf - . | wc -c"),
                              tar_bytes, env=r.env)
        for repo in repos.values():
            shutil.rmtree(repo, ignore_errors=True)
        os.remove(big)

    def snapshot_of(self, repo, path):
        out = subprocess.run([self.cairn.path, "-r", repo, "--json", "snapshots"], env=self.cairn.env,
                             capture_output=True, text=True, check=True).stdout
        import json
        for line in out.splitlines():
            if line.startswith("[") or line.startswith("{"):
                data = json.loads(line)
                for s in (data if isinstance(data, list) else [data]):
                    if path in s.get("paths", []):
                        return s["short_id"]
        raise measure.CommandFailed(f"no snapshot of {path}")

    def best(self, scenario, tool):
        t = self.times.get((scenario, tool))
        return (min(t), sorted(t)[len(t) // 2]) if t else (None, None)

    def markdown(self, command):
        rows = ["| scenario | command | min s | median s |", "|---|---|---:|---:|"]
        for (scenario, tool) in self.times:
            mn, med = self.best(scenario, tool)
            rows.append(f"| {scenario} | {tool} | {mn:.2f} | {med:.2f} |")
        ratio = lambda a, b: (a / b) if a and b else None
        dump, mcat = self.best("cat big file", "cairn dump")[0], self.best("cat big file", "cairn mount")[0]
        rest, mtar = self.best("linux tree out", "cairn restore")[0], self.best("linux tree out", "cairn mount")[0]
        rcat, rtar = self.best("cat big file", "restic mount")[0], self.best("linux tree out", "restic mount")[0]
        lines = ["", "Targets (min of the rounds):"]
        r = ratio(dump, mcat)
        if r is not None:
            lines.append(f"- cat from the mount at {r:.2f}x the speed of `cairn dump` (target >= 0.5): "
                         f"{'met' if r >= 0.5 else 'NOT met'}")
        r = ratio(mtar, rest)
        if r is not None:
            lines.append(f"- tar of the mounted Linux tree {r:.2f}x the time of a full restore (target <= 3): "
                         f"{'met' if r <= 3 else 'NOT met'}")
        r = ratio(rcat, mcat)
        if r is not None:
            lines.append(f"- restic mount's cat takes {r:.1f}x as long as Cairn's")
        r = ratio(rtar, mtar)
        if r is not None:
            lines.append(f"- restic mount's tar takes {r:.1f}x as long as Cairn's")
        lines += [f"- FAILED: {e}" for e in self.errors]
        return "\n".join([f"Command: `{command}`", "", *rows, *lines, ""])
