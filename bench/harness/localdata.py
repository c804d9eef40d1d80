"""The local-data scenarios (issues 18 and 38): a restore elsewhere while the backed-up tree still
exists — first all of it unchanged, then with 10% of its files changed (data.mutate: 4 KiB
overwritten in the middle of every tenth file) — the default restore, which copies what is still
on disk where its cost model finds that cheaper than fetching it ("local data"), against
fetching everything (--no-local-data "repo"), at 0, 20 and 50 ms injected per request
(CAIRN_INJECT_FAULTS=latency=Nms: a remote repository's round trips, on the real local backend;
fetch concurrency auto-tuned, the default), and restic's restore of the same tree as the peer
(it has no such mode; 0 ms only). Modes interleaved, the order rotating each round. Each restore
is checked with diff -r against the unchanged data set. Reports wall time, CPU, peak RSS, bytes
fetched and bytes reused from Cairn's JSON summary, and per latency the ratio local / repo of the
minimums and of the medians, and of the bytes fetched.

Writes localdata.md and localdata.csv into the output directory."""
import csv, json, os, shutil, statistics, subprocess
from . import data
from .measure import CommandFailed, timed

SCENARIOS = ("all present", "10% of files changed")
LATENCIES = (0, 20, 50)
LOCAL, REPO = "local data (default)", "repo (--no-local-data)"


def summary(stdout):
    lines = [l for l in stdout.splitlines() if l.strip().startswith("{")]
    return json.loads(lines[-1]) if lines else {}


def mode_name(lat, how):
    return f"cairn {how}, {lat} ms"


class LocalDataBench:
    def __init__(self, runner, out_dir):
        self.r, self.out_dir = runner, out_dir
        self.runs = {}  # (scenario, mode) -> [(Run, summary)]
        self.errors = {}
        self.counts = {}

    def modes(self, cairn, restic, repos):
        """(name, command builder for a target, environment) of each mode."""
        out = []
        for lat in LATENCIES:
            env = dict(cairn.env, CAIRN_INJECT_FAULTS=f"latency={lat}ms") if lat else cairn.env
            out.append((mode_name(lat, LOCAL), lambda t: cairn.restore_cmd(repos["cairn"], t, local_data=True), env))
            out.append((mode_name(lat, REPO), lambda t: cairn.restore_cmd(repos["cairn"], t, ["--no-local-data"]), env))
        if restic:
            out.append(("restic restore, 0 ms", lambda t: restic.restore_cmd(repos["restic"], t), restic.env))
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
            modes = self.modes(cairn, restic, repos)
            for scenario in SCENARIOS:
                if scenario == SCENARIOS[1]:
                    changed = data.mutate(files, 0, 10)
                    self.counts[scenario] = (changed, len(files))
                else:
                    self.counts[scenario] = (0, len(files))
                self.r.log(f"  {ds.name:<10} {scenario}: {self.counts[scenario][0]} of {len(files)} files changed")
                for rnd in range(self.r.rounds):
                    k = rnd % len(modes)
                    for name, cmd, env in modes[k:] + modes[:k]:
                        if name.startswith("restic") and scenario != SCENARIOS[0]:
                            continue  # restic reads no local data: its time does not change
                        self.one(ds, src, home, scenario, name, cmd, env)
            self.write(ds)
        finally:
            shutil.rmtree(home, ignore_errors=True)

    def one(self, ds, src, home, scenario, name, cmd, env):
        key = (scenario, name)
        target = os.path.join(home, "target")
        self.r.settle()
        try:
            run = timed(cmd(target), env=env)
        except CommandFailed as e:
            self.errors.setdefault(key, str(e))
            shutil.rmtree(target, ignore_errors=True)
            return
        restored = os.path.join(target, src.lstrip("/"))
        d = subprocess.run(["diff", "-rq", "--no-dereference", ds.path, restored], capture_output=True, text=True)
        if d.returncode != 0:
            self.errors.setdefault(key, "wrong: " + (d.stdout or d.stderr).strip()[:300])
        shutil.rmtree(target, ignore_errors=True)
        s = summary(run.stdout) if name.startswith("cairn") else {}
        self.runs.setdefault(key, []).append((run, s))
        self.r.log(f"  {ds.name:<10} {scenario:<22} {name:<40} {run.wall:7.2f} s  cpu {run.cpu:6.2f} s  "
                   f"fetched {s.get('bytes_fetched', 0) / 2**20:8.1f} MiB  "
                   f"reused {s.get('bytes_reused_source', 0) / 2**20:8.1f} MiB"
                   + (f"  {self.errors[key]}" if key in self.errors else ""))

    def write(self, ds):
        os.makedirs(self.out_dir, exist_ok=True)
        with open(os.path.join(self.out_dir, "localdata.csv"), "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["dataset", "scenario", "mode", "round", "wall_s", "cpu_s", "rss_kib", "bytes_fetched",
                        "bytes_reused_source"])
            for (scenario, name), runs in self.runs.items():
                for i, (r, s) in enumerate(runs):
                    w.writerow([ds.name, scenario, name, i + 1, f"{r.wall:.3f}", f"{r.cpu:.3f}", r.rss_kib,
                                s.get("bytes_fetched", ""), s.get("bytes_reused_source", "")])
        lines = []
        for scenario in SCENARIOS:
            changed, total = self.counts.get(scenario, (0, 0))
            lines += [f"### {ds.name}, restored elsewhere, source {scenario} ({changed} of {total} files changed)", "",
                      "| mode | min s | median s | CPU s (min) | peak RSS MiB | fetched MiB | reused MiB | check |",
                      "|---|---|---|---|---|---|---|---|"]
            for (sc, name), runs in self.runs.items():
                if sc != scenario:
                    continue
                walls = [r.wall for r, _ in runs]
                s = runs[-1][1]
                fetched = f"{s['bytes_fetched'] / 2**20:.1f}" if "bytes_fetched" in s else "–"
                reused = f"{s['bytes_reused_source'] / 2**20:.1f}" if "bytes_reused_source" in s else "–"
                lines.append(f"| {name} | {min(walls):.2f} | {statistics.median(walls):.2f} | "
                             f"{min(r.cpu for r, _ in runs):.2f} | {max(r.rss_kib for r, _ in runs) / 1024:.0f} | "
                             f"{fetched} | {reused} | {self.errors.get((sc, name), 'ok')} |")
            lines += ["", "| latency | local / repo, min | local / repo, median | CPU local / repo | fetched local / repo |",
                      "|---|---|---|---|---|"]
            for lat in LATENCIES:
                a, b = self.runs.get((scenario, mode_name(lat, LOCAL))), self.runs.get((scenario, mode_name(lat, REPO)))
                if not a or not b:
                    continue
                wa, wb = [r.wall for r, _ in a], [r.wall for r, _ in b]
                ca, cb = min(r.cpu for r, _ in a), min(r.cpu for r, _ in b)
                fa, fb = a[-1][1].get("bytes_fetched", 0), b[-1][1].get("bytes_fetched", 0)
                lines.append(f"| {lat} ms | {min(wa) / min(wb):.2f}x | {statistics.median(wa) / statistics.median(wb):.2f}x"
                             f" | {ca / cb:.2f}x | {fa / fb if fb else 0:.2f}x |")
            lines.append("")
        with open(os.path.join(self.out_dir, "localdata.md"), "w") as f:
            f.write("\n".join(lines) + "\n")
        print("\n".join(lines), flush=True)

    def failed(self):
        """Cairn's wrong results (a peer's are reported in the table)."""
        return [f"{m} / {sc}: {e}" for (sc, m), e in self.errors.items() if m.startswith("cairn")]
