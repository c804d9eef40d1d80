"""The many-files scenario (issue 17): `many` (1,000,000 small files in ~588 directories, one of
them holding ~250,000 entries) and the same kind of tree at 100,000 and 300,000 files
(`many100k`, `many300k`; bench/datasets.sh).

Per data set, one round each (a round of `many` takes about half an hour with restic beside):
initial backup into a fresh repository, backup again with nothing changed (each backup after an
untimed read of the whole tree, so every tool starts from a warm page cache), `tar -x` of the
set's tar (the baseline), full restore into a fresh directory under --scratch (a tmpfs keeps the
disk out of it), and a no-op restore into that restored tree. Cairn's restores fetch from the
repository (--no-local-data) within the run's --max-memory. Every full restore is checked
(diff -r, rsync -ain, du), after the no-op restore into it (whose time the check's reads
would change: see `restores`). restic runs beside Cairn on the
largest set asked for only: its backups of the smaller sets would add a quarter of an hour and
the per-file curve is Cairn's. The partial and metadata restores and the 1/1/1 restore of the
tree scenarios are not run: at a million files each is another full pass over the tree and
says nothing the full and no-op restores do not.

Writes many.md (tables, the issue-17 targets as PASS/FAIL rows, the curve), many.csv and
manycurve.png (restore time per file against the number of files) into the output directory."""
import csv, os, shutil, subprocess

from . import checks
from .measure import CommandFailed, timed

SETS = ("many100k", "many300k", "many")  # smallest first: the curve's order
INITIAL, UNCHANGED, TAR, FULL, NOOP = ("initial backup", "backup, nothing changed", "tar -x", "full restore",
                                       "no-op restore")


def is_many(name):
    return name in SETS


def count_files(root):
    return sum(len(files) for _, _, files in os.walk(root))


class ManyBench:
    def __init__(self, runner, out_dir, max_mib, largest, head=""):
        self.r, self.out_dir, self.max_mib, self.largest, self.head = runner, out_dir, max_mib, largest, head
        self.rows = []  # dict per timed step
        self.files = {}  # data set -> regular files

    def tools_for(self, ds):
        return [t for t in self.r.tools if t.name == "cairn" or (ds.name == self.largest and t.name == "restic")]

    def step(self, ds, what, tool, cmd, env=None, cwd=None):
        row = {"dataset": ds.name, "files": self.files[ds.name], "step": what, "tool": tool}
        try:
            run = timed(cmd, env=env, cwd=cwd)
        except CommandFailed as e:
            row["check"] = f"error: {e}"
            self.rows.append(row)
            self.r.log(f"  {ds.name:<9} {what:<24} {tool:<8} {row['check']}")
            return None
        row.update(wall_s=run.wall, cpu_s=run.cpu, rss_mib=run.rss_kib / 1024, check="ok")
        self.rows.append(row)
        self.r.log(f"  {ds.name:<9} {what:<24} {tool:<8} {run.wall:8.2f} s  cpu {run.cpu:7.2f} s  "
                   f"rss {run.rss_kib / 1024:6.0f} MiB")
        return row

    def checked(self, row, ds, restored):
        if row and row["check"] == "ok":
            why = checks.tree(ds.path, restored)
            if why:
                row["check"] = f"wrong: {why}"[:300]
                self.r.log(f"  {ds.name} / {row['step']} / {row['tool']}: CHECK FAILED: {why}")

    def warm(self, ds):
        """Reads the whole tree (untimed) so each backup starts from a warm page cache: the first
        tool to read a million files from disk would otherwise be timed on the disk."""
        subprocess.run(f"tar -cf - -C '{os.path.dirname(ds.path)}' '{os.path.basename(ds.path)}' | wc -c",
                       shell=True, check=True, stdout=subprocess.DEVNULL)

    def run(self, ds):
        self.files[ds.name] = count_files(ds.path)
        tools = self.tools_for(ds)
        repos = {}
        try:
            for t in tools:
                repos[t.name] = self.r.fresh(f"repo-{t.name}-{ds.name}")
                t.init(repos[t.name])
                self.warm(ds)
                self.r.settle()
                self.step(ds, INITIAL, t.name, t.backup_cmd(repos[t.name], ds.path), env=t.env)
            for t in tools:
                self.warm(ds)
                self.r.settle()
                self.step(ds, UNCHANGED, t.name, t.backup_cmd(repos[t.name], ds.path), env=t.env)
            for rnd in range(self.r.rounds):
                d = self.r.fresh("tar")
                os.mkdir(d)
                self.r.settle()
                self.checked(self.step(ds, TAR, "tar", ["tar", "-xf", ds.tar, "-C", d]), ds,
                             os.path.join(d, os.path.basename(ds.path)))
                shutil.rmtree(d, ignore_errors=True)
                for t in tools[rnd % len(tools):] + tools[:rnd % len(tools)]:
                    self.restores(ds, t, repos[t.name], noop=rnd == 0)
        finally:
            for d in repos.values():
                shutil.rmtree(d, ignore_errors=True)
        self.write()

    def restores(self, ds, t, repo, noop):
        """A full restore into a fresh directory and, when `noop`, a no-op restore into the
        restored tree as the full restore left it; the tree is removed before the next tool's (a
        million files take 4.9 GB of tmpfs: two at once with the repositories did not fit in
        this machine's memory).

        The no-op runs before the tree is checked: the check reads every file, which sets its
        access time, and a restore puts the snapshot's access times back, so a no-op after the
        check re-applied the metadata of every file (100k files: 1.09 s instead of 0.61 s).
        The check after the no-op covers both: the full restore's row takes its result, and the
        no-op's only if the full one was right."""
        d = self.r.fresh(f"restore-{t.name}")
        try:
            self.r.settle()
            full = self.step(ds, FULL, t.name, t.restore_cmd(repo, d), env=t.env, cwd=t.restore_cwd(d))
            again = None
            if noop and full and full["check"] == "ok":
                self.r.settle()
                again = self.step(ds, NOOP, t.name, t.restore_cmd(repo, d), env=t.env, cwd=t.restore_cwd(d))
            self.checked(full, ds, t.restored(d, ds.path))
            if again and again["check"] == "ok":
                again["check"] = full["check"]
        finally:
            shutil.rmtree(d, ignore_errors=True)

    # -- results -------------------------------------------------------------------------------
    def best(self, ds, step, tool):
        """The fastest good run of a step (and its peak RSS, the largest of the rounds)."""
        rows = [r for r in self.rows if (r["dataset"], r["step"], r["tool"]) == (ds, step, tool)]
        good = [r for r in rows if r["check"] == "ok"]
        if not good:
            return None
        return min(r["wall_s"] for r in good), max(r["rss_mib"] for r in good)

    def targets(self):
        """(data set, target, measured, met) for every issue-17 target that was measured."""
        out = []
        max_mib = self.max_mib
        for ds in self.files:
            c = lambda step: self.best(ds, step, "cairn")  # noqa: E731
            p = lambda step: self.best(ds, step, "restic")  # noqa: E731
            full, tar = c(FULL), self.best(ds, TAR, "tar")
            if full and tar:
                out.append((ds, "full restore ≤ 1.0 × tar -x", f"{full[0] / tar[0]:.2f} ×", full[0] <= tar[0]))
            if full and p(FULL):
                r = full[0] / p(FULL)[0]
                out.append((ds, "full restore ≤ 0.5 × restic's time", f"{r:.2f} ×", r <= 0.5))
            if full:
                out.append((ds, f"full restore peak RSS ≤ --max-memory + 64 MiB ({max_mib + 64:.0f} MiB)",
                            f"{full[1]:.0f} MiB", full[1] <= max_mib + 64))
            if full and p(FULL):
                r = full[1] / p(FULL)[1]
                out.append((ds, "full restore peak RSS ≤ 0.5 × restic's", f"{r:.2f} × ({full[1]:.0f} / "
                            f"{p(FULL)[1]:.0f} MiB)", r <= 0.5))
            for step in (INITIAL, UNCHANGED):
                if c(step) and p(step):
                    (ct, cr), (pt, pr) = c(step), p(step)
                    out.append((ds, f"{step}: peak RSS ≤ restic's", f"{cr:.0f} / {pr:.0f} MiB", cr <= pr))
                    out.append((ds, f"{step}: time ≤ 0.5 × restic's", f"{ct / pt:.2f} × ({ct:.1f} / {pt:.1f} s)",
                                ct <= 0.5 * pt))
            if full and c(NOOP):
                r = c(NOOP)[0] / full[0]
                out.append((ds, "no-op restore ≤ 0.3 × full restore", f"{r:.2f} ×", r <= 0.3))
        curve = self.curve()
        if len(curve) >= 2:
            (n0, t0), (n1, t1) = curve[0], curve[-1]
            r = (t1 / n1) / (t0 / n0)
            out.append((f"{n0:,} → {n1:,} files", f"restore time per file at {n1:,} ≤ 1.2 × at {n0:,}",
                        f"{r:.2f} ×", r <= 1.2))
        return out

    def curve(self):
        """(files, full restore seconds) of Cairn per data set, by number of files."""
        pts = [(self.files[ds], self.best(ds, FULL, "cairn")[0]) for ds in self.files if self.best(ds, FULL, "cairn")]
        return sorted(pts)

    def chart(self):
        pts = self.curve()
        if len(pts) < 2:
            return None
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(7, 4))
        xs = [n for n, _ in pts]
        ax.plot(xs, [t / n * 1e6 for n, t in pts], "o-", label="cairn full restore")
        tars = [(self.files[ds], self.best(ds, TAR, "tar")[0]) for ds in self.files if self.best(ds, TAR, "tar")]
        if tars:
            tars.sort()
            ax.plot([n for n, _ in tars], [t / n * 1e6 for n, t in tars], "s--", label="tar -x")
        ax.set_xscale("log")
        ax.set_xticks(xs, [f"{n // 1000}k" for n in xs])
        ax.set_xlabel("files")
        ax.set_ylabel("µs per file")
        ax.set_ylim(bottom=0)
        ax.set_title("Full restore: time per file (wall, one run each)")
        ax.legend()
        path = os.path.join(self.out_dir, "manycurve.png")
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        return path

    def write(self):
        os.makedirs(self.out_dir, exist_ok=True)
        fields = ["dataset", "files", "step", "tool", "wall_s", "cpu_s", "rss_mib", "check"]
        with open(os.path.join(self.out_dir, "many.csv"), "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=fields)
            w.writeheader()
            for r in self.rows:
                w.writerow({k: (f"{v:.3f}" if isinstance(v, float) else v) for k, v in r.items()})
        lines = [self.head, "| data set | files | step | tool | s | CPU s | peak RSS MiB | check |",
                 "|---|---:|---|---|---:|---:|---:|---|"]
        for r in self.rows:
            if "wall_s" in r:
                lines.append(f"| {r['dataset']} | {r['files']:,} | {r['step']} | {r['tool']} | {r['wall_s']:.2f} | "
                             f"{r['cpu_s']:.2f} | {r['rss_mib']:.0f} | {r['check']} |")
            else:
                lines.append(f"| {r['dataset']} | {r['files']:,} | {r['step']} | {r['tool']} | – | – | – | "
                             f"{r['check']} |")
        lines += ["", "Targets (issue 17):", "", "| data set | target | measured | |", "|---|---|---|---|"]
        lines += [f"| {ds} | {what} | {got} | {'PASS' if ok else 'FAIL'} |" for ds, what, got, ok in self.targets()]
        curve = self.curve()
        if curve:
            lines += ["", "Cairn's full restore per file:", "", "| files | s | µs per file |", "|---:|---:|---:|"]
            lines += [f"| {n:,} | {t:.2f} | {t / n * 1e6:.1f} |" for n, t in curve]
        png = self.chart()
        if png:
            lines += ["", f"![restore time per file]({os.path.basename(png)})"]
        with open(os.path.join(self.out_dir, "many.md"), "w") as f:
            f.write("\n".join(lines) + "\n")
        print("\n".join(lines), flush=True)

    def failed(self):
        """Cairn's and the baseline's wrong results and errors (a peer's are reported in the table)."""
        return [f"{r['tool']} / {r['dataset']} / {r['step']}: {r['check']}" for r in self.rows
                if r["check"] != "ok" and r["tool"] != "restic"]
