"""The diff scenario (issue 15): two snapshots of a private copy of the tree, the second after
lifecycle.py's change of 10% of the files (data.mutate: 4 KiB overwritten in the middle, mtime
moved on), then `diff` of the two snapshots by each tool that has one (Cairn, restic), tools
interleaved with the order rotating each round. Each run is checked: every changed file must be
reported as modified (`M`), and nothing else as added or removed. Target: Cairn's median
<= 0.5x restic's.

Writes diff.md and diff.csv into the output directory."""
import csv, json, os, shutil, statistics, subprocess
from . import data
from .measure import CommandFailed, timed

SCENARIO = "diff, 10% of files changed"
TARGET = 0.5  # Cairn's median over restic's


def snapshot_ids(t, repo):
    """The tool's snapshot IDs, oldest first."""
    if t.name == "cairn":
        out = subprocess.run([t.path, "-r", repo, "--json", "snapshots"], env=t.env, check=True,
                             capture_output=True, text=True).stdout
        return [s["id"] for s in json.loads(out)]
    out = subprocess.run([t.path, "-r", repo, "snapshots", "--json"], env=t.env, check=True,
                         capture_output=True, text=True).stdout
    return [s["id"] for s in sorted(json.loads(out), key=lambda s: s["time"])]


def diff_cmd(t, repo, a, b):
    return [t.path, "-r", repo, "diff", a, b]


def check_output(stdout, changed):
    """None if the diff lists exactly `changed` files as modified and nothing added or removed;
    else why not. Both tools print `M    /path` (restic) or `M SIZE  /path` (Cairn)."""
    lines = [l for l in stdout.splitlines() if l[:2] in ("M ", "+ ", "- ", "T ")]
    modified = sum(1 for l in lines if l.startswith("M ") and not l.rstrip().endswith("/"))
    others = [l for l in lines if not l.startswith("M ")]
    if modified != changed or others:
        return f"{modified} files modified (want {changed}), {len(others)} other changes: {others[:3]}"
    return None


class DiffBench:
    def __init__(self, runner, out_dir):
        self.r, self.out_dir = runner, out_dir
        self.runs = {}  # tool -> [Run]
        self.errors = {}

    def run(self, ds):
        tools = [t for t in self.r.tools if t.name in ("cairn", "restic")]
        home = self.r.fresh("diff")
        try:
            src = data.private_copy(home, ds.path)
            files = data.regular_files(src)
            repos, ids = {}, {}
            for t in tools:
                repos[t.name] = os.path.join(home, f"repo-{t.name}")
                t.init(repos[t.name])
                timed(t.backup_cmd(repos[t.name], src), env=t.env)
            changed = data.mutate(files, 0, 10)
            for t in tools:
                timed(t.backup_cmd(repos[t.name], src), env=t.env)
                ids[t.name] = snapshot_ids(t, repos[t.name])[-2:]
            self.r.log(f"  {ds.name:<10} {SCENARIO}: {changed} of {len(files)} files changed")
            self.r.settle()
            for rnd in range(self.r.rounds):
                for t in [t for t in self.r.order(rnd) if t in tools]:
                    try:
                        run = timed(diff_cmd(t, repos[t.name], *ids[t.name]), env=t.env)
                    except CommandFailed as e:
                        self.errors.setdefault(t.name, str(e))
                        continue
                    why = check_output(run.stdout, changed)
                    if why:
                        self.errors.setdefault(t.name, why)
                    self.runs.setdefault(t.name, []).append(run)
                    self.r.log(f"  {ds.name:<10} {SCENARIO:<30} {t.name:<8} {run.wall:7.2f} s  cpu {run.cpu:6.2f} s  "
                               f"rss {run.rss_kib / 1024:6.0f} MiB" + (f"  WRONG: {why}" if why else ""))
            self.write(ds, changed, len(files))
        finally:
            shutil.rmtree(home, ignore_errors=True)

    def write(self, ds, changed, total):
        os.makedirs(self.out_dir, exist_ok=True)
        rows = []
        for name, runs in self.runs.items():
            walls = [r.wall for r in runs]
            rows.append((name, min(walls), statistics.median(walls), min(r.cpu for r in runs),
                         max(r.rss_kib for r in runs) / 1024, self.errors.get(name, "ok")))
        with open(os.path.join(self.out_dir, "diff.csv"), "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["dataset", "tool", "round", "wall_s", "cpu_s", "rss_kib"])
            for name, runs in self.runs.items():
                for i, r in enumerate(runs):
                    w.writerow([ds.name, name, i + 1, f"{r.wall:.3f}", f"{r.cpu:.3f}", r.rss_kib])
        med = {name: m for name, _, m, _, _, _ in rows}
        lines = [f"### {SCENARIO} ({ds.name}: {changed} of {total} files changed)", "",
                 "| tool | min s | median s | CPU s | peak RSS MiB | check |", "|---|---|---|---|---|---|"]
        lines += [f"| {n} | {mn:.2f} | {md:.2f} | {cpu:.2f} | {rss:.0f} | {chk} |" for n, mn, md, cpu, rss, chk in rows]
        if "cairn" in med and "restic" in med:
            ratio = med["cairn"] / med["restic"]
            lines += ["", f"Cairn / restic (medians): {ratio:.2f}x — target <= {TARGET}x: "
                          f"{'met' if ratio <= TARGET else 'NOT met'}"]
        with open(os.path.join(self.out_dir, "diff.md"), "w") as f:
            f.write("\n".join(lines) + "\n")
        print("\n".join(lines), flush=True)

    def failed(self):
        """Cairn's wrong results (a peer's are reported in the table)."""
        return [f"cairn / {SCENARIO}: {self.errors['cairn']}"] if "cairn" in self.errors else []
