"""The local-data scenario (issue 18, part 1): a restore elsewhere while the backed-up tree still
exists with 10% of its files changed (data.mutate: 4 KiB overwritten in the middle of every
tenth file) — Cairn copies what is still on disk (default) against fetching everything
(--no-local-data), from a local repository and from one with 20 ms injected per request
(CAIRN_INJECT_FAULTS=latency=20ms: a remote repository's round trips, on the real local backend;
with S3's default --fetch-concurrency 32, and auto-tuned),
and restic's restore of the same tree as the peer (it has no such mode). Modes interleaved, the
order rotating each round. Each restore is checked with diff -r against the unchanged data set.
Reports wall time, CPU, peak RSS, bytes fetched and bytes reused from Cairn's JSON summary.

Writes localdata.md and localdata.csv into the output directory."""
import csv, json, os, shutil, statistics, subprocess
from . import data
from .measure import CommandFailed, timed

SCENARIO = "restore elsewhere, source present with 10% of files changed"
LATENCY = "latency=20ms"


def summary(stdout):
    lines = [l for l in stdout.splitlines() if l.strip().startswith("{")]
    return json.loads(lines[-1]) if lines else {}


class LocalDataBench:
    def __init__(self, runner, out_dir):
        self.r, self.out_dir = runner, out_dir
        self.runs = {}  # mode -> [(Run, summary)]
        self.errors = {}

    def modes(self, cairn, restic, repos):
        """(name, command builder for a target, environment) of each mode."""
        fault = dict(cairn.env, CAIRN_INJECT_FAULTS=LATENCY)
        # With latency, S3's default of 32 requests in flight (a local repository's is 4): the
        # changed chunks are scattered, so fetching only them takes many small reads.
        remote = ["--fetch-concurrency", "32"]
        out = [
            ("cairn, source used (default)", lambda t: cairn.restore_cmd(repos["cairn"], t, local_data=True), cairn.env),
            ("cairn --no-local-data", lambda t: cairn.restore_cmd(repos["cairn"], t, ["--no-local-data"]), cairn.env),
            (f"cairn, source used, {LATENCY}", lambda t: cairn.restore_cmd(repos["cairn"], t, remote, local_data=True), fault),
            (f"cairn --no-local-data, {LATENCY}",
             lambda t: cairn.restore_cmd(repos["cairn"], t, ["--no-local-data", *remote]), fault),
            # The true default with latency: the fetch concurrency auto-tuned.
            (f"cairn, source used, {LATENCY}, auto", lambda t: cairn.restore_cmd(repos["cairn"], t, local_data=True), fault),
            (f"cairn --no-local-data, {LATENCY}, auto",
             lambda t: cairn.restore_cmd(repos["cairn"], t, ["--no-local-data"]), fault),
        ]
        if restic:
            out.append(("restic", lambda t: restic.restore_cmd(repos["restic"], t), restic.env))
        return out

    def run(self, ds):
        cairn = next(t for t in self.r.tools if t.name == "cairn")
        restic = next((t for t in self.r.tools if t.name == "restic"), None)
        home = self.r.fresh("localdata")
        try:
            src = data.private_copy(home, ds.path)
            files = data.regular_files(src)
            repos = {}
            for t in [cairn] + ([restic] if restic else []):
                repos[t.name] = os.path.join(home, f"repo-{t.name}")
                t.init(repos[t.name])
                timed(t.backup_cmd(repos[t.name], src), env=t.env)
            changed = data.mutate(files, 0, 10)
            self.r.log(f"  {ds.name:<10} {SCENARIO}: {changed} of {len(files)} files changed")
            modes = self.modes(cairn, restic, repos)
            for rnd in range(self.r.rounds):
                k = rnd % len(modes)
                for name, cmd, env in modes[k:] + modes[:k]:
                    target = os.path.join(home, "target")
                    self.r.settle()
                    try:
                        run = timed(cmd(target), env=env)
                    except CommandFailed as e:
                        self.errors.setdefault(name, str(e))
                        shutil.rmtree(target, ignore_errors=True)
                        continue
                    restored = os.path.join(target, src.lstrip("/"))
                    d = subprocess.run(["diff", "-rq", "--no-dereference", ds.path, restored],
                                       capture_output=True, text=True)
                    if d.returncode != 0:
                        self.errors.setdefault(name, "wrong: " + (d.stdout or d.stderr).strip()[:300])
                    shutil.rmtree(target, ignore_errors=True)
                    s = summary(run.stdout) if name.startswith("cairn") else {}
                    self.runs.setdefault(name, []).append((run, s))
                    self.r.log(f"  {ds.name:<10} {name:<44} {run.wall:7.2f} s  cpu {run.cpu:6.2f} s  "
                               f"fetched {s.get('bytes_fetched', 0) / 2**20:8.1f} MiB  "
                               f"reused {s.get('bytes_reused_source', 0) / 2**20:8.1f} MiB"
                               + (f"  {self.errors[name]}" if name in self.errors else ""))
            self.write(ds, changed, len(files))
        finally:
            shutil.rmtree(home, ignore_errors=True)

    def write(self, ds, changed, total):
        os.makedirs(self.out_dir, exist_ok=True)
        with open(os.path.join(self.out_dir, "localdata.csv"), "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["dataset", "mode", "round", "wall_s", "cpu_s", "rss_kib", "bytes_fetched", "bytes_reused_source"])
            for name, runs in self.runs.items():
                for i, (r, s) in enumerate(runs):
                    w.writerow([ds.name, name, i + 1, f"{r.wall:.3f}", f"{r.cpu:.3f}", r.rss_kib,
                                s.get("bytes_fetched", ""), s.get("bytes_reused_source", "")])
        med = {}
        lines = [f"### {SCENARIO} ({ds.name}: {changed} of {total} files changed)", "",
                 "| mode | min s | median s | CPU s | peak RSS MiB | fetched MiB | reused MiB | check |",
                 "|---|---|---|---|---|---|---|---|"]
        for name, runs in self.runs.items():
            walls = [r.wall for r, _ in runs]
            med[name] = statistics.median(walls)
            s = runs[-1][1]
            fetched = f"{s['bytes_fetched'] / 2**20:.1f}" if "bytes_fetched" in s else "–"
            reused = f"{s['bytes_reused_source'] / 2**20:.1f}" if "bytes_reused_source" in s else "–"
            lines.append(f"| {name} | {min(walls):.2f} | {med[name]:.2f} | {min(r.cpu for r, _ in runs):.2f} | "
                         f"{max(r.rss_kib for r, _ in runs) / 1024:.0f} | {fetched} | {reused} | "
                         f"{self.errors.get(name, 'ok')} |")
        pairs = [("cairn, source used (default)", "cairn --no-local-data"),
                 (f"cairn, source used, {LATENCY}", f"cairn --no-local-data, {LATENCY}"),
                 (f"cairn, source used, {LATENCY}, auto", f"cairn --no-local-data, {LATENCY}, auto")]
        lines.append("")
        for a, b in pairs:
            if a in med and b in med:
                lines.append(f"- {a} / {b} (medians): {med[a] / med[b]:.2f}x")
        if "restic" in med and "cairn, source used (default)" in med:
            lines.append(f"- cairn, source used / restic (medians): {med['cairn, source used (default)'] / med['restic']:.2f}x")
        with open(os.path.join(self.out_dir, "localdata.md"), "w") as f:
            f.write("\n".join(lines) + "\n")
        print("\n".join(lines), flush=True)

    def failed(self):
        """Cairn's wrong results (a peer's are reported in the table)."""
        return [f"{m} / {SCENARIO}: {e}" for m, e in self.errors.items() if m.startswith("cairn")]
